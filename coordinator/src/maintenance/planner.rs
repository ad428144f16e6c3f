//! A region-wide update planned in waves (docs/maintenance-plan.md). Pure.
//!
//! Each host of the plan is updated once, emptied first; its VMs move once,
//! onto a host already updated or a host outside the plan, never onto one
//! still to be updated (which would move them again). A wave takes as many
//! hosts as the room on those landing hosts, the failure-domain and
//! aggregate limits and the region's headroom allow; the hosts updated in
//! a wave land the next wave's VMs.
//!
//! Hosts are taken emptiest first: an empty host costs nothing to update
//! and gives its whole capacity to the next wave, so the landing room grows
//! fastest. VMs are placed largest first, each on the landing host with the
//! most free memory that fits it, so two VMs never count the same room.

use std::collections::BTreeMap;

/// Resource class → amount (`MEMORY_MB`, `VCPU`, ...).
pub type Resources = BTreeMap<String, u64>;

/// A VM as the plan sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanVm {
    pub id: String,
    pub needs: Resources,
}

/// A compute host of the region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanHost {
    pub name: String,
    /// Its failure domain (a rack, a zone).
    pub domain: String,
    pub aggregates: Vec<String>,
    /// What it can hold in all (Placement's capacity).
    pub capacity: Resources,
    pub vms: Vec<PlanVm>,
    /// To be updated by the plan; otherwise it only takes VMs.
    pub in_plan: bool,
    /// Updated already (a plan resumed): it takes VMs, and is not emptied.
    pub done: bool,
}

/// How far a wave may go.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Hosts of one failure domain out of service at once.
    pub per_domain: u32,
    /// Hosts of one aggregate out of service at once.
    pub per_aggregate: u32,
    /// Hosts in one wave at most.
    pub per_wave: u32,
    /// The region's free memory, as a share of its hosts' memory in
    /// service, never drops under this (0.0 to 1.0).
    pub headroom: f64,
}

/// One VM's move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub vm: String,
    pub from: String,
    pub to: String,
}

/// Hosts emptied and updated together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wave {
    pub hosts: Vec<String>,
    pub moves: Vec<Move>,
}

/// Why no plan covers every host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The waves that could be planned.
    pub waves: Vec<Wave>,
    /// Hosts no wave could take, and why for the first of them.
    pub left: Vec<String>,
    pub why: String,
}

const MEMORY: &str = "MEMORY_MB";

/// The waves that update every host of the plan, or how far it gets.
pub fn plan(hosts: &[PlanHost], limits: &Limits) -> Result<Vec<Wave>, Stuck> {
    let mut free: BTreeMap<&str, Resources> = hosts.iter().map(|h| (h.name.as_str(), free_of(h))).collect();
    let mut landing: Vec<&str> =
        hosts.iter().filter(|h| !h.in_plan || h.done).map(|h| h.name.as_str()).collect();
    let mut left: Vec<&PlanHost> = hosts.iter().filter(|h| h.in_plan && !h.done).collect();
    left.sort_by_key(|h| (used(h, MEMORY), h.name.clone()));
    let mut waves = Vec::new();
    while !left.is_empty() {
        let (wave, room) = next_wave(hosts, &left, &landing, &free, limits);
        if wave.hosts.is_empty() {
            let why = why_not(left[0], &landing, &free, limits, hosts);
            return Err(Stuck { waves, left: left.iter().map(|h| h.name.clone()).collect(), why });
        }
        free = room;
        for h in &wave.hosts {
            // Emptied and updated: the next waves land on it.
            if let Some(host) = hosts.iter().find(|x| &x.name == h) {
                free.insert(host.name.as_str(), host.capacity.clone());
                landing.push(host.name.as_str());
            }
        }
        left.retain(|h| !wave.hosts.contains(&h.name));
        waves.push(wave);
    }
    Ok(waves)
}

/// The next wave: hosts taken emptiest first while their VMs fit on the
/// landing hosts and the limits and headroom hold; and the room left.
fn next_wave<'a>(
    all: &'a [PlanHost],
    left: &[&'a PlanHost],
    landing: &[&'a str],
    free: &BTreeMap<&'a str, Resources>,
    limits: &Limits,
) -> (Wave, BTreeMap<&'a str, Resources>) {
    let mut wave = Wave::default();
    let mut room = free.clone();
    let mut taken: Vec<&PlanHost> = Vec::new();
    for h in left {
        if u32::try_from(taken.len()).unwrap_or(u32::MAX) >= limits.per_wave {
            break;
        }
        if !within_limits(&taken, h, limits) {
            continue;
        }
        let mut trial = room.clone();
        let Some(moves) = pack(h, landing, &mut trial) else { continue };
        let mut out: Vec<&PlanHost> = taken.clone();
        out.push(h);
        if !headroom_holds(all, &out, &trial, limits.headroom) {
            continue;
        }
        room = trial;
        taken.push(h);
        wave.hosts.push(h.name.clone());
        wave.moves.extend(moves);
    }
    (wave, room)
}

/// Whether taking `h` keeps every failure domain and aggregate within its
/// limit of hosts out of service at once.
fn within_limits(taken: &[&PlanHost], h: &PlanHost, limits: &Limits) -> bool {
    let in_domain = taken.iter().filter(|t| t.domain == h.domain).count();
    if u32::try_from(in_domain).unwrap_or(u32::MAX) >= limits.per_domain {
        return false;
    }
    h.aggregates.iter().all(|a| {
        let n = taken.iter().filter(|t| t.aggregates.contains(a)).count();
        u32::try_from(n).unwrap_or(u32::MAX) < limits.per_aggregate
    })
}

/// Places the VMs of `h` largest first on the landing hosts, taking their
/// room from `room`; None when one does not fit.
fn pack(h: &PlanHost, landing: &[&str], room: &mut BTreeMap<&str, Resources>) -> Option<Vec<Move>> {
    let mut vms: Vec<&PlanVm> = h.vms.iter().collect();
    vms.sort_by(|a, b| amount(&b.needs, MEMORY).cmp(&amount(&a.needs, MEMORY)).then_with(|| a.id.cmp(&b.id)));
    let mut moves = Vec::new();
    for vm in vms {
        let to = landing
            .iter()
            .copied()
            .filter(|l| room.get(l).is_some_and(|r| fits(&vm.needs, r)))
            .max_by_key(|l| (room.get(l).map_or(0, |r| amount(r, MEMORY)), std::cmp::Reverse(*l)))?;
        if let Some(r) = room.get_mut(to) {
            take(&vm.needs, r);
        }
        moves.push(Move { vm: vm.id.clone(), from: h.name.clone(), to: to.to_string() });
    }
    Some(moves)
}

/// Whether the region's free memory, over the hosts still in service
/// (all but those `out`), stays at or above `headroom` of their capacity.
fn headroom_holds(
    all: &[PlanHost],
    out: &[&PlanHost],
    room: &BTreeMap<&str, Resources>,
    headroom: f64,
) -> bool {
    let serving = all.iter().filter(|h| !out.iter().any(|o| o.name == h.name));
    let (mut capacity, mut free) = (0u64, 0u64);
    for h in serving {
        capacity = capacity.saturating_add(amount(&h.capacity, MEMORY));
        free = free.saturating_add(room.get(h.name.as_str()).map_or(0, |r| amount(r, MEMORY)));
    }
    capacity == 0 || free as f64 >= headroom * capacity as f64
}

/// Why `h` (the emptiest host left) cannot be taken by itself.
fn why_not(
    h: &PlanHost,
    landing: &[&str],
    free: &BTreeMap<&str, Resources>,
    limits: &Limits,
    all: &[PlanHost],
) -> String {
    let mut trial = free.clone();
    if pack(h, landing, &mut trial).is_none() {
        let room: u64 = landing.iter().filter_map(|l| free.get(l)).map(|r| amount(r, MEMORY)).sum();
        return format!(
            "{}: its VMs ({} MB of memory) do not fit on the {} updated or outside host(s) ({} MB free)",
            h.name,
            used(h, MEMORY),
            landing.len(),
            room
        );
    }
    if !headroom_holds(all, &[h], &trial, limits.headroom) {
        return format!(
            "{}: emptying it would leave the region under its headroom of {:.0}%",
            h.name,
            limits.headroom * 100.0
        );
    }
    format!("{}: its failure domain or aggregates are at their limit", h.name)
}

fn free_of(h: &PlanHost) -> Resources {
    let mut r = h.capacity.clone();
    for vm in &h.vms {
        take(&vm.needs, &mut r);
    }
    r
}

fn used(h: &PlanHost, class: &str) -> u64 {
    h.vms.iter().map(|v| amount(&v.needs, class)).sum()
}

fn amount(r: &Resources, class: &str) -> u64 {
    r.get(class).copied().unwrap_or(0)
}

fn fits(want: &Resources, room: &Resources) -> bool {
    want.iter().filter(|(_, n)| **n > 0).all(|(c, n)| room.get(c).is_some_and(|have| n <= have))
}

fn take(want: &Resources, room: &mut Resources) {
    for (c, n) in want {
        if let Some(have) = room.get_mut(c) {
            *have = have.saturating_sub(*n);
        }
    }
}

#[cfg(test)]
mod tests;
