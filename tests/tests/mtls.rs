//! Only real agents speak for their node: mutual TLS between the real
//! `hv-coordinator` and its clients, with certificates made per test
//! (`hv_tests::pki`). A certificate names one node; a Hello for another is
//! refused and the node's real session stays; no certificate, one past its
//! end and one from another CA are refused at the handshake; certificates
//! and the client CA rotated on disk are used without a restart; an agent's
//! session ends when its certificate does, and it comes back with the one
//! renewed on disk. A node's certificate reads its own Hypervisor and
//! health only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_client::AgentServiceClient;
use hv_proto::v1::fleet_service_client::FleetServiceClient;
use hv_proto::v1::{AgentMessage, GetHypervisorRequest, Hello, ListHypervisorsRequest};
use hv_tests::hosts;
use hv_tests::pki::{Pki, Usage};
use hv_tests::region::{AgentPeers, Proc, Region, connect, metric};
use hv_tests::wait::{Poll, ready_when, until};
use hv_tls::TlsFiles;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const SOON: Duration = Duration::from_secs(60);

/// Whether the coordinator at `url` answers a health check of a client
/// with `tls`; the error says why not (refused at the handshake or after).
async fn answers(url: &str, tls: &TlsFiles) -> Result<(), String> {
    let channel = connect(url, tls).await?;
    let rsp = HealthClient::new(channel).check(HealthCheckRequest { service: String::new() }).await;
    rsp.map(|_| ()).map_err(|s| s.to_string())
}

/// Waits until the coordinator answers a client with `tls`.
async fn serving_to(region: &Region, coord: &Proc, tls: &TlsFiles) {
    let url = region.grpc_url();
    let ready = || async {
        match answers(&url, tls).await {
            Ok(()) => Poll::Ready(()),
            Err(e) => Poll::Pending(e),
        }
    };
    until("the coordinator over TLS", Duration::from_secs(30), || coord.tail(20), ready).await;
}

async fn serving(region: &Region, coord: &Proc) {
    serving_to(region, coord, &region.sre_tls).await;
}

/// A Hello for `node` over a connection made with `tls`: the gRPC code.
async fn hello_as(region: &Region, tls: &TlsFiles, node: &str) -> Result<tonic::Code, String> {
    let channel = connect(&region.grpc_url(), tls).await?;
    let hello = AgentMessage {
        seq: 0,
        sent_at: None,
        payload: Some(Payload::Hello(Hello { node: node.into(), ..Default::default() })),
    };
    match AgentServiceClient::new(channel).connect(tokio_stream::iter(vec![hello])).await {
        Ok(_) => Ok(tonic::Code::Ok),
        Err(s) => Ok(s.code()),
    }
}

/// The agent's count of sessions opened.
const CONNECTS: &str = "hv_agent_session_connects_total";

/// Waits for the agent's first session; answers its metrics URL.
async fn first_session(agent: &Proc) -> String {
    let agent_url = until(
        "the agent's metrics",
        Duration::from_secs(10),
        || agent.tail(10),
        || async { hv_tests::wait::ready_if(agent.agent_metrics()) },
    )
    .await;
    until(
        "the agent's session",
        Duration::from_secs(20),
        || agent.tail(10),
        || async {
            let n = metric(&agent_url, CONNECTS).await;
            ready_when(n == Some(1.0), n)
        },
    )
    .await;
    agent_url
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_for_one_node_cannot_speak_for_another_and_the_real_session_stays() {
    let region = Region::start("forged").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    let coord = region.coordinator(None, &["--skip-tests"]);
    let agent = region.agent(&host, &AgentPeers::default());
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    let agent_url = first_session(&agent).await;

    // node-a's certificate, a Hello for the real host: refused by name.
    let forged = region.pki.node("node-a");
    assert_eq!(hello_as(&region, &forged, &host).await, Ok(tonic::Code::PermissionDenied));
    assert_eq!(hello_as(&region, &forged, &host).await, Ok(tonic::Code::PermissionDenied));
    // An SRE's certificate names no node either.
    assert_eq!(hello_as(&region, &region.sre_tls, &host).await, Ok(tonic::Code::PermissionDenied));
    let refused =
        metric(coord.metrics.as_deref().unwrap(), "hv_coordinator_agent_sessions_refused_total").await;
    assert_eq!(refused, Some(3.0));
    assert!(std::fs::read_to_string(&coord.log).unwrap().contains("refused an agent session"), "logged");

    // The real session was never replaced: the agent did not reconnect,
    // and the node stays Active with its agent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(metric(&agent_url, CONNECTS).await, Some(1.0), "the real agent's session was untouched");
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
    // The node's own certificate is let through (the agent's, issued again).
    let own = region.pki.node(&host);
    assert_eq!(hello_as(&region, &own, &host).await, Ok(tonic::Code::Ok));

    // Who may read what: a node's certificate reads its own Hypervisor and
    // health only; an SRE's reads all.
    let url = region.grpc_url();
    let listed = |tls: TlsFiles| {
        let url = url.clone();
        async move {
            let channel = connect(&url, &tls).await.unwrap();
            let rsp =
                FleetServiceClient::new(channel).list_hypervisors(ListHypervisorsRequest::default()).await;
            rsp.map(|r| r.into_inner().hypervisors.into_iter().map(|h| h.name).collect::<Vec<_>>())
                .map_err(|s| s.code())
        }
    };
    assert_eq!(listed(own.clone()).await, Ok(vec![host.clone()]));
    assert_eq!(listed(forged.clone()).await, Ok(vec![]), "another node's Hypervisor is not listed");
    assert!(listed(region.sre_tls.clone()).await.unwrap().contains(&host));
    let get = FleetServiceClient::new(connect(&url, &forged).await.unwrap())
        .get_hypervisor(GetHypervisorRequest { name: host.clone() })
        .await;
    assert_eq!(get.map(|_| ()).map_err(|s| s.code()), Err(tonic::Code::PermissionDenied));
    let service = format!("node/{host}");
    let health = |tls: TlsFiles, service: String| {
        let url = url.clone();
        async move {
            let channel = connect(&url, &tls).await.unwrap();
            let rsp = HealthClient::new(channel).check(HealthCheckRequest { service }).await;
            rsp.map(|_| ()).map_err(|s| s.code())
        }
    };
    assert_eq!(health(forged.clone(), service.clone()).await, Err(tonic::Code::PermissionDenied));
    assert_eq!(health(own.clone(), service.clone()).await, Ok(()));
    assert_eq!(health(forged, String::new()).await, Ok(()), "the coordinator's own health is anyone's");
    assert_eq!(health(region.sre_tls.clone(), service).await, Ok(()));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_certificate_an_expired_one_and_one_from_another_ca_are_refused_at_the_handshake() {
    let region = Region::start("refused").await;
    let coord = region.coordinator(None, &[]);
    serving(&region, &coord).await;
    let url = region.grpc_url();

    // No client certificate: only the CA, to trust the server.
    let bare = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(&region.sre_tls.ca).unwrap()));
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone()).unwrap().tls_config(bare).unwrap();
    let none = match endpoint.connect().await {
        Ok(c) => HealthClient::new(c).check(HealthCheckRequest { service: String::new() }).await.err(),
        Err(e) => Some(tonic::Status::unavailable(hv_tls::explain(&e))),
    };
    assert!(none.is_some(), "a client without a certificate got an answer");

    let expired = region.pki.issue("expired", Usage::Client, vec![region.pki.node_san("node-x")], true);
    let other = Pki::new(&region.dir.join("other-pki"), "other-ca");
    let mut foreign = other.node("node-x");
    foreign.ca = region.sre_tls.ca.clone(); // it trusts the right server; its own CA is foreign
    for (what, tls) in [("expired", &expired), ("another CA's", &foreign)] {
        assert!(answers(&url, tls).await.is_err(), "an {what} certificate got an answer");
    }
    let failed =
        metric(coord.metrics.as_deref().unwrap(), "hv_coordinator_grpc_tls_handshakes_failed_total").await;
    assert!(failed.is_some_and(|n| n >= 3.0), "three handshakes refused and counted: {failed:?}");
    assert!(region.channel_to(&url).await.is_ok(), "the SRE's certificate still works");
}

/// Writes `from` over `to` the way a Secret volume does: a new file renamed
/// into place.
fn replace(from: &std::path::Path, to: &std::path::Path) {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_certificate_and_ca_are_used_without_a_restart() {
    let region = Region::start("rotate").await;
    let coord = region.coordinator(None, &[]);
    serving(&region, &coord).await;
    let url = region.grpc_url();
    let pid = coord.pid();

    // A new CA: the coordinator's certificate and its client CA rotated on
    // disk, as cert-manager does.
    let next = Pki::new(&region.dir.join("next-pki"), "next-ca");
    let server = next.server();
    replace(&server.key, &region.server_tls.key);
    replace(&server.cert, &region.server_tls.cert);
    replace(&next.ca, &region.server_tls.ca);
    let sre = next.sre();

    // A client of the new CA is let in, and it trusts only the new CA: the
    // server shows its new certificate.
    serving_to(&region, &coord, &sre).await;
    // One of the old CA is turned away now.
    let mut old = region.sre_tls.clone();
    old.ca = next.ca.clone();
    assert!(answers(&url, &old).await.is_err(), "a certificate of the old CA still got an answer");
    assert_eq!(coord.pid(), pid, "no restart");
    assert!(std::fs::read_to_string(&coord.log).unwrap().contains("reloaded after its files changed"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_ends_with_its_certificate_and_the_agent_returns_with_the_renewed_one() {
    let region = Region::start("expiry").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.clone();
    let coord = region.coordinator(None, &["--skip-tests"]);
    // Valid for 40 s: time to open a session, then it runs out under it.
    let ends = std::time::SystemTime::now() + Duration::from_secs(40);
    let short = region.pki.node_until(&host, ends);
    let agent = region.agent_with(&host, &AgentPeers::default(), &short);
    region.create_node(&host, &[]).await;
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;
    let agent_url = first_session(&agent).await;
    assert!(std::time::SystemTime::now() < ends, "the session must open before the certificate ends");

    // Renewed on disk (as cert-manager does), long before the end: the
    // agent keeps its session, made with the old one, until that ends.
    let renewed = region.pki.issue("renewed", Usage::Client, vec![region.pki.node_san(&host)], false);
    replace(&renewed.key, &short.key);
    replace(&renewed.cert, &short.cert);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(metric(&agent_url, CONNECTS).await, Some(1.0), "no new session while the first is valid");

    // At its end the coordinator ends the session; the agent reconnects
    // with the renewed certificate, read from disk, without a restart.
    let left = ends.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    until(
        "a second session",
        left + Duration::from_secs(30),
        || agent.tail(20),
        || async {
            let n = metric(&agent_url, CONNECTS).await;
            ready_when(n == Some(2.0), n)
        },
    )
    .await;
    // notAfter is kept to the second, and a session ends up to a tenth of
    // its certificate's remaining life early (spread per node).
    let end = ends - Duration::from_secs(5);
    assert!(std::time::SystemTime::now() >= end, "the first session lasted until its certificate's end");
    let log = std::fs::read_to_string(&coord.log).unwrap();
    assert!(log.contains("its client certificate expired"), "{}", coord.tail(30));
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_outlives_its_certificate_opens_no_session() {
    let region = Region::start("outlive").await;
    let node = format!("outlive-{}", std::process::id());
    let coord = region.coordinator(None, &[]);
    region.create_node(&node, &[]).await;
    until(
        "the Hypervisor",
        SOON,
        || coord.tail(20),
        || async {
            let hv = region.hypervisor(&node).await;
            ready_when(hv.is_some(), hv.map(|h| h.status))
        },
    )
    .await;
    let ends = std::time::SystemTime::now() + Duration::from_secs(8);
    let short = region.pki.node_until(&node, ends);
    // One channel: one TLS connection, kept open across both calls.
    let channel = connect(&region.grpc_url(), &short).await.unwrap();
    let hello = || {
        let m = AgentMessage {
            seq: 0,
            sent_at: None,
            payload: Some(Payload::Hello(Hello { node: node.clone(), ..Default::default() })),
        };
        tokio_stream::iter(vec![m])
    };
    // The coordinator's cache may learn of the Hypervisor a moment after
    // the API server answered it: it says so, and an agent asks again.
    let first = until(
        "a session on a valid certificate",
        SOON,
        || coord.tail(20),
        || async {
            let first = AgentServiceClient::new(channel.clone()).connect(hello()).await;
            match first {
                Err(s) if s.code() == tonic::Code::FailedPrecondition => Poll::Pending(format!("{s:?}")),
                other => Poll::Ready(other),
            }
        },
    )
    .await;
    assert!(first.is_ok(), "a valid certificate opens a session: {first:?}");
    drop(first);
    let left = ends.duration_since(std::time::SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left + Duration::from_secs(1)).await;
    // The connection was made with a valid certificate; the Hello comes after its end.
    let second = AgentServiceClient::new(channel).connect(hello()).await;
    assert_eq!(second.map(|_| ()).map_err(|s| s.code()), Err(tonic::Code::PermissionDenied));
    let refused =
        metric(coord.metrics.as_deref().unwrap(), "hv_coordinator_agent_sessions_refused_total").await;
    assert_eq!(refused, Some(1.0));
    assert!(std::fs::read_to_string(&coord.log).unwrap().contains("its certificate is no longer valid"));
}
