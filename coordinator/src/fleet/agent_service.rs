//! `AgentService.Connect`, the coordinator's end of each agent's stream
//! (docs/protocol.md): Hello first, Welcome with what we already hold,
//! then an Ack for every message and commands from the lifecycle.

use std::sync::Arc;
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_server::AgentService;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{Ack, AgentMessage, CoordinatorMessage, Welcome};
use rustls_pki_types::CertificateDer;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::registry::Registry;
use crate::api::Hypervisor;
use kube::runtime::reflector::{ObjectRef, Store};

pub struct AgentEndpoint {
    pub registry: Arc<Registry>,
    /// The Hypervisors: a session is taken only for a node that has one, so
    /// the registry holds at most one entry per managed node.
    pub hypervisors: Store<Hypervisor>,
    /// Only the leader takes sessions: agents of a follower retry and the
    /// Service routes them to the leader (the pod with the leader label).
    pub leader: watch::Receiver<bool>,
    /// What the agents are told to beat at; a session silent for three
    /// intervals is considered dead.
    pub heartbeat: Duration,
    /// The trust domain of agent certificates: a session is taken only for
    /// the node its client certificate names. `None` only with `--insecure`.
    pub trust_domain: Option<String>,
    /// Counts the sessions refused for their certificate.
    pub sessions: crate::metrics::AgentSessions,
    /// The agents' signer's certificate file, when node certificates must
    /// come from it alone (agents' certificates from the coordinator):
    /// another CA the port trusts (an SRE's) cannot make a node's.
    pub node_signer: Option<std::path::PathBuf>,
}

/// Whether the client certificate of `certs` speaks for `node`: `Err` with
/// what it speaks for instead (for the log and the caller).
pub fn certificate_speaks_for(
    certs: Option<&[CertificateDer<'static>]>,
    trust_domain: &str,
    node: &str,
) -> Result<(), String> {
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Err("no client certificate".into());
    };
    match hv_tls::node_of(leaf, trust_domain) {
        Some(n) if n == node => Ok(()),
        Some(n) => Err(format!("a certificate for node {n}")),
        None => Err(format!(
            "a certificate for no node of {trust_domain} (URIs {:?})",
            hv_tls::identity::uris_of(leaf)
        )),
    }
}

#[tonic::async_trait]
impl AgentService for AgentEndpoint {
    type ConnectStream = futures_util::stream::Map<ReceiverStream<Box<CoordinatorMessage>>, Unbox>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        self.leading()?;
        let certs = request.peer_certs();
        let mut inbound = request.into_inner();
        let hello = first_hello(&mut inbound).await?;
        let expires = self.admit(&hello, certs.as_deref().map(Vec::as_slice))?;
        // Leadership may have ended while we waited for the Hello.
        self.leading()?;
        let (tx, rx) = mpsc::channel(64);
        let certificate_end = certs.as_deref().and_then(|c| c.first()).and_then(hv_tls::not_after);
        let opened = self.registry.open_until(&hello, tx.clone(), certificate_end);
        tracing::info!(
            node = %hello.node, session = opened.id, agent_version = %hello.agent_version,
            acked = opened.acked, "agent session opened"
        );
        let welcome = Welcome {
            coordinator_version: env!("CARGO_PKG_VERSION").into(),
            acked_seq: opened.acked,
            heartbeat_interval: prost_types::Duration::try_from(self.heartbeat).ok(),
        };
        let _ = tx.send(Box::new(CoordinatorMessage { payload: Some(Down::Welcome(welcome)) })).await;
        let session = Session {
            registry: self.registry.clone(),
            node: hello.node,
            id: opened.id,
            silence: self.heartbeat * 3,
            expires,
            tx,
        };
        tokio::spawn(session.pump(inbound, opened.closed));
        Ok(Response::new(futures_util::StreamExt::map(ReceiverStream::new(rx), unbox as Unbox)))
    }
}

impl AgentEndpoint {
    fn leading(&self) -> Result<(), Status> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(Status::unavailable("this coordinator replica is not the leader; retry"))
        }
    }

    /// A session for `hello` is taken only for a managed node its
    /// certificate names, while the certificate is valid; it ends when the
    /// certificate does (the returned instant; None without mutual TLS).
    fn admit(
        &self,
        hello: &hv_proto::v1::Hello,
        certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Option<tokio::time::Instant>, Status> {
        if !valid_node_name(&hello.node) {
            let shown = crate::api::bounded(&hello.node, 64);
            return Err(Status::invalid_argument(format!("Hello names an invalid node {shown:?}")));
        }
        let expires = match &self.trust_domain {
            Some(td) => Some(self.certificate_admits(certs, td, &hello.node)?),
            None => None,
        };
        if self.hypervisors.get(&ObjectRef::new(&hello.node)).is_none() {
            return Err(Status::failed_precondition(format!(
                "no Hypervisor named {} (yet): the coordinator takes sessions only for managed nodes; retry",
                hello.node
            )));
        }
        Ok(expires)
    }

    /// The certificate names `node` and is still valid: when the session
    /// must end. A certificate is checked at the handshake, and a
    /// connection may outlive it: each session is checked again.
    fn certificate_admits(
        &self,
        certs: Option<&[CertificateDer<'static>]>,
        trust_domain: &str,
        node: &str,
    ) -> Result<tokio::time::Instant, Status> {
        if let Err(shown) = certificate_speaks_for(certs, trust_domain, node) {
            self.sessions.refused();
            tracing::warn!(node = %node, presented = %shown, "refused an agent session: its certificate does not name the node");
            return Err(Status::permission_denied(format!(
                "Hello names node {node} but the client showed {shown}"
            )));
        }
        let leaf = certs.and_then(|c| c.first());
        if let (Some(signer), Some(leaf)) = (&self.node_signer, leaf)
            && !from_signer(leaf, signer)
        {
            self.sessions.refused();
            tracing::warn!(node = %node, signer = %signer.display(), "refused an agent session: its certificate is not the agents' signer's");
            return Err(Status::permission_denied(format!(
                "node {node}'s certificate must come from the coordinator (the agents' signer)"
            )));
        }
        match session_end(leaf.and_then(hv_tls::not_after), std::time::SystemTime::now(), node) {
            Ok(end) => Ok(until_instant(end)),
            Err(why) => {
                self.sessions.refused();
                tracing::warn!(node = %node, reason = %why, "refused an agent session: its certificate is no longer valid");
                Err(Status::permission_denied(format!("the client showed {why}")))
            }
        }
    }
}

/// Whether `leaf` was signed by the first certificate of the file `signer`
/// (read now: a rotated signer counts from the next session).
fn from_signer(leaf: &CertificateDer<'_>, signer: &std::path::Path) -> bool {
    match hv_tls::certificates(signer) {
        Ok(certs) => certs.first().is_some_and(|s| hv_tls::identity::issued_by(leaf, s)),
        Err(e) => {
            tracing::error!(signer = %signer.display(), error = %e, "the agents' signer does not read");
            false
        }
    }
}

/// The agent's first message, which must be its Hello, within 10 s.
async fn first_hello(inbound: &mut Streaming<AgentMessage>) -> Result<hv_proto::v1::Hello, Status> {
    let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no Hello within 10s"))??;
    match first.and_then(|m| m.payload) {
        Some(Payload::Hello(h)) => Ok(h),
        _ => Err(Status::invalid_argument("the first message must be Hello")),
    }
}

/// One open session: the agent's messages into the registry, each acked.
struct Session {
    registry: Arc<Registry>,
    node: String,
    id: u64,
    silence: Duration,
    expires: Option<tokio::time::Instant>,
    tx: mpsc::Sender<Box<CoordinatorMessage>>,
}

impl Session {
    async fn pump(
        self,
        mut inbound: Streaming<AgentMessage>,
        mut closed: tokio::sync::oneshot::Receiver<()>,
    ) {
        let expires = self.expires;
        let expiry = async move {
            match expires {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let why = loop {
            tokio::select! {
                // An expired certificate wins over a message ready at the same time.
                biased;
                _ = &mut closed => break "replaced by a newer session".to_string(),
                () = &mut expiry => break "its client certificate expired".to_string(),
                msg = tokio::time::timeout(self.silence, inbound.message()) => match msg {
                    Err(_) => break format!("silent for {}s", self.silence.as_secs()),
                    Ok(Ok(None)) => break "closed by the agent".to_string(),
                    Ok(Err(status)) => break format!("broken: {}", status.message()),
                    Ok(Ok(Some(m))) => {
                        let Some(seq) = self.registry.receive(&self.node, self.id, m) else {
                            break "replaced by a newer session".to_string();
                        };
                        let ack = CoordinatorMessage { payload: Some(Down::Ack(Ack { seq })) };
                        if self.tx.send(Box::new(ack)).await.is_err() {
                            break "the agent stopped reading".to_string();
                        }
                    }
                },
            }
        };
        self.registry.close(&self.node, self.id);
        tracing::info!(node = %self.node, session = self.id, reason = %why, "agent session ended");
    }
}

/// The stream's items out of their queue's boxes.
type Unbox = fn(Box<CoordinatorMessage>) -> Result<CoordinatorMessage, Status>;

fn unbox(m: Box<CoordinatorMessage>) -> Result<CoordinatorMessage, Status> {
    Ok(*m)
}

/// When a session opened now with a certificate valid until `not_after`
/// must end: shortly before it, by a share of up to a tenth of what is left
/// (at most a minute) fixed per node, so that certificates issued in one
/// batch do not end every session in the same second. An error (a refusal)
/// when the certificate has ended or its end cannot be read.
pub fn session_end(
    not_after: Option<std::time::SystemTime>,
    now: std::time::SystemTime,
    node: &str,
) -> Result<std::time::SystemTime, String> {
    let end = not_after.ok_or("a certificate whose end of validity cannot be read")?;
    let left = end.duration_since(now).map_err(|_| "a certificate that has expired".to_string())?;
    if left.is_zero() {
        return Err("a certificate that has expired".into());
    }
    // FNV-1a of the node name: a spread that is the same at every reconnect.
    let hash =
        node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let spread = (left / 10).min(Duration::from_secs(60));
    let share = u32::try_from(hash % 1000).unwrap_or(0);
    Ok(end - spread * share / 1000)
}

/// The monotonic instant of wall-clock time `at` (now, if it has passed).
fn until_instant(at: std::time::SystemTime) -> tokio::time::Instant {
    let left = at.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::Instant::now() + left
}

/// A Kubernetes node name: a DNS subdomain (lowercase alphanumerics, `-`, `.`).
pub fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && name.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::{certificate_speaks_for, session_end, valid_node_name};
    use rcgen::{CertificateParams, KeyPair, SanType};
    use rustls_pki_types::CertificateDer;

    fn cert_for(uri: &str) -> CertificateDer<'static> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()
    }

    /// A session is the node's only with the node's own certificate.
    #[test]
    fn only_a_certificate_naming_the_hellos_node_speaks_for_it() {
        let td = "hypervisor.cloud.sap";
        let a = vec![cert_for("spiffe://hypervisor.cloud.sap/node/node-a")];
        assert_eq!(certificate_speaks_for(Some(&a), td, "node-a"), Ok(()));
        let forged = certificate_speaks_for(Some(&a), td, "node-b").unwrap_err();
        assert!(forged.contains("node node-a"), "{forged}");
        let sre = vec![cert_for("spiffe://hypervisor.cloud.sap/sre/alice")];
        assert!(certificate_speaks_for(Some(&sre), td, "node-a").unwrap_err().contains("no node"));
        let other_domain = vec![cert_for("spiffe://elsewhere.example/node/node-a")];
        assert!(certificate_speaks_for(Some(&other_domain), td, "node-a").is_err());
        assert_eq!(certificate_speaks_for(None, td, "node-a").unwrap_err(), "no client certificate");
        assert_eq!(certificate_speaks_for(Some(&[]), td, "node-a").unwrap_err(), "no client certificate");
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for ok in ["compute-1", "node.example.com", "a"] {
            assert!(valid_node_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Compute", "a/b", "node 1", &"a".repeat(254)] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_session_ends_before_its_certificate_spread_per_node_and_an_ended_one_is_refused() {
        use std::time::{Duration, UNIX_EPOCH};
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let hour = now + Duration::from_secs(3600);
        let ends: Vec<_> = ["compute-1", "compute-2", "compute-3"]
            .iter()
            .map(|n| session_end(Some(hour), now, n).unwrap())
            .collect();
        for end in &ends {
            assert!(*end <= hour && *end >= hour - Duration::from_secs(60), "{end:?}");
        }
        assert!(ends[0] != ends[1] || ends[1] != ends[2], "spread: {ends:?}");
        assert_eq!(session_end(Some(hour), now, "compute-1"), Ok(ends[0]), "the same per node");
        // A short-lived certificate: the spread stays within a tenth of it.
        let soon = now + Duration::from_secs(10);
        assert!(session_end(Some(soon), now, "compute-1").unwrap() >= now + Duration::from_secs(9));
        assert_eq!(session_end(Some(now), now, "compute-1"), Err("a certificate that has expired".into()));
        assert!(session_end(Some(now - Duration::from_secs(1)), now, "x").is_err());
        assert!(session_end(None, now, "x").unwrap_err().contains("cannot be read"));
    }
}
