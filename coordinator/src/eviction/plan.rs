//! One step of an eviction as a pure function (docs/eviction.md): which
//! VM to move next, which migration is stuck, what each VM's record says.
//!
//! [`step`] maps (options, the VM records so far, what Nova shows now, the
//! free cluster-wide slots, whether the Eviction is being deleted, now) to
//! the new records, the phase and the actions. No I/O, no clock.
//!
//! Rules:
//! - Every VM on the host gets a record, largest memory first, and ends in
//!   a final state: Migrated, Gone, NonMigratable or Skipped. Nothing is
//!   fire-and-forget. A server that lands on the host after the start (booted
//!   while the host was being disabled) gets a record when it is first seen;
//!   a migrated one that comes back is moved again. The eviction succeeds
//!   only when every server Nova shows on the host has a final record.
//! - A server whose host Nova does not say is not judged: missing is not
//!   "elsewhere".
//! - At most `maxParallel` migrations in flight from the host, and no more
//!   than the cluster-wide `slots` left by other evictions.
//! - A VM is never started twice in one attempt: a new attempt number is
//!   recorded before its migration is asked for, and a record in
//!   Migrating is only ever resolved from Nova's answer for that attempt.
//! - A request that never reached Nova (no connection, no token) moves
//!   nothing: the VM is asked for again after a pause, and that attempt
//!   does not count against `maxAttempts`.
//! - Stuck (no progress for `progressTimeoutSeconds` where Nova reports
//!   progress, or running longer than `completionTimeoutPerGiBSeconds` ×
//!   GiB of memory): forced to complete ([`unstick`]), then, if it made
//!   no progress for a progress timeout since, aborted; wait for Nova to
//!   confirm, back off exponentially, retry; after `maxAttempts` the VM is
//!   NonMigratable with the reason. One in post-copy is only waited for.
//! - Policy `liveMigrateIfPossible`: cold when it cannot go live (PCI
//!   passthrough, a server not running when its attempt starts, or its
//!   live attempts ran out), from then on, with `maxAttempts` cold
//!   attempts of its own.
//! - Policy `external`: marked, never moved by us, waited for
//!   ([`external`]).
//! - Cancelled (the Eviction is being deleted): abort what is in flight
//!   (a migration in post-copy is waited for), take our marks off, start
//!   nothing, end Cancelled once nothing moves.
//! - A fenced host's VMs are evacuated ([`Evacuation`]): rebuilt elsewhere
//!   from their disks, each attempt recorded like a migration. A server
//!   opted out (or not opted in) is Skipped and named; one whose disks died
//!   with the host is NonMigratable unless rebuilding from its image is
//!   allowed. Nova cannot abort an evacuation: a stuck one is reported and
//!   waited for (Nova refuses a second evacuate while one runs). Nova
//!   rebuilds an evacuated server stopped: one that was ACTIVE is started,
//!   and counts as moved once it runs.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::eviction::{EvictionOptions, EvictionPhase, MigrationPolicy, VmState, VmStatus};
use crate::api::keys::EVACUATE_METADATA;
use crate::eviction::NovaState;

/// How the servers of a fenced host are evacuated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evacuation {
    /// A server without the metadata key is evacuated
    /// (`--evacuate-default`).
    pub by_default: bool,
    /// A server whose own disks were on the host's local storage is rebuilt
    /// from its image all the same, those disks lost
    /// (`--evacuate-rebuild-from-image`).
    pub rebuild_from_image: bool,
    /// The host kept the servers' own disks in Ceph RBD
    /// (`spec.ceph.instanceDisksOnRbd`): they survive it.
    pub instance_disks_on_rbd: bool,
    /// Its power off was confirmed (by its BMC, or by an SRE): no copy of a
    /// server can run there any more. Without it only the Ceph blocklist
    /// holds the old copies, so a server is rebuilt only from disks in Ceph.
    pub powered_off: bool,
}

/// A server's own word on evacuation (its metadata).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptIn {
    Yes,
    No,
    /// A value that says neither: the server is left, the value named (an
    /// opt-out misspelt must not rebuild a server its owner wanted left).
    Unreadable(String),
}

/// The statuses Nova evacuates a server from.
const EVACUABLE_STATUSES: [&str; 3] = ["ACTIVE", "SHUTOFF", "ERROR"];

/// First backoff after a failed attempt; doubles per attempt, capped.
const FIRST_BACKOFF: SignedDuration = SignedDuration::from_secs(10);
const MAX_BACKOFF: SignedDuration = SignedDuration::from_mins(5);

/// A server as Nova shows it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    pub id: String,
    pub name: String,
    /// The compute host it is on (`OS-EXT-SRV-ATTR:host`); None when Nova
    /// did not say.
    pub host: Option<String>,
    /// Nova's server status (`ACTIVE`, `VERIFY_RESIZE`, ...).
    pub status: String,
    pub memory_bytes: u64,
    /// From the server's metadata; None means the eviction's default.
    pub policy: Option<MigrationPolicy>,
    pub locked: bool,
    /// PCI passthrough devices cannot be live-migrated.
    pub pci_passthrough: bool,
    /// Local (non-volume) disks: a live migration must copy them.
    pub local_disk: bool,
    /// The value of our `evict-from` mark in its metadata (policy
    /// `external`), if it carries one.
    pub evict_mark: Option<String>,
    /// Disks Nova keeps on the host's own image backend (a root disk from
    /// an image, an ephemeral disk): lost with the host unless that backend
    /// is Ceph RBD.
    pub host_disks: bool,
    /// From the server's metadata: evacuate it (or not) if its host is
    /// fenced; None means the cluster default.
    pub evacuate: Option<OptIn>,
    /// What the target host must offer (preflight).
    pub needs: crate::eviction::preflight::Needs,
}

/// Nova's view of one migration attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct AttemptObs {
    pub server_id: String,
    pub attempt: u32,
    pub nova_migration_id: Option<i64>,
    /// Nova's status; None while Nova shows no migration yet.
    pub nova_status: Option<NovaState>,
    /// When Nova was first seen running it, else when it was asked: the
    /// completion clock starts there, not in Nova's queue.
    pub started_at: Timestamp,
    /// Last time a progress counter moved (or the start).
    pub last_progress_at: Timestamp,
    /// Nova reports progress counters for this migration. Without them
    /// (some drivers never fill them) only the completion clock applies.
    pub progress_reported: bool,
    /// We asked Nova to abort it already.
    pub abort_requested: bool,
    /// When we asked Nova to force it to complete.
    pub forced_at: Option<Timestamp>,
    /// The request never reached Nova: nothing moves, and the attempt does
    /// not count.
    pub not_sent: bool,
}

#[derive(Clone, Debug)]
pub struct Input<'a> {
    /// The host being emptied.
    pub source: &'a str,
    pub options: &'a EvictionOptions,
    /// The records so far (empty on the first step).
    pub vms: &'a [VmStatus],
    /// Every server on the source host, and every recorded one Nova still
    /// knows wherever it is. A recorded VM missing here was deleted.
    pub servers: &'a [Server],
    pub attempts: &'a [AttemptObs],
    /// Migrations the cluster-wide limit still allows to start.
    pub slots: u32,
    /// The Eviction is being deleted.
    pub cancelled: bool,
    /// The host is fenced: VMs are evacuated. None: migrated.
    pub evacuation: Option<Evacuation>,
    pub now: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask Nova to move the server; the attempt is already recorded.
    Migrate { server_id: String, attempt: u32, live: bool, block_migration: bool },
    /// Confirm a finished cold migration (the server waits in
    /// VERIFY_RESIZE, its old resources still held on the source).
    ConfirmResize { server_id: String, attempt: u32 },
    /// Ask Nova to force this attempt's live migration to complete.
    ForceComplete { server_id: String, attempt: u32, nova_migration_id: i64, why: String },
    /// Mark the server for its owner to move it off `host` (policy
    /// `external`; idempotent).
    Mark { server_id: String, host: String },
    /// Take our mark off a server that has left, or whose eviction ended.
    Unmark { server_id: String },
    /// Ask Nova to abort this attempt's migration.
    Abort { server_id: String, attempt: u32, nova_migration_id: Option<i64>, why: String },
    /// Ask Nova to rebuild the server elsewhere; the attempt is already
    /// recorded.
    Evacuate { server_id: String, attempt: u32 },
    /// Start an evacuated server that ran before (idempotent).
    Start { server_id: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub phase: EvictionPhase,
    pub vms: Vec<VmStatus>,
    pub actions: Vec<Action>,
}

pub fn is_final(s: VmState) -> bool {
    matches!(s, VmState::Migrated | VmState::Gone | VmState::NonMigratable | VmState::Skipped)
}

impl Server {
    fn on(&self, host: &str) -> bool {
        self.host.as_deref() == Some(host)
    }

    /// Known to be on another host than `source`.
    fn elsewhere(&self, source: &str) -> Option<&str> {
        self.host.as_deref().filter(|h| *h != source)
    }
}

pub fn step(input: &Input<'_>) -> Step {
    let mut vms = input.vms.to_vec();
    vms.extend(new_records(input, &vms));
    let mut actions = Vec::new();
    for vm in vms.iter_mut() {
        advance(vm, input, &mut actions);
    }
    if !input.cancelled {
        start_next(&mut vms, input, &mut actions);
    }
    let marked = external::marks(&vms, input, &mut actions);
    let moving = vms.iter().any(|v| v.state == VmState::Migrating) || marked;
    let phase = if input.cancelled {
        if moving { EvictionPhase::Migrating } else { EvictionPhase::Cancelled }
    } else if !marked && vms.iter().all(|v| is_final(v.state)) {
        EvictionPhase::Succeeded
    } else {
        EvictionPhase::Migrating
    };
    Step { phase, vms, actions }
}

/// A record for every server on the host that has none yet, largest
/// memory first (ties by id, so the order is stable across restarts): all
/// of them on the first step, late arrivals after.
fn new_records(input: &Input<'_>, have: &[VmStatus]) -> Vec<VmStatus> {
    let mut on_host: Vec<&Server> =
        input.servers.iter().filter(|s| s.on(input.source) && !have.iter().any(|v| v.id == s.id)).collect();
    on_host.sort_by(|a, b| b.memory_bytes.cmp(&a.memory_bytes).then_with(|| a.id.cmp(&b.id)));
    on_host
        .into_iter()
        .map(|s| {
            let policy = s.policy.unwrap_or(input.options.policy_default());
            let (state, reason) = match policy {
                MigrationPolicy::Skip => {
                    (VmState::Skipped, "policy skip: moved by somebody else".to_string())
                }
                MigrationPolicy::External if input.evacuation.is_none() => {
                    (VmState::External, external::waiting(input.source))
                }
                _ => (VmState::Pending, String::new()),
            };
            let since = (state == VmState::External).then_some(Time(input.now));
            VmStatus {
                id: s.id.clone(),
                name: s.name.clone(),
                memory_bytes: s.memory_bytes,
                state,
                reason,
                attempt_started: since,
                ..Default::default()
            }
        })
        .collect()
}

fn server<'a>(input: &'a Input<'_>, id: &str) -> Option<&'a Server> {
    input.servers.iter().find(|s| s.id == id)
}

fn attempt<'a>(input: &'a Input<'_>, vm: &VmStatus) -> Option<&'a AttemptObs> {
    input.attempts.iter().find(|a| a.server_id == vm.id && a.attempt == vm.attempts)
}

/// Resolve what Nova says about one record.
fn advance(vm: &mut VmStatus, input: &Input<'_>, actions: &mut Vec<Action>) {
    // Moved off, then back (by hand): it must go again.
    if vm.state == VmState::Migrated && server(input, &vm.id).is_some_and(|s| s.on(input.source)) {
        vm.state = VmState::Pending;
        vm.target_host = None;
        vm.reason = "came back to the host after it was moved; moving it again".into();
        return;
    }
    if vm.state == VmState::NonMigratable
        && vm.former_status.is_some()
        && let Some(srv) = server(input, &vm.id)
        && let Some(h) = srv.elsewhere(input.source)
    {
        return evacuated_late(vm, srv, h, actions);
    }
    if is_final(vm.state) {
        return;
    }
    let Some(srv) = server(input, &vm.id) else {
        // Deleted by its owner. A migrating one is gone too: nothing to abort.
        vm.state = VmState::Gone;
        vm.reason = "deleted during the eviction".into();
        return;
    };
    match vm.state {
        // Evacuated after all (an attempt given up on that Nova finished):
        // moved, and started if it ran before.
        VmState::Pending | VmState::Backoff if vm.former_status.is_some() => {
            if let Some(h) = srv.elsewhere(input.source) {
                evacuated_late(vm, srv, h, actions);
            }
        }
        VmState::External => external::advance(vm, srv, input),
        VmState::Pending | VmState::Backoff => {
            if let Some(h) = srv.elsewhere(input.source) {
                vm.state = VmState::Migrated;
                vm.target_host = Some(h.to_string());
                vm.reason = "moved off by somebody else".into();
            }
        }
        VmState::Migrating => supervise(vm, srv, input, actions),
        _ => {}
    }
}

fn supervise(vm: &mut VmStatus, srv: &Server, input: &Input<'_>, actions: &mut Vec<Action>) {
    let o = input.options;
    let Some(att) = attempt(input, vm) else {
        if let Some(h) = srv.elsewhere(input.source) {
            return landed(vm, srv, h, input, actions);
        }
        // Asked for, not visible in Nova yet, or the request was lost in a
        // crash before it was sent. After a progress timeout the attempt
        // counts as failed; the next one is a new request (Nova refuses it
        // with 409 while an old one still runs, so nothing moves twice).
        let asked = vm.attempt_started.as_ref().map_or(input.now, |t| t.0);
        if input.now.duration_since(asked) > secs(o.progress_timeout_seconds) {
            let why = format!("attempt {}: Nova never showed the migration", vm.attempts);
            let cold_next = vm.former_status.is_none() && may_go_cold(vm, srv, o);
            fail_attempt(vm, why, o, input.now, cold_next);
        }
        return;
    };
    if att.not_sent {
        vm.not_sent = vm.not_sent.saturating_add(1);
        vm.state = VmState::Backoff;
        vm.reason = format!("attempt {}: Nova could not be reached; asking again", vm.attempts);
        vm.retry_at = Some(Time(input.now + FIRST_BACKOFF));
        return;
    }
    let evacuated = vm.former_status.is_some();
    let live = !evacuated && goes_live(vm, srv, o);
    if input.evacuation.is_some() && !evacuated && caught_by_fence(vm, srv, att, input) {
        return;
    }
    match &att.nova_status {
        Some(NovaState::Completed | NovaState::Rebuilt | NovaState::Confirmed) => {
            // Nova can report completed a moment before the host field
            // moves; a host it does not say is not judged either.
            if let Some(h) = srv.elsewhere(input.source) {
                landed(vm, srv, h, input, actions);
            }
        }
        // A cold migration is over only once confirmed (the confirmation
        // frees the source); confirm it, even when cancelled: the server
        // already runs on the target.
        Some(NovaState::Finished) => {
            if srv.status == "VERIFY_RESIZE" {
                actions.push(Action::ConfirmResize { server_id: vm.id.clone(), attempt: vm.attempts });
            }
        }
        Some(status @ (NovaState::Failed | NovaState::Cancelled | NovaState::Reverted)) => {
            let why = if att.abort_requested {
                vm.reason.clone()
            } else {
                format!("attempt {} ended {status} in Nova", vm.attempts)
            };
            let cold_next = !evacuated && may_go_cold(vm, srv, o);
            fail_attempt(vm, why, o, input.now, cold_next);
        }
        _ if att.abort_requested => {} // waiting for Nova to confirm the abort
        // Past the point of no return: waited for, never aborted.
        Some(NovaState::PostCopy) => {
            vm.reason = format!(
                "attempt {}: in post-copy, the guest running on its target: waiting for it to end",
                vm.attempts
            );
        }
        _ => {
            let why = if input.cancelled {
                Some(format!("attempt {}: the eviction was cancelled", vm.attempts))
            } else {
                stuck(vm, att, o, input.now)
            };
            if let Some(why) = why {
                vm.reason = why.clone();
                if evacuated
                    && input.now.duration_since(att.started_at) > completion_limit(o, vm.memory_bytes) * 2
                {
                    // Nova cannot abort an evacuation, nor take another while
                    // it runs: past twice its clock it is recorded for an SRE.
                    vm.state = VmState::NonMigratable;
                    vm.reason = format!("{why}; Nova cannot abort an evacuation: look at the server in Nova");
                    return;
                }
                if !live {
                    // Nova cannot abort a cold migration or an evacuation:
                    // it is reported and waited for.
                    return;
                }
                actions.extend(unstick::unstick(vm, att, input, why));
            }
        }
    }
}

/// A migration of this VM in flight when its host was fenced: Nova cannot
/// finish it (its source is gone) and aborting it asks the dead host; the
/// guest may even run on the target already. It is never aborted, retried or
/// evacuated: recorded for an SRE. One that finished is moved. Answers
/// whether it was judged here.
fn caught_by_fence(vm: &mut VmStatus, srv: &Server, att: &AttemptObs, input: &Input<'_>) -> bool {
    match &att.nova_status {
        Some(NovaState::Completed | NovaState::Rebuilt | NovaState::Confirmed) => false,
        Some(NovaState::Failed | NovaState::Cancelled | NovaState::Reverted) if !att.abort_requested => false,
        Some(NovaState::Finished) => {
            let Some(h) = srv.elsewhere(input.source) else { return false };
            vm.state = VmState::Migrated;
            vm.target_host = Some(h.to_string());
            vm.reason = format!(
                "attempt {}: cold migration finished on {h}, not confirmed: its source is fenced; \
                 confirm it in Nova once the host is back",
                vm.attempts
            );
            true
        }
        _ => {
            vm.state = VmState::NonMigratable;
            vm.reason = format!(
                "attempt {}: a migration was in flight when the host was fenced; the server may run on \
                 its target already: look at it in Nova (its Migration names the target) and resolve it \
                 by hand",
                vm.attempts
            );
            true
        }
    }
}

/// An evacuated VM found elsewhere outside a running attempt: moved, and
/// asked to start once if it ran before (never evacuated again).
fn evacuated_late(vm: &mut VmStatus, srv: &Server, host: &str, actions: &mut Vec<Action>) {
    vm.state = VmState::Migrated;
    vm.target_host = Some(host.to_string());
    vm.reason = format!("evacuated to {host} by an attempt given up on");
    if vm.former_status.as_deref() == Some("ACTIVE") && srv.status == "SHUTOFF" {
        actions.push(Action::Start { server_id: vm.id.clone() });
        vm.reason.push_str("; started once, as it ran before");
    }
}

/// The server is on `host` now. An evacuated one that ran before is
/// started first (Nova rebuilds it stopped), for as long as its completion
/// clock allows; past that it counts as moved, its status said, as it must
/// not be evacuated twice.
fn landed(vm: &mut VmStatus, srv: &Server, host: &str, input: &Input<'_>, actions: &mut Vec<Action>) {
    let restart = vm.former_status.as_deref() == Some("ACTIVE") && srv.status != "ACTIVE";
    if restart {
        let asked = vm.attempt_started.as_ref().map_or(input.now, |t| t.0);
        let waited = input.now.duration_since(asked);
        let limit = completion_limit(input.options, vm.memory_bytes);
        if waited <= limit {
            if srv.status == "SHUTOFF" {
                actions.push(Action::Start { server_id: vm.id.clone() });
                vm.reason = format!("rebuilt on {host}, stopped as Nova leaves it; starting it");
            } else {
                vm.reason = format!("rebuilt on {host}; waiting for it to settle ({})", srv.status);
            }
            return;
        }
        vm.reason = format!(
            "rebuilt on {host}, but {} after {}s, not ACTIVE as before: start it by hand",
            srv.status,
            waited.as_secs()
        );
    } else {
        vm.reason.clear();
    }
    vm.state = VmState::Migrated;
    vm.target_host = Some(host.to_string());
}

/// Why a running attempt counts as stuck, if it does (the two clocks).
fn stuck(vm: &VmStatus, att: &AttemptObs, o: &EvictionOptions, now: Timestamp) -> Option<String> {
    let stalled = now.duration_since(att.last_progress_at);
    let running = now.duration_since(att.started_at);
    let limit = completion_limit(o, vm.memory_bytes);
    if att.nova_status == Some(NovaState::Queued) && vm.former_status.is_none() {
        // Waiting for Nova's turn (it runs few live migrations per host at
        // once): not on its clock yet, but not for ever either. An
        // evacuation is not queued so: its clock runs from the ask.
        let bound = limit * i32::try_from(o.max_parallel.saturating_add(1)).unwrap_or(i32::MAX);
        return (running > bound).then(|| {
            format!(
                "attempt {}: queued in Nova for {}s, over the {}s allowed",
                vm.attempts,
                running.as_secs(),
                bound.as_secs()
            )
        });
    }
    if att.progress_reported && stalled > secs(o.progress_timeout_seconds) {
        Some(format!("attempt {}: no progress for {}s", vm.attempts, stalled.as_secs()))
    } else if running > limit {
        Some(format!(
            "attempt {}: running {}s, over the {}s allowed for its memory",
            vm.attempts,
            running.as_secs(),
            limit.as_secs()
        ))
    } else {
        None
    }
}

/// Whether a live attempt of this VM that fails may be followed by cold
/// ones (policy `liveMigrateIfPossible`, not cold already).
fn may_go_cold(vm: &VmStatus, srv: &Server, o: &EvictionOptions) -> bool {
    srv.policy.unwrap_or(o.policy_default()) == MigrationPolicy::LiveMigrateIfPossible
        && goes_live(vm, srv, o)
}

/// Whether this VM's current (or next) attempt is a live migration. Not
/// judged from the server's status, which is MIGRATING while a live
/// attempt runs: `liveMigrateIfPossible` went cold once, for good, when
/// `cold_after_failures` was recorded ([`cold_if_not_running`]).
fn goes_live(vm: &VmStatus, srv: &Server, o: &EvictionOptions) -> bool {
    match srv.policy.unwrap_or(o.policy_default()) {
        MigrationPolicy::LiveMigrate => true,
        MigrationPolicy::LiveMigrateIfPossible => !srv.pci_passthrough && vm.cold_after_failures.is_none(),
        _ => false,
    }
}

/// Before an attempt of `liveMigrateIfPossible` starts: a server that is
/// not running (Nova moves only an ACTIVE or PAUSED one live) goes cold,
/// from this attempt on.
fn cold_if_not_running(vm: &mut VmStatus, srv: &Server, policy: MigrationPolicy) {
    let running = matches!(srv.status.as_str(), "ACTIVE" | "PAUSED");
    if policy == MigrationPolicy::LiveMigrateIfPossible && !running && vm.cold_after_failures.is_none() {
        vm.cold_after_failures = Some(vm.attempts.saturating_sub(vm.not_sent));
    }
}

/// Ends the attempt as failed: a retry after a backoff, cold attempts when
/// `cold_next` and its live attempts ran out, or NonMigratable once the
/// attempts ran out.
fn fail_attempt(vm: &mut VmStatus, why: String, o: &EvictionOptions, now: Timestamp, cold_next: bool) {
    let failed = vm.attempts.saturating_sub(vm.not_sent).saturating_sub(vm.cold_after_failures.unwrap_or(0));
    if cold_next && failed >= o.max_attempts {
        vm.cold_after_failures = Some(failed);
        vm.state = VmState::Backoff;
        vm.reason = format!("{why}; it cannot go live: cold-migrating it (policy liveMigrateIfPossible)");
        vm.retry_at = Some(Time(now + FIRST_BACKOFF));
    } else if failed >= o.max_attempts {
        vm.state = VmState::NonMigratable;
        vm.reason = format!("{failed} attempts failed; last: {why}");
    } else {
        vm.state = VmState::Backoff;
        vm.reason = why;
        vm.retry_at = Some(Time(now + backoff(failed)));
    }
}

/// 10 s, 20 s, 40 s, ... capped at 5 min.
pub fn backoff(attempts: u32) -> SignedDuration {
    let factor = 1i32.checked_shl(attempts.saturating_sub(1).min(16)).unwrap_or(i32::MAX);
    (FIRST_BACKOFF * factor).min(MAX_BACKOFF)
}

fn secs(s: u64) -> SignedDuration {
    SignedDuration::from_secs(i64::try_from(s).unwrap_or(i64::MAX))
}

/// `completionTimeoutPerGiB` × memory (rounded up to whole GiB).
pub fn completion_limit(o: &EvictionOptions, memory_bytes: u64) -> SignedDuration {
    let gib = memory_bytes.div_ceil(1 << 30).max(1);
    secs(o.completion_timeout_per_gib_seconds.saturating_mul(gib))
}

/// Start the next VMs, in record order (largest first), within the limits.
fn start_next(vms: &mut [VmStatus], input: &Input<'_>, actions: &mut Vec<Action>) {
    let in_flight =
        u32::try_from(vms.iter().filter(|v| v.state == VmState::Migrating).count()).unwrap_or(u32::MAX);
    let mut free = input.options.max_parallel.saturating_sub(in_flight).min(input.slots);
    for vm in vms.iter_mut() {
        if free == 0 {
            break;
        }
        let ready = match vm.state {
            VmState::Pending => true,
            VmState::Backoff => vm.retry_at.as_ref().is_none_or(|t| t.0 <= input.now),
            _ => false,
        };
        if !ready {
            continue;
        }
        let Some(srv) = server(input, &vm.id) else { continue };
        if let Some(e) = &input.evacuation {
            if let Some((state, why)) = not_evacuated(srv, e, vm.former_status.is_none()) {
                vm.state = state;
                vm.reason = why;
                continue;
            }
            vm.former_status.get_or_insert_with(|| srv.status.clone());
            vm.attempts += 1;
            vm.state = VmState::Migrating;
            vm.retry_at = None;
            vm.attempt_started = Some(Time(input.now));
            actions.push(Action::Evacuate { server_id: vm.id.clone(), attempt: vm.attempts });
            free -= 1;
            continue;
        }
        let policy = srv.policy.unwrap_or(input.options.policy_default());
        if policy == MigrationPolicy::External {
            // Its owner's to move, whatever brought it back here.
            vm.state = VmState::External;
            vm.reason = external::waiting(input.source);
            continue;
        }
        if let Some(why) = incompatible(srv, policy, &input.options.force) {
            vm.state = VmState::NonMigratable;
            vm.reason = why;
            continue;
        }
        cold_if_not_running(vm, srv, policy);
        vm.attempts += 1;
        vm.state = VmState::Migrating;
        vm.retry_at = None;
        vm.attempt_started = Some(Time(input.now));
        actions.push(Action::Migrate {
            server_id: vm.id.clone(),
            attempt: vm.attempts,
            live: goes_live(vm, srv, input.options),
            block_migration: srv.local_disk,
        });
        free -= 1;
    }
}

/// Why this server of a fenced host is not evacuated, and the final state
/// that says so. Its status is judged before the first attempt only: a
/// failed evacuation leaves it in a passing state, and Nova says no to a
/// retry it will not take.
fn not_evacuated(srv: &Server, e: &Evacuation, first: bool) -> Option<(VmState, String)> {
    match &srv.evacuate {
        Some(OptIn::No) => {
            let why = format!("opted out of evacuation ({EVACUATE_METADATA}=false): left on the fenced host");
            return Some((VmState::Skipped, why));
        }
        Some(OptIn::Unreadable(v)) => {
            let why = format!(
                "{EVACUATE_METADATA}={v:?} says neither true nor false: left on the fenced host, as an \
                 opt-out is read"
            );
            return Some((VmState::Skipped, why));
        }
        None if !e.by_default => {
            let why = format!(
                "not opted in to evacuation (no {EVACUATE_METADATA}=true, and the default is not to): \
                 left on the fenced host"
            );
            return Some((VmState::Skipped, why));
        }
        _ => {}
    }
    if srv.host_disks && !e.instance_disks_on_rbd {
        let why = if !e.rebuild_from_image {
            "its disks were on the fenced host's own storage: a rebuild from its image would lose them \
             (--evacuate-rebuild-from-image allows it)"
        } else if !e.powered_off {
            "its disks were on the fenced host's own storage, and the host's power off is not confirmed: \
             a rebuild from its image could run beside a copy the host still runs"
        } else {
            ""
        };
        if !why.is_empty() {
            return Some((VmState::NonMigratable, why.into()));
        }
    }
    if first && !EVACUABLE_STATUSES.contains(&srv.status.as_str()) {
        let why = format!("Nova evacuates only ACTIVE, SHUTOFF or ERROR servers; this one is {}", srv.status);
        return Some((VmState::NonMigratable, why));
    }
    None
}

/// Why this server cannot be moved as its policy says, unless forced.
fn incompatible(srv: &Server, policy: MigrationPolicy, force: &[String]) -> Option<String> {
    if force.iter().any(|f| f == "compatibility") {
        return None;
    }
    if srv.locked {
        return Some("the server is locked".into());
    }
    if srv.pci_passthrough && policy == MigrationPolicy::LiveMigrate {
        return Some("PCI passthrough devices cannot be live-migrated; set its policy to cold".into());
    }
    None
}

mod external;
#[cfg(test)]
mod tests;
mod unstick;
