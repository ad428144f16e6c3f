//! The test ground's endpoints, typed.
//!
//! `make test-env-up` writes `.hv-env/env.json` (or `$HV_ENV_FILE`); this
//! module reads it. A test that needs a real peer calls [`require`]: on a
//! bare checkout it fails and says how to start the ground. It never skips.

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error(
        "the test ground is not up: {0} does not exist. Start it with `make test-env-up` \
         (or run `make test`, which brings it up, runs everything and takes it down)"
    )]
    Missing(PathBuf),
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error("{0} is not a valid test-ground file: {1}")]
    Parse(PathBuf, serde_json::Error),
}

#[derive(Debug, Clone, Deserialize)]
pub struct TestEnv {
    pub dir: PathBuf,
    pub libvirt: Libvirt,
    pub ovsdb: Ovsdb,
    pub ceph: Ceph,
    pub keystone: Keystone,
    pub nova: Nova,
    pub bmc: Bmc,
    pub kube: Kube,
    /// The preload that gives a process a fake host's own IP on loopback
    /// (tests/env/source_ip.c).
    pub source_ip_shim: PathBuf,
}

/// The Kubernetes control plane (tests/env/peers/kube.sh): etcd,
/// kube-apiserver, kube-controller-manager and kwok, with the chart installed.
#[derive(Debug, Clone, Deserialize)]
pub struct Kube {
    /// `https://127.0.0.1:PORT`
    pub url: String,
    /// The CA of the API server's certificate.
    pub ca_file: PathBuf,
    /// The ground's administrator (system:masters), for the tests' own reads
    /// and writes; never the coordinator's.
    pub admin_kubeconfig: PathBuf,
    /// The API server's audit log: every request of a ServiceAccount of the
    /// chart's namespace, one JSON event a line.
    pub audit_log: PathBuf,
    /// kubectl and the control plane's other binaries.
    pub bin_dir: PathBuf,
    /// etcd's client URL (`http://127.0.0.1:PORT`).
    pub etcd: String,
    pub chart: Chart,
}

/// The chart's release on the ground.
#[derive(Debug, Clone, Deserialize)]
pub struct Chart {
    pub release: String,
    pub namespace: String,
    /// The values it was installed with (JSON).
    pub values: PathBuf,
    /// The Python of the venv with Helm (tests/env/chart.py runs in it).
    pub helm_python: PathBuf,
    /// The coordinator's ServiceAccount, in `namespace`.
    pub coordinator_account: String,
}

impl Kube {
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// host:port of the API server, for a fault proxy's upstream.
    pub fn host_port(&self) -> String {
        self.url.trim_start_matches("https://").to_string()
    }
}

/// The Redfish BMC emulator: one system per fake compute host, powered on.
#[derive(Debug, Clone, Deserialize)]
pub struct Bmc {
    /// `https://127.0.0.1:PORT`
    pub url: String,
    /// The CA of its certificate (the ground's own).
    pub ca_file: PathBuf,
    pub username: String,
    pub password: String,
    /// Host name → the path of its ComputerSystem.
    pub systems: std::collections::BTreeMap<String, String>,
}

impl Bmc {
    /// The UUID of `host`'s system (its URL is by UUID).
    pub fn system_uuid(&self, host: &str) -> Option<String> {
        self.systems.get(host).and_then(|p| p.rsplit('/').next()).map(str::to_string)
    }

    /// The `redfish+https://` address of `host`'s system.
    pub fn address(&self, host: &str) -> String {
        let system = self.systems.get(host).map(String::as_str).unwrap_or("/redfish/v1/Systems/none");
        format!("redfish+{}{system}", self.url)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Libvirt {
    pub host: String,
    pub port: u16,
    /// libvirtd's own directory (readable by it; it runs as `nobody`).
    pub dir: PathBuf,
    /// The test driver: fake hosts and domains, full event support.
    pub test_uri: String,
    /// The QEMU driver (TCG) in session mode: real domains.
    pub qemu_session_uri: String,
    /// The same libvirtd over TLS with SASL.
    pub tls: LibvirtTls,
    /// Each fake Nova host's own libvirtd (its test driver's URI): the
    /// host's machine, calling itself by the host's name, with a domain
    /// for each server Nova runs there.
    pub hosts: std::collections::BTreeMap<String, String>,
}

impl Libvirt {
    /// The libvirt of the machine behind node `node`: a fake host's own
    /// when the node is named after it (or its short name is), else the
    /// shared one.
    pub fn of(&self, node: &str) -> &str {
        let short = node.split('.').next().unwrap_or(node);
        self.hosts.get(node).or_else(|| self.hosts.get(short)).map_or(&self.test_uri, String::as_str)
    }
}

/// libvirt over TLS (client certificate) with SASL (SCRAM-SHA-256) on top.
#[derive(Debug, Clone, Deserialize)]
pub struct LibvirtTls {
    /// `test+tls://localhost:PORT/default`
    pub uri: String,
    /// cacert.pem, clientcert.pem, clientkey.pem of an accepted client.
    pub pki_dir: PathBuf,
    /// The same with a client certificate from another CA.
    pub wrong_ca_pki_dir: PathBuf,
    pub sasl: SaslUser,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SaslUser {
    pub username: String,
    pub password: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Ovsdb {
    pub host: String,
    pub port: u16,
    /// `tcp:127.0.0.1:PORT`
    pub tcp: String,
    /// `unix:/path/db.sock`
    pub unix: String,
    /// Bridges the ground creates (br-int, br-ex).
    pub bridges: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Ceph {
    pub conf: PathBuf,
    pub fsid: String,
    pub mon_host: String,
    pub admin: CephClient,
    /// The restricted hypervisor client (`profile rbd` on the readable pool only).
    pub client: CephClient,
    /// The coordinator's fencing client: reads the maps, adds and lifts
    /// blocklist entries.
    pub fence: CephClient,
    pub readable_pool: String,
    pub forbidden_pool: String,
    /// An RBD image in the readable pool.
    pub image: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CephClient {
    pub id: String,
    pub keyring: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Keystone {
    /// `http://127.0.0.1:PORT/v3`
    pub auth_url: String,
    pub region: String,
    pub admin: Credentials,
    /// The identity the coordinator uses.
    pub coordinator: Credentials,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Credentials {
    pub username: String,
    pub password: String,
    pub project_name: String,
    pub user_domain_name: String,
    pub project_domain_name: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Nova {
    /// `http://127.0.0.1:PORT/v2.1`
    pub compute_url: String,
    pub placement_url: String,
    /// Fake compute hosts (nova-compute with the fake live-migration driver).
    pub hosts: Vec<String>,
    /// The region's control port: stop and start a fake host's nova-compute.
    pub control_url: String,
    pub compute_microversion: String,
    pub placement_microversion: String,
}

/// Where the ground's file is: `$HV_ENV_FILE`, else `.hv-env/env.json` in the checkout.
pub fn env_file() -> PathBuf {
    match std::env::var_os("HV_ENV_FILE") {
        Some(p) => PathBuf::from(p),
        None => crate::repo_root().join(".hv-env/env.json"),
    }
}

pub fn load_from(path: &Path) -> Result<TestEnv, EnvError> {
    if !path.exists() {
        return Err(EnvError::Missing(path.to_path_buf()));
    }
    let text = std::fs::read_to_string(path).map_err(|e| EnvError::Read(path.to_path_buf(), e))?;
    serde_json::from_str(&text).map_err(|e| EnvError::Parse(path.to_path_buf(), e))
}

pub fn load() -> Result<TestEnv, EnvError> {
    load_from(&env_file())
}

/// The ground, or a failed test that says how to start it.
#[allow(clippy::panic)] // failing the calling test is this function's purpose
pub fn require() -> TestEnv {
    match load() {
        Ok(env) => env,
        Err(e) => panic!("{e}"),
    }
}

impl TestEnv {
    /// A clouds.yaml with one cloud, `hv`, logging in as the coordinator's
    /// service user (with `password` instead of the real one, to test a
    /// rejection), reaching Keystone, Nova and Placement where `via` says
    /// (a fault proxy) instead of where the catalog says. Written into
    /// `dir` as `name`; answers its path.
    pub fn clouds_yaml_via(
        &self,
        dir: &Path,
        name: &str,
        password: Option<&str>,
        via: &Via,
    ) -> std::io::Result<PathBuf> {
        let ks = &self.keystone;
        let who = &ks.coordinator;
        let mut yaml = format!(
            "clouds:\n  hv:\n    region_name: {region}\n    interface: public\n    identity_api_version: 3\n    auth:\n      auth_url: {url}\n      username: {user}\n      password: {password}\n      project_name: {project}\n      user_domain_name: {udom}\n      project_domain_name: {pdom}\n",
            region = ks.region,
            url = via.keystone.as_ref().map_or(ks.auth_url.clone(), |u| format!("{u}/v3")),
            user = who.username,
            password = password.unwrap_or(&who.password),
            project = who.project_name,
            udom = who.user_domain_name,
            pdom = who.project_domain_name,
        );
        if let Some(u) = &via.compute {
            yaml.push_str(&format!("    compute_endpoint_override: {u}/v2.1\n"));
        }
        if let Some(u) = &via.placement {
            yaml.push_str(&format!("    placement_endpoint_override: {u}\n"));
        }
        std::fs::create_dir_all(dir)?;
        let path = dir.join(name);
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    /// The same, straight to the peers, as `clouds.yaml`.
    pub fn clouds_yaml(&self, dir: &Path, password: Option<&str>) -> std::io::Result<PathBuf> {
        self.clouds_yaml_via(dir, "clouds.yaml", password, &Via::default())
    }

    /// host:port of Keystone, Nova and Placement, for a fault proxy's upstream.
    pub fn upstreams(&self) -> Upstreams {
        let host_port =
            |url: &str| url.split("//").nth(1).and_then(|r| r.split('/').next()).unwrap_or("").to_string();
        Upstreams {
            keystone: host_port(&self.keystone.auth_url),
            compute: host_port(&self.nova.compute_url),
            placement: host_port(&self.nova.placement_url),
        }
    }
}

/// Where a coordinator reaches its peers instead of directly: base URLs
/// (`http://127.0.0.1:PORT`) of fault proxies.
#[derive(Clone, Debug, Default)]
pub struct Via {
    pub kube: Option<String>,
    pub keystone: Option<String>,
    pub compute: Option<String>,
    pub placement: Option<String>,
}

/// host:port of each OpenStack peer.
#[derive(Clone, Debug)]
pub struct Upstreams {
    pub keystone: String,
    pub compute: String,
    pub placement: String,
}
