//! `AgentService.Connect`, the coordinator's end of each agent's stream
//! (docs/protocol.md): Hello first, Welcome with what we already hold,
//! then an Ack for every message and commands from the lifecycle.

use std::sync::Arc;
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_server::AgentService;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{Ack, AgentMessage, CoordinatorMessage, Welcome};
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
            let why = loop {
                tokio::select! {
                    _ = &mut closed => break "replaced by a newer session".to_string(),
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
    use super::valid_node_name;

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
