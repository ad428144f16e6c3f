//! `FleetService`: the SRE's read API over the fleet (hvctl, grpcurl).
//! Answers from the controller's cache of Hypervisors and the session
//! registry, never from Nova, so a fleet-wide list costs no API call.
//!
//! Who may read what (docs/protocol.md): an SRE's certificate reads the
//! whole fleet, a node's only its own Hypervisor, any other certificate
//! nothing. An identity holds at most [`MAX_WATCHES`] watches, and a watch
//! whose client stops reading for [`SLOW_READER`] is dropped: a node's
//! certificate cannot make the leader hold the fleet in memory for ever.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hv_proto::v1 as pb;
use hv_proto::v1::fleet_service_server::FleetService;
use kube::runtime::reflector::{ObjectRef, Store};
use rustls_pki_types::CertificateDer;
use tokio::sync::broadcast;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::registry::Registry;
use crate::api::Hypervisor;

/// Watches one identity may hold at once.
pub const MAX_WATCHES: usize = 8;
/// How long a watch waits for its client to take the next event.
pub const SLOW_READER: Duration = Duration::from_secs(30);

/// Who asks, as their certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reader {
    /// An SRE (or anyone, on a coordinator serving without TLS): the fleet.
    Sre(String),
    /// A node: its own Hypervisor only.
    Node(String),
}

impl Reader {
    fn may_read(&self, name: &str) -> bool {
        match self {
            Reader::Sre(_) => true,
            Reader::Node(node) => node == name,
        }
    }

    fn identity(&self) -> String {
        match self {
            Reader::Sre(s) => format!("sre/{s}"),
            Reader::Node(n) => format!("node/{n}"),
        }
    }
}

/// The reader `certs` speak for in `trust_domain` (None: no TLS, so no
/// identity to tell apart; a laboratory's setting).
pub fn reader_of(
    certs: Option<&[CertificateDer<'static>]>,
    trust_domain: Option<&str>,
) -> Result<Reader, Status> {
    let Some(td) = trust_domain else { return Ok(Reader::Sre("anyone".into())) };
    let Some(leaf) = certs.and_then(|c| c.first()) else {
        return Err(Status::unauthenticated("no client certificate"));
    };
    if let Some(node) = hv_tls::node_of(leaf, td) {
        return Ok(Reader::Node(node));
    }
    match hv_tls::sre_of(leaf, td) {
        Some(sre) => Ok(Reader::Sre(sre)),
        None => Err(Status::permission_denied(format!(
            "a certificate for neither a node nor an SRE of {td} (URIs {:?})",
            hv_tls::identity::uris_of(leaf)
        ))),
    }
}

pub struct FleetEndpoint {
    pub hypervisors: Store<Hypervisor>,
    pub registry: Arc<Registry>,
    /// Phase changes, as the controller records them.
    pub events: broadcast::Sender<pb::HypervisorEvent>,
    /// A follower's caches are empty: it says so instead of showing an
    /// empty fleet.
    pub leader: tokio::sync::watch::Receiver<bool>,
    /// The trust domain of the callers' certificates (None: no TLS).
    pub trust_domain: Option<String>,
    /// Watches held, per identity.
    pub watches: Arc<Mutex<HashMap<String, usize>>>,
}

/// One watch held by `identity`; let go when dropped.
struct WatchHeld {
    watches: Arc<Mutex<HashMap<String, usize>>>,
    identity: String,
}

impl Drop for WatchHeld {
    fn drop(&mut self) {
        let mut held = crate::locked::lock(&self.watches);
        if let Some(n) = held.get_mut(&self.identity) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.identity);
            }
        }
    }
}

impl FleetEndpoint {
    fn reader<T>(&self, request: &Request<T>) -> Result<Reader, Status> {
        let certs = request.peer_certs();
        reader_of(certs.as_deref().map(Vec::as_slice), self.trust_domain.as_deref())
    }

    /// A watch for `reader`, unless it holds [`MAX_WATCHES`] already.
    fn hold_watch(&self, reader: &Reader) -> Result<WatchHeld, Status> {
        let identity = reader.identity();
        let mut held = crate::locked::lock(&self.watches);
        let n = held.entry(identity.clone()).or_default();
        if *n >= MAX_WATCHES {
            return Err(Status::resource_exhausted(format!(
                "{identity} holds {MAX_WATCHES} watches already; end one first"
            )));
        }
        *n += 1;
        Ok(WatchHeld { watches: self.watches.clone(), identity })
    }

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
        let reader = self.reader(&request)?;
        let phases = request.into_inner().phases;
        let mut hypervisors: Vec<pb::Hypervisor> = self
            .hypervisors
            .state()
            .iter()
            .filter(|hv| reader.may_read(hv.metadata.name.as_deref().unwrap_or_default()))
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
        let reader = self.reader(&request)?;
        let name = request.into_inner().name;
        if !reader.may_read(&name) {
            return Err(Status::permission_denied(format!(
                "{} reads its own Hypervisor only, not {name}",
                reader.identity()
            )));
        }
        match self.hypervisors.get(&ObjectRef::new(&name)) {
            Some(hv) => Ok(Response::new(to_proto(&hv, &self.registry))),
            None => Err(Status::not_found(format!("no Hypervisor named {name}"))),
        }
    }

    type WatchStream = ReceiverStream<Result<pb::HypervisorEvent, Status>>;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        self.leading()?;
        let reader = self.reader(&request)?;
        let held = self.hold_watch(&reader)?;
        let names = request.into_inner().names;
        let wanted = move |n: &str| reader.may_read(n) && (names.is_empty() || names.iter().any(|x| x == n));
        let rx = self.events.subscribe();
        let (tx, out) = tokio::sync::mpsc::channel(256);
        let mut initial: Vec<pb::Hypervisor> = self
            .hypervisors
            .state()
            .iter()
            .filter(|hv| wanted(hv.metadata.name.as_deref().unwrap_or_default()))
            .map(|hv| to_proto(hv, &self.registry))
            .collect();
        initial.sort_by(|a, b| a.name.cmp(&b.name));
        tokio::spawn(async move {
            let _held = held;
            pump(initial, rx, tx, wanted, SLOW_READER).await;
        });
        Ok(Response::new(ReceiverStream::new(out)))
    }
}

/// A watch's events to its client: the `initial` state, then each change
/// it `wanted`; it ends when the client goes, falls behind the changes, or
/// takes no event for `slow`.
async fn pump(
    initial: Vec<pb::Hypervisor>,
    mut rx: broadcast::Receiver<pb::HypervisorEvent>,
    tx: tokio::sync::mpsc::Sender<Result<pb::HypervisorEvent, Status>>,
    wanted: impl Fn(&str) -> bool,
    slow: Duration,
) {
    let send = |ev| tx.send_timeout(Ok(ev), slow);
    for h in initial {
        let ev = pb::HypervisorEvent { hypervisor: Some(h), initial: true, ..Default::default() };
        if send(ev).await.is_err() {
            return;
        }
    }
    loop {
        // A client gone ends the watch at once, not at the next event (a
        // quiet host's may be days away): its slot is let go.
        let next = tokio::select! {
            next = rx.recv() => next,
            () = tx.closed() => return,
        };
        match next {
            Ok(ev) => {
                let name = ev.hypervisor.as_ref().map(|h| h.name.clone()).unwrap_or_default();
                if wanted(&name) && send(ev).await.is_err() {
                    tracing::info!(watched = %name, "a watch's client took no event in time; dropped");
                    return;
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                let msg = format!("watcher fell {n} events behind; watch again");
                let _ = tx.send_timeout(Err(Status::data_loss(msg)), slow).await;
                return;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    fn cert_for(uri: &str) -> Vec<CertificateDer<'static>> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        vec![p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()]
    }

    #[test]
    fn a_node_reads_only_itself_an_sre_reads_all_and_anyone_else_nothing() {
        let td = Some("hypervisor.cloud.sap");
        let node = reader_of(Some(&cert_for("spiffe://hypervisor.cloud.sap/node/node-a")), td).unwrap();
        assert_eq!(node, Reader::Node("node-a".into()));
        assert!(node.may_read("node-a") && !node.may_read("node-b"), "another node's data is refused");
        let sre = reader_of(Some(&cert_for("spiffe://hypervisor.cloud.sap/sre/alice")), td).unwrap();
        assert!(sre.may_read("node-a") && sre.may_read("node-b"));
        let other = reader_of(Some(&cert_for("spiffe://hypervisor.cloud.sap/webhook/x")), td).unwrap_err();
        assert_eq!(other.code(), tonic::Code::PermissionDenied, "{other}");
        let foreign = reader_of(Some(&cert_for("spiffe://elsewhere.example/sre/alice")), td).unwrap_err();
        assert_eq!(foreign.code(), tonic::Code::PermissionDenied, "{foreign}");
        assert_eq!(reader_of(None, td).unwrap_err().code(), tonic::Code::Unauthenticated);
        // Without TLS there is no identity to tell apart.
        assert!(reader_of(None, None).unwrap().may_read("node-b"));
    }

    #[test]
    fn an_identity_holds_a_bounded_number_of_watches() {
        let (hypervisors, _writer) = kube::runtime::reflector::store::<Hypervisor>();
        let (events, _) = broadcast::channel(4);
        let (_leader_tx, leader) = tokio::sync::watch::channel(true);
        let endpoint = FleetEndpoint {
            hypervisors,
            registry: Arc::new(Registry::new(tokio::sync::mpsc::unbounded_channel().0)),
            events,
            leader,
            trust_domain: Some("hypervisor.cloud.sap".into()),
            watches: Arc::default(),
        };
        let node = Reader::Node("node-a".into());
        let held: Vec<WatchHeld> = (0..MAX_WATCHES).map(|_| endpoint.hold_watch(&node).unwrap()).collect();
        let refused = endpoint.hold_watch(&node).err().unwrap();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused}");
        assert!(endpoint.hold_watch(&Reader::Node("node-b".into())).is_ok(), "another identity's own count");
        drop(held);
        assert!(endpoint.hold_watch(&node).is_ok(), "let go when the watches end");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_whose_client_does_not_read_is_dropped() {
        let (events, rx) = broadcast::channel(16);
        let (tx, mut out) = tokio::sync::mpsc::channel(1);
        let h = |name: &str| pb::Hypervisor { name: name.into(), ..Default::default() };
        let pump = tokio::spawn(pump(vec![h("node-a")], rx, tx, |_: &str| true, SLOW_READER));
        tokio::task::yield_now().await;
        // The first event fills the channel; the client reads nothing more.
        events.send(pb::HypervisorEvent { hypervisor: Some(h("node-a")), ..Default::default() }).unwrap();
        tokio::time::sleep(SLOW_READER + Duration::from_secs(1)).await;
        assert!(pump.is_finished(), "dropped after {SLOW_READER:?} without a read");
        assert!(out.recv().await.is_some(), "what was sent before stays readable");
        assert!(out.recv().await.is_none(), "then the watch ends");
    }

    #[tokio::test]
    async fn a_watch_whose_client_went_ends_at_once() {
        let (_events, rx) = broadcast::channel::<pb::HypervisorEvent>(16);
        let (tx, out) = tokio::sync::mpsc::channel(4);
        let pump = tokio::spawn(pump(Vec::new(), rx, tx, |_: &str| true, SLOW_READER));
        drop(out);
        let ended = tokio::time::timeout(Duration::from_secs(5), pump).await;
        assert!(ended.is_ok(), "no event came, and the watch ended all the same");
    }
}
