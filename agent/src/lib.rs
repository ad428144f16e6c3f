//! hv-agent: the per-node agent (DESIGN.md section 1).
//!
//! - [`ovsdb`]: Open vSwitch bridges over OVSDB (our own RFC 7047 client).
//!
//! Not implemented yet (issue 4): libvirt, Ceph RBD, the checks runner, the
//! session to the coordinator, `/healthz` and `/metrics`.

#![forbid(unsafe_code)]

pub mod ovsdb;
