//! What the identity tests need of the ground: the chart's agent DaemonSet,
//! agent pods bound to Nodes (kwok runs them), pod-bound tokens for the
//! coordinator's audience, an expired token signed with the ground's own
//! ServiceAccount key, and a client of the coordinator's bootstrap port.

#![allow(clippy::panic)] // a test's helper fails its test

use std::path::Path;

use hv_proto::v1::identity_service_client::IdentityServiceClient;
use hv_proto::v1::{IssueRequest, IssueResponse};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};

use crate::env::TestEnv;

/// The audience the chart's agents' tokens are for.
pub const AUDIENCE: &str = "hv-coordinator";

/// The chart's agent DaemonSet: (namespace, name, uid, ServiceAccount).
pub async fn agent_daemon_set(client: &kube::Client, namespace: &str) -> (String, String, String, String) {
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels("app.kubernetes.io/component=agent");
    let ds = api.list(&lp).await.unwrap_or_else(|e| panic!("listing DaemonSets: {e}")).items;
    let ds = ds.into_iter().next().unwrap_or_else(|| panic!("no agent DaemonSet in {namespace}"));
    let account = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| panic!("the agent DaemonSet names no ServiceAccount"));
    (namespace.to_string(), ds.name_any(), ds.uid().unwrap_or_default(), account)
}

/// An agent pod `name` bound to `node`, run as `account`; controlled by the
/// DaemonSet `owner` (name, uid) if given. kwok runs it: answers once it is
/// Running.
pub async fn agent_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    node: &str,
    account: &str,
    owner: Option<(&str, &str)>,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let owners = owner.map(|(ds, uid)| {
        serde_json::json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds, "uid": uid,
                            "controller": true, "blockOwnerDeletion": true}])
    });
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "agent-test"},
                     "ownerReferences": owners.unwrap_or(serde_json::json!([]))},
        "spec": {"nodeName": node, "serviceAccountName": account, "automountServiceAccountToken": false,
                 "containers": [{"name": "agent", "image": "hv-agent"}],
                 "tolerations": [{"operator": "Exists"}]},
    }))
    .unwrap_or_else(|e| panic!("{e}"));
    api.create(&PostParams::default(), &pod).await.unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    crate::wait::until(
        &format!("pod {name} Running"),
        std::time::Duration::from_secs(60),
        String::new,
        || async {
            let phase = api.get_opt(name).await.ok().flatten().and_then(|p| p.status?.phase);
            crate::wait::ready_when(phase.as_deref() == Some("Running"), phase)
        },
    )
    .await;
}

/// `token` with its times moved an hour and more into the past and signed
/// again with the ground's ServiceAccount key: a token the API server
/// itself would have issued, expired.
pub fn expired(env: &TestEnv, token: &str) -> String {
    use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.split('.');
    let (header, claims) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let mut claims: serde_json::Value =
        serde_json::from_slice(&b64.decode(claims).unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    claims["iat"] = (now - 7_200).into();
    claims["nbf"] = (now - 7_200).into();
    claims["exp"] = (now - 3_600).into();
    let signed = format!("{header}.{}", b64.encode(claims.to_string()));
    let key_path = env.kube.ca_file.parent().unwrap_or(Path::new(".")).join("sa.key");
    let pem = std::fs::read(&key_path).unwrap_or_else(|e| panic!("{}: {e}", key_path.display()));
    let der =
        <rustls_pki_types::PrivateKeyDer<'static> as rustls_pki_types::pem::PemObject>::from_pem_slice(&pem)
            .map(|k| k.secret_der().to_vec())
            .unwrap_or_else(|e| panic!("{}: {e}", key_path.display()));
    let key = RsaKeyPair::from_pkcs8(&der)
        .or_else(|_| RsaKeyPair::from_der(&der))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut sig = vec![0u8; key.public_modulus_len()];
    key.sign(&RSA_PKCS1_SHA256, &aws_lc_rs::rand::SystemRandom::new(), signed.as_bytes(), &mut sig)
        .unwrap_or_else(|e| panic!("{e}"));
    format!("{signed}.{}", b64.encode(sig))
}

/// Asks the bootstrap port at `url` (its certificate from the CA `ca`) for
/// `node`'s certificate with `token` and a new key.
pub async fn issue(url: &str, ca: &Path, node: &str, token: &str) -> Result<IssueResponse, tonic::Status> {
    let tls =
        hv_tls::client::config_without_identity(ca).map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| tonic::Status::unknown(e.to_string()))?
        .tls_config(tls)
        .map_err(|e| tonic::Status::unknown(e.to_string()))?
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(hv_tls::explain(&e)))?;
    let key = rcgen::KeyPair::generate().map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let csr = rcgen::CertificateParams::default()
        .serialize_request(&key)
        .map_err(|e| tonic::Status::unknown(e.to_string()))?;
    let ask = IssueRequest { node: node.into(), token: token.into(), csr_der: csr.der().to_vec() };
    IdentityServiceClient::new(channel).issue(ask).await.map(tonic::Response::into_inner)
}
