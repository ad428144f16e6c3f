//! hv-ceph-fence: adds or lifts OSD blocklist entries (a fenced host's Ceph
//! client addresses) and reads the blocklist back. `hv-coordinator` runs it
//! as a child process; its JSON on stdout is the contract with
//! `hv_coordinator::fence::ceph`: `{"listed": [...]}` (which of the entries
//! asked are in the blocklist now), or `{"error": "..."}` with exit code 1.

use std::time::Duration;

use clap::{Parser, ValueEnum};
use hv_ceph_probe::ClientArgs;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Op {
    /// Blocklist each entry.
    Add,
    /// Lift each entry (lifting one that is not listed succeeds).
    Rm,
}

/// Add or lift OSD blocklist entries, then read them back (run by hv-coordinator).
/// Its client needs `mon 'allow r, allow command "osd blocklist"'`.
#[derive(Parser, Debug)]
#[command(name = "hv-ceph-fence", version, about)]
struct Args {
    #[command(flatten)]
    client: ClientArgs,
    /// How long an added entry lasts (Ceph drops it then); the default is ten years, since a
    /// fenced host's entry is lifted by the coordinator once an SRE has restored the host.
    #[arg(long, default_value_t = 315_360_000)]
    expire_secs: u64,
    op: Op,
    /// Entries: `IP:port/nonce` (one client instance) or `IP:0/0` (every client of that IP).
    #[arg(required = true)]
    entries: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    let client = a.client.client();
    let add = matches!(a.op, Op::Add);
    match client.blocklist(add, &a.entries, Duration::from_secs(a.expire_secs)) {
        Ok(listed) => {
            println!("{}", serde_json::json!({ "listed": listed }));
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{}", serde_json::json!({ "error": e }));
            std::process::ExitCode::FAILURE
        }
    }
}
