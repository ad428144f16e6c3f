//! Fencing a host's storage: its Ceph client addresses blocklisted, so a
//! half-dead host can no longer read or write a block of its VMs' images.
//!
//! The librados calls run in the `hv-ceph-fence` helper (crate
//! `ceph-probe/`), spawned with a hard timeout, as the agent runs its probe:
//! the coordinator never loads librados, and a hung monitor cannot hang it.
//! The helper adds or lifts the entries and reads the blocklist back; a step
//! counts only when every entry asked is listed (or, lifted, none is).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// How the coordinator reaches Ceph to fence.
#[derive(Clone, Debug)]
pub struct CephFence {
    pub helper: PathBuf,
    pub conf: PathBuf,
    /// Client id without `client.`; it needs `mon 'allow r, allow command "osd blocklist"'`.
    pub id: String,
    pub keyring: Option<PathBuf>,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CephFenceError {
    #[error("{0:?} is not a Ceph client address (IP, IP:port/nonce)")]
    BadAddress(String),
    #[error("cannot run the Ceph fencing helper {helper}: {message}")]
    Helper { helper: String, message: String },
    #[error("the Ceph fencing helper did not finish within {0} s")]
    Timeout(u64),
    #[error("Ceph refused: {0}")]
    Refused(String),
    #[error("the Ceph fencing helper answered garbage: {0}")]
    Garbled(String),
    #[error("read back, the blocklist {0}")]
    NotConfirmed(String),
}

/// The blocklist entry for one address: a bare IP covers every client of
/// that host (`IP:0/0`); `IP:port/nonce` is one client instance. Pure.
pub fn entry_for(address: &str) -> Result<String, CephFenceError> {
    let bad = || CephFenceError::BadAddress(address.to_string());
    let a = address.trim();
    let bare = a.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(a);
    // No host's client is at an unspecified or multicast address: a typo
    // that would fence nothing, or everything.
    let usable = |ip: &IpAddr| !ip.is_unspecified() && !ip.is_multicast();
    if let Ok(ip) = bare.parse::<IpAddr>() {
        if !usable(&ip) {
            return Err(bad());
        }
        return Ok(match ip {
            IpAddr::V4(v4) => format!("{v4}:0/0"),
            IpAddr::V6(v6) => format!("[{v6}]:0/0"),
        });
    }
    let (host_port, nonce) = a.rsplit_once('/').ok_or_else(bad)?;
    let (host, port) = host_port.rsplit_once(':').ok_or_else(bad)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let ip: IpAddr = host.parse().ok().filter(usable).ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let nonce: u64 = nonce.parse().map_err(|_| bad())?;
    Ok(match ip {
        IpAddr::V4(v4) => format!("{v4}:{port}/{nonce}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}/{nonce}"),
    })
}

impl CephFence {
    /// Blocklists every address, confirmed by reading the blocklist back.
    /// Idempotent: an entry listed already is listed again.
    pub async fn blocklist(&self, addresses: &[String]) -> Result<Vec<String>, CephFenceError> {
        if addresses.is_empty() {
            return Err(CephFenceError::BadAddress("(no address)".into()));
        }
        let entries = addresses.iter().map(|a| entry_for(a)).collect::<Result<Vec<_>, _>>()?;
        let listed = self.run("add", &entries).await?;
        let missing: Vec<&String> = entries.iter().filter(|e| !listed.contains(e)).collect();
        if missing.is_empty() {
            Ok(entries)
        } else {
            Err(CephFenceError::NotConfirmed(format!("lacks {missing:?}")))
        }
    }

    /// Lifts every address's entry, confirmed by reading the blocklist back.
    pub async fn lift(&self, addresses: &[String]) -> Result<(), CephFenceError> {
        let entries = addresses.iter().map(|a| entry_for(a)).collect::<Result<Vec<_>, _>>()?;
        let listed = self.run("rm", &entries).await?;
        if listed.is_empty() {
            Ok(())
        } else {
            Err(CephFenceError::NotConfirmed(format!("still holds {listed:?}")))
        }
    }

    async fn run(&self, op: &str, entries: &[String]) -> Result<Vec<String>, CephFenceError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        let mut cmd = tokio::process::Command::new(&self.helper);
        cmd.arg("--conf").arg(&self.conf).arg("--id").arg(&self.id);
        if let Some(k) = &self.keyring {
            cmd.arg("--keyring").arg(k);
        }
        cmd.arg("--timeout-secs").arg(self.timeout.as_secs().max(1).to_string()).arg(op).args(entries);
        cmd.kill_on_drop(true).stdin(std::process::Stdio::null());
        let limit = self.timeout * 2 + Duration::from_secs(5);
        let out = match tokio::time::timeout(limit, cmd.output()).await {
            Err(_) => return Err(CephFenceError::Timeout(limit.as_secs())),
            Ok(Err(e)) => {
                let helper = self.helper.display().to_string();
                return Err(CephFenceError::Helper { helper, message: e.to_string() });
            }
            Ok(Ok(out)) => out,
        };
        answer(&out.stdout, &out.stderr)
    }
}

/// The helper's answer: the entries listed, or Ceph's refusal. Pure.
pub fn answer(stdout: &[u8], stderr: &[u8]) -> Result<Vec<String>, CephFenceError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        listed: Option<Vec<String>>,
        error: Option<String>,
    }
    let garbled =
        |why: String| CephFenceError::Garbled(format!("{why}: {}", String::from_utf8_lossy(stderr).trim()));
    let a: Answer = serde_json::from_slice(stdout).map_err(|e| garbled(e.to_string()))?;
    match (a.listed, a.error) {
        (_, Some(e)) => Err(CephFenceError::Refused(e)),
        (Some(listed), None) => Ok(listed),
        (None, None) => Err(garbled("neither listed nor error".into())),
    }
}

/// Where `hv-ceph-fence` is by default: next to the running binary.
pub fn default_helper() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("hv-ceph-fence")))
        .unwrap_or_else(|| PathBuf::from("hv-ceph-fence"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_covers_the_host_an_instance_address_one_client_and_anything_else_is_refused() {
        assert_eq!(entry_for("10.0.0.5").unwrap(), "10.0.0.5:0/0");
        assert_eq!(entry_for(" 10.0.0.5:6800/42 ").unwrap(), "10.0.0.5:6800/42");
        assert_eq!(entry_for("::1").unwrap(), "[::1]:0/0");
        assert_eq!(entry_for("[fd00::5]:0/7").unwrap(), "[fd00::5]:0/7");
        for bad in [
            "",
            "compute-1",
            "10.0.0.5:6800",
            "10.0.0.256",
            "10.0.0.5:x/1",
            "10.0.0.5:0/-1",
            "a; rm -rf /",
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "0.0.0.0:6800/1",
        ] {
            assert_eq!(entry_for(bad), Err(CephFenceError::BadAddress(bad.to_string())), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn no_address_is_no_fencing_and_nothing_runs() {
        let fence = CephFence {
            helper: "/nonexistent/hv-ceph-fence".into(),
            conf: "/nonexistent/ceph.conf".into(),
            id: "hv-fence".into(),
            keyring: None,
            timeout: Duration::from_secs(1),
        };
        assert!(matches!(fence.blocklist(&[]).await, Err(CephFenceError::BadAddress(_))));
    }

    #[test]
    fn the_helpers_answer_is_read_strictly() {
        assert_eq!(answer(br#"{"listed": ["10.0.0.5:0/0"]}"#, b""), Ok(vec!["10.0.0.5:0/0".to_string()]));
        assert_eq!(
            answer(br#"{"error": "osd blocklist add x: Permission denied"}"#, b""),
            Err(CephFenceError::Refused("osd blocklist add x: Permission denied".into()))
        );
        assert!(
            matches!(answer(b"", b"segfault"), Err(CephFenceError::Garbled(m)) if m.contains("segfault"))
        );
        assert!(matches!(answer(b"{}", b""), Err(CephFenceError::Garbled(_))));
    }
}
