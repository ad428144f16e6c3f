//! The promise under faults: no VM lost, none moved twice, no Nova call from
//! a deposed leader, no host re-enabled while its eviction runs. A fault
//! proxy (`hv_tests::fault_proxy`) sits between the real coordinator and
//! Nova, Placement, Keystone or the Kubernetes API server, and breaks what
//! a real network and a real region break.
//!
//! Each test that moves servers does so within a zone of its own hosts
//! (`hosts::zone`), so the tests run side by side.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionPhase, EvictionReason, VmState};
use hv_coordinator::api::{Hypervisor, Phase};
use hv_tests::env::Via;
use hv_tests::fault_proxy::{Fault, FaultProxy, Match};
use hv_tests::hosts::{self, Zone};
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, Proc, Region, free_port, metric, readyz};
use hv_tests::wait::{Poll, until};

/// Proxies in front of Keystone, Nova and Placement.
struct OpenStackProxies {
    keystone: FaultProxy,
    compute: FaultProxy,
    placement: FaultProxy,
}

impl OpenStackProxies {
    async fn start(region: &Region) -> OpenStackProxies {
        let up = region.env.upstreams();
        OpenStackProxies {
            keystone: FaultProxy::start(&up.keystone).await,
            compute: FaultProxy::start(&up.compute).await,
            placement: FaultProxy::start(&up.placement).await,
        }
    }

    fn via(&self) -> Via {
        Via {
            keystone: Some(self.keystone.url()),
            compute: Some(self.compute.url()),
            placement: Some(self.placement.url()),
            kube: None,
        }
    }
}

/// The zone's source host Active under `coord` (skipTests), with servers
/// of `flavors` booted into the zone.
async fn active_with_servers(
    region: &Region,
    admin: &Admin,
    zone: &Zone,
    flavors: &[&str],
    coord: &Proc,
) -> (String, Vec<String>) {
    let host = zone.source.host.clone();
    region.create_node(&host, &[("hypervisor.cloud.sap/skip-tests", "true")]).await;
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), coord).await;
    let mut ids = Vec::new();
    for (i, flavor) in flavors.iter().enumerate() {
        ids.push(zone.boot(admin, &format!("{}-{i}", region.id), &host, flavor).await);
    }
    (host, ids)
}

/// Every server ACTIVE off `host` with exactly one completed Nova migration:
/// none lost, none moved twice. Answers how many Nova migrations there were.
async fn moved_once_each(admin: &Admin, host: &str, ids: &[String]) -> usize {
    let mut all = 0;
    for id in ids {
        let s = admin.server(id).await.unwrap();
        assert_eq!(s["status"], "ACTIVE", "{s}");
        assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host), "{id} still on {host}");
        let migs = admin.migrations_of(id).await.unwrap();
        let completed = migs.iter().filter(|m| m["status"] == "completed").count();
        assert_eq!(completed, 1, "{id} moved {completed} times: {migs:?}");
        all += migs.len();
    }
    all
}

fn options(max_parallel: u32, progress_timeout: u64) -> EvictionOptions {
    EvictionOptions { max_parallel, progress_timeout_seconds: progress_timeout, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread")]
async fn nova_errors_resets_and_an_expired_token_during_an_eviction_lose_and_double_nothing() {
    let region = Region::start("novafaults").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let p = OpenStackProxies::start(&region).await;
    let coord = region.coordinator_via(region.grpc_port, None, &p.via(), &[]);
    let (host, ids) = active_with_servers(&region, &admin, &zone, &["2", "1", "1"], &coord).await;

    // Nova answers 503 and drops connections now and then, and once
    // answers a live-migration request with a 503 it never acted on.
    p.compute.rule(Match::method_path("GET", "/servers/detail"), Fault::Respond(503, "{}".into()), Some(3));
    p.compute.rule(Match::method_path("GET", "/os-migrations"), Fault::Reset, Some(3));
    p.compute.rule(Match::method_path("PUT", "/os-services/"), Fault::Reset, Some(1));
    let live =
        Match { body_contains: Some("os-migrateLive".into()), ..Match::method_path("POST", "/action") };
    p.compute.rule(live, Fault::Respond(503, r#"{"message": "busy"}"#.into()), Some(1));
    region.create_eviction("faulty", &host, EvictionReason::AdminRequest, options(1, 15)).await;

    // Mid-eviction the coordinator's token expires: Nova answers 401 to it.
    until(
        "a migration under way",
        Duration::from_secs(120),
        || coord.tail(30),
        || async {
            let ev = region.eviction("faulty").await.and_then(|e| e.status).unwrap_or_default();
            hv_tests::wait::ready_when(ev.vms.iter().any(|v| v.state == VmState::Migrated), ev.progress)
        },
    )
    .await;
    let token = p.compute.seen().iter().rev().find_map(|s| s.token.clone()).unwrap();
    let expired = Match { header: Some(("x-auth-token".into(), token.clone())), ..Default::default() };
    p.compute.rule(expired.clone(), Fault::Respond(401, r#"{"error": {"code": 401}}"#.into()), None);
    p.placement.rule(expired, Fault::Respond(401, r#"{"error": {"code": 401}}"#.into()), None);

    let ev = region.wait_eviction("faulty", EvictionPhase::Succeeded, Duration::from_secs(240), &coord).await;
    let st = ev.status.unwrap();
    assert_eq!((st.total, st.migrated), (3, 3), "{:?}", st.vms);
    let nova_migrations = moved_once_each(&admin, &host, &ids).await;
    // The 503 to the migration request: Nova did nothing, the attempt timed
    // out and the next one moved the VM. No extra Nova migration.
    let attempts: u32 = st.vms.iter().map(|v| v.attempts).sum();
    assert_eq!(attempts, 4, "{:?}", st.vms);
    assert_eq!(nova_migrations, 3);
    let seen = p.compute.seen();
    let rejected =
        seen.iter().filter(|s| s.token.as_deref() == Some(token.as_str()) && s.fault.is_some()).count();
    assert!(rejected >= 1, "the expired token was refused at least once");
    let after: Vec<_> =
        seen.iter().filter(|s| s.token.is_some() && s.token.as_deref() != Some(token.as_str())).collect();
    assert!(!after.is_empty(), "a new token was used after the old one expired");
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_migration_whose_answer_is_lost_is_found_and_tracked_to_the_end() {
    let region = Region::start("lostanswer").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let p = OpenStackProxies::start(&region).await;
    let coord = region.coordinator_via(region.grpc_port, None, &p.via(), &[]);
    let (host, ids) = active_with_servers(&region, &admin, &zone, &["2"], &coord).await;
    // Nova gets the request and starts the migration; the coordinator never
    // hears the 202.
    let live =
        Match { body_contains: Some("os-migrateLive".into()), ..Match::method_path("POST", "/action") };
    p.compute.rule(live, Fault::DropResponse, Some(1));
    region.create_eviction("lost", &host, EvictionReason::AdminRequest, options(1, 150)).await;
    let ev = region.wait_eviction("lost", EvictionPhase::Succeeded, Duration::from_secs(120), &coord).await;

    let migs = admin.migrations_of(&ids[0]).await.unwrap();
    assert_eq!(migs.len(), 1, "exactly one Nova migration: {migs:?}");
    assert_eq!(migs[0]["status"], "completed");
    let vm = &ev.status.as_ref().unwrap().vms[0];
    assert_eq!((vm.state, vm.attempts), (VmState::Migrated, 1), "{vm:?}");
    let recorded = region.migrations_of("lost").await;
    assert_eq!(recorded.len(), 1);
    let st = recorded[0].status.clone().unwrap_or_default();
    assert_eq!(st.nova_migration_id, migs[0]["id"].as_i64(), "tracked: Nova's id recorded");
    let seen = p.compute.seen();
    let posts = seen.iter().filter(|s| s.method == "POST" && s.path.contains("/action")).count();
    assert_eq!(
        posts,
        1,
        "asked once, never again: {:?}",
        seen.iter().map(|s| format!("{} {}", s.method, s.path)).collect::<Vec<_>>()
    );
    moved_once_each(&admin, &host, &ids).await;
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_cut_off_from_kubernetes_stops_before_another_starts_and_calls_nova_no_more() {
    let region = Region::start("partition").await;
    let kube = FaultProxy::start_tls(&region.env.kube.host_port(), &region.env.kube.ca_file).await;
    let p = OpenStackProxies::start(&region).await;
    let via = Via { kube: Some(kube.url()), ..p.via() };
    let mut old = region.coordinator_via(region.grpc_port, None, &via, &[]);
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    region.create_node(&host, &[("hypervisor.cloud.sap/skip-tests", "true")]).await;
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &old).await;
    // The drift check asks Nova every 2 s: the old leader is busy with Nova.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!p.compute.seen().is_empty());

    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(region.kube.client.clone(), hv_tests::rbac::COORDINATOR_NAMESPACE);
    let lease = region.lease();
    let old_identity = leases.get(&lease).await.unwrap().spec.unwrap_or_default().holder_identity.unwrap();
    let new_port = free_port();
    let new = region.coordinator_on(new_port, None, &[]);
    kube.blackhole(true);
    let took_over = until(
        "the second replica to take the lease",
        Duration::from_secs(30),
        || new.tail(20),
        || async {
            let l = leases.get(&lease).await.unwrap();
            let spec = l.spec.unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            match spec.acquire_time {
                Some(t) if spec.lease_transitions.unwrap_or(0) >= 1 && !holder.is_empty() => Poll::Ready(t.0),
                _ => Poll::Pending(holder),
            }
        },
    )
    .await;
    // The new leader works the host; the old one is gone.
    region.wait_phase(&host, Phase::Active, Duration::from_secs(30), &new).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let late: Vec<_> =
        p.compute.seen().into_iter().chain(p.placement.seen()).filter(|s| s.at >= took_over).collect();
    assert!(late.is_empty(), "the deposed leader called Nova after {took_over}: {late:?}\n{}", old.tail(30));
    assert!(old.tail(200).contains("could not renew the lease in time"), "{}", old.tail(30));
    // Nova's own request log, each request stamped as it arrived and
    // naming the replica that sent it: the old leader called Nova before
    // the partition, never once the new leader held the lease; the new one
    // did after.
    let by = |who: &str| {
        let tag = format!("({who})");
        hv_tests::openstack::nova_requests(&region.env)
            .into_iter()
            .filter(move |r| r.user_agent.contains(&tag))
            .collect::<Vec<_>>()
    };
    let old_calls = by(&old_identity);
    assert!(old_calls.iter().any(|r| r.at < took_over), "the old leader's calls are in Nova's log");
    let late: Vec<_> = old_calls.iter().filter(|r| r.at >= took_over).collect();
    assert!(late.is_empty(), "Nova took calls from the deposed leader after {took_over}: {late:?}");
    let new_identity = leases.get(&lease).await.unwrap().spec.unwrap_or_default().holder_identity.unwrap();
    assert_ne!(new_identity, old_identity);
    assert!(by(&new_identity).iter().any(|r| r.at >= took_over), "the new leader works with Nova");

    // The Service's view: the new leader's Pod is labelled; the deposed
    // one could not take its label off, so its Pod still carries it too.
    until(
        "the new leader's Pod labelled",
        Duration::from_secs(10),
        || new.tail(20),
        || async {
            let got = region.leader_labelled(&new).await;
            hv_tests::wait::ready_when(got, got)
        },
    )
    .await;
    assert!(region.leader_labelled(&old).await, "the cut-off leader could not have cleared its label");
    // Its container restarts in the same Pod, still cut off: not Ready,
    // so the Service sends nobody to it despite the stale label.
    let pod = old.pod.clone().unwrap();
    old.kill();
    let restarted = region.coordinator_in(&pod, region.grpc_port, None, &via, &[]);
    let unready = until(
        "the restarted replica to answer /readyz",
        Duration::from_secs(10),
        || restarted.tail(20),
        || async {
            let got = readyz(&restarted).await;
            match got {
                Some(r) => Poll::Ready(r),
                None => Poll::Pending("no answer".to_string()),
            }
        },
    )
    .await;
    assert_eq!(unready, (503, "follower; its pod label is not cleared yet".to_string()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(readyz(&restarted).await.map(|r| r.0), Some(503), "still cut off, still not Ready");
    // Back in touch: it clears the stale label, and then it is Ready.
    kube.blackhole(false);
    until(
        "the stale label cleared and the replica Ready",
        Duration::from_secs(20),
        || restarted.tail(20),
        || async {
            let got = (readyz(&restarted).await, region.leader_labelled(&restarted).await);
            hv_tests::wait::ready_when(got.0.as_ref().is_some_and(|r| r.0 == 200) && !got.1, got)
        },
    )
    .await;
    assert!(region.leader_labelled(&new).await, "the leader keeps its label");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_eviction_never_re_enables_the_host_while_the_eviction_runs() {
    let region = Region::start("restartmid").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let mut coord = region.coordinator(None, &[]);
    let (host, ids) = active_with_servers(&region, &admin, &zone, &["1", "1", "1"], &coord).await;
    region.create_eviction("rolling", &host, EvictionReason::RollingUpdate, options(1, 150)).await;
    until(
        "the host disabled",
        Duration::from_secs(60),
        || coord.tail(20),
        || async {
            let svc = admin.service(&host).await.unwrap().unwrap_or_default();
            hv_tests::wait::ready_when(svc["status"] == "disabled", svc)
        },
    )
    .await;
    // Sample Nova's service every second until the eviction is over.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(jiff::Timestamp, String)>::new()));
    let sampler = {
        let (admin, host, samples) =
            (Admin::login(&region.env).await.unwrap(), host.clone(), samples.clone());
        tokio::spawn(async move {
            loop {
                // A failed read is a sample too: it shows, it does not stop the sampling.
                let status = match admin.service(&host).await {
                    Ok(svc) => svc.unwrap_or_default()["status"].as_str().unwrap_or("missing").to_string(),
                    Err(e) => format!("unread: {e}"),
                };
                samples.lock().unwrap().push((jiff::Timestamp::now(), status));
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    until(
        "a VM migrated",
        Duration::from_secs(120),
        || coord.tail(20),
        || async {
            let ev = region.eviction("rolling").await.and_then(|e| e.status).unwrap_or_default();
            hv_tests::wait::ready_when(ev.migrated >= 1, ev.progress)
        },
    )
    .await;
    // A restart whose Eviction cache fills late: the first two reads of
    // Evictions (the list of each of the two controllers that watch them)
    // take 3 s to come back.
    coord.kill();
    let kube = FaultProxy::start_tls(&region.env.kube.host_port(), &region.env.kube.ca_file).await;
    let slow = Match::method_path("GET", "/apis/hypervisor.cloud.sap/v1alpha1/evictions");
    kube.rule(slow, Fault::Delay(Duration::from_secs(3)), Some(2));
    let via = Via { kube: Some(kube.url()), ..Via::default() };
    let coord = region.coordinator_via(region.grpc_port, None, &via, &[]);
    let ev =
        region.wait_eviction("rolling", EvictionPhase::Succeeded, Duration::from_secs(180), &coord).await;
    sampler.abort();
    // The delay hit what it was meant for: the two controllers' first lists.
    let delayed: Vec<_> = kube.seen().into_iter().filter(|r| r.fault.is_some()).collect();
    assert_eq!(delayed.len(), 2, "{delayed:?}");
    assert!(
        delayed.iter().all(|r| r.path.contains("/evictions") && !r.path.contains("watch=")),
        "{delayed:?}"
    );
    let done = ev.status.and_then(|s| s.completed_at).map(|t| t.0).unwrap();
    let during: Vec<_> = samples.lock().unwrap().iter().filter(|(at, _)| *at < done).cloned().collect();
    assert!(during.len() >= 5, "{during:?}");
    assert!(during.iter().all(|(_, s)| s != "enabled"), "re-enabled while the eviction ran: {during:?}");
    assert!(during.iter().filter(|(_, s)| s == "disabled").count() >= 5, "{during:?}");
    // A RollingUpdate eviction re-enables its host at the end.
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    moved_once_each(&admin, &host, &ids).await;
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_that_land_on_the_host_during_its_eviction_are_moved_too() {
    let region = Region::start("latecomers").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let p = OpenStackProxies::start(&region).await;
    let coord = region.coordinator_via(region.grpc_port, None, &p.via(), &[]);
    let (host, mut ids) = active_with_servers(&region, &admin, &zone, &["2", "1"], &coord).await;
    // Disabling the host takes a while (its PUT is held 8 s): two servers
    // the scheduler still places there land during it.
    p.compute.rule(Match::method_path("PUT", "/os-services/"), Fault::Delay(Duration::from_secs(8)), Some(1));
    region.create_eviction("late", &host, EvictionReason::AdminRequest, options(1, 150)).await;
    for i in 0..2 {
        ids.push(zone.boot(&admin, &format!("{}-early-{i}", region.id), &host, "1").await);
    }
    until(
        "a VM migrated",
        Duration::from_secs(120),
        || coord.tail(20),
        || async {
            let ev = region.eviction("late").await.and_then(|e| e.status).unwrap_or_default();
            hv_tests::wait::ready_when(ev.migrated >= 1, ev.progress)
        },
    )
    .await;
    // Mid-eviction an operator moves a server onto the host by hand.
    let elsewhere = zone.targets[1].host.clone();
    let moved_in = zone.boot(&admin, &format!("{}-moved-in", region.id), &elsewhere, "1").await;
    admin.live_migrate_forced(&moved_in, &host).await.unwrap();
    ids.push(moved_in.clone());
    let ev = region.wait_eviction("late", EvictionPhase::Succeeded, Duration::from_secs(240), &coord).await;
    assert!(admin.servers_on(&host).await.unwrap().is_empty(), "none left on {host}");
    let st = ev.status.unwrap();
    assert_eq!(st.total, st.migrated, "{:?}", st.vms);
    for id in &ids {
        let vm = st.vms.iter().find(|v| &v.id == id);
        assert_eq!(vm.map(|v| v.state), Some(VmState::Migrated), "{id} recorded and moved: {:?}", st.vms);
    }
    for id in &ids[..4] {
        let migs = admin.migrations_of(id).await.unwrap();
        assert_eq!(migs.iter().filter(|m| m["status"] == "completed").count(), 1, "{id}: {migs:?}");
    }
    let s = admin.server(&moved_in).await.unwrap();
    assert_ne!(s["OS-EXT-SRV-ATTR:host"].as_str(), Some(host.as_str()), "moved off again");
    // Evicted as Nova shows it empty on the way in; a reconcile later, held
    // by the Eviction (AdminRequest, no reEnable): either may be read first.
    let hv = region.wait_phase(&host, Phase::Maintenance, Duration::from_secs(30), &coord).await;
    let (status, reason, _) = Region::condition(&hv, "Evicted");
    assert_eq!(status, "True", "asked of Nova, which shows it empty");
    assert!(["Evicted", "HeldByEviction"].contains(&reason.as_str()), "{reason}");
    for id in &ids {
        admin.delete_server(id).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_check_report_acknowledged_by_a_leader_that_died_before_recording_it_is_not_lost() {
    let region = Region::start("ackedlost").await;
    let kube = FaultProxy::start_tls(&region.env.kube.host_port(), &region.env.kube.ca_file).await;
    let via = Via { kube: Some(kube.url()), ..Via::default() };
    let mut first = region.coordinator_via(region.grpc_port, None, &via, &["--checks-timeout", "40s"]);
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    region.create_node(&host, &[]).await;
    region.wait_condition(&host, "Tested", "WaitingForAgent", &first).await;
    // The leader can no longer write the Hypervisor's status (each write is
    // held past its timeout; its Lease still renews, so it stays leader);
    // the agent connects, runs the checks, and its report is acknowledged
    // on the stream.
    let status_writes = Match::method_path("PATCH", &format!("/hypervisors/{host}/status"));
    kube.rule(status_writes, Fault::Delay(Duration::from_secs(120)), None);
    let agent = region.agent(&host, &AgentPeers::default());
    let seq = until(
        "the report taken in by the first leader",
        Duration::from_secs(20),
        || first.tail(20),
        || async {
            hv_tests::wait::ready_if(first.logged("check report", "seq").and_then(|s| s.parse::<f64>().ok()))
        },
    )
    .await;
    // The ack reached the agent (its outbox let go of the report): without
    // the new leader's question the report would be gone for good.
    let metrics = until(
        "the agent's health address",
        Duration::from_secs(10),
        || agent.tail(10),
        || async { hv_tests::wait::ready_if(agent.agent_metrics()) },
    )
    .await;
    until(
        "the agent to hold the report's ack",
        Duration::from_secs(10),
        || agent.tail(10),
        || async {
            let acked = metric(&metrics, "hv_agent_acked_seq").await;
            hv_tests::wait::ready_when(acked.is_some_and(|a| a >= seq), (acked, seq))
        },
    )
    .await;
    first.kill();
    let hv = region.hypervisor(&host).await.unwrap();
    let st = hv.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(Phase::Testing), "the report was never recorded");
    assert!(st.checks.is_empty());
    // A new leader on the same address: the agent reconnects, is asked for
    // the same run again and answers with the report it kept.
    let second = region.coordinator(None, &["--checks-timeout", "40s"]);
    let hv: Hypervisor = region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &second).await;
    let st = hv.status.unwrap();
    assert_eq!(st.lifecycle.test_run, 1, "the same run, no retry");
    assert!(!st.checks.is_empty() && st.checks.iter().all(|c| c.passed));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_speaking_for_a_node_without_a_hypervisor_is_refused() {
    use hv_proto::v1::agent_message::Payload;
    use hv_proto::v1::agent_service_client::AgentServiceClient;
    use hv_proto::v1::{AgentMessage, Hello};
    let region = Region::start("ghost").await;
    let coord = region.coordinator(None, &[]);
    let url = region.grpc_url();
    let channel = until(
        "the coordinator",
        Duration::from_secs(20),
        || coord.tail(10),
        || async {
            // The node's own certificate: what is refused is the node, not the caller.
            match hv_tests::region::connect(&url, &region.pki.node("ghost-node")).await {
                Ok(c) => Poll::Ready(c),
                Err(e) => Poll::Pending(e),
            }
        },
    )
    .await;
    let hello = AgentMessage {
        seq: 0,
        sent_at: None,
        payload: Some(Payload::Hello(Hello { node: "ghost-node".into(), ..Default::default() })),
    };
    let code = until(
        "a leading coordinator's answer",
        Duration::from_secs(20),
        || coord.tail(10),
        || async {
            let rsp = AgentServiceClient::new(channel.clone())
                .connect(tokio_stream::iter(vec![hello.clone()]))
                .await;
            match rsp {
                Err(s) if s.code() != tonic::Code::Unavailable => Poll::Ready(s.code()),
                other => Poll::Pending(format!("{:?}", other.map(|_| ()))),
            }
        },
    )
    .await;
    assert_eq!(code, tonic::Code::FailedPrecondition);
}
