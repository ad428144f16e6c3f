//! The ground's fake Nova hosts, handed out to tests: no test names a host.
//!
//! A test claims a host and holds it until its claim is dropped: the claim
//! is an exclusive lock (flock) on a file in `$HV_ENV_DIR/hosts/`, held
//! through a file handle of the claim's own, so tests in parallel threads or
//! processes never share a host, and the kernel lets go of the claims of a
//! test process that crashed. The files are never removed: a lock on a
//! removed file would no longer exclude a claimant of a new file of the same
//! name. A claimed host is scrubbed of what an earlier test may have left on
//! it (servers, a zone). A test that deletes a host's compute service retires the host: it
//! is never handed out again on this ground.
//!
//! A test whose servers move (every eviction) claims a [`Zone`]: its own
//! hosts in an availability zone of their own, its servers booted into it.
//! Nova keeps a server in the zone it was booted into, so migrations land
//! only on the zone's hosts, never on another test's.
#![allow(clippy::panic)] // a test that gets no host fails

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::env::TestEnv;
use crate::openstack::Admin;

/// A host held by this test.
#[derive(Debug)]
pub struct Claim {
    pub host: String,
    /// The locked claim file; closing it (dropping the claim) frees the host.
    _lock: std::fs::File,
    retired: Option<PathBuf>,
}

impl Claim {
    /// Never hand this host out again (its compute service is gone or will be).
    pub fn retire(&self) {
        if let Some(r) = &self.retired {
            let _ = std::fs::write(r, std::process::id().to_string());
        }
    }
}

fn dir(env: &TestEnv) -> PathBuf {
    let d = env.dir.join("hosts");
    let _ = std::fs::create_dir_all(&d);
    d
}

/// Locks `file` for this claim when nobody holds it. The pid written into it
/// is for a reader of the directory; the lock alone decides.
fn take(file: &Path) -> Option<std::fs::File> {
    let mut f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(file).ok()?;
    f.try_lock().ok()?;
    let _ = f.set_len(0);
    let _ = std::io::Write::write_all(&mut f, std::process::id().to_string().as_bytes());
    Some(f)
}

/// Claims a free host that is not retired, scrubbed; waits for one up to
/// two minutes.
pub async fn claim(env: &TestEnv) -> Claim {
    let d = dir(env);
    for _ in 0..600 {
        for host in &env.nova.hosts {
            if is_retired(env, host) {
                continue;
            }
            let file = d.join(format!("{host}.claim"));
            if let Some(lock) = take(&file) {
                // Retired by the holder that just let go of it.
                if is_retired(env, host) {
                    continue;
                }
                let retired = Some(d.join(format!("{host}.retired")));
                let claim = Claim { host: host.clone(), _lock: lock, retired };
                scrub_kube(env, &claim.host).await;
                scrub(env, &claim.host).await;
                return claim;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no free Nova host on the ground within 2 minutes ({} hosts)", env.nova.hosts.len());
}

/// Names of the aggregates that are test zones.
pub const ZONE_PREFIX: &str = "hv-zone-";

/// What an earlier holder may have left on `host`: its servers, its place
/// in a test zone (Nova moves no host with servers between zones, so the
/// servers go first), and its compute service disabled (an eviction's source
/// stays disabled when its test ends first; Nova schedules nothing onto a
/// disabled host, not even a boot that names it). The service is enabled
/// and not forced down, as Nova registered it, its nova-compute running and
/// its BMC system powered on (a fencing test may have left any of them).
/// Best effort: a host Nova cannot reach keeps them.
async fn scrub(env: &TestEnv, host: &str) {
    // First, as Nova passes a change of the enabled status on to the host's
    // nova-compute and waits for it.
    if crate::openstack::stopped_fake_hosts(&env.nova).await.is_ok_and(|s| s.iter().any(|h| h == host)) {
        let _ = crate::openstack::fake_host(&env.nova, host, crate::openstack::FakeHost::Start).await;
    }
    let Ok(admin) = Admin::login(env).await else { return };
    // Enabled only once Nova counts nova-compute up (not forced down, and
    // reported since it started): Nova clears the provider's
    // COMPUTE_STATUS_DISABLED trait only through a live compute, so an
    // enable before that leaves the host unschedulable.
    // Nova refuses to lift forced_down while an evacuation off the host is
    // `done`, which only a starting nova-compute cleans up: one left running
    // by the earlier holder is restarted once, and the lift asked again.
    let mut restarted = false;
    for tried in 0..300 {
        let Ok(Some(svc)) = admin.service(host).await else { break };
        if svc["state"] == "up" && svc["forced_down"] != true {
            break;
        }
        if svc["forced_down"] == true {
            let lifted = admin.set_service(host, serde_json::json!({"forced_down": false})).await.is_ok();
            if !lifted && !restarted && tried >= 10 {
                // `start` on a running fake host restarts it.
                let _ = crate::openstack::fake_host(&env.nova, host, crate::openstack::FakeHost::Start).await;
                restarted = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = admin.set_service(host, serde_json::json!({"status": "enabled"})).await;
    // The scheduler skips a provider still marked disabled.
    for _ in 0..100 {
        if admin.traits_of(host).await.is_ok_and(|t| !t.iter().any(|t| t == "COMPUTE_STATUS_DISABLED")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = crate::bmc::power_on(env, host).await;
    // The standard traits tests give a provider (a host's capabilities, an
    // operator's by hand): one a failed test left would be taken for an
    // operator's by the next holder.
    let _ = admin.remove_traits(host, &["HW_NIC_SRIOV", "HW_NIC_VMDQ"]).await;
    let servers = admin.servers_on(host).await.unwrap_or_default();
    for id in &servers {
        let _ = admin.delete_server(id).await;
    }
    for _ in 0..150 {
        if admin.servers_on(host).await.map_or(true, |s| s.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (id, name, _, hosts) in admin.aggregates().await.unwrap_or_default() {
        if name.starts_with(ZONE_PREFIX) && hosts.iter().any(|h| h == host) {
            for _ in 0..50 {
                if admin.remove_from_aggregate(id, host).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// What an earlier holder left of `host` on the ground's API server: its
/// Node and Hypervisor, the Evictions aimed at it and the Migrations off it,
/// and the pods bound to it. The coordinator that set their finalizers is
/// gone: they are taken away, then each object is deleted and awaited (the
/// host's next Node must be a new one).
async fn scrub_kube(env: &TestEnv, host: &str) {
    use hv_coordinator::api::{Eviction, Hypervisor, Migration};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
    let client = match crate::kube_target::admin(env).await {
        Ok(t) => t.client,
        Err(e) => panic!("scrubbing {host}: {e}"),
    };
    let unfinalize = serde_json::json!({"metadata": {"finalizers": null}});
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let evs: Api<Eviction> = Api::all(client.clone());
    let migs: Api<Migration> = Api::all(client.clone());
    let pods: Api<Pod> = Api::all(client.clone());
    let evictions: Vec<String> = evs
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|e| e.spec.hypervisor == host)
                .filter_map(|e| e.metadata.name)
                .collect()
        })
        .unwrap_or_default();
    let migrations: Vec<String> = migs
        .list(&ListParams::default())
        .await
        .map(|l| {
            let ours = |m: &Migration| m.spec.source_host == host || evictions.contains(&m.spec.eviction);
            l.items.into_iter().filter(ours).filter_map(|m| m.metadata.name).collect()
        })
        .unwrap_or_default();
    let on_host = ListParams::default().fields(&format!("spec.nodeName={host}"));
    let bound: Vec<(String, String)> = pods
        .list(&on_host)
        .await
        .map(|l| {
            l.items.into_iter().filter_map(|p| Some((p.metadata.namespace?, p.metadata.name?))).collect()
        })
        .unwrap_or_default();
    let mut waits = Vec::new();
    for name in &evictions {
        let _ = evs.patch(name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await;
        let _ = evs.delete(name, &now).await;
        waits.push(Box::pin(gone(evs.clone(), name.clone()))
            as std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>);
    }
    for name in &migrations {
        let _ = migs.patch(name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await;
        let _ = migs.delete(name, &now).await;
    }
    for (ns, name) in &bound {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let _ = api.patch(name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await;
        let _ = api.delete(name, &now).await;
    }
    // The host's Hypervisors: by its name, or mapped to it (a Node named
    // `host.example.local`, or annotated with the Nova host); each with its Node.
    let hvs: Api<Hypervisor> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mapped = |h: &Hypervisor| {
        let recorded = h.status.as_ref().and_then(|s| s.lifecycle.nova_host.as_deref());
        h.spec.nova_host == host || recorded == Some(host)
    };
    let mut names: Vec<String> = hvs
        .list(&ListParams::default())
        .await
        .map(|l| l.items.into_iter().filter(mapped).filter_map(|h| h.metadata.name).collect())
        .unwrap_or_default();
    // A Node named after the host with a domain, mapped or not.
    let dotted = format!("{host}.");
    let named = |n: &String| n == host || n.starts_with(&dotted);
    names.extend(
        nodes
            .list(&ListParams::default())
            .await
            .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).filter(named).collect::<Vec<_>>())
            .unwrap_or_default(),
    );
    names.push(host.to_string());
    names.sort();
    names.dedup();
    for name in names {
        let _ = hvs.patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await;
        let _ = hvs.delete(&name, &now).await;
        let _ = nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&unfinalize)).await;
        let _ = nodes.delete(&name, &now).await;
        waits.push(Box::pin(gone(hvs.clone(), name.clone())));
        waits.push(Box::pin(gone(nodes.clone(), name)));
    }
    for w in waits {
        w.await;
    }
}

/// Waits (up to 60 s) until `name` is gone; a finalizer set meanwhile (by
/// a coordinator of the earlier holder's still stopping) is taken away.
async fn gone<K>(api: kube::Api<K>, name: String)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let unfinalize = serde_json::json!({"metadata": {"finalizers": null}});
    for _ in 0..300 {
        match api.get_opt(&name).await {
            Ok(None) => return,
            Ok(Some(_)) => {
                let patch = kube::api::Patch::Merge(&unfinalize);
                let _ = api.patch(&name, &kube::api::PatchParams::default(), &patch).await;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{name} left by an earlier test is still there after 60 s");
}

/// A source host and `targets`, claimed, in an availability zone of their
/// own (the targets enabled in Nova, ready to take servers).
#[derive(Debug)]
pub struct Zone {
    pub name: String,
    pub source: Claim,
    pub targets: Vec<Claim>,
}

/// Claims a zone with `targets` hosts to move servers to.
pub async fn zone(env: &TestEnv, targets: usize) -> Zone {
    let source = claim(env).await;
    let mut claimed = Vec::new();
    for _ in 0..targets {
        claimed.push(claim(env).await);
    }
    let admin = Admin::login(env).await.unwrap_or_else(|e| panic!("admin login: {e}"));
    // A zone of its own, never reused: no host of an earlier zone is in it.
    static ZONES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = ZONES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let stamp = jiff::Timestamp::now().as_millisecond();
    let name = format!("{ZONE_PREFIX}{stamp}-{}-{n}-{}", std::process::id(), source.host);
    let id = admin.create_zone(&name).await.unwrap_or_else(|e| panic!("zone {name}: {e}"));
    for host in std::iter::once(&source).chain(&claimed).map(|c| c.host.as_str()) {
        admin.add_to_aggregate(id, host).await.unwrap_or_else(|e| panic!("{host} into {name}: {e}"));
    }
    for t in &claimed {
        let enable = serde_json::json!({"status": "enabled"});
        admin.set_service(&t.host, enable).await.unwrap_or_else(|e| panic!("enabling {}: {e}", t.host));
    }
    Zone { name, source, targets: claimed }
}

impl Zone {
    /// Boots a server on `host` in this zone (it stays in the zone when it moves).
    pub async fn boot(&self, admin: &Admin, name: &str, host: &str, flavor: &str) -> String {
        admin
            .boot_in(name, host, flavor, Some(&self.name))
            .await
            .unwrap_or_else(|e| panic!("booting {name} on {host} in {}: {e}", self.name))
    }

    /// Whether `host` is one of this zone's.
    pub fn holds(&self, host: &str) -> bool {
        self.source.host == host || self.targets.iter().any(|t| t.host == host)
    }
}

/// Whether a test retired `host` on this ground.
pub fn is_retired(env: &TestEnv, host: &str) -> bool {
    dir(env).join(format!("{host}.retired")).exists()
}

/// `host`'s machine with no domain, for a test that needs it empty to the
/// last domain (libvirt's test driver runs its own `test` domain on every
/// host of the ground): its domains kept aside in `dir`, and put back as
/// they were (defined, started if they ran) when this is dropped.
pub struct WithoutDomains {
    uri: String,
    kept: Vec<(PathBuf, String, bool)>,
}

impl WithoutDomains {
    pub fn take(env: &TestEnv, host: &str, dir: &Path) -> WithoutDomains {
        let uri = env.libvirt.of(host).to_string();
        let virsh = |args: &[&str]| {
            let out = std::process::Command::new("virsh").arg("-c").arg(&uri).args(args).output();
            let out = out.unwrap_or_else(|e| panic!("virsh: {e}"));
            assert!(out.status.success(), "virsh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        // Kept as they go: a failure midway puts back what was taken.
        let mut taken = WithoutDomains { uri: uri.clone(), kept: Vec::new() };
        let names = virsh(&["list", "--all", "--name"]);
        // Nova's own (`instance-*`) are its servers': never taken.
        let names = names.lines().map(str::trim).filter(|n| !n.is_empty() && !n.starts_with("instance-"));
        for name in names {
            let file = dir.join(format!("domain-{host}-{name}.xml"));
            std::fs::write(&file, virsh(&["dumpxml", name]))
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            let running = virsh(&["domstate", name]).trim() == "running";
            if running {
                virsh(&["destroy", name]);
            }
            taken.kept.push((file, name.to_string(), running));
            virsh(&["undefine", name]);
        }
        taken
    }
}

impl Drop for WithoutDomains {
    fn drop(&mut self) {
        for (file, name, running) in &self.kept {
            let virsh = |args: &[&str]| {
                let _ = std::process::Command::new("virsh").arg("-c").arg(&self.uri).args(args).output();
            };
            virsh(&["define", &file.display().to_string()]);
            if *running {
                virsh(&["start", name]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::take;
    use std::sync::{Arc, Barrier};

    /// Claimants racing for one host: exactly one holds it, every round,
    /// until it lets go. (The earlier create-then-write claim lost this
    /// race: a claimant that read the file before its pid was written
    /// removed it as a dead holder's, and a third took the host too.)
    #[test]
    fn claimants_racing_for_one_host_never_share_it() {
        let dir = std::env::temp_dir().join(format!("hv-claims-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..100 {
            let file = dir.join(format!("host-{round}.claim"));
            let barrier = Arc::new(Barrier::new(8));
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let (file, barrier) = (file.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        let held = take(&file);
                        // Hold it while the others try.
                        barrier.wait();
                        held.is_some()
                    })
                })
                .collect();
            let winners =
                handles.into_iter().map(|h| h.join().is_ok_and(|got| got)).filter(|got| *got).count();
            assert_eq!(winners, 1, "round {round}: {winners} claimants hold the host");
            assert!(take(&file).is_some(), "free again once its holder let go");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
