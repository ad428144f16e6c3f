//! What a verdict asks of the fleet ([`health::respond`]): a Degraded host
//! put into `ha` maintenance under its limit (counted, and the spec
//! written), and the gate on disabling hosts for being unseen.

use std::time::Duration;

use kube::api::Api;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::hypervisor::{Context, Error};
use crate::api::hypervisor::HealthState;
use crate::api::{Hypervisor, MaintenanceMode, Phase};
use crate::health::respond::{self, Response};
use crate::lifecycle::HealthObs;

/// How long a host this process put into `ha` counts though the cache does
/// not show it yet.
const CLAIM_TTL: Duration = Duration::from_secs(30);

/// The limits, and the hosts this process put into `ha` moments ago.
pub struct HaClaims {
    limit: usize,
    unseen_max_share: u8,
    claims: super::claims::Claims,
}

impl HaClaims {
    pub fn new(limit: usize, unseen_max_share: u8) -> Self {
        HaClaims { limit, unseen_max_share, claims: super::claims::Claims::new(CLAIM_TTL) }
    }
}

/// The Hypervisors of the Nodes this coordinator manages.
fn managed(ctx: &Context) -> Vec<std::sync::Arc<Hypervisor>> {
    let nodes = ctx.nodes.state();
    let managed: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.name_any()).collect();
    ctx.hypervisors.state().into_iter().filter(|h| managed.contains(&h.name_any())).collect()
}

/// Hosts other than `name` in `ha` maintenance set for health, until an
/// SRE clears it (a host waiting in Maintenance for its repair counts).
fn in_flight(ctx: &Context, name: &str, claimed: &super::claims::Live<'_>) -> usize {
    let mut hosts: Vec<String> = managed(ctx)
        .iter()
        .filter(|h| {
            let phase = h.status.as_ref().and_then(|s| s.phase);
            respond::counts_against_limit(h.spec.maintenance, &h.spec.maintenance_reason, phase)
        })
        .map(|h| h.name_any())
        .collect();
    hosts.extend(claimed.names().map(str::to_string));
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
    terminating: bool,
    health: Option<&HealthObs>,
) -> Result<std::sync::Arc<Hypervisor>, Error> {
    let host = respond::Host { name, phase, maintenance: hv.spec.maintenance, terminating, health };
    // Counted and claimed under one lock, so two reconciles cannot both
    // take the last place.
    let response = ctx.ha.claims.with(|claimed| {
        let r = respond::respond(&host, || in_flight(ctx, name, claimed), ctx.ha.limit);
        if matches!(r, Response::Maintain { .. }) {
            claimed.claim(name);
        }
        r
    });
    match response {
        Response::Nothing => Ok(hv),
        Response::Capped { message } => {
            tracing::warn!(node = %name, "{message}");
            let reference = hv.object_ref(&());
            super::hypervisor::publish(ctx, &reference, EventType::Warning, "HaMaintenanceCapped", &message)
                .await;
            Ok(hv)
        }
        Response::Maintain { reason } => maintain(ctx, hv, name, &reason).await,
    }
}

/// Why the host would be put into `ha` maintenance now, for a host whose
/// hands are off (crate::lifecycle::hands): the same decision, with no
/// place claimed and nothing written.
pub fn would(
    ctx: &Context,
    hv: &Hypervisor,
    phase: Phase,
    terminating: bool,
    health: Option<&HealthObs>,
) -> Option<String> {
    let name = hv.name_any();
    let host = respond::Host { name: &name, phase, maintenance: hv.spec.maintenance, terminating, health };
    let response = ctx
        .ha
        .claims
        .with(|claimed| respond::respond(&host, || in_flight(ctx, &name, claimed), ctx.ha.limit));
    match response {
        Response::Maintain { reason } => Some(reason),
        _ => None,
    }
}

/// Sets `spec.maintenance: ha` for `reason`; the claim goes when the
/// write does not happen.
async fn maintain(
    ctx: &Context,
    hv: std::sync::Arc<Hypervisor>,
    name: &str,
    reason: &str,
) -> Result<std::sync::Arc<Hypervisor>, Error> {
    let reference = hv.object_ref(&());
    let written =
        super::write::maintenance(&Api::all(ctx.client.clone()), &hv, MaintenanceMode::Ha, reason).await;
    let (event, note) = match written {
        // The object changed since it was read: decide again on fresh data.
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
            ctx.ha.claims.forget(name);
            return Err(kube::Error::Api(e).into());
        }
        Ok(written) => {
            let note = format!(
                "spec.maintenance set to ha ({reason}): the host is disabled and emptied, \
                 and stays in Maintenance until an SRE clears it"
            );
            tracing::warn!(node = %name, reason = %reason, "Degraded: ha maintenance set");
            super::hypervisor::publish(ctx, &reference, EventType::Warning, "HaMaintenance", &note).await;
            return Ok(std::sync::Arc::new(written));
        }
        // Anything else must not stop the host's lifecycle: told, and
        // tried again at the next reconcile.
        Err(e) => {
            ctx.ha.claims.forget(name);
            tracing::warn!(node = %name, error = %e, "could not set ha maintenance");
            ("HaMaintenanceFailed", format!("could not set spec.maintenance to ha ({reason}): {e}"))
        }
    };
    super::hypervisor::publish(ctx, &reference, EventType::Warning, event, &note).await;
    Ok(hv)
}

/// Why new unseen holds are held back now, if they are: this host's
/// verdict with the others' recorded ones, against `--unseen-max-share`.
pub fn unseen_hold_back(ctx: &Context, name: &str, own: &HealthObs) -> Option<String> {
    let lost = |s: HealthState| matches!(s, HealthState::Unreachable | HealthState::Failed);
    // The fleet is scanned only for a lost host: the gate says nothing of others.
    if !lost(own.state) {
        return None;
    }
    let others: Vec<HealthState> = managed(ctx)
        .iter()
        .filter(|h| h.name_any() != name)
        .filter_map(|h| h.status.as_ref().and_then(|s| s.health.as_ref()).map(|x| x.state))
        .collect();
    let judged = others.len() + 1;
    let lost_now = others.iter().filter(|s| lost(**s)).count() + usize::from(lost(own.state));
    respond::unseen_gate(lost_now, judged, ctx.ha.unseen_max_share)
}
