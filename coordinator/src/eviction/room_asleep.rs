//! Which hibernated hosts would give a preflight short of room what it
//! lacks (docs/power.md, "An eviction short of room"). Pure.
//!
//! The preflight is run again as if some of the hosts the hibernation
//! policy could wake were awake: their room, zone, aggregates and traits
//! stay in Nova and Placement while they are off. A host that would not
//! let every VM go is not worth a wake.

use crate::api::eviction::MigrationPolicy;
use crate::eviction::plan::Server;
use crate::eviction::preflight::{Candidate, preflight};

/// The hibernated candidates (`asleep`) to wake so that every VM of
/// `servers` finds a place: the single one with the least memory that
/// suffices (the fewest, the least power); else those the preflight over
/// all of them places a VM on; None when even all of them would not do.
pub fn hosts_to_wake(
    servers: &[Server],
    default_policy: MigrationPolicy,
    candidates: &[Candidate],
    force: &[String],
) -> Option<Vec<String>> {
    let (asleep, awake): (Vec<&Candidate>, Vec<&Candidate>) = candidates.iter().partition(|c| c.asleep);
    let mut asleep = asleep;
    asleep.sort_by_key(|c| (memory(c), c.host.clone()));
    let with = |extra: &[&Candidate]| -> Vec<Candidate> {
        awake.iter().chain(extra).map(|c| Candidate { asleep: false, ..(*c).clone() }).collect()
    };
    for one in &asleep {
        if preflight(servers, default_policy, &with(&[*one]), force).findings.is_empty() {
            return Some(vec![one.host.clone()]);
        }
    }
    let all = preflight(servers, default_policy, &with(&asleep), force);
    if !all.findings.is_empty() {
        return None;
    }
    let mut hosts: Vec<String> = all
        .plan
        .iter()
        .filter_map(|vm| vm.fits_on.clone())
        .filter(|h| asleep.iter().any(|c| &c.host == h))
        .collect();
    hosts.sort();
    hosts.dedup();
    // None placed on a host asleep (capacity forced): nothing to wake.
    (!hosts.is_empty()).then_some(hosts)
}

fn memory(c: &Candidate) -> u64 {
    c.room.get("MEMORY_MB").map_or(0, |r| r.free)
}

#[cfg(test)]
#[path = "room_asleep/tests.rs"]
mod tests;
