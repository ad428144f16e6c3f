//! The Kubernetes client, from the caller's kubeconfig and context.

use std::path::Path;

use anyhow::Context as _;
use hv_coordinator::api::{Eviction, Hypervisor};
use kube::Api;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};

pub async fn client(kubeconfig: Option<&Path>, context: Option<&str>) -> anyhow::Result<kube::Client> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
    let config = match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(path).with_context(|| format!("kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options).await?
        }
        None if context.is_some() => Config::from_kubeconfig(&options).await?,
        None => Config::infer()
            .await
            .context("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster")?,
    };
    Ok(kube::Client::try_from(config)?)
}

pub fn hypervisors(client: &kube::Client) -> Api<Hypervisor> {
    Api::all(client.clone())
}

pub fn evictions(client: &kube::Client) -> Api<Eviction> {
    Api::all(client.clone())
}

/// The Hypervisor `node`, with a plain error when there is none.
pub async fn hypervisor(client: &kube::Client, node: &str) -> anyhow::Result<Hypervisor> {
    match hypervisors(client).get_opt(node).await? {
        Some(hv) => Ok(hv),
        None => {
            anyhow::bail!("no Hypervisor {node} (hvctl list shows them; its Node may lack the managed label)")
        }
    }
}
