//! Ceph RBD pool checks, run out of process.
//!
//! The checks need librados and librbd. They run in the `hv-ceph-probe`
//! helper (crate `ceph-probe/`, its FFI and safety argument live there),
//! which the agent spawns with a hard timeout: the long-lived agent never
//! loads those libraries (about 11 MiB resident, and their threads), and a
//! librados call that hangs cannot hang the agent. The helper's JSON on
//! stdout is the contract with [`PoolCheck`].

use std::path::{Path, PathBuf};
use std::time::Duration;

/// How the node reaches Ceph.
#[derive(Clone, Debug)]
pub struct CephClient {
    pub conf: PathBuf,
    /// Client id without the `client.` prefix.
    pub id: String,
    /// The client's keyring; the conf's default search path when None.
    pub keyring: Option<PathBuf>,
    pub timeout: Duration,
}

/// The result of checking one pool.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
pub struct PoolCheck {
    pub pool: String,
    pub passed: bool,
    pub message: String,
    pub latency: Duration,
    /// The OSDs refused the node's client as blocklisted (ESHUTDOWN).
    #[serde(default)]
    pub blocklisted: bool,
    /// The IPs the client reached the cluster from, as the cluster saw them.
    #[serde(default)]
    pub client_ips: Vec<String>,
}

/// Run the pool checks in `hv-ceph-probe`, killed after the client's
/// timeout plus a margin. Any failure of the helper is a failed check with
/// the reason, never a panic.
pub async fn check_pools_isolated(client: &CephClient, pools: &[String], probe: &Path) -> Vec<PoolCheck> {
    let fail = |message: String| -> Vec<PoolCheck> {
        pools
            .iter()
            .map(|p| PoolCheck {
                pool: p.clone(),
                passed: false,
                message: message.clone(),
                latency: Duration::ZERO,
                blocklisted: false,
                client_ips: Vec::new(),
            })
            .collect()
    };
    let mut cmd = tokio::process::Command::new(probe);
    cmd.arg("--conf").arg(&client.conf).arg("--id").arg(&client.id);
    if let Some(k) = &client.keyring {
        cmd.arg("--keyring").arg(k);
    }
    cmd.arg("--timeout-secs").arg(client.timeout.as_secs().max(1).to_string());
    for p in pools {
        cmd.arg("--pool").arg(p);
    }
    cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
    let limit = client.timeout + Duration::from_secs(5);
    match tokio::time::timeout(limit, cmd.output()).await {
        Err(_) => fail(format!("the Ceph probe did not finish within {} s", limit.as_secs())),
        Ok(Err(e)) => fail(format!("cannot run the Ceph probe {}: {e}", probe.display())),
        Ok(Ok(out)) => match serde_json::from_slice::<Vec<PoolCheck>>(&out.stdout) {
            Ok(v) => v,
            Err(e) => fail(format!(
                "the Ceph probe answered garbage ({e}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        },
    }
}

/// Where `hv-ceph-probe` is by default: next to the running binary.
pub fn default_probe() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("hv-ceph-probe")))
        .unwrap_or_else(|| PathBuf::from("hv-ceph-probe"))
}
