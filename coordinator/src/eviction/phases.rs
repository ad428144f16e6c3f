//! An Eviction's phases before Migrating, pure (docs/eviction.md): the
//! refusal of one that cannot run, what its end leaves (a failed preflight
//! runs again after a spec change), the preflight's verdict, and the wait
//! for the host to stop taking VMs. The shell (`k8s::eviction`) reads
//! Nova and writes what these answer.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::checks::Refusal;
use super::plan::Evacuation;
use super::preflight::{Finding, Report};
use crate::api::condition::{ConditionStatus, ConditionType, DesiredCondition, merge};
use crate::api::eviction::{EvictionPhase, EvictionStatus};

/// Look at a moving eviction this often, counted from one look's start to
/// the next: counted from its end, the time a look takes would add to how
/// late an attempt's end is seen (decision record 0018).
pub const POLL: Duration = Duration::from_secs(1);

/// What the host's fencing means for an eviction.
#[derive(Clone, Debug, PartialEq)]
pub enum FenceState {
    /// Not fenced: VMs are migrated.
    None,
    /// Being fenced: nothing new starts. A live migration off a dying host
    /// fails, and an evacuation before the fence could run a VM twice.
    Pending(String),
    /// Fenced, by the record read at this look: VMs are evacuated.
    Fenced(Evacuation),
    /// Fenced, but it showed life again and is not fenced again yet:
    /// nothing new starts (its servers not moved yet may restart there).
    ShowsLife(String),
}

impl FenceState {
    /// How the host's servers are evacuated, once it is fenced.
    pub fn evacuation(&self) -> Option<Evacuation> {
        match self {
            FenceState::Fenced(e) => Some(*e),
            _ => None,
        }
    }

    /// Nothing new starts: the host is being fenced, or was and shows life.
    pub fn holds(&self) -> bool {
        matches!(self, FenceState::Pending(_) | FenceState::ShowsLife(_))
    }

    /// The `HostFenced` condition that says what the fencing does to the
    /// eviction; None when the host is not fenced.
    pub fn condition(&self) -> Option<DesiredCondition> {
        let (status, reason, message) = match self {
            FenceState::None => return None,
            FenceState::Pending(why) => (ConditionStatus::False, "FencingUnderWay", why.clone()),
            FenceState::ShowsLife(why) => (ConditionStatus::False, "FencedHostShowsLife", why.clone()),
            FenceState::Fenced(_) => (
                ConditionStatus::True,
                "Evacuating",
                "the host is fenced: its servers are rebuilt elsewhere (evacuated), not migrated".to_string(),
            ),
        };
        Some(DesiredCondition::new(ConditionType::HostFenced, status, reason, message))
    }
}

/// The status of an Eviction that cannot run: Failed, with the refusal in
/// its `Target` condition.
pub fn refused(
    mut s: EvictionStatus,
    r: &Refusal,
    generation: Option<i64>,
    now: Timestamp,
) -> EvictionStatus {
    let c = DesiredCondition::new(ConditionType::Target, ConditionStatus::False, r.reason, r.message.clone());
    s.conditions = merge(&s.conditions, &[c], now, generation);
    s.observed_generation = generation;
    s.phase = Some(EvictionPhase::Failed);
    s.progress = Some(format!("refused: {}", r.reason));
    s.completed_at.get_or_insert(Time(now));
    s
}

/// A finished Eviction stays final, unless its preflight failed and its
/// spec changed since (normally `force`): then the status that runs it
/// again, as a run of its own (the wait for the host to be disabled counts
/// from its start, not from the first run's).
pub fn run_again(s: &EvictionStatus, generation: Option<i64>, deleting: bool) -> Option<EvictionStatus> {
    let failed_preflight =
        s.conditions.iter().any(|c| c.type_ == ConditionType::Preflight.as_str() && c.status == "False");
    let rerun = !deleting
        && s.phase == Some(EvictionPhase::Failed)
        && failed_preflight
        && generation != s.observed_generation;
    rerun.then(|| EvictionStatus {
        phase: Some(EvictionPhase::Pending),
        completed_at: None,
        started_at: None,
        ..s.clone()
    })
}

/// The preflight's verdict on the status: passed (or found, but the host
/// is fenced: its servers cannot stay) moves on to Disabling with the host
/// recorded; found on a live host fails the eviction, naming each VM.
/// Answers the status and whether it moves on.
pub fn judged(
    mut s: EvictionStatus,
    report: Report,
    fence: &FenceState,
    source: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> (EvictionStatus, bool) {
    s.observed_generation = generation;
    s.started_at.get_or_insert(Time(now));
    let evacuating = matches!(fence, FenceState::Fenced(_));
    let (status, reason, message, passed) = if report.findings.is_empty() {
        (ConditionStatus::True, "Passed", report.summary, true)
    } else if evacuating {
        (ConditionStatus::False, "FoundButEvacuating", findings_message(&report.findings, false), true)
    } else {
        (ConditionStatus::False, "Failed", findings_message(&report.findings, true), false)
    };
    if passed {
        s.phase = Some(EvictionPhase::Disabling);
        s.host = Some(source.to_string());
    } else {
        s.phase = Some(EvictionPhase::Failed);
        s.progress = Some("preflight failed".into());
        s.completed_at = Some(Time(now));
    }
    let c = DesiredCondition::new(ConditionType::Preflight, status, reason, message);
    let said: Vec<DesiredCondition> = std::iter::once(c).chain(fence.condition()).collect();
    s.conditions = merge(&s.conditions, &said, now, generation);
    (s, passed)
}

/// The Preflight reason while hibernated hosts wake for the eviction.
pub const WAITING_FOR_ROOM: &str = "WaitingForRoom";

/// How long a preflight short of room waits for the hibernation policy to
/// wake hosts before it fails: longer than one wake may take by its own
/// bounds (power on 5 min, agent back 15, checks 10).
pub const WAIT_FOR_ROOM: Duration = Duration::from_secs(40 * 60);

/// Whether only room stops the VMs the preflight found (no other check):
/// what a woken host could settle.
pub fn short_of_room_only(report: &Report) -> bool {
    use super::preflight::{CAPACITY, CONSTRAINTS};
    !report.findings.is_empty()
        && report.findings.iter().all(|f| f.check == CAPACITY || f.check == CONSTRAINTS)
}

/// A preflight that found no room where the hibernation policy has hosts
/// to wake (`asleep`: by group, the hosts it may wake) waits for them in
/// Preflight, `Preflight=False/WaitingForRoom`, its lastTransitionTime
/// when the wait began; None (judge it as usual) when something else than
/// room stops a VM, when there is nothing to wake, or once
/// [`WAIT_FOR_ROOM`] has passed.
pub fn waiting_for_room(
    mut s: EvictionStatus,
    report: &Report,
    asleep: &[(String, Vec<String>)],
    generation: Option<i64>,
    now: Timestamp,
) -> Option<EvictionStatus> {
    if !short_of_room_only(report) || asleep.is_empty() {
        return None;
    }
    let preflight = |c: &&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition| {
        c.type_ == ConditionType::Preflight.as_str()
    };
    let waiting = s.conditions.iter().find(preflight).filter(|c| c.reason == WAITING_FOR_ROOM);
    let since = waiting.map_or(now, |c| c.last_transition_time.0);
    let waited = now.duration_since(since);
    if !waited.is_negative() && waited.unsigned_abs() >= WAIT_FOR_ROOM {
        return None;
    }
    let groups: Vec<String> = asleep.iter().map(|(g, hosts)| format!("{g} ({})", hosts.join(", "))).collect();
    let message = format!(
        "{}; waiting up to {} min for the hibernation policy to wake hosts of {}",
        findings_message(&report.findings, false),
        WAIT_FOR_ROOM.as_secs() / 60,
        groups.join(", ")
    );
    s.observed_generation = generation;
    s.started_at.get_or_insert(Time(now));
    s.phase = Some(EvictionPhase::Preflight);
    s.progress = Some("waiting for hibernated hosts to wake".into());
    let c =
        DesiredCondition::new(ConditionType::Preflight, ConditionStatus::False, WAITING_FOR_ROOM, message);
    s.conditions = merge(&s.conditions, &[c], now, generation);
    if let Some(c) = s.conditions.iter_mut().find(|c| c.type_ == ConditionType::Preflight.as_str()) {
        c.last_transition_time = Time(since);
    }
    Some(s)
}

/// A dry run's end, once its preflight is judged: `Planned`, whatever
/// the preflight found, with how many VMs it stops in `progress`; or,
/// when something `held` the preflight (the host's fencing, its machine),
/// with that instead.
pub fn planned(mut s: EvictionStatus, held: Option<&str>, now: Timestamp) -> EvictionStatus {
    let stopped = s.preflight.iter().filter(|v| v.finding.is_some()).count();
    s.phase = Some(EvictionPhase::Planned);
    s.progress = Some(match (held, stopped) {
        (Some(why), _) => format!("dry run: not judged: {why}"),
        (None, 0) => format!("dry run: {} VM(s), none stopped", s.preflight.len()),
        (None, n) => format!("dry run: {} VM(s), {n} stopped", s.preflight.len()),
    });
    s.completed_at = Some(Time(now));
    s
}

/// What Nova says of the host's compute service while the eviction waits
/// for it to be disabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceSeen {
    Enabled,
    Disabled,
    /// Nova shows no compute service for the host.
    Missing,
    /// Nova could not be read.
    Unreadable,
}

/// What the wait for the disable comes to.
#[derive(Clone, Debug, PartialEq)]
pub enum Disabling {
    /// The host takes no new VMs: on to the migrations, with this condition.
    Proceed(DesiredCondition),
    /// Not yet: look again after this long.
    Wait(Duration),
    /// The eviction fails: its status.
    Failed(EvictionStatus),
}

/// Nothing moves before the host stops taking new VMs (the lifecycle
/// disables it when it sees the Eviction); not for ever, though: past
/// `timeout` from the eviction's start it fails.
pub fn disabling(
    s: &EvictionStatus,
    seen: ServiceSeen,
    source: &str,
    timeout: Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> Disabling {
    const NOVA_RETRY: Duration = Duration::from_secs(5);
    let waited = now.duration_since(s.started_at.as_ref().map_or(now, |t| t.0));
    let (reason, message) = match seen {
        ServiceSeen::Disabled => {
            let c = DesiredCondition::new(ConditionType::HostDisabled, ConditionStatus::True, "Disabled", "");
            return Disabling::Proceed(c);
        }
        ServiceSeen::Unreadable => return Disabling::Wait(NOVA_RETRY),
        ServiceSeen::Missing => {
            ("NoComputeService", format!("Nova shows no compute service for host {source}"))
        }
        ServiceSeen::Enabled if waited.as_secs() >= i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX) => (
            "NotDisabled",
            format!("the compute service of {source} was still enabled after {}s", waited.as_secs()),
        ),
        ServiceSeen::Enabled => return Disabling::Wait(POLL),
    };
    let mut s = s.clone();
    let c = DesiredCondition::new(ConditionType::HostDisabled, ConditionStatus::False, reason, message);
    s.conditions = merge(&s.conditions, &[c], now, generation);
    s.phase = Some(EvictionPhase::Failed);
    s.progress = Some(reason.to_string());
    s.completed_at = Some(Time(now));
    Disabling::Failed(s)
}

/// The preflight's findings in a condition's message: at most 20 named,
/// and what to do.
fn findings_message(findings: &[Finding], stops: bool) -> String {
    const SHOWN: usize = 20;
    let lines: Vec<String> = findings.iter().take(SHOWN).map(ToString::to_string).collect();
    let mut msg = format!("{} VM(s) cannot be moved: {}", findings.len(), lines.join("; "));
    if findings.len() > SHOWN {
        msg.push_str(&format!("; and {} more", findings.len() - SHOWN));
    }
    msg.push_str(if stops {
        ". Fix it and delete this Eviction (maintenance makes a new one), \
         or list the checks to skip in spec.options.force"
    } else {
        ". The host is fenced: every server is evacuated all the same, and one Nova cannot place \
         is recorded after its attempts"
    });
    msg
}

#[cfg(test)]
mod tests;
