//! The fleet in numbers, for alerts: Hypervisors per phase and per health
//! state, those that should have an agent and have none, and health changes.
//! Counted from the caches at each scrape, and shown by the leader only: a
//! follower's caches may lag, and two replicas must not both speak for it.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::Phase;
use crate::api::hypervisor::HealthState;

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
}

/// One Hypervisor, as the fleet's figures count it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Host {
    pub phase: Phase,
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
}

/// Counts `hypervisors`.
pub fn hosts(hypervisors: impl IntoIterator<Item = Host>) -> Hosts {
    let mut f = Hosts::default();
    for h in hypervisors {
        *f.phases.entry(h.phase).or_default() += 1;
        f.without_agent += u64::from(!h.agent_connected && crate::lifecycle::expects_agent(h.phase));
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
    }
    f
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
        g
    }

    /// Shows `fleet`, every phase and state with zeros too; `None` (a
    /// follower) shows no sample.
    pub(super) fn show(&self, fleet: Option<Hosts>) {
        self.phases.clear();
        self.health.clear();
        let Some(f) = fleet else {
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
