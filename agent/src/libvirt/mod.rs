//! libvirt on the node, over TCP (`qemu+tcp://<host>:16509/system`, or
//! `ch+tcp://…` for Cloud Hypervisor): host facts and the domain inventory.
//!
//! The `virt` bindings are blocking; async callers wrap these calls in
//! `spawn_blocking`.

pub mod events;
pub mod watch;
pub mod xml;

use hv_proto::v1::{Domain, DomainState, HostFacts};
use virt::connect::Connect;
use virt::domain::DomainState as VState;

#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("connecting to libvirt at {uri}: {message}")]
    Connect { uri: String, message: String },
    #[error("libvirt {call}: {message}")]
    Call { call: &'static str, message: String },
    #[error(transparent)]
    Xml(#[from] xml::XmlError),
}

/// "major.minor.micro" from libvirt's packed version number.
pub fn version_string(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

/// Parse "major.minor.micro" (missing parts are 0) for comparison.
pub fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s.trim().split('.').map(|p| p.parse::<u32>());
    let major = it.next()?.ok()?;
    let minor = it.next().unwrap_or(Ok(0)).ok()?;
    let micro = it.next().unwrap_or(Ok(0)).ok()?;
    Some((major, minor, micro))
}

pub struct Libvirt {
    pub uri: String,
    pub(crate) conn: Connect,
}

impl Libvirt {
    pub fn open(uri: &str) -> Result<Libvirt, LibvirtError> {
        let conn = Connect::open(Some(uri))
            .map_err(|e| LibvirtError::Connect { uri: uri.to_string(), message: e.to_string() })?;
        Ok(Libvirt { uri: uri.to_string(), conn })
    }

    fn call<T>(call: &'static str, r: Result<T, virt::error::Error>) -> Result<T, LibvirtError> {
        r.map_err(|e| LibvirtError::Call { call, message: e.to_string() })
    }

    pub fn connection(&self) -> &Connect {
        &self.conn
    }

    pub fn conn_type(&self) -> Result<String, LibvirtError> {
        Self::call("getType", self.conn.driver_type())
    }

    pub fn lib_version(&self) -> Result<String, LibvirtError> {
        Ok(version_string(Self::call("getLibVersion", self.conn.lib_version())?))
    }

    pub fn facts(&self) -> Result<HostFacts, LibvirtError> {
        let caps = xml::capabilities(&Self::call("getCapabilities", self.conn.capabilities())?)?;
        let node = Self::call("nodeGetInfo", self.conn.node_info())?;
        // Domain capabilities are optional (the test driver has none).
        let domcaps = self.conn.domain_capabilities(None, None, None, None, 0).ok();
        let traits = xml::trait_candidates(&caps.arch, &caps.cpu_features, domcaps.as_deref());
        Ok(HostFacts {
            hostname: Self::call("getHostname", self.conn.hostname())?,
            kernel: String::new(),
            libvirt_version: self.lib_version()?,
            hypervisor_type: Self::call("getType", self.conn.driver_type())?,
            hypervisor_version: version_string(Self::call("getVersion", self.conn.hyp_version())?),
            cpu_model: if caps.cpu_model.is_empty() { node.model.clone() } else { caps.cpu_model },
            arch: if caps.arch.is_empty() { node.model } else { caps.arch },
            cpu_features: caps.cpu_features,
            numa_cells: caps.numa_cells,
            memory_bytes: node.memory * 1024,
            cpus: node.cpus,
            trait_candidates: traits,
        })
    }

    /// Every domain, running or not, with what decides its migratability.
    pub fn inventory(&self) -> Result<Vec<Domain>, LibvirtError> {
        let mut out = Vec::new();
        for d in Self::call("listAllDomains", self.conn.list_all_domains(0))? {
            // A domain can vanish between the list and the lookups: skip it;
            // the next snapshot is the truth.
            let (Ok(uuid), Ok(name), Ok(info), Ok(xml)) =
                (d.uuid_string(), d.name(), d.info(), d.xml_desc(0))
            else {
                continue;
            };
            let (disks, pci_host_devices) = xml::domain_devices(&xml)?;
            out.push(Domain {
                uuid,
                name,
                state: state(info.state) as i32,
                vcpus: info.nr_virt_cpu,
                memory_bytes: info.max_mem * 1024,
                disks,
                pci_host_devices,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

fn state(s: virt::domain::DomainStateEnum) -> DomainState {
    match s {
        virt::enumutil::Enum::Known(VState::Running) => DomainState::Running,
        virt::enumutil::Enum::Known(VState::Blocked) => DomainState::Blocked,
        virt::enumutil::Enum::Known(VState::Paused) => DomainState::Paused,
        virt::enumutil::Enum::Known(VState::Shutdown) => DomainState::Shutdown,
        virt::enumutil::Enum::Known(VState::Shutoff) => DomainState::Shutoff,
        virt::enumutil::Enum::Known(VState::Crashed) => DomainState::Crashed,
        virt::enumutil::Enum::Known(VState::PMSuspended) => DomainState::Pmsuspended,
        _ => DomainState::Unspecified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(version_string(9_000_000), "9.0.0");
        assert_eq!(version_string(10_002_003), "10.2.3");
        assert_eq!(parse_version("8.0"), Some((8, 0, 0)));
        assert!(parse_version("9.0.0") > parse_version("8.10.2"));
        assert_eq!(parse_version("x"), None);
    }
}
