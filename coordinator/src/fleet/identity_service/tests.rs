#![allow(clippy::unwrap_used)]
//! The endpoint over a stand-in for the API server's answers: what it
//! signs, what it counts, and that a refused or failed issuance spends no
//! token.

use std::sync::Mutex as StdMutex;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

use super::*;

struct Answers {
    review: Reviewed,
    pod: Option<PodSeen>,
    node: NodeSeen,
    asked: Arc<StdMutex<Vec<String>>>,
    /// Holds each review until notified (a slow API server).
    hold: Option<Arc<tokio::sync::Notify>>,
}

#[tonic::async_trait]
impl Vouch for Answers {
    async fn review(&self, token: &str, audience: &str) -> Result<Reviewed, kube::Error> {
        crate::locked::lock(&self.asked).push(format!("review {audience}"));
        if let Some(hold) = &self.hold {
            hold.notified().await;
        }
        Ok(Reviewed { authenticated: self.review.authenticated && !token.is_empty(), ..self.review.clone() })
    }
    async fn pod(&self, _: &str, name: &str) -> Result<Option<PodSeen>, kube::Error> {
        crate::locked::lock(&self.asked).push(format!("pod {name}"));
        Ok(self.pod.clone())
    }
    async fn daemon_set_uid(&self, _: &str, _: &str) -> Result<Option<String>, kube::Error> {
        Ok(Some("ds-uid".into()))
    }
    async fn node(&self, _: &str) -> Result<NodeSeen, kube::Error> {
        Ok(self.node)
    }
}

fn answers() -> Answers {
    Answers {
        review: Reviewed {
            authenticated: true,
            error: String::new(),
            username: "system:serviceaccount:hv-system:hv-agent".into(),
            audiences: vec!["hv-coordinator".into()],
            pod_name: Some("hv-agent-x1".into()),
            pod_uid: Some("pod-uid".into()),
            credential_id: Some("JTI=1".into()),
        },
        pod: Some(PodSeen {
            uid: "pod-uid".into(),
            controller: Some(("DaemonSet".into(), "hv-agent".into(), "ds-uid".into())),
            node_name: Some("node-a".into()),
            phase: Some("Running".into()),
            deleting: false,
        }),
        node: NodeSeen::Present,
        asked: Arc::new(StdMutex::new(Vec::new())),
        hold: None,
    }
}

/// A token whose claims say it lives 10 minutes from now.
fn token() -> String {
    token_with_id("")
}

/// The same with the id `jti` (none when empty); the stand-in API server
/// names it `JTI=1` whatever it is.
fn token_with_id(jti: &str) -> String {
    use base64::Engine;
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
    let mut claims = serde_json::json!({"iat": now, "exp": now + 600});
    if !jti.is_empty() {
        claims["jti"] = "1".into();
    }
    let b64 = |v: serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.sig", b64(serde_json::json!({"alg": "RS256"})), b64(claims))
}

fn signer_files(dir: &std::path::Path) -> SignerFiles {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, "agents");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let cert = p.self_signed(&key).unwrap();
    let files = SignerFiles { cert: dir.join("tls.crt"), key: dir.join("tls.key") };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

fn issuer(
    vouch: Answers,
    signer: SignerFiles,
    leading: bool,
) -> (Arc<Issuer>, prometheus_client::registry::Registry) {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = AgentCertificates::register(&mut registry);
    let (_tx, leader) = watch::channel(leading);
    let issuer = Issuer {
        vouch: Arc::new(vouch),
        agents: Agents {
            namespace: "hv-system".into(),
            service_account: "hv-agent".into(),
            daemon_set: "hv-agent".into(),
            audience: "hv-coordinator".into(),
        },
        trust_domain: "td".into(),
        signer,
        life: Duration::from_secs(120),
        max_token_life: Duration::from_secs(3_600),
        leader,
        used: Default::default(),
        in_flight: tokio::sync::Semaphore::new(1),
        metrics,
    };
    (Arc::new(issuer), registry)
}

fn csr() -> Vec<u8> {
    CertificateParams::default().serialize_request(&KeyPair::generate().unwrap()).unwrap().der().to_vec()
}

fn ask(token: &str, node: &str) -> Request<IssueRequest> {
    Request::new(IssueRequest { node: node.into(), token: token.into(), csr_der: csr() })
}

fn text(r: &prometheus_client::registry::Registry) -> String {
    let mut s = String::new();
    let _ = prometheus_client::encoding::text::encode_registry(&mut s, r);
    s
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hv-identity-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn a_token_gets_one_certificate_for_its_pods_node_and_a_replay_is_refused() {
    let dir = tmp("once");
    let (issuer, registry) = issuer(answers(), signer_files(&dir), true);
    let boot = IdentityEndpoint { issuer: issuer.clone(), mutual: false };
    let t = token();
    let got = boot.issue(ask(&t, "node-a")).await.unwrap().into_inner();
    let chain: Vec<rustls_pki_types::CertificateDer<'static>> =
        rustls_pki_types::pem::PemObject::pem_slice_iter(got.certificate_chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    assert_eq!(hv_tls::node_of(&chain[0], "td").as_deref(), Some("node-a"));
    let life = got.not_after.unwrap().seconds - got.not_before.unwrap().seconds;
    assert_eq!(life, 120 + 300, "the life asked, from 5 minutes back");
    let again = boot.issue(ask(&t, "node-a")).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::Unauthenticated, "{again:?}");
    assert!(again.message().contains("used"), "{again:?}");
    let s = text(&registry);
    assert!(s.contains("hv_coordinator_agent_certificates_issued_total{via=\"bootstrap\"} 1"), "{s}");
    assert!(s.contains("hv_coordinator_agent_certificate_refusals_total{reason=\"replayed\"} 1"), "{s}");
}

#[tokio::test]
async fn another_nodes_certificate_is_refused_and_spends_no_token() {
    let dir = tmp("other");
    let (issuer, registry) = issuer(answers(), signer_files(&dir), true);
    let boot = IdentityEndpoint { issuer: issuer.clone(), mutual: false };
    let t = token();
    let refused = boot.issue(ask(&t, "node-b")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("runs on node node-a, not on node-b"), "{refused:?}");
    assert!(boot.issue(ask(&t, "node-a")).await.is_ok(), "the token is still good for its own node");
    assert!(
        text(&registry).contains("hv_coordinator_agent_certificate_refusals_total{reason=\"wrong_node\"} 1")
    );
}

#[tokio::test]
async fn a_follower_signs_nothing_and_asks_nothing() {
    let dir = tmp("follower");
    let a = answers();
    let asked = a.asked.clone();
    let (issuer, _) = issuer(a, signer_files(&dir), false);
    let boot = IdentityEndpoint { issuer, mutual: false };
    let refused = boot.issue(ask(&token(), "node-a")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(crate::locked::lock(&asked).is_empty(), "the API server is not asked");
}

#[tokio::test]
async fn a_signer_that_cannot_be_read_fails_the_issuance_and_gives_the_token_back() {
    let dir = tmp("nosigner");
    let mut files = signer_files(&dir);
    let good_key = files.key.clone();
    files.key = dir.join("missing.key");
    let (issuer, registry) = issuer(answers(), files.clone(), true);
    let boot = IdentityEndpoint { issuer, mutual: false };
    let t = token();
    let failed = boot.issue(ask(&t, "node-a")).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    assert!(!failed.message().contains("missing.key"), "no path told to the caller: {failed:?}");
    let s = text(&registry);
    assert!(s.contains("hv_coordinator_agent_certificates_issued_total{via=\"bootstrap\"} 0"), "{s}");
    assert!(s.contains("hv_coordinator_agent_certificate_errors_total{kind=\"signer\"} 1"), "{s}");
    // The key is back (a Secret mounted late): the same token works, as it
    // was not spent.
    std::fs::copy(good_key, &files.key).unwrap();
    assert!(boot.issue(ask(&t, "node-a")).await.is_ok());
}

#[tokio::test]
async fn a_request_that_is_no_certificate_request_is_invalid() {
    let dir = tmp("junk");
    let (issuer, registry) = issuer(answers(), signer_files(&dir), true);
    let boot = IdentityEndpoint { issuer, mutual: false };
    let junk =
        Request::new(IssueRequest { node: "node-a".into(), token: token(), csr_der: b"junk".to_vec() });
    let refused = boot.issue(junk).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        text(&registry).contains("hv_coordinator_agent_certificate_refusals_total{reason=\"bad_request\"} 1")
    );
    let bad_name = Request::new(IssueRequest { node: "Node A".into(), token: token(), csr_der: csr() });
    assert_eq!(boot.issue(bad_name).await.unwrap_err().code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn past_the_issuances_under_way_a_caller_is_told_to_come_back_and_the_api_server_is_not_asked() {
    let dir = tmp("busy");
    let hold = Arc::new(tokio::sync::Notify::new());
    let slow = Answers { hold: Some(hold.clone()), ..answers() };
    let (issuer, registry) = issuer(slow, signer_files(&dir), true);
    let first = IdentityEndpoint { issuer: issuer.clone(), mutual: false };
    let pending = tokio::spawn(async move { first.issue(ask(&token(), "node-a")).await });
    // The first holds the one place while its review waits.
    while issuer.in_flight.available_permits() == 1 {
        tokio::task::yield_now().await;
    }
    let second = IdentityEndpoint { issuer: issuer.clone(), mutual: false };
    let busy = second.issue(ask(&token(), "node-a")).await.unwrap_err();
    assert_eq!(busy.code(), tonic::Code::ResourceExhausted, "{busy:?}");
    hold.notify_one();
    assert!(pending.await.unwrap().is_ok(), "the first goes on");
    assert!(text(&registry).contains("hv_coordinator_agent_certificate_errors_total{kind=\"busy\"} 1"));
}

#[tokio::test]
async fn a_used_token_is_refused_before_the_api_server_is_asked_again() {
    let dir = tmp("early");
    let a = answers();
    let asked = a.asked.clone();
    let (issuer, _) = issuer(a, signer_files(&dir), true);
    let boot = IdentityEndpoint { issuer, mutual: false };
    let t = token_with_id("once");
    assert!(boot.issue(ask(&t, "node-a")).await.is_ok());
    let before = crate::locked::lock(&asked).len();
    assert_eq!(boot.issue(ask(&t, "node-a")).await.unwrap_err().code(), tonic::Code::Unauthenticated);
    assert_eq!(crate::locked::lock(&asked).len(), before, "no review for a replay");
}

#[tokio::test]
async fn an_answer_lost_on_the_way_is_asked_for_again_with_the_same_request_not_another() {
    let dir = tmp("lost");
    let (issuer, _) = issuer(answers(), signer_files(&dir), true);
    let boot = IdentityEndpoint { issuer, mutual: false };
    let t = token_with_id("once");
    let request = csr();
    let again =
        |csr_der: Vec<u8>| Request::new(IssueRequest { node: "node-a".into(), token: t.clone(), csr_der });
    assert!(boot.issue(again(request.clone())).await.is_ok(), "signed; say its answer is lost");
    assert!(boot.issue(again(request)).await.is_ok(), "the same token and request: signed again");
    let other = boot.issue(again(csr())).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::Unauthenticated, "another key with that token: {other:?}");
}
