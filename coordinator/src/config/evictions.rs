//! How evictions move VMs: the region's limit, how long a host may take to
//! be disabled, the default policy, and Nova's clock (docs/eviction.md).

use std::time::Duration;

use super::duration;
use crate::api::eviction::MigrationPolicy;

#[derive(clap::Args, Debug)]
pub struct EvictionFlags {
    /// Live migrations in flight at once across all evictions (at least 1).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub cluster_max_migrations: u32,
    /// How far Nova's clock may lag the coordinator's. A migration request
    /// whose answer was lost is matched to the migration Nova created for
    /// the server after we asked, less this.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub nova_clock_skew: Duration,
    /// How long an Eviction waits for its host's compute service to be
    /// disabled before it fails (nothing moves before that).
    #[arg(long, default_value = "10m", value_parser = duration)]
    pub eviction_disable_timeout: Duration,
    /// How a VM moves when neither its metadata (hypervisor.cloud.sap:eviction)
    /// nor its Eviction's options.defaultPolicy says: liveMigrate, coldMigrate or skip.
    #[arg(long, default_value = "liveMigrate", value_parser = policy)]
    pub default_migration_policy: MigrationPolicy,
}

fn policy(s: &str) -> Result<MigrationPolicy, String> {
    serde_json::from_value(serde_json::Value::String(s.into()))
        .map_err(|_| format!("{s:?} is not one of liveMigrate, coldMigrate, skip"))
}
