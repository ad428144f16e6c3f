//! Nova's and Placement's view of the whole fleet, read in a handful of
//! lists rather than six reads per host (docs/nova.md, "The fleet view").
//!
//! One read is: the compute services, the aggregates, the hypervisors with
//! their servers (paged), Placement's resource providers, the custom traits
//! that exist among those the fleet's Hypervisors name, and for each of
//! those the providers that carry it. Its cost grows with the number of
//! distinct custom traits and with pages of a thousand hypervisors, not with
//! hosts. [`FleetSnapshot::host`] answers what one host's own reads would
//! have, or nothing where the lists cannot tell.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::error::NovaError;
use super::host::{Aggregate, ComputeService, NovaClient, Provider, ServiceRef, nova_host_from};
use super::http::{Call, Service, field};
use crate::lifecycle::NovaObs;

/// Most hypervisors asked for in one page; Nova answers fewer when its
/// `[api] max_limit` is lower, and its next link says where to go on.
const PAGE: usize = 1000;

/// Most pages followed in one read: a next link that never ends is Nova's
/// error, not a reason to loop (a million hypervisors).
const MAX_PAGES: usize = 1000;

#[derive(Debug, Deserialize)]
struct ListedHypervisor {
    id: String,
    hypervisor_hostname: String,
    /// The compute service's host (the detail view's).
    service: ServiceRef,
    /// Always there with `with_servers` since compute 2.75; none without.
    #[serde(default)]
    servers: Vec<ListedServer>,
}

#[derive(Debug, Deserialize)]
struct ListedServer {
    uuid: String,
}

#[derive(Debug, Deserialize)]
struct Link {
    href: String,
    rel: String,
}

#[derive(Debug, Deserialize)]
struct TraitName(String);

/// A hypervisor as the lists show it.
#[derive(Clone, Debug)]
struct Listed {
    id: String,
    /// The name its resource provider has in Placement.
    hypervisor_hostname: String,
    servers: Vec<String>,
}

/// The fleet as one read found it. Immutable: a newer read replaces it.
#[derive(Debug)]
pub struct FleetSnapshot {
    /// When the read began: nothing in it is older than that.
    pub started: Instant,
    services: HashMap<String, ComputeService>,
    /// By the compute service's host.
    hypervisors: HashMap<String, Listed>,
    aggregates: Vec<Aggregate>,
    /// Provider UUIDs by name.
    providers: HashMap<String, String>,
    /// The custom traits asked about, each with the providers that carry
    /// it (none for a trait Placement does not know).
    traits: BTreeMap<String, HashSet<String>>,
    /// Requests the read took.
    pub requests: usize,
}

impl FleetSnapshot {
    /// What one host's own reads would have answered, where the lists can
    /// tell: None when the host has a compute service but no hypervisor
    /// listed under its name (its servers are then not known from the
    /// lists), or when it names a trait the read did not ask about.
    /// `traits` are the host's custom traits that matter to the lifecycle
    /// (its spec's and the ones recorded as applied); the answer's traits
    /// are those of them its provider carries, which is all the lifecycle
    /// looks at.
    pub fn host(
        &self,
        host: &str,
        wanted_aggregates: &[String],
        traits: &BTreeSet<String>,
    ) -> Option<NovaObs> {
        let Some(service) = self.services.get(host) else {
            return Some(NovaObs::NotRegistered);
        };
        let listed = self.hypervisors.get(host)?;
        if !traits.iter().all(|t| self.traits.contains_key(t)) {
            return None;
        }
        let carried = self.providers.get(&listed.hypervisor_hostname).map(|uuid| {
            traits.iter().filter(|t| self.traits.get(*t).is_some_and(|p| p.contains(uuid))).cloned().collect()
        });
        Some(NovaObs::Registered(nova_host_from(
            host,
            service.clone(),
            Some((listed.id.clone(), listed.hypervisor_hostname.clone())),
            &self.aggregates,
            wanted_aggregates,
            carried,
            listed.servers.clone(),
        )))
    }

    /// How many compute services the read found.
    pub fn hosts(&self) -> usize {
        self.services.len()
    }
}

#[cfg(test)]
impl FleetSnapshot {
    /// A fleet of one host whose lists show it as `h`, for the controllers'
    /// request-level tests.
    pub(crate) fn of_one(host: &str, h: &crate::lifecycle::NovaHost) -> FleetSnapshot {
        use crate::lifecycle::ServiceState;
        let state = match h.service_state {
            ServiceState::Up => "up",
            ServiceState::Down => "down",
            ServiceState::Unknown | ServiceState::ForcedDown => "",
        };
        let service = serde_json::json!({"id": h.service_id, "host": host,
            "status": if h.enabled { "enabled" } else { "disabled" }, "disabled_reason": h.disabled_reason,
            "state": state, "forced_down": h.service_state == ServiceState::ForcedDown});
        let aggregates = h
            .aggregates
            .iter()
            .enumerate()
            .map(|(i, name)| serde_json::json!({"id": i, "name": name, "hosts": [host]}));
        let provider = format!("rp-{host}");
        let traits = h.traits.iter().flatten().map(|t| (t.clone(), HashSet::from([provider.clone()])));
        FleetSnapshot {
            started: Instant::now(),
            services: HashMap::from([(host.to_string(), serde_json::from_value(service).unwrap())]),
            hypervisors: HashMap::from([(
                host.to_string(),
                Listed {
                    id: h.hypervisor_id.clone().unwrap_or_default(),
                    hypervisor_hostname: h.hypervisor_hostname.clone().unwrap_or_else(|| host.to_string()),
                    servers: h.instances.clone(),
                },
            )]),
            aggregates: aggregates.map(|a| serde_json::from_value(a).unwrap()).collect(),
            providers: h.traits.iter().map(|_| (host.to_string(), provider.clone())).collect(),
            traits: traits.collect(),
            requests: 0,
        }
    }
}

impl NovaClient {
    /// One read of the whole fleet (see the module doc). `traits` are the
    /// custom traits the fleet's Hypervisors name; malformed ones are the
    /// lifecycle's to report and are not asked about.
    pub async fn fleet(&self, traits: &BTreeSet<String>) -> Result<FleetSnapshot, NovaError> {
        self.fleet_in_pages(traits, PAGE).await
    }

    /// [`Self::fleet`], asking for `page` hypervisors at a time.
    pub async fn fleet_in_pages(
        &self,
        traits: &BTreeSet<String>,
        page: usize,
    ) -> Result<FleetSnapshot, NovaError> {
        let started = Instant::now();
        let mut requests = 0;
        let services: Vec<ComputeService> = self.compute_services(None).await?;
        requests += 1;
        let call = Call::get(Service::Compute, "os-aggregates");
        let aggregates: Vec<Aggregate> = self.cloud().fetch(call, "aggregates").await?;
        requests += 1;
        let (listed, pages) = self.hypervisors_listed(page, true).await?;
        requests += pages;
        self.provider_names
            .listed(listed.iter().map(|h| (h.service.host.clone(), h.hypervisor_hostname.clone())));
        let mut hypervisors = HashMap::new();
        for h in listed {
            let servers = h.servers.into_iter().map(|s| s.uuid).collect();
            let entry = Listed { id: h.id, hypervisor_hostname: h.hypervisor_hostname, servers };
            hypervisors.insert(h.service.host, entry);
        }
        let call = Call::get(Service::Placement, "resource_providers");
        let listed: Vec<Provider> = self.cloud().fetch(call, "resource_providers").await?;
        requests += 1;
        let providers = listed.into_iter().map(|p| (p.name, p.uuid)).collect();
        let asked: Vec<&str> = traits.iter().filter(|t| ours(t)).map(String::as_str).collect();
        let (carried, asks) = self.providers_with(&asked).await?;
        requests += asks;
        let services = services.into_iter().map(|s| (s.host.clone(), s)).collect();
        Ok(FleetSnapshot { started, services, hypervisors, aggregates, providers, traits: carried, requests })
    }
}

/// A trait the lifecycle may add or remove: a custom one of a spec, or
/// one a host's capabilities give. Nothing else is asked of Placement.
fn ours(t: &str) -> bool {
    crate::lifecycle::valid_trait(t) || crate::lifecycle::host_traits::is_host_trait(t)
}

/// How long a listing of the hypervisors' names stands for preflight: a
/// host's hypervisor hostname is set when its nova-compute registers, and
/// listing them took two of the preflight's requests (one per thousand
/// hosts, paged) on the path to an eviction's first migration. A host
/// listed since under another name is looked up by its service host, and
/// one without a provider by that name is left out of the candidates (the
/// preflight then errs on the side of too little room).
pub const NAMES_STAND: Duration = Duration::from_secs(300);

/// Service host → hypervisor hostname.
type Names = Arc<HashMap<String, String>>;

/// Each compute service's hypervisor hostname as last listed, with when.
#[derive(Default)]
pub struct ProviderNames(Mutex<Option<(Instant, Names)>>);

impl ProviderNames {
    /// The names listed within [`NAMES_STAND`].
    fn recent(&self) -> Option<Arc<HashMap<String, String>>> {
        let last = crate::locked::lock(&self.0);
        last.as_ref().filter(|(at, _)| at.elapsed() < NAMES_STAND).map(|(_, names)| names.clone())
    }

    /// Keeps a new listing (service host, hypervisor hostname); answers it.
    fn listed(&self, names: impl Iterator<Item = (String, String)>) -> Arc<HashMap<String, String>> {
        let names = Arc::new(names.collect::<HashMap<_, _>>());
        let mut last = crate::locked::lock(&self.0);
        *last = Some((Instant::now(), names.clone()));
        names
    }
}

impl NovaClient {
    /// The resource providers that carry each of `traits` (by uuid; none
    /// for a trait Placement does not know), and the requests it took:
    /// one per trait Placement knows, and one to learn which it knows
    /// (asking for the providers of an unknown trait is a 400). None when
    /// no trait is asked about.
    pub(super) async fn providers_with(
        &self,
        traits: &[&str],
    ) -> Result<(BTreeMap<String, HashSet<String>>, usize), NovaError> {
        let mut carried: BTreeMap<String, HashSet<String>> =
            traits.iter().map(|t| (t.to_string(), HashSet::new())).collect();
        if traits.is_empty() {
            return Ok((carried, 0));
        }
        let call = Call::get(Service::Placement, "traits").param("name", format!("in:{}", traits.join(",")));
        let existing: Vec<TraitName> = self.cloud().fetch(call, "traits").await?;
        let mut requests = 1;
        for TraitName(t) in existing {
            let call = Call::get(Service::Placement, "resource_providers").param("required", t.clone());
            let with: Vec<Provider> = self.cloud().fetch(call, "resource_providers").await?;
            requests += 1;
            carried.insert(t, with.into_iter().map(|p| p.uuid).collect());
        }
        Ok((carried, requests))
    }

    /// Every hypervisor (the detail view at 2.87, `page` at a time,
    /// following Nova's next links), with its servers if `with_servers`;
    /// and the pages it took.
    async fn hypervisors_listed(
        &self,
        page: usize,
        with_servers: bool,
    ) -> Result<(Vec<ListedHypervisor>, usize), NovaError> {
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        let mut markers = HashSet::new();
        for n in 0..MAX_PAGES {
            let mut call = Call::get(Service::Compute, "os-hypervisors/detail")
                .param("limit", page.to_string())
                .at_microversion(super::http::HYPERVISOR_DETAIL_MICROVERSION);
            if with_servers {
                call = call.param("with_servers", "true");
            }
            if let Some(m) = &marker {
                call = call.param("marker", m.clone());
            }
            let what = call.describe();
            let answer = self.cloud().call(call).await?;
            let links: Vec<Link> = answer
                .get("hypervisors_links")
                .cloned()
                .map(|v| serde_json::from_value(v).map_err(|e| NovaError::Invalid(format!("{what}: {e}"))))
                .transpose()?
                .unwrap_or_default();
            let listed: Vec<ListedHypervisor> = field(answer, "hypervisors", &what)?;
            // Nova pages its compute nodes, then leaves out those it cannot
            // map to a service (a service deleted under a running
            // nova-compute); a page so shortened has no next link though
            // more follow. So a page without a next link is followed from
            // its last hypervisor, until a page comes back empty.
            let last = listed.last().map(|h| h.id.clone());
            all.extend(listed);
            let next = match links.iter().find(|l| l.rel == "next") {
                Some(next) => next_marker(&next.href, &what)?,
                None => match last {
                    Some(id) => id,
                    None => return Ok((all, n + 1)),
                },
            };
            // A marker that goes back is Nova's error, not a page.
            if !markers.insert(next.clone()) {
                return Err(NovaError::Invalid(format!("{what}: the next page repeats marker {next}")));
            }
            marker = Some(next);
        }
        Err(NovaError::Invalid(format!("os-hypervisors: more than {MAX_PAGES} pages")))
    }

    /// Each compute service's hypervisor hostname, the name of its resource
    /// provider in Placement (libvirt's FQDN where the service host is the
    /// short name): as listed within [`NAMES_STAND`] (by the fleet view's
    /// reads, or an earlier call), else listed now.
    pub(super) async fn provider_names(&self) -> Result<Arc<HashMap<String, String>>, NovaError> {
        if let Some(names) = self.provider_names.recent() {
            return Ok(names);
        }
        let (listed, _) = self.hypervisors_listed(PAGE, false).await?;
        Ok(self.provider_names.listed(listed.into_iter().map(|h| (h.service.host, h.hypervisor_hostname))))
    }
}

/// The `marker` of Nova's next-page link.
fn next_marker(href: &str, what: &str) -> Result<String, NovaError> {
    let url = reqwest::Url::parse(href)
        .map_err(|e| NovaError::Invalid(format!("{what}: next link {href}: {e}")))?;
    url.query_pairs()
        .find(|(k, _)| k == "marker")
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| NovaError::Invalid(format!("{what}: next link without a marker: {href}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traits_asked_are_the_lifecycles_own_kinds() {
        assert!(ours("CUSTOM_HANA") && ours("HW_NIC_SRIOV") && ours("HW_CPU_X86_PDPE1GB"));
        assert!(!ours("HW_CPU_X86_AVX2") && !ours("COMPUTE_STATUS_DISABLED"), "the driver's: never ours");
    }

    #[test]
    fn hypervisor_names_listed_stand_for_five_minutes_and_a_new_listing_replaces_them() {
        let names = ProviderNames::default();
        assert!(names.recent().is_none(), "none listed yet");
        let pair = |h: &str, n: &str| (h.to_string(), n.to_string());
        names.listed([pair("compute-1", "compute-1.example.com")].into_iter());
        let got = names.recent().expect("just listed");
        assert_eq!(got.get("compute-1").map(String::as_str), Some("compute-1.example.com"));
        names.listed([pair("compute-2", "compute-2")].into_iter());
        let got = names.recent().expect("listed again");
        assert!(!got.contains_key("compute-1"), "a new listing replaces the last: {got:?}");
        let old =
            Instant::now().checked_sub(NAMES_STAND + Duration::from_secs(1)).expect("a clock past its start");
        *names.0.lock().unwrap() = Some((old, got));
        assert!(names.recent().is_none(), "too old to stand");
    }

    fn service(host: &str, status: &str) -> ComputeService {
        serde_json::from_value(
            serde_json::json!({"id": format!("svc-{host}"), "host": host, "status": status,
            "state": "up", "forced_down": false}),
        )
        .unwrap()
    }

    fn snapshot() -> FleetSnapshot {
        let aggregates: Vec<Aggregate> = serde_json::from_value(serde_json::json!([
            {"id": 1, "name": "az-a", "hosts": ["c-1"]}, {"id": 2, "name": "gpu", "hosts": []}]))
        .unwrap();
        FleetSnapshot {
            started: Instant::now(),
            services: [("c-1", "enabled"), ("c-2", "disabled"), ("c-3", "enabled")]
                .into_iter()
                .map(|(h, s)| (h.to_string(), service(h, s)))
                .collect(),
            hypervisors: [
                // libvirt's hypervisor hostname is often the FQDN, the
                // service host the short name: matched by the service.
                ("c-1", "c-1.example.com", "hyp-1", vec!["vm-b".to_string(), "vm-a".to_string()]),
                ("c-2", "c-2", "hyp-2", vec![]),
            ]
            .into_iter()
            .map(|(host, name, id, servers)| {
                let listed = Listed { id: id.into(), hypervisor_hostname: name.into(), servers };
                (host.to_string(), listed)
            })
            .collect(),
            aggregates,
            providers: [("c-1.example.com".to_string(), "rp-1".to_string())].into_iter().collect(),
            traits: [
                ("CUSTOM_A".to_string(), ["rp-1".to_string()].into_iter().collect()),
                ("CUSTOM_B".to_string(), HashSet::new()),
            ]
            .into_iter()
            .collect(),
            requests: 5,
        }
    }

    fn set(t: &[&str]) -> BTreeSet<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_listed_host_is_answered_as_its_own_reads_would() {
        let s = snapshot();
        let Some(NovaObs::Registered(h)) =
            s.host("c-1", &["az-a".into(), "nope".into()], &set(&["CUSTOM_A", "CUSTOM_B"]))
        else {
            panic!("c-1 is listed");
        };
        assert_eq!(h.service_id, "svc-c-1");
        assert_eq!(h.hypervisor_id.as_deref(), Some("hyp-1"));
        assert!(h.enabled);
        assert_eq!(h.aggregates, set(&["az-a"]));
        assert_eq!(h.unknown_aggregates, set(&["nope"]));
        assert_eq!(h.traits, Some(set(&["CUSTOM_A"])), "the asked traits its provider carries");
        assert_eq!(h.instances, vec!["vm-a", "vm-b"], "sorted");
    }

    #[test]
    fn what_the_lists_cannot_tell_is_left_to_the_hosts_own_reads() {
        let s = snapshot();
        assert_eq!(s.host("c-9", &[], &set(&[])), Some(NovaObs::NotRegistered), "no compute service");
        assert_eq!(s.host("c-3", &[], &set(&[])), None, "a service without a listed hypervisor");
        assert_eq!(s.host("c-1", &[], &set(&["CUSTOM_NEW"])), None, "a trait not asked about");
        let Some(NovaObs::Registered(h)) = s.host("c-2", &[], &set(&["CUSTOM_A"])) else {
            panic!("c-2 is listed");
        };
        assert_eq!(h.traits, None, "no provider yet, as Placement would say");
        assert!(!h.enabled);
    }

    #[test]
    fn the_next_pages_marker_is_read_from_novas_link() {
        let href = "http://nova:8774/v2.1/os-hypervisors?limit=1000&marker=1b2c-3d&with_servers=true";
        assert_eq!(next_marker(href, "GET os-hypervisors").unwrap(), "1b2c-3d");
        assert!(matches!(next_marker("http://nova/x?limit=1", "x"), Err(NovaError::Invalid(_))));
        assert!(matches!(next_marker("not a url", "x"), Err(NovaError::Invalid(_))));
    }
}
