//! What one reconcile's fencing comes to, as the lifecycle core answers a
//! decision: the host's new fencing record, its `Fenced` condition, a
//! Warning Event and when to look again. Pure: the shell observes,
//! [`decide`](super::decide::decide) names the step, the shell takes it (or
//! cannot), and [`record`] says what that came to; [`cleared`] does the same
//! for a step of taking the fence off ([`clear`](super::clear)).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::decide::Decision;
use crate::api::HypervisorStatus;
use crate::api::condition::{ConditionStatus, ConditionType, DesiredCondition, merge};
use crate::api::hypervisor::{
    FailedFenceStep, FenceRetirement, FenceRevival, FenceStep, FencingStatus, HealthState,
};

/// Tries of a step before it stands failed for an SRE.
pub const ATTEMPTS: u32 = 3;

/// What one reconcile's fencing comes to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FenceOutcome {
    pub record: Option<FencingStatus>,
    /// The `Fenced` condition to set; None with no record: none at all.
    pub condition: Option<DesiredCondition>,
    /// Look again this soon (the next step).
    pub again: Option<Duration>,
    /// A Warning Event: reason and note.
    pub event: Option<(String, String)>,
}

/// What an SRE asked on the Hypervisor (its annotations' values): retry a
/// failed step, confirm the host fenced by hand, clear the fencing, retire
/// the host (and say its machine is gone); and its Node's deletion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Asked {
    pub retry: Option<String>,
    pub confirm: Option<String>,
    pub clear: Option<String>,
    pub retire: Option<String>,
    pub machine_gone: Option<String>,
    /// The Node is being deleted (when it began): a host fenced once its
    /// Node is to go is retired, whenever the deletion began.
    pub node_deleted: Option<String>,
}

impl Asked {
    /// A clearing asked since the record last handled one.
    pub fn clears(&self, r: &FencingStatus) -> bool {
        self.clear.is_some() && r.handled_clear != self.clear
    }

    /// A retirement under way, or asked since the fencing started of a
    /// host that counts fenced (by its Node's deletion, whenever it began,
    /// while no clearing waits); not one a clearing asked since cancelled
    /// (the host was not gone). It outweighs a clearing asked before it.
    pub fn retires(&self, r: &FencingStatus) -> bool {
        let by_hand = self.retire.is_some() && r.handled_retire != self.retire;
        let by_node = self.node_deleted.is_some() && !self.clears(r);
        match &r.retirement {
            Some(x) => self.clear.is_none() || self.clear == x.handled_clear,
            None => r.fenced.is_some() && (by_hand || by_node),
        }
    }

    /// The SRE said, with a retirement asked since the fencing started,
    /// that the machine is removed or wiped (the two annotations alike).
    pub fn machine_gone(&self, r: &FencingStatus) -> bool {
        self.retire.is_some() && self.machine_gone == self.retire && r.handled_retire != self.retire
    }

    /// A confirmation by hand asked since the record last handled one.
    pub fn confirms(&self, r: &FencingStatus) -> bool {
        self.confirm.is_some() && r.handled_confirm != self.confirm
    }
}

/// The record as an SRE's retry leaves it: a failed step cleared (a retry
/// given before the fencing started is not one, nor is the annotation's
/// removal).
pub fn retried(record: Option<FencingStatus>, asked: &Asked) -> Option<FencingStatus> {
    record.map(|mut r| {
        if r.failed.is_some() && asked.retry.is_some() && r.handled_retry != asked.retry {
            r.failed = None;
            r.handled_retry.clone_from(&asked.retry);
        }
        r
    })
}

/// The step a fencing records before a step it takes is tried, when
/// [`decide`](super::decide::decide) names one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// A new fencing starts (counted as under way from now).
    Claimed,
    /// Ranked again under the claims' lock, its failure domain must wait
    /// for others after all: nothing recorded, looked at again soon.
    NotClaimed,
    /// This replica does not hold the lease: the step waits for the next
    /// reconcile, under the lease.
    NotLeader,
    /// The storage step's addresses, with those the record does not hold
    /// yet: recorded before they are added, so a clearing lifts whatever
    /// may have been, whatever a fail-over or a lost write.
    AddressesFirst { addresses: Vec<String>, new: Vec<String> },
    /// The step was taken: how it was confirmed, or why not.
    Step(Result<String, String>),
}

/// What the record and the verdict say beside the decision.
pub struct Facts<'a> {
    pub name: &'a str,
    pub now: Timestamp,
    /// This reconcile's verdict (None: not judged).
    pub health: Option<HealthState>,
    /// The host's agent talked to us lately.
    pub heartbeat_fresh: bool,
    /// The Hypervisor's conditions as stored (news or not).
    pub conditions: &'a [Condition],
    pub asked: &'a Asked,
}

/// The fencing's outcome: `before` is the record (after [`retried`]),
/// `taken` what came of the step a `Take` decision names.
pub fn record(
    before: Option<&FencingStatus>,
    decision: &Decision,
    taken: Option<Taken>,
    f: &Facts<'_>,
) -> FenceOutcome {
    let mut out = FenceOutcome { record: before.cloned(), ..FenceOutcome::default() };
    match (decision, taken) {
        (Decision::Nothing, _) => {}
        (Decision::HeldBack { gate, message }, _) => {
            let news = !held_already(f.conditions, gate.reason());
            out.condition = Some(cond(ConditionStatus::False, gate.reason(), message));
            out.event = news.then(|| (gate.reason().to_string(), message.clone()));
        }
        (Decision::Stuck { message, .. }, _) => {
            out.condition = Some(cond(ConditionStatus::False, super::decide::STUCK, message));
        }
        // decide fences only a fencing under way: the record is there.
        (Decision::Fenced { by_hand }, _) => {
            if let Some(r) = out.record.as_mut() {
                let (condition, event) = fenced(r, *by_hand, f);
                out.condition = Some(condition);
                out.event = event;
            }
        }
        (Decision::ShowsLife { sign }, _) => {
            if let Some(r) = out.record.as_mut() {
                let (condition, event) = shows_life(r, sign, f);
                out.condition = Some(condition);
                out.event = Some(event);
                out.again = Some(Duration::from_millis(100));
            }
        }
        (Decision::FencedAgain, _) => {
            if let Some(r) = out.record.as_mut() {
                let (condition, event) = fenced_again(r, "an SRE confirmed it off", f);
                out.condition = Some(condition);
                out.event = Some(event);
            }
        }
        (Decision::Take(step), Some(taken)) if revived(before) => again(&mut out, *step, taken, f),
        (Decision::Take(step), Some(taken)) => took(&mut out, *step, taken, f),
        (Decision::Take(_), None) => {}
    }
    out
}

fn revived(r: Option<&FencingStatus>) -> bool {
    r.is_some_and(|r| r.fenced.is_some() && r.revival.is_some())
}

/// A fenced host showing life while its servers are evacuated, recorded
/// (written before anything is done to it: no evacuation starts from
/// then): its condition, and a Warning Event.
fn shows_life(r: &mut FencingStatus, sign: &str, f: &Facts<'_>) -> (DesiredCondition, (String, String)) {
    r.revival = Some(FenceRevival {
        seen: Some(Time(f.now)),
        sign: sign.to_string(),
        handled_confirm: f.asked.confirm.clone(),
    });
    // A failure of the first fencing says nothing of this one.
    r.failed = None;
    let message = format!(
        "fenced, but shows life again ({sign}) while its servers are evacuated: no evacuation starts \
         until it is fenced again"
    );
    (
        cond(ConditionStatus::False, SHOWS_LIFE, &message),
        (SHOWS_LIFE.to_string(), format!("{}: {message}", f.name)),
    )
}

/// The reason of a fenced host showing life, of its condition and Event.
pub const SHOWS_LIFE: &str = "FencedHostShowsLife";

/// The host that showed life, fenced again (`how`): its evacuation goes on.
fn fenced_again(r: &mut FencingStatus, how: &str, f: &Facts<'_>) -> (DesiredCondition, (String, String)) {
    let sign = r.revival.take().map(|v| v.sign).unwrap_or_default();
    r.refenced = Some(Time(f.now));
    r.failed = None;
    let message = format!("fenced again after it showed life ({sign}): {how}; its evacuation goes on");
    (
        cond(ConditionStatus::True, "Fenced", &message),
        ("FencedAgain".to_string(), format!("{}: {message}", f.name)),
    )
}

/// What the power off of a host that showed life came to.
fn again(out: &mut FenceOutcome, step: FenceStep, taken: Taken, f: &Facts<'_>) {
    match taken {
        Taken::Step(Ok(how)) => {
            if let Some(r) = out.record.as_mut() {
                let (condition, event) = fenced_again(r, &how, f);
                out.condition = Some(condition);
                out.event = Some(event);
            }
        }
        // Tried again as any step is, and standing failed after the last.
        other => took(out, step, other, f),
    }
}

/// The record counted fenced (once), and its condition: it stands until an
/// SRE clears it, and says so when the host's agent talks again.
fn fenced(
    r: &mut FencingStatus,
    by_hand: bool,
    f: &Facts<'_>,
) -> (DesiredCondition, Option<(String, String)>) {
    let mut event = None;
    if r.fenced.is_none() {
        r.fenced = Some(Time(f.now));
        r.by_hand = by_hand;
        let how = if by_hand { "confirmed by hand" } else { "every step confirmed" };
        let note = format!("{} is fenced ({how}): its VMs may be rebuilt elsewhere", f.name);
        event = Some(("Fenced".to_string(), note));
    }
    let how = if r.by_hand { "an SRE confirmed it" } else { "every step confirmed" };
    let message = format!("fenced ({how}: {}); stays so until an SRE clears it", list(&r.confirmed));
    let (reason, message) = if f.heartbeat_fresh {
        ("FencedAgentTalking", format!("{message}. Its agent talks to us again: look at the host"))
    } else {
        ("Fenced", message)
    };
    (cond(ConditionStatus::True, reason, &message), event)
}

/// What a step named by the decision came to.
fn took(out: &mut FenceOutcome, step: FenceStep, taken: Taken, f: &Facts<'_>) {
    let in_progress = |message: &str| Some(cond(ConditionStatus::False, "InProgress", message));
    match taken {
        Taken::NotClaimed => out.again = Some(Duration::from_secs(1)),
        Taken::NotLeader => out.again = Some(Duration::from_millis(500)),
        // Recorded before any step: a fencing started is never lost to a
        // fail-over or a failed write, and counts as under way.
        Taken::Claimed => {
            out.record = Some(FencingStatus {
                started: Some(Time(f.now)),
                handled_retry: f.asked.retry.clone(),
                handled_confirm: f.asked.confirm.clone(),
                handled_clear: f.asked.clear.clone(),
                handled_retire: f.asked.retire.clone(),
                ..Default::default()
            });
            let message = format!("fencing started ({}): {step} next", f.health.unwrap_or_default());
            out.condition = in_progress(&message);
            out.event = Some(("FencingStarted".to_string(), message));
            out.again = Some(Duration::from_millis(200));
        }
        Taken::AddressesFirst { addresses, new } => {
            let Some(r) = out.record.as_mut() else { return };
            r.ceph_addresses.extend(new);
            out.condition = in_progress(&format!("{step} next: {} recorded first", addresses.join(", ")));
            out.again = Some(Duration::from_millis(200));
        }
        Taken::Step(Ok(how)) => {
            let Some(r) = out.record.as_mut() else { return };
            r.failed = None;
            r.confirmed.push(step);
            let message = format!("{step} confirmed ({how})");
            out.condition = in_progress(&message);
            out.event = Some((format!("{step}Confirmed"), message));
            out.again = Some(Duration::from_millis(200));
        }
        Taken::Step(Err(why)) => {
            let Some(r) = out.record.as_mut() else { return };
            let attempts = r.failed.as_ref().filter(|f| f.step == step).map_or(0, |f| f.attempts) + 1;
            r.failed = Some(FailedFenceStep { step, message: why.clone(), attempts });
            let name = f.name;
            let (reason, message) = if attempts >= ATTEMPTS {
                let message = format!(
                    "{step} not confirmed after {ATTEMPTS} tries: {why}. Retry it (hvctl retry {name}), or \
                     make sure the host is fenced and say so (hvctl confirm-fenced {name})"
                );
                (super::decide::STUCK, message)
            } else {
                ("StepRetrying", format!("{step} not confirmed (try {attempts} of {ATTEMPTS}): {why}"))
            };
            out.condition = Some(cond(ConditionStatus::False, reason, &message));
            out.event = Some((format!("{step}NotConfirmed"), message));
            out.again = Some(Duration::from_secs(1));
        }
    }
}

/// What a step of taking the fence off came to ([`clear::next`](super::clear::next)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleared {
    /// Nothing could be undone; why.
    Waiting(String),
    /// Nova's `forced_down` lifted from the host's compute service.
    ForcedDownLifted { host: String },
    /// These blocklist entries lifted.
    BlocklistLifted { addresses: Vec<String> },
    /// Nothing of the fence is left.
    Done,
}

/// The outcome of a clearing's step on the record `r`.
pub fn cleared(r: &FencingStatus, name: &str, step: Cleared, conditions: &[Condition]) -> FenceOutcome {
    let mut out = FenceOutcome { record: Some(r.clone()), ..FenceOutcome::default() };
    let clearing = |msg: &str| Some(cond(ConditionStatus::True, "Clearing", msg));
    match step {
        Cleared::Waiting(why) => {
            let news = !held_already(conditions, "ClearWaiting");
            out.condition =
                Some(cond(ConditionStatus::True, "ClearWaiting", &format!("clearing asked: {why}")));
            out.event = news.then(|| ("FencingClearWaiting".to_string(), why));
            out.again = Some(Duration::from_secs(5));
        }
        Cleared::ForcedDownLifted { host } => {
            let msg = format!("Nova's forced_down lifted from {host}'s compute service");
            out.condition = clearing(&msg);
            out.event = Some(("ForcedDownLifted".to_string(), msg));
            out.again = Some(Duration::from_millis(200));
        }
        Cleared::BlocklistLifted { addresses } => {
            if let Some(r) = out.record.as_mut() {
                r.blocklist_lifted = true;
            }
            let msg = format!("{} lifted from the OSD blocklist", addresses.join(", "));
            out.condition = clearing(&msg);
            out.event = Some(("BlocklistLifted".to_string(), msg));
            out.again = Some(Duration::from_millis(200));
        }
        Cleared::Done => {
            out.record = None;
            let note =
                format!("{name}'s fence is off: it comes back through its checks before it takes VMs again");
            out.event = Some(("FencingCleared".to_string(), note));
        }
    }
    out
}

/// What a look at a retired host came to ([`retire::next`](super::retire::next)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retired {
    /// Nothing could be done; why.
    Waiting(String),
    /// These blocklist entries lifted, the machine found as `machine` says.
    BlocklistLifted { addresses: Vec<String>, machine: String },
    /// Nothing is left to do.
    Done,
}

/// The outcome of a look at a retired host, `r` its record, `asked` what
/// the SRE asked: the record kept, with its retirement.
pub fn retired(
    r: &FencingStatus,
    name: &str,
    now: Timestamp,
    asked: &Asked,
    step: Retired,
    conditions: &[Condition],
) -> FenceOutcome {
    let mut record = r.clone();
    let retirement = record.retirement.get_or_insert_with(|| FenceRetirement {
        asked: Some(Time(now)),
        handled_clear: asked.clear.clone(),
        ..FenceRetirement::default()
    });
    if let Some(value) = asked.retire.as_ref().or(asked.node_deleted.as_ref()) {
        retirement.handled.clone_from(value);
    }
    let (mut out, mut lifted) = (FenceOutcome::default(), false);
    match step {
        Retired::Waiting(why) => {
            let news = !held_already(conditions, RETIRE_WAITING);
            let message = format!("retired: {why}");
            out.condition = Some(cond(ConditionStatus::True, RETIRE_WAITING, &message));
            out.event = news.then(|| (RETIRE_WAITING.to_string(), format!("{name} {message}")));
            out.again = Some(Duration::from_secs(5));
        }
        Retired::BlocklistLifted { addresses, machine } => {
            retirement.machine = Some(machine.clone());
            lifted = true;
            let message = format!("{} lifted from the OSD blocklist ({machine})", addresses.join(", "));
            out.condition = Some(cond(ConditionStatus::True, RETIRE_WAITING, &message));
            out.event = Some(("BlocklistLifted".to_string(), format!("{name}: {message}")));
            out.again = Some(Duration::from_millis(200));
        }
        Retired::Done => {
            let first = retirement.retired.is_none();
            retirement.retired.get_or_insert(Time(now));
            let message = "retired, gone for good: none of its blocklist entries is left, Nova's \
                           forced_down stays until it is decommissioned (its Node deleted), and this \
                           record is kept (hvctl clear-fenced brings it back instead, should it not be gone)";
            out.condition = Some(cond(ConditionStatus::True, RETIRED, message));
            out.event = first.then(|| (RETIRED.to_string(), format!("{name} is {message}")));
        }
    }
    record.blocklist_lifted |= lifted;
    out.record = Some(record);
    out
}

/// The reasons of a retired host's `Fenced` condition and Events.
pub const RETIRE_WAITING: &str = "RetireWaiting";
pub const RETIRED: &str = "Retired";

/// Every reason the `Fenced` condition is written with (the gates', the
/// steps', the way back's): the metrics' bounded set of them
/// (`hv_hypervisors_fencing`). tests/tests/reasons.rs holds it to the code.
pub const REASONS: [&str; 17] = [
    "AgentHeartbeatFresh",
    "KubeletAlive",
    "CoordinatorBlind",
    "NoAgentQuorum",
    "FailureDomainLost",
    "FleetShareLost",
    "OtherDomainsFirst",
    "InProgress",
    "StepRetrying",
    super::decide::STUCK,
    "Fenced",
    "FencedAgentTalking",
    SHOWS_LIFE,
    "ClearWaiting",
    "Clearing",
    RETIRE_WAITING,
    RETIRED,
];

/// When the fencing's record is written on its own, before the lifecycle
/// acts, and how soon the host is looked at again: a fencing that starts,
/// a fenced host found showing life, or a Failed host's that only waits
/// for its last heartbeat to age (seconds). The lifecycle's disable of a host Nova still counts up would
/// wait on the dead host's nova-compute (up to its RPC timeout, a minute);
/// once the Nova step has forced the host down it no longer does.
pub fn goes_first(
    stored: Option<&FencingStatus>,
    health: Option<HealthState>,
    out: &FenceOutcome,
) -> Option<Duration> {
    if let Some(stored) = stored {
        // A fenced host showing life: written before it is fenced again.
        let revives = stored.revival.is_none() && out.record.as_ref().is_some_and(|r| r.revival.is_some());
        return revives.then_some(Duration::from_millis(100));
    }
    let starts = out.record.is_some();
    let ripens = health == Some(HealthState::Failed)
        && out
            .condition
            .as_ref()
            .is_some_and(|c| c.reason == super::decide::FenceHold::FreshHeartbeat.reason());
    if starts {
        Some(Duration::from_millis(100))
    } else if ripens {
        Some(out.again.unwrap_or(Duration::from_millis(500)))
    } else {
        None
    }
}

/// Writes a reconcile's fencing into the status to be written: the
/// record, and the `Fenced` condition (gone when there is nothing to fence
/// and nothing recorded: no gate holds anything back).
pub fn apply(status: &mut HypervisorStatus, out: &FenceOutcome, now: Timestamp, generation: Option<i64>) {
    status.fencing.clone_from(&out.record);
    match &out.condition {
        Some(c) => status.conditions = merge(&status.conditions, std::slice::from_ref(c), now, generation),
        None if out.record.is_none() => {
            status.conditions.retain(|c| c.type_ != ConditionType::Fenced.as_str())
        }
        None => {}
    }
}

fn cond(status: ConditionStatus, reason: &str, message: &str) -> DesiredCondition {
    DesiredCondition::new(ConditionType::Fenced, status, reason, message)
}

fn list(steps: &[FenceStep]) -> String {
    if steps.is_empty() {
        return "no step".into();
    }
    steps.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

fn held_already(conditions: &[Condition], reason: &str) -> bool {
    conditions.iter().any(|c| c.type_ == ConditionType::Fenced.as_str() && c.reason == reason)
}

#[cfg(test)]
mod tests;
