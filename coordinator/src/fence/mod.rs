//! Fencing a dead host: making sure it can no longer touch its VMs' disks
//! before they are rebuilt elsewhere (docs/fencing.md).
//!
//! Each step is an actuator behind a narrow trait, so the decision of what
//! to fence and when stays pure and a site plugs in the hardware it has.
//! A step counts only once it is confirmed by reading the state back: a BMC
//! that accepted "power off" has not yet powered anything off.

pub mod ceph;
pub mod decide;
pub mod redfish;

use std::future::Future;
use std::time::{Duration, Instant};

pub use ceph::{CephFence, CephFenceError};
pub use redfish::{Bmc, Redfish};

/// A machine's power, as its BMC reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    /// Anything else the BMC says (absent, or a value Redfish does not define).
    Unknown(String),
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PowerState::On => f.write_str("On"),
            PowerState::Off => f.write_str("Off"),
            PowerState::PoweringOn => f.write_str("PoweringOn"),
            PowerState::PoweringOff => f.write_str("PoweringOff"),
            PowerState::Unknown(s) => write!(f, "unknown ({s})"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    #[error(
        "BMC address {0:?} is not redfish://, redfish+https:// or redfish+http:// host[:port]/path-of-the-system"
    )]
    BadAddress(String),
    #[error("the BMC's CA certificate cannot be used: {0}")]
    BadCa(String),
    #[error("the BMC at {url} refused the credentials (HTTP {status})")]
    Refused { url: String, status: u16 },
    #[error("the BMC at {url} has no system {system} (HTTP 404)")]
    NoSystem { url: String, system: String },
    #[error("the BMC at {url} answered HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    #[error("the BMC at {url} cannot be reached: {message}")]
    Unreachable { url: String, message: String },
    #[error("the BMC at {url} answered something that is not a Redfish system: {message}")]
    Garbled { url: String, message: String },
    #[error("the BMC still reports power {last} {waited_s} s after power off was asked")]
    NotConfirmed { last: PowerState, waited_s: u64 },
}

/// A machine's power switch (seed of the actuator pattern: one small
/// interface per kind of hardware).
pub trait PowerActuator: Send + Sync {
    /// The power state the BMC reports now.
    fn power_state(&self) -> impl Future<Output = Result<PowerState, PowerError>> + Send;
    /// Asks for an immediate power off (not a graceful shutdown: a host we
    /// fence is one we no longer trust to shut down).
    fn force_off(&self) -> impl Future<Output = Result<(), PowerError>> + Send;
}

/// How a confirmed power off came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoweredOff {
    /// It was off when asked: nothing was sent.
    AlreadyOff,
    /// Power off was asked once and the BMC reported Off after this long.
    TurnedOff { after: Duration },
}

/// Powers the machine off and reads its state every `every` until the BMC
/// says Off, for at most `within`. The power off is asked once: asking
/// again restarts the wait on some BMCs, and a machine whose BMC never says
/// Off is not fenced, whatever was asked.
pub async fn power_off_confirmed<A: PowerActuator>(
    actuator: &A,
    within: Duration,
    every: Duration,
) -> Result<PoweredOff, PowerError> {
    if actuator.power_state().await? == PowerState::Off {
        return Ok(PoweredOff::AlreadyOff);
    }
    let start = Instant::now();
    actuator.force_off().await?;
    loop {
        let state = actuator.power_state().await?;
        if state == PowerState::Off {
            return Ok(PoweredOff::TurnedOff { after: start.elapsed() });
        }
        if start.elapsed() + every > within {
            return Err(PowerError::NotConfirmed { last: state, waited_s: start.elapsed().as_secs() });
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A BMC that reports the states given, one per read, then the last.
    struct Scripted {
        states: Mutex<Vec<PowerState>>,
        offs: Mutex<u32>,
    }

    impl Scripted {
        fn new(states: &[PowerState]) -> Scripted {
            Scripted { states: Mutex::new(states.iter().rev().cloned().collect()), offs: Mutex::new(0) }
        }
        fn offs(&self) -> u32 {
            *self.offs.lock().unwrap()
        }
    }

    impl PowerActuator for Scripted {
        async fn power_state(&self) -> Result<PowerState, PowerError> {
            let mut s = self.states.lock().unwrap();
            Ok(if s.len() > 1 { s.pop().unwrap() } else { s[0].clone() })
        }
        async fn force_off(&self) -> Result<(), PowerError> {
            *self.offs.lock().unwrap() += 1;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn off_is_confirmed_by_reading_it_back_and_asked_once() {
        use PowerState::*;
        let bmc = Scripted::new(&[On, On, PoweringOff, Off]);
        let done = power_off_confirmed(&bmc, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
        assert!(matches!(done, PoweredOff::TurnedOff { .. }), "{done:?}");
        assert_eq!(bmc.offs(), 1);

        let off = Scripted::new(&[Off]);
        let done = power_off_confirmed(&off, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
        assert_eq!((done, off.offs()), (PoweredOff::AlreadyOff, 0));

        let stuck = Scripted::new(&[On]);
        let err =
            power_off_confirmed(&stuck, Duration::from_secs(10), Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(err, PowerError::NotConfirmed { last: On, .. }), "{err}");
        assert_eq!(stuck.offs(), 1, "never asked twice");

        let unknown = Scripted::new(&[Unknown("null".into())]);
        let err =
            power_off_confirmed(&unknown, Duration::from_secs(3), Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().contains("unknown (null)"), "{err}");
    }
}
