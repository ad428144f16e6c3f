//! `hv-agent run`, the real binary, against the test ground and a recording
//! test coordinator: what it streams, how it answers RunChecks, and its
//! health endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{AgentMessage, CheckConfig, DomainEventKind, RunChecks};
use hv_tests::fake_coordinator::FakeCoordinator;

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn agent(env: &hv_tests::env::TestEnv, coordinator: &str, ovsdb: &str, health: u16) -> Agent {
    let child = Command::new(env!("CARGO_BIN_EXE_hv-agent"))
        .args(["run", "--node", "node-1", "--insecure", "--coordinator", coordinator])
        .args(["--heartbeat", "500ms", "--health-listen", &format!("127.0.0.1:{health}")])
        .args(["--libvirt-uri", &env.libvirt.test_uri, "--ovsdb", ovsdb])
        .args(["--ceph-conf", &env.ceph.conf.to_string_lossy(), "--ceph-id", &env.ceph.client.id])
        .args(["--ceph-keyring", &env.ceph.client.keyring.to_string_lossy(), "--pool", "vms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Agent(child)
}

async fn get(port: u16, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return (0, String::new());
    };
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, buf.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

async fn wait_for<F: Fn(&[AgentMessage]) -> bool>(rec: &FakeCoordinator, what: &str, f: F) {
    hv_tests::wait::until(what, Duration::from_secs(20), String::new, || async {
        let seen = rec.messages().await;
        hv_tests::wait::ready_when(f(&seen), seen.len())
    })
    .await;
}

#[tokio::test]
async fn the_agent_streams_the_node_and_answers_run_checks() {
    let env = hv_tests::env::require();
    let cfg = CheckConfig {
        min_libvirt_version: "8.0.0".into(),
        bridges: vec!["br-int".into(), "br-ex".into()],
        optional_bridges: vec![],
        ceph_pools: vec!["vms".into()],
        start_test_domain: true,
        ..Default::default()
    };
    let rec = FakeCoordinator::with_commands(vec![Down::RunChecks(RunChecks {
        run: 1,
        config: Some(cfg),
        hypervisor_uid: "uid-1".into(),
    })]);
    let url = rec.serve().await.unwrap();
    let health = free_port();
    let _agent = agent(&env, &url, &env.ovsdb.tcp, health);

    wait_for(&rec, "Hello", |m| matches!(m.first().and_then(|m| m.payload.as_ref()), Some(Payload::Hello(h)) if h.node == "node-1")).await;
    wait_for(&rec, "facts", |m| m.iter().any(|m| matches!(&m.payload, Some(Payload::HostFacts(f)) if f.libvirt_version.starts_with("9.") && !f.kernel.is_empty()))).await;
    wait_for(&rec, "inventory", |m| m.iter().any(|m| matches!(&m.payload, Some(Payload::Inventory(i)) if i.domains.iter().any(|d| d.name == "test")))).await;
    wait_for(&rec, "a passing check report for run 1", |m| {
        m.iter().any(|m| matches!(&m.payload, Some(Payload::CheckReport(r)) if r.run == 1 && r.results.len() >= 6 && r.results.iter().all(|c| c.passed)))
    })
    .await;
    wait_for(&rec, "a heartbeat", |m| {
        m.iter().any(|m| matches!(m.payload, Some(Payload::Heartbeat(ref h)) if h.memory_total_bytes > 0))
    })
    .await;

    let out = Command::new("virsh").args(["-c", &env.libvirt.test_uri, "suspend", "test"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_for(&rec, "the suspend event", |m| {
        m.iter().any(|m| matches!(&m.payload, Some(Payload::DomainEvent(e)) if e.name == "test" && e.kind == DomainEventKind::Suspended as i32 && e.reason == "paused"))
    })
    .await;
    let _ = Command::new("virsh").args(["-c", &env.libvirt.test_uri, "resume", "test"]).output();

    let seqs: Vec<u64> = rec.messages().await.iter().map(|m| m.seq).filter(|s| *s > 0).collect();
    let mut sorted = seqs.clone();
    sorted.dedup();
    assert_eq!(seqs, sorted, "sequence numbers rise strictly on one stream");

    let (code, body) = get(health, "/healthz").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let (code, metrics) = get(health, "/metrics").await;
    assert_eq!(code, 200);
    assert!(
        metrics.contains("hv_agent_session_connected 1")
            && metrics.contains("hv_agent_watcher_live{watcher=\"libvirt\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn healthz_fails_when_a_watcher_is_not_live_and_livez_does_not() {
    let env = hv_tests::env::require();
    let health = free_port();
    let _agent = agent(&env, "http://127.0.0.1:1", "tcp:127.0.0.1:1", health);
    // Once libvirt and Ceph are up, only the unreachable OVSDB is named.
    hv_tests::wait::until("healthz to name only OVSDB", Duration::from_secs(15), String::new, || async {
        let (code, body) = get(health, "/healthz").await;
        hv_tests::wait::ready_when(code == 503 && body == "not live: ovsdb\n", (code, body))
    })
    .await;
    // Liveness does not hang on a peer: OVSDB and the coordinator are
    // unreachable, and the agent is alive all the same.
    assert_eq!(get(health, "/livez").await, (200, "alive\n".to_string()));
}
