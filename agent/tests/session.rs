//! The session against a test coordinator (a real tonic server on
//! loopback): replay after a broken stream loses nothing and resends
//! nothing already acknowledged; unexpected messages are survived.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hv_agent::backoff::Backoff;
use hv_agent::session::{Command, Session, SessionConfig};
use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{Ack, AgentMessage, CoordinatorMessage, DomainEvent, RunChecks, Welcome};
use tokio::sync::{Mutex, mpsc};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// A coordinator that stores each message by seq and acks it; on the first
/// connection it stops acking after `ack_first` and breaks the stream after
/// `break_after` messages.
#[derive(Default)]
struct TestCoordinator {
    durable: Mutex<Vec<u64>>,
    per_connection: Mutex<Vec<Vec<u64>>>,
    connections: AtomicUsize,
    ack_first: usize,
    break_after: usize,
    send_unexpected: bool,
}

type Out = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

struct Svc(Arc<TestCoordinator>);

#[tonic::async_trait]
impl AgentService for Svc {
    type ConnectStream = Out;

    async fn connect(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<Out>, Status> {
        let me = self.0.clone();
        let n = me.connections.fetch_add(1, Ordering::SeqCst);
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let Some(Ok(hello)) = inbound.next().await else { return };
            assert!(matches!(hello.payload, Some(Payload::Hello(_))), "Hello comes first");
            let acked = me.durable.lock().await.iter().copied().max().unwrap_or(0);
            let welcome = Down::Welcome(Welcome {
                coordinator_version: "test".into(),
                acked_seq: acked,
                heartbeat_interval: None,
            });
            let _ = tx.send(Ok(CoordinatorMessage { payload: Some(welcome) })).await;
            if me.send_unexpected {
                let _ = tx.send(Ok(CoordinatorMessage { payload: None })).await;
                let again = Down::Welcome(Welcome::default());
                let _ = tx.send(Ok(CoordinatorMessage { payload: Some(again) })).await;
                let _ = tx
                    .send(Ok(CoordinatorMessage {
                        payload: Some(Down::RunChecks(RunChecks {
                            run: 7,
                            config: None,
                            hypervisor_uid: String::new(),
                        })),
                    }))
                    .await;
            }
            me.per_connection.lock().await.push(Vec::new());
            let mut seen = 0;
            while let Some(Ok(m)) = inbound.next().await {
                seen += 1;
                me.per_connection.lock().await[n].push(m.seq);
                if n == 0 && seen > me.break_after {
                    let _ = tx.send(Err(Status::unavailable("coordinator restarting"))).await;
                    return;
                }
                if n == 0 && seen > me.ack_first {
                    continue; // received but not made durable
                }
                let mut d = me.durable.lock().await;
                if !d.contains(&m.seq) {
                    d.push(m.seq);
                }
                drop(d);
                let _ =
                    tx.send(Ok(CoordinatorMessage { payload: Some(Down::Ack(Ack { seq: m.seq })) })).await;
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

async fn serve(c: Arc<TestCoordinator>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Svc(c)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    format!("http://{addr}")
}

fn config(url: String) -> SessionConfig {
    SessionConfig {
        coordinator: url,
        node: "node-1".into(),
        agent_version: "test".into(),
        boot_id: "boot-1".into(),
        heartbeat: Duration::from_secs(3600),
        buffer: 1000,
        backoff: Backoff { base: Duration::from_millis(50), max: Duration::from_millis(200), jitter: 0.2 },
        tls: None,
    }
}

fn event(i: u32) -> Payload {
    Payload::DomainEvent(DomainEvent { name: format!("vm-{i}"), ..Default::default() })
}

#[tokio::test]
async fn replay_after_a_broken_stream_loses_nothing_and_resends_nothing_acked() {
    let coord = Arc::new(TestCoordinator { ack_first: 10, break_after: 15, ..Default::default() });
    let session = Session::new(config(serve(coord.clone()).await));
    let handle = session.handle();
    let stats = session.stats.clone();
    let (cmd_tx, _cmd_rx) = mpsc::channel(8);
    let task = tokio::spawn(session.run(cmd_tx));
    for i in 1..=40 {
        handle.push(event(i)).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    hv_tests::wait::until("40 messages acked", Duration::from_secs(10), String::new, || async {
        let acked = handle.acked().await;
        hv_tests::wait::ready_when(acked >= 40, acked)
    })
    .await;
    let mut durable = coord.durable.lock().await.clone();
    durable.sort();
    assert_eq!(durable, (1..=40).collect::<Vec<u64>>(), "every event is durable exactly once");
    let conns = coord.per_connection.lock().await.clone();
    assert!(conns.len() >= 2, "the stream was broken and re-established");
    let second = conns.iter().skip(1).find(|c| !c.is_empty()).unwrap();
    assert_eq!(second[0], 11, "replay starts right after the last acknowledged seq");
    let acked_first: Vec<u64> = conns[0].iter().copied().take(10).collect();
    for c in conns.iter().skip(1) {
        assert!(c.iter().all(|s| !acked_first.contains(s)), "an acknowledged seq was sent again: {c:?}");
    }
    assert!(stats.connects.load(Ordering::Relaxed) >= 2);
    task.abort();
}

#[tokio::test]
async fn unexpected_messages_are_logged_and_survived() {
    let coord = Arc::new(TestCoordinator {
        ack_first: usize::MAX,
        break_after: usize::MAX,
        send_unexpected: true,
        ..Default::default()
    });
    let session = Session::new(config(serve(coord.clone()).await));
    let handle = session.handle();
    let stats = session.stats.clone();
    let (cmd_tx, mut cmd_rx) = mpsc::channel(8);
    let task = tokio::spawn(session.run(cmd_tx));
    let cmd = tokio::time::timeout(Duration::from_secs(5), cmd_rx.recv()).await.unwrap().unwrap();
    assert_eq!(
        cmd,
        Command::RunChecks(RunChecks { run: 7, config: None, hypervisor_uid: String::new() }),
        "commands after the junk still arrive"
    );
    handle.push(event(1)).await;
    hv_tests::wait::until("the event acked", Duration::from_secs(5), String::new, || async {
        let acked = handle.acked().await;
        hv_tests::wait::ready_when(acked >= 1, acked)
    })
    .await;
    assert_eq!(stats.unexpected_messages.load(Ordering::Relaxed), 2);
    assert_eq!(stats.connects.load(Ordering::Relaxed), 1, "the stream was kept");
    task.abort();
}

#[tokio::test]
async fn an_unreachable_coordinator_is_retried_without_losing_messages() {
    let session = Session::new(config("http://127.0.0.1:1".into()));
    let handle = session.handle();
    let stats = session.stats.clone();
    let (cmd_tx, _rx) = mpsc::channel(8);
    let task = tokio::spawn(session.run(cmd_tx));
    handle.push(event(1)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(stats.stream_errors.load(Ordering::Relaxed) >= 2, "it keeps trying");
    assert_eq!(handle.acked().await, 0);
    task.abort();
}

#[tokio::test]
async fn a_garbled_coordinator_message_is_logged_and_survived() {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};

    // A "coordinator" that answers Connect with a gRPC frame whose bytes are
    // not a CoordinatorMessage.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let svc = service_fn(|_req: hyper::Request<hyper::body::Incoming>| async {
                    let frame: Vec<u8> = vec![0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0xff];
                    let mut r = hyper::Response::new(Full::new(bytes::Bytes::from(frame)));
                    r.headers_mut().insert("content-type", "application/grpc".parse().unwrap());
                    Ok::<_, std::convert::Infallible>(r)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let session = Session::new(config(url));
    let handle = session.handle();
    let stats = session.stats.clone();
    let (cmd_tx, _rx) = mpsc::channel(8);
    let task = tokio::spawn(session.run(cmd_tx));
    handle.push(event(1)).await;
    hv_tests::wait::until(
        "the garbage reported as stream errors",
        Duration::from_secs(5),
        String::new,
        || async {
            let errors = stats.stream_errors.load(Ordering::Relaxed);
            hv_tests::wait::ready_when(errors >= 2, errors)
        },
    )
    .await;
    assert!(!task.is_finished(), "the session survives and keeps reconnecting");
    assert_eq!(stats.connects.load(Ordering::Relaxed), 0, "no Welcome was ever decoded");
    assert_eq!(handle.acked().await, 0, "nothing is considered delivered");
    task.abort();
}
