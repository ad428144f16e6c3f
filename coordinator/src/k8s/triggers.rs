//! When a watched object wakes a Hypervisor's reconcile.
//!
//! A reconcile asks Nova several questions, so it should run when something
//! the lifecycle reads has changed, not on every write (kubelets write their
//! Node every few seconds; the Eviction controller writes its status every
//! second while it moves VMs). The rule here is one a reader can extend
//! without knowing `decide()`: the trigger of an object is a hash of
//! **exactly the observation the shell builds from it** for the core. A
//! field the core starts to read is added to the observation, and so to the
//! trigger, in one place.

use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::{Eviction, Hypervisor};

fn digest(value: &impl Hash) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

/// What the lifecycle reads of a Node (with the site's update signals).
pub fn node(n: &Node, signals: &crate::drain::signals::UpdateSignals) -> Option<u64> {
    Some(digest(&super::hypervisor::node_obs(n, signals)))
}

/// What the lifecycle reads of an Eviction, but for its counts and
/// message: they change with every VM moved, and the host's reconcile acts
/// on the Eviction's phase only (its counts are the Eviction's to show).
pub fn eviction(e: &Eviction) -> Option<u64> {
    let obs = super::hypervisor::eviction_obs(e);
    Some(digest(&(obs.name, obs.reason, obs.re_enable, obs.phase, obs.deleting)))
}

/// What the Eviction controller reads of its own object: the spec (its
/// generation), deletion, the finalizers. Not its own status writes: while
/// it runs it looks again every second anyway, and each write would wake
/// it for a second round of Nova reads that finds nothing new.
pub fn eviction_own(e: &Eviction) -> Option<u64> {
    let deleting = e.metadata.deletion_timestamp.is_some();
    Some(digest(&(e.metadata.generation, deleting, e.finalizers())))
}

/// What the drain marks read of a Hypervisor: whether the host may lose
/// its dependents (`status.evictable`).
pub fn marks(h: &Hypervisor) -> Option<u64> {
    Some(digest(&h.status.as_ref().and_then(|s| s.evictable)))
}

/// What the drain marks read of a Node: its marks, its locks, the
/// webhook's mark of a refused drain and its cordon
/// (`drain::locks::of`).
pub fn node_marks(n: &Node) -> Option<u64> {
    let l = crate::drain::locks::of(n);
    Some(digest(&(l.evictable, l.held, l.drain_refused, l.cordoned)))
}

/// What the drain guards read of a Hypervisor: its phase, whether it is
/// freed for drains, and the hands off annotation (a host handed back is
/// looked at again at once).
pub fn guard(h: &Hypervisor) -> Option<u64> {
    let status = h.status.as_ref();
    let (phase, evictable) = (status.and_then(|s| s.phase), status.and_then(|s| s.evictable));
    Some(digest(&(phase, evictable, h.annotations().contains_key(crate::api::keys::PAUSED_ANNOTATION))))
}

/// What the lifecycle reads of its own object: the spec (its generation),
/// the annotations (the retry token), deletion. Not its own status writes.
pub fn hypervisor(h: &Hypervisor) -> Option<u64> {
    let deleting = h.metadata.deletion_timestamp.is_some();
    Some(digest(&(h.metadata.generation, h.annotations(), deleting)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_triggers_on_ready_and_deletion_not_on_heartbeats() {
        let ready = |status: &str, beat: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "resourceVersion": beat},
                "status": {"conditions": [{"type": "Ready", "status": status,
                    "lastHeartbeatTime": format!("2026-11-23T11:00:0{beat}Z")}]}
            }))
            .unwrap()
        };
        let none = crate::drain::signals::UpdateSignals::default();
        let node = |n: &Node| node(n, &none);
        assert_eq!(node(&ready("True", "1")), node(&ready("True", "2")), "a heartbeat changes nothing");
        assert_ne!(node(&ready("True", "1")), node(&ready("False", "1")));
        let mut deleting = ready("True", "1");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert_ne!(node(&ready("True", "1")), node(&deleting));
        // A sign the site names wakes the host; the same label unnamed does not.
        let site = crate::drain::signals::UpdateSignals(vec!["label:os-update=pending".parse().unwrap()]);
        let mut labelled = ready("True", "1");
        labelled.metadata.labels = Some([("os-update".to_string(), "pending".to_string())].into());
        assert_ne!(super::node(&ready("True", "1"), &site), super::node(&labelled, &site));
        assert_eq!(node(&ready("True", "1")), node(&labelled));
    }

    #[test]
    fn a_nodes_marks_wake_the_drain_marks_not_its_heartbeats() {
        let node = |labels: serde_json::Value, beat: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": beat}]}
            }))
            .unwrap()
        };
        let free = serde_json::json!({crate::api::keys::EVICTABLE_LABEL: "true"});
        let was = node_marks(&node(free.clone(), "2026-11-23T11:00:01Z"));
        assert_eq!(was, node_marks(&node(free, "2026-11-23T11:00:02Z")), "a heartbeat");
        let relabelled = serde_json::json!({crate::api::keys::EVICTABLE_LABEL: "false"});
        assert_ne!(was, node_marks(&node(relabelled, "2026-11-23T11:00:01Z")), "a hand's relabel");
    }

    #[test]
    fn the_drain_marks_wake_on_evictable_only() {
        let mut h = Hypervisor::new("n", Default::default());
        let none = marks(&h);
        h.status = Some(crate::api::HypervisorStatus { evictable: Some(false), ..Default::default() });
        let locked = marks(&h);
        assert_ne!(none, locked);
        if let Some(s) = h.status.as_mut() {
            s.instances = Some(crate::api::hypervisor::InstancesStatus { count: 3, ids: vec![] });
            s.phase = Some(crate::api::Phase::Maintenance);
        }
        assert_eq!(locked, marks(&h), "the rest of the status");
        if let Some(s) = h.status.as_mut() {
            s.evictable = Some(true);
        }
        assert_ne!(locked, marks(&h), "freed");
    }

    fn an_eviction() -> Eviction {
        let spec = crate::api::eviction::EvictionSpec {
            hypervisor: "n".into(),
            reason: crate::api::EvictionReason::AdminRequest,
            options: Default::default(),
            dry_run: false,
        };
        Eviction::new("ev", spec)
    }

    #[test]
    fn an_eviction_wakes_its_host_on_its_phase_not_on_each_vm_moved() {
        use crate::api::eviction::{EvictionPhase, EvictionStatus, VmStatus};
        let mut e = an_eviction();
        e.status =
            Some(EvictionStatus { phase: Some(EvictionPhase::Migrating), total: 3, ..Default::default() });
        let before = eviction(&e);
        // A VM's progress record alone: the lifecycle does not read it.
        if let Some(s) = e.status.as_mut() {
            s.vms.push(VmStatus { id: "a".into(), ..Default::default() });
        }
        assert_eq!(before, eviction(&e));
        if let Some(s) = e.status.as_mut() {
            s.migrated = 1;
        }
        assert_eq!(before, eviction(&e), "a VM moved does not wake the host");
        if let Some(s) = e.status.as_mut() {
            s.phase = Some(EvictionPhase::Succeeded);
        }
        assert_ne!(before, eviction(&e), "its phase does");
    }

    #[test]
    fn an_eviction_wakes_its_own_controller_on_spec_deletion_and_finalizers_not_on_its_status() {
        use crate::api::eviction::{EvictionPhase, EvictionStatus};
        let mut e = an_eviction();
        e.metadata.generation = Some(1);
        let first = eviction_own(&e);
        e.status =
            Some(EvictionStatus { phase: Some(EvictionPhase::Migrating), migrated: 2, ..Default::default() });
        assert_eq!(first, eviction_own(&e), "its own status write");
        e.metadata.generation = Some(2);
        let edited = eviction_own(&e);
        assert_ne!(first, edited, "an SRE's edit of the spec");
        e.metadata.finalizers = Some(vec!["hypervisor.cloud.sap/eviction".into()]);
        let held = eviction_own(&e);
        assert_ne!(edited, held, "its finalizer");
        e.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        assert_ne!(held, eviction_own(&e), "a deletion");
    }
}
