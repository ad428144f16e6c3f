//! The eviction webhook's listener (docs/drain.md): HTTPS on a port of its
//! own, called by the Kubernetes API server for every `pods/eviction`
//! (the chart's ValidatingWebhookConfiguration). It reads the pod, and
//! what the caches hold of its Node, Hypervisor and Eviction, asks
//! [`admission::decide`](crate::drain::admission::decide), and for a refused
//! drain of a cordoned host marks the Node ([`crate::api::keys::DRAIN_REFUSED_ANNOTATION`]) so
//! the lifecycle starts `auto` maintenance.
//!
//! The API server calls it with `failurePolicy: Ignore`, so a webhook that
//! does not answer lets evictions through; the PodDisruptionBudgets on the
//! protected pods (`POD_EVICTABLE_LABEL`) hold them then. A replica that does
//! not lead, or whose caches are not whole, refuses protected pods with a
//! 429 (the drain tries again) rather than guess.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::Instrument;

use crate::api::keys::PAUSED_ANNOTATION;
use crate::api::{Eviction, Hypervisor, MaintenanceMode};
use crate::drain::admission::{self, EvictionView, Host, PodKind, Protected, Verdict};
use crate::k8s::Gate;
use crate::metrics::WebhookOutcome as Outcome;

/// An AdmissionReview is a few kilobytes; anything past this is not one.
const MAX_BODY: usize = 1 << 20;
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the webhook reads and may write.
pub struct Webhook {
    /// Lease-guarded: only the leader marks a Node.
    pub client: kube::Client,
    pub hypervisors: Store<Hypervisor>,
    pub nodes: Store<Node>,
    pub evictions: Store<Eviction>,
    pub gate: Arc<Gate>,
    pub protected: Protected,
    pub updates: Arc<crate::k8s::updates::UpdateLimit>,
    /// Its requests by outcome, and their answer times.
    pub metrics: crate::metrics::WebhookCalls,
}

struct Tls {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl hv_listen::Accept for Tls {
    type Io = TlsStream<TcpStream>;

    async fn next(&self) -> std::io::Result<TcpStream> {
        self.tcp.accept().await.map(|(s, _)| s)
    }

    fn ready(&self, tcp: TcpStream) -> impl Future<Output = std::io::Result<Self::Io>> + Send + 'static {
        self.acceptor.accept(tcp)
    }
}

/// Binds `addr` and serves the webhook over TLS with `config` until the
/// process ends; answers the bound address.
pub async fn serve(
    addr: SocketAddr,
    config: Arc<hv_tls::server::ServerConfig>,
    hook: Arc<Webhook>,
) -> std::io::Result<SocketAddr> {
    let tcp = TcpListener::bind(addr).await?;
    let bound = tcp.local_addr()?;
    let listener = Tls { tcp, acceptor: TlsAcceptor::from(config) };
    let limits = hv_listen::Limits { max_connections: 64, ..Default::default() };
    tokio::spawn(hv_listen::accept_loop(listener, limits, move |req| {
        let hook = hook.clone();
        async move { hook.handle(req).await }
    }));
    Ok(bound)
}

/// The request of an AdmissionReview as the API server sends it; None for
/// anything else.
fn request_of(body: &[u8]) -> Option<AdmissionRequest<DynamicObject>> {
    let review = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body).ok()?;
    TryInto::<AdmissionRequest<DynamicObject>>::try_into(review).ok()
}

/// An eviction an observing install would refuse, allowed and logged.
fn would_refuse(allow: AdmissionResponse, kind: &PodKind, message: &str) -> AdmissionResponse {
    tracing::info!(?kind, %message, "eviction allowed: this install observes only; it would refuse it");
    allow
}

fn json(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    r
}

impl Webhook {
    /// Answers one request, counted by what it came to.
    async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: hyper::body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let began = std::time::Instant::now();
        let (response, outcome) = self.answer(req).await;
        self.metrics.record(outcome, began.elapsed());
        response
    }

    async fn answer<B>(&self, req: Request<B>) -> (Response<Full<Bytes>>, Outcome)
    where
        B: hyper::body::Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let error = |code: StatusCode, text: String| (hv_listen::text(code, text), Outcome::Error);
        if req.method() != Method::POST {
            return error(StatusCode::METHOD_NOT_ALLOWED, "POST an AdmissionReview\n".into());
        }
        // The API server sends its review at once; a sender that trickles
        // would hold a connection's place.
        let read = tokio::time::timeout(BODY_TIMEOUT, Limited::new(req.into_body(), MAX_BODY).collect());
        let body = match read.await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) => return error(StatusCode::BAD_REQUEST, format!("reading the body: {e}\n")),
            Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "the body did not come in time\n".into()),
        };
        let response = match request_of(&body) {
            Some(request) => match self.review(&request).await {
                Ok(r) => r,
                // Not judged: the API server's failurePolicy (Ignore) and
                // the disruption budgets decide, as for a webhook down.
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
            },
            None => return error(StatusCode::BAD_REQUEST, "not an AdmissionReview with a request\n".into()),
        };
        let outcome = if response.allowed { Outcome::Allowed } else { Outcome::Refused };
        match serde_json::to_vec(&response.into_review()) {
            Ok(b) => (json(StatusCode::OK, b), outcome),
            Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        }
    }

    async fn review(&self, req: &AdmissionRequest<DynamicObject>) -> Result<AdmissionResponse, kube::Error> {
        let allow = AdmissionResponse::from(req);
        if req.resource.resource != "pods" || req.sub_resource.as_deref() != Some("eviction") {
            return Ok(allow);
        }
        let (Some(ns), name) = (req.namespace.as_deref(), req.name.as_str()) else { return Ok(allow) };
        let span =
            tracing::info_span!("eviction", pod = %format!("{ns}/{name}"), node = tracing::field::Empty);
        self.judge(req, ns, name, &span).instrument(span.clone()).await
    }

    async fn judge(
        &self,
        req: &AdmissionRequest<DynamicObject>,
        ns: &str,
        name: &str,
        span: &tracing::Span,
    ) -> Result<AdmissionResponse, kube::Error> {
        let allow = AdmissionResponse::from(req);
        let refuse = |message: String| {
            let mut r = AdmissionResponse::from(req).deny(message);
            r.result.code = 429;
            r.result.reason = "TooManyRequests".into();
            r
        };
        // Outside the protected pods' namespaces nothing is protected (nor
        // may the coordinator read a pod there).
        if !self.protected.covers(ns) {
            return Ok(allow);
        }
        // A pod that cannot be read is not judged: an error answer, and the
        // API server's failurePolicy and the budgets decide.
        let Some(pod) = Api::<Pod>::namespaced(self.client.clone(), ns).get_opt(name).await? else {
            return Ok(allow);
        };
        let kind = self.protected.kind(pod.metadata.labels.as_ref().unwrap_or(&Default::default()));
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else { return Ok(allow) };
        span.record("node", node.as_str());
        if kind == PodKind::Unprotected {
            return Ok(allow);
        }
        if !self.gate.open() {
            return Ok(refuse(format!(
                "hypervisor {node}: hv-coordinator is not ready to judge (not the leader, or its caches are not \
                 synced yet); try again"
            )));
        }
        Ok(match admission::decide(&kind, &self.host(&node)) {
            Verdict::Allow => {
                tracing::info!(?kind, "eviction allowed");
                allow
            }
            // An observing install holds no drain: it says what it would do.
            Verdict::Refuse { message, .. } if self.gate.observes() => would_refuse(allow, &kind, &message),
            Verdict::Refuse { mut message, ask } => {
                // A dry run changes nothing (the configuration's
                // sideEffects: NoneOnDryRun).
                if ask
                    && !req.dry_run
                    && let Err(e) = self.ask(&node).await
                {
                    tracing::warn!(error = %e, "could not mark the Node for maintenance");
                    message.push_str(&format!(" (the ask for maintenance failed: {e}; it is tried again)"));
                }
                tracing::info!(?kind, ask, %message, "eviction refused");
                refuse(message)
            }
        })
    }

    /// The host as the caches hold it.
    fn host(&self, node_name: &str) -> Host {
        let hv = self.hypervisors.get(&ObjectRef::new(node_name));
        let node = self.nodes.get(&ObjectRef::new(node_name));
        let marks = node.as_deref().map(crate::drain::locks::of).unwrap_or_default();
        let status = hv.as_ref().and_then(|h| h.status.clone()).unwrap_or_default();
        let spec_asks = hv.as_ref().is_some_and(|h| h.spec.maintenance != MaintenanceMode::None);
        // The lifecycle's own rule of an update's ask.
        let asked = spec_asks
            || node.as_deref().is_some_and(|n| {
                self.updates.asks(crate::k8s::hypervisor::node_obs(n, &self.updates.signals))
            });
        // Would the host wait for a place once asked? (A peek: no claim.)
        let asking = crate::lifecycle::NodeObs::Present {
            ready: true,
            cordoned: true,
            maintenance_required: true,
            drain_refused: true,
        };
        let update_wait = hv.as_ref().and_then(|h| {
            let phase = crate::lifecycle::service_phase(&status, &crate::lifecycle::NovaObs::Unknown);
            self.updates.wait(node_name, phase, &h.spec, asking, false)
        });
        Host {
            update_wait,
            node: node_name.to_string(),
            phase: hv.as_ref().map(|_| status.phase.unwrap_or_default()),
            vms: status.instances.as_ref().map(|i| i.count),
            evictable: marks.evictable,
            locks: marks.held,
            cordoned: marks.cordoned,
            asked,
            eviction: self.eviction(node_name, status.lifecycle.eviction.as_ref().map(|r| r.name.as_str())),
            paused: hv.as_ref().and_then(|h| h.annotations().get(PAUSED_ANNOTATION).cloned()),
        }
    }

    /// The host's running Eviction, else the one its lifecycle names.
    fn eviction(&self, node: &str, named: Option<&str>) -> Option<EvictionView> {
        let all = self.evictions.state();
        let running = all.iter().find(|e| e.spec.hypervisor == node && e.is_running());
        let ev = running
            .or_else(|| all.iter().find(|e| Some(e.metadata.name.as_deref().unwrap_or("")) == named))?;
        let st = ev.status.clone().unwrap_or_default();
        Some(EvictionView {
            name: ev.metadata.name.clone().unwrap_or_default(),
            phase: st.phase.unwrap_or_default(),
            migrated: st.migrated,
            total: st.total,
            message: ev.unmet_message(),
        })
    }

    /// Marks the Node: a drain was refused while the host was in service.
    /// Only while the Node is still cordoned (a JSON patch's test): a mark
    /// landing after the uncordon would ask at the next cordon. Added under
    /// the annotations, never replacing them (other operators' locks are
    /// there); the whole map only for a Node that has none (a 422).
    async fn ask(&self, node: &str) -> Result<(), kube::Error> {
        let now = jiff::Timestamp::now().to_string();
        let key = crate::api::keys::DRAIN_REFUSED_ANNOTATION.replace('~', "~0").replace('/', "~1");
        let cordoned = serde_json::json!({"op": "test", "path": "/spec/unschedulable", "value": true});
        let one =
            serde_json::json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": now});
        let api: Api<Node> = Api::all(self.client.clone());
        let send = |ops: serde_json::Value| {
            let api = api.clone();
            async move {
                let patch: json_patch::Patch =
                    serde_json::from_value(ops).map_err(kube::Error::SerdeError)?;
                api.patch(node, &kube::api::PatchParams::default(), &kube::api::Patch::Json::<()>(patch))
                    .await
            }
        };
        match send(serde_json::json!([cordoned, one])).await {
            Err(kube::Error::Api(e)) if e.code == 422 && self.unannotated(node) => {
                let all = serde_json::json!({"op": "add", "path": "/metadata/annotations",
                    "value": {crate::api::keys::DRAIN_REFUSED_ANNOTATION: now}});
                send(serde_json::json!([cordoned, {"op": "test", "path": "/metadata/annotations", "value": null}, all]))
                    .await
                    .map(|_| ())
            }
            r => r.map(|_| ()),
        }
    }

    fn unannotated(&self, node: &str) -> bool {
        self.nodes.get(&ObjectRef::new(node)).is_none_or(|n| n.metadata.annotations.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review of the eviction of pod `ns/name`.
    fn eviction_review(ns: &str, name: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "kind": "AdmissionReview",
            "apiVersion": "admission.k8s.io/v1",
            "request": {
                "uid": "u1",
                "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "subResource": "eviction",
                "name": name,
                "namespace": ns,
                "operation": "CREATE",
                "userInfo": {"username": "drainer"},
                "object": {"kind": "Eviction", "apiVersion": "policy/v1", "metadata": {"name": name, "namespace": ns}},
                "dryRun": false
            }
        }))
        .unwrap_or_default()
    }

    /// A webhook whose API server answers every pod read with a
    /// nova-compute pod on node n1, its caches empty and its gate shut (a
    /// replica that does not lead).
    fn hook() -> Webhook {
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<http::Request<Body>, http::Response<Body>>();
        tokio::spawn(async move {
            while let Some((_, send)) = handle.next_request().await {
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "nova-compute-n1", "namespace": "openstack",
                        "labels": {"app": "nova-compute"}},
                    "spec": {"nodeName": "n1", "containers": []}});
                if let Ok(rsp) = http::Response::builder()
                    .status(200)
                    .body(Body::from(serde_json::to_vec(&pod).unwrap_or_default()))
                {
                    send.send_response(rsp);
                }
            }
        });
        let client = kube::Client::new(svc, "default");
        let hypervisor =
            "app=nova-compute".parse::<crate::drain::admission::Selector>().into_iter().collect();
        Webhook {
            client,
            hypervisors: kube::runtime::reflector::store::<Hypervisor>().0,
            nodes: kube::runtime::reflector::store::<Node>().0,
            evictions: kube::runtime::reflector::store::<Eviction>().0,
            gate: Arc::new(Gate::new(Arc::new(crate::k8s::leader::LeaseGuard::new(
                std::time::Duration::from_secs(1),
            )))),
            protected: Protected { hypervisor, dependents: vec![], namespaces: vec!["openstack".into()] },
            updates: Arc::new(crate::k8s::updates::UpdateLimit::new(
                0,
                false,
                Default::default(),
                kube::runtime::reflector::store::<Hypervisor>().0,
                kube::runtime::reflector::store::<Node>().0,
            )),
            metrics: Default::default(),
        }
    }

    fn post(body: Vec<u8>) -> Request<Full<Bytes>> {
        let mut r = Request::new(Full::new(Bytes::from(body)));
        *r.method_mut() = Method::POST;
        r
    }

    /// Each request is counted by what it came to, with its answer time:
    /// a pod outside the protected namespaces let through, a protected pod
    /// refused while the replica cannot judge, a request that is no review
    /// and one that is no POST not judged.
    #[tokio::test]
    async fn requests_are_counted_by_outcome_with_their_answer_times() {
        let m = crate::metrics::Metrics::default();
        let hook = Webhook { metrics: m.webhook.clone(), ..hook() };
        let allowed = hook.handle(post(eviction_review("kube-system", "coredns-1"))).await;
        assert_eq!(allowed.status(), StatusCode::OK);
        let refused = hook.handle(post(eviction_review("openstack", "nova-compute-n1"))).await;
        assert_eq!(refused.status(), StatusCode::OK);
        let body = refused.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let review: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        assert_eq!(review["response"]["allowed"], false, "{review}");
        assert_eq!(hook.handle(post(b"not a review".to_vec())).await.status(), StatusCode::BAD_REQUEST);
        let get = Request::new(Full::new(Bytes::new()));
        assert_eq!(hook.handle(get).await.status(), StatusCode::METHOD_NOT_ALLOWED);
        let text = m.render();
        for line in [
            "hv_webhook_requests_total{outcome=\"allowed\"} 1",
            "hv_webhook_requests_total{outcome=\"refused\"} 1",
            "hv_webhook_requests_total{outcome=\"error\"} 2",
            "hv_webhook_request_duration_seconds_count{outcome=\"refused\"} 1",
            "hv_webhook_request_duration_seconds_count{outcome=\"error\"} 2",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    /// An eviction's review as a Kubernetes 1.33 API server sends it, written
    /// out by hand (the end-to-end drain test has the ground's API server
    /// send its own; this one pins the wire format in a unit test).
    #[test]
    fn the_api_servers_review_of_an_eviction_is_read() {
        let body = br#"{
          "kind": "AdmissionReview",
          "apiVersion": "admission.k8s.io/v1",
          "request": {
            "uid": "0df28fbd-5f5f-11e8-bc74-36e6bb280816",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "eviction",
            "name": "nova-compute-compute-3",
            "namespace": "openstack",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:node-drainer",
              "uid": "014fbff9a07c", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": {"kind": "Eviction", "apiVersion": "policy/v1",
              "metadata": {"name": "nova-compute-compute-3", "namespace": "openstack",
                "creationTimestamp": null},
              "deleteOptions": {"gracePeriodSeconds": 30}},
            "oldObject": null,
            "dryRun": false,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
          }
        }"#;
        let req = request_of(body).expect("read");
        assert_eq!(req.uid, "0df28fbd-5f5f-11e8-bc74-36e6bb280816");
        assert_eq!((req.resource.resource.as_str(), req.sub_resource.as_deref()), ("pods", Some("eviction")));
        assert_eq!(
            (req.namespace.as_deref(), req.name.as_str()),
            (Some("openstack"), "nova-compute-compute-3")
        );
        assert!(!req.dry_run);
        let denied = serde_json::to_value(AdmissionResponse::from(&req).deny("busy").into_review()).unwrap();
        assert_eq!(denied["response"]["uid"], "0df28fbd-5f5f-11e8-bc74-36e6bb280816");
        assert_eq!(denied["response"]["allowed"], false);
        for garbage in
            [&b"{garbled"[..], br#"{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}"#]
        {
            assert!(request_of(garbage).is_none());
        }
    }
}
