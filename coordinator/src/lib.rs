//! hv-coordinator: drives Nova and Placement through the hypervisor lifecycle
//! and owns the `Hypervisor`, `Eviction` and `Migration` resources.
//!
//! - [`api`]: the CRD types (the only source of `deploy/crds/`).
//! - [`lifecycle`]: the pure decision core (no I/O, no clock).
//! - [`health`]: what a host's health adds up to, from independent sources (pure).
//! - [`identity`]: whether an agent gets a certificate for its node, and signing it (pure).
//! - [`nova`]: Nova and Placement (Keystone through `openstack_sdk`).
//! - [`drain`]: the node lock protocol for drains and rolling updates (pure).
//! - [`fence`]: the actuators that fence a dead host (power through its BMC).
//! - [`metrics`]: `/metrics` and the eviction counters.
//! - [`power`]: hibernating empty hosts and waking them (pure).
//! - [`maintenance`]: a region's update planned in waves (pure).
//! - [`locked`]: the one way a lock is taken, failing closed when poisoned.

#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod drain;
pub mod eviction;
pub mod fence;
pub mod fleet;
pub mod health;
pub mod identity;
pub mod k8s;
pub mod lifecycle;
pub mod locked;
pub mod maintenance;
pub mod metrics;
pub mod nova;
pub mod power;
