//! hv-agent: the per-node agent. It watches the node's libvirt, OVSDB and
//! Ceph, runs the Testing-phase checks on request, and streams everything
//! to the coordinator; it never writes to Kubernetes.
//!
//! - [`run`]: `hv-agent run`, the watchers, the session and the health listener wired together.
//! - [`session`]: the stream to the coordinator, with its acknowledged outbox (docs/protocol.md).
//! - [`checks`]: the Testing-phase checks and the `hv-agent checks` table (docs/checks.md).
//! - [`hardware`]: SR-IOV NICs and hugepages from the host's /sys, for the facts.
//! - [`libvirt`]: host facts, the domain inventory and lifecycle events; TLS and SASL logins.
//! - [`ovsdb`]: Open vSwitch bridges and their expected settings (our own RFC 7047 client).
//! - [`ceph`]: RBD pools readable as the node's restricted client (via `hv-ceph-probe`).
//! - [`health`]: `/healthz` and `/metrics`.
//! - [`signals`]: health signals of the host, its domains and its peers (docs/health.md).
//! - [`backoff`]: jittered exponential backoff and timestamps.

#![deny(unsafe_code)]

pub mod backoff;
pub mod ceph;
pub mod checks;
pub mod hardware;
pub mod health;
pub mod identity;
pub mod libvirt;
pub mod ovsdb;
pub mod run;
pub mod session;
pub mod signals;
