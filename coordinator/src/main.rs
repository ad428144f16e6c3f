//! `hv-coordinator`: the wiring. Flags, the Kubernetes client, the Nova
//! client, the gRPC server, leader election, and the controllers once this
//! replica leads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use hv_coordinator::api::eviction::MigrationPolicy;
use hv_coordinator::drain::admission::{Protected, Selector};
use hv_coordinator::eviction::limit::ClusterLimit;
use hv_coordinator::fleet::{self, AgentEndpoint, FleetEndpoint, Registry};
use hv_coordinator::k8s::acting;
use hv_coordinator::k8s::eviction::EvictionContext;
use hv_coordinator::k8s::leader::{Election, LeaseGuard};
use hv_coordinator::k8s::leader_pod::LeaderPod;
use hv_coordinator::k8s::updates::UpdateLimit;
use hv_coordinator::k8s::write_slots::WriteSlotsLayer;
use hv_coordinator::k8s::{self, Context, Gate, Intervals, Template, Writers};
use hv_coordinator::lifecycle::Policy;
use hv_coordinator::metrics::Metrics;
use hv_coordinator::nova::{Cloud, CloudSource, FleetView, HttpPolicy, Nova, NovaClient};
use kube::ResourceExt as _;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use tokio::sync::{broadcast, mpsc, watch};

/// The hypervisor lifecycle coordinator (one leader per region; followers wait).
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// gRPC address: AgentService, FleetService, grpc.health.v1, reflection.
    #[arg(long, env = "HV_LISTEN", default_value = "0.0.0.0:9090")]
    listen: SocketAddr,
    /// PEM certificate (chain) the gRPC server presents; re-read when the file
    /// changes. With --tls-key and --client-ca; without them, --insecure.
    #[arg(long, env = "HV_TLS_CERT", requires_all = ["tls_key", "client_ca"])]
    tls_cert: Option<PathBuf>,
    /// The server certificate's private key (PEM); re-read with it.
    #[arg(long, env = "HV_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA that signs the clients' certificates (agents' and SREs');
    /// every gRPC client must show one. Re-read when the file changes.
    #[arg(long, env = "HV_CLIENT_CA", requires = "tls_cert")]
    client_ca: Option<PathBuf>,
    /// Trust domain of agent certificates: an agent's certificate names its
    /// node with the URI SAN spiffe://DOMAIN/node/NAME, and it may speak for
    /// that node only.
    #[arg(long, env = "HV_TRUST_DOMAIN", default_value = "hypervisor.cloud.sap")]
    trust_domain: String,
    /// Serve gRPC in plain text without client certificates: anyone who
    /// reaches the port can then speak for any node. A laboratory's setting.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "client_ca"])]
    insecure: bool,
    /// gRPC connections open at once (agents, SREs); more wait.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// HTTP address of /metrics (Prometheus) and /healthz.
    #[arg(long, env = "HV_METRICS_LISTEN", default_value = "0.0.0.0:8080")]
    metrics_listen: SocketAddr,
    /// Cloud name in clouds.yaml; without it the OS_* variables are used.
    #[arg(long, env = "OS_CLOUD")]
    os_cloud: Option<String>,
    /// clouds.yaml to read (default: ./clouds.yaml, ~/.config/openstack/, /etc/openstack/).
    #[arg(long, env = "OS_CLIENT_CONFIG_FILE")]
    clouds_yaml: Option<PathBuf>,
    /// Label selector of the Nodes that are hypervisors.
    #[arg(long, env = "HV_NODE_SELECTOR", default_value = "hypervisor.cloud.sap/managed=true")]
    node_selector: String,
    /// Aggregate every new Hypervisor joins (repeatable; a Node annotation
    /// hypervisor.cloud.sap/aggregates=a,b overrides it).
    #[arg(long = "aggregate")]
    aggregates: Vec<String>,
    /// CUSTOM_* trait for new Hypervisors (repeatable; annotation hypervisor.cloud.sap/custom-traits).
    #[arg(long = "custom-trait")]
    custom_traits: Vec<String>,
    /// RBD pool new Hypervisors must read (repeatable; annotation hypervisor.cloud.sap/ceph-pools).
    #[arg(long = "ceph-pool")]
    ceph_pools: Vec<String>,
    /// New Hypervisors skip Testing (annotation hypervisor.cloud.sap/skip-tests=true).
    #[arg(long)]
    skip_tests: bool,
    /// Suffix removed from a Node name to get the Nova host its nova-compute
    /// registered under (repeatable; the first that matches): `.example.local`
    /// maps the Node compute-4.example.local to compute-4. The Node annotation
    /// hypervisor.cloud.sap/nova-host overrides it.
    #[arg(long = "nova-host-strip-suffix")]
    nova_host_strip_suffixes: Vec<String>,
    /// How long Onboarding waits for nova-compute to register.
    #[arg(long, default_value = "15m", value_parser = duration)]
    registration_timeout: Duration,
    /// How long Testing waits for the agent's check report.
    #[arg(long, default_value = "10m", value_parser = duration)]
    checks_timeout: Duration,
    /// How long a Node may be not Ready before that counts against its
    /// host's health (docs/health.md): a kubelet restart misses a few posts.
    #[arg(long, default_value = "60s", value_parser = duration)]
    node_not_ready_grace: Duration,
    /// After taking the lead, how long no host is judged: the agents
    /// reconnect (backoff up to 30 s) and send again the signals that hold
    /// (every minute).
    #[arg(long, default_value = "90s", value_parser = duration)]
    health_settle: Duration,
    /// How long an Active host may be Unreachable (its agent gone, or its
    /// kubelet or nova-compute silent) before it is disabled in Nova; no
    /// VM is moved (docs/health.md). Past an agent restart or a kubelet
    /// hiccup, short of letting new VMs land on a host nobody watches.
    #[arg(long, default_value = "5m", value_parser = duration)]
    unreachable_grace: Duration,
    /// A cordoned Node (`spec.unschedulable`) starts `auto` maintenance,
    /// and its uncordon ends it: for update tools that cordon before they
    /// drain (docs/drain.md). Off: only the annotation
    /// hypervisor.cloud.sap/maintenance-required does.
    #[arg(long)]
    cordon_starts_maintenance: bool,
    /// Another sign by which the site's update tool asks for a host, beside
    /// the annotation hypervisor.cloud.sap/maintenance-required (repeatable):
    /// annotation:KEY, label:KEY[=VALUE], or cordon-with:ANNOTATION_KEY (a
    /// cordon with the tool's reason; its uncordon ends it) (docs/drain.md).
    #[arg(long = "update-signal")]
    update_signals: Vec<hv_coordinator::drain::signals::Signal>,
    /// A dependent whose pods the host's VMs need (a network agent):
    /// its lock annotation hypervisor.cloud.sap/lock.COMPONENT stands on the
    /// Node while the host is not evictable (docs/drain.md). Repeatable.
    #[arg(long = "node-lock", value_parser = node_lock)]
    node_locks: Vec<String>,
    /// At most this many hosts held for updates at once (an update's ask:
    /// the maintenance-required annotation, a counted cordon, a refused
    /// drain): a host in service whose Node asks past it waits for a place
    /// (docs/drain.md). 0: no limit.
    #[arg(long, default_value_t = 10)]
    update_max_held: usize,
    /// HTTPS address of the eviction webhook (docs/drain.md), which the
    /// API server calls for every pod eviction; with --webhook-tls-cert
    /// and --webhook-tls-key. Without it, no webhook is served.
    #[arg(long, env = "HV_WEBHOOK_LISTEN", requires_all = ["webhook_tls_cert", "webhook_tls_key"])]
    webhook_listen: Option<SocketAddr>,
    /// PEM certificate (chain) the webhook presents; re-read when it changes.
    #[arg(long, env = "HV_WEBHOOK_TLS_CERT")]
    webhook_tls_cert: Option<PathBuf>,
    #[arg(long, env = "HV_WEBHOOK_TLS_KEY")]
    webhook_tls_key: Option<PathBuf>,
    /// Label selector (`k=v,k2`) of the hypervisor's own pods that a drain
    /// must not evict while the host is not evictable: nova-compute, the
    /// agent (docs/drain.md). Repeatable.
    #[arg(long = "protected-pods", value_parser = selector)]
    protected_pods: Vec<Selector>,
    /// COMPONENT:SELECTOR: a dependent's pods (a network agent), evicted
    /// only once the Node's lock annotation of COMPONENT is gone. Repeatable.
    #[arg(long = "dependent-pods", value_parser = dependent_pods)]
    dependent_pods: Vec<(String, Selector)>,
    /// How many hosts may be in `ha` maintenance set for health (until an
    /// SRE clears it) before a Degraded host is no longer put into it
    /// (docs/health.md): past it, one shared fault is the likelier cause.
    #[arg(long, default_value_t = 5)]
    ha_maintenance_limit: usize,
    /// Past this share (percent) of judged hosts Unreachable or Failed at
    /// once, no further host is disabled for being unseen (docs/health.md):
    /// a cut of our own, or a fault shared by the fleet, is the likelier cause.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    unseen_max_share: u8,
    /// Fencing (docs/fencing.md): past this share (percent) of a failure
    /// domain's hosts lost at once, none of them is fenced.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    fence_max_domain_share: u8,
    /// At most this many fencings start per --fence-interval, fleet-wide.
    #[arg(long, default_value_t = 2)]
    fence_max_started: usize,
    #[arg(long, default_value = "10m", value_parser = duration)]
    fence_interval: Duration,
    /// An agent heard from within this is alive: its host is never fenced.
    /// At least three --agent-heartbeat intervals.
    #[arg(long, default_value = "30s", value_parser = duration)]
    fence_fresh_heartbeat: Duration,
    /// How long a BMC may take to report a power off before the step fails.
    #[arg(long, default_value = "60s", value_parser = duration)]
    fence_power_timeout: Duration,
    /// The Ceph identity that may blocklist (`osd blocklist` in its mon
    /// caps); without it a host that uses Ceph is not fenced past Nova.
    #[arg(long, env = "HV_CEPH_FENCE_ID")]
    ceph_fence_id: Option<String>,
    #[arg(long, env = "HV_CEPH_FENCE_CONF", default_value = "/etc/ceph/ceph.conf")]
    ceph_fence_conf: PathBuf,
    #[arg(long, env = "HV_CEPH_FENCE_KEYRING")]
    ceph_fence_keyring: Option<PathBuf>,
    /// Where the hosts' Ceph clients are (CIDRs, comma-separated): an
    /// agent's reported Ceph address outside these is not blocklisted on
    /// its word. None: any.
    #[arg(long, value_delimiter = ',')]
    ceph_client_networks: Vec<ipnet::IpNet>,
    /// The hv-ceph-fence helper (default: next to this binary).
    #[arg(long)]
    ceph_fence_helper: Option<PathBuf>,
    /// How often an Active or Maintenance node is compared with Nova (drift check).
    #[arg(long, default_value = "60s", value_parser = duration)]
    drift_interval: Duration,
    /// Oldest fleet view of Nova and Placement a settled host's drift check
    /// may rest on (one set of lists for the whole fleet, read again ahead
    /// of that age; docs/nova.md). Default: half the drift interval.
    #[arg(long, value_parser = duration)]
    nova_view_max_age: Option<Duration>,
    /// How often a node in a busy phase is looked at again.
    #[arg(long, default_value = "5s", value_parser = duration)]
    busy_interval: Duration,
    /// Heartbeat interval told to agents; three missed ones end a session.
    #[arg(long, default_value = "10s", value_parser = duration)]
    agent_heartbeat: Duration,
    /// Live migrations in flight at once across all evictions (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    cluster_max_migrations: u32,
    /// How far Nova's clock may lag the coordinator's. A migration request
    /// whose answer was lost is matched to the migration Nova created for
    /// the server after we asked, less this.
    #[arg(long, default_value = "60s", value_parser = duration)]
    nova_clock_skew: Duration,
    /// How long an Eviction waits for its host's compute service to be
    /// disabled before it fails (nothing moves before that).
    #[arg(long, default_value = "10m", value_parser = duration)]
    eviction_disable_timeout: Duration,
    /// How a VM moves when neither its metadata (hypervisor.cloud.sap:eviction)
    /// nor its Eviction's options.defaultPolicy says: liveMigrate, coldMigrate or skip.
    #[arg(long, default_value = "liveMigrate", value_parser = policy)]
    default_migration_policy: MigrationPolicy,
    /// A fenced host's server without the hypervisor.cloud.sap:evacuate
    /// metadata key is evacuated (true), or left (false: opt-in only).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    evacuate_by_default: bool,
    /// A fenced host's server whose own disks were on the host's local
    /// storage (not in Ceph RBD) is rebuilt from its image all the same,
    /// those disks lost. Off: such a server is left and named.
    #[arg(long)]
    evacuate_rebuild_from_image: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "hv-system")]
    namespace: String,
    /// The leader-election Lease. With --namespace it names this install:
    /// every Hypervisor it manages carries `NAMESPACE.LEASE` in the label
    /// hypervisor.cloud.sap/instance (at most 63 characters in all).
    #[arg(long, default_value = "hv-coordinator")]
    lease_name: String,
    /// This replica's identity in the Lease (default: POD_NAME, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Label this replica's pod (named by --identity, in --namespace)
    /// hypervisor.cloud.sap/leader=true while it leads, and be Ready while
    /// the label agrees with the role: the chart's Service selects the
    /// label, so every replica can be Ready and a PodDisruptionBudget can
    /// let one go. Without it only the leader is Ready.
    #[arg(long, requires = "identity")]
    label_leader_pod: bool,
    /// How long a lease stands unrenewed before a follower may take it.
    #[arg(long, default_value = "15s", value_parser = duration)]
    lease_duration: Duration,
    /// A leader that has not renewed within this stops acting (and exits);
    /// shorter than --lease-duration, so two replicas never act at once.
    #[arg(long, default_value = "10s", value_parser = duration)]
    lease_renew_deadline: Duration,
    /// Pause between lease tries (followers) and renewals (the leader).
    #[arg(long, default_value = "2s", value_parser = duration)]
    lease_retry: Duration,
    /// Longest wait for an answer of the Kubernetes API to a request (not a watch).
    #[arg(long, default_value = "15s", value_parser = duration)]
    kube_timeout: Duration,
    /// Longest wait for a connection to Kubernetes, Nova, Placement or Keystone. A call
    /// that changes something starts only while the lease has this much and a second
    /// left before --lease-renew-deadline, so it is sent before another replica can lead.
    #[arg(long, default_value = "3s", value_parser = duration)]
    connect_timeout: Duration,
    /// Writes to the Kubernetes API in flight at once; more wait their turn.
    /// A burst of reconciles (every Hypervisor after a failover) does not
    /// time out the API server's handlers or queue the Lease renewal behind
    /// it (docs/coordinator.md).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    kube_max_in_flight_writes: u32,
    /// Requests to Nova, Placement and Keystone in flight at once; more wait
    /// their turn. A struggling Nova is not sent a retry storm by thousands
    /// of reconciles (docs/nova.md).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    openstack_max_in_flight: u32,
    /// Longest wait for the answer to one request to Nova, Placement or
    /// Keystone. A read of the whole fleet asks for a thousand hypervisors
    /// with their servers in one page; a Nova that takes longer for it
    /// needs more (docs/nova.md).
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    openstack_timeout: Duration,
    /// Hypervisor reconciles run at once (and as many Eviction reconciles);
    /// the rest wait their turn in the queue, first come first served.
    /// Unbounded, a failover or the first start built every host's
    /// reconcile at once (about 20 KiB each, most of them then waiting for
    /// `--openstack-max-in-flight`). Large enough that hosts whose BMC is
    /// read inside their reconcile (seconds each when a row loses power)
    /// do not keep a failed host elsewhere waiting.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u16).range(1..))]
    reconcile_concurrency: u16,
    /// JSON logs (production); the default is human-readable.
    #[arg(long, env = "HV_LOG_JSON")]
    log_json: bool,
}

/// The gRPC server's TLS from the flags: mutual TLS, or plain text only
/// when asked for by name.
fn grpc_tls(args: &Args) -> anyhow::Result<Option<fleet::Tls>> {
    if args.insecure {
        tracing::warn!(
            "--insecure: gRPC in plain text without client certificates; anyone who reaches {} can speak for any node",
            args.listen
        );
        return Ok(None);
    }
    let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.client_ca) else {
        anyhow::bail!(
            "gRPC needs --tls-cert, --tls-key and --client-ca (agents and SREs show certificates from that CA); \
             --insecure serves plain text to anyone"
        );
    };
    let files = hv_tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
    let config = hv_tls::server::config(&files).context("gRPC TLS")?;
    let limits = hv_tls::server::Limits {
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        ..Default::default()
    };
    Ok(Some(fleet::Tls { config, limits, stats: Default::default() }))
}

fn policy(s: &str) -> Result<MigrationPolicy, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("{s:?} is not one of liveMigrate, coldMigrate, skip"))
}

fn duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration =
        s.parse().map_err(|e| format!("{s:?} is not a duration like 10s, 5m, 500ms: {e}"))?;
    Duration::try_from(d).map_err(|e| format!("{s:?}: {e}"))
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match duration(s)? {
        Duration::ZERO => Err(format!("{s:?}: must be longer than nothing")),
        d => Ok(d),
    }
}

fn node_lock(s: &str) -> Result<String, String> {
    if hv_coordinator::drain::locks::valid_component(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a component name (letters, digits, -, _, .; alphanumeric at both ends)"))
    }
}

fn selector(s: &str) -> Result<Selector, String> {
    s.parse()
}

fn dependent_pods(s: &str) -> Result<(String, Selector), String> {
    let (component, sel) = s.split_once(':').ok_or("expected COMPONENT:SELECTOR")?;
    Ok((node_lock(component)?, sel.parse()?))
}

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

async fn run(args: Args) -> anyhow::Result<()> {
    let mut stop = Stop::listen()?;
    if args.lease_renew_deadline >= args.lease_duration || args.lease_retry >= args.lease_renew_deadline {
        anyhow::bail!(
            "need --lease-retry ({:?}) < --lease-renew-deadline ({:?}) < --lease-duration ({:?})",
            args.lease_retry,
            args.lease_renew_deadline,
            args.lease_duration
        );
    }
    let instance = hv_coordinator::k8s::nodes::instance_name(&args.namespace, &args.lease_name)
        .map_err(anyhow::Error::msg)?;
    // Two clients: requests get a read timeout (a hung call must not hang
    // a reconcile or a lease renewal); watches are long polls and get none.
    let mut config =
        kube::Config::infer().await.context("Kubernetes client (KUBECONFIG or in-cluster config)")?;
    // Nothing is sent again by the client itself (`k8s::acting::client`):
    // the watches have their own backoff, and a lease renewal or a reconcile
    // that fails is retried by its loop, which reads first.
    config.default_retry = false;
    let watch_client = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
    let mut request_config = config;
    let http = HttpPolicy {
        connect_timeout: args.connect_timeout,
        max_in_flight: args.openstack_max_in_flight as usize,
        timeout: args.openstack_timeout,
        ..HttpPolicy::default()
    };
    let connect = args.connect_timeout.min(args.kube_timeout);
    request_config.connect_timeout = Some(connect);
    request_config.read_timeout = Some(args.kube_timeout);
    request_config.write_timeout = Some(args.kube_timeout);
    // A call that changes something starts only while the lease has a
    // connection's time and a second left before the renew deadline: it is
    // on the wire before this replica stops leading, and a follower may take
    // the lease only a lease duration after the last renewal (docs/failover.md).
    let margin = connect + Duration::from_secs(1);
    if margin + args.lease_retry >= args.lease_renew_deadline {
        anyhow::bail!(
            "--lease-renew-deadline ({:?}) must exceed --lease-retry ({:?}) plus the {:?} a call needs to start \
             (--connect-timeout and a second)",
            args.lease_renew_deadline,
            args.lease_retry,
            margin
        );
    }
    let guard = Arc::new(LeaseGuard::new(margin));
    // The election renews its Lease with `client`; the controllers write
    // with `acting`, which sends nothing that changes state without the lease.
    let client = kube::Client::try_from(request_config.clone()).context("Kubernetes client")?;
    let metrics = Arc::new(Metrics::default());
    let turns = |max: usize| WriteSlotsLayer::new(max, args.kube_timeout, metrics.kube_writes.clone());
    let acting =
        acting::client(request_config.clone(), guard.clone(), turns(args.kube_max_in_flight_writes as usize))
            .context("Kubernetes client")?;
    // The webhook's Node marks take turns of their own: the API server
    // waits for its answer only seconds, not behind the reconciles' burst.
    let marking =
        acting::client(request_config, guard.clone(), turns(WEBHOOK_WRITES)).context("Kubernetes client")?;
    let source = match &args.os_cloud {
        Some(cloud) => CloudSource::CloudsYaml { cloud: cloud.clone(), file: args.clouds_yaml.clone() },
        None => CloudSource::Env,
    };
    // A configuration that cannot work is the operator's to fix now; a
    // Keystone that rejects or does not answer is an observation per node.
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_default();
        format!("{host}-{}", std::process::id())
    });
    let cloud = Cloud::new(source, http)
        .with_lease_guard(guard.clone())
        .with_identity(&identity)
        .with_metrics(metrics.openstack.clone());
    cloud.check_config().context("OpenStack credentials")?;
    let nova: Arc<dyn Nova> = Arc::new(NovaClient::new(cloud));

    // With the plain client: a follower must be able to clear its label.
    // Before the metrics listener, so /readyz never answers without it.
    let pod =
        args.label_leader_pod.then(|| Arc::new(LeaderPod::new(client.clone(), &args.namespace, &identity)));
    if let Some(pod) = &pod {
        metrics.set_pod_label(pod.state.clone());
    }
    let metrics_addr = hv_coordinator::metrics::serve(args.metrics_listen, metrics.clone())
        .await
        .with_context(|| format!("metrics listener on {}", args.metrics_listen))?;
    tracing::info!(addr = %metrics_addr, "metrics listening");
    if args.ceph_fence_id.is_some() && args.ceph_client_networks.is_empty() {
        tracing::warn!(
            "--ceph-client-networks is not set: an agent's reported Ceph address is blocklisted on its word \
             wherever it is (docs/fencing.md)"
        );
    }
    // A dependent's pods go once the Node carries no lock: without its own
    // lock, nothing would hold them while VMs remain.
    if let Some((c, _)) = args.dependent_pods.iter().find(|(c, _)| !args.node_locks.contains(c)) {
        anyhow::bail!(
            "--dependent-pods {c}:… needs --node-lock {c}: its pods are held by its lock (docs/drain.md)"
        );
    }
    // A live agent that missed a heartbeat or two must still count as fresh.
    if args.fence_fresh_heartbeat < args.agent_heartbeat * 3 {
        anyhow::bail!(
            "--fence-fresh-heartbeat ({:?}) must be at least three --agent-heartbeat intervals ({:?}): \
             a live host whose agent missed a heartbeat would otherwise look fencable",
            args.fence_fresh_heartbeat,
            args.agent_heartbeat
        );
    }
    let tls = grpc_tls(&args)?;
    if let Some(tls) = &tls {
        metrics.set_tls(tls.stats.clone());
    }
    let server = fleet::Server::bind(args.listen).await?;
    let health = server.health.clone();
    tracing::info!(addr = %server.addr, "gRPC listening");
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (leader_tx, leader_rx) = watch::channel(false);
    let (changed_tx, changed_rx) = mpsc::unbounded_channel();
    let (evictions_to_wake, evictions_to_wake_rx) = mpsc::unbounded_channel();
    let registry = Arc::new(Registry::new(changed_tx.clone()).with_metrics(metrics.sessions.clone()));
    let protected =
        Protected { hypervisor: args.protected_pods.clone(), dependents: args.dependent_pods.clone() };
    // The protected pods' cache (for the disruption budgets' label), warm
    // before this replica leads; a change wakes its Node's reconcile.
    let pods = hv_coordinator::drain::pods::watch(&watch_client, &protected, changed_tx, leader_rx.clone());
    let (hv_reader, hv_writer) = reflector::store();
    let (node_reader, node_writer) = reflector::store();
    let (ev_reader, ev_writer) = reflector::store();
    let (mig_reader, mig_writer) = reflector::store();
    let (events, _) = broadcast::channel(1024);
    let agents = AgentEndpoint {
        registry: registry.clone(),
        hypervisors: hv_reader.clone(),
        leader: leader_rx.clone(),
        heartbeat: args.agent_heartbeat,
        trust_domain: tls.is_some().then(|| args.trust_domain.clone()),
        sessions: metrics.sessions.clone(),
    };
    let fleet_api = FleetEndpoint {
        hypervisors: hv_reader.clone(),
        registry: registry.clone(),
        events: events.clone(),
        leader: leader_rx.clone(),
    };
    {
        let (hvs, registry) = (hv_reader.clone(), registry.clone());
        metrics.set_fleet(move || {
            hv_coordinator::metrics::fleet(hvs.state().iter().map(|h| {
                let phase = h.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
                let health = h.status.as_ref().and_then(|s| s.health.as_ref()).map(|x| x.state);
                (phase, registry.connected(&h.name_any()), health)
            }))
        });
    }
    let grpc = tokio::spawn(server.serve(agents, fleet_api, tls, stopped(stop_rx.clone())));
    let follow = pod.clone().map(|pod| {
        let role = leader_tx.subscribe();
        tokio::spawn(async move { pod.follow(role, args.lease_retry).await })
    });

    // The gate opens once this replica leads with whole caches; until then
    // the webhook refuses protected pods (a drain tries again).
    let gate = Arc::new(Gate::new(guard.clone()));
    let updates = Arc::new(UpdateLimit::new(
        args.update_max_held,
        args.cordon_starts_maintenance,
        hv_coordinator::drain::signals::UpdateSignals(args.update_signals.clone()),
        hv_reader.clone(),
        node_reader.clone(),
    ));
    if let (Some(addr), Some(cert), Some(key)) =
        (args.webhook_listen, &args.webhook_tls_cert, &args.webhook_tls_key)
    {
        let config = hv_tls::server::config_without_client_auth(cert, key).context("webhook TLS")?;
        let hook = Arc::new(hv_coordinator::drain::webhook::Webhook {
            client: marking,
            hypervisors: hv_reader.clone(),
            nodes: node_reader.clone(),
            evictions: ev_reader.clone(),
            gate: gate.clone(),
            protected: protected.clone(),
            updates: updates.clone(),
        });
        let bound = hv_coordinator::drain::webhook::serve(addr, config, hook)
            .await
            .with_context(|| format!("webhook listener on {addr}"))?;
        tracing::info!(addr = %bound, "eviction webhook listening");
        if protected.is_empty() {
            tracing::warn!("the eviction webhook protects no pod: give --protected-pods (docs/drain.md)");
        }
    }
    let election = Election {
        lease: args.lease_name.clone(),
        identity: identity.clone(),
        lease_duration: args.lease_duration,
        renew_deadline: args.lease_renew_deadline,
        retry: args.lease_retry,
    };
    tokio::select! {
        _ = election.acquire(&client, &args.namespace, &guard) => {}
        _ = stop.wait() => {
            let _ = stop_tx.send(true);
            return Ok(());
        }
    }
    let _ = leader_tx.send(true);
    health.set_self(true).await;
    metrics.set_leader(true);

    let ev_ctx = Arc::new(EvictionContext {
        client: acting.clone(),
        nova: nova.clone(),
        migrations: mig_reader,
        hypervisors: hv_reader.clone(),
        limit: Arc::new(ClusterLimit::new(args.cluster_max_migrations)),
        gate: gate.clone(),
        written: Default::default(),
        metrics: metrics.clone(),
        default_policy: args.default_migration_policy,
        disable_timeout: args.eviction_disable_timeout,
        nova_clock_skew: args.nova_clock_skew,
        evacuate_by_default: args.evacuate_by_default,
        evacuate_rebuild_from_image: args.evacuate_rebuild_from_image,
        progress_reads: Default::default(),
        instance: instance.clone(),
    });
    let intervals =
        Intervals { busy: args.busy_interval, drift: args.drift_interval, ..Intervals::default() };
    let view_max_age = args.nova_view_max_age.unwrap_or(args.drift_interval / 2);
    let nova_view = Arc::new(FleetView::new(view_max_age, intervals.retry));
    let view = nova_view.clone();
    metrics.set_nova_view(move || view.figures());
    let ctx = Arc::new(Context {
        client: acting.clone(),
        nova,
        nova_view,
        registry: registry.clone(),
        health: health.clone(),
        recorder: Recorder::new(
            acting.clone(),
            Reporter { controller: "hv-coordinator".into(), instance: Some(identity.clone()) },
        ),
        hypervisors: hv_reader,
        nodes: node_reader,
        evictions: ev_reader,
        gate,
        policy: Policy {
            registration_timeout: jiff::SignedDuration::try_from(args.registration_timeout)?,
            checks_timeout: jiff::SignedDuration::try_from(args.checks_timeout)?,
            unreachable_grace: jiff::SignedDuration::try_from(args.unreachable_grace)?,
            cordon_starts_maintenance: args.cordon_starts_maintenance,
        },
        ha: hv_coordinator::k8s::ha::HaClaims::new(args.ha_maintenance_limit, args.unseen_max_share),
        fencing: hv_coordinator::k8s::fence::Fencing::new(
            hv_coordinator::fence::decide::FencePolicy {
                fresh_heartbeat: jiff::SignedDuration::try_from(args.fence_fresh_heartbeat)?,
                max_domain_share: args.fence_max_domain_share,
                max_started: args.fence_max_started,
                interval: jiff::SignedDuration::try_from(args.fence_interval)?,
            },
            args.ceph_fence_id.clone().map(|id| hv_coordinator::fence::ceph::CephFence {
                helper: args
                    .ceph_fence_helper
                    .clone()
                    .unwrap_or_else(hv_coordinator::fence::ceph::default_helper),
                conf: args.ceph_fence_conf.clone(),
                id,
                keyring: args.ceph_fence_keyring.clone(),
                timeout: Duration::from_secs(30),
            }),
            args.fence_power_timeout,
            args.namespace.clone(),
        )
        .with_ceph_networks(args.ceph_client_networks.clone()),
        metrics: metrics.clone(),
        judging_from: jiff::Timestamp::now() + jiff::SignedDuration::try_from(args.health_settle)?,
        health_policy: hv_coordinator::health::HealthPolicy {
            node_grace: jiff::SignedDuration::try_from(args.node_not_ready_grace)?,
        },
        intervals,
        events,
        written: Default::default(),
        node_locks: args.node_locks.clone(),
        pods,
        updates,
        evictions_to_wake,
    });
    let template = Template {
        instance: instance.clone(),
        aggregates: args.aggregates.clone(),
        custom_traits: args.custom_traits.clone(),
        ceph_pools: args.ceph_pools.clone(),
        skip_tests: args.skip_tests,
        nova_host_strip_suffixes: args.nova_host_strip_suffixes.clone(),
    };
    let mut controllers = tokio::spawn(k8s::run(
        watch_client.clone(),
        ctx,
        ev_ctx,
        args.node_selector.clone(),
        template,
        Writers { hypervisors: hv_writer, nodes: node_writer, evictions: ev_writer, migrations: mig_writer },
        changed_rx,
        evictions_to_wake_rx,
        args.reconcile_concurrency,
        stop_rx.clone(),
    ));
    // A leader whose pod cannot carry the label is out of the Service:
    // no agent reaches it, so it gives way to one that can.
    let unlabelled = async {
        match &pod {
            Some(pod) => pod.unlabelled_for(args.lease_renew_deadline).await,
            None => std::future::pending().await,
        }
    };
    let lost = tokio::select! {
        _ = stop.wait() => None,
        _ = election.hold(&client, &args.namespace, &guard) => Some("lost the leader lease"),
        _ = &mut controllers => Some("the controllers stopped (a cache could not sync)"),
        _ = unlabelled => Some("could not label its pod as the leader's"),
    };
    // Hand over: stop acting first, then give the lease up.
    guard.revoke();
    let _ = leader_tx.send(false);
    health.set_self(false).await;
    metrics.set_leader(false);
    registry.close_all();
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controllers).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), grpc).await;
    // The lease first, so the standby leads at once; then the label (a
    // write of the label follower in flight must not land after it).
    if lost.is_none() {
        election.release(&client, &args.namespace).await;
    }
    if let Some(follow) = follow {
        follow.abort();
    }
    if let Some(pod) = &pod {
        // Best effort: a label left behind keeps this pod out of the
        // Service all the same (not Ready), and the next start clears it.
        match tokio::time::timeout(Duration::from_secs(3), pod.write(false)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not clear the pod's leader label"),
            Err(_) => tracing::warn!("could not clear the pod's leader label: no answer within 3s"),
        }
    }
    if let Some(why) = lost {
        anyhow::bail!("{why} ({}); exiting to restart as a follower", args.lease_name);
    }
    tracing::info!("stopped");
    Ok(())
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
