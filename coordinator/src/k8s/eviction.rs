//! The Eviction controller: the imperative shell around the pure checks,
//! preflight and step of `crate::eviction` (docs/eviction.md). Each reconcile
//! reads as observe → decide → record → act:
//!
//! - an Eviction that cannot run (unknown host, a reason it may not use,
//!   options out of bounds) is refused with its `Target` condition;
//! - Pending: the preflight against Nova and Placement;
//! - Disabling: wait, with a deadline, until the host takes no new VMs;
//! - Migrating (and cancelling): observe the servers and their migrations
//!   in Nova, get slots from the cluster-wide limit, step, **record** the
//!   step (new attempts included) in the Eviction's status and a Migration
//!   object per attempt, and only then ask Nova.
//!
//! A host being fenced starts nothing new; once it is fenced its servers
//! are evacuated instead of migrated ([`FenceState`], docs/fencing.md), and a
//! preflight's findings no longer stop the eviction: what Nova cannot
//! place fails and is recorded, the rest comes back.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::{FIELD_MANAGER, Gate, write};
use crate::api::condition::{DesiredCondition, merge};
use crate::api::eviction::{EvictionPhase, EvictionStatus, MigrationPolicy, VmState, VmStatus};
use crate::api::hypervisor::{FenceStep, FencingStatus};
use crate::api::keys::{EVICT_FROM_METADATA, EVICTION_FINALIZER, PAUSED_ANNOTATION};
use crate::api::migration::migration_name;
use crate::api::{
    ConditionStatus, ConditionType, Eviction, Hypervisor, Migration, MigrationKind, MigrationPhase,
    MigrationSpec, MigrationStatus,
};
use crate::eviction::NovaState;
use crate::eviction::checks::{self, Refusal, Target};
use crate::eviction::limit::Budgets;
use crate::eviction::phases::{self, Disabling, FenceState, POLL, ServiceSeen};
use crate::eviction::plan::{self, Action, AttemptObs, Evacuation, Input, Server};
use crate::eviction::preflight::{hold_for_others, named_traits, others_planned, preflight, with_traits};
use crate::eviction::{machine, news};
use crate::lifecycle::hands::Hands;
use crate::metrics::{Metrics, tally};
use crate::nova::servers::NovaMigration;
use crate::nova::{Nova, NovaError};

/// Before the caches are synced nothing is decided: missing is not absent.
const CACHE_WAIT: Duration = Duration::from_millis(500);
/// How long Disabling waits for the host's compute service to be disabled
/// before the Eviction fails (nothing moves before that): Nova answers a
/// disable within nova-compute's RPC timeout (a minute), so ten leave room
/// for its retries and a slow cell without keeping an SRE waiting an hour.
const DISABLE_TIMEOUT: Duration = Duration::from_secs(600);
/// How far Nova's clock may be behind ours: a migration Nova created up to
/// this long before we asked can still be the one we asked for. Clocks kept
/// by NTP differ by far less; an earlier attempt's migration is never
/// matched whatever the window (its id is recorded).
const NOVA_CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);
/// The shortest pause between two looks, however long one took: a slow
/// Nova is not asked faster.
const POLL_PAUSE: Duration = Duration::from_millis(500);
/// Look again this soon after a step saw an attempt end while others run:
/// attempts asked together of like VMs end together, and a look that
/// falls between their ends would leave the later ones' slots idle a whole
/// poll, and the slots drift apart from then on.
const AFTER_AN_END: Duration = Duration::from_millis(300);
/// An attempt's progress counters are read from Nova at most this often:
/// they feed only the stall clock, judged over minutes, and read at every
/// look they would be a large share of the eviction's Nova calls.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// Look again this soon after writing an end (Succeeded, Failed): that look
/// releases the finalizer. The controller does not wake on its own status
/// writes (`triggers::eviction_own`), so without it a finished Eviction
/// would keep its finalizer until something else woke it.
const ENDED: Duration = Duration::from_millis(100);
/// How soon a host found not to be the machine Nova means is looked at
/// again: its agent's next report may settle it.
const MACHINE_LOOK: Duration = Duration::from_secs(5);

pub struct EvictionContext {
    pub client: kube::Client,
    pub nova: Arc<dyn Nova>,
    pub migrations: Store<Migration>,
    /// The Hypervisors, for the Nova host an Eviction's target names.
    pub hypervisors: Store<Hypervisor>,
    /// The Evictions: the room other running ones planned is held in a
    /// preflight.
    pub evictions: Store<Eviction>,
    /// Migrations, and evacuations apart, in flight across all evictions at once.
    pub limit: Arc<Budgets>,
    pub gate: Arc<Gate>,
    /// Events on the Eviction (what a held one would do).
    pub recorder: kube::runtime::events::Recorder,
    /// Our own status writes, for reconciles the cache has not caught up
    /// with: a stale record would ask for an attempt twice.
    pub written: super::written::Written<Eviction>,
    pub metrics: Arc<Metrics>,
    /// Policy of VMs whose server and Eviction name none.
    pub default_policy: MigrationPolicy,
    /// A fenced host's server without the evacuate metadata key is
    /// evacuated (`--evacuate-default`).
    pub evacuate_by_default: bool,
    /// A server whose disks died with its host is rebuilt from its image
    /// (`--evacuate-rebuild-from-image`).
    pub evacuate_rebuild_from_image: bool,
    /// When each attempt in flight last had its progress read, by
    /// Migration name.
    pub progress_reads: Paced,
    /// The attempts this leader forced to complete.
    pub forced: Forced,
    /// This install's name (`crate::api::keys::INSTANCE_LABEL`): an Eviction of
    /// another install's Hypervisor is left to it.
    pub instance: String,
    /// The fleet API's watch: each change of an eviction's phase or progress.
    pub events: tokio::sync::broadcast::Sender<hv_proto::v1::HypervisorEvent>,
    /// The hibernation policy: what a preflight short of room waits for.
    pub hibernation: Arc<super::hibernation::Hibernation>,
    /// How often the policy looks (`--hibernation-interval`).
    pub hibernation_interval: Duration,
}

/// When each of some things was last done, kept in memory only: a new
/// leader does each at once.
#[derive(Default)]
pub struct Paced(std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>);

impl Paced {
    /// Whether `key` was not done within `every`.
    pub(crate) fn due(&self, key: &str, every: Duration) -> bool {
        let last = crate::locked::lock(&self.0);
        last.get(key).is_none_or(|at| at.elapsed() >= every)
    }

    /// Records `key` done now.
    pub(crate) fn done(&self, key: &str) {
        crate::locked::lock(&self.0).insert(key.to_string(), std::time::Instant::now());
    }

    /// Forgets `key`: its attempt or eviction ended.
    pub(crate) fn forget(&self, key: &str) {
        crate::locked::lock(&self.0).remove(key);
    }

    /// Forgets every attempt of an eviction that ended, those this
    /// process never saw end included (a fence, a VM given up, a new
    /// leader). An eviction whose name begins with this one's and a dash
    /// loses its entries too, and only reads its counters once more.
    pub(crate) fn forget_eviction(&self, eviction: &str) {
        let prefix = format!("{eviction}-");
        crate::locked::lock(&self.0).retain(|k, _| !k.starts_with(&prefix));
    }
}

/// The attempts this leader recorded as forced to complete, by eviction
/// and Migration name, until their eviction ends: a cache that has not
/// caught up with the record must never lead to a second force (Nova's
/// call is not idempotent).
#[derive(Default)]
pub struct Forced(std::sync::Mutex<std::collections::HashMap<(String, String), Timestamp>>);

impl Forced {
    fn remember(&self, eviction: &str, migration: &str, at: Timestamp) {
        crate::locked::lock(&self.0).insert((eviction.to_string(), migration.to_string()), at);
    }
    fn at(&self, eviction: &str, migration: &str) -> Option<Timestamp> {
        crate::locked::lock(&self.0).get(&(eviction.to_string(), migration.to_string())).copied()
    }
    fn forget(&self, eviction: &str, migration: &str) {
        crate::locked::lock(&self.0).remove(&(eviction.to_string(), migration.to_string()));
    }
    fn forget_eviction(&self, eviction: &str) {
        crate::locked::lock(&self.0).retain(|(e, _), _| e != eviction);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Nova: {0}")]
    Nova(#[from] NovaError),
    #[error(
        "Migration {0} belongs to an earlier Eviction of the same name; waiting for the garbage collector to remove it"
    )]
    Leftover(String),
}

impl super::measured::ErrorKind for Error {
    /// Kubernetes' kinds are prefixed; OpenStack's are [`NovaError::kind`].
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(e) => super::measured::kube_error_kind(e),
            Error::Nova(e) => e.kind(),
            Error::Leftover(_) => "leftover_migration",
        }
    }
}

pub async fn reconcile(ev: Arc<Eviction>, ctx: Arc<EvictionContext>) -> Result<Requeue, Error> {
    let ev = ctx.written.freshest(ev);
    if !ctx.gate.open() {
        return Ok(Requeue::requeue(CACHE_WAIT));
    }
    if !ours(&ctx, &ev).await? {
        return Ok(Requeue::await_change());
    }
    let ev = match hold_or_release(&ctx, ev).await? {
        Ok(ev) => ev,
        Err(next) => return Ok(next),
    };
    let now = Timestamp::now();
    let source = match source(&ctx, &ev).await? {
        Ok(source) => source,
        Err(refusal) => return refuse(&ctx, &ev, refusal, now).await,
    };
    let deleting = ev.metadata.deletion_timestamp.is_some();
    let fence = fence(&ctx, &ev).await?;
    match status_of(&ev).phase.unwrap_or_default() {
        EvictionPhase::Pending | EvictionPhase::Preflight if !deleting => {
            run_preflight(&ctx, &ev, &source, &fence, now).await
        }
        EvictionPhase::Disabling if !deleting => wait_disabled(&ctx, &ev, &source, &fence, now).await,
        _ => migrate(&ctx, &ev, &source, &fence, now, None).await,
    }
}

/// Whether this install runs `ev`: its Hypervisor is ours (in our cache,
/// or, made a moment ago, labelled ours), or there is none (every install
/// refuses such an Eviction alike). Another install's is left untouched.
async fn ours(ctx: &EvictionContext, ev: &Eviction) -> Result<bool, Error> {
    let name = &ev.spec.hypervisor;
    if ctx.hypervisors.get(&ObjectRef::new(name)).is_some() {
        return Ok(true);
    }
    let hv = Api::<Hypervisor>::all(ctx.client.clone()).get_opt(name).await?;
    Ok(hv.is_none_or(|hv| super::nodes::belongs(&hv, &ctx.instance) == super::nodes::Belongs::Ours))
}

/// The host's fencing as the Hypervisor records it, read from the API
/// server at every look (a lagging cache would start a live migration off
/// a host just fenced, or an evacuation off one whose fence was just
/// lifted): it evacuates only while the record says fenced.
async fn fence(ctx: &EvictionContext, ev: &Eviction) -> Result<FenceState, Error> {
    let name = &ev.spec.hypervisor;
    let hv = Api::<Hypervisor>::all(ctx.client.clone()).get_opt(name).await?;
    let fencing = hv.as_ref().and_then(|h| h.status.as_ref()).and_then(|s| s.fencing.as_ref());
    let evacuation = |hv: Option<&Hypervisor>| Evacuation {
        by_default: ctx.evacuate_by_default,
        rebuild_from_image: ctx.evacuate_rebuild_from_image,
        instance_disks_on_rbd: hv.is_some_and(|h| h.spec.ceph.instance_disks_on_rbd),
        // An SRE's confirmation says the host is off and cut from its storage.
        powered_off: fencing.is_some_and(|f| f.by_hand || f.confirmed.contains(&FenceStep::PoweredOff)),
    };
    Ok(fence_state(name, fencing, || evacuation(hv.as_ref())))
}

/// What the host's fencing record `fencing` means to its Eviction: it
/// evacuates only while the record says fenced and the host shows no life.
fn fence_state(
    name: &str,
    fencing: Option<&FencingStatus>,
    evacuation: impl FnOnce() -> Evacuation,
) -> FenceState {
    match fencing {
        Some(f) if f.fenced.is_some() => match &f.revival {
            Some(v) => FenceState::ShowsLife(format!(
                "{name} was fenced and shows life again ({}): no evacuation starts until it is fenced again",
                v.sign
            )),
            None => FenceState::Fenced(evacuation()),
        },
        Some(_) => FenceState::Pending(format!(
            "{name} is being fenced: nothing new starts until it is (its servers are then evacuated)"
        )),
        None => FenceState::None,
    }
}

pub fn error_policy(ev: Arc<Eviction>, error: &Error, _ctx: Arc<EvictionContext>) -> Requeue {
    tracing::warn!(eviction = %ev.name_any(), error = %error, "eviction reconcile failed");
    match error {
        Error::Kube(kube::Error::Api(e)) if e.code == 409 => Requeue::requeue(Duration::from_millis(200)),
        _ => Requeue::requeue(Duration::from_secs(5)),
    }
}

fn status_of(ev: &Eviction) -> EvictionStatus {
    ev.status.clone().unwrap_or_default()
}

fn api(ctx: &EvictionContext) -> Api<Eviction> {
    Api::all(ctx.client.clone())
}

/// The finalizer while the Eviction runs (answers the Eviction as it now
/// is); a finished one lets go of its finalizer and its slots, and stays
/// final unless a failed preflight is to run again after a spec change
/// (normally `force`).
async fn hold_or_release(
    ctx: &EvictionContext,
    ev: Arc<Eviction>,
) -> Result<Result<Arc<Eviction>, Requeue>, Error> {
    let status = status_of(&ev);
    let phase = status.phase.unwrap_or_default();
    let deleting = ev.metadata.deletion_timestamp.is_some();
    // A dry run asks Nova nothing that a deletion would have to undo: it
    // is never held, and one deleted is left to go.
    if ev.spec.dry_run && deleting {
        write::finalizer(&api(ctx), ev.as_ref(), EVICTION_FINALIZER, false).await?;
        return Ok(Err(Requeue::await_change()));
    }
    if !phase.is_final() {
        if !deleting
            && !ev.spec.dry_run
            && let Some(held) = write::finalizer(&api(ctx), ev.as_ref(), EVICTION_FINALIZER, true).await?
        {
            return Ok(Ok(Arc::new(held)));
        }
        return Ok(Ok(ev));
    }
    ctx.limit.release(&ev.name_any());
    write::finalizer(&api(ctx), ev.as_ref(), EVICTION_FINALIZER, false).await?;
    let Some(again) = phases::run_again(&status, ev.metadata.generation, deleting) else {
        return Ok(Err(Requeue::await_change()));
    };
    record(ctx, &ev, again).await?;
    Ok(Err(Requeue::requeue(Duration::from_millis(100))))
}

/// The Nova host to empty: the one recorded once the eviction started (VMs
/// may be moving; nothing that happens to the Hypervisor or the spec then
/// turns it into a refusal), else the one its target names, or why this
/// Eviction cannot run.
async fn source(ctx: &EvictionContext, ev: &Eviction) -> Result<Result<String, Refusal>, Error> {
    let status = status_of(ev);
    let started =
        !matches!(status.phase.unwrap_or_default(), EvictionPhase::Pending | EvictionPhase::Preflight);
    if started && let Some(host) = status.host {
        return Ok(Ok(host));
    }
    match target(ctx, ev).await? {
        Ok(host) => Ok(Ok(host)),
        // Started before the host was recorded: follow the host by name.
        Err(r) if started => {
            tracing::warn!(reason = r.reason, "target changed mid-eviction; following it by name");
            Ok(Ok(ev.spec.hypervisor.clone()))
        }
        Err(r) => Ok(Err(r)),
    }
}

/// The Hypervisor other than `hv` that holds the Nova host `hv` names,
/// while `hv` has recorded none of its own.
fn held_elsewhere(ctx: &EvictionContext, hv: &Hypervisor) -> Option<String> {
    let status = hv.status.clone().unwrap_or_default();
    if status.lifecycle.nova_host.is_some() {
        return None;
    }
    let name = hv.name_any();
    let host = crate::lifecycle::nova_host(&name, &hv.spec, &status);
    super::nova_hosts::recorded_holder(&ctx.hypervisors, &name, host)
}

/// The Nova host the Eviction's target names, or why it cannot run.
async fn target(ctx: &EvictionContext, ev: &Eviction) -> Result<Result<String, Refusal>, Error> {
    let name = &ev.spec.hypervisor;
    let hv = match ctx.hypervisors.get(&ObjectRef::new(name)) {
        Some(hv) => Some((*hv).clone()),
        None => Api::<Hypervisor>::all(ctx.client.clone()).get_opt(name).await?,
    };
    let owned = |hv: &Hypervisor| {
        let uid = hv.meta().uid.as_deref();
        ev.owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.kind == "Hypervisor" && Some(o.uid.as_str()) == uid)
    };
    let held_by = hv.as_ref().and_then(|hv| held_elsewhere(ctx, hv));
    let found =
        Target { managed: hv.is_some(), owned_by_hypervisor: hv.as_ref().is_some_and(owned), held_by };
    Ok(checks::check(name, ev.spec.reason, &ev.spec.options, &found).map(|()| {
        hv.map(|hv| {
            let status = hv.status.clone().unwrap_or_default();
            crate::lifecycle::nova_host(name, &hv.spec, &status).to_string()
        })
        .unwrap_or_default()
    }))
}

/// Ends the Eviction Failed with the refusal in its `Target` condition.
async fn refuse(ctx: &EvictionContext, ev: &Eviction, r: Refusal, now: Timestamp) -> Result<Requeue, Error> {
    tracing::warn!(reason = r.reason, message = %r.message, "eviction refused");
    record(ctx, ev, phases::refused(status_of(ev), &r, ev.metadata.generation, now)).await?;
    Ok(Requeue::requeue(ENDED))
}

/// Writes the Eviction's status ([`write_status`]) and tells what the write
/// changed ([`tell`]). Answers the Eviction as written, if it was.
async fn record(ctx: &EvictionContext, ev: &Eviction, s: EvictionStatus) -> Result<Option<Eviction>, Error> {
    let written = write_status(ctx, ev, s).await?;
    if let Some(w) = &written {
        tell(ctx, &status_of(ev), w).await;
    }
    Ok(written)
}

/// Writes the Eviction's status, with its summary `Ready` condition, over
/// the version this reconcile read and remembers it for a cache that lags;
/// an unchanged status is not written (every write wakes the Hypervisor's
/// reconcile). Answers the Eviction as written, if it was.
async fn write_status(
    ctx: &EvictionContext,
    ev: &Eviction,
    mut s: EvictionStatus,
) -> Result<Option<Eviction>, Error> {
    let summary = crate::api::ready::eviction_conditions(&s);
    s.conditions = merge(&s.conditions, &summary, Timestamp::now(), ev.metadata.generation);
    if Some(&s) == ev.status.as_ref() {
        return Ok(None);
    }
    let written =
        write::status(&api(ctx), &ev.name_any(), ev.metadata.resource_version.as_deref(), &s).await?;
    ctx.written.remember(ev.metadata.resource_version.clone(), written.clone());
    Ok(Some(written))
}

/// The Events a status write tells ([`news::news`]): on the Eviction, on
/// the Migration of an attempt, and on the host's Node; and the progress
/// on the fleet watch.
async fn tell(ctx: &EvictionContext, before: &EvictionStatus, written: &Eviction) {
    let after = status_of(written);
    if (before.phase, before.migrated, before.in_flight) != (after.phase, after.migrated, after.in_flight) {
        let _ = ctx.events.send(progress_event(ctx, written, &after));
    }
    let dry_run = written.spec.dry_run;
    for n in news::news(&written.name_any(), before, &after, &written.unmet_message(), dry_run) {
        let reference = match &n.about {
            news::About::Eviction => written.object_ref(&()),
            news::About::Migration(name) => migration_ref(ctx, name).await,
            news::About::Node => node_ref(ctx, &written.spec.hypervisor),
        };
        let type_ = if n.warning { EventType::Warning } else { EventType::Normal };
        super::hypervisor::publish_by(&ctx.recorder, &reference, type_, n.reason, &n.note).await;
    }
}

/// The fleet watch's event for an eviction's progress on its host.
fn progress_event(ctx: &EvictionContext, ev: &Eviction, s: &EvictionStatus) -> hv_proto::v1::HypervisorEvent {
    let node = &ev.spec.hypervisor;
    let phase = ctx.hypervisors.get(&ObjectRef::new(node)).and_then(|hv| hv.status.as_ref()?.phase);
    hv_proto::v1::HypervisorEvent {
        hypervisor: Some(hv_proto::v1::Hypervisor {
            name: node.clone(),
            phase: phase.unwrap_or_default().as_str().to_string(),
            ..Default::default()
        }),
        kind: "eviction".into(),
        eviction: Some(hv_proto::v1::EvictionProgress {
            name: ev.name_any(),
            phase: format!("{:?}", s.phase.unwrap_or_default()),
            migrated: s.migrated,
            total: s.total,
            in_flight: s.in_flight,
            non_migratable: s.non_migratable,
        }),
        ..Default::default()
    }
}

/// The Migration `name` (with its uid, so that `kubectl describe` lists
/// the Event): from the cache, or read, as one made in this very step is
/// not in the cache yet; by name alone when it cannot be read.
async fn migration_ref(ctx: &EvictionContext, name: &str) -> ObjectReference {
    let cached = ctx.migrations.get(&ObjectRef::<Migration>::new(name)).map(|m| (*m).clone());
    let found = match cached {
        Some(m) => Some(m),
        None => Api::<Migration>::all(ctx.client.clone()).get_opt(name).await.ok().flatten(),
    };
    match found {
        Some(m) => m.object_ref(&()),
        None => ObjectReference {
            api_version: Some(Migration::api_version(&()).into_owned()),
            kind: Some("Migration".into()),
            name: Some(name.into()),
            ..Default::default()
        },
    }
}

/// The Node a Hypervisor is owned by (its name and uid, so that
/// `kubectl describe node` lists the Event), or by name alone.
fn node_ref(ctx: &EvictionContext, node: &str) -> ObjectReference {
    let hv = ctx.hypervisors.get(&ObjectRef::new(node));
    let owner = hv.as_ref().and_then(|hv| hv.owner_references().iter().find(|o| o.kind == "Node").cloned());
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: owner.map(|o| o.uid),
        ..Default::default()
    }
}

/// Could every VM be placed elsewhere? Failing stops the eviction before
/// anything moves, with a condition naming each VM and why
/// ([`phases::judged`]).
async fn run_preflight(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    fence: &FenceState,
    now: Timestamp,
) -> Result<Requeue, Error> {
    // Judged once the host's fate is known: a fenced host's findings do
    // not stop its eviction, a live one's do.
    if let Some(c) = fence.condition().filter(|_| fence.holds()) {
        return held_preflight(ctx, ev, c, now).await;
    }
    // Whether the host is the machine Nova means, before the room is read.
    let servers = ctx.nova.servers_on(source).await?;
    let machine = judge_machine(ctx, ev, source, &servers);
    if machine.holds && ev.spec.dry_run {
        return held_preflight(ctx, ev, machine.condition, now).await;
    }
    if machine.holds {
        return hold_for_machine(ctx, ev, machine.condition, now).await;
    }
    let asleep = ctx.hibernation.asleep_near(source);
    let (servers, candidates) = candidates(ctx, ev, source, servers, asleep.as_deref()).await?;
    let o = &ev.spec.options;
    let awake: Vec<_> = candidates.iter().filter(|c| !c.asleep).cloned().collect();
    let report = preflight(&servers, o.default_policy.unwrap_or(ctx.default_policy), &awake, &o.force);
    if let Some(next) =
        wait_for_room(ctx, ev, (source, fence, asleep), &report, (&servers, &candidates), now).await?
    {
        return Ok(next);
    }
    let plan = report.plan.clone();
    let (mut s, passed) = phases::judged(status_of(ev), report, fence, source, ev.metadata.generation, now);
    s.conditions = merge(&s.conditions, &[machine.condition], now, ev.metadata.generation);
    s.preflight = plan;
    if ev.spec.dry_run {
        record(ctx, ev, phases::planned(s, None, now)).await?;
        return Ok(Requeue::requeue(ENDED));
    }
    let said = s.conditions.iter().find(|c| c.type_ == ConditionType::Preflight.as_str());
    let (reason, message) = said.map_or(("", ""), |c| (c.reason.as_str(), c.message.as_str()));
    match reason {
        "Passed" => tracing::info!(node = %source, summary = %message, "preflight passed"),
        _ => tracing::warn!(node = %source, reason, message = %message, "preflight findings"),
    }
    match record(ctx, ev, s).await? {
        // The lifecycle disables the host when it sees the Eviction, most
        // often before the preflight is done: straight on, on the Eviction
        // as written.
        Some(written) if passed => {
            // The preflight may have taken seconds: the fencing and the
            // time are read again, so that nothing starts off a host being
            // fenced meanwhile, and no attempt is dated back.
            let fence = self::fence(ctx, &written).await?;
            wait_disabled(ctx, &written, source, &fence, Timestamp::now()).await
        }
        _ => Ok(Requeue::requeue(if passed { Duration::from_millis(100) } else { ENDED })),
    }
}

/// Where the VMs of `source` could go, with their traits and software,
/// and the hosts the hibernation policy could wake for them, marked asleep;
/// the servers with their software.
async fn candidates(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    mut servers: Vec<Server>,
    asleep: Option<&[(String, Vec<String>)]>,
) -> Result<(Vec<Server>, Vec<crate::eviction::preflight::Candidate>), Error> {
    let named = named_traits(&servers);
    let coming: Vec<String> =
        asleep.unwrap_or_default().iter().flat_map(|(_, hosts)| hosts.clone()).collect();
    let (carried, mut candidates, ()) = tokio::try_join!(
        ctx.nova.carriers(&named),
        ctx.nova.candidates(source, &coming),
        with_groups(ctx, &mut servers)
    )?;
    with_traits(&mut candidates, &carried);
    super::host_software::with_software(&ctx.hypervisors, source, &mut servers, &mut candidates);
    hold_for_others(&mut candidates, &others_planned(&ctx.evictions.state(), &ev.name_any()));
    Ok((servers, candidates))
}

/// Gives each server the server group it is in (Nova allows one).
async fn with_groups(ctx: &EvictionContext, servers: &mut [Server]) -> Result<(), NovaError> {
    let on = servers.iter().filter_map(|s| Some((s.id.clone(), s.host.clone()?))).collect();
    let groups = ctx.nova.server_groups_of(&on).await?;
    for s in servers.iter_mut() {
        s.needs.group = groups.iter().find(|g| g.members_on.contains_key(&s.id)).cloned();
    }
    Ok(())
}

/// A preflight short of room that hibernated hosts would settle
/// (`room_asleep::hosts_to_wake`) waits for them
/// (`phases::waiting_for_room`), asking the policy at each look to wake
/// them; a dry run or an evacuation does not wait.
async fn wait_for_room(
    ctx: &EvictionContext,
    ev: &Eviction,
    (source, fence, asleep): (&str, &FenceState, Option<super::hibernation::Asleep>),
    report: &crate::eviction::preflight::Report,
    (servers, candidates): (&[Server], &[crate::eviction::preflight::Candidate]),
    now: Timestamp,
) -> Result<Option<Requeue>, Error> {
    let may_wait = ctx.hibernation.on() && phases::short_of_room_only(report);
    if ev.spec.dry_run || !may_wait || matches!(fence, FenceState::Fenced(_)) {
        return Ok(None);
    }
    let Some(asleep) = asleep else {
        // A new leader's policy has not looked yet: judged after its look.
        return Ok(Some(Requeue::requeue(Duration::from_secs(2))));
    };
    let o = &ev.spec.options;
    let policy = o.default_policy.unwrap_or(ctx.default_policy);
    // Hosts asked for before and still on their way (their provider or
    // service may be gone a moment while they start) are waited for.
    let before = ctx.hibernation.still_coming(source);
    let found = crate::eviction::room_asleep::hosts_to_wake(servers, policy, candidates, &o.force);
    let Some(wake) = found.or((!before.is_empty()).then_some(before)) else {
        let asleep: Vec<(&str, &str)> =
            candidates.iter().filter(|c| c.asleep).map(|c| (c.host.as_str(), c.az.as_str())).collect();
        tracing::info!(node = %source, ?asleep, "preflight short of room: no hibernated host would settle it");
        return Ok(None);
    };
    let named: Vec<(String, Vec<String>)> = asleep
        .into_iter()
        .map(|(group, hosts)| (group, hosts.into_iter().filter(|h| wake.contains(h)).collect::<Vec<_>>()))
        .filter(|(_, hosts)| !hosts.is_empty())
        .collect();
    let named = if named.is_empty() { vec![("its groups".to_string(), wake.clone())] } else { named };
    let Some(mut s) = phases::waiting_for_room(status_of(ev), report, &named, ev.metadata.generation, now)
    else {
        return Ok(None);
    };
    tracing::info!(node = %source, ?wake, "preflight short of room: waiting for hibernated hosts to wake");
    ctx.hibernation.ask_room(source, wake);
    s.preflight = report.plan.clone();
    record(ctx, ev, s).await?;
    Ok(Some(Requeue::requeue(ctx.hibernation_interval.min(Duration::from_secs(15)))))
}

/// A preflight that cannot be judged yet (the host's fencing, or its
/// machine, holds it): the condition says why, and it is looked at again;
/// a dry run ends `Planned` with that as its answer.
async fn held_preflight(
    ctx: &EvictionContext,
    ev: &Eviction,
    c: DesiredCondition,
    now: Timestamp,
) -> Result<Requeue, Error> {
    let mut s = status_of(ev);
    let why = format!("{} ({}): {}", c.type_, c.reason, c.message);
    s.conditions = merge(&s.conditions, &[c], now, ev.metadata.generation);
    if ev.spec.dry_run {
        record(ctx, ev, phases::planned(s, Some(&why), now)).await?;
        return Ok(Requeue::requeue(ENDED));
    }
    record(ctx, ev, s).await?;
    Ok(Requeue::requeue(POLL))
}

/// Whether the host is the machine Nova means: the servers Nova lists on
/// it against the domains its agent last reported, as its Hypervisor
/// records them ([`machine::judge`]).
fn judge_machine(ctx: &EvictionContext, ev: &Eviction, source: &str, servers: &[Server]) -> machine::Verdict {
    let name = &ev.spec.hypervisor;
    let hv = ctx.hypervisors.get(&ObjectRef::new(name));
    let domains = hv.as_ref().and_then(|hv| hv.status.as_ref()?.machine.as_ref()?.domains.clone());
    // A server that never ran (a failed or unfinished build) has no domain.
    let ran = servers.iter().filter(|s| !matches!(s.status.as_str(), "ERROR" | "BUILD"));
    let ids: Vec<String> = ran.map(|s| s.id.clone()).collect();
    let forced = ev.spec.options.force.iter().any(|f| f == machine::MACHINE);
    machine::judge(name, source, &ids, domains.as_deref(), forced)
}

/// Not the machine Nova means: nothing moves; the `Machine` condition says
/// why (a Warning Event when it first does), and the next look comes soon,
/// as the agent's next report may settle it.
async fn hold_for_machine(
    ctx: &EvictionContext,
    ev: &Eviction,
    condition: DesiredCondition,
    now: Timestamp,
) -> Result<Requeue, Error> {
    let mut s = status_of(ev);
    let told = s
        .conditions
        .iter()
        .any(|c| c.type_ == ConditionType::Machine.as_str() && c.reason == condition.reason);
    if !told {
        tracing::warn!(node = %ev.spec.hypervisor, message = %condition.message, "not the machine Nova means");
        let reference = ev.object_ref(&());
        super::hypervisor::publish_by(
            &ctx.recorder,
            &reference,
            EventType::Warning,
            "NotTheMachine",
            &condition.message,
        )
        .await;
    }
    s.phase.get_or_insert(EvictionPhase::Pending);
    s.conditions = merge(&s.conditions, &[condition], now, ev.metadata.generation);
    record(ctx, ev, s).await?;
    Ok(Requeue::requeue(MACHINE_LOOK))
}

/// Nothing moves before the host stops taking new VMs
/// ([`phases::disabling`]).
async fn wait_disabled(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    fence: &FenceState,
    now: Timestamp,
) -> Result<Requeue, Error> {
    if let Some(again) = hands_held(ctx, ev, source, fence, now).await? {
        return Ok(again);
    }
    let seen = match ctx.nova.compute_service(source).await {
        Ok(Some(s)) if s.enabled => ServiceSeen::Enabled,
        Ok(Some(_)) => ServiceSeen::Disabled,
        Ok(None) => ServiceSeen::Missing,
        Err(e) => {
            tracing::warn!(error = %e, "Nova not usable; retrying");
            ServiceSeen::Unreadable
        }
    };
    let generation = ev.metadata.generation;
    match phases::disabling(&status_of(ev), seen, source, DISABLE_TIMEOUT, generation, now) {
        // Straight on to the first migrations, which record the host
        // disabled with their step: one write, and the lifecycle woken by
        // it reads its host beside the requests, not before them.
        Disabling::Proceed(c) => migrate(ctx, ev, source, fence, now, Some(c)).await,
        Disabling::Wait(again) => Ok(Requeue::requeue(again)),
        Disabling::Failed(s) => {
            record(ctx, ev, s).await?;
            Ok(Requeue::requeue(ENDED))
        }
    }
}

/// How often an Eviction held by its host's hands is looked at.
const HANDS_LOOK: Duration = Duration::from_secs(5);

/// An Eviction whose host's hands are off (an SRE's pause, or observe
/// mode; crate::lifecycle::hands) asks nothing of Nova: no disable waited
/// for, no migration asked, followed or aborted. It says so in its
/// `HostPaused` condition, with what it would move (read from Nova), told
/// once as an Event and counted. Answers when to look again; None when the
/// hands are free (a condition left from a pause is set False first).
async fn hands_held(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    fence: &FenceState,
    now: Timestamp,
) -> Result<Option<Requeue>, Error> {
    let cached = ctx.hypervisors.get(&ObjectRef::new(&ev.spec.hypervisor));
    let paused = cached.as_ref().and_then(|h| h.annotations().get(PAUSED_ANNOTATION).cloned());
    let hands = Hands::of(ctx.gate.observes(), paused.as_deref());
    let before = status_of(ev);
    // A cancelled Eviction with nothing in flight asks nothing of Nova to end.
    let in_flight = before.vms.iter().any(|v| v.state == VmState::Migrating);
    if ev.metadata.deletion_timestamp.is_some() && !in_flight {
        return Ok(None);
    }
    let had = before.conditions.iter().find(|c| c.type_ == ConditionType::HostPaused.as_str());
    if hands.free() && had.is_none_or(|c| c.status != "True") {
        return Ok(None);
    }
    let servers = if hands.free() { 0 } else { ctx.nova.servers_on(source).await?.len() };
    let (kind, said) = hands.eviction(source, servers, fence.evacuation().is_some());
    let told = had.is_some_and(|c| c.status == "True" && c.message == said.message);
    let mut s = before.clone();
    s.conditions = merge(&s.conditions, std::slice::from_ref(&said), now, ev.metadata.generation);
    let written = record(ctx, ev, s).await?;
    if hands.free() {
        return Ok(Some(Requeue::requeue(ENDED)));
    }
    if !told {
        tracing::info!(would = kind.reason(), message = %said.message, "hands off: not done");
        ctx.metrics.would(kind.reason());
        let reference = written.as_ref().unwrap_or(ev).object_ref(&());
        let note = format!("not done, hands off: {}", said.message);
        super::hypervisor::publish_by(&ctx.recorder, &reference, EventType::Normal, kind.reason(), &note)
            .await;
    }
    Ok(Some(Requeue::requeue(HANDS_LOOK)))
}

/// What Nova shows of the servers and their current attempts, and the
/// Migration statuses that record it.
struct Seen {
    servers: Vec<Server>,
    attempts: Vec<AttemptObs>,
    /// Migration name, the version read, and the status that records what
    /// Nova shows.
    records: Vec<(String, Option<String>, MigrationStatus)>,
}

/// One step of the migrations: observe, step, record, act. `disabled`:
/// the host was just seen disabled, and the step records it.
async fn migrate(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    fence: &FenceState,
    now: Timestamp,
    disabled: Option<DesiredCondition>,
) -> Result<Requeue, Error> {
    if let Some(again) = hands_held(ctx, ev, source, fence, now).await? {
        return Ok(again);
    }
    let began = std::time::Instant::now();
    let name = ev.name_any();
    let before = status_of(ev);
    let deleting = ev.metadata.deletion_timestamp.is_some();
    let mut seen = observe(ctx, ev, source, &before, now).await?;
    // Options edited out of bounds mid-eviction: what is in flight is
    // followed (with defaults for the bad fields), nothing new starts.
    let (mut options, invalid) = checks::sanitized(&ev.spec.options);
    options.default_policy.get_or_insert(ctx.default_policy);
    let held = deleting || invalid.is_some() || fence.holds();
    let input = Input {
        source,
        options: &options,
        vms: &before.vms,
        servers: &seen.servers,
        attempts: &seen.attempts,
        slots: 0,
        cancelled: deleting,
        evacuation: fence.evacuation(),
        now,
    };
    let (step, read_again) = step_held(ctx, ev, &name, input, held).await?;
    let fence = read_again.as_ref().unwrap_or(fence);
    // Record each new attempt before asking Nova, so a crash in between
    // can never lead to a second request for the same attempt.
    let said = [options_condition(&before, invalid), fence.condition(), disabled];
    let written =
        write_status(ctx, ev, stepped(&before, &step, fence, &said, ev.metadata.generation, now)).await?;
    ctx.metrics.add(&tally(&before.vms, &step, now));
    write_records(ctx, &name, &mut seen.records, &step, now).await;
    let acted = act(ctx, ev, source, &step).await;
    // Told once Nova was asked: the Events wait for nothing on the way.
    if let Some(w) = &written {
        tell(ctx, &before, w).await;
    }
    acted?;
    after_step(ctx, ev, &before, &step, began).await
}

/// Writes what Nova showed of each attempt in flight into its Migration,
/// and the step's forces to complete with it: a force is recorded before
/// it is asked.
async fn write_records(
    ctx: &EvictionContext,
    name: &str,
    records: &mut [(String, Option<String>, MigrationStatus)],
    step: &plan::Step,
    now: Timestamp,
) {
    let forcing: Vec<String> = step
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::ForceComplete { server_id, attempt, .. } => {
                Some(migration_name(name, server_id, *attempt))
            }
            _ => None,
        })
        .collect();
    for (mname, read, st) in records.iter_mut() {
        let force = forcing.contains(mname);
        if force {
            st.force_completed_at = Some(MicroTime(now));
        }
        if write_migration(ctx, mname, read.as_deref(), st).await && force {
            ctx.forced.remember(name, mname, now);
        }
    }
}

/// What follows a step once Nova was asked: a final phase lets its slots
/// go (and a cancelled Eviction being deleted, its finalizer); when to look
/// again.
async fn after_step(
    ctx: &EvictionContext,
    ev: &Eviction,
    before: &EvictionStatus,
    step: &plan::Step,
    began: std::time::Instant,
) -> Result<Requeue, Error> {
    let name = ev.name_any();
    if step.phase.is_final() {
        ctx.limit.release(&name);
        ctx.progress_reads.forget_eviction(&name);
        ctx.forced.forget_eviction(&name);
    }
    if ev.metadata.deletion_timestamp.is_some() && step.phase == EvictionPhase::Cancelled {
        write::finalizer(&api(ctx), ev, EVICTION_FINALIZER, false).await?;
        return Ok(Requeue::await_change());
    }
    let next = if step.phase.is_final() {
        ENDED
    } else if ended_beside_others(&before.vms, &step.vms) {
        AFTER_AN_END
    } else {
        pause_after(began.elapsed())
    };
    Ok(Requeue::requeue(next))
}

/// The step; with new evacuations in it, the host's fencing record is read
/// again first, and should it no longer let them start (a sign of life
/// written since this look began, docs/fencing.md) the step is taken again
/// held, with that record. Nothing is recorded yet: no attempt is spent.
async fn step_held(
    ctx: &EvictionContext,
    ev: &Eviction,
    name: &str,
    input: Input<'_>,
    held: bool,
) -> Result<(plan::Step, Option<FenceState>), Error> {
    let step = with_slots(ctx, name, input.clone(), held);
    if !step.actions.iter().any(|a| matches!(a, Action::Evacuate { .. })) {
        return Ok((step, None));
    }
    let now = fence(ctx, ev).await?;
    if now.evacuation().is_some() {
        return Ok((step, None));
    }
    tracing::warn!(eviction = %name, "the host's fencing no longer lets evacuations start: none asked");
    let step = with_slots(ctx, name, Input { evacuation: now.evacuation(), ..input }, true);
    Ok((step, Some(now)))
}

/// The step with the slots the cluster-wide limit grants (none while
/// `held`): the evacuations' own while it evacuates. The attempts Nova
/// shows ended free their slots for this very step, not the next one a
/// second later: counted after what was seen.
fn with_slots(ctx: &EvictionContext, name: &str, input: Input<'_>, held: bool) -> plan::Step {
    let in_flight = count(&plan::step(&input).vms, VmState::Migrating);
    let want = if held { 0 } else { input.options.max_parallel.saturating_sub(in_flight) };
    let slots = ctx.limit.grant(name, input.evacuation.is_some(), in_flight, want);
    plan::step(&Input { slots, ..input })
}

/// The status that records `step`, with what this look says. Pure.
fn stepped(
    before: &EvictionStatus,
    step: &plan::Step,
    fence: &FenceState,
    said: &[Option<DesiredCondition>],
    generation: Option<i64>,
    now: Timestamp,
) -> EvictionStatus {
    let mut s = before.clone();
    s.observed_generation = generation;
    s.vms = step.vms.clone();
    s.phase = Some(step.phase);
    // Only with a live record: fenced, or being fenced again (as it was).
    s.evacuating = match fence {
        FenceState::Fenced(_) => true,
        FenceState::Pending(_) | FenceState::ShowsLife(_) => before.evacuating,
        FenceState::None => false,
    };
    fill_counts(&mut s, now);
    let said: Vec<DesiredCondition> = said.iter().flatten().cloned().collect();
    s.conditions = merge(&s.conditions, &said, now, generation);
    s
}

/// The pause after a look that took `took`: looks [`POLL`] apart from start
/// to start, and never less than [`POLL_PAUSE`] apart. Pure.
fn pause_after(took: Duration) -> Duration {
    POLL.saturating_sub(took).max(POLL_PAUSE)
}

/// Whether this step saw an attempt end while another one asked before
/// this step still runs. Pure.
fn ended_beside_others(before: &[VmStatus], after: &[VmStatus]) -> bool {
    let moving = |vms: &[VmStatus], id: &str| vms.iter().any(|v| v.id == id && v.state == VmState::Migrating);
    let was: Vec<&str> =
        before.iter().filter(|v| v.state == VmState::Migrating).map(|v| v.id.as_str()).collect();
    let ended = was.iter().any(|id| !moving(after, id));
    let still = was.iter().any(|id| moving(after, id));
    ended && still
}

/// The `Target` condition of a running eviction: False while its options
/// are out of bounds, True again once they are fixed; None when there is
/// nothing to say.
fn options_condition(before: &EvictionStatus, invalid: Option<String>) -> Option<DesiredCondition> {
    let was_invalid =
        before.conditions.iter().any(|c| c.type_ == ConditionType::Target.as_str() && c.status == "False");
    match invalid {
        Some(why) => Some(DesiredCondition::new(
            ConditionType::Target,
            ConditionStatus::False,
            "InvalidSpec",
            format!("{why}; nothing new starts until it is fixed, migrations in flight are followed"),
        )),
        None if was_invalid => {
            Some(DesiredCondition::new(ConditionType::Target, ConditionStatus::True, "Valid", String::new()))
        }
        None => None,
    }
}

fn count(vms: &[VmStatus], state: VmState) -> u32 {
    u32::try_from(vms.iter().filter(|v| v.state == state).count()).unwrap_or(u32::MAX)
}

async fn observe(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    status: &EvictionStatus,
    now: Timestamp,
) -> Result<Seen, Error> {
    let mut servers = ctx.nova.servers_on(source).await?;
    for vm in status.vms.iter().filter(|v| !plan::is_final(v.state)) {
        if !servers.iter().any(|s| s.id == vm.id)
            && let Some(s) = ctx.nova.server(&vm.id).await?
        {
            servers.push(s);
        }
    }
    let moving: Vec<&VmStatus> = status.vms.iter().filter(|v| v.state == VmState::Migrating).collect();
    // One os-migrations call for every VM in flight (10 min of slack for
    // clock skew; every attempt of this eviction was created after its start).
    let from_host = if moving.is_empty() {
        Vec::new()
    } else {
        let start = status.started_at.as_ref().map_or(now, |t| t.0);
        ctx.nova.migrations_from(source, start - jiff::SignedDuration::from_mins(10)).await?
    };
    // An attempt seen ended is stamped when Nova's answer came, not when
    // this step began.
    let read_at = Timestamp::now();
    let mut seen = Seen { servers, attempts: Vec::new(), records: Vec::new() };
    for vm in moving {
        let mname = migration_name(&ev.name_any(), &vm.id, vm.attempts);
        let mine = migration_of(ctx, ev, &mname);
        let read = mine.as_ref().and_then(|m| m.metadata.resource_version.clone());
        let mut recorded = match mine {
            Some(m) => m.status.clone().unwrap_or_default(),
            None if never_made(ctx, ev, &mname).await? => not_sent(),
            None => MigrationStatus::default(),
        };
        // A force this leader recorded stands, whatever the cache says yet.
        if recorded.force_completed_at.is_none() {
            recorded.force_completed_at = ctx.forced.at(&ev.name_any(), &mname).map(MicroTime);
        }
        let others = claimed(ctx, ev, vm);
        let (obs, st) = observe_attempt(ctx, vm, &mname, recorded, &from_host, &others, read_at).await?;
        seen.attempts.extend(obs);
        seen.records.push((mname, read, st));
    }
    Ok(seen)
}

/// This Eviction's Migration `name`: one of an earlier Eviction by the same
/// name (not yet garbage-collected) is not ours to read or write.
fn migration_of(ctx: &EvictionContext, ev: &Eviction, name: &str) -> Option<Arc<Migration>> {
    ctx.migrations.get(&ObjectRef::new(name)).filter(|m| owned_by(m, ev))
}

/// Whether the attempt's Migration was never made, so Nova was never
/// asked: another Eviction's by the same name stands in the cache, and a
/// fresh read (ours may have been made since the cache saw that one) does
/// not show ours either.
async fn never_made(ctx: &EvictionContext, ev: &Eviction, name: &str) -> Result<bool, Error> {
    if ctx.migrations.get(&ObjectRef::new(name)).is_none() {
        return Ok(false);
    }
    let live = Api::<Migration>::all(ctx.client.clone()).get_opt(name).await?;
    Ok(!live.is_some_and(|m| owned_by(&m, ev)))
}

/// The record of an attempt that never reached Nova.
fn not_sent() -> MigrationStatus {
    MigrationStatus { phase: Some(MigrationPhase::NotSent), ..MigrationStatus::default() }
}

fn owned_by(m: &Migration, ev: &Eviction) -> bool {
    let uid = ev.metadata.uid.as_deref();
    uid.is_some() && m.owner_references().iter().any(|o| Some(o.uid.as_str()) == uid)
}

/// Nova migrations already matched to this VM's earlier attempts: never
/// the current attempt's.
fn claimed(ctx: &EvictionContext, ev: &Eviction, vm: &VmStatus) -> Vec<i64> {
    (1..vm.attempts)
        .filter_map(|a| migration_of(ctx, ev, &migration_name(&ev.name_any(), &vm.id, a)))
        .filter_map(|m| m.status.as_ref().and_then(|s| s.nova_migration_id))
        .collect()
}

/// What Nova shows of one VM's current attempt, and the Migration status
/// that records it.
async fn observe_attempt(
    ctx: &EvictionContext,
    vm: &VmStatus,
    mname: &str,
    mut st: MigrationStatus,
    from_host: &[NovaMigration],
    claimed: &[i64],
    now: Timestamp,
) -> Result<(Option<AttemptObs>, MigrationStatus), Error> {
    let asked = vm.attempt_started.as_ref().map_or(now, |t| t.0);
    let abort_requested = st.phase == Some(MigrationPhase::Aborted);
    let forced_at = st.force_completed_at.as_ref().map(|t| t.0);
    let base = |id, status, progress_reported| AttemptObs {
        server_id: vm.id.clone(),
        attempt: vm.attempts,
        nova_migration_id: id,
        nova_status: status,
        started_at: asked,
        last_progress_at: asked,
        progress_reported,
        abort_requested,
        forced_at,
        not_sent: false,
    };
    if st.phase == Some(MigrationPhase::NotSent) {
        return Ok((Some(AttemptObs { not_sent: true, ..base(None, None, false) }), st));
    }
    if st.phase == Some(MigrationPhase::Failed) && st.nova_migration_id.is_none() {
        // Nova refused the request outright.
        return Ok((Some(base(None, Some(NovaState::Failed), false)), st));
    }
    let Some(m) = find_attempt(vm, &st, from_host, asked - NOVA_CLOCK_SKEW, claimed) else {
        return Ok((None, st));
    };
    record_nova(&mut st, m, abort_requested);
    let mut progress_reported = counters_judged(&m.status, &st);
    if m.status.is_final() {
        st.finished_at.get_or_insert(MicroTime(now));
        ctx.progress_reads.forget(mname);
    } else if m.status == (NovaState::Running { live_running: true })
        && ctx.progress_reads.due(mname, PROGRESS_EVERY)
    {
        // Counters exist only while a live migration runs.
        ctx.progress_reads.done(mname);
        progress_reported = false;
        if let Some(p) = ctx.nova.progress_of(&vm.id).await?.into_iter().find(|p| p.id == m.id) {
            progress_reported = record_progress(&mut st, &p, now);
        }
    }
    let mut obs = base(Some(m.id), Some(m.status.clone()), progress_reported);
    if matches!(m.status, NovaState::Running { .. } | NovaState::PostCopy) && st.running_since.is_none() {
        st.running_since = Some(MicroTime(now));
    }
    obs.started_at = st.running_since.as_ref().or(st.started_at.as_ref()).map_or(asked, |t| t.0);
    obs.last_progress_at = st.last_progress_at.as_ref().map_or(asked, |t| t.0);
    Ok((Some(obs), st))
}

/// What Nova shows of the attempt, in its Migration's status (its phase
/// stays Aborted once an abort was asked). Pure.
fn record_nova(st: &mut MigrationStatus, m: &NovaMigration, abort_requested: bool) {
    st.nova_migration_id = Some(m.id);
    st.nova_status = Some(m.status.to_string());
    st.target_host = m.dest_compute.clone().or(st.target_host.take());
    if !abort_requested {
        st.phase = Some(match &m.status {
            NovaState::Completed | NovaState::Rebuilt | NovaState::Confirmed => MigrationPhase::Completed,
            NovaState::Failed | NovaState::Reverted => MigrationPhase::Failed,
            NovaState::Cancelled => MigrationPhase::Cancelled,
            _ => MigrationPhase::Running,
        });
    }
}

/// Whether the stall clock judges the attempt between two reads of its
/// counters: only while its live migration runs, and only if Nova reported
/// counters before (the record keeps them after `running` ends, when no
/// counter moves any more and an abort would be refused). Pure.
fn counters_judged(nova: &NovaState, recorded: &MigrationStatus) -> bool {
    *nova == (NovaState::Running { live_running: true })
        && (recorded.memory_processed_bytes.is_some() || recorded.disk_processed_bytes.is_some())
}

/// Copies Nova's progress counters into the record; `last_progress_at`
/// moves only when a counter did. Answers whether Nova reports counters.
fn record_progress(st: &mut MigrationStatus, p: &crate::nova::servers::Progress, now: Timestamp) -> bool {
    let moved = p.memory_processed_bytes != st.memory_processed_bytes
        || p.memory_remaining_bytes != st.memory_remaining_bytes
        || p.disk_processed_bytes != st.disk_processed_bytes;
    if moved {
        st.last_progress_at = Some(MicroTime(now));
    }
    st.memory_total_bytes = p.memory_total_bytes;
    st.memory_processed_bytes = p.memory_processed_bytes;
    st.memory_remaining_bytes = p.memory_remaining_bytes;
    st.disk_total_bytes = p.disk_total_bytes;
    st.disk_processed_bytes = p.disk_processed_bytes;
    st.disk_remaining_bytes = p.disk_remaining_bytes;
    p.memory_processed_bytes.is_some() || p.disk_processed_bytes.is_some()
}

/// This attempt's Nova migration: the one recorded, else the newest one Nova
/// created for the server since `since` (when we asked, less the clock skew
/// allowed between Nova and us) that no earlier attempt claimed.
fn find_attempt<'a>(
    vm: &VmStatus,
    st: &MigrationStatus,
    from_host: &'a [NovaMigration],
    since: Timestamp,
    claimed: &[i64],
) -> Option<&'a NovaMigration> {
    let mut of_vm = from_host.iter().filter(|m| m.instance_uuid.as_deref() == Some(vm.id.as_str()));
    match st.nova_migration_id {
        Some(id) => of_vm.find(|m| m.id == id),
        None => of_vm
            .filter(|m| !claimed.contains(&m.id) && m.created_at.is_some_and(|c| c >= since))
            .max_by_key(|m| (m.created_at, m.id)),
    }
}

/// Executes the step's actions: confirmations and aborts first, in order;
/// then the new attempts, each a Migration object and then its Nova
/// request, all at once: asked one after another, the third of a step left
/// Nova a fifth of a second after the first, and the slots drifted apart.
async fn act(ctx: &EvictionContext, ev: &Eviction, source: &str, step: &plan::Step) -> Result<(), Error> {
    let mut attempts = Vec::new();
    for action in &step.actions {
        match action {
            Action::Migrate { server_id, attempt, live, block_migration } => attempts.push(NewAttempt {
                server_id,
                attempt: *attempt,
                kind: if *live { MigrationKind::LiveMigrate } else { MigrationKind::ColdMigrate },
                block_migration: *block_migration,
            }),
            Action::Evacuate { server_id, attempt } => attempts.push(NewAttempt {
                server_id,
                attempt: *attempt,
                kind: MigrationKind::Evacuate,
                block_migration: false,
            }),
            // Idempotent, and asked again at the next step until the server
            // runs: a failure is told, not fatal to the reconcile.
            Action::Start { server_id } => match ctx.nova.start(server_id).await {
                Ok(()) => tracing::info!(server = %server_id, "evacuated server started"),
                Err(e) => {
                    tracing::warn!(server = %server_id, error = %e, "could not start the evacuated server yet")
                }
            },
            // Asked again at the next step until Nova shows it confirmed: a
            // failure holds up none of the step's other actions.
            Action::ConfirmResize { server_id, attempt } => match ctx.nova.confirm_resize(server_id).await {
                Ok(()) => tracing::info!(server = %server_id, attempt, "cold migration confirmed"),
                Err(e) => tracing::warn!(server = %server_id, attempt, error = %e, "could not confirm yet"),
            },
            Action::Abort { server_id, attempt, nova_migration_id, why } => {
                abort(ctx, ev, server_id, *attempt, *nova_migration_id, why).await;
            }
            Action::ForceComplete { server_id, attempt, nova_migration_id, why } => {
                force_complete(ctx, ev, server_id, *attempt, *nova_migration_id, why).await;
            }
            Action::Mark { server_id, host } => mark(ctx, server_id, Some(host)).await,
            Action::Unmark { server_id } => mark(ctx, server_id, None).await,
        }
    }
    // Each attempt was recorded before; one that fails here does not keep
    // the others from Nova.
    let asked = attempts.iter().map(|a| new_attempt(ctx, ev, source, &step.vms, a));
    let mut first = Ok(());
    for (a, result) in attempts.iter().zip(futures_util::future::join_all(asked).await) {
        if let Err(e) = result {
            tracing::warn!(server = %a.server_id, attempt = a.attempt, error = %e, "attempt not asked");
            first = first.and(Err(e));
        }
    }
    first
}

/// Aborts an attempt and records it. An abort Nova refuses is told and
/// asked again at the next step, without holding up the step's other
/// actions and new attempts.
async fn abort(
    ctx: &EvictionContext,
    ev: &Eviction,
    server_id: &str,
    attempt: u32,
    id: Option<i64>,
    why: &str,
) {
    if let Some(id) = id
        && let Err(e) = ctx.nova.abort_migration(server_id, id).await
    {
        tracing::warn!(server = %server_id, attempt, error = %e, "could not abort the migration yet");
        return;
    }
    tracing::warn!(server = %server_id, attempt, reason = %why, "migration aborted");
    note_attempt(ctx, ev, server_id, attempt, |st| {
        st.phase = Some(MigrationPhase::Aborted);
        st.message = why.to_string();
    })
    .await;
}

/// Records something of an attempt in its Migration's status.
async fn note_attempt(
    ctx: &EvictionContext,
    ev: &Eviction,
    server_id: &str,
    attempt: u32,
    change: impl FnOnce(&mut MigrationStatus),
) {
    let mname = migration_name(&ev.name_any(), server_id, attempt);
    let mine = migration_of(ctx, ev, &mname);
    let read = mine.as_ref().and_then(|m| m.metadata.resource_version.clone());
    let mut st = mine.and_then(|m| m.status.clone()).unwrap_or_default();
    change(&mut st);
    write_migration(ctx, &mname, read.as_deref(), &st).await;
}

/// Forces a stuck live migration to complete, once its Migration records
/// the ask (written with the step's records): Nova's call is not
/// idempotent, so an ask whose answer is lost is never repeated, and the
/// attempt is aborted a progress timeout later if it has not ended. Only a
/// request Nova surely did not get is forgotten, to be asked at the next
/// step.
async fn force_complete(
    ctx: &EvictionContext,
    ev: &Eviction,
    server_id: &str,
    attempt: u32,
    id: i64,
    why: &str,
) {
    let name = ev.name_any();
    let mname = migration_name(&name, server_id, attempt);
    if ctx.forced.at(&name, &mname).is_none() {
        tracing::warn!(server = %server_id, attempt, "the force was not recorded: asked at the next step");
        return;
    }
    match ctx.nova.force_complete_migration(server_id, id).await {
        Ok(()) => {
            ctx.metrics.forced();
            tracing::warn!(server = %server_id, attempt, reason = %why, "migration forced to complete");
        }
        Err(e) => {
            tracing::warn!(server = %server_id, attempt, error = %e, "could not force the migration to complete");
            if matches!(e, NovaError::Unavailable(_)) {
                ctx.forced.forget(&name, &mname);
                note_attempt(ctx, ev, server_id, attempt, |st| st.force_completed_at = None).await;
            }
        }
    }
}

/// Sets (`Some(host)`) or takes off our `evict-from` mark on a server of
/// policy `external`. Idempotent, and asked again at the next step until
/// Nova shows it done (Nova refuses metadata changes while the server is
/// busy): a failure is told, not fatal to the reconcile.
async fn mark(ctx: &EvictionContext, server_id: &str, host: Option<&String>) {
    match ctx.nova.server_metadata(server_id, EVICT_FROM_METADATA, host.map(String::as_str)).await {
        Ok(()) => tracing::info!(server = %server_id, host = ?host, "evict-from mark set or taken off"),
        Err(e) => tracing::warn!(server = %server_id, error = %e, "could not change the evict-from mark yet"),
    }
}

/// An attempt the step starts.
struct NewAttempt<'a> {
    server_id: &'a str,
    attempt: u32,
    kind: MigrationKind,
    block_migration: bool,
}

/// Records the attempt's Migration object, asks Nova, and records the answer.
async fn new_attempt(
    ctx: &EvictionContext,
    ev: &Eviction,
    source: &str,
    vms: &[VmStatus],
    a: &NewAttempt<'_>,
) -> Result<(), Error> {
    let name = ev.name_any();
    let vm = vms.iter().find(|v| v.id == a.server_id).cloned().unwrap_or_default();
    let mname = migration_name(&name, a.server_id, a.attempt);
    let read = create_migration(ctx, ev, &mname, source, &vm, a.attempt, a.kind, a.block_migration).await?;
    let st = request_migration(ctx, &name, a.server_id, a.attempt, a.kind).await?;
    write_migration(ctx, &mname, read.as_deref(), &st).await;
    Ok(())
}

/// Creates the Migration object of one attempt; answers its version. One
/// that exists already is ours only if this Eviction owns it (recorded
/// before a crash); one of an earlier Eviction by the same name is an error
/// until the garbage collector removed it.
#[allow(clippy::too_many_arguments)]
async fn create_migration(
    ctx: &EvictionContext,
    ev: &Eviction,
    mname: &str,
    source: &str,
    vm: &VmStatus,
    attempt: u32,
    policy: MigrationKind,
    block_migration: bool,
) -> Result<Option<String>, Error> {
    let spec = MigrationSpec {
        eviction: ev.name_any(),
        server_id: vm.id.clone(),
        server_name: vm.name.clone(),
        source_host: source.to_string(),
        attempt,
        policy,
        block_migration,
        memory_bytes: vm.memory_bytes,
    };
    let mut m = Migration::new(mname, spec);
    m.metadata.owner_references = ev.controller_owner_ref(&()).map(|o| vec![o]);
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    let api = Api::<Migration>::all(ctx.client.clone());
    match api.create(&pp, &m).await {
        Ok(created) => Ok(created.metadata.resource_version),
        Err(kube::Error::Api(e)) if e.code == 409 => match api.get_opt(mname).await? {
            Some(existing) if owned_by(&existing, ev) => Ok(existing.metadata.resource_version),
            _ => Err(Error::Leftover(mname.to_string())),
        },
        Err(e) => Err(e.into()),
    }
}

/// Asks Nova to move the server; answers the attempt's Migration status.
/// An answer that was lost leaves the attempt in flight, to be found in
/// Nova's migrations: asking again could move the VM twice (an evacuation
/// too: a second one of a server already rebuilt moves it again).
async fn request_migration(
    ctx: &EvictionContext,
    eviction: &str,
    server_id: &str,
    attempt: u32,
    kind: MigrationKind,
) -> Result<MigrationStatus, Error> {
    // Stamped as the request leaves, not when the step began: the
    // attempt's time is Nova's, what came before it is ours.
    let sent = Timestamp::now();
    let mut st = MigrationStatus {
        phase: Some(MigrationPhase::Pending),
        started_at: Some(MicroTime(sent)),
        last_progress_at: Some(MicroTime(sent)),
        ..Default::default()
    };
    let asked = match kind {
        MigrationKind::LiveMigrate => ctx.nova.migrate(server_id, true).await,
        MigrationKind::ColdMigrate => ctx.nova.migrate(server_id, false).await,
        MigrationKind::Evacuate => ctx.nova.evacuate(server_id).await,
    };
    match asked {
        Ok(()) => tracing::info!(eviction, server = %server_id, attempt, kind = ?kind, "migration requested"),
        Err(e @ NovaError::Unknown(_)) => {
            tracing::warn!(eviction, server = %server_id, attempt, error = %e, "migration request's answer lost; looking in Nova");
            st.message =
                format!("the answer to the request was lost ({e}); looking for the migration in Nova");
        }
        // Not sent: this replica no longer leads (or the install observes
        // only). The attempt stays recorded; the next leader finds no
        // migration and retries it.
        Err(e @ (NovaError::NotLeader(_) | NovaError::Withheld(_))) => return Err(e.into()),
        // Not sent either: Nova or Keystone could not be reached, or no
        // token was had. Asked again later; the attempt does not count.
        Err(e @ (NovaError::Unavailable(_) | NovaError::Unauthorized(_) | NovaError::Config(_))) => {
            tracing::warn!(eviction, server = %server_id, attempt, error = %e, "migration request not sent");
            st.phase = Some(MigrationPhase::NotSent);
            st.message = e.to_string();
            st.finished_at = Some(MicroTime(Timestamp::now()));
        }
        Err(e) => {
            tracing::warn!(eviction, server = %server_id, attempt, error = %e, "migration refused");
            st.phase = Some(MigrationPhase::Failed);
            st.nova_status = Some("refused".into());
            st.message = e.to_string();
            st.finished_at = Some(MicroTime(Timestamp::now()));
        }
    }
    Ok(st)
}

fn fill_counts(s: &mut EvictionStatus, now: Timestamp) {
    s.total = u32::try_from(s.vms.len()).unwrap_or(u32::MAX);
    s.migrated = count(&s.vms, VmState::Migrated);
    s.gone = count(&s.vms, VmState::Gone);
    s.non_migratable = count(&s.vms, VmState::NonMigratable);
    s.in_flight = count(&s.vms, VmState::Migrating);
    s.progress = Some(format!("{}/{}", s.migrated, s.total));
    s.started_at.get_or_insert(Time(now));
    if s.phase.is_some_and(|p| p.is_final()) {
        s.completed_at.get_or_insert(Time(now));
    }
}

/// A Migration's status, over the version read: a write over a newer one
/// (another leader's) fails, and the next reconcile writes what it sees.
/// Writes a Migration's status over the version read; answers whether it
/// was written.
async fn write_migration(
    ctx: &EvictionContext,
    name: &str,
    read: Option<&str>,
    status: &MigrationStatus,
) -> bool {
    let Some(read) = read else {
        // Not in the cache yet (or not ours): the next reconcile writes it.
        tracing::debug!(migration = %name, "Migration not read yet; its status waits");
        return false;
    };
    let api: Api<Migration> = Api::all(ctx.client.clone());
    match write::status(&api, name, Some(read), status).await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(migration = %name, error = %e, "could not write Migration status");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nova(id: i64, server: &str, created: Timestamp) -> NovaMigration {
        NovaMigration {
            id,
            status: NovaState::Running { live_running: true },
            instance_uuid: Some(server.into()),
            source_compute: Some("node-1".into()),
            dest_compute: None,
            migration_type: Some("live-migration".into()),
            created_at: Some(created),
            updated_at: None,
        }
    }

    #[test]
    fn an_attempt_is_matched_across_clock_skew_never_to_an_earlier_attempts_migration() {
        let asked = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let skew = jiff::SignedDuration::from_secs(60);
        let vm = VmStatus { id: "vm-a".into(), attempts: 2, ..Default::default() };
        let none = MigrationStatus::default();
        // Nova's clock 40 s behind ours: its migration looks older than our request.
        let behind = [nova(7, "vm-a", asked - jiff::SignedDuration::from_secs(40))];
        assert_eq!(find_attempt(&vm, &none, &behind, asked - skew, &[]).map(|m| m.id), Some(7));
        // The first attempt's migration (id 6), and another server's, are never ours.
        let earlier = [nova(6, "vm-a", asked - jiff::SignedDuration::from_secs(20)), nova(9, "vm-b", asked)];
        assert_eq!(find_attempt(&vm, &none, &earlier, asked - skew, &[6]).map(|m| m.id), None);
        // Of the candidates, the newest.
        let both = [nova(6, "vm-a", asked - jiff::SignedDuration::from_secs(20)), nova(8, "vm-a", asked)];
        assert_eq!(find_attempt(&vm, &none, &both, asked - skew, &[]).map(|m| m.id), Some(8));
        // Once recorded, only the recorded one.
        let recorded = MigrationStatus { nova_migration_id: Some(6), ..Default::default() };
        assert_eq!(find_attempt(&vm, &recorded, &both, asked - skew, &[]).map(|m| m.id), Some(6));
    }

    #[test]
    fn evacuating_holds_only_while_the_record_says_fenced() {
        let now = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let step = plan::Step { phase: EvictionPhase::Migrating, vms: Vec::new(), actions: Vec::new() };
        let evacuation = Evacuation {
            by_default: true,
            rebuild_from_image: false,
            instance_disks_on_rbd: true,
            powered_off: true,
        };
        let fenced =
            stepped(&EvictionStatus::default(), &step, &FenceState::Fenced(evacuation), &[], None, now);
        assert!(fenced.evacuating);
        // The record gone (the fence lifted): no longer evacuating.
        assert!(!stepped(&fenced, &step, &FenceState::None, &[], None, now).evacuating);
        // Being fenced again: the record lives, what was said stands.
        let pending = FenceState::Pending("being fenced".into());
        assert!(stepped(&fenced, &step, &pending, &[], None, now).evacuating);
        assert!(!stepped(&EvictionStatus::default(), &step, &pending, &[], None, now).evacuating);
        // Fenced and showing life: nothing new starts, what was said stands.
        let lives = FenceState::ShowsLife("shows life".into());
        assert!(lives.holds() && stepped(&fenced, &step, &lives, &[], None, now).evacuating);
    }

    #[test]
    fn a_fenced_host_that_shows_life_holds_its_evacuation() {
        use crate::api::hypervisor::FenceRevival;
        let evacuation = || Evacuation {
            by_default: true,
            rebuild_from_image: false,
            instance_disks_on_rbd: true,
            powered_off: true,
        };
        let t = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH));
        let under_way = FencingStatus { started: t.clone(), ..Default::default() };
        let fenced = FencingStatus { fenced: t.clone(), ..under_way.clone() };
        let revival = FenceRevival { seen: t, sign: "its BMC reads power on".into(), handled_confirm: None };
        let lives = FencingStatus { revival: Some(revival), ..fenced.clone() };
        assert_eq!(fence_state("n", None, evacuation), FenceState::None);
        assert!(matches!(fence_state("n", Some(&under_way), evacuation), FenceState::Pending(_)));
        assert_eq!(fence_state("n", Some(&fenced), evacuation), FenceState::Fenced(evacuation()));
        let state = fence_state("n", Some(&lives), evacuation);
        let c = state.condition().expect("said");
        assert_eq!((c.reason.as_str(), state.holds()), ("FencedHostShowsLife", true));
        assert!(c.message.contains("its BMC reads power on"), "{}", c.message);
    }

    fn vm(id: &str, state: VmState) -> VmStatus {
        VmStatus { id: id.into(), state, ..Default::default() }
    }

    #[test]
    fn a_look_comes_soon_only_after_an_end_beside_an_attempt_still_running() {
        use VmState::{Migrated, Migrating, Pending};
        let before = [vm("a", Migrating), vm("b", Migrating), vm("c", Pending)];
        // a ended, b still runs: its end is likely close.
        assert!(ended_beside_others(&before, &[vm("a", Migrated), vm("b", Migrating), vm("c", Pending)]));
        // a ended and its slot went to c; b still runs.
        assert!(ended_beside_others(&before, &[vm("a", Migrated), vm("b", Migrating), vm("c", Migrating)]));
        // Both ended together (c just started): nothing to expect soon.
        assert!(!ended_beside_others(&before, &[vm("a", Migrated), vm("b", Migrated), vm("c", Migrating)]));
        // Nothing ended.
        assert!(!ended_beside_others(&before, &before));
        // Nothing was running before this step.
        let idle = [vm("a", Pending), vm("b", Pending)];
        assert!(!ended_beside_others(&idle, &[vm("a", Migrating), vm("b", Migrating)]));
    }

    #[test]
    fn looks_are_a_second_apart_from_start_to_start_and_never_closer_than_half() {
        let ms = Duration::from_millis;
        let pauses: Vec<u128> =
            [0, 300, 500, 700, 2_000].map(|took| pause_after(ms(took)).as_millis()).to_vec();
        assert_eq!(pauses, [1_000, 700, 500, 500, 500]);
    }

    #[test]
    fn the_stall_clock_judges_recorded_counters_only_while_the_live_migration_runs() {
        let with = MigrationStatus { memory_processed_bytes: Some(1 << 20), ..Default::default() };
        let without = MigrationStatus::default();
        let running = NovaState::Running { live_running: true };
        assert!(counters_judged(&running, &with));
        assert!(!counters_judged(&running, &without), "Nova never reported counters");
        // Post-migrating: the counters no longer move, and an abort would be refused.
        assert!(!counters_judged(&NovaState::Running { live_running: false }, &with));
        assert!(!counters_judged(&NovaState::Queued, &with));
    }

    #[test]
    fn an_ended_evictions_progress_clocks_are_forgotten() {
        let paced = Paced::default();
        for key in ["ev-vm-a-1", "ev-vm-b-2", "other-vm-a-1"] {
            paced.done(key);
        }
        paced.forget_eviction("ev");
        let every = Duration::from_secs(5);
        assert!(paced.due("ev-vm-a-1", every) && paced.due("ev-vm-b-2", every));
        assert!(!paced.due("other-vm-a-1", every), "another eviction's stays");
    }

    #[test]
    fn a_paced_thing_is_due_once_its_interval_passed_and_afresh_once_forgotten() {
        let paced = Paced::default();
        let every = Duration::from_secs(5);
        assert!(paced.due("ev-vm-a-1", every), "never done: due");
        paced.done("ev-vm-a-1");
        assert!(!paced.due("ev-vm-a-1", every), "done a moment ago");
        assert!(paced.due("ev-vm-b-1", every), "another has its own clock");
        assert!(paced.due("ev-vm-a-1", Duration::ZERO), "an interval already over");
        paced.forget("ev-vm-a-1");
        assert!(paced.due("ev-vm-a-1", every), "forgotten: due");
    }
}
