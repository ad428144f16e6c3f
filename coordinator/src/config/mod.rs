//! The coordinator's configuration: its flags grouped by concern, each
//! group turned into the typed policy its part of the coordinator takes,
//! and the rules between flags checked once, at start. A configuration
//! that cannot work stops the coordinator with an error naming the flags;
//! one that works but is risky is returned as warnings.

pub mod drain;
pub mod evictions;
pub mod fencing;
pub mod grpc;
pub mod health;
pub mod identity;
pub mod leadership;
pub mod lifecycle;
pub mod new_nodes;
pub mod openstack;

use std::net::SocketAddr;
use std::time::Duration;

/// The hypervisor lifecycle coordinator (one leader per region; followers wait).
#[derive(clap::Parser, Debug)]
#[command(name = "hv-coordinator", version)]
pub struct Args {
    #[command(flatten, next_help_heading = "gRPC (agents, SREs)")]
    pub grpc: grpc::GrpcFlags,
    #[command(flatten, next_help_heading = "Agents' certificates from the cluster")]
    pub identity: identity::IdentityFlags,
    #[command(flatten, next_help_heading = "OpenStack")]
    pub openstack: openstack::OpenStackFlags,
    #[command(flatten, next_help_heading = "New nodes")]
    pub new_nodes: new_nodes::NewNodeFlags,
    #[command(flatten, next_help_heading = "Lifecycle")]
    pub lifecycle: lifecycle::LifecycleFlags,
    #[command(flatten, next_help_heading = "Node health")]
    pub health: health::HealthFlags,
    #[command(flatten, next_help_heading = "Drains and rolling updates")]
    pub drain: drain::DrainFlags,
    #[command(flatten, next_help_heading = "Fencing and evacuation")]
    pub fencing: fencing::FencingFlags,
    #[command(flatten, next_help_heading = "Evictions")]
    pub evictions: evictions::EvictionFlags,
    #[command(flatten, next_help_heading = "Leadership and the Kubernetes API")]
    pub leadership: leadership::LeadershipFlags,
    /// `act`: drive Nova, Placement, Ceph, BMCs, Nodes and pods. `observe`:
    /// decide and show what would be done (`Would…` Events, the
    /// `hv_would_total` metric, each host's `Paused` condition), and write
    /// nothing outside this install's own custom resources
    /// (docs/operations.md, "Hands off").
    #[arg(long, env = "HV_MODE", value_enum, default_value_t = Mode::Act)]
    pub mode: Mode,
    /// HTTP address of /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, env = "HV_METRICS_LISTEN", default_value = "0.0.0.0:8080")]
    pub metrics_listen: SocketAddr,
    /// JSON logs (production); the default is human-readable.
    #[arg(long, env = "HV_LOG_JSON")]
    pub log_json: bool,
}

/// Whether the install acts, or only observes (`--mode`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Act,
    Observe,
}

/// A configuration that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "gRPC needs --tls-cert, --tls-key and --client-ca (agents and SREs show certificates from that CA); \
         --insecure serves plain text to anyone"
    )]
    NoGrpcTls,
    #[error(
        "need --lease-retry ({retry:?}) < --lease-renew-deadline ({renew:?}) < --lease-duration ({lease:?})"
    )]
    LeaseOrder { retry: Duration, renew: Duration, lease: Duration },
    #[error(
        "--lease-renew-deadline ({renew:?}) must exceed --lease-retry ({retry:?}) plus the {margin:?} a call \
         needs to start (--connect-timeout and a second)"
    )]
    NoRoomToAct { renew: Duration, retry: Duration, margin: Duration },
    #[error("--namespace and --lease-name name this install: {0}")]
    Instance(String),
    #[error("--dependent-pods {0}:… needs --node-lock {0}: its pods are held by its lock (docs/drain.md)")]
    DependentWithoutLock(String),
    #[error(
        "--fence-fresh-heartbeat ({fresh:?}) must be at least three --agent-heartbeat intervals ({heartbeat:?}): \
         a live host whose agent missed a heartbeat would otherwise look fencable"
    )]
    FreshHeartbeatTooShort { fresh: Duration, heartbeat: Duration },
    #[error("{flag}: {value:?} is too long a duration")]
    Duration { flag: &'static str, value: Duration },
    #[error("--agent-service-account {0:?} is not NAMESPACE/NAME")]
    AgentAccount(String),
    #[error("--agent-certificate-life {0:?} is under 2m: a certificate must outlive a renewal's retries")]
    CertificateLife(Duration),
    #[error(
        "--identity-listen serves agents' certificates over TLS: it needs the gRPC server's (--tls-cert)"
    )]
    IdentityWithoutTls,
}

/// A risky setting the coordinator runs with all the same, logged at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Warning {
    /// gRPC in plain text: anyone who reaches the port can speak for any node.
    Insecure(SocketAddr),
    /// Ceph fencing without --ceph-client-networks: an agent's reported
    /// address is blocklisted on its word.
    CephAnywhere,
    /// The webhook serves, but protects no pod.
    WebhookProtectsNothing,
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Warning::Insecure(addr) => write!(
                f,
                "--insecure: gRPC in plain text without client certificates; anyone who reaches {addr} can speak for any node"
            ),
            Warning::CephAnywhere => write!(
                f,
                "--ceph-client-networks is not set: an agent's reported Ceph address is blocklisted on its word \
                 wherever it is (docs/fencing.md)"
            ),
            Warning::WebhookProtectsNothing => {
                write!(f, "the eviction webhook protects no pod: give --protected-pods (docs/drain.md)")
            }
        }
    }
}

impl Args {
    /// The rules between flags of different groups, and each group's own;
    /// the warnings to log when it can run.
    pub fn check(&self) -> Result<Vec<Warning>, ConfigError> {
        self.leadership.check()?;
        self.drain.check()?;
        self.identity.check()?;
        if self.identity.identity_listen.is_some() && self.grpc.insecure {
            return Err(ConfigError::IdentityWithoutTls);
        }
        // A live agent that missed a heartbeat or two must still count as fresh.
        let (fresh, heartbeat) = (self.fencing.fence_fresh_heartbeat, self.grpc.agent_heartbeat);
        if fresh < heartbeat * 3 {
            return Err(ConfigError::FreshHeartbeatTooShort { fresh, heartbeat });
        }
        let mut warnings = Vec::new();
        match self.grpc.tls_files() {
            Ok(Some(_)) => {}
            Ok(None) => warnings.push(Warning::Insecure(self.grpc.listen)),
            Err(e) => return Err(e),
        }
        if self.fencing.ceph_fence_id.is_some() && self.fencing.ceph_client_networks.is_empty() {
            warnings.push(Warning::CephAnywhere);
        }
        if self.drain.webhook_listen.is_some()
            && self.drain.protected(None).is_empty()
            && self.drain.drain_guard_image.is_none()
        {
            warnings.push(Warning::WebhookProtectsNothing);
        }
        Ok(warnings)
    }

    /// The lifecycle's policy: its own timeouts, the health grace before an
    /// unseen host is disabled, and whether a cordon asks for maintenance.
    pub fn lifecycle_policy(&self) -> Result<crate::lifecycle::Policy, ConfigError> {
        Ok(crate::lifecycle::Policy {
            registration_timeout: signed("--registration-timeout", self.lifecycle.registration_timeout)?,
            checks_timeout: signed("--checks-timeout", self.lifecycle.checks_timeout)?,
            unreachable_grace: signed("--unreachable-grace", self.health.unreachable_grace)?,
            cordon_starts_maintenance: self.drain.cordon_starts_maintenance,
            power: crate::power::machine::Limits::default(),
        })
    }
}

/// A flag's duration as the pure cores count time.
pub(crate) fn signed(flag: &'static str, value: Duration) -> Result<jiff::SignedDuration, ConfigError> {
    jiff::SignedDuration::try_from(value).map_err(|_| ConfigError::Duration { flag, value })
}

/// A duration flag: `10s`, `5m`, `500ms`, `1h30m`.
pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration =
        s.parse().map_err(|e| format!("{s:?} is not a duration like 10s, 5m, 500ms: {e}"))?;
    Duration::try_from(d).map_err(|e| format!("{s:?}: {e}"))
}

#[cfg(test)]
mod tests;
