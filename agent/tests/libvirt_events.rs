//! Lifecycle events from the real libvirtd, caused by `virsh` on another
//! connection, must reach us within a second.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

use hv_agent::libvirt::LibvirtTarget;
use hv_agent::libvirt::events::{LibvirtEvent, init_event_loop, subscribe};
use hv_proto::v1::DomainEventKind;

fn virsh(uri: &str, args: &[&str]) {
    let out = Command::new("virsh").arg("-c").arg(uri).args(args).output().unwrap();
    assert!(out.status.success(), "virsh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

async fn expect(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<LibvirtEvent>,
    want: DomainEventKind,
    reason: &str,
) -> Duration {
    let start = Instant::now();
    loop {
        let ev = tokio::time::timeout(Duration::from_secs(1), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} event within a second"))
            .unwrap();
        if let LibvirtEvent::Domain { name, kind, reason: r, uuid } = ev
            && kind == want
            && name == "test"
        {
            assert_eq!(r, reason);
            assert_eq!(uuid.len(), 36, "{uuid}");
            return start.elapsed();
        }
    }
}

#[tokio::test]
async fn events_arrive_within_a_second_of_virsh() {
    let env = hv_tests::env::require();
    // The `default` test driver is shared by all connections to the daemon.
    let uri = env.libvirt.test_uri.clone();
    init_event_loop().unwrap();
    let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let _sub = subscribe(&conn, tx).unwrap();
    let u = uri.clone();
    let stop = tokio::task::spawn_blocking(move || virsh(&u, &["destroy", "test"]));
    let t1 = expect(&mut rx, DomainEventKind::Stopped, "destroyed").await;
    stop.await.unwrap();
    let u = uri.clone();
    let start = tokio::task::spawn_blocking(move || virsh(&u, &["start", "test"]));
    let t2 = expect(&mut rx, DomainEventKind::Started, "booted").await;
    start.await.unwrap();
    eprintln!("event latency including virsh: stop {t1:?}, start {t2:?}");
}

#[tokio::test]
async fn a_killed_libvirtd_is_reported_lost_and_reconnected_when_back() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use hv_agent::backoff::Backoff;
    use hv_agent::libvirt::watch::{WatchEvent, watch};

    let env = hv_tests::env::require();
    let mut daemon = hv_tests::libvirtd::PrivateLibvirtd::start(&env, "events").unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::channel(16);
    let live = Arc::new(AtomicBool::new(false));
    let backoff = Backoff { base: Duration::from_millis(100), max: Duration::from_millis(500), jitter: 0.3 };
    let task = tokio::spawn(watch(LibvirtTarget::plain(&daemon.test_uri()), backoff, tx, live.clone()));
    macro_rules! next {
        ($secs:expr) => {
            tokio::time::timeout(Duration::from_secs($secs), rx.recv()).await.unwrap()
        };
    }
    assert!(matches!(next!(10), Some(WatchEvent::Connected { .. })));
    assert!(live.load(Ordering::Relaxed));

    let killed = Instant::now();
    daemon.kill();
    match next!(5) {
        Some(WatchEvent::Lost { reason }) => eprintln!("lost after {:?}: {reason}", killed.elapsed()),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(killed.elapsed() < Duration::from_secs(2), "the loss took {:?}", killed.elapsed());
    assert!(!live.load(Ordering::Relaxed));

    let daemon = tokio::task::spawn_blocking(move || {
        daemon.restart().unwrap();
        daemon
    })
    .await
    .unwrap();
    loop {
        match next!(10) {
            Some(WatchEvent::Connected { libvirt_version }) => {
                assert!(libvirt_version.starts_with("9."));
                break;
            }
            Some(WatchEvent::Lost { .. }) => continue, // attempts while it was starting
            other => panic!("expected Connected, got {other:?}"),
        }
    }
    assert!(live.load(Ordering::Relaxed));
    task.abort();
    drop(daemon);
}
