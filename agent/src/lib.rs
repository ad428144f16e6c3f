//! hv-agent: the per-node agent (DESIGN.md section 1).
//!
//! - [`checks`]: the Testing-phase checks and the `hv-agent checks` table.
//! - [`ceph`]: RBD pools readable as the node's restricted client (via `hv-ceph-probe`).
//! - [`libvirt`]: host facts and the domain inventory over TCP.
//! - [`ovsdb`]: Open vSwitch bridges over OVSDB (our own RFC 7047 client).
//! - [`session`]: the stream to the coordinator, with its acknowledged outbox.
//!
//! Not implemented yet (issue 4): host load via sysinfo and kernel via nix, the checks runner, the
//! session to the coordinator, `/healthz` and `/metrics`.

#![deny(unsafe_code)]

pub mod backoff;
pub mod ceph;
pub mod checks;
pub mod health;
pub mod libvirt;
pub mod ovsdb;
pub mod run;
pub mod session;
