//! `hvctl hibernate` and `hvctl wake`: the spec's `powerState`
//! (docs/power.md). The coordinator walks the host there; its
//! `PowerState` condition says how it goes.

use hv_coordinator::api::Phase;
use hv_coordinator::api::keys::POWER_BY_ANNOTATION;
use hv_coordinator::api::power::DesiredPower;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};

use crate::exit::Outcome;
use crate::kube_api::{hypervisor, hypervisors};

pub async fn set(kube: &kube::Client, node: &str, wish: DesiredPower) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    let status = hv.status.as_ref();
    let power = status.and_then(|s| s.power_state);
    if wish == DesiredPower::Hibernating {
        if hv.spec.fencing.bmc.is_none() {
            anyhow::bail!(
                "{node}: no BMC (spec.fencing.bmc): a host powered off could not be powered on again"
            );
        }
        let phase = status.and_then(|s| s.phase).unwrap_or_default();
        if phase != Phase::Active {
            eprintln!("hvctl: {node} is {phase}: it hibernates once it is Active and empty");
        }
        if let Some(n) = status.and_then(|s| s.instances.as_ref()).map(|i| i.count).filter(|n| *n > 0) {
            eprintln!("hvctl: {node} has {n} servers: it hibernates only once they are gone (hvctl evict)");
        }
    }
    let by_policy = hv.annotations().contains_key(POWER_BY_ANNOTATION);
    if hv.spec.power_state == wish && !by_policy {
        let now = power.map(|p| p.to_string()).unwrap_or_else(|| "Running".into());
        println!("{node}: spec.powerState is {wish:?} already (now {now})");
        return Ok(Outcome::Done);
    }
    // The wish becomes the SRE's: the hibernation policy leaves it be.
    let patch = serde_json::json!({
        "metadata": {"annotations": {POWER_BY_ANNOTATION: null}},
        "spec": {"powerState": wish},
    });
    hypervisors(kube).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    println!("{node}: spec.powerState set to {wish:?}; its PowerState condition says how it goes");
    Ok(Outcome::Done)
}
