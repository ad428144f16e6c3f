//! `/metrics` (OpenMetrics text, by `prometheus-client`), `/healthz` and
//! `/readyz` of the coordinator.
//!
//! Each concern owns its families (evictions, reconciles, OpenStack
//! requests, Kubernetes writes, agent sessions, the fleet) and hands a narrow handle to the
//! code it measures. Counters start at zero in every process (Prometheus'
//! `rate()` copes); the durable record is the custom resources' status.

mod eviction;
mod hosts;
mod kube_writes;
mod openstack;
mod reconciles;
mod sessions;
mod view;

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

pub use eviction::{DURATION_BUCKETS, Evictions, Tally, tally};
pub use hosts::{Host, Hosts, hosts};
pub use kube_writes::KubeWrites;
pub use openstack::{OpenStackCalls, operation};
pub use reconciles::Reconciles;
pub use sessions::AgentSessions;

use crate::api::hypervisor::HealthState;

type HostsSource = Box<dyn Fn() -> Hosts + Send + Sync>;
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
    host_gauges: hosts::HostGauges,
    tls: OnceLock<Tls>,
    /// The fleet view of Nova in numbers, shown while this replica leads.
    nova_view: OnceLock<ViewSource>,
    /// The fleet as this replica sees it (the Hypervisor cache and the
    /// agent sessions), shown only while it leads.
    hosts: OnceLock<HostsSource>,
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
        Metrics {
            evictions: Evictions::register(&mut registry),
            reconciles: Reconciles::register(&mut registry),
            openstack: OpenStackCalls::register(&mut registry),
            kube_writes: KubeWrites::register(&mut registry),
            sessions: AgentSessions::register_into(&mut registry),
            host_gauges: hosts::HostGauges::register(&mut registry),
            registry,
            leader: AtomicBool::new(false),
            leader_gauge,
            leader_transitions,
            tls: OnceLock::new(),
            nova_view: OnceLock::new(),
            hosts: OnceLock::new(),
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
        let mut s = String::new();
        let mut encode = || -> Result<(), std::fmt::Error> {
            prometheus_client::encoding::text::encode_registry(&mut s, &self.registry)?;
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
    fn the_fleet_is_counted_by_phase_and_missing_agents_only_where_one_belongs() {
        let host = |phase, agent_connected, health| Host {
            phase,
            agent_connected,
            health,
            fenced_showing_life: false,
            disabled_elsewhere: false,
            paused: false,
            adopted_checks_failed: false,
            update_drain_left: None,
            update_drain_forced: false,
        };
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
            fenced_showing_life: false,
            disabled_elsewhere: false,
            paused: false,
            adopted_checks_failed: false,
            update_drain_left: None,
            update_drain_forced: false,
        };
        m.set_hosts(move || hosts([active]));
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
                // A metric name, not part of another word (`"hv_" + x`).
                if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
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
    }
}
