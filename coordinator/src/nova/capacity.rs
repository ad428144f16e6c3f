//! Where the VMs of a host could go, as preflight needs it: every enabled,
//! up nova-compute but the source, with its zone (os-services), its
//! aggregates' metadata (os-aggregates) and its room from Placement
//! (inventories and usages of the provider named after it; the
//! os-hypervisors usage fields are gone since compute 2.88); and which
//! providers carry the traits the VMs name.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::{StreamExt, TryStreamExt, stream};
use serde::Deserialize;

use super::error::NovaError;
use super::host::NovaClient;
use super::http::{Call, Service};
use crate::eviction::preflight::{Candidate, Room, room};
use crate::lifecycle::ServiceState;

/// Placement requests in flight at once while reading the candidates.
const CONCURRENCY: usize = 8;

/// A nova-compute, its provider's uuid, the aggregates it is in.
pub(super) type Compute = (super::host::ComputeService, String, Vec<AggregateRow>);

#[derive(Clone, Debug, Deserialize)]
pub(super) struct AggregateRow {
    #[serde(default)]
    pub(super) name: String,
    #[serde(default)]
    pub(super) hosts: Option<Vec<String>>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ProviderRow {
    pub(super) uuid: String,
    pub(super) name: String,
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
    /// The hosts the VMs of `source` could go to, and `asleep` (hosts the
    /// hibernation policy could wake) marked as such whatever their
    /// service says. A host without a provider in Placement is left out
    /// (the scheduler could not use it).
    pub async fn candidates(&self, source: &str, asleep: &[String]) -> Result<Vec<Candidate>, NovaError> {
        let mut wanted = Vec::new();
        for (s, uuid, aggregates) in self.computes().await?.into_iter().filter(|(s, _, _)| s.host != source) {
            let awake = s.is_enabled() && s.service_state() == ServiceState::Up;
            if !awake && !asleep.contains(&s.host) {
                continue;
            }
            wanted.push(Candidate {
                host: s.host.clone(),
                provider: uuid,
                az: s.zone,
                aggregates: aggregates.into_iter().map(|a| a.metadata).collect(),
                // One the policy is changing counts only once awake, whatever
                // its service says now (a hibernation not yet disabled).
                asleep: !awake || asleep.contains(&s.host),
                // Its room is read next; its traits and software are the
                // caller's to say (`k8s::eviction`).
                ..Candidate::default()
            });
        }
        stream::iter(wanted)
            .map(|c| async move {
                Ok::<_, NovaError>(Candidate { room: self.provider_room(&c.provider).await?, ..c })
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect()
            .await
    }

    /// Every nova-compute with a provider in Placement (its uuid), and the
    /// aggregates it is a member of. The four lists go out together: an
    /// eviction's first migration waits on them.
    pub(super) async fn computes(&self) -> Result<Vec<Compute>, NovaError> {
        let aggregates = Call::get(Service::Compute, "os-aggregates");
        let providers = Call::get(Service::Placement, "resource_providers");
        let (services, aggregates, providers, provider_of): (
            Vec<super::host::ComputeService>,
            Vec<AggregateRow>,
            Vec<ProviderRow>,
            _,
        ) = tokio::try_join!(
            self.compute_services(None),
            self.cloud().fetch(aggregates, "aggregates"),
            self.cloud().fetch(providers, "resource_providers"),
            // A host's provider is named after its hypervisor, not its service.
            self.provider_names(),
        )?;
        let uuid_of: BTreeMap<String, String> = providers.into_iter().map(|p| (p.name, p.uuid)).collect();
        let mut out = Vec::new();
        for s in services {
            let name = provider_of.get(&s.host).unwrap_or(&s.host);
            let Some(uuid) = uuid_of.get(name).cloned() else { continue };
            let member =
                |a: &&AggregateRow| a.hosts.as_deref().unwrap_or_default().iter().any(|h| h == &s.host);
            let of = aggregates.iter().filter(member).cloned().collect();
            out.push((s, uuid, of));
        }
        Ok(out)
    }

    async fn provider_room(&self, uuid: &str) -> Result<BTreeMap<String, Room>, NovaError> {
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/inventories"));
        let inventories: BTreeMap<String, Inventory> = self.cloud().fetch(call, "inventories").await?;
        let call = Call::get(Service::Placement, format!("resource_providers/{uuid}/usages"));
        let usages: BTreeMap<String, u64> = self.cloud().fetch(call, "usages").await?;
        let room = inventories
            .into_iter()
            .map(|(class, inv)| {
                let r = inv.room(usages.get(&class).copied().unwrap_or(0));
                (class, r)
            })
            .collect();
        Ok(room)
    }

    /// The providers (by uuid) that carry each of `traits`: a trait whose
    /// name Placement could not hold (its names are capitals, digits and
    /// underscores) or does not know is carried by none.
    pub async fn carriers(
        &self,
        traits: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, BTreeSet<String>>, NovaError> {
        let asked: Vec<&str> = traits.iter().map(String::as_str).filter(|t| placement_name(t)).collect();
        let (carried, _) = self.providers_with(&asked).await?;
        let mut all: BTreeMap<String, BTreeSet<String>> =
            traits.iter().map(|t| (t.clone(), BTreeSet::new())).collect();
        all.extend(carried.into_iter().map(|(t, by)| (t, by.into_iter().collect())));
        Ok(all)
    }
}

/// Placement's rule for a trait's name: 1 to 255 capitals, digits and
/// underscores. Asking about another is a 400.
fn placement_name(t: &str) -> bool {
    (1..=255).contains(&t.len())
        && t.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_names_placement_could_hold_are_asked_about() {
        assert!(super::placement_name("HW_CPU_X86_AVX2"));
        assert!(super::placement_name("CUSTOM_GPU_2"));
        assert!(!super::placement_name(""));
        assert!(!super::placement_name("custom_gpu"));
        assert!(!super::placement_name("CUSTOM_A,CUSTOM_B"));
        assert!(!super::placement_name(&"A".repeat(256)));
    }
}
