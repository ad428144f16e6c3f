//! The protected pods of each hypervisor Node, cached, and the label the
//! chart's disruption budgets read on them ([`POD_EVICTABLE_LABEL`]): `"false"`
//! while their host is not evictable, `"true"` once it is. A budget holds
//! every protected pod not labelled `"true"`, so it fails closed: a pod
//! started while the coordinator is down, or before its host's reconcile,
//! is held until the coordinator says otherwise. Pods that match a
//! protected selector on a Node that is no hypervisor (a network agent on a
//! network node) are labelled `"true"` by [`free_elsewhere`].
//!
//! One watch per selector the site names (and per namespace it names, with
//! `--pod-namespace`: no right on pods is needed elsewhere), each object cut to what is used
//! (name, namespace, labels, node): a region's protected pods are a few
//! per host, and the cache is what keeps the marks from costing a list per
//! reconcile. A new protected pod wakes its Node's drain marks
//! (`k8s::drain_marks`), so its label follows at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use crate::api::keys::POD_EVICTABLE_LABEL;
use crate::drain::admission::Protected;

/// The caches, one per selector.
#[derive(Clone, Default)]
pub struct ProtectedPods {
    stores: Vec<Store<Pod>>,
}

impl ProtectedPods {
    /// Over caches filled elsewhere (tests).
    #[cfg(test)]
    pub(crate) fn over(stores: Vec<Store<Pod>>) -> ProtectedPods {
        ProtectedPods { stores }
    }

    /// Waits for every watch's first list; false when one can never come.
    pub async fn wait_until_ready(&self) -> bool {
        for store in &self.stores {
            if store.wait_until_ready().await.is_err() {
                return false;
            }
        }
        true
    }

    /// Every protected pod (each once).
    pub fn all(&self) -> Vec<Arc<Pod>> {
        self.matching(|_| true)
    }

    /// The protected pods `keep` keeps, each once though several selectors
    /// match it (kept before they are keyed: a reconcile asks for one
    /// Node's few among the fleet's).
    fn matching(&self, keep: impl Fn(&Pod) -> bool) -> Vec<Arc<Pod>> {
        let mut seen = BTreeMap::new();
        for pod in self.stores.iter().flat_map(|s| s.state()).filter(|p| keep(p)) {
            seen.entry((pod.metadata.namespace.clone(), pod.metadata.name.clone())).or_insert(pod);
        }
        seen.into_values().collect()
    }

    /// The protected pods on `node` (each once, though several selectors
    /// match it).
    pub fn on_node(&self, node: &str) -> Vec<Arc<Pod>> {
        self.matching(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
    }
}

/// The protected pods that are no hypervisor's and not yet labelled
/// evictable, as (namespace, name): their Node has no Hypervisor
/// (`is_hypervisor`). A pod not yet scheduled has no Node and waits. Pure.
pub fn elsewhere(pods: &[Arc<Pod>], is_hypervisor: impl Fn(&str) -> bool) -> Vec<(String, String)> {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !is_hypervisor(n)))
        .filter(|p| relabel(p, Some(true)).is_some())
        .filter_map(|p| Some((p.metadata.namespace.clone()?, p.metadata.name.clone()?)))
        .collect()
}

/// Labels the protected pods on Nodes that are no hypervisor (not selected,
/// or without a Hypervisor) evictable,
/// every few seconds while this replica leads (`gate`): the budgets hold a
/// protected pod until it is, and no host needs these. Until the process
/// ends.
pub async fn free_elsewhere(
    client: kube::Client,
    pods: ProtectedPods,
    hypervisors: Store<crate::api::Hypervisor>,
    nodes: Store<k8s_openapi::api::core::v1::Node>,
    gate: Arc<crate::k8s::Gate>,
) {
    loop {
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        // An observing install labels no pod.
        if !gate.open() || gate.observes() {
            continue;
        }
        // A hypervisor: a Node the coordinator selects (`--node-selector`)
        // with its Hypervisor. One that left the selection keeps its
        // Hypervisor as the record, and its pods are freed.
        let is_hypervisor = |n: &str| {
            nodes.get(&reflector::ObjectRef::new(n)).is_some()
                && hypervisors.get(&reflector::ObjectRef::new(n)).is_some()
        };
        for (ns, name) in elsewhere(&pods.all(), is_hypervisor) {
            let patch = serde_json::json!({"metadata": {"labels": {POD_EVICTABLE_LABEL: "true"}}});
            let api = Api::<Pod>::namespaced(client.clone(), &ns);
            match api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await
            {
                Ok(_) => {
                    tracing::info!(pod = %format!("{ns}/{name}"), "protected pod on a Node that is no hypervisor labelled evictable")
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "could not label a protected pod")
                }
            }
        }
    }
}

/// The label a protected pod should carry, if it differs from its own:
/// `evictable` as the host's marks say (None: unknown, left as it is).
pub fn relabel(pod: &Pod, evictable: Option<bool>) -> Option<String> {
    let want = evictable?.to_string();
    let have = pod.metadata.labels.as_ref().and_then(|l| l.get(POD_EVICTABLE_LABEL));
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
    let each = protected.selectors().flat_map(|s| protected.watched().into_iter().map(move |ns| (s, ns)));
    for (selector, namespace) in each {
        let api = match namespace {
            Some(ns) => Api::<Pod>::namespaced(client.clone(), ns),
            None => Api::<Pod>::all(client.clone()),
        };
        stores.push(watched(api, selector.as_str(), trim, (&wake, &leading), "protected pod watch"));
    }
    ProtectedPods { stores }
}

/// A cache of the pods of `api` that `selector` selects, each cut by
/// `trim`, filled by a watch in a task of its own until the process ends;
/// `wake` gets the Node of each pod that changes while this replica leads
/// (`leading`: a follower's wakes would pile up unread). `what` names the
/// watch in its warnings.
pub(crate) fn watched(
    api: Api<Pod>,
    selector: &str,
    trim: fn(&mut Pod),
    (wake, leading): (&mpsc::UnboundedSender<String>, &tokio::sync::watch::Receiver<bool>),
    what: &'static str,
) -> Store<Pod> {
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(selector);
    let pods = watcher(api, config).default_backoff().modify(trim).reflect(writer).applied_objects();
    let (wake, selector, leading) = (wake.clone(), selector.to_string(), leading.clone());
    tokio::spawn(async move {
        let mut pods = std::pin::pin!(pods);
        while let Some(item) = pods.next().await {
            match item {
                Ok(pod) => {
                    if let Some(node) = pod.spec.and_then(|s| s.node_name).filter(|_| *leading.borrow()) {
                        let _ = wake.send(node);
                    }
                }
                Err(e) => tracing::warn!(error = %e, %selector, "{what}"),
            }
        }
    });
    reader
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

    fn pod(ns: &str, name: &str, node: Option<&str>, label: Option<&str>) -> Arc<Pod> {
        let mut p = Pod {
            spec: Some(PodSpec { node_name: node.map(String::from), ..Default::default() }),
            ..Default::default()
        };
        p.metadata.namespace = Some(ns.into());
        p.metadata.name = Some(name.into());
        p.metadata.labels = label.map(|v| [(POD_EVICTABLE_LABEL.to_string(), v.to_string())].into());
        Arc::new(p)
    }

    #[test]
    fn pods_on_nodes_that_are_no_hypervisor_are_freed_and_only_those() {
        let pods = [
            pod("openstack", "l2-net-1", Some("net-1"), None),
            pod("openstack", "l2-net-2", Some("net-2"), Some("false")),
            pod("openstack", "l2-net-3", Some("net-3"), Some("true")),
            pod("openstack", "l2-compute-1", Some("compute-1"), None),
            pod("openstack", "l2-pending", None, None),
        ];
        let free = elsewhere(&pods, |n| n.starts_with("compute-"));
        let want = [("openstack", "l2-net-1"), ("openstack", "l2-net-2")];
        assert_eq!(free, want.map(|(a, b)| (a.to_string(), b.to_string())));
    }

    #[test]
    fn a_pod_is_relabelled_only_when_its_label_differs_and_the_state_is_known() {
        let mut pod = Pod::default();
        assert_eq!(relabel(&pod, Some(false)).as_deref(), Some("false"), "unlabelled: labelled");
        assert_eq!(relabel(&pod, None), None, "unknown: left");
        pod.metadata.labels = Some([(POD_EVICTABLE_LABEL.to_string(), "false".to_string())].into());
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
