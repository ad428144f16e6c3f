//! `FleetService`: the SRE's read API over the fleet (hvctl, grpcurl).
//! Answers from the controller's cache of Hypervisors and the session
//! registry, never from Nova, so a fleet-wide list costs no API call.

use std::sync::Arc;

use hv_proto::v1 as pb;
use hv_proto::v1::fleet_service_server::FleetService;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::broadcast;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::registry::Registry;
use crate::api::Hypervisor;

pub struct FleetEndpoint {
    pub hypervisors: Store<Hypervisor>,
    pub registry: Arc<Registry>,
    /// Phase changes, as the controller records them.
    pub events: broadcast::Sender<pb::HypervisorEvent>,
    /// A follower's caches are empty: it says so instead of showing an
    /// empty fleet.
    pub leader: tokio::sync::watch::Receiver<bool>,
}

impl FleetEndpoint {
    fn leading(&self) -> Result<(), Status> {
        if *self.leader.borrow() {
            Ok(())
        } else {
            Err(Status::unavailable(
                "this coordinator replica is not the leader and holds no fleet; ask the leader",
            ))
        }
    }
}

fn timestamp(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.0.as_second(), nanos: t.0.subsec_nanosecond() }
}

/// One Hypervisor as the fleet API shows it.
pub fn to_proto(hv: &Hypervisor, registry: &Registry) -> pb::Hypervisor {
    let name = hv.metadata.name.clone().unwrap_or_default();
    let agent = registry.view(&name);
    let status = hv.status.clone().unwrap_or_default();
    pb::Hypervisor {
        phase: status.phase.unwrap_or_default().as_str().to_string(),
        maintenance: hv.spec.maintenance.as_str().to_string(),
        instances: status.instances.as_ref().map_or(0, |i| i.count),
        agent_connected: agent.connected,
        agent_last_heartbeat: agent
            .last_seen
            .map(|t| prost_types::Timestamp { seconds: t.as_second(), nanos: t.subsec_nanosecond() }),
        libvirt_version: status.libvirt_version.clone().unwrap_or_default(),
        service_id: status.service_id.clone().unwrap_or_default(),
        hypervisor_id: status.hypervisor_id.clone().unwrap_or_default(),
        conditions: status
            .conditions
            .iter()
            .map(|c| pb::Condition {
                r#type: c.type_.clone(),
                status: c.status.clone(),
                reason: c.reason.clone(),
                message: c.message.clone(),
                last_transition_time: Some(timestamp(&c.last_transition_time)),
            })
            .collect(),
        phase_since: status.phase_since.as_ref().map(timestamp),
        health: status.health.as_ref().map(|h| h.state.to_string()).unwrap_or_default(),
        health_since: status.health.as_ref().and_then(|h| h.since.as_ref()).map(timestamp),
        health_evidence: status.health.as_ref().map(|h| h.evidence.clone()).unwrap_or_default(),
        name,
    }
}

#[tonic::async_trait]
impl FleetService for FleetEndpoint {
    async fn list_hypervisors(
        &self,
        request: Request<pb::ListHypervisorsRequest>,
    ) -> Result<Response<pb::ListHypervisorsResponse>, Status> {
        self.leading()?;
        let phases = request.into_inner().phases;
        let mut hypervisors: Vec<pb::Hypervisor> = self
            .hypervisors
            .state()
            .iter()
            .map(|hv| to_proto(hv, &self.registry))
            .filter(|h| phases.is_empty() || phases.iter().any(|p| p.eq_ignore_ascii_case(&h.phase)))
            .collect();
        hypervisors.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListHypervisorsResponse { hypervisors }))
    }

    async fn get_hypervisor(
        &self,
        request: Request<pb::GetHypervisorRequest>,
    ) -> Result<Response<pb::Hypervisor>, Status> {
        self.leading()?;
        let name = request.into_inner().name;
        match self.hypervisors.get(&ObjectRef::new(&name)) {
            Some(hv) => Ok(Response::new(to_proto(&hv, &self.registry))),
            None => Err(Status::not_found(format!("no Hypervisor named {name}"))),
        }
    }

    type WatchStream = ReceiverStream<Result<pb::HypervisorEvent, Status>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.leading()?;
        let names = request.into_inner().names;
        let wanted = move |n: &str| names.is_empty() || names.iter().any(|x| x == n);
        let mut rx = self.events.subscribe();
        let (tx, out) = tokio::sync::mpsc::channel(256);
        let mut initial: Vec<pb::Hypervisor> =
            self.hypervisors.state().iter().map(|hv| to_proto(hv, &self.registry)).collect();
        initial.sort_by(|a, b| a.name.cmp(&b.name));
        tokio::spawn(async move {
            for h in initial.into_iter().filter(|h| wanted(&h.name)) {
                let ev = pb::HypervisorEvent { hypervisor: Some(h), initial: true, ..Default::default() };
                if tx.send(Ok(ev)).await.is_err() {
                    return;
                }
            }
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let name = ev.hypervisor.as_ref().map(|h| h.name.clone()).unwrap_or_default();
                        if wanted(&name) && tx.send(Ok(ev)).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        let msg = format!("watcher fell {n} events behind; watch again");
                        let _ = tx.send(Err(Status::data_loss(msg))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }
}
