//! Writes the gRPC certificates of a local region (`make demo`): a CA, the
//! coordinator's server certificate for 127.0.0.1 and localhost, an SRE's
//! client certificate (hvctl), and one per node naming it. File names are
//! those of `hv_tests::pki`: `<dir>/hv-demo-ca.ca.pem`, `coordinator.pem` and
//! `.key`, `sre.pem` and `.key`, `node-<name>.pem` and `.key`.

use std::path::PathBuf;

use clap::Parser;

/// Test certificates for the coordinator, hvctl and agents (demo only).
#[derive(Parser, Debug)]
#[command(name = "hv-test-pki", version, about)]
struct Args {
    /// Directory to write into.
    dir: PathBuf,
    /// A node to make an agent certificate for (repeatable).
    #[arg(long = "node")]
    nodes: Vec<String>,
}

fn main() {
    let args = Args::parse();
    let pki = hv_tests::pki::Pki::new(&args.dir, "hv-demo-ca");
    pki.server();
    pki.sre();
    for n in &args.nodes {
        pki.node(n);
    }
}
