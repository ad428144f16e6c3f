//! `Migration`: one attempt to move one VM, owned by its `Eviction`. Every
//! attempt gets its own object, so the history of a difficult VM is visible.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How one attempt moves its VM.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MigrationKind {
    #[default]
    LiveMigrate,
    ColdMigrate,
    /// Rebuilt elsewhere from its disks, its host fenced (docs/fencing.md).
    Evacuate,
}

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hypervisor.cloud.sap",
    version = "v1alpha1",
    kind = "Migration",
    plural = "migrations",
    shortname = "mig",
    category = "openstack",
    status = "MigrationStatus",
    printcolumn = r#"{"name":"Eviction","type":"string","jsonPath":".spec.eviction"}"#,
    printcolumn = r#"{"name":"Server","type":"string","jsonPath":".spec.serverId"}"#,
    printcolumn = r#"{"name":"Attempt","type":"integer","jsonPath":".spec.attempt"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.policy"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".status.targetHost"}"#,
    printcolumn = r#"{"name":"Remaining","type":"integer","jsonPath":".status.memoryRemainingBytes","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("Migration spec is immutable; create a new attempt instead"))]
pub struct MigrationSpec {
    /// The owning Eviction.
    pub eviction: String,
    /// Nova server UUID.
    pub server_id: String,
    #[serde(default)]
    pub server_name: String,
    /// Compute host the VM leaves.
    pub source_host: String,
    /// 1 for the first attempt.
    #[schemars(range(min = 1))]
    pub attempt: u32,
    /// How the VM is moved (the field keeps its first name; an attempt
    /// made before evacuations existed reads the same).
    pub policy: MigrationKind,
    /// Local disks: the migration copies them (block migration).
    #[serde(default)]
    pub block_migration: bool,
    /// VM memory, the basis of the completion timeout.
    #[serde(default)]
    pub memory_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum MigrationPhase {
    #[default]
    Pending,
    Running,
    Completed,
    /// Stuck, and aborted by the supervisor.
    Aborted,
    /// Nova reported an error.
    Failed,
    /// The eviction was cancelled.
    Cancelled,
    /// The request never reached Nova (no connection, no token); the VM is
    /// asked for again under a new attempt, and this one does not count.
    NotSent,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    /// Nova's migration id (os-migrations / servers/{id}/migrations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nova_migration_id: Option<i64>,
    /// Nova's migration status, verbatim ("running", "completed", "cancelled", ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nova_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_host: Option<String>,
    /// When the request left for Nova. The attempt's times are kept to the
    /// microsecond: an eviction's makespan is judged against the sum of its
    /// migrations, which whole seconds blur by up to a second each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<MicroTime>,
    /// When the coordinator first saw Nova run it: Nova queues live
    /// migrations beyond its own limit per host, and the completion clock
    /// starts here, not in the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_since: Option<MicroTime>,
    /// When the coordinator first saw the attempt end in Nova.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<MicroTime>,
    /// When the supervisor asked Nova to force this stuck live migration to
    /// complete; it is aborted if it has not ended a progress timeout later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_completed_at: Option<MicroTime>,
    /// Last time any progress counter moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_at: Option<MicroTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_processed_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_remaining_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_total_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_processed_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_remaining_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Name of the Migration object of one attempt of one VM.
pub fn migration_name(eviction: &str, server_id: &str, attempt: u32) -> String {
    let short: String = server_id.chars().take(8).collect();
    format!("{eviction}-{short}-{attempt}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Migrations written before the times were kept to the microsecond
    /// carry whole seconds: they still read, and are written back with
    /// their fraction.
    #[test]
    fn whole_second_times_stored_earlier_still_read() {
        let stored = serde_json::json!({
            "phase": "Completed",
            "startedAt": "2026-11-20T10:00:00Z",
            "finishedAt": "2026-11-20T10:00:07Z",
            "lastProgressAt": "2026-11-20T10:00:05Z",
        });
        let st: MigrationStatus = serde_json::from_value(stored).unwrap_or_else(|e| panic!("{e}"));
        let took = st.finished_at.as_ref().map(|f| f.0).zip(st.started_at.as_ref().map(|s| s.0));
        assert_eq!(took.map(|(f, s)| f.duration_since(s).as_secs_f64()), Some(7.0));
        assert!(st.last_progress_at.is_some());
        let now: MigrationStatus =
            serde_json::from_value(serde_json::json!({"startedAt": "2026-11-20T10:00:00.250000Z"}))
                .unwrap_or_else(|e| panic!("{e}"));
        let written = serde_json::to_value(&now).unwrap_or_default();
        assert_eq!(written["startedAt"], "2026-11-20T10:00:00.250000Z");
    }
}
