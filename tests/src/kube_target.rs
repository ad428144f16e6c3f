//! The Kubernetes API the end-to-end tests talk to: the test ground's real
//! control plane (tests/env/peers/kube.sh), with the chart installed.
//!
//! The tests read and write as the ground's administrator; a coordinator
//! runs as the chart's ServiceAccount, with a token the API server issues
//! (TokenRequest), so the chart's RBAC is what it meets.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::env::TestEnv;

/// A client as the ground's administrator, and its kubeconfig.
pub struct KubeTarget {
    pub client: kube::Client,
    pub kubeconfig: PathBuf,
}

/// The ground's API server, as its administrator; an error if it does not
/// answer.
pub async fn admin(env: &TestEnv) -> Result<KubeTarget, String> {
    let kubeconfig = env.kube.admin_kubeconfig.clone();
    let client = client_from(&kubeconfig).await?;
    client
        .apiserver_version()
        .await
        .map_err(|e| format!("the ground's API server ({}) does not answer: {e}", env.kube.url))?;
    Ok(KubeTarget { client, kubeconfig })
}

/// A client from the kubeconfig at `path`.
pub async fn client_from(path: &Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    kube::Client::try_from(config).map_err(|e| format!("building a client: {e}"))
}

/// A token of the ServiceAccount `namespace/account`, valid for a day, from
/// the API server (`kubectl create token`); bound to the Pod `pod` of that
/// namespace when given, as a pod's own token is (the API server then names
/// the pod in the requests' user info, and the token dies with the pod).
pub fn token(env: &TestEnv, namespace: &str, account: &str, pod: Option<&str>) -> Result<String, String> {
    let mut cmd = Command::new(env.kube.kubectl());
    cmd.arg("--kubeconfig").arg(&env.kube.admin_kubeconfig).args([
        "-n",
        namespace,
        "create",
        "token",
        account,
        "--duration",
        "24h",
    ]);
    if let Some(pod) = pod {
        cmd.args(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
    }
    let out = cmd.output().map_err(|e| format!("kubectl create token: {e}"))?;
    if !out.status.success() {
        return Err(format!("kubectl create token {account}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A token of the ServiceAccount `namespace/account` bound to the Pod
/// `pod`, for `audience`, living `minutes` (10 at least), as the kubelet
/// projects one.
pub fn pod_token(
    env: &TestEnv,
    namespace: &str,
    account: &str,
    pod: &str,
    audience: &str,
    minutes: u32,
) -> Result<String, String> {
    let out = Command::new(env.kube.kubectl())
        .arg("--kubeconfig")
        .arg(&env.kube.admin_kubeconfig)
        .args(["-n", namespace, "create", "token", account, "--audience", audience])
        .args([
            "--duration",
            &format!("{minutes}m"),
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            pod,
        ])
        .output()
        .map_err(|e| format!("kubectl create token: {e}"))?;
    if !out.status.success() {
        return Err(format!("kubectl create token {account}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Writes a kubeconfig at `path` for the ServiceAccount
/// `namespace/account` (its token bound to the Pod `pod`, if given),
/// reaching the API server at `server` (None: the ground's, over TLS; a
/// fault proxy's `http://` URL otherwise).
pub fn account_kubeconfig(
    env: &TestEnv,
    (namespace, account, pod): (&str, &str, Option<&str>),
    server: Option<&str>,
    path: &Path,
) -> Result<(), String> {
    let token = token(env, namespace, account, pod)?;
    let cluster = match server {
        Some(url) => format!("    server: {url}\n"),
        None => format!(
            "    server: {}\n    certificate-authority: {}\n",
            env.kube.url,
            env.kube.ca_file.display()
        ),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: hv-ground\n  cluster:\n{cluster}users:\n- name: {account}\n  user:\n    token: {token}\ncontexts:\n- name: hv-ground\n  context:\n    cluster: hv-ground\n    user: {account}\ncurrent-context: hv-ground\n"
    );
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}
