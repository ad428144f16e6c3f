//! The validation checks of the Testing phase (docs/checks.md): libvirt
//! reachable, libvirt version, a domain can be defined and started, the
//! expected OVS bridges and their settings, each Ceph pool. Run for the coordinator's
//! RunChecks and by hand with `hv-agent checks`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hv_proto::v1::{CheckConfig, CheckResult};

use crate::ceph::CephClient;
use crate::libvirt::blocking::Lane;
use crate::libvirt::{CHECKS_FACTOR, Libvirt, LibvirtTarget, parse_version};
use crate::ovsdb;

/// Where the checks look.
#[derive(Clone, Debug)]
pub struct Endpoints {
    pub libvirt: LibvirtTarget,
    /// The lane the libvirt checks run in: a run while the last one still
    /// hangs fails at once instead of starting one more thread.
    pub libvirt_lane: Lane,
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
pub fn libvirt_checks(target: &LibvirtTarget, min_version: &str, start_domain: bool) -> Vec<Outcome> {
    let mut out = Vec::new();
    let mut conn = None;
    let uri = &target.uri;
    out.push(timed("libvirt-reachable".into(), || {
        let lv = Libvirt::connect(target).map_err(|e| e.to_string())?;
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

/// OVS checks: each expected bridge (present, and as the expectations
/// say), then each `external_ids` key the Open_vSwitch row must carry.
pub async fn ovs_checks(remote: &str, cfg: &CheckConfig) -> Vec<Outcome> {
    let t = Instant::now();
    let expectations: Vec<ovsdb::Expectation> = cfg.bridge_expectations.iter().map(Into::into).collect();
    let system_ids: BTreeMap<String, String> =
        cfg.ovs_external_ids.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let listed = async {
        let c = ovsdb::Client::connect(remote).await.map_err(|e| e.to_string())?;
        let bridges = c.bridges().await.map_err(|e| e.to_string())?;
        let ids = if system_ids.is_empty() {
            BTreeMap::new()
        } else {
            c.system_external_ids().await.map_err(|e| e.to_string())?
        };
        Ok::<_, String>((bridges, ids))
    };
    let ms = |t: Instant| t.elapsed().as_millis() as u64;
    match tokio::time::timeout(Duration::from_secs(10), listed).await {
        Ok(Ok((existing, ids))) => {
            let mut out: Vec<Outcome> =
                ovsdb::check_bridges(&existing, &cfg.bridges, &cfg.optional_bridges, &expectations)
                    .into_iter()
                    .map(|c| Outcome {
                        name: format!("ovs-bridge/{}", c.bridge),
                        passed: c.passed,
                        message: c.message,
                        duration_ms: ms(t),
                    })
                    .collect();
            for (key, want) in &system_ids {
                let one = BTreeMap::from([(key.clone(), want.clone())]);
                let wrong = ovsdb::external_id_mismatches("external_ids", &ids, &one);
                out.push(Outcome {
                    name: format!("ovs-external-id/{key}"),
                    passed: wrong.is_empty(),
                    message: match wrong.first() {
                        Some(w) => format!("Open_vSwitch {w}"),
                        None => format!(
                            "Open_vSwitch external_ids:{key} = {}",
                            ids.get(key).cloned().unwrap_or_default()
                        ),
                    },
                    duration_ms: ms(t),
                });
            }
            out
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => format!("OVSDB at {remote} did not answer within 10 s"),
            };
            let names = cfg
                .bridges
                .iter()
                .chain(&cfg.optional_bridges)
                .map(|b| format!("ovs-bridge/{b}"))
                .chain(system_ids.keys().map(|k| format!("ovs-external-id/{k}")));
            names
                .map(|name| Outcome { name, passed: false, message: why.clone(), duration_ms: ms(t) })
                .collect()
        }
    }
}

/// Every check the config asks for.
pub async fn run(ep: &Endpoints, cfg: &CheckConfig) -> Vec<Outcome> {
    let (target, min, start) = (ep.libvirt.clone(), cfg.min_libvirt_version.clone(), cfg.start_test_domain);
    // Starting a test domain under software emulation takes seconds; a
    // hung libvirtd, for ever.
    let deadline = ep.libvirt.deadline * CHECKS_FACTOR;
    let what = format!("libvirt at {}", ep.libvirt.uri);
    let mut out =
        match ep.libvirt_lane.run(&what, deadline, move || Ok(libvirt_checks(&target, &min, start))).await {
            Ok(outcomes) => outcomes,
            Err(message) => {
                vec![Outcome { name: "libvirt-reachable".into(), passed: false, message, duration_ms: 0 }]
            }
        };
    out.extend(ovs_checks(&ep.ovsdb_remote, cfg).await);
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
