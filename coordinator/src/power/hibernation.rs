//! When to hibernate an empty host and which hibernated hosts to wake, for
//! one group of hosts a policy covers (an aggregate or a zone). Pure.
//!
//! A region keeps spare hosts for maintenance waves and failures; most sit
//! empty for weeks. The policy powers off the ones that have been empty
//! for `hibernate_after` while the free room left awake stays above a
//! headroom, and wakes the fewest hibernated hosts that restore the
//! headroom when it is short, and the ones an eviction's preflight found
//! it needs awake to place its VMs.
//!
//! Two rules make it safe whatever the inputs say:
//! - a host Nova or its agent says runs anything is never hibernated;
//! - hibernating never takes the awake room under the headroom, nor the
//!   awake hosts under `keep_awake`.
//!
//! One change at a time per group: nothing is hibernated while a host of
//! the group is waking or powering off, so a decision always sees the
//! room the last one left.

use std::time::Duration;

/// vCPUs and RAM (MiB), as Placement counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Room {
    pub vcpu: u64,
    pub ram_mb: u64,
}

impl Room {
    pub fn covers(self, need: Room) -> bool {
        self.vcpu >= need.vcpu && self.ram_mb >= need.ram_mb
    }

    fn plus(self, other: Room) -> Room {
        Room { vcpu: self.vcpu.saturating_add(other.vcpu), ram_mb: self.ram_mb.saturating_add(other.ram_mb) }
    }

    fn minus(self, other: Room) -> Room {
        Room { vcpu: self.vcpu.saturating_sub(other.vcpu), ram_mb: self.ram_mb.saturating_sub(other.ram_mb) }
    }

    fn max(self, other: Room) -> Room {
        Room { vcpu: self.vcpu.max(other.vcpu), ram_mb: self.ram_mb.max(other.ram_mb) }
    }
}

/// A host's power, as the lifecycle last saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Power {
    Awake,
    /// Powering off, or on its way there.
    Hibernating,
    Hibernated,
    /// Powered on, not yet back in service.
    Waking,
}

/// One host of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub power: Power,
    /// Awake and taking VMs: enabled in Nova, under no hold or maintenance
    /// of anyone's. Only such hosts' free room counts as headroom: an
    /// emptied host held for its update is no room.
    pub takes_vms: bool,
    /// The policy may power it off: it takes VMs, was enabled by us, and
    /// has a BMC.
    pub may_hibernate: bool,
    /// The policy may power it on: hibernated by the policy, with a BMC.
    pub may_wake: bool,
    /// Servers Nova lists on it.
    pub servers: u32,
    /// Domains its agent reports.
    pub domains: u32,
    /// How long both have said it is empty (None: not empty, or unknown),
    /// counted again from its last wake: a host woken for room is not
    /// hibernated again before `hibernate_after`.
    pub empty_for: Option<Duration>,
    /// Its whole room in Placement.
    pub capacity: Room,
    /// Its free room in Placement (a hibernated host's is what it offers
    /// once awake: it is empty).
    pub free: Room,
}

impl Host {
    fn empty(&self) -> bool {
        self.servers == 0 && self.domains == 0
    }
}

/// How much free room must stay awake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Headroom {
    /// This many of the group's largest hosts' worth.
    Hosts(u32),
    /// This share of the group's whole room, hibernated hosts included.
    Percent(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub hibernate_after: Duration,
    pub headroom: Headroom,
    /// Never fewer awake hosts than this.
    pub keep_awake: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Hibernate { host: String, reason: String },
    Wake { host: String, reason: String },
}

/// The free room that must stay awake in a group of `hosts`.
pub fn required(policy: &Policy, hosts: &[Host]) -> Room {
    match policy.headroom {
        Headroom::Hosts(n) => {
            let largest = hosts.iter().fold(Room::default(), |m, h| m.max(h.capacity));
            Room {
                vcpu: largest.vcpu.saturating_mul(u64::from(n)),
                ram_mb: largest.ram_mb.saturating_mul(u64::from(n)),
            }
        }
        Headroom::Percent(p) => {
            let total = hosts.iter().fold(Room::default(), |s, h| s.plus(h.capacity));
            let share = |v: u64| (u128::from(v) * u128::from(p.min(100))).div_ceil(100) as u64;
            Room { vcpu: share(total.vcpu), ram_mb: share(total.ram_mb) }
        }
    }
}

/// What the awake hosts taking VMs and those waking offer, and how many
/// they are.
fn awake_room(hosts: &[Host]) -> (Room, u32) {
    hosts
        .iter()
        .filter(|h| (h.power == Power::Awake && h.takes_vms) || h.power == Power::Waking)
        .fold((Room::default(), 0), |(r, n), h| (r.plus(h.free), n + 1))
}

/// The decisions for one group. `wanted`: hibernated hosts an eviction's
/// preflight found it needs awake (the VMs it could not place fit once
/// they are): woken with what the headroom asks, and nothing hibernates
/// while any is asked for.
pub fn decide(policy: &Policy, hosts: &[Host], wanted: &[String]) -> Vec<Decision> {
    let need = required(policy, hosts);
    let (room, awake) = awake_room(hosts);
    let mut out = Vec::new();
    if !room.covers(need) || awake < policy.keep_awake {
        out = wake(policy, hosts, need, room, awake);
    }
    let asked =
        hosts.iter().filter(|h| h.power == Power::Hibernated && h.may_wake && wanted.contains(&h.name));
    for h in asked {
        if !out.iter().any(|d| matches!(d, Decision::Wake { host, .. } if host == &h.name)) {
            let reason =
                "an eviction's preflight found no room, which it finds once this host is awake".to_string();
            out.push(Decision::Wake { host: h.name.clone(), reason });
        }
    }
    let changing = hosts.iter().any(|h| matches!(h.power, Power::Waking | Power::Hibernating));
    if !out.is_empty() || changing || !wanted.is_empty() {
        return out;
    }
    hibernate(policy, hosts, need, room, awake).into_iter().collect()
}

/// The fewest hibernated hosts that bring the room up to `need` and the
/// awake count up to `keep_awake`; all of them when even that is not
/// enough.
fn wake(policy: &Policy, hosts: &[Host], need: Room, room: Room, awake: u32) -> Vec<Decision> {
    let sleeping: Vec<&Host> = hosts.iter().filter(|h| h.power == Power::Hibernated && h.may_wake).collect();
    let enough = |picked: &[&Host]| {
        let r = picked.iter().fold(room, |r, h| r.plus(h.free));
        r.covers(need) && awake as usize + picked.len() >= policy.keep_awake as usize
    };
    let picked = fewest(&sleeping, need, room, &enough).unwrap_or(sleeping.clone());
    let reason = if awake < policy.keep_awake {
        format!("{awake} hosts awake, the policy keeps {}", policy.keep_awake)
    } else {
        format!(
            "the awake free room ({} vCPU, {} MiB) is short of the headroom ({} vCPU, {} MiB)",
            room.vcpu, room.ram_mb, need.vcpu, need.ram_mb
        )
    };
    picked.into_iter().map(|h| Decision::Wake { host: h.name.clone(), reason: reason.clone() }).collect()
}

/// RAM first (what runs out first in most clouds), then vCPU, then the
/// name backwards, so the first by name wins a tie in `max_by`.
fn larger(a: &Host, b: &Host) -> std::cmp::Ordering {
    (a.free.ram_mb, a.free.vcpu).cmp(&(b.free.ram_mb, b.free.vcpu)).then_with(|| b.name.cmp(&a.name))
}

/// The smallest set of `hosts` that is `enough`, the one with the least
/// room among those (the least power spent), None when none is. Exact up
/// to [`EXACT`] hosts; beyond, the host covering most of what is still
/// short is taken, one at a time, which may take one more than the fewest.
fn fewest<'a>(
    hosts: &[&'a Host],
    need: Room,
    room: Room,
    enough: &dyn Fn(&[&'a Host]) -> bool,
) -> Option<Vec<&'a Host>> {
    let mut sorted = hosts.to_vec();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if sorted.len() > EXACT {
        return greedy(sorted, need, room, enough);
    }
    let mut best: Option<(usize, Room, Vec<&Host>)> = None;
    for mask in 0u32..(1 << sorted.len()) {
        let set: Vec<&Host> = (0..sorted.len()).filter(|i| mask & (1 << i) != 0).map(|i| sorted[i]).collect();
        if !enough(&set) {
            continue;
        }
        let size = set.iter().fold(Room::default(), |r, h| r.plus(h.free));
        let better = best.as_ref().is_none_or(|(n, s, _)| (set.len(), size) < (*n, *s));
        if better {
            best = Some((set.len(), size, set));
        }
    }
    best.map(|(_, _, set)| set)
}

/// Up to this many hibernated hosts in a group, the fewest are found by
/// trying every set (65,536 at most).
const EXACT: usize = 16;

fn greedy<'a>(
    mut left: Vec<&'a Host>,
    need: Room,
    room: Room,
    enough: &dyn Fn(&[&'a Host]) -> bool,
) -> Option<Vec<&'a Host>> {
    let mut picked: Vec<&Host> = Vec::new();
    while !enough(&picked) {
        let have = picked.iter().fold(room, |r, h| r.plus(h.free));
        let short = need.minus(have);
        // The share of what is short that a host covers, both resources.
        let covers = |h: &Host| {
            let part =
                |free: u64, short: u64| if short == 0 { 0.0 } else { free.min(short) as f64 / short as f64 };
            part(h.free.vcpu, short.vcpu) + part(h.free.ram_mb, short.ram_mb)
        };
        let best = (0..left.len()).max_by(|&i, &j| {
            covers(left[i]).total_cmp(&covers(left[j])).then_with(|| larger(left[i], left[j]))
        })?;
        picked.push(left.remove(best));
    }
    Some(picked)
}

/// The host empty longest that can go while the room stays covered and
/// enough stay awake.
fn hibernate(policy: &Policy, hosts: &[Host], need: Room, room: Room, awake: u32) -> Option<Decision> {
    if awake <= policy.keep_awake {
        return None;
    }
    let mut idle: Vec<&Host> = hosts
        .iter()
        .filter(|h| h.power == Power::Awake && h.takes_vms && h.may_hibernate && h.empty())
        .filter(|h| h.empty_for.is_some_and(|d| d >= policy.hibernate_after))
        .collect();
    idle.sort_by(|a, b| b.empty_for.cmp(&a.empty_for).then_with(|| a.name.cmp(&b.name)));
    let host = idle.into_iter().find(|h| room.minus(h.free).covers(need))?;
    let left = room.minus(host.free);
    Some(Decision::Hibernate {
        host: host.name.clone(),
        reason: format!(
            "empty for {} s; {} vCPU and {} MiB stay free awake, the headroom is {} vCPU and {} MiB",
            host.empty_for.unwrap_or_default().as_secs(),
            left.vcpu,
            left.ram_mb,
            need.vcpu,
            need.ram_mb
        ),
    })
}

#[cfg(test)]
#[path = "hibernation/tests.rs"]
mod tests;
