//! Servers and their live migrations, as the eviction needs them (compute
//! 2.96): what is on a host, moving one, watching the move, aborting it.

use std::sync::atomic::Ordering;

use futures_util::future::join_all;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::NovaError;
use super::host::NovaClient;
use super::http::{Call, Service, field};
use crate::api::eviction::MigrationPolicy;
use crate::api::keys::{EVACUATE_METADATA, EVICT_FROM_METADATA, POLICY_METADATA};
use crate::eviction::NovaState;
use crate::eviction::plan::{OptIn, Server};
use crate::eviction::preflight::{Needs, flavor_resources};
use crate::eviction::server_groups::Group;

/// The compute microversion whose server views embed the image's
/// properties (Nova 2025.1); the same as our pinned one otherwise.
pub const IMAGE_PROPERTIES_MICROVERSION: (u8, u8) = (2, 98);

#[derive(Debug, Deserialize)]
pub(super) struct ServerDetail {
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
pub(super) struct Flavor {
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
    pub(super) fn into_server(self) -> Server {
        let policy = match self.metadata.get(POLICY_METADATA).map(String::as_str) {
            Some("live") => Some(MigrationPolicy::LiveMigrate),
            Some("cold") => Some(MigrationPolicy::ColdMigrate),
            Some("live-if-possible") => Some(MigrationPolicy::LiveMigrateIfPossible),
            Some("external") => Some(MigrationPolicy::External),
            Some("skip") => Some(MigrationPolicy::Skip),
            _ => None,
        };
        let evacuate =
            self.metadata.get(EVACUATE_METADATA).map(|raw| match raw.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "1" => OptIn::Yes,
                "false" | "no" | "0" => OptIn::No,
                _ => OptIn::Unreadable(raw.clone()),
            });
        let image_backed = !matches!(&self.image, Value::String(s) if s.is_empty()) && !self.image.is_null();
        Server {
            id: self.id,
            name: self.name,
            host: self.host.filter(|h| !h.is_empty()),
            status: self.status,
            memory_bytes: self.flavor.ram.saturating_mul(1 << 20),
            policy,
            locked: self.locked,
            pci_passthrough: self.flavor.extra_specs.contains_key("pci_passthrough:alias"),
            local_disk: image_backed && self.flavor.disk > 0,
            host_disks: image_backed || self.flavor.ephemeral > 0,
            evacuate,
            evict_mark: self.metadata.get(EVICT_FROM_METADATA).cloned(),
            needs: Needs {
                image: image_properties(&self.image),
                ..needs(&self.flavor, !image_backed, self.pinned_availability_zone, self.tenant_id)
            },
        }
    }
}

/// The image's properties as Nova shows them in the server (2.98), as
/// text; none when it shows none.
fn image_properties(image: &Value) -> std::collections::BTreeMap<String, String> {
    let props = image.get("properties").and_then(Value::as_object);
    props
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| match v {
            Value::String(s) => Some((k.clone(), s.clone())),
            Value::Number(_) | Value::Bool(_) => Some((k.clone(), v.to_string())),
            _ => None,
        })
        .collect()
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

fn nova_state<'de, D: serde::Deserializer<'de>>(d: D) -> Result<NovaState, D::Error> {
    let s = String::deserialize(d)?;
    Ok(NovaState::from(s.as_str()))
}

/// Nova's timestamps: UTC, without a zone (`2026-11-23T11:00:00.000000`),
/// or with one. Unparseable is None (never "now").
pub(super) fn nova_time<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<jiff::Timestamp>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    Ok(s.and_then(|s| parse_nova_time(&s)))
}

pub fn parse_nova_time(s: &str) -> Option<jiff::Timestamp> {
    let s = s.trim();
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Some(t);
    }
    s.parse::<jiff::civil::DateTime>()
        .ok()
        .and_then(|dt| dt.to_zoned(jiff::tz::TimeZone::UTC).ok())
        .map(|z| z.timestamp())
}

/// One migration as Nova reports it (os-migrations, 2.59+).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct NovaMigration {
    pub id: i64,
    #[serde(deserialize_with = "nova_state")]
    pub status: NovaState,
    #[serde(default)]
    pub instance_uuid: Option<String>,
    #[serde(default)]
    pub source_compute: Option<String>,
    #[serde(default)]
    pub dest_compute: Option<String>,
    /// `live-migration`, `migration`, `evacuation`, `resize`.
    #[serde(default)]
    pub migration_type: Option<String>,
    #[serde(default, deserialize_with = "nova_time")]
    pub created_at: Option<jiff::Timestamp>,
    #[serde(default, deserialize_with = "nova_time")]
    pub updated_at: Option<jiff::Timestamp>,
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
        // Their images' properties, where Nova shows them (2.98); an older
        // Nova is asked again at our pinned version, without them, and from
        // then on only at that one.
        let older = &self.no_image_properties;
        let list: Vec<ServerDetail> = if older.load(Ordering::Relaxed) {
            self.cloud().fetch(call, "servers").await?
        } else {
            let at = call.clone().at_microversion(IMAGE_PROPERTIES_MICROVERSION);
            match self.cloud().fetch(at, "servers").await {
                Err(NovaError::NotAcceptable(e)) => {
                    tracing::info!(error = %e, "Nova shows no image properties (before 2.98): not judged");
                    older.store(true, Ordering::Relaxed);
                    self.cloud().fetch(call, "servers").await?
                }
                other => other?,
            }
        };
        // Listed by host: a server whose host field is hidden is on it.
        Ok(list
            .into_iter()
            .map(|d| {
                let mut s = d.into_server();
                s.host.get_or_insert_with(|| host.to_string());
                s
            })
            .collect())
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

    /// Rebuilds `id` from its disks on a host the scheduler picks, its own
    /// host being dead (its compute service down or forced down): Nova's
    /// `evacuate`, with no host and no admin password. Not idempotent (a
    /// second evacuate of a server already rebuilt moves it again): never
    /// retried on an unknown outcome. At compute 2.95 and later the server is
    /// rebuilt stopped (SHUTOFF), whatever it was: one that ran is started
    /// after ([`Self::start`]).
    pub async fn evacuate(&self, id: &str) -> Result<(), NovaError> {
        self.server_action(id, json!({"evacuate": {}})).await
    }

    /// Starts a stopped server. Starting one that runs already (409, not
    /// SHUTOFF) succeeds.
    pub async fn start(&self, id: &str) -> Result<(), NovaError> {
        match self.server_action(id, json!({"os-start": null})).await {
            Ok(()) => Ok(()),
            Err(NovaError::Conflict(msg)) => match self.server(id).await? {
                Some(s) if s.status == "ACTIVE" => Ok(()),
                _ => Err(NovaError::Conflict(msg)),
            },
            Err(e) => Err(e),
        }
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

    /// The server groups any of the servers (id → host) is in, each with
    /// its rule and where every member runs. Nova names a server's groups
    /// only in that server's own view (2.71+), never in a list: each server
    /// is read, then each group once, then each member elsewhere, the reads
    /// of one kind together (the client bounds what is in flight).
    pub async fn server_groups_of(
        &self,
        on: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<Group>, NovaError> {
        let named = join_all(on.keys().map(|id| self.groups_named_by(id))).await;
        let mut ids = std::collections::BTreeSet::new();
        for r in named {
            ids.extend(r?);
        }
        let mut groups = Vec::new();
        for id in ids {
            let Some(mut g) = self.server_group(&id).await? else { continue };
            let elsewhere: Vec<String> =
                g.members_on.keys().filter(|m| !on.contains_key(*m)).cloned().collect();
            let read = join_all(elsewhere.iter().map(|m| self.server(m))).await;
            for (m, r) in elsewhere.iter().zip(read) {
                match r?.and_then(|s| s.host) {
                    Some(h) => g.members_on.insert(m.clone(), h),
                    None => g.members_on.remove(m),
                };
            }
            for (m, h) in on {
                if g.members_on.contains_key(m) {
                    g.members_on.insert(m.clone(), h.clone());
                }
            }
            groups.push(g);
        }
        Ok(groups)
    }

    /// The ids of the server groups a server's view names (none for a
    /// server gone meanwhile).
    async fn groups_named_by(&self, id: &str) -> Result<Vec<String>, NovaError> {
        match self.cloud().call(Call::get(Service::Compute, format!("servers/{id}"))).await {
            Ok(v) => Ok(v["server"]["server_groups"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g.as_str().map(String::from))
                .collect()),
            Err(NovaError::NotFound(_)) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// One server group, its members as keys of `members_on` (hosts still
    /// to be filled in); None: gone.
    async fn server_group(&self, id: &str) -> Result<Option<Group>, NovaError> {
        #[derive(Deserialize)]
        struct Rules {
            max_server_per_host: Option<u32>,
        }
        #[derive(Deserialize)]
        struct Detail {
            #[serde(default)]
            name: String,
            #[serde(default)]
            policy: String,
            rules: Option<Rules>,
            #[serde(default)]
            members: Vec<String>,
        }
        let call = Call::get(Service::Compute, format!("os-server-groups/{id}"));
        let what = call.describe();
        let d: Detail = match self.cloud().call(call).await {
            Ok(v) => field(v, "server_group", &what)?,
            Err(NovaError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let rule = Group::rule_of(&d.policy, d.rules.and_then(|r| r.max_server_per_host));
        let members_on = d.members.into_iter().map(|m| (m, String::new())).collect();
        Ok(Some(Group { id: id.to_string(), name: d.name, rule, members_on }))
    }

    /// Asks Nova to force a running live migration to complete (post-copy
    /// where the host permits it, else the guest paused for the last of
    /// its memory). Not idempotent: never retried on an unknown outcome.
    /// One Nova no longer runs needs no forcing: Nova answers 400 (it is
    /// not `running`) or 404, and then it must no longer be running.
    pub async fn force_complete_migration(&self, id: &str, migration: i64) -> Result<(), NovaError> {
        let path = format!("servers/{id}/migrations/{migration}/action");
        match self
            .cloud()
            .call(Call::with(Service::Compute, http::Method::POST, path, json!({"force_complete": null})))
            .await
        {
            Ok(_) => Ok(()),
            Err(NovaError::Invalid(msg) | NovaError::NotFound(msg)) => {
                let running = NovaState::Running { live_running: true };
                let still = self
                    .migrations_of(id)
                    .await?
                    .into_iter()
                    .any(|m| m.id == migration && m.status == running);
                if still { Err(NovaError::Invalid(msg)) } else { Ok(()) }
            }
            Err(e) => Err(e),
        }
    }

    /// Sets one metadata item of a server (idempotent).
    pub async fn set_server_metadata(&self, id: &str, key: &str, value: &str) -> Result<(), NovaError> {
        let body = json!({"meta": {key: value}});
        let call =
            Call::with(Service::Compute, http::Method::PUT, format!("servers/{id}/metadata/{key}"), body);
        self.cloud().call(call).await.map(|_| ())
    }

    /// Removes one metadata item of a server; one already gone (404) is
    /// done.
    pub async fn delete_server_metadata(&self, id: &str, key: &str) -> Result<(), NovaError> {
        let call = Call::delete(Service::Compute, format!("servers/{id}/metadata/{key}"));
        match self.cloud().call(call).await {
            Ok(_) | Err(NovaError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
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
                    .any(|m| m.id == migration && m.status.is_final());
                if ended { Ok(()) } else { Err(NovaError::Conflict(msg)) }
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nova_statuses_and_times_are_typed_once() {
        let m: NovaMigration = serde_json::from_value(serde_json::json!({
            "id": 7, "status": "post-migrating", "instance_uuid": "u",
            "created_at": "2026-11-23T11:00:00.000000", "updated_at": null
        }))
        .unwrap();
        assert_eq!(m.status, NovaState::Running { live_running: false });
        assert_eq!(m.created_at, "2026-11-23T11:00:00Z".parse().ok());
        assert_eq!(m.updated_at, None);
        for (s, fin) in
            [("completed", true), ("error", true), ("aborted", true), ("finished", false), ("queued", false)]
        {
            assert_eq!(NovaState::from(s).is_final(), fin, "{s}");
        }
        assert_eq!(NovaState::from("whatever"), NovaState::Other("whatever".into()));
        assert_eq!(parse_nova_time("2026-11-23T11:00:00Z"), "2026-11-23T11:00:00Z".parse().ok());
        assert_eq!(parse_nova_time("yesterday"), None);
    }

    #[test]
    fn a_server_without_a_host_field_has_no_host() {
        let d: ServerDetail = serde_json::from_value(serde_json::json!({
            "id": "s", "flavor": {"ram": 512}
        }))
        .unwrap();
        assert_eq!(d.into_server().host, None, "not \"\": a missing host is unknown, not elsewhere");
    }
}
