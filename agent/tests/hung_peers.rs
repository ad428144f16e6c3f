//! Peers that accept a connection and never answer (a hung libvirtd, a
//! wedged ovsdb-server): the agent's calls end at their deadline with an
//! error that says so, and a hung libvirt call does not leave one more
//! thread behind per attempt. The libvirt client is the real one; the peer
//! is a socket that takes the connection and says nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use hv_agent::checks::{self, Endpoints};
use hv_agent::libvirt::LibvirtTarget;
use hv_agent::ovsdb::{Client, OvsdbError};
use hv_proto::v1::CheckConfig;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A peer that accepts connections and holds them, silent, until `hang_up`
/// is sent (or dropped).
async fn silent_peer() -> (String, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (hang_up, mut stop) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((conn, _)) => held.push(conn),
                    Err(_) => return,
                },
                _ = &mut stop => return,
            }
        }
    });
    (addr, hang_up)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_libvirtd_fails_the_checks_at_their_deadline_and_piles_up_no_threads() {
    let env = hv_tests::env::require();
    let (addr, hang_up) = silent_peer().await;
    let ep = Endpoints {
        libvirt: LibvirtTarget {
            uri: format!("qemu+tcp://{addr}/system"),
            deadline: Duration::from_millis(500),
            ..LibvirtTarget::default()
        },
        libvirt_lane: Default::default(),
        ovsdb_remote: env.ovsdb.tcp.clone(),
        ceph: None,
        ceph_probe: Default::default(),
    };
    let cfg = CheckConfig { bridges: vec!["br-int".into()], ..Default::default() };

    let t = Instant::now();
    let first = checks::run(&ep, &cfg).await;
    let reachable =
        first.iter().find(|o| o.name == "libvirt-reachable").unwrap_or_else(|| panic!("{first:?}"));
    assert!(!reachable.passed);
    assert!(reachable.message.contains("did not answer within 2s"), "{}", reachable.message);
    assert!(t.elapsed() < Duration::from_secs(8), "ended at the deadline: {:?}", t.elapsed());
    assert!(first.iter().any(|o| o.name == "ovs-bridge/br-int" && o.passed), "the other checks still ran");

    // The first call's thread still hangs: the next run says so at once.
    let t = Instant::now();
    let second = checks::run(&ep, &cfg).await;
    let reachable =
        second.iter().find(|o| o.name == "libvirt-reachable").unwrap_or_else(|| panic!("{second:?}"));
    assert!(reachable.message.contains("has not returned yet"), "{}", reachable.message);
    assert!(t.elapsed() < Duration::from_secs(2), "no second wait: {:?}", t.elapsed());

    // The peer hangs up: the hung thread returns and the lane is free.
    let _ = hang_up.send(());
    let mut last = String::new();
    for _ in 0..50 {
        let again = checks::run(&ep, &cfg).await;
        last = again
            .iter()
            .find(|o| o.name == "libvirt-reachable")
            .map(|o| o.message.clone())
            .unwrap_or_default();
        if !last.contains("has not returned yet") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!last.contains("has not returned yet"), "{last}");
}

#[tokio::test(start_paused = true)]
async fn a_wedged_ovsdb_server_fails_the_call_at_its_timeout() {
    let (addr, _hang_up) = silent_peer().await;
    let c = Client::connect(&format!("tcp:{addr}")).await.unwrap();
    // Paused time: the timeout elapses as soon as nothing else can happen.
    let answered = tokio::time::timeout(Duration::from_secs(3600), c.bridges()).await;
    match answered {
        Ok(Err(OvsdbError::Timeout { method, secs })) => {
            assert_eq!((method.as_str(), secs), ("transact", 10))
        }
        other => panic!("the call must end at its own timeout: {other:?}"),
    }
}
