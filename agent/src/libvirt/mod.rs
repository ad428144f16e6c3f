//! libvirt on the node (`qemu+tls://<host>/system`, `qemu+tcp://…`, or
//! `ch+…` for Cloud Hypervisor): host facts and the domain inventory.
//!
//! Authentication (docs/checks.md, "libvirt authentication"): TLS with a
//! client certificate (libvirt reads `cacert.pem`, `clientcert.pem` and
//! `clientkey.pem` from the URI's `pkipath`), and SASL credentials given to
//! libvirt through the auth callback of `virConnectOpenAuth`.
//!
//! The `virt` bindings are blocking; async callers run these calls in a
//! [`blocking::Lane`] under the target's deadline.

pub mod blocking;
pub mod events;
pub mod watch;
pub mod xml;

use std::cell::RefCell;

use hv_proto::v1::{Domain, DomainState, HostFacts};
use virt::connect::{Connect, ConnectAuth, ConnectCredential, ConnectCredentialType};
use virt::domain::DomainState as VState;
use virt::error::ErrorNumber;

#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    #[error("connecting to libvirt at {uri}: {message}")]
    Connect { uri: String, message: String },
    /// libvirt refused our credentials (SASL), or asked for some we do not have.
    #[error("libvirt at {uri} refused the agent's credentials ({who}): {message}")]
    Auth { uri: String, who: String, message: String },
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

/// Where libvirt is, how the agent logs in, and how long it waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibvirtTarget {
    /// The connection URI, with `pkipath=DIR` for a TLS client certificate.
    pub uri: String,
    /// SASL credentials, for a libvirtd with `auth_tls` or `auth_tcp` = "sasl".
    pub sasl: Option<SaslCredentials>,
    /// Longest a connection or a snapshot may take; the checks (which may
    /// start a test domain under emulation) get [`CHECKS_FACTOR`] times it.
    pub deadline: std::time::Duration,
}

/// The libvirt checks' deadline, in multiples of [`LibvirtTarget::deadline`].
pub const CHECKS_FACTOR: u32 = 4;

impl Default for LibvirtTarget {
    fn default() -> Self {
        LibvirtTarget { uri: String::new(), sasl: None, deadline: std::time::Duration::from_secs(30) }
    }
}

#[derive(Clone, PartialEq, Eq)]
pub struct SaslCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for SaslCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SaslCredentials {{ username: {:?}, password: <redacted> }}", self.username)
    }
}

impl LibvirtTarget {
    /// No credentials: TCP without auth, or TLS with the default PKI paths.
    pub fn plain(uri: &str) -> LibvirtTarget {
        LibvirtTarget { uri: uri.to_string(), ..LibvirtTarget::default() }
    }

    /// `uri` with `pkipath=dir` added (libvirt's directory of `cacert.pem`,
    /// `clientcert.pem` and `clientkey.pem`), unless it names one already.
    pub fn with_pki_dir(uri: &str, dir: &std::path::Path) -> String {
        if uri.contains("pkipath=") {
            return uri.to_string();
        }
        let sep = if uri.contains('?') { '&' } else { '?' };
        format!("{uri}{sep}pkipath={}", dir.display())
    }
}

thread_local! {
    /// The credentials for the `virConnectOpenAuth` call running on this
    /// thread: libvirt calls the callback synchronously, on the caller's
    /// thread, and the `virt` crate's callback is a plain function.
    static SASL: RefCell<Option<SaslCredentials>> = const { RefCell::new(None) };
}

/// Answers libvirt's credential prompts from [`SASL`]; a prompt we cannot
/// answer stays empty, and libvirt then fails the login.
#[allow(clippy::ptr_arg)] // the signature is the `virt` crate's callback type
fn answer(creds: &mut Vec<ConnectCredential>) {
    SASL.with(|s| {
        let Some(c) = s.borrow().clone() else { return };
        for cred in creds.iter_mut() {
            cred.result = match cred.typed {
                ConnectCredentialType::AuthName | ConnectCredentialType::UserName => Some(c.username.clone()),
                ConnectCredentialType::Passphrase | ConnectCredentialType::NoEchoPrompt => {
                    Some(c.password.clone())
                }
                _ => None,
            };
        }
    });
}

pub struct Libvirt {
    pub uri: String,
    pub(crate) conn: Connect,
}

impl Libvirt {
    pub fn open(uri: &str) -> Result<Libvirt, LibvirtError> {
        Self::connect(&LibvirtTarget::plain(uri))
    }

    /// Opens `target`, logging in with its credentials where libvirt asks.
    pub fn connect(target: &LibvirtTarget) -> Result<Libvirt, LibvirtError> {
        let uri = target.uri.clone();
        SASL.with(|s| *s.borrow_mut() = target.sasl.clone());
        let mut auth = ConnectAuth::new(
            vec![
                ConnectCredentialType::AuthName,
                ConnectCredentialType::UserName,
                ConnectCredentialType::Passphrase,
                ConnectCredentialType::NoEchoPrompt,
            ],
            answer,
        );
        let opened = Connect::open_auth(Some(&uri), &mut auth, 0);
        SASL.with(|s| *s.borrow_mut() = None);
        let conn = opened.map_err(|e| {
            let auth_failed = matches!(
                e.code(),
                virt::enumutil::Enum::Known(ErrorNumber::AuthFailed | ErrorNumber::AuthCancelled)
            );
            if auth_failed {
                let who = match &target.sasl {
                    Some(c) => format!("SASL user {}", c.username),
                    None => "no SASL credentials configured".to_string(),
                };
                LibvirtError::Auth { uri: uri.clone(), who, message: e.to_string() }
            } else {
                LibvirtError::Connect { uri: uri.clone(), message: e.to_string() }
            }
        })?;
        Ok(Libvirt { uri, conn })
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
        let hardware = domcaps.as_deref().map(xml::domain_offers).unwrap_or_default();
        Ok(HostFacts {
            hostname: Self::call("getHostname", self.conn.hostname())?,
            kernel: String::new(),
            libvirt_version: self.lib_version()?,
            hypervisor_type: Self::call("getType", self.conn.driver_type())?,
            hypervisor_version: version_string(Self::call("getVersion", self.conn.hyp_version())?),
            cpu_model: if caps.cpu_model.is_empty() { node.model.clone() } else { caps.cpu_model },
            arch: if caps.arch.is_empty() { node.model } else { caps.arch },
            cpu_features: caps.cpu_features,
            guest_arches: caps.guest_arches,
            numa_cells: caps.numa_cells,
            memory_bytes: node.memory.saturating_mul(1024),
            cpus: node.cpus,
            // The host's own /sys adds its NICs and hugepages.
            hardware: Some(hardware),
            // Not libvirt's to say: the host's /sys and the Ceph probe.
            system_uuid: String::new(),
            ceph_client_ips: Vec::new(),
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
                memory_bytes: info.max_mem.saturating_mul(1024),
                disks,
                pci_host_devices,
                paused_on_io_error: paused_on_io_error(&d),
                cpu: xml::guest_cpu(&xml),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

/// Whether QEMU paused `d` on an I/O error (its state's reason; an error
/// reading it is "no").
fn paused_on_io_error(d: &virt::domain::Domain) -> bool {
    use virt::domain::{DomainPausedReason, DomainStateReason};
    use virt::enumutil::Enum;
    matches!(
        d.state(),
        Ok((_, Enum::Known(DomainStateReason::Paused(Enum::Known(DomainPausedReason::IOError)))))
    )
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
