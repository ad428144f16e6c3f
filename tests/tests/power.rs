//! Power as desired state against the real peers (docs/power.md): the
//! Redfish BMC emulator (sushy-tools, fake driver: a power change lands up
//! to 11 s after it is asked) powers a claimed host's system on only when
//! asked, and the wake counts only once the BMC reads On. A hibernation
//! and a wake of a whole host, its fake machine following the emulator's
//! power (its agent, nova-compute and kubelet stop when it reads Off).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_coordinator::api::Hypervisor;

use hv_coordinator::api::Phase;
use hv_coordinator::api::keys::HIBERNATED_LABEL;
use hv_coordinator::api::power::HostPower;
use hv_coordinator::fence::{
    Bmc, PowerActuator, PowerError, PowerState, PoweredOff, Redfish, power_off_confirmed,
};
use hv_coordinator::lifecycle::HIBERNATING_REASON;
use hv_coordinator::power::{PoweredOn, power_on_confirmed};
use hv_tests::bmc::{Watched, bmc_of as bmc, machine_follows_bmc};
use hv_tests::fencing::{fencing_coordinator, give_fencing_means, wait_power};
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, Proc, Region};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::Node;

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

/// Waits until `host`'s `status.powerState` is `want`; answers the Hypervisor.
async fn wait_power_state(region: &Region, host: &str, want: HostPower, coord: &Proc) -> Hypervisor {
    until(
        &format!("{host} {want}"),
        Duration::from_secs(180),
        || coord.tail(20),
        || async {
            let hv = region.hypervisor(host).await.unwrap();
            let (power, phase) = hv.status.as_ref().map(|s| (s.power_state, s.phase)).unwrap_or_default();
            let (_, reason, message) = Region::condition(&hv, "PowerState");
            if power == Some(want) {
                Poll::Ready(hv)
            } else {
                Poll::Pending(format!("{power:?} {phase:?} {reason}: {message}"))
            }
        },
    )
    .await
}

fn hvctl(region: &Region, verb: &str, host: &str) {
    let out = region.hvctl().args([verb, host]).output().unwrap();
    assert!(out.status.success(), "hvctl {verb}: {}", String::from_utf8_lossy(&out.stderr));
}

async fn labelled(region: &Region, host: &str) -> bool {
    let nodes: kube::Api<Node> = kube::Api::all(region.kube.client.clone());
    let node = nodes.get(host).await.unwrap();
    node.metadata.labels.unwrap_or_default().get(HIBERNATED_LABEL).is_some_and(|v| v == "true")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_host_hibernates_is_never_fenced_while_off_and_wakes_through_its_checks() {
    let region = Region::start("hibernate").await;
    let claim = hv_tests::hosts::claim(&region.env).await;
    let host = claim.host.clone();
    hv_tests::bmc::power_on(&region.env, &host).await.unwrap();
    wait_power(&region.env, &host, "On").await;
    // Short graces (a Node not Ready counts after 1 s, a silent agent after
    // 3 s): a host judged while it is off would be fenced within seconds.
    let coord = fencing_coordinator(&region, &[]);
    let admin = Admin::login(&region.env).await.unwrap();
    // Nothing on the machine, to the last domain; its agent's inventory
    // every 2 s.
    let _empty = hv_tests::hosts::WithoutDomains::take(&region.env, &host, &region.dir);
    let peers = AgentPeers { inventory_interval: Some("2s".into()), ..AgentPeers::default() };
    let steps = async {
        region.create_node(&host, &[]).await;
        let hv = region.wait_phase(&host, Phase::Active, Duration::from_secs(180), &coord).await;
        give_fencing_means(&region, &host, None).await;
        let run = hv.status.as_ref().map(|s| s.lifecycle.test_run).unwrap_or_default();
        // A member of an aggregate (one the claim's scrub takes it out of).
        let aggregate = format!("{}hibernate-{}", hv_tests::hosts::ZONE_PREFIX, region.id);
        let id = admin.create_aggregate(&aggregate).await.unwrap();
        admin.add_to_aggregate(id, &host).await.unwrap();
        let aggregates = admin.aggregates_of(&host).await.unwrap();
        assert!(aggregates.contains(&aggregate), "{aggregates:?}");

        hvctl(&region, "hibernate", &host);
        wait_power_state(&region, &host, HostPower::Hibernating, &coord).await;
        assert_eq!(hv_tests::bmc::power_state(&region.env, &host).await.unwrap(), "Off");
        assert!(labelled(&region, &host).await, "the Node is marked before the host goes");
        let service = admin.service(&host).await.unwrap().unwrap();
        assert_eq!(service["status"], "disabled");
        assert_eq!(service["disabled_reason"], HIBERNATING_REASON);
        assert_eq!(admin.aggregates_of(&host).await.unwrap(), aggregates, "kept in its aggregates");

        // Off, its kubelet and agent gone, well past every grace: never
        // judged, never fenced.
        region.wait_node_ready(&host, false).await;
        for _ in 0..15 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let hv = region.hypervisor(&host).await.unwrap();
            let status = hv.status.clone().unwrap();
            assert_eq!(
                (status.phase, status.power_state),
                (Some(Phase::Active), Some(HostPower::Hibernating))
            );
            assert!(status.fencing.is_none(), "fenced while hibernated: {:?}", status.fencing);
            let (_, _, healthy) = Region::condition(&hv, "NodeHealthy");
            assert!(healthy.contains("not judged while its power is managed"), "{healthy}");
        }
        assert_eq!(hv_tests::bmc::power_state(&region.env, &host).await.unwrap(), "Off");

        // Woken: powered on, its agent and nova-compute back, its checks
        // run again, enabled.
        hvctl(&region, "wake", &host);
        let hv = wait_power_state(&region, &host, HostPower::Running, &coord).await;
        let status = hv.status.clone().unwrap();
        assert_eq!(status.phase, Some(Phase::Active));
        assert!(
            status.lifecycle.test_run > run,
            "its checks ran again: run {run} then {}",
            status.lifecycle.test_run
        );
        let (tested, _, _) = Region::condition(&hv, "Tested");
        assert_eq!(tested, "True");
        until(
            "enabled in Nova",
            Duration::from_secs(60),
            || coord.tail(20),
            || async {
                let s = admin.service(&host).await.unwrap().unwrap();
                if s["status"] == "enabled" { Poll::Ready(()) } else { Poll::Pending(s.to_string()) }
            },
        )
        .await;
        until(
            "the Node's mark gone",
            Duration::from_secs(30),
            || coord.tail(20),
            || async {
                if labelled(&region, &host).await {
                    Poll::Pending("still marked".into())
                } else {
                    Poll::Ready(())
                }
            },
        )
        .await;
        let hv = region.hypervisor(&host).await.unwrap();
        assert!(hv.status.unwrap().fencing.is_none());
    };
    tokio::select! {
        () = machine_follows_bmc(&region, &host, &peers) => panic!("the machine stopped following its BMC"),
        () = steps => {}
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_with_a_server_refuses_to_hibernate_and_names_it() {
    let region = Region::start("hibernate-busy").await;
    let zone = hv_tests::hosts::zone(&region.env, 0).await;
    let host = zone.source.host.clone();
    hv_tests::bmc::power_on(&region.env, &host).await.unwrap();
    wait_power(&region.env, &host, "On").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let coord = region.coordinator(None, &["--skip-tests"]);
    let _agent = region.agent(&host, &AgentPeers::default());
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, Duration::from_secs(120), &coord).await;
    give_fencing_means(&region, &host, None).await;
    let server = zone.boot(&admin, &format!("{}-busy", region.id), &host, "1").await;

    hvctl(&region, "hibernate", &host);
    let message = region.wait_condition(&host, "PowerState", "HostNotEmpty", &coord).await;
    assert!(message.contains(&server), "{message}");
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.power_state), Some(HostPower::Running));
    let (scheduling, _, _) = Region::condition(&hv, "SchedulingEnabled");
    assert_eq!(scheduling, "True", "left in service");
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    assert_eq!(hv_tests::bmc::power_state(&region.env, &host).await.unwrap(), "On");
}

/// The Preflight condition of the Eviction `name`, as (reason, message).
async fn preflight_of(region: &Region, name: &str) -> Option<(String, String)> {
    let ev = region.eviction(name).await?;
    let c = ev.status?.conditions.into_iter().find(|c| c.type_ == "Preflight")?;
    Some((c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_policy_hibernates_an_empty_spare_and_wakes_it_for_an_eviction_short_of_room() {
    use hv_coordinator::api::eviction::{EvictionPhase, EvictionReason};
    use hv_coordinator::api::keys::{POWER_BY_ANNOTATION, POWER_BY_POLICY};
    use hv_coordinator::api::power::DesiredPower;
    use kube::ResourceExt;

    let region = Region::start("hibernate-policy").await;
    // A zone of two: the source, which will run a server, and a spare.
    let zone = hv_tests::hosts::zone(&region.env, 1).await;
    let (source, spare) = (zone.source.host.clone(), zone.targets[0].host.clone());
    hv_tests::bmc::power_on(&region.env, &spare).await.unwrap();
    wait_power(&region.env, &spare, "On").await;
    // Hosts empty for 5 s hibernate, no headroom asked, none kept awake:
    // only an eviction short of room wakes the spare.
    let policy = format!("zone={},hibernate-after=5s,headroom=0hosts,keep-awake=0", zone.name);
    let coord =
        fencing_coordinator(&region, &["--hibernation-policy", &policy, "--hibernation-interval", "2s"]);
    let admin = Admin::login(&region.env).await.unwrap();
    let _empty = hv_tests::hosts::WithoutDomains::take(&region.env, &spare, &region.dir);
    let peers = AgentPeers { inventory_interval: Some("2s".into()), ..AgentPeers::default() };
    let _source_agent = region.agent(&source, &peers);
    let steps = async {
        // The source has no BMC: the policy never powers it.
        region.create_node(&source, &[]).await;
        region.wait_phase(&source, Phase::Active, Duration::from_secs(180), &coord).await;
        let server = zone.boot(&admin, &format!("{}-moved", region.id), &source, "1").await;
        region.create_node(&spare, &[]).await;
        region.wait_phase(&spare, Phase::Active, Duration::from_secs(180), &coord).await;
        give_fencing_means(&region, &spare, None).await;

        // Empty past hibernate-after: hibernated by the policy, and said so.
        let hv = wait_power_state(&region, &spare, HostPower::Hibernating, &coord).await;
        assert_eq!(hv.spec.power_state, DesiredPower::Hibernating);
        assert_eq!(hv.annotations().get(POWER_BY_ANNOTATION).map(String::as_str), Some(POWER_BY_POLICY));
        assert_eq!(hv_tests::bmc::power_state(&region.env, &spare).await.unwrap(), "Off");
        let events = region.events_for(&spare).await;
        assert!(events.iter().any(|(r, n)| r == "HibernateByPolicy" && n.contains(&zone.name)), "{events:?}");
        let source_hv = region.hypervisor(&source).await.unwrap();
        assert_eq!(source_hv.spec.power_state, DesiredPower::Running, "a host with a server stays on");

        // Emptying the source: no enabled host in its zone. The preflight
        // waits for room; the policy wakes the spare; the server moves there.
        let name = format!("{}-evict", region.id);
        region.create_eviction(&name, &source, EvictionReason::AdminRequest, Default::default()).await;
        let said = until(
            "the preflight waiting for room",
            Duration::from_secs(60),
            || coord.tail(20),
            || async {
                match preflight_of(&region, &name).await {
                    Some((reason, message)) if reason == "WaitingForRoom" => Poll::Ready(message),
                    other => Poll::Pending(format!("{other:?}")),
                }
            },
        )
        .await;
        assert!(said.contains(&zone.name) && said.contains(&spare), "{said}");
        let ev =
            region.wait_eviction(&name, EvictionPhase::Succeeded, Duration::from_secs(300), &coord).await;
        let (reason, _) = preflight_of(&region, &ev.name_any()).await.unwrap();
        assert_eq!(reason, "Passed");
        let s = admin.server(&server).await.unwrap();
        assert_eq!(
            (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
            (Some("ACTIVE"), Some(spare.as_str()))
        );
        let hv = region.hypervisor(&spare).await.unwrap();
        assert_eq!(hv.spec.power_state, DesiredPower::Running);
        assert!(!hv.annotations().contains_key(POWER_BY_ANNOTATION));
        assert_eq!(hv.status.as_ref().and_then(|s| s.power_state), Some(HostPower::Running));
        assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
        let events = region.events_for(&spare).await;
        assert!(events.iter().any(|(r, n)| r == "WakeByPolicy" && n.contains("preflight")), "{events:?}");
    };
    tokio::select! {
        () = machine_follows_bmc(&region, &spare, &peers) => panic!("the machine stopped following its BMC"),
        () = steps => {}
    }
}
