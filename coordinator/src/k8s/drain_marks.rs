//! The drain marks (docs/drain.md), a controller of their own: the node
//! lock protocol's label and lock annotations on a hypervisor's Node
//! ([`drain::locks`](crate::drain::locks)), and the evictable label on its
//! protected pods, as its Hypervisor's `status.evictable` says. The
//! Hypervisor reconcile decides that value from its own read of Nova; this
//! one only writes the marks. It looks again when the value changes
//! ([`super::triggers::marks`]), and every drift interval to repair a
//! hand's change of a mark or label a protected pod that came since.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{ObjectRef, Store};

use super::Gate;
use super::protected_pods::{ProtectedPods, relabel};
use crate::api::Hypervisor;
use crate::api::keys::POD_EVICTABLE_LABEL;
use crate::drain::locks;

/// Longest a reconcile waits for the caches to be whole before it is
/// asked again.
const GATE_WAIT: Duration = Duration::from_secs(5);

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
}

/// Writes the marks the Hypervisor's status asks for. A failed write is
/// logged and tried again at the next look: each mark is compared with
/// what is wanted every time.
pub async fn reconcile(
    hv: Arc<Hypervisor>,
    ctx: Arc<MarksContext>,
) -> Result<Requeue, super::hypervisor::Error> {
    if !ctx.gate.open() {
        ctx.gate.until_synced(GATE_WAIT).await;
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let want = hv.status.as_ref().and_then(|s| s.evictable);
    mark(&ctx, &hv.name_any(), want).await;
    Ok(Requeue::requeue(ctx.drift))
}

pub fn error_policy(
    _hv: Arc<Hypervisor>,
    _error: &super::hypervisor::Error,
    _ctx: Arc<MarksContext>,
) -> Requeue {
    Requeue::requeue(Duration::from_secs(10))
}

/// The Node's marks and its protected pods' labels as `want` says (None:
/// not known; the Node's marks stay, and its pods follow the Node).
async fn mark(ctx: &MarksContext, name: &str, want: Option<bool>) {
    // Without a Node there is nothing to mark.
    let Some(node) = ctx.nodes.get(&ObjectRef::new(name)) else { return };
    let now = locks::of(&node);
    // Freed: the pods before the Node, so the budgets let go as soon as the
    // webhook does. Locked: the Node first, the webhook refusing at once.
    if want == Some(true) && !label_pods(ctx, name, want).await {
        return; // the Node waits for its pods: tried again at the next look
    }
    if let Some(patch) = locks::patch(&now, want, &ctx.node_locks) {
        let api: Api<Node> = Api::all(ctx.client.clone());
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => tracing::info!(node = name, evictable = ?want, "node locks written"),
            Err(e) => tracing::warn!(node = name, error = %e, "could not write the node locks"),
        }
    }
    if want != Some(true) {
        label_pods(ctx, name, want.or(now.evictable)).await;
    }
}

/// Sets [`POD_EVICTABLE_LABEL`] on the Node's protected pods as
/// `evictable` says, where it differs; false when a write failed.
async fn label_pods(ctx: &MarksContext, node: &str, evictable: Option<bool>) -> bool {
    let mut all = true;
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
                all = false;
                tracing::warn!(node, %pod, error = %e, "could not label a protected pod");
            }
        }
    }
    all
}
