//! Every compute host's room, as the hibernation policy needs it: its
//! zone and aggregates (os-services, os-aggregates), and its VCPU and
//! MEMORY_MB capacity and what is free of them (Placement inventories and
//! usages of the provider named after it).

use std::collections::BTreeMap;

use futures_util::{StreamExt, stream};

use super::capacity::Inventory;
use super::error::NovaError;
use super::host::NovaClient;
use super::http::{Call, Service};
use crate::lifecycle::ServiceState;
use crate::power::hibernation::Room;
use crate::power::policy::{HostRoom, Scope};

/// Placement requests in flight at once.
const CONCURRENCY: usize = 8;

impl NovaClient {
    /// Every nova-compute in `scopes` with a provider in Placement (one
    /// without could take no VM, and is left out, as is one whose
    /// provider could not be read this time: the policy then neither
    /// counts its room nor wakes it).
    pub async fn rooms(&self, scopes: &[Scope]) -> Result<Vec<HostRoom>, NovaError> {
        let mut wanted = Vec::new();
        for (s, uuid, aggregates) in self.computes().await? {
            let names = aggregates.into_iter().map(|a| a.name).collect();
            let in_service = s.is_enabled() && s.service_state() == ServiceState::Up;
            let room =
                HostRoom { host: s.host, zone: s.zone, aggregates: names, in_service, ..Default::default() };
            if scopes.iter().any(|scope| scope.holds(&room)) {
                wanted.push((room, uuid));
            }
        }
        let read: Vec<Option<HostRoom>> = stream::iter(wanted)
            .map(|(room, uuid)| async move {
                match self.provider_vcpu_ram(&uuid).await {
                    Ok((capacity, free)) => Some(HostRoom { capacity, free, ..room }),
                    Err(e) => {
                        tracing::warn!(node = %room.host, error = %e, "hibernation policy: room not read");
                        None
                    }
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        Ok(read.into_iter().flatten().collect())
    }

    /// A provider's VCPU and MEMORY_MB: whole, and free.
    async fn provider_vcpu_ram(&self, uuid: &str) -> Result<(Room, Room), NovaError> {
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/inventories"));
        let inventories: BTreeMap<String, Inventory> = self.cloud().fetch(call, "inventories").await?;
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/usages"));
        let usages: BTreeMap<String, u64> = self.cloud().fetch(call, "usages").await?;
        let of = |class: &str, used: bool| {
            let used = if used { usages.get(class).copied().unwrap_or(0) } else { 0 };
            inventories.get(class).map_or(0, |inv| inv.room(used).free)
        };
        let whole = Room { vcpu: of("VCPU", false), ram_mb: of("MEMORY_MB", false) };
        let free = Room { vcpu: of("VCPU", true), ram_mb: of("MEMORY_MB", true) };
        Ok((whole, free))
    }
}
