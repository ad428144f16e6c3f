//! The CA of the coordinator's certificate, published for the agents in a
//! ConfigMap of its namespace (`--publish-server-ca`): an agent that gets
//! its certificate from the coordinator must know whom it talks to, and a
//! Secret would give every hypervisor's kubelet the coordinator's key.
//!
//! The leader writes it (made, or its key written over by server-side
//! apply, under the lease) when it starts to lead and whenever the file's
//! content changes (looked at every 30 s): a rotated CA reaches the agents'
//! mounts as the kubelet syncs them.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio::sync::watch;

use super::FIELD_MANAGER;

/// How often the file is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(30);

/// Where the CA comes from and goes.
#[derive(Clone, Debug)]
pub struct Published {
    pub file: PathBuf,
    pub namespace: String,
    pub config_map: String,
}

/// Keeps the ConfigMap equal to the file while this replica leads: read
/// back at each look, so one deleted or changed by hand is made right.
pub async fn run(client: kube::Client, to: Published, mut leader: watch::Receiver<bool>) {
    let api: Api<ConfigMap> = Api::namespaced(client, &to.namespace);
    loop {
        if *leader.borrow_and_update() {
            publish(&api, &to).await;
        }
        tokio::select! {
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            changed = leader.changed() => if changed.is_err() { return },
        }
    }
}

/// Writes the file's content where the ConfigMap does not hold it.
async fn publish(api: &Api<ConfigMap>, to: &Published) {
    let pem = match std::fs::read_to_string(&to.file) {
        Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => pem,
        Ok(_) => {
            return tracing::warn!(file = %to.file.display(), "no certificate in the CA file; not published");
        }
        Err(e) => {
            return tracing::warn!(file = %to.file.display(), error = %e, "the CA file does not read; not published");
        }
    };
    let held = match api.get_opt(&to.config_map).await {
        Ok(cm) => cm.and_then(|c| c.data).and_then(|mut d| d.remove("ca.crt")),
        Err(e) => {
            return tracing::warn!(config_map = %to.config_map, error = %e, "the published CA not read; retrying");
        }
    };
    if held.as_deref() == Some(pem.as_str()) {
        return;
    }
    match write(api, &to.config_map, &pem).await {
        Ok(()) => {
            tracing::info!(config_map = %to.config_map, "the coordinator's CA published for the agents")
        }
        Err(e) => {
            tracing::warn!(config_map = %to.config_map, error = %e, "the coordinator's CA not published; retrying")
        }
    }
}

/// Makes the ConfigMap, or, when it is there, writes its `ca.crt` over
/// (server-side apply: a hand's other keys stay).
async fn write(api: &Api<ConfigMap>, name: &str, pem: &str) -> Result<(), kube::Error> {
    let cm = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {"ca.crt": pem},
    });
    let made: ConfigMap = serde_json::from_value(cm.clone()).map_err(kube::Error::SerdeError)?;
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match api.create(&pp, &made).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&cm)).await.map(|_| ())
        }
        Err(e) => Err(e),
    }
}
