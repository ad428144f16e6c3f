//! hv-agent: the per-node agent (DESIGN.md section 1).
//!
//! `hv-agent checks` runs the Testing-phase checks once against the given
//! endpoints and prints a table (or JSON): an SRE's first tool on a
//! suspicious node. `hv-agent run` (the session to the coordinator) is not
//! implemented yet (issue 4) and refuses to start.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hv_agent::ceph::CephClient;
use hv_agent::checks::{self, Endpoints};
use hv_proto::v1::CheckConfig;

/// Per-node hypervisor agent.
#[derive(Parser, Debug)]
#[command(name = "hv-agent", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the validation checks once and print the results; exit 0 only if all passed.
    Checks(Box<ChecksArgs>),
    /// Stream the node to the coordinator (not implemented yet).
    Run,
}

#[derive(clap::Args, Debug)]
struct ChecksArgs {
    /// libvirt URI (qemu+tcp://HOST:16509/system, or ch+tcp://… for Cloud Hypervisor).
    #[arg(long, env = "HV_LIBVIRT_URI", default_value = "qemu+tcp://127.0.0.1:16509/system")]
    libvirt_uri: String,
    /// Lowest acceptable libvirt version.
    #[arg(long, env = "HV_MIN_LIBVIRT_VERSION", default_value = "8.0.0")]
    min_libvirt_version: String,
    /// Skip defining and starting a small test domain.
    #[arg(long)]
    no_test_domain: bool,
    /// OVSDB remote (tcp:HOST:PORT or unix:PATH).
    #[arg(long, env = "HV_OVSDB", default_value = "unix:/run/openvswitch/db.sock")]
    ovsdb: String,
    /// A bridge that must exist (repeatable).
    #[arg(long = "bridge", default_values = ["br-int", "br-ex"])]
    bridges: Vec<String>,
    /// A bridge that is checked when present (repeatable).
    #[arg(long = "optional-bridge", default_values = ["br-provider"])]
    optional_bridges: Vec<String>,
    /// Ceph configuration file.
    #[arg(long, env = "HV_CEPH_CONF", default_value = "/etc/ceph/ceph.conf")]
    ceph_conf: PathBuf,
    /// Ceph client id, without `client.` (the node's restricted client).
    #[arg(long, env = "HV_CEPH_ID")]
    ceph_id: Option<String>,
    /// Keyring of that client (default /etc/ceph/ceph.client.ID.keyring).
    #[arg(long, env = "HV_CEPH_KEYRING")]
    ceph_keyring: Option<PathBuf>,
    /// An RBD pool that must be readable (repeatable).
    #[arg(long = "pool")]
    pools: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Command::Run => {
            eprintln!("hv-agent run: the coordinator session is not implemented yet (issue 4)");
            ExitCode::from(2)
        }
        Command::Checks(a) => {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("hv-agent: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let ceph = a.ceph_id.clone().map(|id| CephClient {
                conf: a.ceph_conf.clone(),
                keyring: Some(a.ceph_keyring.clone().unwrap_or_else(|| checks::default_keyring(&id))),
                id,
                timeout: Duration::from_secs(10),
            });
            let ep = Endpoints { libvirt_uri: a.libvirt_uri.clone(), ovsdb_remote: a.ovsdb.clone(), ceph };
            let cfg = CheckConfig {
                min_libvirt_version: a.min_libvirt_version.clone(),
                bridges: a.bridges.clone(),
                optional_bridges: a.optional_bridges.clone(),
                ceph_pools: a.pools.clone(),
                start_test_domain: !a.no_test_domain,
            };
            let outcomes = rt.block_on(checks::run(&ep, &cfg));
            if a.json {
                match serde_json::to_string_pretty(&outcomes) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("hv-agent: {e}"),
                }
            } else {
                print!("{}", checks::table(&outcomes));
            }
            if outcomes.iter().all(|o| o.passed) { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
    }
}
