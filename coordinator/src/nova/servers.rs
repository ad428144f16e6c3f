//! Servers and their live migrations, as the eviction needs them (compute
//! 2.96): what is on a host, moving one, watching the move, aborting it.

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::NovaError;
use super::host::NovaClient;
use super::http::{Call, Service, field};
use crate::api::eviction::MigrationPolicy;
use crate::eviction::plan::{POLICY_METADATA, Server};
use crate::eviction::preflight::{Needs, flavor_resources};

#[derive(Debug, Deserialize)]
struct ServerDetail {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(rename = "OS-EXT-SRV-ATTR:host", default)]
    host: Option<String>,
    #[serde(default)]
    status: String,
    #[serde(default)]
    locked: bool,
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, String>,
    flavor: Flavor,
    /// The zone the user asked for at boot (2.96), which binds every move.
    #[serde(default)]
    pinned_availability_zone: Option<String>,
    #[serde(default)]
    tenant_id: String,
    /// An empty string for a server booted from a volume.
    #[serde(default)]
    image: Value,
}

/// The flavor embedded in the server (2.47+).
#[derive(Debug, Deserialize)]
struct Flavor {
    ram: u64,
    #[serde(default)]
    vcpus: u64,
    #[serde(default)]
    disk: u64,
    #[serde(default)]
    ephemeral: u64,
    /// Swap MB; some clouds answer "" for none.
    #[serde(default)]
    swap: Value,
    #[serde(default)]
    extra_specs: std::collections::BTreeMap<String, String>,
}

impl ServerDetail {
    fn into_server(self) -> Server {
        let policy = match self.metadata.get(POLICY_METADATA).map(String::as_str) {
            Some("live") => Some(MigrationPolicy::LiveMigrate),
            Some("cold") => Some(MigrationPolicy::ColdMigrate),
            Some("skip") => Some(MigrationPolicy::Skip),
            _ => None,
        };
        let image_backed = !matches!(&self.image, Value::String(s) if s.is_empty()) && !self.image.is_null();
        Server {
            id: self.id,
            name: self.name,
            host: self.host.unwrap_or_default(),
            status: self.status,
            memory_bytes: self.flavor.ram.saturating_mul(1 << 20),
            policy,
            locked: self.locked,
            pci_passthrough: self.flavor.extra_specs.contains_key("pci_passthrough:alias"),
            local_disk: image_backed && self.flavor.disk > 0,
            needs: needs(&self.flavor, !image_backed, self.pinned_availability_zone, self.tenant_id),
        }
    }
}

/// What the server asks of a target host, from its embedded flavor.
fn needs(f: &Flavor, volume_backed: bool, pinned_az: Option<String>, project_id: String) -> Needs {
    let swap = f.swap.as_u64().unwrap_or(0);
    let resources =
        flavor_resources(f.vcpus, f.ram, f.disk, f.ephemeral, swap, volume_backed, &f.extra_specs);
    let mut needs = Needs { resources, pinned_az, project_id, ..Needs::default() };
    for (k, v) in &f.extra_specs {
        if let Some(t) = k.strip_prefix("trait:") {
            match v.trim() {
                "required" => needs.required_traits.insert(t.to_string()),
                "forbidden" => needs.forbidden_traits.insert(t.to_string()),
                _ => false,
            };
        } else if let Some(key) = k.strip_prefix("aggregate_instance_extra_specs:") {
            needs.aggregate_specs.insert(key.to_string(), v.trim().to_string());
        }
    }
    needs
}

/// One live migration as Nova reports it (os-migrations, 2.59+).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct NovaMigration {
    pub id: i64,
    pub status: String,
    #[serde(default)]
    pub instance_uuid: Option<String>,
    #[serde(default)]
    pub source_compute: Option<String>,
    #[serde(default)]
    pub dest_compute: Option<String>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
}

/// Progress counters of an in-flight live migration (servers/{id}/migrations).
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
pub struct Progress {
    pub id: i64,
    #[serde(default)]
    pub memory_total_bytes: Option<u64>,
    #[serde(default)]
    pub memory_processed_bytes: Option<u64>,
    #[serde(default)]
    pub memory_remaining_bytes: Option<u64>,
    #[serde(default)]
    pub disk_total_bytes: Option<u64>,
    #[serde(default)]
    pub disk_processed_bytes: Option<u64>,
    #[serde(default)]
    pub disk_remaining_bytes: Option<u64>,
}

impl NovaClient {
    /// Every server on `host`, all projects.
    pub async fn servers_on(&self, host: &str) -> Result<Vec<Server>, NovaError> {
        let call =
            Call::get(Service::Compute, "servers/detail").param("host", host).param("all_tenants", "1");
        let list: Vec<ServerDetail> = self.cloud().fetch(call, "servers").await?;
        Ok(list.into_iter().map(ServerDetail::into_server).collect())
    }

    /// One server wherever it is; None when it was deleted.
    pub async fn server(&self, id: &str) -> Result<Option<Server>, NovaError> {
        let call = Call::get(Service::Compute, format!("servers/{id}"));
        let what = call.describe();
        match self.cloud().call(call).await {
            Ok(v) => Ok(Some(field::<ServerDetail>(v, "server", &what)?.into_server())),
            Err(NovaError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Live-migrates `id` to a host the scheduler picks (block migration
    /// decided by Nova: `auto`), or cold-migrates it.
    pub async fn migrate(&self, id: &str, live: bool) -> Result<(), NovaError> {
        let body = if live {
            json!({"os-migrateLive": {"host": null, "block_migration": "auto"}})
        } else {
            json!({"migrate": null})
        };
        self.server_action(id, body).await
    }

    async fn server_action(&self, id: &str, body: Value) -> Result<(), NovaError> {
        let call = Call::with(Service::Compute, http::Method::POST, format!("servers/{id}/action"), body);
        self.cloud().call(call).await.map(|_| ())
    }

    /// Confirms a finished cold migration. Confirming one that is already
    /// confirmed (409, the server no longer in VERIFY_RESIZE) succeeds.
    pub async fn confirm_resize(&self, id: &str) -> Result<(), NovaError> {
        match self.server_action(id, json!({"confirmResize": null})).await {
            Ok(()) => Ok(()),
            Err(NovaError::Conflict(msg)) => match self.server(id).await? {
                Some(s) if s.status == "VERIFY_RESIZE" => Err(NovaError::Conflict(msg)),
                _ => Ok(()),
            },
            Err(e) => Err(e),
        }
    }

    /// Nova's migrations of one server, newest first.
    pub async fn migrations_of(&self, id: &str) -> Result<Vec<NovaMigration>, NovaError> {
        self.migration_list(Call::get(Service::Compute, "os-migrations").param("instance_uuid", id)).await
    }

    /// Every migration off `host` that changed since `since`, newest first:
    /// one call for all the VMs an eviction is moving (os-migrations
    /// filters `source_compute` and `changes-since`, 2.59+).
    pub async fn migrations_from(
        &self,
        host: &str,
        since: jiff::Timestamp,
    ) -> Result<Vec<NovaMigration>, NovaError> {
        let since = since.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let call = Call::get(Service::Compute, "os-migrations")
            .param("source_compute", host)
            .param("changes-since", &since);
        self.migration_list(call).await
    }

    async fn migration_list(&self, call: Call) -> Result<Vec<NovaMigration>, NovaError> {
        let mut list: Vec<NovaMigration> = self.cloud().fetch(call, "migrations").await?;
        list.sort_by_key(|m| std::cmp::Reverse(m.id));
        Ok(list)
    }

    /// Progress of the in-flight live migrations of one server.
    pub async fn progress_of(&self, id: &str) -> Result<Vec<Progress>, NovaError> {
        let call = Call::get(Service::Compute, format!("servers/{id}/migrations"));
        self.cloud().fetch(call, "migrations").await
    }

    /// Aborts an in-flight live migration. One that already ended needs no
    /// abort: Nova answers 404, or 409 because the server is no longer
    /// migrating, and then the migration's own status must be final.
    pub async fn abort_migration(&self, id: &str, migration: i64) -> Result<(), NovaError> {
        match self
            .cloud()
            .call(Call::delete(Service::Compute, format!("servers/{id}/migrations/{migration}")))
            .await
        {
            Ok(_) | Err(NovaError::NotFound(_)) => Ok(()),
            Err(NovaError::Conflict(msg)) => {
                let ended = self
                    .migrations_of(id)
                    .await?
                    .into_iter()
                    .any(|m| m.id == migration && is_final_status(&m.status));
                if ended { Ok(()) } else { Err(NovaError::Conflict(msg)) }
            }
            Err(e) => Err(e),
        }
    }
}

/// Nova migration statuses after which nothing more happens. A cold
/// migration's `finished` is not one: it still waits for confirmation.
pub fn is_final_status(status: &str) -> bool {
    matches!(status, "completed" | "confirmed" | "failed" | "error" | "cancelled" | "aborted" | "reverted")
}
