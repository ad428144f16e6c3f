//! One row per transition of docs/lifecycle.md's state diagram (and of the flows it
//! describes in prose), then rows for transitions that must not happen.

use super::fixtures::*;
use super::*;
use crate::api::EvictionReason::*;
use crate::api::eviction::EvictionPhase::{self, *};
use crate::api::hypervisor::{FenceRetirement, FencingStatus, HypervisorSpec, HypervisorStatus};
use crate::api::{MaintenanceMode, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

struct Row {
    name: &'static str,
    from: Phase,
    setup: fn(&mut HypervisorSpec, &mut HypervisorStatus, &mut Observations),
    to: Phase,
    /// Actions (by their Display prefix) that must be emitted.
    must: &'static [&'static str],
    /// Actions that must not be emitted.
    never: &'static [&'static str],
}

/// Nova shows the service disabled with the reason of our latest disable,
/// as it was sent.
fn disabled_as_sent(o: &mut Observations, st: &HypervisorStatus) {
    let reason = st.lifecycle.disabled_as.as_ref().and_then(|r| r.last().cloned());
    with_host(o, |h| {
        h.enabled = false;
        h.disabled_reason = reason;
    });
}

fn ev(name: &str, reason: crate::api::EvictionReason, phase: EvictionPhase) -> Option<EvictionObs> {
    Some(eviction(name, reason, phase))
}

/// A Ready Node, cordoned or not, with the update annotation or not.
fn update_node(cordoned: bool, maintenance_required: bool) -> NodeObs {
    NodeObs::Present { ready: true, cordoned, maintenance_required, drain_refused: false }
}

/// A fencing done: started at t(0), fenced at t(5).
fn fenced() -> Option<FencingStatus> {
    Some(FencingStatus { started: Some(Time(t(0))), fenced: Some(Time(t(5))), ..Default::default() })
}

fn maintenance_of(s: &mut HypervisorStatus, mode: &str, reason: crate::api::EvictionReason) {
    s.lifecycle.eviction = Some(eviction_ref(&format!("node-1-{mode}-1"), reason, true));
    s.lifecycle.eviction_seq = 1;
}

#[rustfmt::skip]
const ROWS: &[Row] = &[
    // ---- onboarding
    Row { name: "Initial -> Onboarding: new K8s Node detected", from: Phase::Initial, setup: |_, _, o| o.nova = NovaObs::NotRegistered, to: Phase::Onboarding, must: &[], never: &["enable"] },
    Row { name: "Onboarding -> Testing: configuration completed", from: Phase::Onboarding, setup: |_, _, _| {}, to: Phase::Testing, must: &["run checks (run 1)"], never: &["enable"] },
    Row { name: "Onboarding -> Ready: skipTests", from: Phase::Onboarding, setup: |sp, _, _| sp.skip_tests = true, to: Phase::Ready, must: &[], never: &["run checks", "enable"] },
    Row { name: "Onboarding -> Aborted: aggregate does not exist", from: Phase::Onboarding, setup: |_, _, o| { with_host(o, |h| { h.aggregates.clear(); h.unknown_aggregates = set(&["az-a"]) }) }, to: Phase::Aborted, must: &[], never: &["add to aggregate", "enable"] },
    Row { name: "Onboarding -> Aborted: Keystone rejects the credentials", from: Phase::Onboarding, setup: |_, _, o| o.nova = NovaObs::Rejected("401 Unauthorized".into()), to: Phase::Aborted, must: &[], never: &[] },
    Row { name: "Onboarding -> Aborted: nova-compute never registered", from: Phase::Onboarding, setup: |_, s, o| { o.nova = NovaObs::NotRegistered; s.phase_since = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(-3600))) }, to: Phase::Aborted, must: &[], never: &[] },
    Row { name: "Onboarding -> Aborted: invalid trait in spec", from: Phase::Onboarding, setup: |sp, _, _| sp.custom_traits = vec!["hana".into()], to: Phase::Aborted, must: &[], never: &["add traits"] },
    Row { name: "Onboarding -> Maintenance: maintenance requested before any VM", from: Phase::Onboarding, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; with_host(o, |h| h.enabled = true) }, to: Phase::Maintenance, must: &["disable compute service"], never: &["create eviction"] },
    Row { name: "Onboarding -> Evicting: Node terminated during onboarding", from: Phase::Onboarding, setup: |_, _, o| o.node = NodeObs::Deleting, to: Phase::Evicting, must: &["create eviction node-1-termination-1 (Decommission)"], never: &["add"] },
    Row { name: "Testing -> Maintenance: maintenance requested while testing", from: Phase::Testing, setup: |sp, _, _| sp.maintenance = MaintenanceMode::Auto, to: Phase::Maintenance, must: &[], never: &["run checks", "enable"] },
    Row { name: "Testing -> Evicting: VMs present (default-enabled service) and maintenance", from: Phase::Testing, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Ha; with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &["create eviction node-1-ha-1 (NodeFailure)"], never: &["run checks"] },
    Row { name: "Ready -> Maintenance: maintenance requested on an empty host", from: Phase::Ready, setup: |sp, _, _| sp.maintenance = MaintenanceMode::Auto, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "Ready -> Evicting: Node terminated", from: Phase::Ready, setup: |_, _, o| o.node = NodeObs::Deleting, to: Phase::Evicting, must: &["create eviction node-1-termination-1 (Decommission)"], never: &["enable"] },
    Row { name: "Testing -> Ready: tests passed", from: Phase::Testing, setup: |_, _, o| o.checks = Some(report(1, &[])), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "Testing -> Aborted: a check failed", from: Phase::Testing, setup: |_, _, o| o.checks = Some(report(1, &["ovs-bridge/br-ex"])), to: Phase::Aborted, must: &[], never: &["enable"] },
    Row { name: "Testing -> Aborted: no report in time", from: Phase::Testing, setup: |_, _, _| {}, to: Phase::Aborted, must: &[], never: &["enable"] },
    Row { name: "Ready stays: not enabled while Nova counts nova-compute down (its provider would stay marked disabled)", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.service_state = super::observe::ServiceState::Down), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "Ready -> Active: Nova scheduling enabled", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.enabled = true), to: Phase::Active, must: &[], never: &["disable"] },
    Row { name: "Ready stays: not enabled while a dependency has no Ready pod on the host", from: Phase::Ready, setup: |_, _, o| o.dependencies = Some(vec!["openstack/app=ovs-agent: no pod on the node".into()]), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "Ready stays: not enabled while the dependency pods are not read yet", from: Phase::Ready, setup: |_, _, o| o.dependencies = None, to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "Ready: enabled once every dependency has a Ready pod on the host", from: Phase::Ready, setup: |_, _, o| o.dependencies = Some(vec![]), to: Phase::Ready, must: &["enable compute service"], never: &[] },
    Row { name: "Evicting -> Active: a re-enable waits too while a dependency has no Ready pod", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("drain-1", RollingUpdate, false)); o.eviction = ev("drain-1", RollingUpdate, Succeeded); o.dependencies = Some(vec!["openstack/app=ovs-agent: ovs-1 not Ready".into()]) }, to: Phase::Active, must: &[], never: &["enable"] },
    // ---- maintenance, eviction, decommissioning
    Row { name: "Active: a trait the host's capabilities give is added to its provider", from: Phase::Active, setup: |_, _, o| { with_host(o, |h| h.enabled = true); o.host_traits = Some(super::fixtures::set(&["HW_NIC_SRIOV"])) }, to: Phase::Active, must: &["add traits HW_NIC_SRIOV"], never: &["remove traits"] },
    Row { name: "Active: a host trait we added goes when the capability goes", from: Phase::Active, setup: |_, s, o| { s.lifecycle.applied_traits.push("HW_NIC_SRIOV".into()); with_host(o, |h| { h.enabled = true; h.traits.get_or_insert_default().insert("HW_NIC_SRIOV".into()); }); o.host_traits = Some(Default::default()) }, to: Phase::Active, must: &["remove traits HW_NIC_SRIOV"], never: &["add traits"] },
    Row { name: "Active: host traits we added stay while the capabilities are not reported", from: Phase::Active, setup: |_, s, o| { s.lifecycle.applied_traits.push("HW_NIC_SRIOV".into()); with_host(o, |h| { h.enabled = true; h.traits.get_or_insert_default().insert("HW_NIC_SRIOV".into()); }); o.host_traits = None }, to: Phase::Active, must: &[], never: &["remove traits", "add traits"] },
    Row { name: "Active: a standard trait an operator set is never ours to remove", from: Phase::Active, setup: |_, _, o| { with_host(o, |h| { h.enabled = true; h.traits.get_or_insert_default().insert("HW_NIC_SRIOV".into()); }); o.host_traits = Some(Default::default()) }, to: Phase::Active, must: &[], never: &["remove traits", "add traits"] },
    Row { name: "Active -> Evicting: admin sets maintenance manual", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Manual; sp.maintenance_reason = "firmware".into(); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["disable compute service (hv-lifecycle: maintenance (manual): firmware)", "create eviction node-1-manual-1 (AdminRequest)"], never: &["enable"] },
    Row { name: "Active -> Evicting: Gardener rolling update (auto)", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["create eviction node-1-auto-1 (RollingUpdate)"], never: &[] },
    Row { name: "Active -> Evicting: HA event (ha)", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Ha; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["create eviction node-1-ha-1 (NodeFailure)"], never: &[] },
    Row { name: "Active -> Evicting: Node terminated", from: Phase::Active, setup: |_, _, o| { o.node = NodeObs::Deleting; with_host(o, |h| h.enabled = true) }, to: Phase::Evicting, must: &["create eviction node-1-termination-1 (Decommission)"], never: &[] },
    Row { name: "Active -> Evicting: an Eviction was created by hand (disabled with the transition)", from: Phase::Active, setup: |_, _, o| { with_host(o, |h| h.enabled = true); o.eviction = ev("drain-1", AdminRequest, Pending) }, to: Phase::Evicting, must: &["disable compute service (hv-lifecycle: eviction drain-1 (AdminRequest))"], never: &["create eviction", "enable"] },
    Row { name: "Active -> Maintenance: maintenance on an empty host", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; with_host(o, |h| h.enabled = true) }, to: Phase::Maintenance, must: &["disable compute service"], never: &["create eviction"] },
    Row { name: "Evicting -> Maintenance: eviction complete (planned maintenance)", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Auto; maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Succeeded) }, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "Evicting -> Active: hand-made eviction complete, reason re-enables", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("drain-1", RollingUpdate, false)); o.eviction = ev("drain-1", RollingUpdate, Succeeded); with_host(o, |h| h.enabled = true) }, to: Phase::Active, must: &[], never: &["disable"] },
    Row { name: "Evicting stays until Nova re-enabled (then Active)", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("drain-1", RollingUpdate, false)); o.eviction = ev("drain-1", RollingUpdate, Succeeded) }, to: Phase::Evicting, must: &["enable compute service"], never: &[] },
    Row { name: "Evicting -> Maintenance: hand-made NodeFailure eviction complete", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("ha-1", NodeFailure, false)); o.eviction = ev("ha-1", NodeFailure, Succeeded) }, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "Evicting -> Decommissioned: eviction complete (decommission)", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); s.lifecycle.service_deleted = true; o.eviction = ev("node-1-termination-1", Decommission, Succeeded); o.nova = NovaObs::NotRegistered }, to: Phase::Decommissioned, must: &[], never: &[] },
    Row { name: "Evicting (decommission): leave aggregates and traits first", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); with_host(o, |h| { h.aggregates.insert("foreign".into()); }) }, to: Phase::Evicting, must: &["remove from aggregate az-a", "remove from aggregate foreign", "remove traits CUSTOM_HANA"], never: &["delete compute service"] },
    Row { name: "Evicting (decommission): then delete the service", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); with_host(o, |h| { h.aggregates.clear(); h.traits = Some(set(&["HW_CPU_X86_AVX2"])) }) }, to: Phase::Evicting, must: &["delete compute service svc-1"], never: &["remove"] },
    Row { name: "Maintenance -> Onboarding: maintenance cleared (re-enable via re-test)", from: Phase::Maintenance, setup: |_, _, _| {}, to: Phase::Onboarding, must: &[], never: &["enable"] },
    Row { name: "Evicting -> Onboarding: maintenance cleared mid-eviction cancels it", from: Phase::Evicting, setup: |_, s, o| { maintenance_of(s, "manual", AdminRequest); o.eviction = ev("node-1-manual-1", AdminRequest, Migrating) }, to: Phase::Onboarding, must: &["cancel eviction node-1-manual-1"], never: &["enable"] },
    Row { name: "Maintenance -> Evicting: fenced with servers left after its Eviction ended (evacuate them)", from: Phase::Maintenance, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Manual; maintenance_of(s, "manual", AdminRequest); o.eviction = ev("node-1-manual-1", AdminRequest, Succeeded); s.fencing = fenced(); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &["create eviction node-1-ha-2 (NodeFailure)"], never: &["enable"] },
    Row { name: "forbidden Maintenance -> Evicting: fenced, servers left, this fencing's evacuation done", from: Phase::Maintenance, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Ha; maintenance_of(s, "ha", NodeFailure); o.eviction = ev("node-1-ha-1", NodeFailure, Succeeded); s.fencing = fenced(); s.lifecycle.evacuated_for = fenced().and_then(|f| f.started); with_host(o, |h| h.instances = vec!["opted-out".into()]) }, to: Phase::Maintenance, must: &[], never: &["create eviction", "enable"] },
    Row { name: "forbidden Maintenance -> Evicting: servers left, fencing under way (not fenced yet)", from: Phase::Maintenance, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Manual; maintenance_of(s, "manual", AdminRequest); s.fencing = fenced().map(|f| FencingStatus { fenced: None, ..f }); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Maintenance, must: &[], never: &["create eviction", "enable"] },
    Row { name: "Evicting: its Eviction failed before the fencing was done, servers left (evacuate them)", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Manual; maintenance_of(s, "manual", AdminRequest); o.eviction = ev("node-1-manual-1", AdminRequest, Failed); s.fencing = fenced(); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &["create eviction node-1-ha-2 (NodeFailure)"], never: &["enable"] },
    Row { name: "forbidden: its evacuation failed, servers left: no other one (an SRE's)", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Ha; maintenance_of(s, "ha", NodeFailure); o.eviction = ev("node-1-ha-1", NodeFailure, Failed); s.fencing = fenced(); s.lifecycle.evacuated_for = fenced().and_then(|f| f.started); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &[], never: &["create eviction", "enable"] },
    Row { name: "forbidden: the fencing's own ha Eviction ended unseen, servers left: no other one", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Ha; s.fencing = fenced(); with_host(o, |h| h.instances = vec!["vm-1".into()]); o.eviction = None; s.lifecycle.eviction = None }, to: Phase::Evicting, must: &["create eviction node-1-ha-1 (NodeFailure)"], never: &[] },
    Row { name: "Active -> Evicting: an update asks for the host (Node annotation maintenance-required)", from: Phase::Active, setup: |_, _, o| { o.node = update_node(false, true); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["disable compute service (hv-lifecycle: maintenance (auto): the Node asks for it", "create eviction node-1-auto-1 (RollingUpdate)"], never: &[] },
    Row { name: "Active -> Maintenance: an update asks for an empty host", from: Phase::Active, setup: |_, _, o| { o.node = update_node(false, true); with_host(o, |h| h.enabled = true) }, to: Phase::Maintenance, must: &["disable compute service"], never: &["create eviction"] },
    Row { name: "Active -> Evicting: a drain refused by the webhook, the Node cordoned", from: Phase::Active, setup: |_, _, o| { o.node = NodeObs::Present { ready: true, cordoned: true, maintenance_required: false, drain_refused: true }; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["disable compute service (hv-lifecycle: maintenance (auto): a drain of the Node was refused", "create eviction node-1-auto-1 (RollingUpdate)"], never: &[] },
    Row { name: "forbidden Active -> Evicting: an update's ask waits for a place (--update-max-held)", from: Phase::Active, setup: |_, _, o| { o.node = update_node(false, true); o.update_wait = Some("10 hosts are held for updates".into()); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["create eviction", "disable"] },
    Row { name: "Evicting -> Maintenance: a host held for an update keeps its place past the limit", from: Phase::Evicting, setup: |_, s, o| { maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Succeeded); o.node = update_node(false, true); o.update_wait = Some("10 hosts are held for updates".into()) }, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "forbidden Active -> Evicting: a refused drain's mark on an uncordoned Node asks nothing", from: Phase::Active, setup: |_, _, o| { o.node = NodeObs::Present { ready: true, cordoned: false, maintenance_required: false, drain_refused: true }; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["create eviction", "disable"] },
    Row { name: "forbidden Active -> Evicting: cordoned, and a cordon starts nothing (the default)", from: Phase::Active, setup: |_, _, o| { o.node = update_node(true, false); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["create eviction", "disable"] },
    Row { name: "forbidden Maintenance -> Onboarding: the update's annotation still stands", from: Phase::Maintenance, setup: |_, s, o| { maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Succeeded); o.node = update_node(false, true) }, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "Maintenance -> Onboarding: the update done (annotation removed)", from: Phase::Maintenance, setup: |_, s, o| { maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Succeeded) }, to: Phase::Onboarding, must: &[], never: &["enable"] },
    Row { name: "Evicting -> Onboarding: the update's ask ends mid-eviction (cancel it)", from: Phase::Evicting, setup: |_, s, o| { maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Migrating) }, to: Phase::Onboarding, must: &["cancel eviction node-1-auto-1"], never: &["enable"] },
    Row { name: "Maintenance -> Evicting: fenced while an update held it empty-handed, servers seen again (evacuate)", from: Phase::Maintenance, setup: |_, s, o| { maintenance_of(s, "auto", RollingUpdate); o.eviction = ev("node-1-auto-1", RollingUpdate, Succeeded); o.node = update_node(false, true); s.fencing = fenced(); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &["create eviction node-1-ha-2 (NodeFailure)"], never: &["enable"] },
    Row { name: "Maintenance -> Evicting: termination requested", from: Phase::Maintenance, setup: |sp, _, _| sp.maintenance = MaintenanceMode::Termination, to: Phase::Evicting, must: &["create eviction node-1-termination-1 (Decommission)"], never: &[] },
    Row { name: "Aborted -> Onboarding: explicit retry", from: Phase::Aborted, setup: |_, _, o| o.retry = Some("2026-11-21T10:00:00Z".into()), to: Phase::Onboarding, must: &[], never: &["enable"] },
    // ---- forbidden: these must not move (or must move elsewhere)
    Row { name: "forbidden Initial -> Active/Testing/Ready: always via Onboarding", from: Phase::Initial, setup: |_, _, o| { o.checks = Some(report(1, &[])); with_host(o, |h| h.enabled = true) }, to: Phase::Onboarding, must: &[], never: &["enable"] },
    Row { name: "forbidden Onboarding -> Testing while an aggregate is missing", from: Phase::Onboarding, setup: |_, _, o| with_host(o, |h| h.aggregates.clear()), to: Phase::Onboarding, must: &["add to aggregate az-a"], never: &["run checks"] },
    Row { name: "forbidden Onboarding -> Testing before the resource provider exists", from: Phase::Onboarding, setup: |_, _, o| with_host(o, |h| h.traits = None), to: Phase::Onboarding, must: &[], never: &["run checks"] },
    Row { name: "forbidden scheduling during Onboarding: Nova's default-enabled service is disabled", from: Phase::Onboarding, setup: |_, _, o| with_host(o, |h| h.enabled = true), to: Phase::Testing, must: &["disable compute service"], never: &["enable"] },
    Row { name: "forbidden Testing -> Ready on a stale report", from: Phase::Testing, setup: |_, s, o| { s.phase_since = None; s.lifecycle.test_started = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t(100))); o.checks = Some(report(0, &[])) }, to: Phase::Testing, must: &["run checks (run 1)"], never: &["enable"] },
    Row { name: "forbidden Testing -> Active directly", from: Phase::Testing, setup: |_, _, o| { o.checks = Some(report(1, &[])); with_host(o, |h| h.enabled = true) }, to: Phase::Ready, must: &["disable compute service"], never: &["enable"] },
    Row { name: "forbidden Aborted -> anything without retry", from: Phase::Aborted, setup: |_, _, o| o.checks = Some(report(1, &[])), to: Phase::Aborted, must: &[], never: &["enable", "run checks"] },
    Row { name: "forbidden Aborted -> Onboarding on an already handled retry", from: Phase::Aborted, setup: |_, s, o| { s.lifecycle.handled_retry = Some("r1".into()); o.retry = Some("r1".into()) }, to: Phase::Aborted, must: &[], never: &[] },
    Row { name: "forbidden Aborted -> Evicting on termination (retry first)", from: Phase::Aborted, setup: |_, _, o| o.node = NodeObs::Deleting, to: Phase::Aborted, must: &[], never: &["create eviction", "delete"] },
    // ---- adopting a host in service (docs/lifecycle.md): never disabled on the way in
    Row { name: "Onboarding -> Testing: a host in service with servers is adopted, not disabled", from: Phase::Onboarding, setup: |_, _, o| with_host(o, |h| { h.enabled = true; h.disabled_reason = None; h.instances = vec!["vm-1".into()] }), to: Phase::Testing, must: &["run checks (run 1)"], never: &["disable"] },
    Row { name: "Onboarding -> Testing: an enabled host without servers is not adopted (disabled until tested)", from: Phase::Onboarding, setup: |_, _, o| with_host(o, |h| { h.enabled = true; h.disabled_reason = None }), to: Phase::Testing, must: &["disable compute service"], never: &[] },
    Row { name: "Testing -> Ready: an adopted host's checks passed", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; o.checks = Some(report(1, &[])); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Ready, must: &[], never: &["disable", "enable"] },
    Row { name: "Testing -> Active: an adopted host's check failed, reported, left in service", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; o.checks = Some(report(1, &["ovs-bridge/br-ex"])); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["disable", "create eviction"] },
    Row { name: "Testing stays: an adopted host waits for its check report, enabled", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Testing, must: &[], never: &["disable"] },
    Row { name: "Testing -> Active: an adopted host in service, no report in time: reported, left in service", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["disable"] },
    Row { name: "Testing -> Aborted: an adopted host disabled meanwhile whose check failed is not put back in service", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; o.checks = Some(report(1, &["ovs-bridge/br-ex"])); with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Aborted, must: &[], never: &["enable"] },
    Row { name: "forbidden Aborted: a host aborted before its first look, found in service, is adopted, not disabled", from: Phase::Aborted, setup: |_, _, o| with_host(o, |h| { h.enabled = true; h.disabled_reason = None; h.instances = vec!["vm-1".into()] }), to: Phase::Aborted, must: &[], never: &["disable"] },
    Row { name: "forbidden Active: an adopted host whose checks failed, its agent lost past the grace, is not disabled", from: Phase::Active, setup: |_, s, o| { s.lifecycle.adopted_checks_failed = Some("run 1: 1 of 3 checks failed".into()); o.health = verdict(crate::api::hypervisor::HealthState::Unreachable, -100_000); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Active, must: &[], never: &["disable"] },
    Row { name: "Onboarding -> Testing: an update's ask of a host found in service waits for a place, not disabled", from: Phase::Onboarding, setup: |_, _, o| { o.node = update_node(false, true); o.update_wait = Some("10 hosts are held for updates".into()); with_host(o, |h| { h.enabled = true; h.disabled_reason = None; h.instances = vec!["vm-1".into()] }) }, to: Phase::Testing, must: &["run checks (run 1)"], never: &["disable", "create eviction"] },
    Row { name: "Testing stays: an adopted host's failed check waits for a look that reads Nova", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; o.checks = Some(report(1, &["ovs-bridge/br-ex"])); o.nova = NovaObs::Unknown }, to: Phase::Testing, must: &[], never: &["disable", "enable"] },
    Row { name: "Onboarding -> Evicting: an SRE's maintenance disables and empties an adopted host", from: Phase::Onboarding, setup: |sp, s, o| { s.lifecycle.adopted = true; sp.maintenance = MaintenanceMode::Manual; sp.maintenance_reason = "firmware".into(); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Evicting, must: &["disable compute service (hv-lifecycle: maintenance (manual): firmware)"], never: &[] },
    Row { name: "forbidden Aborted: an adopted host aborted on its configuration is not disabled", from: Phase::Aborted, setup: |_, s, o| { s.lifecycle.adopted = true; with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Aborted, must: &[], never: &["disable"] },
    // ---- one Nova host, one Hypervisor (docs/lifecycle.md): a host another holds is not touched
    Row { name: "forbidden Initial -> Onboarding: the Nova host is held by another Hypervisor", from: Phase::Initial, setup: |_, _, o| o.claimed_by = Some("node-0".into()), to: Phase::Initial, must: &[], never: &["disable", "enable", "add", "run checks"] },
    Row { name: "forbidden Onboarding -> Testing: the Nova host is held by another Hypervisor", from: Phase::Onboarding, setup: |_, _, o| { o.claimed_by = Some("node-0".into()); with_host(o, |h| h.enabled = true) }, to: Phase::Onboarding, must: &[], never: &["disable", "enable", "add", "remove", "run checks"] },
    Row { name: "forbidden Onboarding -> Maintenance: a hold on a Nova host another Hypervisor holds changes nothing", from: Phase::Onboarding, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; o.claimed_by = Some("node-0".into()); with_host(o, |h| h.enabled = true) }, to: Phase::Onboarding, must: &[], never: &["disable", "create eviction"] },
    Row { name: "Onboarding -> Testing: a Hypervisor whose record names the host keeps it", from: Phase::Onboarding, setup: |_, s, o| { s.lifecycle.nova_host = Some("node-1".into()); o.claimed_by = Some("node-0".into()) }, to: Phase::Testing, must: &["run checks (run 1)"], never: &["enable"] },
    // ---- who owns a disable (docs/lifecycle.md): ours is lifted, anyone else's stands
    Row { name: "Ready: Nova's own new-service disable is ours to lift", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some(disables::NEW_SERVICE_REASON.into())), to: Phase::Ready, must: &["enable compute service"], never: &[] },
    Row { name: "forbidden Ready -> Active: nova-compute's AUTO disable is not lifted", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some("AUTO: Connection to libvirt lost: 1".into())), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active: an SRE's disable is not lifted", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some("firmware check -- jdoe".into())), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "Active: our own disable found is repaired", from: Phase::Active, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some("hv-lifecycle: maintenance (manual)".into())), to: Phase::Active, must: &["enable compute service"], never: &[] },
    Row { name: "forbidden Active: nova-compute's AUTO disable is not re-enabled", from: Phase::Active, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some("AUTO: Connection to libvirt lost: 1".into())), to: Phase::Active, must: &[], never: &["enable", "disable"] },
    Row { name: "Active: our own disable found, recorded before it was sent, is repaired", from: Phase::Active, setup: |_, s, o| { s.lifecycle.disabled_as = Some(vec!["hv-lifecycle: onboarding, not tested yet".into(), "hv-lifecycle: maintenance (manual)".into()]); with_host(o, |h| h.disabled_reason = Some("hv-lifecycle: maintenance (manual)".into())) }, to: Phase::Active, must: &["enable compute service"], never: &[] },
    Row { name: "forbidden Active: a disable of our form never recorded as sent (another install's, or copied) is not re-enabled", from: Phase::Active, setup: |_, s, o| { s.lifecycle.disabled_as = Some(vec!["hv-lifecycle: onboarding, not tested yet".into()]); with_host(o, |h| h.disabled_reason = Some("hv-lifecycle: maintenance (manual): theirs".into())) }, to: Phase::Active, must: &[], never: &["enable", "disable"] },
    Row { name: "forbidden Ready -> Active: a disable of our form never recorded as sent is not lifted", from: Phase::Ready, setup: |_, s, o| { s.lifecycle.disabled_as = Some(vec!["hv-lifecycle: maintenance (auto)".into()]); with_host(o, |h| h.disabled_reason = Some("hv-lifecycle: maintenance (manual): copied".into())) }, to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Active: an SRE's disable is not re-enabled", from: Phase::Active, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some("firmware check -- jdoe".into())), to: Phase::Active, must: &[], never: &["enable", "disable"] },
    Row { name: "forbidden Active: a disable without a reason is not re-enabled", from: Phase::Active, setup: |_, _, o| with_host(o, |h| h.disabled_reason = None), to: Phase::Active, must: &[], never: &["enable", "disable"] },
    Row { name: "forbidden Active: Nova's new-service disable of a host in service is not lifted", from: Phase::Active, setup: |_, _, o| with_host(o, |h| h.disabled_reason = Some(disables::NEW_SERVICE_REASON.into())), to: Phase::Active, must: &[], never: &["enable"] },
    Row { name: "Evicting -> Active: eviction complete, disabled by an SRE meanwhile (theirs stays)", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("drain-1", RollingUpdate, false)); o.eviction = ev("drain-1", RollingUpdate, Succeeded); with_host(o, |h| h.disabled_reason = Some("firmware check -- jdoe".into())) }, to: Phase::Active, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active while a hand-made Eviction empties the host", from: Phase::Ready, setup: |_, _, o| o.eviction = ev("drain-1", AdminRequest, Migrating), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active before Nova shows it enabled", from: Phase::Ready, setup: |_, _, _| {}, to: Phase::Ready, must: &["enable compute service"], never: &[] },
    // ---- one Nova host, one machine
    Row { name: "Ready -> Active: the machine is the one Nova means (names as DNS names)", from: Phase::Ready, setup: |_, _, o| { o.machine_hostname = Some("NODE-1.example.com.".into()); with_host(o, |h| h.enabled = true) }, to: Phase::Active, must: &[], never: &["disable"] },
    Row { name: "forbidden Ready -> Active: libvirt names another machine than Nova's record", from: Phase::Ready, setup: |_, _, o| o.machine_hostname = Some("node-2.example.com".into()), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active: another machine, Nova already enabled (nothing written)", from: Phase::Ready, setup: |_, _, o| { o.machine_hostname = Some("node-2".into()); with_host(o, |h| h.enabled = true) }, to: Phase::Ready, must: &[], never: &["enable", "disable"] },
    Row { name: "forbidden Ready -> Active: another machine, even with skipTests", from: Phase::Ready, setup: |sp, _, o| { sp.skip_tests = true; o.machine_hostname = Some("node-2".into()) }, to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active: the agent has not said which machine it is", from: Phase::Ready, setup: |_, _, o| o.machine_hostname = None, to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Ready -> Active: Nova has no hypervisor record to compare with", from: Phase::Ready, setup: |_, _, o| with_host(o, |h| h.hypervisor_hostname = None), to: Phase::Ready, must: &[], never: &["enable"] },
    Row { name: "forbidden Active: our own disable is not repaired for another machine", from: Phase::Active, setup: |_, _, o| o.machine_hostname = Some("node-2".into()), to: Phase::Active, must: &[], never: &["enable"] },
    Row { name: "Active: our own disable is repaired while the agent's name is not known", from: Phase::Active, setup: |_, _, o| o.machine_hostname = None, to: Phase::Active, must: &["enable compute service"], never: &[] },
    Row { name: "Ready: a predecessor's onboarding disable is ours to lift (a Hypervisor made anew)", from: Phase::Ready, setup: |_, s, _| s.lifecycle.disabled_as = Some(vec![]), to: Phase::Ready, must: &["enable compute service"], never: &[] },
    Row { name: "forbidden Active: a predecessor's onboarding disable found in service is someone else's", from: Phase::Active, setup: |_, s, _| s.lifecycle.disabled_as = Some(vec![]), to: Phase::Active, must: &[], never: &["enable"] },
    Row { name: "forbidden Testing -> Active: an adopted host of another machine whose checks failed", from: Phase::Testing, setup: |_, s, o| { s.lifecycle.adopted = true; o.machine_hostname = Some("node-2".into()); o.checks = Some(report(1, &["ovs-bridge/br-ex"])); with_host(o, |h| { h.enabled = true; h.instances = vec!["vm-1".into()] }) }, to: Phase::Testing, must: &[], never: &["disable", "enable"] },
    Row { name: "Ready -> enable: skipTests and no agent (nothing to compare)", from: Phase::Ready, setup: |sp, _, o| { sp.skip_tests = true; o.machine_hostname = None }, to: Phase::Ready, must: &["enable compute service"], never: &[] },
    Row { name: "forbidden Active -> Maintenance while VMs remain", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; with_host(o, |h| h.instances = vec!["vm-1".into()]) }, to: Phase::Evicting, must: &["create eviction"], never: &[] },
    Row { name: "forbidden Active -> Maintenance when a registered service is missing from Nova's list (a down cell hides it)", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; o.nova = NovaObs::NotRegistered }, to: Phase::Evicting, must: &["create eviction node-1-auto-1 (RollingUpdate)"], never: &["enable"] },
    Row { name: "Onboarding -> Maintenance: maintenance requested before the service ever registered", from: Phase::Onboarding, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Auto; o.nova = NovaObs::NotRegistered }, to: Phase::Maintenance, must: &[], never: &["create eviction"] },
    Row { name: "forbidden Active -> Decommissioned directly", from: Phase::Active, setup: |sp, _, o| { sp.maintenance = MaintenanceMode::Termination; o.nova = NovaObs::NotRegistered }, to: Phase::Evicting, must: &["create eviction node-1-termination-1 (Decommission)"], never: &["delete"] },
    Row { name: "forbidden Active -> Evicting/decommission on a missing (not deleting) Node", from: Phase::Active, setup: |_, _, o| { o.node = NodeObs::Absent; with_host(o, |h| h.enabled = true) }, to: Phase::Active, must: &[], never: &["create eviction", "delete", "disable"] },
    Row { name: "forbidden Maintenance -> Active directly", from: Phase::Maintenance, setup: |_, _, o| with_host(o, |h| h.enabled = false), to: Phase::Onboarding, must: &[], never: &["enable"] },
    Row { name: "forbidden Maintenance -> Onboarding while held by a NodeFailure eviction", from: Phase::Maintenance, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("ha-1", NodeFailure, false)); o.eviction = ev("ha-1", NodeFailure, Succeeded) }, to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "forbidden Evicting (decommission): a fenced host not retired keeps its service", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); s.fencing = fenced(); s.lifecycle.applied_traits = vec!["CUSTOM_HANA".into()] }, to: Phase::Evicting, must: &[], never: &["delete", "remove"] },
    Row { name: "Evicting (decommission): a fenced host once retired loses its service", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); s.fencing = fenced().map(|f| FencingStatus { retirement: Some(FenceRetirement { retired: Some(Time(t(9))), ..FenceRetirement::default() }), ..f }); with_host(o, |h| { h.aggregates.clear(); h.traits = Some(set(&["HW_CPU_X86_AVX2"])) }) }, to: Phase::Evicting, must: &["delete compute service svc-1"], never: &[] },
    Row { name: "forbidden Evicting -> Decommissioned while instances remain", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); with_host(o, |h| { h.aggregates.clear(); h.instances = vec!["vm-stuck".into()] }) }, to: Phase::Evicting, must: &[], never: &["delete", "remove"] },
    Row { name: "forbidden Evicting -> Decommissioned when the service vanished unchecked", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Termination; maintenance_of(s, "termination", Decommission); o.eviction = ev("node-1-termination-1", Decommission, Succeeded); o.nova = NovaObs::NotRegistered }, to: Phase::Evicting, must: &[], never: &[] },
    Row { name: "forbidden Evicting -> Maintenance while the eviction runs", from: Phase::Evicting, setup: |sp, s, o| { sp.maintenance = MaintenanceMode::Manual; maintenance_of(s, "manual", AdminRequest); o.eviction = ev("node-1-manual-1", AdminRequest, Migrating) }, to: Phase::Evicting, must: &[], never: &["create eviction", "enable"] },
    Row { name: "forbidden Evicting -> Active while another Eviction still empties the host", from: Phase::Evicting, setup: |_, s, o| { s.lifecycle.eviction = Some(eviction_ref("drain", RollingUpdate, false)); o.eviction = ev("drain-2", AdminRequest, Migrating) }, to: Phase::Evicting, must: &[], never: &["enable"] },
    Row { name: "forbidden Evicting -> Active for a NodeFailure eviction that was cancelled", from: Phase::Evicting, setup: |_, s, _| s.lifecycle.eviction = Some(eviction_ref("ha-1", NodeFailure, false)), to: Phase::Maintenance, must: &[], never: &["enable"] },
    Row { name: "forbidden Decommissioned -> anything", from: Phase::Decommissioned, setup: |_, _, o| { o.retry = Some("r9".into()); o.checks = Some(report(1, &[])) }, to: Phase::Decommissioned, must: &[], never: &["enable", "create", "add"] },
    Row { name: "Decommissioned: a compute service registered again is disabled, nothing else", from: Phase::Decommissioned, setup: |_, _, o| { with_host(o, |h| { h.enabled = true; h.service_id = "svc-2".into() }) }, to: Phase::Decommissioned, must: &["disable compute service (hv-lifecycle: host was decommissioned; re-registered service disabled)"], never: &["enable", "add", "delete", "run checks"] },
];

fn run_row(row: &Row) -> Decision {
    let mut sp = spec();
    let mut st = status(row.from);
    let mut o = obs();
    (row.setup)(&mut sp, &mut st, &mut o);
    let now = if row.name.contains("no report in time") { t(3600) } else { t(60) };
    decide_at(&sp, &st, &o, now)
}

#[test]
fn every_row_of_the_table() {
    let mut failures = Vec::new();
    for row in ROWS {
        let d = run_row(row);
        let actions: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
        let mut why = Vec::new();
        if d.phase != row.to {
            why.push(format!("phase {} (want {})", d.phase, row.to));
        }
        for m in row.must {
            if !actions.iter().any(|a| a.starts_with(m)) {
                why.push(format!("missing action `{m}`"));
            }
        }
        for n in row.never {
            if let Some(a) = actions.iter().find(|a| a.starts_with(n)) {
                why.push(format!("forbidden action `{a}`"));
            }
        }
        if d.phase != row.from && !ALLOWED_TRANSITIONS.contains(&(row.from, d.phase)) {
            why.push("transition not in ALLOWED_TRANSITIONS".into());
        }
        if !why.is_empty() {
            failures.push(format!(
                "{}: {} — actions {:?}, transition {:?}",
                row.name,
                why.join(", "),
                actions,
                d.transition
            ));
        }
    }
    assert!(failures.is_empty(), "{} row(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn every_allowed_transition_has_a_row() {
    for (from, to) in ALLOWED_TRANSITIONS {
        let covered = ROWS.iter().any(|r| r.from == *from && r.to == *to);
        assert!(covered, "no table row shows {from} -> {to}");
    }
}

#[test]
fn aborted_condition_names_the_cause() {
    let mut o = obs();
    with_host(&mut o, |h| {
        h.aggregates.clear();
        h.unknown_aggregates = set(&["az-missing"]);
    });
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(1));
    assert_eq!(d.phase, Phase::Aborted);
    let onboarded = d.conditions.iter().find(|c| c.type_ == crate::api::ConditionType::Onboarded);
    let onboarded = onboarded.map(|c| (c.status, c.reason.clone(), c.message.clone()));
    assert_eq!(
        onboarded,
        Some((
            crate::api::ConditionStatus::False,
            "AggregateNotFound".to_string(),
            "aggregate(s) az-missing do not exist in Nova".into()
        ))
    );
    // The cause survives into later reconciles from the stored record.
    let mut st = status(Phase::Aborted);
    st.lifecycle = d.record.clone();
    let again = decide_at(&spec(), &st, &obs(), t(2));
    let aborted = again.conditions.iter().find(|c| c.type_ == crate::api::ConditionType::Aborted);
    assert!(
        aborted.is_some_and(|c| c.message.contains("az-missing") && c.message.contains("hvctl retry node-1"))
    );
}

#[test]
fn failed_checks_are_named_in_the_condition_and_recorded() {
    let mut o = obs();
    o.checks = Some(report(1, &["ovs-bridge/br-ex"]));
    let d = decide_at(&spec(), &status(Phase::Testing), &o, t(5));
    let tested = d.conditions.iter().find(|c| c.type_ == crate::api::ConditionType::Tested);
    assert!(tested.is_some_and(|c| {
        c.reason == "ChecksFailed" && c.message.contains("ovs-bridge/br-ex: ovs-bridge/br-ex failed")
    }));
    assert_eq!(d.checks.as_ref().map(Vec::len), Some(4));
}

#[test]
fn aggregates_are_added_before_old_ones_are_removed() {
    let mut sp = spec();
    sp.aggregates = vec!["az-b".into()];
    let mut st = status(Phase::Active);
    st.lifecycle.applied_aggregates = vec!["az-a".into()];
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&sp, &st, &o, t(1));
    let acts: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
    assert_eq!(acts, vec!["add to aggregate az-b"], "only the add first");
    // Once Nova shows the new membership, the old one is removed.
    with_host(&mut o, |h| h.aggregates = set(&["az-a", "az-b"]));
    st.lifecycle = d.record;
    let d = decide_at(&sp, &st, &o, t(2));
    let acts: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
    assert_eq!(acts, vec!["remove from aggregate az-a"]);
    // An aggregate somebody else added is never ours to remove.
    with_host(&mut o, |h| h.aggregates = set(&["az-b", "ops-pinned"]));
    st.lifecycle = d.record;
    let d = decide_at(&sp, &st, &o, t(3));
    assert!(d.actions.is_empty(), "{:?}", d.actions);
}

#[test]
fn drift_in_active_is_repaired_and_reported() {
    let mut o = obs();
    with_host(&mut o, |h| {
        h.enabled = false;
        h.disabled_reason = Some("hv-lifecycle: maintenance (manual)".into());
        h.traits = Some(set(&[]));
    });
    let d = decide_at(&spec(), &status(Phase::Active), &o, t(1));
    let acts: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
    assert_eq!(acts, vec!["enable compute service", "add traits CUSTOM_HANA"]);
    assert_eq!(d.warnings.len(), 2, "{:?}", d.warnings);
    assert!(d.warnings.iter().all(|w| w.reason == DRIFT_REPAIRED), "{:?}", d.warnings);
    assert_eq!(d.phase, Phase::Active);
}

#[test]
fn a_disable_by_anyone_else_stands_is_shown_with_its_reason_and_told_once() {
    let mut o = obs();
    with_host(&mut o, |h| {
        h.enabled = false;
        h.disabled_reason = Some("AUTO: Connection to libvirt lost: 1".into());
    });
    let mut st = status(Phase::Active);
    let d = decide_at(&spec(), &st, &o, t(1));
    assert!(acts(&d).is_empty(), "{:?}", d.actions);
    let said = condition(&d, crate::api::ConditionType::SchedulingEnabled);
    assert_eq!((said.status, said.reason.as_str()), (crate::api::ConditionStatus::False, DISABLED_ELSEWHERE));
    assert!(said.message.contains("AUTO: Connection to libvirt lost: 1"), "{said:?}");
    assert_eq!(d.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), [DISABLED_ELSEWHERE]);
    // Told once: the next look finds it shown.
    st.conditions = crate::api::condition::merge(&st.conditions, &d.conditions, t(1), None);
    let d = decide_at(&spec(), &st, &o, t(2));
    assert!(d.warnings.is_empty() && acts(&d).is_empty(), "{d:?}");
    // The other party enables it again: we follow.
    with_host(&mut o, |h| {
        h.enabled = true;
        h.disabled_reason = None;
    });
    let d = decide_at(&spec(), &st, &o, t(3));
    assert!(acts(&d).is_empty(), "{:?}", d.actions);
    assert_eq!(
        condition(&d, crate::api::ConditionType::SchedulingEnabled).status,
        crate::api::ConditionStatus::True
    );
}

#[test]
fn maintenance_keeps_nova_disabled_when_reenabled_behind_our_back() {
    let mut sp = spec();
    sp.maintenance = MaintenanceMode::Manual;
    sp.maintenance_reason = "disk swap".into();
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&sp, &status(Phase::Maintenance), &o, t(1));
    let acts: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
    assert_eq!(acts, vec!["disable compute service (hv-lifecycle: maintenance (manual): disk swap)"]);
    assert_eq!(d.phase, Phase::Maintenance);
}

#[test]
fn restart_with_eviction_not_yet_visible_recreates_under_the_same_name() {
    let mut sp = spec();
    sp.maintenance = MaintenanceMode::Auto;
    let mut st = status(Phase::Evicting);
    st.lifecycle.eviction =
        Some(eviction_ref("node-1-auto-1", crate::api::EvictionReason::RollingUpdate, true));
    st.lifecycle.eviction_seq = 1;
    let d = decide_at(&sp, &st, &obs(), t(1));
    let acts: Vec<String> = d.actions.iter().map(|a| a.to_string()).collect();
    assert_eq!(acts, vec!["create eviction node-1-auto-1 (RollingUpdate)"]);
    assert_eq!(d.record.eviction_seq, 1, "no second eviction is minted");
}

#[test]
fn an_adopted_host_stops_being_adopted_once_aborted_and_its_failure_goes_when_validated_afresh() {
    let mut st = status(Phase::Testing);
    st.lifecycle.adopted = true;
    let mut o = obs();
    o.checks = Some(report(1, &["ovs-bridge/br-ex"]));
    let d = decide_at(&spec(), &st, &o, t(60));
    assert_eq!((d.phase, d.record.adopted), (Phase::Aborted, false), "disabled meanwhile: as any host");
    let mut st = status(Phase::Maintenance);
    st.lifecycle.adopted_checks_failed = Some("run 1: 1 of 3 checks failed".into());
    let d = decide_at(&spec(), &st, &obs(), t(60));
    assert_eq!((d.phase, d.record.adopted_checks_failed), (Phase::Onboarding, None));
}

#[test]
fn a_nova_host_another_hypervisor_holds_is_refused_naming_it_and_told_once() {
    let mut o = obs();
    o.claimed_by = Some("compute-3".into());
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(60));
    let c = condition(&d, crate::api::ConditionType::Onboarded);
    assert_eq!((c.status, c.reason.as_str()), (crate::api::ConditionStatus::False, NOVA_HOST_CLAIMED));
    assert!(c.message.contains("held by Hypervisor compute-3"), "{}", c.message);
    assert_eq!(d.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), [NOVA_HOST_CLAIMED]);
    assert!(d.actions.is_empty(), "{:?}", d.actions);
    assert_eq!(
        (d.record.nova_host.as_deref(), d.service_id.as_deref()),
        (None, None),
        "nothing of it recorded"
    );
    // Told once: the condition stands, no new warning.
    let mut st = status(Phase::Onboarding);
    st.conditions = crate::api::condition::merge(&[], &d.conditions, t(60), None);
    let again = decide_at(&spec(), &st, &o, t(120));
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    // Once the holder is gone, it onboards.
    o.claimed_by = None;
    let freed = decide_at(&spec(), &st, &o, t(180));
    assert_eq!(freed.record.nova_host.as_deref(), Some("node-1"));
    assert_ne!(condition(&freed, crate::api::ConditionType::Onboarded).reason, NOVA_HOST_CLAIMED);
}

fn condition(d: &Decision, t: crate::api::ConditionType) -> DesiredCondition {
    d.conditions.iter().find(|c| c.type_ == t).cloned().unwrap_or_else(|| panic!("no {t} condition"))
}

#[test]
fn onboarding_names_close_compute_services_when_the_nova_host_is_not_found() {
    let mut o = obs();
    o.nova = NovaObs::NotRegistered;
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(1));
    assert_eq!(condition(&d, crate::api::ConditionType::Onboarded).reason, "WaitingForNovaCompute");
    o.close_hosts = vec!["node (same short name)".into()];
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(1));
    let c = condition(&d, crate::api::ConditionType::Onboarded);
    assert_eq!(c.reason, "NovaHostNotFound");
    assert!(c.message.contains("node-1") && c.message.contains("node (same short name)"), "{}", c.message);
    assert_eq!(d.phase, Phase::Onboarding, "still waiting: the service may yet register");
    // Past the registration timeout, the abort names them too.
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(3600));
    assert_eq!(d.phase, Phase::Aborted);
    let c = condition(&d, crate::api::ConditionType::Onboarded);
    assert!(c.reason == "RegistrationTimeout" && c.message.contains("close: node"), "{c:?}");
}

#[test]
fn the_nova_host_is_the_one_in_spec_until_found_then_the_found_one_stays() {
    let mut sp = spec();
    sp.nova_host = "node".into();
    let mut st = status(Phase::Onboarding);
    assert_eq!(nova_host(NAME, &sp, &st), "node");
    let d = decide_at(&sp, &st, &obs(), t(1));
    assert_eq!(d.record.nova_host.as_deref(), Some("node"), "recorded once registered");
    st.lifecycle = d.record;
    st.phase = Some(d.phase);
    sp.nova_host = "elsewhere".into();
    assert_eq!(nova_host(NAME, &sp, &st), "node", "a later spec change does not move the host");
    let d = decide_at(&sp, &st, &obs(), t(2));
    let c = condition(&d, crate::api::ConditionType::Onboarded);
    assert_eq!(c.reason, "NovaHostChanged");
    assert!(c.message.contains("elsewhere") && c.message.contains("node"), "{}", c.message);
    sp.nova_host = String::new();
    assert_eq!(nova_host(NAME, &sp, &status(Phase::Initial)), NAME, "empty: the Node name");
}

#[test]
fn a_service_nova_enabled_on_registration_is_reported_once() {
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    let mut st = status(Phase::Onboarding);
    st.service_id = None;
    let d = decide_at(&spec(), &st, &o, t(1));
    assert!(d.warnings.iter().any(|w| w.reason == NOVA_ENABLES_NEW_SERVICES), "{:?}", d.warnings);
    assert!(d.actions.iter().any(|a| matches!(a, Action::DisableService { .. })));
    st.service_id = d.service_id.clone();
    let d = decide_at(&spec(), &st, &o, t(2));
    assert!(d.warnings.is_empty(), "said once, at the first registration: {:?}", d.warnings);
}

#[test]
fn a_decommissioned_host_that_registers_again_is_disabled_and_reported() {
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&spec(), &status(Phase::Decommissioned), &o, t(1));
    assert!(d.warnings.iter().any(|w| w.reason == SERVICE_RE_REGISTERED), "{:?}", d.warnings);
    let c = condition(&d, crate::api::ConditionType::SchedulingEnabled);
    assert_eq!((c.status, c.reason.as_str()), (crate::api::ConditionStatus::False, "ReRegistered"));
    // Once disabled it stays reported, with no further action or Event.
    with_host(&mut o, |h| h.enabled = false);
    let d = decide_at(&spec(), &status(Phase::Decommissioned), &o, t(2));
    assert!(d.actions.is_empty() && d.warnings.is_empty(), "{:?} {:?}", d.actions, d.warnings);
    assert_eq!(condition(&d, crate::api::ConditionType::SchedulingEnabled).reason, "ReRegistered");
}

fn verdict(state: crate::api::hypervisor::HealthState, since: i64) -> Option<HealthObs> {
    Some(HealthObs {
        state,
        since: Some(t(since)),
        summary: "agent: no session since then".into(),
        hold_back: None,
        empties: true,
    })
}

fn acts(d: &Decision) -> Vec<String> {
    d.actions.iter().map(|a| a.to_string()).collect()
}

/// A fenced host is disabled at once (no grace, no fleet gate) and stays
/// so when it looks healthy again: only an SRE clears a fencing.
#[test]
fn a_fenced_host_is_held_disabled_whatever_its_health_until_the_fencing_is_cleared() {
    use crate::api::ConditionType::SchedulingEnabled;
    use crate::api::hypervisor::HealthState::*;
    let sp = spec();
    let mut st = status(Phase::Active);
    st.lifecycle.test_run = 1;
    st.fencing = Some(Default::default());
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    o.agent.connected = false;
    let mut failed = verdict(Failed, 0);
    if let Some(v) = failed.as_mut() {
        v.hold_back = Some("7 of 10 judged hosts are Unreachable or Failed".into());
    }
    o.health = failed;
    let d = decide_at(&sp, &st, &o, t(10));
    assert_eq!(acts(&d), ["disable compute service (hv-lifecycle: host unseen (fenced))"]);
    assert_eq!(condition(&d, SchedulingEnabled).reason, "HostFenced");
    st.lifecycle = d.record;
    with_host(&mut o, |h| h.enabled = false);
    // Healthy again: no recheck, no enable.
    o.agent.connected = true;
    o.health = verdict(Healthy, 500);
    o.checks = Some(report(1, &[]));
    let d = decide_at(&sp, &st, &o, t(600));
    assert!(d.actions.is_empty(), "{d:?}");
    assert_eq!(condition(&d, SchedulingEnabled).reason, "HostFenced");
}

/// The whole story of a host we lose sight of (docs/health.md), one
/// decision at a time, each fed the record the last one wrote.
#[test]
fn an_unseen_host_is_disabled_after_the_grace_moves_nothing_and_comes_back_only_through_a_passed_recheck() {
    use crate::api::ConditionType::{SchedulingEnabled, Tested};
    use crate::api::hypervisor::HealthState::*;
    let sp = spec();
    let mut st = status(Phase::Active);
    st.lifecycle.test_run = 1;
    let mut o = obs();
    with_host(&mut o, |h| {
        h.enabled = true;
        h.instances = vec!["vm-1".into()];
    });
    o.agent.connected = false;

    // Within the grace (five minutes by default): nothing.
    o.health = verdict(Unreachable, 0);
    let d = decide_at(&sp, &st, &o, t(299));
    assert!(d.actions.is_empty() && d.record.unseen.is_none(), "{d:?}");
    // Past it: disabled with the cause, a Warning, and nothing moved.
    let d = decide_at(&sp, &st, &o, t(300));
    assert_eq!(
        acts(&d),
        ["disable compute service (hv-lifecycle: host unseen (Unreachable: agent: no session since then))"]
    );
    assert_eq!((d.phase, d.warnings[0].reason), (Phase::Active, HOST_UNSEEN));
    assert_eq!(condition(&d, SchedulingEnabled).reason, "HostUnseen");
    st.lifecycle = d.record;
    disabled_as_sent(&mut o, &st);

    // Not judged (the coordinator blind): the hold stands, nothing else.
    o.health = None;
    let d = decide_at(&sp, &st, &o, t(400));
    assert!(d.actions.is_empty() && d.record.unseen == st.lifecycle.unseen, "{d:?}");
    // Drift repair does not enable it: someone enabled it by hand.
    o.health = verdict(Unreachable, 0);
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&sp, &st, &o, t(410));
    assert_eq!(
        acts(&d),
        ["disable compute service (hv-lifecycle: host unseen (Unreachable: agent: no session since then))"]
    );
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    disabled_as_sent(&mut o, &st);

    // Seen again: run 2 is asked for, and the host stays disabled.
    o.agent.connected = true;
    o.health = verdict(Healthy, 500);
    let d = decide_at(&sp, &st, &o, t(500));
    assert_eq!(acts(&d), ["run checks (run 2)"]);
    assert_eq!(condition(&d, Tested).reason, "Rechecking");
    st.lifecycle = d.record;
    // A stale pass (run 1) enables nothing; run 2 failing holds it.
    o.checks = Some(report(1, &[]));
    let d = decide_at(&sp, &st, &o, t(501));
    assert_eq!(acts(&d), ["run checks (run 2)"]);
    o.checks = Some(report(2, &["ovs-bridge/br-ex"]));
    let d = decide_at(&sp, &st, &o, t(502));
    assert!(d.actions.is_empty(), "{d:?}");
    assert_eq!(condition(&d, SchedulingEnabled).reason, "RecheckFailed");
    assert!(condition(&d, SchedulingEnabled).message.contains("hvctl retry node-1"), "{d:?}");
    st.lifecycle = d.record;
    // ... until a retry, even if a pass of run 2 shows up later.
    o.checks = Some(report(2, &[]));
    let d = decide_at(&sp, &st, &o, t(503));
    assert!(d.actions.is_empty(), "{d:?}");
    o.retry = Some("r1".into());
    let d = decide_at(&sp, &st, &o, t(504));
    assert_eq!(acts(&d), ["run checks (run 3)"]);
    st.lifecycle = d.record;
    // A pass of run 3 enables it; the hold is gone once Nova shows it
    // enabled (an enable that failed is asked again, with no new run).
    o.checks = Some(report(3, &[]));
    let d = decide_at(&sp, &st, &o, t(505));
    assert_eq!(acts(&d), ["enable compute service"]);
    assert!(d.record.unseen.is_some() && d.warnings.is_empty(), "{d:?}");
    st.lifecycle = d.record;
    assert_eq!(acts(&decide_at(&sp, &st, &o, t(506))), ["enable compute service"], "asked again");
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&sp, &st, &o, t(507));
    assert!(d.actions.is_empty() && d.record.unseen.is_none() && d.warnings.is_empty(), "{d:?}");
    assert_eq!(d.phase, Phase::Active);
}

#[test]
fn a_failed_host_waits_the_grace_too_and_a_skip_tests_host_needs_no_recheck() {
    use crate::api::hypervisor::HealthState::*;
    let mut sp = spec();
    let mut st = status(Phase::Active);
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    o.health = verdict(Failed, 100);
    assert!(decide_at(&sp, &st, &o, t(399)).actions.is_empty());
    let d = decide_at(&sp, &st, &o, t(400));
    assert!(acts(&d)[0].starts_with("disable compute service (hv-lifecycle: host unseen (Failed"), "{d:?}");
    // Degraded and Healthy hosts are no business of the hold.
    for state in [Healthy, Degraded] {
        o.health = verdict(state, -10_000);
        assert!(decide_at(&sp, &st, &o, t(100)).record.unseen.is_none());
    }
    o.health = verdict(Failed, 100);
    st.lifecycle = decide_at(&sp, &st, &o, t(400)).record;
    disabled_as_sent(&mut o, &st);
    sp.skip_tests = true;
    o.health = verdict(Healthy, 500);
    let d = decide_at(&sp, &st, &o, t(500));
    assert_eq!(acts(&d), ["enable compute service"]);
    st.lifecycle = d.record;
    with_host(&mut o, |h| h.enabled = true);
    assert!(decide_at(&sp, &st, &o, t(501)).record.unseen.is_none());
}

/// The fleet gate holds new holds back; a hold whose record was lost (a
/// status write failed after the disable) is found again in Nova's reason;
/// a failed recheck is not undone by an agent restart.
#[test]
fn the_gate_holds_back_nova_remembers_a_lost_hold_and_a_failed_recheck_waits_for_a_retry() {
    use crate::api::hypervisor::HealthState::*;
    let sp = spec();
    let st = status(Phase::Active);
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    o.health = verdict(Unreachable, 0);
    if let Some(h) = o.health.as_mut() {
        h.hold_back = Some("3 of 4 judged hosts".into());
    }
    let d = decide_at(&sp, &st, &o, t(1000));
    assert!(d.actions.is_empty() && d.record.unseen.is_none(), "{d:?}");
    let said = condition(&d, crate::api::ConditionType::SchedulingEnabled);
    assert_eq!(said.reason, "UnseenHeldBack");
    assert!(said.message.ends_with("not disabled: 3 of 4 judged hosts"), "{said:?}");
    // Nor enabled, if someone disabled it meanwhile (no drift repair).
    with_host(&mut o, |h| h.enabled = false);
    assert!(decide_at(&sp, &st, &o, t(1000)).actions.is_empty());
    // Nova disabled with our reason, our record empty, the agent back:
    // held again and rechecked, not "drift repaired".
    o.health = verdict(Healthy, 1000);
    with_host(&mut o, |h| {
        h.enabled = false;
        h.disabled_reason = Some("hv-lifecycle: host unseen (Unreachable: agent: no session)".into());
    });
    let d = decide_at(&sp, &st, &o, t(1001));
    assert_eq!(acts(&d), ["run checks (run 1)"]);
    assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    assert_eq!(d.record.unseen.as_ref().map(|u| u.cause.as_str()), Some("Unreachable: agent: no session"));
    let mut st = st;
    st.lifecycle = d.record;
    o.checks = Some(report(1, &["libvirt-version"]));
    st.lifecycle = decide_at(&sp, &st, &o, t(1002)).record;
    // The agent goes and comes back: the failed run still stands.
    o.health = verdict(Unreachable, 1003);
    st.lifecycle = decide_at(&sp, &st, &o, t(1003)).record;
    o.health = verdict(Healthy, 1004);
    o.checks = None;
    let d = decide_at(&sp, &st, &o, t(1004));
    assert!(d.actions.is_empty(), "{d:?}");
    assert_eq!(condition(&d, crate::api::ConditionType::SchedulingEnabled).reason, "RecheckFailed");
}

#[test]
fn a_host_unseen_past_the_grace_is_not_enabled_from_ready_or_by_the_end_of_an_eviction() {
    use crate::api::hypervisor::HealthState::*;
    let sp = spec();
    let mut o = obs();
    o.health = verdict(Unreachable, 0);
    let d = decide_at(&sp, &status(Phase::Ready), &o, t(1000));
    assert!(d.actions.is_empty() && d.phase == Phase::Ready, "{d:?}");
    assert_eq!(condition(&d, crate::api::ConditionType::SchedulingEnabled).reason, "HostUnseen");
    let mut st = status(Phase::Evicting);
    st.lifecycle.eviction = Some(eviction_ref("drain-1", RollingUpdate, false));
    o.eviction = ev("drain-1", RollingUpdate, Succeeded);
    let d = decide_at(&sp, &st, &o, t(1000));
    assert_eq!(d.phase, Phase::Active);
    assert!(d.actions.is_empty() && d.record.unseen.is_some(), "{d:?}");
}

#[test]
fn a_held_host_stays_disabled_past_a_re_enabling_eviction_and_leaves_the_hold_with_a_maintenance() {
    use crate::api::hypervisor::HealthState::*;
    let sp = spec();
    let mut st = status(Phase::Active);
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    o.health = verdict(Failed, 0);
    st.lifecycle = decide_at(&sp, &st, &o, t(400)).record;
    with_host(&mut o, |h| h.enabled = false);
    // A hand-made re-enabling eviction runs and ends: back to Active, still held.
    o.eviction = ev("drain-1", RollingUpdate, Migrating);
    let d = decide_at(&sp, &st, &o, t(401));
    assert_eq!(d.phase, Phase::Evicting);
    st.phase = Some(d.phase);
    st.lifecycle = d.record;
    assert!(st.lifecycle.unseen.is_some(), "the hold survives an eviction");
    o.eviction = ev("drain-1", RollingUpdate, Succeeded);
    let d = decide_at(&sp, &st, &o, t(402));
    assert_eq!(d.phase, Phase::Active);
    assert!(!acts(&d).contains(&"enable compute service".to_string()), "{d:?}");
    assert!(d.record.unseen.is_some());
    // A maintenance ends it: the host comes back through Onboarding's checks.
    st.phase = Some(Phase::Active);
    st.lifecycle = d.record;
    o.eviction = None;
    let mut sp = sp;
    sp.maintenance = MaintenanceMode::Auto;
    with_host(&mut o, |h| h.instances.clear());
    let d = decide_at(&sp, &st, &o, t(403));
    assert_eq!(d.phase, Phase::Maintenance);
    assert!(d.record.unseen.is_none());
}

/// A fenced host's running Eviction is its fencing's evacuation: once it
/// ends, no other is made for the servers it left.
#[test]
fn an_eviction_running_when_the_host_is_fenced_counts_as_its_evacuation() {
    use crate::api::EvictionReason::AdminRequest;
    let mut sp = spec();
    sp.maintenance = MaintenanceMode::Manual;
    let mut st = status(Phase::Evicting);
    maintenance_of(&mut st, "manual", AdminRequest);
    st.fencing = fenced();
    let mut o = obs();
    o.eviction = ev("node-1-manual-1", AdminRequest, EvictionPhase::Migrating);
    with_host(&mut o, |h| h.instances = vec!["opted-out".into()]);
    let d = decide_at(&sp, &st, &o, t(50));
    assert_eq!(d.record.evacuated_for, fenced().and_then(|f| f.started));
    st.lifecycle = d.record;
    o.eviction = ev("node-1-manual-1", AdminRequest, EvictionPhase::Succeeded);
    let d = decide_at(&sp, &st, &o, t(60));
    assert_eq!(d.phase, Phase::Maintenance);
    st.lifecycle = d.record;
    st.phase = Some(Phase::Maintenance);
    let d = decide_at(&sp, &st, &o, t(70));
    assert!(d.actions.iter().all(|a| !a.to_string().starts_with("create eviction")), "{d:?}");
}

/// The fencing's own `ha` Eviction counts as its evacuation from the
/// moment it is made: ended before it was ever seen running (every server
/// skipped, or across a fail-over), it is not followed by another.
#[test]
fn the_fencings_own_eviction_counts_as_its_evacuation_even_if_never_seen_running() {
    let mut sp = spec();
    sp.maintenance = MaintenanceMode::Ha;
    let mut st = status(Phase::Active);
    st.fencing = fenced();
    let mut o = obs();
    with_host(&mut o, |h| h.instances = vec!["opted-out".into()]);
    let d = decide_at(&sp, &st, &o, t(50));
    assert!(acts(&d).iter().any(|a| a.starts_with("create eviction")), "{d:?}");
    assert_eq!(d.record.evacuated_for, fenced().and_then(|f| f.started));
    let name = d.record.eviction.clone().unwrap().name;
    st.lifecycle = d.record;
    st.phase = Some(d.phase);
    o.eviction = ev(&name, NodeFailure, EvictionPhase::Succeeded);
    let d = decide_at(&sp, &st, &o, t(60));
    assert_eq!(d.phase, Phase::Maintenance);
    st.lifecycle = d.record;
    st.phase = Some(Phase::Maintenance);
    let d = decide_at(&sp, &st, &o, t(70));
    assert!(acts(&d).iter().all(|a| !a.starts_with("create eviction")), "{d:?}");
}

/// Where the site says so, a cordon is an update's ask: `auto`
/// maintenance while it stands, back through the checks once uncordoned;
/// an SRE's own maintenance is never overridden by it.
#[test]
fn a_cordon_starts_auto_maintenance_only_where_the_policy_says_so() {
    let policy = Policy { cordon_starts_maintenance: true, ..Policy::default() };
    let sp = spec();
    let st = status(Phase::Active);
    let mut o = obs();
    o.node = update_node(true, false);
    with_host(&mut o, |h| {
        h.enabled = true;
        h.instances = vec!["vm-1".into()]
    });
    let d = decide(&Input { name: NAME, spec: &sp, status: &st, obs: &o, policy: &policy, now: t(10) });
    assert_eq!(d.phase, Phase::Evicting);
    assert!(
        acts(&d).iter().any(|a| a
            .starts_with("disable compute service (hv-lifecycle: maintenance (auto): the Node is cordoned")),
        "{d:?}"
    );
    assert!(acts(&d).contains(&"create eviction node-1-auto-1 (RollingUpdate)".to_string()), "{d:?}");
    // An SRE's manual maintenance stays manual, cordoned or not.
    let mut manual = spec();
    manual.maintenance = MaintenanceMode::Manual;
    let d = decide(&Input { name: NAME, spec: &manual, status: &st, obs: &o, policy: &policy, now: t(10) });
    assert!(acts(&d).contains(&"create eviction node-1-manual-1 (AdminRequest)".to_string()), "{d:?}");
}

#[test]
fn a_held_host_disabled_by_someone_else_meanwhile_comes_back_without_being_enabled() {
    let mut sp = spec();
    sp.skip_tests = true;
    let mut st = status(Phase::Active);
    st.lifecycle.unseen = Some(crate::api::hypervisor::UnseenHold {
        disabled_at: Time(t(0)),
        cause: "Unreachable: agent: no session".into(),
        recheck_run: None,
        recheck_failed: false,
    });
    let mut o = obs();
    o.health = verdict(crate::api::hypervisor::HealthState::Healthy, 100);
    with_host(&mut o, |h| {
        h.enabled = false;
        h.disabled_reason = Some("firmware check -- jdoe".into());
    });
    let d = decide_at(&sp, &st, &o, t(200));
    assert!(acts(&d).is_empty(), "{:?}", d.actions);
    assert!(d.record.unseen.is_none(), "the hold is over");
    assert_eq!(condition(&d, crate::api::ConditionType::SchedulingEnabled).reason, DISABLED_ELSEWHERE);
    assert_eq!(d.warnings.iter().filter(|w| w.reason == DISABLED_ELSEWHERE).count(), 1, "told once");
    // The same with our own unseen reason: enabled.
    with_host(&mut o, |h| {
        h.disabled_reason = Some("hv-lifecycle: host unseen (Unreachable: agent: no session)".into())
    });
    assert_eq!(acts(&decide_at(&sp, &st, &o, t(200))), ["enable compute service"]);
}

#[test]
fn another_machine_is_named_on_both_sides_and_warned_of_once() {
    let sp = spec();
    let mut o = obs();
    o.machine_hostname = Some("node-2.example.com".into());
    let mut st = status(Phase::Ready);
    let d = decide_at(&sp, &st, &o, t(10));
    assert!(d.actions.is_empty() && d.phase == Phase::Ready, "{d:?}");
    let said = condition(&d, crate::api::ConditionType::SchedulingEnabled);
    assert_eq!(said.reason, MACHINE_MISMATCH);
    assert!(
        said.message.contains("node-2.example.com") && said.message.contains("node-1.example.com"),
        "{said:?}"
    );
    assert!(!said.message.contains("  "), "{said:?}");
    assert_eq!(d.warnings.iter().map(|w| w.reason).collect::<Vec<_>>(), [MACHINE_MISMATCH]);
    st.conditions = crate::api::condition::merge(&[], &d.conditions, t(10), None);
    let again = decide_at(&sp, &st, &o, t(20));
    assert!(again.warnings.is_empty(), "{:?}", again.warnings);
    // The agent of the right machine reports: activated.
    o.machine_hostname = Some("node-1.example.com".into());
    let d = decide_at(&sp, &st, &o, t(30));
    assert_eq!(acts(&d), ["enable compute service"]);
}

#[test]
fn every_disable_of_ours_is_recorded_in_the_decision_that_sends_it() {
    let mut o = obs();
    with_host(&mut o, |h| h.enabled = true);
    let d = decide_at(&spec(), &status(Phase::Onboarding), &o, t(1));
    let sent: Vec<String> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::DisableService { reason } => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 1, "{:?}", d.actions);
    assert_eq!(d.record.disabled_as.as_ref(), Some(&sent), "recorded with the disable");
    // A maintenance's disable of an Active host: recorded beside the first.
    let mut st = status(Phase::Active);
    st.lifecycle.disabled_as = Some(sent.clone());
    let mut sp = spec();
    sp.maintenance = MaintenanceMode::Auto;
    let d = decide_at(&sp, &st, &o, t(2));
    let reason = d.actions.iter().find_map(|a| match a {
        Action::DisableService { reason } => Some(reason.clone()),
        _ => None,
    });
    let reason = reason.expect("the maintenance disables");
    let recorded = d.record.disabled_as.unwrap_or_default();
    assert_eq!(recorded.last(), Some(&reason));
    assert_eq!(recorded.first(), sent.first());
    // No disable sent: nothing recorded anew.
    let d = decide_at(&spec(), &status(Phase::Active), &obs(), t(3));
    assert_eq!(d.record.disabled_as, None);
    // A Hypervisor made by this version records from its first look.
    let d = decide_at(&spec(), &status(Phase::Initial), &obs(), t(4));
    assert_eq!(d.record.disabled_as, Some(vec![]));
}

#[test]
fn a_host_seen_again_as_another_machine_stays_held_and_is_not_checked_again() {
    use crate::api::hypervisor::{HealthState::*, UnseenHold};
    let reason = "hv-lifecycle: host unseen (Unreachable: agent gone)";
    let mut st = status(Phase::Active);
    st.lifecycle.disabled_as = Some(vec![reason.into()]);
    let hold = UnseenHold {
        disabled_at: Time(t(0)),
        cause: "Unreachable: agent gone".into(),
        recheck_run: Some(2),
        recheck_failed: false,
    };
    st.lifecycle.unseen = Some(hold);
    st.lifecycle.test_run = 2;
    let mut o = obs();
    with_host(&mut o, |h| h.disabled_reason = Some(reason.into()));
    o.health = verdict(Healthy, 900);
    o.checks = Some(report(2, &[]));
    o.machine_hostname = Some("node-2.example.com".into());
    for now in [1000, 1010] {
        let d = decide_at(&spec(), &st, &o, t(now));
        assert!(d.actions.is_empty(), "{:?}", d.actions);
        assert!(d.record.unseen.is_some(), "the hold stays");
        assert_eq!(condition(&d, crate::api::ConditionType::SchedulingEnabled).reason, MACHINE_MISMATCH);
        st.lifecycle = d.record;
        st.conditions = crate::api::condition::merge(&st.conditions, &d.conditions, t(now), None);
    }
    // Its own machine's agent: enabled.
    o.machine_hostname = Some("node-1.example.com".into());
    assert_eq!(acts(&decide_at(&spec(), &st, &o, t(1020))), ["enable compute service"]);
}

#[test]
fn a_place_held_for_an_update_is_recorded_while_the_ask_empties_or_holds_the_host() {
    let asks = update_node(false, true);
    let mut o = obs();
    o.node = asks;
    with_host(&mut o, |h| {
        h.enabled = true;
        h.instances = vec!["vm-1".into()];
    });
    // An Active host asked: its place recorded, with the disable it goes with.
    let d = decide_at(&spec(), &status(Phase::Active), &o, t(1));
    assert!(d.actions.iter().any(|a| matches!(a, Action::DisableService { .. })), "{:?}", d.actions);
    assert_eq!(d.record.update_place, Some(Time(t(1))));
    // Kept as it was while the ask holds the host.
    let mut held = status(Phase::Maintenance);
    held.lifecycle.update_place = Some(Time(t(1)));
    assert_eq!(decide_at(&spec(), &held, &o, t(5)).record.update_place, Some(Time(t(1))));
    // Waiting for a place, in service: none taken.
    let mut waits = o.clone();
    waits.update_wait = Some("10 hosts are held for updates".into());
    assert_eq!(decide_at(&spec(), &status(Phase::Active), &waits, t(2)).record.update_place, None);
    // An SRE's own maintenance: no update's place.
    let mut manual = spec();
    manual.maintenance = MaintenanceMode::Manual;
    assert_eq!(decide_at(&manual, &held, &o, t(6)).record.update_place, None);
    // The ask ended: the place is given back.
    let mut ended = o.clone();
    ended.node = update_node(false, false);
    assert_eq!(decide_at(&spec(), &held, &ended, t(7)).record.update_place, None);
    // A host out of service for good takes none.
    assert_eq!(decide_at(&spec(), &status(Phase::Decommissioned), &o, t(8)).record.update_place, None);
}
