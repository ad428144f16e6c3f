//! The gRPC server's flags: where it listens, its mutual TLS, and the
//! agents' heartbeat.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, duration};

#[derive(clap::Args, Debug)]
pub struct GrpcFlags {
    /// gRPC address: AgentService, FleetService, grpc.health.v1, reflection.
    #[arg(long, env = "HV_LISTEN", default_value = "0.0.0.0:9090")]
    pub listen: SocketAddr,
    /// PEM certificate (chain) the gRPC server presents; re-read when the file
    /// changes. With --tls-key and --client-ca; without them, --insecure.
    #[arg(long, env = "HV_TLS_CERT", requires_all = ["tls_key", "client_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// The server certificate's private key (PEM); re-read with it.
    #[arg(long, env = "HV_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA that signs the clients' certificates (agents' and SREs');
    /// every gRPC client must show one. Re-read when the file changes.
    #[arg(long, env = "HV_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// Trust domain of agent certificates: an agent's certificate names its
    /// node with the URI SAN spiffe://DOMAIN/node/NAME, and it may speak for
    /// that node only.
    #[arg(long, env = "HV_TRUST_DOMAIN", default_value = "hypervisor.cloud.sap")]
    pub trust_domain: String,
    /// Serve gRPC in plain text without client certificates: anyone who
    /// reaches the port can then speak for any node. A laboratory's setting.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "client_ca"])]
    pub insecure: bool,
    /// gRPC connections open at once (agents, SREs); more wait.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Heartbeat interval told to agents; three missed ones end a session.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub agent_heartbeat: Duration,
}

impl GrpcFlags {
    /// The server's certificate files: mutual TLS, or plain text (None)
    /// only when asked for by name.
    pub fn tls_files(&self) -> Result<Option<hv_tls::TlsFiles>, ConfigError> {
        if self.insecure {
            return Ok(None);
        }
        match (&self.tls_cert, &self.tls_key, &self.client_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                Ok(Some(hv_tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() }))
            }
            _ => Err(ConfigError::NoGrpcTls),
        }
    }

    /// The listener's bounds beyond the TLS handshake's.
    pub fn limits(&self) -> hv_tls::server::Limits {
        hv_tls::server::Limits {
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            ..Default::default()
        }
    }
}
