//! The agents' certificates from the cluster (docs/agent-identity.md): the
//! bootstrap port, the signing CA, who may ask, and how long a certificate
//! lives.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, duration};

#[derive(clap::Args, Debug)]
pub struct IdentityFlags {
    /// Address of the bootstrap port: IdentityService over server TLS (the
    /// gRPC server's certificate), where an agent without a certificate
    /// asks for one with its pod's token. Unset: agents bring their own.
    #[arg(long, env = "HV_IDENTITY_LISTEN", requires_all = ["agent_signer_cert", "agent_signer_key"])]
    pub identity_listen: Option<SocketAddr>,
    /// The CA that signs agents' certificates (PEM, its own certificate
    /// first); trusted for clients beside --client-ca. Read at each
    /// issuance.
    #[arg(long, env = "HV_AGENT_SIGNER_CERT", requires = "agent_signer_key")]
    pub agent_signer_cert: Option<PathBuf>,
    /// The signing CA's private key (PEM).
    #[arg(long, env = "HV_AGENT_SIGNER_KEY", requires = "agent_signer_cert")]
    pub agent_signer_key: Option<PathBuf>,
    /// The agents' ServiceAccount, NAMESPACE/NAME: only its tokens get
    /// certificates.
    #[arg(long, env = "HV_AGENT_SERVICE_ACCOUNT", default_value = "hv-system/hv-agent")]
    pub agent_service_account: String,
    /// The agents' DaemonSet, in the ServiceAccount's namespace: only its
    /// pods get certificates.
    #[arg(long, env = "HV_AGENT_DAEMONSET", default_value = "hv-agent")]
    pub agent_daemonset: String,
    /// The audience the agents' projected tokens are for: a token for the
    /// API server (or anyone else) is refused.
    #[arg(long, env = "HV_AGENT_TOKEN_AUDIENCE", default_value = "hv-coordinator")]
    pub agent_token_audience: String,
    /// How long an agent's certificate lives; agents renew at two thirds.
    #[arg(long, default_value = "24h", value_parser = duration)]
    pub agent_certificate_life: Duration,
    /// The CA of the gRPC server's certificate (PEM), published for the
    /// agents in the ConfigMap --publish-server-ca-configmap of this
    /// install's namespace while this replica leads.
    #[arg(long, env = "HV_PUBLISH_SERVER_CA", requires = "publish_server_ca_configmap")]
    pub publish_server_ca: Option<PathBuf>,
    /// The ConfigMap (key `ca.crt`) the agents mount.
    #[arg(long, env = "HV_PUBLISH_SERVER_CA_CONFIGMAP", requires = "publish_server_ca")]
    pub publish_server_ca_configmap: Option<String>,
    /// Also take agents' certificates from --client-ca (from a host
    /// directory) while agents move to certificates from the coordinator.
    /// Without it, with --identity-listen, a node's certificate must come
    /// from the agents' signer.
    #[arg(long, env = "HV_ACCEPT_HOST_CERTIFICATES")]
    pub accept_host_certificates: bool,
    /// The longest-lived token taken (the chart's projected tokens live
    /// 10 minutes).
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub agent_token_max_life: Duration,
}

impl IdentityFlags {
    /// Who may ask, when the bootstrap port serves.
    pub fn agents(&self) -> Result<crate::identity::Agents, ConfigError> {
        let (namespace, account) = self
            .agent_service_account
            .split_once('/')
            .filter(|(n, a)| !n.is_empty() && !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| ConfigError::AgentAccount(self.agent_service_account.clone()))?;
        Ok(crate::identity::Agents {
            namespace: namespace.into(),
            service_account: account.into(),
            daemon_set: self.agent_daemonset.clone(),
            audience: self.agent_token_audience.clone(),
        })
    }

    /// A certificate must outlive a renewal's retries: at least 2 minutes.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.agents()?;
        if self.agent_certificate_life < Duration::from_secs(120) {
            return Err(ConfigError::CertificateLife(self.agent_certificate_life));
        }
        Ok(())
    }
}
