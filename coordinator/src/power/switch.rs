//! Powering a hibernated host on, confirmed by reading its BMC back: a BMC
//! that accepted "power on" has not yet powered anything on.

use std::time::Duration;

use tokio::time::Instant;

use crate::fence::{PowerActuator, PowerError, PowerState, unconfirmed};

/// How a confirmed power on came about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoweredOn {
    /// It was on when asked: nothing was sent.
    AlreadyOn,
    /// Power on was asked once and the BMC reported On after this long.
    TurnedOn { after: Duration },
}

/// Powers the machine on and reads its state every `every` until the BMC
/// says On, for at most `within`. Asked once, as power off is: asking again
/// restarts the boot on some BMCs. A read or the ask itself that goes
/// unanswered is read on until `within` (the ask may have been taken); a
/// refusal is final at once.
pub async fn power_on_confirmed<A: PowerActuator>(
    actuator: &A,
    within: Duration,
    every: Duration,
) -> Result<PoweredOn, PowerError> {
    let first = actuator.power_state().await?;
    if first == PowerState::On {
        return Ok(PoweredOn::AlreadyOn);
    }
    let start = Instant::now();
    // Already powering on (an earlier ask, or a leader before us): waited
    // for, not asked again.
    let asked = match first {
        PowerState::PoweringOn => None,
        _ => match actuator.power_on().await {
            Ok(()) => None,
            Err(e @ PowerError::Unreachable { .. }) => Some(e),
            Err(e) => return Err(e),
        },
    };
    let (mut last_state, mut last_error) = (None, None);
    loop {
        match actuator.power_state().await {
            Ok(PowerState::On) => return Ok(PoweredOn::TurnedOn { after: start.elapsed() }),
            Ok(state) => last_state = Some(state),
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() + every > within {
            let waited_s = start.elapsed().as_secs();
            return Err(unconfirmed(PowerState::On, asked, last_state, last_error, waited_s));
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A BMC that reports the states given, one per read, then the last;
    /// counts the power ons asked, and answers them as `answer` says.
    struct Scripted {
        states: Mutex<Vec<Result<PowerState, PowerError>>>,
        ons: Mutex<u32>,
        answer: fn() -> Result<(), PowerError>,
    }

    fn unreachable() -> PowerError {
        PowerError::Unreachable { url: "bmc".into(), message: "timed out".into() }
    }

    impl Scripted {
        fn new(states: Vec<Result<PowerState, PowerError>>, answer: fn() -> Result<(), PowerError>) -> Self {
            Scripted { states: Mutex::new(states.into_iter().rev().collect()), ons: Mutex::new(0), answer }
        }
        fn ons(&self) -> u32 {
            *self.ons.lock().unwrap()
        }
    }

    impl PowerActuator for Scripted {
        async fn power_state(&self) -> Result<PowerState, PowerError> {
            let mut s = self.states.lock().unwrap();
            match s.len() {
                0 => Ok(PowerState::Unknown("script ended".into())),
                1 => match &s[0] {
                    Ok(state) => Ok(state.clone()),
                    Err(_) => Err(unreachable()),
                },
                _ => s.pop().unwrap(),
            }
        }
        async fn force_off(&self) -> Result<(), PowerError> {
            panic!("waking never powers a machine off")
        }
        async fn power_on(&self) -> Result<(), PowerError> {
            *self.ons.lock().unwrap() += 1;
            (self.answer)()
        }
    }

    const WITHIN: Duration = Duration::from_secs(30);
    const EVERY: Duration = Duration::from_secs(1);

    #[tokio::test(start_paused = true)]
    async fn on_is_asked_once_and_confirmed_by_reading_it_back() {
        use PowerState::*;
        let bmc = Scripted::new(vec![Ok(Off), Ok(Off), Ok(PoweringOn), Ok(On)], || Ok(()));
        let done = power_on_confirmed(&bmc, WITHIN, EVERY).await.unwrap();
        assert_eq!(done, PoweredOn::TurnedOn { after: 2 * EVERY });
        assert_eq!(bmc.ons(), 1);

        let on = Scripted::new(vec![Ok(On)], || Ok(()));
        assert_eq!(power_on_confirmed(&on, WITHIN, EVERY).await.unwrap(), PoweredOn::AlreadyOn);
        assert_eq!(on.ons(), 0, "nothing asked of a machine on");

        let booting = Scripted::new(vec![Ok(PoweringOn), Ok(PoweringOn), Ok(On)], || Ok(()));
        assert!(matches!(power_on_confirmed(&booting, WITHIN, EVERY).await, Ok(PoweredOn::TurnedOn { .. })));
        assert_eq!(booting.ons(), 0, "a machine powering on is not asked again");

        let stuck = Scripted::new(vec![Ok(Off)], || Ok(()));
        let err = power_on_confirmed(&stuck, Duration::from_secs(10), EVERY).await.unwrap_err();
        assert!(matches!(err, PowerError::NotConfirmed { wanted: On, last: Off, .. }), "{err:?}");
        assert!(err.to_string().contains("after power On was asked"), "{err}");
        assert_eq!(stuck.ons(), 1, "never asked twice");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_bmc_or_a_lost_answer_is_read_on_and_a_refusal_is_final() {
        use PowerState::*;
        let busy = Scripted::new(vec![Ok(Off), Err(unreachable()), Err(unreachable()), Ok(On)], || Ok(()));
        assert!(matches!(power_on_confirmed(&busy, WITHIN, EVERY).await, Ok(PoweredOn::TurnedOn { .. })));
        let lost = Scripted::new(vec![Ok(Off), Ok(Off), Ok(On)], || Err(unreachable()));
        assert!(matches!(power_on_confirmed(&lost, WITHIN, EVERY).await, Ok(PoweredOn::TurnedOn { .. })));
        assert_eq!(lost.ons(), 1);
        // Never on, the ask's answer lost: that is what is said.
        let never = Scripted::new(vec![Ok(Off)], || Err(unreachable()));
        let err = power_on_confirmed(&never, Duration::from_secs(5), EVERY).await.unwrap_err();
        assert!(matches!(err, PowerError::Unreachable { .. }), "{err}");
        let refusing =
            Scripted::new(vec![Ok(Off)], || Err(PowerError::Refused { url: "bmc".into(), status: 403 }));
        let t = tokio::time::Instant::now();
        let err = power_on_confirmed(&refusing, WITHIN, EVERY).await.unwrap_err();
        assert!(matches!(err, PowerError::Refused { .. }) && t.elapsed() < EVERY, "{err}");
        // The state cannot be read at all: nothing is asked.
        let dark = Scripted::new(vec![Err(unreachable())], || Ok(()));
        assert!(power_on_confirmed(&dark, WITHIN, EVERY).await.is_err());
        assert_eq!(dark.ons(), 0);
    }
}
