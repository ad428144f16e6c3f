//! One region, many actors, on the real peers (docs/lifecycle.md, "Who
//! owns a disable"): a compute service disabled by nova-compute itself
//! (`AUTO: `) or by an SRE stands, shown on the Hypervisor, counted, and
//! told once; the coordinator follows once that party enables it again;
//! a disable of its own that it finds is repaired. A host an SRE paused,
//! and a whole install in observe mode, get no write (docs/operations.md,
//! "Hands off").

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_coordinator::api::eviction::EvictionReason;
use hv_coordinator::api::hypervisor::HealthState;
use hv_tests::fencing::{address, claim_hosts, fencing_coordinator, give_fencing_means, wait_power};
use hv_tests::hosts;
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, Proc, Region, healthy_active};
use hv_tests::wait::{ready_when, until};
use serde_json::json;

const SOON: Duration = Duration::from_secs(60);

/// The tests' drift interval (`--drift-interval`, 2 s) three times over,
/// with a second to spare.
const THREE_DRIFT_INTERVALS: u64 = 7;

#[tokio::test(flavor = "multi_thread")]
async fn a_disable_by_nova_compute_or_an_sre_stands_and_a_disable_of_ours_is_repaired() {
    let region = Region::start("sharing").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.as_str();
    let coord = region.coordinator(None, &["--skip-tests"]);
    let metrics = coord.metrics.clone().unwrap();
    let admin = Admin::login(&region.env).await.unwrap();
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Active, SOON, &coord).await;

    for reason in ["AUTO: Connection to libvirt lost: 1", "firmware check, do not enable -- jdoe"] {
        admin.set_service(host, json!({"status": "disabled", "disabled_reason": reason})).await.unwrap();
        let said = region.wait_condition(host, "SchedulingEnabled", "DisabledElsewhere", &coord).await;
        assert!(said.contains(reason), "Nova's reason shown: {said}");
        // It stands: Nova's service sampled every second.
        for _ in 0..THREE_DRIFT_INTERVALS {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let svc = admin.service(host).await.unwrap().unwrap();
            assert_eq!(
                (svc["status"].as_str(), svc["disabled_reason"].as_str()),
                (Some("disabled"), Some(reason))
            );
        }
        let counted = hv_tests::region::metric(&metrics, "hv_hypervisors_disabled_elsewhere").await;
        assert_eq!(counted, Some(1.0), "counted");
        // That party enables it again: the coordinator follows.
        admin.set_service(host, json!({"status": "enabled"})).await.unwrap();
        region.wait_condition(host, "SchedulingEnabled", "Enabled", &coord).await;
        let hv = region.hypervisor(host).await.unwrap();
        assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Active));
    }
    // Told with Nova's reason (a second Event of the same reason on the
    // same object is counted in the first's series by the recorder).
    let events = region.events_for(host).await;
    let told: Vec<_> = events.iter().filter(|e| e.0 == "DisabledElsewhere").collect();
    assert!(told.iter().any(|e| e.1.contains("AUTO: Connection to libvirt lost")), "{events:?}");

    // A disable of ours found (a maintenance's, left behind) is repaired.
    // A disable of our form that this Hypervisor never recorded sending
    // (another install's, or copied by hand) is someone else's: it stands.
    let copied = "hv-lifecycle: maintenance (manual): copied by hand";
    admin.set_service(host, json!({"status": "disabled", "disabled_reason": copied})).await.unwrap();
    let said = region.wait_condition(host, "SchedulingEnabled", "DisabledElsewhere", &coord).await;
    assert!(said.contains(copied), "{said}");
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = admin.service(host).await.unwrap().unwrap();
        assert_eq!(svc["status"], "disabled", "{svc}");
    }
    admin.set_service(host, json!({"status": "enabled"})).await.unwrap();
    region.wait_condition(host, "SchedulingEnabled", "Enabled", &coord).await;

    // A disable of ours found (one recorded before it was sent, left
    // behind) is repaired.
    let ours = region.our_disable(host).await;
    assert!(ours.starts_with("hv-lifecycle: "), "{ours}");
    admin.set_service(host, json!({"status": "disabled", "disabled_reason": ours})).await.unwrap();
    until(
        "our own disable repaired",
        SOON,
        || coord.tail(30),
        || async {
            let svc = admin.service(host).await.unwrap().unwrap_or_default();
            ready_when(svc["status"] == "enabled", svc)
        },
    )
    .await;
    until(
        "a DriftRepaired Event naming the old reason",
        Duration::from_secs(10),
        || coord.tail(10),
        || async {
            let events = region.events_for(host).await;
            ready_when(events.iter().any(|e| e.0 == "DriftRepaired" && e.1.contains(ours.as_str())), events)
        },
    )
    .await;
}

/// The requests `coord` sent Nova (its User-Agent names its Pod) after the
/// `from`th request of the log: each as "METHOD path".
fn coordinator_requests(env: &hv_tests::env::TestEnv, coord: &Proc, from: usize) -> Vec<String> {
    let tag = format!("({})", coord.pod.as_deref().expect("a coordinator in a Pod"));
    let all = hv_tests::openstack::nova_requests(env);
    let ours = all.into_iter().skip(from).filter(|r| r.user_agent.contains(&tag));
    ours.map(|r| format!("{} {}", r.method, r.path)).collect()
}

/// The Node's keys of ours (`hypervisor.cloud.sap/…` labels and
/// annotations) and its finalizers.
async fn node_marks(region: &Region, host: &str) -> Vec<(String, String)> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(region.kube.client.clone());
    let node = nodes.get(host).await.unwrap();
    let ours = |m: Option<std::collections::BTreeMap<String, String>>| {
        m.unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with("hypervisor.cloud.sap/"))
            .collect::<Vec<_>>()
    };
    let mut marks = ours(node.metadata.labels);
    marks.extend(ours(node.metadata.annotations));
    marks.extend(node.metadata.finalizers.unwrap_or_default().into_iter().map(|f| ("finalizer".into(), f)));
    marks
}

/// For three drift intervals, sampled every second: `host`'s compute
/// service stays as `service` says (status, reason), it is not forced
/// down, its BMC reads On, and `address` is not in Ceph's blocklist.
async fn nothing_done_to(
    region: &Region,
    admin: &Admin,
    host: &str,
    service: (&str, Option<&str>),
    address: &str,
) {
    let entry = format!("{address}:0/0");
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = admin.service(host).await.unwrap().unwrap();
        assert_eq!(
            (svc["status"].as_str(), svc["disabled_reason"].as_str()),
            (Some(service.0), service.1),
            "{svc}"
        );
        assert_eq!(svc["forced_down"], false, "{svc}");
        assert_eq!(hv_tests::bmc::power_state(&region.env, host).await.unwrap(), "On");
        let listed = hv_tests::region::blocklist(&region.env).unwrap();
        assert!(!listed.contains_key(&entry), "{listed:?}");
    }
}

/// The coordinator's flags to fence by the ground's Ceph.
fn ceph_fence_flags(env: &hv_tests::env::TestEnv) -> Vec<String> {
    let (conf, keyring) = (env.ceph.conf.display(), env.ceph.fence.keyring.display());
    let pairs = [("--ceph-fence-id", env.ceph.fence.id.clone()), ("--ceph-fence-conf", conf.to_string())];
    let pairs = pairs.into_iter().chain([("--ceph-fence-keyring", keyring.to_string())]);
    pairs.flat_map(|(flag, value)| [flag.to_string(), value]).collect()
}

/// Waits until `host`'s `Paused` condition says it would do `what`.
async fn would(region: &Region, host: &str, what: &str, coord: &Proc) -> String {
    until(
        &format!("{host} would {what}"),
        Duration::from_secs(90),
        || coord.tail(30),
        || async {
            let said =
                region.hypervisor(host).await.map(|h| Region::condition(&h, "Paused")).unwrap_or_default();
            ready_when(said.0 == "True" && said.2.contains(what), said)
        },
    )
    .await
    .2
}

/// A host an SRE paused (`hvctl pause`) gets no write: a disable of ours
/// left behind is not repaired, and once it dies (its agent and kubelet
/// gone, with a BMC and a Ceph address to fence by) it is judged Failed
/// and never fenced. What would be done is in its `Paused` condition and
/// Events; Nova's request log shows only reads from the coordinator, and
/// its Node's marks stay as they were.
#[tokio::test(flavor = "multi_thread")]
async fn a_paused_host_gets_no_write_and_is_never_fenced() {
    let region = Region::start("sharing-pause").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 3).await;
    let [host, peer1, peer2] = [0, 1, 2].map(|i| claims[i].host.clone());
    let flags = ceph_fence_flags(&env);
    let fence_id: Vec<&str> = flags.iter().map(String::as_str).collect();
    let coord = fencing_coordinator(&region, &fence_id);
    let metrics = coord.metrics.clone().unwrap();
    let mut agents = Vec::new();
    for h in [&host, &peer1, &peer2] {
        agents.push(healthy_active(&region, h, &coord).await.1);
    }
    give_fencing_means(&region, &host, Some(address::PAUSED)).await;
    wait_power(&env, &host, "On").await;
    let admin = Admin::login(&env).await.unwrap();

    let out = region.hvctl().args(["pause", &host, "--reason", "firmware by hand -- jdoe"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = region.wait_condition(&host, "Paused", "PausedBySre", &coord).await;
    assert!(said.contains("firmware by hand -- jdoe"), "{said}");
    let marks = node_marks(&region, &host).await;
    let from = hv_tests::openstack::nova_requests(&env).len();

    // A disable of ours left behind, which drift repair would lift.
    let ours = region.our_disable(&host).await;
    let ours = ours.as_str();
    admin.set_service(&host, json!({"status": "disabled", "disabled_reason": ours})).await.unwrap();
    would(&region, &host, "enable compute service", &coord).await;
    nothing_done_to(&region, &admin, &host, ("disabled", Some(ours)), address::PAUSED).await;

    // The host dies.
    agents[0].kill();
    region.kwok_lets_go(&host).await;
    hv_tests::region::wait_health(&region, &host, HealthState::Failed, &coord).await;
    would(&region, &host, "fence the host", &coord).await;
    nothing_done_to(&region, &admin, &host, ("disabled", Some(ours)), address::PAUSED).await;
    let hv = region.hypervisor(&host).await.unwrap();
    assert!(hv.status.as_ref().and_then(|s| s.fencing.as_ref()).is_none(), "{:?}", hv.status);

    let asked = coordinator_requests(&env, &coord, from);
    let writes: Vec<&String> = asked.iter().filter(|r| !r.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "the coordinator wrote to Nova for a paused host: {writes:?}");
    assert!(!asked.is_empty(), "the paused host is still read");
    assert_eq!(node_marks(&region, &host).await, marks, "its Node's marks stay");
    let events = region.events_for(&host).await;
    for reason in ["WouldEnable", "WouldFence"] {
        assert!(events.iter().any(|e| e.0 == reason), "{reason}: {events:?}");
    }
    assert_eq!(hv_tests::region::metric(&metrics, "hv_hypervisors_paused").await, Some(1.0));

    // Not resumed here: the dead host would be fenced (the shell tests
    // show a resumed host acted on again).
    drop(coord);
    region.kubelet_returns(&host).await;
}

/// An install in observe mode (`--mode observe`) over a region in
/// service: an Eviction of a host with a server, and a host that dies with
/// a BMC and a Ceph address to fence by, are decided and shown
/// (`HostPaused`, `Paused`, `Would…` Events), and nothing is written: Nova's
/// request log shows only reads from it, Ceph's blocklist and the BMC are
/// untouched, the server stays where it is, and the Nodes keep their marks.
#[tokio::test(flavor = "multi_thread")]
async fn observe_mode_writes_nothing_through_an_eviction_and_a_fencing() {
    let region = Region::start("sharing-observe").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 3).await;
    let [evicted, dies, peer] = [0, 1, 2].map(|i| claims[i].host.clone());
    let flags = ceph_fence_flags(&env);
    let fence_id: Vec<&str> = flags.iter().map(String::as_str).collect();
    // A region in service: an acting install onboarded its hosts.
    let mut acting = fencing_coordinator(&region, &fence_id);
    let mut agents = Vec::new();
    for h in [&evicted, &dies, &peer] {
        agents.push(healthy_active(&region, h, &acting).await.1);
    }
    give_fencing_means(&region, &dies, Some(address::OBSERVED)).await;
    wait_power(&env, &dies, "On").await;
    let admin = Admin::login(&env).await.unwrap();
    let vm = admin.boot_on(&format!("{}-observed", region.id), &evicted, "1").await.unwrap();
    acting.stop();

    let mut observing_args = fence_id.to_vec();
    observing_args.extend(["--mode", "observe"]);
    let coord = fencing_coordinator(&region, &observing_args);
    let metrics = coord.metrics.clone().unwrap();
    region.wait_leading(&coord).await;
    for h in [&evicted, &dies, &peer] {
        region.wait_condition(h, "Paused", "ObserveMode", &coord).await;
    }
    let marks = [node_marks(&region, &evicted).await, node_marks(&region, &dies).await];
    let from = hv_tests::openstack::nova_requests(&env).len();

    // An eviction, of a host an SRE disabled already: it would migrate
    // at once.
    let sre = "emptying by hand -- jdoe";
    admin.set_service(&evicted, json!({"status": "disabled", "disabled_reason": sre})).await.unwrap();
    let name = format!("{}-observed", region.id);
    region.create_eviction(&name, &evicted, EvictionReason::AdminRequest, Default::default()).await;
    until(
        "the Eviction held, saying what it would move",
        SOON,
        || coord.tail(30),
        || async {
            let ev = region.eviction(&name).await;
            let conditions = ev.and_then(|e| e.status).map(|s| s.conditions).unwrap_or_default();
            let held = conditions.iter().find(|c| c.type_ == "HostPaused").cloned();
            ready_when(
                held.as_ref().is_some_and(|c| c.message.contains("would migrate the 1 server(s)")),
                held,
            )
        },
    )
    .await;

    // A fencing.
    agents[1].kill();
    region.kwok_lets_go(&dies).await;
    hv_tests::region::wait_health(&region, &dies, HealthState::Failed, &coord).await;
    would(&region, &dies, "fence the host", &coord).await;
    nothing_done_to(&region, &admin, &dies, ("enabled", None), address::OBSERVED).await;

    let svc = admin.service(&evicted).await.unwrap().unwrap();
    assert_eq!(
        (svc["status"].as_str(), svc["disabled_reason"].as_str()),
        (Some("disabled"), Some(sre)),
        "{svc}"
    );
    assert_eq!(admin.servers_on(&evicted).await.unwrap(), std::slice::from_ref(&vm), "the server stays");
    let asked = coordinator_requests(&env, &coord, from);
    let writes: Vec<&String> = asked.iter().filter(|r| !r.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "an observing coordinator wrote to Nova: {writes:?}");
    assert!(asked.iter().any(|r| r.contains("servers")), "it read the servers: {asked:?}");
    assert_eq!([node_marks(&region, &evicted).await, node_marks(&region, &dies).await], marks);
    let told: Vec<String> = region.events_for(&name).await.into_iter().map(|e| e.0).collect();
    assert!(told.contains(&"WouldMigrate".to_string()), "{told:?}");
    let told: Vec<String> = region.events_for(&dies).await.into_iter().map(|e| e.0).collect();
    assert!(told.contains(&"WouldFence".to_string()), "{told:?}");
    assert!(hv_tests::region::metric_sum(&metrics, "hv_would_total").await.unwrap_or_default() >= 2.0);

    drop(coord);
    region.kubelet_returns(&dies).await;
    admin.delete_server(&vm).await.unwrap();
}

/// Waits until `node`'s Hypervisor is refused the Nova host `holder` holds.
async fn refused(region: &Region, node: &str, holder: &str, coord: &Proc) {
    let said = region.wait_condition(node, "Onboarded", "NovaHostClaimed", coord).await;
    assert!(said.contains(&format!("held by Hypervisor {holder}")), "{said}");
    let hv = region.hypervisor(node).await.unwrap();
    let recorded = hv.status.and_then(|s| s.lifecycle.nova_host);
    assert_eq!(recorded, None, "the refused Hypervisor records no Nova host");
}

/// One Nova host, one Hypervisor: a second Node naming the Nova host of an
/// Active one is refused before anything is written to Nova for it, and
/// the first stays enabled; two Nodes naming one host created together get
/// one winner; and so do two created on either side of a failover.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_node_naming_a_claimed_nova_host_is_refused_with_no_nova_write() {
    let region = Region::start("sharing-claims").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 3).await;
    let [host, raced, failed_over] = [0, 1, 2].map(|i| claims[i].host.clone());
    let admin = Admin::login(&env).await.unwrap();
    let coord = region.coordinator(None, &["--skip-tests"]);
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;

    // A second Node naming the host.
    let pid = std::process::id();
    let twin = format!("{host}-twin-{pid}");
    let from = hv_tests::openstack::nova_requests(&env).len();
    region.create_node(&twin, &[("hypervisor.cloud.sap/nova-host", &host)]).await;
    refused(&region, &twin, &host, &coord).await;
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = admin.service(&host).await.unwrap().unwrap();
        assert_eq!(svc["status"], "enabled", "{svc}");
    }
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Active), "the holder is untouched");
    let asked = coordinator_requests(&env, &coord, from);
    let writes: Vec<&String> = asked.iter().filter(|r| !r.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "written to Nova after the second Node appeared: {writes:?}");
    let events = region.events_for(&twin).await;
    assert!(events.iter().any(|e| e.0 == "NovaHostClaimed" && e.1.contains(host.as_str())), "{events:?}");
    // The refused one has no compute service of its own: its Node goes.
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(region.kube.client.clone());
    nodes.delete(&twin, &Default::default()).await.unwrap();
    until(
        "the refused Node deleted",
        SOON,
        || coord.tail(30),
        || async {
            let left = nodes.get_opt(&twin).await.unwrap().map(|n| n.metadata.finalizers);
            ready_when(left.is_none(), left)
        },
    )
    .await;
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "enabled", "{svc}");

    // Two Nodes naming one host, created together: one wins.
    let (a, b) = (format!("{raced}-a-{pid}"), format!("{raced}-b-{pid}"));
    let naming = [("hypervisor.cloud.sap/nova-host", raced.as_str())];
    tokio::join!(region.create_node(&a, &naming), region.create_node(&b, &naming));
    let winner = until(
        "one of the two Active, the other refused",
        SOON,
        || coord.tail(30),
        || async {
            let phases = [region.hypervisor(&a).await, region.hypervisor(&b).await]
                .map(|h| h.and_then(|h| h.status).and_then(|s| s.phase));
            let active: Vec<usize> = (0..2).filter(|&i| phases[i] == Some(Phase::Active)).collect();
            match active[..] {
                [one] => hv_tests::wait::Poll::Ready(one),
                _ => hv_tests::wait::Poll::Pending(format!("{phases:?}")),
            }
        },
    )
    .await;
    let (won, lost) = if winner == 0 { (&a, &b) } else { (&b, &a) };
    refused(&region, lost, won, &coord).await;
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = admin.service(&raced).await.unwrap().unwrap();
        assert_eq!(svc["status"], "enabled", "{svc}");
    }

    // One claimed, then a failover, then the second.
    let mut coord = coord;
    let standby = region.coordinator_on(hv_tests::region::free_port(), None, &["--skip-tests"]);
    let (first, second) = (format!("{failed_over}-1-{pid}"), format!("{failed_over}-2-{pid}"));
    let naming = [("hypervisor.cloud.sap/nova-host", failed_over.as_str())];
    region.create_node(&first, &naming).await;
    until(
        "the first claims the host",
        SOON,
        || coord.tail(30),
        || async {
            let recorded =
                region.hypervisor(&first).await.and_then(|h| h.status).and_then(|s| s.lifecycle.nova_host);
            ready_when(recorded.as_deref() == Some(failed_over.as_str()), recorded)
        },
    )
    .await;
    coord.kill();
    region.create_node(&second, &naming).await;
    region.wait_leading(&standby).await;
    region.wait_phase(&first, Phase::Active, SOON, &standby).await;
    refused(&region, &second, &first, &standby).await;
}

/// A host found in service (its compute service enabled, with a server) is
/// adopted: never disabled on its way in (Nova's service sampled every
/// second), its checks run by its agent, Active after that one run.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_in_service_with_servers_is_adopted_and_never_disabled() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let region = Region::start("sharing-adopt").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    let admin = Admin::login(&region.env).await.unwrap();
    admin.set_service(&host, json!({"status": "enabled"})).await.unwrap();
    let vm = admin.boot_on(&format!("{}-adopted", region.id), &host, "1").await.unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sampler = {
        let (admin, host, stop) = (Admin::login(&region.env).await.unwrap(), host.clone(), stop.clone());
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let svc = admin.service(&host).await.unwrap().unwrap_or_default();
                samples
                    .push((svc["status"].as_str().unwrap_or("").to_string(), svc["disabled_reason"].clone()));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            samples
        })
    };
    let coord = region.coordinator(None, &[]);
    let _agent = region.agent(&host, &hv_tests::region::AgentPeers::default());
    region.create_node(&host, &[]).await;
    let hv = region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    let status = hv.status.clone().unwrap();
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert_eq!(Region::condition(&hv, "Tested").1, "Passed");
    tokio::time::sleep(Duration::from_secs(THREE_DRIFT_INTERVALS)).await;
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.unwrap();
    assert!(samples.len() as u64 >= THREE_DRIFT_INTERVALS, "sampled {} times", samples.len());
    let disabled: Vec<_> = samples.iter().filter(|(s, _)| s != "enabled").collect();
    assert!(disabled.is_empty(), "an adopted host was disabled: {disabled:?}");
    let events: Vec<String> = region.events_for(&host).await.into_iter().map(|e| e.0).collect();
    for reason in ["HostAdopted", "Testing", "Ready", "Active"] {
        assert!(events.iter().any(|r| r == reason), "{reason}: {events:?}");
    }
    assert_eq!(admin.servers_on(&host).await.unwrap(), std::slice::from_ref(&vm), "its server stays");
    admin.delete_server(&vm).await.unwrap();
}

/// One Nova host, one machine: a Node whose agent runs on another machine
/// (its libvirt calls itself by another fake host's name) passes its checks
/// and is not activated: it stays Ready, its compute service disabled as
/// onboarding left it, with no write to Nova after the mismatch is shown,
/// and one Warning naming both sides. The agent of its own machine then
/// gets it activated.
#[tokio::test(flavor = "multi_thread")]
async fn an_agent_whose_libvirt_names_another_machine_does_not_activate_its_host() {
    let region = Region::start("sharing-machine").await;
    let env = region.env.clone();
    let claims = claim_hosts(&env, 2).await;
    let (host, elsewhere) = (claims[0].host.as_str(), claims[1].host.as_str());
    let admin = Admin::login(&env).await.unwrap();
    let coord = region.coordinator(None, &[]);
    let wrong = AgentPeers { libvirt: Some(env.libvirt.of(elsewhere).to_string()), ..Default::default() };
    let mut agent = region.agent(host, &wrong);
    region.create_node(host, &[]).await;
    let said = region.wait_condition(host, "SchedulingEnabled", "MachineMismatch", &coord).await;
    assert!(said.contains(&format!("calls its machine {elsewhere}")) && said.contains(host), "{said}");
    let from = hv_tests::openstack::nova_requests(&env).len();
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let svc = admin.service(host).await.unwrap().unwrap();
        assert_eq!(svc["status"], "disabled", "{svc}");
        let hv = region.hypervisor(host).await.unwrap();
        assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Ready));
    }
    let asked = coordinator_requests(&env, &coord, from);
    let writes: Vec<&String> = asked.iter().filter(|r| !r.starts_with("GET ")).collect();
    assert!(writes.is_empty(), "written to Nova while the machine differs: {writes:?}");
    let events = region.events_for(host).await;
    let told: Vec<_> = events.iter().filter(|e| e.0 == "MachineMismatch").collect();
    assert_eq!(told.len(), 1, "{events:?}");
    let hv = region.hypervisor(host).await.unwrap();
    let recorded = hv.status.and_then(|s| s.machine).and_then(|m| m.hostname);
    assert_eq!(recorded.as_deref(), Some(elsewhere), "the machine's name is in status");

    // The node's own machine's agent: activated.
    agent.kill();
    let _agent = region.agent(host, &AgentPeers::default());
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "enabled", "{svc}");
}

/// An Eviction's `Machine` condition as (status, reason, message).
async fn machine_said(region: &Region, name: &str) -> (String, String, String) {
    let ev = region.eviction(name).await;
    let c = ev.and_then(|e| e.status).and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "Machine"));
    c.map(|c| (c.status, c.reason, c.message)).unwrap_or_default()
}

/// One Nova host, one machine, before anything moves: a Node whose agent
/// runs on another machine of the same host name (a libvirtd calling
/// itself by the host's name, without the host's domains) is activated,
/// but its Eviction moves nothing: Nova lists a server there that the
/// agent never reported. `Machine=False`, `NotTheMachine`, naming both
/// sides, one Warning, and no migration asked of Nova. Once the agent of
/// the host's own machine reports the server, the Eviction empties it.
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_moves_nothing_off_a_machine_that_never_ran_the_hosts_servers() {
    let region = Region::start("sharing-domains").await;
    let env = region.env.clone();
    let zone = hosts::zone(&env, 1).await;
    let host = zone.source.host.clone();
    let admin = Admin::login(&env).await.unwrap();
    let twin = hv_tests::libvirtd::PrivateLibvirtd::start(&env, &host).unwrap();
    let mut agent = region.agent(&host, &AgentPeers { libvirt: Some(twin.test_uri()), ..Default::default() });
    let (_, coord, ids) = region.active_host_with(&admin, &zone, &["1"], &[]).await;
    until(
        "the twin's domains recorded",
        SOON,
        || coord.tail(30),
        || async {
            let hv = region.hypervisor(&host).await;
            let domains = hv.and_then(|h| h.status?.machine?.domains);
            ready_when(domains.is_some(), domains)
        },
    )
    .await;

    let from = hv_tests::openstack::nova_requests(&env).len();
    let name = format!("machine-{}", std::process::id());
    region.create_eviction(&name, &host, EvictionReason::AdminRequest, Default::default()).await;
    let said = until(
        "the Eviction held: not the machine",
        SOON,
        || coord.tail(30),
        || async {
            let said = machine_said(&region, &name).await;
            ready_when(said.1 == "NotTheMachine", said)
        },
    )
    .await;
    assert_eq!(said.0, "False");
    assert!(said.2.contains(&ids[0]) && said.2.contains(&format!("node {host}")), "{said:?}");
    for _ in 0..THREE_DRIFT_INTERVALS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let server = admin.server(&ids[0]).await.unwrap();
        assert_eq!(server["OS-EXT-SRV-ATTR:host"], host.as_str(), "{server}");
    }
    let asked = coordinator_requests(&env, &coord, from);
    let moves: Vec<&String> = asked.iter().filter(|r| r.contains("/action")).collect();
    assert!(moves.is_empty(), "a server moved off another machine: {moves:?}");
    let events = region.events_for(&name).await;
    assert_eq!(events.iter().filter(|e| e.0 == "NotTheMachine").count(), 1, "{events:?}");

    // The host's own machine's agent reports the server: it moves.
    agent.kill();
    drop(twin);
    let _agent = region.agent(&host, &AgentPeers::default());
    until(
        "the Eviction done",
        Duration::from_secs(120),
        || coord.tail(30),
        || async {
            let phase = region.eviction(&name).await.and_then(|e| e.status).and_then(|s| s.phase);
            ready_when(phase == Some(hv_coordinator::api::eviction::EvictionPhase::Succeeded), phase)
        },
    )
    .await;
    assert_eq!(machine_said(&region, &name).await.1, "Seen");
    let server = admin.server(&ids[0]).await.unwrap();
    assert_ne!(server["OS-EXT-SRV-ATTR:host"], host.as_str(), "{server}");
}
