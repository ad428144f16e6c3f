//! A recording coordinator for agent tests and benchmarks: a real tonic
//! `AgentService` on loopback that welcomes the agent, sends the commands
//! it was given, acks every message and records it with its arrival time.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use hv_proto::v1::agent_service_server::{AgentService, AgentServiceServer};
use hv_proto::v1::coordinator_message::Payload as Down;
use hv_proto::v1::{Ack, AgentMessage, CoordinatorMessage, Welcome};
use tokio::sync::{Mutex, mpsc};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

#[derive(Default)]
pub struct FakeCoordinator {
    /// Sent after the Welcome on every new stream.
    pub commands: Vec<Down>,
    /// Every message received, with when it arrived.
    pub received: Mutex<Vec<(Instant, AgentMessage)>>,
}

impl FakeCoordinator {
    pub fn with_commands(commands: Vec<Down>) -> Arc<Self> {
        Arc::new(FakeCoordinator { commands, ..Default::default() })
    }

    /// Serve on a free loopback port; returns `http://127.0.0.1:PORT`.
    pub async fn serve(self: &Arc<Self>) -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let svc = Svc(self.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(AgentServiceServer::new(svc))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await;
        });
        Ok(url)
    }

    /// A copy of what arrived so far.
    pub async fn messages(&self) -> Vec<AgentMessage> {
        self.received.lock().await.iter().map(|(_, m)| m.clone()).collect()
    }
}

struct Svc(Arc<FakeCoordinator>);

type Out = Pin<Box<dyn Stream<Item = Result<CoordinatorMessage, Status>> + Send>>;

#[tonic::async_trait]
impl AgentService for Svc {
    type ConnectStream = Out;

    async fn connect(&self, req: Request<Streaming<AgentMessage>>) -> Result<Response<Out>, Status> {
        let me = self.0.clone();
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(async move {
            let welcome = Down::Welcome(Welcome {
                coordinator_version: "fake".into(),
                acked_seq: 0,
                heartbeat_interval: None,
            });
            let _ = tx.send(Ok(CoordinatorMessage { payload: Some(welcome) })).await;
            for c in &me.commands {
                let _ = tx.send(Ok(CoordinatorMessage { payload: Some(c.clone()) })).await;
            }
            while let Some(Ok(m)) = inbound.next().await {
                let seq = m.seq;
                me.received.lock().await.push((Instant::now(), m));
                if seq > 0 {
                    let _ = tx.send(Ok(CoordinatorMessage { payload: Some(Down::Ack(Ack { seq })) })).await;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}
