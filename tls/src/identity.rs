//! Who a certificate speaks for.
//!
//! An agent's certificate carries the URI SAN
//! `spiffe://<trust-domain>/node/<node name>`: the SPIFFE form, so a site
//! that issues SPIFFE identities (SPIRE, cert-manager's csi-driver-spiffe)
//! needs nothing of its own, and a URI cannot be mistaken for a host name
//! the way a DNS SAN can. A certificate with no such URI, or with more than
//! one, speaks for no node.

use rustls_pki_types::CertificateDer;

/// The URI SAN of `node`'s certificate in `trust_domain`.
pub fn node_uri(trust_domain: &str, node: &str) -> String {
    format!("spiffe://{trust_domain}/node/{node}")
}

/// Every URI SAN of `cert` (for logs: what a refused client showed).
pub fn uris_of(cert: &CertificateDer<'_>) -> Vec<String> {
    match webpki::EndEntityCert::try_from(cert) {
        Ok(c) => c.valid_uri_names().map(str::to_string).collect(),
        Err(_) => Vec::new(),
    }
}

/// The node `cert` speaks for in `trust_domain`, if exactly one.
pub fn node_of(cert: &CertificateDer<'_>, trust_domain: &str) -> Option<String> {
    one_of(cert, trust_domain, "node")
}

/// The SRE `cert` speaks for in `trust_domain`
/// (`spiffe://<trust-domain>/sre/<name>`), if exactly one and no node: an
/// SRE reads the whole fleet, a node only itself.
pub fn sre_of(cert: &CertificateDer<'_>, trust_domain: &str) -> Option<String> {
    let node = format!("spiffe://{trust_domain}/node/");
    match uris_of(cert).iter().any(|u| u.starts_with(&node)) {
        true => None,
        false => one_of(cert, trust_domain, "sre"),
    }
}

/// The one name under `spiffe://<trust_domain>/<kind>/` that `cert` carries.
fn one_of(cert: &CertificateDer<'_>, trust_domain: &str, kind: &str) -> Option<String> {
    let prefix = format!("spiffe://{trust_domain}/{kind}/");
    let mut names = uris_of(cert).into_iter().filter_map(|u| u.strip_prefix(&prefix).map(str::to_string));
    let name = names.next().filter(|n| !n.is_empty() && !n.contains('/'))?;
    match names.next() {
        Some(_) => None,
        None => Some(name),
    }
}

/// When `cert` stops being valid (its notAfter); None when it cannot be
/// read. webpki checks validity at the handshake only; a session that
/// outlives its certificate is ended at this time by its server.
pub fn not_after(cert: &CertificateDer<'_>) -> Option<std::time::SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let secs = u64::try_from(parsed.validity().not_after.timestamp()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// Whether `leaf` names `issuer` as its issuer and carries a signature
/// `issuer`'s key made: a node's certificate from the agents' signer, not
/// from another CA the server also trusts.
pub fn issued_by(leaf: &CertificateDer<'_>, issuer: &CertificateDer<'_>) -> bool {
    let (Ok((_, l)), Ok((_, i))) = (
        x509_parser::parse_x509_certificate(leaf.as_ref()),
        x509_parser::parse_x509_certificate(issuer.as_ref()),
    ) else {
        return false;
    };
    l.issuer() == i.subject() && l.verify_signature(Some(i.public_key())).is_ok()
}

/// When `cert` starts and stops being valid (notBefore, notAfter).
pub fn validity(cert: &CertificateDer<'_>) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let at = |t: i64| Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::try_from(t).ok()?));
    Some((at(parsed.validity().not_before.timestamp())?, at(parsed.validity().not_after.timestamp())?))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rcgen::{CertificateParams, KeyPair, SanType};

    fn cert_with(sans: Vec<SanType>) -> CertificateDer<'static> {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = sans;
        p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()
    }

    fn uri(s: &str) -> SanType {
        SanType::URI(s.try_into().unwrap())
    }

    #[test]
    fn an_sre_is_one_sre_uri_of_the_trust_domain_and_no_node() {
        let td = "hypervisor.cloud.sap";
        let sre = cert_with(vec![uri("spiffe://hypervisor.cloud.sap/sre/alice")]);
        assert_eq!(sre_of(&sre, td).as_deref(), Some("alice"));
        let elsewhere = cert_with(vec![uri("spiffe://elsewhere.example/sre/alice")]);
        assert_eq!(sre_of(&elsewhere, td), None);
        let node = cert_with(vec![uri("spiffe://hypervisor.cloud.sap/node/compute-1")]);
        assert_eq!(sre_of(&node, td), None);
        let both = cert_with(vec![
            uri("spiffe://hypervisor.cloud.sap/node/compute-1"),
            uri("spiffe://hypervisor.cloud.sap/sre/alice"),
        ]);
        assert_eq!(sre_of(&both, td), None, "a node's certificate is a node's, whatever else it says");
        let two_nodes = cert_with(vec![
            uri("spiffe://hypervisor.cloud.sap/node/a"),
            uri("spiffe://hypervisor.cloud.sap/node/b"),
            uri("spiffe://hypervisor.cloud.sap/sre/alice"),
        ]);
        assert_eq!(sre_of(&two_nodes, td), None, "any node URI: no SRE");
    }

    #[test]
    fn the_node_is_the_one_spiffe_uri_of_the_trust_domain() {
        let td = "hypervisor.cloud.sap";
        let cases: Vec<(Vec<SanType>, Option<&str>)> = vec![
            (vec![uri("spiffe://hypervisor.cloud.sap/node/compute-1")], Some("compute-1")),
            (
                vec![
                    SanType::DnsName("compute-2".try_into().unwrap()),
                    uri("spiffe://hypervisor.cloud.sap/node/compute-2"),
                ],
                Some("compute-2"),
            ),
            // Another trust domain, another path, a DNS name alone: no node.
            (vec![uri("spiffe://elsewhere.example/node/compute-1")], None),
            (vec![uri("spiffe://hypervisor.cloud.sap/sre/alice")], None),
            (vec![SanType::DnsName("compute-1".try_into().unwrap())], None),
            (vec![uri("spiffe://hypervisor.cloud.sap/node/")], None),
            (vec![uri("spiffe://hypervisor.cloud.sap/node/a/b")], None),
            // Two nodes in one certificate: it speaks for neither.
            (
                vec![
                    uri("spiffe://hypervisor.cloud.sap/node/a"),
                    uri("spiffe://hypervisor.cloud.sap/node/b"),
                ],
                None,
            ),
            (vec![], None),
        ];
        for (sans, want) in cases {
            let shown = format!("{sans:?}");
            assert_eq!(node_of(&cert_with(sans), td).as_deref(), want, "{shown}");
        }
        assert_eq!(node_uri(td, "compute-1"), "spiffe://hypervisor.cloud.sap/node/compute-1");
    }

    #[test]
    fn a_certificate_is_issued_by_the_ca_whose_key_signed_it_alone() {
        let ca = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let cert = p.self_signed(&key).unwrap();
            (p, key, cert)
        };
        let (signer_p, signer_k, signer) = ca("signer");
        // Another CA of the same name: the name alone is not enough.
        let (_, _, twin) = ca("signer");
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .signed_by(&leaf_key, &rcgen::Issuer::from_params(&signer_p, &signer_k))
            .unwrap();
        assert!(issued_by(leaf.der(), signer.der()));
        assert!(!issued_by(leaf.der(), twin.der()));
        assert!(!issued_by(signer.der(), twin.der()));
        assert!(!issued_by(&CertificateDer::from(vec![0x30, 0x00]), signer.der()));
    }

    #[test]
    fn garbage_is_no_certificate_and_no_node() {
        let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x00]);
        assert!(uris_of(&junk).is_empty());
        assert_eq!(node_of(&junk, "hypervisor.cloud.sap"), None);
        assert_eq!(not_after(&junk), None);
    }

    #[test]
    fn the_end_of_validity_is_read_to_the_second() {
        let end = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_900_000_000);
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.not_after = end.into();
        let cert = p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone();
        assert_eq!(not_after(&cert), Some(end));
    }
}
