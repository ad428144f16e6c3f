//! The coordinator's gRPC face: agent sessions ([`agent_service`]), the
//! session registry ([`registry`]), the fleet API ([`fleet_service`]), the
//! standard health service and server reflection, on one port.
//!
//! Health: the service `""` answers for the coordinator itself and is
//! SERVING only on the leader (the kubelet's probes speak no TLS and use
//! `/readyz` on the metrics port instead, which is also OK on a follower
//! whose pod carries no leader label: `k8s::leader_pod`);
//! `node/<name>` is SERVING only while that node is Active with a live
//! agent (set by the controller). A node's certificate asks about its own
//! node and the coordinator only ([`ScopedHealth`]).

pub mod agent_service;
pub mod fleet_service;
pub mod guest_cpus;
pub mod identity_service;
pub mod registry;

#[cfg(test)]
mod fuzz;

use std::net::SocketAddr;
use std::time::Duration;

use hv_proto::v1::agent_service_server::AgentServiceServer;
use hv_proto::v1::fleet_service_server::FleetServiceServer;
use hv_proto::v1::identity_service_server::IdentityServiceServer;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthApi, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::HealthReporter;

pub use agent_service::AgentEndpoint;
pub use fleet_service::FleetEndpoint;
pub use registry::Registry;

/// Per-node health in `grpc.health.v1`, under `node/<name>`.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
}

impl Health {
    /// Health reported through `reporter` (the gRPC server holds its service).
    pub fn new(reporter: HealthReporter) -> Health {
        Health { reporter }
    }

    pub fn service_name(node: &str) -> String {
        format!("node/{node}")
    }

    pub async fn set_node(&self, node: &str, serving: bool) {
        let status = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
        self.reporter.set_service_status(Self::service_name(node), status).await;
    }

    /// The coordinator itself (`""`): serving while it leads.
    pub async fn set_self(&self, serving: bool) {
        let status = if serving { ServingStatus::Serving } else { ServingStatus::NotServing };
        self.reporter.set_service_status("", status).await;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("gRPC listener on {0}: {1}")]
    Bind(SocketAddr, std::io::Error),
    #[error("reflection descriptors: {0}")]
    Reflection(String),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Binds the port (so a caller learns a bind error at once) and answers the
/// bound address and the health handle; `serve` runs until `shutdown`.
pub struct Server {
    listener: TcpListener,
    pub addr: SocketAddr,
    pub health: Health,
    health_service: tonic_health::server::HealthService,
}

impl Server {
    pub async fn bind(addr: SocketAddr) -> Result<Server, ServeError> {
        let listener = TcpListener::bind(addr).await.map_err(|e| ServeError::Bind(addr, e))?;
        let addr = listener.local_addr().map_err(|e| ServeError::Bind(addr, e))?;
        let reporter = HealthReporter::new();
        let health_service = tonic_health::server::HealthService::from_health_reporter(reporter.clone());
        let health = Health { reporter };
        health.set_self(false).await;
        Ok(Server { listener, addr, health, health_service })
    }

    /// Serves until `shutdown`: over mutual TLS when `tls` is given (every
    /// client shows a certificate from its CA), else in plain text
    /// (`--insecure`).
    pub async fn serve(
        self,
        agents: AgentEndpoint,
        fleet: FleetEndpoint,
        identity: Option<std::sync::Arc<identity_service::Issuer>>,
        tls: Option<Tls>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), ServeError> {
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(hv_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| ServeError::Reflection(e.to_string()))?;
        let router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            // An agent holds one stream; an SRE's watch one more.
            .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
            .add_service(HealthServer::new(ScopedHealth {
                inner: self.health_service,
                trust_domain: fleet.trust_domain.clone(),
            }))
            .add_service(reflection)
            .add_service(AgentServiceServer::new(agents).max_decoding_message_size(MAX_MESSAGE_BYTES))
            .add_service(FleetServiceServer::new(fleet).max_decoding_message_size(MAX_MESSAGE_BYTES))
            .add_optional_service(identity.map(|issuer| {
                IdentityServiceServer::new(identity_service::IdentityEndpoint { issuer, mutual: true })
                    .max_decoding_message_size(identity_service::MAX_MESSAGE_BYTES)
            }));
        match tls {
            Some(tls) => {
                let incoming = hv_tls::server::incoming(self.listener, tls.config, tls.limits, tls.stats);
                router.serve_with_incoming_shutdown(incoming, shutdown).await?
            }
            None => {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(self.listener);
                router.serve_with_incoming_shutdown(incoming, shutdown).await?
            }
        }
        Ok(())
    }
}

/// The bootstrap port: `IdentityService` alone, over server TLS, until
/// `shutdown`. Its listener is bound by the caller, so that a bind error
/// shows at start.
pub async fn serve_bootstrap(
    listener: TcpListener,
    issuer: std::sync::Arc<identity_service::Issuer>,
    tls: Tls,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let endpoint = identity_service::IdentityEndpoint { issuer, mutual: false };
    let incoming = hv_tls::server::incoming(listener, tls.config, tls.limits, tls.stats);
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(MAX_STREAMS_PER_CONNECTION))
        .add_service(
            IdentityServiceServer::new(endpoint)
                .max_decoding_message_size(identity_service::MAX_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await?;
    Ok(())
}

/// The health service as its caller may see it: an SRE's certificate asks
/// about any service, a node's about its own node (`node/<name>`) and the
/// coordinator (`""`) only, any other certificate nothing.
pub struct ScopedHealth {
    inner: tonic_health::server::HealthService,
    trust_domain: Option<String>,
}

impl ScopedHealth {
    fn allowed(&self, request: &Request<HealthCheckRequest>) -> Result<(), Status> {
        let certs = request.peer_certs();
        let reader =
            fleet_service::reader_of(certs.as_deref().map(Vec::as_slice), self.trust_domain.as_deref())?;
        health_scope(&reader, &request.get_ref().service)
    }
}

/// Whether `reader` may ask about the health service `service`.
fn health_scope(reader: &fleet_service::Reader, service: &str) -> Result<(), Status> {
    match reader {
        fleet_service::Reader::Node(node) if !service.is_empty() && service != Health::service_name(node) => {
            Err(Status::permission_denied(format!(
                "node/{node} asks about its own health only, not {service}"
            )))
        }
        _ => Ok(()),
    }
}

#[tonic::async_trait]
impl HealthApi for ScopedHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.allowed(&request)?;
        self.inner.check(request).await
    }

    type WatchStream = tonic_health::server::WatchStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.allowed(&request)?;
        self.inner.watch(request).await
    }
}

/// The largest message taken from a client: an agent's inventory of a few
/// hundred domains is far below it.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// Streams one client connection may hold open at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// The server's TLS: its configuration (certificate and client CA re-read
/// when their files change), the listener's bounds, and its counters.
pub struct Tls {
    pub config: std::sync::Arc<hv_tls::server::ServerConfig>,
    pub limits: hv_tls::server::Limits,
    pub stats: std::sync::Arc<hv_tls::server::Stats>,
}

#[cfg(test)]
mod scope_tests {
    use super::fleet_service::Reader;
    use super::*;

    #[test]
    fn a_node_asks_about_its_own_health_and_the_coordinators_only() {
        let node = Reader::Node("node-a".into());
        assert!(health_scope(&node, "").is_ok());
        assert!(health_scope(&node, "node/node-a").is_ok());
        let other = health_scope(&node, "node/node-b").unwrap_err();
        assert_eq!(other.code(), tonic::Code::PermissionDenied, "{other}");
        assert!(health_scope(&Reader::Sre("alice".into()), "node/node-b").is_ok());
    }
}
