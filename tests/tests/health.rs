//! Node health on the real ground (docs/health.md): the real coordinator
//! judges a host from its agent's stream and signals, its Node's `Ready`
//! condition and Nova's view of its nova-compute, and records the verdict.
//! The host signals come from a fake /proc the agent is pointed at.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_coordinator::api::hypervisor::{HealthState, HealthStatus};
use hv_coordinator::health::marks::{self, Marks};
use hv_tests::hosts;
use hv_tests::region::{AgentPeers, Proc, Region, metric};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

const SOON: Duration = Duration::from_secs(60);

/// Waits until the host's recorded health is `want`; answers it.
async fn wait_health(region: &Region, host: &str, want: HealthState, coord: &Proc) -> HealthStatus {
    until(
        &format!("{host} {want}"),
        SOON,
        || coord.tail(30),
        || async {
            match region.hypervisor(host).await.and_then(|h| h.status).and_then(|s| s.health) {
                Some(h) if h.state == want => Poll::Ready(h),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_is_judged_from_its_agent_its_node_and_nova_and_nothing_is_failed_on_one_source() {
    let region = Region::start("health").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    let coord = region.coordinator(None, &["--skip-tests", "--node-not-ready-grace", "1s"]);
    let root = hv_tests::region::healthy_host(&region.dir.join("host"));
    let peers = AgentPeers { host_root: Some(root.clone()), ..Default::default() };
    let mut agent = region.agent(&host, &peers);
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    let healthy = wait_health(&region, &host, HealthState::Healthy, &coord).await;
    assert!(healthy.evidence.is_empty(), "{healthy:?}");
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(Region::condition(&hv, "NodeHealthy").0, "True");
    // The Node says so too, for Kubernetes-side tooling: labelled, with the
    // time the agent was last heard from.
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    let wait_marks = |coord: &Proc, what: &'static str, want: fn(&Marks) -> bool| {
        let (nodes, host, tail) = (nodes.clone(), host.clone(), coord.tail(20));
        async move {
            until(
                what,
                SOON,
                || tail.clone(),
                || async {
                    let m = marks::of(&nodes.get(&host).await.unwrap());
                    hv_tests::wait::ready_when(want(&m), m)
                },
            )
            .await
        }
    };
    wait_marks(&coord, "the Node marked", |m| m.schedulable && m.heartbeat.is_some()).await;

    // A critical host signal: the root filesystem turns read-only.
    std::fs::write(root.join("proc/1/mounts"), "/dev/vda1 / ext4 ro,relatime 0 0\n").unwrap();
    let degraded = wait_health(&region, &host, HealthState::Degraded, &coord).await;
    assert!(
        degraded.evidence.iter().any(|e| e.starts_with("root-read-only (critical): / is mounted read-only")),
        "{degraded:?}"
    );
    wait_marks(&coord, "a Degraded host's Node without the label", |m| !m.schedulable).await;
    let hv = region.hypervisor(&host).await.unwrap();
    let (status, reason, message) = Region::condition(&hv, "NodeHealthy");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Degraded"), "{message}");
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active), "recorded, nothing done yet");
    let events = region.events_for(&host).await;
    assert!(
        events.iter().any(|(r, n)| r == "HealthDegraded" && n.starts_with("Healthy -> Degraded")),
        "{events:?}"
    );
    // What an SRE sees.
    let out = region.hvctl().args(["get", &host]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("health:      Degraded since "), "{text}");
    assert!(text.contains("  root-read-only (critical): / is mounted read-only"), "{text}");
    let out = region.hvctl().arg("list").output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    let row = list.lines().find(|l| l.starts_with(host.as_str())).unwrap_or_default();
    assert_eq!(row.split_whitespace().nth(2), Some("Degraded"), "{list}");
    // It ends: the host is Healthy again.
    std::fs::write(root.join("proc/1/mounts"), "/dev/vda1 / ext4 rw,relatime 0 0\n").unwrap();
    wait_health(&region, &host, HealthState::Healthy, &coord).await;

    // Only the agent's stream is lost (the Node stays Ready, Nova sees
    // nova-compute up): Unreachable, and it stays so, never Failed.
    agent.kill();
    let unreachable = wait_health(&region, &host, HealthState::Unreachable, &coord).await;
    assert!(unreachable.evidence[0].starts_with("agent: no session since "), "{unreachable:?}");
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = region.hypervisor(&host).await.and_then(|h| h.status).and_then(|s| s.health).unwrap();
        assert_eq!(h.state, HealthState::Unreachable, "one source is never Failed: {h:?}");
    }
    // A second, independent source: the kubelet stops posting.
    let not_ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
        "reason": "NodeStatusUnknown", "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    nodes.patch_status(&host, &PatchParams::default(), &Patch::Merge(&not_ready)).await.unwrap();
    let failed = wait_health(&region, &host, HealthState::Failed, &coord).await;
    assert!(failed.evidence.iter().any(|e| e.starts_with("Node: not Ready since")), "{failed:?}");
    let events = region.events_for(&host).await;
    assert!(events.iter().any(|(r, _)| r == "HealthFailed"), "{events:?}");

    // Both come back: Healthy.
    let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "lastTransitionTime": jiff::Timestamp::now().to_string()}]}});
    nodes.patch_status(&host, &PatchParams::default(), &Patch::Merge(&ready)).await.unwrap();
    let back = region.agent(&host, &peers);
    wait_health(&region, &host, HealthState::Healthy, &coord).await;
    wait_marks(&coord, "the label back", |m| m.schedulable).await;
    let url = coord.metrics.as_deref().unwrap();
    for (state, at_least) in [("Degraded", 1.0), ("Unreachable", 1.0), ("Failed", 1.0), ("Healthy", 2.0)] {
        let n = metric(url, &format!("hv_health_transitions_total{{to=\"{state}\"}}")).await;
        assert!(n.is_some_and(|n| n >= at_least), "{state}: {n:?}");
    }
    assert_eq!(metric(url, "hv_hypervisors_by_health{state=\"Healthy\"}").await, Some(1.0));

    // A warning is shown and changes nothing: an agent whose ovsdb-server
    // refuses it stays Healthy, the loss in the evidence.
    drop(back);
    let refused =
        AgentPeers { ovsdb: Some(format!("tcp:127.0.0.1:{}", hv_tests::region::free_port())), ..peers };
    let _agent = region.agent(&host, &refused);
    let healthy = until(
        "the OVSDB warning",
        SOON,
        || coord.tail(30),
        || async {
            match region.hypervisor(&host).await.and_then(|h| h.status).and_then(|s| s.health) {
                Some(h) if h.evidence.iter().any(|e| e.starts_with("ovsdb-unreachable (warning)")) => {
                    Poll::Ready(h)
                }
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(healthy.state, HealthState::Healthy, "{healthy:?}");
}
