//! hv-agent: the per-node agent (DESIGN.md section 1).
//!
//! NOT IMPLEMENTED YET (issue 4): libvirt over TCP, OVSDB, Ceph RBD, the
//! validation checks and the session to the coordinator. This binary exists
//! so the workspace layout is complete; it refuses to run rather than
//! pretend to be an agent.

use std::process::ExitCode;

use clap::Parser;

/// Per-node hypervisor agent (not implemented yet; see issue 4).
#[derive(Parser, Debug)]
#[command(name = "hv-agent", version, about)]
struct Args {}

fn main() -> ExitCode {
    let _args = Args::parse();
    eprintln!(
        "hv-agent {}: not implemented yet (issue 4: libvirt, OVSDB, Ceph RBD, checks, coordinator session)",
        env!("CARGO_PKG_VERSION")
    );
    ExitCode::from(2)
}
