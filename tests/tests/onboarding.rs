//! End to end: a Kubernetes Node appears and, with no human, is onboarded
//! into Nova, tested by its agent and opened for scheduling, or stopped in
//! Aborted with a cause an SRE can act on (issue 5).
//!
//! Real `hv-coordinator`, `hv-agent` and `hvctl` binaries; the ground's real
//! Keystone, Nova, Placement, libvirtd, OVSDB and Ceph; the Kubernetes API
//! stand-in (or `KUBECONFIG`). Each test owns one Nova host, so the tests
//! run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::{Hypervisor, Phase};
use hv_tests::openstack::Admin;
use hv_tests::region::{AgentPeers, PrivateOvsdb, Proc, Region, ceph_client, set_ceph_caps};
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
async fn health(url: &str, service: &str) -> Result<ServingStatus, tonic::Code> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let channel = loop {
        match tonic::transport::Endpoint::from_shared(url.to_string()).unwrap().connect().await {
            Ok(c) => break c,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("coordinator {url}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    let rsp = HealthClient::new(channel).check(HealthCheckRequest { service: service.into() }).await;
    rsp.map(|r| r.into_inner().status()).map_err(|s| s.code())
}

async fn wait_health(url: &str, service: &str, want: ServingStatus) {
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let got = health(url, service).await;
        if got == Ok(want) {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{service} stayed {got:?}, wanted {want:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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

async fn events_for(region: &Region, name: &str) -> Vec<(String, String)> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::all(region.kube.client.clone());
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_node_is_onboarded_tested_and_activated() {
    let region = Region::start("happy").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = "compute-1";
    let agg = unique("e2e-az");
    admin.create_aggregate(&agg).await.unwrap();
    let coord = region.coordinator(None, &[]);
    let url = region.grpc_url();
    wait_health(&url, "", ServingStatus::Serving).await;
    assert_eq!(
        health(&url, &format!("node/{host}")).await,
        Err(tonic::Code::NotFound),
        "unknown before its Node"
    );

    region.create_node(host, &[(AGGREGATES, &agg), (TRAITS, "CUSTOM_HV_E2E")]).await;
    // No agent yet: the node is onboarded and waits in Testing.
    let hv = region.wait_phase(host, Phase::Testing, SOON, &coord).await;
    region.wait_condition(host, "Tested", "WaitingForAgent", &coord).await;
    assert!(admin.aggregates_of(host).await.unwrap().contains(&agg), "host added to {agg} in Nova");
    assert!(
        admin.traits_of(host).await.unwrap().contains(&"CUSTOM_HV_E2E".to_string()),
        "trait on the provider"
    );
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled", "no VM may land before the checks pass: {svc}");
    assert_eq!(health(&url, &format!("node/{host}")).await, Ok(ServingStatus::NotServing));
    let owner = hv.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owner.first().map(|o| (o.kind.as_str(), o.name.as_str())), Some(("Node", host)));

    let mut agent = region.agent(host, &AgentPeers::default());
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    let status = hv.status.clone().unwrap();
    assert!(!status.checks.is_empty() && status.checks.iter().all(|c| c.passed), "{:?}", status.checks);
    assert!(status.checks.iter().any(|c| c.name == "ovs-bridge/br-ex"));
    assert_eq!(status.lib_virt_version.as_deref().map(|v| !v.is_empty()), Some(true));
    assert_eq!(status.service_id.as_deref(), svc["id"].as_str());
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled", "scheduling opened in Nova");
    wait_health(&url, &format!("node/{host}"), ServingStatus::Serving).await;
    let reasons: Vec<String> = events_for(&region, host).await.into_iter().map(|e| e.0).collect();
    for phase in ["Onboarding", "Testing", "Ready", "Active"] {
        assert!(reasons.iter().any(|r| r == phase), "an Event for {phase}: {reasons:?}");
    }

    // Someone re-enables... here: disables the host behind our back. The
    // drift check puts it back and says so.
    admin
        .set_service(host, serde_json::json!({"status": "disabled", "disabled_reason": "by hand"}))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + SOON;
    while admin.service(host).await.unwrap().unwrap()["status"] != "enabled" {
        assert!(tokio::time::Instant::now() < deadline, "drift not repaired:\n{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let events = events_for(&region, host).await;
        if events.iter().any(|e| e.0 == "DriftRepaired" && e.1.contains("by hand")) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a DriftRepaired Event naming the old reason: {events:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The fleet API, through the real hvctl.
    let out = std::process::Command::new(hv_tests::region::bin("hvctl"))
        .args(["--coordinator", &url, "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with(host) && l.contains("Active") && l.contains("yes")), "{text}");

    // Reflection: grpcurl and grpc_health_probe need no proto files.
    let services = reflected_services(&url).await;
    for svc in ["hv.v1.AgentService", "hv.v1.FleetService", "grpc.health.v1.Health"] {
        assert!(services.iter().any(|s| s == svc), "{svc} listed by reflection: {services:?}");
    }

    // Maintenance on the empty host, then cleared: the agent's checks run
    // again (a new test run) before scheduling reopens.
    let run_before = hv.status.as_ref().map_or(0, |s| s.lifecycle.test_run);
    let hvs: kube::Api<Hypervisor> = kube::Api::all(region.kube.client.clone());
    let patch = serde_json::json!({"spec": {"maintenance": "manual", "maintenanceReason": "kernel update"}});
    hvs.patch(host, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    region.wait_phase(host, Phase::Maintenance, SOON, &coord).await;
    let svc = admin.service(host).await.unwrap().unwrap();
    assert_eq!(svc["status"], "disabled");
    assert!(svc["disabled_reason"].as_str().unwrap_or_default().contains("kernel update"), "{svc}");
    wait_health(&url, &format!("node/{host}"), ServingStatus::NotServing).await;
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
    wait_health(&url, &format!("node/{host}"), ServingStatus::Serving).await;

    // The agent goes away: the node stops answering SERVING at once.
    agent.kill();
    wait_health(&url, &format!("node/{host}"), ServingStatus::NotServing).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_tests_goes_straight_to_ready_and_active() {
    let region = Region::start("skip").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = "compute-2";
    let coord = region.coordinator(None, &[]);
    region.create_node(host, &[(SKIP_TESTS, "true")]).await;
    let hv = region.wait_phase(host, Phase::Active, SOON, &coord).await;
    assert_eq!(Region::condition(&hv, "Tested").1, "Skipped");
    assert!(hv.status.unwrap().checks.is_empty(), "no checks ran");
    let phases: Vec<String> = events_for(&region, host).await.into_iter().map(|e| e.0).collect();
    assert!(!phases.iter().any(|p| p == "Testing"), "never in Testing: {phases:?}");
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_aggregate_aborts_and_a_retry_after_the_fix_succeeds() {
    let region = Region::start("noagg").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = "compute-3";
    let agg = unique("e2e-missing");
    let coord = region.coordinator(None, &[]);
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
async fn a_missing_br_ex_aborts_and_a_retry_after_the_fix_succeeds() {
    let region = Region::start("nobrex").await;
    let host = "compute-4";
    let ovs = PrivateOvsdb::start(&region.dir, &["br-int"]).unwrap();
    let coord = region.coordinator(None, &[]);
    let _agent = region.agent(host, &AgentPeers { ovsdb: Some(ovs.remote.clone()), ..Default::default() });
    region.create_node(host, &[]).await;
    let hv = expect_abort(&region, host, "Tested", "ChecksFailed", "br-ex", &coord).await;
    let failed: Vec<String> =
        hv.status.unwrap().checks.into_iter().filter(|c| !c.passed).map(|c| c.name).collect();
    assert_eq!(failed, vec!["ovs-bridge/br-ex".to_string()]);

    ovs.add_bridge("br-ex").unwrap();
    retry_to_active(&region, host, &coord).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreadable_ceph_pool_aborts_and_a_retry_after_the_fix_succeeds() {
    let region = Region::start("noceph").await;
    let host = "compute-5";
    let env = &region.env;
    let id = format!("e2e-{}", std::process::id());
    let pool = env.ceph.readable_pool.clone();
    let wrong = format!("profile rbd pool={}", env.ceph.forbidden_pool);
    let keyring = ceph_client(env, &id, &wrong, &region.dir).unwrap();
    let coord = region.coordinator(None, &[]);
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
    let host = "compute-6";
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
    let region = Region::start("restart").await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = "compute-7";
    let agg = unique("e2e-restart");
    let agg_id = admin.create_aggregate(&agg).await.unwrap();
    let mut coord = region.coordinator(None, &[]);
    region.create_node(host, &[(AGGREGATES, &agg), (TRAITS, "CUSTOM_HV_RESTART")]).await;
    // Kill it the moment Nova shows the host in the aggregate.
    let deadline = tokio::time::Instant::now() + SOON;
    while !admin.aggregates_of(host).await.unwrap().contains(&agg) {
        assert!(tokio::time::Instant::now() < deadline, "never added:\n{}", coord.tail(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let region = Region::start("leader").await;
    let host = "compute-8";
    let mut first = region.coordinator(None, &[]);
    wait_health(&region.grpc_url(), "", ServingStatus::Serving).await;
    let other_port = hv_tests::region::free_port();
    let second = region.coordinator_on(other_port, None, &[]);
    let second_url = format!("http://127.0.0.1:{other_port}");
    // The follower says it is not serving, and turns agents away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(health(&second_url, "").await, Ok(ServingStatus::NotServing));
    assert_eq!(agent_connect_code(&second_url).await, tonic::Code::Unavailable);

    region.create_node(host, &[(SKIP_TESTS, "true")]).await;
    region.wait_phase(host, Phase::Active, SOON, &first).await;
    first.stop();
    wait_health(&second_url, "", ServingStatus::Serving).await;
    // The new leader has the node in hand: it answers for it.
    let deadline = tokio::time::Instant::now() + SOON;
    while health(&second_url, &format!("node/{host}")).await != Ok(ServingStatus::NotServing) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "new leader never reconciled {host}:\n{}",
            second.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens AgentService.Connect with a Hello and answers the gRPC code.
async fn agent_connect_code(url: &str) -> tonic::Code {
    use hv_proto::v1::agent_message::Payload;
    use hv_proto::v1::agent_service_client::AgentServiceClient;
    use hv_proto::v1::{AgentMessage, Hello};
    let channel = tonic::transport::Endpoint::from_shared(url.to_string()).unwrap().connect().await.unwrap();
    let hello = AgentMessage {
        seq: 0,
        sent_at: None,
        payload: Some(Payload::Hello(Hello { node: "compute-8".into(), ..Default::default() })),
    };
    let rsp = AgentServiceClient::new(channel).connect(tokio_stream::iter(vec![hello])).await;
    match rsp {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// What `grpcurl list` shows: the services named by server reflection.
async fn reflected_services(url: &str) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let channel = tonic::transport::Endpoint::from_shared(url.to_string()).unwrap().connect().await.unwrap();
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
