//! The fleet in numbers, for alerts: Hypervisors per phase and per health
//! state, those that should have an agent and have none, health changes,
//! and the HA side: fencings by their condition's reason, the longest under
//! way, hosts in `ha` maintenance and its limit, disables held back by the
//! unseen gate. Counted from the caches at each scrape, and shown by the
//! leader only: a follower's caches may lag, and two replicas must not both
//! speak for it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use jiff::Timestamp;

use crate::api::hypervisor::HealthState;
use crate::api::{ConditionType, Hypervisor, Phase};
use crate::fence::record::REASONS as FENCED_REASONS;

/// The label of a `Fenced` reason the code does not write (an older
/// release's, say): the label set stays bounded.
const OTHER_REASON: &str = "Other";

/// The reason of `SchedulingEnabled` when the unseen gate holds a host's
/// disable back (lifecycle::decide).
const UNSEEN_HELD_BACK: &str = "UnseenHeldBack";

/// Every health state, in the order the metrics show them.
const HEALTH_STATES: [HealthState; 4] =
    [HealthState::Healthy, HealthState::Degraded, HealthState::Unreachable, HealthState::Failed];

/// Hypervisors per phase, those without the agent they need, and per health.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hosts {
    pub phases: std::collections::BTreeMap<Phase, u64>,
    pub without_agent: u64,
    /// Hypervisors per health state (those judged at least once).
    pub health: std::collections::BTreeMap<HealthState, u64>,
    /// Fenced hosts that showed life again, not fenced again yet.
    pub fenced_showing_life: u64,
    /// Hosts whose compute service someone else disabled (respected).
    pub disabled_elsewhere: u64,
    /// Hosts the coordinator keeps its hands off (paused, or observe mode).
    pub paused: u64,
    /// Adopted hosts whose first check run failed, left in service.
    pub adopted_checks_failed: u64,
    /// The least time an update tool still waits for a host not emptied
    /// yet, in seconds (docs/drain.md); None: no such drain.
    pub update_drain_left: Option<f64>,
    /// Hosts not emptied whose update tool no longer waits.
    pub update_drains_forced: u64,
    /// Hosts per reason of their `Fenced` condition (those with one).
    pub fencing: std::collections::BTreeMap<&'static str, u64>,
    /// The longest a fencing under way has run, in seconds; None: none.
    pub fencing_longest: Option<f64>,
    /// Hosts in `ha` maintenance set for their health.
    pub ha_maintenance: u64,
    /// Hosts whose disable for being unseen the fleet gate holds back.
    pub unseen_held_back: u64,
    /// The hosts not in service (decommissioned ones apart): name, phase
    /// and their `Ready` reason, for the dashboard's table.
    pub out_of_service: Vec<(String, Phase, &'static str)>,
}

/// One Hypervisor, as the fleet's figures count it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Host {
    pub phase: Phase,
    /// Where its power stands (`status.powerState`; docs/power.md).
    pub power: Option<crate::api::power::HostPower>,
    pub agent_connected: bool,
    pub health: Option<HealthState>,
    /// Its fencing record says it showed life again (docs/fencing.md).
    pub fenced_showing_life: bool,
    /// Its compute service is disabled by someone else (docs/lifecycle.md).
    pub disabled_elsewhere: bool,
    /// Its `Paused` condition is True (docs/operations.md, "Hands off").
    pub paused: bool,
    /// Its `Tested` condition says an adopted host's checks failed.
    pub adopted_checks_failed: bool,
    /// An update tool drains it, not emptied yet: the seconds left before
    /// the tool stops waiting (at most 0).
    pub update_drain_left: Option<f64>,
    /// Its `UpdateDrain` condition says the tool no longer waits.
    pub update_drain_forced: bool,
    /// Its fencing, its ha maintenance, the unseen gate ([`ha_figures`]).
    pub ha: HaFigures,
    /// Not in service: its name and its `Ready` reason (`api::ready`).
    pub out_of_service: Option<(String, &'static str)>,
}

/// What the HA side shows of one host.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HaFigures {
    /// Its `Fenced` condition's reason (one of `fence::record::REASONS`,
    /// else `Other`); None: no such condition.
    pub fenced: Option<&'static str>,
    /// Seconds since its fencing started, while one is under way and the
    /// host does not count fenced yet (nor is it being cleared or retired).
    pub fencing_for: Option<f64>,
    /// In `ha` maintenance set for its health: one of those
    /// `--ha-maintenance-limit` bounds.
    pub ha_maintenance: bool,
    /// Its `SchedulingEnabled` condition says the unseen gate holds its
    /// disable back.
    pub unseen_held_back: bool,
}

/// `h` as the HA side's figures count it, at `now`.
pub fn ha_figures(h: &Hypervisor, now: Timestamp) -> HaFigures {
    let status = h.status.as_ref();
    let reason_of = |t: ConditionType| {
        status.and_then(|s| s.conditions.iter().find(|c| c.type_ == t.as_str())).map(|c| c.reason.as_str())
    };
    let fenced = reason_of(ConditionType::Fenced)
        .map(|r| FENCED_REASONS.iter().find(|known| **known == r).copied().unwrap_or(OTHER_REASON));
    let winding_up = fenced.is_some_and(|r| matches!(r, "Clearing" | "ClearWaiting"));
    let fencing_for = status
        .and_then(|s| s.fencing.as_ref())
        .filter(|f| f.fenced.is_none() && f.retirement.is_none() && !winding_up)
        .and_then(|f| f.started.as_ref())
        .map(|started| now.duration_since(started.0).as_secs_f64().max(0.0));
    let phase = status.and_then(|s| s.phase);
    HaFigures {
        fenced,
        fencing_for,
        ha_maintenance: crate::health::respond::counts_against_limit(
            h.spec.maintenance,
            &h.spec.maintenance_reason,
            phase,
        ),
        unseen_held_back: reason_of(ConditionType::SchedulingEnabled) == Some(UNSEEN_HELD_BACK),
    }
}

/// Counts `hypervisors`.
pub fn hosts(hypervisors: impl IntoIterator<Item = Host>) -> Hosts {
    let mut f = Hosts::default();
    for h in hypervisors {
        if let Some((name, reason)) = h.out_of_service.clone().filter(|_| h.phase != Phase::Decommissioned) {
            f.out_of_service.push((name, h.phase, reason));
        }
        *f.phases.entry(h.phase).or_default() += 1;
        f.without_agent += u64::from(!h.agent_connected && crate::lifecycle::judged(h.phase, h.power));
        if let Some(state) = h.health {
            *f.health.entry(state).or_default() += 1;
        }
        f.fenced_showing_life += u64::from(h.fenced_showing_life);
        f.disabled_elsewhere += u64::from(h.disabled_elsewhere);
        f.paused += u64::from(h.paused);
        f.adopted_checks_failed += u64::from(h.adopted_checks_failed);
        if let Some(left) = h.update_drain_left {
            f.update_drain_left = Some(f.update_drain_left.map_or(left, |l: f64| l.min(left)));
        }
        f.update_drains_forced += u64::from(h.update_drain_forced);
        if let Some(reason) = h.ha.fenced {
            *f.fencing.entry(reason).or_default() += 1;
        }
        if let Some(took) = h.ha.fencing_for {
            f.fencing_longest = Some(f.fencing_longest.map_or(took, |l: f64| l.max(took)));
        }
        f.ha_maintenance += u64::from(h.ha.ha_maintenance);
        f.unseen_held_back += u64::from(h.ha.unseen_held_back);
    }
    f
}

/// One host not in service: its name, phase and `Ready` reason. As many
/// series as hosts out of service (decommissioned ones apart), each gone
/// as soon as its host is back.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutLabel {
    node: String,
    phase: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabel {
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToLabel {
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

fn state_name(s: HealthState) -> &'static str {
    match s {
        HealthState::Healthy => "Healthy",
        HealthState::Degraded => "Degraded",
        HealthState::Unreachable => "Unreachable",
        HealthState::Failed => "Failed",
    }
}

/// The fleet's families.
pub struct HostGauges {
    phases: Family<PhaseLabel, Gauge>,
    without_agent: Gauge,
    health: Family<StateLabel, Gauge>,
    transitions: Family<ToLabel, Counter>,
    fenced_showing_life: Gauge,
    showed_life: Counter,
    disabled_elsewhere: Gauge,
    paused: Gauge,
    adopted_checks_failed: Gauge,
    update_drain_left: Gauge<f64, std::sync::atomic::AtomicU64>,
    update_drains_forced: Gauge,
    would: Family<ActionLabel, Counter>,
    fencing: Family<ReasonLabel, Gauge>,
    out_of_service: Family<OutLabel, Gauge>,
    fencing_longest: Gauge<f64, std::sync::atomic::AtomicU64>,
    ha_maintenance: Gauge,
    ha_limit: Gauge,
    unseen_held_back: Gauge,
}

impl HostGauges {
    pub(super) fn register(registry: &mut Registry) -> HostGauges {
        let g = HostGauges {
            phases: Family::default(),
            without_agent: Gauge::default(),
            health: Family::default(),
            transitions: Family::default(),
            fenced_showing_life: Gauge::default(),
            showed_life: Counter::default(),
            disabled_elsewhere: Gauge::default(),
            paused: Gauge::default(),
            adopted_checks_failed: Gauge::default(),
            update_drain_left: Gauge::default(),
            update_drains_forced: Gauge::default(),
            would: Family::default(),
            fencing: Family::default(),
            out_of_service: Family::default(),
            fencing_longest: Gauge::default(),
            ha_maintenance: Gauge::default(),
            ha_limit: Gauge::default(),
            unseen_held_back: Gauge::default(),
        };
        registry.register(
            "hv_hypervisors",
            "Hypervisors per phase (shown by the leader only).",
            g.phases.clone(),
        );
        registry.register(
            "hv_hypervisors_without_agent",
            "Hypervisors in Testing, Ready, Active or Evicting whose agent is not connected.",
            g.without_agent.clone(),
        );
        registry.register(
            "hv_hypervisors_by_health",
            "Hypervisors per health state (docs/health.md).",
            g.health.clone(),
        );
        registry.register(
            "hv_health_transitions",
            "Changes of a host's health, by the state entered.",
            g.transitions.clone(),
        );
        registry.register(
            "hv_fenced_hosts_showing_life",
            "Fenced hosts that showed life again while their servers were evacuated, not fenced again yet \
             (docs/fencing.md).",
            g.fenced_showing_life.clone(),
        );
        registry.register(
            "hv_fenced_host_revivals",
            "Fenced hosts found showing life while their servers were evacuated (docs/fencing.md).",
            g.showed_life.clone(),
        );
        registry.register(
            "hv_hypervisors_disabled_elsewhere",
            "Hypervisors whose compute service someone else disabled (nova-compute, an SRE, another tool): \
             respected, never re-enabled by the coordinator (docs/lifecycle.md).",
            g.disabled_elsewhere.clone(),
        );
        registry.register(
            "hv_hypervisors_paused",
            "Hypervisors the coordinator keeps its hands off: paused by an SRE, or the install observes only \
             (docs/operations.md).",
            g.paused.clone(),
        );
        registry.register(
            "hv_hypervisors_adopted_checks_failed",
            "Hosts adopted in service whose first check run failed: reported, left in service until an SRE \
             decides (docs/lifecycle.md).",
            g.adopted_checks_failed.clone(),
        );
        registry.register(
            "hv_update_drain_seconds_left",
            "The least time an update tool that stops waiting (Gardener MCM's drain timeout) still waits for a \
             host not emptied yet; +Inf when none drains (docs/drain.md).",
            g.update_drain_left.clone(),
        );
        registry.register(
            "hv_update_drains_forced",
            "Hosts not emptied whose update tool no longer waits and deletes their pods whatever the budgets say \
             (docs/drain.md).",
            g.update_drains_forced.clone(),
        );
        registry.register(
            "hv_would",
            "What the coordinator would have done on a host it keeps its hands off, by kind (WouldDisable, \
             WouldFence, …): told once each time it is decided anew.",
            g.would.clone(),
        );
        for s in HEALTH_STATES {
            let _ = g.transitions.get_or_create(&ToLabel { to: state_name(s) });
        }
        g.register_ha(registry);
        g
    }

    fn register_ha(&self, registry: &mut Registry) {
        registry.register(
            "hv_hypervisors_fencing",
            "Hypervisors per reason of their Fenced condition: a gate holding the fencing back, a step under \
             way or not confirmed, fenced, the way back (docs/fencing.md).",
            self.fencing.clone(),
        );
        registry.register(
            "hv_fencing_longest_under_way_seconds",
            "How long the longest fencing under way has run since it started, the host not counted fenced yet; \
             0 when none is.",
            self.fencing_longest.clone(),
        );
        registry.register(
            "hv_hypervisors_ha_maintenance",
            "Hypervisors in ha maintenance set for their health: those --ha-maintenance-limit bounds.",
            self.ha_maintenance.clone(),
        );
        registry.register(
            "hv_ha_maintenance_limit",
            "How many hosts may be in ha maintenance for their health at once (--ha-maintenance-limit).",
            self.ha_limit.clone(),
        );
        registry.register(
            "hv_hypervisor_out_of_service",
            "1 for each hypervisor not in service (decommissioned ones apart), by name, phase and Ready reason: \
             the dashboard's table of hosts not Active.",
            self.out_of_service.clone(),
        );
        registry.register(
            "hv_hypervisors_unseen_held_back",
            "Unseen hypervisors not disabled in Nova because too many are unseen at once (--unseen-max-share; \
             SchedulingEnabled=UnseenHeldBack).",
            self.unseen_held_back.clone(),
        );
    }

    /// `--ha-maintenance-limit`, shown by every replica.
    pub(super) fn set_ha_limit(&self, limit: usize) {
        self.ha_limit.set(i64::try_from(limit).unwrap_or(i64::MAX));
    }

    /// Shows `fleet`, every phase and state with zeros too; `None` (a
    /// follower) shows no sample.
    pub(super) fn show(&self, fleet: Option<Hosts>) {
        self.phases.clear();
        self.health.clear();
        self.fencing.clear();
        self.out_of_service.clear();
        let Some(f) = fleet else {
            self.fencing_longest.set(0.0);
            self.ha_maintenance.set(0);
            self.unseen_held_back.set(0);
            self.without_agent.set(0);
            self.fenced_showing_life.set(0);
            self.disabled_elsewhere.set(0);
            self.paused.set(0);
            self.adopted_checks_failed.set(0);
            self.update_drain_left.set(f64::INFINITY);
            self.update_drains_forced.set(0);
            return;
        };
        let n = |v: Option<&u64>| i64::try_from(v.copied().unwrap_or(0)).unwrap_or(i64::MAX);
        for p in Phase::ALL {
            self.phases.get_or_create(&PhaseLabel { phase: p.as_str() }).set(n(f.phases.get(&p)));
        }
        for s in HEALTH_STATES {
            self.health.get_or_create(&StateLabel { state: state_name(s) }).set(n(f.health.get(&s)));
        }
        self.without_agent.set(n(Some(&f.without_agent)));
        self.fenced_showing_life.set(n(Some(&f.fenced_showing_life)));
        self.disabled_elsewhere.set(n(Some(&f.disabled_elsewhere)));
        self.paused.set(n(Some(&f.paused)));
        self.adopted_checks_failed.set(n(Some(&f.adopted_checks_failed)));
        self.update_drain_left.set(f.update_drain_left.unwrap_or(f64::INFINITY));
        self.update_drains_forced.set(n(Some(&f.update_drains_forced)));
        for r in FENCED_REASONS.into_iter().chain([OTHER_REASON]) {
            self.fencing.get_or_create(&ReasonLabel { reason: r }).set(n(f.fencing.get(r)));
        }
        self.fencing_longest.set(f.fencing_longest.unwrap_or(0.0));
        self.ha_maintenance.set(n(Some(&f.ha_maintenance)));
        self.unseen_held_back.set(n(Some(&f.unseen_held_back)));
        for (node, phase, reason) in f.out_of_service {
            self.out_of_service.get_or_create(&OutLabel { node, phase: phase.as_str(), reason }).set(1);
        }
    }

    pub(super) fn would(&self, reason: &'static str) {
        self.would.get_or_create(&ActionLabel { action: reason }).inc();
    }

    pub(super) fn showed_life(&self) {
        self.showed_life.inc();
    }

    pub(super) fn health_changed(&self, to: HealthState) {
        self.transitions.get_or_create(&ToLabel { to: state_name(to) }).inc();
    }
}
