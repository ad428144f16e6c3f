//! The OVSDB client against the test ground's real ovsdb-server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::Duration;

use hv_agent::ovsdb::{Bridge, Client, check_bridges};

fn vsctl(remote: &str, args: &[&str]) {
    let out =
        Command::new("ovs-vsctl").arg(format!("--db={remote}")).arg("--no-wait").args(args).output().unwrap();
    assert!(out.status.success(), "ovs-vsctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn bridges_are_listed_with_their_ports() {
    let env = hv_tests::env::require();
    for remote in [&env.ovsdb.tcp, &env.ovsdb.unix] {
        let c = Client::connect(remote).await.unwrap();
        assert!(c.list_dbs().await.unwrap().contains(&"Open_vSwitch".to_string()));
        let bridges = c.bridges().await.unwrap();
        let int = bridges.iter().find(|b| b.name == "br-int").unwrap_or_else(|| panic!("{bridges:?}"));
        assert_eq!(int.ports, vec!["br-int"], "a bridge has its own internal port");
    }
}

#[tokio::test]
async fn a_missing_bridge_fails_its_check_by_name() {
    let env = hv_tests::env::require();
    let c = Client::connect(&env.ovsdb.tcp).await.unwrap();
    let checks = check_bridges(
        &c.bridges().await.unwrap(),
        &["br-int".into(), "br-hv-missing".into()],
        &[],
        &hv_agent::ovsdb::default_expectations(),
    );
    assert!(checks[0].passed, "{checks:?}");
    assert!(!checks[1].passed);
    assert!(checks[1].message.contains("br-hv-missing"), "{}", checks[1].message);
}

/// The bridge `name` after the first change that satisfies `want` (other
/// tests change the shared OVSDB meanwhile).
async fn until(
    watch: &mut hv_agent::ovsdb::BridgeWatch,
    name: &str,
    want: impl Fn(Option<&Bridge>) -> bool,
) -> Option<Bridge> {
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let bridges = watch.next().await.expect("the monitor ended");
            let found = bridges.into_iter().find(|b| b.name == name);
            if want(found.as_ref()) {
                return found;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no change of {name} as wanted within 5 s"))
}

#[tokio::test]
async fn the_monitor_sees_a_bridge_added_reconfigured_and_removed() {
    let env = hv_tests::env::require();
    let c = Client::connect(&env.ovsdb.tcp).await.unwrap();
    let (now, mut watch) = c.watch_bridges().await.unwrap();
    assert!(now.iter().any(|b| b.name == "br-int"), "{now:?}");
    let name = format!("br-t{}", std::process::id() % 10_000);
    vsctl(&env.ovsdb.unix, &["add-br", &name]);
    let added = until(&mut watch, &name, |b| b.is_some()).await.unwrap();
    assert_eq!(added.fail_mode, None, "{added:?}");
    vsctl(&env.ovsdb.unix, &["set-fail-mode", &name, "standalone"]);
    until(&mut watch, &name, |b| b.is_some_and(|b| b.fail_mode.as_deref() == Some("standalone"))).await;
    vsctl(&env.ovsdb.unix, &["set", "Bridge", &name, "datapath_type=netdev"]);
    let changed = until(&mut watch, &name, |b| b.is_some_and(|b| b.datapath_type == "netdev")).await.unwrap();
    assert_eq!(changed.fail_mode.as_deref(), Some("standalone"), "a modify keeps the other columns");
    vsctl(&env.ovsdb.unix, &["del-br", &name]);
    until(&mut watch, &name, |b| b.is_none()).await;
}

#[tokio::test]
async fn the_connection_survives_a_minute_idle() {
    let env = hv_tests::env::require();
    let c = Client::connect(&env.ovsdb.tcp).await.unwrap();
    c.list_dbs().await.unwrap();
    // ovsdb-server probes an idle TCP client with `echo` after 5 s and drops
    // it if unanswered; the reader task answers.
    tokio::time::sleep(Duration::from_secs(65)).await;
    assert!(!c.is_closed(), "the server dropped the idle connection");
    assert!(c.list_dbs().await.unwrap().contains(&"Open_vSwitch".to_string()));
}

#[tokio::test]
async fn a_bad_remote_is_a_clear_error() {
    let err = Client::connect("http://nope").await.err().unwrap().to_string();
    assert!(err.contains("neither tcp:HOST:PORT nor unix:PATH"), "{err}");
    let err = Client::connect("tcp:127.0.0.1:1").await.err().unwrap().to_string();
    assert!(err.contains("connecting to OVSDB at tcp:127.0.0.1:1"), "{err}");
}

#[tokio::test]
async fn a_bridge_in_the_wrong_fail_mode_and_missing_external_ids_fail_by_field() {
    // An ovsdb-server of its own: the ground's Open_vSwitch row is shared.
    let dir = std::env::temp_dir().join(format!("hv-ovs-expect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ovs = hv_tests::region::PrivateOvsdb::start(&dir, &["br-int", "br-ex"]).unwrap();
    ovs.set_fail_mode("br-int", "standalone").unwrap();
    let cfg = hv_proto::v1::CheckConfig {
        bridges: vec!["br-int".into(), "br-ex".into()],
        bridge_expectations: vec![hv_proto::v1::BridgeExpectation {
            bridge: "br-int".into(),
            fail_mode: "secure".into(),
            ..Default::default()
        }],
        ovs_external_ids: [("ovn-bridge-mappings".to_string(), "*".to_string())].into(),
        ..Default::default()
    };
    let out = hv_agent::checks::ovs_checks(&ovs.remote, &cfg).await;
    let by = |n: &str| out.iter().find(|o| o.name == n).cloned().unwrap_or_else(|| panic!("{n}: {out:?}"));
    let int = by("ovs-bridge/br-int");
    assert!(!int.passed);
    assert_eq!(int.message, "bridge br-int: fail_mode: wanted secure, found standalone");
    assert!(by("ovs-bridge/br-ex").passed);
    let ids = by("ovs-external-id/ovn-bridge-mappings");
    assert!(!ids.passed);
    assert_eq!(ids.message, "Open_vSwitch external_ids:ovn-bridge-mappings: wanted any value, found (unset)");

    // The fix, as an SRE would make it.
    ovs.set_fail_mode("br-int", "secure").unwrap();
    ovs.vsctl(&["set", "Open_vSwitch", ".", "external_ids:ovn-bridge-mappings=physnet1:br-ex"]).unwrap();
    let out = hv_agent::checks::ovs_checks(&ovs.remote, &cfg).await;
    assert!(out.iter().all(|o| o.passed), "{out:?}");
    assert_eq!(out.len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
