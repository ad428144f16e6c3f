//! The agent's one long-lived stream to the coordinator (docs/protocol.md).
//!
//! Hello first; the coordinator's Welcome says what it already holds, and
//! the outbox replays the rest. Then heartbeats (jittered), whatever the
//! watchers push, acks back, and commands (RunChecks, Configure) handed to
//! the caller. A message the agent did not expect is logged and ignored; a
//! stream that breaks or sends something undecodable is logged and
//! reconnected with jittered backoff. Nothing unacknowledged is lost.

pub mod outbox;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_client::AgentServiceClient;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{AgentMessage, Capability, Configure, Heartbeat, Hello, RunChecks};
use tokio::sync::{Mutex, Notify, mpsc};

use crate::backoff::{Backoff, draw, timestamp_now as now};
use outbox::Outbox;

#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// `http://HOST:PORT` of the coordinator's gRPC endpoint.
    pub coordinator: String,
    pub node: String,
    pub agent_version: String,
    /// Random per process, so the coordinator knows when sequences restart.
    pub boot_id: String,
    pub heartbeat: Duration,
    pub buffer: usize,
    pub backoff: Backoff,
    /// This agent's certificate (naming its node) and key, and the CA of
    /// the coordinator's certificate. `None`: plain text (`--insecure`).
    pub tls: Option<SessionTls>,
}

/// Where the session's client certificate comes from.
#[derive(Clone, Debug)]
pub enum SessionTls {
    /// Files read at each connection: a rotated certificate is used from
    /// the next one on.
    Files(hv_tls::TlsFiles),
    /// The coordinator's certificate for this node ([`crate::identity`]):
    /// when a new one arrives a new session opens with it at once and
    /// replaces the old one, kept open until the new one is welcomed (what
    /// was not acknowledged is sent again).
    Issued { ca: std::path::PathBuf, current: crate::identity::Current },
}

impl SessionTls {
    /// When the certificate the next connection presents ends: the file's
    /// as it is now, or the one from the coordinator.
    pub fn certificate_end(&self) -> Option<std::time::SystemTime> {
        match self {
            SessionTls::Files(files) => hv_tls::client::certificate_not_after(&files.cert).ok(),
            SessionTls::Issued { current, .. } => current.borrow().as_ref().map(|c| c.not_after),
        }
    }

    /// The client setting for a connection made now.
    fn config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        match self {
            SessionTls::Files(files) => hv_tls::client::config(files).map_err(|e| e.to_string()),
            SessionTls::Issued { ca, current } => {
                let held = current.borrow().clone().ok_or("no certificate from the coordinator yet")?;
                hv_tls::client::config_in_memory(ca, &held.chain_pem, &held.key_pem)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Answers once a certificate newer than the one a connection took
    /// arrives; never for files.
    async fn renewed(watching: &mut Option<crate::identity::Current>) {
        let changed = match watching {
            Some(w) => w.changed().await.is_ok(),
            None => false,
        };
        if !changed {
            std::future::pending::<()>().await;
        }
    }
}

/// Commands from the coordinator, for the rest of the agent.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    RunChecks(RunChecks),
    Configure(Configure),
}

/// Counters for `/metrics` and the tests.
#[derive(Debug, Default)]
pub struct SessionStats {
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    pub unexpected_messages: AtomicU64,
    pub stream_errors: AtomicU64,
}

/// Push messages into the session from anywhere.
#[derive(Clone)]
pub struct SessionHandle {
    outbox: Arc<Mutex<Outbox>>,
    notify: Arc<Notify>,
    /// Counts the sessions a coordinator welcomed: a new one (a new
    /// leader, say) knows nothing of what an earlier one was told.
    welcomes: Arc<tokio::sync::watch::Sender<u64>>,
}

impl SessionHandle {
    pub async fn push(&self, payload: Payload) -> u64 {
        let seq = self.outbox.lock().await.push(payload, Some(now()));
        self.notify.notify_one();
        seq
    }

    /// Changes each time a coordinator welcomes a session.
    pub fn welcomes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.welcomes.subscribe()
    }

    pub async fn dropped(&self) -> u64 {
        self.outbox.lock().await.dropped()
    }

    pub async fn acked(&self) -> u64 {
        self.outbox.lock().await.acked()
    }

    /// (dropped, acknowledged sequence, held) under one lock, for a scrape.
    pub async fn outbox_figures(&self) -> (u64, u64, usize) {
        let o = self.outbox.lock().await;
        (o.dropped(), o.acked(), o.pending())
    }
}

pub struct Session {
    cfg: SessionConfig,
    handle: SessionHandle,
    pub stats: Arc<SessionStats>,
}

#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("connecting to {0}: {1}")]
    Connect(String, String),
    #[error("the coordinator refused the session: {0}")]
    Refused(tonic::Status),
    #[error("stream broken: {0}")]
    Broken(tonic::Status),
    #[error("the coordinator closed the stream")]
    Closed,
    #[error("first message was not Welcome")]
    NoWelcome,
    #[error("no Welcome within {} s", WELCOME_WITHIN.as_secs())]
    NoWelcomeWithin,
    #[error("a new certificate arrived")]
    Renewed(Box<Kept>),
}

/// How long a new session may take from its connection to the
/// coordinator's Welcome.
const WELCOME_WITHIN: Duration = Duration::from_secs(10);

/// A session kept open while its successor connects: the coordinator sees
/// the new one replace it, never a node without its agent.
struct Kept {
    _client: AgentServiceClient<tonic::transport::Channel>,
    _outbound: mpsc::Sender<AgentMessage>,
    _inbound: tonic::Streaming<hv_proto::v1::CoordinatorMessage>,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the session being replaced")
    }
}

impl Session {
    pub fn new(cfg: SessionConfig) -> Session {
        let handle = SessionHandle {
            outbox: Arc::new(Mutex::new(Outbox::new(cfg.buffer))),
            notify: Arc::new(Notify::new()),
            welcomes: Arc::new(tokio::sync::watch::Sender::new(0)),
        };
        Session { cfg, handle, stats: Arc::new(SessionStats::default()) }
    }

    pub fn handle(&self) -> SessionHandle {
        self.handle.clone()
    }

    /// Run until `commands` is closed.
    pub async fn run(self, commands: mpsc::Sender<Command>) {
        let mut attempt = 0u32;
        let mut kept = None;
        loop {
            if let Some(SessionTls::Issued { current, .. }) = &self.cfg.tls {
                // No session before the first certificate.
                let _ = current.clone().wait_for(Option::is_some).await;
            }
            let began = std::time::Instant::now();
            let end = self.stream_once(&commands, kept.take()).await;
            let welcomed = self.stats.connected.swap(false, Ordering::Relaxed);
            // A session that held: not one a coordinator welcomes and drops.
            let held = welcomed && began.elapsed() >= self.cfg.backoff.max;
            let closed = matches!(end, Err(StreamEnd::Closed));
            match end {
                Ok(()) => return,
                Err(StreamEnd::Renewed(old)) => {
                    // Back at once, with the new certificate; the old
                    // session ends once the new one is welcomed.
                    tracing::info!(node = %self.cfg.node, "reconnecting with the new certificate");
                    kept = Some(old);
                    attempt = 0;
                    continue;
                }
                Err(StreamEnd::Closed) => {}
                Err(e) => {
                    self.stats.stream_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %self.cfg.node, error = %e, "session ended; reconnecting");
                }
            }
            attempt = attempt_after(attempt, held, closed);
            if commands.is_closed() {
                return;
            }
            tokio::time::sleep(self.cfg.backoff.delay(attempt, draw())).await;
            attempt = attempt.saturating_add(1);
        }
    }

    /// The coordinator's endpoint with the certificate in use now, and what
    /// tells of a newer one (a certificate from the coordinator).
    fn endpoint(&self) -> Result<(tonic::transport::Endpoint, Option<crate::identity::Current>), StreamEnd> {
        let connect_error = |e: String| StreamEnd::Connect(self.cfg.coordinator.clone(), e);
        let mut endpoint = tonic::transport::Endpoint::from_shared(self.cfg.coordinator.clone())
            .map_err(|e| connect_error(e.to_string()))?
            .connect_timeout(Duration::from_secs(5))
            .http2_keep_alive_interval(Duration::from_secs(20))
            .keep_alive_timeout(Duration::from_secs(10));
        // Marked seen before the certificate is read: one that arrives in
        // between reconnects once more, none is missed.
        let renewals = match &self.cfg.tls {
            Some(SessionTls::Issued { current, .. }) => {
                let mut w = current.clone();
                w.mark_unchanged();
                Some(w)
            }
            _ => None,
        };
        if let Some(tls) = &self.cfg.tls {
            let tls = tls.config().map_err(connect_error)?;
            endpoint = endpoint.tls_config(tls).map_err(|e| connect_error(e.to_string()))?;
        }
        Ok((endpoint, renewals))
    }

    /// One session, from Hello to its end. `previous`, a session being
    /// replaced, is closed once this one is welcomed (or fails).
    async fn stream_once(
        &self,
        commands: &mpsc::Sender<Command>,
        previous: Option<Box<Kept>>,
    ) -> Result<(), StreamEnd> {
        let connect_error = |e: String| StreamEnd::Connect(self.cfg.coordinator.clone(), e);
        let (endpoint, mut renewals) = self.endpoint()?;
        let channel = endpoint.connect().await.map_err(|e| connect_error(hv_tls::explain(&e)))?;
        let mut client = AgentServiceClient::new(channel);
        let (tx, rx) = mpsc::channel::<AgentMessage>(256);
        let acked = self.handle.outbox.lock().await.acked();
        let hello = Hello {
            node: self.cfg.node.clone(),
            agent_version: self.cfg.agent_version.clone(),
            boot_id: self.cfg.boot_id.clone(),
            capabilities: vec![
                Capability::Libvirt as i32,
                Capability::Ovsdb as i32,
                Capability::CephRbd as i32,
                Capability::Checks as i32,
                Capability::DomainEvents as i32,
                Capability::BridgeExpectations as i32,
            ],
            replay_from: acked + 1,
        };
        let _ = tx
            .send(AgentMessage { seq: 0, sent_at: Some(now()), payload: Some(Payload::Hello(hello)) })
            .await;
        // Bounded: a session kept open meanwhile (`previous`) sends no
        // heartbeat, and the coordinator ends it after three.
        let opened = tokio::time::timeout(WELCOME_WITHIN, async {
            let mut inbound = client
                .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(StreamEnd::Refused)?
                .into_inner();
            let first = inbound.message().await.map_err(StreamEnd::Broken)?;
            Ok::<_, StreamEnd>((inbound, first))
        });
        let (mut inbound, first) = opened.await.map_err(|_| StreamEnd::NoWelcomeWithin)??;
        let mut heartbeat = self.cfg.heartbeat;
        match first {
            Some(m) => match m.payload {
                Some(Down::Welcome(w)) => {
                    let mut ob = self.handle.outbox.lock().await;
                    ob.ack(w.acked_seq);
                    ob.rewind();
                    if let Some(d) = w.heartbeat_interval.and_then(|d| Duration::try_from(d).ok()) {
                        heartbeat = bounded_heartbeat(d);
                    }
                }
                _ => return Err(StreamEnd::NoWelcome),
            },
            None => return Err(StreamEnd::Closed),
        }
        drop(previous);
        self.stats.connected.store(true, Ordering::Relaxed);
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        self.handle.welcomes.send_modify(|n| *n = n.wrapping_add(1));
        let mut next_beat = tokio::time::Instant::now() + jitter(heartbeat);
        loop {
            let unsent = self.handle.outbox.lock().await.take_unsent();
            for m in unsent {
                if tx.send(m).await.is_err() {
                    return Err(StreamEnd::Closed);
                }
            }
            tokio::select! {
                _ = SessionTls::renewed(&mut renewals) => {
                    return Err(StreamEnd::Renewed(Box::new(Kept { _client: client, _outbound: tx, _inbound: inbound })));
                }
                _ = self.handle.notify.notified() => {}
                _ = tokio::time::sleep_until(next_beat) => {
                    next_beat = tokio::time::Instant::now() + jitter(heartbeat);
                    let dropped = self.handle.outbox.lock().await.dropped();
                    self.handle.push(Payload::Heartbeat(Heartbeat { dropped_messages: dropped, ..host_load() })).await;
                }
                msg = inbound.message() => match msg {
                    Ok(Some(m)) => match m.payload {
                        Some(Down::Ack(a)) => self.handle.outbox.lock().await.ack(a.seq),
                        Some(Down::RunChecks(r)) => {
                            if commands.send(Command::RunChecks(r)).await.is_err() { return Ok(()); }
                        }
                        Some(Down::Configure(c)) => {
                            if let Some(d) = c.heartbeat_interval.and_then(|d| Duration::try_from(d).ok()) {
                                heartbeat = bounded_heartbeat(d);
                            }
                            if commands.send(Command::Configure(c)).await.is_err() { return Ok(()); }
                        }
                        other => {
                            self.stats.unexpected_messages.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(node = %self.cfg.node, message = ?other, "ignoring an unexpected coordinator message");
                        }
                    },
                    Ok(None) => return Err(StreamEnd::Closed),
                    Err(status) => return Err(StreamEnd::Broken(status)),
                },
            }
        }
    }
}

/// The heartbeat interval a coordinator asks for, within sane bounds (a
/// huge one would overflow the next beat's deadline; a tiny one would flood).
pub fn bounded_heartbeat(d: Duration) -> Duration {
    d.clamp(Duration::from_millis(100), Duration::from_secs(3600))
}

/// ±20 % around the interval, so a fleet of agents does not beat in step.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.8 + 0.4 * draw())
}

/// Load and memory pressure of the host, for heartbeats.
fn host_load() -> Heartbeat {
    use sysinfo::{MemoryRefreshKind, RefreshKind, System};
    let mut hb = Heartbeat::default();
    if let Ok(l) = System::load_average() {
        hb.load1 = l.one;
    }
    if let Ok(sys) = System::new_with_specifics(
        RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()),
    ) {
        hb.memory_total_bytes = sys.total_memory();
        hb.memory_available_bytes = sys.available_memory();
    }
    hb
}

/// The backoff step to wait at after a stream ended: from the start when
/// the coordinator closed it or when a welcomed session held (at least the
/// longest backoff): a session broken by a leader's death is a first
/// failure, not the next of a row, or agents wait 21 to 30 s from the
/// first try after a later failover. Else the row goes on, so a
/// coordinator that welcomes and drops at once is not hammered.
fn attempt_after(attempt: u32, held: bool, closed: bool) -> u32 {
    if held || closed { 0 } else { attempt }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_interval_from_the_coordinator_is_bounded() {
        assert_eq!(bounded_heartbeat(Duration::MAX), Duration::from_secs(3600));
        assert_eq!(bounded_heartbeat(Duration::ZERO), Duration::from_millis(100));
        // The deadline a huge interval would make: no overflow.
        let _ = tokio::time::Instant::now() + jitter(bounded_heartbeat(Duration::from_secs(u64::MAX)));
    }

    #[test]
    fn a_session_that_held_starts_its_backoff_afresh() {
        // (attempts so far, welcomed and held, closed by the coordinator) -> next
        assert_eq!(attempt_after(6, true, false), 0, "a leader died under a live session");
        assert_eq!(attempt_after(6, false, true), 0);
        assert_eq!(attempt_after(6, false, false), 6, "failures in a row go on");
    }
}
