//! The validation checks of the Testing phase (seed 000): libvirt reachable
//! over TCP, libvirt version, a domain can be defined and started, the
//! expected OVS bridges, each Ceph pool. Run for the coordinator's
//! RunChecks and by hand with `hv-agent checks`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use hv_proto::v1::{CheckConfig, CheckResult};

use crate::ceph::CephClient;
use crate::libvirt::{Libvirt, parse_version};
use crate::ovsdb;

/// Where the checks look.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub libvirt_uri: String,
    pub ovsdb_remote: String,
    pub ceph: Option<CephClient>,
    /// The `hv-ceph-probe` helper that runs the RBD checks out of process.
    pub ceph_probe: PathBuf,
}

/// One check, before it becomes a protocol message.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Outcome {
    pub name: String,
    pub passed: bool,
    pub message: String,
    pub duration_ms: u64,
}

impl Outcome {
    pub fn to_proto(&self) -> CheckResult {
        CheckResult {
            name: self.name.clone(),
            passed: self.passed,
            message: self.message.clone(),
            duration: Some(prost_types::Duration {
                seconds: (self.duration_ms / 1000) as i64,
                nanos: ((self.duration_ms % 1000) * 1_000_000) as i32,
            }),
            finished_at: Some(crate::backoff::timestamp_now()),
        }
    }
}

fn timed<F: FnOnce() -> Result<String, String>>(name: String, f: F) -> Outcome {
    let t = Instant::now();
    let r = f();
    let duration_ms = t.elapsed().as_millis() as u64;
    match r {
        Ok(message) => Outcome { name, passed: true, message, duration_ms },
        Err(message) => Outcome { name, passed: false, message, duration_ms },
    }
}

/// A minimal diskless domain: enough to prove the hypervisor can start a VM.
fn test_domain_xml(name: &str, domain_type: &str) -> String {
    format!(
        "<domain type='{domain_type}'><name>{name}</name><memory unit='MiB'>32</memory><vcpu>1</vcpu>\
         <os><type>hvm</type></os><features><acpi/></features>\
         <devices><console type='pty'/></devices></domain>"
    )
}

/// libvirt checks (blocking).
pub fn libvirt_checks(uri: &str, min_version: &str, start_domain: bool) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut conn = None;
    out.push(timed("libvirt-reachable".into(), || {
        let lv = Libvirt::open(uri).map_err(|e| e.to_string())?;
        let v = lv.lib_version().map_err(|e| e.to_string())?;
        conn = Some((lv, v.clone()));
        Ok(format!("{uri} answered (libvirt {v})"))
    }));
    let Some((lv, have)) = conn else {
        out.push(Outcome {
            name: "libvirt-version".into(),
            passed: false,
            message: "not checked: libvirt unreachable".into(),
            duration_ms: 0,
        });
        return out;
    };
    out.push(timed("libvirt-version".into(), || {
        let want = parse_version(min_version)
            .ok_or_else(|| format!("minimum version {min_version:?} is not major.minor.micro"))?;
        match parse_version(&have) {
            Some(h) if h >= want => Ok(format!("{have} >= {min_version}")),
            _ => Err(format!("libvirt {have} is older than the required {min_version}")),
        }
    }));
    if start_domain {
        out.push(timed("libvirt-domain-start".into(), || start_and_destroy(&lv)));
    }
    out
}

fn start_and_destroy(lv: &Libvirt) -> Result<String, String> {
    let kind = match lv.conn_type().as_deref() {
        Ok("TEST") => "test",
        _ => "qemu",
    };
    let name = format!("hv-check-{}", std::process::id());
    let dom = lv
        .connection()
        .define_domain_xml(&test_domain_xml(&name, kind))
        .map_err(|e| format!("defining a test domain: {e}"))?;
    let started = dom.create().map_err(|e| format!("starting test domain {name}: {e}"));
    let _ = dom.destroy();
    let undefined = dom.undefine().map_err(|e| format!("undefining test domain {name}: {e}"));
    started?;
    undefined?;
    Ok(format!("domain {name} ({kind}) defined, started, destroyed and undefined"))
}

/// OVS bridge checks.
pub async fn ovs_checks(remote: &str, bridges: &[String], optional: &[String]) -> Vec<Outcome> {
    let t = Instant::now();
    let listed = async {
        let c = ovsdb::Client::connect(remote).await.map_err(|e| e.to_string())?;
        c.bridges().await.map_err(|e| e.to_string())
    };
    match tokio::time::timeout(Duration::from_secs(10), listed).await {
        Ok(Ok(existing)) => ovsdb::check_bridges(&existing, bridges, optional)
            .into_iter()
            .map(|c| Outcome {
                name: format!("ovs-bridge/{}", c.bridge),
                passed: c.passed,
                message: c.message,
                duration_ms: t.elapsed().as_millis() as u64,
            })
            .collect(),
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => format!("OVSDB at {remote} did not answer within 10 s"),
            };
            bridges
                .iter()
                .chain(optional)
                .map(|b| Outcome {
                    name: format!("ovs-bridge/{b}"),
                    passed: false,
                    message: why.clone(),
                    duration_ms: t.elapsed().as_millis() as u64,
                })
                .collect()
        }
    }
}

/// Every check the config asks for.
pub async fn run(ep: &Endpoints, cfg: &CheckConfig) -> Vec<Outcome> {
    let (uri, min, start) = (ep.libvirt_uri.clone(), cfg.min_libvirt_version.clone(), cfg.start_test_domain);
    let mut out =
        tokio::task::spawn_blocking(move || libvirt_checks(&uri, &min, start)).await.unwrap_or_else(|e| {
            vec![Outcome {
                name: "libvirt-reachable".into(),
                passed: false,
                message: format!("check crashed: {e}"),
                duration_ms: 0,
            }]
        });
    out.extend(ovs_checks(&ep.ovsdb_remote, &cfg.bridges, &cfg.optional_bridges).await);
    if !cfg.ceph_pools.is_empty() {
        let pools = cfg.ceph_pools.clone();
        match ep.ceph.clone() {
            Some(client) => {
                let checks = crate::ceph::check_pools_isolated(&client, &pools, &ep.ceph_probe).await;
                out.extend(checks.into_iter().map(|c| Outcome {
                    name: format!("ceph-pool/{}", c.pool),
                    passed: c.passed,
                    message: c.message,
                    duration_ms: c.latency.as_millis() as u64,
                }));
            }
            None => out.extend(cfg.ceph_pools.iter().map(|p| Outcome {
                name: format!("ceph-pool/{p}"),
                passed: false,
                message: "no Ceph client configured (--ceph-conf, --ceph-id)".into(),
                duration_ms: 0,
            })),
        }
    }
    out
}

/// The table `hv-agent checks` prints.
pub fn table(outcomes: &[Outcome]) -> String {
    let w = outcomes.iter().map(|o| o.name.len()).max().unwrap_or(5).max(5);
    let mut s = format!("{:<w$}  {:<6}  {:>8}  {}\n", "CHECK", "RESULT", "TIME", "MESSAGE");
    for o in outcomes {
        let result = if o.passed { "pass" } else { "FAIL" };
        s.push_str(&format!("{:<w$}  {:<6}  {:>6}ms  {}\n", o.name, result, o.duration_ms, o.message));
    }
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    s.push_str(&format!("{} checks, {} failed\n", outcomes.len(), failed));
    s
}

/// Default Ceph paths on a hypervisor.
pub fn default_keyring(id: &str) -> PathBuf {
    PathBuf::from(format!("/etc/ceph/ceph.client.{id}.keyring"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_marks_failures_and_counts() {
        let t = table(&[
            Outcome { name: "libvirt-reachable".into(), passed: true, message: "ok".into(), duration_ms: 3 },
            Outcome {
                name: "ovs-bridge/br-ex".into(),
                passed: false,
                message: "bridge br-ex does not exist".into(),
                duration_ms: 1,
            },
        ]);
        assert!(t.contains("FAIL") && t.contains("2 checks, 1 failed"), "{t}");
    }

    #[test]
    fn proto_duration() {
        let p =
            Outcome { name: "x".into(), passed: true, message: String::new(), duration_ms: 1500 }.to_proto();
        let d = p.duration.unwrap_or_default();
        assert_eq!((d.seconds, d.nanos), (1, 500_000_000));
    }
}
