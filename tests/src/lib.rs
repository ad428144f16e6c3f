//! hv-tests: end-to-end tests across real peers, and their harness.
//!
//! Tests live in `tests/tests/`. This library holds what they share: the
//! typed endpoints of the test ground ([`env`]), small clients to check
//! the peers directly ([`openstack`], [`ovsdb`]), and the reading of the
//! condition reasons the coordinator writes ([`reasons`]).

#![forbid(unsafe_code)]

pub mod audit;
pub mod bmc;
pub mod env;
pub mod fake_coordinator;
pub mod fault_proxy;
pub mod fencing;
pub mod hosts;
pub mod identity;
pub mod kube_target;
pub mod libvirt_proxy;
pub mod libvirtd;
pub mod manifests;
pub mod openstack;
pub mod ovsdb;
pub mod pki;
pub mod rbac;
pub mod reasons;
pub mod region;
pub mod wait;

use std::path::PathBuf;

/// The repository root (the workspace this crate sits in).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
