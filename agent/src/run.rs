//! `hv-agent run`: the watchers, the session and the health endpoint,
//! wired together. Everything the coordinator learns about the node flows
//! through here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::{
    CheckReport, CheckResult, ConnectivityChange, DomainEvent, HealthSignalKind, HostFacts, Inventory,
    RunChecks,
};
use tokio::sync::mpsc;

use crate::backoff::{Backoff, draw, timestamp_now as now};
use crate::ceph::CephClient;
use crate::checks::{self, Endpoints};
use crate::health::{self, Health, Watcher};
use crate::libvirt::blocking::Lane;
use crate::libvirt::events::LibvirtEvent;
use crate::libvirt::watch::{WatchEvent, watch};
use crate::libvirt::{Libvirt, LibvirtTarget};
use crate::ovsdb;
use crate::session::{Command, Session, SessionConfig, SessionHandle};
use crate::signals;

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub session: SessionConfig,
    pub endpoints: Endpoints,
    pub ceph_pools: Vec<String>,
    pub inventory_interval: Duration,
    pub health_listen: SocketAddr,
    /// Where the host's /proc and /sys are (health signals).
    pub host_root: std::path::PathBuf,
    /// The session's certificate from the coordinator (it then replaces
    /// `session.tls`), or None.
    pub identity: Option<crate::identity::IdentityConfig>,
}

/// Kernel and hostname from the host itself (nix), beside libvirt's view;
/// the machine's SMBIOS UUID from the host's /sys (the agent must be able
/// to read it: it is mode 0400, root's).
fn host_identity(f: &mut HostFacts, host_root: &std::path::Path) {
    let uuid = std::fs::read_to_string(host_root.join("sys/class/dmi/id/product_uuid")).unwrap_or_default();
    f.system_uuid = uuid.trim().to_ascii_lowercase();
    crate::hardware::read_sys(host_root, f.hardware.get_or_insert_default());
    if let Ok(u) = nix::sys::utsname::uname() {
        f.kernel = u.release().to_string_lossy().into_owned();
    }
    if let Ok(h) = nix::unistd::gethostname() {
        let h = h.to_string_lossy().into_owned();
        if f.hostname.is_empty() {
            f.hostname = h;
        }
    }
}

/// Facts and inventory through a short connection of their own, in the
/// snapshot lane under the target's deadline: a hung libvirtd must not hang
/// the agent.
async fn snapshot(
    target: &LibvirtTarget,
    lane: &Lane,
    host_root: &std::path::Path,
) -> Result<(HostFacts, Inventory), String> {
    let (t, deadline, root) = (target.clone(), target.deadline, host_root.to_path_buf());
    lane.run("libvirt snapshot", deadline, move || {
        let lv = Libvirt::connect(&t).map_err(|e| e.to_string())?;
        let mut facts = lv.facts().map_err(|e| e.to_string())?;
        host_identity(&mut facts, &root);
        let domains = lv.inventory().map_err(|e| e.to_string())?;
        Ok((facts, Inventory { domains }))
    })
    .await
}

/// Starts everything; returns the health address and runs until the session ends.
pub async fn run(mut cfg: AgentConfig) -> Result<(), String> {
    if let Some(id) = cfg.identity.clone() {
        let (tx, current) = tokio::sync::watch::channel(crate::identity::kept(&id));
        cfg.session.tls = Some(crate::session::SessionTls::Issued { ca: id.ca.clone(), current });
        tokio::spawn(crate::identity::run(id, tx));
    }
    let session = Session::new(cfg.session.clone());
    let handle = session.handle();
    let libvirt_live = Arc::new(AtomicBool::new(false));
    let ovs_live = Arc::new(AtomicBool::new(false));
    let ceph_live = Arc::new(AtomicBool::new(cfg.endpoints.ceph.is_none() || cfg.ceph_pools.is_empty()));
    let health = Health {
        watchers: vec![
            Watcher { name: "libvirt", live: libvirt_live.clone() },
            Watcher { name: "ovsdb", live: ovs_live.clone() },
            Watcher { name: "ceph", live: ceph_live.clone() },
        ],
        session: session.stats.clone(),
        handle: handle.clone(),
        certificate: cfg.session.tls.clone(),
    };
    let addr = health::serve(cfg.health_listen, health).await.map_err(|e| format!("health listener: {e}"))?;
    tracing::info!(node = %cfg.session.node, %addr, "health and metrics listening");

    let (signal_tx, signal_rx) = mpsc::channel(256);
    tokio::spawn(signals::run(signal_rx, cfg.host_root.clone(), handle.clone()));
    // The IPs the Ceph probe last reached the cluster from, for the facts.
    let (ceph_ips_tx, ceph_ips) = tokio::sync::watch::channel(Vec::<String>::new());
    tokio::spawn(libvirt_task(cfg.clone(), handle.clone(), libvirt_live, signal_tx.clone(), ceph_ips));
    // The bridges the host must have, and how: br-int secure, then as the
    // last checks demanded.
    let (must_have, required) = tokio::sync::watch::channel(signals::ovs::Required::before_checks());
    tokio::spawn(ovs_task(
        cfg.endpoints.ovsdb_remote.clone(),
        handle.clone(),
        ovs_live,
        signal_tx.clone(),
        required,
    ));
    if let Some(client) = cfg.endpoints.ceph.clone().filter(|_| !cfg.ceph_pools.is_empty()) {
        tokio::spawn(ceph_task(
            client,
            cfg.ceph_pools.clone(),
            cfg.endpoints.ceph_probe.clone(),
            handle.clone(),
            ceph_live,
            signal_tx,
            ceph_ips_tx,
        ));
    }
    let (cmd_tx, mut cmd_rx) = mpsc::channel(16);
    let commands = {
        let handle = handle.clone();
        let ep = cfg.endpoints.clone();
        tokio::spawn(async move {
            let mut reports = Reports::default();
            while let Some(cmd) = cmd_rx.recv().await {
                match cmd {
                    Command::RunChecks(r) => {
                        if let Some(config) = r.config.as_ref() {
                            let now = signals::ovs::Required::from_checks(config);
                            must_have.send_if_modified(|m| std::mem::replace(m, now) != *m);
                        }
                        // A run is executed at most once per process. Asked
                        // again (a new leader whose predecessor acknowledged
                        // the report and died before recording it), the
                        // agent sends the report it kept.
                        let report = match reports.get(&r) {
                            Some(kept) => kept,
                            None => {
                                let config = r.config.clone().unwrap_or_default();
                                let outcomes = checks::run(&ep, &config).await;
                                let results = outcomes.iter().map(|o| o.to_proto()).collect();
                                reports.keep(&r, results)
                            }
                        };
                        handle.push(Payload::CheckReport(report)).await;
                    }
                    Command::Configure(_) => {}
                }
            }
        })
    };
    session.run(cmd_tx).await;
    commands.abort();
    Ok(())
}

/// The reports of the last few test runs, each with the request it
/// answers: the same run of the same Hypervisor with the same configuration
/// gets the kept report; anything else is run afresh.
#[derive(Default)]
struct Reports(std::collections::VecDeque<(RunChecks, CheckReport)>);

impl Reports {
    const KEPT: usize = 8;

    fn get(&self, asked: &RunChecks) -> Option<CheckReport> {
        self.0.iter().find(|(r, _)| r == asked).map(|(_, report)| report.clone())
    }

    fn keep(&mut self, asked: &RunChecks, results: Vec<CheckResult>) -> CheckReport {
        let report = CheckReport { run: asked.run, results, hypervisor_uid: asked.hypervisor_uid.clone() };
        if self.0.len() >= Self::KEPT {
            self.0.pop_front();
        }
        self.0.push_back((asked.clone(), report.clone()));
        report
    }
}

async fn libvirt_task(
    cfg: AgentConfig,
    handle: SessionHandle,
    live: Arc<AtomicBool>,
    signals: mpsc::Sender<signals::Update>,
    mut ceph_ips: tokio::sync::watch::Receiver<Vec<String>>,
) {
    let peer =
        |connected: bool, why: &str| signals::peer(HealthSignalKind::LibvirtUnreachable, connected, why);
    let target = cfg.endpoints.libvirt.clone();
    let uri = target.uri.clone();
    let (tx, mut rx) = mpsc::channel(256);
    tokio::spawn(watch(target.clone(), Backoff::default(), tx, live));
    // Snapshots run in a task of their own, one at a time: a burst of events
    // asks for one snapshot, and events are never held up behind one.
    let (want_tx, want_rx) = mpsc::channel::<()>(1);
    // Set at each connect: the next snapshot looks for domains already
    // paused on an I/O error.
    let fresh = Arc::new(AtomicBool::new(false));
    // Set at each session a coordinator welcomes: the facts go again, as a
    // new leader has not heard them.
    let retell = Arc::new(AtomicBool::new(false));
    let mut welcomes = handle.welcomes();
    tokio::spawn(snapshot_task(
        (target, cfg.host_root.clone()),
        cfg.session.node.clone(),
        handle.clone(),
        want_rx,
        (signals.clone(), fresh.clone(), retell.clone()),
        ceph_ips.clone(),
    ));
    let want = move || {
        let _ = want_tx.try_send(());
    };
    let mut refresh = tokio::time::interval(cfg.inventory_interval);
    loop {
        tokio::select! {
            ev = rx.recv() => match ev {
                None => return,
                Some(WatchEvent::Connected { .. }) => {
                    handle.push(Payload::Connectivity(ConnectivityChange { peer: "libvirt".into(), connected: true, message: uri.clone() })).await;
                    let _ = signals.send(peer(true, "")).await;
                    fresh.store(true, Ordering::Relaxed);
                    want();
                }
                Some(WatchEvent::Lost { reason }) => {
                    let _ = signals.send(peer(false, &reason)).await;
                    handle.push(Payload::Connectivity(ConnectivityChange { peer: "libvirt".into(), connected: false, message: reason })).await;
                }
                Some(WatchEvent::Domain(LibvirtEvent::Domain { uuid, name, kind, reason })) => {
                    for u in signals::domain::updates(kind, &reason, &uuid, &name) {
                        let _ = signals.send(u).await;
                    }
                    let e = DomainEvent { uuid, name, kind: kind as i32, reason, observed_at: Some(now()) };
                    handle.push(Payload::DomainEvent(e)).await;
                    want();
                }
                Some(WatchEvent::Domain(LibvirtEvent::Closed { .. })) => {}
            },
            _ = refresh.tick() => want(),
            Ok(()) = welcomes.changed() => {
                retell.store(true, Ordering::Relaxed);
                want();
            }
            // New Ceph IPs: new facts. A closed channel (no Ceph) never fires again.
            Ok(()) = ceph_ips.changed() => want(),
        }
    }
}

async fn snapshot_task(
    (target, host_root): (LibvirtTarget, std::path::PathBuf),
    node: String,
    handle: SessionHandle,
    mut want: mpsc::Receiver<()>,
    (signals, fresh, retell): (mpsc::Sender<signals::Update>, Arc<AtomicBool>, Arc<AtomicBool>),
    ceph_ips: tokio::sync::watch::Receiver<Vec<String>>,
) {
    let mut last_facts: Option<HostFacts> = None;
    let lane = Lane::default();
    while want.recv().await.is_some() {
        let first = fresh.swap(false, Ordering::Relaxed);
        if retell.swap(false, Ordering::Relaxed) {
            last_facts = None;
        }
        match snapshot(&target, &lane, &host_root).await {
            Ok((mut facts, inv)) => {
                facts.ceph_client_ips = ceph_ips.borrow().clone();
                if last_facts.as_ref() != Some(&facts) {
                    handle.push(Payload::HostFacts(facts.clone())).await;
                    last_facts = Some(facts);
                }
                if first {
                    for u in signals::domain::from_inventory(&inv.domains) {
                        let _ = signals.send(u).await;
                    }
                }
                handle.push(Payload::Inventory(inv)).await;
            }
            Err(e) => tracing::warn!(node = %node, error = %e, "libvirt snapshot failed"),
        }
    }
}

async fn ovs_task(
    remote: String,
    handle: SessionHandle,
    live: Arc<AtomicBool>,
    signals: mpsc::Sender<signals::Update>,
    mut required: tokio::sync::watch::Receiver<signals::ovs::Required>,
) {
    let peer = |connected: bool, why: &str| signals::peer(HealthSignalKind::OvsdbUnreachable, connected, why);
    let backoff = Backoff::default();
    let mut attempt = 0;
    // Said once per outage (also when it never answered since the start):
    // a repeat would lower a signal escalated to critical.
    let mut said_lost = false;
    // What the bridges were, across reconnects.
    let mut bridges = signals::ovs::Bridges::default();
    // The requirements' sender lives as long as the agent; were it gone,
    // the last requirements would stand.
    let mut requirements_open = true;
    loop {
        let why = match ovsdb::Client::connect(&remote).await {
            Ok(c) => match c.watch_bridges().await {
                Ok((initial, mut w)) => {
                    attempt = 0;
                    live.store(true, Ordering::Relaxed);
                    said_lost = false;
                    let _ = signals.send(peer(true, "")).await;
                    handle
                        .push(Payload::Connectivity(ConnectivityChange {
                            peer: "ovsdb".into(),
                            connected: true,
                            message: remote.clone(),
                        }))
                        .await;
                    let mut present = initial;
                    loop {
                        let now_required = required.borrow_and_update().clone();
                        for u in bridges.judge(&present, &now_required) {
                            let _ = signals.send(u).await;
                        }
                        // A change of the bridges, or of what they must be.
                        tokio::select! {
                            next = w.next() => match next {
                                Some(now) => present = now,
                                None => break,
                            },
                            changed = required.changed(), if requirements_open => {
                                requirements_open = changed.is_ok();
                            }
                        }
                    }
                    "the OVSDB connection ended".to_string()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "OVSDB monitor failed");
                    e.to_string()
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "OVSDB unreachable");
                e.to_string()
            }
        };
        if !said_lost {
            said_lost = true;
            let _ = signals.send(peer(false, &why)).await;
        }
        if live.swap(false, Ordering::Relaxed) {
            handle
                .push(Payload::Connectivity(ConnectivityChange {
                    peer: "ovsdb".into(),
                    connected: false,
                    message: "connection lost".into(),
                }))
                .await;
        }
        tokio::time::sleep(backoff.delay(attempt, draw())).await;
        attempt += 1;
    }
}

async fn ceph_task(
    client: CephClient,
    pools: Vec<String>,
    probe: std::path::PathBuf,
    handle: SessionHandle,
    live: Arc<AtomicBool>,
    signals: mpsc::Sender<signals::Update>,
    ips: tokio::sync::watch::Sender<Vec<String>>,
) {
    let (mut first, mut blocklisted_last) = (true, false);
    loop {
        if !std::mem::take(&mut first) {
            // A blocklisted client looks again soon: the lift of its
            // entries (a cleared fence) is seen in seconds, not a minute.
            tokio::time::sleep(Duration::from_secs(if blocklisted_last { 5 } else { 60 })).await;
        }
        let checks = crate::ceph::check_pools_isolated(&client, &pools, &probe).await;
        blocklisted_last = checks.iter().any(|c| c.blocklisted);
        // A probe that never connected learned nothing: the last IPs stand.
        if let Some(learned) = checks.iter().map(|c| &c.client_ips).find(|ips| !ips.is_empty()) {
            ips.send_if_modified(|old| std::mem::replace(old, learned.clone()) != *old);
        }
        for u in signals::ceph::updates(&checks) {
            let _ = signals.send(u).await;
        }
        let ok = !checks.is_empty() && checks.iter().all(|c| c.passed);
        if live.swap(ok, Ordering::Relaxed) != ok {
            let message =
                checks.iter().filter(|c| !c.passed).map(|c| c.message.clone()).collect::<Vec<_>>().join("; ");
            handle
                .push(Payload::Connectivity(ConnectivityChange {
                    peer: "ceph".into(),
                    connected: ok,
                    message,
                }))
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hv_proto::v1::CheckConfig;

    fn asked(uid: &str, run: u64, bridges: &[&str]) -> RunChecks {
        let config =
            CheckConfig { bridges: bridges.iter().map(|b| b.to_string()).collect(), ..Default::default() };
        RunChecks { run, config: Some(config), hypervisor_uid: uid.into() }
    }

    #[test]
    fn a_kept_report_answers_only_the_same_run_of_the_same_hypervisor_and_configuration() {
        let mut r = Reports::default();
        let ok = vec![CheckResult { name: "ovs-bridge/br-int".into(), passed: true, ..Default::default() }];
        let kept = r.keep(&asked("uid-1", 1, &["br-int"]), ok);
        assert_eq!(kept.hypervisor_uid, "uid-1", "the report echoes the Hypervisor it answers");
        assert_eq!(r.get(&asked("uid-1", 1, &["br-int"])), Some(kept));
        assert_eq!(r.get(&asked("uid-2", 1, &["br-int"])), None, "a Hypervisor created anew runs again");
        assert_eq!(r.get(&asked("uid-1", 1, &["br-int", "br-ex"])), None, "another configuration runs again");
        assert_eq!(r.get(&asked("uid-1", 2, &["br-int"])), None);
        for run in 2..=9 {
            r.keep(&asked("uid-1", run, &[]), Vec::new());
        }
        assert_eq!(r.get(&asked("uid-1", 1, &["br-int"])), None, "only the last 8 are kept");
    }
}
