#![allow(clippy::unwrap_used)]
use super::*;

fn agents() -> Agents {
    Agents {
        namespace: "hv-system".into(),
        service_account: "hv-agent".into(),
        daemon_set: "hv-agent".into(),
        audience: "hypervisor.cloud.sap".into(),
    }
}

fn good_review() -> Reviewed {
    Reviewed {
        authenticated: true,
        error: String::new(),
        username: "system:serviceaccount:hv-system:hv-agent".into(),
        audiences: vec!["hypervisor.cloud.sap".into()],
        pod_name: Some("hv-agent-x1".into()),
        pod_uid: Some("pod-uid".into()),
        credential_id: Some("JTI=1".into()),
    }
}

fn ask(node: &str, via: Via) -> Ask {
    Ask { node: node.into(), via }
}

fn good_pod() -> PodSeen {
    PodSeen {
        uid: "pod-uid".into(),
        controller: Some(("DaemonSet".into(), "hv-agent".into(), "ds-uid".into())),
        node_name: Some("node-a".into()),
        phase: Some("Running".into()),
        deleting: false,
    }
}

#[test]
fn a_token_is_vouched_for_only_when_authenticated_for_our_audience_of_our_account_and_bound() {
    let a = agents();
    assert_eq!(vouched_pod(&good_review(), &a), Ok(("hv-agent-x1".into(), "pod-uid".into())));
    let cases: Vec<(Reviewed, &str)> = vec![
        (
            Reviewed { authenticated: false, error: "token has expired".into(), ..good_review() },
            "token_invalid",
        ),
        (
            Reviewed { audiences: vec!["https://kubernetes.default.svc".into()], ..good_review() },
            "wrong_audience",
        ),
        (Reviewed { audiences: vec![], ..good_review() }, "wrong_audience"),
        (
            Reviewed { username: "system:serviceaccount:hv-system:default".into(), ..good_review() },
            "wrong_account",
        ),
        (
            Reviewed { username: "system:serviceaccount:other:hv-agent".into(), ..good_review() },
            "wrong_account",
        ),
        (Reviewed { username: "alice".into(), ..good_review() }, "wrong_account"),
        (Reviewed { pod_name: None, ..good_review() }, "token_not_bound"),
        (Reviewed { pod_uid: Some(String::new()), ..good_review() }, "token_not_bound"),
    ];
    for (review, reason) in cases {
        let got = vouched_pod(&review, &a).unwrap_err();
        assert_eq!(got.reason(), reason, "{review:?}: {got}");
        assert!(Refusal::REASONS.contains(&got.reason()));
    }
    let expired = vouched_pod(&cases_expired(), &a).unwrap_err();
    assert!(expired.to_string().contains("token has expired"), "the API server's reason is kept: {expired}");
    assert!(expired.is_unauthenticated());
}

fn cases_expired() -> Reviewed {
    Reviewed { authenticated: false, error: "token has expired".into(), ..good_review() }
}

#[test]
fn a_renewal_comes_from_the_certificate_of_the_node_asked_for_and_a_token_is_judged_first_by_its_times() {
    let claims = Claims { iat: 1_000, exp: 1_600, credential_id: Some("JTI=x".into()) };
    let max = Duration::from_secs(3_600);
    let at = |node: &str, via: Via, c: Option<&Claims>, now: u64| before_review(&ask(node, via), c, now, max);
    assert_eq!(at("node-a", Via::Bootstrap, Some(&claims), 1_100), Ok(Duration::from_secs(500)));
    assert!(at("node-a", Via::Renewal(Some("node-a".into())), Some(&claims), 1_100).is_ok());
    let reason = |r: Result<Duration, Refusal>| r.unwrap_err().reason();
    assert_eq!(
        reason(at("node-a", Via::Renewal(Some("node-b".into())), Some(&claims), 1_100)),
        "other_certificate"
    );
    assert_eq!(reason(at("node-a", Via::Renewal(None), Some(&claims), 1_100)), "other_certificate");
    assert_eq!(reason(at("", Via::Bootstrap, Some(&claims), 1_100)), "bad_request");
    assert_eq!(reason(at("node-a", Via::Bootstrap, None, 1_100)), "token_invalid");
    assert_eq!(reason(at("node-a", Via::Bootstrap, Some(&claims), 1_600)), "token_invalid", "ended");
    let long = Claims { exp: 1_000 + 86_400, ..claims.clone() };
    assert_eq!(reason(at("node-a", Via::Bootstrap, Some(&long), 1_100)), "token_long_lived");
}

#[test]
fn only_a_running_pod_of_our_daemon_set_on_the_node_asked_for_may_have_its_certificate() {
    let a = agents();
    let at = ("hv-agent-x1", "pod-uid");
    let ok = pod_may_have(at, Some(&good_pod()), Some("ds-uid"), &a, NodeSeen::Present, "node-a");
    assert_eq!(ok, Ok(()));
    let owned_by = |kind: &str, name: &str, uid: &str| PodSeen {
        controller: Some((kind.into(), name.into(), uid.into())),
        ..good_pod()
    };
    type Case<'a> = (Option<PodSeen>, Option<&'a str>, NodeSeen, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (None, Some("ds-uid"), NodeSeen::Present, "node-a", "pod_gone"),
        (
            Some(PodSeen { uid: "a-new-pod".into(), ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_gone",
        ),
        (
            Some(PodSeen { controller: None, ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_ours",
        ),
        (
            Some(owned_by("ReplicaSet", "hv-agent", "ds-uid")),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_ours",
        ),
        (
            Some(owned_by("DaemonSet", "other", "ds-uid")),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_ours",
        ),
        (
            Some(owned_by("DaemonSet", "hv-agent", "forged")),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_ours",
        ),
        (Some(good_pod()), None, NodeSeen::Present, "node-a", "pod_not_ours"),
        (
            Some(PodSeen { phase: Some("Pending".into()), ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_running",
        ),
        (
            Some(PodSeen { phase: None, ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_running",
        ),
        (
            Some(PodSeen { deleting: true, ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "pod_not_running",
        ),
        (Some(good_pod()), Some("ds-uid"), NodeSeen::Present, "node-b", "wrong_node"),
        (
            Some(PodSeen { node_name: None, ..good_pod() }),
            Some("ds-uid"),
            NodeSeen::Present,
            "node-a",
            "wrong_node",
        ),
        (Some(good_pod()), Some("ds-uid"), NodeSeen::Deleting, "node-a", "node_gone"),
        (Some(good_pod()), Some("ds-uid"), NodeSeen::Missing, "node-a", "node_gone"),
    ];
    for (pod, ds, node, asked, reason) in cases {
        let got = pod_may_have(at, pod.as_ref(), ds, &a, node, asked).unwrap_err();
        assert_eq!(got.reason(), reason, "{pod:?} {ds:?} {node:?} {asked}: {got}");
        assert!(!got.is_unauthenticated(), "the token was good: {got}");
    }
}

#[test]
fn a_credential_id_gets_one_certificate_while_its_token_lives() {
    let mut used = Used::default();
    let t0 = Instant::now();
    let (long, short) = (Duration::from_secs(600), Duration::from_secs(10));
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert_eq!(used.take("JTI=1", t0, long, b"req-1"), Ok(true));
    assert_eq!(
        used.take("JTI=1", at(5), long, b"req-x"),
        Err(Refusal::Replayed),
        "another request: a replay"
    );
    assert_eq!(used.take("JTI=1", at(5), long, b"req-1"), Ok(false), "its own request again: a lost answer");
    assert!(used.refuses("JTI=1", at(5), b"req-x") && !used.refuses("JTI=1", at(5), b"req-1"));
    assert_eq!(used.take("JTI=2", at(5), short, b"req-2"), Ok(true));
    used.give_back("JTI=2");
    assert_eq!(used.take("JTI=2", at(6), short, b"req-3"), Ok(true), "given back: not used");
    // A token with little life left takes no other token's record with it.
    assert_eq!(used.take("JTI=3", at(30), short, b"req-4"), Ok(true));
    assert_eq!(used.take("JTI=1", at(31), long, b"req-x"), Err(Refusal::Replayed), "JTI=1 lives on");
    assert_eq!(used.len(), 2, "JTI=2's token ended: forgotten");
    // Past its token's end an id is forgotten: the API server refuses the
    // token by then.
    assert_eq!(used.take("JTI=1", t0 + long + Duration::from_secs(1), long, b"req-x"), Ok(true));
    // A renewal notes its token without asking, and never shortens a record.
    used.mark("JTI=4", t0, long, b"req-5");
    used.mark("JTI=4", t0, short, b"req-5");
    assert_eq!(used.take("JTI=4", at(60), long, b"req-6"), Err(Refusal::Replayed));
}

#[test]
fn a_tokens_claims_are_read_from_its_middle_part() {
    use base64::Engine;
    let b64 = |v: &serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let token = |claims: serde_json::Value| {
        format!("{}.{}.sig", b64(&serde_json::json!({"alg": "RS256"})), b64(&claims))
    };
    let t = token(serde_json::json!({"iat": 1_000, "exp": 1_600, "jti": "x"}));
    assert_eq!(
        token_claims(&t),
        Some(Claims { iat: 1_000, exp: 1_600, credential_id: Some("JTI=x".into()) })
    );
    assert_eq!(token_claims("no-dots"), None);
    assert_eq!(token_claims(&token(serde_json::json!({"iat": 1_000}))), None);
    let no_id = token_claims(&token(serde_json::json!({"iat": 1, "exp": 2}))).unwrap();
    assert_eq!(no_id.credential_id, None);
}
