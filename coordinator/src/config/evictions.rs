//! How evictions move VMs: the region's limit and the default policy
//! (docs/eviction.md).

use crate::api::eviction::MigrationPolicy;

#[derive(clap::Args, Debug)]
pub struct EvictionFlags {
    /// Live migrations in flight at once across all evictions (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub cluster_max_migrations: u32,
    /// Evacuations of fenced hosts in flight at once across the region (at
    /// least 1): a budget of their own, so they never wait for the slots of
    /// planned evictions (docs/fencing.md).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub cluster_max_evacuations: u32,
    /// How a VM moves when neither its metadata (hypervisor.cloud.sap:eviction)
    /// nor its Eviction's options.defaultPolicy says: liveMigrate, coldMigrate or skip.
    #[arg(long, default_value = "liveMigrate", value_parser = policy)]
    pub default_migration_policy: MigrationPolicy,
}

fn policy(s: &str) -> Result<MigrationPolicy, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("{s:?} is not one of liveMigrate, coldMigrate, skip"))
}
