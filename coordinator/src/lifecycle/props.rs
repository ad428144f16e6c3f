//! Invariants of the lifecycle, checked two ways:
//! - exhaustively, one decision at a time, over a grid of every phase and a
//!   representative value of every observation (`one_step_rules_hold_on_the_whole_grid`);
//! - over random sequences of observations fed through the real
//!   record-keeping (`sequences_keep_the_invariants`), for the rules that
//!   span several steps.

use std::collections::BTreeSet;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use super::fixtures::*;
use super::*;
use crate::api::eviction::EvictionPhase;
use crate::api::hypervisor::{HealthState, HypervisorSpec, HypervisorStatus, UnseenHold};
use crate::api::{EvictionReason, MaintenanceMode, Phase};

const MODES: [MaintenanceMode; 5] = [
    MaintenanceMode::None,
    MaintenanceMode::Manual,
    MaintenanceMode::Auto,
    MaintenanceMode::Ha,
    MaintenanceMode::Termination,
];

/// Rules that must hold for every single decision.
fn check_one_step(
    sp: &HypervisorSpec,
    st: &HypervisorStatus,
    o: &Observations,
    d: &Decision,
    now: Timestamp,
) -> Result<(), String> {
    let policy = Policy::default();
    let from = st.phase.unwrap_or_default();
    if d.phase != from && !ALLOWED_TRANSITIONS.contains(&(from, d.phase)) {
        return Err(format!("transition {from} -> {} is not allowed", d.phase));
    }
    let found_enabled = matches!(&o.nova, NovaObs::Registered(h) if h.enabled);
    if (from, d.phase) == (Phase::Testing, Phase::Active) && !(st.lifecycle.adopted && found_enabled) {
        return Err("Testing -> Active for a host not adopted, or not in service as it was found".into());
    }
    if d.record.adopted && matches!(d.phase, Phase::Active | Phase::Maintenance | Phase::Evicting) {
        return Err(format!("still adopted in {}", d.phase));
    }
    let enables = d.actions.contains(&Action::EnableService);
    if enables && !matches!(from, Phase::Ready | Phase::Active | Phase::Evicting) {
        return Err(format!("EnableService in {from}"));
    }
    let eviction_runs = o.eviction.as_ref().is_some_and(|e| e.is_active());
    if enables && eviction_runs {
        return Err(format!("EnableService in {from} while an Eviction runs"));
    }
    if let NovaObs::Registered(h) = &o.nova {
        let disables = d.actions.iter().any(|a| matches!(a, Action::DisableService { .. }));
        // An adopted host (in service when first seen) is left enabled.
        let adopted = st.lifecycle.adopted || d.record.adopted;
        if h.enabled
            && matches!(from, Phase::Onboarding | Phase::Testing | Phase::Aborted)
            && !disables
            && !adopted
        {
            return Err(format!("service left enabled in {from}"));
        }
        if d.record.adopted && !st.lifecycle.adopted && (st.lifecycle.test_run > 0 || h.instances.is_empty())
        {
            return Err("adopted a host tested by us already, or empty".into());
        }
        if enables && disables {
            return Err("EnableService and DisableService together".into());
        }
        let in_service = !matches!(from, Phase::Initial | Phase::Onboarding | Phase::Testing | Phase::Ready);
        if enables
            && !h.enabled
            && super::disables::ours_to_enable(
                h.disabled_reason.as_deref(),
                st.lifecycle.disabled_as.as_deref(),
                in_service,
            )
            .is_err()
        {
            return Err(format!("someone else's disable ({:?}) lifted in {from}", h.disabled_reason));
        }
    }
    for a in &d.actions {
        if let Action::DeleteService { .. } = a {
            match &o.nova {
                NovaObs::Registered(h) if h.instances.is_empty() => {}
                other => return Err(format!("DeleteService with nova {other:?}")),
            }
        }
    }
    if d.phase == Phase::Decommissioned && from != Phase::Decommissioned {
        let ok =
            o.nova == NovaObs::NotRegistered && (st.lifecycle.service_deleted || st.service_id.is_none());
        if !ok {
            return Err("Decommissioned without a confirmed delete of an empty service".into());
        }
    }
    if from == Phase::Aborted && d.phase != Phase::Aborted {
        let fresh = o.retry.is_some() && o.retry != st.lifecycle.handled_retry;
        if !fresh {
            return Err("left Aborted without a fresh retry".into());
        }
    }
    if from == Phase::Decommissioned {
        // The one thing done for a decommissioned host: a compute service
        // that registered again is disabled.
        let re_registered_enabled = matches!(&o.nova, NovaObs::Registered(h) if h.enabled);
        let only_disable = d.actions.iter().all(|a| matches!(a, Action::DisableService { .. }));
        if !only_disable || re_registered_enabled == d.actions.is_empty() {
            return Err(format!("actions {:?} on a Decommissioned node with nova {:?}", d.actions, o.nova));
        }
    }
    if d.transition.is_some() != (d.phase != from) {
        return Err("transition record does not match the phase change".into());
    }
    // The unseen hold (docs/health.md): made only on a judged verdict that
    // lost sight of the host, and only a pass of the run started after it
    // was seen again (or skipTests) lifts it with an enable.
    let due = o.health.as_ref().is_some_and(|h| {
        matches!(h.state, HealthState::Unreachable | HealthState::Failed)
            && h.since.is_none_or(|s| now.duration_since(s) >= policy.unreachable_grace)
    });
    let held_back = o.health.as_ref().is_some_and(|h| h.hold_back.is_some());
    let nova_says_held = matches!(&o.nova, NovaObs::Registered(h) if !h.enabled
        && h.disabled_reason.as_deref().is_some_and(|r| r.starts_with("hv-lifecycle: host unseen (")));
    let made = st.lifecycle.unseen.is_none() && d.record.unseen.is_some();
    let may_make = (due && !held_back) || (nova_says_held && from == Phase::Active);
    if made && !may_make {
        return Err(format!("host held unseen on verdict {:?}", o.health));
    }
    if due && enables {
        return Err(format!("enabled while unseen past the grace (gate or not): {:?}", o.health));
    }
    if held_back && d.actions.iter().any(|a| matches!(a, Action::DisableService { reason } if reason.starts_with("hv-lifecycle: host unseen")))
        && st.lifecycle.unseen.is_none()
        && !nova_says_held
    {
        return Err("a host disabled for being unseen while the gate holds back".into());
    }
    let hold = st.lifecycle.unseen.clone().filter(|_| from == Phase::Active);
    let hold = hold.or_else(|| {
        (from == Phase::Active && nova_says_held).then(|| UnseenHold {
            disabled_at: Time(now),
            cause: String::new(),
            recheck_run: None,
            recheck_failed: false,
        })
    });
    if let Some(hold) = hold.filter(|_| enables) {
        let passed = hold.recheck_run.is_some_and(|run| {
            !hold.recheck_failed
                && o.checks.as_ref().is_some_and(|r| {
                    r.run == run && !r.results.is_empty() && r.results.iter().all(|c| c.passed)
                })
        });
        if !passed && !sp.skip_tests {
            return Err(format!("a held host enabled without a passed recheck: {hold:?}"));
        }
    }
    // Nothing is moved off an Active host but for a maintenance (the unseen
    // hold among the rest starts no migration); an update's ask is one.
    let update = match o.node {
        NodeObs::Present { maintenance_required, cordoned, drain_refused, .. } => {
            maintenance_required || (cordoned && (drain_refused || policy.cordon_starts_maintenance))
        }
        _ => false,
    };
    let maintenance = sp.maintenance.is_requested() || o.node == NodeObs::Deleting || update;
    if from == Phase::Active
        && !maintenance
        && d.actions.iter().any(|a| matches!(a, Action::CreateEviction { .. }))
    {
        return Err("an Eviction created in Active without a maintenance".into());
    }
    if d.conditions.len() != 5 {
        return Err(format!("{} owned conditions instead of 5", d.conditions.len()));
    }
    if let Some(c) = d.conditions.iter().find(|c| c.type_.owner() != crate::api::condition::Owner::Lifecycle)
    {
        return Err(format!("decide wrote {}, a condition it does not own", c.type_));
    }
    Ok(())
}

fn grid_specs() -> Vec<HypervisorSpec> {
    let mut out = Vec::new();
    for mode in MODES {
        for skip in [false, true] {
            let mut sp = spec();
            sp.maintenance = mode;
            sp.maintenance_reason = "r".into();
            sp.skip_tests = skip;
            out.push(sp);
        }
    }
    let mut bad = spec();
    bad.custom_traits.push("not-a-trait".into());
    out.push(bad);
    out
}

fn grid_statuses(phase: Phase) -> Vec<HypervisorStatus> {
    let base = status(phase);
    let mut maint = base.clone();
    maint.lifecycle.eviction = Some(eviction_ref("node-1-auto-1", EvictionReason::RollingUpdate, true));
    let mut ext_up = base.clone();
    ext_up.lifecycle.eviction = Some(eviction_ref("drain", EvictionReason::RollingUpdate, false));
    let mut ext_fail = base.clone();
    ext_fail.lifecycle.eviction = Some(eviction_ref("drain", EvictionReason::NodeFailure, false));
    let mut deleted = base.clone();
    deleted.lifecycle.service_deleted = true;
    deleted.lifecycle.eviction = Some(eviction_ref("node-1-auto-1", EvictionReason::Decommission, true));
    deleted.lifecycle.handled_retry = Some("r1".into());
    deleted.phase_since = Some(Time(t(-100_000)));
    let mut fresh = base.clone();
    fresh.service_id = None;
    fresh.phase_since = None;
    let mut out = vec![base.clone(), maint, ext_up, ext_fail.clone(), deleted, fresh];
    if matches!(phase, Phase::Testing | Phase::Aborted) {
        // Adopted: in service when first seen, on its way in.
        let mut adopted = base.clone();
        adopted.lifecycle.adopted = true;
        out.push(adopted);
    }
    if matches!(phase, Phase::Active | Phase::Evicting) {
        // Held unseen: before its recheck, during it (run 1), after it failed.
        for (run, failed) in [(None, false), (Some(1), false), (Some(1), true)] {
            let hold = UnseenHold {
                disabled_at: Time(t(0)),
                cause: "Unreachable: agent".into(),
                recheck_run: run,
                recheck_failed: failed,
            };
            for mut st in [base.clone(), ext_fail.clone()] {
                st.lifecycle.test_run = 1;
                st.lifecycle.test_started = Some(Time(t(0)));
                st.lifecycle.unseen = Some(hold.clone());
                out.push(st);
            }
        }
    }
    out
}

/// Verdicts by agent session: none (not judged), and what a host with or
/// without its agent can be judged.
fn grid_health(agent: bool) -> [Option<HealthObs>; 3] {
    let v = |state, since, hold_back: Option<&str>| {
        let hold_back = hold_back.map(str::to_string);
        Some(HealthObs {
            state,
            since: Some(t(since)),
            summary: "agent: no session".into(),
            hold_back,
            empties: true,
        })
    };
    if agent {
        [None, v(HealthState::Healthy, 0, None), v(HealthState::Degraded, 0, None)]
    } else {
        [None, v(HealthState::Unreachable, 0, None), v(HealthState::Failed, 50, Some("3 of 4 lost"))]
    }
}

fn grid_nova() -> Vec<NovaObs> {
    let enabled = NovaHost { enabled: true, ..host() };
    let busy = NovaHost { enabled: true, instances: vec!["vm-1".into()], ..host() };
    let busy_off = NovaHost { instances: vec!["vm-1".into()], ..host() };
    let missing = NovaHost { aggregates: set(&[]), unknown_aggregates: set(&["az-a"]), ..host() };
    let drifted =
        NovaHost { aggregates: set(&["old"]), traits: Some(set(&["CUSTOM_X"])), enabled: true, ..host() };
    let no_rp = NovaHost { traits: None, hypervisor_id: None, ..host() };
    let emptied = NovaHost { aggregates: set(&[]), traits: Some(set(&[])), ..host() };
    let held = NovaHost {
        disabled_reason: Some("hv-lifecycle: host unseen (Unreachable: agent: no session)".into()),
        ..host()
    };
    vec![
        NovaObs::Unknown,
        NovaObs::Unreachable("timeout".into()),
        NovaObs::Rejected("401".into()),
        NovaObs::NotRegistered,
        NovaObs::Registered(host()),
        NovaObs::Registered(enabled),
        NovaObs::Registered(busy),
        NovaObs::Registered(busy_off),
        NovaObs::Registered(missing),
        NovaObs::Registered(drifted),
        NovaObs::Registered(no_rp),
        NovaObs::Registered(emptied),
        NovaObs::Registered(held),
    ]
}

fn grid_evictions() -> Vec<Option<EvictionObs>> {
    use EvictionPhase::*;
    let mut deleting = eviction("drain", EvictionReason::RollingUpdate, Migrating);
    deleting.deleting = true;
    vec![
        None,
        Some(eviction("node-1-auto-1", EvictionReason::RollingUpdate, Migrating)),
        Some(eviction("node-1-auto-1", EvictionReason::RollingUpdate, Succeeded)),
        Some(eviction("node-1-auto-1", EvictionReason::RollingUpdate, Failed)),
        Some(eviction("drain", EvictionReason::AdminRequest, Migrating)),
        Some(eviction("drain", EvictionReason::RollingUpdate, Succeeded)),
        Some(eviction("drain", EvictionReason::NodeFailure, Succeeded)),
        Some(deleting),
    ]
}

#[test]
fn one_step_rules_hold_on_the_whole_grid() {
    let specs = grid_specs();
    let novas = grid_nova();
    let evictions = grid_evictions();
    let nodes = [
        NodeObs::Present { ready: true, cordoned: false, maintenance_required: false, drain_refused: false },
        NodeObs::Present { ready: true, cordoned: true, maintenance_required: true, drain_refused: false },
        NodeObs::Deleting,
        NodeObs::Absent,
    ];
    let checks = [None, Some(report(1, &[])), Some(report(1, &["libvirt-version"])), Some(report(0, &[]))];
    let retries = [None, Some("r1".to_string()), Some("r2".to_string())];
    let policy = Policy::default();
    let mut decisions = 0u64;
    let mut seen: BTreeSet<(Phase, Phase)> = BTreeSet::new();
    for phase in Phase::ALL {
        for st in grid_statuses(phase) {
            for sp in &specs {
                for nova in &novas {
                    for ev in &evictions {
                        for node in nodes {
                            for (agent, health) in
                                [false, true].into_iter().flat_map(|a| grid_health(a).map(|h| (a, h)))
                            {
                                for ch in &checks {
                                    for retry in &retries {
                                        // Verdicts act in service only, and
                                        // not through retries: kept small.
                                        let acts =
                                            matches!(phase, Phase::Ready | Phase::Active | Phase::Evicting)
                                                && retry.as_deref() != Some("r2");
                                        if health.is_some() && !acts {
                                            continue;
                                        }
                                        let o = Observations {
                                            node,
                                            agent: AgentObs { connected: agent, domains: None, since: None },
                                            checks: ch.clone(),
                                            nova: nova.clone(),
                                            eviction: ev.clone(),
                                            retry: retry.clone(),
                                            close_hosts: Vec::new(),
                                            health: health.clone(),
                                            update_wait: None,
                                            claimed_by: None,
                                            machine_hostname: Some("node-1.example.com".into()),
                                            host_traits: None,
                                            dependencies: Some(Vec::new()),
                                            power: Default::default(),
                                        };
                                        for now in [t(60), t(100_000)] {
                                            let input = Input {
                                                name: NAME,
                                                spec: sp,
                                                status: &st,
                                                obs: &o,
                                                policy: &policy,
                                                now,
                                            };
                                            let d = decide(&input);
                                            if let Err(e) = check_one_step(sp, &st, &o, &d, now) {
                                                panic!(
                                                    "{e}\nstatus {st:?}\nspec {sp:?}\nobs {o:?}\ndecision {d:?}"
                                                );
                                            }
                                            seen.insert((phase, d.phase));
                                            decisions += 1;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    for edge in ALLOWED_TRANSITIONS {
        assert!(seen.contains(edge), "the grid never takes {} -> {}", edge.0, edge.1);
    }
    assert!(decisions > 1_000_000, "grid too small: {decisions}");
}

/// One Nova host, one Hypervisor: in every phase, a Hypervisor with no
/// record of its own whose host another holds does nothing, records no
/// Nova host and takes no service as its own.
#[test]
fn a_hypervisor_whose_nova_host_another_holds_does_nothing_in_any_phase() {
    let mut decisions = 0u32;
    for phase in Phase::ALL {
        for mut st in grid_statuses(phase) {
            st.lifecycle.nova_host = None;
            for sp in &grid_specs() {
                // The shell shows no compute service to a Hypervisor refused one.
                for nova in [NovaObs::NotRegistered, NovaObs::Unknown] {
                    let mut o = super::fixtures::obs();
                    o.nova = nova;
                    o.claimed_by = Some("holder".into());
                    o.retry = Some("r9".into());
                    let d = super::fixtures::decide_at(sp, &st, &o, t(100_000));
                    assert!(d.actions.is_empty(), "{phase}: {:?}", d.actions);
                    assert_eq!(d.record.nova_host, None, "{phase}");
                    assert_eq!(d.service_id, st.service_id, "{phase}");
                    assert_eq!(d.phase, phase, "{phase}: stays where it is");
                    decisions += 1;
                }
            }
        }
    }
    assert!(decisions > 100, "{decisions}");
}

// ------------------------------------------------------------------ sequences

#[derive(Clone, Debug)]
enum NovaKind {
    Unknown,
    Unreachable,
    Rejected,
    NotRegistered,
    Registered {
        enabled: bool,
        aggs: Vec<bool>,
        unknown: bool,
        traits: Option<Vec<bool>>,
        instances: u8,
        hv: bool,
    },
}

#[derive(Clone, Debug)]
enum EvKind {
    None,
    /// The eviction named in status, in this phase.
    Ours(EvictionPhase),
    External {
        reason: EvictionReason,
        phase: EvictionPhase,
        deleting: bool,
    },
}

#[derive(Clone, Copy, Debug)]
enum ChecksKind {
    None,
    Current { pass: bool },
    Stale,
}

#[derive(Clone, Copy, Debug)]
enum RetryKind {
    None,
    Same,
    Fresh,
}

#[derive(Clone, Debug)]
struct Step {
    mode: MaintenanceMode,
    skip: bool,
    node: NodeObs,
    agent: bool,
    nova: NovaKind,
    ev: EvKind,
    checks: ChecksKind,
    retry: RetryKind,
    advance: i64,
    /// Garbage to put into free-text fields.
    junk: String,
    /// The verdict, if judged: which of the two a host with (Healthy,
    /// Degraded) or without (Unreachable, Failed) its agent can have, and
    /// how many seconds ago it began.
    health: Option<(bool, i64)>,
    /// The shell's fleet gate holds new unseen holds back.
    held_back: bool,
}

fn ev_phase() -> impl Strategy<Value = EvictionPhase> {
    use EvictionPhase::*;
    prop::sample::select(vec![Pending, Preflight, Disabling, Migrating, Succeeded, Failed, Cancelled])
}

fn reason() -> impl Strategy<Value = EvictionReason> {
    use EvictionReason::*;
    prop::sample::select(vec![NodeFailure, RollingUpdate, AdminRequest, Decommission])
}

/// No report, one for the current run (passing with `pass`), a stale one.
fn checks_kind(pass: f64) -> impl Strategy<Value = ChecksKind> {
    prop_oneof![
        2 => Just(ChecksKind::None),
        3 => prop::bool::weighted(pass).prop_map(|pass| ChecksKind::Current { pass }),
        1 => Just(ChecksKind::Stale),
    ]
}

/// No retry token (weight `none` against 3), the handled one, a fresh one.
fn retry_kind(none: u32) -> impl Strategy<Value = RetryKind> {
    prop_oneof![none => Just(RetryKind::None), 1 => Just(RetryKind::Same), 2 => Just(RetryKind::Fresh)]
}

/// The Node as a step sees it; with `asks`, now and then an update's ask
/// (its annotation, or a cordon). Without, no draw is spent on it: the
/// deterministic runs below walk the same sequences as before asks existed.
fn node_obs(asks: bool) -> BoxedStrategy<NodeObs> {
    let plain = any::<bool>().prop_map(|ready| NodeObs::Present {
        ready,
        cordoned: false,
        maintenance_required: false,
        drain_refused: false,
    });
    if asks {
        let ask = (any::<bool>(), prop::bool::weighted(0.5), any::<bool>()).prop_map(
            |(cordoned, required, refused)| NodeObs::Present {
                ready: true,
                cordoned,
                maintenance_required: required || !cordoned,
                drain_refused: refused,
            },
        );
        prop_oneof![20 => plain, 3 => ask, 1 => Just(NodeObs::Deleting), 1 => Just(NodeObs::Absent)].boxed()
    } else {
        prop_oneof![20 => plain, 1 => Just(NodeObs::Deleting), 1 => Just(NodeObs::Absent)].boxed()
    }
}

fn step() -> impl Strategy<Value = Step> {
    step_with(false)
}

fn step_with(asks: bool) -> impl Strategy<Value = Step> {
    let nova = prop_oneof![
        1 => Just(NovaKind::Unknown),
        1 => Just(NovaKind::Unreachable),
        1 => Just(NovaKind::Rejected),
        2 => Just(NovaKind::NotRegistered),
        // A host the eviction emptied and decommissioning cleaned up.
        2 => Just(NovaKind::Registered { enabled: false, aggs: vec![false; 3], unknown: false, traits: Some(vec![false; 2]), instances: 0, hv: true }),
        12 => (any::<bool>(), prop::collection::vec(prop::bool::weighted(0.8), 3), prop::bool::weighted(0.05),
               prop::option::weighted(0.9, prop::collection::vec(prop::bool::weighted(0.8), 2)), 0u8..3, prop::bool::weighted(0.95))
            .prop_map(|(enabled, aggs, unknown, traits, instances, hv)| NovaKind::Registered { enabled, aggs, unknown, traits, instances, hv }),
    ];
    let ev = prop_oneof![
        4 => Just(EvKind::None),
        4 => ev_phase().prop_map(EvKind::Ours),
        1 => (reason(), ev_phase(), prop::bool::weighted(0.2)).prop_map(|(reason, phase, deleting)| EvKind::External { reason, phase, deleting }),
    ];
    let checks = checks_kind(0.8);
    let retry = retry_kind(6);
    let mode = prop_oneof![12 => Just(MaintenanceMode::None), 2 => Just(MaintenanceMode::Manual), 2 => Just(MaintenanceMode::Auto), 1 => Just(MaintenanceMode::Ha), 1 => Just(MaintenanceMode::Termination)];
    let node = node_obs(asks);
    (
        mode,
        prop::bool::weighted(0.1),
        node,
        prop::bool::weighted(0.9),
        nova,
        ev,
        checks,
        retry,
        0i64..400,
        ".{0,12}",
        prop::option::weighted(0.7, (any::<bool>(), 0i64..600)),
    )
        .prop_map(|(mode, skip, node, agent, nova, ev, checks, retry, advance, junk, health)| Step {
            mode,
            skip,
            node,
            agent,
            nova,
            ev,
            checks,
            retry,
            advance,
            junk,
            health,
            held_back: false,
        })
}

/// Steps of an Active host with a VM, no maintenance and no eviction, whose
/// agent comes and goes: the unseen hold's ground.
fn hold_step() -> impl Strategy<Value = Step> {
    let checks = checks_kind(0.7);
    let retry = retry_kind(4);
    // Nova's reason: someone's, or ours (a hold whose record was lost).
    let reason = prop_oneof![
        3 => Just("agent: no session".to_string()),
        1 => Just("hv-lifecycle: host unseen (Unreachable: agent: no session)".to_string()),
    ];
    (
        any::<bool>(),
        prop::option::weighted(0.8, (any::<bool>(), 0i64..600)),
        checks,
        retry,
        0i64..400,
        any::<bool>(),
        prop::bool::weighted(0.05),
        reason,
        prop::bool::weighted(0.15),
    )
        .prop_map(|(agent, health, checks, retry, advance, enabled, skip, junk, held_back)| Step {
            mode: MaintenanceMode::None,
            skip,
            node: NodeObs::Present {
                ready: true,
                cordoned: false,
                maintenance_required: false,
                drain_refused: false,
            },
            agent,
            nova: NovaKind::Registered {
                enabled,
                aggs: vec![true, true, false],
                unknown: false,
                traits: Some(vec![true, false]),
                instances: 1,
                hv: true,
            },
            ev: EvKind::None,
            checks,
            retry,
            advance,
            junk,
            health,
            held_back,
        })
}

const AGGS: [&str; 3] = ["az-a", "az-b", "foreign"];
const TRAITS: [&str; 2] = ["CUSTOM_A", "CUSTOM_B"];

/// Model state carried across a sequence, to check multi-step rules.
#[derive(Default)]
struct Model {
    /// Checks passed (or were skipped) since the node last (re)entered Onboarding.
    cleared: bool,
    /// The node was in Maintenance and has not been re-tested since.
    needs_retest: bool,
    /// We deleted the service while it was empty, and saw no instance since.
    deleted_empty: bool,
    seen_registered: bool,
    /// Unseen holds made and lifted by a recheck (the generator reaches both).
    holds: u32,
    lifts: u32,
}

struct Sim {
    spec: HypervisorSpec,
    status: HypervisorStatus,
    now: Timestamp,
    model: Model,
    transitions: BTreeSet<(Phase, Phase)>,
}

impl Sim {
    fn new() -> Self {
        let spec = HypervisorSpec {
            aggregates: vec!["az-a".into(), "az-b".into()],
            custom_traits: vec!["CUSTOM_A".into()],
            ..HypervisorSpec::default()
        };
        Sim {
            spec,
            status: HypervisorStatus::default(),
            now: t(0),
            model: Model::default(),
            transitions: BTreeSet::new(),
        }
    }

    /// A host in service, as onboarding leaves it.
    fn in_service() -> Self {
        let mut sim = Sim::new();
        sim.status.phase = Some(Phase::Active);
        sim.status.phase_since = Some(Time(sim.now));
        sim.status.service_id = Some("svc".into());
        sim.status.hypervisor_id = Some("hv".into());
        sim.status.lifecycle.test_run = 1;
        sim.status.lifecycle.applied_aggregates = vec!["az-a".into(), "az-b".into()];
        sim.status.lifecycle.applied_traits = vec!["CUSTOM_A".into()];
        sim.model.cleared = true;
        sim.model.seen_registered = true;
        sim
    }

    fn observe(&self, s: &Step) -> Observations {
        let nova = match &s.nova {
            NovaKind::Unknown => NovaObs::Unknown,
            NovaKind::Unreachable => NovaObs::Unreachable(s.junk.clone()),
            NovaKind::Rejected => NovaObs::Rejected(s.junk.clone()),
            NovaKind::NotRegistered => NovaObs::NotRegistered,
            NovaKind::Registered { enabled, aggs, unknown, traits, instances, hv } => {
                NovaObs::Registered(NovaHost {
                    service_id: "svc".into(),
                    hypervisor_id: hv.then(|| "hv".to_string()),
                    // Named whether or not the record is listed yet: the
                    // walk is the generator's, the machine gate the table's.
                    hypervisor_hostname: Some("node-1.example.com".to_string()),
                    enabled: *enabled,
                    disabled_reason: Some(s.junk.clone()),
                    service_state: crate::lifecycle::ServiceState::Up,
                    aggregates: AGGS
                        .iter()
                        .zip(aggs)
                        .filter(|(_, on)| **on)
                        .map(|(a, _)| a.to_string())
                        .collect(),
                    unknown_aggregates: if *unknown { set(&["az-b"]) } else { set(&[]) },
                    traits: traits.as_ref().map(|on| {
                        TRAITS.iter().zip(on).filter(|(_, on)| **on).map(|(t, _)| t.to_string()).collect()
                    }),
                    instances: (0..*instances).map(|i| format!("vm-{i}")).collect(),
                })
            }
        };
        let eviction = match &s.ev {
            EvKind::None => None,
            EvKind::Ours(phase) => self
                .status
                .lifecycle
                .eviction
                .as_ref()
                .map(|r| EvictionObs { phase: *phase, ..eviction(&r.name, r.reason, *phase) }),
            EvKind::External { reason, phase, deleting } => {
                Some(EvictionObs { deleting: *deleting, ..eviction("hand-made", *reason, *phase) })
            }
        };
        let run = self.status.lifecycle.test_run;
        let checks = match s.checks {
            ChecksKind::None => None,
            ChecksKind::Current { pass } => Some(report(run, if pass { &[] } else { &["ovs-bridge/br-ex"] })),
            ChecksKind::Stale => Some(report(run.wrapping_sub(1), &[])),
        };
        let retry = match s.retry {
            RetryKind::None => None,
            RetryKind::Same => self.status.lifecycle.handled_retry.clone().or(Some("r0".into())),
            RetryKind::Fresh => Some(format!("r{}", self.now.as_second())),
        };
        let health = s.health.map(|(second, ago)| {
            let state = match (s.agent, second) {
                (true, false) => HealthState::Healthy,
                (true, true) => HealthState::Degraded,
                (false, false) => HealthState::Unreachable,
                (false, true) => HealthState::Failed,
            };
            let since = self.now.checked_sub(jiff::SignedDuration::from_secs(ago)).ok();
            let hold_back = s.held_back.then(|| "3 of 4 judged hosts".to_string());
            HealthObs { state, since, summary: s.junk.clone(), hold_back, empties: true }
        });
        Observations {
            node: s.node,
            agent: AgentObs { connected: s.agent, domains: None, since: None },
            checks,
            nova,
            eviction,
            retry,
            close_hosts: Vec::new(),
            health,
            update_wait: None,
            claimed_by: None,
            machine_hostname: Some("node-1.example.com".into()),
            host_traits: None,
            dependencies: Some(Vec::new()),
            power: Default::default(),
        }
    }

    /// Apply the step's spec change as the API server would (CEL: termination
    /// cannot be undone; manual needs a reason).
    fn edit_spec(&mut self, s: &Step) {
        if self.spec.maintenance != MaintenanceMode::Termination {
            self.spec.maintenance = s.mode;
            self.spec.maintenance_reason =
                if s.mode == MaintenanceMode::Manual { "fw".into() } else { String::new() };
        }
        self.spec.skip_tests = s.skip;
    }

    fn step(&mut self, s: &Step) -> Result<(), String> {
        self.now = self.now.checked_add(jiff::SignedDuration::from_secs(s.advance)).unwrap_or(self.now);
        self.edit_spec(s);
        let o = self.observe(s);
        let policy = Policy::default();
        let input = Input {
            name: NAME,
            spec: &self.spec,
            status: &self.status,
            obs: &o,
            policy: &policy,
            now: self.now,
        };
        let d = decide(&input);
        check_one_step(&self.spec, &self.status, &o, &d, self.now)?;
        if decide(&input) != d {
            return Err("decide is not deterministic".into());
        }
        self.check_model(&o, &d)?;
        let from = self.status.phase.unwrap_or_default();
        self.transitions.insert((from, d.phase));
        self.status.phase = Some(d.phase);
        self.status.phase_since = d.phase_since;
        self.status.lifecycle = d.record;
        // The shell records the delete once Nova answered it.
        if d.actions.iter().any(|a| matches!(a, Action::DeleteService { .. })) {
            self.status.lifecycle.service_deleted = true;
        }
        self.status.service_id = d.service_id;
        self.status.hypervisor_id = d.hypervisor_id;
        Ok(())
    }

    fn check_model(&mut self, o: &Observations, d: &Decision) -> Result<(), String> {
        let from = self.status.phase.unwrap_or_default();
        let m = &mut self.model;
        if let NovaObs::Registered(h) = &o.nova {
            m.seen_registered = true;
            if !h.instances.is_empty() {
                m.deleted_empty = false;
            }
        }
        if d.actions.iter().any(|a| matches!(a, Action::DeleteService { .. })) {
            m.deleted_empty = true;
        }
        // Held unseen (by our record, or by Nova's reason when the record
        // was lost): not cleared until a recheck passes in Active.
        let nova_held = from == Phase::Active
            && matches!(&o.nova, NovaObs::Registered(h) if !h.enabled
                && h.disabled_reason.as_deref().is_some_and(|r| r.starts_with("hv-lifecycle: host unseen (")));
        let recorded = self.status.lifecycle.unseen.clone();
        if recorded.is_none() && (d.record.unseen.is_some() || nova_held) {
            m.cleared = false;
            m.holds += 1;
        }
        let held = recorded.or_else(|| {
            nova_held.then(|| UnseenHold {
                disabled_at: Time(self.now),
                cause: String::new(),
                recheck_run: None,
                recheck_failed: false,
            })
        });
        // Cleared by a passed recheck: the enable it asks for, or the hold
        // gone once Nova shows the host enabled.
        let enabling = d.actions.contains(&Action::EnableService);
        let lifted = d.record.unseen.is_none() && d.transition.is_none();
        if let Some(hold) = held.as_ref().filter(|_| from == Phase::Active && (lifted || enabling)) {
            let passed = hold.recheck_run.is_some_and(|run| {
                o.checks.as_ref().is_some_and(|r| r.run == run && r.results.iter().all(|c| c.passed))
            });
            if !passed && !self.spec.skip_tests {
                return Err(format!("unseen hold lifted in {from} without a passed recheck"));
            }
            m.cleared = true;
            m.lifts += u32::from(lifted);
        }
        if d.actions.contains(&Action::EnableService) && !m.cleared {
            return Err(format!("scheduling enabled in {from} before the checks passed"));
        }
        if let Some(tr) = &d.transition {
            match (tr.from, tr.to) {
                (Phase::Testing, Phase::Ready) => {
                    let run = self.status.lifecycle.test_run;
                    let passed = o.checks.as_ref().is_some_and(|r| {
                        r.run == run && !r.results.is_empty() && r.results.iter().all(|c| c.passed)
                    });
                    if !passed && !self.spec.skip_tests {
                        return Err("Ready without a passing report for the current run".into());
                    }
                    m.cleared = true;
                    m.needs_retest = false;
                }
                // An adopted host was in service, enabled by its owner,
                // before we came: its failed first run is reported, and
                // it stays in service as it was.
                (Phase::Testing, Phase::Active) => {
                    m.cleared = true;
                    m.needs_retest = false;
                }
                (Phase::Onboarding, Phase::Ready) => {
                    if !self.spec.skip_tests {
                        return Err("Onboarding -> Ready without skipTests".into());
                    }
                    m.cleared = true;
                    m.needs_retest = false;
                }
                (_, Phase::Onboarding) => m.cleared = false,
                (_, Phase::Testing) => m.needs_retest = false,
                (_, Phase::Maintenance) => m.needs_retest = true,
                (_, Phase::Active) if m.needs_retest => {
                    return Err("Active after Maintenance without passing through Testing".into());
                }
                (_, Phase::Decommissioned) if !m.deleted_empty && m.seen_registered => {
                    return Err("Decommissioned while instances may remain".into());
                }
                _ => {}
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(Config { cases: 512, ..Config::default() })]

    #[test]
    fn sequences_keep_the_invariants(steps in prop::collection::vec(step(), 1..80)) {
        let mut sim = Sim::new();
        for (i, s) in steps.iter().enumerate() {
            if let Err(e) = sim.step(s) {
                prop_assert!(false, "step {i}: {e}\nstep {s:?}\nstatus {:?}", sim.status);
            }
        }
    }

    /// The same with updates asking for the host now and then: an ask is
    /// a maintenance like the spec's, and nothing else changes.
    #[test]
    fn sequences_with_update_asks_keep_the_invariants(steps in prop::collection::vec(step_with(true), 1..80)) {
        let mut sim = Sim::new();
        for (i, s) in steps.iter().enumerate() {
            if let Err(e) = sim.step(s) {
                prop_assert!(false, "step {i}: {e}\nstep {s:?}\nstatus {:?}", sim.status);
            }
        }
    }

    /// A host in service whose agent comes and goes is held disabled only
    /// on a judged loss of sight, never emptied for it, and enabled again
    /// only on a pass of the run started after it was seen again.
    #[test]
    fn held_hosts_come_back_only_through_a_passed_recheck(steps in prop::collection::vec(hold_step(), 1..60)) {
        let mut sim = Sim::in_service();
        for (i, s) in steps.iter().enumerate() {
            if let Err(e) = sim.step(s) {
                prop_assert!(false, "step {i}: {e}\nstep {s:?}\nstatus {:?}", sim.status);
            }
            prop_assert_eq!(sim.status.phase, Some(Phase::Active), "step {}: the hold moves nothing", i);
        }
    }

    /// Arbitrary (even nonsensical) stored status and observations never panic.
    #[test]
    fn garbage_never_panics(
        phase in prop::sample::select(Phase::ALL.to_vec()),
        junk in ".{0,40}",
        seq in any::<u32>(),
        run in any::<u64>(),
        steps in prop::collection::vec(step(), 1..4),
    ) {
        let mut sim = Sim::new();
        sim.status.phase = Some(phase);
        sim.status.lifecycle.eviction_seq = seq;
        sim.status.lifecycle.test_run = run;
        sim.status.lifecycle.handled_retry = Some(junk.clone());
        sim.spec.aggregates.push(junk.clone());
        sim.spec.custom_traits.push(junk.clone());
        sim.spec.maintenance_reason = junk.repeat(20);
        sim.status.lifecycle.eviction = Some(eviction_ref(&junk, EvictionReason::Decommission, run % 2 == 0));
        for s in &steps {
            let o = sim.observe(s);
            let policy = Policy { registration_timeout: jiff::SignedDuration::MAX, checks_timeout: jiff::SignedDuration::MIN, unreachable_grace: jiff::SignedDuration::MIN, cordon_starts_maintenance: true, power: Default::default() };
            let d = decide(&Input { name: &junk, spec: &sim.spec, status: &sim.status, obs: &o, policy: &policy, now: Timestamp::MAX });
            for a in &d.actions {
                if let Action::DisableService { reason } = a {
                    prop_assert!(reason.len() <= 255, "Nova's disabled_reason holds 255 characters");
                }
            }
        }
    }
}

/// The hold's generator makes holds, rechecks, failed rechecks and lifts.
#[test]
fn hold_sequences_reach_every_stage_of_the_hold() {
    let mut runner = TestRunner::deterministic();
    let (mut holds, mut lifts, mut failed) = (0, 0, 0);
    for _ in 0..500 {
        let Ok(tree) = prop::collection::vec(hold_step(), 40).new_tree(&mut runner) else {
            continue;
        };
        let mut sim = Sim::in_service();
        for s in &tree.current() {
            if sim.step(s).is_err() {
                break;
            }
            failed += u32::from(sim.status.lifecycle.unseen.as_ref().is_some_and(|u| u.recheck_failed));
        }
        holds += sim.model.holds;
        lifts += sim.model.lifts;
    }
    assert!(
        holds > 300 && lifts > 100 && failed > 100,
        "holds {holds}, lifts {lifts}, failed steps {failed}"
    );
}

/// The sequence generator is strong enough to walk every allowed transition,
/// so the property above is not vacuous.
#[test]
fn random_sequences_reach_every_transition() {
    let mut runner = TestRunner::deterministic();
    let mut all = BTreeSet::new();
    let (mut holds, mut lifts) = (0, 0);
    for _ in 0..3000 {
        let Ok(tree) = prop::collection::vec(step(), 60).new_tree(&mut runner) else {
            continue;
        };
        let steps = tree.current();
        let mut sim = Sim::new();
        for s in &steps {
            if sim.step(s).is_err() {
                break;
            }
        }
        all.extend(sim.transitions);
        holds += sim.model.holds;
        lifts += sim.model.lifts;
    }
    assert!(holds > 20 && lifts > 0, "unseen holds made {holds}, lifted {lifts}");
    let missing: Vec<_> = ALLOWED_TRANSITIONS.iter().filter(|e| !all.contains(e)).collect();
    assert!(missing.is_empty(), "random sequences never took {missing:?}");
}
