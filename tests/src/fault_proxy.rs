//! A fault-injecting HTTP/1.1 proxy the end-to-end tests put between the
//! coordinator and one of its peers (Nova, Placement, Keystone, the
//! Kubernetes API server).
//!
//! It forwards each request on a connection of its own to the upstream
//! (over TLS for the API server: the client speaks plain HTTP to the proxy,
//! with a bearer token) and streams the response back (so Kubernetes
//! watches pass through), and
//! records every request it saw with the time it arrived. Faults:
//!
//! - the whole proxy can **blackhole** (hold every request and every chunk of
//!   every response until told otherwise: a partition) or add **latency**;
//! - **rules** act on the requests they match (method, path, body, a
//!   header), a given number of times: reset the connection before
//!   forwarding, answer a status of their own without forwarding (a 503, or
//!   the 401 Nova gives for an expired token), or forward the request and
//!   **drop its response** (the peer acted; the client never hears).
//!
//! It speaks enough HTTP/1.1 for what our clients send: requests with a
//! `content-length` body (or none), responses with `content-length`,
//! `chunked`, or read to the end.
#![allow(clippy::panic)] // test support: a proxy that cannot start fails its test

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What a rule does to a matching request.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Close the client's connection without forwarding.
    Reset,
    /// Answer with this status and body without forwarding.
    Respond(u16, String),
    /// Forward, let the upstream act, throw its answer away and close.
    DropResponse,
    /// Forward after this delay.
    Delay(Duration),
}

/// Which requests a rule applies to; empty fields match anything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Match {
    pub method: Option<String>,
    pub path_contains: Option<String>,
    pub body_contains: Option<String>,
    /// A header (lower-case name) with exactly this value.
    pub header: Option<(String, String)>,
}

impl Match {
    pub fn method_path(method: &str, path_contains: &str) -> Match {
        Match { method: Some(method.into()), path_contains: Some(path_contains.into()), ..Default::default() }
    }

    fn matches(&self, r: &Head, body: &[u8]) -> bool {
        self.method.as_ref().is_none_or(|m| m == &r.method)
            && self.path_contains.as_ref().is_none_or(|p| r.path.contains(p.as_str()))
            && self.body_contains.as_ref().is_none_or(|b| String::from_utf8_lossy(body).contains(b.as_str()))
            && self.header.as_ref().is_none_or(|(n, v)| r.header(n) == Some(v.as_str()))
    }
}

#[derive(Clone, Debug)]
struct Rule {
    when: Match,
    fault: Fault,
    /// None: for ever.
    left: Option<u32>,
}

/// One request the proxy saw.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: jiff::Timestamp,
    pub method: String,
    pub path: String,
    /// `x-auth-token`, for OpenStack requests.
    pub token: Option<String>,
    /// The fault applied, if any.
    pub fault: Option<Fault>,
    /// The upstream's status, when one came back (and was passed on or dropped).
    pub status: Option<u16>,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    latency: Duration,
    seen: Vec<Seen>,
}

/// A running proxy; dropping it stops accepting (connections in flight end
/// with their peers).
pub struct FaultProxy {
    pub addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
    blackhole: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where the proxy forwards to: host:port, over TLS when it has a CA.
#[derive(Clone)]
struct Upstream {
    addr: String,
    tls: Option<tokio_rustls::TlsConnector>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

impl Upstream {
    async fn connect(&self) -> std::io::Result<Box<dyn Io>> {
        let tcp = TcpStream::connect(&self.addr).await?;
        let Some(tls) = &self.tls else { return Ok(Box::new(tcp)) };
        let host = self.addr.rsplit_once(':').map_or(self.addr.as_str(), |(h, _)| h);
        let name = rustls_pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        Ok(Box::new(tls.connect(name, tcp).await?))
    }
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream` (host:port).
    pub async fn start(upstream: &str) -> FaultProxy {
        Self::listen(Upstream { addr: upstream.to_string(), tls: None }).await
    }

    /// The same, to an upstream that speaks TLS with a certificate of the CA
    /// in `ca_pem` (the API server): plain HTTP in, TLS out.
    pub async fn start_tls(upstream: &str, ca_pem: &std::path::Path) -> FaultProxy {
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca_pem)
            .unwrap_or_else(|e| panic!("fault proxy: {}: {e}", ca_pem.display()));
        for cert in certs {
            let cert = cert.unwrap_or_else(|e| panic!("fault proxy: {}: {e}", ca_pem.display()));
            roots.add(cert).unwrap_or_else(|e| panic!("fault proxy: {}: {e}", ca_pem.display()));
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("fault proxy: {e}"))
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = Some(tokio_rustls::TlsConnector::from(Arc::new(config)));
        Self::listen(Upstream { addr: upstream.to_string(), tls }).await
    }

    async fn listen(upstream: Upstream) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("fault proxy: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("fault proxy: {e}"));
        let state = Arc::new(Mutex::new(State::default()));
        let (blackhole, gate) = watch::channel(false);
        let (st, up) = (state.clone(), upstream);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (st, up, gate) = (st.clone(), up.clone(), gate.clone());
                tokio::spawn(async move {
                    let _ = serve(client, &up, st, gate).await;
                });
            }
        });
        FaultProxy { addr, state, blackhole, task }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        match self.state.lock() {
            Ok(mut s) => f(&mut s),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Holds all traffic (new requests and response chunks) while true.
    pub fn blackhole(&self, on: bool) {
        let _ = self.blackhole.send(on);
    }

    pub fn latency(&self, d: Duration) {
        self.with(|s| s.latency = d);
    }

    /// Applies `fault` to the next `times` matching requests (None: all).
    pub fn rule(&self, when: Match, fault: Fault, times: Option<u32>) {
        self.with(|s| s.rules.push(Rule { when, fault, left: times }));
    }

    pub fn clear_rules(&self) {
        self.with(|s| s.rules.clear());
    }

    /// Every request seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.with(|s| s.seen.clone())
    }
}

#[derive(Debug)]
struct Head {
    method: String,
    path: String,
    /// The head as received, to forward unchanged.
    raw: Vec<u8>,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    fn content_length(&self) -> usize {
        self.header("content-length").and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }
}

async fn read_head<R: AsyncBufReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<Head>> {
    let mut raw = Vec::new();
    loop {
        let mut line = Vec::new();
        if r.read_until(b'\n', &mut line).await? == 0 {
            return Ok(None);
        }
        raw.extend_from_slice(&line);
        if line == b"\r\n" || line == b"\n" {
            break;
        }
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let mut lines = text.lines();
    let first: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let (method, path) = (first.first().unwrap_or(&"").to_string(), first.get(1).unwrap_or(&"").to_string());
    Ok(Some(Head { method, path, raw, headers }))
}

async fn wait_open(gate: &mut watch::Receiver<bool>) {
    let _ = gate.wait_for(|held| !*held).await;
}

/// One client connection: request after request, each on a fresh upstream
/// connection (so a dropped response never desynchronises a pooled one).
async fn serve(
    client: TcpStream,
    upstream: &Upstream,
    state: Arc<Mutex<State>>,
    mut gate: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let (cr, mut cw) = client.into_split();
    let mut cr = BufReader::new(cr);
    while let Some(req) = read_head(&mut cr).await? {
        let mut body = vec![0u8; req.content_length()];
        cr.read_exact(&mut body).await?;
        wait_open(&mut gate).await;
        let (fault, latency) = {
            let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
            let fault =
                s.rules.iter_mut().find(|r| r.left != Some(0) && r.when.matches(&req, &body)).map(|r| {
                    r.left = r.left.map(|n| n - 1);
                    r.fault.clone()
                });
            (fault, s.latency)
        };
        let mut seen = Seen {
            at: jiff::Timestamp::now(),
            method: req.method.clone(),
            path: req.path.clone(),
            token: req.header("x-auth-token").map(str::to_string),
            fault: fault.clone(),
            status: None,
        };
        let record = |seen: Seen| state.lock().unwrap_or_else(|p| p.into_inner()).seen.push(seen);
        tokio::time::sleep(latency).await;
        match fault {
            Some(Fault::Reset) => {
                record(seen);
                return Ok(());
            }
            Some(Fault::Respond(status, text)) => {
                record(seen);
                let answer = format!(
                    "HTTP/1.1 {status} Fault\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                    text.len()
                );
                cw.write_all(answer.as_bytes()).await?;
                continue;
            }
            Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
            _ => {}
        }
        let mut up = upstream.connect().await?;
        up.write_all(&req.raw).await?;
        up.write_all(&body).await?;
        up.flush().await?;
        let (ur, _uw) = tokio::io::split(up);
        let mut ur = BufReader::new(ur);
        let Some(rsp) = read_head(&mut ur).await? else { return Ok(()) };
        seen.status = rsp.method.parse::<u16>().ok().or_else(|| rsp.path.parse().ok());
        let drop_it = seen.fault == Some(Fault::DropResponse);
        record(seen);
        if drop_it {
            // The upstream acted; the client hears nothing.
            return Ok(());
        }
        cw.write_all(&rsp.raw).await?;
        let head_only = req.method == "HEAD" || rsp.path == "204" || rsp.path == "304";
        if !head_only {
            copy_body(&rsp, &mut ur, &mut cw, &mut gate).await?;
        }
        if rsp.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
            return Ok(());
        }
    }
    Ok(())
}

/// The response body, streamed through chunk by chunk (a watch's chunks
/// arrive for minutes); held while the proxy blackholes.
async fn copy_body<R: AsyncBufReadExt + Unpin, W: AsyncWrite + Unpin>(
    rsp: &Head,
    from: &mut R,
    to: &mut W,
    gate: &mut watch::Receiver<bool>,
) -> std::io::Result<()> {
    let chunked = rsp.header("transfer-encoding").is_some_and(|t| t.to_ascii_lowercase().contains("chunked"));
    if let Some(n) = rsp.header("content-length").and_then(|v| v.trim().parse::<u64>().ok()) {
        let mut left = n;
        let mut buf = vec![0u8; 16384];
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = from.read(&mut buf[..want]).await?;
            if got == 0 {
                return Ok(());
            }
            wait_open(gate).await;
            to.write_all(&buf[..got]).await?;
            left -= got as u64;
        }
        return Ok(());
    }
    if !chunked {
        let mut buf = vec![0u8; 16384];
        loop {
            let got = from.read(&mut buf).await?;
            if got == 0 {
                return Ok(());
            }
            wait_open(gate).await;
            to.write_all(&buf[..got]).await?;
        }
    }
    loop {
        let mut size_line = Vec::new();
        if from.read_until(b'\n', &mut size_line).await? == 0 {
            return Ok(());
        }
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&size_line).trim().split(';').next().unwrap_or("0"),
            16,
        )
        .unwrap_or(0);
        let mut chunk = vec![0u8; size + 2];
        from.read_exact(&mut chunk).await?;
        wait_open(gate).await;
        to.write_all(&size_line).await?;
        to.write_all(&chunk).await?;
        to.flush().await?;
        if size == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny upstream that answers every request with its path.
    async fn upstream() -> (String, Arc<Mutex<u32>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("{e}"));
        let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let hits = Arc::new(Mutex::new(0u32));
        let h = hits.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let h = h.clone();
                tokio::spawn(async move {
                    let (r, mut w) = s.into_split();
                    let mut r = BufReader::new(r);
                    while let Ok(Some(req)) = read_head(&mut r).await {
                        let mut body = vec![0u8; req.content_length()];
                        if r.read_exact(&mut body).await.is_err() {
                            return;
                        }
                        *h.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                        let text = req.path.clone();
                        let out = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}", text.len());
                        if w.write_all(out.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, hits)
    }

    #[tokio::test]
    async fn it_forwards_records_and_applies_each_fault() {
        let (up, hits) = upstream().await;
        let p = FaultProxy::start(&up).await;
        let client = reqwest::Client::new();
        let get = |path: &str| client.get(format!("{}{path}", p.url())).header("x-auth-token", "t1").send();
        assert_eq!(get("/a").await.unwrap_or_else(|e| panic!("{e}")).text().await.unwrap_or_default(), "/a");
        p.rule(Match::method_path("GET", "/b"), Fault::Respond(503, "{}".into()), Some(1));
        assert_eq!(get("/b").await.map(|r| r.status().as_u16()).unwrap_or(0), 503);
        assert_eq!(get("/b").await.map(|r| r.status().as_u16()).unwrap_or(0), 200, "once only");
        p.rule(Match::method_path("POST", "/act"), Fault::DropResponse, Some(1));
        let before = *hits.lock().unwrap_or_else(|e| e.into_inner());
        let dropped = client.post(format!("{}/act", p.url())).body("x").send().await;
        assert!(dropped.is_err(), "the client hears nothing");
        assert_eq!(*hits.lock().unwrap_or_else(|e| e.into_inner()), before + 1, "but the upstream acted");
        p.rule(Match::default(), Fault::Reset, Some(1));
        assert!(get("/c").await.is_err());
        let seen = p.seen();
        assert_eq!(seen.len(), 5);
        assert_eq!(seen[0].token.as_deref(), Some("t1"));
        assert_eq!(seen[3].fault, Some(Fault::DropResponse));
        assert_eq!(seen[3].status, Some(200));
        // Blackholed: nothing passes until it is lifted.
        p.blackhole(true);
        let held = tokio::time::timeout(Duration::from_millis(300), get("/d")).await;
        assert!(held.is_err(), "held");
        p.blackhole(false);
        assert_eq!(get("/e").await.map(|r| r.status().as_u16()).unwrap_or(0), 200);
    }
}
