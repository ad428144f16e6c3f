//! Fencing a Failed host and evacuating it (docs/fencing.md): its limits,
//! the Ceph identity that blocklists, and which servers are rebuilt.

use std::path::PathBuf;
use std::time::Duration;

use super::{ConfigError, duration, signed};
use crate::fence::ceph::CephFence;
use crate::fence::decide::FencePolicy;

/// How long the hv-ceph-fence helper may take for one blocklist change.
const CEPH_FENCE_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(clap::Args, Debug)]
pub struct FencingFlags {
    /// Fencing (docs/fencing.md): past this share (percent) of a failure
    /// domain's hosts lost at once, none of them is fenced.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub fence_max_domain_share: u8,
    /// At most this many fencings start per --fence-interval, fleet-wide.
    #[arg(long, default_value_t = 2)]
    pub fence_max_started: usize,
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub fence_interval: Duration,
    /// An agent heard from within this is alive: its host is never fenced.
    /// At least three --agent-heartbeat intervals.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub fence_fresh_heartbeat: Duration,
    /// How long a BMC may take to report a power off before the step fails.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub fence_power_timeout: Duration,
    /// The Ceph identity that may blocklist (`osd blocklist` in its mon
    /// caps); without it a host that uses Ceph is not fenced past Nova.
    #[arg(long, env = "HV_CEPH_FENCE_ID")]
    pub ceph_fence_id: Option<String>,
    #[arg(long, env = "HV_CEPH_FENCE_CONF", default_value = "/etc/ceph/ceph.conf")]
    pub ceph_fence_conf: PathBuf,
    #[arg(long, env = "HV_CEPH_FENCE_KEYRING")]
    pub ceph_fence_keyring: Option<PathBuf>,
    /// Where the hosts' Ceph clients are (CIDRs, comma-separated): an
    /// agent's reported Ceph address outside these is not blocklisted on
    /// its word. None: any.
    #[arg(long, value_delimiter = ',')]
    pub ceph_client_networks: Vec<ipnet::IpNet>,
    /// A fenced host's server without the hypervisor.cloud.sap:evacuate
    /// metadata key is evacuated (true), or left (false: opt-in only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub evacuate_by_default: bool,
    /// A fenced host's server whose own disks were on the host's local
    /// storage (not in Ceph RBD) is rebuilt from its image all the same,
    /// those disks lost. Off: such a server is left and named.
    #[arg(long)]
    pub evacuate_rebuild_from_image: bool,
}

impl FencingFlags {
    pub fn policy(&self) -> Result<FencePolicy, ConfigError> {
        Ok(FencePolicy {
            fresh_heartbeat: signed("--fence-fresh-heartbeat", self.fence_fresh_heartbeat)?,
            max_domain_share: self.fence_max_domain_share,
            max_started: self.fence_max_started,
            interval: signed("--fence-interval", self.fence_interval)?,
        })
    }

    /// The Ceph identity that blocklists, when one is given.
    pub fn ceph(&self) -> Option<CephFence> {
        self.ceph_fence_id.clone().map(|id| CephFence {
            helper: crate::fence::ceph::default_helper(),
            conf: self.ceph_fence_conf.clone(),
            id,
            keyring: self.ceph_fence_keyring.clone(),
            timeout: CEPH_FENCE_TIMEOUT,
        })
    }
}
