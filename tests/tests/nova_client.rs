//! The coordinator's Nova and Placement client against the real region:
//! Keystone through clouds.yaml, the host operations, and the typed errors.
//! Each test uses its own host, so they may run in parallel.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use hv_coordinator::lifecycle::{Action, NovaObs, ServiceState};
use hv_coordinator::nova::{Cloud, CloudSource, HttpPolicy, NovaClient, NovaError};
use hv_tests::openstack::Admin;

fn client(env: &hv_tests::env::TestEnv, dir: &std::path::Path, password: Option<&str>) -> NovaClient {
    let file = env.clouds_yaml(dir, password).unwrap();
    let source = CloudSource::CloudsYaml { cloud: "hv".into(), file: Some(file) };
    NovaClient::new(Cloud::new(source, HttpPolicy::default()))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), jiff::Timestamp::now().as_millisecond() % 1_000_000)
}

#[tokio::test]
async fn the_client_sees_the_host_and_changes_it_idempotently() {
    let env = hv_tests::env::require();
    let dir = tempdir("nova-client-ops");
    let nova = client(&env, &dir, None);
    let admin = Admin::login(&env).await.unwrap();
    let claim = hv_tests::hosts::claim(&env).await;
    let host = claim.host.clone();
    let agg = unique("nc-agg");
    admin.create_aggregate(&agg).await.unwrap();

    let NovaObs::Registered(h) = nova.observe(&host, &[agg.clone(), "no-such-aggregate".into()]).await else {
        panic!("{host} should be registered");
    };
    assert!(!h.service_id.is_empty());
    assert!(h.hypervisor_id.is_some(), "fake computes report their hypervisor");
    assert!(!h.aggregates.contains(&agg));
    assert_eq!(h.unknown_aggregates, BTreeSet::from(["no-such-aggregate".to_string()]));
    assert!(h.traits.is_some(), "the provider is visible in Placement");
    // nova-compute's liveness as Nova's service group reports it, and an
    // operator's forced_down over it (set back at once: hosts are shared).
    assert_eq!(h.service_state, ServiceState::Up, "a running fake compute reports in");
    admin.set_service(&host, serde_json::json!({"forced_down": true})).await.unwrap();
    let forced = nova.observe(&host, &[]).await;
    admin.set_service(&host, serde_json::json!({"forced_down": false})).await.unwrap();
    assert!(
        matches!(&forced, NovaObs::Registered(f) if f.service_state == ServiceState::ForcedDown),
        "{forced:?}"
    );
    let sid = Some(h.service_id.as_str());

    // Add twice: the second is a no-op, not a 409.
    for _ in 0..2 {
        nova.execute(&host, sid, &Action::AddAggregate { name: agg.clone() }).await.unwrap();
    }
    assert!(admin.aggregates_of(&host).await.unwrap().contains(&agg));
    let missing = nova.execute(&host, sid, &Action::AddAggregate { name: "no-such-aggregate".into() }).await;
    assert!(matches!(missing, Err(NovaError::NotFound(_))), "{missing:?}");

    let traits = BTreeSet::from(["CUSTOM_NC_TEST".to_string()]);
    nova.execute(&host, sid, &Action::AddTraits { traits: traits.clone() }).await.unwrap();
    assert!(admin.traits_of(&host).await.unwrap().contains(&"CUSTOM_NC_TEST".to_string()));

    nova.execute(&host, sid, &Action::DisableService { reason: "nc test".into() }).await.unwrap();
    let svc = admin.service(&host).await.unwrap().unwrap();
    assert_eq!(
        (svc["status"].as_str(), svc["disabled_reason"].as_str()),
        (Some("disabled"), Some("nc test"))
    );
    let NovaObs::Registered(h) = nova.observe(&host, std::slice::from_ref(&agg)).await else { panic!() };
    assert!(!h.enabled);
    assert_eq!(h.disabled_reason.as_deref(), Some("nc test"));
    assert!(h.aggregates.contains(&agg));
    assert!(h.traits.as_ref().unwrap().contains("CUSTOM_NC_TEST"));

    for _ in 0..2 {
        nova.execute(&host, sid, &Action::RemoveAggregate { name: agg.clone() }).await.unwrap();
        nova.execute(&host, sid, &Action::RemoveTraits { traits: traits.clone() }).await.unwrap();
    }
    nova.execute(&host, sid, &Action::EnableService).await.unwrap();
    let NovaObs::Registered(h) = nova.observe(&host, &[]).await else { panic!() };
    assert!(h.enabled && !h.aggregates.contains(&agg));
    assert!(!h.traits.unwrap().contains("CUSTOM_NC_TEST"));
}

#[tokio::test]
async fn a_host_forced_down_is_read_back_as_such_until_it_is_lifted() {
    let env = hv_tests::env::require();
    let dir = tempdir("nova-client-forced-down");
    let nova = client(&env, &dir, None);
    let claim = hv_tests::hosts::claim(&env).await;
    let host = claim.host.clone();
    assert_eq!(nova.compute_service(&host).await.unwrap().map(|s| s.state), Some(ServiceState::Up));
    nova.set_forced_down(&host, true).await.unwrap();
    nova.set_forced_down(&host, true).await.unwrap(); // idempotent
    assert_eq!(nova.compute_service(&host).await.unwrap().map(|s| s.state), Some(ServiceState::ForcedDown));
    let NovaObs::Registered(h) = nova.observe(&host, &[]).await else { panic!("{host} is registered") };
    assert_eq!(h.service_state, ServiceState::ForcedDown, "the lifecycle's view agrees");
    nova.set_forced_down(&host, false).await.unwrap();
    assert_eq!(nova.compute_service(&host).await.unwrap().map(|s| s.state), Some(ServiceState::Up));

    let err = nova.set_forced_down("no-such-host", true).await.unwrap_err();
    assert!(matches!(err, NovaError::NotFound(_)), "{err}");
    assert_eq!(nova.compute_service("no-such-host").await.unwrap().map(|s| s.state), None);
}

#[tokio::test]
async fn an_unknown_host_is_not_registered() {
    let env = hv_tests::env::require();
    let nova = client(&env, &tempdir("nova-client-unknown"), None);
    assert_eq!(nova.observe("compute-99", &[]).await, NovaObs::NotRegistered);
}

#[tokio::test]
async fn a_wrong_password_is_a_rejection_and_a_dead_keystone_is_unreachable() {
    let env = hv_tests::env::require();
    let nova = client(&env, &tempdir("nova-client-badpw"), Some("wrong-password"));
    let claim = hv_tests::hosts::claim(&env).await;
    let obs = nova.observe(&claim.host, &[]).await;
    assert!(matches!(&obs, NovaObs::Rejected(_)), "{obs:?}");

    let mut dead = env.clone();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    dead.keystone.auth_url = format!("http://127.0.0.1:{port}/v3");
    let source = CloudSource::CloudsYaml {
        cloud: "hv".into(),
        file: Some(dead.clouds_yaml(&tempdir("nova-client-dead"), None).unwrap()),
    };
    let policy = HttpPolicy {
        attempts: 2,
        first_pause: std::time::Duration::from_millis(10),
        ..HttpPolicy::default()
    };
    let obs = NovaClient::new(Cloud::new(source, policy)).observe(&claim.host, &[]).await;
    assert!(matches!(&obs, NovaObs::Unreachable(_)), "{obs:?}");
}

#[tokio::test]
async fn a_missing_cloud_is_a_configuration_error() {
    let env = hv_tests::env::require();
    let dir = tempdir("nova-client-nocloud");
    let file = env.clouds_yaml(&dir, None).unwrap();
    let source = CloudSource::CloudsYaml { cloud: "elsewhere".into(), file: Some(file) };
    let obs = NovaClient::new(Cloud::new(source, HttpPolicy::default())).observe("compute-1", &[]).await;
    match obs {
        NovaObs::Unreachable(m) => assert!(m.contains("elsewhere"), "{m}"),
        other => panic!("{other:?}"),
    }
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hv-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Finding "two acting leaders": a replica whose lease guard does not hold
/// (never won, or its renewals stopped) sends Nova nothing, read or change;
/// Nova's own request log has no request with this replica's identity.
/// Renewed, the same client is let through.
#[tokio::test]
async fn a_replica_without_the_lease_sends_nova_nothing() {
    use hv_coordinator::k8s::leader::LeaseGuard;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::time::Instant;
    let env = hv_tests::env::require();
    let dir = tempdir("nova-client-lease");
    let claim = hv_tests::hosts::claim(&env).await;
    let host = claim.host.clone();
    let identity = unique("deposed-replica");
    let guard = Arc::new(LeaseGuard::new(Duration::from_secs(1)));
    let file = env.clouds_yaml(&dir, None).unwrap();
    let source = CloudSource::CloudsYaml { cloud: "hv".into(), file: Some(file) };
    let cloud =
        Cloud::new(source, HttpPolicy::default()).with_identity(&identity).with_lease_guard(guard.clone());
    let nova = NovaClient::new(cloud);

    let admin = Admin::login(&env).await.unwrap();
    let sid = admin.service(&host).await.unwrap().unwrap()["id"].as_str().unwrap().to_string();
    let sid = Some(sid.as_str());
    let disable = Action::DisableService { reason: "a deposed leader's".into() };
    let refused = nova.execute(&host, sid, &disable).await;
    assert!(matches!(refused, Err(NovaError::NotLeader(_))), "{refused:?}");
    // A renewal that is older than the renew deadline is no lease either.
    let long_ago = Instant::now().checked_sub(Duration::from_secs(20)).unwrap_or_else(Instant::now);
    guard.renewed(long_ago, Duration::from_secs(10));
    let refused = nova.execute(&host, sid, &disable).await;
    assert!(matches!(refused, Err(NovaError::NotLeader(_))), "{refused:?}");
    // Nor does it read.
    assert!(!matches!(nova.observe(&host, &[]).await, NovaObs::Registered(_)), "a read went out");
    let mine = |env: &hv_tests::env::TestEnv| {
        hv_tests::openstack::nova_requests(env)
            .into_iter()
            .filter(|r| r.user_agent.contains(&identity))
            .count()
    };
    assert_eq!(mine(&env), 0, "Nova saw a request from a replica without the lease");

    guard.renewed(Instant::now(), Duration::from_secs(10));
    assert!(matches!(nova.observe(&host, &[]).await, NovaObs::Registered(_)));
    assert!(mine(&env) > 0, "once it leads, its requests reach Nova (and the log names it)");
}

/// The fleet's lists show a host as its own reads do: its service, its
/// hypervisor, its aggregates, its servers, and of the custom traits asked
/// about those its provider carries (a trait Placement never heard of is
/// carried by none, not an error). Pages of three hypervisors, followed by
/// Nova's next links, cover every host.
#[tokio::test]
async fn the_fleets_lists_show_a_host_as_its_own_reads_do() {
    let env = hv_tests::env::require();
    let dir = tempdir("nova-client-fleet");
    let nova = client(&env, &dir, None);
    let admin = Admin::login(&env).await.unwrap();
    let claim = hv_tests::hosts::claim(&env).await;
    let host = claim.host.clone();
    let agg = unique("nc-fleet-agg");
    admin.create_aggregate(&agg).await.unwrap();
    let NovaObs::Registered(h) = nova.observe(&host, &[]).await else { panic!("{host} registered") };
    let sid = Some(h.service_id.as_str());
    nova.execute(&host, sid, &Action::AddAggregate { name: agg.clone() }).await.unwrap();
    let mine = format!("CUSTOM_NC_FLEET_{}", std::process::id());
    let traits = BTreeSet::from([mine.clone()]);
    nova.execute(&host, sid, &Action::AddTraits { traits: traits.clone() }).await.unwrap();
    let server = admin.boot_on(&unique("nc-fleet"), &host, "1").await.unwrap();
    hv_tests::wait::until(
        "the server listed on its host",
        std::time::Duration::from_secs(60),
        String::new,
        || async {
            match nova.observe(&host, &[]).await {
                NovaObs::Registered(h) if h.instances.contains(&server) => hv_tests::wait::Poll::Ready(()),
                other => hv_tests::wait::Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await;

    let asked = BTreeSet::from([mine.clone(), "CUSTOM_NEVER_CREATED_ANYWHERE".to_string()]);
    let wanted = [agg.clone(), "no-such-aggregate".to_string()];
    // Another test binary may have decommissioned a host (its compute
    // service deleted), so "every host" is every host Nova lists a service
    // for, read before the fleet.
    let mut registered = Vec::new();
    for h in &env.nova.hosts {
        if admin.service(h).await.unwrap().is_some() {
            registered.push(h.clone());
        }
    }
    assert!(registered.len() > 3, "more than a page of registered hosts: {registered:?}");
    let fleet = nova.fleet_in_pages(&asked, 3).await.unwrap();
    assert!(fleet.hosts() >= registered.len(), "every registered host's service: {}", fleet.hosts());
    for h in &registered {
        assert_ne!(fleet.host(h, &[], &BTreeSet::new()), Some(NovaObs::NotRegistered), "{h} in the lists");
    }
    // Services, aggregates, the pages, providers, which traits exist, and
    // the providers of the one that does.
    let pages = fleet.hosts().div_ceil(3);
    assert!(fleet.requests >= 5 + pages, "{pages} pages followed: {} requests", fleet.requests);
    let NovaObs::Registered(own) = nova.observe(&host, &wanted).await else { panic!("{host} registered") };
    let Some(NovaObs::Registered(listed)) = fleet.host(&host, &wanted, &asked) else {
        panic!("{host} in the lists: {fleet:?}");
    };
    let own_asked = own.traits.as_ref().map(|t| t.intersection(&asked).cloned().collect::<BTreeSet<_>>());
    assert_eq!(listed.traits, own_asked, "the asked traits it carries");
    assert_eq!(listed.traits, Some(traits.clone()));
    assert_eq!(
        NovaObs::Registered(listed),
        NovaObs::Registered(hv_coordinator::lifecycle::NovaHost { traits: own_asked, ..own })
    );
    assert_eq!(fleet.host("no-such-host", &[], &BTreeSet::new()), Some(NovaObs::NotRegistered));
    assert_eq!(fleet.host(&host, &[], &BTreeSet::from(["CUSTOM_NOT_ASKED".into()])), None);

    admin.delete_server(&server).await.unwrap();
    nova.execute(&host, sid, &Action::RemoveAggregate { name: agg }).await.unwrap();
    nova.execute(&host, sid, &Action::RemoveTraits { traits }).await.unwrap();
}
