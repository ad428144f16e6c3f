//! `Hypervisor`: one per Kubernetes Node that runs nova-compute, named after
//! the Node and owned by it. `spec` is what the SRE wants; `status` is what the
//! coordinator observed and decided, including the bookkeeping the lifecycle
//! core needs to resume after a restart (docs/lifecycle.md).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::condition::ConditionType;
use super::eviction::EvictionReason;
use super::power::{DesiredPower, HostPower, PowerRecord};

/// Desired state of a hypervisor.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "hypervisor.cloud.sap",
    version = "v1alpha1",
    kind = "Hypervisor",
    plural = "hypervisors",
    shortname = "hv",
    category = "openstack",
    status = "HypervisorStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health.state"}"#,
    printcolumn = r#"{"name":"Maintenance","type":"string","jsonPath":".spec.maintenance"}"#,
    printcolumn = r#"{"name":"Instances","type":"integer","jsonPath":".status.instances.count"}"#,
    printcolumn = r#"{"name":"Agent","type":"boolean","jsonPath":".status.agent.connected"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Libvirt","type":"string","jsonPath":".status.libvirtVersion","priority":1}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".status.serviceId","priority":1}"#,
    printcolumn = r#"{"name":"Power","type":"string","jsonPath":".status.powerState","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.maintenance != 'manual' || self.maintenanceReason != ''").message("spec.maintenanceReason is required when spec.maintenance is 'manual'").field_path(".maintenanceReason"))]
#[x_kube(validation = Rule::new("oldSelf.maintenance != 'termination' || self.maintenance == 'termination'").message("spec.maintenance 'termination' cannot be undone").field_path(".maintenance"))]
#[x_kube(validation = Rule::new("self.customTraits.all(t, t.matches('^CUSTOM_[A-Z0-9_]{1,248}$'))").message("spec.customTraits entries must match ^CUSTOM_[A-Z0-9_]+$").field_path(".customTraits"))]
#[x_kube(validation = Rule::new("!has(self.fencing) || !has(self.fencing.bmc) || self.fencing.bmc.address.startsWith('redfish://') || self.fencing.bmc.address.startsWith('redfish+https://')").message("spec.fencing.bmc.address must be redfish:// or redfish+https:// (HTTPS: the BMC's credentials never travel in clear)").field_path(".fencing.bmc.address"))]
pub struct HypervisorSpec {
    /// The host name nova-compute registered under (`CONF.host`), when it
    /// differs from the Kubernetes Node name (`compute-4` for the Node
    /// `compute-4.example.local`). Empty: the Node name. Filled at creation
    /// from the Node annotation `hypervisor.cloud.sap/nova-host` or the
    /// coordinator's `--nova-host-strip-suffix`. Once the compute service
    /// was found, the host it was found under is kept in
    /// `status.lifecycle.novaHost` and a later change here is refused with a
    /// condition (docs/lifecycle.md, "Nova host names").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 255))]
    pub nova_host: String,
    /// Nova host aggregates the host must be a member of. An aggregate that
    /// does not exist in Nova stops onboarding (phase Aborted).
    #[serde(default)]
    pub aggregates: Vec<String>,
    /// `CUSTOM_*` traits set on the host's Placement resource provider.
    /// Traits that are not `CUSTOM_*` belong to nova-compute and are never touched.
    /// Bounded (64 traits of Placement's 255 characters) so that the API
    /// server can bound the cost of the CEL rule that checks them.
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 255)))]
    pub custom_traits: Vec<String>,
    /// Skip the Testing phase. Useful in development; not recommended in production.
    #[serde(default)]
    pub skip_tests: bool,
    /// Maintenance mode. Setting it stops scheduling and evicts the VMs;
    /// clearing it re-runs Testing (unless skipTests) and returns the node to
    /// Active. `termination` cannot be undone and ends in Decommissioned.
    #[serde(default)]
    pub maintenance: MaintenanceMode,
    /// Why the node is in maintenance; required for `manual`. Written into
    /// Nova's disabled reason so it is visible to OpenStack operators too.
    #[serde(default)]
    #[schemars(length(max = 200))]
    pub maintenance_reason: String,
    /// What the Testing phase expects of the node's libvirt.
    #[serde(default)]
    pub libvirt: LibvirtSpec,
    /// Open vSwitch bridges the Testing phase expects.
    #[serde(default)]
    pub ovs: OvsSpec,
    /// Ceph RBD pools the Testing phase expects to be readable.
    #[serde(default)]
    pub ceph: CephSpec,
    /// How the host is fenced when it has failed (docs/fencing.md).
    #[serde(default)]
    pub fencing: FencingSpec,
    /// `Hibernating`: once Active and empty, the host is disabled in Nova
    /// and powered off through its BMC (`fencing.bmc`); `Running` wakes
    /// it, through its checks (docs/power.md).
    #[serde(default, skip_serializing_if = "DesiredPower::is_running")]
    pub power_state: DesiredPower,
}

impl HypervisorSpec {
    /// The Nova host this spec names for the Hypervisor `name`.
    pub fn nova_host<'a>(&'a self, name: &'a str) -> &'a str {
        if self.nova_host.is_empty() { name } else { &self.nova_host }
    }
}

/// Maintenance modes (`""` when the node is not in maintenance; docs/lifecycle.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum MaintenanceMode {
    /// Not in maintenance.
    #[default]
    #[serde(rename = "")]
    None,
    /// An admin asked for it (needs a reason).
    #[serde(rename = "manual")]
    Manual,
    /// An automated rolling update (e.g. Gardener) needs the node.
    #[serde(rename = "auto")]
    Auto,
    /// The HA detector found a hardware problem.
    #[serde(rename = "ha")]
    Ha,
    /// The Kubernetes Node is being terminated; ends in Decommissioned.
    #[serde(rename = "termination")]
    Termination,
}

impl MaintenanceMode {
    pub fn is_requested(self) -> bool {
        self != MaintenanceMode::None
    }

    pub fn as_str(self) -> &'static str {
        match self {
            MaintenanceMode::None => "",
            MaintenanceMode::Manual => "manual",
            MaintenanceMode::Auto => "auto",
            MaintenanceMode::Ha => "ha",
            MaintenanceMode::Termination => "termination",
        }
    }

    /// The eviction reason a maintenance of this mode runs with (docs/lifecycle.md's
    /// table of eviction reasons).
    pub fn eviction_reason(self) -> Option<EvictionReason> {
        match self {
            MaintenanceMode::None => None,
            MaintenanceMode::Manual => Some(EvictionReason::AdminRequest),
            MaintenanceMode::Auto => Some(EvictionReason::RollingUpdate),
            MaintenanceMode::Ha => Some(EvictionReason::NodeFailure),
            MaintenanceMode::Termination => Some(EvictionReason::Decommission),
        }
    }
}

/// What the Testing phase expects of the node's libvirt. (How the agent
/// reaches libvirt, URI and credentials, is the agent's configuration.)
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LibvirtSpec {
    /// Lowest acceptable libvirt version, "major.minor.micro".
    #[serde(default = "default_min_libvirt")]
    #[schemars(default = "default_min_libvirt", regex(pattern = r"^[0-9]+\.[0-9]+\.[0-9]+$"))]
    pub minimum_version: String,
}

impl Default for LibvirtSpec {
    fn default() -> Self {
        LibvirtSpec { minimum_version: default_min_libvirt() }
    }
}

fn default_min_libvirt() -> String {
    "8.0.0".into()
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OvsSpec {
    /// Bridges that must exist.
    #[serde(default = "default_bridges")]
    #[schemars(default = "default_bridges")]
    pub bridges: Vec<String>,
    /// Bridges that are checked when present but may be missing.
    #[serde(default = "default_optional_bridges")]
    #[schemars(default = "default_optional_bridges")]
    pub optional_bridges: Vec<String>,
    /// What bridges must look like beyond existing; a mismatch fails the
    /// bridge's check naming the field, the wanted and the found value.
    /// Default: br-int in fail mode secure (standalone makes it a learning
    /// switch when its controller is gone).
    #[serde(default = "default_expectations")]
    #[schemars(default = "default_expectations")]
    pub expectations: Vec<BridgeExpectation>,
    /// `external_ids` the Open_vSwitch table's row must carry, e.g.
    /// `ovn-bridge-mappings`; the value `*` accepts any non-empty value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub external_ids: BTreeMap<String, String>,
}

impl Default for OvsSpec {
    fn default() -> Self {
        OvsSpec {
            bridges: default_bridges(),
            optional_bridges: default_optional_bridges(),
            expectations: default_expectations(),
            external_ids: BTreeMap::new(),
        }
    }
}

/// One bridge's expected settings; unset fields are not checked.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BridgeExpectation {
    #[schemars(length(min = 1, max = 255))]
    pub bridge: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_mode: Option<FailMode>,
    /// `system` or `netdev` (OVSDB's empty value means `system`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub datapath_type: String,
    /// Ports that must be on the bridge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// `external_ids` the Bridge row must carry; `*` accepts any non-empty value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub external_ids: BTreeMap<String, String>,
}

/// An OVS bridge's behaviour when its controller is unreachable.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Drop what the controller has not programmed.
    Secure,
    /// Act as a learning switch.
    Standalone,
}

impl FailMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FailMode::Secure => "secure",
            FailMode::Standalone => "standalone",
        }
    }
}

fn default_expectations() -> Vec<BridgeExpectation> {
    vec![BridgeExpectation {
        bridge: "br-int".into(),
        fail_mode: Some(FailMode::Secure),
        ..BridgeExpectation::default()
    }]
}

fn default_bridges() -> Vec<String> {
    vec!["br-int".into(), "br-ex".into()]
}

fn default_optional_bridges() -> Vec<String> {
    vec!["br-provider".into()]
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CephSpec {
    /// RBD pools the node must be able to read as its own Ceph client.
    #[serde(default)]
    pub pools: Vec<String>,
    /// Nova on this host keeps the servers' own disks (a root disk from an
    /// image, ephemeral disks) in Ceph RBD (`[libvirt] images_type = rbd`):
    /// they outlive the host, so its servers can be evacuated whole. False:
    /// only volume-backed servers are (docs/fencing.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub instance_disks_on_rbd: bool,
}

/// The means to fence the host beside Nova's `forced_down` (docs/fencing.md).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencingSpec {
    /// Its BMC: a fenced host is powered off. None: it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcSpec>,
    /// The addresses its Ceph clients use, put into the OSD blocklist when
    /// it is fenced: an IP (every client at that address) or one client
    /// instance (`IP:PORT/NONCE`). Given, they replace the ones its agent
    /// reported (`status.machine.cephAddresses`): for a host whose VMs
    /// reach Ceph from another address than its agent's probe. A host with
    /// `ceph.pools` and no address either way cannot be fenced on its
    /// storage: its fencing stops there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub ceph_addresses: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcSpec {
    /// `redfish+https://HOST[:PORT]/redfish/v1/Systems/ID` (`redfish://`
    /// is HTTPS too; `redfish+http://` is plain HTTP).
    #[schemars(length(min = 1, max = 512))]
    pub address: String,
    /// A Secret in the coordinator's namespace with `username` and
    /// `password`, and `ca.crt` when the BMC's certificate is not from a
    /// public CA.
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret: String,
    /// Do not check the BMC's certificate (many BMCs ship self-signed ones).
    #[serde(default)]
    pub insecure: bool,
}

/// Lifecycle phase (docs/lifecycle.md).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema,
)]
pub enum Phase {
    /// Newly discovered Node; the Hypervisor object was just created.
    #[default]
    Initial,
    /// Registering with Nova: compute service lookup, aggregates, traits.
    Onboarding,
    /// The agent runs the validation checks.
    Testing,
    /// Onboarding or Testing failed; the cause is in a condition. Left only
    /// by an explicit retry.
    Aborted,
    /// Tested, waiting for scheduling to be enabled in Nova.
    Ready,
    /// Enabled in Nova; VMs may land here.
    Active,
    /// Scheduling stopped and VMs evicted; held for maintenance work.
    Maintenance,
    /// VMs are being moved off the node.
    Evicting,
    /// Removed from Nova; the object stays as the record. Terminal.
    Decommissioned,
}

impl Phase {
    pub const ALL: [Phase; 9] = [
        Phase::Initial,
        Phase::Onboarding,
        Phase::Testing,
        Phase::Aborted,
        Phase::Ready,
        Phase::Active,
        Phase::Maintenance,
        Phase::Evicting,
        Phase::Decommissioned,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Initial => "Initial",
            Phase::Onboarding => "Onboarding",
            Phase::Testing => "Testing",
            Phase::Aborted => "Aborted",
            Phase::Ready => "Ready",
            Phase::Active => "Active",
            Phase::Maintenance => "Maintenance",
            Phase::Evicting => "Evicting",
            Phase::Decommissioned => "Decommissioned",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An update tool's drain of the Node, as the coordinator reads it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateDrainStatus {
    /// The tool (`Gardener MCM`).
    #[schemars(length(max = 63))]
    pub tool: String,
    /// When it began to drain (its signal on the Node).
    pub since: Time,
    /// When it stops waiting for the budgets and deletes the Node's pods.
    pub stops_waiting_at: Time,
}

/// Observed state of a hypervisor.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HypervisorStatus {
    /// Lifecycle phase; absent means Initial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// When the current phase was entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_since: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The spec generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nova compute service id (a UUID since compute microversion 2.53).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_id: Option<String>,
    /// Nova hypervisor id (a UUID since compute microversion 2.53). The
    /// Placement resource provider is looked up by the host's name: its UUID
    /// is not guaranteed to be this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor_id: Option<String>,
    /// libvirt version reported by the agent, "major.minor.micro".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt_version: Option<String>,
    /// Hypervisor (QEMU / Cloud Hypervisor) version reported by the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor_version: Option<String>,
    /// Results of the latest test run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckResultStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<InstancesStatus>,
    /// An update tool that stops waiting at a known time drains the Node
    /// (docs/drain.md, "When a tool will not wait"); the `UpdateDrain`
    /// condition says how the host stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_drain: Option<UpdateDrainStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// The host's health from every source (docs/health.md); also the
    /// `NodeHealthy` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// The host's fencing, from its start until an SRE clears it
    /// (docs/fencing.md); also the `Fenced` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingStatus>,
    /// The machine as its agent last reported it, kept once the agent is
    /// gone: fencing needs it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineStatus>,
    /// Whether the host may lose the pods its VMs need, as the Node's drain
    /// marks should say (docs/drain.md): true only with no VM on it, by the
    /// reconcile's own read of Nova, and held out of service. Absent: not
    /// known; the marks stay as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evictable: Option<bool>,
    /// Where the host's power stands (docs/power.md); absent while it was
    /// never asked to hibernate. Also the `PowerState` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<HostPower>,
    /// The lifecycle core's own bookkeeping, so a restarted coordinator
    /// resumes where it stopped. Not meant to be edited.
    #[serde(default)]
    pub lifecycle: LifecycleRecord,
}

/// What the host's agent reported about its machine that fencing relies
/// on; each part replaced only by a newer report of it, never erased.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    /// Its SMBIOS system UUID, lowercase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_uuid: Option<String>,
    /// The IPs its Ceph client reached the cluster from, as the cluster
    /// saw them: what fencing blocklists unless `spec.fencing.cephAddresses`
    /// says otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub ceph_addresses: Vec<String>,
    /// The host name libvirt gives on the machine: what Nova's libvirt
    /// driver names the host's hypervisor record after. A host is activated
    /// only when the two agree (docs/lifecycle.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub hostname: Option<String>,
    /// The UUIDs of the domains in the agent's last report (with Nova's
    /// libvirt driver, its servers' UUIDs), sorted; absent until one was
    /// reported. Compared with the servers Nova lists on the host before
    /// an eviction or evacuation starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024), inner(length(max = 36)))]
    pub domains: Option<Vec<String>>,
    /// What the host offers guests, as its agent last reported: the
    /// traits synced to its resource provider, and what the preflight
    /// judges a target host by (docs/lifecycle.md, "Host capabilities").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<HostCapabilities>,
    /// The guest CPUs of the domains in the agent's last report, grouped:
    /// what a host each VM moves to must give (docs/eviction.md, "OS
    /// validation"). Absent until one was reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub guest_cpus: Option<Vec<GuestCpuStatus>>,
}

/// One guest CPU and the domains that have it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestCpuStatus {
    /// host-passthrough, host-model or custom.
    #[schemars(length(max = 32))]
    pub mode: String,
    /// A custom CPU's named model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 64))]
    pub model: String,
    /// The flags it requires.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    pub features: Vec<String>,
    #[schemars(length(max = 1024), inner(length(max = 36)))]
    pub domains: Vec<String>,
}

/// A host's CPU, hypervisor software and hardware, as its agent reports
/// them (libvirt's capabilities and domain capabilities, the host's /sys).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCapabilities {
    #[schemars(length(max = 32))]
    pub arch: String,
    /// The architectures of the guests it can run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 32)))]
    pub guest_arches: Vec<String>,
    #[schemars(length(max = 128))]
    pub cpu_model: String,
    /// The host CPU's feature flags, as libvirt names them, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 64)))]
    pub cpu_features: Vec<String>,
    /// The named CPU models guests may be given here; absent when the
    /// domain capabilities could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), inner(length(max = 64)))]
    pub cpu_models: Option<Vec<String>>,
    /// libvirt's hypervisor driver ("QEMU") and its version ("8.2.2").
    #[schemars(length(max = 32))]
    pub hypervisor_type: String,
    #[schemars(length(max = 32))]
    pub hypervisor_version: String,
    #[schemars(length(max = 32))]
    pub libvirt_version: String,
    #[serde(default)]
    pub amd_sev: bool,
    #[serde(default)]
    pub uefi_secure_boot: bool,
    /// Network controllers that can have SR-IOV virtual functions; absent
    /// when the host's PCI devices could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov_nics: Option<u32>,
    /// NUMA cells: CPUs and memory (MiB) of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub numa_cells: Vec<NumaCellStatus>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub hugepages: Vec<HugepageStatus>,
    /// The standard traits these add to the host's resource provider:
    /// the ones Nova's libvirt driver does not report itself. Absent when
    /// what they come from could not be read: those added stay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64), inner(length(max = 255)))]
    pub traits: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NumaCellStatus {
    pub cpus: u32,
    pub memory_mib: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HugepageStatus {
    #[serde(rename = "sizeKiB")]
    pub size_kib: u64,
    pub total: u64,
}

impl MachineStatus {
    /// `old` with the parts `new` reports.
    pub fn updated(old: Option<&MachineStatus>, new: &MachineStatus) -> MachineStatus {
        let mut m = old.cloned().unwrap_or_default();
        if new.system_uuid.is_some() {
            m.system_uuid = new.system_uuid.clone();
        }
        if !new.ceph_addresses.is_empty() {
            m.ceph_addresses = new.ceph_addresses.clone();
        }
        if new.hostname.is_some() {
            m.hostname = new.hostname.clone();
        }
        if new.domains.is_some() {
            m.domains = new.domains.clone();
        }
        if new.capabilities.is_some() {
            m.capabilities = new.capabilities.clone();
        }
        if new.guest_cpus.is_some() {
            m.guest_cpus = new.guest_cpus.clone();
        }
        m
    }
}

/// A fencing under way or done: it stands until an SRE clears it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FencingStatus {
    /// When the fencing started (recorded before its first step).
    pub started: Option<Time>,
    /// The steps confirmed, in the order taken.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirmed: Vec<FenceStep>,
    /// The step that could not be confirmed, and why; it stands until an
    /// SRE retries it or confirms the host fenced by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedFenceStep>,
    /// When the host counted fenced (every step confirmed, or by hand).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<Time>,
    /// An SRE confirmed the host fenced (`hvctl confirm-fenced`).
    #[serde(default)]
    pub by_hand: bool,
    /// The retry annotation's value last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_retry: Option<String>,
    /// The confirm-fenced annotation's value when this fencing started: a
    /// confirmation counts only if given since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_confirm: Option<String>,
    /// The clear-fenced annotation's value when this fencing started: a
    /// clearing counts only if asked since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_clear: Option<String>,
    /// The addresses the storage step put into the OSD blocklist (recorded
    /// before it is tried): the ones a clearing lifts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ceph_addresses: Vec<String>,
    /// The clearing lifted the host's blocklist entries.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blocklist_lifted: bool,
    /// The fenced host showed life again while its servers were being
    /// evacuated: no evacuation starts until it is fenced again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revival: Option<FenceRevival>,
    /// When it was last fenced again after showing life (its power off
    /// read twice, or an SRE's confirmation): life is looked for since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refenced: Option<Time>,
    /// The retire annotation's value when this fencing started: a
    /// retirement counts only if asked since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_retire: Option<String>,
    /// The host is retired, gone for good (`hvctl retire`): the record
    /// stays, its blocklist entries are lifted once its machine is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retirement: Option<FenceRetirement>,
}

impl FencingStatus {
    /// The host was retired: gone for good, nothing left to do.
    pub fn retired(&self) -> bool {
        self.retirement.as_ref().is_some_and(|r| r.retired.is_some())
    }
}

/// A fenced host retired by an SRE (docs/fencing.md, "A host gone for
/// good").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceRetirement {
    /// When the coordinator took the SRE's word.
    pub asked: Option<Time>,
    /// The retire annotation's value it took.
    #[serde(default)]
    pub handled: String,
    /// The clear-fenced annotation's value when it was asked: a clearing
    /// asked since cancels the retirement (the host was not gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_clear: Option<String>,
    /// How the machine was found off or gone, before its blocklist
    /// entries were lifted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// When nothing was left to do: the host counts retired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retired: Option<Time>,
}

/// A fenced host that showed life again (docs/fencing.md, "A fenced host
/// that shows life").
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceRevival {
    /// When the sign was first seen.
    pub seen: Option<Time>,
    /// What showed it: its agent talking, its BMC reading power on.
    pub sign: String,
    /// The confirm-fenced annotation's value then: an SRE's confirmation
    /// that the host is off again counts only if given since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_confirm: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedFenceStep {
    pub step: FenceStep,
    pub message: String,
    /// Tries so far; the step stands failed after the last.
    pub attempts: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckResultStatus {
    /// Stable check name, e.g. `ovs-bridge/br-ex`.
    pub name: String,
    pub passed: bool,
    #[serde(default)]
    pub message: String,
    /// How long the check ran, in milliseconds.
    #[serde(default)]
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancesStatus {
    /// Number of Nova instances on the host.
    pub count: u32,
    /// Their Nova UUIDs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub connected: bool,
    /// Since when the current session (or disconnection) lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
}

/// A step of fencing a dead host, in the order they are taken
/// (docs/fencing.md).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum FenceStep {
    /// Nova holds its compute service forced down.
    NovaForcedDown,
    /// Its Ceph client addresses are in the OSD blocklist.
    CephBlocklisted,
    /// Its BMC reports its power off.
    PoweredOff,
}

impl std::fmt::Display for FenceStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FenceStep::NovaForcedDown => "NovaForcedDown",
            FenceStep::CephBlocklisted => "CephBlocklisted",
            FenceStep::PoweredOff => "PoweredOff",
        })
    }
}

/// What a host's health adds up to (docs/health.md).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default, JsonSchema,
)]
pub enum HealthState {
    /// Every source sees it, and it reports nothing critical.
    #[default]
    Healthy,
    /// It works, and its agent reports something critical: it should be emptied.
    Degraded,
    /// A channel to it is lost (its agent's stream, its kubelet, its
    /// nova-compute): we cannot see it; the cause is unknown.
    Unreachable,
    /// Its agent's stream and at least one other channel are lost.
    Failed,
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HealthState::Healthy => "Healthy",
            HealthState::Degraded => "Degraded",
            HealthState::Unreachable => "Unreachable",
            HealthState::Failed => "Failed",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    pub state: HealthState,
    /// When the host entered this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// What the state rests on: one line per lost source or agent signal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// What the lifecycle core remembers between reconciles.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleRecord {
    /// The Nova host the compute service was found under; every Nova call
    /// for this Hypervisor uses it from then on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nova_host: Option<String>,
    /// Aggregates this controller added (and may therefore remove).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_aggregates: Vec<String>,
    /// `CUSTOM_*` traits this controller added (and may therefore remove).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_traits: Vec<String>,
    /// Current test run number; a check report counts only for this run.
    #[serde(default)]
    pub test_run: u64,
    /// When the current test run was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_started: Option<Time>,
    /// The eviction this node is waiting for or held by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<EvictionRef>,
    /// Number of evictions this controller has created for the node; part of
    /// their names, so a re-created eviction gets a name of its own.
    #[serde(default)]
    pub eviction_seq: u32,
    /// The last retry token acted on (annotation `hypervisor.cloud.sap/retry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handled_retry: Option<String>,
    /// Why the node is Aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<AbortRecord>,
    /// The reasons of this controller's latest disables of the compute
    /// service (at most 4, newest last), each recorded before it is sent:
    /// a disable Nova shows is ours to lift only when its reason is one of
    /// them (docs/lifecycle.md, "Who owns a disable"). Absent on a
    /// Hypervisor made before the record existed, which goes by the
    /// reason's prefix alone until its first disable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4), inner(length(max = 255)))]
    pub disabled_as: Option<Vec<String>>,
    /// Since when an update's ask holds this host out of service: one of
    /// the places `--update-max-held` counts (docs/drain.md). Recorded
    /// before the host is disabled for it, so a new leader counts it too;
    /// cleared when the ask ends or an SRE's own maintenance takes over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_place: Option<Time>,
    /// The host was in service when first seen (its compute service
    /// enabled, with servers): it is adopted, never disabled on its way in,
    /// its first check run a re-check. Cleared once it is Active, or taken
    /// out of service (Maintenance, Evicting, Decommissioned).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopted: bool,
    /// What the adopted host's first check run found wrong: reported, the
    /// host left in service. Cleared when the host is validated afresh
    /// (back to Onboarding), or by a re-check that passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted_checks_failed: Option<String>,
    /// Set once the compute service was deleted with no instance left.
    #[serde(default)]
    pub service_deleted: bool,
    /// Set while an Active host is disabled in Nova because we lost sight
    /// of it (docs/health.md); cleared once it is seen again and its
    /// checks pass, or when it leaves Active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unseen: Option<UnseenHold>,
    /// The start of the fencing whose servers an Eviction has evacuated
    /// (or is evacuating): a fenced host with servers left gets one
    /// evacuation per fencing, never a loop of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuated_for: Option<Time>,
    /// Since when the host's power has stood where `status.powerState`
    /// says, and the test run its wake started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerRecord>,
}

/// An Active host held disabled while we cannot see it (docs/health.md).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnseenHold {
    /// When it was disabled.
    pub disabled_at: Time,
    /// The health verdict it was disabled for, with its first evidence line.
    pub cause: String,
    /// The test run started once it was seen again: only a pass of this run
    /// enables it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_run: Option<u64>,
    /// That run failed (or never reported): it stays disabled until a retry.
    #[serde(default)]
    pub recheck_failed: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EvictionRef {
    pub name: String,
    pub reason: EvictionReason,
    /// Re-enable the node when this eviction completes.
    pub re_enable: bool,
    /// Created by this controller for spec.maintenance (as opposed to an
    /// Eviction created by hand).
    pub for_maintenance: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbortRecord {
    /// Condition type that failed (`Onboarded` or `Tested`).
    // Typed, so that it and the reason beside it are one value (what
    // tests/src/reasons reads back); stored as its name, a string, as it
    // always was.
    #[schemars(with = "String")]
    pub condition: ConditionType,
    pub reason: String,
    pub message: String,
    /// Phase the node was in when it aborted.
    pub from: Phase,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An abort's record as it has always been stored reads back typed,
    /// and is stored again the same.
    #[test]
    fn a_stored_abort_record_reads_back_the_same() {
        let stored = serde_json::json!({
            "condition": "Tested",
            "reason": "ChecksFailed",
            "message": "a check failed",
            "from": "Testing",
        });
        let record: AbortRecord = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(record.condition, ConditionType::Tested);
        assert_eq!(serde_json::to_value(&record).unwrap(), stored);
    }
}
