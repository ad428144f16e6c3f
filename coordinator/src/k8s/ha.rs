//! A Degraded host put into `ha` maintenance ([`health::respond`]): how many
//! hosts are being emptied for health, and the write of the spec.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::hypervisor::{Context, Error};
use crate::api::{Hypervisor, MaintenanceMode, Phase};
use crate::health::respond::{self, Response};
use crate::lifecycle::HealthObs;

/// How long a host this process put into `ha` counts though the cache does
/// not show it yet.
const CLAIM_TTL: Duration = Duration::from_secs(30);

/// The limit, and the hosts this process put into `ha` moments ago.
pub struct HaClaims {
    limit: usize,
    recent: Mutex<Vec<(String, Instant)>>,
}

impl HaClaims {
    pub fn new(limit: usize) -> Self {
        HaClaims { limit, recent: Mutex::new(Vec::new()) }
    }

    fn forget(&self, name: &str) {
        if let Ok(mut recent) = self.recent.lock() {
            recent.retain(|(n, _)| n != name);
        }
    }
}

/// Hosts other than `name` in `ha` maintenance and not yet emptied.
fn in_flight(ctx: &Context, name: &str, recent: &[(String, Instant)]) -> usize {
    let mut hosts: Vec<String> = ctx
        .hypervisors
        .state()
        .iter()
        .filter(|h| h.spec.maintenance == MaintenanceMode::Ha)
        .filter(|h| {
            let phase = h.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
            !matches!(phase, Phase::Maintenance | Phase::Decommissioned)
        })
        .map(|h| h.name_any())
        .collect();
    hosts.extend(recent.iter().map(|(n, _)| n.clone()));
    hosts.sort();
    hosts.dedup();
    hosts.iter().filter(|h| *h != name).count()
}

/// Answers the Hypervisor as it now is: with `spec.maintenance: ha` when
/// its verdict asked for it and the write went through (a conflict is an
/// error: the reconcile runs again on fresh data and decides again).
pub async fn respond(
    ctx: &Context,
    hv: std::sync::Arc<Hypervisor>,
    name: &str,
    phase: Phase,
    health: Option<&HealthObs>,
) -> Result<std::sync::Arc<Hypervisor>, Error> {
    let host = respond::Host { name, phase, maintenance: hv.spec.maintenance, health };
    // Counted and claimed under one lock, so two reconciles cannot both
    // take the last place.
    let response = {
        let Ok(mut recent) = ctx.ha.recent.lock() else { return Ok(hv) };
        recent.retain(|(_, at)| at.elapsed() < CLAIM_TTL);
        let r = respond::respond(&host, in_flight(ctx, name, &recent), ctx.ha.limit);
        if matches!(r, Response::Maintain { .. }) {
            recent.push((name.to_string(), Instant::now()));
        }
        r
    };
    let reference = hv.object_ref(&());
    match response {
        Response::Nothing => Ok(hv),
        Response::Capped { message } => {
            tracing::warn!(node = %name, "{message}");
            super::hypervisor::publish(ctx, &reference, EventType::Warning, "HaMaintenanceCapped", &message)
                .await;
            Ok(hv)
        }
        Response::Maintain { reason } => match write_maintenance(ctx, &hv, &reason).await {
            Ok(written) => {
                let note = format!(
                    "spec.maintenance set to ha ({reason}): the host is disabled and emptied, \
                     and stays in Maintenance until an SRE clears it"
                );
                tracing::warn!(node = %name, reason = %reason, "Degraded: ha maintenance set");
                super::hypervisor::publish(ctx, &reference, EventType::Warning, "HaMaintenance", &note).await;
                Ok(std::sync::Arc::new(written))
            }
            Err(e) => {
                ctx.ha.forget(name);
                Err(e.into())
            }
        },
    }
}

/// `spec.maintenance: ha` with `reason`, over the version read: a change
/// since (an SRE's own maintenance) is a conflict, never overwritten.
async fn write_maintenance(ctx: &Context, hv: &Hypervisor, reason: &str) -> Result<Hypervisor, kube::Error> {
    let rv = hv.meta().resource_version.clone().unwrap_or_default();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/spec/maintenance", "value": MaintenanceMode::Ha.as_str()},
        {"op": "add", "path": "/spec/maintenanceReason", "value": reason},
    ]))
    .map_err(kube::Error::SerdeError)?;
    let pp = PatchParams { field_manager: Some(super::FIELD_MANAGER.into()), ..Default::default() };
    let api: Api<Hypervisor> = Api::all(ctx.client.clone());
    api.patch(&hv.name_any(), &pp, &Patch::<()>::Json(patch)).await
}
