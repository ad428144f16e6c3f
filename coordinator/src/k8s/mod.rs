//! The Kubernetes side: the Node watcher that creates a Hypervisor for each
//! selected Node ([`nodes`]), the Hypervisor controller ([`hypervisor`]), the
//! Eviction controller ([`eviction`]), what wakes them ([`triggers`]), the one
//! way status and finalizers are written ([`write`]), how many writes leave
//! at once ([`write_slots`]), the status the
//! lifecycle composes ([`status`]), leader election ([`leader`]) and the
//! leader's pod label ([`leader_pod`]); each reconcile in its span and
//! counted ([`measured`]), taking turns ([`turns`]); what the caches drop
//! ([`trim`]).

pub mod acting;
pub mod claims;
pub mod cluster_api;
pub mod dependencies;
pub mod drain_marks;
pub mod eviction;
pub mod fence;
mod fence_fleet;
pub mod guards;
pub mod ha;
pub mod hibernation;
pub mod host_software;
pub mod hypervisor;
pub mod identity;
pub mod kubelet;
pub mod leader;
pub mod leader_pod;
pub mod measured;
pub mod nodes;
pub mod nova_hosts;
pub mod power;
pub mod protected_pods;
pub mod publish_ca;
pub mod retire;
pub mod status;
pub mod triggers;
pub mod trim;
pub mod turns;
pub mod updates;
pub mod webhook;
pub mod write;
pub mod write_slots;
pub mod written;

#[cfg(test)]
mod shell_tests;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::StreamExt;
use hv_proto::v1::{BridgeExpectation, CheckConfig};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::eviction::VmState;
use crate::api::hypervisor::HypervisorSpec;
use crate::api::keys::PAUSED_ANNOTATION;
use crate::api::{Eviction, Hypervisor, Migration};

pub use hypervisor::{Context, FIELD_MANAGER, Intervals};
pub use nodes::Template;

/// What the agent must check for this node, from its spec (docs/checks.md).
pub fn check_config(spec: &HypervisorSpec) -> CheckConfig {
    let expectations = spec.ovs.expectations.iter().map(|e| BridgeExpectation {
        bridge: e.bridge.clone(),
        fail_mode: e.fail_mode.map(|m| m.as_str().to_string()).unwrap_or_default(),
        datapath_type: e.datapath_type.clone(),
        ports: e.ports.clone(),
        external_ids: e.external_ids.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    });
    CheckConfig {
        min_libvirt_version: spec.libvirt.minimum_version.clone(),
        bridges: spec.ovs.bridges.clone(),
        optional_bridges: spec.ovs.optional_bridges.clone(),
        ceph_pools: spec.ceph.pools.clone(),
        start_test_domain: true,
        bridge_expectations: expectations.collect(),
        ovs_external_ids: spec.ovs.external_ids.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// Whether the controllers may decide now: every cache they read has its
/// first full list, and this replica provably holds the leader lease.
/// Before the caches are whole, an object missing from one is unknown, not
/// absent (a host mid-eviction must not be re-enabled because its Eviction
/// is not cached yet); once the lease lapses, a deposed leader asks nothing
/// more of anyone.
#[derive(Debug)]
pub struct Gate {
    synced: AtomicBool,
    filled: tokio::sync::Notify,
    lease: Arc<leader::LeaseGuard>,
    /// `--mode observe`: decide and report, act on nothing outside our
    /// own custom resources (crate::lifecycle::hands).
    observing: bool,
}

impl Gate {
    pub fn new(lease: Arc<leader::LeaseGuard>) -> Gate {
        Gate { synced: AtomicBool::new(false), filled: tokio::sync::Notify::new(), lease, observing: false }
    }

    /// The install observes only (`--mode observe`).
    pub fn observing(mut self, on: bool) -> Gate {
        self.observing = on;
        self
    }

    pub fn observes(&self) -> bool {
        self.observing
    }

    /// Ok when a call outside the Kubernetes API that changes something (a
    /// BMC's, Ceph's) may leave now: this replica leads at this very moment
    /// and the install acts.
    pub fn may_act(&self) -> Result<(), String> {
        if self.observing {
            return Err("not sent: this install observes only (--mode observe)".into());
        }
        self.lease.ensure()
    }

    pub fn open(&self) -> bool {
        self.synced.load(Ordering::Acquire) && self.lease.holds()
    }

    /// The caches are whole: the controllers may decide once the lease holds.
    fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
        self.filled.notify_waiters();
    }

    /// Returns once the caches are whole, or after `at_most`. A reconcile
    /// waits here rather than asking again every half second: while a new
    /// leader of thousands of hosts lists its caches for minutes, thousands
    /// of reconciles a second would take the cores the lists need.
    pub async fn until_synced(&self, at_most: std::time::Duration) {
        let filled = self.filled.notified();
        let mut filled = std::pin::pin!(filled);
        filled.as_mut().enable();
        if self.synced.load(Ordering::Acquire) {
            return;
        }
        let _ = tokio::time::timeout(at_most, filled).await;
    }
}

/// The writing ends of the caches the controllers read ([`Context`]'s stores).
pub struct Writers {
    pub hypervisors: reflector::store::Writer<Hypervisor>,
    pub nodes: reflector::store::Writer<Node>,
    pub evictions: reflector::store::Writer<Eviction>,
    pub migrations: reflector::store::Writer<Migration>,
}

/// What wakes the controllers beside their own watches, by name.
pub struct Wakes {
    /// Nodes whose agent session changed: their Hypervisor's reconcile.
    pub sessions: mpsc::UnboundedReceiver<String>,
    /// Nodes whose protected pods changed: their drain marks.
    pub protected_pods: mpsc::UnboundedReceiver<String>,
    /// Evictions to reconcile now.
    pub evictions: mpsc::UnboundedReceiver<String>,
}

/// Runs the Node watcher and the Hypervisor, Eviction and drain marks
/// controllers until `stop` turns true. `watch_client` serves the watches
/// (no read timeout); the contexts' clients serve requests.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    watch_client: kube::Client,
    ctx: Arc<Context>,
    ev_ctx: Arc<eviction::EvictionContext>,
    node_selector: String,
    template: Template,
    writers: Writers,
    wakes: Wakes,
    concurrency: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let (node_tx, node_rx) = mpsc::unbounded_channel::<String>();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<String>();
    let (marks_tx, marks_rx) = mpsc::unbounded_channel::<Hypervisor>();
    let (guards_tx, guards_rx) = mpsc::unbounded_channel::<Hypervisor>();
    let (node_marks_tx, node_marks_rx) = mpsc::unbounded_channel::<Node>();
    let wc = &watch_client;
    // This install's Hypervisors only (crate::api::keys::INSTANCE_LABEL), those it
    // managed before installs were named adopted first.
    adopt(&ctx.client, &node_selector, &template.instance).await;
    let ours = watcher::Config::default().labels(&nodes::instance_selector(&template.instance));
    let hypervisors = watcher(Api::<Hypervisor>::all(wc.clone()), ours)
        .default_backoff()
        .modify(trim::unmanaged)
        .reflect(writers.hypervisors)
        .applied_objects()
        // Every change, for the drain marks' (and guards') own trigger.
        .inspect(move |hv| {
            if let Ok(hv) = hv {
                let _ = marks_tx.send(hv.clone());
                // Without guards, nobody receives: the send fails at once.
                let _ = guards_tx.send(hv.clone());
            }
        })
        .predicate_filter(triggers::hypervisor, Default::default());
    let woken = [wakes.sessions, node_rx, ev_rx];
    let hypervisor_controller = hypervisors_controlled(hypervisors, woken, &ctx, concurrency, stop.clone());
    let eviction_controller = evictions_controlled(wc, wakes.evictions, &ev_ctx, concurrency, stop.clone());
    let marks_controller =
        marks_controlled(marks_rx, node_marks_rx, wakes.protected_pods, &ctx, concurrency, stop.clone());
    let guards = guards_controlled(wc, guards_rx, &ctx, stop);
    let machines = machines_watched(wc, &ctx, &template.instance);
    tokio::select! {
        _ = hypervisor_controller => {}
        _ = eviction_controller => {}
        _ = marks_controller => {}
        _ = guards => {}
        _ = machines => {}
        _ = hibernation::run(ctx.clone(), ev_ctx.hibernation.clone(), ev_ctx.hibernation_interval) => {}
        _ = watch_nodes(wc, &ctx, &node_selector, &template, writers.nodes, node_tx, node_marks_tx) => {}
        _ = watch_evictions(wc, writers.evictions, ev_tx) => {}
        _ = cache_migrations(wc, writers.migrations) => {}
        _ = crate::k8s::protected_pods::free_elsewhere(
            ctx.client.clone(), ctx.pods.clone(), ctx.hypervisors.clone(), ctx.nodes.clone(), ctx.gate.clone(),
        ) => {}
        // Never ends unless the caches cannot sync: a branch that ended
        // would drop the controllers, and the coordinator exits.
        _ = async { if sync(&ctx, &ev_ctx).await { std::future::pending::<()>().await } } => {}
    }
}

/// The Hypervisor controller over `hypervisors` (its watch, filtered by
/// `triggers::hypervisor`), woken also by node names from `wakes`; each
/// reconcile in its turn, measured.
fn hypervisors_controlled(
    hypervisors: impl futures_util::Stream<Item = Result<Hypervisor, watcher::Error>> + Send + 'static,
    wakes: [mpsc::UnboundedReceiver<String>; 3],
    ctx: &Arc<Context>,
    concurrency: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    let turns = Arc::new(tokio::sync::Semaphore::new(usize::from(concurrency)));
    let waiting = ctx.metrics.reconciles.waiting("hypervisor");
    let to_ref = |n: String| ObjectRef::<Hypervisor>::new(&n);
    let woken = futures_util::stream::select_all(wakes.map(UnboundedReceiverStream::new)).map(to_ref);
    Controller::for_stream(hypervisors, ctx.hypervisors.clone())
        .reconcile_on(woken)
        .graceful_shutdown_on(stopped(stop))
        .run(
            move |hv, ctx| {
                let span = tracing::info_span!("reconcile", controller = "hypervisor", node = %hv.name_any());
                let metrics = ctx.metrics.reconciles.clone();
                let (queue, waiting) = (turns.clone(), waiting.clone());
                async move {
                    turns::in_turn(&queue, &waiting, || {
                        // As the cache holds it now, not as it was when the
                        // reconcile began to wait for its turn.
                        let hv = turns::latest(&ctx.hypervisors, hv);
                        measured::measured("hypervisor", &metrics, span, hypervisor::reconcile(hv, ctx))
                    })
                    .await
                }
            },
            hypervisor::error_policy,
            ctx.clone(),
        )
        .for_each(|res| log_result("hypervisor controller", res))
}

/// The Eviction controller, over a watch and cache of its own (woken by
/// `triggers::eviction_own`), and by names from `wake`.
fn evictions_controlled(
    watch_client: &kube::Client,
    wake: mpsc::UnboundedReceiver<String>,
    ev_ctx: &Arc<eviction::EvictionContext>,
    concurrency: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    let turns = Arc::new(tokio::sync::Semaphore::new(usize::from(concurrency)));
    let waiting = ev_ctx.metrics.reconciles.waiting("eviction");
    let (own_evictions, own_writer) = reflector::store::<Eviction>();
    let cached = own_evictions.clone();
    let evictions = watcher(Api::<Eviction>::all(watch_client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(trim::unmanaged)
        .reflect(own_writer)
        .applied_objects()
        .predicate_filter(triggers::eviction_own, Default::default());
    Controller::for_stream(evictions, own_evictions)
        .reconcile_on(UnboundedReceiverStream::new(wake).map(|n| ObjectRef::<Eviction>::new(&n)))
        .graceful_shutdown_on(stopped(stop))
        .run(
            move |ev, ctx| {
                let span =
                    tracing::info_span!("reconcile", controller = "eviction", eviction = %ev.name_any());
                let metrics = ctx.metrics.reconciles.clone();
                let (queue, waiting, cached) = (turns.clone(), waiting.clone(), cached.clone());
                async move {
                    turns::in_turn(&queue, &waiting, || {
                        let ev = turns::latest(&cached, ev);
                        measured::measured("eviction", &metrics, span, eviction::reconcile(ev, ctx))
                    })
                    .await
                }
            },
            eviction::error_policy,
            ev_ctx.clone(),
        )
        .for_each(|res| log_result("eviction controller", res))
}

/// The drain marks' controller ([`drain_marks`]): woken by a change of a
/// Hypervisor's `status.evictable` (`triggers::marks`), of a Node's marks
/// (`triggers::node_marks`), and of a Node's protected pods.
fn marks_controlled(
    hypervisors: mpsc::UnboundedReceiver<Hypervisor>,
    nodes: mpsc::UnboundedReceiver<Node>,
    pods: mpsc::UnboundedReceiver<String>,
    ctx: &Arc<Context>,
    concurrency: u16,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send {
    let marks = Arc::new(drain_marks::MarksContext {
        client: ctx.client.clone(),
        nodes: ctx.nodes.clone(),
        pods: ctx.pods.clone(),
        node_locks: ctx.node_locks.clone(),
        gate: ctx.gate.clone(),
        drift: ctx.intervals.drift,
        own_reads: ctx.own_reads.clone(),
    });
    let metrics = ctx.metrics.reconciles.clone();
    let changes = UnboundedReceiverStream::new(hypervisors)
        .map(Ok::<_, watcher::Error>)
        .predicate_filter(triggers::marks, Default::default());
    let to_ref = |n: String| ObjectRef::<Hypervisor>::new(&n);
    let nodes = UnboundedReceiverStream::new(nodes)
        .map(Ok::<_, watcher::Error>)
        .predicate_filter(triggers::node_marks, Default::default())
        .filter_map(|n| std::future::ready(n.ok().map(|n| n.name_any())));
    let pods = UnboundedReceiverStream::new(pods);
    let config = kube::runtime::controller::Config::default().concurrency(concurrency);
    Controller::for_stream(changes, ctx.hypervisors.clone())
        .with_config(config)
        .reconcile_on(futures_util::stream::select(nodes, pods).map(to_ref))
        .graceful_shutdown_on(stopped(stop))
        .run(
            move |hv, marks| {
                let span =
                    tracing::info_span!("reconcile", controller = "drain-marks", node = %hv.name_any());
                let metrics = metrics.clone();
                async move {
                    measured::measured("drain-marks", &metrics, span, drain_marks::reconcile(hv, marks)).await
                }
            },
            drain_marks::error_policy,
            marks,
        )
        .for_each(|res| log_result("drain marks controller", res))
}

/// Cluster API's Machines ([`cluster_api`]), with the `cluster-api`
/// update signal; else never ends.
fn machines_watched(
    watch_client: &kube::Client,
    ctx: &Arc<Context>,
    instance: &str,
) -> impl std::future::Future<Output = ()> + Send + use<> {
    if !ctx.updates.signals.cluster_api() {
        return futures_util::future::Either::Left(std::future::pending());
    }
    let machines = cluster_api::MachinesContext {
        client: ctx.client.clone(),
        hypervisors: ctx.hypervisors.clone(),
        nodes: ctx.nodes.clone(),
        own_reads: ctx.own_reads.clone(),
        gate: ctx.gate.clone(),
        instance: instance.to_string(),
        look: ctx.intervals.drift.min(std::time::Duration::from_secs(10)),
    };
    futures_util::future::Either::Right(cluster_api::run(watch_client.clone(), machines))
}

/// The drain guards' controller ([`guards`]) and its watch of their
/// Deployments, when the install keeps guards; else never ends.
fn guards_controlled(
    watch_client: &kube::Client,
    hypervisors: mpsc::UnboundedReceiver<Hypervisor>,
    ctx: &Arc<Context>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + use<> {
    // Without guards the receiver goes here, and nothing is queued for it.
    let Some(config) = ctx.guard.clone() else {
        drop(hypervisors);
        return futures_util::future::Either::Left(std::future::pending());
    };
    let (wake_tx, wake_rx) = mpsc::unbounded_channel();
    let (deployments, watched) = guards::watch(watch_client, &config, wake_tx);
    let guard_ctx = Arc::new(guards::GuardContext {
        client: ctx.client.clone(),
        config,
        deployments,
        nodes: ctx.nodes.clone(),
        own_reads: ctx.own_reads.clone(),
        gate: ctx.gate.clone(),
        drift: ctx.intervals.drift,
    });
    let controller = guards::controlled(
        hypervisors,
        wake_rx,
        ctx.hypervisors.clone(),
        guard_ctx,
        ctx.metrics.clone(),
        stopped(stop),
    );
    futures_util::future::Either::Right(async move {
        tokio::select! {
            _ = watched => {}
            _ = controller => {}
        }
    })
}

/// `nodes::adopt_unlabelled`, again every 2 s until it succeeds: the
/// caches, and so the gate, wait for it.
async fn adopt(client: &kube::Client, selector: &str, instance: &str) {
    loop {
        match nodes::adopt_unlabelled(client, selector, instance).await {
            Ok(0) => return,
            Ok(n) => return tracing::info!(adopted = n, instance, "adopted the Hypervisors of no install"),
            Err(e) => {
                tracing::warn!(error = %e, "could not adopt the Hypervisors of no install; trying again")
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
}

async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

async fn log_result<T, E: std::fmt::Display>(what: &'static str, res: Result<T, E>) {
    if let Err(e) = res {
        tracing::debug!(error = %e, what, "controller");
    }
}

/// Nodes: a cache for the Hypervisor controller, a Hypervisor for each new
/// one, and a reconcile of its Hypervisor when what the lifecycle reads of
/// the Node changes (`triggers::node`), not on every kubelet write.
///
/// A Node the Hypervisor cache vouches for (`nodes::settled`) costs no
/// request, so a new leader's Node list is not held up by a GET per Node
/// (held long enough, it outlives etcd's compaction and starts over). The
/// Nodes are read once that cache holds its first list: it is swapped in
/// whole, and an empty one vouches for nothing.
async fn watch_nodes(
    watch_client: &kube::Client,
    ctx: &Context,
    selector: &str,
    template: &Template,
    writer: reflector::store::Writer<Node>,
    wake: mpsc::UnboundedSender<String>,
    marks: mpsc::UnboundedSender<Node>,
) {
    if ctx.hypervisors.wait_until_ready().await.is_err() {
        return tracing::error!("the Hypervisor cache can never fill; Nodes are not watched");
    }
    let signals = ctx.updates.signals.clone();
    let nodes = watcher(Api::<Node>::all(watch_client.clone()), watcher::Config::default().labels(selector))
        .default_backoff()
        .modify(trim::node)
        .reflect(writer)
        .applied_objects()
        // Every change, for the drain marks' own trigger.
        .inspect(move |n| {
            if let Ok(n) = n {
                let _ = marks.send(n.clone());
            }
        })
        .predicate_filter(move |n: &Node| triggers::node(n, &signals), Default::default());
    let mut nodes = std::pin::pin!(nodes);
    while let Some(item) = nodes.next().await {
        match item {
            Ok(node) => {
                let cached =
                    node.metadata.name.as_deref().and_then(|n| ctx.hypervisors.get(&ObjectRef::new(n)));
                // No Node write for a host whose hands are off.
                let paused = cached.as_ref().is_some_and(|h| h.annotations().contains_key(PAUSED_ANNOTATION));
                let finalize = !ctx.gate.observes() && !paused;
                if !nodes::settled(&node, cached.as_deref(), &template.instance, finalize) {
                    nodes::ensure_hypervisor(&ctx.client, &node, template, finalize).await;
                }
                if let Some(name) = node.metadata.name {
                    let _ = wake.send(name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "node watch"),
        }
    }
}

/// Evictions: a cache, and a reconcile of the Hypervisor they target when
/// what the lifecycle reads of them changes (`triggers::eviction`).
async fn watch_evictions(
    watch_client: &kube::Client,
    writer: reflector::store::Writer<Eviction>,
    wake: mpsc::UnboundedSender<String>,
) {
    let evictions = watcher(Api::<Eviction>::all(watch_client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(trim::unmanaged)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(triggers::eviction, Default::default());
    let mut evictions = std::pin::pin!(evictions);
    while let Some(item) = evictions.next().await {
        match item {
            Ok(ev) => {
                let _ = wake.send(ev.spec.hypervisor.clone());
            }
            Err(e) => tracing::warn!(error = %e, "eviction watch"),
        }
    }
}

/// Migrations: a cache for the Eviction controller (the per-attempt records).
async fn cache_migrations(watch_client: &kube::Client, writer: reflector::store::Writer<Migration>) {
    watcher(Api::<Migration>::all(watch_client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(trim::unmanaged)
        .reflect(writer)
        .applied_objects()
        .for_each(|_| async {})
        .await;
}

/// How long the first decisions wait for the protected pods' first lists.
const PODS_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits for every cache's first list, seeds the cluster migration limit
/// with what is in flight (a previous leader's migrations count from the
/// start), then lets the controllers decide. False when a cache can never
/// sync (its writer is gone): nothing would ever be decided.
async fn sync(ctx: &Context, ev_ctx: &eviction::EvictionContext) -> bool {
    let ready = futures_util::future::join4(
        ctx.hypervisors.wait_until_ready(),
        ctx.nodes.wait_until_ready(),
        ctx.evictions.wait_until_ready(),
        ev_ctx.migrations.wait_until_ready(),
    )
    .await;
    // The protected pods too, for a while: a host freed before its pods
    // were seen would free none. A watch that cannot list (no RBAC for
    // pods) must not stop fencing and evictions: past the wait, the
    // coordinator decides without them, and the budgets, which fail
    // closed, keep holding the pods it cannot label.
    let pods = tokio::time::timeout(PODS_WAIT, ctx.pods.wait_until_ready()).await;
    match pods {
        Ok(true) => {}
        Ok(false) => tracing::error!("a protected pod watch went away before its first list"),
        Err(_) => tracing::error!(
            waited = ?PODS_WAIT,
            "the protected pods could not be listed; deciding without them: their disruption budgets hold them"
        ),
    }
    if ready.0.is_err() || ready.1.is_err() || ready.2.is_err() || ready.3.is_err() {
        tracing::error!("a cache's writer went away before its first list");
        return false;
    }
    let in_flight = ctx.evictions.state().into_iter().map(|e| {
        let moving =
            e.status.as_ref().map_or(0, |s| s.vms.iter().filter(|v| v.state == VmState::Migrating).count());
        let evacuating = e.status.as_ref().is_some_and(|s| s.evacuating);
        (kube::ResourceExt::name_any(e.as_ref()), u32::try_from(moving).unwrap_or(u32::MAX), evacuating)
    });
    ev_ctx.limit.seed(in_flight);
    ctx.gate.mark_synced();
    tracing::info!("caches synced; deciding");
    true
}
