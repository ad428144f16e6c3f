//! The well-known keys: every label, annotation, finalizer and Nova
//! metadata key the coordinator reads or writes, in one place, so that a
//! key is spelled once and an SRE finds them all here.

// On Nodes, set by people or tools, read when the Node is selected.

/// The Nodes the coordinator selects unless `--node-selector` says
/// otherwise: those labelled `hypervisor.cloud.sap/managed=true`.
pub const DEFAULT_NODE_SELECTOR: &str = "hypervisor.cloud.sap/managed=true";
/// Nova aggregates the host joins (comma-separated).
pub const AGGREGATES_ANNOTATION: &str = "hypervisor.cloud.sap/aggregates";
/// Custom traits the host's resource provider gets (comma-separated).
pub const TRAITS_ANNOTATION: &str = "hypervisor.cloud.sap/custom-traits";
/// Ceph pools the host's checks read (comma-separated).
pub const POOLS_ANNOTATION: &str = "hypervisor.cloud.sap/ceph-pools";
/// Onboarding without the validation tests.
pub const SKIP_TESTS_ANNOTATION: &str = "hypervisor.cloud.sap/skip-tests";
/// The host name nova-compute registered under, when not the Node name.
pub const NOVA_HOST_ANNOTATION: &str = "hypervisor.cloud.sap/nova-host";
/// An update tool asks for the host to be emptied (`auto` maintenance);
/// removed once the update is done (docs/drain.md).
pub const MAINTENANCE_REQUIRED_ANNOTATION: &str = "hypervisor.cloud.sap/maintenance-required";
/// The host's failure domain (its availability zone).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

// On Nodes, written by the coordinator.

/// Holds a selected Node's deletion until its host is out of Nova. Without
/// it the Node would vanish at once, and with it (through the owner
/// reference) the Hypervisor, before a single VM was moved.
pub const NODE_FINALIZER: &str = "hypervisor.cloud.sap/decommission";
/// Set while the host is judged Healthy, for Kubernetes-side tooling.
pub const SCHEDULABLE_LABEL: &str = "hypervisor.cloud.sap/schedulable";
/// Set (`"true"`) from before a host is powered off for hibernation until
/// it is back in service: its Node NotReady and its agent gone are on
/// purpose; it is no dead host (docs/power.md).
pub const HIBERNATED_LABEL: &str = "hypervisor.cloud.sap/hibernated";
/// On a Hypervisor whose `spec.powerState: Hibernating` the hibernation
/// policy set (value [`POWER_BY_POLICY`]): the policy may wake it again.
/// `hvctl hibernate` and `hvctl wake` remove it: the wish is then the SRE's.
pub const POWER_BY_ANNOTATION: &str = "hypervisor.cloud.sap/power-by";
pub const POWER_BY_POLICY: &str = "hibernation-policy";
/// When the host's agent was last heard from.
pub const HEARTBEAT_ANNOTATION: &str = "hypervisor.cloud.sap/heartbeat";
/// Whether the host may lose the pods its VMs need (the node lock protocol).
pub const EVICTABLE_LABEL: &str = "hypervisor.cloud.sap/evictable";
/// One per dependent that may not take its pods away yet:
/// `LOCK_ANNOTATION_PREFIX<component>`.
pub const LOCK_ANNOTATION_PREFIX: &str = "hypervisor.cloud.sap/lock.";
/// On a hypervisor's Node, set by the coordinator while the Node's Cluster
/// API Machine is being deleted (its namespace/name): with the
/// `cluster-api` update signal, an update's ask (docs/drain.md).
pub const MACHINE_DELETING_ANNOTATION: &str = "hypervisor.cloud.sap/machine-deleting";
/// The coordinator's pre-drain hook on a hypervisor's Cluster API Machine:
/// Cluster API does not drain the Node while it stands, and the coordinator
/// lifts it once the host is emptied and held (docs/drain.md).
pub const CLUSTER_API_HOOK_ANNOTATION: &str = "pre-drain.delete.hook.machine.cluster.x-k8s.io/hv-lifecycle";
/// The webhook refused a drain of a host not yet evictable: with the Node
/// cordoned, it asks for `auto` maintenance; removed once uncordoned.
pub const DRAIN_REFUSED_ANNOTATION: &str = "hypervisor.cloud.sap/drain-refused";

// On pods.

/// On a hypervisor Node's protected pods: `"false"` while the host is not
/// evictable, `"true"` once it is. The chart's PodDisruptionBudgets select
/// the pods not labelled `"true"`, so they hold while the webhook is down.
pub const POD_EVICTABLE_LABEL: &str = "hypervisor.cloud.sap/evictable";
/// On the coordinator's own pod while it leads: the chart's Service selects it.
pub const LEADER_LABEL: &str = "hypervisor.cloud.sap/leader";

// On Hypervisors.

/// The coordinator install a Hypervisor belongs to.
pub const INSTANCE_LABEL: &str = "hypervisor.cloud.sap/instance";
/// Set by an SRE (or `hvctl retry`) to a new value to retry an Aborted host.
pub const RETRY_ANNOTATION: &str = "hypervisor.cloud.sap/retry";
/// Set by an SRE (or `hvctl confirm-fenced`) once they made sure the host
/// is off and cut from its storage, past a step that cannot be confirmed.
pub const CONFIRM_FENCED_ANNOTATION: &str = "hypervisor.cloud.sap/confirm-fenced";
/// Set by an SRE (or `hvctl clear-fenced`) once the host is repaired and
/// back: the fence comes off (docs/fencing.md, Recovery).
pub const CLEAR_FENCED_ANNOTATION: &str = "hypervisor.cloud.sap/clear-fenced";
/// Set by an SRE (or `hvctl retire`) for a fenced host gone for good: its
/// blocklist entries are lifted once its machine reads off, the record is
/// kept (docs/fencing.md, A host gone for good).
pub const RETIRE_ANNOTATION: &str = "hypervisor.cloud.sap/retire";
/// Set by an SRE (or `hvctl retire --machine-gone`) to the retire
/// annotation's value: the machine is removed or wiped, so no BMC reading
/// is waited for. Another value says nothing.
pub const MACHINE_GONE_ANNOTATION: &str = "hypervisor.cloud.sap/machine-gone";
/// Set by an SRE (or `hvctl pause`) to a reason: the coordinator writes
/// nothing for the host (Nova, Placement, Ceph, its BMC, its Node and pods)
/// and never fences it, but still observes, judges and reports it;
/// removed (`hvctl resume`) to let it act again.
pub const PAUSED_ANNOTATION: &str = "hypervisor.cloud.sap/paused";
/// Holds a Hypervisor's deletion while VMs may depend on its host.
pub const HYPERVISOR_FINALIZER: &str = "hypervisor.cloud.sap/in-service";

// On Evictions and Secrets.

/// Keeps a deleted Eviction until its in-flight migrations are aborted.
pub const EVICTION_FINALIZER: &str = "hypervisor.cloud.sap/eviction";
/// A Secret needs it for its credentials to be sent to a BMC.
pub const BMC_SECRET_LABEL: &str = "hypervisor.cloud.sap/bmc-credentials";

// On Nova servers (metadata).

/// A server's own eviction policy.
pub const POLICY_METADATA: &str = "hypervisor.cloud.sap:eviction";
/// Set by us on a server of policy `external` while an eviction waits for
/// its owner to move it: the host it must leave. Removed once it has.
pub const EVICT_FROM_METADATA: &str = "hypervisor.cloud.sap:evict-from";
/// Whether a server is evacuated when its host is fenced.
pub const EVACUATE_METADATA: &str = "hypervisor.cloud.sap:evacuate";

// Kubernetes' own.

/// Where the kubelets' Leases live, one per Node, named after it.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
