//! RBD pool checks against the test ground's Ceph, as the restricted
//! client, through the real `hv-ceph-probe` binary and the agent's runner.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_agent::ceph::{CephClient, PoolCheck, check_pools_isolated};

fn client(env: &hv_tests::env::TestEnv) -> CephClient {
    CephClient {
        conf: env.ceph.conf.clone(),
        id: env.ceph.client.id.clone(),
        keyring: Some(env.ceph.client.keyring.clone()),
        timeout: Duration::from_secs(10),
    }
}

fn probe() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_BIN_EXE_hv-ceph-probe"))
}

async fn check(c: &CephClient, pools: &[String]) -> Vec<PoolCheck> {
    check_pools_isolated(c, pools, &probe()).await
}

/// Held by every test here: one of them blocklists the whole loopback
/// address, which every other probe would see.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn the_readable_pool_passes_and_the_forbidden_one_fails_clearly() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = hv_tests::env::require();
    let checks = check(
        &client(&env),
        &[env.ceph.readable_pool.clone(), env.ceph.forbidden_pool.clone(), "nonexistent".into()],
    )
    .await;
    assert!(checks[0].passed, "{:?}", checks[0]);
    assert!(checks[0].message.contains("vms/probe is 16 MiB"), "{}", checks[0].message);
    assert!(!checks[1].passed);
    assert!(
        checks[1].message.contains("client.node-1 cannot list RBD images in pool secret")
            && checks[1].message.contains("Operation not permitted"),
        "{}",
        checks[1].message
    );
    assert!(!checks[2].passed);
    assert!(checks[2].message.contains("pool nonexistent"), "{}", checks[2].message);
}

#[tokio::test]
async fn a_wrong_key_or_an_unreachable_cluster_fails_within_the_timeout() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = hv_tests::env::require();
    let mut wrong = client(&env);
    wrong.keyring = Some(env.ceph.admin.keyring.clone()); // the admin key under client.node-1's name
    let c = check(&wrong, &["vms".into()]).await;
    assert!(!c[0].passed && c[0].message.contains("connecting to Ceph as client.node-1"), "{:?}", c[0]);

    let dir = std::env::temp_dir().join(format!("hv-ceph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("ceph.conf");
    std::fs::write(&conf, "[global]\nmon host = v2:127.0.0.1:1\nauth client required = cephx\n").unwrap();
    let mut nowhere = client(&env);
    nowhere.conf = conf;
    nowhere.timeout = Duration::from_secs(3);
    let t = Instant::now();
    let c = check(&nowhere, &["vms".into()]).await;
    assert!(!c[0].passed, "{:?}", c[0]);
    assert!(t.elapsed() < Duration::from_secs(15), "took {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_missing_probe_is_a_clear_failure() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = hv_tests::env::require();
    let pools = vec![env.ceph.readable_pool.clone()];
    let c = check_pools_isolated(&client(&env), &pools, std::path::Path::new("/nonexistent/probe")).await;
    assert!(
        c.iter().all(|p| !p.passed && p.message.contains("cannot run the Ceph probe /nonexistent/probe")),
        "{c:?}"
    );
}

#[tokio::test]
async fn a_client_blocklisted_by_its_address_or_by_a_range_fails_as_blocklisted_and_passes_once_lifted() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = hv_tests::env::require();
    let c = client(&env);
    let pools = vec![env.ceph.readable_pool.clone()];
    let before = check(&c, &pools).await;
    assert!(before[0].passed && !before[0].blocklisted, "{before:?}");

    // Every client of the probe's IP: the OSDs refuse its reads too.
    let entry = hv_tests::region::Blocklisted::add(&env, "127.0.0.1:0/0", false).unwrap();
    let listed = check(&c, &pools).await;
    assert!(!listed[0].passed && listed[0].blocklisted, "{listed:?}");
    assert!(
        listed[0]
            .message
            .starts_with("client.node-1 is blocklisted by the cluster (at 127.0.0.1, entry 127.0.0.1:0/0)"),
        "{}",
        listed[0].message
    );
    drop(entry);
    let lifted = check(&c, &pools).await;
    assert!(lifted[0].passed && !lifted[0].blocklisted, "{lifted:?}");

    let range = hv_tests::region::Blocklisted::add(&env, "127.0.0.0/8", true).unwrap();
    let listed = check(&c, &pools).await;
    assert!(listed[0].blocklisted && listed[0].message.contains("entry cidr:127.0.0.0:0/8)"), "{listed:?}");
    let again = check(&c, &pools).await;
    assert_eq!(again[0].message, listed[0].message, "the evidence is the same from one probe to the next");
    drop(range);
    assert!(check(&c, &pools).await[0].passed);
}
