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
