//! What the preflight's OS validation reads of the hosts (docs/eviction.md):
//! the software and CPU each host's agent reported, from the Hypervisors'
//! status, and the guest CPUs of the source's domains.

use std::collections::BTreeMap;

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::Hypervisor;
use crate::eviction::os_check::HostSoftware;
use crate::eviction::plan::Server;
use crate::eviction::preflight::Candidate;

/// What the hosts' agents reported of their software and CPU, on each
/// candidate and, as the host each VM runs on, on each server; with each
/// server's guest CPU as the source's agent reported its domain.
pub fn with_software(
    hypervisors: &Store<Hypervisor>,
    source: &str,
    servers: &mut [Server],
    candidates: &mut [Candidate],
) {
    let mut software = BTreeMap::new();
    let mut guests = BTreeMap::new();
    for hv in hypervisors.state() {
        let Some(status) = hv.status.as_ref() else { continue };
        let host = crate::lifecycle::nova_host(&hv.name_any(), &hv.spec, status).to_string();
        let Some(machine) = status.machine.as_ref() else { continue };
        if host == source {
            guests = crate::eviction::os_check::guest_cpus(machine);
        }
        if let Some(caps) = machine.capabilities.as_ref() {
            software.insert(host, HostSoftware::from(caps));
        }
    }
    for c in candidates.iter_mut() {
        c.software = software.get(&c.host).cloned();
    }
    for s in servers.iter_mut() {
        s.needs.runs_on = software.get(source).cloned();
        s.needs.guest_cpu = guests.get(&s.id).cloned();
    }
}
