//! The fencing shell (docs/fencing.md): observe what
//! [`fence::decide`](crate::fence::decide) needs, take the one step it
//! names, and answer the host's fencing record and `Fenced` condition for
//! the reconcile to write. Only the leader reconciles, and every step is
//! idempotent: a step repeated after a fail-over costs nothing.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::hypervisor::{Context, Error};
use crate::api::condition::{ConditionStatus, ConditionType, DesiredCondition};
use crate::api::hypervisor::{FailedFenceStep, FenceStep, FencingStatus, HealthState};
use crate::api::keys::RETRY_ANNOTATION;
use crate::api::keys::{BMC_SECRET_LABEL, CLEAR_FENCED_ANNOTATION, CONFIRM_FENCED_ANNOTATION, ZONE_LABEL};
use crate::api::{Hypervisor, MaintenanceMode};
use crate::eviction::NovaState;
use crate::fence::ceph::CephFence;
use crate::fence::decide::{self, Decision, FencePolicy, Situation};
use crate::fence::redfish::{Bmc, Redfish};
use crate::fence::{PowerState, PoweredOff, power_off_confirmed, read_again_if_off, same_machine};
use crate::fence::{clear, targets};
use crate::health::PowerSource;
use crate::lifecycle::ServiceState;

/// Tries of a step before it stands failed for an SRE.
pub const ATTEMPTS: u32 = 3;
/// Prefix of the maintenance reason of a host put into `ha` for being
/// fenced.
pub const EVACUATE_REASON_PREFIX: &str = "hv-fence: ";
/// How long a fencing this process started counts though the cache does
/// not show it yet.
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
        }
    }

    /// The same, an agent's Ceph addresses taken only within `networks`.
    pub fn with_ceph_networks(self, networks: Vec<ipnet::IpNet>) -> Self {
        FenceContext { ceph_networks: networks, ..self }
    }
}

/// What one reconcile's fencing comes to.
pub struct FenceOutcome {
    pub record: Option<FencingStatus>,
    /// The `Fenced` condition to set; None with no record: none at all.
    pub condition: Option<DesiredCondition>,
    /// Look again this soon (the next step).
    pub again: Option<Duration>,
    /// A Warning Event: reason and note.
    pub event: Option<(String, String)>,
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

/// What the storage step blocklists for `hv` ([`targets::ceph_addresses`]),
/// every other Hypervisor's addresses read from the cache.
fn ceph_targets(ctx: &Context, hv: &Hypervisor) -> Result<Vec<String>, String> {
    let name = hv.name_any();
    let others: Vec<(String, Vec<String>)> = ctx
        .hypervisors
        .state()
        .iter()
        .filter(|h| h.name_any() != name)
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

/// `health`: this reconcile's verdict (None: not judged); `blind`: why
/// the coordinator's own view cannot be trusted now; `evicting`: the
/// host's running Eviction, if any.
pub async fn run(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    health: Option<HealthState>,
    blind: Option<String>,
    evicting: Option<&str>,
    now: Timestamp,
) -> FenceOutcome {
    let name = hv.name_any();
    let status = hv.status.clone().unwrap_or_default();
    let mut record = status.fencing.clone();
    let retry = hv.annotations().get(RETRY_ANNOTATION).cloned();
    let confirm = hv.annotations().get(CONFIRM_FENCED_ANNOTATION).cloned();
    let clear = hv.annotations().get(CLEAR_FENCED_ANNOTATION).cloned();
    if let Some(r) = record.as_ref().filter(|r| clear.is_some() && r.handled_clear != clear) {
        return clearing(ctx, hv, host, r, evicting, &status.conditions).await;
    }
    // An SRE's retry clears a failed step (a retry given before the
    // fencing started is not one, nor is the annotation's removal).
    if let Some(r) =
        record.as_mut().filter(|r| r.failed.is_some() && retry.is_some() && r.handled_retry != retry)
    {
        r.failed = None;
        r.handled_retry = retry.clone();
    }
    // Neither under way nor Failed: nothing to fence (decide's first rule),
    // and no fleet scan on every reconcile of every healthy host.
    if record.is_none() && health != Some(HealthState::Failed) {
        return FenceOutcome { record: None, condition: None, again: None, event: None };
    }
    let steps = steps_of(hv);
    let serving = in_service(ctx);
    let (lost, hosts, domain) = domain_of(ctx, &serving, &name, health);
    let failed = record.as_ref().and_then(|r| r.failed.as_ref()).filter(|f| f.attempts >= ATTEMPTS);
    let situation = Situation {
        health: health.unwrap_or(HealthState::Healthy),
        heartbeat_age: ctx.registry.view(&name).last_seen.map(|t| now.duration_since(t)),
        blind: blind.as_deref(),
        other_agents: other_agents(ctx, &serving, &name),
        domain: (&domain, lost, hosts),
        started_lately: started_lately(ctx, &name, now),
        steps: &steps,
        under_way: record.is_some(),
        confirmed: record.as_ref().map_or(&[][..], |r| &r.confirmed[..]),
        failed: failed.map(|f| (f.step, f.message.as_str())),
        fenced: record.as_ref().and_then(|r| r.fenced.as_ref().map(|_| r.by_hand)),
        confirmed_by_hand: record.as_ref().is_some_and(|r| confirm.is_some() && r.handled_confirm != confirm),
    };
    let heartbeat_fresh = situation.heartbeat_age.is_some_and(|a| a < ctx.fencing.policy.fresh_heartbeat);
    let decision = decide::decide(&situation, &ctx.fencing.policy);
    let mut out = FenceOutcome { record: record.clone(), condition: None, again: None, event: None };
    match decision {
        Decision::Nothing => {}
        Decision::HeldBack { gate, message } => {
            let news = !held_already(&status.conditions, gate.reason());
            out.condition = Some(cond(ConditionStatus::False, gate.reason(), &message));
            out.event = news.then(|| (gate.reason().to_string(), message));
        }
        Decision::Stuck { message, .. } => {
            out.condition = Some(cond(ConditionStatus::False, "StepNotConfirmed", &message));
        }
        Decision::Fenced { by_hand } => {
            // decide fences only a fencing under way: the record is there.
            let Some(r) = out.record.as_mut() else { return out };
            if r.fenced.is_none() {
                r.fenced = Some(Time(now));
                r.by_hand = by_hand;
                let how = if by_hand { "confirmed by hand" } else { "every step confirmed" };
                out.event = Some((
                    "Fenced".to_string(),
                    format!("{name} is fenced ({how}): its VMs may be rebuilt elsewhere"),
                ));
            }
            let how = if r.by_hand { "an SRE confirmed it" } else { "every step confirmed" };
            let message = format!("fenced ({how}: {}); stays so until an SRE clears it", list(&r.confirmed));
            // Fenced, and yet its agent talks: the fencing stands, and says so.
            let (reason, message) = if heartbeat_fresh {
                ("FencedAgentTalking", format!("{message}. Its agent talks to us again: look at the host"))
            } else {
                ("Fenced", message)
            };
            out.condition = Some(cond(ConditionStatus::True, reason, &message));
        }
        Decision::Take(step) if record.is_none() => {
            // Recorded before any step: a fencing started is never lost to
            // a fail-over or a failed write, and counts against the limit.
            if !claim(ctx, &name) {
                out.again = Some(Duration::from_secs(1));
                return out;
            }
            out.record = Some(FencingStatus {
                started: Some(Time(now)),
                handled_retry: retry.clone(),
                handled_confirm: confirm.clone(),
                handled_clear: clear.clone(),
                ..Default::default()
            });
            let message = format!("fencing started ({}): {step} next", health.unwrap_or_default());
            out.condition = Some(cond(ConditionStatus::False, "InProgress", &message));
            out.event = Some(("FencingStarted".to_string(), message));
            out.again = Some(Duration::from_millis(200));
        }
        Decision::Take(step) => {
            // Only the leader acts: a step a deposed leader is about to take
            // waits for the next reconcile, under the lease.
            if !ctx.gate.open() {
                out.again = Some(Duration::from_millis(500));
                return out;
            }
            let Some(r) = out.record.as_mut() else { return out };
            // The storage step's addresses are written to the record before
            // they are added: a clearing lifts whatever may have been,
            // whatever a fail-over or a lost write.
            let ceph = (step == FenceStep::CephBlocklisted).then(|| {
                ceph_targets(ctx, hv)
                    .and_then(|a| targets::to_record(&r.ceph_addresses, &a).map(|new| (a, new)))
            });
            if let Some(Ok((addresses, new))) = &ceph
                && !new.is_empty()
            {
                r.ceph_addresses.extend(new.iter().cloned());
                let message = format!("{step} next: {} recorded first", addresses.join(", "));
                out.condition = Some(cond(ConditionStatus::False, "InProgress", &message));
                out.again = Some(Duration::from_millis(200));
                return out;
            }
            tracing::warn!(node = %name, step = %step, "fencing: taking a step");
            match take(ctx, hv, host, step, ceph.map(|c| c.map(|(addresses, _)| addresses))).await {
                Ok(how) => {
                    r.failed = None;
                    r.confirmed.push(step);
                    let message = format!("{step} confirmed ({how})");
                    out.condition = Some(cond(ConditionStatus::False, "InProgress", &message));
                    out.event = Some((format!("{step}Confirmed"), message));
                    out.again = Some(Duration::from_millis(200));
                    return out;
                }
                Err(why) => {
                    let attempts = r.failed.as_ref().filter(|f| f.step == step).map_or(0, |f| f.attempts) + 1;
                    r.failed = Some(FailedFenceStep { step, message: why.clone(), attempts });
                    let (reason, message) = if attempts >= ATTEMPTS {
                        let message = format!(
                            "{step} not confirmed after {ATTEMPTS} tries: {why}. Retry it (hvctl retry {name}), or \
                             make sure the host is fenced and say so (hvctl confirm-fenced {name})"
                        );
                        ("StepNotConfirmed", message)
                    } else {
                        (
                            "StepRetrying",
                            format!("{step} not confirmed (try {attempts} of {ATTEMPTS}): {why}"),
                        )
                    };
                    out.condition = Some(cond(ConditionStatus::False, reason, &message));
                    out.event = Some((format!("{step}NotConfirmed"), message));
                }
            }
            out.again = Some(Duration::from_secs(1));
        }
    }
    out
}

fn cond(status: ConditionStatus, reason: &str, message: &str) -> DesiredCondition {
    DesiredCondition::new(ConditionType::Fenced, status, reason, message)
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
    let name = hv.name_any();
    let mut out = FenceOutcome { record: Some(r.clone()), condition: None, again: None, event: None };
    if !ctx.gate.open() {
        out.again = Some(Duration::from_millis(500));
        return out;
    }
    let wait = |why: String, out: &mut FenceOutcome| {
        let news = !held_already(conditions, "ClearWaiting");
        out.condition = Some(cond(ConditionStatus::True, "ClearWaiting", &format!("clearing asked: {why}")));
        out.event = news.then(|| ("FencingClearWaiting".to_string(), why));
        out.again = Some(Duration::from_secs(5));
    };
    let forced_down = match ctx.nova.service_state(host).await {
        Ok(state) => state == Some(ServiceState::ForcedDown),
        Err(e) => {
            wait(format!("Nova cannot be read: {e}"), &mut out);
            return out;
        }
    };
    // Every evacuation since the fencing started (with the slack Nova's clock may need).
    let since =
        r.started.as_ref().map_or(Timestamp::UNIX_EPOCH, |t| t.0) - jiff::SignedDuration::from_mins(10);
    let evacuations_unsettled = match ctx.nova.migrations_from(host, since).await {
        Ok(list) => list
            .iter()
            .filter(|m| m.migration_type.as_deref() == Some("evacuation"))
            .filter(|m| !matches!(m.status, NovaState::Completed | NovaState::Failed | NovaState::Cancelled))
            .count(),
        Err(e) => {
            wait(format!("Nova's migrations cannot be read: {e}"), &mut out);
            return out;
        }
    };
    let situation = clear::Situation {
        eviction_running: evicting,
        agent_back: ctx.registry.view(&name).connected,
        evacuations_unsettled,
        forced_down,
        // Lifted whatever the step came to (tried, confirmed by hand): a
        // lift of an entry not there is a no-op.
        blocklisted: !lifted_by_clearing(ctx, hv, r).is_empty() && !r.blocklist_lifted,
    };
    match clear::next(&situation) {
        clear::Next::Wait(why) => wait(why, &mut out),
        clear::Next::LiftForcedDown => match ctx.nova.set_forced_down(host, false).await {
            Ok(()) => {
                let msg = format!("Nova's forced_down lifted from {host}'s compute service");
                out.condition = Some(cond(ConditionStatus::True, "Clearing", &msg));
                out.event = Some(("ForcedDownLifted".to_string(), msg));
                out.again = Some(Duration::from_millis(200));
            }
            // Nova's own rule: not before the host's nova-compute has
            // started and destroyed what was left of its evacuated servers.
            Err(e @ crate::nova::NovaError::Invalid(_)) => wait(
                format!(
                    "Nova refused to lift {host}'s forced_down ({e}); it does so until the host's \
                     nova-compute has started again and cleaned up after the evacuation"
                ),
                &mut out,
            ),
            Err(e) => wait(format!("Nova: {e}"), &mut out),
        },
        clear::Next::LiftBlocklist => {
            let addresses = lifted_by_clearing(ctx, hv, r);
            let lifted = match &ctx.fencing.ceph {
                Some(ceph) => ceph.lift(&addresses).await.map_err(|e| e.to_string()),
                None => Err("this coordinator has no Ceph fencing identity (--ceph-fence-id)".into()),
            };
            match lifted {
                Ok(()) => {
                    if let Some(r) = out.record.as_mut() {
                        r.blocklist_lifted = true;
                    }
                    let msg = format!("{} lifted from the OSD blocklist", addresses.join(", "));
                    out.condition = Some(cond(ConditionStatus::True, "Clearing", &msg));
                    out.event = Some(("BlocklistLifted".to_string(), msg));
                    out.again = Some(Duration::from_millis(200));
                }
                Err(why) => wait(format!("the blocklist entries could not be lifted: {why}"), &mut out),
            }
        }
        clear::Next::Done => {
            out.record = None;
            out.event = Some((
                "FencingCleared".to_string(),
                format!("{name}'s fence is off: it comes back through its checks before it takes VMs again"),
            ));
        }
    }
    out
}

/// The addresses a clearing lifts ([`targets::to_lift`]): never one
/// another host's fencing holds.
fn lifted_by_clearing(ctx: &Context, hv: &Hypervisor, r: &FencingStatus) -> Vec<String> {
    let name = hv.name_any();
    let hypervisors = ctx.hypervisors.state();
    let others_held: Vec<String> =
        hypervisors.iter().filter(|h| h.name_any() != name).flat_map(|h| held(h).to_vec()).collect();
    let old = r.confirmed.contains(&FenceStep::CephBlocklisted)
        || r.failed.as_ref().is_some_and(|f| f.step == FenceStep::CephBlocklisted);
    targets::to_lift(&r.ceph_addresses, &hv.spec.fencing.ceph_addresses, old, &others_held)
}

fn list(steps: &[FenceStep]) -> String {
    if steps.is_empty() {
        return "no step".into();
    }
    steps.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(", ")
}

fn held_already(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    reason: &str,
) -> bool {
    conditions.iter().any(|c| c.type_ == ConditionType::Fenced.as_str() && c.reason == reason)
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
            match ctx.nova.service_state(host).await.map_err(|e| format!("Nova, reading back: {e}"))? {
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
            match power_off_confirmed(&redfish, ctx.fencing.power_within, every).await {
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
        let mut off = ctx.fencing.off.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
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
    let off = ctx.fencing.off.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    off.get(name).is_some_and(|t| t.elapsed() < Duration::from_secs(10))
}

/// The host's system UUID, as its agent reported it.
fn system_uuid(hv: &Hypervisor) -> Option<&str> {
    hv.status.as_ref().and_then(|s| s.machine.as_ref()).and_then(|m| m.system_uuid.as_deref())
}

/// The BMC with its credentials from the Secret the spec names.
async fn bmc(ctx: &Context, spec: &crate::api::hypervisor::BmcSpec) -> Result<Bmc, String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.fencing.namespace);
    let what = format!("Secret {}/{}", ctx.fencing.namespace, spec.credentials_secret);
    if spec.address.starts_with("redfish+http://") {
        return Err(format!("{} is plain HTTP: the BMC's credentials would travel in clear", spec.address));
    }
    let secret = secrets.get(&spec.credentials_secret).await.map_err(|e| format!("{what}: {e}"))?;
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

/// The other managed hosts' agents: (connected, all).
/// Only hosts whose agent belongs there count (Testing to Evicting): one
/// onboarding, in maintenance or decommissioned says nothing of our view.
fn other_agents(ctx: &Context, serving: &[String], name: &str) -> (usize, usize) {
    let others = serving.iter().filter(|n| *n != name);
    (others.clone().filter(|n| ctx.registry.connected(n)).count(), others.count())
}

/// The managed hosts whose agent belongs there (Testing to Evicting).
fn in_service(ctx: &Context) -> Vec<String> {
    let managed: std::collections::BTreeSet<String> =
        ctx.nodes.state().iter().map(|n| n.name_any()).collect();
    ctx.hypervisors
        .state()
        .iter()
        .filter(|h| managed.contains(&h.name_any()))
        .filter(|h| {
            let phase = h.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
            crate::lifecycle::expects_agent(phase)
        })
        .map(|h| h.name_any())
        .collect()
}

/// The host's failure domain: the managed hosts in service (Testing to
/// Evicting) that share its zone label (all of them when it has none).
/// Answers its hosts lost (Unreachable or Failed, this one by `health`),
/// all its hosts, and its name.
fn domain_of(
    ctx: &Context,
    serving: &[String],
    name: &str,
    health: Option<HealthState>,
) -> (usize, usize, String) {
    let nodes = ctx.nodes.state();
    let zone_of = |n: &k8s_openapi::api::core::v1::Node| n.labels().get(ZONE_LABEL).cloned();
    let zone = nodes.iter().find(|n| n.name_any() == name).and_then(|n| zone_of(n));
    let members: Vec<String> = nodes
        .iter()
        .filter(|n| zone.is_none() || zone_of(n) == zone)
        .map(|n| n.name_any())
        .filter(|n| n == name || serving.contains(n))
        .collect();
    let lost = |s: Option<HealthState>| matches!(s, Some(HealthState::Unreachable | HealthState::Failed));
    let hypervisors = ctx.hypervisors.state();
    let recorded = |m: &str| {
        hypervisors
            .iter()
            .find(|h| h.name_any() == m)
            .and_then(|h| h.status.as_ref().and_then(|s| s.health.as_ref()).map(|x| x.state))
    };
    let lost_now =
        members.iter().filter(|m| *m != name && lost(recorded(m))).count() + usize::from(lost(health));
    let label = zone.map_or_else(|| "the managed hosts".to_string(), |z| format!("zone {z}"));
    (lost_now, members.len().max(1), label)
}

/// Fencings of other hosts started within the policy's interval: recorded
/// in their status, or started by this process moments ago.
fn started_lately(ctx: &Context, name: &str, now: Timestamp) -> usize {
    let recorded = recorded_lately(ctx, name, now);
    ctx.fencing.claims.with(|claimed| lately(recorded, claimed, name))
}

fn recorded_lately(ctx: &Context, name: &str, now: Timestamp) -> Vec<String> {
    let window = ctx.fencing.policy.interval;
    ctx.hypervisors
        .state()
        .iter()
        .filter(|h| h.name_any() != name)
        .filter(|h| {
            h.status
                .as_ref()
                .and_then(|s| s.fencing.as_ref())
                .and_then(|f| f.started.as_ref())
                .is_some_and(|t| now.duration_since(t.0) < window)
        })
        .map(|h| h.name_any())
        .collect()
}

fn lately(mut hosts: Vec<String>, claimed: &super::claims::Live<'_>, name: &str) -> usize {
    hosts.extend(claimed.names().filter(|n| *n != name).map(str::to_string));
    hosts.sort();
    hosts.dedup();
    hosts.len()
}

/// Claims a place under the rate limit for a fencing about to start:
/// counted and claimed under one lock, so two reconciles cannot both take
/// the last place.
fn claim(ctx: &Context, name: &str) -> bool {
    let recorded = recorded_lately(ctx, name, Timestamp::now());
    ctx.fencing.claims.with(|claimed| {
        if lately(recorded, claimed, name) >= ctx.fencing.policy.max_started {
            return false;
        }
        claimed.claim(name);
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

/// Writes a reconcile's fencing into the status to be written: the
/// record, and the `Fenced` condition (gone when there is nothing to
/// fence and nothing recorded: no gate holds anything back).
pub fn record(
    status: &mut crate::api::HypervisorStatus,
    fenced: &FenceOutcome,
    now: Timestamp,
    generation: Option<i64>,
) {
    status.fencing = fenced.record.clone();
    match &fenced.condition {
        Some(c) => {
            status.conditions =
                crate::api::condition::merge(&status.conditions, std::slice::from_ref(c), now, generation)
        }
        None if fenced.record.is_none() => {
            status.conditions.retain(|c| c.type_ != ConditionType::Fenced.as_str())
        }
        None => {}
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
