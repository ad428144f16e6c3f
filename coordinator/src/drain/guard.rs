//! The drain guard (docs/drain.md): one small Deployment per hypervisor
//! whose single pod runs on the hypervisor's Node and is protected as the
//! hypervisor's own pods are (the eviction webhook, the disruption budget's
//! label). nova-compute, libvirt and our agent are DaemonSet pods in most
//! deployments, and `kubectl drain --ignore-daemonsets` (what every update
//! tool runs) never evicts those; it evicts the guard, and waits on it until
//! the host is emptied and held. Pure: the shell (`k8s::guards`) reads the
//! Deployment and writes what [`step`] says.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile, SecurityContext,
    Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use crate::api::Phase;

/// The label every guard pod carries, and its value: the selector by which
/// the coordinator protects them ([`selector`]) and the chart's budget
/// holds them.
pub const NAME_LABEL: (&str, &str) = ("app.kubernetes.io/name", "hv-drain-guard");
/// Which Node a guard guards: the Node's name where it fits a label value,
/// else a stable digest of it ([`label_value`]).
pub const GUARD_OF_LABEL: &str = "hypervisor.cloud.sap/guard-of";
/// The Node's name in full, on the Deployment (a label may hold a digest).
pub const NODE_ANNOTATION: &str = "hypervisor.cloud.sap/node";
/// A digest of the Deployment as the coordinator wants it: a guard that
/// differs (another image, a hand's edit of what we set) is written again.
pub const SPEC_ANNOTATION: &str = "hypervisor.cloud.sap/guard-spec";

/// What every guard is made of, from the coordinator's flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardConfig {
    /// The namespace of the guards' Deployments (the coordinator's own).
    pub namespace: String,
    /// The agent's image: its `guard` command sleeps until it is stopped.
    pub image: String,
    /// Pull secrets of that image, by name.
    pub pull_secrets: Vec<String>,
    /// The install's name (`--instance`), on every guard.
    pub instance: String,
}

/// Whether the host has a guard: from its onboarding (a host about to
/// enter service, or adopted in service with its VMs) until it is
/// decommissioned. A new Node not yet onboarded runs no VM.
pub fn wanted(phase: Phase) -> bool {
    !matches!(phase, Phase::Initial | Phase::Decommissioned)
}

/// How many guard pods the host has: one, but none while it is freed for
/// drains and cordoned. Evicted from a freed host, a guard that tolerates
/// the cordon would come back on the same Node, and a drain that lists the
/// Node's pods again (Cluster API's) would evict it again without end.
pub fn replicas(freed: bool, cordoned: bool) -> i32 {
    if freed && cordoned { 0 } else { 1 }
}

/// The protected-pod selector that matches every guard of the install.
pub fn selector(instance: &str) -> String {
    format!("{}={},{}={instance}", NAME_LABEL.0, NAME_LABEL.1, crate::api::keys::INSTANCE_LABEL)
}

/// The guard Deployment's name: `hv-guard-<node>`, or a digest of a Node
/// name too long for it (a pod's name adds the ReplicaSet's suffixes).
pub fn name(node: &str) -> String {
    let plain = format!("hv-guard-{node}");
    if plain.len() <= 200 { plain } else { format!("hv-guard-{}", label_value(node)) }
}

/// A label value (at most 63 characters, alphanumeric at both ends) that
/// names `node`: the name itself when it fits, else its start and a digest.
pub fn label_value(node: &str) -> String {
    let fits = node.len() <= 63
        && node.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        && node.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && node.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if fits {
        return node.to_string();
    }
    let start: String = node.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').take(40).collect();
    let start = start.trim_matches('-');
    if start.is_empty() { format!("{:016x}", digest(node)) } else { format!("{start}-{:016x}", digest(node)) }
}

/// FNV-1a, 64 bits: stable across releases (a label value and the spec
/// annotation are compared with what an earlier leader wrote).
fn digest(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The guard of `node`, owned by its Hypervisor (`owner`: the garbage
/// collector removes it with the Hypervisor).
pub fn deployment(config: &GuardConfig, node: &str, owner: OwnerReference, replicas: i32) -> Deployment {
    let labels = BTreeMap::from([
        (NAME_LABEL.0.to_string(), NAME_LABEL.1.to_string()),
        (GUARD_OF_LABEL.to_string(), label_value(node)),
        (crate::api::keys::INSTANCE_LABEL.to_string(), config.instance.clone()),
    ]);
    let pod = PodSpec {
        // Bound to its Node by name, as a DaemonSet's pods are: the
        // hostname label may differ from the Node's name.
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        ..Default::default()
                    }],
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        // Every taint: a cordon, NotReady, a site's own. The guard stays
        // on its Node whatever the Node says, until a drain may take it.
        tolerations: Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }]),
        containers: vec![Container {
            name: "guard".into(),
            image: Some(config.image.clone()),
            args: Some(vec!["guard".into()]),
            resources: Some(ResourceRequirements {
                requests: Some(BTreeMap::from([
                    ("cpu".to_string(), Quantity("1m".into())),
                    ("memory".to_string(), Quantity("8Mi".into())),
                ])),
                limits: Some(BTreeMap::from([("memory".to_string(), Quantity("32Mi".into()))])),
                ..Default::default()
            }),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                read_only_root_filesystem: Some(true),
                capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        }],
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65534),
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            ..Default::default()
        }),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(5),
        image_pull_secrets: (!config.pull_secrets.is_empty()).then(|| {
            config
                .pull_secrets
                .iter()
                .map(|n| k8s_openapi::api::core::v1::LocalObjectReference { name: n.clone() })
                .collect()
        }),
        ..Default::default()
    };
    let spec = DeploymentSpec {
        replicas: Some(replicas),
        revision_history_limit: Some(1),
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([
                (NAME_LABEL.0.to_string(), NAME_LABEL.1.to_string()),
                (GUARD_OF_LABEL.to_string(), label_value(node)),
            ])),
            ..Default::default()
        },
        template: PodTemplateSpec {
            metadata: Some(ObjectMeta { labels: Some(labels.clone()), ..Default::default() }),
            spec: Some(pod),
        },
        ..Default::default()
    };
    let digest =
        serde_json::to_string(&spec).map(|s| format!("{:016x}", self::digest(&s))).unwrap_or_default();
    Deployment {
        metadata: ObjectMeta {
            name: Some(name(node)),
            namespace: Some(config.namespace.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (NODE_ANNOTATION.to_string(), node.to_string()),
                (SPEC_ANNOTATION.to_string(), digest),
            ])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(spec),
        ..Default::default()
    }
}

/// What to do with a host's guard.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// As it should be.
    Keep,
    /// Missing, or not as wanted (another image, a hand scaled it down):
    /// written whole.
    Write(Box<Deployment>),
    /// The host no longer has one.
    Remove,
}

/// Compares the guard there is (`have`) with the one wanted (`want`, None:
/// none). A guard being deleted is left to finish; it is made again after.
pub fn step(have: Option<&Deployment>, want: Option<Deployment>) -> Step {
    match (have, want) {
        (None, None) => Step::Keep,
        (Some(h), None) if h.metadata.deletion_timestamp.is_none() => Step::Remove,
        (Some(_), None) => Step::Keep,
        (Some(h), Some(_)) if h.metadata.deletion_timestamp.is_some() => Step::Keep,
        (Some(h), Some(w)) if same(h, &w) => Step::Keep,
        (_, Some(w)) => Step::Write(Box::new(w)),
    }
}

/// The guard there is as wanted: our digest, and each field we set as we
/// set it (a hand's edit of the template keeps the digest).
fn same(have: &Deployment, want: &Deployment) -> bool {
    let replicas = |d: &Deployment| d.spec.as_ref().and_then(|s| s.replicas);
    let template = |d: &Deployment| d.spec.as_ref().map(|s| s.template.clone());
    let (Some(h), Some(w)) = (template(have), template(want)) else { return false };
    let labels = |t: &PodTemplateSpec| t.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default();
    let (hl, wl) = (labels(&h), labels(&w));
    let (hs, ws) = (h.spec.unwrap_or_default(), w.spec.unwrap_or_default());
    let run =
        |s: &PodSpec| s.containers.first().map(|c| (c.image.clone(), c.args.clone(), c.resources.clone()));
    spec_digest(have).is_some()
        && spec_digest(have) == spec_digest(want)
        && replicas(have) == replicas(want)
        && wl.iter().all(|(k, v)| hl.get(k) == Some(v))
        && hs.affinity == ws.affinity
        && hs.tolerations == ws.tolerations
        && hs.containers.len() == 1
        && run(&hs) == run(&ws)
}

fn spec_digest(d: &Deployment) -> Option<&str> {
    d.metadata.annotations.as_ref().and_then(|a| a.get(SPEC_ANNOTATION)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> GuardConfig {
        GuardConfig {
            namespace: "hv-system".into(),
            image: "hv-agent:1".into(),
            pull_secrets: vec![],
            instance: "hv".into(),
        }
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "hypervisor.cloud.sap/v1".into(),
            kind: "Hypervisor".into(),
            name: "compute-1".into(),
            uid: "u-1".into(),
            controller: Some(true),
            ..Default::default()
        }
    }

    #[test]
    fn a_host_has_a_guard_from_its_onboarding_until_it_is_decommissioned() {
        for phase in Phase::ALL {
            let expected = !matches!(phase, Phase::Initial | Phase::Decommissioned);
            assert_eq!(wanted(phase), expected, "{phase:?}");
        }
    }

    #[test]
    fn the_guard_is_bound_to_its_node_by_name_tolerates_every_taint_and_is_protected_by_its_labels() {
        let d = deployment(&config(), "compute-1", owner(), 1);
        assert_eq!(d.metadata.name.as_deref(), Some("hv-guard-compute-1"));
        let spec = d.spec.as_ref().unwrap();
        let template = spec.template.spec.as_ref().unwrap();
        let terms = &template
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref())
            .unwrap()
            .node_selector_terms;
        let fields = terms[0].match_fields.as_ref().unwrap();
        assert_eq!(
            (fields[0].key.as_str(), fields[0].values.as_deref()),
            ("metadata.name", Some(&["compute-1".to_string()][..]))
        );
        let tolerations = template.tolerations.as_ref().unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(
            (tolerations[0].operator.as_deref(), tolerations[0].key.as_deref()),
            (Some("Exists"), None)
        );
        assert_eq!(template.containers[0].args.as_deref(), Some(&["guard".to_string()][..]));
        assert_eq!(spec.replicas, Some(1));
        // The protected-pod selector matches the pod's labels.
        let labels = spec.template.metadata.as_ref().unwrap().labels.clone().unwrap();
        let sel: crate::drain::admission::Selector = selector("hv").parse().unwrap();
        assert!(sel.matches(&labels), "{labels:?}");
        assert!(!selector("other").parse::<crate::drain::admission::Selector>().unwrap().matches(&labels));
        // The Deployment's selector is the pod's, and picks this Node's guard only.
        let picked = spec.selector.match_labels.as_ref().unwrap();
        assert!(picked.iter().all(|(k, v)| labels.get(k) == Some(v)));
        assert_eq!(picked.get(GUARD_OF_LABEL).map(String::as_str), Some("compute-1"));
    }

    #[test]
    fn a_node_name_too_long_for_a_label_is_named_by_a_stable_digest() {
        let long = format!("{}.example.com", "a".repeat(70));
        let v = label_value(&long);
        assert!(v.len() <= 63 && v.starts_with("aaaa") && v == label_value(&long), "{v}");
        assert_ne!(v, label_value(&format!("{}.example.org", "a".repeat(70))));
        assert_eq!(label_value("compute-1.example.com"), "compute-1.example.com");
        let very = "b".repeat(240);
        assert!(name(&very).len() < 100, "{}", name(&very));
        assert_eq!(digest("compute-1"), digest("compute-1"), "stable");
    }

    #[test]
    fn a_guard_is_written_when_missing_or_changed_and_removed_when_not_wanted() {
        let want = deployment(&config(), "compute-1", owner(), 1);
        assert_eq!(step(None, None), Step::Keep);
        assert_eq!(step(None, Some(want.clone())), Step::Write(Box::new(want.clone())));
        assert_eq!(step(Some(&want), Some(want.clone())), Step::Keep);
        assert_eq!(step(Some(&want), None), Step::Remove);
        // Another image: written again.
        let newer =
            deployment(&GuardConfig { image: "hv-agent:2".into(), ..config() }, "compute-1", owner(), 1);
        assert_eq!(step(Some(&want), Some(newer.clone())), Step::Write(Box::new(newer)));
        // Scaled down by a hand: written again.
        let mut scaled = want.clone();
        scaled.spec.as_mut().unwrap().replicas = Some(0);
        assert!(matches!(step(Some(&scaled), Some(want.clone())), Step::Write(_)));
        // A hand's edit of the template: written again.
        let mut unlabelled = want.clone();
        if let Some(l) = unlabelled
            .spec
            .as_mut()
            .and_then(|s| s.template.metadata.as_mut())
            .and_then(|m| m.labels.as_mut())
        {
            l.remove(crate::api::keys::INSTANCE_LABEL);
        }
        assert!(matches!(step(Some(&unlabelled), Some(want.clone())), Step::Write(_)));
        let mut moved = want.clone();
        if let Some(p) = moved.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            p.affinity = None;
        }
        assert!(matches!(step(Some(&moved), Some(want.clone())), Step::Write(_)));
        let mut intolerant = want.clone();
        if let Some(p) = intolerant.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
            p.tolerations = Some(vec![]);
        }
        assert!(matches!(step(Some(&intolerant), Some(want.clone())), Step::Write(_)));
        // None while freed and cordoned, one otherwise.
        assert_eq!((replicas(true, true), replicas(true, false), replicas(false, true)), (0, 1, 1));
        let none = deployment(&config(), "compute-1", owner(), 0);
        assert!(matches!(step(Some(&want), Some(none.clone())), Step::Write(_)));
        assert_eq!(step(Some(&none), Some(none.clone())), Step::Keep);
        // Not ours (no digest): written.
        let mut bare = want.clone();
        bare.metadata.annotations = None;
        assert!(matches!(step(Some(&bare), Some(want.clone())), Step::Write(_)));
        // Being deleted: left to finish.
        let mut going = want.clone();
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert_eq!(step(Some(&going), Some(want)), Step::Keep);
        assert_eq!(step(Some(&going), None), Step::Keep);
    }
}
