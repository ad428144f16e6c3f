//! The chart's RBAC meets the real authorizer: a release of the chart with
//! one permission taken out of its coordinator's rules, a coordinator
//! running as that release's ServiceAccount, and the API server's 403
//! naming what is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_tests::env::Via;
use hv_tests::region::{Install, Region, free_port};
use hv_tests::wait::{Poll, until};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// Copies `from` into `to`, file by file.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_permission_missing_from_the_chart_is_the_real_authorizers_403() {
    let region = Region::start("rbac-403").await;
    let env = &region.env;
    // The chart with `patch` on Nodes taken out of its coordinator's rules.
    let chart = region.dir.join("chart");
    copy_dir(&hv_tests::repo_root().join("deploy/helm/hv"), &chart);
    let rules = chart.join("files/coordinator-rules.yaml");
    let text = std::fs::read_to_string(&rules).unwrap();
    let granted = "resources: [nodes]\n    verbs: [get, list, watch, patch]";
    assert!(text.contains(granted), "the chart's Node rule moved: update this test");
    std::fs::write(&rules, text.replace(granted, "resources: [nodes]\n    verbs: [get, list, watch]"))
        .unwrap();
    // Its own release, in a namespace of its own.
    // (The ground's audit log records this namespace's accounts.)
    let ns = "hv-rbac".to_string();
    let release = format!("rbac{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(region.kube.client.clone());
    let made = namespaces
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap())
        .await;
    assert!(made.is_ok() || matches!(&made, Err(kube::Error::Api(s)) if s.code == 409), "{made:?}");
    let values = region.dir.join("values.json");
    // No CRDs: the ground's release owns them, and one release per cluster may.
    let v = json!({"openstack": {"cloudsSecret": "hv-clouds", "cloud": "hv"}, "crds": {"install": false},
        "coordinator": {"replicas": 1}});
    std::fs::write(&values, v.to_string()).unwrap();
    let out = std::process::Command::new(&env.kube.chart.helm_python)
        .arg(hv_tests::repo_root().join("tests/env/chart.py"))
        .arg(&env.kube.admin_kubeconfig)
        .args([&ns, &release])
        .arg(&values)
        .arg(&chart)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm install: {}", String::from_utf8_lossy(&out.stderr));

    let account = format!("{release}-coordinator");
    let pod = format!("{account}-0");
    let install = Install { namespace: ns.clone(), account: account.clone() };
    region.coordinator_pod(&install, &pod);
    let coord = region.coordinator_of(&install, &pod, free_port(), None, &Via::default(), &["--skip-tests"]);
    let node = format!("rbac-{}", std::process::id());
    region.create_node(&node, &[]).await;
    // Its finalizer on the Node is a patch the chart no longer grants.
    let user = format!("system:serviceaccount:{ns}:{account}");
    let denied = format!("User \"{user}\" cannot patch resource \"nodes\"");
    until(
        "the API server's 403 in the coordinator's log",
        Duration::from_secs(60),
        || coord.tail(20),
        || async {
            let log = std::fs::read_to_string(&coord.log).unwrap_or_default();
            if log.contains(&denied) { Poll::Ready(()) } else { Poll::Pending("not yet".into()) }
        },
    )
    .await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(region.kube.client.clone());
    let n = nodes.get(&node).await.unwrap();
    assert!(n.metadata.finalizers.unwrap_or_default().is_empty(), "nothing was patched");
    drop(coord);
    // The suite's check, on the audit log, against the rules this release
    // was installed with: the denied request is a use the rules do not grant.
    let used = hv_tests::audit::read(&env.kube.audit_log);
    let theirs: Vec<_> = used.iter().filter(|a| a.user == user).cloned().collect();
    assert!(
        theirs.iter().any(|a| a.verb == "patch" && a.resource == "nodes" && a.name == node),
        "the audit log records the refused patch: {theirs:?}"
    );
    let rules = hv_tests::rbac::read_rules(&rules).unwrap();
    let problems = hv_tests::rbac::check(&rules, &theirs, &user, &ns).unwrap_err();
    assert!(
        problems.iter().any(|p| p.starts_with("used but not granted: patch nodes ")),
        "the RBAC check names the missing permission: {problems:?}"
    );
    nodes.delete(&node, &DeleteParams::default()).await.unwrap();
    // The release's cluster-wide objects, and its namespace.
    use k8s_openapi::api::flowcontrol::v1::FlowSchema;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let _ = Api::<FlowSchema>::all(region.kube.client.clone())
        .delete(&format!("{account}-lease"), &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRoleBinding>::all(region.kube.client.clone())
        .delete(&account, &DeleteParams::default())
        .await;
    let _ =
        Api::<ClusterRole>::all(region.kube.client.clone()).delete(&account, &DeleteParams::default()).await;
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy = format!("{account}-leader-label");
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(region.kube.client.clone())
        .delete(&policy, &DeleteParams::default())
        .await;
    let _ = Api::<ValidatingAdmissionPolicy>::all(region.kube.client.clone())
        .delete(&policy, &DeleteParams::default())
        .await;
    // Its Role in kube-node-lease, which the namespace does not take along.
    let lease_ns = hv_tests::rbac::NODE_LEASE_NAMESPACE;
    let _ = Api::<RoleBinding>::namespaced(region.kube.client.clone(), lease_ns)
        .delete(&account, &DeleteParams::default())
        .await;
    let _ = Api::<Role>::namespaced(region.kube.client.clone(), lease_ns)
        .delete(&account, &DeleteParams::default())
        .await;
    namespaces.delete(&ns, &DeleteParams::default()).await.unwrap();
}

/// The chart's admission policy on the real API server: the coordinator's
/// account sets and clears the leader label on the pod its token is bound
/// to, and on no other (a replica cannot point the Service at another's
/// pod); it may set its own other labels on another pod (the drain marks),
/// and changes no other label, no annotation and no spec; a token bound to
/// no pod sets no leader label.
#[tokio::test(flavor = "multi_thread")]
async fn a_replica_sets_the_leader_label_on_its_own_pod_only() {
    use hv_coordinator::api::keys::LEADER_LABEL;
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};

    let region = Region::start("leader-label").await;
    let chart = &region.env.kube.chart;
    let ns = chart.namespace.as_str();
    let (mine, other) = ("hv-coordinator-label-a", "hv-coordinator-label-b");
    let install = Install { namespace: ns.to_string(), account: chart.coordinator_account.clone() };
    region.coordinator_pod(&install, mine);
    region.coordinator_pod(&install, other);
    let as_account = |pod: Option<&'static str>, file: &str| {
        let path = region.dir.join(file);
        hv_tests::kube_target::account_kubeconfig(
            &region.env,
            (ns, &chart.coordinator_account, pod),
            None,
            &path,
        )
        .unwrap();
        path
    };
    let bound =
        hv_tests::kube_target::client_from(&as_account(Some(mine), "bound.kubeconfig")).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(bound, ns);
    let label = |v: Option<&str>| Patch::Merge(json!({"metadata": {"labels": {LEADER_LABEL: v}}}));
    let refused = |r: Result<Pod, kube::Error>, why: &str| match r {
        Err(kube::Error::Api(s)) => assert!(s.code == 403 && s.message.contains(why), "{s:?}"),
        other => panic!("not refused: {other:?}"),
    };
    let p = PatchParams::default();

    pods.patch(mine, &p, &label(Some("true"))).await.unwrap();
    pods.patch(mine, &p, &label(None)).await.unwrap();
    refused(pods.patch(other, &p, &label(Some("true"))).await, "on its own pod only");
    let admin: Api<Pod> = Api::namespaced(region.kube.client.clone(), ns);
    let admin_set = admin.patch(other, &p, &label(Some("true"))).await.unwrap();
    assert_eq!(admin_set.labels().get(LEADER_LABEL).map(String::as_str), Some("true"), "an SRE may");
    refused(pods.patch(other, &p, &label(None)).await, "on its own pod only");
    // Other labels of another pod: the drain marks.
    let mark = Patch::Merge(json!({"metadata": {"labels": {"hypervisor.cloud.sap/evictable": "true"}}}));
    pods.patch(other, &p, &mark).await.unwrap();
    // Nothing else: no label not ours, no annotation.
    let theirs = Patch::Merge(json!({"metadata": {"labels": {"app.kubernetes.io/name": "elsewhere"}}}));
    refused(pods.patch(other, &p, &theirs).await, "only its own labels");
    let note = Patch::Merge(json!({"metadata": {"annotations": {"example.com/note": "x"}}}));
    refused(pods.patch(mine, &p, &note).await, "no pod's annotations");
    // No spec change, on its own pod either.
    let image =
        Patch::Strategic(json!({"spec": {"containers": [{"name": "coordinator", "image": "elsewhere"}]}}));
    refused(pods.patch(mine, &p, &image).await, "changes no pod's spec");
    // A token bound to no pod names no pod: the label stays as it is.
    let unbound = hv_tests::kube_target::client_from(&as_account(None, "unbound.kubeconfig")).await.unwrap();
    let unbound: Api<Pod> = Api::namespaced(unbound, ns);
    refused(unbound.patch(mine, &p, &label(Some("true"))).await, "on its own pod only");
    admin.patch(other, &p, &label(None)).await.unwrap();
}
