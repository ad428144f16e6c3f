//! The generated AgentService really streams both ways over HTTP/2 on
//! loopback, and undecodable bytes are an error, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::pin::Pin;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::agent_service_client::AgentServiceClient;
use hv_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{Ack, AgentMessage, CoordinatorMessage, Heartbeat, Hello, Welcome};
use prost::Message;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Welcomes a Hello and acks every message by its sequence number.
struct Echo;

#[tonic::async_trait]
impl AgentService for Echo {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

    async fn connect(
        &self,
        req: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let mut inbound = req.into_inner();
        let out = async_stream_like(move |tx| async move {
            while let Some(msg) = inbound.next().await {
                let msg = match msg {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let reply = match msg.payload {
                    Some(Payload::Hello(h)) => Down::Welcome(Welcome {
                        coordinator_version: format!("test for {}", h.node),
                        acked_seq: 0,
                        heartbeat_interval: None,
                    }),
                    Some(_) => Down::Ack(Ack { seq: msg.seq }),
                    None => {
                        let _ = tx.send(Err(Status::invalid_argument("empty payload"))).await;
                        return;
                    }
                };
                if tx.send(Ok(CoordinatorMessage { payload: Some(reply) })).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(out))
    }
}

fn async_stream_like<F, Fut>(f: F) -> Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<CoordinatorMessage, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn serve() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Echo))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    addr
}

fn msg(seq: u64, payload: Payload) -> AgentMessage {
    AgentMessage { seq, sent_at: None, payload: Some(payload) }
}

#[tokio::test]
async fn hello_welcome_and_acks_by_sequence() {
    let addr = serve().await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let mut client = AgentServiceClient::new(channel);
    let hello = Hello {
        node: "node-1".into(),
        agent_version: "0.1.0".into(),
        boot_id: "b".into(),
        ..Default::default()
    };
    let up = tokio_stream::iter(vec![
        msg(1, Payload::Hello(hello)),
        msg(2, Payload::Heartbeat(Heartbeat { load1: 0.5, ..Default::default() })),
        msg(3, Payload::Heartbeat(Heartbeat::default())),
    ]);
    let mut down = client.connect(up).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(m) = down.next().await {
        got.push(m.unwrap().payload.unwrap());
    }
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(matches!(&got[0], Down::Welcome(w) if w.coordinator_version == "test for node-1"));
    assert_eq!(got[1], Down::Ack(Ack { seq: 2 }));
    assert_eq!(got[2], Down::Ack(Ack { seq: 3 }));
}

#[test]
fn garbled_bytes_are_a_decode_error() {
    let garbage: [&[u8]; 4] = [
        &[0xff, 0xff, 0xff],
        &[0x0a, 0x80],
        &[0x52, 0x05, 0x01],
        &[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ];
    for g in garbage {
        assert!(AgentMessage::decode(g).is_err(), "{g:?} decoded");
    }
    // Unknown fields from a newer agent are skipped, not an error.
    let mut newer = msg(7, Payload::Heartbeat(Heartbeat::default())).encode_to_vec();
    newer.extend_from_slice(&[0xf8, 0x3e, 0x01]); // field 999, varint 1
    assert_eq!(AgentMessage::decode(newer.as_slice()).unwrap().seq, 7);
}

#[test]
fn descriptor_set_serves_reflection_for_both_services() {
    let fds = prost_types::FileDescriptorSet::decode(hv_proto::FILE_DESCRIPTOR_SET).unwrap();
    let services: Vec<String> =
        fds.file.iter().flat_map(|f| f.service.iter().map(|s| s.name().to_string())).collect();
    assert!(
        services.contains(&"AgentService".to_string()) && services.contains(&"FleetService".to_string()),
        "{services:?}"
    );
}
