//! What each client asked of the API server, as RBAC sees it, read from the
//! ground's audit log (`--audit-log-format json`: one event a line, every
//! request of a ServiceAccount of the chart's namespace at `Metadata` level).
//! The chart's RBAC is checked against it (`hv_tests::rbac`).

/// One kind of request, as an RBAC rule names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Access {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// The namespace the request named; empty for a cluster-scoped resource
    /// or a request across all namespaces (only a ClusterRole grants those).
    pub namespace: String,
    /// The object's name; empty for a request on a collection.
    pub name: String,
    /// The pod the client's token is bound to (the API server's
    /// `authentication.kubernetes.io/pod-name`); empty for a token bound
    /// to none.
    pub bound_pod: String,
}

#[derive(serde::Deserialize)]
struct Event {
    verb: String,
    user: User,
    #[serde(rename = "objectRef")]
    object_ref: Option<ObjectRef>,
    stage: String,
}

#[derive(serde::Deserialize)]
struct User {
    username: String,
    #[serde(default)]
    extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// Where the API server names the pod a ServiceAccount token is bound to.
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct ObjectRef {
    #[serde(rename = "apiGroup")]
    api_group: String,
    resource: String,
    subresource: String,
    namespace: String,
    name: String,
}

/// The requests on resources in one audit log line (None: a request on a
/// path that is not a resource, such as discovery, or a line that is not
/// an event's end).
pub fn access(line: &str) -> Option<Access> {
    let e: Event = serde_json::from_str(line).ok()?;
    // One event per request: its end (a watch's as it starts streaming).
    if e.stage != "ResponseComplete" && e.stage != "ResponseStarted" {
        return None;
    }
    let r = e.object_ref?;
    let bound_pod = e.user.extra.get(POD_NAME).and_then(|v| v.first()).cloned().unwrap_or_default();
    Some(Access {
        bound_pod,
        user: e.user.username,
        verb: e.verb,
        group: r.api_group,
        resource: r.resource,
        subresource: r.subresource,
        namespace: r.namespace,
        name: r.name,
    })
}

/// Every access in the audit log `file`, each kind once.
pub fn read(file: &std::path::Path) -> Vec<Access> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let all: std::collections::BTreeSet<Access> = text.lines().filter_map(access).collect();
    all.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_event_is_read_as_rbac_names_it() {
        let line = r#"{"kind":"Event","level":"Metadata","stage":"ResponseComplete","verb":"patch",
            "user":{"username":"system:serviceaccount:hv-system:hv-coordinator"},
            "objectRef":{"resource":"hypervisors","subresource":"status","name":"n1","apiGroup":"hypervisor.cloud.sap","apiVersion":"v1alpha1"}}"#
            .replace('\n', "");
        let a = access(&line).unwrap();
        assert_eq!(
            (
                a.verb.as_str(),
                a.group.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.namespace.as_str()
            ),
            ("patch", "hypervisor.cloud.sap", "hypervisors", "status", "")
        );
        assert_eq!(a.user, "system:serviceaccount:hv-system:hv-coordinator");
        assert_eq!(a.bound_pod, "", "a token bound to no pod");
        let bound = line.replace(
            r#""username":"system:serviceaccount:hv-system:hv-coordinator""#,
            r#""username":"system:serviceaccount:hv-system:hv-coordinator","extra":{"authentication.kubernetes.io/pod-name":["hv-coordinator-3"],"authentication.kubernetes.io/pod-uid":["5e0c"]}"#,
        );
        assert_eq!(access(&bound).unwrap().bound_pod, "hv-coordinator-3");
        let core = r#"{"stage":"ResponseStarted","verb":"watch","user":{"username":"u"},"objectRef":{"resource":"nodes","apiVersion":"v1"}}"#;
        assert_eq!(access(core).unwrap().group, "", "the core group is empty");
        let discovery =
            r#"{"stage":"ResponseComplete","verb":"get","user":{"username":"u"},"requestURI":"/apis"}"#;
        assert_eq!(access(discovery), None);
        assert_eq!(access(&line.replace("ResponseComplete", "Panic")), None);
    }
}
