//! Power as desired state against the real peers (docs/power.md): the
//! Redfish BMC emulator (sushy-tools, fake driver: a power change lands up
//! to 11 s after it is asked) powers a claimed host's system on only when
//! asked, and the wake counts only once the BMC reads On.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_coordinator::fence::{
    Bmc, PowerActuator, PowerError, PowerState, PoweredOff, Redfish, power_off_confirmed,
};
use hv_coordinator::power::{PoweredOn, power_on_confirmed};
use hv_tests::env::TestEnv;

fn bmc(env: &TestEnv, host: &str) -> Bmc {
    Bmc {
        address: env.bmc.address(host),
        username: env.bmc.username.clone(),
        password: env.bmc.password.clone(),
        ca_pem: Some(std::fs::read(&env.bmc.ca_file).unwrap()),
        insecure: false,
        timeout: Duration::from_secs(5),
    }
}

/// The actuator under test, with what it read and how often it asked.
struct Watched<'a> {
    inner: &'a Redfish,
    seen: std::sync::Mutex<Vec<PowerState>>,
    ons: std::sync::atomic::AtomicU32,
}

impl PowerActuator for Watched<'_> {
    async fn power_state(&self) -> Result<PowerState, PowerError> {
        let state = self.inner.power_state().await?;
        self.seen.lock().unwrap().push(state.clone());
        Ok(state)
    }
    async fn force_off(&self) -> Result<(), PowerError> {
        panic!("waking never powers a machine off")
    }
    async fn power_on(&self) -> Result<(), PowerError> {
        self.ons.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.power_on().await
    }
}

#[tokio::test]
async fn a_machine_off_is_powered_on_once_and_counted_on_only_when_the_bmc_says_so() {
    let env = hv_tests::env::require();
    let claim = hv_tests::hosts::claim(&env).await;
    let r = Redfish::new(&bmc(&env, &claim.host)).unwrap();
    // A claim's own power on may still be landing: it is on, then off.
    let up = power_on_confirmed(&r, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    assert!(matches!(up, PoweredOn::AlreadyOn | PoweredOn::TurnedOn { .. }), "{up:?}");
    let off = power_off_confirmed(&r, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    assert!(matches!(off, PoweredOff::TurnedOff { .. }), "{off:?}");

    let watched = Watched { inner: &r, seen: std::sync::Mutex::new(Vec::new()), ons: Default::default() };
    let t = Instant::now();
    let done =
        power_on_confirmed(&watched, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    let PoweredOn::TurnedOn { after } = done else { panic!("it was off: {done:?}") };
    // Asked once; every state read before the BMC said On was Off (the
    // emulator lands the change up to 11 s later); bounded.
    let seen = watched.seen.into_inner().unwrap();
    assert_eq!(watched.ons.load(std::sync::atomic::Ordering::Relaxed), 1);
    let (last, before) = seen.split_last().unwrap();
    assert_eq!(*last, PowerState::On, "{seen:?}");
    assert!(!before.is_empty() && before.iter().all(|s| *s == PowerState::Off), "{seen:?}");
    assert!(after < Duration::from_secs(13) && t.elapsed() < Duration::from_secs(15), "{after:?}");
    // On: nothing more is asked.
    assert_eq!(
        power_on_confirmed(&r, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap(),
        PoweredOn::AlreadyOn
    );
}

#[tokio::test]
async fn a_refused_password_is_told_before_anything_is_asked() {
    let env = hv_tests::env::require();
    let claim = hv_tests::hosts::claim(&env).await;
    let wrong = Bmc { password: "not-it".into(), ..bmc(&env, &claim.host) };
    let err = Redfish::new(&wrong).unwrap().power_on().await.unwrap_err();
    assert!(matches!(err, PowerError::Refused { status: 401, .. }), "{err}");
    let err =
        power_on_confirmed(&Redfish::new(&wrong).unwrap(), Duration::from_secs(5), Duration::from_secs(1))
            .await
            .unwrap_err();
    assert!(matches!(err, PowerError::Refused { .. }), "{err}");
}
