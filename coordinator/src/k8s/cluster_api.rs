//! Cluster API's Machines (docs/drain.md, "Cluster API"), with the
//! `cluster-api` update signal: our pre-drain hook on each hypervisor's
//! Machine, a deleted Machine's mark on its Node (the update's ask), and
//! the hook lifted once the host is emptied and held, as
//! [`crate::drain::cluster_api`] decides. The Machines are read from the
//! cluster the coordinator runs in, at the version the API server
//! recommends; a cluster without Cluster API is looked at again every
//! minute. Each Machine is looked at when it changes and every
//! `look` (a host emptied frees its Machine within that).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use super::Gate;
use super::drain_marks::OwnReads;
use crate::api::Hypervisor;
use crate::api::keys::{CLUSTER_API_HOOK_ANNOTATION, MACHINE_DELETING_ANNOTATION, PAUSED_ANNOTATION};
use crate::drain::cluster_api::{Hook, Host, MachineView, decide};
use crate::lifecycle::hands::Hands;

/// Cluster API's group; its Machines are of kind `Machine`.
pub const GROUP: &str = "cluster.x-k8s.io";

/// How long a cluster without Cluster API waits before it is asked again.
const REDISCOVER: Duration = Duration::from_secs(60);

pub struct MachinesContext {
    pub client: kube::Client,
    pub hypervisors: Store<Hypervisor>,
    pub nodes: Store<Node>,
    pub own_reads: Arc<OwnReads>,
    pub gate: Arc<Gate>,
    /// The install's name: our hook's value, so that another install's
    /// reader can tell whose it is.
    pub instance: String,
    /// How often every Machine is looked at though none changed.
    pub look: Duration,
}

/// Runs until dropped.
pub async fn run(watch_client: kube::Client, ctx: MachinesContext) {
    let resource = discover(&ctx.client).await;
    tracing::info!(version = %resource.version, "Cluster API Machines read");
    let writer = reflector::store::Writer::new(resource.clone());
    let machines = writer.as_reader();
    let api = Api::<DynamicObject>::all_with(watch_client, &resource);
    let events = watcher(api, watcher::Config::default()).default_backoff().reflect(writer).touched_objects();
    let mut events = std::pin::pin!(events);
    let mut tick = tokio::time::interval(ctx.look);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(m)) => one(&ctx, &resource, &m).await,
                Some(Err(e)) => tracing::warn!(error = %e, "Cluster API Machines' watch"),
                None => return,
            },
            _ = tick.tick() => {
                for m in machines.state() {
                    one(&ctx, &resource, &m).await;
                }
                unmark_gone(&ctx, &machines).await;
            }
        }
    }
}

/// The Machine kind at the version the API server recommends, once the
/// group is served.
async fn discover(client: &kube::Client) -> ApiResource {
    let mut told = false;
    loop {
        match kube::discovery::group(client, GROUP).await.map(|g| g.recommended_kind("Machine")) {
            Ok(Some((resource, _))) => return resource,
            Ok(None) | Err(_) if !told => {
                told = true;
                tracing::warn!(
                    group = GROUP,
                    "--update-signal cluster-api: no Cluster API Machines are served here; asking again every minute"
                );
            }
            _ => {}
        }
        tokio::time::sleep(REDISCOVER).await;
    }
}

/// The annotations Cluster API writes on a workload cluster's Node: its
/// Machine's name and namespace.
pub const NODE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
pub const NODE_MACHINE_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";

fn view(m: &DynamicObject, instance: &str) -> MachineView {
    let hook = match m.annotations().get(CLUSTER_API_HOOK_ANNOTATION) {
        None => Hook::Absent,
        Some(v) if v == instance => Hook::Ours,
        Some(_) => Hook::Theirs,
    };
    MachineView {
        key: format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any()),
        node: m.data["status"]["nodeRef"]["name"].as_str().map(str::to_string),
        deleting: m.metadata.deletion_timestamp.is_some(),
        hook,
    }
}

/// The Machine's Node when it is this cluster's: a Node of that name that
/// Cluster API marked as the Machine's (a management cluster serves
/// Machines of other clusters too, whose Nodes may share names with ours).
fn node_of(ctx: &MachinesContext, m: &DynamicObject, node: Option<&str>) -> Option<Arc<Node>> {
    let node = ctx.nodes.get(&ObjectRef::new(node?))?;
    let said = |k: &str| node.annotations().get(k).cloned();
    let ns = m.namespace().unwrap_or_default();
    let ours = said(NODE_MACHINE_ANNOTATION) == Some(m.name_any())
        && said(NODE_MACHINE_NAMESPACE_ANNOTATION) == Some(ns);
    ours.then_some(node)
}

/// Observe one Machine and its host, decide, write. Only while this
/// replica leads, and never for a host whose hands are off.
async fn one(ctx: &MachinesContext, resource: &ApiResource, m: &DynamicObject) {
    if !ctx.gate.open() {
        return;
    }
    let machine = view(m, &ctx.instance);
    let node = node_of(ctx, m, machine.node.as_deref());
    let hv = node.as_ref().and_then(|n| ctx.hypervisors.get(&ObjectRef::new(&n.name_any())));
    let host = match &hv {
        None => Host::NotOurs,
        Some(hv) => {
            let paused = hv.annotations().get(PAUSED_ANNOTATION).map(String::as_str);
            if !Hands::of(ctx.gate.observes(), paused).free() {
                return;
            }
            let name = hv.name_any();
            let evictable = hv.status.as_ref().and_then(|s| s.evictable);
            Host::Ours { freed: evictable == Some(true) && ctx.own_reads.free(&name) }
        }
    };
    let writes = decide(&machine, host);
    if let Some(place) = writes.hook {
        let value = place.then(|| ctx.instance.clone());
        let patch = serde_json::json!({"metadata": {"annotations": {CLUSTER_API_HOOK_ANNOTATION: value}}});
        let api = Api::<DynamicObject>::namespaced_with(
            ctx.client.clone(),
            &m.namespace().unwrap_or_default(),
            resource,
        );
        match api.patch(&m.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::info!(machine = %machine.key, node = ?machine.node, place, "Cluster API pre-drain hook written")
            }
            Err(e) => {
                tracing::warn!(machine = %machine.key, error = %e, "Cluster API pre-drain hook not written")
            }
        }
    }
    if let (Some(mark), Some(node)) = (writes.mark, node)
        && node.annotations().get(MACHINE_DELETING_ANNOTATION) != Some(&mark)
    {
        mark_node(ctx, &node.name_any(), Some(&mark)).await;
    }
}

/// A Node's mark whose Machine is gone, or no longer being deleted, is
/// taken away: the ask ends with it.
async fn unmark_gone(ctx: &MachinesContext, machines: &Store<DynamicObject>) {
    // Not before the Machines' first list: every mark would look orphaned.
    let listed = futures_util::FutureExt::now_or_never(machines.wait_until_ready()).is_some();
    if !ctx.gate.open() || !listed {
        return;
    }
    let deleting: std::collections::BTreeSet<String> = machines
        .state()
        .iter()
        .map(|m| view(m, &ctx.instance))
        .filter(|m| m.deleting)
        .map(|m| m.key)
        .collect();
    for node in ctx.nodes.state() {
        let Some(mark) = node.annotations().get(MACHINE_DELETING_ANNOTATION) else { continue };
        if deleting.contains(mark) {
            continue;
        }
        // Hands off: a paused host's Node is not written.
        let hv = ctx.hypervisors.get(&ObjectRef::new(&node.name_any()));
        let paused = hv.as_ref().and_then(|h| h.annotations().get(PAUSED_ANNOTATION)).map(String::as_str);
        if Hands::of(ctx.gate.observes(), paused).free() {
            mark_node(ctx, &node.name_any(), None).await;
        }
    }
}

async fn mark_node(ctx: &MachinesContext, node: &str, mark: Option<&str>) {
    let patch = serde_json::json!({"metadata": {"annotations": {MACHINE_DELETING_ANNOTATION: mark}}});
    let api: Api<Node> = Api::all(ctx.client.clone());
    match api.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::info!(node, machine = ?mark, "the Node's Cluster API Machine deletion marked"),
        Err(e) => tracing::warn!(node, error = %e, "the Node's Cluster API mark not written"),
    }
}
