//! hv-ceph-probe: checks RBD pools as the node's Ceph client and prints the
//! results as JSON on stdout. `hv-agent` runs it as a child process, so the
//! agent itself never loads librados/librbd (about 11 MiB of resident
//! libraries and their threads) and a hung librados call cannot hang it.
//! The JSON is the contract with `hv_agent::ceph::PoolCheck`.

#![deny(unsafe_code)]

use hv_ceph_probe::ClientArgs;

use clap::Parser;

/// Check RBD pools as a Ceph client; prints JSON (run by hv-agent).
#[derive(Parser, Debug)]
#[command(name = "hv-ceph-probe", version, about)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// A pool to check (repeatable).
    #[arg(long = "pool")]
    pools: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    let client = a.client.client();
    match serde_json::to_string(&client.check_pools(&a.pools)) {
        Ok(s) => {
            println!("{s}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hv-ceph-probe: {e}");
            std::process::ExitCode::from(2)
        }
    }
}
