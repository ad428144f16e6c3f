//! The chart's RBAC, derived from what the coordinator does: the API
//! server's audit log records every (verb, API group, resource, subresource)
//! each of the chart's ServiceAccounts asks for during the end-to-end tests
//! (`audit`), and the
//! coordinator's rules in the chart (`deploy/helm/hv/files/coordinator-rules.yaml`)
//! must grant each of them and nothing else. No wildcards.

use std::collections::BTreeSet;
use std::path::Path;

use crate::audit::Access;

/// The coordinator's user: the chart's ServiceAccount, as the API server
/// names it.
pub const COORDINATOR_USER: &str = "system:serviceaccount:hv-system:hv-coordinator";
/// The coordinator's own namespace in the tests (its Lease and its Pods),
/// not `default`, where the Events of cluster-scoped objects go: so a rule
/// in the wrong one of the chart's Role and ClusterRole fails the check.
pub const COORDINATOR_NAMESPACE: &str = "hv-system";

/// One RBAC rule, as in a ClusterRole or Role.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Rule {
    #[serde(rename = "apiGroups")]
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
    /// Only these objects. None in the rules file: the chart names the
    /// objects itself (the Secrets of `coordinator.fencing.bmcSecrets`).
    #[serde(default, rename = "resourceNames")]
    pub resource_names: Vec<String>,
}

/// What the names of the Pod objects the tests' coordinators run in
/// start with (`hv-coordinator-0` to `-63`), as the chart's Deployment's
/// pods' names do.
pub const COORDINATOR_POD_PREFIX: &str = "hv-coordinator-";

/// Where the kubelets' Leases live: the coordinator's Role there reads them.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// Where the ground's chart names protected and dependent pods
/// (`tests/env/peers/chart.sh`): a Role there, and one in the
/// coordinator's own namespace (the agent's pods), grants the pods rules.
pub const PROTECTED_POD_NAMESPACE: &str = "openstack";

/// The coordinator's rules: cluster-wide (its ClusterRole), in its own
/// namespace (its Role: the leader-election Lease), and in
/// [`NODE_LEASE_NAMESPACE`] (its Role there).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Rules {
    pub cluster: Vec<Rule>,
    pub namespace: Vec<Rule>,
    #[serde(default, rename = "nodeLeases")]
    pub node_leases: Vec<Rule>,
    /// Rules the chart grants with the eviction webhook
    /// (`coordinator.drainProtection`) in a Role of each namespace of the
    /// protected and dependent pods and in its own; the tests run it, so
    /// they count.
    #[serde(default, rename = "podNamespaces")]
    pub pod_namespaces: Vec<Rule>,
    /// Rules the chart grants with the drain guards
    /// (`coordinator.drainGuard`) in a Role of its own namespace: they
    /// count as that namespace's.
    #[serde(default)]
    pub guards: Vec<Rule>,
    /// Rules the chart grants in its ClusterRole with the `cluster-api`
    /// update signal: they count as cluster rules.
    #[serde(default, rename = "clusterApi")]
    pub cluster_api: Vec<Rule>,
}

/// A permission: where (`cluster` for the ClusterRole, `namespace` for the
/// Role in the coordinator's own namespace, `node-leases` for its Role in
/// [`NODE_LEASE_NAMESPACE`]), verb, group, and resource or
/// resource/subresource.
pub type Permission = (&'static str, String, String, String);

/// A request on pods in a namespace of the protected pods (or its own,
/// but not one of its own pods) needs the pods Role there; any other
/// request in the coordinator's own namespace needs its Role; any other
/// (cluster-scoped, across namespaces, or in another namespace such as the
/// Events of cluster-scoped objects in `default`) needs its ClusterRole.
fn permission(a: &Access, own_namespace: &str) -> Permission {
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    // Its own pod: the one its token is bound to, not any pod whose name
    // looks like a coordinator's (another replica's pod, read by the
    // eviction webhook in a drain, needs the pods Role).
    let own_pod = a.namespace == own_namespace && !a.bound_pod.is_empty() && a.name == a.bound_pod;
    let pod_namespace = a.namespace == own_namespace || a.namespace == PROTECTED_POD_NAMESPACE;
    let scope = if a.resource == "pods" && pod_namespace && !own_pod {
        "pod-namespaces"
    } else if a.namespace == own_namespace {
        "namespace"
    } else if a.namespace == NODE_LEASE_NAMESPACE {
        "node-leases"
    } else {
        "cluster"
    };
    (scope, a.verb.clone(), a.group.clone(), resource)
}

/// Every permission `rules` grant; a wildcard is an error.
pub fn granted(rules: &Rules) -> Result<BTreeSet<Permission>, String> {
    let mut out = BTreeSet::new();
    let scoped = (rules.cluster.iter().chain(&rules.cluster_api).map(|r| ("cluster", r)))
        .chain(rules.namespace.iter().chain(&rules.guards).map(|r| ("namespace", r)))
        .chain(rules.node_leases.iter().map(|r| ("node-leases", r)))
        .chain(rules.pod_namespaces.iter().map(|r| ("pod-namespaces", r)));
    for (scope, r) in scoped {
        for field in r.api_groups.iter().chain(&r.resources).chain(&r.verbs).chain(&r.resource_names) {
            if field.contains('*') {
                return Err(format!("a wildcard in {r:?}: grant what is used, by name"));
            }
        }
        for g in &r.api_groups {
            for res in &r.resources {
                for v in &r.verbs {
                    out.insert((scope, v.clone(), g.clone(), res.clone()));
                }
            }
        }
    }
    Ok(out)
}

/// Compares what `user` used with what `rules` grant: every use granted in
/// the right scope, every grant used.
/// The error lists each difference.
pub fn check(rules: &Rules, used: &[Access], user: &str, own_namespace: &str) -> Result<usize, Vec<String>> {
    let granted = granted(rules).map_err(|e| vec![e])?;
    let mut problems = Vec::new();
    for r in rules
        .cluster
        .iter()
        .chain(&rules.namespace)
        .chain(&rules.node_leases)
        .chain(&rules.pod_namespaces)
        .chain(&rules.guards)
        .chain(&rules.cluster_api)
    {
        if !r.resource_names.is_empty() {
            problems.push(format!("resourceNames in the rules file (the chart names objects): {r:?}"));
        }
    }
    let mine: Vec<&Access> = used.iter().filter(|a| a.user == user).collect();
    let used: BTreeSet<Permission> = mine.iter().map(|a| permission(a, own_namespace)).collect();
    // A ClusterRole grants in every namespace too; a cluster rule counts as
    // used only by what is asked outside the namespaces with a Role.
    let in_cluster = |p: &Permission| granted.contains(&("cluster", p.1.clone(), p.2.clone(), p.3.clone()));
    problems.extend(
        used.difference(&granted)
            .filter(|p| !(p.0 != "cluster" && in_cluster(p)))
            .map(|(s, v, g, r)| format!("used but not granted: {v} {r} (group {g:?}, {s} rules)")),
    );
    problems.extend(
        granted
            .difference(&used)
            .map(|(s, v, g, r)| format!("granted but never used: {v} {r} (group {g:?}, {s} rules)")),
    );
    if problems.is_empty() { Ok(used.len()) } else { Err(problems) }
}

/// The rules file of the chart.
pub fn read_rules(path: &Path) -> Result<Rules, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Where the chart keeps the coordinator's rules.
pub fn chart_rules() -> std::path::PathBuf {
    crate::repo_root().join("deploy/helm/hv/files/coordinator-rules.yaml")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn uses(rules: &Rules) -> Vec<Access> {
        granted(rules)
            .unwrap()
            .into_iter()
            .map(|(scope, verb, group, res)| {
                let (resource, subresource) = match res.split_once('/') {
                    Some((r, s)) => (r.to_string(), s.to_string()),
                    None => (res, String::new()),
                };
                let namespace = match scope {
                    "namespace" => COORDINATOR_NAMESPACE,
                    "node-leases" => NODE_LEASE_NAMESPACE,
                    "pod-namespaces" => PROTECTED_POD_NAMESPACE,
                    _ => "",
                }
                .to_string();
                let name = format!("{COORDINATOR_POD_PREFIX}0");
                let bound_pod = name.clone();
                Access {
                    user: COORDINATOR_USER.into(),
                    verb,
                    group,
                    resource,
                    subresource,
                    namespace,
                    name,
                    bound_pod,
                }
            })
            .collect()
    }

    /// The chart's rules grant exactly what they grant; removing any one
    /// rule's verb fails the check naming it, and so does a wildcard or a
    /// grant nobody uses.
    fn read_chart_rules_without_drain_protection() -> Rules {
        let mut rules = read_rules(&chart_rules()).unwrap();
        rules.pod_namespaces.clear();
        rules
    }

    #[test]
    fn the_check_fails_when_a_rule_is_removed_widened_or_unused() {
        // The whole chart passes with what it grants.
        let full = read_rules(&chart_rules()).unwrap();
        let full_used = uses(&full);
        assert_eq!(check(&full, &full_used, COORDINATOR_USER, COORDINATOR_NAMESPACE), Ok(full_used.len()));
        // The rest without the eviction webhook's rules.
        let rules = read_chart_rules_without_drain_protection();
        let used = uses(&rules);
        assert!(!used.is_empty());
        assert_eq!(check(&rules, &used, COORDINATOR_USER, COORDINATOR_NAMESPACE), Ok(used.len()));
        // Another user's requests are not the coordinator's.
        let mut others = used.clone();
        others.push(Access { user: "anonymous".into(), verb: "delete".into(), ..used[0].clone() });
        assert!(check(&rules, &others, COORDINATOR_USER, COORDINATOR_NAMESPACE).is_ok());

        for namespaced in [false, true] {
            let list = if namespaced { &rules.namespace } else { &rules.cluster };
            for (i, rule) in list.iter().enumerate() {
                for (j, verb) in rule.verbs.iter().enumerate() {
                    let mut fewer = rules.clone();
                    let list = if namespaced { &mut fewer.namespace } else { &mut fewer.cluster };
                    list[i].verbs.remove(j);
                    let problems = check(&fewer, &used, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
                    assert!(problems.iter().all(|p| p.starts_with("used but not granted")), "{problems:?}");
                    assert!(
                        problems.iter().any(|p| p.contains(&format!(" {verb} "))),
                        "{verb}: {problems:?}"
                    );
                }
            }
        }
        // Without the eviction webhook's rules, a write to an agent's pod is
        // one no rule is there for: its own Role's pods rule is for its own
        // pods' leader label (the API server would let the patch through,
        // the chart's admission policy then keeps the pod's spec and leader
        // label as they are).
        let agent = |used: &[Access], namespace: &str| {
            let mut used = used.to_vec();
            let pod = used.iter().find(|a| a.resource == "pods" && a.namespace == COORDINATOR_NAMESPACE);
            let pod =
                Access { name: "hv-agent-x7k2p".into(), namespace: namespace.into(), ..pod.unwrap().clone() };
            used.push(pod);
            used
        };
        let agent_pod = agent(&used, COORDINATOR_NAMESPACE);
        let problems = check(&rules, &agent_pod, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("used but not granted: patch pods") && p.contains("pod-namespaces")),
            "{problems:?}"
        );
        // With them, the pods Role of the coordinator's namespace grants it,
        // and the one of the protected pods' namespace there; no rule does
        // in another namespace: the chart grants no pods cluster-wide.
        assert!(
            check(&full, &agent(&full_used, COORDINATOR_NAMESPACE), COORDINATOR_USER, COORDINATOR_NAMESPACE)
                .is_ok()
        );
        assert!(
            check(
                &full,
                &agent(&full_used, PROTECTED_POD_NAMESPACE),
                COORDINATOR_USER,
                COORDINATOR_NAMESPACE
            )
            .is_ok()
        );
        let problems =
            check(&full, &agent(&full_used, "default"), COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("used but not granted: patch pods") && p.contains("cluster rules")),
            "{problems:?}"
        );
        assert!(
            full.cluster.iter().all(|r| !r.resources.contains(&"pods".to_string())),
            "no pods cluster-wide"
        );
        // Its own pods are patched under its own Role (the leader label, held to
        // its own pod by the chart's admission policy, tests/tests/rbac.rs).
        assert!(
            rules.namespace.iter().any(|r| r.resources == ["pods"] && r.verbs == ["patch"]),
            "its own pods"
        );
        let mut wide = rules.clone();
        wide.cluster[0].verbs.push("*".into());
        assert!(
            check(&wide, &used, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err()[0].contains("wildcard")
        );
        let mut extra = rules.clone();
        extra.cluster[0].verbs.push("deletecollection".into());
        let problems = check(&extra, &used, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
        assert!(problems.iter().all(|p| p.starts_with("granted but never used")), "{problems:?}");

        // The kubelets' Leases are read in their namespace only: the same
        // rule in the ClusterRole would grant every Lease of the cluster.
        let mut leases = full.clone();
        let rule = leases.node_leases.remove(0);
        leases.cluster.push(rule);
        let problems = check(&leases, &full_used, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
        assert!(
            problems
                .iter()
                .any(|p| p.starts_with("granted but never used: get leases") && p.contains("cluster")),
            "{problems:?}"
        );
        assert!(full_used.iter().any(|a| a.namespace == NODE_LEASE_NAMESPACE && a.resource == "leases"));

        // A namespaced rule moved to the other scope: the ClusterRole
        // grants what nobody used outside the coordinator's namespace.
        let mut moved = rules.clone();
        let lease = moved.namespace.remove(0);
        moved.cluster.push(lease);
        let problems = check(&moved, &used, COORDINATOR_USER, COORDINATOR_NAMESPACE).unwrap_err();
        assert!(
            problems.iter().any(|p| p.starts_with("granted but never used") && p.contains("cluster rules"))
        );
    }

    /// The webhook reading another replica's pod in a drain needs the pods
    /// Role, whatever the pod's name; only the pod its token is bound to is
    /// its own.
    #[test]
    fn only_the_pod_its_token_is_bound_to_is_its_own() {
        let at = |name: &str, bound_pod: &str| Access {
            user: COORDINATOR_USER.into(),
            verb: "get".into(),
            group: String::new(),
            resource: "pods".into(),
            subresource: String::new(),
            namespace: COORDINATOR_NAMESPACE.into(),
            name: name.into(),
            bound_pod: bound_pod.into(),
        };
        let scope = |a: &Access| permission(a, COORDINATOR_NAMESPACE).0;
        assert_eq!(scope(&at("hv-coordinator-0", "hv-coordinator-0")), "namespace");
        assert_eq!(scope(&at("hv-coordinator-7f89f67ffb-22d7b", "hv-coordinator-0")), "pod-namespaces");
        assert_eq!(scope(&at("hv-coordinator-1", "hv-coordinator-0")), "pod-namespaces");
        assert_eq!(scope(&at("hv-coordinator-0", "")), "pod-namespaces", "a token bound to no pod");
    }
}
