//! `hv-coordinator`: the wiring. The flags and their rules are
//! [`hv_coordinator::config`]; here they become the Kubernetes and Nova
//! clients, the caches, the gRPC, metrics and webhook listeners, leader
//! election, and the controllers once this replica leads.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use hv_coordinator::api::{Eviction, Hypervisor, Migration};
use hv_coordinator::config::{Args, Mode};
use hv_coordinator::eviction::limit::Budgets;
use hv_coordinator::fleet::{self, AgentEndpoint, FleetEndpoint, Health, Registry};
use hv_coordinator::k8s::acting::LeaderOnlyLayer;
use hv_coordinator::k8s::drain_marks::OwnReads;
use hv_coordinator::k8s::eviction::EvictionContext;
use hv_coordinator::k8s::leader::{Election, LeaseGuard};
use hv_coordinator::k8s::leader_pod::LeaderPod;
use hv_coordinator::k8s::updates::UpdateLimit;
use hv_coordinator::k8s::write_slots::WriteSlotsLayer;
use hv_coordinator::k8s::{self, Context, Gate, Writers};
use hv_coordinator::metrics::Metrics;
use hv_coordinator::nova::{Cloud, FleetView, HttpPolicy, Nova, NovaClient};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

/// Writes of the eviction webhook (Node marks) in flight at once: a turn of
/// their own, apart from the controllers'.
const WEBHOOK_WRITES: usize = 4;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "info,kube_runtime=warn,kube_client=warn,openstack_sdk=warn,openstack_sdk_core=warn",
        )
    });
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if args.log_json {
        builder.json().init();
    } else {
        builder.init();
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "hv-coordinator stopped");
            eprintln!("hv-coordinator: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Start, wait to lead, lead until stopped or the lease is lost, hand over.
async fn run(args: Args) -> anyhow::Result<()> {
    let mut stop = Stop::listen()?;
    for warning in args.check()? {
        tracing::warn!("{warning}");
    }
    let identity = args.leadership.identity();
    let metrics = Arc::new(Metrics::default());
    let clients = Clients::new(&args, &metrics).await?;
    let nova = nova(&args, &clients.guard, &identity, &metrics)?;
    // With the plain client: a follower must be able to clear its label.
    // Before the metrics listener, so /readyz never answers without it.
    let pod = args
        .leadership
        .label_leader_pod
        .then(|| Arc::new(LeaderPod::new(clients.plain.clone(), &args.leadership.namespace, &identity)));
    if let Some(pod) = &pod {
        metrics.set_pod_label(pod.state.clone());
    }
    let metrics_addr = hv_coordinator::metrics::serve(args.metrics_listen, metrics.clone())
        .await
        .with_context(|| format!("metrics listener on {}", args.metrics_listen))?;
    tracing::info!(addr = %metrics_addr, "metrics listening");
    let (serving, for_controllers) = Serving::start(&args, &clients, &metrics).await?;
    let follow = pod.clone().map(|pod| {
        let role = serving.leader_tx.subscribe();
        let retry = args.leadership.lease_retry;
        tokio::spawn(async move { pod.follow(role, retry).await })
    });
    let election = args.leadership.election(&identity);
    tokio::select! {
        _ = election.acquire(&clients.plain, &args.leadership.namespace, &clients.guard) => {}
        _ = stop.wait() => {
            let _ = serving.stop_tx.send(true);
            return Ok(());
        }
    }
    let leading = Leading { args: &args, clients: &clients, serving: &serving, metrics: &metrics };
    let (lost, controllers) =
        leading.lead(nova, &identity, &election, pod.as_deref(), for_controllers, &mut stop).await?;
    let release = lost.is_none_or(Ended::releases);
    hand_over(&args, &clients, serving, &metrics, &election, controllers, release).await;
    if let Some(follow) = follow {
        follow.abort();
    }
    if let Some(pod) = &pod {
        clear_label(pod).await;
    }
    if let Some(ended) = lost {
        anyhow::bail!("{} ({}); exiting to restart as a follower", ended.why(), args.leadership.lease_name);
    }
    tracing::info!("stopped");
    Ok(())
}

/// The Kubernetes clients and the lease guard the acting one obeys.
struct Clients {
    /// Watches: long polls, no read timeout.
    watch: kube::Client,
    /// Requests with a read timeout (a hung call must not hang a reconcile
    /// or a lease renewal); the election renews its Lease with it.
    plain: kube::Client,
    /// The agents' certificates' reviews and reads.
    identity: kube::Client,
    /// The controllers' writes: nothing that changes state is sent without
    /// the lease.
    acting: kube::Client,
    /// The webhook's Node marks, under the lease as `acting`, with turns of
    /// their own: the API server waits for its answer only seconds, not
    /// behind the reconciles' burst.
    marking: kube::Client,
    guard: Arc<LeaseGuard>,
}

impl Clients {
    async fn new(args: &Args, metrics: &Metrics) -> anyhow::Result<Clients> {
        let l = &args.leadership;
        let mut config =
            kube::Config::infer().await.context("Kubernetes client (KUBECONFIG or in-cluster config)")?;
        // Nothing is sent again by the client itself (`k8s::acting::client`):
        // the watches have their own backoff, and a lease renewal or a
        // reconcile that fails is retried by its loop, which reads first.
        config.default_retry = false;
        let watch = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
        config.connect_timeout = Some(l.kube_connect());
        config.read_timeout = Some(l.kube_timeout);
        config.write_timeout = Some(l.kube_timeout);
        let guard = Arc::new(LeaseGuard::new(l.margin()));
        let plain = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
        // The agents' certificates ask on a connection of their own: a burst
        // of them never holds up a lease renewal.
        let identity = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
        let turns = |max: usize| WriteSlotsLayer::new(max, l.kube_timeout, metrics.kube_writes.clone());
        let only = LeaderOnlyLayer::new(guard.clone(), args.mode == Mode::Observe);
        let acting = hv_coordinator::k8s::acting::client(
            config.clone(),
            only.clone(),
            turns(l.kube_max_in_flight_writes as usize),
        )
        .context("Kubernetes client")?;
        let marking = hv_coordinator::k8s::acting::client(config, only, turns(WEBHOOK_WRITES))
            .context("Kubernetes client")?;
        Ok(Clients { watch, plain, identity, acting, marking, guard })
    }
}

/// Nova and Placement, through Keystone. A configuration that cannot work
/// is the operator's to fix now; a Keystone that rejects or does not answer
/// is an observation per node.
fn nova(
    args: &Args,
    guard: &Arc<LeaseGuard>,
    identity: &str,
    metrics: &Metrics,
) -> anyhow::Result<Arc<dyn Nova>> {
    let http = HttpPolicy {
        connect_timeout: args.leadership.connect_timeout,
        max_in_flight: args.openstack.openstack_max_in_flight as usize,
        timeout: args.openstack.openstack_timeout,
        ..HttpPolicy::default()
    };
    let cloud = Cloud::new(args.openstack.source(), http)
        .with_lease_guard(guard.clone())
        .with_identity(identity)
        .with_metrics(metrics.openstack.clone())
        .observing(args.mode == Mode::Observe);
    cloud.check_config().context("OpenStack credentials")?;
    Ok(Arc::new(NovaClient::new(cloud)))
}

/// What runs whether or not this replica leads: the caches' readers, the
/// gRPC server (a follower refuses agents), the protected pods' cache and
/// the webhook, and the channels the controllers are woken by.
struct Serving {
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    leader_tx: watch::Sender<bool>,
    health: Health,
    registry: Arc<Registry>,
    grpc: JoinHandle<Result<(), fleet::ServeError>>,
    stores: Stores,
    gate: Arc<Gate>,
    updates: Arc<UpdateLimit>,
    pods: hv_coordinator::k8s::protected_pods::ProtectedPods,
    dependencies: hv_coordinator::k8s::dependencies::NodeDependencies,
    /// Wakes a Node's drain marks (a host found free on this leader's own read).
    marks_wake: mpsc::UnboundedSender<String>,
    events: broadcast::Sender<hv_proto::v1::HypervisorEvent>,
}

/// Why a leadership ended before it was asked to stop.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Held(hv_coordinator::k8s::leader::Held),
    ControllersStopped,
    Unlabelled,
}

impl Ended {
    fn why(self) -> &'static str {
        use hv_coordinator::k8s::leader::Held;
        match self {
            Ended::Held(Held::Lost) => "lost the leader lease",
            Ended::Held(Held::Poisoned) => "a lock was poisoned by a panic",
            Ended::ControllersStopped => "the controllers stopped (a cache could not sync)",
            Ended::Unlabelled => "could not label its pod as the leader's",
        }
    }

    /// Whether the lease is given up once the controllers stopped: it is
    /// still ours only when a poisoned lock ended the leadership.
    fn releases(self) -> bool {
        matches!(self, Ended::Held(hv_coordinator::k8s::leader::Held::Poisoned))
    }
}

/// What only the leader's controllers take: the caches' writers and the
/// channels that wake their reconciles.
struct ForControllers {
    writers: Writers,
    /// Nodes whose agent session changed: their Hypervisor's reconcile.
    changed: mpsc::UnboundedReceiver<String>,
    /// Nodes whose protected pods changed: their drain marks.
    pods_changed: mpsc::UnboundedReceiver<String>,
}

#[derive(Clone)]
struct Stores {
    hypervisors: Store<Hypervisor>,
    nodes: Store<Node>,
    evictions: Store<Eviction>,
    migrations: Store<Migration>,
}

/// The agents' certificates (docs/agent-identity.md): the signer, its
/// bootstrap port, the oldest certificate in the metrics, and the CA
/// published for the agents; the signer for the gRPC port too.
async fn start_identity(
    args: &Args,
    clients: &Clients,
    metrics: &Arc<Metrics>,
    (leader_rx, stop_rx): (&watch::Receiver<bool>, &watch::Receiver<bool>),
    registry: &Arc<Registry>,
) -> anyhow::Result<Option<Arc<fleet::identity_service::Issuer>>> {
    let identity = issuer(args, clients, metrics, leader_rx)?;
    let by_session = registry.clone();
    metrics.set_oldest_agent_certificate(move || by_session.oldest_certificate_end());
    serve_bootstrap(args, identity.clone(), stopped(stop_rx.clone())).await?;
    if let (Some(file), Some(config_map)) =
        (&args.identity.publish_server_ca, &args.identity.publish_server_ca_configmap)
    {
        let to = k8s::publish_ca::Published {
            file: file.clone(),
            namespace: args.leadership.namespace.clone(),
            config_map: config_map.clone(),
        };
        tokio::spawn(k8s::publish_ca::run(clients.acting.clone(), to, leader_rx.clone()));
    }
    Ok(identity)
}

/// The agents' certificates, when the bootstrap port serves
/// (docs/agent-identity.md).
fn issuer(
    args: &Args,
    clients: &Clients,
    metrics: &Metrics,
    leader: &watch::Receiver<bool>,
) -> anyhow::Result<Option<Arc<fleet::identity_service::Issuer>>> {
    let id = &args.identity;
    let (Some(_), Some(cert), Some(key)) = (id.identity_listen, &id.agent_signer_cert, &id.agent_signer_key)
    else {
        return Ok(None);
    };
    let signer = fleet::identity_service::SignerFiles { cert: cert.clone(), key: key.clone() };
    signer.load().context("the agents' signing CA (--agent-signer-cert, --agent-signer-key)")?;
    let ends = signer.clone();
    metrics.set_certificate("agent-signer", move || ends.load().ok().map(|s| s.not_after()));
    Ok(Some(Arc::new(fleet::identity_service::Issuer {
        vouch: Arc::new(hv_coordinator::k8s::identity::ClusterVouch { client: clients.identity.clone() }),
        agents: id.agents()?,
        trust_domain: args.grpc.trust_domain.clone(),
        signer,
        life: id.agent_certificate_life,
        max_token_life: id.agent_token_max_life,
        leader: leader.clone(),
        used: Default::default(),
        in_flight: tokio::sync::Semaphore::new(fleet::identity_service::MAX_IN_FLIGHT),
        metrics: metrics.agent_certificates.clone(),
    })))
}

/// The bootstrap port, served until `shutdown` (bound now: a bind error
/// stops the start).
async fn serve_bootstrap(
    args: &Args,
    issuer: Option<Arc<fleet::identity_service::Issuer>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (Some(issuer), Some(addr), Some(files)) =
        (issuer, args.identity.identity_listen, args.grpc.tls_files()?)
    else {
        return Ok(());
    };
    let (config, _) =
        hv_tls::server::config_for_bootstrap(&files.cert, &files.key).context("bootstrap TLS")?;
    let listener =
        tokio::net::TcpListener::bind(addr).await.with_context(|| format!("bootstrap port {addr}"))?;
    tracing::info!(addr = %listener.local_addr()?, "bootstrap port listening");
    let tls = fleet::Tls { config, limits: args.grpc.limits(), stats: Default::default() };
    tokio::spawn(async move {
        if let Err(e) = fleet::serve_bootstrap(listener, issuer, tls, shutdown).await {
            tracing::error!(error = %e, "bootstrap port stopped");
        }
    });
    Ok(())
}

fn stores() -> (Stores, Writers) {
    let (hypervisors, hv_writer) = reflector::store();
    let (nodes, node_writer) = reflector::store();
    let (evictions, ev_writer) = reflector::store();
    let (migrations, mig_writer) = reflector::store();
    let writers =
        Writers { hypervisors: hv_writer, nodes: node_writer, evictions: ev_writer, migrations: mig_writer };
    (Stores { hypervisors, nodes, evictions, migrations }, writers)
}

impl Serving {
    async fn start(
        args: &Args,
        clients: &Clients,
        metrics: &Arc<Metrics>,
    ) -> anyhow::Result<(Serving, ForControllers)> {
        let signer_ca: Vec<_> = args.identity.agent_signer_cert.iter().cloned().collect();
        let tls = match args.grpc.tls_files()? {
            Some(files) => {
                let (config, presented) =
                    hv_tls::server::config_trusting(&files, &signer_ca).context("gRPC TLS")?;
                metrics.set_certificate("grpc", move || presented.not_after());
                Some(fleet::Tls { config, limits: args.grpc.limits(), stats: Default::default() })
            }
            None => None,
        };
        if let Some(tls) = &tls {
            metrics.set_tls(tls.stats.clone());
        }
        let server = fleet::Server::bind(args.grpc.listen).await?;
        let health = server.health.clone();
        tracing::info!(addr = %server.addr, "gRPC listening");
        let (stop_tx, stop_rx) = watch::channel(false);
        let (leader_tx, leader_rx) = watch::channel(false);
        let (changed_tx, changed_rx) = mpsc::unbounded_channel();
        let registry = Arc::new(Registry::new(changed_tx.clone()).with_metrics(metrics.sessions.clone()));
        // The protected pods' cache (for the disruption budgets' label), warm
        // before this replica leads; a change wakes its Node's drain marks.
        let (pods_tx, pods_changed) = mpsc::unbounded_channel();
        let marks_wake = pods_tx.clone();
        let pods = hv_coordinator::k8s::protected_pods::watch(
            &clients.watch,
            &args.drain.protected(guard(args)?.as_ref()),
            pods_tx,
            leader_rx.clone(),
        );
        // The hosts' dependency pods; a change wakes the Hypervisor's reconcile.
        let dependencies = hv_coordinator::k8s::dependencies::watch(
            &clients.watch,
            &args.lifecycle.node_dependencies,
            changed_tx.clone(),
            leader_rx.clone(),
        );
        let (stores, writers) = stores();
        let (events, _) = broadcast::channel(1024);
        let agents = AgentEndpoint {
            registry: registry.clone(),
            hypervisors: stores.hypervisors.clone(),
            leader: leader_rx.clone(),
            heartbeat: args.grpc.agent_heartbeat,
            trust_domain: tls.is_some().then(|| args.grpc.trust_domain.clone()),
            sessions: metrics.sessions.clone(),
            node_signer: args
                .identity
                .identity_listen
                .and(args.identity.agent_signer_cert.clone())
                .filter(|_| !args.identity.accept_host_certificates),
        };
        let fleet_api = FleetEndpoint {
            hypervisors: stores.hypervisors.clone(),
            registry: registry.clone(),
            events: events.clone(),
            leader: leader_rx.clone(),
            trust_domain: tls.is_some().then(|| args.grpc.trust_domain.clone()),
            watches: Default::default(),
        };
        let identity = start_identity(args, clients, metrics, (&leader_rx, &stop_rx), &registry).await?;
        count_hosts(metrics, &stores.hypervisors, &registry);
        metrics.set_evictions(stores.evictions.clone());
        metrics.set_ha_maintenance_limit(args.health.ha_maintenance_limit);
        let grpc = tokio::spawn(server.serve(agents, fleet_api, identity, tls, stopped(stop_rx.clone())));
        // The gate opens once this replica leads with whole caches; until then
        // the webhook refuses protected pods (a drain tries again).
        let gate = Arc::new(Gate::new(clients.guard.clone()).observing(args.mode == Mode::Observe));
        let updates = Arc::new(UpdateLimit::new(
            args.drain.update_max_held,
            args.drain.cordon_starts_maintenance,
            args.drain.signals(),
            stores.hypervisors.clone(),
            stores.nodes.clone(),
        ));
        serve_webhook(args, clients, &stores, &gate, &updates, metrics).await?;
        let serving = Serving {
            stop_tx,
            stop_rx,
            leader_tx,
            health,
            registry,
            grpc,
            stores,
            gate,
            updates,
            pods,
            dependencies,
            marks_wake,
            events,
        };
        Ok((serving, ForControllers { writers, changed: changed_rx, pods_changed }))
    }
}

/// The fleet's phases and health for /metrics, read from the cache.
fn count_hosts(metrics: &Metrics, hypervisors: &Store<Hypervisor>, registry: &Arc<Registry>) {
    const PAUSED: &str = hv_coordinator::api::ConditionType::Paused.as_str();
    const DRAIN: &str = hv_coordinator::api::ConditionType::UpdateDrain.as_str();
    let (hvs, registry) = (hypervisors.clone(), registry.clone());
    metrics.set_hosts(move || {
        hv_coordinator::metrics::hosts(hvs.state().iter().map(|h| {
            let status = h.status.as_ref();
            let fencing = status.and_then(|s| s.fencing.as_ref());
            hv_coordinator::metrics::Host {
                phase: status.and_then(|s| s.phase).unwrap_or_default(),
                power: status.and_then(|s| s.power_state),
                agent_connected: registry.connected(&h.name_any()),
                health: status.and_then(|s| s.health.as_ref()).map(|x| x.state),
                fenced_showing_life: fencing.is_some_and(|f| f.fenced.is_some() && f.revival.is_some()),
                disabled_elsewhere: status.is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "SchedulingEnabled"
                            && c.reason == hv_coordinator::lifecycle::DISABLED_ELSEWHERE
                    })
                }),
                paused: status
                    .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == PAUSED && c.status == "True")),
                adopted_checks_failed: status.is_some_and(|s| {
                    s.conditions.iter().any(|c| c.reason == hv_coordinator::lifecycle::ADOPTED_CHECKS_FAILED)
                }),
                update_drain_left: status.and_then(update_drain_left),
                update_drain_forced: status.is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == DRAIN && c.reason == hv_coordinator::drain::deadline::FORCES)
                }),
                ha: hv_coordinator::metrics::ha_figures(h, jiff::Timestamp::now()),
                out_of_service: status
                    .map(|s| hv_coordinator::api::ready::host(s).0)
                    .filter(|r| *r != hv_coordinator::api::ready::HostReady::InService)
                    .map(|r| (h.name_any(), r.reason())),
            }
        }))
    });
}

/// The drain guards' make, when asked for (docs/drain.md): in the
/// coordinator's namespace, for this install.
fn guard(args: &Args) -> anyhow::Result<Option<hv_coordinator::drain::guard::GuardConfig>> {
    Ok(args.drain.guard(&args.leadership.namespace, &args.leadership.instance()?))
}

/// Seconds before a host's update tool stops waiting, while its
/// `UpdateDrain` condition is True (the host not emptied yet).
fn update_drain_left(s: &hv_coordinator::api::hypervisor::HypervisorStatus) -> Option<f64> {
    const DRAIN: &str = hv_coordinator::api::ConditionType::UpdateDrain.as_str();
    let draining = s.conditions.iter().any(|c| c.type_ == DRAIN && c.status == "True");
    let at = s.update_drain.as_ref().filter(|_| draining)?.stops_waiting_at.0;
    Some(at.duration_since(jiff::Timestamp::now()).as_secs_f64().max(0.0))
}

/// The eviction webhook, when asked for (docs/drain.md).
async fn serve_webhook(
    args: &Args,
    clients: &Clients,
    stores: &Stores,
    gate: &Arc<Gate>,
    updates: &Arc<UpdateLimit>,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    let Some(listen) = args.drain.webhook() else { return Ok(()) };
    let (config, presented) =
        hv_tls::server::config_without_client_auth(listen.cert, listen.key).context("webhook TLS")?;
    metrics.set_certificate("webhook", move || presented.not_after());
    let hook = Arc::new(hv_coordinator::k8s::webhook::Webhook {
        client: clients.marking.clone(),
        hypervisors: stores.hypervisors.clone(),
        nodes: stores.nodes.clone(),
        evictions: stores.evictions.clone(),
        gate: gate.clone(),
        protected: args.drain.protected(guard(args)?.as_ref()),
        updates: updates.clone(),
        metrics: metrics.webhook.clone(),
    });
    let bound = hv_coordinator::k8s::webhook::serve(listen.addr, config, hook)
        .await
        .with_context(|| format!("webhook listener on {}", listen.addr))?;
    tracing::info!(addr = %bound, "eviction webhook listening");
    Ok(())
}

/// A replica that leads, and what it leads with.
struct Leading<'a> {
    args: &'a Args,
    clients: &'a Clients,
    serving: &'a Serving,
    metrics: &'a Arc<Metrics>,
}

impl Leading<'_> {
    /// Runs the controllers until stopped (None) or until leading is no
    /// longer safe (why); the controllers' task is returned to be waited for.
    async fn lead(
        &self,
        nova: Arc<dyn Nova>,
        identity: &str,
        election: &Election,
        pod: Option<&LeaderPod>,
        taken: ForControllers,
        stop: &mut Stop,
    ) -> anyhow::Result<(Option<Ended>, JoinHandle<()>)> {
        let (args, serving) = (self.args, self.serving);
        let _ = serving.leader_tx.send(true);
        serving.health.set_self(true).await;
        self.metrics.set_leader(true);
        let (wake_tx, wake_rx) = mpsc::unbounded_channel();
        let ctx = self.context(nova.clone(), identity, wake_tx)?;
        let mut controllers = tokio::spawn(k8s::run(
            self.clients.watch.clone(),
            ctx,
            self.eviction_context(nova, identity)?,
            args.new_nodes.node_selector.clone(),
            args.new_nodes.template(&args.leadership.instance()?),
            taken.writers,
            k8s::Wakes { sessions: taken.changed, protected_pods: taken.pods_changed, evictions: wake_rx },
            args.leadership.reconcile_concurrency,
            serving.stop_rx.clone(),
        ));
        // A leader whose pod cannot carry the label is out of the Service:
        // no agent reaches it, so it gives way to one that can.
        let unlabelled = async {
            match pod {
                Some(pod) => pod.unlabelled_for(args.leadership.lease_renew_deadline).await,
                None => std::future::pending().await,
            }
        };
        let lost = tokio::select! {
            _ = stop.wait() => None,
            held = election.hold(&self.clients.plain, &args.leadership.namespace, &self.clients.guard) => {
                Some(Ended::Held(held))
            }
            _ = &mut controllers => Some(Ended::ControllersStopped),
            _ = unlabelled => Some(Ended::Unlabelled),
        };
        Ok((lost, controllers))
    }

    fn eviction_context(&self, nova: Arc<dyn Nova>, identity: &str) -> anyhow::Result<Arc<EvictionContext>> {
        let (args, serving) = (self.args, self.serving);
        Ok(Arc::new(EvictionContext {
            client: self.clients.acting.clone(),
            nova,
            migrations: serving.stores.migrations.clone(),
            hypervisors: serving.stores.hypervisors.clone(),
            evictions: serving.stores.evictions.clone(),
            limit: Arc::new(Budgets::new(
                args.evictions.cluster_max_migrations,
                args.evictions.cluster_max_evacuations,
            )),
            gate: serving.gate.clone(),
            recorder: Recorder::new(
                self.clients.acting.clone(),
                Reporter { controller: "hv-coordinator".into(), instance: Some(identity.to_string()) },
            ),
            written: Default::default(),
            metrics: self.metrics.clone(),
            default_policy: args.evictions.default_migration_policy,
            evacuate_by_default: args.fencing.evacuate_by_default,
            evacuate_rebuild_from_image: args.fencing.evacuate_rebuild_from_image,
            progress_reads: Default::default(),
            forced: Default::default(),
            instance: args.leadership.instance()?,
            events: serving.events.clone(),
            hibernation: Arc::new(k8s::hibernation::Hibernation::new(
                args.lifecycle.hibernation_policies.clone(),
            )),
            hibernation_interval: args.lifecycle.hibernation_interval,
        }))
    }

    fn context(
        &self,
        nova: Arc<dyn Nova>,
        identity: &str,
        evictions_to_wake: mpsc::UnboundedSender<String>,
    ) -> anyhow::Result<Arc<Context>> {
        let (args, serving, acting) = (self.args, self.serving, &self.clients.acting);
        let intervals = args.lifecycle.intervals();
        let nova_view = Arc::new(FleetView::new(args.lifecycle.view_max_age(), intervals.retry));
        let view = nova_view.clone();
        self.metrics.set_nova_view(move || view.figures());
        let fencing = args.fencing.policy()?;
        Ok(Arc::new(Context {
            client: acting.clone(),
            nova,
            nova_view,
            // Per leadership: a new leader frees no host before it reads it.
            own_reads: Arc::new(OwnReads::waking(serving.marks_wake.clone())),
            renewals: Default::default(),
            nova_hosts: Default::default(),
            registry: serving.registry.clone(),
            health: serving.health.clone(),
            recorder: Recorder::new(
                acting.clone(),
                Reporter { controller: "hv-coordinator".into(), instance: Some(identity.to_string()) },
            ),
            hypervisors: serving.stores.hypervisors.clone(),
            nodes: serving.stores.nodes.clone(),
            evictions: serving.stores.evictions.clone(),
            gate: serving.gate.clone(),
            policy: args.lifecycle_policy()?,
            ha: hv_coordinator::k8s::ha::HaClaims::new(
                args.health.ha_maintenance_limit,
                args.health.unseen_max_share,
            ),
            fencing: hv_coordinator::k8s::fence::FenceContext::new(
                fencing,
                args.fencing.ceph(),
                args.fencing.fence_power_timeout,
                args.leadership.namespace.clone(),
            )
            .with_ceph_networks(args.fencing.ceph_client_networks.clone())
            .with_domain_label(args.fencing.fence_domain_label.clone()),
            metrics: self.metrics.clone(),
            judging_from: args.health.judging_from(jiff::Timestamp::now())?,
            health_policy: args.health.policy()?,
            intervals,
            events: serving.events.clone(),
            written: Default::default(),
            node_locks: args.drain.node_locks.clone(),
            pods: serving.pods.clone(),
            dependencies: serving.dependencies.clone(),
            updates: serving.updates.clone(),
            guard: guard(args)?,
            evictions_to_wake,
        }))
    }
}

/// Hand over: stop acting first, then give the lease up, so the standby
/// leads at once instead of after a lease duration.
async fn hand_over(
    args: &Args,
    clients: &Clients,
    serving: Serving,
    metrics: &Metrics,
    election: &Election,
    controllers: JoinHandle<()>,
    release: bool,
) {
    clients.guard.revoke();
    let _ = serving.leader_tx.send(false);
    serving.health.set_self(false).await;
    metrics.set_leader(false);
    serving.registry.close_all();
    let _ = serving.stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controllers).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), serving.grpc).await;
    // The lease first, so the standby leads at once; then the label (a
    // write of the label follower in flight must not land after it).
    if release {
        election.release(&clients.plain, &args.leadership.namespace).await;
    }
}

/// Best effort: a label left behind keeps this pod out of the Service all
/// the same (not Ready), and the next start clears it.
async fn clear_label(pod: &LeaderPod) {
    match tokio::time::timeout(Duration::from_secs(3), pod.write(false)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "could not clear the pod's leader label"),
        Err(_) => tracing::warn!("could not clear the pod's leader label: no answer within 3s"),
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// SIGTERM (Kubernetes) or SIGINT (Ctrl-C), listened for from the start:
/// a signal that arrives between two waits is not lost.
struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Stop {
    fn listen() -> anyhow::Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stop {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
        })
    }

    async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
