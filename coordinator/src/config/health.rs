//! How a host's health is judged, and how far the responses to it may go
//! (docs/health.md).

use std::time::Duration;

use super::{ConfigError, duration, signed};
use crate::health::HealthPolicy;

#[derive(clap::Args, Debug)]
pub struct HealthFlags {
    /// How long a Node may be not Ready before that counts against its
    /// host's health (docs/health.md): a kubelet restart misses a few posts.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub node_not_ready_grace: Duration,
    /// After taking the lead, how long no host is judged: the agents
    /// reconnect (backoff up to 30 s) and send again the signals that hold
    /// (every minute).
    #[arg(long, default_value = "90s", value_parser = duration)]
    pub health_settle: Duration,
    /// How long an Active host may be Unreachable (its agent gone, or its
    /// kubelet or nova-compute silent) before it is disabled in Nova; no
    /// VM is moved (docs/health.md). Past an agent restart or a kubelet
    /// hiccup, short of letting new VMs land on a host nobody watches.
    #[arg(long, default_value = "5m", value_parser = duration)]
    pub unreachable_grace: Duration,
    /// How many hosts may be in `ha` maintenance set for health (until an
    /// SRE clears it) before a Degraded host is no longer put into it
    /// (docs/health.md): past it, one shared fault is the likelier cause.
    #[arg(long, default_value_t = 5)]
    pub ha_maintenance_limit: usize,
    /// Past this share (percent) of judged hosts Unreachable or Failed at
    /// once, no further host is disabled for being unseen (docs/health.md):
    /// a cut of our own, or a fault shared by the fleet, is the likelier cause.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub unseen_max_share: u8,
}

impl HealthFlags {
    pub fn policy(&self) -> Result<HealthPolicy, ConfigError> {
        Ok(HealthPolicy { node_grace: signed("--node-not-ready-grace", self.node_not_ready_grace)? })
    }

    /// From when hosts are judged, for a leader that starts leading now.
    pub fn judging_from(&self, now: jiff::Timestamp) -> Result<jiff::Timestamp, ConfigError> {
        Ok(now + signed("--health-settle", self.health_settle)?)
    }
}
