//! When an update tool stops waiting (docs/drain.md, "When a tool will not
//! wait"). Gardener's machine-controller-manager drains a Node through the
//! eviction API, so the drain guard, the budgets and the webhook hold it;
//! but it stops waiting for them, and deletes the Node's pods whatever
//! they say, once its drain timeout has passed since it began, or once the
//! Node has been NotReady for more than five minutes. What is left on the
//! host then goes with the machine. This says how long the host has, so an
//! SRE is told before the time runs out. Pure.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;

use super::signals::{MCM_CONDITION, UpdateSignals};
use crate::api::condition::DesiredCondition;
use crate::api::{ConditionStatus, ConditionType};

/// How long a NotReady Node keeps MCM waiting for the budgets.
pub const MCM_NOT_READY_FORCE: Duration = Duration::from_secs(5 * 60);

/// Warned this long before the tool stops waiting (the alert on
/// `hv_update_drain_seconds_left` says the same).
pub const WARN_BEFORE: Duration = Duration::from_secs(30 * 60);

/// A tool that drains the Node and stops waiting at a known time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolDrain {
    pub tool: &'static str,
    /// When it began (its signal's transition).
    pub since: Timestamp,
    pub timeout: Duration,
    /// When the Node's `Ready` turned other than `True`, if it is not.
    pub not_ready_since: Option<Timestamp>,
}

impl ToolDrain {
    /// Never past the last time there is: a timeout or a transition time
    /// out of all proportion reads as "not in this era", never a panic.
    pub fn stops_waiting_at(&self) -> Timestamp {
        SignedDuration::try_from(self.timeout)
            .ok()
            .and_then(|d| self.since.checked_add(d).ok())
            .unwrap_or(Timestamp::MAX)
    }
}

/// Gardener MCM, as the host's status names it.
pub const TOOL_MCM: &str = "Gardener MCM";

/// Gardener MCM's drain of `node`, when its signal is named and its
/// condition stands. A condition without its transition time began at
/// `unknown_since` (when it was first seen).
pub fn of(node: &Node, signals: &UpdateSignals, unknown_since: Timestamp) -> Option<ToolDrain> {
    let timeout = signals.mcm_drain_timeout()?;
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let terminating = conditions.iter().find(|c| c.type_ == MCM_CONDITION && c.status == "True")?;
    let since = |c: &k8s_openapi::api::core::v1::NodeCondition| c.last_transition_time.as_ref().map(|t| t.0);
    let not_ready_since = conditions
        .iter()
        .find(|c| c.type_ == "Ready" && c.status != "True")
        .map(|c| since(c).unwrap_or(unknown_since));
    Some(ToolDrain {
        tool: TOOL_MCM,
        since: since(terminating).unwrap_or(unknown_since),
        timeout,
        not_ready_since,
    })
}

/// Where the drain stands for the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The host is emptied and held: the tool may go on.
    Emptied,
    /// The tool waits for the budgets, `left` more.
    Waits { left: Duration },
    /// Less than [`WARN_BEFORE`] is left.
    Near { left: Duration },
    /// The tool no longer waits: it deletes the pods whatever the budgets
    /// say (why).
    Forces(&'static str),
}

pub fn stage(d: &ToolDrain, emptied: bool, now: Timestamp) -> Stage {
    if emptied {
        return Stage::Emptied;
    }
    let not_ready = d.not_ready_since.map(|t| now.duration_since(t));
    if not_ready
        .is_some_and(|n| n >= SignedDuration::try_from(MCM_NOT_READY_FORCE).unwrap_or(SignedDuration::MAX))
    {
        return Stage::Forces("the Node has been NotReady for more than 5 minutes");
    }
    let left = d.stops_waiting_at().duration_since(now);
    let Ok(left) = Duration::try_from(left) else { return Stage::Forces("its drain timeout has passed") };
    if left.is_zero() {
        return Stage::Forces("its drain timeout has passed");
    }
    if left <= WARN_BEFORE { Stage::Near { left } } else { Stage::Waits { left } }
}

pub const WAITS: &str = "ToolWaits";
pub const NEAR: &str = "DeadlineNear";
pub const FORCES: &str = "ToolForces";
pub const EMPTIED: &str = "Emptied";
pub const NOT_DRAINING: &str = "NotDraining";

/// The `UpdateDrain` condition: True while a tool drains the host and it is
/// not emptied yet; False once it is, or once the tool's signal is gone
/// (then only when it was said before: a host never drained carries none).
/// `vms`: the host's VMs as counted.
pub fn condition(
    drain: Option<&ToolDrain>,
    stage: Option<&Stage>,
    vms: Option<u32>,
    said_before: bool,
) -> Option<DesiredCondition> {
    let t = ConditionType::UpdateDrain;
    let (Some(d), Some(stage)) = (drain, stage) else {
        return said_before.then(|| {
            DesiredCondition::new(t, ConditionStatus::False, NOT_DRAINING, "no update tool drains the Node")
        });
    };
    let since = d.since.strftime("%Y-%m-%dT%H:%M:%SZ");
    let at = d.stops_waiting_at().strftime("%Y-%m-%dT%H:%M:%SZ");
    let vms = vms.map_or("its VMs (not counted)".to_string(), |n| format!("{n} VMs"));
    let c = match stage {
        Stage::Emptied => DesiredCondition::new(
            t,
            ConditionStatus::False,
            EMPTIED,
            format!(
                "{} drains the Node since {since}; the host is emptied and held, its pods may go",
                d.tool
            ),
        ),
        Stage::Waits { left } => DesiredCondition::new(
            t,
            ConditionStatus::True,
            WAITS,
            format!(
                "{} drains the Node since {since}; it waits for the host to be emptied ({vms} left) until {at}, {} from now",
                d.tool,
                minutes(*left)
            ),
        ),
        Stage::Near { left } => DesiredCondition::new(
            t,
            ConditionStatus::True,
            NEAR,
            format!(
                "{} stops waiting at {at}, {} from now, and then deletes the Node's pods whatever the budgets say; \
                 {vms} left on the host: speed the eviction up (docs/drain.md) or stop the tool",
                d.tool,
                minutes(*left)
            ),
        ),
        Stage::Forces(why) => DesiredCondition::new(
            t,
            ConditionStatus::True,
            FORCES,
            format!(
                "{} no longer waits ({why}): it deletes the Node's pods whatever the budgets say, with {vms} on \
                 the host; a NotReady host is the HA path's (docs/fencing.md)",
                d.tool
            ),
        ),
    };
    Some(c)
}

fn minutes(d: Duration) -> String {
    let m = d.as_secs().div_ceil(60);
    if m >= 60 { format!("{}h{:02}m", m / 60, m % 60) } else { format!("{m}m") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(terminating: Option<&str>, not_ready: Option<&str>) -> Node {
        let mut conditions = Vec::new();
        if let Some(t) = terminating {
            conditions
                .push(serde_json::json!({"type": "Terminating", "status": "True", "reason": "ScaleDown",
                "message": "Machine shoot--x--worker-abc is being deleted", "lastTransitionTime": t}));
        }
        match not_ready {
            Some(t) => conditions
                .push(serde_json::json!({"type": "Ready", "status": "Unknown", "lastTransitionTime": t})),
            None => conditions.push(serde_json::json!({"type": "Ready", "status": "True"})),
        }
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "n"}, "status": {"conditions": conditions}}),
        )
        .unwrap()
    }

    const T0: Timestamp = Timestamp::UNIX_EPOCH;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn mcm_drains_only_where_its_signal_is_named_and_its_condition_stands() {
        let mcm = UpdateSignals(vec!["gardener-mcm".parse().unwrap()]);
        let d = of(&node(Some("2026-11-28T10:00:00Z"), None), &mcm, T0).unwrap();
        assert_eq!(
            (d.since, d.timeout, d.not_ready_since),
            (at("2026-11-28T10:00:00Z"), Duration::from_secs(7200), None)
        );
        assert_eq!(d.stops_waiting_at(), at("2026-11-28T12:00:00Z"));
        assert_eq!(of(&node(None, None), &mcm, T0), None, "no condition");
        assert_eq!(
            of(&node(Some("2026-11-28T10:00:00Z"), None), &UpdateSignals::default(), T0),
            None,
            "not named"
        );
        let nr = of(&node(Some("2026-11-28T10:00:00Z"), Some("2026-11-28T10:30:00Z")), &mcm, T0).unwrap();
        assert_eq!(nr.not_ready_since, Some(at("2026-11-28T10:30:00Z")));
    }

    #[test]
    fn the_host_is_told_how_long_it_has_warned_before_and_told_when_the_tool_forces() {
        let mcm = UpdateSignals(vec!["gardener-mcm".parse().unwrap()]);
        let d = of(&node(Some("2026-11-28T10:00:00Z"), None), &mcm, T0).unwrap();
        let rows = [
            ("10:10:00", false, Stage::Waits { left: Duration::from_secs(110 * 60) }),
            ("11:30:00", false, Stage::Near { left: Duration::from_secs(30 * 60) }),
            ("11:59:59", false, Stage::Near { left: Duration::from_secs(1) }),
            ("12:00:00", false, Stage::Forces("its drain timeout has passed")),
            ("13:00:00", false, Stage::Forces("its drain timeout has passed")),
            ("13:00:00", true, Stage::Emptied),
        ];
        for (now, emptied, want) in rows {
            assert_eq!(stage(&d, emptied, at(&format!("2026-11-28T{now}Z"))), want, "{now}");
        }
        // NotReady for more than 5 minutes: forced long before the timeout.
        let nr = of(&node(Some("2026-11-28T10:00:00Z"), Some("2026-11-28T10:10:00Z")), &mcm, T0).unwrap();
        assert!(matches!(stage(&nr, false, at("2026-11-28T10:14:59Z")), Stage::Waits { .. }));
        assert_eq!(
            stage(&nr, false, at("2026-11-28T10:15:00Z")),
            Stage::Forces("the Node has been NotReady for more than 5 minutes")
        );
        // A timeout shorter than the warning is near from its start.
        let short = of(
            &node(Some("2026-11-28T10:00:00Z"), None),
            &UpdateSignals(vec!["gardener-mcm:20m".parse().unwrap()]),
            T0,
        )
        .unwrap();
        assert!(matches!(stage(&short, false, at("2026-11-28T10:00:01Z")), Stage::Near { .. }));
        // Out of all proportion: the end of time, never a panic.
        let mut far = d.clone();
        far.since = Timestamp::MAX;
        assert_eq!(far.stops_waiting_at(), Timestamp::MAX);
        assert!(matches!(stage(&far, false, at("2026-11-28T10:00:00Z")), Stage::Waits { .. }));
        far.timeout = Duration::MAX;
        assert_eq!(far.stops_waiting_at(), Timestamp::MAX);
        // No transition time: counted from when it was first seen.
        let mut bare = node(Some("2026-11-28T10:00:00Z"), None);
        if let Some(c) = bare.status.as_mut().and_then(|s| s.conditions.as_mut()) {
            c[0].last_transition_time = None;
        }
        assert_eq!(of(&bare, &mcm, at("2026-11-28T11:00:00Z")).unwrap().since, at("2026-11-28T11:00:00Z"));
    }

    #[test]
    fn the_condition_says_when_the_tool_stops_waiting_and_what_is_left() {
        let mcm = UpdateSignals(vec!["gardener-mcm".parse().unwrap()]);
        let d = of(&node(Some("2026-11-28T10:00:00Z"), None), &mcm, T0).unwrap();
        let c = condition(Some(&d), Some(&Stage::Waits { left: Duration::from_secs(6000) }), Some(3), false)
            .unwrap();
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, WAITS));
        assert!(
            c.message.contains("until 2026-11-28T12:00:00Z, 1h40m from now") && c.message.contains("3 VMs"),
            "{}",
            c.message
        );
        let c = condition(Some(&d), Some(&Stage::Near { left: Duration::from_secs(600) }), Some(3), true)
            .unwrap();
        assert_eq!(c.reason, NEAR);
        let c =
            condition(Some(&d), Some(&Stage::Forces("its drain timeout has passed")), None, true).unwrap();
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, FORCES));
        let c = condition(Some(&d), Some(&Stage::Emptied), Some(0), true).unwrap();
        assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, EMPTIED));
        // No drain: said False only where it was said before.
        assert_eq!(condition(None, None, None, false), None);
        assert_eq!(condition(None, None, None, true).map(|c| c.reason), Some(NOT_DRAINING.to_string()));
    }
}
