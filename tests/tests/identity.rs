//! Agents' certificates from the cluster (docs/agent-identity.md), on the
//! ground's real API server: the agent pod bound to a node gets that
//! node's certificate on its token and opens its session, and renews a
//! 2-minute certificate twice without its session losing a message; a
//! token of another ServiceAccount, of a pod not ours, of our pod on
//! another node, an expired, a replayed and another audience's token get
//! nothing, nor does a deleted Node.
//!
//! The agent pods are objects kwok runs on the test's Nodes, controlled by
//! the chart's agent DaemonSet (no DaemonSet controller runs on the
//! ground); their tokens come from the API server's TokenRequest, bound to
//! them, as the kubelet projects them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::time::Duration;

use hv_coordinator::api::{Hypervisor, Phase};
use hv_tests::hosts;
use hv_tests::identity::{AUDIENCE, agent_daemon_set, agent_pod, expired, issue};
use hv_tests::kube_target::pod_token;
use hv_tests::pki::Pki;
use hv_tests::region::{AgentPeers, Proc, Region, free_port, metric, metric_sum};
use hv_tests::wait::{ready_when, until};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};

/// The chart's agents as the coordinator is told of them, and a signing
/// CA of this test's own.
struct Agents {
    namespace: String,
    daemon_set: String,
    uid: String,
    account: String,
    signer: Pki,
    bootstrap_port: u16,
}

impl Agents {
    async fn of(region: &Region) -> Agents {
        let ns = region.env.kube.chart.namespace.clone();
        let (namespace, daemon_set, uid, account) = agent_daemon_set(&region.kube.client, &ns).await;
        let signer = Pki::new(&region.dir.join("signer"), "hv-agent-signer");
        Agents { namespace, daemon_set, uid, account, signer, bootstrap_port: free_port() }
    }

    fn bootstrap_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.bootstrap_port)
    }

    /// A coordinator that signs agents' certificates living `life`.
    fn coordinator(&self, region: &Region, life: &str) -> Proc {
        let listen = format!("127.0.0.1:{}", self.bootstrap_port);
        let (cert, key) =
            (self.signer.ca.display().to_string(), self.signer.ca_key_file().display().to_string());
        let account = format!("{}/{}", self.namespace, self.account);
        let (ca, config_map) = (region.server_tls.ca.display().to_string(), self.ca_config_map(region));
        region.coordinator(
            None,
            &[
                "--skip-tests",
                "--publish-server-ca",
                &ca,
                "--publish-server-ca-configmap",
                &config_map,
                "--identity-listen",
                &listen,
                "--agent-signer-cert",
                &cert,
                "--agent-signer-key",
                &key,
                "--agent-service-account",
                &account,
                "--agent-daemonset",
                &self.daemon_set,
                "--agent-certificate-life",
                life,
            ],
        )
    }

    /// Where the coordinator publishes its CA for the agents.
    fn ca_config_map(&self, region: &Region) -> String {
        format!("ca-{}", region.id)
    }

    /// An agent pod `name` on `node`, ours or not.
    async fn pod(&self, region: &Region, name: &str, node: &str, ours: bool) {
        let owner = ours.then_some((self.daemon_set.as_str(), self.uid.as_str()));
        agent_pod(&region.kube.client, &self.namespace, name, node, &self.account, owner).await;
    }

    fn token(&self, region: &Region, pod: &str) -> String {
        pod_token(&region.env, &self.namespace, &self.account, pod, AUDIENCE, 10).unwrap()
    }

    async fn remove_pods(&self, region: &Region) {
        let api: Api<Pod> = Api::namespaced(region.kube.client.clone(), &self.namespace);
        let lp = ListParams::default().labels("app.kubernetes.io/component=agent-test");
        let _ = api.delete_collection(&DeleteParams::default(), &lp).await;
    }
}

/// The coordinator's count of certificates refused for `reason`.
async fn refused(coord: &Proc, reason: &str) -> f64 {
    let name = format!("hv_coordinator_agent_certificate_refusals_total{{reason=\"{reason}\"}}");
    metric(coord.metrics.as_deref().unwrap(), &name).await.unwrap_or(-1.0)
}

async fn issued(coord: &Proc, via: &str) -> f64 {
    let name = format!("hv_coordinator_agent_certificates_issued_total{{via=\"{via}\"}}");
    metric(coord.metrics.as_deref().unwrap(), &name).await.unwrap_or(-1.0)
}

/// The node the first certificate of a PEM chain names.
fn node_of(chain_pem: &[u8]) -> Option<String> {
    let leaf = rustls_pki_types::pem::PemObject::pem_slice_iter(chain_pem).next()?.ok()?;
    hv_tls::node_of(&leaf, "hypervisor.cloud.sap")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_agent_pod_gets_its_nodes_certificate_and_renews_a_short_one_twice_losing_nothing() {
    let region = Region::start("identity").await;
    let agents = Agents::of(&region).await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    // A ConfigMap left with a stale CA (an earlier install's): written over.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(region.kube.client.clone(), &agents.namespace);
    let stale: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": agents.ca_config_map(&region)},
        "data": {"ca.crt": "-----BEGIN CERTIFICATE-----\nstale\n-----END CERTIFICATE-----\n", "note": "a hand's"},
    }))
    .unwrap();
    cms.create(&kube::api::PostParams::default(), &stale).await.unwrap();
    let coord = agents.coordinator(&region, "2m");
    region.create_node(&host, &[]).await;
    let pod = format!("agent-{}", region.id);
    agents.pod(&region, &pod, &host, true).await;
    let token_file: PathBuf = region.dir.join("token");
    std::fs::write(&token_file, agents.token(&region, &pod)).unwrap();
    let kept = region.dir.join("identity");
    let agent = region.agent_from_coordinator(
        &host,
        &AgentPeers::default(),
        &agents.bootstrap_url(),
        &token_file,
        &kept,
    );
    region.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
    region.wait_condition(&host, "AgentConnected", "Connected", &coord).await;
    assert_eq!(issued(&coord, "bootstrap").await, 1.0);
    // The coordinator's CA, published for the agents' mounts over the
    // stale one; the hand's other key stays.
    let want = std::fs::read_to_string(&region.server_tls.ca).unwrap();
    let data = until(
        "the CA published",
        Duration::from_secs(30),
        || coord.tail(10),
        || async {
            let cm = cms.get_opt(&agents.ca_config_map(&region)).await.unwrap();
            let data = cm.and_then(|c| c.data).unwrap_or_default();
            ready_when(data.get("ca.crt") == Some(&want), data)
        },
    )
    .await;
    assert_eq!(data.get("note").map(String::as_str), Some("a hand's"));
    // Deleted by a hand: made again (looked at below, after the renewals).
    cms.delete(&agents.ca_config_map(&region), &DeleteParams::default()).await.unwrap();
    let chain = std::fs::read(kept.join("identity.pem")).unwrap();
    assert_eq!(node_of(&chain).as_deref(), Some(host.as_str()), "the certificate names the pod's node");

    // A 2-minute certificate, renewed at 80 s (less the agent's draw): two
    // renewals, each a new session, in about three minutes.
    let agent_url = agent.agent_metrics().unwrap();
    let connected_since = |hv: &Hypervisor| {
        let c = hv
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "AgentConnected").cloned());
        c.map(|c| (c.status, c.last_transition_time))
    };
    let before = connected_since(&region.hypervisor(&host).await.unwrap());
    assert_eq!(before.as_ref().map(|b| b.0.as_str()), Some("True"));
    until(
        "two renewals",
        Duration::from_secs(240),
        || format!("{}\n{}", agent.tail(10), coord.tail(10)),
        || async {
            let renewed = issued(&coord, "renewal").await;
            ready_when(renewed >= 2.0, renewed)
        },
    )
    .await;
    until(
        "the third session, with the last certificate",
        Duration::from_secs(30),
        || agent.tail(10),
        || async {
            let n = metric(&agent_url, "hv_agent_session_connects_total").await;
            ready_when(n == Some(3.0), n)
        },
    )
    .await;
    // Nothing lost: every message acknowledged, none dropped, and the host
    // never left Active nor lost its agent.
    until(
        "the outbox emptied",
        Duration::from_secs(30),
        || agent.tail(10),
        || async {
            let held = metric(&agent_url, "hv_agent_outbox_messages").await;
            ready_when(held == Some(0.0), held)
        },
    )
    .await;
    assert_eq!(metric(&agent_url, "hv_agent_dropped_messages_total").await, Some(0.0));
    let back =
        cms.get_opt(&agents.ca_config_map(&region)).await.unwrap().and_then(|c| c.data).unwrap_or_default();
    assert_eq!(back.get("ca.crt"), Some(&want), "the deleted ConfigMap made again");
    assert_eq!(
        metric(&agent_url, "hv_agent_session_stream_errors_total").await,
        Some(0.0),
        "no session broke"
    );
    // Each new session replaced the one before while it was still open:
    // the coordinator never saw the node without its agent.
    let coord_url = coord.metrics.as_deref().unwrap();
    assert_eq!(metric(coord_url, "hv_coordinator_agent_sessions_replaced_total").await, Some(2.0));
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
    assert_eq!(connected_since(&hv), before, "AgentConnected never changed");
    assert_eq!(issued(&coord, "bootstrap").await, 1.0, "renewals over mutual TLS, never the token alone");
    // The fleet's oldest certificate: the one now in use, under 2 minutes away.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let end =
        metric_sum(coord.metrics.as_deref().unwrap(), "hv_coordinator_agent_certificate_expiry_min_seconds ")
            .await
            .unwrap();
    assert!(end > now && end <= now + 130.0, "{end} against {now}");
    drop(agent);
    agents.remove_pods(&region).await;
    let _ = cms.delete(&agents.ca_config_map(&region), &DeleteParams::default()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn no_token_but_our_agent_pods_own_on_its_node_gets_a_certificate() {
    let region = Region::start("idrefuse").await;
    let agents = Agents::of(&region).await;
    let coord = agents.coordinator(&region, "24h");
    let (node_a, node_b) = (format!("{}-a", region.id), format!("{}-b", region.id));
    region.create_node(&node_a, &[]).await;
    region.create_node(&node_b, &[]).await;
    let (ours_a, ours_b, stray_a) = (
        format!("agent-{}-a", region.id),
        format!("agent-{}-b", region.id),
        format!("stray-{}-a", region.id),
    );
    agents.pod(&region, &ours_a, &node_a, true).await;
    agents.pod(&region, &ours_b, &node_b, true).await;
    agents.pod(&region, &stray_a, &node_a, false).await;
    let (url, ca) = (agents.bootstrap_url(), region.server_tls.ca.clone());
    region.wait_leading(&coord).await;
    let none = issue(&url, &ca, &node_a, "").await.unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "no token: {none:?}");

    // Our pod on node-a: node-a's certificate, once.
    let good = agents.token(&region, &ours_a);
    let got = issue(&url, &ca, &node_a, &good).await.unwrap();
    assert_eq!(node_of(got.certificate_chain_pem.as_bytes()).as_deref(), Some(node_a.as_str()));
    // Node-a's certificate from another CA the gRPC port trusts (its
    // client CA): it opens no session while certificates come from the
    // coordinator.
    let elsewhere = region.pki.node(&node_a);
    let channel = hv_tests::region::connect(&region.grpc_url(), &elsewhere).await.unwrap();
    let hello = hv_proto::v1::AgentMessage {
        seq: 0,
        sent_at: None,
        payload: Some(hv_proto::v1::agent_message::Payload::Hello(hv_proto::v1::Hello {
            node: node_a.clone(),
            ..Default::default()
        })),
    };
    let session = hv_proto::v1::agent_service_client::AgentServiceClient::new(channel)
        .connect(tokio_stream::iter(vec![hello]))
        .await
        .unwrap_err();
    assert_eq!(session.code(), tonic::Code::PermissionDenied, "{session:?}");
    let replay = issue(&url, &ca, &node_a, &good).await.unwrap_err();
    assert_eq!(replay.code(), tonic::Code::Unauthenticated, "{replay:?}");
    assert_eq!(refused(&coord, "replayed").await, 1.0);

    // Our pod on node-b asking for node-a.
    let b = agents.token(&region, &ours_b);
    let wrong = issue(&url, &ca, &node_a, &b).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::PermissionDenied, "{wrong:?}");
    assert_eq!(refused(&coord, "wrong_node").await, 1.0);

    // A pod of the agents' ServiceAccount that our DaemonSet does not control.
    let stray = agents.token(&region, &stray_a);
    let not_ours = issue(&url, &ca, &node_a, &stray).await.unwrap_err();
    assert_eq!(not_ours.code(), tonic::Code::PermissionDenied, "{not_ours:?}");
    assert_eq!(refused(&coord, "pod_not_ours").await, 1.0);

    // Another ServiceAccount's token, bound to its pod, for our audience.
    let other_pod = format!("other-{}", region.id);
    let chart = &region.env.kube.chart;
    region.coordinator_pod(
        &hv_tests::region::Install {
            namespace: chart.namespace.clone(),
            account: chart.coordinator_account.clone(),
        },
        &other_pod,
    );
    let other =
        pod_token(&region.env, &chart.namespace, &chart.coordinator_account, &other_pod, AUDIENCE, 10)
            .unwrap();
    let account = issue(&url, &ca, &node_a, &other).await.unwrap_err();
    assert_eq!(account.code(), tonic::Code::PermissionDenied, "{account:?}");
    assert_eq!(refused(&coord, "wrong_account").await, 1.0);

    // Expired (signed with the ground's own key), and for the API server's
    // audience: the API server does not vouch for either.
    let old = expired(&region.env, &agents.token(&region, &ours_a));
    let late = issue(&url, &ca, &node_a, &old).await.unwrap_err();
    assert_eq!(late.code(), tonic::Code::Unauthenticated, "{late:?}");
    assert!(late.message().contains("expired"), "the API server's reason: {late:?}");
    let api_token = pod_token(
        &region.env,
        &agents.namespace,
        &agents.account,
        &ours_a,
        "https://kubernetes.default.svc",
        10,
    )
    .unwrap();
    let audience = issue(&url, &ca, &node_a, &api_token).await.unwrap_err();
    assert_eq!(audience.code(), tonic::Code::Unauthenticated, "{audience:?}");
    assert_eq!(refused(&coord, "token_invalid").await, 3.0, "no token, expired, another audience");

    // node-b deleted: its pod's token gets nothing for it again.
    let fresh_b = agents.token(&region, &ours_b);
    let nodes: Api<Node> = Api::all(region.kube.client.clone());
    // Held by the coordinator's finalizer until its host is decommissioned:
    // being deleted is enough.
    nodes.delete(&node_b, &DeleteParams::default()).await.unwrap();
    let gone = issue(&url, &ca, &node_b, &fresh_b).await.unwrap_err();
    assert!(
        matches!(gone.code(), tonic::Code::PermissionDenied | tonic::Code::Unauthenticated),
        "a deleted Node's pod, or its token, refused: {gone:?}"
    );
    assert_eq!(gone.code(), tonic::Code::PermissionDenied, "{gone:?}");
    assert_eq!(refused(&coord, "node_gone").await, 1.0);
    assert_eq!(issued(&coord, "bootstrap").await, 1.0, "one certificate in all");
    let log = std::fs::read_to_string(&coord.log).unwrap();
    assert!(log.contains("agent certificate refused"), "each refusal logged");
    agents.remove_pods(&region).await;
    let pods: Api<Pod> = Api::namespaced(region.kube.client.clone(), &chart.namespace);
    let _ = pods.delete(&other_pod, &DeleteParams::default()).await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(region.kube.client.clone(), &chart.namespace);
    let _ = cms.delete(&agents.ca_config_map(&region), &DeleteParams::default()).await;
}
