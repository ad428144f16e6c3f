//! The drain guards (docs/drain.md), a controller of their own: one small
//! Deployment per hypervisor, kept as [`crate::drain::guard`] says. Its pod
//! is one of the hypervisor's protected pods (the chart's budget and the
//! eviction webhook hold it; the drain marks label it), so a drain that
//! skips DaemonSet pods waits on it until the host is emptied and held.
//! Woken when a Hypervisor's phase or `status.evictable` changes, when a
//! guard Deployment changes or goes, and every drift interval (a cordon is
//! seen then).

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::Gate;
use crate::api::Hypervisor;
use crate::api::keys::PAUSED_ANNOTATION;
use crate::drain::guard::{self, GuardConfig, Step};
use crate::lifecycle::hands::Hands;

/// Longest a reconcile waits for the caches to be whole before it is
/// asked again.
const GATE_WAIT: Duration = Duration::from_secs(5);

/// How soon a guard not written is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// The field manager of the guards' server-side apply.
const MANAGER: &str = "hv-coordinator";

pub struct GuardContext {
    pub client: kube::Client,
    pub config: GuardConfig,
    /// The install's guards, cached (their namespace, their labels).
    pub deployments: Store<Deployment>,
    /// The Nodes (a cordon), and the hosts this leader found free.
    pub nodes: Store<k8s_openapi::api::core::v1::Node>,
    pub own_reads: Arc<super::drain_marks::OwnReads>,
    pub gate: Arc<Gate>,
    /// How often a guard is compared with what is wanted though nothing
    /// changed (`--drift-interval`).
    pub drift: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Hypervisor has no uid yet")]
    NoUid,
}

impl super::measured::ErrorKind for Error {
    fn kind(&self) -> &'static str {
        match self {
            Error::Kube(e) => super::measured::kube_error_kind(e),
            Error::NoUid => "no_uid",
        }
    }
}

/// Observe the host's guard, decide, write it.
pub async fn reconcile(hv: Arc<Hypervisor>, ctx: Arc<GuardContext>) -> Result<Requeue, Error> {
    if !ctx.gate.open() {
        ctx.gate.until_synced(GATE_WAIT).await;
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    // Until the guards' first list, a guard there would look missing.
    if tokio::time::timeout(GATE_WAIT, ctx.deployments.wait_until_ready()).await.is_err() {
        tracing::warn!("the drain guards are not listed yet (is `list` on deployments granted?)");
        return Ok(Requeue::requeue(RETRY));
    }
    let node = hv.name_any();
    // Hands off, or an install that observes: nothing of the host is written.
    let paused = hv.annotations().get(PAUSED_ANNOTATION).map(String::as_str);
    if !Hands::of(ctx.gate.observes(), paused).free() {
        return Ok(Requeue::requeue(ctx.drift));
    }
    let have = ctx.deployments.get(&ObjectRef::new(&guard::name(&node)).within(&ctx.config.namespace));
    let step = guard::step(have.as_deref(), wanted(&ctx, &hv, &node)?);
    act(&ctx, &node, step, have.is_some()).await?;
    Ok(Requeue::requeue(ctx.drift))
}

/// The guard the host should have: one pod, none while it is freed for
/// drains (this leader's own read) and cordoned; None once it has none.
fn wanted(ctx: &GuardContext, hv: &Hypervisor, node: &str) -> Result<Option<Deployment>, Error> {
    let phase = hv.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
    let freed = hv.status.as_ref().and_then(|s| s.evictable) == Some(true) && ctx.own_reads.free(node);
    let cordoned = ctx
        .nodes
        .get(&ObjectRef::new(node))
        .is_some_and(|n| n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false));
    let replicas = guard::replicas(freed, cordoned);
    Ok(match guard::wanted(phase) {
        true => Some(guard::deployment(&ctx.config, node, owner(hv)?, replicas)),
        false => None,
    })
}

/// Writes what [`guard::step`] says: a guard missing is made (one the
/// cache has not shown yet is written over), one that differs written
/// whole, one not wanted removed.
async fn act(ctx: &GuardContext, node: &str, step: Step, cached: bool) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ctx.config.namespace);
    let name = guard::name(node);
    match step {
        Step::Keep => {}
        Step::Write(d) => {
            let made = !cached
                && match api
                    .create(&PostParams { field_manager: Some(MANAGER.into()), ..Default::default() }, &d)
                    .await
                {
                    Ok(_) => true,
                    Err(kube::Error::Api(s)) if s.code == 409 => false,
                    Err(e) => return Err(e.into()),
                };
            if !made {
                api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&*d)).await?;
            }
            tracing::info!(node, guard = %name, made, "drain guard written");
        }
        Step::Remove => {
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                ..Default::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => tracing::info!(node, guard = %name, "drain guard removed"),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// A guard not written is tried again soon, not a drift interval later.
pub fn error_policy(hv: Arc<Hypervisor>, error: &Error, ctx: Arc<GuardContext>) -> Requeue {
    tracing::warn!(node = %hv.name_any(), error = %error, "drain guard not written");
    Requeue::requeue(RETRY.min(ctx.drift))
}

/// The Hypervisor as the guard's controlling owner: the garbage collector
/// removes the guard with it.
fn owner(hv: &Hypervisor) -> Result<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference, Error> {
    hv.controller_owner_ref(&()).ok_or(Error::NoUid)
}

/// The install's guards, watched in their namespace; a change wakes the
/// guard's host (`wake`).
pub fn watch(
    watch_client: &kube::Client,
    config: &GuardConfig,
    wake: mpsc::UnboundedSender<String>,
) -> (Store<Deployment>, impl std::future::Future<Output = ()> + Send + use<>) {
    let (store, writer) = reflector::store();
    let api: Api<Deployment> = Api::namespaced(watch_client.clone(), &config.namespace);
    let labels = guard::selector(&config.instance);
    let stream = watcher(api, watcher::Config::default().labels(&labels))
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    let run = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(d) => {
                    if let Some(node) = d.annotations().get(guard::NODE_ANNOTATION) {
                        let _ = wake.send(node.clone());
                    }
                }
                Err(e) => tracing::warn!(error = %e, "drain guards' watch"),
            }
        }
    };
    (store, run)
}

/// The guards' controller: woken by a Hypervisor whose phase changed
/// (`hypervisors`), and by the host of a guard that changed (`woken`).
pub fn controlled(
    hypervisors: mpsc::UnboundedReceiver<Hypervisor>,
    woken: mpsc::UnboundedReceiver<String>,
    cache: Store<Hypervisor>,
    ctx: Arc<GuardContext>,
    metrics: Arc<crate::metrics::Metrics>,
    stop: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> + Send {
    let changes = UnboundedReceiverStream::new(hypervisors)
        .map(Ok::<_, watcher::Error>)
        .predicate_filter(super::triggers::guard, Default::default());
    let woken = UnboundedReceiverStream::new(woken).map(|n| ObjectRef::<Hypervisor>::new(&n));
    Controller::for_stream(changes, cache)
        .reconcile_on(woken)
        .graceful_shutdown_on(stop)
        .run(
            move |hv, ctx| {
                let span = tracing::info_span!("reconcile", controller = "drain-guard", node = %hv.name_any());
                let metrics = metrics.reconciles.clone();
                async move { super::measured::measured("drain-guard", &metrics, span, reconcile(hv, ctx)).await }
            },
            error_policy,
            ctx,
        )
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "drain guard controller");
            }
        })
}
