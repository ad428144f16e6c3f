//! Nova and Placement, as the lifecycle needs them (docs/nova.md):
//! Keystone authentication and the catalog through `openstack_sdk`
//! ([`http`]), the host operations over it ([`host`]), and typed errors
//! ([`error`]).

pub mod capacity;
pub mod error;
pub mod host;
pub mod http;
pub mod rooms;
pub mod servers;
pub mod snapshot;
pub mod view;

#[cfg(test)]
mod fuzz;

pub use error::NovaError;
pub use host::{NovaClient, ServiceView};
pub use http::{Cloud, CloudSource, HttpPolicy};
pub use snapshot::FleetSnapshot;
pub use view::FleetView;

use jiff::Timestamp;

use crate::eviction::plan::Server;
use crate::eviction::preflight::Candidate;
use crate::lifecycle::{Action, NovaObs};
use servers::{NovaMigration, Progress};

/// What the controllers ask of Nova and Placement: the narrow face of
/// [`NovaClient`]. The controllers hold it as a trait object so that each
/// reconcile can be tested at the request level against a fake, while every
/// claim about the real Nova is tested against the real one.
#[tonic::async_trait]
pub trait Nova: Send + Sync {
    /// Nova's view of `host`, for the lifecycle core.
    async fn observe(&self, host: &str, wanted_aggregates: &[String]) -> NovaObs;
    /// The whole fleet in a handful of lists ([`fleet`]), for the shared
    /// view; `traits` are the custom traits the fleet's Hypervisors name.
    async fn fleet(&self, traits: &std::collections::BTreeSet<String>) -> Result<FleetSnapshot, NovaError>;
    /// The host names of every nova-compute service.
    async fn compute_hosts(&self) -> Result<Vec<String>, NovaError>;
    /// One action of a decision (idempotent).
    async fn execute(&self, host: &str, service_id: Option<&str>, action: &Action) -> Result<(), NovaError>;
    async fn servers_on(&self, host: &str) -> Result<Vec<Server>, NovaError>;
    async fn server(&self, id: &str) -> Result<Option<Server>, NovaError>;
    /// The hosts the VMs of `source` could go to, without their traits
    /// ([`Nova::carriers`] says which matter), and the hosts `asleep`
    /// marked as such.
    async fn candidates(&self, source: &str, asleep: &[String]) -> Result<Vec<Candidate>, NovaError>;
    /// The resource providers (by uuid) that carry each of `traits`.
    async fn carriers(
        &self,
        traits: &std::collections::BTreeSet<String>,
    ) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>, NovaError>;
    async fn migrations_from(&self, host: &str, since: Timestamp) -> Result<Vec<NovaMigration>, NovaError>;
    async fn progress_of(&self, id: &str) -> Result<Vec<Progress>, NovaError>;
    /// Not idempotent: never retried on an unknown outcome.
    async fn migrate(&self, id: &str, live: bool) -> Result<(), NovaError>;
    /// Rebuilds a fenced host's server elsewhere. Not idempotent: never
    /// retried on an unknown outcome.
    async fn evacuate(&self, id: &str) -> Result<(), NovaError>;
    /// Starts a stopped server (idempotent).
    async fn start(&self, id: &str) -> Result<(), NovaError>;
    async fn confirm_resize(&self, id: &str) -> Result<(), NovaError>;
    async fn abort_migration(&self, id: &str, migration: i64) -> Result<(), NovaError>;
    /// The server groups any of the servers (id → host) is in, with their
    /// rules and their members' hosts.
    async fn server_groups_of(
        &self,
        on: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::eviction::server_groups::Group>, NovaError>;
    /// Not idempotent: never retried on an unknown outcome.
    async fn force_complete_migration(&self, id: &str, migration: i64) -> Result<(), NovaError>;
    /// Sets (`Some`) or removes one metadata item of a server (idempotent).
    async fn server_metadata(&self, id: &str, key: &str, value: Option<&str>) -> Result<(), NovaError>;
    /// Holds the host's compute service forced down (fencing; idempotent).
    async fn set_forced_down(&self, host: &str, down: bool) -> Result<(), NovaError>;
    /// The host's compute service (enabled, its state); None: no such
    /// service.
    async fn compute_service(&self, host: &str) -> Result<Option<ServiceView>, NovaError>;
    /// The zone, aggregates and room of every compute host in `scopes`,
    /// for the hibernation policy.
    async fn rooms(
        &self,
        scopes: &[crate::power::policy::Scope],
    ) -> Result<Vec<crate::power::policy::HostRoom>, NovaError>;
}

#[tonic::async_trait]
impl Nova for NovaClient {
    async fn observe(&self, host: &str, wanted_aggregates: &[String]) -> NovaObs {
        NovaClient::observe(self, host, wanted_aggregates).await
    }
    async fn fleet(&self, traits: &std::collections::BTreeSet<String>) -> Result<FleetSnapshot, NovaError> {
        NovaClient::fleet(self, traits).await
    }
    async fn compute_hosts(&self) -> Result<Vec<String>, NovaError> {
        NovaClient::compute_hosts(self).await
    }
    async fn execute(&self, host: &str, service_id: Option<&str>, action: &Action) -> Result<(), NovaError> {
        NovaClient::execute(self, host, service_id, action).await
    }
    async fn servers_on(&self, host: &str) -> Result<Vec<Server>, NovaError> {
        NovaClient::servers_on(self, host).await
    }
    async fn server(&self, id: &str) -> Result<Option<Server>, NovaError> {
        NovaClient::server(self, id).await
    }
    async fn candidates(&self, source: &str, asleep: &[String]) -> Result<Vec<Candidate>, NovaError> {
        NovaClient::candidates(self, source, asleep).await
    }
    async fn carriers(
        &self,
        traits: &std::collections::BTreeSet<String>,
    ) -> Result<std::collections::BTreeMap<String, std::collections::BTreeSet<String>>, NovaError> {
        NovaClient::carriers(self, traits).await
    }
    async fn migrations_from(&self, host: &str, since: Timestamp) -> Result<Vec<NovaMigration>, NovaError> {
        NovaClient::migrations_from(self, host, since).await
    }
    async fn progress_of(&self, id: &str) -> Result<Vec<Progress>, NovaError> {
        NovaClient::progress_of(self, id).await
    }
    async fn migrate(&self, id: &str, live: bool) -> Result<(), NovaError> {
        NovaClient::migrate(self, id, live).await
    }
    async fn evacuate(&self, id: &str) -> Result<(), NovaError> {
        NovaClient::evacuate(self, id).await
    }
    async fn start(&self, id: &str) -> Result<(), NovaError> {
        NovaClient::start(self, id).await
    }
    async fn confirm_resize(&self, id: &str) -> Result<(), NovaError> {
        NovaClient::confirm_resize(self, id).await
    }
    async fn abort_migration(&self, id: &str, migration: i64) -> Result<(), NovaError> {
        NovaClient::abort_migration(self, id, migration).await
    }
    async fn force_complete_migration(&self, id: &str, migration: i64) -> Result<(), NovaError> {
        NovaClient::force_complete_migration(self, id, migration).await
    }
    async fn server_groups_of(
        &self,
        on: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<crate::eviction::server_groups::Group>, NovaError> {
        NovaClient::server_groups_of(self, on).await
    }
    async fn server_metadata(&self, id: &str, key: &str, value: Option<&str>) -> Result<(), NovaError> {
        match value {
            Some(v) => NovaClient::set_server_metadata(self, id, key, v).await,
            None => NovaClient::delete_server_metadata(self, id, key).await,
        }
    }
    async fn set_forced_down(&self, host: &str, down: bool) -> Result<(), NovaError> {
        NovaClient::set_forced_down(self, host, down).await
    }
    async fn compute_service(&self, host: &str) -> Result<Option<ServiceView>, NovaError> {
        NovaClient::compute_service(self, host).await
    }
    async fn rooms(
        &self,
        scopes: &[crate::power::policy::Scope],
    ) -> Result<Vec<crate::power::policy::HostRoom>, NovaError> {
        NovaClient::rooms(self, scopes).await
    }
}
