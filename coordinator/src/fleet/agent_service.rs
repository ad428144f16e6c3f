//! `AgentService.Connect`, the coordinator's end of each agent's stream
//! (docs/protocol.md): Hello first, Welcome with what we already hold,
//! then an Ack for every message and commands from the lifecycle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Service routes them to the leader (the follower is not ready).
    pub leader: watch::Receiver<bool>,
    /// What the agents are told to beat at; a session silent for three
    /// intervals is considered dead.
    pub heartbeat: Duration,
    /// The trust domain of agent certificates: a session is taken only for
    /// the node its client certificate names. `None` only with `--insecure`.
    pub trust_domain: Option<String>,
    /// Sessions refused because the certificate did not name the Hello's node.
    pub refused: Arc<AtomicU64>,
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
    type ConnectStream = ReceiverStream<Result<CoordinatorMessage, Status>>;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        if !*self.leader.borrow() {
            return Err(Status::unavailable("this coordinator replica is not the leader; retry"));
        }
        let certs = request.peer_certs();
        let mut inbound = request.into_inner();
        let first = tokio::time::timeout(Duration::from_secs(10), inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no Hello within 10s"))??;
        let hello = match first.and_then(|m| m.payload) {
            Some(Payload::Hello(h)) => h,
            _ => return Err(Status::invalid_argument("the first message must be Hello")),
        };
        if !valid_node_name(&hello.node) {
            let shown = super::registry::bounded(&hello.node, 64);
            return Err(Status::invalid_argument(format!("Hello names an invalid node {shown:?}")));
        }
        if let Some(td) = &self.trust_domain
            && let Err(shown) = certificate_speaks_for(certs.as_deref().map(Vec::as_slice), td, &hello.node)
        {
            self.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(node = %hello.node, presented = %shown, "refused an agent session: its certificate does not name the node");
            return Err(Status::permission_denied(format!(
                "Hello names node {} but the client showed {shown}",
                hello.node
            )));
        }
        // A certificate is checked at the handshake; the session it opened
        // ends when it expires, and the agent comes back with its renewed one.
        let expires = self
            .trust_domain
            .as_ref()
            .and_then(|_| certs.as_deref()?.first().and_then(hv_tls::not_after))
            .map(until_instant);
        if self.hypervisors.get(&ObjectRef::new(&hello.node)).is_none() {
            return Err(Status::failed_precondition(format!(
                "no Hypervisor named {} (yet): the coordinator takes sessions only for managed nodes; retry",
                hello.node
            )));
        }
        let (tx, rx) = mpsc::channel(64);
        let opened = self.registry.open(&hello, tx.clone());
        tracing::info!(
            node = %hello.node, session = opened.id, agent_version = %hello.agent_version,
            acked = opened.acked, "agent session opened"
        );
        let welcome = Welcome {
            coordinator_version: env!("CARGO_PKG_VERSION").into(),
            acked_seq: opened.acked,
            heartbeat_interval: prost_types::Duration::try_from(self.heartbeat).ok(),
        };
        let _ = tx.send(Ok(CoordinatorMessage { payload: Some(Down::Welcome(welcome)) })).await;
        let registry = self.registry.clone();
        let silence = self.heartbeat * 3;
        let node = hello.node;
        tokio::spawn(async move {
            let mut closed = opened.closed;
            let expiry = async move {
                match expires {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(expiry);
            let why = loop {
                tokio::select! {
                    _ = &mut closed => break "replaced by a newer session".to_string(),
                    () = &mut expiry => break "its client certificate expired".to_string(),
                    msg = tokio::time::timeout(silence, inbound.message()) => match msg {
                        Err(_) => break format!("silent for {}s", silence.as_secs()),
                        Ok(Ok(None)) => break "closed by the agent".to_string(),
                        Ok(Err(status)) => break format!("broken: {}", status.message()),
                        Ok(Ok(Some(m))) => {
                            let Some(seq) = registry.receive(&node, opened.id, m) else {
                                break "replaced by a newer session".to_string();
                            };
                            let ack = CoordinatorMessage { payload: Some(Down::Ack(Ack { seq })) };
                            if tx.send(Ok(ack)).await.is_err() {
                                break "the agent stopped reading".to_string();
                            }
                        }
                    },
                }
            };
            registry.close(&node, opened.id);
            tracing::info!(node = %node, session = opened.id, reason = %why, "agent session ended");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
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
    use super::{certificate_speaks_for, valid_node_name};
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
}
