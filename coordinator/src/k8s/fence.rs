//! The fencing shell (docs/fencing.md): observe what
//! [`fence::decide`](crate::fence::decide) needs, take the one step it
//! names, and answer the host's fencing record and `Fenced` condition for
//! the reconcile to write. Only the leader reconciles, and every step is
//! idempotent: a step repeated after a fail-over costs nothing.

use crate::lifecycle::hands::Would;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::hypervisor::{Context, Error};
use crate::api::hypervisor::{FenceStep, FencingStatus, HealthState};
use crate::api::keys::RETRY_ANNOTATION;
use crate::api::keys::{BMC_SECRET_LABEL, CLEAR_FENCED_ANNOTATION, CONFIRM_FENCED_ANNOTATION};
use crate::api::keys::{MACHINE_GONE_ANNOTATION, RETIRE_ANNOTATION};
use crate::api::{Hypervisor, MaintenanceMode};
use crate::eviction::NovaState;
use crate::fence::ceph::CephFence;
use crate::fence::decide::{self, Decision, FencePolicy, Situation};
pub use crate::fence::record::FenceOutcome;
use crate::fence::record::{self, Asked, Cleared, Facts, Taken};
use crate::fence::redfish::{Bmc, Redfish};
use crate::fence::{Guarded, PowerState, PoweredOff, power_off_confirmed, read_again_if_off, same_machine};
use crate::fence::{clear, signs, targets};
use crate::health::PowerSource;
use crate::lifecycle::ServiceState;

use super::fence_fleet::{self, Domains, FleetSeen};

/// Prefix of the maintenance reason of a host put into `ha` for being
/// fenced.
pub const EVACUATE_REASON_PREFIX: &str = "hv-fence: ";
/// How long a fencing this process started counts as under way though the
/// cache does not show it yet.
const CLAIM_TTL: Duration = Duration::from_secs(30);

/// What fencing may use, and the fencings this process started moments ago.
pub struct FenceContext {
    pub policy: FencePolicy,
    /// The storage step's means; None: a host that uses Ceph cannot be
    /// fenced past Nova.
    pub ceph: Option<CephFence>,
    /// How long a BMC may take to report the power off.
    pub power_within: Duration,
    /// Where the BMC credentials' Secrets are (the coordinator's namespace).
    pub namespace: String,
    claims: super::claims::Claims,
    /// When each host's BMC last confirmed its power off (two reads).
    off: Mutex<BTreeMap<String, Instant>>,
    /// Where the hosts' Ceph clients are: an agent's report outside these
    /// is not blocklisted on its word (none: any).
    pub ceph_networks: Vec<ipnet::IpNet>,
    /// The Node label that names a host's failure domain (none: each host
    /// is a domain of its own).
    pub domain_label: Option<String>,
    /// The last read of each looked-at fenced host's compute service and
    /// kubelet Lease, to tell their moves ([`signs::Reports`]).
    pub(super) reports: Mutex<signs::Reports>,
    leases: Mutex<signs::Reports>,
}

impl FenceContext {
    pub fn new(
        policy: FencePolicy,
        ceph: Option<CephFence>,
        power_within: Duration,
        namespace: String,
    ) -> Self {
        FenceContext {
            policy,
            ceph,
            power_within,
            namespace,
            claims: super::claims::Claims::new(CLAIM_TTL),
            off: Mutex::new(BTreeMap::new()),
            ceph_networks: Vec::new(),
            domain_label: None,
            reports: Mutex::new(signs::Reports::default()),
            leases: Mutex::new(signs::Reports::default()),
        }
    }

    /// The same, an agent's Ceph addresses taken only within `networks`.
    pub fn with_ceph_networks(self, networks: Vec<ipnet::IpNet>) -> Self {
        FenceContext { ceph_networks: networks, ..self }
    }

    /// The same, failure domains named by the Node label `label`.
    pub fn with_domain_label(self, label: Option<String>) -> Self {
        FenceContext { domain_label: label, ..self }
    }
}

/// The host's steps: Nova; its storage when it uses Ceph (pools, disks on
/// RBD, or addresses given or reported: with none known, the step then
/// fails and says so, never left out); its power when it has a BMC.
pub fn steps_of(hv: &Hypervisor) -> Vec<FenceStep> {
    let spec = &hv.spec;
    let uses_ceph = !spec.ceph.pools.is_empty()
        || spec.ceph.instance_disks_on_rbd
        || !spec.fencing.ceph_addresses.is_empty()
        || !learned_ceph(hv).is_empty();
    decide::sequence(uses_ceph, spec.fencing.bmc.is_some())
}

/// The Ceph IPs the host's agent reported.
fn learned_ceph(hv: &Hypervisor) -> &[String] {
    hv.status.as_ref().and_then(|s| s.machine.as_ref()).map_or(&[], |m| &m.ceph_addresses[..])
}

/// The blocklist entries other hosts' fencings hold (not lifted yet).
fn held(h: &Hypervisor) -> &[String] {
    match h.status.as_ref().and_then(|s| s.fencing.as_ref()) {
        Some(f) if !f.blocklist_lifted => &f.ceph_addresses,
        _ => &[],
    }
}

/// A host retired, gone for good: its addresses may be a replacement's.
fn retired(h: &Hypervisor) -> bool {
    h.status.as_ref().and_then(|s| s.fencing.as_ref()).is_some_and(FencingStatus::retired)
}

/// What the storage step blocklists for `hv` ([`targets::ceph_addresses`]),
/// every other Hypervisor's addresses read from the cache.
fn ceph_targets(ctx: &Context, hv: &Hypervisor) -> Result<Vec<String>, String> {
    let name = hv.name_any();
    let others: Vec<(String, Vec<String>)> = ctx
        .hypervisors
        .state()
        .iter()
        .filter(|h| h.name_any() != name && !retired(h))
        .map(|h| {
            let mut all = h.spec.fencing.ceph_addresses.clone();
            all.extend_from_slice(learned_ceph(h));
            all.extend_from_slice(held(h));
            (h.name_any(), all)
        })
        .collect();
    let (spec, learned) = (&hv.spec.fencing.ceph_addresses, learned_ceph(hv));
    targets::ceph_addresses(spec, learned, &ctx.fencing.ceph_networks, &others)
}

/// What this reconcile saw of the host that the fencing asks.
pub struct Observed<'a> {
    /// The health verdict (None: not judged).
    pub health: Option<HealthState>,
    /// Why the coordinator's own view cannot be trusted now.
    pub blind: Option<String>,
    /// The host's kubelet is alive: a fencing under way stops.
    pub kubelet_alive: bool,
    /// The host's running Eviction, if any.
    pub evicting: Option<&'a str>,
    /// Nova lists servers on the host.
    pub servers_left: bool,
    /// The host's power as the health verdict read it this reconcile
    /// (Unknown: not read, or unreadable).
    pub power: PowerSource,
    /// When its Node's deletion began: for a fenced host, a retirement
    /// asked (docs/fencing.md, "A host gone for good").
    pub node_deleted: Option<Timestamp>,
}

/// How often a fenced host is looked at for signs of life while its
/// servers are evacuated.
const LIFE_LOOK: Duration = Duration::from_secs(2);

/// Observe, decide ([`decide::decide`]), take the step, and
/// [`record::record`] what it came to.
pub async fn run(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    o: Observed<'_>,
    now: Timestamp,
) -> FenceOutcome {
    let status = hv.status.clone().unwrap_or_default();
    let asked = asked(hv, o.node_deleted);
    let record = record::retried(status.fencing.clone(), &asked);
    let evacuating = record.as_ref().filter(|r| evacuation_open(hv, r, o.evicting, o.servers_left));
    // Moves are told between looks: remembered only while the host is
    // looked at for signs of life.
    if evacuating.is_none() && !record.as_ref().is_some_and(|r| asked.retires(r) && !r.retired()) {
        crate::locked::lock(&ctx.fencing.reports).forget(&hv.name_any());
        crate::locked::lock(&ctx.fencing.leases).forget(&hv.name_any());
    }
    let life = match evacuating {
        Some(r) => life_sign(ctx, hv, host, r, o.power, now).await,
        None => None,
    };
    let reviving = life.is_some() || record.as_ref().is_some_and(|r| r.revival.is_some());
    if let Some(out) = asked_first(ctx, hv, host, &o, &asked, (evacuating.is_some(), reviving)).await {
        return out;
    }
    // Neither under way nor Failed: nothing to fence (decide's first rule),
    // and no fleet scan on every reconcile of every healthy host.
    if record.is_none() && o.health != Some(HealthState::Failed) {
        return FenceOutcome::default();
    }
    let name = hv.name_any();
    let seen = observe(ctx, hv, &name, o.health, record.is_some(), now);
    let fencing_domains = seen.domains.fencing();
    let s = situation(&o, &seen, &fencing_domains, record.as_ref(), &asked, life.as_deref());
    let decision = decide::decide(&s, &ctx.fencing.policy);
    let taken = match decision {
        Decision::Take(step) => Some(take_or_claim(ctx, hv, host, record.as_ref(), (step, o.health)).await),
        _ => None,
    };
    let heartbeat_fresh = seen.heartbeat_age.is_some_and(|a| a < ctx.fencing.policy.fresh_heartbeat);
    // A step's outcome dates from when it was confirmed: a power off again
    // waits on the BMC for seconds, and life is looked for from then.
    let at = if taken.is_some() { Timestamp::now() } else { now };
    let facts = Facts {
        name: &name,
        now: at,
        health: o.health,
        heartbeat_fresh,
        conditions: &status.conditions,
        asked: &asked,
    };
    let mut out = record::record(record.as_ref(), &decision, taken, &facts);
    if matches!(decision, Decision::ShowsLife { .. }) {
        ctx.metrics.fenced_host_showed_life();
    }
    if evacuating.is_some() {
        out.again = Some(out.again.map_or(LIFE_LOOK, |a| a.min(LIFE_LOOK)));
    }
    out
}

/// The step the fencing would take now, for a host whose hands are off
/// (crate::lifecycle::hands): its decision on the same reads, with no step
/// taken, no claim made and nothing recorded.
pub fn would(ctx: &Context, hv: &Hypervisor, o: &Observed<'_>, now: Timestamp) -> Option<(Would, String)> {
    let status = hv.status.clone().unwrap_or_default();
    let asked = asked(hv, o.node_deleted);
    if let Some(r) = status.fencing.as_ref() {
        if asked.retires(r) && !r.retired() {
            return Some((Would::RetireFence, "retire the fenced host (lift its blocklist entries)".into()));
        }
        if asked.clears(r) {
            return Some((Would::ClearFence, "clear the fence (Nova's forced_down, the blocklist)".into()));
        }
    }
    let record = record::retried(status.fencing.clone(), &asked);
    if record.is_none() && o.health != Some(HealthState::Failed) {
        return None;
    }
    let name = hv.name_any();
    let seen = observe(ctx, hv, &name, o.health, record.is_some(), now);
    let fencing_domains = seen.domains.fencing();
    let s = situation(o, &seen, &fencing_domains, record.as_ref(), &asked, None);
    match decide::decide(&s, &ctx.fencing.policy) {
        Decision::Take(step) => Some((Would::Fence, format!("fence the host (its next step: {step})"))),
        _ => None,
    }
}

/// What an SRE asked that comes before the fencing's own decision: a
/// retirement, which outweighs a clearing asked before it and begins once
/// the evacuation is over and the host shows no life (one that does is
/// fenced again first); or a clearing, which waits while the host's
/// Eviction runs (a sign of life meanwhile is the fencing's to answer).
async fn asked_first(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    o: &Observed<'_>,
    asked: &Asked,
    (evacuating, reviving): (bool, bool),
) -> Option<FenceOutcome> {
    let status = hv.status.as_ref()?;
    if let Some(r) = status.fencing.as_ref().filter(|r| asked.retires(r))
        && !evacuating
        && !reviving
    {
        return Some(super::retire::look(ctx, hv, host, r, asked, o.kubelet_alive, &status.conditions).await);
    }
    if let Some(r) = status.fencing.as_ref().filter(|r| asked.clears(r))
        && !(reviving && o.evicting.is_some())
    {
        return Some(clearing(ctx, hv, host, r, o.evicting, &status.conditions).await);
    }
    None
}

/// What the decision reads: the verdict, the fleet and the host as seen,
/// the record (after an SRE's retry) and what was asked, and a sign of life.
fn situation<'a>(
    o: &'a Observed<'_>,
    seen: &'a Seen,
    fencing_domains: &'a [(&'a str, bool)],
    record: Option<&'a FencingStatus>,
    asked: &Asked,
    life: Option<&'a str>,
) -> Situation<'a> {
    let failed = record.and_then(|r| r.failed.as_ref()).filter(|f| f.attempts >= record::ATTEMPTS);
    let revival = record.and_then(|r| r.revival.as_ref());
    Situation {
        health: o.health.unwrap_or(HealthState::Healthy),
        heartbeat_age: seen.heartbeat_age,
        kubelet_alive: o.kubelet_alive,
        blind: o.blind.as_deref(),
        other_agents: seen.other_agents,
        domain: (&seen.domain, seen.lost, seen.hosts),
        fleet: seen.domains.fleet,
        failure_domain: &seen.domains.own,
        fencing_domains,
        steps: &seen.steps,
        under_way: record.is_some(),
        confirmed: record.map_or(&[][..], |r| &r.confirmed[..]),
        failed: failed.map(|f| (f.step, f.message.as_str())),
        fenced: record.and_then(|r| r.fenced.as_ref().map(|_| r.by_hand)),
        confirmed_by_hand: record.is_some_and(|r| asked.confirms(r)),
        revived: revival.is_some(),
        life,
        refenced_by_hand: revival
            .is_some_and(|v| asked.confirm.is_some() && asked.confirm != v.handled_confirm),
        refenced_before: record.is_some_and(|r| r.refenced.is_some()),
    }
}

/// Whether the fenced host's servers are being evacuated: its Eviction
/// runs, or the lifecycle is yet to make the one for this fencing.
fn evacuation_open(hv: &Hypervisor, r: &FencingStatus, evicting: Option<&str>, servers_left: bool) -> bool {
    let evacuated_for = hv.status.as_ref().and_then(|s| s.lifecycle.evacuated_for.as_ref());
    r.fenced.is_some() && (evicting.is_some() || servers_left && evacuated_for != r.started.as_ref())
}

/// A sign that the fenced host lives, since it counted fenced or was last
/// fenced again ([`signs`]): its agent's heartbeat since then and fresh,
/// its kubelet renewing its Lease, its nova-compute reporting to Nova, or
/// its BMC reading power on (only a BMC whose certificate is checked: an
/// unchecked one could be anyone). The BMC is read here only if the health
/// verdict did not read it this reconcile (`read`).
async fn life_sign(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    r: &FencingStatus,
    read: PowerSource,
    now: Timestamp,
) -> Option<String> {
    let since = r.refenced.as_ref().or(r.fenced.as_ref())?.0;
    let name = hv.name_any();
    let heartbeat = ctx.registry.view(&name).last_seen;
    let fresh = ctx.fencing.policy.fresh_heartbeat;
    if heartbeat.is_some_and(|t| t > since && now.duration_since(t) < fresh) {
        return Some("its agent talks to us".into());
    }
    if kubelet_renews(ctx, &name, since, now).await {
        return Some("its kubelet renews its Node's Lease".into());
    }
    if nova_compute_reports(ctx, &name, host, since).await.0 {
        return Some("its nova-compute reports to Nova".into());
    }
    let power = match read {
        PowerSource::Unknown => power_source(ctx, hv).await,
        known => known,
    };
    (power == PowerSource::On).then(|| "its BMC reads power on".into())
}

/// Whether the host's nova-compute reported to Nova lately, by this
/// process's looks since `since` ([`signs::Reports`]), and whether Nova
/// was read: one that cannot be read (logged) answers from the reads
/// before. A service that is gone reads as a row never written.
pub(super) async fn nova_compute_reports(
    ctx: &Context,
    name: &str,
    host: &str,
    since: Timestamp,
) -> (bool, bool) {
    let window = signs::REPORT_WINDOW;
    let service = match ctx.nova.compute_service(host).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "could not read the fenced host's compute service for signs of life");
            return (
                crate::locked::lock(&ctx.fencing.reports).lately(name, since, Timestamp::now(), window),
                false,
            );
        }
    };
    let row = service.map_or(
        signs::Row { enabled: false, disabled_reason: None, forced_down: false, updated_at: None },
        |s| signs::Row {
            enabled: s.enabled,
            disabled_reason: s.disabled_reason,
            forced_down: s.state == ServiceState::ForcedDown,
            updated_at: s.updated_at,
        },
    );
    let mut reports = crate::locked::lock(&ctx.fencing.reports);
    (reports.moved_lately(name, since, row, Timestamp::now(), window), true)
}

/// Whether the host's kubelet renewed its Lease lately (within half its
/// duration), by this process's reads since `since`; a Lease that cannot
/// be read answers from the reads before.
async fn kubelet_renews(ctx: &Context, name: &str, since: Timestamp, now: Timestamp) -> bool {
    let half = |d: jiff::SignedDuration| d / 2;
    match super::kubelet::written(&ctx.client, name).await {
        Some(lease) => crate::locked::lock(&ctx.fencing.leases).moved_lately(
            name,
            since,
            signs::Row::renewed(lease.renewed),
            now,
            half(lease.duration),
        ),
        None => crate::locked::lock(&ctx.fencing.leases).lately(
            name,
            since,
            now,
            half(super::kubelet::MAX_DURATION),
        ),
    }
}

/// What an SRE asked on the Hypervisor's annotations; deleting the Node
/// (`node_deleted`: its deletion's time) asks a retirement too.
pub(super) fn asked(hv: &Hypervisor, node_deleted: Option<Timestamp>) -> Asked {
    let get = |key: &str| hv.annotations().get(key).cloned();
    Asked {
        retry: get(RETRY_ANNOTATION),
        confirm: get(CONFIRM_FENCED_ANNOTATION),
        clear: get(CLEAR_FENCED_ANNOTATION),
        retire: get(RETIRE_ANNOTATION),
        machine_gone: get(MACHINE_GONE_ANNOTATION),
        node_deleted: node_deleted.map(|t| format!("its Node deleted at {t}")),
    }
}

/// What the fencing's decision reads of the fleet and the host, from the
/// caches.
struct Seen {
    steps: Vec<FenceStep>,
    heartbeat_age: Option<jiff::SignedDuration>,
    other_agents: (usize, usize),
    domain: String,
    lost: usize,
    hosts: usize,
    domains: Domains,
}

fn observe(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    health: Option<HealthState>,
    under_way: bool,
    now: Timestamp,
) -> Seen {
    let fleet = FleetSeen::read(ctx);
    let (lost, hosts, domain) = fence_fleet::zone_of(ctx, &fleet, name, health);
    let claimed: Vec<String> = ctx.fencing.claims.with(|c| c.names().map(str::to_string).collect());
    Seen {
        steps: steps_of(hv),
        heartbeat_age: ctx.registry.view(name).last_seen.map(|t| now.duration_since(t)),
        other_agents: fence_fleet::other_agents(ctx, &fleet, name),
        domain,
        lost,
        hosts,
        domains: fence_fleet::failure_domains(ctx, &fleet, name, (health, under_way), &claimed),
    }
}

/// The step the decision names: a new fencing's place among the failure
/// domains claimed, or (only by the leader) the step taken, the storage
/// step's new addresses first recorded. `health`: this reconcile's verdict.
async fn take_or_claim(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    record: Option<&FencingStatus>,
    (step, health): (FenceStep, Option<HealthState>),
) -> Taken {
    let Some(r) = record else {
        return if claim(ctx, &hv.name_any(), health) { Taken::Claimed } else { Taken::NotClaimed };
    };
    if !ctx.gate.open() {
        return Taken::NotLeader;
    }
    let ceph = (step == FenceStep::CephBlocklisted).then(|| {
        ceph_targets(ctx, hv).and_then(|a| targets::to_record(&r.ceph_addresses, &a).map(|new| (a, new)))
    });
    if let Some(Ok((addresses, new))) = &ceph
        && !new.is_empty()
    {
        return Taken::AddressesFirst { addresses: addresses.clone(), new: new.clone() };
    }
    tracing::warn!(node = %hv.name_any(), step = %step, "fencing: taking a step");
    let taken = take(ctx, hv, host, step, ceph.map(|c| c.map(|(addresses, _)| addresses))).await;
    // A step that failed once the lease no longer held (refused at the
    // moment of its call, or cut short) is no attempt of this leader's.
    if taken.is_err() && !ctx.gate.open() {
        return Taken::NotLeader;
    }
    Taken::Step(taken)
}

/// One step of taking a fence off, asked by an SRE ([`clear::next`]).
async fn clearing(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    r: &FencingStatus,
    evicting: Option<&str>,
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> FenceOutcome {
    if !ctx.gate.open() {
        let again = Some(Duration::from_millis(500));
        return FenceOutcome { record: Some(r.clone()), again, ..FenceOutcome::default() };
    }
    let step = match clear_situation(ctx, hv, host, r, evicting).await {
        Ok(situation) => undo(ctx, hv, host, r, &situation).await,
        Err(why) => Cleared::Waiting(why),
    };
    record::cleared(r, &hv.name_any(), step, conditions)
}

/// What the clearing reads of Nova: whether the host is forced down, and
/// its evacuations not settled since the fencing started (with the slack
/// Nova's clock may need); why not, when Nova cannot be read.
async fn clear_situation<'a>(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    r: &FencingStatus,
    evicting: Option<&'a str>,
) -> Result<clear::Clearing<'a>, String> {
    let service = ctx.nova.compute_service(host).await.map_err(|e| format!("Nova cannot be read: {e}"))?;
    let since =
        r.started.as_ref().map_or(Timestamp::UNIX_EPOCH, |t| t.0) - jiff::SignedDuration::from_mins(10);
    let list = ctx.nova.migrations_from(host, since).await;
    let list = list.map_err(|e| format!("Nova's migrations cannot be read: {e}"))?;
    let evacuations_unsettled = list
        .iter()
        .filter(|m| m.migration_type.as_deref() == Some("evacuation"))
        .filter(|m| !matches!(m.status, NovaState::Completed | NovaState::Failed | NovaState::Cancelled))
        .count();
    Ok(clear::Clearing {
        eviction_running: evicting,
        agent_back: ctx.registry.view(&hv.name_any()).connected,
        evacuations_unsettled,
        forced_down: service.is_some_and(|s| s.state == ServiceState::ForcedDown),
        // Lifted whatever the step came to (tried, confirmed by hand): a
        // lift of an entry not there is a no-op.
        blocklisted: !lifted_by_clearing(ctx, hv, r).is_empty() && !r.blocklist_lifted,
    })
}

/// Undoes what [`clear::next`] names.
async fn undo(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    r: &FencingStatus,
    situation: &clear::Clearing<'_>,
) -> Cleared {
    match clear::next(situation) {
        clear::Next::Wait(why) => Cleared::Waiting(why),
        clear::Next::LiftForcedDown => match ctx.nova.set_forced_down(host, false).await {
            Ok(()) => Cleared::ForcedDownLifted { host: host.to_string() },
            // Nova's own rule: not before the host's nova-compute has
            // started and destroyed what was left of its evacuated servers.
            Err(e @ crate::nova::NovaError::Invalid(_)) => Cleared::Waiting(format!(
                "Nova refused to lift {host}'s forced_down ({e}); it does so until the host's \
                 nova-compute has started again and cleaned up after the evacuation"
            )),
            Err(e) => Cleared::Waiting(format!("Nova: {e}")),
        },
        clear::Next::LiftBlocklist => {
            let addresses = lifted_by_clearing(ctx, hv, r);
            match lift(ctx, &addresses).await {
                Ok(()) => Cleared::BlocklistLifted { addresses },
                Err(why) => Cleared::Waiting(format!("the blocklist entries could not be lifted: {why}")),
            }
        }
        clear::Next::Done => Cleared::Done,
    }
}

/// Lifts blocklist entries; sent only while the lease holds at this very
/// moment.
pub(super) async fn lift(ctx: &Context, addresses: &[String]) -> Result<(), String> {
    let Some(ceph) = &ctx.fencing.ceph else {
        return Err("this coordinator has no Ceph fencing identity (--ceph-fence-id)".into());
    };
    ctx.gate.may_act()?;
    ceph.lift(addresses).await.map_err(|e| e.to_string())
}

/// The addresses a clearing (or a retirement) lifts
/// ([`targets::to_lift`]): never one another host's fencing holds.
pub(super) fn lifted_by_clearing(ctx: &Context, hv: &Hypervisor, r: &FencingStatus) -> Vec<String> {
    let name = hv.name_any();
    let hypervisors = ctx.hypervisors.state();
    let others_held: Vec<String> =
        hypervisors.iter().filter(|h| h.name_any() != name).flat_map(|h| held(h).to_vec()).collect();
    let old = r.confirmed.contains(&FenceStep::CephBlocklisted)
        || r.failed.as_ref().is_some_and(|f| f.step == FenceStep::CephBlocklisted);
    targets::to_lift(&r.ceph_addresses, &hv.spec.fencing.ceph_addresses, old, &others_held)
}

/// Takes one step and confirms it by reading the state back; answers how
/// it was confirmed, or why not.
/// `ceph`: the storage step's addresses, or why there are none (its
/// only caller decides them for that step).
async fn take(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    step: FenceStep,
    ceph: Option<Result<Vec<String>, String>>,
) -> Result<String, String> {
    match step {
        FenceStep::NovaForcedDown => {
            ctx.nova.set_forced_down(host, true).await.map_err(|e| format!("Nova: {e}"))?;
            let read =
                ctx.nova.compute_service(host).await.map_err(|e| format!("Nova, reading back: {e}"))?;
            match read.map(|s| s.state) {
                Some(ServiceState::ForcedDown) => {
                    Ok(format!("Nova shows {host}'s compute service forced down"))
                }
                other => {
                    Err(format!("Nova shows {host}'s compute service as {other:?} after forced_down was set"))
                }
            }
        }
        FenceStep::CephBlocklisted => {
            let addresses = ceph.unwrap_or_else(|| Err("no Ceph address was decided".into()))?;
            let Some(ceph) = &ctx.fencing.ceph else {
                return Err("this coordinator has no Ceph fencing identity (--ceph-fence-id)".into());
            };
            // Sent only while the lease holds at this very moment.
            ctx.gate.may_act()?;
            let entries = ceph.blocklist(&addresses).await.map_err(|e| e.to_string())?;
            Ok(format!("the OSD map's blocklist holds {}", entries.join(", ")))
        }
        FenceStep::PoweredOff => {
            let Some(spec) = &hv.spec.fencing.bmc else {
                return Err("spec.fencing.bmc is gone".into());
            };
            let bmc = bmc(ctx, spec).await?;
            let redfish = Redfish::new(&bmc).map_err(|e| e.to_string())?;
            // Never the power of another machine than the host.
            let (_, uuid) = redfish.read().await.map_err(|e| e.to_string())?;
            same_machine(system_uuid(hv), uuid.as_deref())?;
            let every = Duration::from_secs(1);
            let guarded = Guarded { inner: &redfish, may_act: || ctx.gate.may_act() };
            match power_off_confirmed(&guarded, ctx.fencing.power_within, every).await {
                Ok(PoweredOff::AlreadyOff) => Ok("the BMC reported power off; nothing was asked".into()),
                Ok(PoweredOff::TurnedOff { after }) => {
                    Ok(format!("the BMC reported power off {:.1} s after it was asked", after.as_secs_f64()))
                }
                Err(e) => Err(e.to_string()),
            }
        }
    }
}

/// The host's power as its BMC reports it, for the health model: read
/// only while its agent's stream is gone, with a short timeout (a reconcile
/// waits on it). Anything unreadable is Unknown: it counts for nothing.
pub async fn power_source(ctx: &Context, hv: &Hypervisor) -> PowerSource {
    // A BMC whose certificate is not checked could be anyone: its word
    // never makes a host Failed (a fencing decision rests on none such).
    let Some(spec) = hv.spec.fencing.bmc.as_ref().filter(|b| !b.insecure) else {
        return PowerSource::Unknown;
    };
    let name = hv.name_any();
    let read = async {
        let mut bmc = bmc(ctx, spec).await?;
        bmc.timeout = Duration::from_secs(3);
        let redfish = Redfish::new(&bmc).map_err(|e| e.to_string())?;
        let (power, uuid) = redfish.read().await.map_err(|e| e.to_string())?;
        // Another machine's power says nothing of this host.
        same_machine(system_uuid(hv), uuid.as_deref())?;
        // Confirmed off moments ago, this read is the second of two.
        if confirmed_off_lately(ctx, &name) {
            return Ok(power);
        }
        read_again_if_off(&redfish, power, Duration::from_secs(1)).await.map_err(|e| e.to_string())
    };
    let read = read.await;
    {
        let mut off = crate::locked::lock(&ctx.fencing.off);
        match &read {
            Ok(PowerState::Off) => off.insert(name.clone(), Instant::now()),
            _ => off.remove(&name),
        };
    }
    match read {
        Ok(PowerState::Off) => PowerSource::Off,
        Ok(PowerState::On | PowerState::PoweringOn | PowerState::PoweringOff) => PowerSource::On,
        Ok(PowerState::Unknown(what)) => {
            tracing::debug!(node = %hv.name_any(), power = %what, "BMC power state not understood");
            PowerSource::Unknown
        }
        Err(e) => {
            tracing::debug!(node = %hv.name_any(), error = %e, "BMC power state not read");
            PowerSource::Unknown
        }
    }
}

/// The host's BMC confirmed its power off within the last 10 s.
fn confirmed_off_lately(ctx: &Context, name: &str) -> bool {
    let off = crate::locked::lock(&ctx.fencing.off);
    off.get(name).is_some_and(|t| t.elapsed() < Duration::from_secs(10))
}

/// The host's system UUID, as its agent reported it.
pub(super) fn system_uuid(hv: &Hypervisor) -> Option<&str> {
    hv.status.as_ref().and_then(|s| s.machine.as_ref()).and_then(|m| m.system_uuid.as_deref())
}

/// The BMC with its credentials from the Secret the spec names.
pub(super) async fn bmc(ctx: &Context, spec: &crate::api::hypervisor::BmcSpec) -> Result<Bmc, String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.fencing.namespace);
    let what = format!("Secret {}/{}", ctx.fencing.namespace, spec.credentials_secret);
    if spec.address.starts_with("redfish+http://") {
        return Err(format!("{} is plain HTTP: the BMC's credentials would travel in clear", spec.address));
    }
    let secret = secrets.get(&spec.credentials_secret).await.map_err(|e| match &e {
        // The chart's Role reads the Secrets it names, no other.
        kube::Error::Api(s) if s.code == 403 => format!(
            "{what}: not readable by the coordinator: name it in the chart's coordinator.fencing.bmcSecrets ({e})"
        ),
        _ => format!("{what}: {e}"),
    })?;
    // Only a Secret meant for it: whoever may edit a Hypervisor must not
    // make the coordinator send any Secret of its namespace to a host they name.
    if secret.labels().get(BMC_SECRET_LABEL).map(String::as_str) != Some("true") {
        return Err(format!("{what} is not labelled {BMC_SECRET_LABEL}=true"));
    }
    let data: BTreeMap<String, Vec<u8>> =
        secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
    let text = |key: &str| -> Result<String, String> {
        let bytes = data.get(key).ok_or_else(|| format!("{what} has no {key}"))?;
        String::from_utf8(bytes.clone()).map_err(|_| format!("{what}: {key} is not UTF-8"))
    };
    Ok(Bmc {
        address: spec.address.clone(),
        username: text("username")?,
        password: text("password")?,
        ca_pem: data.get("ca.crt").cloned(),
        insecure: spec.insecure,
        timeout: Duration::from_secs(10),
    })
}

/// Claims the start of a fencing of `name`: its failure domain ranked again
/// under the claims' lock, with the fencings this process started moments
/// ago (the cache may not show them yet), so two reconciles of hosts in two
/// domains cannot both take the last place. Counted as under way from then.
fn claim(ctx: &Context, name: &str, health: Option<HealthState>) -> bool {
    let fleet = FleetSeen::read(ctx);
    ctx.fencing.claims.with(|live| {
        let claimed: Vec<String> = live.names().map(str::to_string).collect();
        let domains = fence_fleet::failure_domains(ctx, &fleet, name, (health, false), &claimed);
        let max = ctx.fencing.policy.max_domains;
        if decide::domain_waits(&domains.own, &domains.fencing(), max).is_some() {
            return false;
        }
        live.claim(name);
        true
    })
}

/// Publishes a fencing Event on the Hypervisor.
pub async fn tell(ctx: &Context, hv: &Hypervisor, fenced: &FenceOutcome) {
    if let Some((reason, note)) = &fenced.event {
        tracing::warn!(node = %hv.name_any(), reason = %reason, "{note}");
        let reference = kube::Resource::object_ref(hv, &());
        super::hypervisor::publish(ctx, &reference, EventType::Warning, reason, note).await;
    }
}

/// Puts a fenced host into `ha` maintenance once its record says fenced
/// (written first, so its Eviction finds it fenced): its lifecycle then
/// makes the NodeFailure Eviction that evacuates its servers. Maintenance
/// an SRE asked for stands; its running Eviction evacuates once it sees the
/// host fenced. A conflict is an error (decided again on fresh data); any
/// other failure is told and tried again at the next reconcile.
pub async fn evacuate(ctx: &Context, hv: &Hypervisor, evicting: Option<&str>) -> Result<(), Error> {
    let fencing = hv.status.as_ref().and_then(|s| s.fencing.as_ref());
    let ours = hv.spec.maintenance == MaintenanceMode::Ha
        && hv.spec.maintenance_reason.starts_with(EVACUATE_REASON_PREFIX);
    if fencing.is_none() && ours && evicting.is_none() && hv.metadata.deletion_timestamp.is_none() {
        return release(ctx, hv).await;
    }
    let Some(fenced) = fencing.and_then(|f| f.fenced.as_ref()) else { return Ok(()) };
    if hv.spec.maintenance.is_requested() || hv.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let reason = format!("{EVACUATE_REASON_PREFIX}fenced at {}; its servers are evacuated", fenced.0);
    let api: Api<Hypervisor> = Api::all(ctx.client.clone());
    let reference = kube::Resource::object_ref(hv, &());
    let (reason_, note) = match super::write::maintenance(&api, hv, MaintenanceMode::Ha, &reason).await {
        // The object changed since it was read (a conflict, or the patch's
        // version test failing: 422): decided again on fresh data. Last in
        // the reconcile, so nothing else of it is skipped.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => return Err(kube::Error::Api(e).into()),
        Err(e) => ("EvacuationNotRequested", format!("could not set spec.maintenance to ha ({reason}): {e}")),
        Ok(_) => (
            "EvacuationRequested",
            format!(
                "spec.maintenance set to ha ({reason}): its Eviction rebuilds the servers elsewhere; \
                 the host stays fenced until an SRE clears it"
            ),
        ),
    };
    tracing::warn!(node = %hv.name_any(), reason = reason_, "{note}");
    super::hypervisor::publish(ctx, &reference, EventType::Warning, reason_, &note).await;
    Ok(())
}

/// The `ha` maintenance set for a fencing that is gone (cleared by an
/// SRE): cleared, so the host comes back through Onboarding and its checks.
async fn release(ctx: &Context, hv: &Hypervisor) -> Result<(), Error> {
    let api: Api<Hypervisor> = Api::all(ctx.client.clone());
    let reference = kube::Resource::object_ref(hv, &());
    match super::write::maintenance(&api, hv, MaintenanceMode::None, "").await {
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => Err(kube::Error::Api(e).into()),
        Err(e) => {
            let note = format!("the fence is off, but spec.maintenance could not be cleared: {e}");
            tracing::warn!(node = %hv.name_any(), "{note}");
            super::hypervisor::publish(ctx, &reference, EventType::Warning, "MaintenanceNotCleared", &note)
                .await;
            Ok(())
        }
        Ok(_) => {
            let note =
                "the fence is off: spec.maintenance cleared; the host is checked again before it is enabled";
            tracing::info!(node = %hv.name_any(), "{note}");
            super::hypervisor::publish(ctx, &reference, EventType::Normal, "MaintenanceCleared", note).await;
            Ok(())
        }
    }
}
