//! The coordinator's side: a rustls server configuration that requires a
//! client certificate from the CA, with the server certificate and the CA
//! re-read when their files change, and the accept loop that hands tonic
//! finished TLS connections.
//!
//! tonic's own TLS setting takes the certificate once, at start; a rotated
//! certificate would need a restart, and so would a rotated CA. Here the
//! certificate is chosen per handshake ([`ReloadingCert`]) and the client
//! certificate verified by a verifier made from the CA file as it is now
//! ([`ReloadingClientCa`]).

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

pub use rustls::ServerConfig;

use crate::reload::Reloading;
use crate::{TlsError, TlsFiles, read};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

pub(crate) fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    parse_certs(path, &read(path)?)
}

/// The certificates in `pem`, read from `path` (named in errors).
pub(crate) fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem { path: path.to_path_buf(), what: e.to_string() })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { path: path.to_path_buf(), what: "no certificate in it".into() });
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| TlsError::Pem { path: path.to_path_buf(), what: e.to_string() })
}

/// The server certificate, chosen anew per handshake from the files as
/// they are.
#[derive(Debug)]
struct ReloadingCert(Reloading<Arc<CertifiedKey>>);

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some((*self.0.get()).clone())
    }
}

/// The certificate a server configuration presents, as its next handshake
/// would take it: a look re-reads the files when they changed, as a
/// handshake does (and keeps the one in use when they do not load). For
/// metrics: when it ends.
#[derive(Clone, Debug)]
pub struct Presented(Arc<ReloadingCert>);

impl Presented {
    /// The end of the leaf certificate's validity (its notAfter); None when
    /// it cannot be read.
    pub fn not_after(&self) -> Option<SystemTime> {
        self.0.0.get().cert.first().and_then(crate::not_after)
    }
}

/// Client certificates verified against the CA file as it is.
#[derive(Debug)]
struct ReloadingClientCa {
    inner: Reloading<Arc<dyn ClientCertVerifier>>,
    /// The schemes do not change with the CA; asked of the first verifier.
    schemes: Vec<SignatureScheme>,
}

impl ClientCertVerifier for ReloadingClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would have to outlive a reload. Clients then offer
    /// the certificate they have, which is what ours do anyway.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner.get().verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.get().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.get().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}

/// A verifier of client certificates from any of the CAs in the first
/// file of `cas`, or the first CA of each other file (a signer's file may
/// carry the chain above it: that chain is not trusted for clients).
fn client_verifier(
    cas: &[std::path::PathBuf],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for (n, ca) in cas.iter().enumerate() {
        let all = certs(ca)?;
        let taken = if n == 0 { all.len() } else { 1 };
        for cert in all.into_iter().take(taken) {
            roots
                .add(cert)
                .map_err(|e| TlsError::Verifier { path: ca.to_path_buf(), what: e.to_string() })?;
        }
    }
    let first = cas.first().cloned().unwrap_or_default();
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Verifier { path: first, what: e.to_string() })
}

/// The server configuration for `files`: HTTP/2 only, a client certificate
/// from `files.ca` required, both re-read when their files change; and the
/// certificate it presents.
pub fn config(files: &TlsFiles) -> Result<(Arc<ServerConfig>, Presented), TlsError> {
    config_trusting(files, &[])
}

/// [`config`], with client certificates from the CAs in the files `also`
/// taken as well (the CA that signs the agents' certificates), re-read
/// with `files.ca`.
pub fn config_trusting(
    files: &TlsFiles,
    also: &[std::path::PathBuf],
) -> Result<(Arc<ServerConfig>, Presented), TlsError> {
    let p = provider();
    let pk = p.clone();
    let cert = Reloading::new("server certificate", vec![files.cert.clone(), files.key.clone()], move |f| {
        Ok(Arc::new(CertifiedKey::from_der(certs(&f[0])?, key(&f[1])?, &pk)?))
    })?;
    let pv = p.clone();
    let cas: Vec<_> = std::iter::once(files.ca.clone()).chain(also.iter().cloned()).collect();
    let ca = Reloading::new("client CA", cas, move |f| client_verifier(f, pv.clone()))?;
    let schemes = ca.get().supported_verify_schemes();
    let verifier = Arc::new(ReloadingClientCa { inner: ca, schemes });
    let cert = Arc::new(ReloadingCert(cert));
    let mut cfg = ServerConfig::builder_with_provider(p)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert.clone());
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    // No session resumption: a resumed session brings the client
    // certificate verified back then, never checked again, so a certificate
    // past its end or of a CA rotated out would still get in.
    cfg.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    cfg.send_tls13_tickets = 0;
    Ok((Arc::new(cfg), Presented(cert)))
}

/// A server configuration without client certificates, for HTTPS that
/// the Kubernetes API server calls (the eviction webhook): HTTP/1.1, the
/// certificate re-read when its files change; and the certificate it presents.
pub fn config_without_client_auth(
    cert: &Path,
    key_file: &Path,
) -> Result<(Arc<ServerConfig>, Presented), TlsError> {
    server_only(cert, key_file, b"http/1.1")
}

/// The same for gRPC (HTTP/2): the coordinator's bootstrap port, where an
/// agent without a certificate yet asks for one.
pub fn config_for_bootstrap(
    cert: &Path,
    key_file: &Path,
) -> Result<(Arc<ServerConfig>, Presented), TlsError> {
    server_only(cert, key_file, b"h2")
}

fn server_only(
    cert: &Path,
    key_file: &Path,
    alpn: &[u8],
) -> Result<(Arc<ServerConfig>, Presented), TlsError> {
    let p = provider();
    let pk = p.clone();
    let cert =
        Reloading::new("server certificate", vec![cert.to_path_buf(), key_file.to_path_buf()], move |f| {
            Ok(Arc::new(CertifiedKey::from_der(certs(&f[0])?, key(&f[1])?, &pk)?))
        })?;
    let cert = Arc::new(ReloadingCert(cert));
    let mut cfg = ServerConfig::builder_with_provider(p)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(cert.clone());
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok((Arc::new(cfg), Presented(cert)))
}

/// Bounds on the listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Established connections open at once; past it new ones wait.
    pub max_connections: usize,
    /// Handshakes under way at once; past it a new connection waits for a
    /// place, roughly in the order it came, up to `handshake_wait`.
    pub max_handshakes: usize,
    /// Connections accepted and not through their handshake yet (waiting
    /// for a place or in one); past it a new connection is closed at once,
    /// so clients that never finish a handshake cannot pile up.
    pub max_pending: usize,
    /// How long a connection waits for a handshake place before it is
    /// closed. Closing at once sends agents reconnecting together after a
    /// failover back to their backoff, which delays the last of them far
    /// more than this wait. A flood of silent clients costs an agent this
    /// wait before it is closed.
    pub handshake_wait: Duration,
    /// A client that has not finished its handshake by then is dropped.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 10_000,
            max_handshakes: 256,
            max_pending: 8_192,
            handshake_wait: Duration::from_secs(15),
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// What the listener saw, for metrics.
#[derive(Debug, Default)]
pub struct Stats {
    pub handshakes_failed: AtomicU64,
    pub connections: AtomicU64,
}

/// One accepted TLS connection; it holds its place under
/// [`Limits::max_connections`] until closed.
pub struct Conn {
    tls: TlsStream<TcpStream>,
    _slot: OwnedSemaphorePermit,
    stats: Arc<Stats>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stats.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connected for Conn {
    type ConnectInfo = TlsConnectInfo<TcpConnectInfo>;

    /// What tonic's `Request::peer_certs` reads.
    fn connect_info(&self) -> Self::ConnectInfo {
        self.tls.connect_info()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tls).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tls).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }
}

/// Accepts on `listener` and hands over each connection once its TLS
/// handshake is done; handshakes run side by side, so a slow or silent
/// client holds up no one until `max_handshakes` are under way: past that,
/// new connections wait for a place (`Limits`). Accept errors (out of file
/// descriptors) pause the loop, 10 ms doubling to 1 s, instead of spinning. The loop ends (and
/// the port is closed) when the server drops the stream.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
    stats: Arc<Stats>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes.max(1)));
    let pending = Arc::new(Semaphore::new(limits.max_pending.max(1)));
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(c) => {
                    pause = Duration::from_millis(10);
                    c
                }
                Err(e) => {
                    tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "gRPC accept failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let Ok(admitted) = pending.clone().try_acquire_owned() else {
                stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "too many connections waiting for a TLS handshake; connection closed");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, stats, slots) = (acceptor.clone(), tx.clone(), stats.clone(), slots.clone());
            let handshakes = handshakes.clone();
            tokio::spawn(async move {
                let place = tokio::time::timeout(limits.handshake_wait, handshakes.acquire_owned()).await;
                let Ok(Ok(handshake)) = place else {
                    stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "no TLS handshake place free in time; connection closed");
                    return;
                };
                let done = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await;
                drop((handshake, admitted));
                match done {
                    Ok(Ok(tls)) => {
                        let Ok(slot) = slots.acquire_owned().await else { return };
                        stats.connections.fetch_add(1, Ordering::Relaxed);
                        let _ = tx.send(Ok(Conn { tls, _slot: slot, stats })).await;
                    }
                    Ok(Err(e)) => {
                        stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(%peer, error = %e, "TLS handshake refused");
                    }
                    Err(_) => {
                        stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(%peer, "TLS handshake not finished in time");
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConnection};

    struct Ca {
        params: CertificateParams,
        key: KeyPair,
        pem: String,
    }

    fn ca() -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Ca { params, key, pem }
    }

    /// A leaf of `ca` for `sans`: (certificate PEM, key PEM).
    fn leaf(ca: &Ca, sans: Vec<SanType>, expired: bool) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = sans;
        if expired {
            p.not_before = rcgen::date_time_ymd(2020, 1, 1);
            p.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &Issuer::from_params(&ca.params, &ca.key)).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn server_files(dir: &Path, ca: &Ca) -> TlsFiles {
        std::fs::create_dir_all(dir).unwrap();
        let (cert, key) = leaf(ca, vec![SanType::DnsName("localhost".try_into().unwrap())], false);
        let files = TlsFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key"), ca: dir.join("ca.crt") };
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
        std::fs::write(&files.ca, &ca.pem).unwrap();
        files
    }

    fn client_config(trust: &Ca, client: Option<(String, String)>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(trust.pem.as_bytes()).unwrap()).unwrap();
        let b = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let cfg = match client {
            Some((cert, key)) => b
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        Arc::new(cfg)
    }

    /// A handshake in memory, including what follows it (session tickets).
    fn handshake(
        client: &Arc<ClientConfig>,
        server: &Arc<ServerConfig>,
    ) -> Result<HandshakeKind, rustls::Error> {
        let mut c = ClientConnection::new(client.clone(), ServerName::try_from("localhost").unwrap())?;
        let mut s = ServerConnection::new(server.clone())?;
        for _ in 0..20 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                s.read_tls(&mut &buf[..]).unwrap();
                s.process_new_packets()?;
            }
            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).unwrap();
            }
            if !buf.is_empty() {
                c.read_tls(&mut &buf[..]).unwrap();
                c.process_new_packets()?;
            }
            if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() && !s.wants_write() {
                return Ok(s.handshake_kind().unwrap());
            }
        }
        panic!("the handshake did not end")
    }

    /// A leaf of `ca` for localhost valid until `until` (year, month, day),
    /// written to `dir` as a Secret volume swaps files in (renamed over).
    fn write_leaf(ca: &Ca, dir: &Path, until: (i32, u8, u8)) -> (std::path::PathBuf, std::path::PathBuf) {
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.not_after = rcgen::date_time_ymd(until.0, until.1, until.2);
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &Issuer::from_params(&ca.params, &ca.key)).unwrap();
        let (crt, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        for (path, text) in [(&crt, cert.pem()), (&k, key.serialize_pem())] {
            std::fs::write(path.with_extension("next"), text).unwrap();
            std::fs::rename(path.with_extension("next"), path).unwrap();
        }
        (crt, k)
    }

    /// The certificate a server presents, looked at, follows its files as a
    /// handshake would: a rotation shows its new end, a rotation that does
    /// not load keeps the one in use. A client's is read from its file.
    #[test]
    fn the_presented_certificates_end_follows_its_files() {
        let dir = std::env::temp_dir().join(format!("hv-tls-presented-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = ca();
        let at = |secs: u64| Some(std::time::UNIX_EPOCH + Duration::from_secs(secs));
        let (cert, key) = write_leaf(&good, &dir, (2040, 1, 1));
        let (_, presented) = config_without_client_auth(&cert, &key).unwrap();
        assert_eq!(presented.not_after(), at(2_208_988_800), "2040-01-01");
        assert_eq!(crate::client::certificate_not_after(&cert).ok(), at(2_208_988_800));
        write_leaf(&good, &dir, (2041, 6, 1));
        assert_eq!(presented.not_after(), at(2_253_657_600), "rotated: 2041-06-01");
        std::fs::write(dir.join("broken"), "not a certificate").unwrap();
        std::fs::rename(dir.join("broken"), &cert).unwrap();
        assert_eq!(presented.not_after(), at(2_253_657_600), "a broken file keeps the one in use");
        assert!(crate::client::certificate_not_after(&cert).is_err(), "a client's file says it is broken");
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn node(ca: &Ca, expired: bool) -> (String, String) {
        let uri = SanType::URI("spiffe://hypervisor.cloud.sap/node/n1".try_into().unwrap());
        leaf(ca, vec![uri], expired)
    }

    /// A connection past the handshake bound waits for a place and gets in;
    /// one past the pending bound is closed at once.
    #[tokio::test]
    async fn a_connection_past_the_handshake_bound_waits_for_a_place() {
        use tokio_stream::StreamExt;
        let dir = std::env::temp_dir().join(format!("hv-tls-wait-{}", std::process::id()));
        let good = ca();
        let (server, _) = config(&server_files(&dir, &good)).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            max_connections: 16,
            max_handshakes: 1,
            max_pending: 2,
            handshake_wait: Duration::from_secs(20),
            handshake_timeout: Duration::from_secs(20),
        };
        let stats = Arc::new(Stats::default());
        let mut conns = incoming(listener, server, limits, stats.clone());
        // A client that has not spoken holds the one place until it leaves.
        let silent = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let connector = tokio_rustls::TlsConnector::from(client_config(&good, Some(node(&good, false))));
        let agent = tokio::spawn(async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Both pending places taken (the silent one, the agent waiting): a
        // third is closed at once, well before any handshake could end.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read =
            tokio::time::timeout(Duration::from_secs(2), tokio::io::AsyncReadExt::read(&mut third, &mut buf));
        assert!(matches!(read.await, Ok(Ok(0)) | Ok(Err(_))), "past the pending bound: closed");
        assert_eq!(stats.handshakes_failed.load(Ordering::Relaxed), 1, "the third only");
        assert!(!agent.is_finished(), "the agent waits for the place");

        // The silent client leaves: its place goes to the agent.
        drop(silent);
        assert!(agent.await.unwrap().is_ok(), "the agent waited for the place and got in");
        let conn = tokio::time::timeout(Duration::from_secs(10), conns.next()).await.unwrap();
        assert!(matches!(conn, Some(Ok(_))), "handed over");
        assert_eq!(stats.handshakes_failed.load(Ordering::Relaxed), 2, "the third and the silent one");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Only certificates of the client CA get in, every time with a full
    /// handshake: a resumed session would bring back a certificate checked
    /// once, before an expiry or a CA rotation.
    #[test]
    fn clients_are_verified_at_every_connection_never_resumed() {
        let dir = std::env::temp_dir().join(format!("hv-tls-server-{}", std::process::id()));
        let good = ca();
        let files = server_files(&dir, &good);
        let (server, _) = config(&files).unwrap();
        let client = client_config(&good, Some(node(&good, false)));
        assert_eq!(handshake(&client, &server).unwrap(), HandshakeKind::Full);
        assert_eq!(
            handshake(&client, &server).unwrap(),
            HandshakeKind::Full,
            "the same client is not resumed"
        );

        assert!(handshake(&client_config(&good, None), &server).is_err(), "no certificate");
        assert!(handshake(&client_config(&good, Some(node(&good, true))), &server).is_err(), "expired");
        let other = ca();
        assert!(handshake(&client_config(&good, Some(node(&other, false))), &server).is_err(), "another CA");

        // The client CA rotated on disk: the same client config, once let in,
        // is turned away at its next connection.
        let next = dir.join("ca.crt.next");
        std::fs::write(&next, &other.pem).unwrap();
        std::fs::rename(&next, &files.ca).unwrap(); // a new file, as a Secret volume swaps it in
        assert!(handshake(&client, &server).is_err(), "a certificate of the CA rotated out");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
