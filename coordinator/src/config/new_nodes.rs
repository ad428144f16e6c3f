//! Which Nodes are hypervisors, and what a new Hypervisor's spec starts
//! from.

use crate::k8s::Template;

#[derive(clap::Args, Debug)]
pub struct NewNodeFlags {
    /// Label selector of the Nodes that are hypervisors.
    #[arg(long, env = "HV_NODE_SELECTOR", default_value = crate::api::keys::DEFAULT_NODE_SELECTOR)]
    pub node_selector: String,
    /// Aggregate every new Hypervisor joins (repeatable; a Node annotation
    /// hypervisor.cloud.sap/aggregates=a,b overrides it).
    #[arg(long = "aggregate")]
    pub aggregates: Vec<String>,
    /// CUSTOM_* trait for new Hypervisors (repeatable; annotation hypervisor.cloud.sap/custom-traits).
    #[arg(long = "custom-trait")]
    pub custom_traits: Vec<String>,
    /// RBD pool new Hypervisors must read (repeatable; annotation hypervisor.cloud.sap/ceph-pools).
    #[arg(long = "ceph-pool")]
    pub ceph_pools: Vec<String>,
    /// New Hypervisors skip Testing (annotation hypervisor.cloud.sap/skip-tests=true).
    #[arg(long)]
    pub skip_tests: bool,
    /// Suffix removed from a Node name to get the Nova host its nova-compute
    /// registered under (repeatable; the first that matches): `.example.local`
    /// maps the Node compute-4.example.local to compute-4. The Node annotation
    /// hypervisor.cloud.sap/nova-host overrides it.
    #[arg(long = "nova-host-strip-suffix")]
    pub nova_host_strip_suffixes: Vec<String>,
}

impl NewNodeFlags {
    /// A new Hypervisor's spec, for the install named `instance`.
    pub fn template(&self, instance: &str) -> Template {
        Template {
            instance: instance.to_string(),
            aggregates: self.aggregates.clone(),
            custom_traits: self.custom_traits.clone(),
            ceph_pools: self.ceph_pools.clone(),
            skip_tests: self.skip_tests,
            nova_host_strip_suffixes: self.nova_host_strip_suffixes.clone(),
        }
    }
}
