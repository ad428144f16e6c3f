//! Fencing a dead host: making sure it can no longer touch its VMs' disks
//! before they are rebuilt elsewhere (docs/fencing.md).
//!
//! Each step is an actuator behind a narrow trait, so the decision of what
//! to fence and when stays pure and a site plugs in the hardware it has.
//! A step counts only once it is confirmed by reading the state back: a BMC
//! that accepted "power off" has not yet powered anything off.

pub mod ceph;
pub mod clear;
pub mod decide;
pub mod record;
pub mod redfish;
pub mod retire;
pub mod signs;
pub mod targets;

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
    #[error("the BMC still reports power {last} {waited_s} s after power {wanted} was asked")]
    NotConfirmed { wanted: PowerState, last: PowerState, waited_s: u64 },
    /// Not asked: this replica did not hold the leader lease at that moment.
    #[error("power change not asked: {0}")]
    NotLeader(String),
}

/// The first three fields of a UUID byte-swapped: how SMBIOS before 2.6
/// stored them, and how some BMCs still show a machine's UUID that Linux
/// reads the other way round.
fn swapped(uuid: &str) -> Option<String> {
    let parts: Vec<&str> = uuid.split('-').collect();
    let [a, b, c, d, e] = parts[..] else { return None };
    let swap = |f: &str| -> Option<String> {
        let bytes: Vec<&str> = (0..f.len()).step_by(2).map(|i| f.get(i..i + 2)).collect::<Option<_>>()?;
        Some(bytes.into_iter().rev().collect())
    };
    Some(format!("{}-{}-{}-{d}-{e}", swap(a)?, swap(b)?, swap(c)?))
}

/// A system UUID firmware that never set one reports (all zeros, all
/// ones, or the well-known placeholder of many boards), in either byte
/// order: shared by many machines, it identifies none. Pure.
pub fn placeholder_uuid(uuid: &str) -> bool {
    let u = uuid.trim().to_ascii_lowercase();
    let digits: String = u.chars().filter(|c| *c != '-').collect();
    const KNOWN: &str = "03000200-0400-0500-0006-000700080009";
    digits.chars().all(|c| c == '0')
        || digits.chars().all(|c| c == 'f')
        || u == KNOWN
        || swapped(KNOWN).is_some_and(|s| s == u)
}

/// Whether the machine a BMC speaks for is the host: its system UUID
/// (`bmc`) against the one the host's agent reported (`host`), either
/// byte order of the first fields. Anything short of that is a reason
/// not to trust the BMC: a BMC address copied from another machine must
/// neither power that machine off nor make this host look dead. Pure.
pub fn same_machine(host: Option<&str>, bmc: Option<&str>) -> Result<(), String> {
    // A placeholder stands for no machine, whichever side says it.
    let host = host.filter(|u| !placeholder_uuid(u));
    let bmc = bmc.filter(|u| !placeholder_uuid(u));
    let Some(host) = host.map(str::to_ascii_lowercase) else {
        return Err(
            "the host's system UUID was never reported by its agent: its BMC cannot be checked to be \
                    the host's"
                .into(),
        );
    };
    let Some(bmc) = bmc.map(str::to_ascii_lowercase) else {
        return Err("the BMC reports no UUID for its system: it cannot be checked to be the host's".into());
    };
    if bmc == host || swapped(&bmc).as_deref() == Some(host.as_str()) {
        return Ok(());
    }
    Err(format!("the BMC's system is {bmc}, the host is {host}: spec.fencing.bmc names another machine"))
}

/// A machine's power switch (seed of the actuator pattern: one small
/// interface per kind of hardware).
pub trait PowerActuator: Send + Sync {
    /// The power state the BMC reports now.
    fn power_state(&self) -> impl Future<Output = Result<PowerState, PowerError>> + Send;
    /// Asks for an immediate power off (not a graceful shutdown: a host we
    /// fence is one we no longer trust to shut down).
    fn force_off(&self) -> impl Future<Output = Result<(), PowerError>> + Send;
    /// Asks for the machine to power on (a hibernated host woken; never
    /// part of fencing).
    fn power_on(&self) -> impl Future<Output = Result<(), PowerError>> + Send;
}

/// An actuator that asks for nothing unless `may_act` says so at that
/// moment (the shell: the leader lease held): a power step that began
/// under the lease does not power a host off after the lease lapsed in
/// its reads. Reading is always let through.
pub struct Guarded<'a, A, F> {
    pub inner: &'a A,
    pub may_act: F,
}

impl<A: PowerActuator, F: Fn() -> Result<(), String> + Send + Sync> PowerActuator for Guarded<'_, A, F> {
    fn power_state(&self) -> impl Future<Output = Result<PowerState, PowerError>> + Send {
        self.inner.power_state()
    }

    async fn force_off(&self) -> Result<(), PowerError> {
        (self.may_act)().map_err(PowerError::NotLeader)?;
        self.inner.force_off().await
    }

    async fn power_on(&self) -> Result<(), PowerError> {
        (self.may_act)().map_err(PowerError::NotLeader)?;
        self.inner.power_on().await
    }
}

/// `first`, a state just read, and when it is Off the state read again
/// `gap` later: one read of a BMC mid-reset, or a glitch, is not a power
/// loss, and a host is never judged dead on one.
pub async fn read_again_if_off<A: PowerActuator>(
    actuator: &A,
    first: PowerState,
    gap: Duration,
) -> Result<PowerState, PowerError> {
    if first != PowerState::Off {
        return Ok(first);
    }
    tokio::time::sleep(gap).await;
    actuator.power_state().await
}

/// How a confirmed power off came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoweredOff {
    /// It was off when asked: nothing was sent.
    AlreadyOff,
    /// Power off was asked once and the BMC reported Off (twice) after this
    /// long.
    TurnedOff { after: Duration },
}

/// Powers the machine off and reads its state every `every` until the BMC
/// says Off twice in a row, for at most `within`. The power off is asked once: asking
/// again restarts the wait on some BMCs, and a machine whose BMC never says
/// Off is not fenced, whatever was asked. A BMC busy with the change may
/// not answer a read for a while, and a power off whose answer was lost may
/// have been taken: both are read on until `within`.
pub async fn power_off_confirmed<A: PowerActuator>(
    actuator: &A,
    within: Duration,
    every: Duration,
) -> Result<PoweredOff, PowerError> {
    // Off read twice, a read apart: one read of a BMC mid-reset is not a
    // machine off, and nothing would be asked of it.
    let first = actuator.power_state().await?;
    if read_again_if_off(actuator, first, every).await? == PowerState::Off {
        return Ok(PoweredOff::AlreadyOff);
    }
    let start = Instant::now();
    let asked = match actuator.force_off().await {
        Ok(()) => None,
        Err(e @ PowerError::Unreachable { .. }) => Some(e),
        Err(e) => return Err(e),
    };
    let (mut last_state, mut last_error) = (None, None);
    loop {
        // Off read twice, a read apart, as when it was off already: a
        // power-restore policy or a BMC mid-reset must not pass for off.
        let read = match actuator.power_state().await {
            Ok(PowerState::Off) => read_again_if_off(actuator, PowerState::Off, every).await,
            other => other,
        };
        match read {
            Ok(PowerState::Off) => return Ok(PoweredOff::TurnedOff { after: start.elapsed() }),
            Ok(state) => last_state = Some(state),
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() + every > within {
            let waited_s = start.elapsed().as_secs();
            return Err(unconfirmed(PowerState::Off, asked, last_state, last_error, waited_s));
        }
        tokio::time::sleep(every).await;
    }
}

/// What a power change not read back within its bound says: the ask's
/// lost answer first (it may never have been taken), else the last state
/// read, else the last read's error.
pub fn unconfirmed(
    wanted: PowerState,
    asked: Option<PowerError>,
    last_state: Option<PowerState>,
    last_error: Option<PowerError>,
    waited_s: u64,
) -> PowerError {
    match (asked, last_state, last_error) {
        (Some(e), _, _) => e,
        (None, Some(last), _) => PowerError::NotConfirmed { wanted, last, waited_s },
        (None, None, Some(e)) => e,
        (None, None, None) => {
            PowerError::NotConfirmed { wanted, last: PowerState::Unknown("no answer".into()), waited_s }
        }
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
        async fn power_on(&self) -> Result<(), PowerError> {
            panic!("fencing never powers a machine on")
        }
    }

    #[test]
    fn a_bmc_counts_only_for_the_machine_whose_uuid_it_reports() {
        let host = "4c4c4544-0042-3510-8051-b4c04f4e3332";
        assert_eq!(same_machine(Some(host), Some("4C4C4544-0042-3510-8051-B4C04F4E3332")), Ok(()));
        // SMBIOS's older byte order of the first three fields.
        assert_eq!(same_machine(Some(host), Some("44454c4c-4200-1035-8051-b4c04f4e3332")), Ok(()));
        let other = same_machine(Some(host), Some("4c4c4544-0042-3510-8051-b4c04f4e3333")).unwrap_err();
        assert!(other.contains("names another machine"), "{other}");
        assert!(same_machine(None, Some(host)).unwrap_err().contains("never reported"));
        assert!(same_machine(Some(host), None).unwrap_err().contains("no UUID"));
        assert!(same_machine(Some(host), Some("garbage")).is_err());
        // A placeholder matches nothing, not even itself, in either byte order.
        for p in [
            "03000200-0400-0500-0006-000700080009",
            "00020003-0004-0005-0006-000700080009",
            "00000000-0000-0000-0000-000000000000",
        ] {
            assert!(placeholder_uuid(p), "{p}");
            assert!(same_machine(Some(p), Some(p)).is_err(), "{p}");
        }
        assert!(!placeholder_uuid(host));
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

    #[tokio::test(start_paused = true)]
    async fn nothing_is_powered_off_once_the_lease_lapsed_mid_step() {
        use PowerState::*;
        let bmc = Scripted::new(&[On]);
        let lapsed = Guarded { inner: &bmc, may_act: || Err("the leader lease lapsed".to_string()) };
        let err =
            power_off_confirmed(&lapsed, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(err, PowerError::NotLeader(_)), "{err}");
        assert_eq!(bmc.offs(), 0, "not asked");
        // Held: asked, as without the guard.
        let bmc = Scripted::new(&[On, Off]);
        let held = Guarded { inner: &bmc, may_act: || Ok(()) };
        power_off_confirmed(&held, Duration::from_secs(30), Duration::from_secs(1)).await.unwrap();
        assert_eq!(bmc.offs(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_off_counts_only_when_read_twice() {
        use PowerState::*;
        let gap = Duration::from_secs(1);
        let glitch = Scripted::new(&[On]);
        assert_eq!(read_again_if_off(&glitch, Off, gap).await.unwrap(), On);
        let off = Scripted::new(&[Off]);
        assert_eq!(read_again_if_off(&off, Off, gap).await.unwrap(), Off);
        // On is answered at once, not read again.
        let never = Scripted::new(&[Unknown("not read".into())]);
        let t = tokio::time::Instant::now();
        assert_eq!(read_again_if_off(&never, On, gap).await.unwrap(), On);
        assert!(t.elapsed() < gap);
    }

    /// A BMC that does not answer some reads, or the power off itself.
    struct Busy {
        reads: Mutex<u32>,
        silent_reads: std::ops::Range<u32>,
        off_lost: bool,
    }

    impl PowerActuator for Busy {
        async fn power_state(&self) -> Result<PowerState, PowerError> {
            let mut n = self.reads.lock().unwrap();
            *n += 1;
            if self.silent_reads.contains(&*n) {
                return Err(PowerError::Unreachable { url: "bmc".into(), message: "timed out".into() });
            }
            Ok(if *n >= 5 { PowerState::Off } else { PowerState::On })
        }
        async fn force_off(&self) -> Result<(), PowerError> {
            if self.off_lost {
                return Err(PowerError::Unreachable { url: "bmc".into(), message: "reset".into() });
            }
            Ok(())
        }
        async fn power_on(&self) -> Result<(), PowerError> {
            panic!("fencing never powers a machine on")
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_read_of_off_between_two_of_on_is_no_power_off() {
        let (within, every) = (Duration::from_secs(10), Duration::from_secs(1));
        let restored = Scripted::new(&[PowerState::On, PowerState::Off, PowerState::On]);
        let err = power_off_confirmed(&restored, within, every).await.unwrap_err();
        assert!(matches!(err, PowerError::NotConfirmed { last: PowerState::On, .. }), "{err:?}");
        assert_eq!(restored.offs(), 1, "asked once");
        let settles = Scripted::new(&[PowerState::On, PowerState::Off, PowerState::On, PowerState::Off]);
        let done = power_off_confirmed(&settles, within, every).await.unwrap();
        assert!(matches!(done, PoweredOff::TurnedOff { .. }), "{done:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_bmc_silent_for_a_while_or_an_answer_lost_is_read_on_until_it_says_off() {
        let (within, every) = (Duration::from_secs(30), Duration::from_secs(1));
        let busy = Busy { reads: Mutex::new(0), silent_reads: 2..4, off_lost: false };
        assert!(matches!(power_off_confirmed(&busy, within, every).await, Ok(PoweredOff::TurnedOff { .. })));
        let lost = Busy { reads: Mutex::new(0), silent_reads: 0..0, off_lost: true };
        assert!(matches!(power_off_confirmed(&lost, within, every).await, Ok(PoweredOff::TurnedOff { .. })));
        // Never off, the power off's answer lost: that is what is said.
        let never = Scripted::new(&[PowerState::On]);
        struct Lost<'a>(&'a Scripted);
        impl PowerActuator for Lost<'_> {
            async fn power_state(&self) -> Result<PowerState, PowerError> {
                self.0.power_state().await
            }
            async fn force_off(&self) -> Result<(), PowerError> {
                Err(PowerError::Unreachable { url: "bmc".into(), message: "reset".into() })
            }
            async fn power_on(&self) -> Result<(), PowerError> {
                panic!("fencing never powers a machine on")
            }
        }
        let err = power_off_confirmed(&Lost(&never), Duration::from_secs(5), every).await.unwrap_err();
        assert!(matches!(err, PowerError::Unreachable { .. }), "{err}");
        // A refusal is final at once.
        struct Refusing;
        impl PowerActuator for Refusing {
            async fn power_state(&self) -> Result<PowerState, PowerError> {
                Ok(PowerState::On)
            }
            async fn force_off(&self) -> Result<(), PowerError> {
                Err(PowerError::Refused { url: "bmc".into(), status: 403 })
            }
            async fn power_on(&self) -> Result<(), PowerError> {
                panic!("fencing never powers a machine on")
            }
        }
        let t = tokio::time::Instant::now();
        let err = power_off_confirmed(&Refusing, within, every).await.unwrap_err();
        assert!(matches!(err, PowerError::Refused { .. }) && t.elapsed() < every, "{err}");
    }
}
