//! hv-agent: the per-node agent (DESIGN.md section 1).
//!
//! - [`libvirt`]: host facts and the domain inventory over TCP.
//! - [`ovsdb`]: Open vSwitch bridges over OVSDB (our own RFC 7047 client).
//!
//! Not implemented yet (issue 4): libvirt events and reconnect, Ceph RBD, the checks runner, the
//! session to the coordinator, `/healthz` and `/metrics`.

#![deny(unsafe_code)]

pub mod libvirt;
pub mod ovsdb;
