//! Which Kubernetes API the end-to-end tests talk to.
//!
//! With `KUBECONFIG` set, a real cluster: it must answer, and the project's
//! CRDs are applied to it. With `HV_REQUIRE_CLUSTER=1`, a cluster is
//! mandatory: no answer is a failure, never a silent fallback. Otherwise a
//! fresh in-process [`StandIn`] per test.

use std::path::PathBuf;

use crate::kube_standin::StandIn;

/// A client, and the stand-in behind it when there is no real cluster.
pub struct KubeTarget {
    pub client: kube::Client,
    pub standin: Option<StandIn>,
}

impl KubeTarget {
    pub fn is_real_cluster(&self) -> bool {
        self.standin.is_none()
    }
}

/// From the environment (`KUBECONFIG`, `HV_REQUIRE_CLUSTER`).
pub async fn from_env() -> Result<KubeTarget, String> {
    let kubeconfig = std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()).map(PathBuf::from);
    let require = std::env::var("HV_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
    connect(kubeconfig, require).await
}

pub async fn connect(kubeconfig: Option<PathBuf>, require_cluster: bool) -> Result<KubeTarget, String> {
    match kubeconfig {
        Some(path) => {
            let opts = kube::config::KubeConfigOptions::default();
            let kc = kube::config::Kubeconfig::read_from(&path)
                .map_err(|e| format!("KUBECONFIG {}: {e}", path.display()))?;
            let config = kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .map_err(|e| format!("KUBECONFIG {}: {e}", path.display()))?;
            let client = kube::Client::try_from(config).map_err(|e| format!("building a client: {e}"))?;
            client
                .apiserver_version()
                .await
                .map_err(|e| format!("the cluster in KUBECONFIG {} does not answer: {e}", path.display()))?;
            install_crds(&client).await?;
            Ok(KubeTarget { client, standin: None })
        }
        None if require_cluster => {
            Err("HV_REQUIRE_CLUSTER=1 but KUBECONFIG is not set: no cluster to run against".to_string())
        }
        None => {
            // Who asked for what, added to the ground's record (the chart's
            // RBAC is checked against it after the suite).
            let audit = crate::env::env_file().parent().map(|d| d.join(crate::rbac::AUDIT_FILE));
            let crds = crate::repo_root().join("deploy/crds");
            let s = StandIn::start_recording(&crds, ([127, 0, 0, 1], 0).into(), 10_000, audit).await?;
            let client = s.client().map_err(|e| format!("client for the stand-in: {e}"))?;
            Ok(KubeTarget { client, standin: Some(s) })
        }
    }
}

async fn install_crds(client: &kube::Client) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for crd in hv_coordinator::api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &kube::api::PatchParams::apply("hv-tests").force(), &kube::api::Patch::Apply(&crd))
            .await
            .map_err(|e| format!("applying CRD {name}: {e}"))?;
    }
    Ok(())
}
