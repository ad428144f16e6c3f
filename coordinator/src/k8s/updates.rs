//! The fleet's limit on hosts held for updates (`--update-max-held`,
//! docs/drain.md). An update tool that cordons or annotates a whole pool at
//! once must not have every host disabled and emptied in the same minute:
//! the hosts left in service must take their VMs. A host in service whose
//! Node asks waits while the limit's worth of hosts are held for updates;
//! a host already held keeps its place.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::hypervisor::HypervisorSpec;
use crate::api::{Hypervisor, MaintenanceMode, Phase};
use crate::lifecycle::NodeObs;

/// How long a host given a place counts though the cache does not show
/// its recorded place yet (two reconciles must not both take the last
/// place in that moment): renewed at each of its reconciles while it asks.
/// The record, not this, is what a new leader counts.
const CLAIM_TTL: Duration = Duration::from_secs(600);

/// The limit, the caches it counts in, and the hosts given a place
/// moments ago.
pub struct UpdateLimit {
    /// 0: no limit.
    pub max_held: usize,
    pub cordon_starts_maintenance: bool,
    /// How the site's update tools ask (`--update-signal`).
    pub signals: crate::drain::signals::UpdateSignals,
    hypervisors: Store<Hypervisor>,
    nodes: Store<Node>,
    claims: super::claims::Claims,
}

impl UpdateLimit {
    pub fn new(
        max_held: usize,
        cordon_starts_maintenance: bool,
        signals: crate::drain::signals::UpdateSignals,
        hypervisors: Store<Hypervisor>,
        nodes: Store<Node>,
    ) -> Self {
        UpdateLimit {
            max_held,
            cordon_starts_maintenance,
            signals,
            hypervisors,
            nodes,
            claims: super::claims::Claims::new(CLAIM_TTL),
        }
    }

    /// Whether the Node asks for its host (the lifecycle's rule, without
    /// the SRE's spec).
    pub fn asks(&self, node: NodeObs) -> bool {
        match node {
            NodeObs::Present { maintenance_required, cordoned, drain_refused, .. } => {
                maintenance_required || (cordoned && (drain_refused || self.cordon_starts_maintenance))
            }
            _ => false,
        }
    }

    /// Why the host `name` (in `phase`, under `spec`, its Node `node`)
    /// must wait for a place, or None; with `claim`, a place given is
    /// held for it until the cache shows it held.
    pub fn wait(
        &self,
        name: &str,
        phase: Phase,
        spec: &HypervisorSpec,
        node: NodeObs,
        claim: bool,
    ) -> Option<String> {
        self.claims.with(|claimed| {
            // A claim goes with its ask.
            claimed.drop_where(|n| n == name && !self.asks(node));
            let in_service = matches!(phase, Phase::Active | Phase::Ready);
            if self.max_held == 0
                || spec.maintenance != MaintenanceMode::None
                || !self.asks(node)
                || !in_service
            {
                return None;
            }
            let mut held = self.held();
            held.extend(claimed.names().map(str::to_string));
            held.remove(name);
            if held.len() >= self.max_held {
                let some: Vec<&str> = held.iter().take(5).map(String::as_str).collect();
                return Some(format!(
                    "{} hosts are held for updates (--update-max-held {}): {}{}",
                    held.len(),
                    self.max_held,
                    some.join(", "),
                    if held.len() > some.len() { ", ..." } else { "" }
                ));
            }
            if claim {
                claimed.claim(name);
            }
            None
        })
    }

    /// The hosts held for an update now: their Node asks, the SRE's spec
    /// does not, and they hold a recorded place (`status.lifecycle.updatePlace`,
    /// which a new leader reads as the old one wrote it) or are out of
    /// service for it (a host held before places were recorded).
    fn held(&self) -> BTreeSet<String> {
        let asking: BTreeSet<String> = self
            .nodes
            .state()
            .iter()
            .filter(|n| self.asks(super::hypervisor::node_obs(n, &self.signals)))
            .map(|n| n.name_any())
            .collect();
        self.hypervisors
            .state()
            .iter()
            .filter(|h| asking.contains(&h.name_any()) && h.spec.maintenance == MaintenanceMode::None)
            .filter(|h| {
                let status = h.status.as_ref();
                let phase = status.and_then(|s| s.phase).unwrap_or_default();
                let placed = status.is_some_and(|s| s.lifecycle.update_place.is_some());
                placed || matches!(phase, Phase::Evicting | Phase::Maintenance)
            })
            .map(|h| h.name_any())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn node(name: &str, required: bool) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        if required {
            n.metadata.annotations = Some(
                [(crate::api::keys::MAINTENANCE_REQUIRED_ANNOTATION.to_string(), "os".to_string())].into(),
            );
        }
        n
    }

    fn hv(name: &str, phase: Phase) -> Hypervisor {
        let mut h = Hypervisor::new(name, HypervisorSpec::default());
        h.status =
            Some(crate::api::hypervisor::HypervisorStatus { phase: Some(phase), ..Default::default() });
        h
    }

    fn stores(hosts: &[(&str, Phase, bool)]) -> (Store<Hypervisor>, Store<Node>) {
        let (hr, mut hw) = reflector::store();
        let (nr, mut nw) = reflector::store();
        hw.apply_watcher_event(&Event::Init);
        nw.apply_watcher_event(&Event::Init);
        for (name, phase, asks) in hosts {
            hw.apply_watcher_event(&Event::InitApply(hv(name, *phase)));
            nw.apply_watcher_event(&Event::InitApply(node(name, *asks)));
        }
        hw.apply_watcher_event(&Event::InitDone);
        nw.apply_watcher_event(&Event::InitDone);
        (hr, nr)
    }

    #[test]
    fn a_new_leader_counts_the_places_recorded_by_the_old_one() {
        use Phase::*;
        // "c" was given a place and recorded it, but is still Active (its
        // disable not sent yet when the old leader went).
        let mut placed = hv("c", Active);
        placed.status.as_mut().unwrap().lifecycle.update_place =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH));
        let (hr, mut hw) = reflector::store();
        let (nr, mut nw) = reflector::store();
        hw.apply_watcher_event(&Event::Init);
        nw.apply_watcher_event(&Event::Init);
        for h in [hv("a", Maintenance), placed, hv("e", Active)] {
            nw.apply_watcher_event(&Event::InitApply(node(&h.name_any(), true)));
            hw.apply_watcher_event(&Event::InitApply(h));
        }
        hw.apply_watcher_event(&Event::InitDone);
        nw.apply_watcher_event(&Event::InitDone);
        // The new leader: no claim in memory.
        let limit = UpdateLimit::new(2, false, Default::default(), hr, nr);
        let spec = HypervisorSpec::default();
        let why = limit.wait("e", Active, &spec, ASKS, true).expect("e waits: a and c hold the places");
        assert!(why.contains("a, c"), "{why}");
        assert_eq!(limit.wait("c", Active, &spec, ASKS, true), None, "c keeps its recorded place");
    }

    const ASKS: NodeObs =
        NodeObs::Present { ready: true, cordoned: false, maintenance_required: true, drain_refused: false };

    #[test]
    fn a_host_in_service_waits_while_the_limit_is_held_and_a_held_one_keeps_its_place() {
        use Phase::*;
        let (hvs, nodes) = stores(&[
            ("a", Maintenance, true),
            ("b", Evicting, true),
            ("c", Active, true),
            ("d", Maintenance, false),
        ]);
        let limit = UpdateLimit::new(2, false, Default::default(), hvs.clone(), nodes.clone());
        let spec = HypervisorSpec::default();
        let why = limit.wait("c", Active, &spec, ASKS, true).expect("waits");
        assert!(why.starts_with("2 hosts are held for updates (--update-max-held 2): a, b"), "{why}");
        assert_eq!(limit.wait("a", Maintenance, &spec, ASKS, true), None, "held: keeps its place");
        assert_eq!(limit.wait("b", Evicting, &spec, ASKS, true), None);
        // A Node that does not ask, or an SRE's own maintenance: not ours to hold back.
        let plain = NodeObs::Present {
            ready: true,
            cordoned: true,
            maintenance_required: false,
            drain_refused: false,
        };
        assert_eq!(limit.wait("c", Active, &spec, plain, true), None);
        let manual = HypervisorSpec { maintenance: MaintenanceMode::Manual, ..Default::default() };
        assert_eq!(limit.wait("c", Active, &manual, ASKS, true), None);
        // With room, the first to ask gets the place, the next waits for it.
        let roomy = UpdateLimit::new(3, false, Default::default(), hvs.clone(), nodes.clone());
        assert_eq!(roomy.wait("c", Active, &spec, ASKS, true), None);
        assert!(roomy.wait("e", Active, &spec, ASKS, true).is_some(), "c's claim counts");
        assert_eq!(roomy.wait("c", Active, &spec, ASKS, true), None, "c keeps its claim");
        // Its ask withdrawn, the claim goes.
        roomy.wait("c", Active, &spec, plain, true);
        assert_eq!(roomy.wait("e", Active, &spec, ASKS, true), None);
        // A peek claims nothing; no limit holds nothing back.
        let peek = UpdateLimit::new(3, false, Default::default(), hvs.clone(), nodes.clone());
        assert_eq!(peek.wait("c", Active, &spec, ASKS, false), None);
        assert_eq!(peek.wait("e", Active, &spec, ASKS, false), None);
        assert_eq!(
            UpdateLimit::new(0, false, Default::default(), hvs.clone(), nodes.clone())
                .wait("c", Active, &spec, ASKS, true),
            None
        );
        // A cordon counts only where the site says so.
        let cordoned = NodeObs::Present {
            ready: true,
            cordoned: true,
            maintenance_required: false,
            drain_refused: false,
        };
        assert!(
            !UpdateLimit::new(1, false, Default::default(), hvs.clone(), nodes.clone()).asks(cordoned)
                && UpdateLimit::new(1, true, Default::default(), hvs, nodes).asks(cordoned)
        );
    }
}
