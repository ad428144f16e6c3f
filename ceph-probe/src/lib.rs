//! The node's and the coordinator's Ceph helpers, as child processes: the
//! long-lived agent and coordinator never load librados/librbd (about 11 MiB
//! resident, and their threads), and a librados call that hangs cannot hang
//! them. `hv-ceph-probe` checks RBD pools as the node's client (run by
//! hv-agent); `hv-ceph-fence` adds and lifts OSD blocklist entries and reads
//! them back (run by hv-coordinator to fence a host). Each prints JSON on
//! stdout, its contract with the process that runs it.

#![deny(unsafe_code)]

pub mod blocklist;
pub mod ffi;

use std::path::PathBuf;
use std::time::Duration;

/// Who the helper is to Ceph: the flags both helpers take.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// Ceph configuration file.
    #[arg(long)]
    pub conf: PathBuf,
    /// Client id, without `client.`.
    #[arg(long)]
    pub id: String,
    /// The client's keyring (the conf's default search path otherwise).
    #[arg(long)]
    pub keyring: Option<PathBuf>,
    /// Mount, monitor and OSD operation timeout.
    #[arg(long, default_value_t = 10)]
    pub timeout_secs: u64,
}

impl ClientArgs {
    pub fn client(self) -> ffi::CephClient {
        ffi::CephClient {
            conf: self.conf,
            id: self.id,
            keyring: self.keyring,
            timeout: Duration::from_secs(self.timeout_secs),
        }
    }
}
