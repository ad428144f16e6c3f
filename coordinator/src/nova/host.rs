//! The lifecycle's Nova and Placement operations on one host, over [`Cloud`].
//!
//! Every operation is idempotent, because the shell may run an action twice
//! (after a crash between the call and the status write): adding a host to an
//! aggregate it is in, removing it from one it is not in, enabling an enabled
//! service and deleting a deleted one all succeed.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::NovaError;
use super::http::{Call, Cloud, Service, field};
use crate::lifecycle::{Action, NovaHost, NovaObs, ServiceState};

/// How often a generation conflict on the provider's traits is retried.
const TRAIT_ATTEMPTS: u32 = 5;

/// A row of `os-services` (nova-compute): the one way the compute service
/// is read.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct ComputeService {
    id: String,
    pub(super) host: String,
    /// Its availability zone.
    #[serde(default)]
    pub(super) zone: String,
    pub(super) status: String,
    #[serde(default)]
    disabled_reason: Option<String>,
    /// "up" or "down": Nova's service group (the last report's age).
    #[serde(default)]
    state: String,
    #[serde(default)]
    forced_down: bool,
    /// When Nova last wrote the service's row: nova-compute's reports and
    /// any change of its status alike.
    #[serde(default, deserialize_with = "super::servers::nova_time")]
    updated_at: Option<jiff::Timestamp>,
}

/// The host's compute service as Nova holds it ([`NovaClient::compute_service`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceView {
    /// It takes new VMs.
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub state: ServiceState,
    /// When Nova last wrote its row (nova-compute's reports, and any change
    /// of its status).
    pub updated_at: Option<jiff::Timestamp>,
}

impl ComputeService {
    pub(super) fn is_enabled(&self) -> bool {
        self.status == "enabled"
    }

    pub(super) fn service_state(&self) -> ServiceState {
        match (self.forced_down, self.state.as_str()) {
            (true, _) => ServiceState::ForcedDown,
            (false, "up") => ServiceState::Up,
            (false, "down") => ServiceState::Down,
            _ => ServiceState::Unknown,
        }
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct HypervisorRef {
    pub(super) id: String,
    pub(super) hypervisor_hostname: String,
    #[serde(default)]
    pub(super) service: Option<ServiceRef>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ServiceRef {
    pub(super) host: String,
}

#[derive(Clone, Debug, Deserialize)]
pub(super) struct Aggregate {
    id: i64,
    name: String,
    #[serde(default)]
    hosts: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct Provider {
    pub(super) uuid: String,
    #[serde(default)]
    pub(super) name: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct ProviderTraits {
    traits: Vec<String>,
    resource_provider_generation: i64,
}

#[derive(Debug, Deserialize)]
pub(super) struct ServerRef {
    id: String,
}

/// The lifecycle's view of one host from what Nova and Placement answered,
/// however they were asked (one host's own reads, or the fleet's lists in
/// [`super::fleet`]): one rule for both, so the two can be compared.
/// Instances are sorted: the two sources list them in different orders.
pub(super) fn nova_host_from(
    host: &str,
    service: ComputeService,
    hypervisor: Option<(String, String)>,
    aggregates: &[Aggregate],
    wanted_aggregates: &[String],
    traits: Option<BTreeSet<String>>,
    mut instances: Vec<String>,
) -> NovaHost {
    let member: BTreeSet<String> = aggregates
        .iter()
        .filter(|a| a.hosts.as_deref().unwrap_or_default().iter().any(|h| h == host))
        .map(|a| a.name.clone())
        .collect();
    let known: BTreeSet<&str> = aggregates.iter().map(|a| a.name.as_str()).collect();
    let unknown = wanted_aggregates.iter().filter(|a| !known.contains(a.as_str())).cloned().collect();
    instances.sort();
    let (hypervisor_id, hypervisor_hostname) = hypervisor.unzip();
    NovaHost {
        service_state: service.service_state(),
        enabled: service.status == "enabled",
        service_id: service.id,
        hypervisor_id,
        hypervisor_hostname,
        disabled_reason: service.disabled_reason,
        aggregates: member,
        unknown_aggregates: unknown,
        traits,
        instances,
    }
}

/// Nova and Placement as the lifecycle needs them.
pub struct NovaClient {
    cloud: Cloud,
    /// Each compute service's hypervisor hostname, as last listed
    /// (`snapshot::ProviderNames`).
    pub(super) provider_names: super::snapshot::ProviderNames,
    /// Nova refused the servers list at the image properties' microversion
    /// (an older release): not asked at it again by this process.
    pub(super) no_image_properties: std::sync::atomic::AtomicBool,
}

impl NovaClient {
    pub fn new(cloud: Cloud) -> NovaClient {
        NovaClient { cloud, provider_names: Default::default(), no_image_properties: Default::default() }
    }

    pub(super) fn cloud(&self) -> &Cloud {
        &self.cloud
    }

    /// Nova's view of `host`, for the lifecycle core.
    pub async fn observe(&self, host: &str, wanted_aggregates: &[String]) -> NovaObs {
        match self.try_observe(host, wanted_aggregates).await {
            Ok(Some(h)) => NovaObs::Registered(h),
            Ok(None) => NovaObs::NotRegistered,
            Err(NovaError::Unauthorized(m)) => NovaObs::Rejected(m),
            Err(e) => NovaObs::Unreachable(e.to_string()),
        }
    }

    async fn try_observe(
        &self,
        host: &str,
        wanted_aggregates: &[String],
    ) -> Result<Option<NovaHost>, NovaError> {
        let Some(service) = self.service(host).await? else {
            return Ok(None);
        };
        // The reads that do not depend on each other go out together: a
        // host's own look is on the path of every transition (an eviction
        // waits on it before its host is disabled).
        let (hypervisor, aggregates, instances) =
            tokio::try_join!(self.hypervisor(host), self.aggregates(), self.instances(host))?;
        let node = hypervisor.as_ref().map_or(host, |h| h.hypervisor_hostname.as_str());
        let traits = match self.provider(node).await? {
            Some(p) => Some(self.traits(&p.uuid).await?.traits.into_iter().collect()),
            None => None,
        };
        Ok(Some(nova_host_from(
            host,
            service,
            hypervisor.map(|h| (h.id, h.hypervisor_hostname)),
            &aggregates,
            wanted_aggregates,
            traits,
            instances,
        )))
    }

    /// Runs one action of a decision against Nova or Placement. `service_id`
    /// is the one last observed (needed by the os-services calls).
    pub async fn execute(
        &self,
        host: &str,
        service_id: Option<&str>,
        action: &Action,
    ) -> Result<(), NovaError> {
        // Status and reason of the compute service go in one PUT (2.53+).
        let set_service = |body: Value| -> Result<Call, NovaError> {
            let id = service_id
                .ok_or_else(|| NovaError::NotFound(format!("no compute service known for {host}")))?;
            Ok(Call::with(Service::Compute, http::Method::PUT, format!("os-services/{id}"), body))
        };
        match action {
            Action::DisableService { reason } => {
                self.cloud
                    .call(set_service(json!({"status": "disabled", "disabled_reason": reason}))?)
                    .await?;
            }
            Action::EnableService => {
                self.cloud.call(set_service(json!({"status": "enabled"}))?).await?;
            }
            Action::AddAggregate { name } => self.aggregate_host(host, name, true).await?,
            Action::RemoveAggregate { name } => self.aggregate_host(host, name, false).await?,
            Action::AddTraits { traits } => {
                self.change_traits(host, |t| t.extend(traits.iter().cloned()), traits).await?
            }
            Action::RemoveTraits { traits } => {
                self.change_traits(host, |t| t.retain(|x| !traits.contains(x)), &BTreeSet::new()).await?
            }
            Action::DeleteService { service_id } => {
                match self
                    .cloud
                    .call(Call::delete(Service::Compute, format!("os-services/{service_id}")))
                    .await
                {
                    Ok(_) | Err(NovaError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            // Not Nova's: the shell hands these to the agent session or the
            // Kubernetes API.
            Action::RunChecks { .. }
            | Action::CreateEviction { .. }
            | Action::CancelEviction { .. }
            | Action::PowerOff
            | Action::PowerOn => {}
        }
        Ok(())
    }

    /// The nova-compute services, of `host` only or of the whole region:
    /// the one read of `os-services`.
    pub(super) async fn compute_services(
        &self,
        host: Option<&str>,
    ) -> Result<Vec<ComputeService>, NovaError> {
        let call = Call::get(Service::Compute, "os-services").param("binary", "nova-compute");
        let call = match host {
            Some(host) => call.param("host", host),
            None => call,
        };
        self.cloud.fetch(call, "services").await
    }

    async fn service(&self, host: &str) -> Result<Option<ComputeService>, NovaError> {
        Ok(self.compute_services(Some(host)).await?.into_iter().find(|s| s.host == host))
    }

    /// Marks the host's compute service forced down (or lifts it): Nova
    /// then treats it as down whatever its service group says, accepts
    /// `evacuate` of its servers and schedules nothing there. Idempotent;
    /// [`Self::compute_service`] reads it back. The first fencing step, and the
    /// last thing lifted when an SRE brings a fenced host back.
    pub async fn set_forced_down(&self, host: &str, down: bool) -> Result<(), NovaError> {
        let service = self
            .service(host)
            .await?
            .ok_or_else(|| NovaError::NotFound(format!("no compute service known for {host}")))?;
        let call = Call::with(
            Service::Compute,
            http::Method::PUT,
            format!("os-services/{}", service.id),
            json!({"forced_down": down}),
        );
        self.cloud.call(call).await.map(|_| ())
    }

    /// The host's compute service as Nova holds it: enabled or not (with
    /// why), forced down or its service group's up or down; None without a
    /// service. One call.
    pub async fn compute_service(&self, host: &str) -> Result<Option<ServiceView>, NovaError> {
        Ok(self.service(host).await?.map(|s| ServiceView {
            enabled: s.is_enabled(),
            state: s.service_state(),
            disabled_reason: s.disabled_reason,
            updated_at: s.updated_at,
        }))
    }

    /// The host names of every nova-compute service in the region.
    pub async fn compute_hosts(&self) -> Result<Vec<String>, NovaError> {
        Ok(self.compute_services(None).await?.into_iter().map(|s| s.host).collect())
    }

    async fn hypervisor(&self, host: &str) -> Result<Option<HypervisorRef>, NovaError> {
        // The pattern is a substring match on the hypervisor hostname
        // (compute-1 matches compute-10, and compute-1.example.com): keep
        // the one whose service is ours, which only the detail view names.
        let call = Call::get(Service::Compute, "os-hypervisors/detail")
            .param("hypervisor_hostname_pattern", host)
            .at_microversion(super::http::HYPERVISOR_DETAIL_MICROVERSION);
        let what = call.describe();
        let list: Vec<HypervisorRef> = match self.cloud.call(call).await {
            Ok(v) => field(v, "hypervisors", &what)?,
            Err(NovaError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(list.into_iter().find(|h| match &h.service {
            Some(s) => s.host == host,
            None => h.hypervisor_hostname == host,
        }))
    }

    async fn aggregates(&self) -> Result<Vec<Aggregate>, NovaError> {
        let call = Call::get(Service::Compute, "os-aggregates");
        self.cloud.fetch(call, "aggregates").await
    }

    async fn aggregate_host(&self, host: &str, name: &str, add: bool) -> Result<(), NovaError> {
        let aggregates = self.aggregates().await?;
        let Some(agg) = aggregates.iter().find(|a| a.name == name) else {
            return if add {
                Err(NovaError::NotFound(format!("aggregate {name} does not exist in Nova")))
            } else {
                Ok(())
            };
        };
        let member = agg.hosts.as_deref().unwrap_or_default().iter().any(|h| h == host);
        if member == add {
            return Ok(());
        }
        let body =
            if add { json!({"add_host": {"host": host}}) } else { json!({"remove_host": {"host": host}}) };
        let call = Call::with(
            Service::Compute,
            http::Method::POST,
            format!("os-aggregates/{}/action", agg.id),
            body,
        );
        match self.cloud.call(call).await {
            Ok(_) => Ok(()),
            // Someone did it between our read and our call.
            Err(NovaError::Conflict(_)) if add => Ok(()),
            Err(NovaError::NotFound(_)) if !add => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn provider(&self, name: &str) -> Result<Option<Provider>, NovaError> {
        let call = Call::get(Service::Placement, "resource_providers").param("name", name);
        let list: Vec<Provider> = self.cloud.fetch(call, "resource_providers").await?;
        Ok(list.into_iter().next())
    }

    async fn traits(&self, provider: &str) -> Result<ProviderTraits, NovaError> {
        let call = Call::get(Service::Placement, format!("resource_providers/{provider}/traits"));
        let what = call.describe();
        serde_json::from_value(self.cloud.call(call).await?)
            .map_err(|e| NovaError::Invalid(format!("{what}: {e}")))
    }

    /// Read-modify-write of the provider's traits under its generation;
    /// a 409 means someone else wrote in between, so read again.
    async fn change_traits(
        &self,
        host: &str,
        change: impl Fn(&mut BTreeSet<String>),
        create: &BTreeSet<String>,
    ) -> Result<(), NovaError> {
        // Custom traits must exist before a provider can carry them; the
        // standard ones exist already, and Placement refuses to create them.
        for t in create.iter().filter(|t| t.starts_with("CUSTOM_")) {
            let mut call = Call::get(Service::Placement, format!("traits/{t}"));
            call.method = http::Method::PUT;
            self.cloud.call(call).await?;
        }
        let node = self.hypervisor(host).await?.map_or_else(|| host.to_string(), |h| h.hypervisor_hostname);
        let provider = self
            .provider(&node)
            .await?
            .ok_or_else(|| NovaError::NotFound(format!("no resource provider named {node} in Placement")))?;
        let mut last = None;
        for _ in 0..TRAIT_ATTEMPTS {
            let current = self.traits(&provider.uuid).await?;
            let before: BTreeSet<String> = current.traits.into_iter().collect();
            let mut traits = before.clone();
            change(&mut traits);
            if traits == before {
                return Ok(());
            }
            let body = json!({"traits": traits, "resource_provider_generation": current.resource_provider_generation});
            let call = Call::with(
                Service::Placement,
                http::Method::PUT,
                format!("resource_providers/{}/traits", provider.uuid),
                body,
            );
            match self.cloud.call(call).await {
                Ok(_) => return Ok(()),
                Err(e @ NovaError::Conflict(_)) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| NovaError::Conflict("trait update kept conflicting".into())))
    }

    async fn instances(&self, host: &str) -> Result<Vec<String>, NovaError> {
        // Admin-only `host` filter; every project. The default page limit is
        // Nova's osapi_max_limit (1000), far above what one host carries.
        let call = Call::get(Service::Compute, "servers").param("host", host).param("all_tenants", "1");
        let servers: Vec<ServerRef> = self.cloud.fetch(call, "servers").await?;
        Ok(servers.into_iter().map(|s| s.id).collect())
    }
}
