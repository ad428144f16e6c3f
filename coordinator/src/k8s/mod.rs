//! The Kubernetes side: the Node watcher that creates a Hypervisor for each
//! selected Node ([`nodes`]), the Hypervisor controller ([`hypervisor`]),
//! the status it writes ([`status`]) and leader election ([`leader`]).

pub mod eviction;
pub mod hypervisor;
pub mod leader;
pub mod nodes;
pub mod status;
pub mod written;

use std::sync::Arc;

use futures_util::StreamExt;
use hv_proto::v1::CheckConfig;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, predicates, watcher};
use tokio::sync::mpsc;

use crate::api::hypervisor::HypervisorSpec;
use crate::api::{Eviction, Hypervisor, Migration};

pub use hypervisor::{Context, FIELD_MANAGER, Intervals, RETRY_ANNOTATION};
pub use nodes::Template;

/// What the agent must check for this node, from its spec (DESIGN.md section 3).
pub fn check_config(spec: &HypervisorSpec) -> CheckConfig {
    CheckConfig {
        min_libvirt_version: spec.libvirt.minimum_version.clone(),
        bridges: spec.ovs.bridges.clone(),
        optional_bridges: spec.ovs.optional_bridges.clone(),
        ceph_pools: spec.ceph.pools.clone(),
        start_test_domain: true,
    }
}

/// The writing ends of the caches the controller reads ([`Context`]'s stores).
pub struct Writers {
    pub hypervisors: reflector::store::Writer<Hypervisor>,
    pub nodes: reflector::store::Writer<Node>,
    pub evictions: reflector::store::Writer<Eviction>,
    pub migrations: reflector::store::Writer<Migration>,
}

/// Runs the Node watcher and the Hypervisor and Eviction controllers until `stop` turns true.
/// `changed` carries node names the agent sessions want reconciled.
pub async fn run(
    ctx: Arc<Context>,
    ev_ctx: Arc<eviction::EvictionContext>,
    node_selector: String,
    template: Template,
    writers: Writers,
    changed: mpsc::UnboundedReceiver<String>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let client = ctx.client.clone();
    let hv_api: Api<Hypervisor> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let ev_api: Api<Eviction> = Api::all(client.clone());

    // Nodes: a cache for the controller, a Hypervisor for each new one, and a
    // reconcile of the Hypervisor when what the lifecycle reads of its Node
    // changes (Ready, deletion). Not on every Node update: kubelets write
    // their Node every few seconds, and each reconcile asks Nova six questions.
    let (node_tx, node_rx) = mpsc::unbounded_channel::<String>();
    let nodes = watcher(node_api, watcher::Config::default().labels(&node_selector))
        .default_backoff()
        .reflect(writers.nodes)
        .applied_objects()
        .predicate_filter(
            |n: &Node| {
                let ready = u64::from(hypervisor::node_ready(n));
                let deleting = u64::from(n.metadata.deletion_timestamp.is_some());
                Some(1 + ready + 2 * deleting)
            },
            Default::default(),
        );
    let creator = {
        let client = client.clone();
        async move {
            let mut nodes = std::pin::pin!(nodes);
            while let Some(item) = nodes.next().await {
                match item {
                    Ok(node) => {
                        nodes::ensure_hypervisor(&client, &node, &template).await;
                        if let Some(name) = node.metadata.name {
                            let _ = node_tx.send(name);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "node watch"),
                }
            }
        }
    };
    // Evictions: a cache, and a reconcile of the Hypervisor they target
    // when what the lifecycle reads of them changes (phase, counts, deletion).
    let (ev_tx, ev_rx) = mpsc::unbounded_channel::<String>();
    let evictions = watcher(ev_api, watcher::Config::default())
        .default_backoff()
        .reflect(writers.evictions)
        .applied_objects()
        .predicate_filter(
            |e: &Eviction| {
                let st = e.status.clone().unwrap_or_default();
                let key = format!(
                    "{:?}/{}/{}/{}/{}/{}",
                    st.phase,
                    st.migrated,
                    st.total,
                    st.non_migratable,
                    st.conditions.iter().map(|c| c.status.as_str()).collect::<String>(),
                    e.metadata.deletion_timestamp.is_some()
                );
                let mut h = std::hash::DefaultHasher::new();
                std::hash::Hash::hash(&key, &mut h);
                Some(std::hash::Hasher::finish(&h))
            },
            Default::default(),
        );
    let eviction_triggers = async move {
        let mut evictions = std::pin::pin!(evictions);
        while let Some(item) = evictions.next().await {
            match item {
                Ok(ev) => {
                    let _ = ev_tx.send(ev.spec.hypervisor.clone());
                }
                Err(e) => tracing::warn!(error = %e, "eviction watch"),
            }
        }
    };
    // Hypervisors: reconcile on spec, annotation (retry) or deletion
    // changes, not on our own status writes.
    let hypervisors = watcher(hv_api, watcher::Config::default())
        .default_backoff()
        .reflect(writers.hypervisors)
        .applied_objects()
        .predicate_filter(
            |h: &Hypervisor| {
                let parts = [
                    predicates::generation(h),
                    predicates::annotations(h),
                    h.metadata.deletion_timestamp.as_ref().map(|_| 1),
                ];
                Some(parts.iter().fold(17u64, |acc, p| acc.wrapping_mul(31).wrapping_add(p.unwrap_or(0))))
            },
            Default::default(),
        );
    let reader = ctx.hypervisors.clone();
    let to_ref = |n: String| ObjectRef::<Hypervisor>::new(&n);
    let controller = Controller::for_stream(hypervisors, reader)
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(changed).map(to_ref))
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(node_rx).map(to_ref))
        .reconcile_on(tokio_stream::wrappers::UnboundedReceiverStream::new(ev_rx).map(to_ref))
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(hypervisor::reconcile, hypervisor::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "controller");
            }
        });
    // Migrations: a cache for the Eviction controller (cluster-wide limit,
    // per-attempt records).
    let migrations = watcher(Api::<Migration>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writers.migrations)
        .applied_objects()
        .for_each(|_| async {});
    let evictions = Controller::new(Api::<Eviction>::all(client.clone()), watcher::Config::default())
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(eviction::reconcile, eviction::error_policy, ev_ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "eviction controller");
            }
        });
    tokio::select! {
        _ = controller => {}
        _ = evictions => {}
        _ = creator => {}
        _ = eviction_triggers => {}
        _ = migrations => {}
    }
}
