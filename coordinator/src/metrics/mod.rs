//! `/metrics` (OpenMetrics text, by `prometheus-client`), `/healthz` and
//! `/readyz` of the coordinator.
//!
//! Each concern owns its families (evictions, reconciles, OpenStack
//! requests, Kubernetes writes, agent sessions, the fleet, the eviction
//! webhook, the certificates) and hands a narrow handle to the code it
//! measures. Beside them, the build and the process (`hv_listen::metrics`).
//! Counters start at zero in every process (Prometheus' `rate()` copes);
//! the durable record is the custom resources' status.

mod agent_certificates;
mod certificates;
mod eviction;
mod hosts;
mod kube_writes;
mod openstack;
mod reconciles;
mod sessions;
mod view;
mod webhook;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use hv_listen::{Bytes, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use agent_certificates::AgentCertificates;
pub use eviction::{DURATION_BUCKETS, Evictions, Tally, tally};
pub use hosts::{HaFigures, Host, Hosts, ha_figures, hosts};
pub use kube_writes::KubeWrites;
pub use openstack::{OpenStackCalls, operation};
pub use reconciles::Reconciles;
pub use sessions::AgentSessions;
pub use webhook::{Outcome as WebhookOutcome, WebhookCalls};

use crate::api::EvictionPhase;
use crate::api::hypervisor::HealthState;

type HostsSource = Box<dyn Fn() -> Hosts + Send + Sync>;
type EvictionsSource = Box<dyn Fn() -> Vec<EvictionPhase> + Send + Sync>;
type ViewSource = Box<dyn Fn() -> Option<crate::nova::view::ViewFigures> + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    to: &'static str,
}

/// The gRPC listener's TLS counters, in their own registry: shown only
/// when the listener serves TLS.
struct Tls {
    registry: Registry,
    stats: Arc<hv_tls::server::Stats>,
    failed: Counter,
    connections: Gauge,
}

pub struct Metrics {
    registry: Registry,
    leader: AtomicBool,
    leader_gauge: Gauge,
    leader_transitions: Family<RoleLabel, Counter>,
    evictions: Evictions,
    pub reconciles: Reconciles,
    pub openstack: OpenStackCalls,
    pub kube_writes: KubeWrites,
    pub sessions: AgentSessions,
    pub agent_certificates: AgentCertificates,
    pub webhook: WebhookCalls,
    host_gauges: hosts::HostGauges,
    tls: OnceLock<Tls>,
    /// The fleet view of Nova in numbers, shown while this replica leads.
    nova_view: OnceLock<ViewSource>,
    /// The fleet as this replica sees it (the Hypervisor cache and the
    /// agent sessions), shown only while it leads.
    hosts: OnceLock<HostsSource>,
    /// The Evictions' phases (the Eviction cache), shown only while it leads.
    eviction_phases: OnceLock<EvictionsSource>,
    /// When the first of the connected agents' certificates ends (the
    /// session registry), shown only while it leads.
    oldest_agent_certificate: OnceLock<Box<dyn Fn() -> Option<std::time::SystemTime> + Send + Sync>>,
    /// The certificates its listeners present, shown while they serve TLS.
    certificates: std::sync::Mutex<Vec<certificates::Source>>,
    /// This replica's pod label, when it labels its pod (`k8s::leader_pod`).
    pod_label: OnceLock<Arc<crate::k8s::leader_pod::LabelState>>,
    /// One scrape at a time: the fleet's gauges are refilled for each.
    scraping: std::sync::Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let leader_gauge = Gauge::default();
        registry.register("hv_coordinator_leader", "Whether this replica leads.", leader_gauge.clone());
        let leader_transitions = Family::<RoleLabel, Counter>::default();
        registry.register(
            "hv_coordinator_leader_transitions",
            "Times this replica became the leader or stopped leading.",
            leader_transitions.clone(),
        );
        for to in ["leader", "follower"] {
            let _ = leader_transitions.get_or_create(&RoleLabel { to });
        }
        hv_listen::metrics::build_info(&mut registry, "hv-coordinator", env!("CARGO_PKG_VERSION"));
        Metrics {
            evictions: Evictions::register(&mut registry),
            reconciles: Reconciles::register(&mut registry),
            openstack: OpenStackCalls::register(&mut registry),
            kube_writes: KubeWrites::register(&mut registry),
            sessions: AgentSessions::register_into(&mut registry),
            agent_certificates: AgentCertificates::register(&mut registry),
            webhook: WebhookCalls::register(&mut registry),
            host_gauges: hosts::HostGauges::register(&mut registry),
            registry,
            leader: AtomicBool::new(false),
            leader_gauge,
            leader_transitions,
            tls: OnceLock::new(),
            nova_view: OnceLock::new(),
            hosts: OnceLock::new(),
            eviction_phases: OnceLock::new(),
            oldest_agent_certificate: OnceLock::new(),
            certificates: std::sync::Mutex::new(Vec::new()),
            pod_label: OnceLock::new(),
            scraping: std::sync::Mutex::new(()),
        }
    }
}

impl Metrics {
    pub fn set_tls(&self, stats: Arc<hv_tls::server::Stats>) {
        let mut registry = Registry::default();
        let (failed, connections) = (Counter::default(), Gauge::default());
        registry.register(
            "hv_coordinator_grpc_tls_handshakes_failed",
            "gRPC TLS handshakes refused (no, expired or foreign client certificate) or timed out.",
            failed.clone(),
        );
        registry.register("hv_coordinator_grpc_connections", "gRPC connections open.", connections.clone());
        let _ = self.tls.set(Tls { registry, stats, failed, connections });
    }

    pub fn set_nova_view(
        &self,
        source: impl Fn() -> Option<crate::nova::view::ViewFigures> + Send + Sync + 'static,
    ) {
        let _ = self.nova_view.set(Box::new(source));
    }

    pub fn set_hosts(&self, source: impl Fn() -> Hosts + Send + Sync + 'static) {
        let _ = self.hosts.set(Box::new(source));
    }

    /// The Evictions' phases, read from `evictions` (the cache) at each
    /// scrape while this replica leads.
    pub fn set_evictions(&self, evictions: kube::runtime::reflector::Store<crate::api::Eviction>) {
        let _ = self.eviction_phases.set(Box::new(move || {
            evictions
                .state()
                .iter()
                .map(|e| e.status.as_ref().and_then(|s| s.phase).unwrap_or_default())
                .collect()
        }));
    }

    /// The end of the first connected agent's certificate, read from
    /// `source` at each scrape while this replica leads.
    pub fn set_oldest_agent_certificate(
        &self,
        source: impl Fn() -> Option<std::time::SystemTime> + Send + Sync + 'static,
    ) {
        let _ = self.oldest_agent_certificate.set(Box::new(source));
    }

    /// A certificate a listener presents (`used`: `grpc`, `webhook`), its
    /// end read at each scrape.
    pub fn set_certificate(
        &self,
        used: &'static str,
        not_after: impl Fn() -> Option<std::time::SystemTime> + Send + Sync + 'static,
    ) {
        crate::locked::lock(&self.certificates).push((used, Box::new(not_after)));
    }

    /// `--ha-maintenance-limit`.
    pub fn set_ha_maintenance_limit(&self, limit: usize) {
        self.host_gauges.set_ha_limit(limit);
    }

    /// This replica leads (or no longer does) from now on.
    pub fn set_leader(&self, leads: bool) {
        if self.leader.swap(leads, Ordering::Relaxed) != leads {
            self.leader_transitions
                .get_or_create(&RoleLabel { to: if leads { "leader" } else { "follower" } })
                .inc();
        }
        self.leader_gauge.set(i64::from(leads));
    }

    pub fn is_leader(&self) -> bool {
        self.leader.load(Ordering::Relaxed)
    }

    pub fn add(&self, t: &Tally) {
        self.evictions.add(t);
    }

    /// Nova took an ask to force a stuck live migration to complete.
    pub fn forced(&self) {
        self.evictions.forced();
    }

    /// A host's health changed to `to`.
    /// A fenced host was found showing life (docs/fencing.md).
    /// Something was decided on a host whose hands are off, and not done
    /// (`reason`: `WouldDisable`, `WouldFence`, …).
    pub fn would(&self, reason: &'static str) {
        self.host_gauges.would(reason);
    }

    pub fn fenced_host_showed_life(&self) {
        self.host_gauges.showed_life();
    }

    pub fn health_changed(&self, to: HealthState) {
        self.host_gauges.health_changed(to);
    }

    /// Readiness follows this replica's pod label from now on.
    pub fn set_pod_label(&self, state: Arc<crate::k8s::leader_pod::LabelState>) {
        let _ = self.pod_label.set(state);
    }

    /// The exposition: the values read at scrape time (the fleet, the TLS
    /// counters) first, then every family.
    pub fn render(&self) -> String {
        let _one = crate::locked::lock(&self.scraping);
        let hosts = self.hosts.get().filter(|_| self.is_leader()).map(|source| source());
        self.host_gauges.show(hosts);
        self.evictions.show(self.eviction_phases.get().filter(|_| self.is_leader()).map(|source| source()));
        let certificates = {
            let sources = crate::locked::lock(&self.certificates);
            (!sources.is_empty()).then(|| certificates::registry(&sources))
        };
        let mut s = String::new();
        let mut encode = || -> Result<(), std::fmt::Error> {
            prometheus_client::encoding::text::encode_registry(&mut s, &self.registry)?;
            prometheus_client::encoding::text::encode_registry(&mut s, &hv_listen::metrics::process())?;
            if let Some(certificates) = &certificates {
                prometheus_client::encoding::text::encode_registry(&mut s, certificates)?;
            }
            if let Some(source) = self.oldest_agent_certificate.get().filter(|_| self.is_leader()) {
                prometheus_client::encoding::text::encode_registry(
                    &mut s,
                    &agent_certificates::oldest(source()),
                )?;
            }
            if let Some(tls) = self.tls.get() {
                tls.failed
                    .inner()
                    .store(tls.stats.handshakes_failed.load(Ordering::Relaxed), Ordering::Relaxed);
                tls.connections
                    .set(i64::try_from(tls.stats.connections.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
                prometheus_client::encoding::text::encode_registry(&mut s, &tls.registry)?;
            }
            if let Some(figures) =
                self.nova_view.get().filter(|_| self.is_leader()).and_then(|source| source())
            {
                prometheus_client::encoding::text::encode_registry(&mut s, &view::registry(&figures))?;
            }
            prometheus_client::encoding::text::encode_eof(&mut s)
        };
        // Writing into a String cannot fail.
        let _ = encode();
        s
    }

    fn route(&self, req: &Request<Incoming>) -> Response<Full<Bytes>> {
        match req.uri().path() {
            "/metrics" => hv_listen::openmetrics(self.render()),
            path => {
                let (code, body) = self.answer(path);
                hv_listen::text(code, body)
            }
        }
    }

    /// `/healthz` is liveness: the process answers, whatever its peers do,
    /// and no lock of it was poisoned (`crate::locked`).
    /// `/readyz` is readiness (`k8s::leader_pod::readiness`): a replica whose
    /// pod label agrees with its role, or without pod labels only the
    /// leader (the kubelet's probes speak no TLS, so they cannot use the
    /// gRPC health service).
    fn answer(&self, path: &str) -> (StatusCode, String) {
        match path {
            "/healthz" if crate::locked::poisoned() => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "a lock was poisoned by a panic: restart the process\n".into(),
            ),
            "/healthz" => (StatusCode::OK, "ok\n".into()),
            "/readyz" => {
                let label = self.pod_label.get().map(|s| s.get());
                match crate::k8s::leader_pod::readiness(self.is_leader(), label) {
                    (true, why) => (StatusCode::OK, format!("{why}\n")),
                    (false, why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
                }
            }
            _ => (StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the process ends; answers the bound address.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    hv_listen::serve(addr, hv_listen::Limits::default(), move |req| {
        let m = metrics.clone();
        async move { m.route(&req) }
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::Phase;

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }

    #[test]
    fn each_host_out_of_service_is_one_series_gone_once_it_is_back() {
        let host = |name: &str, phase, reason: Option<&'static str>| Host {
            phase,
            agent_connected: true,
            out_of_service: reason.map(|r| (name.to_string(), r)),
            ..Host::default()
        };
        let m = Metrics::default();
        m.set_leader(true);
        let back = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let b = back.clone();
        m.set_hosts(move || {
            let back = b.load(std::sync::atomic::Ordering::Relaxed);
            hosts([
                host("n1", Phase::Active, None),
                host("n2", Phase::Evicting, (!back).then_some("Evicting")),
                host("n3", Phase::Decommissioned, Some("Decommissioned")),
            ])
        });
        let text = m.render();
        has(&text, "hv_hypervisor_out_of_service{node=\"n2\",phase=\"Evicting\",reason=\"Evicting\"} 1");
        assert!(!text.contains("node=\"n1\"") && !text.contains("node=\"n3\""), "{text}");
        back.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(!m.render().contains("node=\"n2\""), "a host back in service leaves no series");
    }

    #[test]
    fn the_fleet_is_counted_by_phase_and_missing_agents_only_where_one_belongs() {
        let host =
            |phase, agent_connected, health| Host { phase, agent_connected, health, ..Host::default() };
        let f = hosts([
            host(Phase::Active, true, Some(HealthState::Healthy)),
            host(Phase::Active, false, Some(HealthState::Unreachable)),
            Host { fenced_showing_life: true, ..host(Phase::Maintenance, false, Some(HealthState::Failed)) },
            host(Phase::Onboarding, false, None),
            host(Phase::Aborted, true, Some(HealthState::Healthy)),
            host(Phase::Evicting, false, Some(HealthState::Unreachable)),
            Host { disabled_elsewhere: true, ..host(Phase::Active, true, None) },
            Host { update_drain_left: Some(5400.0), ..host(Phase::Evicting, true, None) },
            Host {
                update_drain_left: Some(0.0),
                update_drain_forced: true,
                ..host(Phase::Evicting, true, None)
            },
        ]);
        assert_eq!((f.update_drain_left, f.update_drains_forced), (Some(0.0), 1), "the least time left");
        assert_eq!(f.health.get(&HealthState::Unreachable), Some(&2));
        assert_eq!(f.health.values().sum::<u64>(), 5, "a host never judged is not counted");
        assert_eq!(f.phases.get(&Phase::Active), Some(&3));
        assert_eq!(
            f.without_agent, 2,
            "Active and Evicting without an agent; Maintenance and Onboarding may be"
        );
        let m = Metrics::default();
        let snapshot = f.clone();
        m.set_hosts(move || snapshot.clone());
        assert!(!m.render().contains("hv_hypervisors{"), "a follower does not speak for the fleet");
        m.set_leader(true);
        let text = m.render();
        has(&text, "hv_hypervisors{phase=\"Active\"} 3");
        has(&text, "hv_hypervisors_disabled_elsewhere 1");
        has(&text, "hv_hypervisors{phase=\"Decommissioned\"} 0");
        has(&text, "hv_hypervisors_without_agent 2");
        has(&text, "hv_fenced_hosts_showing_life 1");
        has(&text, "hv_update_drain_seconds_left 0.0");
        assert!(!text.contains("hv_hypervisor_out_of_service{"), "every host here is in service: {text}");
        has(&text, "hv_update_drains_forced 1");
        has(&text, "hv_fenced_host_revivals_total 0");
        m.fenced_host_showed_life();
        has(&m.render(), "hv_fenced_host_revivals_total 1");
        has(&text, "hv_hypervisors_by_health{state=\"Unreachable\"} 2");
        has(&text, "hv_hypervisors_by_health{state=\"Degraded\"} 0");
        m.health_changed(HealthState::Failed);
        m.health_changed(HealthState::Failed);
        has(&m.render(), "hv_health_transitions_total{to=\"Failed\"} 2");
        m.set_leader(false);
        assert!(!m.render().contains("hv_hypervisors{"), "a deposed leader stops speaking for the fleet");
    }

    /// A follower reads no fleet view: figures it showed would be its own
    /// stale ones, or none, beside the leader's.
    #[test]
    fn only_the_leader_shows_the_fleet_view() {
        let m = Metrics::default();
        m.set_nova_view(|| {
            Some(crate::nova::view::ViewFigures {
                bound: Duration::from_secs(30),
                age: Some(Duration::from_secs(4)),
                last_read: Some(Duration::from_secs(1)),
                failures: 0,
            })
        });
        let shown = |m: &Metrics| m.render().contains("hv_coordinator_nova_view_bound_seconds");
        assert!(!shown(&m), "a follower");
        m.set_leader(true);
        assert!(shown(&m), "the leader");
        m.set_leader(false);
        assert!(!shown(&m), "a deposed leader");
    }

    #[test]
    fn only_the_leader_is_ready_and_every_replica_is_alive() {
        let m = Metrics::default();
        assert_eq!(m.answer("/healthz").0, StatusCode::OK);
        assert_eq!(m.answer("/readyz"), (StatusCode::SERVICE_UNAVAILABLE, "follower\n".into()));
        m.set_leader(true);
        assert_eq!(m.answer("/readyz"), (StatusCode::OK, "leader\n".into()));
        assert_eq!(m.answer("/healthz").0, StatusCode::OK);
        assert_eq!(m.answer("/nope").0, StatusCode::NOT_FOUND);
    }

    /// Every `hv_` sample name the chart's alerts and dashboard query is
    /// one the coordinator exposes (a renamed family would leave an alert
    /// that never fires and a panel that stays empty).
    #[test]
    fn every_metric_the_chart_queries_is_exposed() {
        let m = Metrics::default();
        m.set_tls(Arc::new(hv_tls::server::Stats::default()));
        let active = Host {
            phase: Phase::Active,
            agent_connected: true,
            health: Some(HealthState::Healthy),
            ha: HaFigures { fenced: Some("StepNotConfirmed"), ..HaFigures::default() },
            out_of_service: Some(("node-1".into(), "Fencing")),
            ..Host::default()
        };
        m.set_hosts(move || hosts([active.clone()]));
        m.set_evictions(kube::runtime::reflector::store::<crate::api::Eviction>().0);
        m.set_certificate("grpc", || Some(std::time::SystemTime::now()));
        m.set_oldest_agent_certificate(|| Some(std::time::SystemTime::now()));
        m.set_nova_view(|| {
            Some(crate::nova::view::ViewFigures {
                bound: Duration::from_secs(30),
                age: Some(Duration::from_secs(12)),
                last_read: Some(Duration::from_secs(2)),
                failures: 0,
            })
        });
        m.set_leader(true);
        m.add(&Tally { durations: vec![1.0], ..Tally::default() });
        m.reconciles.record("hypervisor", Duration::from_millis(1), Err("kubernetes_conflict"));
        m.openstack.record("compute", "GET os-services".into(), "200".into(), Duration::from_millis(1));
        m.sessions.message("heartbeat");
        m.webhook.record(WebhookOutcome::Allowed, Duration::from_millis(2));
        let text = m.render();
        let exposed: std::collections::BTreeSet<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/hv");
        let mut queried = std::collections::BTreeSet::new();
        for file in ["templates/monitoring.yaml", "dashboards/hv-fleet.json"] {
            let body = std::fs::read_to_string(root.join(file)).unwrap_or_default();
            assert!(!body.is_empty(), "{file} read");
            let mut rest = body.as_str();
            while let Some(at) = rest.find("hv_") {
                let name: String =
                    rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let before = rest[..at].chars().last();
                // A metric name, not part of another word (`"hv_" + x`);
                // the agent's are the agent's to show (its own test).
                let word = before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !word && !name.starts_with("hv_agent_") {
                    queried.insert(name.clone());
                }
                rest = &rest[at + name.len().max(3)..];
            }
        }
        assert!(queried.len() > 15, "the chart queries the families: {queried:?}");
        let missing: Vec<_> = queried.iter().filter(|q| !exposed.contains(q.as_str())).collect();
        assert!(missing.is_empty(), "queried but not exposed: {missing:?}\nexposed: {exposed:?}");
    }

    #[test]
    fn leadership_changes_are_counted_once_each() {
        let m = Metrics::default();
        has(&m.render(), "hv_coordinator_leader 0");
        m.set_leader(true);
        m.set_leader(true);
        m.set_leader(false);
        let text = m.render();
        has(&text, "hv_coordinator_leader_transitions_total{to=\"leader\"} 1");
        has(&text, "hv_coordinator_leader_transitions_total{to=\"follower\"} 1");
        has(&text, "hv_coordinator_leader 0");
    }

    #[test]
    fn the_exposition_has_every_family_with_cumulative_buckets_and_ends_with_eof() {
        let m = Metrics::default();
        m.add(&Tally { started: 3, succeeded: 2, durations: vec![4.0, 45.5], ..Tally::default() });
        m.add(&Tally { durations: vec![7200.0], ..Tally::default() });
        m.reconciles.record("hypervisor", Duration::from_millis(3), Ok(()));
        m.reconciles.record("hypervisor", Duration::from_millis(40), Err("kubernetes_conflict"));
        m.openstack.record(
            "compute",
            operation("GET", "os-services"),
            "200".into(),
            Duration::from_millis(20),
        );
        m.sessions.opened(false);
        m.sessions.opened(true);
        m.sessions.message("heartbeat");
        m.sessions.dropped(4);
        let s = m.render();
        for line in [
            "hv_eviction_migrations_started_total 3",
            "hv_eviction_migrations_succeeded_total 2",
            "hv_eviction_migrations_aborted_total 0",
            "hv_eviction_migration_outcomes_total{outcome=\"succeeded\"} 2",
            "hv_eviction_migration_outcomes_total{outcome=\"retried\"} 0",
            "hv_eviction_migration_outcomes_total{outcome=\"aborted\"} 0",
            "hv_eviction_migration_outcomes_total{outcome=\"non_migratable\"} 0",
            "hv_webhook_requests_total{outcome=\"allowed\"} 0",
            "hv_eviction_migration_duration_seconds_bucket{le=\"5.0\"} 1",
            "hv_eviction_migration_duration_seconds_bucket{le=\"30.0\"} 1",
            "hv_eviction_migration_duration_seconds_bucket{le=\"60.0\"} 2",
            "hv_eviction_migration_duration_seconds_bucket{le=\"3600.0\"} 2",
            "hv_eviction_migration_duration_seconds_bucket{le=\"+Inf\"} 3",
            "hv_eviction_migration_duration_seconds_sum 7249.5",
            "hv_eviction_migration_duration_seconds_count 3",
            "hv_coordinator_leader 0",
            "hv_reconciles_total{controller=\"hypervisor\",result=\"ok\"} 1",
            "hv_reconciles_total{controller=\"hypervisor\",result=\"error\"} 1",
            "hv_reconcile_errors_total{controller=\"hypervisor\",kind=\"kubernetes_conflict\"} 1",
            "hv_reconcile_duration_seconds_count{controller=\"hypervisor\"} 2",
            "hv_reconcile_duration_seconds_bucket{le=\"0.005\",controller=\"hypervisor\"} 1",
            "hv_openstack_requests_total{service=\"compute\",operation=\"GET os-services\",status=\"200\"} 1",
            "hv_openstack_request_duration_seconds_count{service=\"compute\",operation=\"GET os-services\"} 1",
            "hv_coordinator_agent_sessions 1",
            "hv_coordinator_agent_sessions_opened_total 2",
            "hv_coordinator_agent_sessions_replaced_total 1",
            "hv_coordinator_agent_messages_total{kind=\"heartbeat\"} 1",
            "hv_coordinator_agent_outbox_dropped_total 4",
        ] {
            has(&s, line);
        }
        assert_eq!(s.lines().last(), Some("# EOF"));
        assert!(!s.contains("hv_coordinator_grpc_tls"), "no TLS families without TLS");
        assert!(!s.contains("hv_coordinator_certificate_expiry_seconds"), "nor certificates");
    }

    /// Which build runs, and what the process uses, on every replica.
    #[test]
    fn the_build_and_the_process_are_shown() {
        let s = Metrics::default().render();
        let build = format!(
            "hv_build_info{{binary=\"hv-coordinator\",version=\"{}\",arch=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::ARCH
        );
        has(&s, &build);
        for family in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(s.lines().any(|l| l.starts_with(&format!("{family} "))), "missing {family} in\n{s}");
        }
    }

    /// The end of each certificate a listener presents, read at each
    /// scrape: a rotation shows at the next.
    #[test]
    fn the_certificates_ends_are_read_at_each_scrape() {
        let m = Metrics::default();
        let end = Arc::new(std::sync::atomic::AtomicU64::new(2_208_988_800));
        let read = end.clone();
        m.set_certificate("grpc", move || {
            Some(std::time::UNIX_EPOCH + Duration::from_secs(read.load(Ordering::Relaxed)))
        });
        m.set_certificate("webhook", || Some(std::time::UNIX_EPOCH + Duration::from_secs(2_000_000_000)));
        let s = m.render();
        has(&s, "hv_coordinator_certificate_expiry_seconds{use=\"grpc\"} 2208988800");
        has(&s, "hv_coordinator_certificate_expiry_seconds{use=\"webhook\"} 2000000000");
        end.store(2_253_657_600, Ordering::Relaxed);
        has(&m.render(), "hv_coordinator_certificate_expiry_seconds{use=\"grpc\"} 2253657600");
    }

    /// Fencings by their condition's reason (an unknown one as Other), the
    /// longest under way, hosts in ha maintenance for health against the
    /// limit, disables held back by the unseen gate: read from the
    /// Hypervisors, shown by the leader only (the limit by every replica).
    #[test]
    fn the_ha_side_is_counted_from_the_hypervisors_by_the_leader() {
        use crate::api::hypervisor::FencingStatus;
        use crate::api::{Hypervisor, HypervisorSpec, HypervisorStatus, MaintenanceMode};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
        let now = jiff::Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(1_800_000_000);
        let ago = |secs: i64| Some(Time(now - jiff::SignedDuration::from_secs(secs)));
        let cond = |t: &str, reason: &str| Condition {
            type_: t.into(),
            reason: reason.into(),
            status: "False".into(),
            message: String::new(),
            last_transition_time: Time(now),
            observed_generation: None,
        };
        let hv = |spec: HypervisorSpec, phase, conditions, fencing| {
            let mut h = Hypervisor::new("n", spec);
            h.status =
                Some(HypervisorStatus { phase: Some(phase), conditions, fencing, ..Default::default() });
            h
        };
        let ha = |reason: &str| HypervisorSpec {
            maintenance: MaintenanceMode::Ha,
            maintenance_reason: reason.into(),
            ..Default::default()
        };
        let started = |secs, fenced: Option<i64>| {
            Some(FencingStatus { started: ago(secs), fenced: fenced.and_then(ago), ..Default::default() })
        };
        let fleet = [
            hv(
                HypervisorSpec::default(),
                Phase::Active,
                vec![cond("Fenced", "StepNotConfirmed")],
                started(1200, None),
            ),
            hv(
                HypervisorSpec::default(),
                Phase::Active,
                vec![cond("Fenced", "InProgress")],
                started(30, None),
            ),
            hv(HypervisorSpec::default(), Phase::Active, vec![cond("Fenced", "NoAgentQuorum")], None),
            hv(HypervisorSpec::default(), Phase::Active, vec![cond("Fenced", "SomeOldReason")], None),
            // Fenced long ago: not under way any more.
            hv(
                ha("hv-health: fenced"),
                Phase::Maintenance,
                vec![cond("Fenced", "Fenced")],
                started(9000, Some(8000)),
            ),
            // Being cleared: winding up, not under way.
            hv(
                HypervisorSpec::default(),
                Phase::Maintenance,
                vec![cond("Fenced", "ClearWaiting")],
                started(5000, None),
            ),
            hv(ha("hv-health: root-read-only"), Phase::Evicting, vec![], None),
            hv(ha("hv-health: gone"), Phase::Decommissioned, vec![], None),
            hv(ha("an SRE's own reason"), Phase::Maintenance, vec![], None),
            hv(
                HypervisorSpec::default(),
                Phase::Active,
                vec![cond("SchedulingEnabled", "UnseenHeldBack")],
                None,
            ),
        ];
        let figures: Vec<HaFigures> = fleet.iter().map(|h| ha_figures(h, now)).collect();
        assert_eq!(figures[0].fencing_for, Some(1200.0));
        assert_eq!(figures[3].fenced, Some("Other"), "a reason the code does not write");
        assert_eq!(figures[4].fencing_for, None, "fenced");
        assert_eq!(figures[5].fencing_for, None, "being cleared");
        let host = |ha| Host { phase: Phase::Active, agent_connected: true, ha, ..Host::default() };
        let f = hosts(figures.into_iter().map(host));
        let m = Metrics::default();
        m.set_hosts(move || f.clone());
        m.set_ha_maintenance_limit(5);
        let follower = m.render();
        has(&follower, "hv_ha_maintenance_limit 5");
        has(&follower, "hv_hypervisors_ha_maintenance 0");
        has(&follower, "hv_fencing_longest_under_way_seconds 0.0");
        assert!(!follower.contains("hv_hypervisors_fencing{"), "a follower does not speak for the fleet");
        m.set_leader(true);
        let s = m.render();
        has(&s, "hv_hypervisors_fencing{reason=\"StepNotConfirmed\"} 1");
        has(&s, "hv_hypervisors_fencing{reason=\"InProgress\"} 1");
        has(&s, "hv_hypervisors_fencing{reason=\"NoAgentQuorum\"} 1");
        has(&s, "hv_hypervisors_fencing{reason=\"Other\"} 1");
        has(&s, "hv_hypervisors_fencing{reason=\"FleetShareLost\"} 0");
        has(&s, "hv_fencing_longest_under_way_seconds 1200.0");
        has(&s, "hv_hypervisors_ha_maintenance 2");
        has(&s, "hv_ha_maintenance_limit 5");
        has(&s, "hv_hypervisors_unseen_held_back 1");
    }

    /// The Evictions by phase, every phase, from the cache: by the leader only.
    #[test]
    fn evictions_are_counted_by_phase_by_the_leader() {
        use crate::api::{Eviction, EvictionReason, EvictionSpec, EvictionStatus};
        let spec = || EvictionSpec {
            hypervisor: "n".into(),
            reason: EvictionReason::AdminRequest,
            options: Default::default(),
            dry_run: false,
        };
        let (store, mut writer) = kube::runtime::reflector::store::<Eviction>();
        for (name, phase) in
            [("a", EvictionPhase::Migrating), ("b", EvictionPhase::Migrating), ("c", EvictionPhase::Failed)]
        {
            let mut e = Eviction::new(name, spec());
            e.status = Some(EvictionStatus { phase: Some(phase), ..Default::default() });
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(e));
        }
        let mut fresh = Eviction::new("d", spec());
        fresh.status = None;
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fresh));
        let m = Metrics::default();
        m.set_evictions(store);
        assert!(!m.render().contains("hv_evictions{"), "a follower");
        m.set_leader(true);
        let s = m.render();
        has(&s, "hv_evictions{phase=\"Migrating\"} 2");
        has(&s, "hv_evictions{phase=\"Failed\"} 1");
        has(&s, "hv_evictions{phase=\"Pending\"} 1");
        has(&s, "hv_evictions{phase=\"Planned\"} 0");
    }
}
