//! Whether the coordinator may act on a host, or only watch it
//! (docs/operations.md, "Hands off"). A region is shared: an SRE pauses one
//! host (`hypervisor.cloud.sap/paused`, `hvctl pause`) while they work on
//! it by hand, and a whole install can run in observe mode (`--mode
//! observe`) while it is rolled out onto a region already in service. Either
//! way the host is still observed, judged and reported; what would be done
//! is shown (a `Would…` Event and metric), and nothing is written outside
//! our own custom resources.

use crate::api::condition::{ConditionStatus, ConditionType, DesiredCondition};

use super::Action;

/// Who may act on one host now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hands {
    /// The coordinator acts.
    Free,
    /// An SRE paused the host, for the reason given.
    Paused(String),
    /// The install observes only (`--mode observe`).
    Observing,
}

/// The condition's reasons.
pub const ACTING: &str = "Acting";
pub const PAUSED: &str = "PausedBySre";
pub const OBSERVING: &str = "ObserveMode";

impl Hands {
    /// An SRE's pause outweighs the install's mode in what is shown: it
    /// names who holds the host, and why.
    pub fn of(observing: bool, paused: Option<&str>) -> Hands {
        match paused {
            Some(reason) => Hands::Paused(reason.trim().to_string()),
            None if observing => Hands::Observing,
            None => Hands::Free,
        }
    }

    pub fn free(&self) -> bool {
        *self == Hands::Free
    }

    /// The condition's status, reason and the words for who holds the host.
    fn held(&self) -> (ConditionStatus, &'static str, String) {
        match self {
            Hands::Free => (ConditionStatus::False, ACTING, "the coordinator acts on this host".to_string()),
            Hands::Paused(r) if r.is_empty() => {
                (ConditionStatus::True, PAUSED, "paused by an SRE (no reason given)".to_string())
            }
            Hands::Paused(r) => (ConditionStatus::True, PAUSED, format!("paused by an SRE: {r}")),
            Hands::Observing => {
                (ConditionStatus::True, OBSERVING, "this install observes only (--mode observe)".to_string())
            }
        }
    }

    /// The `Paused` condition: what holds the host, and what would be done
    /// were it free (`would`, one line each, as [`item`] words them).
    pub fn condition(&self, would: &[String]) -> DesiredCondition {
        let (status, reason, why) = self.held();
        let message = match would {
            [] if !self.free() => format!("{why}; nothing would be done now"),
            [] => why,
            _ => format!("{why}; would {}", would.join("; ")),
        };
        DesiredCondition::new(ConditionType::Paused, status, reason, message)
    }

    /// An Eviction's `HostPaused` condition, and the kind of what it would
    /// do: move the `servers` Nova lists on `source` (evacuate them, when
    /// `evacuates`), asking nothing of Nova while the hands are off.
    pub fn eviction(&self, source: &str, servers: usize, evacuates: bool) -> (Would, DesiredCondition) {
        let (status, reason, why) = self.held();
        let (kind, verb) =
            if evacuates { (Would::Evacuate, "evacuate") } else { (Would::Migrate, "migrate") };
        let message = if self.free() {
            format!("{source}: {why}")
        } else {
            format!(
                "{source}: {why}; would {verb} the {servers} server(s) Nova lists on it; nothing is asked of Nova"
            )
        };
        (kind, DesiredCondition::new(ConditionType::HostPaused, status, reason, message))
    }
}

/// What would be written, by kind: an Event's reason and a metric's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Would {
    Disable,
    Enable,
    ChangeAggregates,
    ChangeTraits,
    RunChecks,
    Evict,
    CancelEviction,
    DeleteService,
    Fence,
    ClearFence,
    RetireFence,
    Maintain,
    Evacuate,
    Migrate,
    ChangePower,
}

impl Would {
    pub fn reason(self) -> &'static str {
        match self {
            Would::Disable => "WouldDisable",
            Would::Enable => "WouldEnable",
            Would::ChangeAggregates => "WouldChangeAggregates",
            Would::ChangeTraits => "WouldChangeTraits",
            Would::RunChecks => "WouldRunChecks",
            Would::Evict => "WouldEvict",
            Would::CancelEviction => "WouldCancelEviction",
            Would::DeleteService => "WouldDeleteService",
            Would::Fence => "WouldFence",
            Would::ClearFence => "WouldClearFence",
            Would::RetireFence => "WouldRetireFence",
            Would::Maintain => "WouldMaintain",
            Would::Evacuate => "WouldEvacuate",
            Would::Migrate => "WouldMigrate",
            Would::ChangePower => "WouldChangePower",
        }
    }

    /// The kind of a lifecycle action. Running the checks starts a test
    /// domain on the host: it is a write too.
    pub fn of(action: &Action) -> Would {
        match action {
            Action::DisableService { .. } => Would::Disable,
            Action::EnableService => Would::Enable,
            Action::AddAggregate { .. } | Action::RemoveAggregate { .. } => Would::ChangeAggregates,
            Action::AddTraits { .. } | Action::RemoveTraits { .. } => Would::ChangeTraits,
            Action::RunChecks { .. } => Would::RunChecks,
            Action::CreateEviction { reason, .. } if *reason == crate::api::EvictionReason::NodeFailure => {
                Would::Evacuate
            }
            Action::CreateEviction { .. } => Would::Evict,
            Action::CancelEviction { .. } => Would::CancelEviction,
            Action::DeleteService { .. } => Would::DeleteService,
            Action::PowerOff | Action::PowerOn => Would::ChangePower,
        }
    }
}

/// One thing that would be done, as the `Paused` condition lists it: the
/// list's separator never inside an item (a maintenance reason may hold
/// one), so [`told`] reads each back whole.
pub fn item(line: &str) -> String {
    line.replace("; ", ", ")
}

/// The items a `Paused` condition's message said would be done (as
/// [`Hands::condition`] writes them, last): each told already. An SRE's
/// reason that reads like a list tells nothing more than its own words.
pub fn told(message: &str) -> Vec<&str> {
    message.rsplit_once("; would ").map(|(_, items)| items.split("; ").collect()).unwrap_or_default()
}

/// What an observing install may still write to the Kubernetes API: its
/// own custom resources (their status included) and Events. Everything
/// else (Nodes, pods, anyone's objects) is refused before it leaves.
/// `path` is the request's URI path.
pub fn observer_may_write(path: &str) -> bool {
    let ours = format!("/apis/{}/", crate::api::GROUP);
    let events = path.starts_with("/apis/events.k8s.io/")
        || (path.starts_with("/api/v1/namespaces/") && path.split('/').nth(5) == Some("events"));
    path.starts_with(&ours) || events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_outweighs_the_mode_and_either_holds_the_host() {
        assert_eq!(Hands::of(false, None), Hands::Free);
        assert_eq!(Hands::of(true, None), Hands::Observing);
        assert_eq!(
            Hands::of(true, Some(" bios update -- jdoe ")),
            Hands::Paused("bios update -- jdoe".into())
        );
        assert_eq!(Hands::of(false, Some("")), Hands::Paused(String::new()));
        assert!(Hands::of(false, None).free());
        assert!(!Hands::of(true, None).free());
        assert!(!Hands::of(false, Some("x")).free());
    }

    #[test]
    fn the_condition_names_who_holds_the_host_and_what_would_be_done() {
        let c = Hands::Paused("bios update".into()).condition(&["disable compute service".into()]);
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, PAUSED));
        assert_eq!(c.message, "paused by an SRE: bios update; would disable compute service");
        let c = Hands::Observing.condition(&[]);
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, OBSERVING));
        assert!(c.message.ends_with("nothing would be done now"), "{}", c.message);
        let c = Hands::Free.condition(&[]);
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, ACTING));
        assert!(Hands::Paused(String::new()).condition(&[]).message.contains("no reason given"));
    }

    #[test]
    fn what_was_told_is_read_back_item_by_item() {
        let said = Hands::Paused("x; would y".into()).condition(&[
            "add to aggregate ab".into(),
            "fence the host (its next step: NovaForcedDown)".into(),
        ]);
        let items = told(&said.message);
        assert!(
            items.contains(&"add to aggregate ab") && !items.contains(&"add to aggregate a"),
            "{items:?}"
        );
        assert!(items.contains(&"fence the host (its next step: NovaForcedDown)"), "{items:?}");
        assert!(told(&Hands::Observing.condition(&[]).message).is_empty());
        // An item with the separator inside (a maintenance reason's) reads back whole.
        let line = item("disable compute service (hv-lifecycle: maintenance (manual): BIOS; CHG123)");
        let said = Hands::Paused("x".into()).condition(std::slice::from_ref(&line));
        assert_eq!(told(&said.message), [line.as_str()]);
    }

    #[test]
    fn an_eviction_held_says_what_it_would_move_and_how() {
        let (kind, c) = Hands::Observing.eviction("n1", 3, false);
        assert_eq!(
            (kind, c.type_, c.status),
            (Would::Migrate, ConditionType::HostPaused, ConditionStatus::True)
        );
        assert!(c.message.contains("would migrate the 3 server(s)"), "{}", c.message);
        let (kind, c) = Hands::Paused("disk swap".into()).eviction("n1", 2, true);
        assert_eq!((kind, c.reason.as_str()), (Would::Evacuate, PAUSED));
        assert!(c.message.contains("disk swap") && c.message.contains("would evacuate"), "{}", c.message);
        let (_, c) = Hands::Free.eviction("n1", 2, true);
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, ACTING));
        assert!(!c.message.contains("would"), "{}", c.message);
    }

    #[test]
    fn every_action_has_its_kind_and_an_evacuation_is_told_apart() {
        use crate::api::EvictionReason;
        let evict = |reason| Action::CreateEviction { name: "e".into(), reason };
        assert_eq!(Would::of(&evict(EvictionReason::NodeFailure)), Would::Evacuate);
        assert_eq!(Would::of(&evict(EvictionReason::AdminRequest)), Would::Evict);
        assert_eq!(Would::of(&Action::DisableService { reason: "r".into() }), Would::Disable);
        assert_eq!(Would::of(&Action::EnableService), Would::Enable);
        assert_eq!(Would::of(&Action::RunChecks { run: 1 }), Would::RunChecks);
        assert_eq!(Would::of(&Action::DeleteService { service_id: "1".into() }), Would::DeleteService);
        assert_eq!(Would::of(&Action::CancelEviction { name: "e".into() }), Would::CancelEviction);
        assert_eq!(Would::of(&Action::AddAggregate { name: "a".into() }), Would::ChangeAggregates);
        assert_eq!(Would::of(&Action::RemoveTraits { traits: Default::default() }), Would::ChangeTraits);
        assert_eq!(Would::Fence.reason(), "WouldFence");
    }

    #[test]
    fn an_observer_writes_only_its_own_resources_and_events() {
        assert!(observer_may_write("/apis/hypervisor.cloud.sap/v1/hypervisors/n1/status"));
        assert!(observer_may_write("/apis/hypervisor.cloud.sap/v1/evictions/e1"));
        assert!(observer_may_write("/apis/events.k8s.io/v1/namespaces/default/events"));
        assert!(observer_may_write("/api/v1/namespaces/default/events/x"));
        assert!(!observer_may_write("/api/v1/nodes/n1"));
        assert!(!observer_may_write("/api/v1/namespaces/openstack/pods/nova-compute-1"));
        assert!(!observer_may_write("/api/v1/namespaces/events/pods/p"), "a namespace named events");
        assert!(!observer_may_write("/apis/hypervisor.cloud.sap.evil/v1/x"));
        assert!(!observer_may_write("/apis/coordination.k8s.io/v1/namespaces/x/leases/l"));
    }
}
