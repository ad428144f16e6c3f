//! The protected pods of each hypervisor Node, cached, and the label the
//! chart's disruption budgets read on them ([`POD_EVICTABLE`]): `"false"`
//! while their host is not evictable, `"true"` once it is. A budget selects
//! the pods labelled `"false"` only, so pods that match a protected
//! selector on a Node that is no hypervisor (a network agent on a network
//! node) are never held by it.
//!
//! One watch per selector the site names, each object cut to what is used
//! (name, namespace, labels, node): a region's protected pods are a few
//! per host, and the cache is what keeps the marks from costing a list per
//! reconcile. A new protected pod wakes its Node's reconcile, so its label
//! follows within a reconcile.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::POD_EVICTABLE;
use super::admission::Protected;

/// The caches, one per selector.
#[derive(Clone, Default)]
pub struct ProtectedPods {
    stores: Vec<Store<Pod>>,
}

impl ProtectedPods {
    /// The protected pods on `node` (each once, though several selectors
    /// match it).
    pub fn on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        let mut seen = BTreeMap::new();
        for store in &self.stores {
            for pod in store.state() {
                if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) {
                    let key = (pod.metadata.namespace.clone(), pod.metadata.name.clone());
                    seen.entry(key).or_insert(pod);
                }
            }
        }
        seen.into_values().collect()
    }
}

/// The label a protected pod should carry, if it differs from its own:
/// `evictable` as the host's marks say (None: unknown, left as it is).
pub fn relabel(pod: &Pod, evictable: Option<bool>) -> Option<String> {
    let want = evictable?.to_string();
    let have = pod.metadata.labels.as_ref().and_then(|l| l.get(POD_EVICTABLE));
    (have != Some(&want)).then_some(want)
}

/// Starts the watches (each in a task of its own, until the process
/// ends); `wake` gets the Node of each protected pod that changes while
/// this replica leads (`leading`: a follower's wakes would pile up unread).
pub fn watch(
    client: &kube::Client,
    protected: &Protected,
    wake: mpsc::UnboundedSender<String>,
    leading: tokio::sync::watch::Receiver<bool>,
) -> ProtectedPods {
    let mut stores = Vec::new();
    for selector in protected.selectors() {
        let (reader, writer) = reflector::store();
        stores.push(reader);
        let config = watcher::Config::default().labels(selector.as_str());
        let pods = watcher(Api::<Pod>::all(client.clone()), config)
            .default_backoff()
            .modify(trim)
            .reflect(writer)
            .applied_objects();
        let (wake, what, leading) = (wake.clone(), selector.as_str().to_string(), leading.clone());
        tokio::spawn(async move {
            let mut pods = std::pin::pin!(pods);
            while let Some(item) = pods.next().await {
                match item {
                    Ok(pod) => {
                        if let Some(node) = pod.spec.and_then(|s| s.node_name).filter(|_| *leading.borrow()) {
                            let _ = wake.send(node);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, selector = %what, "protected pod watch"),
                }
            }
        });
    }
    ProtectedPods { stores }
}

/// What is kept of a pod: its name, namespace, labels and node.
fn trim(pod: &mut Pod) {
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec { node_name, containers: Vec::new(), ..Default::default() });
    pod.status = None;
    pod.metadata.managed_fields = None;
    pod.metadata.annotations = None;
    pod.metadata.owner_references = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_relabelled_only_when_its_label_differs_and_the_state_is_known() {
        let mut pod = Pod::default();
        assert_eq!(relabel(&pod, Some(false)).as_deref(), Some("false"), "unlabelled: labelled");
        assert_eq!(relabel(&pod, None), None, "unknown: left");
        pod.metadata.labels = Some([(POD_EVICTABLE.to_string(), "false".to_string())].into());
        assert_eq!(relabel(&pod, Some(false)), None);
        assert_eq!(relabel(&pod, Some(true)).as_deref(), Some("true"));
        let mut big = Pod {
            spec: Some(PodSpec {
                node_name: Some("n".into()),
                containers: vec![Default::default()],
                ..Default::default()
            }),
            ..Default::default()
        };
        big.metadata.annotations = Some([("a".to_string(), "b".repeat(1000))].into());
        trim(&mut big);
        assert_eq!(big.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some("n"));
        assert!(big.metadata.annotations.is_none() && big.spec.unwrap().containers.is_empty());
    }
}
