//! How long the lifecycle waits on a host, and how often it looks again.

use std::time::Duration;

use super::duration;
use crate::k8s::Intervals;

#[derive(clap::Args, Debug)]
pub struct LifecycleFlags {
    /// How long Onboarding waits for nova-compute to register.
    #[arg(long, default_value = "15m", value_parser = duration)]
    pub registration_timeout: Duration,
    /// How long Testing waits for the agent's check report.
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub checks_timeout: Duration,
    /// How often an Active or Maintenance node is compared with Nova (drift check).
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub drift_interval: Duration,
    /// Oldest fleet view of Nova and Placement a settled host's drift check
    /// may rest on (one set of lists for the whole fleet, read again ahead
    /// of that age; docs/nova.md). Default: half the drift interval.
    #[arg(long, value_parser = duration)]
    pub nova_view_max_age: Option<Duration>,
    /// How often a node in a busy phase is looked at again.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub busy_interval: Duration,
    /// NAMESPACE/SELECTOR: pods that must run Ready on a host before it is
    /// enabled in Nova, as its network agent (`openstack/app=ovn-controller`).
    /// One that stops being Ready on an Active host Degrades it (it is not
    /// emptied for that). Repeatable; the coordinator reads pods in these
    /// namespaces only.
    #[arg(long = "node-dependency")]
    pub node_dependencies: Vec<crate::lifecycle::dependencies::Dependency>,
    /// `aggregate=NAME` or `zone=NAME`, then optionally
    /// `hibernate-after=6h`, `headroom=1hosts` (or a share, `20%`) and
    /// `keep-awake=2`: empty hosts of the group with a BMC are hibernated
    /// while the free room left awake covers the headroom, and woken when
    /// it does not or an eviction finds no room (docs/power.md).
    /// Repeatable; none: no host is hibernated but by an SRE.
    #[arg(long = "hibernation-policy")]
    pub hibernation_policies: Vec<crate::power::policy::GroupPolicy>,
    /// How often the hibernation policy looks at its groups (at least 1s).
    #[arg(long, default_value = "30s", value_parser = at_least_a_second)]
    pub hibernation_interval: Duration,
}

fn at_least_a_second(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?}: at least 1s"));
    }
    Ok(d)
}

impl LifecycleFlags {
    pub fn intervals(&self) -> Intervals {
        Intervals { busy: self.busy_interval, drift: self.drift_interval, ..Intervals::default() }
    }

    /// The oldest fleet view a drift check may rest on.
    pub fn view_max_age(&self) -> Duration {
        self.nova_view_max_age.unwrap_or(self.drift_interval / 2)
    }
}
