//! The node lock protocol (docs/drain.md): the label [`EVICTABLE_LABEL`] says
//! whether the host may lose the pods its VMs need, and one annotation
//! [`LOCK_ANNOTATION_PREFIX`]`<component>` per dependent the site names stands while it
//! may not. A dependent's operator removes its pods only once its lock is
//! gone. Pure: the shell reads the Node and writes the patch.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};

use crate::api::Phase;
use crate::api::keys::{EVICTABLE_LABEL, LOCK_ANNOTATION_PREFIX};

/// The protocol's marks as the Node carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Locks {
    /// The label's value (None: absent or neither `true` nor `false`).
    pub evictable: Option<bool>,
    /// The components whose lock annotation stands.
    pub held: BTreeSet<String>,
    /// The webhook's mark of a refused drain ([`crate::api::keys::DRAIN_REFUSED_ANNOTATION`]).
    pub drain_refused: bool,
    pub cordoned: bool,
}

pub fn of(node: &Node) -> Locks {
    let labels = node.metadata.labels.as_ref();
    let annotations = node.metadata.annotations.iter().flatten();
    Locks {
        evictable: labels.and_then(|l| l.get(EVICTABLE_LABEL)).and_then(|v| v.parse().ok()),
        held: annotations
            .filter_map(|(k, _)| k.strip_prefix(LOCK_ANNOTATION_PREFIX))
            .map(str::to_string)
            .collect(),
        drain_refused: node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::api::keys::DRAIN_REFUSED_ANNOTATION)),
        cordoned: node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
    }
}

/// Whether the host may lose its dependents: no VM on it (as Nova counts
/// them: `instances`, None when not read) and held out of service
/// (Initial, Maintenance, Aborted, Decommissioned). On its way into
/// service (Onboarding, Testing) it needs them: its checks read them and
/// VMs land right after. None: not known, the marks stay as they are.
pub fn evictable(phase: Phase, instances: Option<usize>) -> Option<bool> {
    let held = matches!(phase, Phase::Initial | Phase::Maintenance | Phase::Aborted | Phase::Decommissioned);
    match instances {
        Some(0) => Some(held),
        Some(_) => Some(false),
        // Nova unread: a host in service keeps its locks, whatever it had.
        None if !held => Some(false),
        None => None,
    }
}

/// Nova's count of VMs on the host, for [`evictable`]. No compute service
/// is an empty host only when there never was one or we deleted it
/// (decommissioned): a service that vanished otherwise (a down cell, a
/// renamed host) may hide VMs, so the count is unknown.
pub fn vm_count(nova: &crate::lifecycle::NovaObs, never_registered_or_deleted: bool) -> Option<usize> {
    use crate::lifecycle::NovaObs;
    match nova {
        NovaObs::Registered(host) => Some(host.instances.len()),
        NovaObs::NotRegistered if never_registered_or_deleted => Some(0),
        _ => None,
    }
}

/// A component name the protocol can carry: an annotation name's last
/// part (letters, digits, `-`, `_`, `.`; at most 63, starting and ending
/// alphanumeric).
pub fn valid_component(c: &str) -> bool {
    let alnum = |ch: Option<char>| ch.is_some_and(|ch| ch.is_ascii_alphanumeric());
    !c.is_empty()
        && c.len() + LOCK_ANNOTATION_PREFIX.rsplit('/').next().map_or(0, str::len) <= 63
        && c.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
        && alnum(c.chars().next())
        && alnum(c.chars().last())
}

/// The merge patch that brings the Node's marks to `evictable` for the
/// site's `components`, or None when nothing needs writing. A lock of a
/// component the site no longer names is left alone: it may be another
/// operator's. A refused drain's mark goes with the cordon it belongs to:
/// the uncordon after the update ends its ask.
pub fn patch(now: &Locks, evictable: Option<bool>, components: &[String]) -> Option<Value> {
    let mut labels = Map::new();
    let mut annotations = Map::new();
    if now.drain_refused && !now.cordoned {
        annotations.insert(crate::api::keys::DRAIN_REFUSED_ANNOTATION.into(), Value::Null);
    }
    let Some(evictable) = evictable else {
        return crate::health::marks::metadata_patch(labels, annotations);
    };
    if now.evictable != Some(evictable) {
        labels.insert(EVICTABLE_LABEL.into(), json!(evictable.to_string()));
    }
    for c in components {
        match (evictable, now.held.contains(c)) {
            (false, false) => {
                annotations.insert(format!("{LOCK_ANNOTATION_PREFIX}{c}"), json!(""));
            }
            (true, true) => {
                annotations.insert(format!("{LOCK_ANNOTATION_PREFIX}{c}"), Value::Null);
            }
            _ => {}
        }
    }
    crate::health::marks::metadata_patch(labels, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_evictable_only_empty_and_unschedulable() {
        for phase in [Phase::Onboarding, Phase::Testing, Phase::Ready, Phase::Active, Phase::Evicting] {
            assert_eq!(evictable(phase, Some(0)), Some(false), "{phase:?}: in service, or on its way");
            assert_eq!(evictable(phase, None), Some(false), "{phase:?}: Nova unread");
        }
        for phase in [Phase::Initial, Phase::Maintenance, Phase::Aborted, Phase::Decommissioned] {
            assert_eq!(evictable(phase, Some(0)), Some(true), "{phase:?}");
            assert_eq!(evictable(phase, Some(2)), Some(false), "{phase:?}: VMs live there");
            assert_eq!(evictable(phase, None), None, "{phase:?}: unknown, left as it is");
        }
    }

    #[test]
    fn locks_stand_while_the_host_is_not_evictable_and_go_with_it() {
        let comps = vec!["neutron-l2".to_string(), "ovn".to_string()];
        let bare = Locks::default();
        let held = patch(&bare, Some(false), &comps).unwrap();
        assert_eq!(
            held,
            json!({"metadata": {"labels": {EVICTABLE_LABEL: "false"},
                "annotations": {"hypervisor.cloud.sap/lock.neutron-l2": "", "hypervisor.cloud.sap/lock.ovn": ""}}})
        );
        let now =
            Locks { evictable: Some(false), held: comps.iter().cloned().collect(), ..Default::default() };
        assert_eq!(patch(&now, Some(false), &comps), None, "nothing to write");
        let freed = patch(&now, Some(true), &comps).unwrap();
        assert_eq!(
            freed,
            json!({"metadata": {"labels": {EVICTABLE_LABEL: "true"},
                "annotations": {"hypervisor.cloud.sap/lock.neutron-l2": null, "hypervisor.cloud.sap/lock.ovn": null}}})
        );
        assert_eq!(patch(&now, None, &comps), None, "unknown: left as it is");
        // Another operator's lock is never ours to lift.
        let others = Locks { evictable: Some(false), held: ["bgp".to_string()].into(), ..Default::default() };
        let p = patch(&others, Some(true), &comps).unwrap();
        assert!(p["metadata"]["annotations"].get("hypervisor.cloud.sap/lock.bgp").is_none(), "{p}");
        // Without components, only the label.
        assert_eq!(
            patch(&bare, Some(true), &[]),
            Some(json!({"metadata": {"labels": {EVICTABLE_LABEL: "true"}}}))
        );
    }

    #[test]
    fn a_vanished_compute_service_is_no_count_but_a_deleted_one_is_empty() {
        use crate::lifecycle::NovaObs;
        assert_eq!(vm_count(&NovaObs::NotRegistered, true), Some(0), "never registered, or deleted by us");
        assert_eq!(vm_count(&NovaObs::NotRegistered, false), None, "vanished: may hide VMs");
        assert_eq!(vm_count(&NovaObs::Unreachable("x".into()), true), None);
        // Held and unknown: the marks stay as they are.
        assert_eq!(evictable(Phase::Maintenance, vm_count(&NovaObs::NotRegistered, false)), None);
        assert_eq!(evictable(Phase::Decommissioned, vm_count(&NovaObs::NotRegistered, true)), Some(true));
    }

    #[test]
    fn a_refused_drains_mark_goes_with_the_uncordon() {
        let refused =
            |cordoned| Locks { evictable: Some(true), drain_refused: true, cordoned, ..Default::default() };
        assert_eq!(patch(&refused(true), Some(true), &[]), None, "still draining: kept");
        let gone = json!({"metadata": {"annotations": {"hypervisor.cloud.sap/drain-refused": null}}});
        assert_eq!(patch(&refused(false), Some(true), &[]), Some(gone.clone()));
        assert_eq!(patch(&refused(false), None, &[]), Some(gone), "whatever the host's state");
    }

    #[test]
    fn the_marks_are_read_from_the_node_as_written() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n",
            "labels": {EVICTABLE_LABEL: "false"},
            "annotations": {"hypervisor.cloud.sap/lock.ovn": "", "other": "x"}}}))
        .unwrap();
        assert_eq!(
            of(&node),
            Locks { evictable: Some(false), held: ["ovn".to_string()].into(), ..Default::default() }
        );
        assert!(valid_component("neutron-l2") && valid_component("ovn.bgp"));
        assert!(
            !valid_component("")
                && !valid_component("-x")
                && !valid_component("a/b")
                && !valid_component("x-")
        );
        // The name after the domain is `lock.` and the component: 63 at most.
        assert!(valid_component(&"a".repeat(58)) && !valid_component(&"a".repeat(59)));
    }
}
