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

#[tokio::test]
async fn the_readable_pool_passes_and_the_forbidden_one_fails_clearly() {
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
    let env = hv_tests::env::require();
    let pools = vec![env.ceph.readable_pool.clone()];
    let c = check_pools_isolated(&client(&env), &pools, std::path::Path::new("/nonexistent/probe")).await;
    assert!(
        c.iter().all(|p| !p.passed && p.message.contains("cannot run the Ceph probe /nonexistent/probe")),
        "{c:?}"
    );
}
