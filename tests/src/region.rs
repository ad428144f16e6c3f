//! A region for end-to-end tests: the test ground with its Kubernetes
//! control plane, and the real `hv-coordinator`
//! and `hv-agent` binaries as child processes, with helpers to create
//! Nodes, wait for phases and break or mend a node's peers.
//!
//! The binaries are the ones `cargo test --workspace --all-targets` builds
//! next to the test executables (`target/debug/`).
//!
//! Every helper here fails the calling test loudly when the region cannot be
//! set up: that is its purpose, hence the panics.
#![allow(clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionPhase, EvictionReason, EvictionSpec};
use hv_coordinator::api::hypervisor::{HealthState, HealthStatus};
use hv_coordinator::api::{Eviction, Hypervisor, Migration, Phase};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::env::{TestEnv, Via};
use crate::kube_target::KubeTarget;
use crate::pki::Pki;
use crate::wait::{Poll, until};
use hv_tls::TlsFiles;

/// A workspace binary built beside the test executable. `cargo test` does
/// not build other packages' binaries: `make test` runs `cargo build
/// --workspace --bins` first.
/// The project's binary `name`: beside the running test or example's
/// profile directory, or in `$HV_BIN_DIR` (a benchmark runs the release
/// coordinator from a debug example).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = match std::env::var_os("HV_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => exe.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default(),
    };
    let path = dir.join(name);
    if !path.exists() {
        panic!("{} is not built: run `cargo build --workspace --bins` (make test does)", path.display());
    }
    path
}

///
/// Taken below the kernel's ephemeral range: a port the kernel hands out
/// (`bind` to 0) may be taken by any process's next outgoing connection
/// between the pick and the listener's bind, and on a ground of many
/// clients that happened. Tests of one process pick in turn, from a start
/// of their own.
pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next().and_then(|p| p.parse::<u32>().ok()))
        .unwrap_or(32768);
    let (base, span) =
        (ephemeral_low.saturating_sub(12_000).max(10_000), 12_000.min(ephemeral_low.saturating_sub(10_000)));
    let start = std::process::id()
        .wrapping_mul(7919)
        .wrapping_add(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 13);
    for i in 0..span {
        let Ok(port) = u16::try_from(base + (start.wrapping_add(i)) % span.max(1)) else { continue };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// A child process that is killed when dropped, with its output in a file.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    /// `http://host:port/metrics` of a coordinator.
    pub metrics: Option<String>,
    /// The Pod a coordinator runs in (its identity).
    pub pod: Option<String>,
    child: Option<Child>,
}

impl Proc {
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Result<Proc, String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting {name} ({:?}): {e}", cmd.get_program()))?;
        Ok(Proc { name: name.to_string(), log, metrics: None, pod: None, child: Some(child) })
    }

    /// The value of `key=value` in the first line of this process's log
    /// that contains `text` (tracing's colours taken out).
    pub fn logged(&self, text: &str, key: &str) -> Option<String> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let line = log.lines().map(without_colours).find(|l| l.contains(text))?;
        let at = line.find(&format!(" {key}="))? + key.len() + 2;
        Some(line[at..].split_whitespace().next()?.trim_matches('"').to_string())
    }

    /// `http://host:port/metrics` of an agent, from its log.
    pub fn agent_metrics(&self) -> Option<String> {
        self.logged("health and metrics listening", "addr").map(|a| format!("http://{a}/metrics"))
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (graceful stop); SIGKILL after 15 s.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(c.id()).unwrap_or(0));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            for _ in 0..150 {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How a node's agent reaches its peers (defaults: the ground's).
#[derive(Clone, Debug, Default)]
pub struct AgentPeers {
    /// libvirt's URI (default: the machine's own for a node named after a
    /// fake host, else the ground's shared libvirtd).
    pub libvirt: Option<String>,
    pub ovsdb: Option<String>,
    pub ceph_id: Option<String>,
    pub ceph_keyring: Option<PathBuf>,
    /// Where the agent reads the host's /proc and /sys (default: a quiet
    /// fake host, [`healthy_host`]).
    pub host_root: Option<PathBuf>,
    /// Pools the agent probes every minute (`--pool`; none by default).
    pub pools: Vec<String>,
    /// The host's own IP: the agent's connections (its Ceph probe's too)
    /// leave from it (default 127.0.0.1, shared by every fake host).
    pub source_ip: Option<String>,
    /// How often the agent reads its host's facts and domains again
    /// (`--inventory-interval`; the agent's default otherwise).
    pub inventory_interval: Option<String>,
}

pub struct Region {
    pub env: TestEnv,
    /// The ground's API server, as its administrator.
    pub kube: KubeTarget,
    /// Scratch directory of this test (logs, kubeconfig, clouds.yaml).
    pub dir: PathBuf,
    /// The administrator's kubeconfig (for kubectl and hvctl).
    pub kubeconfig: PathBuf,
    /// Label value selecting this test's Nodes (`hv-e2e=<id>`).
    pub id: String,
    /// The coordinator's gRPC port (fixed per region, so a restarted
    /// coordinator is found by the agents at the same address).
    pub grpc_port: u16,
    /// This test's gRPC certificates: the coordinator's, an SRE's, one per
    /// node's agent.
    pub pki: Pki,
    /// The coordinator's server certificate and the SRE's client one.
    pub server_tls: TlsFiles,
    pub sre_tls: TlsFiles,
    /// When this region started (the API server outlives it).
    pub started: jiff::Timestamp,
    /// Modules whose debug events the coordinators started after
    /// [`Region::debug_coordinators`] log, unless `HV_COORDINATOR_LOG` says.
    debug: std::sync::Mutex<Vec<String>>,
}

impl Region {
    pub async fn start(test: &str) -> Region {
        let env = crate::env::require();
        let kube = crate::kube_target::admin(&env).await.unwrap_or_else(|e| panic!("Kubernetes API: {e}"));
        let id = format!("{test}-{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("hv-e2e-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let kubeconfig = kube.kubeconfig.clone();
        let pki = Pki::new(&dir.join("pki"), "hv-test-ca");
        let (server_tls, sre_tls) = (pki.server(), pki.sre());
        // Whole seconds: an Event's creation time is.
        let started = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default();
        let debug = Default::default();
        Region {
            env,
            kube,
            dir,
            kubeconfig,
            id,
            grpc_port: free_port(),
            pki,
            server_tls,
            sre_tls,
            started,
            debug,
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.grpc_port)
    }

    /// A gRPC channel to the coordinator at `url` as an SRE (client
    /// certificate of this region's CA); an error when it cannot connect.
    pub async fn channel_to(&self, url: &str) -> Result<tonic::transport::Channel, String> {
        connect(url, &self.sre_tls).await
    }

    /// `hvctl` with this region's coordinator and an SRE's certificate.
    pub fn hvctl(&self) -> Command {
        let mut cmd = Command::new(bin("hvctl"));
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HV_COORDINATOR", self.grpc_url())
            .env("HV_TLS_CERT", &self.sre_tls.cert)
            .env("HV_TLS_KEY", &self.sre_tls.key)
            .env("HV_TLS_CA", &self.sre_tls.ca);
        cmd
    }

    /// Coordinators started from now on log the debug events of `modules`
    /// (a test that counts what they do prints why, should it fail).
    pub fn debug_coordinators(&self, modules: &[&str]) {
        if let Ok(mut d) = self.debug.lock() {
            d.extend(modules.iter().map(|m| m.to_string()));
        }
    }

    /// Starts `hv-coordinator` with short intervals, logging in with
    /// `password` (None: the right one), plus `extra` flags.
    pub fn coordinator(&self, password: Option<&str>, extra: &[&str]) -> Proc {
        self.coordinator_on(self.grpc_port, password, extra)
    }

    /// The same, listening on another port (a second replica).
    pub fn coordinator_on(&self, port: u16, password: Option<&str>, extra: &[&str]) -> Proc {
        self.coordinator_via(port, password, &Via::default(), extra)
    }

    /// A coordinator reaching Kubernetes, Keystone, Nova or Placement
    /// through the fault proxies `via` names, in a Pod of its own
    /// (`hv-coordinator-N`, its token bound to it), made as an object only
    /// (no kubelet runs it).
    pub fn coordinator_via(&self, port: u16, password: Option<&str>, via: &Via, extra: &[&str]) -> Proc {
        static PODS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = PODS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % COORDINATOR_PODS;
        let pod = format!("{}{n}", crate::rbac::COORDINATOR_POD_PREFIX);
        let account = &self.env.kube.chart.coordinator_account;
        self.coordinator_pod(
            &Install { namespace: crate::rbac::COORDINATOR_NAMESPACE.into(), account: account.clone() },
            &pod,
        );
        self.coordinator_in(&pod, port, password, via, extra)
    }

    /// A coordinator in the Pod `pod` (a restarted container keeps its
    /// Pod): it labels the Pod while it leads, as the chart runs it.
    pub fn coordinator_in(
        &self,
        pod: &str,
        port: u16,
        password: Option<&str>,
        via: &Via,
        extra: &[&str],
    ) -> Proc {
        let chart = &self.env.kube.chart;
        let install =
            Install { namespace: chart.namespace.clone(), account: chart.coordinator_account.clone() };
        self.coordinator_of(&install, pod, port, password, via, extra)
    }

    /// The coordinator Pod `name` of the release `install` (its namespace,
    /// run as its ServiceAccount, whose tokens can then be bound to it), as
    /// an object (no kubelet runs it): created, or, left by an earlier test,
    /// kept with its leader label taken away.
    pub fn coordinator_pod(&self, install: &Install, name: &str) {
        create_pod(&self.kubeconfig, install, name);
    }

    /// A coordinator of the chart's release `install` (its namespace and
    /// ServiceAccount), in the Pod `pod` there.
    pub fn coordinator_of(
        &self,
        install: &Install,
        pod: &str,
        port: u16,
        password: Option<&str>,
        via: &Via,
        extra: &[&str],
    ) -> Proc {
        let clouds = self
            .env
            .clouds_yaml_via(&self.dir, &format!("clouds-{port}.yaml"), password, via)
            .unwrap_or_else(|e| panic!("clouds.yaml: {e}"));
        // The chart's ServiceAccount: its RBAC is what the coordinator meets,
        // and the API server's audit log records what it asked for.
        let kubeconfig = self.dir.join(format!("kubeconfig-{port}"));
        let (ns, account) = (&install.namespace, &install.account);
        crate::kube_target::account_kubeconfig(
            &self.env,
            (ns, account, Some(pod)),
            via.kube.as_deref(),
            &kubeconfig,
        )
        .unwrap_or_else(|e| panic!("the coordinator's kubeconfig: {e}"));
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(bin("hv-coordinator"));
        cmd.env("KUBECONFIG", &kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("HV_COORDINATOR_LOG").unwrap_or_else(|_| {
                    let debug = self.debug.lock().map(|d| d.clone()).unwrap_or_default();
                    let debug: String = debug.iter().map(|m| format!(",{m}=debug")).collect();
                    format!("info,kube_runtime=warn,kube_client=warn,openstack_sdk=warn,openstack_sdk_core=warn{debug}")
                }),
            )
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-listen", &metrics])
            .args(["--os-cloud", "hv", "--clouds-yaml"])
            .arg(&clouds)
            .args(["--namespace", ns, "--lease-name", &self.lease()])
            .args(["--node-selector", &format!("hv-e2e={}", self.id)]);
        // Short intervals for tests, unless `extra` names its own.
        let defaults = [
            ("--agent-heartbeat", "1s"),
            ("--busy-interval", "1s"),
            ("--drift-interval", "2s"),
            ("--lease-duration", "4s"),
            ("--lease-renew-deadline", "3s"),
            ("--lease-retry", "500ms"),
            ("--health-settle", "2s"),
            ("--kube-timeout", "5s"),
            ("--connect-timeout", "500ms"),
        ];
        for (flag, value) in defaults.iter().filter(|(f, _)| !extra.contains(f)) {
            cmd.args([flag, value]);
        }
        cmd.args(extra);
        // Most tests run hosts without an agent (skipTests): they are
        // Unreachable, and must not be disabled under them. The health
        // tests give a grace of their own.
        if !extra.contains(&"--unreachable-grace") {
            cmd.args(["--unreachable-grace", "1h"]);
        }
        cmd.arg("--tls-cert").arg(&self.server_tls.cert);
        cmd.arg("--tls-key").arg(&self.server_tls.key);
        cmd.arg("--client-ca").arg(&self.server_tls.ca);
        cmd.args(["--identity", pod, "--label-leader-pod"]);
        let log = self.dir.join(format!("coordinator-{port}.log"));
        let mut p = Proc::spawn("hv-coordinator", &mut cmd, log).unwrap_or_else(|e| panic!("{e}"));
        p.metrics = Some(format!("http://{metrics}/metrics"));
        p.pod = Some(pod.to_string());
        p
    }

    /// The name of this region's leader-election Lease (in
    /// [`COORDINATOR_NAMESPACE`](crate::rbac::COORDINATOR_NAMESPACE)).
    pub fn lease(&self) -> String {
        format!("hv-e2e-{}", self.id)
    }

    /// The name of this region's coordinator install (the label its
    /// Hypervisors carry).
    pub fn instance(&self) -> String {
        format!("{}.{}", crate::rbac::COORDINATOR_NAMESPACE, self.lease())
    }

    /// Waits (up to 30 s) until coordinator `p` holds the Lease.
    pub async fn wait_leading(&self, p: &Proc) {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.kube.client.clone(), crate::rbac::COORDINATOR_NAMESPACE);
        let me = p.pod.clone().unwrap_or_else(|| panic!("{} runs in no Pod", p.name));
        until(
            &format!("{} leading", p.name),
            Duration::from_secs(30),
            || p.tail(20),
            || async {
                let lease = leases.get_opt(&self.lease()).await.ok().flatten();
                match lease.and_then(|l| l.spec).and_then(|s| s.holder_identity) {
                    Some(h) if h == me => Poll::Ready(()),
                    other => Poll::Pending(format!("held by {other:?}")),
                }
            },
        )
        .await;
    }

    /// Whether the Pod of coordinator `p` carries the leader label.
    pub async fn leader_labelled(&self, p: &Proc) -> bool {
        self.pod_labelled(p.pod.as_deref().unwrap_or_else(|| panic!("{} runs in no Pod", p.name))).await
    }

    /// Whether the coordinator Pod `pod` carries the leader label.
    pub async fn pod_labelled(&self, pod: &str) -> bool {
        use k8s_openapi::api::core::v1::Pod;
        let api: Api<Pod> = Api::namespaced(self.kube.client.clone(), crate::rbac::COORDINATOR_NAMESPACE);
        let got = api.get(pod).await.unwrap_or_else(|e| panic!("Pod {pod}: {e}"));
        got.metadata
            .labels
            .unwrap_or_default()
            .get(hv_coordinator::api::keys::LEADER_LABEL)
            .map(String::as_str)
            == Some("true")
    }

    /// Starts `hv-agent run` for `node` against its machine's libvirt (test
    /// driver), and the given or the ground's OVSDB and Ceph client.
    pub fn agent(&self, node: &str, peers: &AgentPeers) -> Proc {
        self.agent_with(node, peers, &self.pki.node(node))
    }

    /// The same, with the certificate files `tls`.
    pub fn agent_with(&self, node: &str, peers: &AgentPeers, tls: &TlsFiles) -> Proc {
        let mut cmd = Command::new(bin("hv-agent"));
        cmd.args(["run", "--node", node, "--coordinator", &self.grpc_url()])
            .arg("--tls-cert")
            .arg(&tls.cert)
            .arg("--tls-key")
            .arg(&tls.key)
            .arg("--tls-ca")
            .arg(&tls.ca);
        self.spawn_agent(node, peers, cmd)
    }

    /// An agent whose certificate comes from the coordinator's bootstrap
    /// port `bootstrap`, on the token in `token_file`, kept in `dir`.
    pub fn agent_from_coordinator(
        &self,
        node: &str,
        peers: &AgentPeers,
        bootstrap: &str,
        token_file: &Path,
        dir: &Path,
    ) -> Proc {
        let mut cmd = Command::new(bin("hv-agent"));
        cmd.args(["run", "--node", node, "--coordinator", &self.grpc_url(), "--identity-url", bootstrap])
            .arg("--tls-ca")
            .arg(&self.server_tls.ca)
            .arg("--token-file")
            .arg(token_file)
            .arg("--identity-dir")
            .arg(dir);
        self.spawn_agent(node, peers, cmd)
    }

    /// `cmd` (an agent's, its session's flags given) with this region's
    /// peers, started.
    fn spawn_agent(&self, node: &str, peers: &AgentPeers, mut cmd: Command) -> Proc {
        let env = &self.env;
        cmd.env("RUST_LOG", "info")
            .args(["--heartbeat", "1s", "--health-listen", "127.0.0.1:0"])
            .args(["--libvirt-uri", peers.libvirt.as_deref().unwrap_or(env.libvirt.of(node))])
            .args(["--ovsdb", peers.ovsdb.as_deref().unwrap_or(&env.ovsdb.tcp)])
            .arg("--ceph-conf")
            .arg(&env.ceph.conf)
            .args(["--ceph-id", peers.ceph_id.as_deref().unwrap_or(&env.ceph.client.id)])
            .arg("--ceph-keyring")
            .arg(peers.ceph_keyring.as_ref().unwrap_or(&env.ceph.client.keyring));
        for pool in &peers.pools {
            cmd.args(["--pool", pool]);
        }
        if let Some(every) = &peers.inventory_interval {
            cmd.args(["--inventory-interval", every]);
        }
        if let Some(ip) = &peers.source_ip {
            cmd.env("LD_PRELOAD", &env.source_ip_shim).env("HV_TEST_SOURCE_IP", ip);
        }
        // A quiet fake host by default: the machine's own load would
        // raise signals at random.
        let root =
            peers.host_root.clone().unwrap_or_else(|| healthy_host(&self.dir.join(format!("host-{node}"))));
        // The machine's SMBIOS UUID: its BMC's system on the ground.
        if let Some(uuid) = env.bmc.system_uuid(node) {
            let dmi = root.join("sys/class/dmi/id");
            std::fs::create_dir_all(&dmi).unwrap_or_else(|e| panic!("{}: {e}", dmi.display()));
            std::fs::write(dmi.join("product_uuid"), format!("{}\n", uuid.to_uppercase()))
                .unwrap_or_else(|e| panic!("{}: {e}", dmi.display()));
        }
        cmd.arg("--host-root").arg(root);
        Proc::spawn("hv-agent", &mut cmd, self.dir.join(format!("agent-{node}.log")))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Creates the Node `name` with this test's label and `annotations`, as
    /// a kubelet registers it, kept alive by kwok; answers once it is Ready.
    pub async fn create_node(&self, name: &str, annotations: &[(&str, &str)]) {
        let api: Api<Node> = Api::all(self.kube.client.clone());
        let labels = BTreeMap::from([
            ("hv-e2e".to_string(), self.id.clone()),
            (KWOK_MANAGED.0.to_string(), KWOK_MANAGED.1.to_string()),
        ]);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(labels),
                annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
        self.wait_node_ready(name, true).await;
    }

    /// Waits (up to 60 s) until the Node's `Ready` condition is `True`
    /// (`ready`) or not.
    pub async fn wait_node_ready(&self, name: &str, ready: bool) {
        let api: Api<Node> = Api::all(self.kube.client.clone());
        until(&format!("Node {name} Ready={ready}"), Duration::from_secs(60), String::new, || async {
            let node = api.get_opt(name).await.ok().flatten();
            let status = node
                .and_then(|n| n.status)
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
                .map(|c| c.status);
            if (status.as_deref() == Some("True")) == ready {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("Ready: {status:?}"))
            }
        })
        .await;
    }

    /// Upgrades the ground's release of the chart with Helm: its install
    /// values with `changes` merged in (JSON merge patch).
    pub fn upgrade_chart(&self, changes: &serde_json::Value) {
        let chart = &self.env.kube.chart;
        let text = std::fs::read_to_string(&chart.values)
            .unwrap_or_else(|e| panic!("{}: {e}", chart.values.display()));
        let mut values: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("chart values: {e}"));
        json_patch::merge(&mut values, changes);
        // One Helm upgrade of the release at a time (Helm refuses a second).
        static UPGRADES: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = UPGRADES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let file = self.dir.join("chart-values.json");
        std::fs::write(&file, values.to_string()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let out = Command::new(&chart.helm_python)
            .arg(crate::repo_root().join("tests/env/chart.py"))
            .arg(&self.env.kube.admin_kubeconfig)
            .args([&chart.namespace, &chart.release])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| panic!("helm: {e}"));
        assert!(out.status.success(), "helm upgrade: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// The Node's kubelet stops: kwok no longer renews its Lease, and the
    /// Node lifecycle controller turns it Unknown (12 s on the ground).
    /// Answers once it is not Ready.
    pub async fn kubelet_stops(&self, name: &str) {
        self.kwok_lets_go(name).await;
        self.wait_node_ready(name, false).await;
    }

    /// The Node's kubelet is back: kwok renews its Lease and sets it Ready.
    pub async fn kubelet_returns(&self, name: &str) {
        self.kwok_manages(name, true).await;
        self.wait_node_ready(name, true).await;
    }

    /// Whether kwok keeps the Node `name` alive (renews its Lease, sets it
    /// Ready). Off, nothing changes at once: the Node lifecycle controller
    /// turns it Unknown after its grace, or a test sets its condition.
    pub async fn kwok_manages(&self, name: &str, on: bool) {
        self.label_kwok(name, on).await;
    }

    /// kwok no longer keeps the Node `name` alive, made sure of: its Lease
    /// is seen unrenewed over a renewal or two (6 s at least).
    pub async fn kwok_lets_go(&self, name: &str) {
        self.label_kwok(name, false).await;
        // kwok may take a Node up again when a relist it read before the
        // label went away lands after (its lease controller then renews for
        // ever): a Lease still renewed a few renewals later is let go again.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let before = self.lease_renewed(name).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            if self.lease_renewed(name).await == before {
                return;
            }
            self.label_kwok(name, true).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.label_kwok(name, false).await;
        }
    }

    async fn label_kwok(&self, name: &str, on: bool) {
        let api: Api<Node> = Api::all(self.kube.client.clone());
        let value = on.then_some(KWOK_MANAGED.1);
        let patch = serde_json::json!({"metadata": {"labels": {KWOK_MANAGED.0: value}}});
        api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("Node {name}: {e}"));
    }

    /// The renewal time of the Node `name`'s Lease, as written.
    async fn lease_renewed(&self, name: &str) -> Option<String> {
        let api: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.kube.client.clone(), "kube-node-lease");
        let lease = api.get_opt(name).await.ok().flatten()?;
        lease.spec?.renew_time.map(|t| format!("{:?}", t.0))
    }

    /// The Hypervisor `name`, if it exists; a failed read fails the test.
    pub async fn hypervisor(&self, name: &str) -> Option<Hypervisor> {
        let api: Api<Hypervisor> = Api::all(self.kube.client.clone());
        api.get_opt(name).await.unwrap_or_else(|e| panic!("reading Hypervisor {name}: {e}"))
    }

    /// Waits for `name` to reach `phase`; on timeout fails with its status
    /// and the end of the coordinator's log.
    pub async fn wait_phase(&self, name: &str, phase: Phase, timeout: Duration, coord: &Proc) -> Hypervisor {
        crate::wait::until(
            &format!("{name} {}", phase.as_str()),
            timeout,
            || coord.tail(40),
            || async {
                match self.hypervisor(name).await {
                    Some(hv) if hv.status.as_ref().and_then(|s| s.phase) == Some(phase) => {
                        crate::wait::Poll::Ready(hv)
                    }
                    None => crate::wait::Poll::Pending("(no Hypervisor)".into()),
                    Some(hv) => crate::wait::Poll::Pending(hv.status.map_or("(no status yet)".into(), |s| {
                        serde_json::to_string_pretty(&s).unwrap_or_default()
                    })),
                }
            },
        )
        .await
    }

    /// Waits for condition `type_` of `name` to have `reason`; answers its message.
    pub async fn wait_condition(&self, name: &str, type_: &str, reason: &str, coord: &Proc) -> String {
        let what = format!("{name}: {type_} {reason}");
        crate::wait::until(
            &what,
            Duration::from_secs(60),
            || coord.tail(40),
            || async {
                let c = self.hypervisor(name).await.map(|h| Self::condition(&h, type_)).unwrap_or_default();
                if c.1 == reason {
                    crate::wait::Poll::Ready(c.2)
                } else {
                    crate::wait::Poll::Pending(format!("{c:?}"))
                }
            },
        )
        .await
    }

    /// An agent and a Node for each of `hosts`, once each is Active.
    pub async fn active_with_agents(&self, hosts: &[String], coord: &Proc, timeout: Duration) -> Vec<Proc> {
        let mut agents = Vec::new();
        for h in hosts {
            agents.push(self.agent(h, &AgentPeers::default()));
            self.create_node(h, &[]).await;
        }
        for h in hosts {
            self.wait_phase(h, Phase::Active, timeout, coord).await;
        }
        agents
    }

    /// Puts the zone's source host under this region as an Active node
    /// (skipTests, no agent) and boots servers of `flavors` on it, in the
    /// zone; answers the host name, the running coordinator and the server ids.
    pub async fn active_host_with(
        &self,
        admin: &crate::openstack::Admin,
        zone: &crate::hosts::Zone,
        flavors: &[&str],
        annotations: &[(&str, &str)],
    ) -> (String, Proc, Vec<String>) {
        let host = zone.source.host.clone();
        let coord = self.coordinator(None, &["--skip-tests"]);
        self.create_node(&host, annotations).await;
        self.wait_phase(&host, Phase::Active, Duration::from_secs(60), &coord).await;
        let mut ids = Vec::new();
        for (i, flavor) in flavors.iter().enumerate() {
            ids.push(zone.boot(admin, &format!("{}-{i}", self.id), &host, flavor).await);
        }
        (host, coord, ids)
    }

    /// Creates the Eviction `name` of `host` by hand.
    pub async fn create_eviction(
        &self,
        name: &str,
        host: &str,
        reason: EvictionReason,
        options: EvictionOptions,
    ) {
        let evs: Api<Eviction> = Api::all(self.kube.client.clone());
        let ev =
            Eviction::new(name, EvictionSpec { hypervisor: host.into(), reason, options, dry_run: false });
        evs.create(&PostParams::default(), &ev)
            .await
            .unwrap_or_else(|e| panic!("creating Eviction {name}: {e}"));
    }

    /// Every Eviction aimed at `host`, as the API server lists them.
    pub async fn evictions_of(&self, host: &str) -> Vec<Eviction> {
        let evs: Api<Eviction> = Api::all(self.kube.client.clone());
        let all = evs.list(&Default::default()).await.unwrap_or_else(|e| panic!("listing Evictions: {e}"));
        all.items.into_iter().filter(|e| e.spec.hypervisor == host).collect()
    }

    pub async fn eviction(&self, name: &str) -> Option<Eviction> {
        let evs: Api<Eviction> = Api::all(self.kube.client.clone());
        evs.get_opt(name).await.unwrap_or_else(|e| panic!("reading Eviction {name}: {e}"))
    }

    /// Waits for the Eviction `name` to reach `phase`.
    pub async fn wait_eviction(
        &self,
        name: &str,
        phase: EvictionPhase,
        timeout: Duration,
        coord: &Proc,
    ) -> Eviction {
        crate::wait::until(
            &format!("Eviction {name} {phase:?}"),
            timeout,
            || coord.tail(40),
            || async {
                let ev = self.eviction(name).await;
                let now = ev.as_ref().and_then(|e| e.status.as_ref()).and_then(|s| s.phase);
                match ev {
                    Some(e) if now == Some(phase) => crate::wait::Poll::Ready(e),
                    other => crate::wait::Poll::Pending(format!("{:?}", other.and_then(|e| e.status))),
                }
            },
        )
        .await
    }

    /// Every Migration object in this region's API.
    pub async fn migrations(&self) -> Vec<Migration> {
        let api: Api<Migration> = Api::all(self.kube.client.clone());
        api.list(&Default::default()).await.unwrap_or_else(|e| panic!("listing Migrations: {e}")).items
    }

    /// The Migration objects of one Eviction (one per attempt).
    pub async fn migrations_of(&self, eviction: &str) -> Vec<Migration> {
        self.migrations().await.into_iter().filter(|m| m.spec.eviction == eviction).collect()
    }

    /// `hvctl retry NODE`, the real binary, against this region's API.
    pub fn retry(&self, node: &str) -> String {
        let out = self.hvctl().args(["retry", node]).output().unwrap_or_else(|e| panic!("hvctl: {e}"));
        assert!(out.status.success(), "hvctl retry failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The Kubernetes Events about the object `name` since this region
    /// started (an earlier test's on a host reused are not this one's), as
    /// (reason, note).
    pub async fn events_for(&self, name: &str) -> Vec<(String, String)> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.kube.client.clone());
        let list = api.list(&Default::default()).await.unwrap_or_else(|e| panic!("listing Events: {e}"));
        let since = |e: &k8s_openapi::api::events::v1::Event| {
            let at = e.series.as_ref().map(|s| s.last_observed_time.0).or(e.event_time.as_ref().map(|t| t.0));
            at.or(e.metadata.creation_timestamp.as_ref().map(|t| t.0)).is_some_and(|t| t >= self.started)
        };
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(since)
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// The reason of a disable `host`'s Hypervisor recorded sending (its
    /// onboarding's, for a host onboarded while Nova had it enabled): what
    /// the coordinator owns in Nova, to leave behind by hand.
    pub async fn our_disable(&self, host: &str) -> String {
        let hv = self.hypervisor(host).await.unwrap_or_else(|| panic!("no Hypervisor {host}"));
        let recorded = hv.status.and_then(|s| s.lifecycle.disabled_as).unwrap_or_default();
        recorded.into_iter().next().unwrap_or_else(|| panic!("{host}: no disable of ours recorded"))
    }

    /// A condition of `hv` as (status, reason, message).
    pub fn condition(hv: &Hypervisor, type_: &str) -> (String, String, String) {
        let c = hv.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == type_).cloned());
        c.map(|c| (c.status, c.reason, c.message)).unwrap_or_default()
    }
}

/// An ovsdb-server of one test's own (userspace, unix socket), for a node
/// whose bridges a test breaks and mends without touching the ground's.
pub struct PrivateOvsdb {
    pub remote: String,
    _proc: Proc,
}

impl PrivateOvsdb {
    pub fn start(dir: &Path, bridges: &[&str]) -> Result<PrivateOvsdb, String> {
        let dir = dir.join("ovs");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let db = dir.join("conf.db");
        run(Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg("/usr/share/openvswitch/vswitch.ovsschema"))?;
        let sock = dir.join("db.sock");
        let mut cmd = Command::new("ovsdb-server");
        cmd.arg(&db)
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!("--unixctl={}", dir.join("ctl").display()))
            .arg("--no-chdir");
        let proc = Proc::spawn("ovsdb-server", &mut cmd, dir.join("ovsdb-server.log"))?;
        for _ in 0..100 {
            if sock.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if !sock.exists() {
            return Err(format!("private ovsdb-server made no socket {} within 5 s", sock.display()));
        }
        let me = PrivateOvsdb { remote: format!("unix:{}", sock.display()), _proc: proc };
        me.vsctl(&["init"])?;
        for br in bridges {
            me.add_bridge(br)?;
        }
        Ok(me)
    }

    pub fn vsctl(&self, args: &[&str]) -> Result<(), String> {
        run(Command::new("ovs-vsctl").arg(format!("--db={}", self.remote)).arg("--no-wait").args(args))
    }

    /// Adds a bridge; `br-int` in fail mode secure, as Neutron and OVN set it.
    pub fn add_bridge(&self, name: &str) -> Result<(), String> {
        // One transaction, as Neutron does: a br-int never seen standalone.
        if name == "br-int" {
            self.vsctl(&["add-br", name, "--", "set-fail-mode", name, "secure"])
        } else {
            self.vsctl(&["add-br", name])
        }
    }

    pub fn set_fail_mode(&self, bridge: &str, mode: &str) -> Result<(), String> {
        self.vsctl(&["set-fail-mode", bridge, mode])
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed: {}",
            cmd.get_args().collect::<Vec<_>>(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A Ceph client of one test's own with the given OSD caps; answers its
/// keyring. `set_caps` changes them later (the "fix").
pub fn ceph_client(env: &TestEnv, id: &str, osd_caps: &str, dir: &Path) -> Result<PathBuf, String> {
    let keyring = dir.join(format!("ceph.client.{id}.keyring"));
    run(ceph(env)
        .args(["auth", "get-or-create", &format!("client.{id}"), "mon", "profile rbd", "osd", osd_caps, "-o"])
        .arg(&keyring))?;
    Ok(keyring)
}

pub fn set_ceph_caps(env: &TestEnv, id: &str, osd_caps: &str) -> Result<(), String> {
    run(ceph(env).args(["auth", "caps", &format!("client.{id}"), "mon", "profile rbd", "osd", osd_caps]))
}

/// An entry in the cluster's OSD blocklist (`ceph osd blocklist add`, or
/// `range add` for a CIDR), removed when dropped and expiring after 5 min
/// anyway. Blocklisting `127.0.0.1:0/0` stops every Ceph client of the
/// ground: only a test binary where no other test uses Ceph meanwhile may
/// do it (test binaries run one after the other).
pub struct Blocklisted {
    env: TestEnv,
    args: Vec<String>,
}

impl Blocklisted {
    /// `entry` is `IP:port/nonce` or, with `range`, `IP/bits`.
    pub fn add(env: &TestEnv, entry: &str, range: bool) -> Result<Blocklisted, String> {
        let mut args = vec!["osd".to_string(), "blocklist".to_string()];
        if range {
            args.push("range".into());
        }
        run(ceph(env).args(&args).args(["add", entry, "300"]))?;
        args.extend(["rm".to_string(), entry.to_string()]);
        Ok(Blocklisted { env: env.clone(), args })
    }
}

impl Blocklisted {
    /// Lifts `entry` (`IP:port/nonce`) when dropped: for an entry the code
    /// under test adds.
    pub fn lift_later(env: &TestEnv, entry: &str) -> Blocklisted {
        let args = ["osd", "blocklist", "rm", entry].map(str::to_string).to_vec();
        Blocklisted { env: env.clone(), args }
    }
}

impl Drop for Blocklisted {
    fn drop(&mut self) {
        if let Err(e) = run(ceph(&self.env).args(&self.args)) {
            eprintln!("could not lift the blocklist entry ({e}); it expires within 5 min");
        }
    }
}

/// The cluster's OSD blocklist as the admin reads it: entry → expiry.
pub fn blocklist(env: &TestEnv) -> Result<std::collections::BTreeMap<String, String>, String> {
    let out = ceph(env).args(["osd", "dump", "-f", "json"]).output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("ceph osd dump: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let map: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    let list = map.get("blocklist").and_then(serde_json::Value::as_object).cloned().unwrap_or_default();
    Ok(list.into_iter().map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string())).collect())
}

fn ceph(env: &TestEnv) -> Command {
    let mut c = Command::new("ceph");
    c.arg("-c")
        .arg(&env.ceph.conf)
        .args(["--connect-timeout", "10", "-n", &format!("client.{}", env.ceph.admin.id), "--keyring"])
        .arg(&env.ceph.admin.keyring);
    c
}

/// A gRPC channel to `url` with the client certificate `tls`.
pub async fn connect(url: &str, tls: &TlsFiles) -> Result<tonic::transport::Channel, String> {
    let config = hv_tls::client::config(tls).map_err(|e| e.to_string())?;
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .tls_config(config)
        .map_err(|e| e.to_string())?;
    endpoint.connect().await.map_err(|e| hv_tls::explain(&e))
}

/// One sample `name` of the `/metrics` at `url`: None when it cannot be read
/// or does not have it.
/// A fake host tree under `dir` for the agent's health signals
/// (`--host-root`): `/` read-write, two idle CPUs, memory to spare. Kept
/// when it exists (a restarted agent finds the host as the test left it).
pub fn healthy_host(dir: &Path) -> PathBuf {
    let files = [
        ("proc/1/mounts", "/dev/vda1 / ext4 rw,relatime 0 0\n"),
        ("proc/loadavg", "0.10 0.10 0.10 1/100 1000\n"),
        ("proc/cpuinfo", "processor\t: 0\n\nprocessor\t: 1\n"),
        ("proc/meminfo", "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\n"),
    ];
    for (path, text) in files {
        let p = dir.join(path);
        if !p.exists() {
            std::fs::create_dir_all(p.parent().unwrap_or(dir))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            std::fs::write(&p, text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
    dir.to_path_buf()
}

/// One `hv-ceph-probe` of the ground's readable pool, as the ground's
/// node client from the fake host IP `ip`: its result for the pool.
pub fn ceph_probe_from(env: &TestEnv, ip: &str) -> serde_json::Value {
    let out = Command::new(bin("hv-ceph-probe"))
        .env("LD_PRELOAD", &env.source_ip_shim)
        .env("HV_TEST_SOURCE_IP", ip)
        .arg("--conf")
        .arg(&env.ceph.conf)
        .args(["--id", &env.ceph.client.id, "--pool", &env.ceph.readable_pool])
        .arg("--keyring")
        .arg(&env.ceph.client.keyring)
        .output()
        .unwrap_or_else(|e| panic!("hv-ceph-probe: {e}"));
    let all: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("hv-ceph-probe answered {out:?}: {e}"));
    all[0].clone()
}

/// A coordinator's `/readyz`: its HTTP status and text; None when it does
/// not answer.
pub async fn readyz(p: &Proc) -> Option<(u16, String)> {
    let url = p.metrics.as_deref()?.replace("/metrics", "/readyz");
    let rsp = reqwest::get(&url).await.ok()?;
    let code = rsp.status().as_u16();
    Some((code, rsp.text().await.ok()?.trim().to_string()))
}

/// A release of the chart a coordinator runs under: its namespace and
/// its ServiceAccount there.
#[derive(Clone, Debug)]
pub struct Install {
    pub namespace: String,
    pub account: String,
}

/// How many Pod objects the tests' coordinators take turns in
/// (`hv-coordinator-0` to `-63`): enough for every coordinator the tests run
/// at once.
pub const COORDINATOR_PODS: u32 = 64;

/// The label kwok manages Nodes by (taken away, the Node's "kubelet" stops).
pub const KWOK_MANAGED: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// Creates the coordinator Pod `namespace/name` as the administrator of
/// `kubeconfig`, from its own thread (callers may be inside a runtime that
/// must not block).
fn create_pod(kubeconfig: &Path, install: &Install, name: &str) {
    use k8s_openapi::api::core::v1::Pod;
    let (kubeconfig, namespace, name) =
        (kubeconfig.to_path_buf(), install.namespace.clone(), name.to_string());
    let account = install.account.clone();
    let made = std::thread::spawn(move || {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        rt.block_on(async {
            let client = crate::kube_target::client_from(&kubeconfig).await?;
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "hv-coordinator"}},
                // A process stands for it: no scheduler of that name binds it
                // to a Node.
                "spec": {"schedulerName": "hv-ground-process", "serviceAccountName": account,
                    "containers": [{"name": "coordinator", "image": "hv-coordinator"}]},
            }))
            .map_err(|e| e.to_string())?;
            let api = Api::<Pod>::namespaced(client, &namespace);
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let unlabel = serde_json::json!({"metadata": {"labels": {hv_coordinator::api::keys::LEADER_LABEL: null}}});
                    api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&unlabel))
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            }
        })
    })
    .join();
    match made {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("creating the coordinator's Pod: {e}"),
        Err(_) => panic!("creating the coordinator's Pod: the thread panicked"),
    }
}

pub async fn metric(url: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The sum of the samples at `url` whose line starts with `prefix` (a name
/// and the first of its labels, `hv_x_total{service="compute",`): 0 when
/// there is none, None when `/metrics` cannot be read.
pub async fn metric_sum(url: &str, prefix: &str) -> Option<f64> {
    let text = reqwest::get(url).await.ok()?.text().await.ok()?;
    let value = |l: &str| l.rsplit_once(' ').and_then(|(_, v)| v.trim().parse::<f64>().ok());
    Some(text.lines().filter(|l| l.starts_with(prefix)).filter_map(value).sum())
}

/// A log line without its ANSI colours.
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An escape sequence runs to its final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// How long the health helpers wait.
const HEALTH_SOON: Duration = Duration::from_secs(60);

/// Waits until the host's recorded health is such that `done`; answers it.
pub async fn wait_health_where(
    region: &Region,
    host: &str,
    what: &str,
    done: impl Fn(&HealthStatus) -> bool,
    coord: &Proc,
) -> HealthStatus {
    until(
        &format!("{host}: {what}"),
        HEALTH_SOON,
        || coord.tail(30),
        || async {
            match region.hypervisor(host).await.and_then(|h| h.status).and_then(|s| s.health) {
                Some(h) if done(&h) => Poll::Ready(h),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await
}

/// Waits until the host's evidence has a line starting with `line`.
pub async fn wait_evidence(region: &Region, host: &str, line: &str, coord: &Proc) -> HealthStatus {
    wait_health_where(region, host, line, |h| h.evidence.iter().any(|e| e.starts_with(line)), coord).await
}

/// Waits until the host's recorded health is `want`.
pub async fn wait_health(region: &Region, host: &str, want: HealthState, coord: &Proc) -> HealthStatus {
    wait_health_where(region, host, &want.to_string(), |h| h.state == want, coord).await
}

/// A host with a healthy fake /proc and its agent, Active under `coord`
/// (skipTests), judged Healthy. Answers the fake host's root and the agent.
pub async fn healthy_active(region: &Region, host: &str, coord: &Proc) -> (std::path::PathBuf, Proc) {
    healthy_active_with(region, host, coord, AgentPeers::default()).await
}

/// The same, the agent with `peers` (its fake /proc and /sys made here).
pub async fn healthy_active_with(
    region: &Region,
    host: &str,
    coord: &Proc,
    peers: AgentPeers,
) -> (std::path::PathBuf, Proc) {
    let root = healthy_host(&region.dir.join(format!("host-{host}")));
    let peers = AgentPeers { host_root: Some(root.clone()), ..peers };
    let agent = region.agent(host, &peers);
    region.create_node(host, &[("hypervisor.cloud.sap/skip-tests", "true")]).await;
    region.wait_phase(host, Phase::Active, HEALTH_SOON, coord).await;
    wait_health(region, host, HealthState::Healthy, coord).await;
    (root, agent)
}
