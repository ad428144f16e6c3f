//! Leader election, the install's name, and the bounds on every request to
//! the Kubernetes API (docs/failover.md).

use std::time::Duration;

use super::{ConfigError, duration};
use crate::k8s::leader::Election;

#[derive(clap::Args, Debug)]
pub struct LeadershipFlags {
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "hv-system")]
    pub namespace: String,
    /// The leader-election Lease. With --namespace it names this install:
    /// every Hypervisor it manages carries `NAMESPACE.LEASE` in the label
    /// hypervisor.cloud.sap/instance (at most 63 characters in all).
    #[arg(long, default_value = "hv-coordinator")]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: POD_NAME, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Label this replica's pod (named by --identity, in --namespace)
    /// hypervisor.cloud.sap/leader=true while it leads, and be Ready while
    /// the label agrees with the role: the chart's Service selects the
    /// label, so every replica can be Ready and a PodDisruptionBudget can
    /// let one go. Without it only the leader is Ready.
    #[arg(long, requires = "identity")]
    pub label_leader_pod: bool,
    /// How long a lease stands unrenewed before a follower may take it.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// A leader that has not renewed within this stops acting (and exits);
    /// shorter than --lease-duration, so two replicas never act at once.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub lease_renew_deadline: Duration,
    /// Pause between lease tries (followers) and renewals (the leader).
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub lease_retry: Duration,
    /// Longest wait for an answer of the Kubernetes API to a request (not a watch).
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub kube_timeout: Duration,
    /// Writes to the Kubernetes API in flight at once; more wait their turn.
    /// A burst of reconciles (every Hypervisor after a failover) does not
    /// time out the API server's handlers or queue the Lease renewal behind
    /// it (docs/coordinator.md).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_max_in_flight_writes: u32,
    /// Longest wait for a connection to Kubernetes, Nova, Placement or Keystone. A call
    /// that changes something starts only while the lease has this much and a second
    /// left before --lease-renew-deadline, so it is sent before another replica can lead.
    #[arg(long, default_value = "3s", value_parser = duration)]
    pub connect_timeout: Duration,
    /// Hypervisor reconciles run at once (and as many Eviction reconciles);
    /// the rest wait their turn in the queue, first come first served.
    /// Unbounded, a failover or the first start built every host's
    /// reconcile at once (about 20 KiB each, most of them then waiting for
    /// `--openstack-max-in-flight`). Large enough that hosts whose BMC is
    /// read inside their reconcile (seconds each when a row loses power)
    /// do not keep a failed host elsewhere waiting.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    pub reconcile_concurrency: u16,
}

impl LeadershipFlags {
    /// The lease's times are ordered, and leave a call room to start before
    /// this replica could stop leading.
    pub fn check(&self) -> Result<(), ConfigError> {
        let (retry, renew, lease) = (self.lease_retry, self.lease_renew_deadline, self.lease_duration);
        if renew >= lease || retry >= renew {
            return Err(ConfigError::LeaseOrder { retry, renew, lease });
        }
        let margin = self.margin();
        if margin + retry >= renew {
            return Err(ConfigError::NoRoomToAct { renew, retry, margin });
        }
        self.instance()?;
        Ok(())
    }

    /// How long to wait for a connection to the Kubernetes API.
    pub fn kube_connect(&self) -> Duration {
        self.connect_timeout.min(self.kube_timeout)
    }

    /// A call that changes something starts only while the lease has a
    /// connection's time and a second left before the renew deadline: it
    /// is on the wire before this replica stops leading, and a follower may
    /// take the lease only a lease duration after the last renewal.
    pub fn margin(&self) -> Duration {
        self.kube_connect() + Duration::from_secs(1)
    }

    /// This install's name (`NAMESPACE.LEASE`), the value of its Hypervisors'
    /// instance label.
    pub fn instance(&self) -> Result<String, ConfigError> {
        crate::k8s::nodes::instance_name(&self.namespace, &self.lease_name).map_err(ConfigError::Instance)
    }

    /// This replica's identity: the flag (POD_NAME), else host name and pid.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host =
                nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
            format!("{host}-{}", std::process::id())
        })
    }

    pub fn election(&self, identity: &str) -> Election {
        Election {
            lease: self.lease_name.clone(),
            identity: identity.to_string(),
            lease_duration: self.lease_duration,
            renew_deadline: self.lease_renew_deadline,
            retry: self.lease_retry,
        }
    }
}
