//! The Hypervisor controller: the imperative shell around
//! [`lifecycle::decide`](crate::lifecycle::decide). One reconcile gathers the
//! observations (Node, agent, Nova, Eviction, retry annotation), decides,
//! executes the actions (each idempotent), writes status with server-side
//! apply under our field manager, records Kubernetes Events and sets the
//! node's gRPC health.

use std::sync::Arc;
use std::time::Duration;

use hv_proto::v1 as pb;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::status::compose;
use crate::api::eviction::{EvictionOptions, EvictionPhase};
use crate::api::{Eviction, EvictionSpec, Hypervisor, HypervisorStatus, Phase};
use crate::fleet::fleet_service::to_proto;
use crate::fleet::{Health, Registry};
use crate::lifecycle::{self, Action, AgentObs, EvictionObs, Input, NodeObs, NovaObs, Observations, Policy};
use crate::nova::NovaClient;

/// Annotation an SRE (or `hvctl retry`) sets to a new value to retry an
/// Aborted node.
pub const RETRY_ANNOTATION: &str = "hypervisor.cloud.sap/retry";
/// Field manager of every write this controller makes.
pub const FIELD_MANAGER: &str = "hv-coordinator";

/// How often a node is looked at again without a trigger.
#[derive(Clone, Debug)]
pub struct Intervals {
    /// Phases where something is under way (Onboarding, Testing, Ready, Evicting).
    pub busy: Duration,
    /// Active and Maintenance: the drift check.
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
    pub nova: Arc<NovaClient>,
    pub registry: Arc<Registry>,
    pub health: Health,
    pub recorder: Recorder,
    pub hypervisors: Store<Hypervisor>,
    pub nodes: Store<Node>,
    pub evictions: Store<Eviction>,
    pub policy: Policy,
    pub intervals: Intervals,
    pub events: tokio::sync::broadcast::Sender<pb::HypervisorEvent>,
    /// Our own status writes, for reconciles the cache has not caught up with.
    pub written: super::written::Written<Hypervisor>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Hypervisor has no name")]
    Unnamed,
}

pub async fn reconcile(hv: Arc<Hypervisor>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let hv = ctx.written.freshest(hv);
    let name = hv.metadata.name.clone().ok_or(Error::Unnamed)?;
    let status = hv.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let node = observe_node(&ctx, &name).await?;
    let agent = ctx.registry.view(&name);
    let nova = if phase == Phase::Decommissioned {
        NovaObs::Unknown
    } else {
        ctx.nova.observe(&name, &hv.spec.aggregates).await
    };
    let obs = Observations {
        node,
        agent: AgentObs { connected: agent.connected },
        checks: agent.checks.clone(),
        nova: nova.clone(),
        eviction: observe_eviction(&ctx.evictions, &name, &status),
        retry: hv.annotations().get(RETRY_ANNOTATION).cloned(),
    };
    let now = Timestamp::now();
    let decision = lifecycle::decide(&Input {
        name: &name,
        spec: &hv.spec,
        status: &status,
        obs: &obs,
        policy: &ctx.policy,
        now,
    });

    let service_id = decision.service_id.clone();
    let mut failures = Vec::new();
    for action in &decision.actions {
        let result = execute(&ctx, &hv, &name, service_id.as_deref(), action).await;
        match result {
            Ok(()) => tracing::info!(node = %name, action = %action, "done"),
            Err(e) => {
                tracing::warn!(node = %name, action = %action, error = %e, "action failed");
                failures.push(format!("{action}: {e}"));
            }
        }
    }

    let new_status = compose(&status, &decision, &agent, &nova, hv.metadata.generation, now);
    if new_status != status {
        let written = write_status(&ctx.client, &name, &new_status).await?;
        ctx.written.remember(hv.metadata.resource_version.clone(), written);
    }
    let reference = hv.object_ref(&());
    if let Some(t) = &decision.transition {
        tracing::info!(node = %name, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "phase changed");
        publish(
            &ctx,
            &reference,
            EventType::Normal,
            t.to.as_str(),
            &format!("{} -> {}: {}", t.from.as_str(), t.to.as_str(), t.reason),
        )
        .await;
        let mut updated = (*hv).clone();
        updated.status = Some(new_status.clone());
        let ev = pb::HypervisorEvent {
            hypervisor: Some(to_proto(&updated, &ctx.registry)),
            previous_phase: t.from.as_str().to_string(),
            reason: t.reason.clone(),
            ..Default::default()
        };
        let _ = ctx.events.send(ev);
    }
    for drift in &decision.drift {
        tracing::warn!(node = %name, drift = %drift, "Nova drifted; repairing");
        publish(&ctx, &reference, EventType::Warning, "DriftRepaired", drift).await;
    }
    for failure in &failures {
        publish(&ctx, &reference, EventType::Warning, "ActionFailed", failure).await;
    }
    ctx.health.set_node(&name, decision.phase == Phase::Active && agent.connected).await;
    if let Some(keep) = super::nodes::release(node, decision.phase, new_status.service_id.as_deref(), &nova) {
        super::nodes::let_go(&ctx.client, &name, keep).await?;
    }

    let unreachable = matches!(nova, NovaObs::Unreachable(_));
    let next = if decision.transition.is_some() {
        Duration::from_millis(200)
    } else if !failures.is_empty() || unreachable {
        ctx.intervals.retry
    } else if decision.actions.iter().any(|a| !matches!(a, Action::RunChecks { .. })) {
        // Look at the result of what we just changed soon.
        Duration::from_secs(1)
    } else {
        match decision.phase {
            // Evicting moves when its Eviction does, and that change triggers
            // a reconcile; between them only drift matters.
            Phase::Active | Phase::Maintenance | Phase::Evicting => ctx.intervals.drift,
            Phase::Aborted | Phase::Decommissioned => ctx.intervals.drift * 5,
            _ => ctx.intervals.busy,
        }
    };
    Ok(Requeue::requeue(next))
}

pub fn error_policy(hv: Arc<Hypervisor>, error: &Error, ctx: Arc<Context>) -> Requeue {
    tracing::warn!(node = %hv.name_any(), error = %error, "reconcile failed");
    Requeue::requeue(ctx.intervals.retry)
}

async fn execute(
    ctx: &Context,
    hv: &Hypervisor,
    name: &str,
    service_id: Option<&str>,
    action: &Action,
) -> Result<(), String> {
    match action {
        Action::RunChecks { run } => {
            if ctx.registry.run_checks(name, *run, super::check_config(&hv.spec)) {
                Ok(())
            } else {
                Err("the agent is not connected".into())
            }
        }
        Action::CreateEviction { name: ev, reason } => {
            let api: Api<Eviction> = Api::all(ctx.client.clone());
            let mut eviction = Eviction::new(
                ev,
                EvictionSpec {
                    hypervisor: name.to_string(),
                    reason: *reason,
                    options: EvictionOptions::default(),
                },
            );
            eviction.metadata.owner_references = hv.controller_owner_ref(&()).map(|o| vec![o]);
            match api
                .create(
                    &PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() },
                    &eviction,
                )
                .await
            {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
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
        _ => ctx.nova.execute(name, service_id, action).await.map_err(|e| e.to_string()),
    }
}

/// The Node from the cache; a Node missing from the cache is confirmed
/// absent by a direct read (the cache may lag behind a new Node).
async fn observe_node(ctx: &Context, name: &str) -> Result<NodeObs, Error> {
    let node = match ctx.nodes.get(&ObjectRef::new(name)) {
        Some(n) => Some((*n).clone()),
        None => Api::<Node>::all(ctx.client.clone()).get_opt(name).await?,
    };
    Ok(match node {
        None => NodeObs::Absent,
        Some(n) if n.metadata.deletion_timestamp.is_some() => NodeObs::Deleting,
        Some(n) => NodeObs::Present { ready: node_ready(&n) },
    })
}

pub(super) fn node_ready(n: &Node) -> bool {
    let conditions = n.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The Eviction named in our record, else a running one aimed at the node.
fn observe_eviction(store: &Store<Eviction>, node: &str, status: &HypervisorStatus) -> Option<EvictionObs> {
    let named = status.lifecycle.eviction.as_ref().and_then(|r| store.get(&ObjectRef::new(&r.name)));
    let ev = named.or_else(|| {
        store.state().into_iter().find(|e| {
            e.spec.hypervisor == node
                && !e.status.as_ref().and_then(|s| s.phase).unwrap_or_default().is_final()
        })
    })?;
    let st = ev.status.clone().unwrap_or_default();
    Some(EvictionObs {
        name: ev.name_any(),
        reason: ev.spec.reason,
        re_enable: ev.spec.reason.re_enables(ev.spec.options.re_enable),
        phase: st.phase.unwrap_or(EvictionPhase::default()),
        message: st
            .conditions
            .iter()
            .find(|c| c.status != "True")
            .map(|c| c.message.clone())
            .unwrap_or_default(),
        migrated: st.migrated,
        total: st.total,
        deleting: ev.metadata.deletion_timestamp.is_some(),
    })
}

async fn write_status(
    client: &kube::Client,
    name: &str,
    status: &HypervisorStatus,
) -> Result<Hypervisor, Error> {
    let api: Api<Hypervisor> = Api::all(client.clone());
    let patch = serde_json::json!({
        "apiVersion": "hypervisor.cloud.sap/v1alpha1",
        "kind": "Hypervisor",
        "status": status,
    });
    Ok(api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?)
}

async fn publish(
    ctx: &Context,
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
    if let Err(e) = ctx.recorder.publish(&ev, reference).await {
        tracing::warn!(reason, error = %e, "could not record a Kubernetes Event");
    }
}
