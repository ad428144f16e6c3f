//! The fleet as a fencing sees it, from the caches (docs/fencing.md, The
//! controller): the other agents, the host's zone, the fleet's losses and
//! the failure domains with a host to fence. A host fenced and not yet
//! cleared or retired has left service, but counts all the same: lost for
//! the shares, not connected for the quorum, so a partition that cuts the
//! coordinator from one rack after another never fences past half the
//! fleet.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::hypervisor::Context;
use crate::api::Hypervisor;
use crate::api::condition::ConditionType;
use crate::api::hypervisor::HealthState;
use crate::api::keys::ZONE_LABEL;
use crate::fence::decide;

/// Who counts, read once per look.
pub(super) struct FleetSeen {
    /// Managed hosts whose agent belongs there (Testing to Evicting).
    serving: BTreeSet<String>,
    /// Hosts fenced, not cleared nor retired, out of service.
    fenced_out: BTreeSet<String>,
}

impl FleetSeen {
    pub(super) fn read(ctx: &Context) -> FleetSeen {
        let managed: BTreeSet<String> = ctx.nodes.state().iter().map(|n| n.name_any()).collect();
        let (mut serving, mut fenced_out) = (BTreeSet::new(), BTreeSet::new());
        for h in ctx.hypervisors.state().iter().filter(|h| managed.contains(&h.name_any())) {
            let status = h.status.as_ref();
            let phase = status.and_then(|s| s.phase).unwrap_or_default();
            if crate::lifecycle::judged(phase, status.and_then(|s| s.power_state)) {
                serving.insert(h.name_any());
            } else if fenced_and_kept(h) {
                fenced_out.insert(h.name_any());
            }
        }
        FleetSeen { serving, fenced_out }
    }

    /// Every host that counts: in service, or fenced out.
    fn counted(&self) -> impl Iterator<Item = &String> {
        self.serving.iter().chain(&self.fenced_out)
    }
}

/// Fenced, and neither cleared (the record would be gone) nor retired.
fn fenced_and_kept(h: &Hypervisor) -> bool {
    let fencing = h.status.as_ref().and_then(|s| s.fencing.as_ref());
    fencing.is_some_and(|f| f.fenced.is_some() && !f.retired())
}

/// The other hosts' agents: (connected, all). Hosts onboarding, in
/// maintenance or decommissioned say nothing of our view; fenced ones
/// count as not connected.
pub(super) fn other_agents(ctx: &Context, fleet: &FleetSeen, name: &str) -> (usize, usize) {
    let others: Vec<&String> = fleet.counted().filter(|n| *n != name).collect();
    (others.iter().filter(|n| ctx.registry.connected(n)).count(), others.len())
}

fn lost(s: Option<HealthState>) -> bool {
    matches!(s, Some(HealthState::Unreachable | HealthState::Failed))
}

/// The host's zone: the hosts that count sharing its zone label (all of
/// them when it has none). Answers its hosts lost (Unreachable or Failed,
/// this one by `health`; fenced out), all its hosts, and its name.
pub(super) fn zone_of(
    ctx: &Context,
    fleet: &FleetSeen,
    name: &str,
    health: Option<HealthState>,
) -> (usize, usize, String) {
    let nodes = ctx.nodes.state();
    let zone_label = |n: &Node| n.labels().get(ZONE_LABEL).cloned();
    let zone = nodes.iter().find(|n| n.name_any() == name).and_then(|n| zone_label(n));
    let counted: BTreeSet<&String> = fleet.counted().collect();
    let members: Vec<String> = nodes
        .iter()
        .filter(|n| zone.is_none() || zone_label(n) == zone)
        .map(|n| n.name_any())
        .filter(|n| n == name || counted.contains(n))
        .collect();
    let hypervisors = ctx.hypervisors.state();
    let recorded = |m: &str| {
        let h = hypervisors.iter().find(|h| h.name_any() == m);
        h.and_then(|h| h.status.as_ref().and_then(|s| s.health.as_ref()).map(|x| x.state))
    };
    let lost_now =
        members.iter().filter(|m| *m != name && (fleet.fenced_out.contains(*m) || lost(recorded(m)))).count()
            + usize::from(lost(health));
    let label = zone.map_or_else(|| "the managed hosts".to_string(), |z| format!("zone {z}"));
    (lost_now, members.len().max(1), label)
}

/// The failure domains as one fencing sees them ([`failure_domains`]).
pub(super) struct Domains {
    /// The host's own.
    pub own: String,
    /// Each with a fencing that can go on ([`decide::domain_place`]), and
    /// whether one is under way there.
    pub fencing: Vec<(String, bool)>,
    /// The fleet's hosts lost (Unreachable or Failed, fenced out), and all.
    pub fleet: (usize, usize),
}

impl Domains {
    pub(super) fn fencing(&self) -> Vec<(&str, bool)> {
        self.fencing.iter().map(|(d, b)| (d.as_str(), *b)).collect()
    }
}

/// The host's failure domain, the domains with a fencing that can go on,
/// and the fleet's losses. `own`: this host's verdict and whether its
/// fencing is under way (the cache may not show it yet); `claimed`: the
/// fencings this process started moments ago.
pub(super) fn failure_domains(
    ctx: &Context,
    fleet: &FleetSeen,
    name: &str,
    own: (Option<HealthState>, bool),
    claimed: &[String],
) -> Domains {
    let nodes = ctx.nodes.state();
    let labels: BTreeMap<String, &BTreeMap<String, String>> =
        nodes.iter().map(|n| (n.name_any(), n.labels())).collect();
    let domain = |host: &str| {
        let get = |key: &str| labels.get(host).and_then(|l| l.get(key)).map(String::as_str);
        decide::failure_domain(host, get(ZONE_LABEL), ctx.fencing.domain_label.as_deref().and_then(get))
    };
    let (mut fencing, mut counts) = (BTreeMap::<String, bool>::new(), (0, 0));
    for h in ctx.hypervisors.state().iter() {
        let host = h.name_any();
        let fenced_out = fleet.fenced_out.contains(&host);
        let in_service = host == name || fleet.serving.contains(&host);
        let status = h.status.as_ref();
        let health = match host == name {
            true => own.0,
            false => status.and_then(|s| s.health.as_ref()).map(|x| x.state),
        };
        if in_service || fenced_out {
            counts.1 += 1;
            counts.0 += usize::from(fenced_out || lost(health));
        }
        let place = match host == name {
            true => own.1.then_some(true).or((health == Some(HealthState::Failed)).then_some(false)),
            false => place_of(h, in_service && health == Some(HealthState::Failed), claimed.contains(&host)),
        };
        if let Some(under_way) = place {
            *fencing.entry(domain(&host)).or_default() |= under_way;
        }
    }
    Domains { own: domain(name), fencing: fencing.into_iter().collect(), fleet: counts }
}

/// Another host's place among the domains being fenced, from its status
/// ([`decide::domain_place`]); one this process claimed moments ago is
/// under way.
fn place_of(h: &Hypervisor, failed_in_service: bool, claimed: bool) -> Option<bool> {
    let status = h.status.as_ref();
    let fencing = status.and_then(|s| s.fencing.as_ref()).map(|f| f.fenced.is_some());
    let fenced = ConditionType::Fenced.as_str();
    let reason =
        status.and_then(|s| s.conditions.iter().find(|c| c.type_ == fenced)).map(|c| c.reason.as_str());
    match (fencing, claimed) {
        (None, true) => Some(true),
        _ => decide::domain_place(failed_in_service, fencing, reason),
    }
}
