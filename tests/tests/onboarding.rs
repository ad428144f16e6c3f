//! End to end: a Kubernetes Node appears and, with no human, is onboarded
//! into Nova, tested by its agent and opened for scheduling, or stopped in
//! Aborted with a cause an SRE can act on (docs/lifecycle.md).
//!
//! Real `hv-coordinator`, `hv-agent` and `hvctl` binaries; the ground's real
//! Keystone, Nova, Placement, libvirtd, OVSDB and Ceph; the ground's
//! Kubernetes control plane. Each test claims a Nova host of its own
//! (`hv_tests::hosts`), so the tests run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::{Hypervisor, Phase};
use hv_tests::hosts::{self, Claim};
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, PrivateOvsdb, Proc, Region, ceph_client, readyz, set_ceph_caps};
use hv_tests::wait::{Poll, ready_when, until};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const AGGREGATES: &str = "hypervisor.cloud.sap/aggregates";
const TRAITS: &str = "hypervisor.cloud.sap/custom-traits";
const POOLS: &str = "hypervisor.cloud.sap/ceph-pools";
const SKIP_TESTS: &str = "hypervisor.cloud.sap/skip-tests";
const SOON: Duration = Duration::from_secs(60);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), jiff::Timestamp::now().as_millisecond() % 100_000)
}

/// grpc.health.v1 Check, as grpc_health_probe does it. Err is the gRPC code.
async fn health(region: &Region, url: &str, service: &str) -> Result<ServingStatus, tonic::Code> {
    let channel = until(&format!("coordinator {url}"), Duration::from_secs(20), String::new, || async {
        match region.channel_to(url).await {
            Ok(c) => Poll::Ready(c),
            Err(e) => Poll::Pending(e),
        }
    })
    .await;
    let rsp = HealthClient::new(channel).check(HealthCheckRequest { service: service.into() }).await;
    rsp.map(|r| r.into_inner().status()).map_err(|s| s.code())
}

async fn wait_health(region: &Region, url: &str, service: &str, want: ServingStatus) {
    let _ = until(&format!("{service} {want:?}"), SOON, String::new, || async {
        let got = health(region, url, service).await;
        ready_when(got == Ok(want), got)
    })
    .await;
}

/// Waits for Aborted; `condition` must carry `reason` and name `cause`.
async fn expect_abort(
    region: &Region,
    host: &str,
    condition: &str,
    reason: &str,
    cause: &str,
    coord: &Proc,
) -> Hypervisor {
    let hv = region.wait_phase(host, Phase::Aborted, SOON, coord).await;
    let (_, got, message) = Region::condition(&hv, condition);
    assert_eq!(got, reason, "{condition}: {message}");
    assert!(message.contains(cause), "{condition} names {cause}: {message}");
    hv
}

/// After the fix: one `hvctl retry`, then Active.
async fn retry_to_active(region: &Region, host: &str, coord: &Proc) {
    region.retry(host);
    region.wait_phase(host, Phase::Active, SOON, coord).await;
}

/// A region with a claimed host, and a coordinator.
async fn region_with_host(test: &str, extra: &[&str]) -> (Region, Claim, Proc) {
    let region = Region::start(test).await;
    let host = hosts::claim(&region.env).await;
    let coord = region.coordinator(None, extra);
    (region, host, coord)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_node_is_onboarded_and_waits_in_testing_disabled_without_an_agent() {
    let (region, claim, coord) = region_with_host("onboard", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let agg = unique("e2e-az");
    admin.create_aggregate(&agg).await.unwrap();
    let url = region.grpc_url();
    wait_health(&region, &url, "", ServingStatus::Serving).await;
    assert_eq!(
        health(&region, &url, &format!("node/{host}")).await,
        Err(tonic::Code::NotFound),
        "unknown before its Node"
    );

    region.create_node(host, &[(AGGREGATES, &agg), (TRAITS, "CUSTOM_HV_E2E")]).await;
    let hv = region.wait_phase(host, Phase::Testing, SOON, &coord).await;
    region.wait_condition(host, "Tested", "WaitingForAgent", &coord).await;
    assert!(admin.aggregates_of(host).await.unwrap().contains(&agg), "host added to {agg} in Nova");
    assert!(
        admin.traits_of(host).await.unwrap().contains(&"CUSTOM_HV_E2E".to_string()),
        "trait on the provider"
    );
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled", "no VM may land before the checks pass: {svc}");
    assert_eq!(health(&region, &url, &format!("node/{host}")).await, Ok(ServingStatus::NotServing));
    let owner = hv.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.first().map(|o| (o.kind.as_str(), o.name.as_str())), Some(("Node", host)));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agents_checks_activate_the_node_and_open_scheduling() {
    let (region, claim, coord) = region_with_host("activate", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let status = hv.status.clone().unwrap();
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert!(status.checks.iter().any(|c| c.name == "ovs-bridge/br-ex"));
    assert_eq!(status.libvirt_version.as_deref().map(|v| !v.is_empty()), Some(true));
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(status.service_id.as_deref(), svc["id"].as_str());
    assert_eq!(svc["status"], "enabled", "scheduling opened in Nova");
    wait_health(&region, &region.grpc_url(), &format!("node/{host}"), ServingStatus::Serving).await;
    let reasons: Vec<String> = region.events_for(host).await.into_iter().map(|e| e.0).collect();
    for phase in ["Onboarding", "Testing", "Ready", "Active"] {
        assert!(reasons.iter().any(|r| r == phase), "an Event for {phase}: {reasons:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hvctl_lists_the_fleet_and_reflection_names_the_services() {
    let (region, claim, coord) = region_with_host("fleet", &["--skip-tests"]).await;
    let host = claim.host.as_str();
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let url = region.grpc_url();
    let text = until(
        "hvctl to show the node Active with its agent",
        SOON,
        || coord.tail(10),
        || async {
            let out = region.hvctl().args(["--coordinator", &url, "list"]).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            ready_when(
                text.lines().any(|l| l.starts_with(host) && l.contains("Active") && l.contains("yes")),
                text,
            )
        },
    )
    .await;
    assert!(text.starts_with("NAME"), "{text}");
    // Reflection: grpcurl and grpc_health_probe need no proto files.
    let services = reflected_services(&region, &url).await;
    for svc in ["hv.v1.AgentService", "hv.v1.FleetService", "grpc.health.v1.Health"] {
        assert!(services.iter().any(|s| s == svc), "{svc} listed by reflection: {services:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn clearing_maintenance_runs_the_checks_again_before_scheduling_reopens() {
    let (region, claim, coord) = region_with_host("retest", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let url = region.grpc_url();
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let run_before = hv.status.as_ref().map_or(0, |s| s.lifecycle.test_run);
    let hvs: kube::Api<Hypervisor> = kube::Api::all(region.kube.client.clone());
    let patch = serde_json::json!({"spec": {"maintenance": "manual", "maintenanceReason": "kernel update"}});
    hvs.patch(host, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    region.wait_phase(host, Phase::Maintenance, SOON, &coord).await;
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled");
    assert!(svc["disabled_reason"].as_str().unwrap_or_default().contains("kernel update"), "{svc}");
    wait_health(&region, &url, &format!("node/{host}"), ServingStatus::NotServing).await;
    let patch = serde_json::json!({"spec": {"maintenance": "", "maintenanceReason": ""}});
    hvs.patch(host, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let status = hv.status.unwrap();
    assert!(
        status.lifecycle.test_run > run_before,
        "tested again: run {} after {run_before}",
        status.lifecycle.test_run
    );
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled");
    wait_health(&region, &url, &format!("node/{host}"), ServingStatus::Serving).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_going_away_turns_the_nodes_health_not_serving() {
    let (region, claim, coord) = region_with_host("agentgone", &[]).await;
    let host = claim.host.as_str();
    let mut agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let url = region.grpc_url();
    wait_health(&region, &url, &format!("node/{host}"), ServingStatus::Serving).await;
    agent.kill();
    wait_health(&region, &url, &format!("node/{host}"), ServingStatus::NotServing).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_tests_goes_straight_to_ready_and_active() {
    let (region, claim, coord) = region_with_host("skip", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    region.create_node(host, &[(SKIP_TESTS, "true")]).await;
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    assert_eq!(Region::condition(&hv, "Tested").1, "Skipped");
    assert!(hv.status.unwrap().checks.is_empty(), "no checks ran");
    let phases: Vec<String> = region.events_for(host).await.into_iter().map(|e| e.0).collect();
    assert!(!phases.iter().any(|p| p == "Testing"), "never in Testing: {phases:?}");
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_aggregate_aborts_and_a_retry_after_the_fix_succeeds() {
    let (region, claim, coord) = region_with_host("noagg", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let agg = unique("e2e-missing");
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[(AGGREGATES, &agg)]).await;
    let hv = expect_abort(&region, host, "Aborted", "AggregateNotFound", &agg, &coord).await;
    assert_eq!(Region::condition(&hv, "Aborted").0, "True");
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled", "Aborted keeps scheduling off");

    admin.create_aggregate(&agg).await.unwrap();
    retry_to_active(&region, host, &coord).await;
    assert!(admin.aggregates_of(host).await.unwrap().contains(&agg));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_br_ex_and_a_standalone_br_int_abort_and_a_retry_after_the_fix_succeeds() {
    let (region, claim, coord) = region_with_host("nobrex", &[]).await;
    let host = claim.host.as_str();
    let ovs = PrivateOvsdb::start(&region.dir, &["br-int"]).unwrap();
    // A learning switch where the integration bridge must drop what its
    // controller did not program.
    ovs.set_fail_mode("br-int", "standalone").unwrap();
    let _agent = region.agent(host, &AgentPeers { ovsdb: Some(ovs.remote.clone()), ..Default::default() });
    region.create_node(host, &[]).await;
    let hv = expect_abort(&region, host, "Tested", "ChecksFailed", "br-ex", &coord).await;
    let failed: Vec<(String, String)> =
        hv.status.unwrap().checks.into_iter().filter(|c| !c.passed).map(|c| (c.name, c.message)).collect();
    let names: Vec<&str> = failed.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(names, vec!["ovs-bridge/br-int", "ovs-bridge/br-ex"], "{failed:?}");
    assert_eq!(failed[0].1, "bridge br-int: fail_mode: wanted secure, found standalone");

    ovs.add_bridge("br-ex").unwrap();
    ovs.set_fail_mode("br-int", "secure").unwrap();
    retry_to_active(&region, host, &coord).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_named_unlike_its_nova_host_is_mapped_and_an_unmapped_one_names_the_close_hosts() {
    let (region, claim, coord) =
        region_with_host("novahost", &["--nova-host-strip-suffix", ".example.local"]).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let nova_host = claim.host.as_str();
    let node = format!("{nova_host}.example.local");
    let unmapped = format!("{nova_host}.elsewhere.test");
    let (node, unmapped) = (node.as_str(), unmapped.as_str());
    let _agent = region.agent(node, &AgentPeers::default());
    region.create_node(node, &[]).await;
    region.create_node(unmapped, &[]).await;

    let hv = region.wait_phase(node, Phase::Active, SOON, &coord).await;
    assert_eq!(hv.spec.nova_host, nova_host);
    assert_eq!(hv.status.as_ref().and_then(|s| s.lifecycle.nova_host.as_deref()), Some(nova_host));
    assert_eq!(admin.service(nova_host).await.unwrap().unwrap()["status"], "enabled");
    wait_health(&region, &region.grpc_url(), &format!("node/{node}"), ServingStatus::Serving).await;

    // The same short name without a mapping: the condition says where to look.
    let msg = region.wait_condition(unmapped, "Onboarded", "NovaHostNotFound", &coord).await;
    assert!(msg.contains(&format!("{nova_host} (same short name as {unmapped})")), "{msg}");
    assert!(msg.contains("spec.novaHost"), "{msg}");
    assert_eq!(
        region.hypervisor(unmapped).await.and_then(|h| h.status).and_then(|s| s.phase),
        Some(Phase::Onboarding)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_ceph_pool_aborts_and_a_retry_after_the_fix_succeeds() {
    let (region, claim, coord) = region_with_host("noceph", &[]).await;
    let host = claim.host.as_str();
    let env = &region.env;
    let id = format!("e2e-{}", std::process::id());
    let pool = env.ceph.readable_pool.clone();
    let wrong = format!("profile rbd pool={}", env.ceph.forbidden_pool);
    let keyring = ceph_client(env, &id, &wrong, &region.dir).unwrap();
    let peers = AgentPeers { ceph_id: Some(id.clone()), ceph_keyring: Some(keyring), ..Default::default() };
    let _agent = region.agent(host, &peers);
    region.create_node(host, &[(POOLS, &pool)]).await;
    expect_abort(&region, host, "Tested", "ChecksFailed", &pool, &coord).await;

    set_ceph_caps(env, &id, &format!("profile rbd pool={pool}")).unwrap();
    retry_to_active(&region, host, &coord).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_keystone_password_aborts_and_a_retry_after_the_fix_succeeds() {
    let region = Region::start("badpw").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.as_str();
    let mut coord = region.coordinator(Some("not-the-password"), &[]);
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    expect_abort(&region, host, "Aborted", "KeystoneRejected", "Keystone", &coord).await;

    // The fix: the right password (the Secret is corrected, the pod restarts).
    coord.stop();
    let coord = region.coordinator(None, &[]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        region.hypervisor(host).await.unwrap().status.unwrap().phase,
        Some(Phase::Aborted),
        "Aborted holds until the retry"
    );
    retry_to_active(&region, host, &coord).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_coordinator_killed_mid_onboarding_resumes_without_repeating_nova_calls() {
    let (region, claim, mut coord) = region_with_host("restart", &[]).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let agg = unique("e2e-restart");
    let agg_id = admin.create_aggregate(&agg).await.unwrap();
    region.create_node(host, &[(AGGREGATES, &agg), (TRAITS, "CUSTOM_HV_RESTART")]).await;
    // Kill it the moment Nova shows the host in the aggregate.
    until(
        "the host in its aggregate",
        SOON,
        || coord.tail(30),
        || async {
            let aggs = admin.aggregates_of(host).await.unwrap();
            ready_when(aggs.contains(&agg), aggs)
        },
    )
    .await;
    coord.kill();
    let killed_in = region.hypervisor(host).await.and_then(|h| h.status).and_then(|s| s.phase);

    let coord = region.coordinator(None, &[]);
    let _agent = region.agent(host, &AgentPeers::default());
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let log = std::fs::read_to_string(region.env.dir.join("logs/nova-api-access.log")).unwrap();
    let adds =
        log.lines().filter(|l| l.contains(&format!("POST /v2.1/os-aggregates/{agg_id}/action"))).count();
    assert_eq!(adds, 1, "add_host sent once across the restart (killed in {killed_in:?})");
    assert!(admin.traits_of(host).await.unwrap().contains(&"CUSTOM_HV_RESTART".to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_acts_and_a_stopped_leader_hands_over() {
    let (region, claim, mut first) = region_with_host("leader", &[]).await;
    let host = claim.host.as_str();
    wait_health(&region, &region.grpc_url(), "", ServingStatus::Serving).await;
    let other_port = hv_tests::region::free_port();
    let second = region.coordinator_on(other_port, None, &[]);
    let second_url = format!("https://127.0.0.1:{other_port}");
    // The follower says it is not serving, and turns agents away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(health(&region, &second_url, "").await, Ok(ServingStatus::NotServing));
    assert_eq!(agent_connect_code(&region, &second_url, host).await, tonic::Code::Unavailable);

    // Both are Ready (a budget may let one go); only the leader's Pod
    // carries the label the Service selects.
    let pods = (first.pod.clone().unwrap(), second.pod.clone().unwrap());
    let labels = || async { (region.pod_labelled(&pods.0).await, region.pod_labelled(&pods.1).await) };
    let both_ready = || async { (readyz(&first).await, readyz(&second).await) };
    let _ = until(
        "the leader's Pod labelled",
        SOON,
        || first.tail(20),
        || async {
            let got = labels().await;
            ready_when(got == (true, false), got)
        },
    )
    .await;
    let _ = until(
        "both replicas Ready",
        SOON,
        || second.tail(20),
        || async {
            let got = both_ready().await;
            let ok = |r: &Option<(u16, String)>, role: &str| {
                r.as_ref().is_some_and(|(c, t)| *c == 200 && t.starts_with(role))
            };
            ready_when(ok(&got.0, "leader;") && ok(&got.1, "follower;"), got)
        },
    )
    .await;

    region.create_node(host, &[(SKIP_TESTS, "true")]).await;
    region.wait_phase(host, Phase::Active, SOON, &first).await;
    first.stop();
    wait_health(&region, &second_url, "", ServingStatus::Serving).await;
    // The stopped leader took its label off; the new one put its own on.
    let _ = until(
        "the label moved to the new leader",
        SOON,
        || second.tail(20),
        || async {
            let got = labels().await;
            ready_when(got == (false, true), got)
        },
    )
    .await;
    // The new leader has the node in hand: it answers for it.
    let _ = until(
        &format!("the new leader to answer for {host}"),
        SOON,
        || second.tail(30),
        || async {
            let got = health(&region, &second_url, &format!("node/{host}")).await;
            ready_when(got == Ok(ServingStatus::NotServing), got)
        },
    )
    .await;
}

/// Opens AgentService.Connect with a Hello and answers the gRPC code.
async fn agent_connect_code(region: &Region, url: &str, node: &str) -> tonic::Code {
    use hv_proto::v1::agent_message::Payload;
    use hv_proto::v1::agent_service_client::AgentServiceClient;
    use hv_proto::v1::{AgentMessage, Hello};
    let channel = hv_tests::region::connect(url, &region.pki.node(node)).await.unwrap();
    let hello = AgentMessage {
        seq: 0,
        sent_at: None,
        payload: Some(Payload::Hello(Hello { node: node.into(), ..Default::default() })),
    };
    let rsp = AgentServiceClient::new(channel).connect(tokio_stream::iter(vec![hello])).await;
    match rsp {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// What `grpcurl list` shows: the services named by server reflection.
async fn reflected_services(region: &Region, url: &str) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let channel = region.channel_to(url).await.unwrap();
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    match stream.message().await.unwrap().and_then(|r| r.message_response) {
        Some(MessageResponse::ListServicesResponse(list)) => {
            list.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer {other:?}"),
    }
}
