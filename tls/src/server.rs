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
use std::time::Duration;

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
    let pem = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
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

fn client_verifier(
    ca: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certs(ca)? {
        roots.add(cert).map_err(|e| TlsError::Verifier { path: ca.to_path_buf(), what: e.to_string() })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::Verifier { path: ca.to_path_buf(), what: e.to_string() })
}

/// The server configuration for `files`: HTTP/2 only, a client certificate
/// from `files.ca` required, both re-read when their files change.
pub fn config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let p = provider();
    let pk = p.clone();
    let cert = Reloading::new("server certificate", vec![files.cert.clone(), files.key.clone()], move |f| {
        Ok(Arc::new(CertifiedKey::from_der(certs(&f[0])?, key(&f[1])?, &pk)?))
    })?;
    let pv = p.clone();
    let ca =
        Reloading::new("client CA", vec![files.ca.clone()], move |f| client_verifier(&f[0], pv.clone()))?;
    let schemes = ca.get().supported_verify_schemes();
    let verifier = Arc::new(ReloadingClientCa { inner: ca, schemes });
    let mut cfg = ServerConfig::builder_with_provider(p)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(ReloadingCert(cert)));
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// Bounds on the listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once; the next waits until one closes.
    pub max_connections: usize,
    /// A client that has not finished its handshake by then is dropped.
    pub handshake_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_connections: 10_000, handshake_timeout: Duration::from_secs(10) }
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
/// client holds up no one. Accept errors (out of file descriptors) pause
/// the loop, 10 ms doubling to 1 s, instead of spinning.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    limits: Limits,
    stats: Arc<Stats>,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let (tcp, peer) = match listener.accept().await {
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
            let _ = tcp.set_nodelay(true);
            let (acceptor, tx, stats) = (acceptor.clone(), tx.clone(), stats.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
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
