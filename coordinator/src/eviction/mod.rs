//! Eviction, pure (docs/eviction.md): [`preflight::preflight`] decides
//! whether every VM of the host could be placed elsewhere, [`plan::step`]
//! decides, for one Eviction, which VM moves next, which migration is stuck
//! and what every VM's record says, [`checks`] refuses an Eviction that
//! cannot run, [`machine`] whether the host is the machine Nova means, and
//! [`phases`] says what the phases before Migrating come to. [`NovaState`] is what Nova says of a migration.
//! [`server_groups`] where a group's rule lets a member go. [`limit::ClusterLimit`] is the cluster-wide migration limit; [`news`] what a status write tells as Events.
//! The shell that runs them against Nova is `k8s::eviction`.

pub mod checks;
pub mod limit;
pub mod machine;
pub mod news;
mod nova_state;
pub mod os_check;
pub mod phases;
pub mod plan;
pub mod preflight;
pub mod room_asleep;
pub mod server_groups;

pub use nova_state::NovaState;
