//! The coordinator's server and live-migration calls against the real Nova
//! region: a server seen on its host with its flavor's memory, a live
//! migration watched while it runs, aborted (Nova shows it `cancelled`,
//! the server stays), and then let through (the server lands elsewhere).
//!
//! The fake live-migration driver holds a migration for about 5 s unless
//! it is aborted, which is what makes the abort observable.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::nova::servers::NovaMigration;
use hv_coordinator::nova::{Cloud, CloudSource, HttpPolicy, NovaClient};
use hv_tests::openstack::Admin;
use hv_tests::wait::{Poll, ready_when, until};

async fn wait_status(nova: &NovaClient, id: &str, want: &[&str]) -> NovaMigration {
    let what = format!("the migration of {id} {want:?}");
    until(&what, Duration::from_secs(60), String::new, || async {
        match nova.migrations_of(id).await.unwrap().into_iter().next() {
            Some(m) if want.contains(&m.status.as_str()) => Poll::Ready(m),
            other => Poll::Pending(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_migration_is_watched_aborted_and_then_completed() {
    let env = hv_tests::env::require();
    let dir = std::env::temp_dir().join(format!("hv-nova-migrations-{}", std::process::id()));
    let file = env.clouds_yaml(&dir, None).unwrap();
    let nova = NovaClient::new(Cloud::new(
        CloudSource::CloudsYaml { cloud: "hv".into(), file: Some(file) },
        HttpPolicy::default(),
    ));
    let admin = Admin::login(&env).await.unwrap();
    // Its server moves to a host the scheduler picks: one of its zone's.
    let zone = hv_tests::hosts::zone(&env, 1).await;
    let source = zone.source.host.clone();
    let t0 = jiff::Timestamp::now() - jiff::SignedDuration::from_mins(1);
    let id = zone.boot(&admin, &format!("mig-{}", std::process::id()), &source, "1").await;

    let on_host = nova.servers_on(&source).await.unwrap();
    let me = on_host.iter().find(|s| s.id == id).expect("the server is listed on its host");
    assert_eq!(me.memory_bytes, 512 << 20, "m1.tiny's 512 MiB, from the embedded flavor");
    assert!(!me.locked && !me.pci_passthrough);

    // Start, see it running with Nova's migration id, abort it.
    nova.migrate(&id, true).await.unwrap();
    let running = wait_status(&nova, &id, &["running"]).await;
    assert_eq!(running.source_compute.as_deref(), Some(source.as_str()));
    let progress = nova.progress_of(&id).await.unwrap();
    assert_eq!(
        progress.first().map(|p| p.id),
        Some(running.id),
        "servers/{{id}}/migrations shows the same one"
    );
    nova.abort_migration(&id, running.id).await.unwrap();
    let ended = wait_status(&nova, &id, &["cancelled"]).await;
    assert_eq!(ended.id, running.id);
    assert_eq!(
        nova.server(&id).await.unwrap().unwrap().host.as_deref(),
        Some(source.as_str()),
        "an aborted migration leaves it where it was"
    );
    nova.abort_migration(&id, running.id)
        .await
        .unwrap_or_else(|e| panic!("aborting an ended migration is a no-op: {e}"));

    // Now let one through.
    nova.migrate(&id, true).await.unwrap();
    let done = wait_status(&nova, &id, &["completed"]).await;
    assert_ne!(done.id, running.id);
    let moved = nova.server(&id).await.unwrap().unwrap();
    assert_ne!(moved.host.as_deref(), Some(source.as_str()));
    assert_eq!(done.dest_compute, moved.host);

    // The batched query an eviction uses: both attempts, off the source, since t0.
    let from = nova.migrations_from(&source, t0).await.unwrap();
    let mine: Vec<(i64, &str)> = from
        .iter()
        .filter(|m| m.instance_uuid.as_deref() == Some(id.as_str()))
        .map(|m| (m.id, m.status.as_str()))
        .collect();
    assert_eq!(mine, [(done.id, "completed"), (running.id, "cancelled")], "{from:?}");
    assert!(from.iter().all(|m| m.source_compute.as_deref() == Some(source.as_str())));
    let later = nova.migrations_from(&source, jiff::Timestamp::now() + jiff::SignedDuration::from_mins(5));
    assert!(
        later.await.unwrap().iter().all(|m| m.instance_uuid.as_deref() != Some(id.as_str())),
        "changes-since filters"
    );

    admin.delete_server(&id).await.unwrap();
    until("the server deleted", Duration::from_secs(30), String::new, || async {
        ready_when(nova.server(&id).await.unwrap().is_none(), ())
    })
    .await;
}
