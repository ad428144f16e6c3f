//! Preflight as a pure function (docs/eviction.md): before anything moves, could
//! Nova's scheduler place every VM of the host somewhere else?
//!
//! Four named checks, each skippable with `options.force`:
//! - `compatibility`: locked servers, PCI passthrough under live migration
//!   (local disks are fine: the migration becomes a block migration);
//! - `constraints`: what would make the scheduler refuse every remaining
//!   host: the server's pinned availability zone (compute 2.96), required
//!   and forbidden traits (`trait:X=required|forbidden`), flavor keys
//!   scoped `aggregate_instance_extra_specs:` and the tenant isolation of
//!   aggregates (`filter_tenant_id*`);
//! - `os`: whether an admissible host can run the VM as it runs now: its
//!   hypervisor software, the VM's guest CPU, its image's properties
//!   (`eviction::os_check`);
//! - `capacity`: free resources from Placement inventories and usages
//!   (`(total - reserved) × allocation_ratio - used`, each allocation
//!   within `max_unit`), VMs placed largest first, each on the fitting
//!   host with the most free memory, so two VMs never count the same room,
//!   after the room other running evictions planned for their VMs not yet
//!   moved ([`hold_for_others`]).
//!
//! Server groups count under `constraints` ([`server_groups`]): an
//! anti-affinity member never goes where the group's other members (or
//! those placed before it) already are, an affinity member only where its
//! group runs.
//!
//! Not modelled: image-property traits, granular resource groups
//! (`resourcesN:`).

use std::collections::{BTreeMap, BTreeSet};

use crate::api::eviction::{MigrationPolicy, PlannedVm};
use crate::eviction::os_check::{self, GuestCpu, HostSoftware};
use crate::eviction::plan::Server;
use crate::eviction::server_groups::{self, Group, Placed};

pub const COMPATIBILITY: &str = "compatibility";
pub const CONSTRAINTS: &str = "constraints";
pub const CAPACITY: &str = "capacity";
pub const OS: &str = "os";

/// What a VM asks of the host it goes to (from its embedded flavor).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Resource class → amount (`VCPU`, `MEMORY_MB`, `DISK_GB`, custom).
    pub resources: BTreeMap<String, u64>,
    /// Set when the user asked for the zone (compute 2.96's
    /// `pinned_availability_zone`); None: any zone will do.
    pub pinned_az: Option<String>,
    pub required_traits: BTreeSet<String>,
    pub forbidden_traits: BTreeSet<String>,
    /// `aggregate_instance_extra_specs:KEY=VALUE` of the flavor.
    pub aggregate_specs: BTreeMap<String, String>,
    pub project_id: String,
    /// The software and CPU of the host it runs on (its agent's report):
    /// a target must be no older, and give the same CPU.
    pub runs_on: Option<HostSoftware>,
    /// Its guest CPU, as its domain says (its agent's report).
    pub guest_cpu: Option<GuestCpu>,
    /// Its image's properties (compute 2.98; empty before, or booted
    /// from a volume whose image Nova does not show).
    pub image: BTreeMap<String, String>,
    /// The server group it is in (Nova allows one), once read.
    pub group: Option<Group>,
}

/// Room on one resource class of a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    pub free: u64,
    pub max_unit: u64,
}

/// A host a VM could go to: an enabled, up nova-compute other than the source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidate {
    pub host: String,
    /// Its resource provider's uuid in Placement.
    pub provider: String,
    pub az: String,
    pub room: BTreeMap<String, Room>,
    /// Of the traits some VM requires or forbids ([`named_traits`]), those
    /// its provider carries ([`with_traits`]).
    pub traits: BTreeSet<String>,
    /// Metadata of each aggregate the host is in.
    pub aggregates: Vec<BTreeMap<String, String>>,
    /// Its software and CPU, as its agent reported them (None: not a
    /// host of ours, or not reported).
    pub software: Option<HostSoftware>,
    /// Not in service now: hibernated (or waking) by the hibernation
    /// policy, a candidate only once it is awake.
    pub asleep: bool,
}

/// One reason a VM cannot be moved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub check: &'static str,
    pub vm: String,
    pub reason: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.check, self.vm, self.reason)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub findings: Vec<Finding>,
    /// Each VM of the host, in the order given: where it would fit, or
    /// what stops it.
    pub plan: Vec<PlannedVm>,
    /// One line for the Preflight condition when nothing was found.
    pub summary: String,
}

/// The traits the servers require or forbid: the only ones the checks
/// look at, so the only ones asked of Placement (most hosts' VMs name
/// none, and a read of each candidate's traits was a third of the
/// preflight's requests).
pub fn named_traits(servers: &[Server]) -> BTreeSet<String> {
    servers
        .iter()
        .flat_map(|s| s.needs.required_traits.iter().chain(&s.needs.forbidden_traits))
        .cloned()
        .collect()
}

/// Gives each candidate the traits of `carried` (trait → the providers
/// that carry it) its provider is among.
pub fn with_traits(candidates: &mut [Candidate], carried: &BTreeMap<String, BTreeSet<String>>) {
    for c in candidates {
        c.traits =
            carried.iter().filter(|(_, by)| by.contains(&c.provider)).map(|(t, _)| t.clone()).collect();
    }
}

/// Checks every server Nova shows on the host against the candidates.
pub fn preflight(
    servers: &[Server],
    default_policy: MigrationPolicy,
    candidates: &[Candidate],
    force: &[String],
) -> Report {
    let forced = |name: &str| force.iter().any(|f| f == name);
    let mut movers: Vec<&Server> =
        servers.iter().filter(|s| s.policy.unwrap_or(default_policy).moved_by_us()).collect();
    movers.sort_by(|a, b| b.memory_bytes.cmp(&a.memory_bytes).then_with(|| a.id.cmp(&b.id)));
    let mut room: Vec<BTreeMap<String, Room>> = candidates.iter().map(|c| c.room.clone()).collect();
    let mut findings = Vec::new();
    let mut placed: BTreeMap<&str, &str> = BTreeMap::new();
    let mut in_groups = Placed::new();
    for srv in movers {
        let vm = format!("{} ({})", srv.id, srv.name);
        let fitting = hosts_for(srv, srv.policy.unwrap_or(default_policy), candidates, &forced)
            .and_then(|f| grouped(srv, f, candidates, &in_groups, &forced));
        let fitting = match fitting {
            Ok(fitting) => fitting,
            Err((check, reason)) => {
                findings.push(Finding { check, vm, reason });
                continue;
            }
        };
        if forced(CAPACITY) {
            continue;
        }
        let best = fitting
            .iter()
            .copied()
            .filter(|&i| fits(&srv.needs.resources, &room[i]))
            .max_by_key(|&i| (free(&room[i], "MEMORY_MB"), std::cmp::Reverse(i)));
        match best {
            Some(i) => {
                take(&srv.needs.resources, &mut room[i]);
                placed.insert(srv.id.as_str(), candidates[i].host.as_str());
                if let Some(g) = &srv.needs.group {
                    server_groups::place(&mut in_groups, g, &candidates[i].host);
                }
            }
            None => findings.push(Finding {
                check: CAPACITY,
                vm,
                reason: format!(
                    "needs {}; no {} host has that much free{}",
                    describe(&srv.needs.resources),
                    if forced(CONSTRAINTS) { "enabled" } else { "admissible" },
                    fitting
                        .iter()
                        .max_by_key(|&&i| free(&room[i], "MEMORY_MB"))
                        .map(|&i| format!(
                            " (most memory free: {} MB, on {})",
                            free(&room[i], "MEMORY_MB"),
                            candidates[i].host
                        ))
                        .unwrap_or_default()
                ),
            }),
        }
    }
    let summary = if candidates.is_empty() {
        "no other enabled compute host".to_string()
    } else {
        let total: u64 = room.iter().map(|r| free(r, "MEMORY_MB")).sum();
        let skipped: Vec<&str> =
            [COMPATIBILITY, CONSTRAINTS, OS, CAPACITY].into_iter().filter(|c| forced(c)).collect();
        let mut s = format!(
            "every VM fits on the {} other enabled host(s); {} MB of memory stays free",
            candidates.len(),
            total
        );
        if !skipped.is_empty() {
            s.push_str(&format!("; skipped (force): {}", skipped.join(", ")));
        }
        s
    };
    let plan = servers.iter().map(|s| planned(s, default_policy, &placed, &findings)).collect();
    Report { findings, plan, summary }
}

/// The candidates that may take `srv` by the checks before capacity
/// (compatibility, constraints, os), or the first that refuses it and why.
fn hosts_for(
    srv: &Server,
    policy: MigrationPolicy,
    candidates: &[Candidate],
    forced: &impl Fn(&str) -> bool,
) -> Result<Vec<usize>, (&'static str, String)> {
    if !forced(COMPATIBILITY) {
        if srv.locked {
            return Err((COMPATIBILITY, "the server is locked".into()));
        }
        if srv.pci_passthrough && policy == MigrationPolicy::LiveMigrate {
            let why = "PCI passthrough devices cannot be live-migrated; set its policy to cold";
            return Err((COMPATIBILITY, why.into()));
        }
    }
    let fitting: Vec<usize> = if forced(CONSTRAINTS) {
        (0..candidates.len()).collect()
    } else {
        let (ok, rejected) = admissible(&srv.needs, candidates);
        if ok.is_empty() {
            return Err((CONSTRAINTS, no_host(candidates.len(), &rejected)));
        }
        ok
    };
    // No host at all (the constraints forced) is the capacity's to say.
    if forced(OS) || fitting.is_empty() {
        return Ok(fitting);
    }
    // A running VM moved live keeps its domain; any other is defined anew.
    let live_policy = match policy {
        MigrationPolicy::LiveMigrate => true,
        MigrationPolicy::LiveMigrateIfPossible => !srv.pci_passthrough,
        _ => false,
    };
    let live = live_policy && matches!(srv.status.as_str(), "ACTIVE" | "PAUSED");
    let (ok, rejected) = runnable(&srv.needs, live, candidates, &fitting);
    if ok.is_empty() {
        return Err((OS, none_runs_it(fitting.len(), &rejected)));
    }
    Ok(ok)
}

/// Of the `fitting` candidates, those the server's group lets it go to
/// (not judged when `constraints` is forced).
fn grouped(
    srv: &Server,
    fitting: Vec<usize>,
    candidates: &[Candidate],
    in_groups: &Placed,
    forced: &impl Fn(&str) -> bool,
) -> Result<Vec<usize>, (&'static str, String)> {
    let Some(g) = srv.needs.group.as_ref().filter(|_| !forced(CONSTRAINTS)) else { return Ok(fitting) };
    let source = srv.host.as_deref().unwrap_or_default();
    let hosts: Vec<&str> = fitting.iter().map(|&i| candidates[i].host.as_str()).collect();
    let ok =
        server_groups::allowed(g, &srv.id, source, &hosts, in_groups).map_err(|why| (CONSTRAINTS, why))?;
    Ok(fitting.into_iter().filter(|&i| ok.contains(&candidates[i].host.as_str())).collect())
}

/// Takes from the candidates' room what other running evictions planned
/// for their VMs not yet moved (host → resources): two evictions starting
/// together must not both count the same free room. A VM already moving
/// holds its room in Placement itself.
pub fn hold_for_others(candidates: &mut [Candidate], planned: &[(String, BTreeMap<String, u64>)]) {
    for (host, wants) in planned {
        if let Some(c) = candidates.iter_mut().find(|c| &c.host == host) {
            take(wants, &mut c.room);
        }
    }
}

/// What the other running evictions (not `me`, not dry runs) planned for
/// their VMs not yet under way: (host, resources) per VM, for
/// [`hold_for_others`].
pub fn others_planned(
    evictions: &[std::sync::Arc<crate::api::Eviction>],
    me: &str,
) -> Vec<(String, BTreeMap<String, u64>)> {
    use crate::api::eviction::{EvictionPhase, VmState};
    let mut out = Vec::new();
    for e in evictions {
        let Some(st) = e.status.as_ref() else { continue };
        // Past its preflight: one still judging (or waiting for room)
        // holds nothing, lest two short of room hold each other off.
        let running = matches!(st.phase, Some(EvictionPhase::Disabling | EvictionPhase::Migrating));
        if e.metadata.name.as_deref() == Some(me) || e.spec.dry_run || !running {
            continue;
        }
        for p in &st.preflight {
            let state = st.vms.iter().find(|v| v.id == p.id).map(|v| v.state);
            let waiting = matches!(state, None | Some(VmState::Pending | VmState::Backoff));
            if let (Some(host), true) = (&p.fits_on, waiting) {
                out.push((host.clone(), p.takes.clone()));
            }
        }
    }
    out
}

fn planned(
    s: &Server,
    default_policy: MigrationPolicy,
    placed: &BTreeMap<&str, &str>,
    findings: &[Finding],
) -> PlannedVm {
    let vm = format!("{} ({})", s.id, s.name);
    PlannedVm {
        id: s.id.clone(),
        name: s.name.clone(),
        policy: s.policy.unwrap_or(default_policy),
        fits_on: placed.get(s.id.as_str()).map(|h| h.to_string()),
        takes: s.needs.resources.clone(),
        finding: findings.iter().find(|f| f.vm == vm).map(|f| format!("{}: {}", f.check, f.reason)),
    }
}

/// The candidates whose zone, traits and aggregates admit the VM, and
/// per rule how many hosts it rejected.
fn admissible(needs: &Needs, candidates: &[Candidate]) -> (Vec<usize>, BTreeMap<String, usize>) {
    let mut ok = Vec::new();
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    for (i, c) in candidates.iter().enumerate() {
        match rejection(needs, c) {
            None => ok.push(i),
            Some(why) => *rejected.entry(why).or_default() += 1,
        }
    }
    (ok, rejected)
}

fn rejection(needs: &Needs, c: &Candidate) -> Option<String> {
    if let Some(az) = &needs.pinned_az
        && &c.az != az
    {
        return Some(format!("outside its availability zone {az}"));
    }
    if let Some(t) = needs.required_traits.iter().find(|t| !c.traits.contains(*t)) {
        return Some(format!("without the required trait {t}"));
    }
    if let Some(t) = needs.forbidden_traits.iter().find(|t| c.traits.contains(*t)) {
        return Some(format!("with the forbidden trait {t}"));
    }
    for (k, v) in &needs.aggregate_specs {
        if !c.aggregates.iter().any(|m| m.get(k).is_some_and(|have| have.split(',').any(|h| h.trim() == v))) {
            return Some(format!("in no aggregate with {k}={v}"));
        }
    }
    let tenants: Vec<&str> = c
        .aggregates
        .iter()
        .flat_map(|m| m.iter())
        .filter(|(k, _)| k.starts_with("filter_tenant_id"))
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .collect();
    if !tenants.is_empty() && !tenants.contains(&needs.project_id.as_str()) {
        return Some(format!("isolated to other projects than {}", needs.project_id));
    }
    None
}

/// Of the candidates `among`, those that can run the VM as it runs now
/// ([`os_check`]), and per reason how many cannot.
fn runnable(
    needs: &Needs,
    live: bool,
    candidates: &[Candidate],
    among: &[usize],
) -> (Vec<usize>, BTreeMap<String, usize>) {
    let mut ok = Vec::new();
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    for &i in among {
        let c = &candidates[i];
        let asks = os_check::Asks {
            live,
            runs_on: needs.runs_on.as_ref(),
            cpu: needs.guest_cpu.as_ref(),
            image: &needs.image,
        };
        let why = os_check::rejection(&asks, c.software.as_ref(), &c.aggregates);
        match why {
            None => ok.push(i),
            Some(why) => *rejected.entry(why).or_default() += 1,
        }
    }
    (ok, rejected)
}

fn none_runs_it(admissible: usize, rejected: &BTreeMap<String, usize>) -> String {
    let why: Vec<String> = rejected.iter().map(|(why, n)| format!("{n} {why}")).collect();
    format!("none of the {admissible} admissible hosts can run it as it runs now: {}", why.join("; "))
}

fn no_host(candidates: usize, rejected: &BTreeMap<String, usize>) -> String {
    if candidates == 0 {
        return "no other enabled compute host".into();
    }
    let why: Vec<String> = rejected.iter().map(|(why, n)| format!("{n} {why}")).collect();
    format!("none of the {candidates} other enabled hosts is admissible: {}", why.join("; "))
}

fn free(room: &BTreeMap<String, Room>, class: &str) -> u64 {
    room.get(class).map_or(0, |r| r.free)
}

fn fits(want: &BTreeMap<String, u64>, room: &BTreeMap<String, Room>) -> bool {
    want.iter()
        .filter(|(_, n)| **n > 0)
        .all(|(class, n)| room.get(class).is_some_and(|r| *n <= r.free && *n <= r.max_unit))
}

fn take(want: &BTreeMap<String, u64>, room: &mut BTreeMap<String, Room>) {
    for (class, n) in want {
        if let Some(r) = room.get_mut(class) {
            r.free = r.free.saturating_sub(*n);
        }
    }
}

fn describe(want: &BTreeMap<String, u64>) -> String {
    let parts: Vec<String> = want.iter().filter(|(_, n)| **n > 0).map(|(c, n)| format!("{c} {n}")).collect();
    parts.join(", ")
}

/// What a flavor asks for, the way Nova turns it into a Placement request:
/// VCPU, MEMORY_MB and DISK_GB (root disk only when not volume-backed,
/// plus ephemeral and swap), overridden or extended by `resources:CLASS=N`.
pub fn flavor_resources(
    vcpus: u64,
    ram_mb: u64,
    root_gb: u64,
    ephemeral_gb: u64,
    swap_mb: u64,
    volume_backed: bool,
    extra_specs: &BTreeMap<String, String>,
) -> BTreeMap<String, u64> {
    // Saturating: these come from Nova; a flavor past u64 cannot fit anyway.
    let root = if volume_backed { 0 } else { root_gb };
    let disk = root.saturating_add(ephemeral_gb).saturating_add(swap_mb.div_ceil(1024));
    let mut r = BTreeMap::from([
        ("VCPU".to_string(), vcpus),
        ("MEMORY_MB".to_string(), ram_mb),
        ("DISK_GB".to_string(), disk),
    ]);
    for (k, v) in extra_specs {
        if let Some(class) = k.strip_prefix("resources:")
            && let Ok(n) = v.trim().parse::<u64>()
        {
            r.insert(class.to_string(), n);
        }
    }
    r.retain(|_, n| *n > 0);
    r
}

/// Room on a provider from its Placement inventory and usage.
pub fn room(total: u64, reserved: u64, allocation_ratio: f64, max_unit: u64, used: u64) -> Room {
    let capacity = (total.saturating_sub(reserved) as f64 * allocation_ratio).floor();
    let capacity = if capacity.is_finite() && capacity > 0.0 { capacity as u64 } else { 0 };
    Room { free: capacity.saturating_sub(used), max_unit }
}

#[cfg(test)]
pub(crate) mod tests;
