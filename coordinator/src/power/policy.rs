//! The hibernation policy's settings (`--hibernation-policy`, one per
//! aggregate or zone) and the groups it covers, built from what Nova,
//! Placement and our Hypervisors say: the typed inputs of
//! [`super::hibernation::decide`]. Pure.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::hibernation::{Headroom, Host, Policy, Power, Room};
use crate::api::power::{DesiredPower, HostPower};

/// Which hosts a policy covers: the members of a Nova host aggregate, or
/// the compute services of an availability zone.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Aggregate(String),
    Zone(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Aggregate(a) => write!(f, "aggregate {a}"),
            Scope::Zone(z) => write!(f, "zone {z}"),
        }
    }
}

/// One `--hibernation-policy`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPolicy {
    pub scope: Scope,
    pub policy: Policy,
}

impl std::str::FromStr for GroupPolicy {
    type Err = String;

    /// `aggregate=NAME` or `zone=NAME`, then `hibernate-after=DURATION`,
    /// `headroom=Nhosts|P%` and `keep-awake=N`, comma-separated; only the
    /// scope is required (defaults: 6h, 1hosts, 2).
    fn from_str(s: &str) -> Result<GroupPolicy, String> {
        let mut scope = None;
        let mut policy = Policy {
            hibernate_after: Duration::from_secs(6 * 3600),
            headroom: Headroom::Hosts(1),
            keep_awake: 2,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| format!("{part:?}: expected KEY=VALUE"))?;
            let value = value.trim();
            match key.trim() {
                "aggregate" | "zone" if scope.is_some() => {
                    return Err(format!("{s:?}: one aggregate or zone per policy"));
                }
                "aggregate" | "zone" if value.is_empty() => {
                    return Err(format!("{part:?}: the name is empty"));
                }
                "aggregate" => scope = Some(Scope::Aggregate(value.to_string())),
                "zone" => scope = Some(Scope::Zone(value.to_string())),
                "hibernate-after" => policy.hibernate_after = duration(value)?,
                "headroom" => policy.headroom = headroom(value)?,
                "keep-awake" => {
                    policy.keep_awake =
                        value.parse().map_err(|_| format!("keep-awake={value:?}: not a count"))?
                }
                other => {
                    return Err(format!(
                        "{other:?}: not a setting (aggregate, zone, hibernate-after, headroom, keep-awake)"
                    ));
                }
            }
        }
        let scope = scope.ok_or_else(|| format!("{s:?}: names no aggregate= or zone="))?;
        Ok(GroupPolicy { scope, policy })
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration =
        s.parse().map_err(|e| format!("hibernate-after={s:?} is not a duration like 30m, 6h: {e}"))?;
    Duration::try_from(d).map_err(|e| format!("hibernate-after={s:?}: {e}"))
}

fn headroom(s: &str) -> Result<Headroom, String> {
    let bad = || format!("headroom={s:?}: expected a count of hosts (2hosts) or a share (20%)");
    if let Some(p) = s.strip_suffix('%') {
        let p: u8 = p.trim().parse().map_err(|_| bad())?;
        return if p <= 100 { Ok(Headroom::Percent(p)) } else { Err(bad()) };
    }
    let n = s.strip_suffix("hosts").or_else(|| s.strip_suffix("host")).ok_or_else(bad)?;
    n.trim().parse().map(Headroom::Hosts).map_err(|_| bad())
}

/// A compute host as Nova and Placement show it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRoom {
    /// Its Nova host name.
    pub host: String,
    pub zone: String,
    /// The names of the aggregates it is a member of.
    pub aggregates: Vec<String>,
    /// Its compute service enabled and up.
    pub in_service: bool,
    /// VCPU and MEMORY_MB, `(total - reserved) × allocation_ratio`.
    pub capacity: Room,
    /// The same, less what is allocated.
    pub free: Room,
}

impl Scope {
    pub fn holds(&self, h: &HostRoom) -> bool {
        match self {
            Scope::Aggregate(a) => h.aggregates.iter().any(|x| x == a),
            Scope::Zone(z) => &h.zone == z,
        }
    }
}

/// One of our hosts, as its Hypervisor and the policy's memory say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OurHost {
    /// Its Hypervisor's (and Node's) name.
    pub name: String,
    /// Active: in service by our lifecycle, enabled by us.
    pub active: bool,
    pub wish: DesiredPower,
    /// Where its power stands (None: never changed).
    pub power: Option<HostPower>,
    /// Its wish was the policy's, not an SRE's.
    pub by_policy: bool,
    /// It has a BMC to power it on again.
    pub bmc: bool,
    /// Paused by an SRE (`hypervisor.cloud.sap/paused`): left alone.
    pub paused: bool,
    /// The lifecycle refused its last hibernation, or cannot tell it is
    /// empty (`PowerState` reason `HostNotEmpty`, `NoBmc` or
    /// `EmptinessUnknown`).
    pub refused: bool,
    /// Servers Nova lists, domains its agent reports (None: unknown).
    pub servers: Option<u32>,
    pub domains: Option<u32>,
    /// How long it has been seen empty and awake, by this leader.
    pub empty_for: Option<Duration>,
}

impl OurHost {
    /// Where its power is, counting a wish not yet carried out as under way,
    /// so that one change at a time holds from the moment it is asked.
    pub fn power(&self) -> Power {
        use HostPower as P;
        match (self.wish, self.power.unwrap_or(P::Running)) {
            (
                DesiredPower::Hibernating,
                P::Running | P::Unsupported | P::Stopping | P::WaitingForPowerOff,
            ) => Power::Hibernating,
            (DesiredPower::Running, P::Hibernating) => Power::Waking,
            (_, P::Running | P::Unsupported | P::FailedToStop) => Power::Awake,
            (_, P::Stopping | P::WaitingForPowerOff) => Power::Hibernating,
            (_, P::Hibernating | P::FailedToStart) => Power::Hibernated,
            (_, P::StartingMachine | P::WaitingForAgent | P::WaitingForChecks) => Power::Waking,
        }
    }
}

/// The policy's own wish that the lifecycle will not carry out (the host
/// refused it, left Active, or was paused before it began), or the
/// policy's mark left on a wish that is no longer to hibernate (an SRE's
/// edit): withdrawn, so that a wish never outlives its reason and holds
/// the group's next change for ever.
pub fn withdraw(o: &OurHost) -> bool {
    if !o.by_policy {
        return false;
    }
    if o.wish.is_running() {
        return true;
    }
    let not_begun = o.power.is_none_or(|p| matches!(p, HostPower::Running | HostPower::Unsupported));
    not_begun && (!o.active || o.paused || o.refused)
}

/// The hosts of one group for [`super::hibernation::decide`]: every member
/// Nova shows, ours as their Hypervisors say, others as awake hosts the
/// policy never powers (their room counts while they are in service).
pub fn group_hosts(scope: &Scope, rooms: &[HostRoom], ours: &BTreeMap<String, OurHost>) -> Vec<Host> {
    rooms.iter().filter(|r| scope.holds(r)).map(|r| host(r, ours.get(&r.host))).collect()
}

fn host(r: &HostRoom, ours: Option<&OurHost>) -> Host {
    let Some(o) = ours else {
        return Host {
            name: r.host.clone(),
            power: Power::Awake,
            takes_vms: r.in_service,
            may_hibernate: false,
            may_wake: false,
            servers: 1,
            domains: 1,
            empty_for: None,
            capacity: r.capacity,
            free: r.free,
        };
    };
    let power = o.power();
    let takes_vms =
        power == Power::Awake && o.active && r.in_service && o.power.is_none_or(|p| p.in_service());
    Host {
        name: r.host.clone(),
        power,
        takes_vms,
        may_hibernate: takes_vms && o.bmc && o.wish.is_running() && !o.paused && !o.refused,
        // An SRE's hibernation, or one that failed to start, is theirs.
        may_wake: power == Power::Hibernated
            && o.by_policy
            && o.bmc
            && !o.paused
            && o.power == Some(HostPower::Hibernating),
        servers: o.servers.unwrap_or(u32::MAX),
        domains: o.domains.unwrap_or(u32::MAX),
        empty_for: o.empty_for.filter(|_| power == Power::Awake),
        capacity: r.capacity,
        free: r.free,
    }
}

/// The hosts the policy may wake, is powering off, or that are waking,
/// in a group holding `source` (a Nova host), by group, and those of
/// `asked` (what the eviction asked for last) awake and not yet enabled:
/// what an eviction short of room waits for.
pub fn asleep_near(
    policies: &[GroupPolicy],
    rooms: &[HostRoom],
    ours: &BTreeMap<String, OurHost>,
    (source, asked): (&str, &[String]),
) -> Vec<(Scope, Vec<String>)> {
    let Some(src) = rooms.iter().find(|r| r.host == source) else { return Vec::new() };
    policies
        .iter()
        .filter(|p| p.scope.holds(src))
        .map(|p| {
            let hosts = group_hosts(&p.scope, rooms, ours);
            // Powering off by the policy: wakeable once off.
            let going =
                |h: &Host| h.power == Power::Hibernating && ours.get(&h.name).is_some_and(|o| o.by_policy);
            // Woken for this eviction, Active, not yet enabled (its
            // dependencies not Ready yet, say): still on its way.
            let enabling = |h: &Host| {
                asked.contains(&h.name)
                    && h.power == Power::Awake
                    && !h.takes_vms
                    && ours.get(&h.name).is_some_and(|o| o.active)
            };
            let coming = hosts
                .into_iter()
                .filter(|h| h.may_wake || h.power == Power::Waking || going(h) || enabling(h));
            let asleep = coming.map(|h| h.name).collect();
            (p.scope.clone(), asleep)
        })
        .filter(|(_, asleep): &(Scope, Vec<String>)| !asleep.is_empty())
        .collect()
}

#[cfg(test)]
#[path = "policy/tests.rs"]
mod tests;
