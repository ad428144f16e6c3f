//! A host's power as desired state, laid out as Hive's hibernation: the
//! spec says `Running` or `Hibernating`, the status walks through stable,
//! transitional and error states, and each step is one the shell can take
//! and read back. Pure: one call decides the next state and the one step
//! to take, from what was just observed.
//!
//! Hibernating: the host must be empty (Nova and its agent, both read just
//! before), is disabled in Nova with our reason (kept in its aggregates),
//! then powered off and read Off twice. Waking: powered on and read On, its
//! agent and nova-compute back, its checks run again, then enabled.
//! Every state has a way out: an error state is left by a retry or by the
//! opposite wish, and a wish reversed midway undoes only what was done.

use std::time::Duration;

pub use crate::api::power::{DesiredPower as Desired, HostPower as State};

/// What was read just before deciding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    pub bmc: bool,
    /// The servers Nova lists on the host (None: not read).
    pub servers: Option<Vec<String>>,
    /// The domains its agent reports (None: no report).
    pub domains: Option<u32>,
    /// Disabled in Nova with our hibernation reason.
    pub disabled_by_us: bool,
    /// Disabled in Nova by anyone else (nova-compute, an SRE, another of
    /// our own holds): never written over, nor enabled by us.
    pub disabled_by_others: bool,
    /// The BMC's last confirmed reading.
    pub power: Power,
    /// Its agent connected since the host was last read Off, and its Node
    /// Ready: the machine back, not a session of before.
    pub agent_connected: bool,
    pub compute_up: bool,
    pub checks: Checks,
    /// An SRE asked to retry (`hvctl retry`) since the state was entered.
    pub retry: bool,
    /// How long the host has been in its state.
    pub in_state_for: Duration,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Power {
    #[default]
    Unread,
    /// Read Off twice, a read apart.
    Off,
    On,
    /// The power change could not be asked or read (the BMC's error).
    Failed,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Checks {
    #[default]
    NotRun,
    Running,
    Passed,
    Failed,
}

/// The one step the shell takes next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Disable the compute service with our hibernation reason.
    Disable,
    /// Power off, confirmed Off twice.
    PowerOff,
    /// Power on, confirmed On.
    PowerOn,
    /// Ask the agent for its checks.
    RunChecks,
    /// Enable the compute service we disabled (our reason only).
    Enable,
}

/// How long each wait may last before it is an error state: a power
/// change whose ask was lost (a failover, a BMC that dropped it) must not
/// leave a host waiting for ever.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From Stopping entered to the host read empty (its agent can be
    /// gone): past it, hibernation is given up and our disable undone.
    pub read_empty: Duration,
    /// From power off asked to Off read twice.
    pub power_off: Duration,
    /// From power on asked to On read.
    pub power_on: Duration,
    /// From On read to its agent and nova-compute back.
    pub agent_back: Duration,
    /// From back to its checks passed.
    pub checks: Duration,
    /// From a power change asked to asking it again while the BMC still
    /// reads the other way: the ask was lost (a failover between the
    /// state's write and the ask, a BMC that dropped it).
    pub ask_again: Duration,
}

impl Default for Limits {
    /// A BMC takes seconds to minutes to change a machine's power; a
    /// server boots in minutes; its checks take what Testing allows.
    fn default() -> Self {
        Limits {
            read_empty: Duration::from_secs(600),
            power_off: Duration::from_secs(300),
            power_on: Duration::from_secs(300),
            agent_back: Duration::from_secs(900),
            checks: Duration::from_secs(600),
            ask_again: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Next {
    pub state: State,
    pub step: Option<Step>,
    /// The `PowerState` condition's reason.
    pub reason: &'static str,
    pub message: String,
}

fn next(state: State, step: Option<Step>, reason: &'static str, message: impl Into<String>) -> Next {
    Next { state, step, reason, message: message.into() }
}

/// The next state and step, from `state`, for `desired`.
pub fn decide(desired: Desired, state: State, seen: &Seen, limits: &Limits) -> Next {
    if let Some(again) = ask_again(desired, state, seen, limits) {
        return again;
    }
    match desired {
        Desired::Hibernating => hibernate(state, seen, limits),
        Desired::Running => wake(state, seen, limits),
    }
}

/// A power change asked and still not seen after `limits.ask_again`,
/// within its bound: asked again (the shell reads the BMC first and asks
/// nothing of a machine already there or on its way), by the same rules as
/// the first ask: a power off only of an empty host disabled in Nova.
fn ask_again(desired: Desired, state: State, seen: &Seen, limits: &Limits) -> Option<Next> {
    let late = |bound: Duration| seen.in_state_for >= limits.ask_again && seen.in_state_for < bound;
    match (desired, state, seen.power) {
        (Desired::Hibernating, State::WaitingForPowerOff, Power::On)
            if late(limits.power_off)
                && seen.bmc
                && (seen.disabled_by_us || seen.disabled_by_others)
                && emptiness(seen) == Emptiness::Empty =>
        {
            Some(next(
                state,
                Some(Step::PowerOff),
                "WaitingForPowerOff",
                "still read On: power off asked again",
            ))
        }
        (Desired::Running, State::StartingMachine, Power::Off) if late(limits.power_on) && seen.bmc => {
            Some(next(state, Some(Step::PowerOn), "StartingMachine", "still read Off: power on asked again"))
        }
        _ => None,
    }
}

/// Whether the host is empty, both sources read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Emptiness {
    Empty,
    /// A source could not be read: nothing is decided on it.
    Unknown(String),
    Occupied(String),
}

pub fn emptiness(seen: &Seen) -> Emptiness {
    match (&seen.servers, seen.domains) {
        (None, _) => Emptiness::Unknown("Nova's servers on the host could not be read".into()),
        (_, None) => Emptiness::Unknown("its agent has reported no domains".into()),
        (Some(s), _) if !s.is_empty() => {
            Emptiness::Occupied(format!("Nova lists servers on it: {}", s.join(", ")))
        }
        (_, Some(n)) if n > 0 => Emptiness::Occupied(format!("its agent reports {n} domains")),
        _ => Emptiness::Empty,
    }
}

fn hibernate(state: State, seen: &Seen, limits: &Limits) -> Next {
    use State::*;
    let stay = |why: String| next(state, None, "EmptinessUnknown", format!("not hibernated yet: {why}"));
    match state {
        Running | Unsupported if !seen.bmc => {
            next(Unsupported, None, "NoBmc", "hibernation needs a BMC to power the host on again")
        }
        Running | Unsupported | Stopping => match emptiness(seen) {
            // Not powered off yet: our disable, if any, is undone.
            _ if !seen.bmc => {
                undo(seen, "NoBmc", "hibernation needs a BMC to power the host on again".into())
            }
            Emptiness::Unknown(why) if state == Stopping && seen.in_state_for >= limits.read_empty => undo(
                seen,
                "EmptinessUnknown",
                format!("hibernation given up: {why} {} s after it began", limits.read_empty.as_secs()),
            ),
            Emptiness::Unknown(why) => stay(why),
            Emptiness::Occupied(why) if state == Stopping => {
                undo(seen, "HostNotEmpty", format!("hibernation given up: {why}"))
            }
            Emptiness::Occupied(why) => next(Running, None, "HostNotEmpty", format!("not hibernated: {why}")),
            Emptiness::Empty => power_off(seen, Stopping),
        },
        // Powered on midway, or a failed start: powered off again once read
        // empty, never through Stopping (whose undo enables: this host's
        // checks have not passed since it was powered on).
        StartingMachine | WaitingForAgent | WaitingForChecks | FailedToStart => match emptiness(seen) {
            Emptiness::Empty if seen.bmc => power_off(seen, state),
            // With a server on it, it comes back through its checks instead.
            Emptiness::Occupied(why) => Next {
                reason: "HostNotEmpty",
                message: format!("hibernation given up: {why}"),
                ..wake(state, seen, limits)
            },
            // Still coming up: on, so its agent can report.
            Emptiness::Unknown(_) | Emptiness::Empty
                if matches!(state, StartingMachine | WaitingForAgent) =>
            {
                wake(state, seen, limits)
            }
            // Back, its agent gone again: kept disabled, and failed once
            // its checks are overdue.
            Emptiness::Unknown(why) if state == WaitingForChecks => match checked(seen, limits) {
                failed if failed.state == FailedToStart => failed,
                _ => stay(why),
            },
            Emptiness::Unknown(why) => stay(why),
            Emptiness::Empty => next(state, None, "NoBmc", "not hibernated: its BMC is gone; wake it"),
        },
        WaitingForPowerOff => {
            let off = next(Hibernating, None, "Hibernating", "powered off, read Off twice");
            once_off(seen, limits, off, "waiting for the BMC to read Off")
        }
        // Powered on behind our back (by hand, or a BMC restoring power):
        // back through its checks, or off again once read empty.
        Hibernating if seen.power == Power::On || seen.agent_connected => next(
            WaitingForAgent,
            None,
            "PoweredOnElsewhere",
            "powered on while hibernated, not by us: read again, powered off once empty",
        ),
        Hibernating => next(Hibernating, None, "Hibernating", "powered off"),
        // Retried: its emptiness read again before power off is asked
        // again. Never enabled from here: a power off that failed may have
        // left it half down; waking takes it through its checks.
        FailedToStop if seen.retry => match emptiness(seen) {
            Emptiness::Empty if seen.bmc => power_off(seen, FailedToStop),
            Emptiness::Empty => next(FailedToStop, None, "NoBmc", "not retried: its BMC is gone; wake it"),
            Emptiness::Unknown(why) | Emptiness::Occupied(why) => {
                next(FailedToStop, None, "FailedToStop", format!("not retried: {why}; wake it"))
            }
        },
        FailedToStop => {
            next(FailedToStop, None, "FailedToStop", "the BMC did not power the host off; retry or wake it")
        }
    }
}

/// An empty host with a BMC: powered off once disabled in Nova (by us,
/// or already by its owner, whose disable is never written over); until
/// then disabled by us, staying in `disabling` (Stopping before any power
/// change).
fn power_off(seen: &Seen, disabling: State) -> Next {
    if seen.disabled_by_us || seen.disabled_by_others {
        return next(
            State::WaitingForPowerOff,
            Some(Step::PowerOff),
            "WaitingForPowerOff",
            "disabled and empty: powering off",
        );
    }
    next(disabling, Some(Step::Disable), "Stopping", "empty: disabling it in Nova")
}

/// A power off asked: `off` once the BMC reads Off; an error once it
/// refuses or the bound passes; else still waiting.
fn once_off(seen: &Seen, limits: &Limits, off: Next, waiting: &'static str) -> Next {
    use State::*;
    match seen.power {
        Power::Off => off,
        Power::Failed => next(FailedToStop, None, "FailedToStop", "the BMC did not power the host off"),
        Power::On | Power::Unread if seen.in_state_for >= limits.power_off => next(
            FailedToStop,
            None,
            "FailedToStop",
            format!("not read Off {} s after power off was asked", limits.power_off.as_secs()),
        ),
        Power::On | Power::Unread => next(WaitingForPowerOff, None, "WaitingForPowerOff", waiting),
    }
}

/// Back to Running before any power change: our disable undone.
fn undo(seen: &Seen, reason: &'static str, message: String) -> Next {
    next(State::Running, seen.disabled_by_us.then_some(Step::Enable), reason, message)
}

fn wake(state: State, seen: &Seen, limits: &Limits) -> Next {
    use State::*;
    match state {
        Running | Unsupported => next(Running, None, "Running", "running"),
        // Not powered off yet: only our disable is undone.
        Stopping => undo(seen, "Running", "hibernation called off".into()),
        // A power off asked may still land: powered on only once read Off
        // (a power on that a late power off undoes would leave an enabled
        // host dark).
        WaitingForPowerOff => {
            let off = next(StartingMachine, Some(Step::PowerOn), "StartingMachine", "read Off: powering on");
            once_off(seen, limits, off, "woken while powering off: powered on once the BMC reads Off")
        }
        Hibernating | FailedToStop => {
            next(StartingMachine, Some(Step::PowerOn), "StartingMachine", "powering on")
        }
        StartingMachine => match seen.power {
            Power::On => next(
                WaitingForAgent,
                None,
                "WaitingForAgent",
                "powered on: waiting for its agent and nova-compute",
            ),
            Power::Failed => next(FailedToStart, None, "FailedToStart", "the BMC did not power the host on"),
            Power::Off | Power::Unread if seen.in_state_for >= limits.power_on => next(
                FailedToStart,
                None,
                "FailedToStart",
                format!("not read On {} s after power on was asked", limits.power_on.as_secs()),
            ),
            Power::Off | Power::Unread => {
                next(StartingMachine, None, "StartingMachine", "waiting for the BMC to read On")
            }
        },
        WaitingForAgent if seen.agent_connected && seen.compute_up => {
            next(WaitingForChecks, Some(Step::RunChecks), "WaitingForChecks", "back: running its checks")
        }
        WaitingForAgent if seen.in_state_for >= limits.agent_back => {
            let missing = match (seen.agent_connected, seen.compute_up) {
                (false, false) => "its agent and nova-compute",
                (false, true) => "its agent",
                _ => "nova-compute",
            };
            let waited = limits.agent_back.as_secs();
            next(FailedToStart, None, "AgentNotBack", format!("{missing} not back {waited} s after power on"))
        }
        WaitingForAgent => {
            next(WaitingForAgent, None, "WaitingForAgent", "waiting for its agent and nova-compute")
        }
        WaitingForChecks => checked(seen, limits),
        FailedToStart if seen.retry => {
            next(StartingMachine, Some(Step::PowerOn), "StartingMachine", "retried: powering on")
        }
        FailedToStart => next(
            FailedToStart,
            None,
            "FailedToStart",
            "the host did not come back; retry to power it on again",
        ),
    }
}

/// Back in service once its checks pass: enabled where we disabled it; a
/// disable of its owner's stands.
fn checked(seen: &Seen, limits: &Limits) -> Next {
    use State::*;
    match seen.checks {
        Checks::Passed if seen.disabled_by_us => {
            next(Running, Some(Step::Enable), "Running", "its checks passed: enabled")
        }
        Checks::Passed => next(Running, None, "Running", "its checks passed; its owner's disable stands"),
        Checks::Failed => next(FailedToStart, None, "ChecksFailed", "its checks failed after power on"),
        Checks::NotRun | Checks::Running if seen.in_state_for >= limits.checks => next(
            FailedToStart,
            None,
            "ChecksNotDone",
            format!("its checks not done {} s after it came back", limits.checks.as_secs()),
        ),
        Checks::NotRun => {
            next(WaitingForChecks, Some(Step::RunChecks), "WaitingForChecks", "running its checks")
        }
        Checks::Running => next(WaitingForChecks, None, "WaitingForChecks", "its checks are running"),
    }
}

#[cfg(test)]
#[path = "machine/tests.rs"]
mod tests;
