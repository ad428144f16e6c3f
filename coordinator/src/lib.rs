//! hv-coordinator: drives Nova and Placement through the hypervisor lifecycle
//! and owns the `Hypervisor`, `Eviction` and `Migration` resources.
//!
//! - [`api`]: the CRD types (the only source of `deploy/crds/`).
//! - [`lifecycle`]: the pure decision core (no I/O, no clock).

#![forbid(unsafe_code)]

pub mod api;
pub mod lifecycle;
