//! A `Hypervisor` for every selected Node, named after it and owned by it
//! (docs/lifecycle.md, Initial -> Onboarding).
//!
//! The spec is filled once, at creation, from the coordinator's defaults and
//! the Node's `hypervisor.cloud.sap/*` annotations; from then on the
//! Hypervisor's spec is the one source of truth and SREs edit it there.
//!
//! A selected Node carries our finalizer: deleting it is a termination, and the Node stays until its host is decommissioned; the
//! Hypervisor is then orphaned and stays as the record.
//!
//! Each Hypervisor carries the label [`INSTANCE_LABEL`] naming the
//! coordinator install that manages it (its Lease's namespace and name): two installs that
//! share a cluster (two regions, a canary) each act only on their own, and a
//! Node that both select stays with the first (docs/lifecycle.md,
//! "One install, its own hosts"). A Hypervisor without the label (made
//! before it existed) is adopted by the install that selects its Node.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

use super::FIELD_MANAGER;
use crate::api::hypervisor::HypervisorSpec;
use crate::api::keys::{
    AGGREGATES_ANNOTATION, INSTANCE_LABEL, NODE_FINALIZER, NOVA_HOST_ANNOTATION, POOLS_ANNOTATION,
    SKIP_TESTS_ANNOTATION, TRAITS_ANNOTATION,
};
use crate::api::{Hypervisor, Phase};
use crate::lifecycle::{NodeObs, NovaObs};

/// The label selector of this install's Hypervisors.
pub fn instance_selector(instance: &str) -> String {
    format!("{INSTANCE_LABEL}={instance}")
}

/// Whether `v` may be a label's value (and so an install's name): at most
/// 63 letters, digits, '-', '_' or '.', alphanumeric at both ends.
pub fn valid_label_value(v: &str) -> bool {
    let alnum = |ch: Option<char>| ch.is_some_and(|ch| ch.is_ascii_alphanumeric());
    !v.is_empty()
        && v.len() <= 63
        && v.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        && alnum(v.chars().next())
        && alnum(v.chars().last())
}

/// An install's name: its Lease's namespace and name (`hv-system.hv-coordinator`),
/// unique in the cluster as the Lease is; an error when it cannot be a label value.
pub fn instance_name(namespace: &str, lease: &str) -> Result<String, String> {
    let name = format!("{namespace}.{lease}");
    if valid_label_value(&name) {
        Ok(name)
    } else {
        Err(format!(
            "the install's name {name:?} (--namespace.--lease-name) is no label value: at most 63 letters, digits, -, _, .; alphanumeric at both ends"
        ))
    }
}

/// Before this install watches its Hypervisors: every Hypervisor of no
/// install (made before installs were named) is labelled ours when we
/// select its Node or its Node is gone (a decommissioned record); one whose
/// Node exists and another selector takes is left. Each label is written
/// over the version read: of two installs adopting at once, one wins.
/// Done before the caches fill, so no host we managed before an upgrade is
/// ever unseen (its pods freed, its drain let through). Answers how many
/// were adopted.
pub async fn adopt_unlabelled(
    client: &kube::Client,
    selector: &str,
    instance: &str,
) -> Result<usize, kube::Error> {
    use kube::api::ListParams;
    let hvs: Api<Hypervisor> = Api::all(client.clone());
    let unlabelled = hvs.list(&ListParams::default().labels(&format!("!{INSTANCE_LABEL}"))).await?;
    if unlabelled.items.is_empty() {
        return Ok(0);
    }
    let nodes: Api<Node> = Api::all(client.clone());
    let names = |l: kube::core::ObjectList<kube::core::PartialObjectMeta<Node>>| {
        l.items.into_iter().filter_map(|n| n.metadata.name).collect::<std::collections::HashSet<_>>()
    };
    let all = names(nodes.list_metadata(&ListParams::default()).await?);
    let selected = names(nodes.list_metadata(&ListParams::default().labels(selector)).await?);
    let pp = kube::api::PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let mut adopted = 0;
    for hv in unlabelled.items {
        let name = hv.name_any();
        if all.contains(&name) && !selected.contains(&name) {
            continue;
        }
        let label = serde_json::json!({"metadata": {
            "resourceVersion": hv.metadata.resource_version, "labels": {INSTANCE_LABEL: instance}}});
        match hvs.patch(&name, &pp, &kube::api::Patch::Merge(&label)).await {
            Ok(_) => adopted += 1,
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(adopted)
}

/// Whether `hv` is this install's (`instance`), and whether it is another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Belongs {
    Ours,
    /// Made before installs were named: the install selecting its Node adopts it.
    Nobodys,
    Theirs,
}

pub fn belongs(hv: &Hypervisor, instance: &str) -> Belongs {
    match hv.labels().get(INSTANCE_LABEL) {
        Some(v) if v == instance => Belongs::Ours,
        Some(_) => Belongs::Theirs,
        None => Belongs::Nobodys,
    }
}

/// Defaults for new Hypervisors (coordinator flags).
#[derive(Clone, Debug, Default)]
pub struct Template {
    /// This install's name ([`instance_name`]): the value of [`INSTANCE_LABEL`].
    pub instance: String,
    pub aggregates: Vec<String>,
    pub custom_traits: Vec<String>,
    pub ceph_pools: Vec<String>,
    pub skip_tests: bool,
    /// Suffixes removed from a Node name to get its Nova host (the first
    /// that matches), e.g. `.example.local`.
    pub nova_host_strip_suffixes: Vec<String>,
}

/// The Nova host of a new Node: its annotation, else the Node name without
/// the first matching suffix, else the Node name ("" in spec).
fn nova_host_for(node: &Node, template: &Template) -> String {
    if let Some(h) = node.annotations().get(NOVA_HOST_ANNOTATION).map(|h| h.trim()).filter(|h| !h.is_empty())
    {
        return h.to_string();
    }
    let name = node.name_any();
    template
        .nova_host_strip_suffixes
        .iter()
        .filter(|s| !s.is_empty())
        .find_map(|s| name.strip_suffix(s.as_str()).filter(|h| !h.is_empty()).map(str::to_string))
        .unwrap_or_default()
}

/// Pure: the spec of a new Hypervisor for `node`.
pub fn spec_for(node: &Node, template: &Template) -> HypervisorSpec {
    let ann = node.annotations();
    let list = |key: &str, default: &[String]| -> Vec<String> {
        match ann.get(key) {
            Some(v) => v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
            None => default.to_vec(),
        }
    };
    let mut spec = HypervisorSpec {
        nova_host: nova_host_for(node, template),
        aggregates: list(AGGREGATES_ANNOTATION, &template.aggregates),
        custom_traits: list(TRAITS_ANNOTATION, &template.custom_traits),
        skip_tests: ann.get(SKIP_TESTS_ANNOTATION).map_or(template.skip_tests, |v| v.trim() == "true"),
        ..HypervisorSpec::default()
    };
    spec.ceph.pools = list(POOLS_ANNOTATION, &template.ceph_pools);
    spec
}

/// Whether the Hypervisor controller may let a deleted Node go, and if so
/// whether the Hypervisor must stay as the record (it is orphaned first,
/// so the garbage collector leaves it).
pub fn release(node: NodeObs, phase: Phase, service_id: Option<&str>, nova: &NovaObs) -> Option<Keep> {
    if node != NodeObs::Deleting {
        return None;
    }
    match (phase, nova) {
        (Phase::Decommissioned, _) => Some(Keep::Record),
        // Never in Nova: nothing to evict or to keep a record of.
        (_, NovaObs::NotRegistered) if service_id.is_none() => Some(Keep::Nothing),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    Record,
    Nothing,
}

/// Lets the Node go: orphans the Hypervisor if it is to stay (dropping only
/// the Node's owner reference, over the version read), then drops our
/// finalizer.
pub async fn let_go(client: &kube::Client, name: &str, keep: Keep) -> Result<(), kube::Error> {
    if keep == Keep::Record {
        let api: Api<Hypervisor> = Api::all(client.clone());
        if let Some(hv) = api.get_opt(name).await? {
            let node_ref = hv.owner_references().iter().find(|o| o.kind == "Node" && o.name == name).cloned();
            if let Some(owner) = node_ref {
                super::write::drop_owner(&api, &hv, &owner.uid).await?;
            }
        }
    }
    let api: Api<Node> = Api::all(client.clone());
    if let Some(node) = api.get_opt(name).await? {
        set_finalizer(&api, &node, false).await?;
    }
    tracing::info!(node = %name, record = ?keep, "Node released");
    Ok(())
}

async fn set_finalizer(api: &Api<Node>, node: &Node, present: bool) -> Result<(), kube::Error> {
    super::write::finalizer(api, node, NODE_FINALIZER, present).await.map(|_| ())
}

/// Whether a Node needs nothing of [`ensure_hypervisor`]: it is not being
/// deleted, carries our finalizer, and the Hypervisor cache holds one of
/// ours for it. A new leader's Node watcher then reads on without a
/// request per Node; a Node the cache does not vouch for is looked up in
/// the API. `finalize`: our finalizer belongs on the Node (not in observe
/// mode).
pub fn settled(node: &Node, cached: Option<&Hypervisor>, instance: &str, finalize: bool) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && (!finalize || node.finalizers().iter().any(|f| f == NODE_FINALIZER))
        && cached.is_some_and(|hv| belongs(hv, instance) == Belongs::Ours)
}

/// For every selected Node: its Hypervisor and our finalizer; a deleted
/// Node whose Hypervisor is gone (deleted by hand) is let go at once.
/// `finalize`: our finalizer is added (an observing install writes no Node).
pub async fn ensure_hypervisor(client: &kube::Client, node: &Node, template: &Template, finalize: bool) {
    let Some(name) = node.metadata.name.clone() else { return };
    let api: Api<Hypervisor> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    if node.metadata.deletion_timestamp.is_some() {
        if let Ok(None) = api.get_opt(&name).await
            && let Err(e) = set_finalizer(&nodes, node, false).await
        {
            tracing::warn!(node = %name, error = %e, "could not release the Node");
        }
        return;
    }
    let existing = match api.get_opt(&name).await {
        Ok(hv) => hv,
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "could not look up the Hypervisor");
            return;
        }
    };
    match existing.as_ref().map(|hv| (belongs(hv, &template.instance), hv)) {
        Some((Belongs::Theirs, hv)) => {
            let theirs = hv.labels().get(INSTANCE_LABEL).cloned().unwrap_or_default();
            tracing::warn!(node = %name, instance = %theirs, "the Node's Hypervisor belongs to another coordinator install; holding back");
            return;
        }
        Some((Belongs::Nobodys, hv)) => {
            let adopt = serde_json::json!({"metadata": {
                "resourceVersion": hv.metadata.resource_version, "labels": {INSTANCE_LABEL: template.instance}}});
            let pp =
                kube::api::PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
            match api.patch(&name, &pp, &kube::api::Patch::Merge(&adopt)).await {
                Ok(_) => tracing::info!(node = %name, "adopted a Hypervisor of no install"),
                Err(e) => tracing::warn!(node = %name, error = %e, "could not adopt the Hypervisor"),
            }
        }
        Some((Belongs::Ours, _)) | None => {}
    }
    if finalize && let Err(e) = set_finalizer(&nodes, node, true).await {
        tracing::warn!(node = %name, error = %e, "could not add our finalizer to the Node");
    }
    if existing.is_some() {
        return;
    }
    let mut hv = Hypervisor::new(&name, spec_for(node, template));
    hv.metadata.owner_references = node.controller_owner_ref(&()).map(|o| vec![o]);
    hv.metadata.labels = Some([(INSTANCE_LABEL.to_string(), template.instance.clone())].into());
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.create(&pp, &hv).await {
        Ok(_) => tracing::info!(node = %name, "created Hypervisor for new Node"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(node = %name, error = %e, "could not create the Hypervisor"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("compute-1".into());
        n.metadata.annotations =
            Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        n
    }

    #[test]
    fn a_node_is_settled_only_with_our_finalizer_and_a_cached_hypervisor_of_ours() {
        let mut n = node(&[]);
        n.metadata.finalizers = Some(vec![NODE_FINALIZER.to_string()]);
        let mut ours = Hypervisor::new("compute-1", HypervisorSpec::default());
        ours.metadata.labels = Some([(INSTANCE_LABEL.to_string(), "hv-a".to_string())].into());
        assert!(settled(&n, Some(&ours), "hv-a", true));
        assert!(!settled(&n, None, "hv-a", true), "not cached: looked up");
        assert!(!settled(&n, Some(&ours), "hv-b", true), "another install's");
        let nobodys = Hypervisor::new("compute-1", HypervisorSpec::default());
        assert!(!settled(&n, Some(&nobodys), "hv-a", true), "to adopt");
        let mut bare = n.clone();
        bare.metadata.finalizers = None;
        assert!(!settled(&bare, Some(&ours), "hv-a", true), "our finalizer to add");
        assert!(settled(&bare, Some(&ours), "hv-a", false), "no finalizer in observe mode");
        let mut going = n.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
        assert!(!settled(&going, Some(&ours), "hv-a", true), "a Node being deleted");
    }

    #[test]
    fn an_install_is_named_by_a_label_value_and_knows_its_hypervisors() {
        for good in ["hv-coordinator", "a", "hv-e2e-drain-kubectl-123", &"x".repeat(63)] {
            assert!(valid_label_value(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a/b", "a b", &"x".repeat(64)] {
            assert!(!valid_label_value(bad), "{bad}");
        }
        let mut hv = Hypervisor::new("compute-1", HypervisorSpec::default());
        assert_eq!(belongs(&hv, "hv-coordinator"), Belongs::Nobodys);
        hv.metadata.labels = Some([(INSTANCE_LABEL.to_string(), "hv-coordinator".to_string())].into());
        assert_eq!(belongs(&hv, "hv-coordinator"), Belongs::Ours);
        assert_eq!(belongs(&hv, "hv-canary"), Belongs::Theirs);
        assert_eq!(instance_selector("hv-coordinator"), "hypervisor.cloud.sap/instance=hv-coordinator");
        assert_eq!(instance_name("hv-system", "hv-coordinator").as_deref(), Ok("hv-system.hv-coordinator"));
        assert!(instance_name("hv-system", &"x".repeat(60)).is_err());
    }

    #[test]
    fn a_deleted_node_is_let_go_only_once_nothing_in_nova_needs_it() {
        use crate::lifecycle::NovaHost;
        let registered = NovaObs::Registered(NovaHost::default());
        let present = NodeObs::Present {
            ready: true,
            cordoned: false,
            maintenance_required: false,
            drain_refused: false,
        };
        for phase in [Phase::Active, Phase::Evicting, Phase::Maintenance, Phase::Onboarding] {
            assert_eq!(release(NodeObs::Deleting, phase, Some("svc"), &registered), None, "{phase:?}");
            assert_eq!(
                release(NodeObs::Deleting, phase, Some("svc"), &NovaObs::NotRegistered),
                None,
                "{phase:?}: it was in Nova; the lifecycle must finish"
            );
            assert_eq!(release(present, phase, None, &NovaObs::NotRegistered), None);
        }
        assert_eq!(
            release(NodeObs::Deleting, Phase::Decommissioned, Some("svc"), &NovaObs::Unknown),
            Some(Keep::Record)
        );
        assert_eq!(
            release(NodeObs::Deleting, Phase::Onboarding, None, &NovaObs::NotRegistered),
            Some(Keep::Nothing)
        );
        assert_eq!(
            release(NodeObs::Deleting, Phase::Onboarding, None, &NovaObs::Unknown),
            None,
            "Nova not seen"
        );
        assert_eq!(release(present, Phase::Decommissioned, None, &NovaObs::Unknown), None);
    }

    #[test]
    fn annotations_override_the_template() {
        let t = Template {
            instance: "hv-coordinator".into(),
            aggregates: vec!["az-1".into()],
            custom_traits: vec![],
            ceph_pools: vec!["vms".into()],
            skip_tests: false,
            nova_host_strip_suffixes: vec![],
        };
        let s = spec_for(&node(&[]), &t);
        assert_eq!(
            (s.aggregates.clone(), s.ceph.pools.clone(), s.skip_tests),
            (vec!["az-1".into()], vec!["vms".into()], false)
        );
        let s = spec_for(
            &node(&[
                (AGGREGATES_ANNOTATION, "a, b,,"),
                (TRAITS_ANNOTATION, "CUSTOM_X"),
                (POOLS_ANNOTATION, ""),
                (SKIP_TESTS_ANNOTATION, "true"),
            ]),
            &t,
        );
        assert_eq!(s.aggregates, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(s.custom_traits, vec!["CUSTOM_X".to_string()]);
        assert!(s.ceph.pools.is_empty());
        assert!(s.skip_tests);
        assert_eq!(s.ovs.bridges, vec!["br-int".to_string(), "br-ex".to_string()]);
    }

    #[test]
    fn the_nova_host_comes_from_the_annotation_else_a_stripped_suffix_else_the_node_name() {
        let mut t = Template::default();
        let mut n = node(&[]);
        n.metadata.name = Some("compute-4.example.local".into());
        assert_eq!(spec_for(&n, &t).nova_host, "", "no mapping: the Node name");
        t.nova_host_strip_suffixes = vec![".other".into(), ".example.local".into()];
        assert_eq!(spec_for(&n, &t).nova_host, "compute-4");
        assert_eq!(spec_for(&n, &t).nova_host("compute-4.example.local"), "compute-4");
        n.metadata.annotations = Some([(NOVA_HOST_ANNOTATION.to_string(), " hv-4 ".to_string())].into());
        assert_eq!(spec_for(&n, &t).nova_host, "hv-4", "the annotation wins");
        let mut whole = node(&[]);
        whole.metadata.name = Some(".example.local".into());
        assert_eq!(spec_for(&whole, &t).nova_host, "", "a suffix is never the whole name");
    }
}
