//! End to end: what a host offers reaches Nova, and a host takes VMs only
//! once what it depends on runs there (docs/lifecycle.md, "Host
//! capabilities" and "Dependencies ready"), and the preflight judges the
//! hosts a VM could go to by them (docs/eviction.md, "OS validation").
//!
//! Real `hv-coordinator` and `hv-agent`; the ground's real Keystone, Nova,
//! Placement, libvirtd and Kubernetes control plane (kwok runs the pods of
//! its fake Nodes and marks them Ready). The host's /sys is a fake tree
//! (`--host-root`), so a test can give it an SR-IOV NIC and take it away;
//! a proxy on the libvirt RPC gives a host a newer hypervisor than its
//! neighbours' (`hv_tests::libvirt_proxy`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::eviction::{EvictionOptions, EvictionPhase, EvictionReason, EvictionSpec};
use hv_coordinator::api::{Eviction, Hypervisor, MaintenanceMode, Phase};
use hv_tests::hosts;
use hv_tests::libvirt_proxy::VersionProxy;
use hv_tests::openstack::{Admin, X86_64_IMAGE};
use hv_tests::region::{AgentPeers, Region, healthy_active, healthy_active_with, healthy_host};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

const SOON: Duration = Duration::from_secs(60);
const SRIOV: &str = "HW_NIC_SRIOV";

/// Waits until the provider of `host` carries `trait_` (or no longer does).
async fn wait_trait(admin: &Admin, host: &str, trait_: &str, carried: bool, coord: &hv_tests::region::Proc) {
    until(
        &format!("{trait_} on {host}'s provider: {carried}"),
        SOON,
        || coord.tail(30),
        || async {
            let traits = admin.traits_of(host).await.unwrap_or_default();
            if traits.iter().any(|t| t == trait_) == carried {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{traits:?}"))
            }
        },
    )
    .await;
}

/// Waits until `trait_` is recorded as ours in `host`'s status (or no
/// longer is).
async fn wait_ours(region: &Region, host: &str, trait_: &str, ours: bool, coord: &hv_tests::region::Proc) {
    until(
        &format!("{trait_} recorded as ours: {ours}"),
        SOON,
        || coord.tail(30),
        || async {
            let status = region.hypervisor(host).await.and_then(|h| h.status).unwrap_or_default();
            let applied = status.lifecycle.applied_traits;
            if applied.iter().any(|t| t == trait_) == ours {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{applied:?}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hosts_sriov_nic_becomes_its_trait_and_goes_with_it_leaving_an_operators() {
    let region = Region::start("host-traits").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    let root = healthy_host(&region.dir.join(format!("host-{host}")));
    // A network controller (PCI class 0x02) with virtual functions.
    let nic = root.join("sys/bus/pci/devices/0000:3b:00.0");
    std::fs::create_dir_all(&nic).unwrap();
    std::fs::write(nic.join("class"), "0x020000\n").unwrap();
    let vfs = nic.join("sriov_totalvfs");
    std::fs::write(&vfs, "8\n").unwrap();
    let peers = AgentPeers {
        host_root: Some(root.clone()),
        inventory_interval: Some("2s".into()),
        ..Default::default()
    };
    let coord = region.coordinator(None, &[]);
    let _agent = region.agent(host, &peers);
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    wait_trait(&admin, host, SRIOV, true, &coord).await;
    let status = region.hypervisor(host).await.unwrap().status.unwrap();
    let caps = status.machine.and_then(|m| m.capabilities).expect("capabilities recorded");
    assert_eq!(caps.sriov_nics, Some(1), "{caps:?}");
    assert_eq!(caps.traits, Some(vec![SRIOV.to_string()]), "{caps:?}");
    assert!(!caps.hypervisor_type.is_empty() && !caps.libvirt_version.is_empty(), "{caps:?}");
    // The test driver's machine runs i686 guests only: the preflight
    // judges an image's architecture by these.
    assert_eq!(caps.guest_arches, ["i686"], "{caps:?}");
    wait_ours(&region, host, SRIOV, true, &coord).await;

    // An operator's standard trait, set by hand: never ours to remove.
    admin.add_trait(host, "HW_NIC_VMDQ").await.unwrap();
    // The NIC goes (its VFs disabled in firmware): so does the trait.
    std::fs::write(&vfs, "0\n").unwrap();
    wait_trait(&admin, host, SRIOV, false, &coord).await;
    let traits = admin.traits_of(host).await.unwrap();
    assert!(traits.iter().any(|t| t == "HW_NIC_VMDQ"), "the operator's trait stays: {traits:?}");
    // Forgotten as ours once Placement no longer shows it.
    wait_ours(&region, host, SRIOV, false, &coord).await;
    let hv = region.hypervisor(host).await.unwrap();
    assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Active));
}

fn dependency_pod(name: &str, label: &str, id: &str, node: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {label: id}},
        "spec": {"nodeName": node, "containers": [{"name": "agent", "image": "ovs-agent"}]}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_waits_in_ready_until_its_network_agent_runs_there() {
    let region = Region::start("deps").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.as_str();
    let admin = Admin::login(&region.env).await.unwrap();
    // The ground's chart names `openstack` for the hypervisors' pods: its
    // Role there lets the coordinator watch them.
    let (namespace, label) = ("openstack", "hv-e2e-dependency");
    let dependency = format!("{namespace}/{label}={}", region.id);
    let coord = region.coordinator(None, &["--node-dependency", &dependency]);
    let _agent = region.agent(host, &AgentPeers::default());
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Ready, SOON, &coord).await;
    let waiting = region.wait_condition(host, "SchedulingEnabled", "DependenciesNotReady", &coord).await;
    assert!(waiting.contains(&dependency) && waiting.contains("no pod on the node"), "{waiting}");
    // It stays so: not enabled in Nova, not Active.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let hv = region.hypervisor(host).await.unwrap();
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Ready));
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "disabled");

    // The network agent starts there (kwok marks it Ready): enabled, Active.
    let pods: Api<Pod> = Api::namespaced(region.kube.client.clone(), namespace);
    let name = format!("ovs-agent-{}", region.id);
    pods.create(&PostParams::default(), &dependency_pod(&name, label, &region.id, host)).await.unwrap();
    region.wait_phase(host, Phase::Active, SOON, &coord).await;
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled");

    // It stops being Ready: the host is Degraded, and not emptied for it.
    let not_ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&not_ready)).await.unwrap();
    let evidence = region.wait_condition(host, "NodeHealthy", "Degraded", &coord).await;
    assert!(evidence.contains("dependency-not-ready") && evidence.contains(&name), "{evidence}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let hv = region.hypervisor(host).await.unwrap();
    assert_eq!(hv.spec.maintenance, MaintenanceMode::None, "not put into ha maintenance");
    assert_eq!(hv.status.as_ref().and_then(|s| s.phase), Some(Phase::Active));
    assert_eq!(admin.service(host).await.unwrap().unwrap()["status"], "enabled", "left in service");
    let _ = pods.delete(&name, &DeleteParams::default()).await;
}

/// Creates a dry-run Eviction of `host`, skipping the checks `force` names.
async fn dry_run(region: &Region, name: &str, host: &str, force: &[&str]) {
    let evs: Api<Eviction> = Api::all(region.kube.client.clone());
    let options =
        EvictionOptions { force: force.iter().map(|f| f.to_string()).collect(), ..Default::default() };
    let spec = EvictionSpec {
        hypervisor: host.into(),
        reason: EvictionReason::AdminRequest,
        options,
        dry_run: true,
    };
    evs.create(&PostParams::default(), &Eviction::new(name, spec)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_preflight_names_a_vm_whose_every_candidate_has_an_older_hypervisor() {
    let region = Region::start("os-check").await;
    let zone = hosts::zone(&region.env, 2).await;
    let admin = Admin::login(&region.env).await.unwrap();
    let host = zone.source.host.clone();
    let coord = region.coordinator(None, &[]);
    // The targets in service, their agents reporting the test driver's 0.0.2.
    let mut targets = Vec::new();
    for t in &zone.targets {
        targets.push(healthy_active(&region, &t.host, &coord).await);
    }
    // The source's agent hears its libvirtd answer 9.0.0.
    let direct = region.env.libvirt.of(&host).to_string();
    let upstream = direct.trim_start_matches("test+tcp://").split('/').next().unwrap_or_default();
    let proxy = VersionProxy::start(upstream, 9_000_000).await;
    let peers = AgentPeers {
        libvirt: Some(proxy.uri()),
        inventory_interval: Some("2s".into()),
        ..Default::default()
    };
    let (_root, _agent) = healthy_active_with(&region, &host, &coord, peers).await;
    let software = |hv: Option<Hypervisor>| {
        hv.and_then(|h| h.status?.machine?.capabilities).map(|c| c.hypervisor_version).unwrap_or_default()
    };
    assert_eq!(software(region.hypervisor(&host).await), "9.0.0");
    assert_eq!(software(region.hypervisor(&zone.targets[0].host).await), "0.0.2");
    let vm = zone.boot(&admin, &format!("{}-vm", region.id), &host, "1").await;
    // One whose image asks for x86_64 guests (Nova shows its properties at
    // 2.98): the source runs them (its proxy says so), the test driver's
    // machines of the targets run i686 guests only.
    let x86 = admin
        .boot_image(&format!("{}-x86", region.id), &host, "1", Some(&zone.name), X86_64_IMAGE)
        .await
        .unwrap();
    // Their domains reported, so the machine is the one Nova means.
    until(
        "the VMs' domains reported",
        SOON,
        || coord.tail(20),
        || async {
            let domains =
                region.hypervisor(&host).await.and_then(|h| h.status?.machine?.domains).unwrap_or_default();
            if domains.contains(&vm) && domains.contains(&x86) {
                Poll::Ready(())
            } else {
                Poll::Pending(format!("{domains:?}"))
            }
        },
    )
    .await;

    dry_run(&region, "os-dry", &host, &[]).await;
    let ev = region.wait_eviction("os-dry", EvictionPhase::Planned, SOON, &coord).await;
    let status = ev.status.unwrap();
    let preflight = status.conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    assert_eq!(preflight.reason, "Failed", "{preflight:?}");
    assert!(preflight.message.contains(&vm) && preflight.message.contains(&x86), "{}", preflight.message);
    let finding = |id: &str| {
        status.preflight.iter().find(|p| p.id == id).and_then(|p| p.finding.clone()).unwrap_or_default()
    };
    let older = finding(&vm);
    assert!(
        older.starts_with("os: ") && older.contains("2 with a hypervisor older than the source's 9.0.0"),
        "{older}"
    );
    let arch = finding(&x86);
    assert!(
        arch.starts_with("os: ") && arch.contains("2 running no guest of the image's architecture x86_64"),
        "{arch}"
    );
    for id in [&vm, &x86] {
        assert!(admin.migrations_of(id).await.unwrap().is_empty(), "a dry run moves nothing");
    }

    // Skipped by an SRE who knows better, it passes.
    dry_run(&region, "os-forced", &host, &["os"]).await;
    let ev = region.wait_eviction("os-forced", EvictionPhase::Planned, SOON, &coord).await;
    let status = ev.status.unwrap();
    let preflight = status.conditions.iter().find(|c| c.type_ == "Preflight").unwrap();
    assert_eq!(preflight.reason, "Passed", "{preflight:?}");
    assert!(preflight.message.contains("skipped (force): os"), "{}", preflight.message);
    admin.delete_server(&vm).await.unwrap();
    admin.delete_server(&x86).await.unwrap();
}
