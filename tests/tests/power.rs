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
use hv_tests::bmc::{Watched, bmc_of as bmc};

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

    let watched = Watched::new(&r);
    let t = Instant::now();
    let done =
        power_on_confirmed(&watched, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    let PoweredOn::TurnedOn { after } = done else { panic!("it was off: {done:?}") };
    // Asked once; every state read before the BMC said On was Off (the
    // emulator lands the change up to 11 s later); bounded.
    let seen = watched.seen();
    assert_eq!((watched.ons(), watched.offs()), (1, 0));
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
