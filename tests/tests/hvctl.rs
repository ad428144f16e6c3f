//! An SRE's day with `hvctl` and `kubectl` on the real peers (docs/hvctl.md):
//! reading the fleet as a table, JSON or YAML; `why` a host is out of
//! service; a dry run that prints the preflight's own findings and moves
//! nothing; maintenance set and cleared; an eviction by hand and its VMs;
//! `watch` showing health and eviction progress; the summary `Ready`
//! condition that `kubectl wait` reads; the printer columns and short
//! names; and the Events on Evictions, Migrations and the Node. Exit codes
//! are checked against docs/hvctl.md's table.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hv_coordinator::api::{Eviction, EvictionPhase, Hypervisor, Phase};
use hv_tests::hosts;
use hv_tests::openstack::Admin;
use hv_tests::region::{Region, healthy_active};
use hv_tests::wait::{ready_when, until};
use kube::Api;
use kube::api::{Patch, PatchParams};

const SOON: Duration = Duration::from_secs(120);

fn run(region: &Region, args: &[&str]) -> (i32, String, String) {
    let out: Output = region.hvctl().args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn kubectl(region: &Region, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(region.env.kube.kubectl())
        .arg("--kubeconfig")
        .arg(&region.kubeconfig)
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `hvctl watch NODE` running, with the lines it printed so far.
fn watching(region: &Region, node: &str) -> (std::process::Child, Arc<Mutex<Vec<String>>>) {
    let mut child =
        region.hvctl().args(["watch", node]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (out, seen) = (child.stdout.take().unwrap(), lines.clone());
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            seen.lock().unwrap().push(line);
        }
    });
    (child, lines)
}

/// The Preflight condition of `ev` as hvctl prints it.
fn preflight_line(ev: &Eviction) -> String {
    let c = ev.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    format!("{} {} ({}): {}", c.type_, c.status, c.reason, c.message)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_prints_the_preflight_it_records_and_moves_nothing() {
    let region = Region::start("hvctl-dry").await;
    let zone = hosts::zone(&region.env, 1).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let id = region.id.clone();
    let host = zone.source.host.clone();
    let coord = region.coordinator(None, &[]);
    let (_root, _agent) = healthy_active(&region, &host, &coord).await;
    let plain = zone.boot(&admin, &format!("{id}-plain"), &host, "1").await;
    let required = serde_json::json!({"trait:CUSTOM_HV_NOWHERE": "required"});
    let nowhere = admin.create_flavor(&format!("dry-trait-{id}"), 512, required).await.unwrap();
    // The host alone carries the trait the stuck server's flavor requires.
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let traits = serde_json::json!({"spec": {"customTraits": ["CUSTOM_HV_NOWHERE"]}});
    hvs.patch(&host, &PatchParams::default(), &Patch::Merge(&traits)).await.unwrap();
    until(
        "the host's trait in Placement",
        SOON,
        || coord.tail(20),
        || async {
            let traits = admin.traits_of(&host).await.unwrap();
            ready_when(traits.iter().any(|t| t == "CUSTOM_HV_NOWHERE"), traits)
        },
    )
    .await;
    let stuck = zone.boot(&admin, &format!("{id}-stuck"), &host, &nowhere).await;

    // Some VM cannot move: exit 3, the finding named, and the plan the
    // coordinator recorded is what is printed.
    let (code, out, err) = run(&region, &["evict", &host, "--dry-run", "--keep"]);
    assert_eq!(code, 3, "{out}\n{err}");
    let kept = region.evictions_of(&host).await;
    assert_eq!(kept.len(), 1, "the kept dry run only");
    let ev = &kept[0];
    assert!(ev.spec.dry_run);
    assert_eq!(ev.status.as_ref().and_then(|s| s.phase), Some(EvictionPhase::Planned));
    assert!(out.starts_with(&preflight_line(ev)), "{out}");
    let row = |vm: &str| out.lines().find(|l| l.starts_with(vm)).unwrap_or_default().to_string();
    assert!(row(&stuck).contains("constraints:") && row(&stuck).contains("CUSTOM_HV_NOWHERE"), "{out}");
    assert!(row(&plain).contains(&zone.targets[0].host), "{out}");
    // As JSON: the Eviction as recorded.
    let (code, json, _) = run(&region, &["evict", &host, "--dry-run", "-o", "json"]);
    assert_eq!(code, 3);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["status"]["phase"], "Planned");
    assert_eq!(v["status"]["preflight"].as_array().map(Vec::len), Some(2), "{json}");

    // Nothing was disabled or moved, and only the kept dry run is left.
    let hv = region.hypervisor(&host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
    assert_eq!(Region::condition(&hv, "SchedulingEnabled").0, "True");
    assert_eq!(admin.service(&host).await.unwrap().unwrap()["status"], "enabled");
    for s in [&plain, &stuck] {
        assert!(admin.migrations_of(s).await.unwrap().is_empty(), "{s} was migrated");
    }
    assert_eq!(region.evictions_of(&host).await.len(), 1, "a dry run not kept is deleted");

    // Once the stuck one is gone, every VM can move: exit 0.
    admin.delete_server(&stuck).await.unwrap();
    let out = until(
        "a dry run that passes",
        SOON,
        || coord.tail(20),
        || async {
            let (code, out, err) = run(&region, &["evict", &host, "--dry-run"]);
            ready_when(code == 0, format!("{out}{err}"))
        },
    )
    .await;
    assert!(out.starts_with("Preflight True (Passed)"), "{out}");
    drop(coord);
    admin.delete_server(&plain).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_sres_day_maintenance_why_watch_evictions_and_kubectl() {
    let region = Region::start("hvctl-day").await;
    let zone = hosts::zone(&region.env, 1).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = zone.source.host.clone();
    let coord = region.coordinator(None, &[]);
    let (_root, _agent) = healthy_active(&region, &host, &coord).await;
    let vm = zone.boot(&admin, &format!("{}-0", region.id), &host, "1").await;

    // In service: Ready for kubectl wait, and for hvctl.
    let (code, _, err) =
        kubectl(&region, &["wait", "--for=condition=Ready", &format!("hypervisor/{host}"), "--timeout=60s"]);
    assert_eq!(code, 0, "{err}");
    let (_, table, _) = kubectl(&region, &["get", "hv", &host]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert!(header.contains(&"HEALTH") && header.contains(&"REASON"), "{table}");
    assert!(table.contains("Healthy") && table.contains("InService"), "{table}");
    let (_, names, _) =
        kubectl(&region, &["api-resources", "--api-group=hypervisor.cloud.sap", "--no-headers"]);
    let eviction = names.lines().find(|l| l.starts_with("evictions")).unwrap_or_default();
    assert_eq!(eviction.split_whitespace().nth(1), Some("hvev"), "no core short name: {names}");
    let (code, why, _) = run(&region, &["why", &host]);
    assert_eq!((code, why.lines().next()), (0, Some(format!("{host}: in service (Active)").as_str())));
    let (code, health, _) = run(&region, &["health", &host]);
    assert_eq!((code, health.trim()), (0, format!("node/{host}: SERVING").as_str()));

    // Reading as a table, as JSON and as YAML.
    let (_, list, _) = run(&region, &["list"]);
    let row = list.lines().find(|l| l.starts_with(host.as_str())).unwrap_or_default();
    assert_eq!(row.split_whitespace().collect::<Vec<_>>()[1..3], ["Active", "Healthy"], "{list}");
    let (_, json, _) = run(&region, &["list", "-o", "json", "--phase", "Active"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["items"].as_array().unwrap().iter().any(|h| h["metadata"]["name"] == host.as_str()));
    let (_, yaml, _) = run(&region, &["get", &host, "-o", "yaml"]);
    let v: serde_json::Value = serde_norway::from_str(&yaml).unwrap();
    assert_eq!(v["status"]["phase"], "Active");

    // Maintenance, followed by watch, why and evictions.
    let (mut watch, watched) = watching(&region, &host);
    until("the watch's first line", SOON, String::new, || async {
        let lines = watched.lock().unwrap().clone();
        ready_when(!lines.is_empty(), lines)
    })
    .await;
    let (code, out, err) = run(&region, &["maintenance", "set", &host, "--reason", "firmware, by hvctl"]);
    assert_eq!(code, 0, "{out}{err}");
    region.wait_phase(&host, Phase::Maintenance, SOON, &coord).await;
    let (code, why, _) = run(&region, &["why", &host]);
    assert_eq!(code, 3, "{why}");
    assert!(why.starts_with(&format!("{host}: not in service: InMaintenance")), "{why}");
    assert!(why.contains("hvctl maintenance clear"), "{why}");
    let (code, health, _) = run(&region, &["health", &host]);
    assert_eq!((code, health.trim()), (3, format!("node/{host}: NOT_SERVING").as_str()));
    let (_, evs, _) = run(&region, &["evictions", &host]);
    let vm_row = evs.lines().find(|l| l.trim_start().starts_with(vm.as_str())).unwrap_or_default();
    assert!(vm_row.contains("Migrated") && vm_row.contains(&zone.targets[0].host), "{evs}");
    watch.kill().unwrap();
    let _ = watch.wait();
    let watched = watched.lock().unwrap().join("\n");
    assert!(watched.contains("Active      -> Evicting"), "{watched}");
    assert!(watched.contains("Migrating: 0/1 moved, 1 in flight"), "{watched}");
    assert!(watched.contains("Succeeded: 1/1 moved"), "{watched}");

    // Events on the Eviction, its Migration and the Node.
    let ev = region.evictions_of(&host).await.into_iter().next().unwrap();
    let ev_name = kube::ResourceExt::name_any(&ev);
    let on_eviction: Vec<String> = region.events_for(&ev_name).await.into_iter().map(|e| e.0).collect();
    assert!(
        on_eviction.contains(&"EvictionStarted".into()) && on_eviction.contains(&"EvictionSucceeded".into())
    );
    let migration = region.migrations_of(&ev_name).await.into_iter().next().unwrap();
    let on_migration = region.events_for(&kube::ResourceExt::name_any(&migration)).await;
    assert!(
        on_migration.iter().any(|(r, n)| r == "MigrationCompleted" && n.contains(&zone.targets[0].host)),
        "{on_migration:?}"
    );
    let (_, described, _) = kubectl(&region, &["describe", "node", &host]);
    assert!(described.contains("EvictionSucceeded"), "{described}");

    // Back into service.
    let (code, _, _) = run(&region, &["maintenance", "clear", &host]);
    assert_eq!(code, 0);
    region.wait_phase(&host, Phase::Active, SOON, &coord).await;

    // An eviction by hand: the host is empty now, so it succeeds at once.
    let (code, made, err) = run(&region, &["evict", &host]);
    assert_eq!(code, 0, "{err}");
    let name = made.split_whitespace().next().unwrap().trim_start_matches("eviction/").to_string();
    region.wait_eviction(&name, EvictionPhase::Succeeded, SOON, &coord).await;
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    assert_eq!(evs.get(&name).await.unwrap().spec.reason.as_str(), "AdminRequest");
    let (_, all, _) = run(&region, &["evictions"]);
    assert!(all.lines().any(|l| l.starts_with(&name) && l.contains("Succeeded")), "{all}");
    drop(coord);
    admin.delete_server(&vm).await.unwrap();
}

/// The coordinator writes a Hypervisor often (a new version each time):
/// an SRE's maintenance is written again over the new version, as long as
/// nobody else changed the maintenance itself.
#[tokio::test(flavor = "multi_thread")]
async fn maintenance_is_set_and_cleared_while_the_hypervisor_keeps_changing() {
    use hv_coordinator::api::HypervisorSpec;
    use kube::api::PostParams;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    let region = Region::start("hvctl-busy").await;
    let name = format!("{}-busy", region.id);
    let api: Api<Hypervisor> = Api::all(region.kube.client.clone());
    api.create(&PostParams::default(), &Hypervisor::new(&name, HypervisorSpec::default())).await.unwrap();
    // Another writer, a write every 20 ms (a coordinator writes a few a second).
    let (stop, writes) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU32::new(0)));
    let writer = {
        let (api, name, stop, writes) = (api.clone(), name.clone(), stop.clone(), writes.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = writes.fetch_add(1, Ordering::Relaxed);
                let tick =
                    serde_json::json!({"metadata": {"annotations": {"example.com/tick": n.to_string()}}});
                let _ = api.patch(&name, &PatchParams::default(), &Patch::Merge(&tick)).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    for round in 0..20 {
        let args: &[&str] = if round % 2 == 0 {
            &["maintenance", "set", &name, "--mode", "manual", "--reason", "firmware"]
        } else {
            &["maintenance", "clear", &name]
        };
        let region = &region;
        let (code, out, err) = tokio::task::block_in_place(|| run(region, args));
        assert_eq!(code, 0, "round {round}: {out}{err}");
        let spec = api.get(&name).await.unwrap().spec;
        let want = if round % 2 == 0 { "manual" } else { "" };
        assert_eq!(spec.maintenance.as_str(), want, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.unwrap();
    assert!(writes.load(Ordering::Relaxed) > 10, "the other writer wrote");
    let _ = api.delete(&name, &Default::default()).await;
}

#[test]
fn exit_codes_are_distinct_from_usage_errors_and_completion_is_printed() {
    let hvctl = hv_tests::region::bin("hvctl");
    let code = |args: &[&str]| std::process::Command::new(&hvctl).args(args).output().unwrap();
    let usage = code(&["maintenance", "set"]);
    assert_eq!(usage.status.code(), Some(2), "clap's usage error");
    // hvctl's own checks of its arguments are usage errors too, found
    // before anything is read.
    let unconfirmed =
        code(&["maintenance", "set", "n1", "--mode", "termination", "--kubeconfig", "/nonexistent"]);
    assert_eq!(unconfirmed.status.code(), Some(2), "{}", String::from_utf8_lossy(&unconfirmed.stderr));
    assert!(String::from_utf8_lossy(&unconfirmed.stderr).contains("--yes"));
    let no_reason = code(&["pause", "n1", "--reason", " ", "--kubeconfig", "/nonexistent"]);
    assert_eq!(no_reason.status.code(), Some(2));
    // What cannot be done is 1.
    let failed = code(&["why", "n1", "--kubeconfig", "/nonexistent"]);
    assert_eq!(failed.status.code(), Some(1), "{}", String::from_utf8_lossy(&failed.stderr));
    let help = String::from_utf8_lossy(&code(&["--help"]).stdout).into_owned();
    for n in 0..=4 {
        assert!(help.contains(&format!("  {n}  ")), "{help}");
    }
    let bash = code(&["completion", "bash"]);
    assert!(bash.status.success() && String::from_utf8_lossy(&bash.stdout).contains("_hvctl()"));
}
