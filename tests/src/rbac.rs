//! The chart's RBAC, derived from what the coordinator does: the stand-in
//! records every (verb, API group, resource, subresource) each client asks
//! for during the end-to-end tests (`kube_standin::audit`), and the
//! coordinator's rules in the chart (`deploy/helm/hv/files/coordinator-rules.yaml`)
//! must grant each of them and nothing else. No wildcards.

use std::collections::BTreeSet;
use std::path::Path;

use crate::kube_standin::audit::Access;

/// The record the stand-ins of one ground add to, in its directory.
pub const AUDIT_FILE: &str = "kube-audit.jsonl";
/// The bearer token (the user) in the coordinator's kubeconfig in the tests.
pub const COORDINATOR_USER: &str = "hv-coordinator";

/// One RBAC rule, as in a ClusterRole or Role.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Rule {
    #[serde(rename = "apiGroups")]
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

/// The coordinator's rules: cluster-wide (its ClusterRole), and in its own
/// namespace (its Role: the leader-election Lease).
#[derive(Clone, Debug, serde::Deserialize)]
pub struct Rules {
    pub cluster: Vec<Rule>,
    pub namespace: Vec<Rule>,
}

/// A permission: verb, group, and resource or resource/subresource.
pub type Permission = (String, String, String);

fn permission(a: &Access) -> Permission {
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    (a.verb.clone(), a.group.clone(), resource)
}

/// Every permission `rules` grant; a wildcard is an error.
pub fn granted(rules: &Rules) -> Result<BTreeSet<Permission>, String> {
    let mut out = BTreeSet::new();
    for r in rules.cluster.iter().chain(&rules.namespace) {
        for field in r.api_groups.iter().chain(&r.resources).chain(&r.verbs) {
            if field.contains('*') {
                return Err(format!("a wildcard in {r:?}: grant what is used, by name"));
            }
        }
        for g in &r.api_groups {
            for res in &r.resources {
                for v in &r.verbs {
                    out.insert((v.clone(), g.clone(), res.clone()));
                }
            }
        }
    }
    Ok(out)
}

/// Compares what `user` used with what `rules` grant: every use granted,
/// every grant used. The error lists each difference.
pub fn check(rules: &Rules, used: &[Access], user: &str) -> Result<usize, Vec<String>> {
    let granted = granted(rules).map_err(|e| vec![e])?;
    let used: BTreeSet<Permission> = used.iter().filter(|a| a.user == user).map(permission).collect();
    let mut problems: Vec<String> = used
        .difference(&granted)
        .map(|(v, g, r)| format!("used but not granted: {v} {r} (group {g:?})"))
        .collect();
    problems.extend(
        granted.difference(&used).map(|(v, g, r)| format!("granted but never used: {v} {r} (group {g:?})")),
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
            .map(|(verb, group, res)| {
                let (resource, subresource) = match res.split_once('/') {
                    Some((r, s)) => (r.to_string(), s.to_string()),
                    None => (res, String::new()),
                };
                Access { user: COORDINATOR_USER.into(), verb, group, resource, subresource }
            })
            .collect()
    }

    /// The chart's rules grant exactly what they grant; removing any one
    /// rule's verb fails the check naming it, and so does a wildcard or a
    /// grant nobody uses.
    #[test]
    fn the_check_fails_when_a_rule_is_removed_widened_or_unused() {
        let rules = read_rules(&chart_rules()).unwrap();
        let used = uses(&rules);
        assert!(!used.is_empty());
        assert_eq!(check(&rules, &used, COORDINATOR_USER), Ok(used.len()));
        // Another user's requests are not the coordinator's.
        let mut others = used.clone();
        others.push(Access { user: "anonymous".into(), verb: "delete".into(), ..used[0].clone() });
        assert!(check(&rules, &others, COORDINATOR_USER).is_ok());

        for (i, rule) in rules.cluster.iter().enumerate() {
            for (j, verb) in rule.verbs.iter().enumerate() {
                let mut fewer = rules.clone();
                fewer.cluster[i].verbs.remove(j);
                let problems = check(&fewer, &used, COORDINATOR_USER).unwrap_err();
                assert!(problems.iter().all(|p| p.starts_with("used but not granted")), "{problems:?}");
                assert!(problems.iter().any(|p| p.contains(&format!(" {verb} "))), "{verb}: {problems:?}");
            }
        }
        let mut wide = rules.clone();
        wide.cluster[0].verbs.push("*".into());
        assert!(check(&wide, &used, COORDINATOR_USER).unwrap_err()[0].contains("wildcard"));
        let mut extra = rules.clone();
        extra.cluster[0].verbs.push("deletecollection".into());
        let problems = check(&extra, &used, COORDINATOR_USER).unwrap_err();
        assert!(problems.iter().all(|p| p.starts_with("granted but never used")), "{problems:?}");
    }
}
