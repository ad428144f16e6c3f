//! The dependency pods of every host (`--node-dependency`), cached: one
//! watch per dependency, in its namespace only, each pod cut to its name,
//! its Node and whether it is Ready. A change wakes its Node's Hypervisor
//! while this replica leads, so a host waiting in Ready is enabled as soon
//! as its network agent is.

use futures_util::FutureExt;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus};
use kube::Api;
use kube::runtime::reflector::Store;
use tokio::sync::mpsc;

use crate::lifecycle::dependencies::{Dependency, PodState, unmet};

/// The caches, one per dependency, in the order given.
#[derive(Clone, Default)]
pub struct NodeDependencies {
    watched: Vec<(Dependency, Store<Pod>)>,
}

impl NodeDependencies {
    /// What the host of Node `node` lacks, one line per dependency; None
    /// while a watch has not listed its pods yet.
    pub fn unmet_on(&self, node: &str) -> Option<Vec<String>> {
        let mut out = Vec::new();
        for (dep, store) in &self.watched {
            store.wait_until_ready().now_or_never()?.ok()?;
            let pods: Vec<PodState> = store
                .state()
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
                .map(|p| PodState { name: p.metadata.name.clone().unwrap_or_default(), ready: ready(p) })
                .collect();
            out.extend(unmet(dep, &pods));
        }
        Some(out)
    }
}

/// Its `Ready` condition True, and not being deleted.
fn ready(p: &Pod) -> bool {
    let conditions = p.status.as_ref().and_then(|s| s.conditions.as_ref());
    p.metadata.deletion_timestamp.is_none()
        && conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Starts the watches (each in a task of its own, until the process ends);
/// `wake` gets the Node of each pod that changes while this replica leads.
pub fn watch(
    client: &kube::Client,
    dependencies: &[Dependency],
    wake: mpsc::UnboundedSender<String>,
    leading: tokio::sync::watch::Receiver<bool>,
) -> NodeDependencies {
    let watched = dependencies
        .iter()
        .map(|dep| {
            let api = Api::<Pod>::namespaced(client.clone(), &dep.namespace);
            let store = super::protected_pods::watched(
                api,
                dep.selector.as_str(),
                trim,
                (&wake, &leading),
                "dependency pod watch",
            );
            (dep.clone(), store)
        })
        .collect();
    NodeDependencies { watched }
}

/// What is kept of a pod: its name, its Node, its `Ready` condition and
/// whether it is being deleted.
fn trim(pod: &mut Pod) {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec { node_name, containers: Vec::new(), ..Default::default() });
    let ready = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| {
        c.iter().find(|c| c.type_ == "Ready").map(|c| PodCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            ..Default::default()
        })
    });
    pod.status = Some(PodStatus { conditions: ready.map(|c| vec![c]), ..Default::default() });
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.metadata.owner_references = None;
    pod.metadata.labels = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_is_the_condition_and_not_being_deleted() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "ovs-1", "namespace": "openstack"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}]}
        }))
        .unwrap_or_default();
        assert!(ready(&p));
        trim(&mut p);
        assert!(ready(&p), "trimmed, it is as Ready");
        assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("node-1"));
        p.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert!(!ready(&p), "a pod being deleted is on its way out");
        let mut q = p.clone();
        q.metadata.deletion_timestamp = None;
        q.status = None;
        assert!(!ready(&q), "no condition is not Ready");
    }
}
