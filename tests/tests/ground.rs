//! Smoke tests of the test ground: each peer answers, through the project's
//! own test support, the way later tests will use it. They need
//! `make test-env-up` (done by `make test`) and fail, never skip, without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use hv_tests::{env, openstack, ovsdb};

#[test]
fn a_bare_checkout_fails_with_instructions() {
    let err = env::load_from(std::path::Path::new("/nonexistent/env.json")).unwrap_err().to_string();
    assert!(err.contains("make test-env-up"), "{err}");
}

#[test]
fn libvirt_answers_over_tcp() {
    let e = env::require();
    let conn = virt::connect::Connect::open(Some(&e.libvirt.test_uri)).expect("test driver over TCP");
    let version = conn.lib_version().unwrap();
    assert!(version >= 9_000_000, "libvirt {version}");
    assert_eq!(conn.driver_type().unwrap(), "TEST");
    let qemu =
        virt::connect::Connect::open(Some(&e.libvirt.qemu_session_uri)).expect("qemu session over TCP");
    assert_eq!(qemu.driver_type().unwrap(), "QEMU");
    assert!(qemu.hyp_version().unwrap() >= 7_000_000, "QEMU under TCG answers");
}

/// The UUIDs of the domains the libvirt at `uri` runs.
fn domains(uri: &str) -> Vec<String> {
    let conn = virt::connect::Connect::open(Some(uri)).expect("a fake host's libvirtd");
    let listed = conn.list_all_domains(0).unwrap();
    listed.iter().map(|d| d.uuid_string().unwrap()).collect()
}

/// Each fake host is a machine of its own: its libvirt calls itself by the
/// host's name, as Nova's record of the host does, and a server Nova's
/// fake driver runs there is a domain of the same UUID in it, gone once
/// the server is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn a_fake_host_is_a_machine_running_its_servers_as_domains() {
    let e = env::require();
    let claim = hv_tests::hosts::claim(&e).await;
    let uri = e.libvirt.of(&claim.host).to_string();
    assert_ne!(uri, e.libvirt.test_uri, "a libvirtd of its own");
    let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
    assert_eq!(conn.hostname().unwrap(), claim.host);
    let admin = openstack::Admin::login(&e).await.unwrap();
    let record = admin.hypervisor_of(&claim.host).await.unwrap().unwrap();
    assert_eq!(record["hypervisor_hostname"], claim.host.as_str(), "{record}");

    let id = admin.boot_on(&format!("machine-{}", std::process::id()), &claim.host, "1").await.unwrap();
    hv_tests::wait::until(
        "the server a domain on its host",
        std::time::Duration::from_secs(10),
        String::new,
        || async { hv_tests::wait::ready_when(domains(&uri).contains(&id), domains(&uri)) },
    )
    .await;
    admin.delete_server(&id).await.unwrap();
    hv_tests::wait::until(
        "the domain gone with its server",
        std::time::Duration::from_secs(30),
        String::new,
        || async { hv_tests::wait::ready_when(!domains(&uri).contains(&id), domains(&uri)) },
    )
    .await;
}

#[tokio::test]
async fn ovsdb_lists_its_databases_and_bridges() {
    let e = env::require();
    let dbs = ovsdb::call(&e.ovsdb.host, e.ovsdb.port, "list_dbs", serde_json::json!([])).await.unwrap();
    assert!(dbs.as_array().unwrap().iter().any(|d| d == "Open_vSwitch"), "{dbs}");
    let rows = ovsdb::call(
        &e.ovsdb.host,
        e.ovsdb.port,
        "transact",
        serde_json::json!(["Open_vSwitch", {"op": "select", "table": "Bridge", "where": [], "columns": ["name"]}]),
    )
    .await
    .unwrap();
    let names: Vec<&str> =
        rows[0]["rows"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    for br in &e.ovsdb.bridges {
        assert!(names.contains(&br.as_str()), "{br} missing from {names:?}");
    }
}

fn rbd_ls(e: &env::TestEnv, pool: &str) -> std::process::Output {
    Command::new("timeout")
        .arg("30")
        .arg("rbd")
        .arg("-c")
        .arg(&e.ceph.conf)
        .arg("--id")
        .arg(&e.ceph.client.id)
        .arg("--keyring")
        .arg(&e.ceph.client.keyring)
        .arg("ls")
        .arg(pool)
        .output()
        .unwrap()
}

#[test]
fn rbd_images_are_listed_by_the_restricted_client_only_where_allowed() {
    let e = env::require();
    let ok = rbd_ls(&e, &e.ceph.readable_pool);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    assert!(String::from_utf8_lossy(&ok.stdout).lines().any(|l| l == e.ceph.image));
    let denied = rbd_ls(&e, &e.ceph.forbidden_pool);
    assert!(!denied.status.success(), "client.{} could read {}", e.ceph.client.id, e.ceph.forbidden_pool);
    assert!(String::from_utf8_lossy(&denied.stderr).contains("Operation not permitted"));
}

#[tokio::test]
async fn keystone_nova_and_placement_answer_with_real_tokens() {
    let e = env::require();
    let tok = openstack::token(&e.keystone, &e.keystone.coordinator).await.unwrap();
    let catalog = tok.body["token"]["catalog"].as_array().unwrap();
    for kind in ["compute", "placement", "identity"] {
        assert!(catalog.iter().any(|s| s["type"] == kind), "{kind} missing from the catalog");
    }
    let mv = format!("compute {}", e.nova.compute_microversion);
    let services =
        openstack::get(&format!("{}/os-services?binary=nova-compute", e.nova.compute_url), &tok, &mv)
            .await
            .unwrap();
    let hosts: Vec<&str> =
        services["services"].as_array().unwrap().iter().filter_map(|s| s["host"].as_str()).collect();
    // The decommission tests (which may have run already) retire their hosts.
    let kept = || e.nova.hosts.iter().filter(|h| !hv_tests::hosts::is_retired(&e, h));
    assert!(kept().count() >= 8, "{:?}", e.nova.hosts);
    for h in kept() {
        assert!(hosts.contains(&h.as_str()), "{h} not registered: {hosts:?}");
    }
    let pmv = format!("placement {}", e.nova.placement_microversion);
    let rps =
        openstack::get(&format!("{}/resource_providers", e.nova.placement_url), &tok, &pmv).await.unwrap();
    let names: Vec<&str> =
        rps["resource_providers"].as_array().unwrap().iter().filter_map(|r| r["name"].as_str()).collect();
    for h in kept() {
        assert!(names.contains(&h.as_str()), "no resource provider for {h}: {names:?}");
    }
}

#[tokio::test]
async fn a_wrong_password_is_rejected_and_a_forged_token_refused() {
    let e = env::require();
    let mut wrong = e.keystone.coordinator.clone();
    wrong.password = "not-the-password".into();
    let err = openstack::token(&e.keystone, &wrong).await.unwrap_err().to_string();
    assert!(err.contains("HTTP 401"), "{err}");
    let forged = openstack::Token { value: "forged".into(), body: serde_json::Value::Null };
    let mv = format!("compute {}", e.nova.compute_microversion);
    let err = openstack::get(&format!("{}/os-services", e.nova.compute_url), &forged, &mv).await.unwrap_err();
    assert!(err.to_string().contains("HTTP 401"), "{err}");
}

#[tokio::test]
async fn the_kubernetes_api_serves_a_hypervisor_a_watch_sees_change() {
    use futures_util::StreamExt;
    use hv_coordinator::api::{Hypervisor, HypervisorSpec};
    use kube::api::{Api, Patch, PatchParams, PostParams, WatchEvent, WatchParams};

    let target =
        hv_tests::kube_target::admin(&hv_tests::env::require()).await.unwrap_or_else(|e| panic!("{e}"));
    let api: Api<Hypervisor> = Api::all(target.client.clone());
    let name = format!("smoke-{}", std::process::id());
    let created =
        api.create(&PostParams::default(), &Hypervisor::new(&name, HypervisorSpec::default())).await.unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    let mut events = api
        .watch(&WatchParams::default().fields(&format!("metadata.name={name}")).timeout(20), &rv)
        .await
        .unwrap()
        .boxed();
    let patch = serde_json::json!({"spec": {"aggregates": ["az-smoke"]}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let seen = loop {
        match tokio::time::timeout(std::time::Duration::from_secs(20), events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Modified(h) => break h,
            WatchEvent::Bookmark(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(seen.spec.aggregates, vec!["az-smoke"]);
    api.delete(&name, &Default::default()).await.unwrap();
}

/// The chart installed the CRDs the Rust types make, as templates Helm
/// upgrades with the release and keeps when it is uninstalled.
#[tokio::test]
async fn the_chart_installs_the_crds_to_keep_and_upgrade() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::ResourceExt;
    use kube::api::Api;

    let target =
        hv_tests::kube_target::admin(&hv_tests::env::require()).await.unwrap_or_else(|e| panic!("{e}"));
    let api: Api<CustomResourceDefinition> = Api::all(target.client.clone());
    for want in hv_coordinator::api::crds() {
        let name = want.name_any();
        let got = api.get(&name).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let a = got.annotations();
        assert_eq!(a.get("helm.sh/resource-policy").map(String::as_str), Some("keep"), "{name}: {a:?}");
        assert_eq!(a.get("meta.helm.sh/release-name").map(String::as_str), Some("hv"), "{name}: {a:?}");
        let served = |c: &CustomResourceDefinition| {
            let v = &c.spec.versions[0];
            (v.name.clone(), v.additional_printer_columns.clone(), c.spec.names.short_names.clone())
        };
        assert_eq!(served(&got), served(&want), "{name}: as the Rust types make it");
    }
}

/// Every coordinator pod on a Node of the ground is one a test's process
/// stands for (`hv-coordinator-N`): the chart's Deployment's replica waits
/// for a Node none is, since the scheduler would bind it to a fake Node,
/// where a drain evicts it past the eviction webhook as if it were the
/// coordinator's own pod.
#[tokio::test]
async fn the_charts_coordinator_replica_is_bound_to_no_node() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, ListParams};

    let env = hv_tests::env::require();
    let admin = hv_tests::kube_target::admin(&env).await.unwrap();
    let ns = &env.kube.chart.namespace;
    let name = format!("{}-coordinator", env.kube.chart.release);
    let deployment = Api::<Deployment>::namespaced(admin.client.clone(), ns).get(&name).await.unwrap();
    assert_eq!(deployment.spec.and_then(|s| s.replicas), Some(1), "{name}");
    let pods = Api::<Pod>::namespaced(admin.client.clone(), ns).list(&ListParams::default()).await.unwrap();
    let of_the_deployment = |p: &&Pod| {
        p.metadata.owner_references.iter().flatten().any(|o| o.kind == "ReplicaSet")
            && p.metadata.name.as_deref().is_some_and(|n| n.starts_with(&format!("{name}-")))
    };
    let replicas: Vec<&Pod> = pods.items.iter().filter(of_the_deployment).collect();
    assert!(!replicas.is_empty(), "the Deployment's controller made its replica");
    let bound: Vec<_> = replicas
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    assert!(bound.is_empty(), "replicas on a Node no process stands for: {bound:?}");
}

#[tokio::test]
async fn the_control_plane_is_the_pinned_release_with_tls_and_rbac() {
    use kube::api::Api;
    let env = hv_tests::env::require();
    let admin = hv_tests::kube_target::admin(&env).await.unwrap();
    // The release the wrapper module pins, as its binaries say.
    let pinned =
        std::fs::read_to_string(hv_tests::repo_root().join("tests/env/controlplane/kubernetes/go.mod"))
            .unwrap()
            .lines()
            .find_map(|l| {
                let l = l.trim().trim_start_matches("require ");
                l.strip_prefix("k8s.io/kubernetes ")
                    .and_then(|v| v.split_whitespace().next())
                    .map(str::to_string)
            })
            .unwrap();
    assert_eq!(admin.client.apiserver_version().await.unwrap().git_version, pinned);
    // No certificate, no token: anonymous, refused beyond discovery.
    let anonymous = reqwest::Client::builder()
        .add_root_certificate(
            reqwest::Certificate::from_pem(&std::fs::read(&env.kube.ca_file).unwrap()).unwrap(),
        )
        .build()
        .unwrap();
    let rsp = anonymous.get(format!("{}/api/v1/nodes", env.kube.url)).send().await.unwrap();
    assert_eq!(rsp.status(), 403, "anonymous may not list Nodes");
    // The chart's coordinator account, with a TokenRequest token: what its
    // RBAC grants (Nodes). Its agent account, which the chart grants
    // nothing: refused. (A refused request of the coordinator's would count
    // in the RBAC check of the suite as one it needs.)
    let path = std::env::temp_dir().join(format!("hv-ground-token-{}.kubeconfig", std::process::id()));
    let chart = &env.kube.chart;
    hv_tests::kube_target::account_kubeconfig(
        &env,
        (&chart.namespace, &chart.coordinator_account, None),
        None,
        &path,
    )
    .unwrap();
    let coordinator = hv_tests::kube_target::client_from(&path).await.unwrap();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(coordinator);
    nodes.list(&Default::default()).await.unwrap();
    hv_tests::kube_target::account_kubeconfig(&env, (&chart.namespace, "hv-agent", None), None, &path)
        .unwrap();
    let agent = hv_tests::kube_target::client_from(&path).await.unwrap();
    let _ = std::fs::remove_file(&path);
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(agent);
    match nodes.list(&Default::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("the agent's account listed Nodes: {other:?}"),
    }
}
