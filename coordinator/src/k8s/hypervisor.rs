//! The Hypervisor controller: the imperative shell around
//! [`lifecycle::decide`](crate::lifecycle::decide). One reconcile reads as
//! observe (Node, agent, Nova, Eviction, retry annotation) → decide → act
//! (each action idempotent) → write (status by server-side apply over the
//! version read) → tell (Events, the fleet stream, gRPC health).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use hv_proto::v1 as pb;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::status::compose;
use super::{Gate, write};
use crate::api::condition::{ConditionType, merge};
use crate::api::eviction::EvictionOptions;
use crate::api::hypervisor::{HealthState, HealthStatus};
use crate::api::keys::{HYPERVISOR_FINALIZER, PAUSED_ANNOTATION, RETRY_ANNOTATION};
use crate::api::{Eviction, EvictionSpec, Hypervisor, HypervisorStatus, Phase};
use crate::fence::record::{self, FenceOutcome};
use crate::fleet::fleet_service::to_proto;
use crate::fleet::{Health, Registry};
use crate::health::AgentView;
use crate::health::{self, HealthPolicy, NodeSource};
use crate::lifecycle::hands::{self, Hands, Would};
use crate::lifecycle::{
    self, Action, AgentObs, Decision, EvictionObs, Input, NodeObs, NovaObs, Observations, Policy, PowerObs,
};
use crate::nova::Nova;
use crate::nova::view::{FleetView, may_share};

/// Field manager of every write this controller makes.
pub const FIELD_MANAGER: &str = "hv-coordinator";

/// Longest a reconcile waits in its turn for the caches to be whole before
/// it is asked again.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// How often a node is looked at again without a trigger.
#[derive(Clone, Debug)]
pub struct Intervals {
    /// Phases where something is under way (Onboarding, Testing, Ready, Evicting).
    pub busy: Duration,
    /// Active, Maintenance and Decommissioned: the drift check.
    pub drift: Duration,
    /// After a failed action or an unreachable Nova.
    pub retry: Duration,
}

impl Default for Intervals {
    fn default() -> Self {
        Intervals {
            busy: Duration::from_secs(5),
            drift: Duration::from_secs(60),
            retry: Duration::from_secs(10),
        }
    }
}

pub struct Context {
    pub client: kube::Client,
    pub nova: Arc<dyn Nova>,
    /// The hosts this leader found free for drains on their own read: the
    /// drain marks free only those.
    pub own_reads: Arc<super::drain_marks::OwnReads>,
    /// When this leader saw each kubelet's Lease renewed.
    pub renewals: super::kubelet::Renewals,
    /// The Nova hosts this leader gave lately (one host, one Hypervisor).
    pub nova_hosts: super::nova_hosts::NovaHosts,
    /// Nova's view of the whole fleet, shared by every reconcile of a
    /// settled host (docs/nova.md, "The fleet view").
    pub nova_view: Arc<FleetView>,
    pub registry: Arc<Registry>,
    pub health: Health,
    pub recorder: Recorder,
    pub hypervisors: Store<Hypervisor>,
    pub nodes: Store<Node>,
    pub evictions: Store<Eviction>,
    pub gate: Arc<Gate>,
    pub policy: Policy,
    pub health_policy: HealthPolicy,
    /// Hosts put into `ha` maintenance for health, and how many may be.
    pub ha: super::ha::HaClaims,
    /// What fencing a Failed host may use, and its limits.
    pub fencing: super::fence::FenceContext,
    /// Hosts are judged from this time on: a new leader starts with no
    /// session and no signal, and the agents need a moment to come back.
    pub judging_from: Timestamp,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub intervals: Intervals,
    pub events: tokio::sync::broadcast::Sender<pb::HypervisorEvent>,
    /// Our own status writes, for reconciles the cache has not caught up with.
    pub written: super::written::Written<Hypervisor>,
    /// The dependents whose lock the host's Node carries while its VMs need
    /// them (docs/drain.md).
    pub node_locks: Vec<String>,
    /// The pods a drain must not take while the host needs them, cached:
    /// they carry `crate::api::keys::POD_EVICTABLE_LABEL` as their host's marks say
    /// (docs/drain.md).
    pub pods: crate::k8s::protected_pods::ProtectedPods,
    /// The hosts' dependency pods (`--node-dependency`).
    pub dependencies: crate::k8s::dependencies::NodeDependencies,
    /// How many hosts updates may hold at once (docs/drain.md).
    pub updates: Arc<super::updates::UpdateLimit>,
    /// What the drain guards are made of; None: the install keeps none
    /// (docs/drain.md).
    pub guard: Option<crate::drain::guard::GuardConfig>,
    /// Evictions to reconcile now: one waiting for its host to stop taking
    /// VMs is told as soon as this reconcile has disabled it.
    pub evictions_to_wake: tokio::sync::mpsc::UnboundedSender<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Hypervisor has no name")]
    Unnamed,
}

impl super::measured::ErrorKind for Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(e) => super::measured::kube_error_kind(e),
            Error::Unnamed => "unnamed",
        }
    }
}

/// What one reconcile saw, beside the core's observations.
struct Seen {
    obs: Observations,
    agent: AgentView,
    /// The Nova host the observations are of.
    host: String,
    /// The Node's `Ready` condition, for the health model.
    node_ready: NodeSource,
    /// The kubelet's Lease (read only while the agent's stream is gone and
    /// the host is judged).
    lease: Option<health::Heartbeat>,
    /// The marks on the Node (None: no Node).
    marks: Option<health::marks::Marks>,
    /// When the Node's deletion began (None: not being deleted, or gone).
    node_deleted: Option<Timestamp>,
    /// The host's power as its BMC reports it (read only while the agent's
    /// stream is gone and the host is judged).
    power: health::PowerSource,
    /// The host has a BMC (`spec.fencing.bmc`).
    bmc: bool,
    /// Nova's view of the host is the shared fleet view, read before this
    /// reconcile, not now: it only confirms.
    shared: bool,
    /// A new leader settles: no host is judged (sampled once per reconcile,
    /// so that sharing the view and the verdict agree on it).
    settling: bool,
}

pub async fn reconcile(hv: Arc<Hypervisor>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let hv = ctx.written.freshest(hv);
    if !ctx.gate.open() {
        ctx.gate.until_synced(GATE_WAIT).await;
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let name = hv.metadata.name.clone().ok_or(Error::Unnamed)?;
    let deleting = hv.metadata.deletion_timestamp.is_some();
    // An observing install holds no deletion: uninstalled, it leaves nothing stuck.
    let hv = if deleting || ctx.gate.observes() { hv } else { hold(&ctx, hv).await? };
    let status = hv.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let now = Timestamp::now();
    // Observe, and judge the host's health.
    let (mut seen, verdict) = look(&ctx, &hv, &name, &status, now).await?;
    let deletion =
        deleting.then(|| lifecycle::deletion::may_go(phase, status.service_id.as_deref(), &seen.obs.nova));
    if let Some(Ok(())) = deletion {
        tracing::info!("Hypervisor deleted; nothing in Nova depends on its host");
        write::finalizer(&api(&ctx), hv.as_ref(), HYPERVISOR_FINALIZER, false).await?;
        return Ok(Requeue::await_change());
    }
    if let hands @ (Hands::Paused(_) | Hands::Observing) = hands_of(&ctx, &hv) {
        let held = (&hands, deletion.as_ref());
        return hands_off(&ctx, hv, (&name, &status), (&seen, &verdict), held, now).await;
    }
    let hv = if deleting {
        hv
    } else {
        let terminating = seen.obs.node == NodeObs::Deleting;
        super::ha::respond(&ctx, hv, &name, phase, terminating, seen.obs.health.as_ref()).await?
    };
    // Fencing, its own step before the lifecycle's.
    let fenced = fence(&ctx, &hv, &seen, &verdict, now).await;
    if let Some(again) = record::goes_first(status.fencing.as_ref(), verdict.state(), &fenced) {
        fencing_first(&ctx, &hv, &name, &status, &verdict, &fenced, now).await?;
        return Ok(Requeue::requeue(again));
    }
    // Decide, act, write.
    let (hv, status, decision) = decided(&ctx, hv, &name, &status, &mut seen.obs, now).await?;
    let outcome = act(&ctx, &hv, &name, &seen.host, &decision).await;
    let mut new_status =
        composed(&status, &decision, &seen, &verdict, outcome.service_deleted, hv.metadata.generation, now);
    let also = said_beside(&ctx, &name, &status, &mut new_status, deletion.as_ref(), now);
    new_status.conditions = merge(&new_status.conditions, &also, now, hv.metadata.generation);
    record::apply(&mut new_status, &fenced, now, hv.metadata.generation);
    let hv = write_judged(&ctx, hv, &name, &status, &new_status, seen.shared).await?;
    // Tell, and what follows from what was written.
    tell(&ctx, &hv, &name, &decision, &new_status, &outcome.failures, &seen).await;
    super::fence::tell(&ctx, &hv, &fenced).await;
    tell_news(&ctx, &hv, &status, &new_status, verdict.judged).await;
    mark_node(&ctx, &name, &seen, &new_status).await;
    let service_id = new_status.service_id.as_deref();
    if let Some(keep) = super::nodes::release(seen.obs.node, decision.phase, service_id, &seen.obs.nova) {
        super::nodes::let_go(&ctx.client, &name, keep).await?;
    }
    super::fence::evacuate(&ctx, &hv, seen.evicting()).await?;
    let failed = !outcome.failures.is_empty();
    Ok(Requeue::requeue(next_look(&ctx.intervals, &decision, &seen.obs.nova, failed, &verdict, &fenced)))
}

/// What the reconcile sees of the host, and its health verdict as of
/// `now`, taken before the reads: the agent's session is sampled then too,
/// so a slow read (the whole fleet's) does not age its heartbeat. The fleet
/// view only confirms: what it would change is decided on the host's own
/// reads, read now.
async fn look(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    status: &HypervisorStatus,
    now: Timestamp,
) -> Result<(Seen, Verdict), Error> {
    let phase = status.phase.unwrap_or_default();
    let mut seen = observe(ctx, hv, name, status).await?;
    let mut verdict = judge_health(ctx, &seen, status.health.as_ref(), (phase, status.power_state), now);
    seen.obs.health = health_obs(ctx, name, &verdict);
    if seen.shared && !view_confirms(ctx, hv, name, status, &seen, &verdict, now) {
        seen.obs.nova = ctx.nova_view.fresh(ctx.nova.as_ref(), &seen.host, &hv.spec.aggregates).await;
        seen.shared = false;
        verdict = judge_health(ctx, &seen, status.health.as_ref(), (phase, status.power_state), now);
        seen.obs.health = health_obs(ctx, name, &verdict);
    }
    Ok((seen, verdict))
}

/// The lifecycle's decision, with what must be recorded before its actions
/// run written first: the Nova host it claims ([`claimed_first`]), the
/// reason of a disable it sends, the traits it adds. Answers the Hypervisor and its status as
/// they now are.
async fn decided(
    ctx: &Context,
    hv: Arc<Hypervisor>,
    name: &str,
    status: &HypervisorStatus,
    obs: &mut Observations,
    now: Timestamp,
) -> Result<(Arc<Hypervisor>, HypervisorStatus, Decision), Error> {
    let (hv, status, decision) = claimed_first(ctx, hv, name, status, obs, now).await?;
    let disables = decision.actions.iter().any(|a| matches!(a, Action::DisableService { .. }));
    let new_disable = disables && decision.record.disabled_as != status.lifecycle.disabled_as;
    // A place taken among those held for updates: recorded before the host
    // leaves service, so a new leader counts it.
    let new_place = decision.record.update_place.is_some() && status.lifecycle.update_place.is_none();
    // Traits we add are ours once recorded: one sent first and never
    // recorded would be taken for someone else's, and stay.
    let adds = decision.actions.iter().any(|a| matches!(a, Action::AddTraits { .. }));
    let new_traits = adds && decision.record.applied_traits != status.lifecycle.applied_traits;
    // A power change is asked once: the state it leads to is recorded
    // first, so a write that fails asks nothing and a new leader waits for
    // it instead of asking again. The Node is marked before a power off.
    let powers = decision.actions.iter().any(|a| matches!(a, Action::PowerOff | Action::PowerOn));
    if decision.actions.contains(&Action::PowerOff) {
        mark_powered_down(ctx, name).await?;
    }
    if !new_disable && !new_place && !new_traits && !powers {
        return Ok((hv, status, decision));
    }
    // A disable of ours is recorded before it is sent: a write that fails
    // sends nothing.
    let mut recorded = status.clone();
    recorded.lifecycle.disabled_as.clone_from(&decision.record.disabled_as);
    recorded.lifecycle.update_place.clone_from(&decision.record.update_place);
    recorded.lifecycle.applied_traits.clone_from(&decision.record.applied_traits);
    if powers {
        recorded.power_state = decision.power_state;
        recorded.lifecycle.power.clone_from(&decision.record.power);
    }
    let hv = write_status(ctx, hv, name, &status, &recorded).await?;
    Ok((hv, recorded, decision))
}

/// The decision. A Hypervisor that first records its Nova host claims it
/// first ([`NovaHosts`](super::nova_hosts::NovaHosts)), and the record is
/// written before anything is written to Nova for it; when another holds
/// the host, the decision is made again knowing it (it then changes
/// nothing).
async fn claimed_first(
    ctx: &Context,
    hv: Arc<Hypervisor>,
    name: &str,
    status: &HypervisorStatus,
    obs: &mut Observations,
    now: Timestamp,
) -> Result<(Arc<Hypervisor>, HypervisorStatus, Decision), Error> {
    let spec = hv.spec.clone();
    let decide = |obs: &Observations| {
        lifecycle::decide(&Input { name, spec: &spec, status, obs, policy: &ctx.policy, now })
    };
    let decision = decide(obs);
    let Some(host) = decision.record.nova_host.clone().filter(|_| status.lifecycle.nova_host.is_none())
    else {
        return Ok((hv, status.clone(), decision));
    };
    if let Err(holder) = ctx.nova_hosts.claim(&ctx.hypervisors, name, &host) {
        tracing::warn!(nova_host = %host, holder = %holder, "the Nova host is held by another Hypervisor");
        obs.claimed_by = Some(holder);
        obs.nova = NovaObs::NotRegistered;
        return Ok((hv, status.clone(), decide(obs)));
    }
    let mut claimed = status.clone();
    claimed.lifecycle.nova_host = Some(host.clone());
    match write_status(ctx, hv, name, status, &claimed).await {
        Ok(hv) => {
            tracing::info!(nova_host = %host, "Nova host claimed");
            Ok((hv, claimed, decision))
        }
        Err(e) => {
            // Only a write surely refused gives the claim up: one whose
            // answer was lost may have landed.
            if let Error::Kube(kube::Error::Api(a)) = &e
                && matches!(a.code, 409 | 422)
            {
                ctx.nova_hosts.forget(&host, name);
            }
            Err(e)
        }
    }
}

/// Whether the coordinator may act on this host: the install's mode, and
/// an SRE's pause on the Hypervisor.
fn hands_of(ctx: &Context, hv: &Hypervisor) -> Hands {
    Hands::of(ctx.gate.observes(), hv.annotations().get(PAUSED_ANNOTATION).map(String::as_str))
}

/// The conditions the reconcile says beside the lifecycle's: why a
/// deletion is held, and a pause lifted (a host never paused carries no
/// `Paused` condition). Pure.
fn also_said(
    status: &HypervisorStatus,
    deletion: Option<&Result<(), String>>,
) -> Vec<lifecycle::DesiredCondition> {
    let paused = status.conditions.iter().any(|c| c.type_ == ConditionType::Paused.as_str());
    let resumed = paused.then(|| Hands::Free.condition(&[]));
    deletion.map(lifecycle::deletion::condition).into_iter().chain(resumed).collect()
}

/// The conditions said beside the lifecycle's ([`also_said`]), and how
/// long an update tool that will not wait for ever leaves the host, read
/// from the cached Node ([`update_drain`]).
fn said_beside(
    ctx: &Context,
    name: &str,
    before: &HypervisorStatus,
    next: &mut HypervisorStatus,
    deletion: Option<&Result<(), String>>,
    now: Timestamp,
) -> Vec<lifecycle::DesiredCondition> {
    // A tool's drain whose condition bears no time began when first seen.
    let unknown_since = before.update_drain.as_ref().map_or(now, |d| d.since.0);
    let node = ctx.nodes.get(&ObjectRef::new(name));
    let drain = node.and_then(|n| crate::drain::deadline::of(&n, &ctx.updates.signals, unknown_since));
    let drain = update_drain(before, next, drain.as_ref(), now);
    also_said(before, deletion).into_iter().chain(drain).collect()
}

/// How long an update tool that will not wait for ever leaves the host
/// (docs/drain.md, "When a tool will not wait"): recorded in `next` for the
/// fleet's figures, and said in the `UpdateDrain` condition, answered.
/// Pure.
fn update_drain(
    before: &HypervisorStatus,
    next: &mut HypervisorStatus,
    drain: Option<&crate::drain::deadline::ToolDrain>,
    now: Timestamp,
) -> Option<lifecycle::DesiredCondition> {
    use crate::drain::deadline;
    let emptied = next.evictable == Some(true);
    let stage = drain.map(|d| deadline::stage(d, emptied, now));
    next.update_drain = drain.map(|d| crate::api::hypervisor::UpdateDrainStatus {
        tool: d.tool.to_string(),
        since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(d.since),
        stops_waiting_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(d.stops_waiting_at()),
    });
    let said = before.conditions.iter().any(|c| c.type_ == ConditionType::UpdateDrain.as_str());
    deadline::condition(drain, stage.as_ref(), next.instances.as_ref().map(|i| i.count), said)
}

/// What a look changed that is told beside the lifecycle's Events: the
/// host's health, and an update tool's time running short.
async fn tell_news(
    ctx: &Context,
    hv: &Hypervisor,
    before: &HypervisorStatus,
    after: &HypervisorStatus,
    judged: bool,
) {
    tell_health(ctx, hv, before.health.as_ref(), after, judged).await;
    tell_drain(ctx, hv, before, after).await;
}

/// A Warning Event when the update tool's time nears its end, or has run
/// out, told once: when the `UpdateDrain` condition's reason turns to it.
async fn tell_drain(ctx: &Context, hv: &Hypervisor, before: &HypervisorStatus, after: &HypervisorStatus) {
    use crate::drain::deadline::{FORCES, NEAR};
    let of = |s: &HypervisorStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ConditionType::UpdateDrain.as_str())
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (was, now) = (of(before).map(|c| c.0), of(after));
    if let Some((reason, message)) =
        now.filter(|(r, _)| (r == NEAR || r == FORCES) && was.as_deref() != Some(r.as_str()))
    {
        tracing::warn!(reason, %message, "an update tool will not wait for the host");
        publish(ctx, &hv.object_ref(&()), EventType::Warning, &reason, &message).await;
    }
}

/// A host whose hands are off (an SRE's pause, or observe mode;
/// docs/operations.md, "Hands off"): observed and judged as any other,
/// the lifecycle's and the fencing's decisions made on the same reads, and
/// only told: its verdict, the machine as its agent reports it, and what
/// would be done are written to its status (the `Paused` condition), each
/// new kind of thing it would do is an Event and counted. Nothing else is
/// written, and it is never fenced.
async fn hands_off(
    ctx: &Context,
    hv: Arc<Hypervisor>,
    (name, status): (&str, &HypervisorStatus),
    (seen, verdict): (&Seen, &Verdict),
    (hands, deletion): (&Hands, Option<&Result<(), String>>),
    now: Timestamp,
) -> Result<Requeue, Error> {
    let would = would_do(ctx, &hv, (name, status), (seen, verdict), now);
    let lines: Vec<String> = would.iter().map(|(_, line)| line.clone()).collect();
    let mut next = status.clone();
    next.machine = super::status::machine(status, &seen.agent);
    let mut held = vec![hands.condition(&lines)];
    // A deletion waits for the host as ever, and says why.
    held.extend(deletion.map(lifecycle::deletion::condition));
    if verdict.status.is_some() {
        next.health = verdict.status.clone();
        held.push(verdict.condition.clone());
    }
    next.conditions = merge(&next.conditions, &held, now, hv.metadata.generation);
    let hv = write_status(ctx, hv, name, status, &next).await?;
    tell_health(ctx, &hv, status.health.as_ref(), &next, verdict.judged).await;
    tell_would(ctx, &hv, status, &would).await;
    ctx.health.set_node(name, status.phase == Some(Phase::Active) && seen.agent.connected).await;
    let look = if verdict.status.is_some() { ctx.intervals.busy } else { ctx.intervals.drift };
    Ok(Requeue::requeue(verdict.recheck.map_or(look, |r| r.min(look))))
}

/// What a host whose hands are off would have done now, on this look's
/// reads: the `ha` maintenance its verdict asks, what an SRE asked of its
/// fence or the fencing decides, and the lifecycle's actions.
fn would_do(
    ctx: &Context,
    hv: &Hypervisor,
    (name, status): (&str, &HypervisorStatus),
    (seen, verdict): (&Seen, &Verdict),
    now: Timestamp,
) -> Vec<(Would, String)> {
    let phase = status.phase.unwrap_or_default();
    let terminating = seen.obs.node == NodeObs::Deleting;
    let maintain = super::ha::would(ctx, hv, phase, terminating, seen.obs.health.as_ref());
    let maintain = maintain.map(|why| (Would::Maintain, format!("put the host into ha maintenance ({why})")));
    let fence = super::fence::would(ctx, hv, &fence_observed(seen, verdict), now);
    let input = Input { name, spec: &hv.spec, status, obs: &seen.obs, policy: &ctx.policy, now };
    let actions = lifecycle::decide(&input).actions.into_iter().map(|a| (Would::of(&a), a.to_string()));
    maintain.into_iter().chain(fence).chain(actions).map(|(kind, line)| (kind, hands::item(&line))).collect()
}

/// Each thing a host whose hands are off would do, told once: an Event and
/// a count when the `Paused` condition did not say it already.
async fn tell_would(ctx: &Context, hv: &Hypervisor, before: &HypervisorStatus, would: &[(Would, String)]) {
    let paused = ConditionType::Paused.as_str();
    let said = before.conditions.iter().find(|c| c.type_ == paused && c.status == "True");
    let told = said.map(|c| hands::told(&c.message)).unwrap_or_default();
    let reference = hv.object_ref(&());
    for (kind, line) in would {
        if told.contains(&line.as_str()) {
            continue;
        }
        tracing::info!(would = kind.reason(), what = %line, "hands off: not done");
        ctx.metrics.would(kind.reason());
        publish(ctx, &reference, EventType::Normal, kind.reason(), &format!("not done, hands off: {line}"))
            .await;
    }
}

/// The fencing's step (docs/fencing.md), taken before the lifecycle acts:
/// once Nova holds a dead host forced down it no longer waits on the
/// host's nova-compute to answer a change of its enabled status (up to its
/// RPC timeout, a minute).
async fn fence(
    ctx: &Context,
    hv: &Hypervisor,
    seen: &Seen,
    verdict: &Verdict,
    now: Timestamp,
) -> FenceOutcome {
    // Never the Nova host another Hypervisor holds.
    if seen.obs.claimed_by.is_some() {
        return FenceOutcome::default();
    }
    super::fence::run(ctx, hv, &seen.host, fence_observed(seen, verdict), now).await
}

/// What the fencing reads of this reconcile's look.
fn fence_observed<'a>(seen: &'a Seen, verdict: &Verdict) -> super::fence::Observed<'a> {
    super::fence::Observed {
        health: verdict.state(),
        blind: (!verdict.judged).then(|| verdict.condition.message.clone()),
        kubelet_alive: verdict.kubelet_alive,
        evicting: seen.evicting(),
        servers_left: matches!(&seen.obs.nova, NovaObs::Registered(h) if !h.instances.is_empty()),
        power: seen.power,
        node_deleted: seen.node_deleted,
    }
}

/// A fencing that starts, or that only waits for the dead host's last
/// heartbeat to age ([`record::goes_first`]): its record is written on its
/// own, the verdict with it (a Failed host says so at once), and the
/// lifecycle does not act yet.
async fn fencing_first(
    ctx: &Context,
    hv: &Arc<Hypervisor>,
    name: &str,
    status: &HypervisorStatus,
    verdict: &Verdict,
    fenced: &FenceOutcome,
    now: Timestamp,
) -> Result<(), Error> {
    let mut early = status.clone();
    if verdict.status.is_some() {
        early.health = verdict.status.clone();
        let judged = std::slice::from_ref(&verdict.condition);
        early.conditions = merge(&early.conditions, judged, now, hv.metadata.generation);
    }
    record::apply(&mut early, fenced, now, hv.metadata.generation);
    write_status(ctx, hv.clone(), name, status, &early).await?;
    tell_health(ctx, hv, status.health.as_ref(), &early, verdict.judged).await;
    super::fence::tell(ctx, hv, fenced).await;
    Ok(())
}

/// The status the reconcile judged, written ([`write_status`]) once what
/// the host's own read (not `shared`, the fleet view's) says of freeing it
/// for drains is noted for the drain marks
/// ([`OwnReads`](super::drain_marks::OwnReads)); locking it may rest on
/// the view.
async fn write_judged(
    ctx: &Context,
    hv: Arc<Hypervisor>,
    name: &str,
    before: &HypervisorStatus,
    after: &HypervisorStatus,
    shared: bool,
) -> Result<Arc<Hypervisor>, Error> {
    if !shared || after.evictable != Some(true) {
        ctx.own_reads.record(name, after.evictable);
    }
    write_status(ctx, hv, name, before, after).await
}

/// The status written over the version read, with its summary `Ready`
/// condition, when it changed (every write wakes the drain marks, and
/// costs the API server); answers the Hypervisor as it now is.
async fn write_status(
    ctx: &Context,
    hv: Arc<Hypervisor>,
    name: &str,
    before: &HypervisorStatus,
    after: &HypervisorStatus,
) -> Result<Arc<Hypervisor>, Error> {
    let mut after = after.clone();
    let summary = crate::api::ready::host_conditions(&after);
    after.conditions = merge(&after.conditions, &summary, Timestamp::now(), hv.metadata.generation);
    if after == *before {
        return Ok(hv);
    }
    let written = write::status(&api(ctx), name, hv.metadata.resource_version.as_deref(), &after).await?;
    ctx.written.remember(hv.metadata.resource_version.clone(), written.clone());
    Ok(Arc::new(written))
}

/// The verdict as the lifecycle acts on it (None when not judged now).
fn health_obs(ctx: &Context, name: &str, verdict: &Verdict) -> Option<lifecycle::HealthObs> {
    verdict.status.as_ref().filter(|_| verdict.judged).map(|h| {
        let mut v = health::observe::lifecycle_view(h, verdict.empties);
        v.hold_back = super::ha::unseen_hold_back(ctx, name, &v);
        v
    })
}

/// The status the lifecycle's decision and the health verdict make of the
/// stored one, with whether the host may lose its dependents
/// ([`drain::locks::evictable`](crate::drain::locks::evictable)), from the
/// same reads. `service_deleted`: Nova answered our delete of the service.
/// Pure.
fn composed(
    status: &HypervisorStatus,
    decision: &Decision,
    seen: &Seen,
    verdict: &Verdict,
    service_deleted: bool,
    generation: Option<i64>,
    now: Timestamp,
) -> HypervisorStatus {
    let mut new_status = compose(status, decision, &seen.agent, &seen.obs.nova, generation, now);
    // The record says "deleted" only once Nova answered the delete.
    new_status.lifecycle.service_deleted |= service_deleted;
    new_status.health = verdict.status.clone();
    let healthy = [verdict.condition.clone()];
    new_status.conditions = merge(&new_status.conditions, &healthy, now, generation);
    let service_gone = new_status.service_id.is_none() || new_status.lifecycle.service_deleted;
    let vms = crate::drain::locks::vm_count(&seen.obs.nova, service_gone);
    new_status.evictable = crate::drain::locks::evictable(decision.phase, vms);
    new_status
}

/// Whether the fleet view leaves the host as it stands: the lifecycle
/// decides no action, no transition and no warning on it, and the status
/// stays the same (docs/nova.md, "The fleet view"); a host freed for
/// drains (`status.evictable` turning true) is a change of its status, so
/// it rests on the host's own reads. Pure over what was seen.
fn view_confirms(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    status: &HypervisorStatus,
    seen: &Seen,
    verdict: &Verdict,
    now: Timestamp,
) -> bool {
    let input = Input { name, spec: &hv.spec, status, obs: &seen.obs, policy: &ctx.policy, now };
    let decision = lifecycle::decide(&input);
    let next = composed(status, &decision, seen, verdict, false, hv.metadata.generation, now);
    let unconfirmed = if !decision.actions.is_empty() {
        Some("an action")
    } else if decision.transition.is_some() {
        Some("a transition")
    } else if !decision.warnings.is_empty() {
        Some("a warning")
    } else if !same_but_words_not_from_nova(next.clone(), status) {
        Some("a status change")
    } else if next.evictable == Some(true) && !ctx.own_reads.free(name) {
        Some("its freeing for drains, not yet read by this leader")
    } else {
        None
    };
    if let Some(why) = unconfirmed {
        tracing::debug!(why, "the fleet view does not confirm the host; reading it");
    }
    unconfirmed.is_none()
}

/// Whether `next` differs from `status` only in what rests on no read of
/// Nova: what the agent's session says (its connection and the
/// `AgentConnected` condition, the machine and versions it reports), the
/// wording of an unchanged health verdict (`NodeHealthy` with the same
/// status and reason: "not judged while the agents reconnect" after a
/// failover), and our own change of the service's status done
/// (`SchedulingEnabled` from `Disabling` to `Disabled`, or `Enabling` to
/// `Enabled`, same message: the snapshot read after Nova accepted it), and
/// `status.evictable` unless it turns true (locking the host for drains
/// may rest on the view; freeing it may not). So agents reconnecting
/// (thousands at once after a failover) cost Nova nothing. A changed
/// verdict, or an eviction's end, is none of these: it is decided on the
/// host's own fresh reads.
fn same_but_words_not_from_nova(mut next: HypervisorStatus, status: &HypervisorStatus) -> bool {
    next.agent.clone_from(&status.agent);
    next.machine.clone_from(&status.machine);
    next.libvirt_version.clone_from(&status.libvirt_version);
    next.hypervisor_version.clone_from(&status.hypervisor_version);
    // Only freeing the host for drains rests on its own read; locking it
    // (or a value not recorded yet, as after an upgrade) may rest on the view.
    if next.evictable != Some(true) || status.evictable == Some(true) {
        next.evictable = status.evictable;
    }
    for c in &mut next.conditions {
        let Some(old) = status.conditions.iter().find(|o| o.type_ == c.type_) else { continue };
        let agents = c.type_ == ConditionType::AgentConnected.as_str();
        let same = c.status == old.status && c.reason == old.reason;
        let worded = same && c.type_ == ConditionType::NodeHealthy.as_str();
        let answered = c.type_ == ConditionType::SchedulingEnabled.as_str()
            && c.status == old.status
            && c.message == old.message
            && matches!(
                (old.reason.as_str(), c.reason.as_str()),
                ("Disabling", "Disabled") | ("Enabling", "Enabled")
            );
        if agents || worded || answered {
            c.clone_from(old);
        }
    }
    next == *status
}

/// A change of a judged verdict: logged, counted and an Event.
async fn tell_health(
    ctx: &Context,
    hv: &Hypervisor,
    before: Option<&HealthStatus>,
    written: &HypervisorStatus,
    judged: bool,
) {
    if let (Some(now_health), true) = (&written.health, judged)
        && let Some((warning, reason, note)) = health::observe::change(before, now_health)
    {
        tracing::info!(health = %now_health.state, evidence = ?now_health.evidence, "health changed");
        ctx.metrics.health_changed(now_health.state);
        let kind = if warning { EventType::Warning } else { EventType::Normal };
        publish(ctx, &hv.object_ref(&()), kind, &reason, &note).await;
        let mut updated = hv.clone();
        updated.status = Some(written.clone());
        let _ = ctx.events.send(pb::HypervisorEvent {
            hypervisor: Some(to_proto(&updated, &ctx.registry)),
            kind: "health".into(),
            previous_health: before.map(|h| h.state.to_string()).unwrap_or_default(),
            ..Default::default()
        });
    }
}

/// Our finalizer on the Hypervisor, so that its deletion waits for its host
/// ([`lifecycle::deletion`]); answers the object as it now is.
async fn hold(ctx: &Context, hv: Arc<Hypervisor>) -> Result<Arc<Hypervisor>, Error> {
    Ok(match write::finalizer(&api(ctx), hv.as_ref(), HYPERVISOR_FINALIZER, true).await? {
        Some(updated) => Arc::new(updated),
        None => hv,
    })
}

pub fn error_policy(hv: Arc<Hypervisor>, error: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(node = %hv.name_any(), error = %error, "reconcile failed");
    match error {
        // Someone wrote since we read (or a newer leader did): look again now.
        Error::Kube(kube::Error::Api(e)) if e.code == 409 => Requeue::requeue(Duration::from_millis(200)),
        _ => Requeue::requeue(ctx.intervals.retry),
    }
}

fn api(ctx: &Context) -> Api<Hypervisor> {
    Api::all(ctx.client.clone())
}

async fn observe(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    status: &HypervisorStatus,
) -> Result<Seen, Error> {
    let phase = status.phase.unwrap_or_default();
    let settling = Timestamp::now() < ctx.judging_from;
    let (node, node_ready, marks, node_deleted) = observe_node(ctx, name).await?;
    let agent = ctx.registry.view(name);
    let host = lifecycle::nova_host(name, &hv.spec, status).to_string();
    let leaving = hv.metadata.deletion_timestamp.is_some() || node == NodeObs::Deleting;
    let eviction = observe_eviction(ctx, name, status).await?;
    let evicting = eviction.as_ref().is_some_and(|e| e.is_active());
    // While a new leader settles no host is judged: what Nova says of a
    // host whose agent has not reconnected yet weighs on no verdict.
    let connected = agent.connected || settling;
    let steady = !crate::power::read_alone(hv.spec.power_state, status.power_state)
        && may_share(phase, leaving, status.fencing.is_some(), health_of(status), connected, evicting);
    let (claimed_by, nova, shared) = observe_own_nova(ctx, hv, name, status, &host, steady).await;
    let close_hosts = match &nova {
        NovaObs::NotRegistered if phase == Phase::Onboarding => {
            let named = agent.machine.as_ref().and_then(|m| m.hostname.as_deref());
            observe_close_hosts(ctx, &host, named).await
        }
        _ => Vec::new(),
    };
    let in_service_as = lifecycle::service_phase(status, &nova);
    let obs = Observations {
        node,
        agent: AgentObs { connected: agent.connected, domains: agent.domains, since: agent.since },
        // Only a report of this Hypervisor's own runs: one created anew
        // under the same name starts again at run 1.
        checks: agent
            .checks
            .clone()
            .filter(|_| Some(agent.checks_hypervisor.as_str()) == hv.meta().uid.as_deref()),
        nova,
        eviction,
        retry: hv.annotations().get(RETRY_ANNOTATION).cloned(),
        close_hosts,
        // Judged after observing, with the phase read.
        health: None,
        // A host whose hands are off takes no place among those held for updates.
        update_wait: ctx.updates.wait(name, in_service_as, &hv.spec, node, hands_of(ctx, hv).free()),
        claimed_by,
        machine_hostname: machine_hostname(&agent, status),
        host_traits: host_capability_traits(&agent, status),
        dependencies: ctx.dependencies.unmet_on(name),
        power: PowerObs { bmc: hv.spec.fencing.bmc.is_some(), reading: super::power::reading(ctx, hv).await },
    };
    // Not while a new leader settles: no agent is connected yet, and no
    // host is judged then anyway.
    let lost = crate::lifecycle::judged(phase, status.power_state) && !agent.connected && !settling;
    let (power, lease) = lost_sources(ctx, hv, name, lost).await;
    let bmc = hv.spec.fencing.bmc.is_some();
    Ok(Seen { obs, agent, host, node_ready, lease, marks, node_deleted, power, bmc, shared, settling })
}

/// What tells a host whose agent is gone from a dead one, read only when
/// it is `lost`: its BMC's power and its kubelet's Lease.
async fn lost_sources(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    lost: bool,
) -> (health::PowerSource, Option<health::Heartbeat>) {
    if !lost {
        return (health::PowerSource::Unknown, None);
    }
    let power = super::fence::power_source(ctx, hv).await;
    (power, ctx.renewals.heartbeat(&ctx.client, name, Timestamp::now()).await)
}

/// The host name of the node's machine: a connected agent speaks for its
/// machine itself; a gone one by what it last said.
fn machine_hostname(agent: &AgentView, status: &HypervisorStatus) -> Option<String> {
    if agent.connected { agent.machine.as_ref() } else { status.machine.as_ref() }
        .and_then(|m| m.hostname.clone())
}

/// The traits the host's capabilities give, as this session's report says,
/// else as the last one recorded; None when none was ever reported.
fn host_capability_traits(agent: &AgentView, status: &HypervisorStatus) -> Option<BTreeSet<String>> {
    let reports = [agent.machine.as_ref(), status.machine.as_ref()];
    let capabilities = reports.into_iter().flatten().find_map(|m| m.capabilities.as_ref())?;
    Some(capabilities.traits.as_ref()?.iter().cloned().collect())
}

impl Seen {
    /// The host's running Eviction, by name.
    fn evicting(&self) -> Option<&str> {
        self.obs.eviction.as_ref().filter(|e| e.is_running()).map(|e| e.name.as_str())
    }
}

/// Nova's view of the host: the fleet view's when it may stand for the
/// host (`shareable`, [`may_share`]) and has it, else the host's own read;
/// with whether it is the fleet view's.
/// The Hypervisor that holds this one's Nova host, if another does while
/// this one has recorded none: then the compute service there is none of
/// this one's, and is not read. Else the host as [`observe_nova`] reads it.
async fn observe_own_nova(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    status: &HypervisorStatus,
    host: &str,
    steady: bool,
) -> (Option<String>, NovaObs, bool) {
    let unrecorded = status.lifecycle.nova_host.is_none();
    match unrecorded.then(|| ctx.nova_hosts.holder(&ctx.hypervisors, name, host)).flatten() {
        Some(holder) => (Some(holder), NovaObs::NotRegistered, false),
        None => {
            let (nova, shared) = observe_nova(ctx, hv, host, steady).await;
            (None, nova, shared)
        }
    }
}

async fn observe_nova(ctx: &Context, hv: &Hypervisor, host: &str, shareable: bool) -> (NovaObs, bool) {
    if shareable {
        let traits = host_traits(hv);
        let fleet = || fleet_traits(&ctx.hypervisors);
        let view = ctx.nova_view.host(ctx.nova.as_ref(), host, &hv.spec.aggregates, &traits, fleet).await;
        if let Some(nova) = view {
            return (nova, true);
        }
        tracing::debug!("the fleet view cannot stand for the host (read on its own since); reading it");
    } else {
        tracing::debug!("the host is not steady; reading it on its own");
    }
    (ctx.nova_view.fresh(ctx.nova.as_ref(), host, &hv.spec.aggregates).await, false)
}

fn health_of(status: &HypervisorStatus) -> Option<HealthState> {
    status.health.as_ref().map(|h| h.state)
}

/// The traits of a Hypervisor the lifecycle looks at: its spec's, its
/// capabilities' and
/// those recorded as applied.
fn host_traits(hv: &Hypervisor) -> BTreeSet<String> {
    let applied = hv.status.iter().flat_map(|s| s.lifecycle.applied_traits.iter());
    let capabilities = hv.status.iter().flat_map(|s| s.machine.iter().flat_map(|m| m.capabilities.iter()));
    let offered = capabilities.flat_map(|c| c.traits.iter().flatten());
    hv.spec.custom_traits.iter().chain(applied).chain(offered).cloned().collect()
}

/// Every custom trait the fleet's Hypervisors name, for a read of the fleet.
fn fleet_traits(hypervisors: &Store<Hypervisor>) -> BTreeSet<String> {
    hypervisors.state().iter().flat_map(|hv| host_traits(hv)).collect()
}

/// The host's health as one reconcile records it (docs/health.md).
struct Verdict {
    status: Option<HealthStatus>,
    condition: lifecycle::DesiredCondition,
    /// Judged now (not held, not outside the judged phases): a change is news.
    judged: bool,
    /// When to look again though nothing changes.
    recheck: Option<Duration>,
    /// Judged now, and its kubelet alive (docs/health.md).
    kubelet_alive: bool,
    /// Degraded by a signal that asks for the host to be emptied.
    empties: bool,
}

impl Verdict {
    /// The host's health as judged now (None: not judged).
    fn state(&self) -> Option<HealthState> {
        self.status.as_ref().map(|h| h.state)
    }
}

/// A host not judged (in maintenance, a fenced one among them) has no
/// Lease read: its Node reading Ready says its kubelet lives, which a
/// fencing under way and a retirement must not overlook (a host gone for
/// good has none).
fn unjudged_kubelet_alive(node: health::NodeSource) -> bool {
    node == health::NodeSource::Ready
}

/// Judged only where an agent belongs (a host in Onboarding, Maintenance or
/// Decommissioned may lack one, its Node may be down for its work); held
/// while the coordinator is blind, and in the first moments of a
/// leadership, while the agents reconnect and send again the signals that
/// hold (a host judged before its signals are back would flap).
fn judge_health(
    ctx: &Context,
    seen: &Seen,
    previous: Option<&HealthStatus>,
    (phase, power): (Phase, Option<crate::api::power::HostPower>),
    now: Timestamp,
) -> Verdict {
    if !crate::lifecycle::judged(phase, power) {
        let why = match power.filter(|p| !p.in_service()) {
            Some(p) => format!("not judged while its power is managed: {p}"),
            None => format!("judged in Testing, Ready, Active and Evicting; the host is {}", phase.as_str()),
        };
        return Verdict {
            status: None,
            condition: health::observe::not_judged(&why),
            judged: false,
            recheck: None,
            kubelet_alive: unjudged_kubelet_alive(seen.node_ready),
            empties: false,
        };
    }
    let (nova, mut own) = health::observe::nova_source(&seen.obs.nova);
    let settling =
        seen.settling.then(|| ctx.judging_from.duration_since(now).max(jiff::SignedDuration::from_millis(1)));
    if settling.is_some() {
        own = health::OwnView::Blind("took over moments ago; the agents are reconnecting".into());
    }
    let signals = with_dependencies(&seen.agent.signals, &seen.obs, phase, now);
    let sources = health::Sources {
        agent: health::observe::agent_source(&seen.agent),
        node: seen.node_ready,
        lease: seen.lease,
        nova,
        power: seen.power,
        signals: &signals,
    };
    let recheck = recheck_of(ctx, seen, &sources, settling, now);
    let a = health::assess(&sources, &own, previous, &ctx.health_policy, now);
    let kubelet_alive = a.held.is_none() && health::model::kubelet_alive(&sources, &ctx.health_policy, now);
    match (&a.held, previous) {
        (Some(why), None) => Verdict {
            status: None,
            condition: health::observe::not_judged(why),
            judged: false,
            recheck,
            kubelet_alive,
            empties: false,
        },
        _ => Verdict {
            status: Some(health::next_status(previous, &a, now)),
            condition: health::observe::condition(&a),
            judged: a.held.is_none(),
            recheck,
            kubelet_alive,
            empties: a.empties,
        },
    }
}

/// The agent's signals, and on an Active host one per dependency that
/// lacks a Ready pod there: critical (it Degrades the host) but not one
/// that empties it.
fn with_dependencies(
    agent: &[health::Signal],
    obs: &Observations,
    phase: Phase,
    now: Timestamp,
) -> Vec<health::Signal> {
    let unmet = obs.dependencies.iter().flatten().filter(|_| phase == Phase::Active);
    let dependency = unmet.map(|line| health::Signal {
        kind: "dependency-not-ready".into(),
        subject: String::new(),
        severity: health::signal::Severity::Critical,
        evidence: line.clone(),
        since: now,
        refreshed: now,
        empties: false,
    });
    agent.iter().cloned().chain(dependency).collect()
}

/// When to judge the host again though nothing changes: the verdict's
/// own clocks, the end of a new leader's settling, and a lost host with a
/// BMC soon (its power off makes it Failed at once, without the kubelet's
/// or Nova's grace).
fn recheck_of(
    ctx: &Context,
    seen: &Seen,
    sources: &health::Sources<'_>,
    settling: Option<jiff::SignedDuration>,
    now: Timestamp,
) -> Option<Duration> {
    let watch_power = (sources.agent != health::AgentSource::Connected
        && seen.power != health::PowerSource::Off
        && seen.bmc)
        .then(|| jiff::SignedDuration::from_secs(2));
    [health::model::recheck_in(sources, &ctx.health_policy, now), settling, watch_power]
        .into_iter()
        .flatten()
        .min()
        .and_then(|d| Duration::try_from(d).ok())
}

/// What executing a decision's actions came to.
#[derive(Default)]
struct Outcome {
    failures: Vec<String>,
    service_deleted: bool,
}

async fn act(ctx: &Context, hv: &Hypervisor, name: &str, host: &str, decision: &Decision) -> Outcome {
    let mut out = Outcome::default();
    let service_id = decision.service_id.as_deref();
    for action in &decision.actions {
        let result = execute(ctx, hv, name, host, service_id, action).await;
        match result {
            Ok(()) => {
                tracing::info!(action = %action, "done");
                out.service_deleted |= matches!(action, Action::DeleteService { .. });
                if matches!(action, Action::DisableService { .. }) {
                    wake_evictions_of(ctx, name);
                }
            }
            Err(e) => {
                tracing::warn!(action = %action, error = %e, "action failed");
                out.failures.push(format!("{action}: {e}"));
            }
        }
    }
    out
}

/// An Eviction moves nothing before its host stops taking new VMs, and
/// looks again only every second: told at once, its first migrations start
/// about a second sooner.
fn wake_evictions_of(ctx: &Context, name: &str) {
    for ev in ctx.evictions.state() {
        if ev.spec.hypervisor == name && ev.is_running() {
            let _ = ctx.evictions_to_wake.send(ev.name_any());
        }
    }
}

/// Events, the fleet stream and the node's gRPC health.
async fn tell(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    decision: &Decision,
    new_status: &HypervisorStatus,
    failures: &[String],
    seen: &Seen,
) {
    let reference = hv.object_ref(&());
    if let Some(why) = &seen.obs.update_wait {
        tracing::info!(%why, "an update asks for the host; it waits for a place");
        let note = format!("an update asks for the host; it stays in service until a place frees: {why}");
        publish(ctx, &reference, EventType::Normal, "UpdateWaits", &note).await;
    }
    if let Some(t) = &decision.transition {
        tracing::info!(from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "phase changed");
        let note = format!("{} -> {}: {}", t.from.as_str(), t.to.as_str(), t.reason);
        publish(ctx, &reference, EventType::Normal, t.to.as_str(), &note).await;
        let mut updated = hv.clone();
        updated.status = Some(new_status.clone());
        let ev = pb::HypervisorEvent {
            hypervisor: Some(to_proto(&updated, &ctx.registry)),
            previous_phase: t.from.as_str().to_string(),
            reason: t.reason.clone(),
            kind: "phase".into(),
            ..Default::default()
        };
        let _ = ctx.events.send(ev);
    }
    for w in &decision.warnings {
        tracing::warn!(reason = w.reason, message = %w.message, "warning");
        publish(ctx, &reference, EventType::Warning, w.reason, &w.message).await;
    }
    for failure in failures {
        publish(ctx, &reference, EventType::Warning, "ActionFailed", failure).await;
    }
    ctx.health.set_node(name, decision.phase == Phase::Active && seen.agent.connected).await;
}

/// When to look again: soon after a change, later while only drift
/// matters; sooner when the health verdict would change with no other
/// news (a Node's grace running out) or the fencing's next step is due.
fn next_look(
    i: &Intervals,
    d: &Decision,
    nova: &NovaObs,
    failed: bool,
    v: &Verdict,
    f: &FenceOutcome,
) -> Duration {
    let look = lifecycle_look(i, d, nova, failed);
    [Some(look), v.recheck, f.again].into_iter().flatten().min().unwrap_or(look)
}

fn lifecycle_look(i: &Intervals, d: &Decision, nova: &NovaObs, failed: bool) -> Duration {
    if d.transition.is_some() {
        Duration::from_millis(200)
    } else if failed || matches!(nova, NovaObs::Unreachable(_)) {
        i.retry
    } else if d.actions.iter().any(|a| !matches!(a, Action::RunChecks { .. })) {
        // Look at the result of what we just changed soon.
        Duration::from_secs(1)
    } else {
        match d.phase {
            // A power change under way is read back every few seconds.
            Phase::Active if d.power_state.is_some_and(|p| p.changing()) => i.busy,
            // Evicting moves when its Eviction's phase does, and that change
            // triggers a reconcile; between them only drift matters. Decommissioned:
            // a host that registers again is disabled within one interval.
            Phase::Active | Phase::Maintenance | Phase::Evicting | Phase::Decommissioned => i.drift,
            Phase::Aborted => i.drift * 5,
            _ => i.busy,
        }
    }
}

/// Compute services that look like `host`, for a host Nova does not know
/// (a wrong Node-name mapping shows at once). Empty when Nova cannot say.
async fn observe_close_hosts(ctx: &Context, host: &str, agent_hostname: Option<&str>) -> Vec<String> {
    match ctx.nova.compute_hosts().await {
        Ok(services) => lifecycle::close_hosts(host, agent_hostname, &services),
        Err(e) => {
            tracing::debug!(node = %host, error = %e, "listing compute services");
            Vec::new()
        }
    }
}

/// An Eviction of the name the lifecycle asked for exists already: its
/// own, made by an earlier look (taken as made), or somebody else's, such
/// as a dry run or one made by hand (never taken: the host would wait on
/// an eviction that is not its maintenance's).
async fn same_eviction(api: &Api<Eviction>, hv: &Hypervisor, name: &str) -> Result<(), String> {
    let found = api.get(name).await.map_err(|e| e.to_string())?;
    let uid = hv.meta().uid.as_deref();
    let owned =
        found.owner_references().iter().any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid);
    if owned && !found.spec.dry_run {
        return Ok(());
    }
    Err(format!(
        "an Eviction named {name} exists that is not this host's maintenance (a dry run, or made by hand): \
         delete it, and the maintenance's own is made"
    ))
}

async fn execute(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    host: &str,
    service_id: Option<&str>,
    action: &Action,
) -> Result<(), String> {
    match action {
        Action::PowerOff => super::power::ask(ctx, hv, false).await,
        Action::PowerOn => super::power::ask(ctx, hv, true).await,
        Action::RunChecks { run } => {
            let uid = hv.meta().uid.as_deref().unwrap_or_default();
            if ctx.registry.run_checks(name, uid, *run, super::check_config(&hv.spec)) {
                Ok(())
            } else {
                Err("the agent is not connected".into())
            }
        }
        Action::CreateEviction { name: ev, reason } => {
            let api: Api<Eviction> = Api::all(ctx.client.clone());
            let spec = EvictionSpec {
                hypervisor: name.to_string(),
                reason: *reason,
                options: EvictionOptions::default(),
                dry_run: false,
            };
            let mut eviction = Eviction::new(ev, spec);
            eviction.metadata.owner_references = hv.controller_owner_ref(&()).map(|o| vec![o]);
            let pp = PostParams { field_manager: Some(super::FIELD_MANAGER.into()), ..Default::default() };
            match api.create(&pp, &eviction).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => same_eviction(&api, hv, ev).await,
                Err(e) => Err(e.to_string()),
            }
        }
        Action::CancelEviction { name: ev } => {
            let api: Api<Eviction> = Api::all(ctx.client.clone());
            match api.delete(ev, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        }
        _ => ctx.nova.execute(host, service_id, action).await.map_err(|e| e.to_string()),
    }
}

/// The Node from the cache; a Node missing from the cache is confirmed
/// absent by a direct read (the cache may lag behind a new Node). With it,
/// when its deletion began.
async fn observe_node(ctx: &Context, name: &str) -> Result<NodeSeen, Error> {
    let node = match ctx.nodes.get(&ObjectRef::new(name)) {
        Some(n) => Some((*n).clone()),
        None => Api::<Node>::all(ctx.client.clone()).get_opt(name).await?,
    };
    Ok((
        node.as_ref().map_or(NodeObs::Absent, |n| node_obs(n, &ctx.updates.signals)),
        health::observe::node_source(node.as_ref()),
        node.as_ref().map(health::marks::of),
        node.as_ref().and_then(|n| n.metadata.deletion_timestamp.as_ref()).map(|t| t.0),
    ))
}

type NodeSeen = (NodeObs, NodeSource, Option<health::marks::Marks>, Option<Timestamp>);

/// The Node's schedulable label and heartbeat annotation (`health::marks`).
/// A failed write is logged and tried again at the next reconcile.
async fn mark_node(ctx: &Context, name: &str, seen: &Seen, status: &HypervisorStatus) {
    let Some(marks) = &seen.marks else { return };
    let healthy =
        status.health.as_ref().is_some_and(|h| h.state == crate::api::hypervisor::HealthState::Healthy);
    let heard = seen.agent.last_seen.filter(|_| seen.agent.connected);
    let hibernated = status.power_state.is_some_and(|p| !p.in_service());
    let Some(patch) = health::marks::patch(marks, healthy, heard, hibernated) else { return };
    let api: Api<Node> = Api::all(ctx.client.clone());
    if let Err(e) =
        api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await
    {
        tracing::warn!(error = %e, "could not mark the Node");
    }
}

/// The Node marked hibernated before its host is powered off: whoever
/// watches Nodes reads its NotReady as meant, from the first moment.
async fn mark_powered_down(ctx: &Context, name: &str) -> Result<(), Error> {
    let mut labels = serde_json::Map::new();
    labels.insert(crate::api::keys::HIBERNATED_LABEL.into(), serde_json::json!("true"));
    let Some(patch) = health::marks::metadata_patch(labels, serde_json::Map::new()) else { return Ok(()) };
    let api: Api<Node> = Api::all(ctx.client.clone());
    match api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
        // No Node to mark: nobody reads it for this host.
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
        Ok(_) => Ok(()),
    }
}

/// What the lifecycle reads of a Node (and what wakes it: `triggers`);
/// `signals`: how the site's update tools ask for a host.
pub fn node_obs(n: &Node, signals: &crate::drain::signals::UpdateSignals) -> NodeObs {
    if n.metadata.deletion_timestamp.is_some() {
        return NodeObs::Deleting;
    }
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
    NodeObs::Present {
        ready: conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True"),
        cordoned: n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        maintenance_required: signals.ask(n),
        drain_refused: n.annotations().contains_key(crate::api::keys::DRAIN_REFUSED_ANNOTATION),
    }
}

/// The Eviction named in our record, else a running one aimed at the node.
/// A named one missing from the cache is confirmed absent by a direct read:
/// the lifecycle takes "absent" as "deleted", and a cache that lags (just
/// after a start or a fail-over) must never re-enable a host mid-eviction.
async fn observe_eviction(
    ctx: &Context,
    node: &str,
    status: &HypervisorStatus,
) -> Result<Option<EvictionObs>, Error> {
    if let Some(r) = &status.lifecycle.eviction {
        return Ok(match ctx.evictions.get(&ObjectRef::new(&r.name)) {
            Some(ev) => Some(eviction_obs(&ev)),
            None => {
                Api::<Eviction>::all(ctx.client.clone()).get_opt(&r.name).await?.as_ref().map(eviction_obs)
            }
        });
    }
    let running = ctx.evictions.state().into_iter().find(|e| e.spec.hypervisor == node && e.is_running());
    Ok(running.map(|e| eviction_obs(&e)))
}

/// What the lifecycle reads of an Eviction (and what wakes it: `triggers`).
pub fn eviction_obs(ev: &Eviction) -> EvictionObs {
    let st = ev.status.clone().unwrap_or_default();
    EvictionObs {
        name: ev.name_any(),
        reason: ev.spec.reason,
        re_enable: ev.spec.reason.re_enables(ev.spec.options.re_enable),
        phase: st.phase.unwrap_or_default(),
        message: ev.unmet_message(),
        migrated: st.migrated,
        total: st.total,
        deleting: ev.metadata.deletion_timestamp.is_some(),
    }
}

pub(super) async fn publish(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    publish_by(&ctx.recorder, reference, type_, reason, note).await;
}

/// An Event by `recorder` on `reference`; a failure is logged only.
pub(super) async fn publish_by(
    recorder: &Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        tracing::warn!(reason, error = %e, "could not record a Kubernetes Event");
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;
    use crate::api::hypervisor::{AgentStatus, HealthState, HealthStatus};

    #[test]
    fn a_host_not_judged_lives_for_the_fencing_only_while_its_node_reads_ready() {
        assert!(unjudged_kubelet_alive(health::NodeSource::Ready));
        assert!(!unjudged_kubelet_alive(health::NodeSource::NotReady { since: None }));
        assert!(!unjudged_kubelet_alive(health::NodeSource::Absent));
    }

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn status(connected: bool, healthy: (&str, &str), instances: u32) -> HypervisorStatus {
        HypervisorStatus {
            agent: Some(AgentStatus { connected, ..Default::default() }),
            health: Some(HealthStatus { state: HealthState::Healthy, ..Default::default() }),
            conditions: vec![
                condition("AgentConnected", if connected { "True" } else { "False" }, "Connected", ""),
                condition("NodeHealthy", "True", healthy.0, healthy.1),
            ],
            instances: Some(crate::api::hypervisor::InstancesStatus {
                count: instances,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_the_agents_word_and_the_wording_of_a_verdict_pass_as_unchanged() {
        let was = status(true, ("Healthy", "the agent, the kubelet and nova-compute answer"), 1);
        let reconnecting = status(false, ("Healthy", "not judged: the coordinator took over moments ago"), 1);
        assert!(same_but_words_not_from_nova(reconnecting, &was), "the agent's absence, the verdict held");
        let fewer = status(true, ("Healthy", "the agent, the kubelet and nova-compute answer"), 0);
        assert!(!same_but_words_not_from_nova(fewer, &was), "a change Nova's view made");
        let judged = status(true, ("NovaComputeDown", "nova-compute is down"), 1);
        assert!(!same_but_words_not_from_nova(judged, &was), "another verdict");
        let mut degraded = was.clone();
        if let Some(h) = degraded.health.as_mut() {
            h.state = HealthState::Degraded;
        }
        assert!(!same_but_words_not_from_nova(degraded, &was), "another health state");
    }

    #[test]
    fn an_evictions_end_is_a_change() {
        let evicted = |status: &str, reason: &str, message: &str| {
            let mut s = status_of_host(1);
            s.conditions.push(condition("Evicted", status, reason, message));
            s
        };
        let was =
            evicted("False", "EvictionRunning", "Eviction e Migrating (its status counts the VMs moved)");
        let remain = evicted("False", "InstancesRemain", "12/12 VM(s) moved; 1 instance(s) remain");
        assert!(!same_but_words_not_from_nova(remain, &was), "Nova's count at the end");
        let done = evicted("True", "Evicted", "12/12 VM(s) moved");
        assert!(!same_but_words_not_from_nova(done, &was), "the end");
        let failed = evicted("False", "EvictionFailed", "3/12 VM(s) moved");
        assert!(!same_but_words_not_from_nova(failed, &was), "another reason");
        let mut fewer = was.clone();
        fewer.instances = status_of_host(0).instances;
        assert!(!same_but_words_not_from_nova(fewer, &was), "Nova's count of the host's VMs");
    }

    #[test]
    fn our_change_of_the_service_status_done_passes_as_unchanged_not_another() {
        let scheduling = |status: &str, reason: &str, message: &str| {
            let mut s = status_of_host(1);
            s.conditions.push(condition("SchedulingEnabled", status, reason, message));
            s
        };
        let asked = scheduling("False", "Disabling", "hv-lifecycle: eviction e (AdminRequest)");
        let done = scheduling("False", "Disabled", "hv-lifecycle: eviction e (AdminRequest)");
        assert!(same_but_words_not_from_nova(done, &asked), "the disable Nova answered");
        let other = scheduling("False", "Disabled", "disabled by hand");
        assert!(!same_but_words_not_from_nova(other, &asked), "another reason in Nova");
        let enabled = scheduling("True", "Enabled", "");
        assert!(!same_but_words_not_from_nova(enabled, &asked), "enabled instead");
        let enabling = scheduling("True", "Enabling", "");
        assert!(same_but_words_not_from_nova(scheduling("True", "Enabled", ""), &enabling));
        let was = scheduling("False", "Disabled", "hv-lifecycle: eviction e (AdminRequest)");
        let back = scheduling("False", "Disabling", "hv-lifecycle: eviction e (AdminRequest)");
        assert!(!same_but_words_not_from_nova(back, &was), "not the other way");
    }

    #[test]
    fn only_freeing_the_host_for_drains_needs_its_own_read() {
        let with = |evictable: Option<bool>| HypervisorStatus { evictable, ..status_of_host(0) };
        // Recorded for the first time (after an upgrade), or locked: the view may say so.
        assert!(same_but_words_not_from_nova(with(Some(false)), &with(None)));
        assert!(same_but_words_not_from_nova(with(Some(false)), &with(Some(true))));
        assert!(same_but_words_not_from_nova(with(Some(true)), &with(Some(true))));
        // Freed: only on the host's own read.
        assert!(!same_but_words_not_from_nova(with(Some(true)), &with(Some(false))));
        assert!(!same_but_words_not_from_nova(with(Some(true)), &with(None)));
    }

    fn status_of_host(instances: u32) -> HypervisorStatus {
        status(true, ("Healthy", "the agent, the kubelet and nova-compute answer"), instances)
    }
}
