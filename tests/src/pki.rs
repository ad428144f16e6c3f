//! Certificates for the gRPC between the coordinator, its agents and SREs,
//! made per test with rcgen: a CA, the coordinator's server certificate
//! (for 127.0.0.1 and localhost), an SRE's client certificate, one per node
//! on demand (URI SAN `spiffe://<trust domain>/node/<name>`), and whatever a
//! test needs to be refused: a certificate past its end, one from another
//! CA.
#![allow(clippy::panic)] // a test without its certificates fails

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hv_tls::TlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The trust domain the tests' coordinators are started with (the default).
pub const TRUST_DOMAIN: &str = "hypervisor.cloud.sap";

/// A CA and the certificates it issued, as PEM files in `dir`.
pub struct Pki {
    pub dir: PathBuf,
    ca_params: CertificateParams,
    ca_key: KeyPair,
    /// The CA certificate's file.
    pub ca: PathBuf,
}

/// Writes `text` to `path` as a new file renamed into place, so a reader
/// (a coordinator re-reading its certificate) never sees half of it.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("writing");
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// What a leaf certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    Server,
    Client,
}

impl Pki {
    /// A new CA named `name` in `dir`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("CA key: {e}"));
        let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("CA: {e}"));
        let ca = dir.join(format!("{name}.ca.pem"));
        write(&ca, &cert.pem());
        Pki { dir: dir.to_path_buf(), ca_params: params, ca_key: key, ca }
    }

    /// The CA's key, written beside its certificate: what a signer of
    /// agents' certificates is given.
    pub fn ca_key_file(&self) -> PathBuf {
        let path = self.dir.join("ca.key");
        write(&path, &self.ca_key.serialize_pem());
        path
    }

    /// Issues `name`'s certificate for `usage` with `sans` (`expired`: its
    /// validity ended in 2021) and writes it with its key. The CA file is
    /// the one of this PKI.
    pub fn issue(&self, name: &str, usage: Usage, sans: Vec<SanType>, expired: bool) -> TlsFiles {
        // 2020-01-01 to 2021-01-01.
        let (start, end) = (1_577_836_800, 1_609_459_200);
        let past =
            expired.then(|| (UNIX_EPOCH + Duration::from_secs(start), UNIX_EPOCH + Duration::from_secs(end)));
        self.issue_valid(name, usage, sans, past)
    }

    /// `node`'s agent certificate, valid from now until `until` (to see
    /// what ends when it expires); written where [`node`](Self::node) writes.
    pub fn node_until(&self, node: &str, until: SystemTime) -> TlsFiles {
        let from = SystemTime::now() - Duration::from_secs(60);
        self.issue_valid(
            &format!("node-{node}"),
            Usage::Client,
            vec![self.node_san(node)],
            Some((from, until)),
        )
    }

    /// As [`issue`](Self::issue), valid over `validity` (default: rcgen's,
    /// 1975 to 4096).
    fn issue_valid(
        &self,
        name: &str,
        usage: Usage,
        sans: Vec<SanType>,
        validity: Option<(SystemTime, SystemTime)>,
    ) -> TlsFiles {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        if let Some((from, until)) = validity {
            params.not_before = from.into();
            params.not_after = until.into();
        }
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("{name} key: {e}"));
        let issuer = Issuer::from_params(&self.ca_params, &self.ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap_or_else(|e| panic!("{name}: {e}"));
        let files = TlsFiles {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}.key")),
            ca: self.ca.clone(),
        };
        // The key first: a reader that sees the new certificate finds its key
        // (one that reads in between finds the new key with the old
        // certificate, does not load them, and keeps what it had).
        write(&files.key, &key.serialize_pem());
        write(&files.cert, &cert.pem());
        files
    }

    /// The coordinator's: a server certificate for 127.0.0.1 and localhost;
    /// its `ca` is the CA of its clients (this one).
    pub fn server(&self) -> TlsFiles {
        let sans = vec![
            SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            SanType::DnsName("localhost".try_into().unwrap_or_else(|e| panic!("{e}"))),
        ];
        self.issue("coordinator", Usage::Server, sans, false)
    }

    /// An SRE's (hvctl, the tests' own gRPC clients): a client certificate
    /// that names no node.
    pub fn sre(&self) -> TlsFiles {
        self.issue("sre", Usage::Client, vec![uri(&format!("spiffe://{TRUST_DOMAIN}/sre/tests"))], false)
    }

    /// The agent of `node`: a client certificate naming it.
    pub fn node(&self, node: &str) -> TlsFiles {
        self.issue(&format!("node-{node}"), Usage::Client, vec![self.node_san(node)], false)
    }

    /// The URI SAN that names `node`.
    pub fn node_san(&self, node: &str) -> SanType {
        uri(&hv_tls::node_uri(TRUST_DOMAIN, node))
    }
}

/// A URI SAN.
pub fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().unwrap_or_else(|e| panic!("{s}: {e}")))
}
