//! Fencing actuators against the real peers: power through the Redfish BMC
//! emulator (sushy-tools, fake driver: a power change lands up to 11 s
//! after it is asked), storage through the real Ceph cluster's OSD blocklist
//! (addresses no client of the ground uses), and Nova's side of a dead
//! host on the real region (forced down, evacuate, the old host's cleanup).
//! Each power or Nova test works on hosts it has claimed. Last, the
//! fencing controller: the real coordinator fences a Failed host through
//! all three, and leaves alone a host whose kubelet is alive, whatever else
//! of it is lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_coordinator::fence::{
    Bmc, CephFence, CephFenceError, PowerActuator, PowerError, PowerState, PoweredOff, Redfish,
    power_off_confirmed,
};
use hv_coordinator::nova::{Cloud, CloudSource, HttpPolicy, NovaClient, NovaError};

use hv_coordinator::api::hypervisor::{FenceStep, HealthState};
use hv_coordinator::api::{Hypervisor, Phase};
use hv_tests::bmc::{Watched, bmc_of as bmc};
use hv_tests::env::TestEnv;
use hv_tests::fencing::{
    address, claim_hosts, fencing_coordinator, give_fencing_means, kubelet_silent, wait_fencing, wait_power,
};
use hv_tests::openstack::{Admin, FakeHost, fake_host};
use hv_tests::region::{AgentPeers, Blocklisted, Region, healthy_active, wait_health};
use hv_tests::wait::{Poll, until};
use kube::Api;
use kube::api::{Patch, PatchParams};

/// Powers the claimed host's system back on and waits until it is.
async fn power_on(env: &TestEnv, host: &str) {
    hv_tests::bmc::power_on(env, host).await.unwrap();
    let r = Redfish::new(&bmc(env, host)).unwrap();
    let on = || async {
        match r.power_state().await {
            Ok(PowerState::On) => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        }
    };
    hv_tests::wait::until("the system powered on again", Duration::from_secs(20), String::new, on).await;
}

#[tokio::test]
async fn a_system_is_powered_off_once_and_counted_off_only_when_the_bmc_says_so() {
    let env = hv_tests::env::require();
    let claim = hv_tests::hosts::claim(&env).await;
    power_on(&env, &claim.host).await; // a claim's power on lands seconds later
    let r = Redfish::new(&bmc(&env, &claim.host)).unwrap();

    let watched = Watched::new(&r);
    let t = Instant::now();
    let done =
        power_off_confirmed(&watched, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    let PoweredOff::TurnedOff { after } = done else { panic!("it was on: {done:?}") };
    // Asked once; every state read before the BMC said Off was On (the
    // emulator lands the change up to 11 s later), then Off twice; bounded.
    let seen = watched.seen();
    assert_eq!((watched.offs(), watched.ons()), (1, 0));
    let (before, off) = seen.split_at(seen.len().saturating_sub(2));
    assert_eq!(off, [PowerState::Off, PowerState::Off], "{seen:?}");
    assert!(!before.is_empty() && before.iter().all(|s| *s == PowerState::On), "{seen:?}");
    assert!(after < Duration::from_secs(13) && t.elapsed() < Duration::from_secs(15), "{after:?}");
    assert_eq!(r.power_state().await.unwrap(), PowerState::Off);
    let again = power_off_confirmed(&r, Duration::from_secs(30), Duration::from_millis(250)).await.unwrap();
    assert_eq!(again, PoweredOff::AlreadyOff);
    power_on(&env, &claim.host).await;
}

#[tokio::test]
async fn a_wrong_password_an_unknown_system_a_foreign_certificate_and_a_dead_bmc_are_told_apart() {
    let env = hv_tests::env::require();
    let claim = hv_tests::hosts::claim(&env).await;
    power_on(&env, &claim.host).await;
    let good = bmc(&env, &claim.host);

    let wrong = Bmc { password: "not-it".into(), ..good.clone() };
    let err = Redfish::new(&wrong).unwrap().power_state().await.unwrap_err();
    assert!(matches!(err, PowerError::Refused { status: 401, .. }), "{err}");
    let err = Redfish::new(&wrong).unwrap().force_off().await.unwrap_err();
    assert!(matches!(err, PowerError::Refused { .. }), "refused before anything is asked: {err}");

    let nobody =
        Bmc { address: format!("redfish+{}/redfish/v1/Systems/no-such-system", env.bmc.url), ..good.clone() };
    let err = Redfish::new(&nobody).unwrap().power_state().await.unwrap_err();
    assert!(matches!(err, PowerError::NoSystem { .. }), "{err}");

    // The system's roots do not know the ground's CA; insecure accepts it.
    let foreign = Bmc { ca_pem: None, ..good.clone() };
    let err = Redfish::new(&foreign).unwrap().power_state().await.unwrap_err();
    assert!(
        matches!(err, PowerError::Unreachable { .. }) && err.to_string().contains("certificate"),
        "{err}"
    );
    let insecure = Bmc { ca_pem: None, insecure: true, ..good.clone() };
    assert_eq!(Redfish::new(&insecure).unwrap().power_state().await.unwrap(), PowerState::On);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dead =
        Bmc { address: format!("redfish+https://127.0.0.1:{port}/redfish/v1/Systems/1"), ..good.clone() };
    let t = Instant::now();
    let err = Redfish::new(&dead).unwrap().power_state().await.unwrap_err();
    assert!(matches!(err, PowerError::Unreachable { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(6), "{:?}", t.elapsed());

    let err = Redfish::new(&Bmc { ca_pem: Some(b"not a certificate".to_vec()), ..good }).unwrap_err();
    assert!(matches!(err, PowerError::BadCa(_)), "{err}");
    // Nothing was powered off by any of it.
    assert_eq!(Redfish::new(&bmc(&env, &claim.host)).unwrap().power_state().await.unwrap(), PowerState::On);
}

fn ceph_fence(env: &TestEnv, client: &hv_tests::env::CephClient) -> CephFence {
    CephFence {
        helper: hv_tests::region::bin("hv-ceph-fence"),
        conf: env.ceph.conf.clone(),
        id: client.id.clone(),
        keyring: Some(client.keyring.clone()),
        timeout: Duration::from_secs(10),
    }
}

#[tokio::test]
async fn a_hosts_ceph_addresses_are_blocklisted_read_back_and_lifted_by_the_fencing_identity_only() {
    let env = hv_tests::env::require();
    let fence = ceph_fence(&env, &env.ceph.fence);
    // A whole host and one client instance, both unused on the ground.
    let addresses = vec!["127.0.0.9".to_string(), "127.0.0.10:6800/4242".to_string()];
    let entries = fence.blocklist(&addresses).await.unwrap();
    assert_eq!(entries, ["127.0.0.9:0/0", "127.0.0.10:6800/4242"]);
    let listed = hv_tests::region::blocklist(&env).unwrap();
    for e in &entries {
        // Until lifted: Ceph's own expiry is years away.
        let expiry = listed.get(e).unwrap_or_else(|| panic!("{e} not in {listed:?}"));
        assert!(expiry.as_str() > "2030", "{e} expires {expiry}");
    }
    fence.blocklist(&addresses).await.unwrap(); // idempotent

    // A node's own client (profile rbd) may add entries but never lift one.
    let node = ceph_fence(&env, &env.ceph.client);
    let err = node.lift(&addresses).await.unwrap_err();
    assert!(matches!(&err, CephFenceError::Refused(m) if m.contains("Permission denied")), "{err}");
    assert!(hv_tests::region::blocklist(&env).unwrap().contains_key("127.0.0.9:0/0"));

    fence.lift(&addresses).await.unwrap();
    let listed = hv_tests::region::blocklist(&env).unwrap();
    assert!(entries.iter().all(|e| !listed.contains_key(e)), "{listed:?}");
    fence.lift(&addresses).await.unwrap(); // lifting what is not listed succeeds

    // Refused before anything runs.
    let err = fence.blocklist(&["compute-1".to_string()]).await.unwrap_err();
    assert_eq!(err, CephFenceError::BadAddress("compute-1".into()));
    let missing = CephFence { helper: "/nonexistent/hv-ceph-fence".into(), ..fence.clone() };
    let err = missing.blocklist(&addresses).await.unwrap_err();
    assert!(matches!(err, CephFenceError::Helper { .. }), "{err}");
}

fn nova_client(env: &TestEnv, name: &str) -> NovaClient {
    let dir = std::env::temp_dir().join(format!("hv-fencing-{name}-{}", std::process::id()));
    let file = env.clouds_yaml(&dir, None).unwrap();
    NovaClient::new(Cloud::new(
        CloudSource::CloudsYaml { cloud: "hv".into(), file: Some(file) },
        HttpPolicy::default(),
    ))
}

/// Nova's own record of the server's evacuation (`done`: rebuilt;
/// `completed`: its old host cleaned up), read as the admin reads it.
async fn evacuation_status(admin: &Admin, id: &str) -> Option<String> {
    let migrations = admin.migrations_of(id).await.unwrap();
    let evacuation = migrations.iter().find(|m| m["migration_type"] == "evacuation")?;
    evacuation["status"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_hosts_server_is_evacuated_once_forced_down_rebuilt_stopped_and_its_old_host_cleans_up_when_it_starts()
 {
    let env = hv_tests::env::require();
    let nova = nova_client(&env, "evacuate");
    let admin = Admin::login(&env).await.unwrap();
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let (source, target) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let id = zone.boot(&admin, &format!("evac-{}", std::process::id()), &source, "1").await;

    // The host dies: its nova-compute stops. Nova's service group still
    // counts it up, and Nova refuses to rebuild its server elsewhere.
    fake_host(&env.nova, &source, FakeHost::Stop).await.unwrap();
    let err = nova.evacuate(&id).await.unwrap_err();
    assert!(matches!(err, NovaError::Invalid(_)), "{err}"); // 400: "still in use"
    assert_eq!(nova.server(&id).await.unwrap().and_then(|s| s.host).as_deref(), Some(source.as_str()));

    // Forced down (the first fencing step), it accepts; the scheduler picks
    // the zone's other host, and at compute 2.95+ the server comes back stopped.
    nova.set_forced_down(&source, true).await.unwrap();
    nova.evacuate(&id).await.unwrap();
    let rebuilt =
        until("the server rebuilt on the other host", Duration::from_secs(60), String::new, || async {
            match nova.server(&id).await.unwrap() {
                Some(s) if s.host.as_deref() == Some(target.as_str()) && s.status == "SHUTOFF" => {
                    Poll::Ready(s)
                }
                other => Poll::Pending(format!("{other:?}")),
            }
        })
        .await;
    assert_eq!(rebuilt.status, "SHUTOFF");
    assert_eq!(evacuation_status(&admin, &id).await.as_deref(), Some("done"));
    nova.start(&id).await.unwrap();
    until("the server running again", Duration::from_secs(30), String::new, || async {
        match nova.server(&id).await.unwrap() {
            Some(s) if s.status == "ACTIVE" => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        }
    })
    .await;
    nova.start(&id).await.unwrap(); // started already: no error

    // Nova does not lift forced_down while the evacuation is only `done`:
    // the old host must have started and cleaned up first.
    let err = nova.set_forced_down(&source, false).await.unwrap_err();
    assert!(matches!(err, NovaError::Invalid(_)), "{err}");

    // The old host comes back: its nova-compute, at start, destroys what is
    // left of the evacuated server there, and Nova records it completed.
    fake_host(&env.nova, &source, FakeHost::Start).await.unwrap();
    until("the old host's cleanup", Duration::from_secs(60), String::new, || async {
        match evacuation_status(&admin, &id).await {
            Some(s) if s == "completed" => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(nova.server(&id).await.unwrap().and_then(|s| s.host).as_deref(), Some(target.as_str()));
    nova.set_forced_down(&source, false).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_host_is_fenced_step_by_step_each_confirmed_and_a_host_cut_from_us_alone_is_not() {
    let region = Region::start("fencing").await;
    let env = region.env.clone();
    // Four: with one dead and one cut, two of the cut one's three peers
    // still talk to us, so no quorum gate hides what is shown.
    let claims = claim_hosts(&env, 4).await;
    let [dead, cut, other, fourth] = [0, 1, 2, 3].map(|i| claims[i].host.clone());
    let keyring = env.ceph.fence.keyring.display().to_string();
    let conf = env.ceph.conf.display().to_string();
    let coord = fencing_coordinator(
        &region,
        &[
            "--ceph-fence-id",
            &env.ceph.fence.id,
            "--ceph-fence-conf",
            &conf,
            "--ceph-fence-keyring",
            &keyring,
        ],
    );
    let mut agents = Vec::new();
    for host in [&dead, &cut, &other, &fourth] {
        agents.push(healthy_active(&region, host, &coord).await.1);
    }
    for (host, ceph) in [(&dead, address::CONTROLLER), (&cut, address::CONTROLLER_CUT)] {
        give_fencing_means(&region, host, Some(ceph)).await;
        wait_power(&env, host, "On").await;
    }
    let _lift = Blocklisted::lift_later(&env, &format!("{}:0/0", address::CONTROLLER));
    let admin = Admin::login(&env).await.unwrap();

    // The host dies: its agent's stream ends and its kubelet stops posting.
    agents[0].kill();
    kubelet_silent(&region, &dead).await;
    wait_health(&region, &dead, HealthState::Failed, &coord).await;
    let fencing = wait_fencing(&region, &dead, "the host fenced", |f| f.fenced.is_some(), &coord).await;
    let failed_since = region.hypervisor(&dead).await.and_then(|h| h.status).and_then(|s| s.health);
    if let (Some(since), Some(started), Some(done)) =
        (failed_since.and_then(|h| h.since), &fencing.started, &fencing.fenced)
    {
        let secs = |a: &jiff::Timestamp, b: &jiff::Timestamp| b.duration_since(*a).as_secs_f64();
        eprintln!(
            "fencing on the ground: Failed -> started {:.1} s, started -> fenced {:.1} s",
            secs(&since.0, &started.0),
            secs(&started.0, &done.0)
        );
    }
    // In order, each confirmed, and each shown by the peer itself.
    let all = [FenceStep::NovaForcedDown, FenceStep::CephBlocklisted, FenceStep::PoweredOff];
    assert_eq!(fencing.confirmed, all, "{fencing:?}");
    assert!(!fencing.by_hand && fencing.failed.is_none(), "{fencing:?}");
    let svc = admin.service(&dead).await.unwrap().unwrap();
    assert_eq!(svc["forced_down"], true, "{svc}");
    let listed = hv_tests::region::blocklist(&env).unwrap();
    assert!(listed.contains_key(&format!("{}:0/0", address::CONTROLLER)), "{listed:?}");
    assert_eq!(hv_tests::bmc::power_state(&env, &dead).await.unwrap(), "Off");
    let hv = region.hypervisor(&dead).await.unwrap();
    let (status, reason, message) = Region::condition(&hv, "Fenced");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Fenced"), "{message}");
    let events = region.events_for(&dead).await;
    for step in ["NovaForcedDownConfirmed", "CephBlocklistedConfirmed", "PoweredOffConfirmed"] {
        assert!(events.iter().any(|(r, _)| r == step), "{step}: {events:?}");
    }
    assert!(events.iter().any(|(r, _)| r == "Fenced"), "{events:?}");
    assert!(events.iter().any(|(r, _)| r == "FencingStarted"), "{events:?}");

    // Another host's agent and nova-compute stop (a bad rollout of its
    // OpenStack pods), its kubelet alive: its Node stays Ready, its Lease
    // renewed. Unreachable, past the heartbeat's freshness, never Failed,
    // and nothing is done to it, though it has a BMC and Ceph to fence by.
    agents[1].kill();
    wait_health(&region, &cut, HealthState::Unreachable, &coord).await;
    fake_host(&env.nova, &cut, FakeHost::Stop).await.unwrap();
    // Nova sees nova-compute down after its service_down_time (60 s).
    let vetoed = until(
        "Nova's word and the veto",
        Duration::from_secs(150),
        || coord.tail(30),
        || async {
            let health = region.hypervisor(&cut).await.and_then(|h| h.status).and_then(|s| s.health);
            match health {
                Some(h)
                    if h.evidence
                        .iter()
                        .any(|e| e.starts_with("kubelet: alive, its Lease renewed lately")) =>
                {
                    Poll::Ready(h)
                }
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(vetoed.evidence.iter().any(|e| e == "Nova: nova-compute down"), "{vetoed:?}");
    assert_eq!(vetoed.state, HealthState::Unreachable, "{vetoed:?}");
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let status = region.hypervisor(&cut).await.and_then(|h| h.status).unwrap();
        assert_eq!(status.health.map(|h| h.state), Some(HealthState::Unreachable));
        assert!(status.fencing.is_none(), "{:?}", status.fencing);
        let held = status.conditions.iter().find(|c| c.type_ == "Fenced");
        assert!(held.is_none(), "nothing to fence, nothing held back: {held:?}");
    }
    let svc = admin.service(&cut).await.unwrap().unwrap();
    assert_eq!(svc["forced_down"], false, "{svc}");
    assert_eq!(hv_tests::bmc::power_state(&env, &cut).await.unwrap(), "On");
    let listed = hv_tests::region::blocklist(&env).unwrap();
    assert!(!listed.contains_key(&format!("{}:0/0", address::CONTROLLER_CUT)), "{listed:?}");
    let events = region.events_for(&cut).await;
    assert!(!events.iter().any(|(r, _)| r == "HealthFailed" || r == "FencingStarted"), "{events:?}");
    drop(coord);
    fake_host(&env.nova, &cut, FakeHost::Start).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn six_of_ten_hosts_lost_at_once_are_not_fenced_and_the_gate_says_why() {
    let region = Region::start("fence-storm").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 10).await;
    let names: Vec<String> = claims.iter().map(|c| c.host.clone()).collect();
    let coord = fencing_coordinator(&region, &[]);
    // All ten brought up together, then waited for.
    let mut agents = Vec::new();
    for host in &names {
        let root = hv_tests::region::healthy_host(&region.dir.join(format!("host-{host}")));
        agents.push(region.agent(host, &AgentPeers { host_root: Some(root), ..Default::default() }));
        region.create_node(host, &[("hypervisor.cloud.sap/skip-tests", "true")]).await;
    }
    for host in &names {
        region.wait_phase(host, Phase::Active, Duration::from_secs(90), &coord).await;
        wait_health(&region, host, HealthState::Healthy, &coord).await;
    }
    let admin = Admin::login(&env).await.unwrap();
    // Six at once: their agents' streams end and their kubelets stop posting.
    let lost = &names[..6];
    for agent in &mut agents[..6] {
        agent.kill();
    }
    for host in lost {
        kubelet_silent(&region, host).await;
    }
    for host in lost {
        wait_health(&region, host, HealthState::Failed, &coord).await;
    }
    // Held back, each saying why, and nothing done, well past the heartbeat's freshness.
    for host in lost {
        let why = region.wait_condition(host, "Fenced", "NoAgentQuorum", &coord).await;
        assert!(why.contains("4 of the 9 other hosts' agents are connected"), "{why}");
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    for host in &names {
        let status = region.hypervisor(host).await.and_then(|h| h.status).unwrap();
        assert!(status.fencing.is_none(), "{host}: {:?}", status.fencing);
        let svc = admin.service(host).await.unwrap().unwrap();
        assert_eq!(svc["forced_down"], false, "{host}: {svc}");
    }
    for host in lost {
        let events = region.events_for(host).await;
        assert!(
            events.iter().any(|(r, n)| r == "NoAgentQuorum" && n.contains("other hosts' agents")),
            "{events:?}"
        );
    }
    drop(coord);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_step_that_cannot_be_confirmed_stops_the_fencing_until_an_sre_confirms_it_by_hand() {
    let region = Region::start("fence-stuck").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 3).await;
    let dead = claims[0].host.clone();
    let coord = fencing_coordinator(&region, &[]);
    let mut agents = Vec::new();
    for claim in &claims {
        agents.push(healthy_active(&region, &claim.host, &coord).await.1);
    }
    // Its BMC address was copied from another machine's (the second host's,
    // which runs): that BMC answers, to the credentials we hold, for a
    // system whose UUID is not the one the host's agent reported. Its
    // storage is not Ceph here.
    give_fencing_means(&region, &dead, None).await;
    let other = claims[1].host.clone();
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let copied = serde_json::json!({"spec": {"fencing": {"bmc": {"address": env.bmc.address(&other)}}}});
    hvs.patch(&dead, &PatchParams::default(), &Patch::Merge(&copied)).await.unwrap();
    let reported = region.hypervisor(&dead).await.and_then(|h| h.status).and_then(|s| s.machine);
    assert_eq!(reported.and_then(|m| m.system_uuid), env.bmc.system_uuid(&dead));
    // Before any fencing, a confirmation is refused: nothing to confirm.
    let out = region.hvctl().args(["confirm-fenced", &dead]).output().unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no fencing under way"), "{out:?}");

    agents[0].kill();
    kubelet_silent(&region, &dead).await;
    // Nova's step confirmed; the power step tried three times, then it stops and says why.
    let stuck = wait_fencing(
        &region,
        &dead,
        "the fencing stuck on its power step",
        |f| f.failed.as_ref().is_some_and(|x| x.attempts >= 3),
        &coord,
    )
    .await;
    assert_eq!(stuck.confirmed, [FenceStep::NovaForcedDown], "{stuck:?}");
    let failed = stuck.failed.clone().unwrap();
    assert_eq!(failed.step, FenceStep::PoweredOff);
    let want = format!(
        "the BMC's system is {}, the host is {}: spec.fencing.bmc names another machine",
        env.bmc.system_uuid(&other).unwrap(),
        env.bmc.system_uuid(&dead).unwrap()
    );
    assert!(failed.message.contains(&want), "{failed:?}");
    let message = region.wait_condition(&dead, "Fenced", "StepNotConfirmed", &coord).await;
    assert!(message.contains("hvctl confirm-fenced"), "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = region.hypervisor(&dead).await.and_then(|h| h.status).and_then(|s| s.fencing).unwrap();
    assert!(still.fenced.is_none() && still.failed.is_some_and(|f| f.attempts == 3), "no fourth try");
    assert_eq!(hv_tests::bmc::power_state(&env, &dead).await.unwrap(), "On", "nothing powered off");
    assert_eq!(
        hv_tests::bmc::power_state(&env, &other).await.unwrap(),
        "On",
        "least of all the other machine"
    );

    // The SRE made sure it is off, and says so.
    let out = region.hvctl().args(["confirm-fenced", &dead]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let fenced = wait_fencing(&region, &dead, "fenced by hand", |f| f.fenced.is_some(), &coord).await;
    assert!(fenced.by_hand, "{fenced:?}");
    let hv = region.hypervisor(&dead).await.unwrap();
    let (status, _, message) = Region::condition(&hv, "Fenced");
    assert_eq!(status, "True", "{message}");
    assert!(message.contains("an SRE confirmed it"), "{message}");
    drop(coord);
}

/// A host cut from the coordinator (its agent and kubelet silent, its
/// nova-compute and its servers running) is Failed and half fenced: Nova
/// forces it down and its Ceph address is blocklisted, but its power step
/// cannot be confirmed (its BMC address names another machine). Its agent
/// comes back: the fencing is held there, and an SRE's confirmation does
/// not count while it lives. The route out is the SRE's clearing: the
/// fence comes off, the host comes back through its checks, and its
/// servers end ACTIVE where they were, never evacuated.
#[tokio::test(flavor = "multi_thread")]
async fn a_half_fenced_host_whose_agent_is_back_is_held_then_cleared_its_servers_never_evacuated() {
    let region = Region::start("fence-half").await;
    let env = region.env.clone();
    let zone = hv_tests::hosts::zone(&env, 2).await;
    let (dead, other) = (zone.source.host.clone(), zone.targets[0].host.clone());
    let (conf, keyring) = (env.ceph.conf.display().to_string(), env.ceph.fence.keyring.display().to_string());
    let ceph =
        ["--ceph-fence-id", &env.ceph.fence.id, "--ceph-fence-conf", &conf, "--ceph-fence-keyring", &keyring];
    let coord = fencing_coordinator(&region, &ceph);
    let (root, agent) = healthy_active(&region, &dead, &coord).await;
    let mut agents = vec![agent];
    for t in &zone.targets {
        agents.push(healthy_active(&region, &t.host, &coord).await.1);
    }
    give_fencing_means(&region, &dead, Some(address::HALF_FENCED)).await;
    let _lift = Blocklisted::lift_later(&env, &format!("{}:0/0", address::HALF_FENCED));
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let copied = serde_json::json!({"spec": {"fencing": {"bmc": {"address": env.bmc.address(&other)}}}});
    hvs.patch(&dead, &PatchParams::default(), &Patch::Merge(&copied)).await.unwrap();
    let admin = Admin::login(&env).await.unwrap();
    let tag = std::process::id();
    let mut ids = Vec::new();
    for i in 0..2 {
        ids.push(zone.boot(&admin, &format!("half-{i}-{tag}"), &dead, "1").await);
    }

    agents[0].kill();
    kubelet_silent(&region, &dead).await;
    let stuck = wait_fencing(
        &region,
        &dead,
        "storage cut, the power step not confirmed",
        |f| f.failed.as_ref().is_some_and(|x| x.attempts >= 3),
        &coord,
    )
    .await;
    assert_eq!(stuck.confirmed, [FenceStep::NovaForcedDown, FenceStep::CephBlocklisted], "{stuck:?}");
    assert!(
        hv_tests::region::blocklist(&env).unwrap().contains_key(&format!("{}:0/0", address::HALF_FENCED))
    );

    // Its agent is back: held there, and a confirmation by hand does not
    // count while it talks.
    let peers = AgentPeers { host_root: Some(root.clone()), ..Default::default() };
    agents[0] = region.agent(&dead, &peers);
    let held = region.wait_condition(&dead, "Fenced", "AgentHeartbeatFresh", &coord).await;
    assert!(held.contains("a host that talks to us is not fenced"), "{held}");
    let out = region.hvctl().args(["confirm-fenced", &dead]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let f = region.hypervisor(&dead).await.and_then(|h| h.status).and_then(|s| s.fencing).unwrap();
    assert!(f.fenced.is_none(), "a confirmation by hand while it talks: {f:?}");
    assert!(region.evictions_of(&dead).await.is_empty(), "nothing evacuated");

    // The SRE's decision: it is not dead. The fence comes off, and the
    // host comes back through its checks.
    region.kubelet_returns(&dead).await;
    let out = region.hvctl().args(["clear-fenced", &dead]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    region.wait_phase(&dead, Phase::Active, Duration::from_secs(120), &coord).await;
    until(
        "the fence off",
        Duration::from_secs(60),
        || coord.tail(30),
        || async {
            match region.hypervisor(&dead).await.and_then(|h| h.status).map(|s| s.fencing) {
                Some(None) => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    // Enabled again once its checks passed.
    until(
        "the host enabled in Nova, not forced down",
        Duration::from_secs(120),
        || coord.tail(30),
        || async {
            let svc = admin.service(&dead).await.unwrap().unwrap();
            match (svc["forced_down"].as_bool(), svc["status"].as_str()) {
                (Some(false), Some("enabled")) => Poll::Ready(()),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(
        !hv_tests::region::blocklist(&env).unwrap().contains_key(&format!("{}:0/0", address::HALF_FENCED))
    );
    for id in &ids {
        let s = admin.server(id).await.unwrap();
        assert_eq!(
            (s["status"].as_str(), s["OS-EXT-SRV-ATTR:host"].as_str()),
            (Some("ACTIVE"), Some(dead.as_str())),
            "{id}"
        );
        let migrations = admin.migrations_of(id).await.unwrap();
        assert!(
            migrations.iter().all(|m| m["migration_type"] != "evacuation"),
            "{id} evacuated: {migrations:?}"
        );
    }
    let events = region.events_for(&dead).await;
    for reason in [
        "CephBlocklistedConfirmed",
        "AgentHeartbeatFresh",
        "ForcedDownLifted",
        "BlocklistLifted",
        "FencingCleared",
    ] {
        assert!(events.iter().any(|(r, _)| r == reason), "{reason}: {events:?}");
    }
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
    drop(coord);
}
