//! What the API server says for an agent asking for its certificate
//! ([`crate::identity`]): its token reviewed, the pod the token is bound
//! to, the agents' DaemonSet, and the Node. Fresh reads every time, never
//! a cache: a pod deleted a moment ago must not get a certificate.

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::{Api, Client};

use crate::identity::{NodeSeen, PodSeen, Reviewed};

/// The extras a bound token carries (the API server's names).
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// The reads, on a client that is not held back for want of the lease
/// (a TokenReview is a POST that changes nothing): only the leader asks,
/// which the gRPC endpoint sees to.
#[derive(Clone)]
pub struct ClusterVouch {
    pub client: Client,
}

#[tonic::async_trait]
impl crate::fleet::identity_service::Vouch for ClusterVouch {
    async fn review(&self, token: &str, audience: &str) -> Result<Reviewed, kube::Error> {
        let ask = TokenReview {
            spec: TokenReviewSpec { token: Some(token.into()), audiences: Some(vec![audience.into()]) },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api.create(&PostParams::default(), &ask).await?;
        Ok(reviewed(answer))
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodSeen>, kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?.map(|p| pod_seen(&p)))
    }

    async fn daemon_set_uid(&self, namespace: &str, name: &str) -> Result<Option<String>, kube::Error> {
        let api: Api<DaemonSet> = Api::namespaced(self.client.clone(), namespace);
        Ok(api.get_opt(name).await?.and_then(|d| d.metadata.uid))
    }

    async fn node(&self, name: &str) -> Result<NodeSeen, kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        Ok(match api.get_opt(name).await? {
            None => NodeSeen::Missing,
            Some(n) if n.metadata.deletion_timestamp.is_some() => NodeSeen::Deleting,
            Some(_) => NodeSeen::Present,
        })
    }
}

/// The review's answer in our terms. An extra the API server gives as a
/// list counts only with exactly one value.
fn reviewed(answer: TokenReview) -> Reviewed {
    let status = answer.status.unwrap_or_default();
    let user = status.user.unwrap_or_default();
    let extra = user.extra.unwrap_or_default();
    let one = |key: &str| match extra.get(key).map(Vec::as_slice) {
        Some([v]) => Some(v.clone()),
        _ => None,
    };
    Reviewed {
        authenticated: status.authenticated.unwrap_or(false),
        error: status.error.unwrap_or_default(),
        username: user.username.unwrap_or_default(),
        audiences: status.audiences.unwrap_or_default(),
        pod_name: one(POD_NAME),
        pod_uid: one(POD_UID),
        credential_id: one(CREDENTIAL_ID),
    }
}

fn pod_seen(p: &Pod) -> PodSeen {
    let controller = p.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    PodSeen {
        uid: p.metadata.uid.clone().unwrap_or_default(),
        controller: controller.map(|o| (o.kind.clone(), o.name.clone(), o.uid.clone())),
        node_name: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: p.status.as_ref().and_then(|s| s.phase.clone()),
        deleting: p.metadata.deletion_timestamp.is_some(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_bound_tokens_review_names_its_pod_and_its_id() {
        let answer: TokenReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {},
            "status": {"authenticated": true, "audiences": ["hypervisor.cloud.sap"],
                "user": {"username": "system:serviceaccount:hv-system:hv-agent",
                    "extra": {POD_NAME: ["hv-agent-x1"], POD_UID: ["u1"], CREDENTIAL_ID: ["JTI=abc"],
                              "authentication.kubernetes.io/node-name": ["node-a"]}}}
        }))
        .unwrap();
        let r = reviewed(answer);
        assert!(r.authenticated);
        assert_eq!(r.pod_name.as_deref(), Some("hv-agent-x1"));
        assert_eq!(r.pod_uid.as_deref(), Some("u1"));
        assert_eq!(r.credential_id.as_deref(), Some("JTI=abc"));
        assert_eq!(r.audiences, vec!["hypervisor.cloud.sap".to_string()]);
    }

    #[test]
    fn a_refused_review_keeps_the_api_servers_reason_and_two_pods_are_none() {
        let answer: TokenReview = serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {},
            "status": {"authenticated": false, "error": "token has expired",
                "user": {"extra": {POD_NAME: ["a", "b"]}}}
        }))
        .unwrap();
        let r = reviewed(answer);
        assert!(!r.authenticated);
        assert_eq!(r.error, "token has expired");
        assert_eq!(r.pod_name, None);
    }

    #[test]
    fn a_pod_is_seen_with_its_controller_node_and_phase() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u", "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "x"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "hv-agent", "uid": "d", "controller": true}]},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        let seen = pod_seen(&pod);
        assert_eq!(seen.controller, Some(("DaemonSet".into(), "hv-agent".into(), "d".into())));
        assert_eq!(
            (seen.node_name.as_deref(), seen.phase.as_deref(), seen.deleting),
            (Some("node-a"), Some("Running"), false)
        );
    }
}
