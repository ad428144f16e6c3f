//! The drain marks (docs/drain.md), a controller of their own: the node
//! lock protocol's label and lock annotations on a hypervisor's Node
//! ([`drain::locks`](crate::drain::locks)), and the evictable label on its
//! protected pods, as its Hypervisor's `status.evictable` says. The
//! Hypervisor reconcile decides that value; this one only writes the
//! marks, and frees a host only once this leader found it free on its own
//! read of Nova ([`OwnReads`]): not on the fleet view's word, nor on a
//! status a former leader wrote. It looks again when the value changes
//! ([`super::triggers::marks`]), and every drift interval to repair a
//! hand's change of a mark or label a protected pod that came since.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Gate;
use super::protected_pods::{ProtectedPods, relabel};
use crate::api::Hypervisor;
use crate::api::keys::{PAUSED_ANNOTATION, POD_EVICTABLE_LABEL};
use crate::drain::locks;
use crate::lifecycle::hands::Hands;

/// Longest a reconcile waits for the caches to be whole before it is
/// asked again.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// How soon marks not written are tried again.
const RETRY: Duration = Duration::from_secs(5);

/// The hosts this leader found free for drains on its own read of Nova,
/// recorded by the Hypervisor reconcile before it writes
/// `status.evictable`; one set per leadership, so a new leader frees
/// nothing before it has read the host itself.
#[derive(Default)]
pub struct OwnReads {
    free: Mutex<HashSet<String>>,
    /// Wakes a host's drain marks when its own read finds it free: its
    /// status may already say so (a former leader wrote it), and then no
    /// change of status would.
    wake: Option<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl OwnReads {
    pub fn waking(wake: tokio::sync::mpsc::UnboundedSender<String>) -> OwnReads {
        OwnReads { free: Mutex::default(), wake: Some(wake) }
    }

    /// What the host's own read says of it (`evictable` as decided from it).
    pub fn record(&self, host: &str, evictable: Option<bool>) {
        let newly = {
            let mut free = crate::locked::lock(&self.free);
            if evictable == Some(true) {
                free.insert(host.to_string())
            } else {
                free.remove(host);
                false
            }
        };
        if let Some(wake) = self.wake.as_ref().filter(|_| newly) {
            let _ = wake.send(host.to_string());
        }
    }

    /// Whether this leader's own read found the host free.
    pub fn free(&self, host: &str) -> bool {
        crate::locked::lock(&self.free).contains(host)
    }
}

pub struct MarksContext {
    pub client: kube::Client,
    pub nodes: Store<Node>,
    /// The pods a drain must not take while the host needs them, cached.
    pub pods: ProtectedPods,
    /// The dependents whose lock the Node carries while its VMs need them.
    pub node_locks: Vec<String>,
    pub gate: Arc<Gate>,
    /// How often the marks are compared with what is wanted though nothing
    /// changed (`--drift-interval`).
    pub drift: Duration,
    /// The hosts this leader may free.
    pub own_reads: Arc<OwnReads>,
}

/// Writes the marks the Hypervisor's status asks for. A failed write is an
/// error (counted, and the marks looked at again soon): each mark is
/// compared with what is wanted every time.
pub async fn reconcile(
    hv: Arc<Hypervisor>,
    ctx: Arc<MarksContext>,
) -> Result<Requeue, super::hypervisor::Error> {
    if !ctx.gate.open() {
        ctx.gate.until_synced(GATE_WAIT).await;
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let name = hv.name_any();
    // Hands off: the Node's marks and its pods' labels stay as they are.
    let paused = hv.annotations().get(PAUSED_ANNOTATION).map(String::as_str);
    if !Hands::of(ctx.gate.observes(), paused).free() {
        return Ok(Requeue::requeue(ctx.drift));
    }
    // Free in status but not on this leader's own read: not known yet (the
    // Hypervisor reconcile reads the host before it confirms).
    let want = hv.status.as_ref().and_then(|s| s.evictable).filter(|&e| !e || ctx.own_reads.free(&name));
    mark(&ctx, &name, want).await?;
    Ok(Requeue::requeue(ctx.drift))
}

/// A mark not written is tried again soon, not a drift interval later.
pub fn error_policy(
    hv: Arc<Hypervisor>,
    error: &super::hypervisor::Error,
    ctx: Arc<MarksContext>,
) -> Requeue {
    tracing::warn!(node = %hv.name_any(), error = %error, "drain marks not written");
    Requeue::requeue(RETRY.min(ctx.drift))
}

/// The Node's marks and its protected pods' labels as `want` says (None:
/// not known; the Node's marks stay, and its pods follow the Node).
async fn mark(ctx: &MarksContext, name: &str, want: Option<bool>) -> Result<(), kube::Error> {
    // Without a Node there is nothing to mark.
    let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else { return Ok(()) };
    let now = locks::of(&node);
    // Freed: the pods before the Node, so the budgets let go as soon as the
    // webhook does. Locked: the Node first, the webhook refusing at once.
    // The Node waits for its pods: a pod not labelled leaves it locked.
    if want == Some(true) {
        label_pods(ctx, name, want).await?;
    }
    let mut node_written = Ok(());
    if let Some(patch) = locks::patch(&now, want, &ctx.node_locks) {
        let api: Api<Node> = Api::all(ctx.client.clone());
        node_written = api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ());
        if node_written.is_ok() {
            tracing::info!(node = name, evictable = ?want, "node locks written");
        }
    }
    // Locked: the pods are labelled whatever became of the Node's write.
    if want != Some(true) {
        label_pods(ctx, name, want.or(now.evictable)).await?;
    }
    node_written
}

/// Sets [`POD_EVICTABLE_LABEL`] on the Node's protected pods as
/// `evictable` says, where it differs; every pod is tried, and the last
/// write that failed is the error.
async fn label_pods(ctx: &MarksContext, node: &str, evictable: Option<bool>) -> Result<(), kube::Error> {
    let mut failed = Ok(());
    for pod in ctx.pods.on_node(node) {
        let Some(value) = relabel(&pod, evictable) else { continue };
        let (Some(ns), Some(pod_name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref())
        else {
            continue;
        };
        let patch = serde_json::json!({"metadata": {"labels": {POD_EVICTABLE_LABEL: value}}});
        let api = Api::<Pod>::namespaced(ctx.client.clone(), ns);
        let pod = format!("{ns}/{pod_name}");
        match api.patch(pod_name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => tracing::info!(node, %pod, %value, "protected pod labelled"),
            Err(e) => {
                tracing::warn!(node, %pod, error = %e, "could not label a protected pod");
                failed = Err(e);
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {

    use http::{Method, Request, Response};
    use k8s_openapi::api::core::v1::PodSpec;
    use kube::client::Body;
    use kube::runtime::{reflector, watcher};

    use super::*;
    use crate::api::keys::EVICTABLE_LABEL;
    use crate::k8s::leader::LeaseGuard;

    /// A mock API server: logs "METHOD path" and answers `fail` paths 500.
    fn client(log: Arc<Mutex<Vec<String>>>, fail: &'static str) -> kube::Client {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let (method, path) = (req.method().clone(), req.uri().path().to_string());
                if let Ok(mut l) = log.lock() {
                    l.push(format!("{method} {path}"));
                }
                let code = if !fail.is_empty() && path.contains(fail) && method == Method::PATCH {
                    500
                } else {
                    200
                };
                let body = if code == 500 {
                    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500, "message": "boom"})
                } else {
                    let kind = if path.contains("/pods/") { "Pod" } else { "Node" };
                    serde_json::json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "x"}})
                };
                if let Ok(rsp) = Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                {
                    send.send_response(rsp);
                }
            }
        });
        kube::Client::new(svc, "default")
    }

    /// The marks' context over a mock API server, `node-1` found free on
    /// this leader's own read.
    fn marks(
        log: Arc<Mutex<Vec<String>>>,
        fail: &'static str,
        node_labels: &[(&str, &str)],
    ) -> Arc<MarksContext> {
        let own_reads = OwnReads::default();
        own_reads.record("node-1", Some(true));
        marks_with(log, fail, node_labels, own_reads)
    }

    fn marks_with(
        log: Arc<Mutex<Vec<String>>>,
        fail: &'static str,
        node_labels: &[(&str, &str)],
        own_reads: OwnReads,
    ) -> Arc<MarksContext> {
        let (nodes, mut nw) = reflector::store::<Node>();
        let mut node = Node::default();
        node.metadata.name = Some("node-1".into());
        node.metadata.labels =
            Some(node_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        nw.apply_watcher_event(&watcher::Event::Apply(node));
        let (pods, mut pw) = reflector::store::<Pod>();
        let mut pod = Pod::default();
        pod.metadata.name = Some("nova-compute-1".into());
        pod.metadata.namespace = Some("openstack".into());
        pod.spec = Some(PodSpec { node_name: Some("node-1".into()), ..Default::default() });
        pw.apply_watcher_event(&watcher::Event::Apply(pod));
        let lease = Arc::new(LeaseGuard::new(Duration::ZERO));
        lease.renewed(tokio::time::Instant::now(), Duration::from_secs(3600));
        let gate = Gate::new(lease);
        gate.mark_synced();
        Arc::new(MarksContext {
            client: client(log, fail),
            nodes,
            pods: ProtectedPods::over(vec![pods]),
            node_locks: vec!["ovn".into()],
            gate: Arc::new(gate),
            drift: Duration::from_secs(60),
            own_reads: Arc::new(own_reads),
        })
    }

    fn with_evictable(evictable: Option<bool>) -> Arc<Hypervisor> {
        let mut h = Hypervisor::new("node-1", Default::default());
        h.status = Some(crate::api::HypervisorStatus { evictable, ..Default::default() });
        Arc::new(h)
    }

    fn sent(log: &Arc<Mutex<Vec<String>>>) -> Vec<String> {
        log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    const POD: &str = "PATCH /api/v1/namespaces/openstack/pods/nova-compute-1";
    const NODE: &str = "PATCH /api/v1/nodes/node-1";

    #[tokio::test]
    async fn freeing_labels_the_pods_before_the_node_and_a_pod_not_labelled_keeps_the_node_locked() {
        let log = Arc::default();
        let locked = [(EVICTABLE_LABEL, "false")];
        let next = reconcile(with_evictable(Some(true)), marks(Arc::clone(&log), "", &locked)).await;
        assert_eq!(next.ok(), Some(Requeue::requeue(Duration::from_secs(60))));
        assert_eq!(sent(&log), [POD, NODE], "the pods first");
        let log = Arc::default();
        let next = reconcile(with_evictable(Some(true)), marks(Arc::clone(&log), "/pods/", &locked)).await;
        assert!(next.is_err(), "a mark not written is an error, looked at again soon");
        assert_eq!(sent(&log), [POD], "the Node stays locked");
    }

    #[tokio::test]
    async fn a_host_free_in_status_is_freed_only_once_this_leaders_own_read_found_it_free() {
        let locked = [(EVICTABLE_LABEL, "false")];
        // A former leader's status, or the fleet view's word: not freed.
        let log = Arc::default();
        let unread = marks_with(Arc::clone(&log), "", &locked, OwnReads::default());
        reconcile(with_evictable(Some(true)), unread.clone()).await.ok();
        assert_eq!(sent(&log), [POD], "the Node stays locked (its pods follow it)");
        // Its own read found it free: freed.
        unread.own_reads.record("node-1", Some(true));
        reconcile(with_evictable(Some(true)), unread.clone()).await.ok();
        assert_eq!(sent(&log), [POD, POD, NODE], "freed: the pods, then the Node");
        // Then found busy again: forgotten.
        unread.own_reads.record("node-1", Some(false));
        assert!(!unread.own_reads.free("node-1"));
    }

    #[test]
    fn a_host_newly_found_free_wakes_its_marks_once() {
        let (tx, mut woken) = tokio::sync::mpsc::unbounded_channel();
        let own = OwnReads::waking(tx);
        own.record("node-1", Some(true));
        own.record("node-1", Some(true));
        own.record("node-1", Some(false));
        assert_eq!(woken.try_recv().ok().as_deref(), Some("node-1"));
        assert!(woken.try_recv().is_err(), "once: found free again wakes nothing, nor locking");
    }

    #[tokio::test]
    async fn locking_marks_the_node_before_the_pods_and_unknown_leaves_the_node_as_it_is() {
        let log = Arc::default();
        let free = [(EVICTABLE_LABEL, "true")];
        reconcile(with_evictable(Some(false)), marks(Arc::clone(&log), "", &free)).await.ok();
        assert_eq!(sent(&log), [NODE, POD], "the Node first");
        // The Node's write failing still locks the pods.
        let log = Arc::default();
        let next = reconcile(with_evictable(Some(false)), marks(Arc::clone(&log), "/nodes/", &free)).await;
        assert!(next.is_err(), "the Node not written is an error");
        assert_eq!(sent(&log), [NODE, POD], "the pods locked all the same");
        // Not known: the Node's marks stay; its pods follow the Node.
        let log = Arc::default();
        reconcile(with_evictable(None), marks(Arc::clone(&log), "", &free)).await.ok();
        assert_eq!(sent(&log), [POD]);
    }
}
