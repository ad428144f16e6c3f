//! `Eviction`: take the VMs off one hypervisor (docs/eviction.md).
//! Preflight -> disable -> migrate -> complete -> optional re-enable.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "hypervisor.cloud.sap",
    version = "v1alpha1",
    kind = "Eviction",
    plural = "evictions",
    // Not "ev": kubectl gives that one to core Events.
    shortname = "hvev",
    category = "openstack",
    status = "EvictionStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.hypervisor"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".spec.reason"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Migrated","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Waiting","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].message","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.options) || !has(self.options.force) || self.options.force.all(f, f in ['capacity', 'constraints', 'compatibility', 'os', 'machine'])").message("spec.options.force entries must be capacity, constraints, compatibility, os or machine").field_path(".options.force"))]
#[x_kube(validation = Rule::new("(has(self.dryRun) && self.dryRun) == (has(oldSelf.dryRun) && oldSelf.dryRun)").message("spec.dryRun is immutable").field_path(".dryRun"))]
pub struct EvictionSpec {
    /// Name of the Hypervisor (= Node) to evict. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.hypervisor is immutable"))]
    #[schemars(length(min = 1, max = 253))]
    pub hypervisor: String,
    /// Why; decides whether the node is re-enabled afterwards. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.reason is immutable"))]
    pub reason: EvictionReason,
    #[serde(default)]
    pub options: EvictionOptions,
    /// Only the preflight: what it finds and where each VM would fit are
    /// recorded, and the Eviction ends `Planned`. Nothing is disabled or
    /// moved, and the host's lifecycle does not see it. Immutable.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
}

/// Why a host is evicted; decides whether it is re-enabled afterwards.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum EvictionReason {
    /// The HA detector found the node failed. Never re-enabled automatically.
    NodeFailure,
    /// A rolling update needs the node. Re-enabled after the update.
    RollingUpdate,
    /// An admin asked. Re-enabled if `options.reEnable`.
    AdminRequest,
    /// The node is retired. Never re-enabled; ends in Decommissioned.
    Decommission,
}

impl EvictionReason {
    /// Whether the node goes back into service when the eviction is over,
    /// given the `options.reEnable` the user set (docs/eviction.md).
    pub fn re_enables(self, option: Option<bool>) -> bool {
        match self {
            EvictionReason::NodeFailure | EvictionReason::Decommission => false,
            EvictionReason::RollingUpdate => option.unwrap_or(true),
            EvictionReason::AdminRequest => option.unwrap_or(false),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EvictionReason::NodeFailure => "NodeFailure",
            EvictionReason::RollingUpdate => "RollingUpdate",
            EvictionReason::AdminRequest => "AdminRequest",
            EvictionReason::Decommission => "Decommission",
        }
    }
}

/// How a VM is moved off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MigrationPolicy {
    #[default]
    LiveMigrate,
    ColdMigrate,
    /// Live, and cold when it cannot go live: a server with PCI
    /// passthrough, one not running when its attempt starts, or one whose
    /// live attempts all failed is cold-migrated from then on, with
    /// attempts of its own.
    LiveMigrateIfPossible,
    /// Its owner's own tooling moves it: the server is marked (metadata
    /// `hypervisor.cloud.sap:evict-from` = the host), and the eviction
    /// waits for it to leave the host or be deleted; it is never moved by
    /// us, and the mark goes once it has left.
    External,
    /// Somebody else moves this VM; the eviction leaves it alone.
    Skip,
}

impl MigrationPolicy {
    /// Moved by this eviction (not left, not moved by a third party).
    pub fn moved_by_us(self) -> bool {
        !matches!(self, MigrationPolicy::Skip | MigrationPolicy::External)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionOptions {
    /// Re-enable the node when done. Default by reason: RollingUpdate yes,
    /// AdminRequest no; NodeFailure and Decommission never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub re_enable: Option<bool>,
    /// Migrations in flight from this host at once.
    #[serde(default = "default_parallel")]
    #[schemars(default = "default_parallel", range(min = 1, max = 32))]
    pub max_parallel: u32,
    /// A migration without progress for this long is stuck.
    #[serde(default = "default_progress_timeout")]
    #[schemars(default = "default_progress_timeout", range(min = 1))]
    pub progress_timeout_seconds: u64,
    /// A migration running longer than this many seconds per GiB of VM
    /// memory is stuck.
    #[serde(rename = "completionTimeoutPerGiBSeconds", default = "default_completion_timeout")]
    #[schemars(default = "default_completion_timeout", range(min = 1))]
    pub completion_timeout_per_gib_seconds: u64,
    /// Attempts per VM before it is marked non-migratable.
    #[serde(default = "default_attempts")]
    #[schemars(default = "default_attempts", range(min = 1, max = 20))]
    pub max_attempts: u32,
    /// A live migration found stuck is first forced to complete (Nova's
    /// `force_complete`: post-copy where the host permits it, else the
    /// guest paused for the last of its memory), and aborted only if it
    /// has still not ended `progressTimeoutSeconds` later. false: a stuck
    /// migration is aborted straight away, the guest never paused.
    #[serde(default = "yes")]
    #[schemars(default = "yes")]
    pub force_complete: bool,
    /// Policy for VMs without a `hypervisor.cloud.sap:eviction` metadata
    /// key; unset: the coordinator's `--default-migration-policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_policy: Option<MigrationPolicy>,
    /// Preflight checks to skip by name (`capacity`, `constraints`,
    /// `compatibility`), and `machine`: go on although the agent reported
    /// none of the servers Nova lists on the host. Use with care. Bounded,
    /// so that the API server can bound the cost of the CEL rule that
    /// checks the names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(max = 16)))]
    pub force: Vec<String>,
}

impl EvictionOptions {
    /// The policy of a VM without its own (the shell fills in the cluster
    /// default before the pure step sees the options).
    pub fn policy_default(&self) -> MigrationPolicy {
        self.default_policy.unwrap_or_default()
    }
}

impl Default for EvictionOptions {
    fn default() -> Self {
        EvictionOptions {
            re_enable: None,
            max_parallel: default_parallel(),
            progress_timeout_seconds: default_progress_timeout(),
            completion_timeout_per_gib_seconds: default_completion_timeout(),
            max_attempts: default_attempts(),
            force_complete: true,
            default_policy: None,
            force: Vec::new(),
        }
    }
}

fn default_parallel() -> u32 {
    2
}
fn default_progress_timeout() -> u64 {
    150
}
fn default_completion_timeout() -> u64 {
    150
}
fn default_attempts() -> u32 {
    3
}
fn yes() -> bool {
    true
}

/// What the preflight expects of one VM.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlannedVm {
    /// Nova server UUID.
    pub id: String,
    #[serde(default)]
    pub name: String,
    pub policy: MigrationPolicy,
    /// The host whose room the preflight counted it against: Nova's
    /// scheduler picks the real target. Absent when it fits nowhere, when
    /// the room was not counted (`force: capacity`), or when it stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fits_on: Option<String>,
    /// The resources it was counted with (Placement classes): the room
    /// another eviction's preflight leaves to it on `fitsOn` until it has
    /// moved.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub takes: BTreeMap<String, u64>,
    /// What stops it: `check: why`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, JsonSchema)]
pub enum EvictionPhase {
    #[default]
    Pending,
    Preflight,
    Disabling,
    Migrating,
    /// Every VM is in a final state.
    Succeeded,
    /// Stopped (e.g. preflight failed); the condition says why.
    Failed,
    /// Deleted while running; in-flight migrations were aborted.
    Cancelled,
    /// A dry run (`spec.dryRun`) whose preflight ran: nothing moved.
    Planned,
}

impl EvictionPhase {
    pub const ALL: [EvictionPhase; 8] = [
        EvictionPhase::Pending,
        EvictionPhase::Preflight,
        EvictionPhase::Disabling,
        EvictionPhase::Migrating,
        EvictionPhase::Succeeded,
        EvictionPhase::Failed,
        EvictionPhase::Cancelled,
        EvictionPhase::Planned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EvictionPhase::Pending => "Pending",
            EvictionPhase::Preflight => "Preflight",
            EvictionPhase::Disabling => "Disabling",
            EvictionPhase::Migrating => "Migrating",
            EvictionPhase::Succeeded => "Succeeded",
            EvictionPhase::Failed => "Failed",
            EvictionPhase::Cancelled => "Cancelled",
            EvictionPhase::Planned => "Planned",
        }
    }

    pub fn is_final(self) -> bool {
        matches!(
            self,
            EvictionPhase::Succeeded
                | EvictionPhase::Failed
                | EvictionPhase::Cancelled
                | EvictionPhase::Planned
        )
    }
}

impl Eviction {
    /// Not in a final phase (one not yet begun runs). A dry run never
    /// runs: it disables nothing, moves nothing, holds no drain.
    pub fn is_running(&self) -> bool {
        !self.spec.dry_run && !self.status.as_ref().and_then(|s| s.phase).unwrap_or_default().is_final()
    }

    /// The message of its first condition that is not True: why it waits
    /// or stopped (empty when none).
    pub fn unmet_message(&self) -> String {
        let conditions = self.status.iter().flat_map(|s| s.conditions.iter());
        conditions
            .filter(|c| {
                !super::ready::SUMMARY_TYPES.iter().any(|t| t.as_str() == c.type_) && c.status != "True"
            })
            .map(|c| c.message.clone())
            .next()
            .unwrap_or_default()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<EvictionPhase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// "migrated/total", for `kubectl get evictions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The Nova host being emptied, fixed when the preflight passes: once
    /// VMs move, the eviction follows this host whatever becomes of its
    /// Hypervisor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The last preflight's plan, one entry per VM: where the room it
    /// found would take each, or what stops it (`hvctl evict --dry-run`
    /// prints it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<PlannedVm>,
    /// VMs on the host when the eviction started.
    #[serde(default)]
    pub total: u32,
    #[serde(default)]
    pub migrated: u32,
    /// VMs deleted by their owner while the eviction ran.
    #[serde(default)]
    pub gone: u32,
    #[serde(default)]
    pub non_migratable: u32,
    #[serde(default)]
    pub in_flight: u32,
    /// One entry per VM, each ending in a final state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<VmStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Whether the node was re-enabled at the end.
    #[serde(default)]
    pub re_enabled: bool,
    /// The host's fencing record said fenced at the last look: its VMs are
    /// evacuated, not migrated (docs/fencing.md). Never without a live
    /// fencing record: unset once the record is gone.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evacuating: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum VmState {
    #[default]
    Pending,
    Migrating,
    /// Waiting out the backoff before the next attempt.
    Backoff,
    Migrated,
    /// Deleted by its owner during the eviction.
    Gone,
    NonMigratable,
    /// Policy `external`: marked, waiting for its owner to move it.
    External,
    /// Left on the host: policy `Skip` (moved by somebody else), or not
    /// evacuated by its opt-in or opt-out; the reason says which.
    Skipped,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmStatus {
    /// Nova server UUID.
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default)]
    pub state: VmState,
    #[serde(default)]
    pub attempts: u32,
    /// Attempts whose request never reached Nova (no connection to it, or
    /// no token from Keystone): asked again after a pause, and not counted
    /// against `maxAttempts` (an outage is not the VM's fault).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub not_sent: u32,
    /// Host the VM ended on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_host: Option<String>,
    /// Why it is non-migratable, or why the last attempt failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Nova's status of the server when its first evacuation was asked
    /// for (its attempts are evacuations). Nova rebuilds an evacuated
    /// server stopped: one that was ACTIVE is started again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub former_status: Option<String>,
    /// Policy `liveMigrateIfPossible`: it could not go live and is
    /// cold-migrated from its next attempt on; this many live attempts had
    /// failed (the cold ones get `maxAttempts` of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_after_failures: Option<u32>,
    /// Name of the current or last Migration object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<String>,
    /// When the current attempt was asked of Nova.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_started: Option<Time>,
    /// In Backoff: when the next attempt may start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
