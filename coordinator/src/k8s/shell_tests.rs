//! Request-level tests of the two reconcilers: each runs once against a
//! mock Kubernetes API (`tower_test`, as kube-rs' controller examples do)
//! and a fake Nova, and the test checks the requests it made, in order.
//! A change to what a reconcile asks or writes shows here without the
//! ground; what Nova and the API server do with it is the end-to-end
//! suite's to show.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Node;
use kube::client::Body;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};

use super::eviction::{self, EvictionContext};
use super::hypervisor::{self, Context, Intervals};
use super::leader::LeaseGuard;
use super::{Gate, written::Written};
use crate::api::eviction::{
    EvictionOptions, EvictionPhase, EvictionReason, EvictionSpec, EvictionStatus, VmState, VmStatus,
};
use crate::api::hypervisor::EvictionRef;
use crate::api::{Eviction, Hypervisor, HypervisorSpec, HypervisorStatus, Phase};
use crate::eviction::limit::Budgets;
use crate::eviction::plan::Server;
use crate::eviction::preflight::Candidate;
use crate::fleet::{Health, Registry};
use crate::lifecycle::{Action, NovaHost, NovaObs, Policy, ServiceState};
use crate::metrics::Metrics;
use crate::nova::FleetSnapshot;
use crate::nova::servers::{NovaMigration, Progress};
use crate::nova::{Nova, NovaError};

/// What happened, in order: "k8s METHOD PATH" and "nova CALL".
type Log = Arc<Mutex<Vec<String>>>;

fn entries(log: &Log) -> Vec<String> {
    log.lock().map(|l| l.clone()).unwrap_or_default()
}

fn push(log: &Log, line: String) {
    if let Ok(mut l) = log.lock() {
        l.push(line);
    }
}

/// A mock API server answering with `answer`, logging each request and
/// keeping the bodies of writes.
fn api(
    log: Log,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    answer: fn(&Method, &str) -> (u16, Value),
) -> kube::Client {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (method, path) = (req.method().clone(), req.uri().path().to_string());
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            push(&log, format!("k8s {method} {path}"));
            if let Ok(mut b) = bodies.lock() {
                b.push((format!("{method} {path}"), body));
            }
            let (code, out) = answer(&method, &path);
            let rsp = Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&out).unwrap_or_default()));
            if let Ok(rsp) = rsp {
                send.send_response(rsp);
            }
        }
    });
    kube::Client::new(svc, "default")
}

fn not_found() -> (u16, Value) {
    (
        404,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

/// A Hypervisor as the API server would answer a write of it.
fn hv_json(name: &str, rv: &str) -> Value {
    json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor",
           "metadata": {"name": name, "resourceVersion": rv, "uid": "hv-uid"}, "spec": {}})
}

/// Nova as a test wants it, recording every call.
struct FakeNova {
    log: Log,
    obs: NovaObs,
    servers: Vec<Server>,
    migrate: Result<(), NovaError>,
    execute: Result<(), NovaError>,
    /// Whether Nova shows the host's compute service enabled.
    service_enabled: Arc<Mutex<Option<bool>>>,
    /// Servers whose migration Nova answers with an error, and which.
    failing: Arc<Mutex<Vec<(String, NovaError)>>>,
    /// node-1 as the fleet's lists show it; None: the fleet read fails.
    fleet: Arc<Mutex<Option<NovaHost>>>,
    /// How long a read of the fleet takes.
    fleet_delay: Arc<Mutex<Duration>>,
    /// The migrations Nova lists from the host.
    migrations: Vec<NovaMigration>,
}

#[tonic::async_trait]
impl Nova for FakeNova {
    async fn observe(&self, host: &str, _: &[String]) -> NovaObs {
        push(&self.log, format!("nova observe {host}"));
        self.obs.clone()
    }
    async fn fleet(&self, _: &std::collections::BTreeSet<String>) -> Result<FleetSnapshot, NovaError> {
        push(&self.log, "nova fleet".into());
        // As a real read: the snapshot dates from when the read began.
        let began = std::time::Instant::now();
        let delay = self.fleet_delay.lock().map(|d| *d).unwrap_or_default();
        tokio::time::sleep(delay).await;
        match self.fleet.lock().map(|f| f.clone()).ok().flatten() {
            Some(h) => {
                let mut snapshot = FleetSnapshot::of_one("node-1", &h);
                snapshot.started = began;
                Ok(snapshot)
            }
            None => Err(NovaError::Unavailable("the fake has no fleet lists".into())),
        }
    }
    async fn compute_hosts(&self) -> Result<Vec<String>, NovaError> {
        Ok(Vec::new())
    }
    async fn execute(&self, _: &str, _: Option<&str>, action: &Action) -> Result<(), NovaError> {
        push(&self.log, format!("nova {action}"));
        self.execute.clone()
    }
    async fn servers_on(&self, host: &str) -> Result<Vec<Server>, NovaError> {
        push(&self.log, format!("nova servers on {host}"));
        Ok(self.servers.clone())
    }
    async fn server(&self, _: &str) -> Result<Option<Server>, NovaError> {
        Ok(None)
    }
    async fn candidates(&self, _: &str, _: &[String]) -> Result<Vec<Candidate>, NovaError> {
        Ok(Vec::new())
    }
    async fn carriers(
        &self,
        traits: &std::collections::BTreeSet<String>,
    ) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>, NovaError> {
        Ok(traits.iter().map(|t| (t.clone(), Default::default())).collect())
    }
    async fn migrations_from(&self, _: &str, _: Timestamp) -> Result<Vec<NovaMigration>, NovaError> {
        Ok(self.migrations.clone())
    }
    async fn progress_of(&self, id: &str) -> Result<Vec<Progress>, NovaError> {
        push(&self.log, format!("nova progress {id}"));
        Ok(Vec::new())
    }
    async fn migrate(&self, id: &str, _: bool) -> Result<(), NovaError> {
        push(&self.log, format!("nova migrate {id}"));
        let failing = self.failing.lock().map(|f| f.clone()).unwrap_or_default();
        match failing.into_iter().find(|(server, _)| server == id) {
            Some((_, e)) => Err(e),
            None => self.migrate.clone(),
        }
    }
    async fn evacuate(&self, id: &str) -> Result<(), NovaError> {
        push(&self.log, format!("nova evacuate {id}"));
        self.migrate.clone()
    }
    async fn start(&self, id: &str) -> Result<(), NovaError> {
        push(&self.log, format!("nova start {id}"));
        Ok(())
    }
    async fn confirm_resize(&self, _: &str) -> Result<(), NovaError> {
        Ok(())
    }
    async fn abort_migration(&self, _: &str, _: i64) -> Result<(), NovaError> {
        Ok(())
    }
    async fn server_groups_of(
        &self,
        _: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::eviction::server_groups::Group>, NovaError> {
        Ok(Vec::new())
    }
    async fn force_complete_migration(&self, id: &str, migration: i64) -> Result<(), NovaError> {
        push(&self.log, format!("nova force_complete {id} {migration}"));
        Ok(())
    }
    async fn server_metadata(&self, id: &str, key: &str, value: Option<&str>) -> Result<(), NovaError> {
        push(&self.log, format!("nova metadata {id} {key}={value:?}"));
        Ok(())
    }
    async fn set_forced_down(&self, host: &str, down: bool) -> Result<(), NovaError> {
        push(&self.log, format!("nova forced_down {host} {down}"));
        Ok(())
    }
    async fn compute_service(&self, _: &str) -> Result<Option<crate::nova::ServiceView>, NovaError> {
        let enabled = self.service_enabled.lock().map(|e| *e).unwrap_or_default();
        Ok(enabled.map(|enabled| crate::nova::ServiceView {
            enabled,
            disabled_reason: None,
            state: ServiceState::Up,
            updated_at: None,
        }))
    }
    async fn rooms(
        &self,
        _: &[crate::power::policy::Scope],
    ) -> Result<Vec<crate::power::policy::HostRoom>, NovaError> {
        Ok(Vec::new())
    }
}

#[test]
fn an_observing_gate_lets_no_call_outside_the_kubernetes_api_leave() {
    let lease = Arc::new(LeaseGuard::new(Duration::ZERO));
    lease.renewed(tokio::time::Instant::now(), Duration::from_secs(3600));
    assert_eq!(Gate::new(lease.clone()).may_act(), Ok(()));
    let observing = Gate::new(lease.clone()).observing(true);
    assert!(observing.observes());
    assert!(observing.may_act().unwrap_err().contains("observes only"));
    lease.revoke();
    assert!(Gate::new(lease).may_act().is_err(), "nor without the lease");
}

fn gate(open: bool) -> Arc<Gate> {
    let lease = Arc::new(LeaseGuard::new(Duration::ZERO));
    lease.renewed(tokio::time::Instant::now(), Duration::from_secs(3600));
    let g = Gate::new(lease);
    g.synced.store(open, std::sync::atomic::Ordering::Release);
    Arc::new(g)
}

struct Hv {
    ctx: Arc<Context>,
    log: Log,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    /// What the fake's fleet lists show of node-1 (None: the fleet read
    /// fails), and how long a read of them takes.
    fleet: Arc<Mutex<Option<NovaHost>>>,
    fleet_delay: Arc<Mutex<Duration>>,
    /// The Evictions the reconciles asked to wake.
    woken: tokio::sync::mpsc::UnboundedReceiver<String>,
}

fn hypervisor_ctx(
    answer: fn(&Method, &str) -> (u16, Value),
    nova: NovaObs,
    open: bool,
    evictions: Vec<Eviction>,
) -> Hv {
    hypervisor_ctx_executing(answer, nova, open, evictions, Ok(()))
}

/// As `hypervisor_ctx`, with every Nova action answering `execute`.
fn hypervisor_ctx_executing(
    answer: fn(&Method, &str) -> (u16, Value),
    nova: NovaObs,
    open: bool,
    evictions: Vec<Eviction>,
    execute: Result<(), NovaError>,
) -> Hv {
    hypervisor_ctx_on(answer, nova, open, evictions, execute, &[])
}

/// As `hypervisor_ctx_executing`, the Node carrying `labels`.
fn hypervisor_ctx_on(
    answer: fn(&Method, &str) -> (u16, Value),
    nova: NovaObs,
    open: bool,
    evictions: Vec<Eviction>,
    execute: Result<(), NovaError>,
    labels: &[(&str, &str)],
) -> Hv {
    let log: Log = Arc::default();
    let bodies = Arc::default();
    let client = api(log.clone(), Arc::clone(&bodies), answer);
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let mut node = Node::default();
    node.metadata.name = Some("node-1".into());
    node.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    node.status = serde_json::from_value(json!({"conditions": [{"type": "Ready", "status": "True"}]})).ok();
    node_writer.apply_watcher_event(&watcher::Event::Apply(node));
    let (evs, mut ev_writer) = reflector::store::<Eviction>();
    for e in evictions {
        ev_writer.apply_watcher_event(&watcher::Event::Apply(e));
    }
    let (changed, _) = tokio::sync::mpsc::unbounded_channel();
    let (evictions_to_wake, woken) = tokio::sync::mpsc::unbounded_channel();
    let (reporter, _) = tonic_health::server::health_reporter();
    let fleet: Arc<Mutex<Option<NovaHost>>> = Arc::default();
    let fleet_delay: Arc<Mutex<Duration>> = Arc::default();
    let ctx = Context {
        client: client.clone(),
        nova_view: Arc::new(crate::nova::FleetView::new(Duration::from_secs(30), Duration::from_secs(10))),
        own_reads: Default::default(),
        renewals: Default::default(),
        nova_hosts: Default::default(),
        nova: Arc::new(FakeNova {
            log: log.clone(),
            obs: nova,
            servers: Vec::new(),
            migrate: Ok(()),
            execute,
            service_enabled: Arc::new(Mutex::new(Some(false))),
            failing: Arc::default(),
            fleet: fleet.clone(),
            fleet_delay: fleet_delay.clone(),
            migrations: Vec::new(),
        }),
        registry: Arc::new(Registry::new(changed)),
        health: Health::new(reporter),
        recorder: Recorder::new(client, Reporter { controller: "test".into(), instance: None }),
        hypervisors: reflector::store::<Hypervisor>().0,
        nodes,
        evictions: evs,
        gate: gate(open),
        policy: Policy::default(),
        health_policy: Default::default(),
        ha: crate::k8s::ha::HaClaims::new(3, 50),
        fencing: crate::k8s::fence::FenceContext::new(
            Default::default(),
            None,
            Duration::from_secs(60),
            "hv-system".into(),
        ),
        judging_from: jiff::Timestamp::UNIX_EPOCH,
        metrics: Default::default(),
        intervals: Intervals::default(),
        events: tokio::sync::broadcast::channel(8).0,
        written: Written::default(),
        node_locks: Vec::new(),
        pods: Default::default(),
        dependencies: Default::default(),
        updates: Arc::new(crate::k8s::updates::UpdateLimit::new(
            0,
            false,
            Default::default(),
            reflector::store::<Hypervisor>().0,
            reflector::store::<Node>().0,
        )),
        guard: None,
        evictions_to_wake,
    };
    Hv { ctx: Arc::new(ctx), log, bodies, fleet, fleet_delay, woken }
}

fn hypervisor(phase: Option<Phase>, record: Option<EvictionRef>) -> Arc<Hypervisor> {
    let mut h = Hypervisor::new("node-1", HypervisorSpec::default());
    h.metadata.resource_version = Some("7".into());
    h.metadata.uid = Some("hv-uid".into());
    h.metadata.finalizers = Some(vec![crate::api::keys::HYPERVISOR_FINALIZER.into()]);
    let mut st = HypervisorStatus { phase, ..Default::default() };
    st.service_id = Some("svc-1".into());
    st.lifecycle.eviction = record;
    h.status = Some(st);
    Arc::new(h)
}

/// A registered host; a disabled one disabled by us.
fn registered(enabled: bool, instances: &[&str]) -> NovaObs {
    NovaObs::Registered(NovaHost {
        service_id: "svc-1".into(),
        hypervisor_id: Some("hv-1".into()),
        hypervisor_hostname: Some("node-1".into()),
        enabled,
        disabled_reason: (!enabled).then(|| "hv-lifecycle: maintenance (manual)".to_string()),
        traits: Some(Default::default()),
        instances: instances.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
}

fn status_writes(bodies: &Arc<Mutex<Vec<(String, Value)>>>) -> Vec<Value> {
    let b = bodies.lock().map(|b| b.clone()).unwrap_or_default();
    b.into_iter()
        .filter(|(what, _)| what.starts_with("PATCH") && what.ends_with("/status"))
        .map(|(_, v)| v)
        .collect()
}

#[tokio::test]
async fn a_new_hypervisor_is_onboarded_with_one_status_write_over_the_version_read() {
    let t = hypervisor_ctx(
        |m, p| match (m.as_str(), p) {
            ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1/status") => {
                (200, hv_json("node-1", "8"))
            }
            _ => (201, json!({})),
        },
        NovaObs::NotRegistered,
        true,
        vec![],
    );
    let next = hypervisor::reconcile(hypervisor(None, None), t.ctx.clone()).await.map_err(|e| e.to_string());
    assert_eq!(next, Ok(Requeue::requeue(Duration::from_millis(200))), "a transition: look again soon");
    let writes = status_writes(&t.bodies);
    assert_eq!(writes.len(), 1, "{:?}", entries(&t.log));
    assert_eq!(writes[0]["metadata"]["resourceVersion"], "7", "written over the version read");
    assert_eq!(writes[0]["status"]["phase"], "Onboarding");
    let log = entries(&t.log);
    assert_eq!(log[0], "nova observe node-1");
    assert!(log.iter().any(|l| l.starts_with("k8s POST /apis/events.k8s.io/v1/")), "an Event: {log:?}");
}

#[tokio::test]
async fn nothing_is_asked_or_written_before_the_caches_are_whole() {
    let t = hypervisor_ctx(|_, _| (500, json!({})), NovaObs::NotRegistered, false, vec![]);
    let next = hypervisor::reconcile(hypervisor(None, None), t.ctx.clone()).await.map_err(|e| e.to_string());
    assert_eq!(next, Ok(Requeue::requeue(Duration::from_millis(500))));
    assert!(entries(&t.log).is_empty(), "{:?}", entries(&t.log));
}

fn hand_made(phase: EvictionPhase) -> Value {
    json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction",
           "metadata": {"name": "drain-1", "resourceVersion": "3"},
           "spec": {"hypervisor": "node-1", "reason": "RollingUpdate"},
           "status": {"phase": phase}})
}

#[tokio::test]
async fn the_eviction_waiting_for_its_host_is_woken_once_the_host_is_disabled() {
    let eviction = |name: &str, host: &str, phase: EvictionPhase| -> Eviction {
        let mut v = hand_made(phase);
        v["metadata"]["name"] = json!(name);
        v["spec"]["hypervisor"] = json!(host);
        serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))
    };
    let record = EvictionRef {
        name: "drain-1".into(),
        reason: EvictionReason::RollingUpdate,
        re_enable: true,
        for_maintenance: false,
    };
    let cached = vec![
        eviction("drain-1", "node-1", EvictionPhase::Disabling),
        eviction("drain-0", "node-1", EvictionPhase::Succeeded),
        eviction("drain-9", "node-9", EvictionPhase::Disabling),
    ];
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    // The host still takes VMs: this reconcile disables it and wakes the
    // running Eviction of this host, not the finished one nor another host's.
    let mut t = hypervisor_ctx(answer, registered(true, &["vm-1"]), true, cached.clone());
    hypervisor::reconcile(hypervisor(Some(Phase::Evicting), Some(record.clone())), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(entries(&t.log).iter().any(|l| l.starts_with("nova disable")), "{:?}", entries(&t.log));
    let mut woken = Vec::new();
    while let Ok(n) = t.woken.try_recv() {
        woken.push(n);
    }
    assert_eq!(woken, ["drain-1"]);

    // Already disabled: nothing done, nobody woken.
    let mut quiet = hypervisor_ctx(answer, registered(false, &["vm-1"]), true, cached);
    hypervisor::reconcile(hypervisor(Some(Phase::Evicting), Some(record)), quiet.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(quiet.woken.try_recv().is_err());
}

#[tokio::test]
async fn a_named_eviction_missing_from_the_cache_is_read_before_the_host_is_re_enabled() {
    // Evicting under a hand-made RollingUpdate Eviction that the cache does
    // not show yet: the reconcile reads it, finds it running, and leaves
    // the host disabled.
    let record = EvictionRef {
        name: "drain-1".into(),
        reason: EvictionReason::RollingUpdate,
        re_enable: true,
        for_maintenance: false,
    };
    let t = hypervisor_ctx(
        |m, p| match (m.as_str(), p) {
            ("GET", "/apis/hypervisor.cloud.sap/v1alpha1/evictions/drain-1") => {
                (200, hand_made(EvictionPhase::Migrating))
            }
            ("PATCH", _) => (200, hv_json("node-1", "8")),
            _ => (201, json!({})),
        },
        registered(false, &["vm-1"]),
        true,
        vec![],
    );
    hypervisor::reconcile(hypervisor(Some(Phase::Evicting), Some(record.clone())), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(
        log.contains(&"k8s GET /apis/hypervisor.cloud.sap/v1alpha1/evictions/drain-1".to_string()),
        "{log:?}"
    );
    assert!(!log.iter().any(|l| l.starts_with("nova enable")), "re-enabled mid-eviction: {log:?}");

    // Truly gone (404): the eviction ended before completion, and its reason
    // re-enables the host.
    let gone = hypervisor_ctx(
        |m, p| match (m.as_str(), p) {
            ("GET", "/apis/hypervisor.cloud.sap/v1alpha1/evictions/drain-1") => not_found(),
            ("PATCH", _) => (200, hv_json("node-1", "8")),
            _ => (201, json!({})),
        },
        registered(false, &[]),
        true,
        vec![],
    );
    hypervisor::reconcile(hypervisor(Some(Phase::Evicting), Some(record)), gone.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        entries(&gone.log).iter().any(|l| l == "nova enable compute service"),
        "{:?}",
        entries(&gone.log)
    );
}

#[tokio::test]
async fn the_service_is_recorded_deleted_only_once_nova_answered_the_delete() {
    // The decommission tail of a host Nova shows empty, outside every
    // aggregate: the next action is the DELETE of its compute service.
    let record = EvictionRef {
        name: "node-1-termination-1".into(),
        reason: EvictionReason::Decommission,
        re_enable: false,
        for_maintenance: true,
    };
    let mut done = Eviction::new(
        "node-1-termination-1",
        EvictionSpec {
            hypervisor: "node-1".into(),
            reason: EvictionReason::Decommission,
            options: EvictionOptions::default(),
            dry_run: false,
        },
    );
    done.status = Some(EvictionStatus { phase: Some(EvictionPhase::Succeeded), ..Default::default() });
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    let decommissioning = || {
        let mut hv = (*hypervisor(Some(Phase::Evicting), Some(record.clone()))).clone();
        hv.spec.maintenance = crate::api::MaintenanceMode::Termination;
        Arc::new(hv)
    };
    for (execute, deleted) in
        [(Err(NovaError::Unknown("DELETE: connection reset".into())), false), (Ok(()), true)]
    {
        let t = hypervisor_ctx_executing(answer, registered(false, &[]), true, vec![done.clone()], execute);
        hypervisor::reconcile(decommissioning(), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
        let log = entries(&t.log);
        assert!(log.iter().any(|l| l.starts_with("nova delete compute service")), "{log:?}");
        let writes = status_writes(&t.bodies);
        let recorded = writes.last().and_then(|w| w["status"]["lifecycle"]["serviceDeleted"].as_bool());
        assert_eq!(recorded.unwrap_or(false), deleted, "{writes:?}");
    }
}

#[tokio::test]
async fn a_status_write_over_a_newer_version_fails_and_is_retried_soon() {
    let t = hypervisor_ctx(
        |m, _| match m.as_str() {
            "PATCH" => (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
            ),
            _ => (201, json!({})),
        },
        NovaObs::NotRegistered,
        true,
        vec![],
    );
    let hv = hypervisor(None, None);
    let err =
        hypervisor::reconcile(hv.clone(), t.ctx.clone()).await.err().unwrap_or_else(|| panic!("no conflict"));
    assert_eq!(
        hypervisor::error_policy(hv, &err, t.ctx.clone()),
        Requeue::requeue(Duration::from_millis(200))
    );
}

struct Ev {
    ctx: Arc<EvictionContext>,
    log: Log,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    /// Whether Nova shows node-1's compute service enabled (at first, yes).
    service_enabled: Arc<Mutex<Option<bool>>>,
    /// Servers whose migration Nova answers with an error.
    failing: Arc<Mutex<Vec<(String, NovaError)>>>,
    /// The Hypervisor cache's writing end.
    hv_writer: Mutex<reflector::store::Writer<Hypervisor>>,
}

fn eviction_ctx(
    answer: fn(&Method, &str) -> (u16, Value),
    servers: Vec<Server>,
    migrate: Result<(), NovaError>,
    managed: bool,
) -> Ev {
    eviction_ctx_limited(answer, servers, migrate, managed, 5)
}

fn eviction_ctx_limited(
    answer: fn(&Method, &str) -> (u16, Value),
    servers: Vec<Server>,
    migrate: Result<(), NovaError>,
    managed: bool,
    cluster_max: u32,
) -> Ev {
    eviction_ctx_seeing(answer, servers, Vec::new(), migrate, managed, cluster_max)
}

/// As `eviction_ctx_limited`, Nova listing `migrations` from the host.
fn eviction_ctx_seeing(
    answer: fn(&Method, &str) -> (u16, Value),
    servers: Vec<Server>,
    migrations: Vec<NovaMigration>,
    migrate: Result<(), NovaError>,
    managed: bool,
    cluster_max: u32,
) -> Ev {
    let log: Log = Arc::default();
    let bodies = Arc::default();
    let client = api(log.clone(), Arc::clone(&bodies), answer);
    let service_enabled = Arc::new(Mutex::new(Some(true)));
    let failing: Arc<Mutex<Vec<(String, NovaError)>>> = Arc::default();
    let (hypervisors, mut hv_writer) = reflector::store::<Hypervisor>();
    if managed {
        hv_writer
            .apply_watcher_event(&watcher::Event::Apply((*hypervisor(Some(Phase::Evicting), None)).clone()));
    }
    let recorder = Recorder::new(client.clone(), Reporter { controller: "test".into(), instance: None });
    let ctx = EvictionContext {
        client,
        nova: Arc::new(FakeNova {
            log: log.clone(),
            obs: NovaObs::Unknown,
            servers,
            migrate,
            execute: Ok(()),
            service_enabled: service_enabled.clone(),
            failing: failing.clone(),
            fleet: Arc::default(),
            fleet_delay: Arc::default(),
            migrations,
        }),
        migrations: reflector::store().0,
        hypervisors,
        evictions: reflector::store::<Eviction>().0,
        limit: Arc::new(Budgets::new(cluster_max, cluster_max)),
        gate: gate(true),
        recorder,
        written: Written::default(),
        metrics: Arc::new(Metrics::default()),
        default_policy: Default::default(),
        evacuate_by_default: true,
        evacuate_rebuild_from_image: false,
        progress_reads: Default::default(),
        forced: Default::default(),
        instance: "hv-coordinator".into(),
        events: tokio::sync::broadcast::channel(16).0,
        hibernation: Arc::default(),
        hibernation_interval: Duration::from_secs(30),
    };
    Ev { ctx: Arc::new(ctx), log, bodies, service_enabled, failing, hv_writer: Mutex::new(hv_writer) }
}

fn an_eviction(status: Option<EvictionStatus>) -> Arc<Eviction> {
    let spec = EvictionSpec {
        hypervisor: "node-1".into(),
        reason: EvictionReason::AdminRequest,
        options: EvictionOptions::default(),
        dry_run: false,
    };
    let mut e = Eviction::new("ev", spec);
    e.metadata.resource_version = Some("5".into());
    e.metadata.uid = Some("ev-uid".into());
    e.metadata.finalizers = Some(vec![crate::api::keys::EVICTION_FINALIZER.into()]);
    e.status = status;
    Arc::new(e)
}

fn ev_json() -> Value {
    json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction",
           "metadata": {"name": "ev", "resourceVersion": "6"}, "spec": {"hypervisor": "node-1", "reason": "AdminRequest"}})
}

/// The answer to any write of an Eviction or one of its Migrations.
fn ev_or_migration(_: &Method, path: &str) -> (u16, Value) {
    if path.contains("/migrations") {
        return (
            200,
            json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Migration", "metadata": {"name": "m", "resourceVersion": "1"},
            "spec": {"eviction": "ev", "serverId": "vm-a", "sourceHost": "node-1", "attempt": 1, "policy": "liveMigrate"}}),
        );
    }
    (200, ev_json())
}

fn server(id: &str) -> Server {
    Server {
        id: id.into(),
        name: id.into(),
        host: Some("node-1".into()),
        status: "ACTIVE".into(),
        memory_bytes: 1 << 30,
        policy: None,
        locked: false,
        pci_passthrough: false,
        local_disk: false,
        host_disks: false,
        evacuate: None,
        evict_mark: None,
        needs: Default::default(),
    }
}

fn migrating(vms: Vec<VmStatus>) -> Option<EvictionStatus> {
    Some(EvictionStatus {
        phase: Some(EvictionPhase::Migrating),
        started_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())),
        vms,
        ..Default::default()
    })
}

#[tokio::test]
async fn an_eviction_of_an_unmanaged_host_is_refused_with_its_target_condition() {
    let t = eviction_ctx(
        |m, p| match (m.as_str(), p) {
            ("GET", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1") => not_found(),
            _ => (200, ev_json()),
        },
        vec![],
        Ok(()),
        false,
    );
    let next = eviction::reconcile(an_eviction(None), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    // Its own status write does not wake it: it looks again at once, and
    // that look releases the finalizer.
    assert_eq!(next, Requeue::requeue(Duration::from_millis(100)));
    let writes = status_writes(&t.bodies);
    assert_eq!(writes.len(), 1, "{:?}", entries(&t.log));
    assert_eq!(writes[0]["status"]["phase"], "Failed");
    assert_eq!(writes[0]["status"]["conditions"][0]["type"], "Target");
    assert_eq!(writes[0]["status"]["conditions"][0]["reason"], "UnknownHypervisor");
    assert!(!entries(&t.log).iter().any(|l| l.starts_with("nova")), "Nova never asked");
}

#[tokio::test]
async fn a_new_attempt_is_recorded_and_its_migration_object_created_before_nova_is_asked() {
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    let vm =
        VmStatus { id: "vm-a".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() };
    eviction::reconcile(an_eviction(migrating(vec![vm])), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    let at = |what: &str| {
        log.iter().position(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no {what} in {log:?}"))
    };
    let recorded = at("k8s PATCH /apis/hypervisor.cloud.sap/v1alpha1/evictions/ev/status");
    let created = at("k8s POST /apis/hypervisor.cloud.sap/v1alpha1/migrations");
    let asked = at("nova migrate vm-a");
    assert!(recorded < asked && created < asked, "recorded and created before Nova was asked: {log:?}");
    let writes = status_writes(&t.bodies);
    assert_eq!(writes[0]["metadata"]["resourceVersion"], "5");
    assert_eq!(writes[0]["status"]["vms"][0]["attempts"], 1);
    assert_eq!(writes[0]["status"]["vms"][0]["state"], "Migrating");
}

#[tokio::test]
async fn the_slot_an_attempt_seen_done_frees_is_taken_in_the_same_step() {
    // maxParallel 1, vm-a in flight: Nova shows its migration completed and
    // the server on another host. This very reconcile starts vm-b, not
    // the next one a poll later.
    let asked = Timestamp::now() - jiff::SignedDuration::from_secs(30);
    let done = nova_migration(41, "vm-a", crate::eviction::NovaState::Completed, asked);
    let moved = Server { host: Some("node-2".into()), ..server("vm-a") };
    let t = eviction_ctx_seeing(ev_or_migration, vec![moved, server("vm-b")], vec![done], Ok(()), true, 5);
    let vms = vec![
        in_flight("vm-a", asked),
        VmStatus { id: "vm-b".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() },
    ];
    let mut ev = (*an_eviction(migrating(vms))).clone();
    ev.spec.options.max_parallel = 1;
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(log.iter().any(|l| l == "nova migrate vm-b"), "the freed slot is taken now: {log:?}");
    let writes = status_writes(&t.bodies);
    let last = writes
        .iter()
        .rfind(|w| w["kind"] == "Eviction")
        .unwrap_or_else(|| panic!("no status written: {log:?}"));
    assert_eq!(last["status"]["vms"][0]["state"], "Migrated", "{last}");
    assert_eq!(last["status"]["vms"][1]["state"], "Migrating", "{last}");
}

/// Nova's live migration `id` of `server` from node-1 to node-2, created a
/// second after `asked`.
fn nova_migration(
    id: i64,
    server: &str,
    status: crate::eviction::NovaState,
    asked: Timestamp,
) -> NovaMigration {
    NovaMigration {
        id,
        status,
        instance_uuid: Some(server.into()),
        source_compute: Some("node-1".into()),
        dest_compute: Some("node-2".into()),
        migration_type: Some("live-migration".into()),
        created_at: Some(asked + jiff::SignedDuration::from_secs(1)),
        updated_at: None,
    }
}

/// A VM whose first attempt was asked at `asked`.
fn in_flight(id: &str, asked: Timestamp) -> VmStatus {
    VmStatus {
        id: id.into(),
        state: VmState::Migrating,
        attempts: 1,
        attempt_started: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(asked)),
        memory_bytes: 1 << 30,
        ..Default::default()
    }
}

/// vm-a's attempt in flight, asked 30 s ago, as Nova shows it (`status`),
/// with the eviction's context.
fn one_attempt_in_flight(status: crate::eviction::NovaState) -> (Ev, Arc<Eviction>) {
    let asked = Timestamp::now() - jiff::SignedDuration::from_secs(30);
    let nova = nova_migration(41, "vm-a", status, asked);
    let t = eviction_ctx_seeing(ev_or_migration, vec![server("vm-a")], vec![nova], Ok(()), true, 5);
    (t, an_eviction(migrating(vec![in_flight("vm-a", asked)])))
}

#[tokio::test]
async fn a_look_comes_soon_after_an_end_beside_a_running_attempt() {
    // vm-a's and vm-b's attempts were asked together; Nova shows vm-a's
    // completed and vm-b's still running.
    let asked = Timestamp::now() - jiff::SignedDuration::from_secs(30);
    let seen = vec![
        nova_migration(41, "vm-a", crate::eviction::NovaState::Completed, asked),
        nova_migration(42, "vm-b", crate::eviction::NovaState::Running { live_running: true }, asked),
    ];
    let moved = Server { host: Some("node-2".into()), ..server("vm-a") };
    let t = eviction_ctx_seeing(ev_or_migration, vec![moved, server("vm-b")], seen, Ok(()), true, 5);
    let mut ev = (*an_eviction(migrating(vec![in_flight("vm-a", asked), in_flight("vm-b", asked)]))).clone();
    ev.spec.options.max_parallel = 2;
    let next = eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next, kube::runtime::controller::Action::requeue(Duration::from_millis(300)));
}

#[tokio::test]
async fn a_running_attempts_progress_is_not_read_again_at_the_next_look() {
    let (t, ev) = one_attempt_in_flight(crate::eviction::NovaState::Running { live_running: true });
    eviction::reconcile(ev.clone(), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    eviction::reconcile(ev, t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert_eq!(log.iter().filter(|l| *l == "nova servers on node-1").count(), 2, "two looks: {log:?}");
    assert_eq!(log.iter().filter(|l| *l == "nova progress vm-a").count(), 1, "{log:?}");
}

/// Two VMs pending, `max_parallel` 2, both pending.
fn two_pending() -> Arc<Eviction> {
    let pending = |id: &str| VmStatus {
        id: id.into(),
        state: VmState::Pending,
        memory_bytes: 1 << 30,
        ..Default::default()
    };
    let mut ev = (*an_eviction(migrating(vec![pending("vm-a"), pending("vm-b")]))).clone();
    ev.spec.options.max_parallel = 2;
    Arc::new(ev)
}

#[tokio::test]
async fn attempts_started_together_are_all_asked_though_one_cannot_be() {
    // vm-a's request cannot be sent by this replica (no longer the leader,
    // as Nova's client finds): vm-b's is asked all the same, its answer
    // recorded, and the reconcile ends in the error.
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a"), server("vm-b")], Ok(()), true);
    t.failing.lock().unwrap().push(("vm-a".into(), NovaError::NotLeader("lease lost".into())));
    let done = eviction::reconcile(two_pending(), t.ctx.clone()).await;
    assert!(matches!(done, Err(eviction::Error::Nova(NovaError::NotLeader(_)))), "{done:?}");
    let log = entries(&t.log);
    assert!(log.contains(&"nova migrate vm-a".to_string()), "{log:?}");
    assert!(log.contains(&"nova migrate vm-b".to_string()), "{log:?}");
    let recorded = t.bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let of = |server: &str| {
        recorded.iter().any(|(what, _)| {
            what.starts_with("PATCH /apis/hypervisor.cloud.sap/v1alpha1/migrations/ev-")
                && what.contains(server)
        })
    };
    assert!(of("vm-b"), "vm-b's answer recorded: {log:?}");
    assert!(!of("vm-a"), "vm-a's attempt stays as recorded before asking: {log:?}");
}

/// An Eviction that passed its preflight and waits for its host to be
/// disabled.
fn disabling() -> Eviction {
    let mut ev = (*an_eviction(None)).clone();
    ev.status = Some(EvictionStatus {
        phase: Some(EvictionPhase::Disabling),
        host: Some("node-1".into()),
        started_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())),
        ..Default::default()
    });
    ev
}

#[tokio::test]
async fn the_reconcile_that_sees_the_host_disabled_starts_the_first_migrations() {
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    *t.service_enabled.lock().unwrap() = Some(false);
    let ev = disabling();
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(log.contains(&"nova migrate vm-a".to_string()), "in this very reconcile: {log:?}");
    // One write: the host disabled, recorded with the first step.
    let writes: Vec<Value> =
        status_writes(&t.bodies).into_iter().filter(|w| w["kind"] == "Eviction").collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0]["metadata"]["resourceVersion"], "5", "over the version read");
    assert_eq!(writes[0]["status"]["phase"], "Migrating");
    assert_eq!(writes[0]["status"]["vms"][0]["state"], "Migrating");
    let conditions = writes[0]["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c["type"] == "HostDisabled" && c["status"] == "True"),
        "{conditions:?}"
    );
    let log = entries(&t.log);
    let recorded = log.iter().position(|l| l.contains("/evictions/ev/status")).expect("recorded");
    let asked = log.iter().position(|l| l == "nova migrate vm-a").expect("asked");
    assert!(recorded < asked, "recorded before Nova was asked: {log:?}");
}

#[tokio::test]
async fn a_preflight_that_passes_on_a_host_disabled_already_goes_straight_to_the_first_migrations() {
    // The fake region has no other host: the checks that need one are
    // skipped, as an SRE's `force` does.
    let forced = || {
        let mut ev = (*an_eviction(None)).clone();
        ev.spec.options.force = vec!["constraints".into(), "capacity".into()];
        Arc::new(ev)
    };
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    *t.service_enabled.lock().unwrap() = Some(false);
    eviction::reconcile(forced(), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(log.contains(&"nova migrate vm-a".to_string()), "in this very reconcile: {log:?}");
    let writes: Vec<Value> =
        status_writes(&t.bodies).into_iter().filter(|w| w["kind"] == "Eviction").collect();
    let phases: Vec<&Value> = writes.iter().map(|w| &w["status"]["phase"]).collect();
    assert_eq!(phases, [&json!("Disabling"), &json!("Migrating")], "{writes:?}");
    // Each over the version the one before answered.
    assert_eq!(writes[0]["metadata"]["resourceVersion"], "5");
    assert_eq!(writes[1]["metadata"]["resourceVersion"], "6");

    // Still enabled: it waits (the lifecycle wakes it once it disabled the host).
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    let next = eviction::reconcile(forced(), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next, Requeue::requeue(Duration::from_secs(1)));
    assert!(!entries(&t.log).iter().any(|l| l.starts_with("nova migrate")), "{:?}", entries(&t.log));
}

#[tokio::test]
async fn a_host_whose_fencing_began_during_the_preflight_has_nothing_started_off_it() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // The Hypervisor as the API server answers it: not fenced when the
    // reconcile begins, its fencing under way once the preflight is done.
    static READS: AtomicUsize = AtomicUsize::new(0);
    let answer = |m: &Method, p: &str| {
        if m == Method::GET && p == "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1" {
            let mut hv = hv_json("node-1", "7");
            if READS.fetch_add(1, Ordering::SeqCst) > 0 {
                hv["status"] = json!({"fencing": {"started": "2026-11-26T08:00:00Z"}});
            }
            return (200, hv);
        }
        ev_or_migration(m, p)
    };
    let t = eviction_ctx(answer, vec![server("vm-a")], Ok(()), true);
    *t.service_enabled.lock().unwrap() = Some(false);
    let mut ev = (*an_eviction(None)).clone();
    ev.spec.options.force = vec!["constraints".into(), "capacity".into()];
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(READS.load(Ordering::SeqCst) >= 2, "read again after the preflight: {log:?}");
    assert!(!log.iter().any(|l| l.starts_with("nova migrate")), "nothing starts: {log:?}");
    let last = status_writes(&t.bodies).into_iter().rfind(|w| w["kind"] == "Eviction").expect("written");
    let conditions = last["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c["type"] == "HostFenced" && c["reason"] == "FencingUnderWay"),
        "{last}"
    );
}

#[tokio::test]
async fn a_preflight_run_again_after_a_spec_change_waits_for_the_host_from_its_own_start() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let t = eviction_ctx(ev_or_migration, vec![], Ok(()), true);
    let mut ev = (*an_eviction(None)).clone();
    ev.metadata.generation = Some(2);
    let long_ago = Timestamp::now() - jiff::SignedDuration::from_secs(3600);
    ev.status = Some(EvictionStatus {
        phase: Some(EvictionPhase::Failed),
        observed_generation: Some(1),
        started_at: Some(Time(long_ago)),
        completed_at: Some(Time(long_ago)),
        conditions: vec![Condition {
            type_: "Preflight".into(),
            status: "False".into(),
            reason: "Failed".into(),
            message: "1 VM(s) cannot be moved".into(),
            last_transition_time: Time(long_ago),
            observed_generation: Some(1),
        }],
        ..Default::default()
    });
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let written = status_writes(&t.bodies).into_iter().rfind(|w| w["kind"] == "Eviction").expect("run again");
    assert_eq!(written["status"]["phase"], "Pending", "{written}");
    assert!(written["status"]["startedAt"].is_null(), "the first run's start is not this one's: {written}");
}

#[tokio::test]
async fn a_migrating_step_says_it_applied_the_spec_it_read() {
    // The spec edited mid-eviction (generation 3, status at 2): the step
    // applies the spec it read, and says so.
    let (t, ev) = one_attempt_in_flight(crate::eviction::NovaState::Running { live_running: true });
    let mut ev = (*ev).clone();
    ev.metadata.generation = Some(3);
    if let Some(s) = ev.status.as_mut() {
        s.observed_generation = Some(2);
    }
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let written = status_writes(&t.bodies).into_iter().rfind(|w| w["kind"] == "Eviction").expect("the step");
    assert_eq!(written["status"]["observedGeneration"], 3, "{written}");
}

#[tokio::test]
async fn a_migration_request_whose_answer_was_lost_stays_in_flight_not_refused() {
    let lost = Err(NovaError::Unknown("POST servers/vm-a/action: connection reset".into()));
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], lost, true);
    let vm =
        VmStatus { id: "vm-a".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() };
    eviction::reconcile(an_eviction(migrating(vec![vm])), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let bodies = t.bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let migration = bodies
        .iter()
        .rfind(|(what, _)| what.starts_with("PATCH /apis/hypervisor.cloud.sap/v1alpha1/migrations/"))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no Migration status written"));
    assert_eq!(migration["status"]["phase"], "Pending", "{migration}");
    assert!(migration["status"]["message"].as_str().unwrap_or_default().contains("lost"), "{migration}");
    assert!(migration["status"]["novaStatus"].is_null(), "not recorded as refused: {migration}");
}

fn migration_status_written(bodies: &Arc<Mutex<Vec<(String, Value)>>>) -> Value {
    let bodies = bodies.lock().map(|b| b.clone()).unwrap_or_default();
    bodies
        .iter()
        .rfind(|(what, _)| what.starts_with("PATCH /apis/hypervisor.cloud.sap/v1alpha1/migrations/"))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no Migration status written"))
}

#[tokio::test]
async fn a_migration_request_that_never_reached_nova_is_recorded_not_sent() {
    let down = Err(NovaError::Unavailable("POST servers/vm-a/action: connection refused".into()));
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], down, true);
    let vm =
        VmStatus { id: "vm-a".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() };
    eviction::reconcile(an_eviction(migrating(vec![vm])), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let migration = migration_status_written(&t.bodies);
    assert_eq!(migration["status"]["phase"], "NotSent", "{migration}");
    assert_eq!(migration["metadata"]["resourceVersion"], "1", "written over the version created");
}

#[tokio::test]
async fn a_migration_left_by_an_earlier_eviction_of_the_same_name_is_not_taken_for_ours() {
    let t = eviction_ctx(
        |m, p| match (m.as_str(), p) {
            ("POST", "/apis/hypervisor.cloud.sap/v1alpha1/migrations") => (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists", "code": 409}),
            ),
            ("GET", p) if p.starts_with("/apis/hypervisor.cloud.sap/v1alpha1/migrations/") => (
                200,
                json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Migration",
                       "metadata": {"name": "ev-vm-a-1", "resourceVersion": "3",
                                    "ownerReferences": [{"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction",
                                                         "name": "ev", "uid": "an-older-ev-uid", "controller": true}]},
                       "spec": {"eviction": "ev", "serverId": "vm-a", "sourceHost": "node-1", "attempt": 1, "policy": "liveMigrate"}}),
            ),
            _ => ev_or_migration(m, p),
        },
        vec![server("vm-a")],
        Ok(()),
        true,
    );
    let vm =
        VmStatus { id: "vm-a".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() };
    let e = eviction::reconcile(an_eviction(migrating(vec![vm])), t.ctx.clone()).await.err();
    assert!(matches!(e, Some(eviction::Error::Leftover(_))), "{e:?}");
    assert!(!entries(&t.log).iter().any(|l| l.starts_with("nova migrate")), "{:?}", entries(&t.log));
}

#[tokio::test]
async fn a_running_eviction_edited_out_of_bounds_or_orphaned_is_followed_not_refused() {
    // Started on node-1, whose Hypervisor is gone now (not managed), with
    // maxParallel edited to 0 on a server that skipped validation.
    let t = eviction_ctx(
        |m, p| match (m.as_str(), p) {
            ("GET", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1") => not_found(),
            _ => ev_or_migration(m, p),
        },
        vec![server("vm-a")],
        Ok(()),
        false,
    );
    let vm =
        VmStatus { id: "vm-a".into(), state: VmState::Pending, memory_bytes: 1 << 30, ..Default::default() };
    let mut status = migrating(vec![vm]);
    if let Some(s) = status.as_mut() {
        s.host = Some("node-1".into());
    }
    let mut ev = (*an_eviction(status)).clone();
    ev.spec.options.max_parallel = 0;
    eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let writes = status_writes(&t.bodies);
    let last = writes.last().cloned().unwrap_or_default();
    assert_eq!(last["status"]["phase"], "Migrating", "not refused mid-flight: {last}");
    let target = last["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Target").cloned())
        .unwrap_or_default();
    assert_eq!((target["status"].as_str(), target["reason"].as_str()), (Some("False"), Some("InvalidSpec")));
    assert!(!entries(&t.log).iter().any(|l| l.starts_with("nova migrate")), "nothing new starts");
}

#[tokio::test]
async fn our_finalizer_is_added_and_the_status_written_over_the_version_it_left() {
    let t = hypervisor_ctx(
        |m, p| match (m.as_str(), p) {
            ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1") => {
                let mut v = hv_json("node-1", "9");
                v["metadata"]["finalizers"] = json!([crate::api::keys::HYPERVISOR_FINALIZER]);
                (200, v)
            }
            ("PATCH", _) => (200, hv_json("node-1", "10")),
            _ => (201, json!({})),
        },
        registered(true, &["vm-1"]),
        true,
        vec![],
    );
    let mut bare = (*hypervisor(Some(Phase::Active), None)).clone();
    bare.metadata.finalizers = None;
    hypervisor::reconcile(Arc::new(bare), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let bodies = t.bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let (_, patch) = bodies
        .iter()
        .find(|(w, _)| w == "PATCH /apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1")
        .cloned()
        .unwrap_or_else(|| panic!("no finalizer patch: {:?}", entries(&t.log)));
    assert_eq!(patch[1]["value"], json!([crate::api::keys::HYPERVISOR_FINALIZER]), "{patch}");
    // The first status write over the version the finalizer left (here
    // the Nova host's claim, the answer having no record of it), each next
    // one over the version the one before answered.
    let writes = status_writes(&t.bodies);
    let versions: Vec<&Value> = writes.iter().map(|w| &w["metadata"]["resourceVersion"]).collect();
    assert_eq!(versions, [&json!("9"), &json!("10")], "{writes:?}");
}

#[tokio::test]
async fn deleting_the_hypervisor_of_a_host_in_service_is_held_with_a_condition() {
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    let deleting = |phase| {
        let mut hv = (*hypervisor(Some(phase), None)).clone();
        hv.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        Arc::new(hv)
    };
    let t = hypervisor_ctx(answer, registered(true, &["vm-1"]), true, vec![]);
    hypervisor::reconcile(deleting(Phase::Active), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(
        !log.iter().any(|l| l == "k8s PATCH /apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1"),
        "{log:?}"
    );
    let writes = status_writes(&t.bodies);
    let deleting_condition = writes
        .last()
        .and_then(|w| w["status"]["conditions"].as_array().cloned())
        .and_then(|c| c.into_iter().find(|c| c["type"] == "Deleting"))
        .unwrap_or_else(|| panic!("no Deleting condition: {writes:?}"));
    assert_eq!(deleting_condition["status"], "False");
    assert!(deleting_condition["message"].as_str().unwrap_or_default().contains("1 instance(s)"));

    // Decommissioned: the finalizer goes, and nothing is asked of Nova.
    let t = hypervisor_ctx(answer, NovaObs::NotRegistered, true, vec![]);
    hypervisor::reconcile(deleting(Phase::Decommissioned), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let bodies = t.bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let released = bodies
        .iter()
        .find(|(w, _)| w == "PATCH /apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1")
        .map(|(_, p)| p.clone())
        .unwrap_or_else(|| panic!("finalizer kept: {:?}", entries(&t.log)));
    assert_eq!(released[1]["op"], "remove", "{released}");
    assert!(entries(&t.log).iter().all(|l| !l.starts_with("nova ") || l.starts_with("nova observe")));
}

#[tokio::test]
async fn a_passed_report_of_an_earlier_hypervisor_by_the_same_name_is_not_this_ones() {
    use hv_proto::v1::agent_message::Payload;
    use hv_proto::v1::{AgentMessage, Capability, CheckReport, CheckResult, Hello};
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    for (uid, next) in [("the-first-hypervisors-uid", "Testing"), ("hv-uid", "Ready")] {
        let t = hypervisor_ctx(answer, registered(false, &[]), true, vec![]);
        let (tx, _rx) = tokio::sync::mpsc::channel(8);
        let hello = Hello {
            node: "node-1".into(),
            boot_id: "boot".into(),
            capabilities: vec![Capability::Checks as i32, Capability::BridgeExpectations as i32],
            ..Default::default()
        };
        let session = t.ctx.registry.open(&hello, tx);
        let passed = CheckResult { name: "libvirt-reachable".into(), passed: true, ..Default::default() };
        let report = CheckReport { run: 1, results: vec![passed], hypervisor_uid: uid.into() };
        let msg = AgentMessage { seq: 1, sent_at: None, payload: Some(Payload::CheckReport(report)) };
        t.ctx.registry.receive("node-1", session.id, msg);
        let mut hv = (*hypervisor(Some(Phase::Testing), None)).clone();
        if let Some(st) = hv.status.as_mut() {
            st.lifecycle.test_run = 1;
            st.lifecycle.test_started =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
            st.phase_since = st.lifecycle.test_started.clone();
        }
        hypervisor::reconcile(Arc::new(hv), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
        let writes = status_writes(&t.bodies);
        let phase = writes.last().map(|w| w["status"]["phase"].clone()).unwrap_or_default();
        assert_eq!(phase, next, "report for {uid}: {writes:?}");
    }
}

#[tokio::test]
async fn a_host_nova_keeps_enabled_fails_the_eviction_at_the_disabling_deadline() {
    let disabling = |ago: i64| {
        migrating(vec![]).map(|mut s| {
            s.phase = Some(EvictionPhase::Disabling);
            s.started_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now() - jiff::SignedDuration::from_secs(ago),
            ));
            s
        })
    };
    // Within the 10 minutes allowed: wait, write nothing, move nothing.
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    let next =
        eviction::reconcile(an_eviction(disabling(30)), t.ctx.clone()).await.map_err(|e| e.to_string());
    assert_eq!(next, Ok(Requeue::requeue(Duration::from_secs(1))));
    assert!(status_writes(&t.bodies).is_empty());
    // Past them: Failed, saying why, and nothing was asked to move.
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a")], Ok(()), true);
    eviction::reconcile(an_eviction(disabling(601)), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let writes = status_writes(&t.bodies);
    let last = writes.last().cloned().unwrap_or_default();
    assert_eq!(last["status"]["phase"], "Failed", "{last}");
    let c = last["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "HostDisabled").cloned())
        .unwrap_or_default();
    assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("False"), Some("NotDisabled")), "{c}");
    assert!(!entries(&t.log).iter().any(|l| l.starts_with("nova migrate")));
}

/// Finding "the cluster migration limit is not atomic": the reconciles of
/// all Evictions draw from the leader's one limit (its grants are atomic:
/// `limit.rs`), so with a cluster limit of 2 three Evictions of two VMs each
/// (maxParallel 2) start two migrations in all, not six (nor three, were a
/// step to start one).
#[tokio::test]
async fn evictions_reconciled_together_start_no_more_than_the_cluster_limit() {
    let servers = vec![server("vm-a"), server("vm-b")];
    let t = eviction_ctx_limited(ev_or_migration, servers, Ok(()), true, 2);
    let pending = |id: &str| VmStatus {
        id: id.into(),
        state: VmState::Pending,
        memory_bytes: 1 << 30,
        ..Default::default()
    };
    let evictions: Vec<Arc<Eviction>> = ["ev-1", "ev-2", "ev-3"]
        .into_iter()
        .map(|name| {
            let mut e = (*an_eviction(migrating(vec![pending("vm-a"), pending("vm-b")]))).clone();
            e.metadata.name = Some(name.into());
            e.metadata.uid = Some(format!("{name}-uid"));
            Arc::new(e)
        })
        .collect();
    let runs = evictions.into_iter().map(|e| eviction::reconcile(e, t.ctx.clone()));
    for r in futures_util::future::join_all(runs).await {
        r.unwrap_or_else(|e| panic!("{e}"));
    }
    let asked = entries(&t.log).iter().filter(|l| l.starts_with("nova migrate")).count();
    assert_eq!(asked, 2, "{:?}", entries(&t.log));
    assert_eq!(t.ctx.limit.migrations.held(), 2);
}

/// The fleet view only confirms: a settled host it shows as its status
/// already says costs no read of its own and no write; one it shows
/// otherwise is read on its own, and what is written is that read's.
#[tokio::test]
async fn the_fleet_view_confirms_a_settled_host_and_leaves_any_change_to_its_own_reads() {
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    // Held in an SRE's Maintenance with a VM left (a phase whose health is
    // not judged; not evictable, so nothing is freed for drains).
    let NovaObs::Registered(host) = registered(false, &["vm-1"]) else { unreachable!() };
    let held = || {
        let mut h = (*hypervisor(Some(Phase::Maintenance), None)).clone();
        h.spec.maintenance = crate::api::MaintenanceMode::Manual;
        h
    };
    // The status an earlier reconcile wrote from the host's own reads.
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    hypervisor::reconcile(Arc::new(held()), t.ctx.clone()).await.unwrap();
    let written = status_writes(&t.bodies).pop().expect("a first status");
    assert_eq!(written["status"]["phase"], "Maintenance", "{written}");
    let mut settled = held();
    settled.status = Some(serde_json::from_value(written["status"].clone()).unwrap());
    let settled = Arc::new(settled);

    // The view shows it the same: nothing of its own is read, nothing written.
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    *t.fleet.lock().unwrap() = Some(host.clone());
    hypervisor::reconcile(settled.clone(), t.ctx.clone()).await.unwrap();
    let log = entries(&t.log);
    assert!(log.contains(&"nova fleet".to_string()), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("nova observe")), "{log:?}");
    assert!(status_writes(&t.bodies).is_empty(), "{log:?}");
    // A second reconcile within the bound reads no fleet again.
    hypervisor::reconcile(settled.clone(), t.ctx.clone()).await.unwrap();
    assert_eq!(entries(&t.log).iter().filter(|l| *l == "nova fleet").count(), 1);

    // The view shows a second server (the host's own reads know better:
    // another one): the host is read on its own, and its read is written.
    let mut landed = host.clone();
    landed.instances = vec!["vm-1".into(), "vm-2".into()];
    let t = hypervisor_ctx(answer, registered(false, &["vm-3"]), true, vec![]);
    *t.fleet.lock().unwrap() = Some(landed);
    hypervisor::reconcile(settled.clone(), t.ctx.clone()).await.unwrap();
    let log = entries(&t.log);
    assert!(log.contains(&"nova observe node-1".to_string()), "{log:?}");
    let writes = status_writes(&t.bodies);
    assert_eq!(
        writes.last().map(|w| w["status"]["instances"]["ids"].clone()),
        Some(json!(["vm-3"])),
        "{writes:?}"
    );

    // Emptied and held (its status from its own read of the empty host):
    // freeing it for drains (`status.evictable` turning true, which the
    // drain marks follow) rests on its own reads, whatever the view shows;
    // once its status says so, the view confirms.
    let NovaObs::Registered(empty) = registered(false, &[]) else { unreachable!() };
    let t = hypervisor_ctx(answer, NovaObs::Registered(empty.clone()), true, vec![]);
    hypervisor::reconcile(settled.clone(), t.ctx.clone()).await.unwrap();
    let written = status_writes(&t.bodies).pop().expect("the emptied status");
    assert_eq!(written["status"]["evictable"], json!(true), "{written}");
    let mut emptied = held();
    emptied.status = Some(serde_json::from_value(written["status"].clone()).unwrap());
    let emptied = Arc::new(emptied);
    assert_eq!(settled.status.as_ref().and_then(|s| s.evictable), Some(false), "a VM on it");
    // A leader that has not read the freed host itself (a new one, after a
    // failover) reads it before it counts it free; once it has, the view
    // confirms it.
    for before in [&settled, &emptied] {
        let t = hypervisor_ctx(answer, NovaObs::Registered(empty.clone()), true, vec![]);
        *t.fleet.lock().unwrap() = Some(empty.clone());
        hypervisor::reconcile(before.clone(), t.ctx.clone()).await.unwrap();
        let log = entries(&t.log);
        let evictable = before.status.as_ref().and_then(|s| s.evictable);
        assert!(log.contains(&"nova fleet".to_string()), "{log:?}");
        assert!(log.contains(&"nova observe node-1".to_string()), "evictable {evictable:?}: {log:?}");
        assert!(t.ctx.own_reads.free("node-1"), "evictable {evictable:?}: found free on its own read");
    }
    let t = hypervisor_ctx(answer, NovaObs::Registered(empty.clone()), true, vec![]);
    *t.fleet.lock().unwrap() = Some(empty.clone());
    t.ctx.own_reads.record("node-1", Some(true));
    hypervisor::reconcile(emptied.clone(), t.ctx.clone()).await.unwrap();
    let log = entries(&t.log);
    assert!(!log.contains(&"nova observe node-1".to_string()), "the view confirms: {log:?}");

    // A busy phase, or an Active host whose agent is away, never rests on
    // the view.
    for phase in [Phase::Ready, Phase::Active] {
        let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
        *t.fleet.lock().unwrap() = Some(host.clone());
        // Healthy as last judged: only the missing agent keeps it off the view.
        let mut hv = (*hypervisor(Some(phase), None)).clone();
        if let Some(st) = hv.status.as_mut() {
            st.health = Some(crate::api::hypervisor::HealthStatus::default());
        }
        hypervisor::reconcile(Arc::new(hv), t.ctx.clone()).await.unwrap();
        let log = entries(&t.log);
        assert!(
            !log.contains(&"nova fleet".to_string()) && log.contains(&"nova observe node-1".to_string()),
            "{phase:?}: {log:?}"
        );
    }
}

/// An Active host whose agent is away while a new leader settles (no host
/// judged yet) rests on the view; so does one whose agent just reconnected,
/// though its status changes (the agent's word rests on no read of Nova):
/// a failover costs Nova one read of the fleet, not one per host.
#[tokio::test]
async fn a_failover_reads_the_fleet_not_each_host() {
    use hv_proto::v1::{Capability, Hello};
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    let NovaObs::Registered(host) = registered(true, &["vm-1"]) else { unreachable!() };
    // The status an earlier leader wrote, agent connected, Healthy.
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let hello = Hello {
        node: "node-1".into(),
        boot_id: "boot".into(),
        capabilities: vec![Capability::Checks as i32, Capability::BridgeExpectations as i32],
        ..Default::default()
    };
    let _session = t.ctx.registry.open(&hello, tx.clone());
    let mut active = (*hypervisor(Some(Phase::Active), None)).clone();
    if let Some(st) = active.status.as_mut() {
        st.health = Some(crate::api::hypervisor::HealthStatus::default());
    }
    hypervisor::reconcile(Arc::new(active.clone()), t.ctx.clone()).await.unwrap();
    let written = status_writes(&t.bodies).pop().expect("a first status");
    active.status = Some(serde_json::from_value(written["status"].clone()).unwrap());
    assert_eq!(active.status.as_ref().and_then(|s| s.agent.as_ref()).map(|a| a.connected), Some(true));

    // A new leader, settling, the agent not back yet: the view, no own read.
    let mut t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    Arc::get_mut(&mut t.ctx).expect("the only handle").judging_from =
        Timestamp::now() + jiff::SignedDuration::from_secs(60);
    *t.fleet.lock().unwrap() = Some(host.clone());
    hypervisor::reconcile(Arc::new(active.clone()), t.ctx.clone()).await.unwrap();
    let log = entries(&t.log);
    assert!(log.contains(&"nova fleet".to_string()), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("nova observe")), "{log:?}");
    let after = status_writes(&t.bodies).pop().expect("the agent's absence written");
    assert_eq!(after["status"]["agent"]["connected"], json!(false), "{after}");
    assert_eq!(after["status"]["health"], written["status"]["health"], "no verdict while settling");
    let mut away = active.clone();
    away.status = Some(serde_json::from_value(after["status"].clone()).unwrap());

    // Settled, the agent back: its word is written, Nova is not read per host.
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    let _session = t.ctx.registry.open(&hello, tx);
    *t.fleet.lock().unwrap() = Some(host.clone());
    hypervisor::reconcile(Arc::new(away), t.ctx.clone()).await.unwrap();
    let log = entries(&t.log);
    assert!(log.contains(&"nova fleet".to_string()), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("nova observe")), "{log:?}");
    let back = status_writes(&t.bodies).pop().expect("the agent's return written");
    assert_eq!(back["status"]["agent"]["connected"], json!(true), "{back}");
}

/// The fleet view under concurrent reconciles: one read for all of them; a
/// host read on its own is not answered from a snapshot older than that
/// read; a read slower than the bound is taken by those who waited for it
/// and those who come within half the bound after it, not read again by
/// each in turn; a failing read is not tried again at
/// once.
#[tokio::test]
async fn the_fleet_is_read_once_for_all_and_never_older_than_a_hosts_own_read() {
    use crate::nova::FleetView;
    let answer = |_: &Method, _: &str| (201, json!({}));
    let NovaObs::Registered(host) = registered(true, &["vm-1"]) else { unreachable!() };
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    *t.fleet.lock().unwrap() = Some(host.clone());
    let nova = t.ctx.nova.clone();
    let reads = |t: &Hv| entries(&t.log).iter().filter(|l| *l == "nova fleet").count();
    let none = std::collections::BTreeSet::new();
    let ask = |view: Arc<FleetView>| {
        let nova = nova.clone();
        let none = none.clone();
        async move { view.host(nova.as_ref(), "node-1", &[], &none, Default::default).await }
    };

    let view = Arc::new(FleetView::new(Duration::from_millis(200), Duration::from_secs(60)));
    let figures = |view: &FleetView| view.figures().unwrap_or_else(|| panic!("the view is on"));
    assert_eq!((figures(&view).age, figures(&view).last_read), (None, None), "not read yet");
    let all = futures_util::future::join_all((0..10).map(|_| ask(view.clone()))).await;
    assert!(all.iter().all(|o| *o == Some(NovaObs::Registered(host.clone()))), "{all:?}");
    assert_eq!(reads(&t), 1, "one read for ten reconciles");
    assert!(figures(&view).age.is_some_and(|a| a < Duration::from_millis(200)), "{:?}", figures(&view));
    assert!(figures(&view).last_read.is_some());
    view.fresh(nova.as_ref(), "node-1", &[]).await;
    assert_eq!(ask(view.clone()).await, None, "read on its own after the snapshot began");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(figures(&view).age, None, "nobody asked within the bound: no age to alert on");
    assert_eq!(view.hosts_read_on_their_own(), 1);
    assert!(ask(view.clone()).await.is_some(), "a newer snapshot answers again");
    assert_eq!(reads(&t), 2);
    assert_eq!(view.hosts_read_on_their_own(), 0, "a read older than the snapshot is forgotten");

    // A read slower than the bound: those who waited take it.
    *t.fleet_delay.lock().unwrap() = Duration::from_millis(300);
    tokio::time::sleep(Duration::from_millis(250)).await;
    let all = futures_util::future::join_all((0..5).map(|_| ask(view.clone()))).await;
    assert!(all.iter().all(Option::is_some), "{all:?}");
    assert_eq!(reads(&t), 3, "one slow read, not five in turn");
    assert!(
        figures(&view).last_read.is_some_and(|r| r >= Duration::from_millis(300)),
        "{:?}",
        figures(&view)
    );
    // Nor by those who come after it: it stands for half the bound after
    // it ended, while one reads the next.
    let reader = tokio::spawn(ask(view.clone()));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = tokio::time::timeout(Duration::from_millis(50), ask(view.clone())).await;
    assert_eq!(after.ok().flatten(), Some(NovaObs::Registered(host.clone())), "took the slow read at once");
    assert!(reader.await.unwrap().is_some());
    assert_eq!(reads(&t), 4, "the next read, by one reconcile");

    // A failing read: the last snapshot still confirms (younger than ten
    // bounds), the fleet is not read again before the pause; once the last
    // snapshot is older than that, hosts go to their own reads.
    *t.fleet.lock().unwrap() = None;
    *t.fleet_delay.lock().unwrap() = Duration::ZERO;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(ask(view.clone()).await, Some(NovaObs::Registered(host.clone())), "the last read confirms");
    assert_eq!(ask(view.clone()).await, Some(NovaObs::Registered(host.clone())));
    assert_eq!(reads(&t), 5, "not read again within the pause");
    assert_eq!(figures(&view).failures, 1);
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(ask(view.clone()).await, None, "older than ten bounds: hosts read their own");

    // Off: no read at all.
    let before = reads(&t);
    let off = Arc::new(FleetView::new(Duration::ZERO, Duration::from_secs(60)));
    assert_eq!(off.figures(), None, "no figures for a view that is off");
    assert_eq!(ask(off).await, None);
    assert_eq!(reads(&t), before);
}

#[tokio::test]
async fn the_fleet_is_read_again_ahead_of_the_bound_while_the_others_take_the_current_read() {
    use crate::nova::FleetView;
    let answer = |_: &Method, _: &str| (201, json!({}));
    let NovaObs::Registered(host) = registered(true, &["vm-1"]) else { unreachable!() };
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    *t.fleet.lock().unwrap() = Some(host.clone());
    let nova = t.ctx.nova.clone();
    let reads = |t: &Hv| entries(&t.log).iter().filter(|l| *l == "nova fleet").count();
    let ask = |view: Arc<FleetView>| {
        let nova = nova.clone();
        async move { view.host(nova.as_ref(), "node-1", &[], &Default::default(), Default::default).await }
    };
    // A read takes 1 s: with a 6 s bound, the next is due at 4 s of age
    // (a snapshot dates from when its read began).
    *t.fleet_delay.lock().unwrap() = Duration::from_secs(1);
    let view = Arc::new(FleetView::new(Duration::from_secs(6), Duration::from_secs(60)));
    assert!(ask(view.clone()).await.is_some());
    assert_eq!(reads(&t), 1);
    assert!(ask(view.clone()).await.is_some());
    assert_eq!(reads(&t), 1, "young: not read again");

    tokio::time::sleep(Duration::from_millis(3300)).await;
    // Due, within the bound: the first to ask reads (slowly now), the
    // others take the current read without waiting for it.
    *t.fleet_delay.lock().unwrap() = Duration::from_secs(2);
    let reader = tokio::spawn(ask(view.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..5 {
        let other = tokio::time::timeout(Duration::from_millis(500), ask(view.clone())).await;
        assert_eq!(other.ok().flatten(), Some(NovaObs::Registered(host.clone())), "did not wait");
    }
    assert!(reader.await.unwrap().is_some());
    assert_eq!(reads(&t), 2, "one read ahead, by one reconcile");
    // That read took 2 s: twice that ahead would make it due at once; not
    // before half the bound (3 s), so at most two reads begin per bound.
    assert!(ask(view.clone()).await.is_some());
    assert_eq!(reads(&t), 2, "not read again before half the bound");
}

/// A host read on its own is not read on its own again at each look while
/// reads of the fleet run back to back: it waits for the read under way if
/// that began after its own read, else for the next; with no read under
/// way and a snapshot older than its own read, it reads its own.
#[tokio::test]
async fn a_host_read_on_its_own_waits_for_a_read_of_the_fleet_begun_after() {
    use crate::nova::FleetView;
    let answer = |_: &Method, _: &str| (201, json!({}));
    let NovaObs::Registered(host) = registered(true, &["vm-1"]) else { unreachable!() };
    let t = hypervisor_ctx(answer, NovaObs::Registered(host.clone()), true, vec![]);
    *t.fleet.lock().unwrap() = Some(host.clone());
    let nova = t.ctx.nova.clone();
    let reads = |t: &Hv| entries(&t.log).iter().filter(|l| *l == "nova fleet").count();
    let ask = |view: Arc<FleetView>, name: &'static str| {
        let nova = nova.clone();
        async move { view.host(nova.as_ref(), name, &[], &Default::default(), Default::default).await }
    };
    // Reads of 1 s within a 6 s bound: the next is due at 4 s of age.
    *t.fleet_delay.lock().unwrap() = Duration::from_secs(1);
    let view = Arc::new(FleetView::new(Duration::from_secs(6), Duration::from_secs(60)));
    assert!(ask(view.clone(), "node-1").await.is_some());
    view.fresh(nova.as_ref(), "node-1", &[]).await;
    assert_eq!(ask(view.clone(), "node-1").await, None, "no read under way: its own read");

    // A read begun after its own read: the host waits for it.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let reader = tokio::spawn(ask(view.clone(), "node-2"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(ask(view.clone(), "node-1").await, Some(NovaObs::Registered(host.clone())), "waited");
    assert_eq!(reader.await.unwrap(), Some(NovaObs::NotRegistered), "not in the fleet");
    assert_eq!(reads(&t), 2, "no read for the waiting host");

    // A read under way that began before its own read: it waits for that
    // one and the next, due at once after a read of half the bound.
    tokio::time::sleep(Duration::from_millis(3100)).await;
    *t.fleet_delay.lock().unwrap() = Duration::from_secs(3);
    let reader = tokio::spawn(ask(view.clone(), "node-2"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    view.fresh(nova.as_ref(), "node-1", &[]).await;
    assert_eq!(ask(view.clone(), "node-1").await, Some(NovaObs::Registered(host.clone())), "waited two");
    reader.await.unwrap();
    assert_eq!(reads(&t), 4, "the one under way and the next");
}

/// While its Eviction runs, a host reads its own host at each reconcile
/// (nothing kept between them), and its status names the running Eviction
/// without counts, which change with every VM moved and do not wake the
/// host (`triggers::eviction`); the end writes them.
#[tokio::test]
async fn an_evicted_host_reads_its_own_host_and_leaves_the_counts_to_the_eviction() {
    use hv_proto::v1::Hello;
    let answer = |m: &Method, _: &str| match m.as_str() {
        "PATCH" => (200, hv_json("node-1", "8")),
        _ => (201, json!({})),
    };
    let record = EvictionRef {
        name: "drain-1".into(),
        reason: EvictionReason::RollingUpdate,
        re_enable: false,
        for_maintenance: false,
    };
    let moved = |phase: EvictionPhase, migrated: u32| -> Vec<Eviction> {
        let mut v = hand_made(phase);
        v["status"]["migrated"] = json!(migrated);
        v["status"]["total"] = json!(12);
        v["spec"]["options"] = json!({"reEnable": false});
        vec![serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"))]
    };
    let hello = Hello { node: "node-1".into(), boot_id: "boot".into(), ..Default::default() };
    let (tx, _rx) = tokio::sync::mpsc::channel(8);
    let view = Arc::new(crate::nova::FleetView::new(Duration::from_secs(30), Duration::from_secs(10)));
    let observed = |t: &Hv| entries(&t.log).iter().filter(|l| l.starts_with("nova observe")).count();
    let step = |phase, migrated, nova| {
        let mut t = hypervisor_ctx(answer, nova, true, moved(phase, migrated));
        Arc::get_mut(&mut t.ctx).expect("the only handle").nova_view = view.clone();
        t
    };
    let evicted = |t: &Hv| {
        let w = status_writes(&t.bodies).pop().expect("a status written");
        let conditions = w["status"]["conditions"].as_array().cloned().unwrap_or_default();
        let c = conditions.iter().find(|c| c["type"] == "Evicted").cloned().expect("Evicted");
        c["message"].as_str().unwrap_or_default().to_string()
    };
    for migrated in [3, 4] {
        let t = step(EvictionPhase::Migrating, migrated, registered(false, &["vm-1"]));
        let _session = t.ctx.registry.open(&hello, tx.clone());
        let hv = hypervisor(Some(Phase::Evicting), Some(record.clone()));
        hypervisor::reconcile(hv, t.ctx.clone()).await.unwrap();
        assert_eq!(observed(&t), 1, "its own read at each step: {:?}", entries(&t.log));
        let message = evicted(&t);
        assert!(message.contains("Migrating") && !message.contains("/12"), "{message}");
    }
    let t = step(EvictionPhase::Succeeded, 12, registered(false, &[]));
    let _session = t.ctx.registry.open(&hello, tx.clone());
    hypervisor::reconcile(hypervisor(Some(Phase::Evicting), Some(record)), t.ctx.clone()).await.unwrap();
    assert_eq!(observed(&t), 1, "the end: {:?}", entries(&t.log));
    assert!(evicted(&t).contains("12/12 migrated"), "{}", evicted(&t));
}

/// A reconcile before the caches are whole waits in its turn for them
/// instead of asking again at once, sends nothing meanwhile, and returns
/// as soon as they are whole.
#[tokio::test]
async fn a_reconcile_waits_for_the_caches_instead_of_spinning() {
    let t = hypervisor_ctx(|_, _| (201, json!({})), NovaObs::NotRegistered, false, vec![]);
    let gate = t.ctx.gate.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        gate.mark_synced();
    });
    let start = tokio::time::Instant::now();
    let next = hypervisor::reconcile(hypervisor(None, None), t.ctx.clone()).await.map_err(|e| e.to_string());
    let waited = start.elapsed();
    assert_eq!(
        next,
        Ok(Requeue::requeue(Duration::from_millis(500))),
        "asked again once the caches are whole"
    );
    assert!(waited >= Duration::from_millis(300), "returned before the caches were whole: {waited:?}");
    assert!(waited < Duration::from_secs(4), "not woken when the caches were whole: {waited:?}");
    assert!(
        t.bodies.lock().map(|b| b.is_empty()).unwrap_or(false),
        "nothing sent before the caches are whole"
    );
}

/// A Hypervisor of the fencing's fleet: `phase`, `health`, and its
/// fencing record (`fenced`: counted fenced) with its condition's reason.
fn fleet_member(name: &str, phase: &str, health: &str, fencing: Option<(bool, &str)>) -> Hypervisor {
    let mut status = json!({"phase": phase, "health": {"state": health}});
    if let Some((fenced, reason)) = fencing {
        let mut record = json!({"started": "2026-11-27T10:00:00Z"});
        if fenced {
            record["fenced"] = json!("2026-11-27T10:00:30Z");
        }
        status["fencing"] = record;
        status["conditions"] = json!([{"type": "Fenced", "status": "False", "reason": reason, "message": "",
            "lastTransitionTime": "2026-11-27T10:00:00Z"}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor",
        "metadata": {"name": name}, "spec": {}, "status": status
    }))
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Only a fencing that can go on takes a place among the failure domains
/// (not one stuck, or held by a gate of its own), a fencing this process
/// claimed moments ago counts as under way, and a host fenced out of
/// service still counts lost and not connected.
#[tokio::test]
async fn a_stuck_or_held_fencing_takes_no_domain_place_and_a_fenced_host_still_counts_lost() {
    use super::fence_fleet::{self, FleetSeen};
    use crate::api::hypervisor::HealthState;
    let mut hv = hypervisor_ctx(ev_or_migration, registered(true, &[]), true, Vec::new());
    let ctx = Arc::get_mut(&mut hv.ctx).expect("not shared yet");
    let (nodes, mut node_writer) = reflector::store::<Node>();
    let (hypervisors, mut hv_writer) = reflector::store::<Hypervisor>();
    let racks =
        [("n1", "r1"), ("n2", "r1"), ("n3", "r2"), ("n4", "r3"), ("n5", "r5"), ("n6", "r4"), ("n7", "")];
    for (name, rack) in racks {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some([("example.com/rack".to_string(), rack.to_string())].into());
        node_writer.apply_watcher_event(&watcher::Event::Apply(node));
    }
    for h in [
        fleet_member("n1", "Active", "Failed", None),
        fleet_member("n2", "Active", "Healthy", None),
        fleet_member("n3", "Active", "Failed", Some((false, "StepNotConfirmed"))),
        fleet_member("n4", "Active", "Failed", Some((false, "FailureDomainLost"))),
        fleet_member("n5", "Maintenance", "Failed", Some((true, "Fenced"))),
        fleet_member("n6", "Active", "Failed", Some((false, "InProgress"))),
        fleet_member("n7", "Active", "Unreachable", None),
    ] {
        hv_writer.apply_watcher_event(&watcher::Event::Apply(h));
    }
    ctx.nodes = nodes;
    ctx.hypervisors = hypervisors;
    let fencing =
        crate::k8s::fence::FenceContext::new(Default::default(), None, Duration::from_secs(60), "ns".into());
    ctx.fencing = fencing.with_domain_label(Some("example.com/rack".into()));
    let ctx = &hv.ctx;
    let fleet = FleetSeen::read(ctx);
    let own = (Some(HealthState::Healthy), false);
    let d = fence_fleet::failure_domains(ctx, &fleet, "n2", own, &[]);
    assert_eq!(d.own, "r1");
    // n1 would start (r1); n6 goes on (r4). Not n3 (stuck), n4 (its zone
    // held), n5 (fenced), n7 (not Failed).
    assert_eq!(d.fencing, [("r1".to_string(), false), ("r4".to_string(), true)]);
    // Seven hosts count, n5 fenced out among them: lost n1, n3, n4, n5, n6, n7.
    assert_eq!(d.fleet, (6, 7));
    assert_eq!(fence_fleet::other_agents(ctx, &fleet, "n2"), (0, 6), "n5 counts, not connected");
    let (lost, hosts, _) = fence_fleet::zone_of(ctx, &fleet, "n2", Some(HealthState::Healthy));
    assert_eq!((lost, hosts), (6, 7));
    // n1 claimed by this process moments ago: under way before the cache shows it.
    let d = fence_fleet::failure_domains(ctx, &fleet, "n2", own, &["n1".to_string()]);
    assert_eq!(d.fencing, [("r1".to_string(), true), ("r4".to_string(), true)]);
    // The host itself: its own verdict and record, not the cache's; an
    // empty rack label is a domain of its own.
    let d = fence_fleet::failure_domains(ctx, &fleet, "n7", (Some(HealthState::Failed), false), &[]);
    assert_eq!(d.own, "n7");
    assert!(d.fencing.contains(&("n7".to_string(), false)), "{:?}", d.fencing);
}

#[test]
fn deleting_a_fenced_hosts_node_asks_its_retirement_beside_an_sres_word() {
    use kube::ResourceExt;
    let at = Timestamp::from_second(1_800_000_000).unwrap_or_default();
    let hv = hypervisor(None, None);
    let asked = super::fence::asked(&hv, Some(at));
    assert_eq!((asked.node_deleted, asked.retire), (Some(format!("its Node deleted at {at}")), None));
    assert_eq!(super::fence::asked(&hv, None).node_deleted, None, "a Node not being deleted asks nothing");
    let mut by_hand = (*hv).clone();
    by_hand.annotations_mut().insert(crate::api::keys::RETIRE_ANNOTATION.into(), "by hand".into());
    let asked = super::fence::asked(&by_hand, Some(at));
    assert_eq!(asked.retire.as_deref(), Some("by hand"), "hvctl retire's word, beside the Node's");
}

/// The Events a reconcile recorded: their reasons.
fn event_reasons(bodies: &Arc<Mutex<Vec<(String, Value)>>>) -> Vec<String> {
    let b = bodies.lock().map(|b| b.clone()).unwrap_or_default();
    b.into_iter()
        .filter(|(what, _)| what.starts_with("POST /apis/events.k8s.io/"))
        .filter_map(|(_, v)| v["reason"].as_str().map(str::to_string))
        .collect()
}

fn condition_of<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

fn paused(mut hv: Hypervisor, reason: Option<&str>) -> Arc<Hypervisor> {
    hv.metadata.annotations =
        reason.map(|r| [(crate::api::keys::PAUSED_ANNOTATION.to_string(), r.to_string())].into());
    Arc::new(hv)
}

/// A paused Active host with a disable of ours left behind: drift repair
/// would enable it. Nothing is asked of Nova but its reads; what would be
/// done is in the `Paused` condition and an Event. Resumed, it is repaired.
#[tokio::test]
async fn a_paused_host_is_judged_and_told_and_nothing_is_asked_of_nova_until_resumed() {
    let answer = |m: &Method, p: &str| match (m.as_str(), p) {
        ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1/status") => {
            (200, hv_json("node-1", "8"))
        }
        _ => (201, json!({})),
    };
    let t = hypervisor_ctx(answer, registered(false, &[]), true, vec![]);
    let host = (*hypervisor(Some(Phase::Active), None)).clone();
    hypervisor::reconcile(paused(host.clone(), Some("bios update -- jdoe")), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    let asked: Vec<&String> =
        log.iter().filter(|l| l.starts_with("nova ") && !l.starts_with("nova observe")).collect();
    assert!(asked.is_empty(), "only reads of Nova: {log:?}");
    assert!(
        log.iter()
            .all(|l| !l.starts_with("k8s PATCH /api/v1/") && !l.starts_with("k8s POST /apis/hypervisor")),
        "no Node, pod or Eviction written: {log:?}"
    );
    let writes = status_writes(&t.bodies);
    assert_eq!(writes.len(), 1, "{log:?}");
    let said = condition_of(&writes[0]["status"], "Paused").cloned().unwrap_or_default();
    assert_eq!((said["status"].as_str(), said["reason"].as_str()), (Some("True"), Some("PausedBySre")));
    let message = said["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("bios update -- jdoe") && message.contains("would enable compute service"),
        "{message}"
    );
    assert_eq!(writes[0]["status"]["phase"], "Active", "the phase is left as it was: {:?}", writes[0]);
    assert!(event_reasons(&t.bodies).contains(&"WouldEnable".to_string()), "{log:?}");

    // Told once: the same look again tells nothing new.
    let mut told = host.clone();
    let mut status = told.status.clone().unwrap_or_default();
    status.conditions = serde_json::from_value(writes[0]["status"]["conditions"].clone()).unwrap_or_default();
    told.status = Some(status);
    let t = hypervisor_ctx(answer, registered(false, &[]), true, vec![]);
    hypervisor::reconcile(paused(told.clone(), Some("bios update -- jdoe")), t.ctx.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!event_reasons(&t.bodies).contains(&"WouldEnable".to_string()), "{:?}", entries(&t.log));

    // Resumed: repaired, and the condition says the coordinator acts.
    let t = hypervisor_ctx(answer, registered(false, &[]), true, vec![]);
    hypervisor::reconcile(paused(told, None), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    assert!(log.contains(&"nova enable compute service".to_string()), "{log:?}");
    let writes = status_writes(&t.bodies);
    let said = writes.last().and_then(|w| condition_of(&w["status"], "Paused")).cloned().unwrap_or_default();
    assert_eq!(
        (said["status"].as_str(), said["reason"].as_str()),
        (Some("False"), Some("Acting")),
        "{writes:?}"
    );
}

/// An Eviction of a paused host asks nothing of Nova: no migration, and
/// no wait for its disable; it says what it would move, once.
#[tokio::test]
async fn an_eviction_of_a_paused_host_asks_nothing_of_nova_and_says_what_it_would_move() {
    let t = eviction_ctx(ev_or_migration, vec![server("vm-a"), server("vm-b")], Ok(()), true);
    let mut hv = (*hypervisor(Some(Phase::Evicting), None)).clone();
    hv.metadata.annotations =
        Some([(crate::api::keys::PAUSED_ANNOTATION.to_string(), "disk swap".to_string())].into());
    t.hv_writer.lock().unwrap().apply_watcher_event(&watcher::Event::Apply(hv));
    *t.service_enabled.lock().unwrap() = Some(false);
    let ev = disabling();
    let next = eviction::reconcile(Arc::new(ev), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(next, Requeue::requeue(Duration::from_secs(5)));
    let log = entries(&t.log);
    let asked: Vec<&String> =
        log.iter().filter(|l| l.starts_with("nova ") && *l != "nova servers on node-1").collect();
    assert!(asked.is_empty(), "only a read of Nova: {log:?}");
    let writes: Vec<Value> =
        status_writes(&t.bodies).into_iter().filter(|w| w["kind"] == "Eviction").collect();
    assert_eq!(writes.len(), 1, "{log:?}");
    assert_eq!(writes[0]["status"]["phase"], "Disabling", "left where it was");
    let said = condition_of(&writes[0]["status"], "HostPaused").cloned().unwrap_or_default();
    assert_eq!(said["status"], "True");
    assert!(said["message"].as_str().unwrap_or_default().contains("would migrate the 2 server(s)"), "{said}");
    assert_eq!(event_reasons(&t.bodies), ["WouldMigrate"]);
}

/// Two Hypervisors naming one Nova host: the first records the host in its
/// status before anything is asked of Nova; the second asks Nova nothing
/// but reads, and says which Hypervisor holds the host.
#[tokio::test]
async fn the_first_hypervisor_naming_a_nova_host_claims_it_before_nova_is_asked_and_a_second_changes_nothing()
{
    let answer = |m: &Method, p: &str| match (m.as_str(), p) {
        ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1/status") => {
            (200, hv_json("node-1", "8"))
        }
        ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/twin/status") => {
            (200, hv_json("twin", "8"))
        }
        _ => (201, json!({})),
    };
    // Enabled and empty: onboarding disables it, a write to Nova.
    let t = hypervisor_ctx(answer, registered(true, &[]), true, vec![]);
    let onboarding = |name: &str| {
        let mut h = (*hypervisor(Some(Phase::Onboarding), None)).clone();
        h.metadata.name = Some(name.into());
        h.spec.nova_host = "node-1".into();
        if let Some(s) = h.status.as_mut() {
            s.service_id = None;
        }
        Arc::new(h)
    };
    hypervisor::reconcile(onboarding("node-1"), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    let claimed =
        log.iter().position(|l| l.ends_with("/hypervisors/node-1/status")).expect("the claim written");
    let asked = log.iter().position(|l| l.starts_with("nova disable")).expect("onboarding disables");
    assert!(claimed < asked, "recorded before Nova was asked: {log:?}");
    let writes = status_writes(&t.bodies);
    assert_eq!(writes[0]["status"]["lifecycle"]["novaHost"], "node-1", "{writes:?}");

    let before = entries(&t.log).len();
    hypervisor::reconcile(onboarding("twin"), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log: Vec<String> = entries(&t.log).into_iter().skip(before).collect();
    let asked: Vec<&String> =
        log.iter().filter(|l| l.starts_with("nova ") && !l.starts_with("nova observe")).collect();
    assert!(asked.is_empty(), "the twin asks Nova nothing: {log:?}");
    let writes = status_writes(&t.bodies);
    let twin = writes.last().cloned().unwrap_or_default();
    assert_eq!(twin["status"]["lifecycle"]["novaHost"], Value::Null, "{twin}");
    let said = condition_of(&twin["status"], "Onboarded").cloned().unwrap_or_default();
    assert_eq!(said["reason"], "NovaHostClaimed", "{twin}");
    assert!(said["message"].as_str().unwrap_or_default().contains("held by Hypervisor node-1"), "{said}");
    assert!(event_reasons(&t.bodies).contains(&"NovaHostClaimed".to_string()));
}

/// A trait the host's capabilities give is recorded as ours before it is
/// sent to Placement: one sent and never recorded would be taken for an
/// operator's, and stay when the capability goes.
#[tokio::test]
async fn a_trait_from_the_hosts_capabilities_is_recorded_before_placement_is_asked() {
    let answer = |m: &Method, p: &str| match (m.as_str(), p) {
        ("PATCH", "/apis/hypervisor.cloud.sap/v1alpha1/hypervisors/node-1/status") => {
            (200, hv_json("node-1", "8"))
        }
        _ => (201, json!({})),
    };
    let t = hypervisor_ctx(answer, registered(true, &[]), true, vec![]);
    let mut hv = (*hypervisor(Some(Phase::Active), None)).clone();
    let capabilities = crate::api::hypervisor::HostCapabilities {
        arch: "x86_64".into(),
        sriov_nics: Some(2),
        traits: Some(vec!["HW_NIC_SRIOV".into()]),
        ..Default::default()
    };
    if let Some(s) = hv.status.as_mut() {
        s.machine = Some(crate::api::hypervisor::MachineStatus {
            capabilities: Some(capabilities),
            ..Default::default()
        });
    }
    hypervisor::reconcile(Arc::new(hv), t.ctx.clone()).await.unwrap_or_else(|e| panic!("{e}"));
    let log = entries(&t.log);
    let asked =
        log.iter().position(|l| l.starts_with("nova add traits HW_NIC_SRIOV")).expect("the trait added");
    let before = log[..asked].iter().filter(|l| l.ends_with("/hypervisors/node-1/status")).count();
    let writes = status_writes(&t.bodies);
    let ours = |w: &Value| w["status"]["lifecycle"]["appliedTraits"] == json!(["HW_NIC_SRIOV"]);
    assert!(writes[..before].iter().any(ours), "recorded before Placement was asked: {log:?} {writes:?}");
}
