//! `hv-agent checks` against the real peers of the test ground.
//!
//! The Ceph checks run in `hv-ceph-probe`, another package of the
//! workspace: `make test` builds it; alone, `cargo build -p hv-ceph-probe`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Output};

fn checks(env: &hv_tests::env::TestEnv, libvirt_uri: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hv-agent"))
        .arg("checks")
        .args(["--libvirt-uri", libvirt_uri, "--ovsdb", &env.ovsdb.tcp])
        .args(["--ceph-conf", &env.ceph.conf.to_string_lossy(), "--ceph-id", &env.ceph.client.id])
        .args(["--ceph-keyring", &env.ceph.client.keyring.to_string_lossy()])
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn all_checks_pass_on_a_healthy_node_with_a_real_tcg_domain() {
    let env = hv_tests::env::require();
    let out = checks(&env, &env.libvirt.qemu_session_uri, &["--pool", "vms", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let results: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let failed: Vec<&serde_json::Value> =
        results.as_array().unwrap().iter().filter(|r| r["passed"] != true).collect();
    assert!(failed.is_empty(), "failed: {failed:?}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<&str> = results.as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    for want in [
        "libvirt-reachable",
        "libvirt-version",
        "libvirt-domain-start",
        "ovs-bridge/br-int",
        "ovs-bridge/br-ex",
        "ceph-pool/vms",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let start = results.as_array().unwrap().iter().find(|r| r["name"] == "libvirt-domain-start").unwrap();
    assert!(start["message"].as_str().unwrap().contains("(qemu) defined, started"), "{start}");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_missing_bridge_and_a_forbidden_pool_fail_by_name_with_exit_code_1() {
    let env = hv_tests::env::require();
    let out = checks(
        &env,
        &env.libvirt.test_uri,
        &[
            "--bridge", "br-int", "--bridge", "br-ex", "--bridge", "br-nope", "--pool", "vms", "--pool",
            "secret",
        ],
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let line = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} not in\n{table}"))
            .to_string()
    };
    assert!(
        line("ovs-bridge/br-nope").contains("FAIL") && line("ovs-bridge/br-nope").contains("does not exist"),
        "{table}"
    );
    assert!(
        line("ceph-pool/secret").contains("FAIL")
            && line("ceph-pool/secret").contains("Operation not permitted"),
        "{table}"
    );
    assert!(line("ceph-pool/vms ").contains("pass"), "{table}");
    assert!(line("libvirt-domain-start").contains("pass"), "{table}");
    assert!(table.contains("failed"), "{table}");
}

#[test]
fn an_unreachable_libvirt_and_a_too_old_minimum_are_reported() {
    let env = hv_tests::env::require();
    let out = checks(&env, "qemu+tcp://127.0.0.1:1/system", &["--json"]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r[0]["name"], "libvirt-reachable");
    assert_eq!(r[0]["passed"], false);
    assert!(r[0]["message"].as_str().unwrap().contains("127.0.0.1:1"));
    let out = checks(
        &env,
        &env.libvirt.test_uri,
        &["--min-libvirt-version", "99.0.0", "--no-test-domain", "--json"],
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = r.as_array().unwrap().iter().find(|c| c["name"] == "libvirt-version").unwrap();
    assert_eq!(v["passed"], false);
    assert!(v["message"].as_str().unwrap().contains("older than the required 99.0.0"), "{v}");
    assert_eq!(out.status.code(), Some(1));
}
