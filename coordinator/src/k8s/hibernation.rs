//! The hibernation policy at work (docs/power.md, "The policy"): every
//! look, the leader reads each compute host's room from Nova and
//! Placement and our Hypervisors from the cache, decides per group
//! ([`crate::power::hibernation::decide`]) and sets the chosen hosts'
//! `spec.powerState`, marked as the policy's. The lifecycle carries the
//! wish out, with its own fresh checks: the policy never powers a host
//! itself, and a host it picks that is not empty after all stays on.
//!
//! An eviction whose preflight finds no room that hibernated hosts would
//! give asks here for them ([`Hibernation::ask_room`]); the next look
//! wakes them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};

use super::hypervisor::Context;
use crate::api::condition::ConditionType;
use crate::api::keys::{PAUSED_ANNOTATION, POWER_BY_ANNOTATION, POWER_BY_POLICY};
use crate::api::power::{DesiredPower, HostPower};
use crate::api::{Hypervisor, Phase};
use crate::power::hibernation::{Decision, Power, decide};
use crate::power::policy::{GroupPolicy, HostRoom, OurHost, Scope, asleep_near, group_hosts, withdraw};

/// How long an eviction's ask for room counts: a few of its preflight's
/// looks (it asks again at each while it waits).
const ASK_COUNTS: Duration = Duration::from_secs(60);

/// By group, the hosts a policy may wake or is changing (names).
pub type Asleep = Vec<(String, Vec<String>)>;

/// What a look saw: Nova's hosts of the groups, and ours by Nova host.
type Seen = (Vec<HostRoom>, BTreeMap<String, OurHost>);

/// The policies, and what the leader's last look saw.
#[derive(Default)]
pub struct Hibernation {
    policies: Vec<GroupPolicy>,
    seen: Mutex<Option<Seen>>,
    /// By Nova host emptied: when its eviction last found no room, and
    /// the hibernated hosts that would give it.
    asks: Mutex<BTreeMap<String, (Instant, Vec<String>)>>,
    /// When each Nova host was first seen empty and awake, by this process:
    /// a new leader counts `hibernateAfter` anew.
    empty_since: Mutex<BTreeMap<String, Instant>>,
}

impl Hibernation {
    pub fn new(policies: Vec<GroupPolicy>) -> Hibernation {
        Hibernation { policies, ..Hibernation::default() }
    }

    /// The hosts the policy may wake, or that are waking, in the groups of
    /// `source` (a Nova host), by group, as the last look saw them; None
    /// before this leader's first look (nothing is known yet).
    pub fn asleep_near(&self, source: &str) -> Option<Asleep> {
        let seen = self.seen.lock().ok()?;
        let (rooms, ours) = seen.as_ref()?;
        let near = asleep_near(&self.policies, rooms, ours, (source, &self.asked_for(source)));
        Some(near.into_iter().map(|(scope, hosts)| (scope.to_string(), hosts)).collect())
    }

    /// The hosts the eviction off `source` asked for last (this leader).
    pub fn asked_for(&self, source: &str) -> Vec<String> {
        let asks = self.asks.lock();
        asks.ok().and_then(|a| a.get(source).map(|(_, hosts)| hosts.clone())).unwrap_or_default()
    }

    /// The hosts the eviction off `source` asked for that are still on
    /// their way by the last look: not in service, not failed to start. A
    /// host starting may be missing from Nova's lists a moment; it is
    /// waited for all the same.
    pub fn still_coming(&self, source: &str) -> Vec<String> {
        let Ok(seen) = self.seen.lock() else { return Vec::new() };
        let Some((rooms, ours)) = seen.as_ref() else { return Vec::new() };
        let serving = |h: &String| rooms.iter().any(|r| &r.host == h && r.in_service);
        let failed = |h: &String| {
            ours.get(h)
                .is_some_and(|o| matches!(o.power, Some(HostPower::FailedToStart | HostPower::FailedToStop)))
        };
        self.asked_for(source).into_iter().filter(|h| !serving(h) && !failed(h)).collect()
    }

    /// Whether any policy is set.
    pub fn on(&self) -> bool {
        !self.policies.is_empty()
    }

    /// An eviction off `source` waits for room `hosts` would give: the
    /// next look wakes those of them still hibernated.
    pub fn ask_room(&self, source: &str, hosts: Vec<String>) {
        if let Ok(mut asks) = self.asks.lock() {
            asks.insert(source.to_string(), (Instant::now(), hosts));
        }
    }

    /// The hosts of `scope` evictions asked for lately.
    fn wanted(&self, scope: &Scope, rooms: &[HostRoom]) -> Vec<String> {
        let Ok(mut asks) = self.asks.lock() else { return Vec::new() };
        asks.retain(|_, (at, _)| at.elapsed() < ASK_COUNTS);
        let asked = asks.values().flat_map(|(_, hosts)| hosts);
        let members: Vec<&String> = rooms.iter().filter(|r| scope.holds(r)).map(|r| &r.host).collect();
        let mut wanted: Vec<String> = asked.filter(|h| members.contains(h)).cloned().collect();
        wanted.sort();
        wanted.dedup();
        wanted
    }
}

/// Looks every `every` while this process leads, the first as soon as
/// the caches are synced, until the process ends.
pub async fn run(ctx: Arc<Context>, hibernation: Arc<Hibernation>, every: Duration) {
    if !hibernation.on() {
        return std::future::pending().await;
    }
    loop {
        if !ctx.gate.open() {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        }
        if let Err(e) = look(&ctx, &hibernation).await {
            tracing::warn!(error = %e, "hibernation policy: no look this time");
        }
        tokio::time::sleep(every).await;
    }
}

/// Observe, decide per group, act. A decision of one group is counted in
/// the next group's view: a host in two groups changes once per look.
async fn look(ctx: &Context, hib: &Hibernation) -> Result<(), crate::nova::NovaError> {
    let scopes: Vec<Scope> = hib.policies.iter().map(|p| p.scope.clone()).collect();
    let rooms = ctx.nova.rooms(&scopes).await?;
    let hypervisors = ctx.hypervisors.state();
    let mut ours = ours(&hypervisors, &rooms, hib);
    let of = |o: &OurHost| hypervisors.iter().find(|h| h.name_any() == o.name).cloned();
    for o in ours.values_mut().filter(|o| withdraw(o)) {
        if let Some(hv) = of(o) {
            let why = "the hibernation policy withdraws its wish: the host refused it (or cannot tell it is empty), left Active or is paused, or an SRE changed it";
            set_wish(ctx, &hv, DesiredPower::Running, ("PolicyWithdrawn", why)).await;
        }
        (o.wish, o.by_policy) = (DesiredPower::Running, false);
    }
    if let Ok(mut seen) = hib.seen.lock() {
        *seen = Some((rooms.clone(), ours.clone()));
    }
    for p in &hib.policies {
        let hosts = group_hosts(&p.scope, &rooms, &ours);
        if hosts.is_empty() {
            tracing::warn!(group = %p.scope, "hibernation policy: no compute host of Nova's is in this group");
            continue;
        }
        let wanted = hib.wanted(&p.scope, &rooms);
        for d in decide(&p.policy, &hosts, &wanted) {
            let (host, wish, reason) = match &d {
                Decision::Hibernate { host, reason } => (host, DesiredPower::Hibernating, reason),
                Decision::Wake { host, reason } => (host, DesiredPower::Running, reason),
            };
            let Some(o) = ours.get_mut(host) else { continue };
            if let Some(hv) = of(o) {
                let event = if wish.is_running() { "WakeByPolicy" } else { "HibernateByPolicy" };
                let why = format!("the hibernation policy of {}: {reason}", p.scope);
                set_wish(ctx, &hv, wish, (event, &why)).await;
            }
            (o.wish, o.by_policy) = (wish, !wish.is_running());
        }
    }
    Ok(())
}

/// Our Hypervisors by Nova host, with how long each has been empty.
fn ours(hypervisors: &[Arc<Hypervisor>], rooms: &[HostRoom], hib: &Hibernation) -> BTreeMap<String, OurHost> {
    let Ok(mut since) = hib.empty_since.lock() else { return BTreeMap::new() };
    let now = Instant::now();
    let mut out = BTreeMap::new();
    for hv in hypervisors {
        let name = hv.name_any();
        let host = hv.spec.nova_host(&name).to_string();
        if !rooms.iter().any(|r| r.host == host) {
            continue;
        }
        let status = hv.status.as_ref();
        let by = hv.annotations().get(POWER_BY_ANNOTATION);
        let mut o = OurHost {
            name: name.clone(),
            active: status.and_then(|s| s.phase) == Some(Phase::Active),
            wish: hv.spec.power_state,
            power: status.and_then(|s| s.power_state),
            by_policy: by.is_some_and(|v| v == POWER_BY_POLICY),
            bmc: hv.spec.fencing.bmc.is_some(),
            paused: hv.annotations().contains_key(PAUSED_ANNOTATION),
            refused: status.is_some_and(|s| {
                let power = s.conditions.iter().find(|c| c.type_ == ConditionType::PowerState.as_str());
                power.is_some_and(|c| {
                    matches!(c.reason.as_str(), "HostNotEmpty" | "NoBmc" | "EmptinessUnknown")
                })
            }),
            servers: status.and_then(|s| s.instances.as_ref()).map(|i| i.count),
            // The last report stands only while its agent is there.
            domains: status
                .filter(|s| {
                    let agent =
                        s.conditions.iter().find(|c| c.type_ == ConditionType::AgentConnected.as_str());
                    agent.is_some_and(|c| c.status == "True")
                })
                .and_then(|s| s.machine.as_ref()?.domains.as_ref())
                .map(|d| u32::try_from(d.len()).unwrap_or(u32::MAX)),
            empty_for: None,
        };
        let empty = o.servers == Some(0) && o.domains == Some(0) && o.power() == Power::Awake;
        if empty {
            o.empty_for = Some(now.duration_since(*since.entry(host.clone()).or_insert(now)));
        } else {
            since.remove(&host);
        }
        out.insert(host, o);
    }
    since.retain(|host, _| out.contains_key(host));
    out
}

/// Sets `hv`'s `spec.powerState` as the policy's, over the version it
/// decided on: an SRE's edit meanwhile wins, and the next look decides
/// again.
async fn set_wish(ctx: &Context, hv: &Hypervisor, wish: DesiredPower, (event, why): (&str, &str)) {
    let name = hv.name_any();
    if let Err(e) = ctx.gate.may_act() {
        tracing::info!(node = %name, ?wish, why, held = %e, "hibernation policy: not set");
        return;
    }
    let by = (wish == DesiredPower::Hibernating).then_some(POWER_BY_POLICY);
    let power = (wish == DesiredPower::Hibernating).then_some(wish);
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": hv.resource_version(), "annotations": {POWER_BY_ANNOTATION: by}},
        "spec": {"powerState": power},
    });
    let api = Api::<Hypervisor>::all(ctx.client.clone());
    match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(node = %name, ?wish, why, "hibernation policy: power wish set");
            super::hypervisor::publish_by(&ctx.recorder, &hv.object_ref(&()), EventType::Normal, event, why)
                .await;
        }
        Err(e) => tracing::warn!(node = %name, ?wish, error = %e, "hibernation policy: power wish not set"),
    }
}
