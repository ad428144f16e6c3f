//! Where the VMs of a host could go, as preflight needs it: every enabled,
//! up nova-compute but the source, with its zone (os-services), its
//! aggregates' metadata (os-aggregates) and its room and traits from
//! Placement (inventories, usages, traits of the provider named after it;
//! the os-hypervisors usage fields are gone since compute 2.88).

use std::collections::{BTreeMap, BTreeSet};

use futures_util::{StreamExt, TryStreamExt, stream};
use serde::Deserialize;

use super::error::NovaError;
use super::host::NovaClient;
use super::http::{Call, Service};
use crate::eviction::preflight::{Candidate, Room, room};

/// Placement requests in flight at once while reading the candidates.
const CONCURRENCY: usize = 8;

#[derive(Debug, Deserialize)]
pub(super) struct ServiceRow {
    host: String,
    #[serde(default)]
    zone: String,
    status: String,
    state: String,
    #[serde(default)]
    forced_down: bool,
}

#[derive(Debug, Deserialize)]
pub(super) struct AggregateRow {
    #[serde(default)]
    hosts: Option<Vec<String>>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ProviderRow {
    uuid: String,
    name: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct Inventory {
    total: u64,
    #[serde(default)]
    reserved: u64,
    #[serde(default = "one")]
    allocation_ratio: f64,
    #[serde(default)]
    max_unit: Option<u64>,
}

fn one() -> f64 {
    1.0
}

impl Inventory {
    /// Room left in this inventory with `used` of it taken.
    pub(super) fn room(&self, used: u64) -> Room {
        room(self.total, self.reserved, self.allocation_ratio, self.max_unit.unwrap_or(self.total), used)
    }
}

impl NovaClient {
    /// The hosts the VMs of `source` could go to. A host without a
    /// provider in Placement is left out (the scheduler could not use it).
    pub async fn candidates(&self, source: &str) -> Result<Vec<Candidate>, NovaError> {
        // The four lists go out together: an eviction's first migration
        // waits on them.
        let services = Call::get(Service::Compute, "os-services").param("binary", "nova-compute");
        let aggregates = Call::get(Service::Compute, "os-aggregates");
        let providers = Call::get(Service::Placement, "resource_providers");
        let (services, aggregates, providers, provider_of): (
            Vec<ServiceRow>,
            Vec<AggregateRow>,
            Vec<ProviderRow>,
            _,
        ) = tokio::try_join!(
            self.cloud().fetch(services, "services"),
            self.cloud().fetch(aggregates, "aggregates"),
            self.cloud().fetch(providers, "resource_providers"),
            // A host's provider is named after its hypervisor, not its service.
            self.provider_names(),
        )?;
        let uuid_of: BTreeMap<String, String> = providers.into_iter().map(|p| (p.name, p.uuid)).collect();

        let usable = services
            .into_iter()
            .filter(|s| s.host != source && s.status == "enabled" && s.state == "up" && !s.forced_down);
        let mut wanted = Vec::new();
        for s in usable {
            let name = provider_of.get(&s.host).unwrap_or(&s.host);
            let Some(uuid) = uuid_of.get(name).cloned() else { continue };
            let metadata = aggregates
                .iter()
                .filter(|a| a.hosts.as_deref().unwrap_or_default().iter().any(|h| h == &s.host))
                .map(|a| a.metadata.clone())
                .collect();
            wanted.push((s, uuid, metadata));
        }
        stream::iter(wanted)
            .map(|(s, uuid, aggregates)| async move {
                let (room, traits) = self.provider_room(&uuid).await?;
                Ok::<_, NovaError>(Candidate { host: s.host, az: s.zone, room, traits, aggregates })
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await
    }

    async fn provider_room(
        &self,
        uuid: &str,
    ) -> Result<(BTreeMap<String, Room>, BTreeSet<String>), NovaError> {
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/inventories"));
        let inventories: BTreeMap<String, Inventory> = self.cloud().fetch(call, "inventories").await?;
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/usages"));
        let usages: BTreeMap<String, u64> = self.cloud().fetch(call, "usages").await?;
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/traits"));
        let traits: BTreeSet<String> = self.cloud().fetch(call, "traits").await?;
        let room = inventories
            .into_iter()
            .map(|(class, inv)| {
                let r = inv.room(usages.get(&class).copied().unwrap_or(0));
                (class, r)
            })
            .collect();
        Ok((room, traits))
    }
}
