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
    /// Fencing (docs/fencing.md): past this share (percent) of a zone's
    /// hosts (Node label topology.kubernetes.io/zone) lost at once, none of
    /// them is fenced.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub fence_max_domain_share: u8,
    /// Past this share (percent) of the fleet's hosts lost at once, none is
    /// fenced.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub fence_max_fleet_share: u8,
    /// The Node label that names a host's failure domain (its rack, its
    /// power feed): hosts of one domain lost together are fenced together.
    /// A host without it (or with none given) is a domain of its own.
    #[arg(long, value_parser = crate::drain::admission::label_key)]
    pub fence_domain_label: Option<String>,
    /// Hosts of at most this many failure domains are fenced at once; a
    /// host of another waits for them (at least 1).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    pub fence_max_domains: u16,
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
            max_fleet_share: self.fence_max_fleet_share,
            max_domains: usize::from(self.fence_max_domains),
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
