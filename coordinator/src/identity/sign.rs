//! Signing an agent's certificate (pure: no I/O, the clock passed in).
//!
//! The certificate says only what the coordinator decided: the node's
//! SPIFFE URI and nothing else, a client certificate (not a CA), valid for
//! the configured life and never past its signer's end. Of the request
//! only the public key is taken, once its signature shows the caller holds
//! the private key.

use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, PrivateKeyDer};

/// How far back a certificate's start is put, for clocks that differ.
pub const BACKDATE: Duration = Duration::from_secs(300);

/// The CA that signs agents' certificates: its chain (PEM, its own
/// certificate first) and its key.
pub struct Signer {
    chain_pem: String,
    issuer: Issuer<'static, KeyPair>,
    not_after: SystemTime,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("not_after", &self.not_after).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SignError {
    #[error("the signer's certificate: {0}")]
    Certificate(String),
    #[error("the signer's key: {0}")]
    Key(String),
    #[error("the certificate request: {0}")]
    Request(String),
    #[error("signing: {0}")]
    Signing(String),
    #[error("the signer's certificate ended at {0:?}")]
    SignerEnded(SystemTime),
}

impl Signer {
    /// The signer of `cert_pem` (its certificate first, then any chain up
    /// to the root) and `key_pem`.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Signer, SignError> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| SignError::Certificate(e.to_string()))?;
        let first = certs.first().ok_or_else(|| SignError::Certificate("no certificate in it".into()))?;
        let not_after = hv_tls::not_after(first)
            .ok_or_else(|| SignError::Certificate("its end cannot be read".into()))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| SignError::Key(e.to_string()))?;
        let key = KeyPair::try_from(&key).map_err(|e| SignError::Key(e.to_string()))?;
        let issuer =
            Issuer::from_ca_cert_der(first, key).map_err(|e| SignError::Certificate(e.to_string()))?;
        let chain_pem = certs.iter().map(pem_of).collect();
        Ok(Signer { chain_pem, issuer, not_after })
    }

    /// When the signer's own certificate ends.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// A certificate for `uri` (the node's SPIFFE URI, `node` its common
    /// name) with the public key of `csr_der`, valid from `now` less
    /// [`BACKDATE`] for `life` (cut at the signer's end); the chain PEM and
    /// the validity.
    pub fn sign(
        &self,
        csr_der: &[u8],
        node: &str,
        uri: &str,
        now: SystemTime,
        life: Duration,
        serial: [u8; 16],
    ) -> Result<Issued, SignError> {
        if now >= self.not_after {
            return Err(SignError::SignerEnded(self.not_after));
        }
        let csr = CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(csr_der))
            .map_err(|e| SignError::Request(e.to_string()))?;
        let not_before = now.checked_sub(BACKDATE).unwrap_or(now);
        let not_after = (now + life).min(self.not_after);
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, node);
        let uri = uri.to_string().try_into().map_err(|e: rcgen::Error| SignError::Signing(e.to_string()))?;
        p.subject_alt_names = vec![SanType::URI(uri)];
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(SerialNumber::from_slice(&positive(serial)));
        p.not_before = not_before.into();
        p.not_after = not_after.into();
        let cert =
            p.signed_by(&csr.public_key, &self.issuer).map_err(|e| SignError::Signing(e.to_string()))?;
        Ok(Issued { chain_pem: format!("{}{}", pem_of(cert.der()), self.chain_pem), not_before, not_after })
    }
}

/// A signed certificate: its chain (PEM) and its validity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub chain_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

/// A serial number is a positive integer: the high bit cleared.
fn positive(mut serial: [u8; 16]) -> [u8; 16] {
    serial[0] &= 0x7f;
    serial
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    let lf = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::encode_config(&pem::Pem::new("CERTIFICATE", der.to_vec()), lf)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ca(not_after: SystemTime) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        p.distinguished_name.push(DnType::CommonName, "agents");
        p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        p.not_after = not_after.into();
        let cert = p.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn csr() -> (Vec<u8>, KeyPair) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::default();
        // What the request asks for is ignored.
        p.subject_alt_names =
            vec![SanType::URI("spiffe://hypervisor.cloud.sap/node/elsewhere".try_into().unwrap())];
        p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let req = p.serialize_request(&key).unwrap();
        (req.der().to_vec(), key)
    }

    #[test]
    fn the_certificate_names_the_node_alone_as_a_client_for_its_life() {
        let now = SystemTime::now();
        let (cert, key) = ca(now + Duration::from_secs(86_400 * 365));
        let signer = Signer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let (der, _) = csr();
        let uri = "spiffe://hypervisor.cloud.sap/node/compute-1";
        let issued =
            signer.sign(&der, "compute-1", uri, now, Duration::from_secs(86_400), [0xff; 16]).unwrap();
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(issued.chain_pem.as_bytes()).collect::<Result<_, _>>().unwrap();
        assert_eq!(chain.len(), 2, "the leaf, then its signer");
        assert_eq!(hv_tls::node_of(&chain[0], "hypervisor.cloud.sap").as_deref(), Some("compute-1"));
        assert_eq!(
            hv_tls::identity::uris_of(&chain[0]),
            vec![uri.to_string()],
            "the request's URI is not taken"
        );
        let (_, parsed) = x509_parser::parse_x509_certificate(chain[0].as_ref()).unwrap();
        assert!(!parsed.is_ca());
        let eku = parsed.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs(issued.not_after), secs(now + Duration::from_secs(86_400)));
        assert_eq!(secs(issued.not_before), secs(now - BACKDATE));
        assert_eq!(hv_tls::not_after(&chain[0]).map(secs), Some(secs(issued.not_after)));
    }

    #[test]
    fn no_certificate_outlives_its_signer_and_an_ended_signer_signs_nothing() {
        let now = SystemTime::now();
        let end = now + Duration::from_secs(3_600);
        let (cert, key) = ca(end);
        let signer = Signer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let (der, _) = csr();
        let uri = "spiffe://td/node/a";
        let issued = signer.sign(&der, "a", uri, now, Duration::from_secs(86_400), [1; 16]).unwrap();
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs(issued.not_after), secs(end));
        let later = end + Duration::from_secs(1);
        assert!(matches!(
            signer.sign(&der, "a", uri, later, Duration::from_secs(60), [1; 16]),
            Err(SignError::SignerEnded(_))
        ));
    }

    #[test]
    fn a_request_whose_signature_does_not_hold_or_that_is_no_request_is_refused() {
        let now = SystemTime::now();
        let (cert, key) = ca(now + Duration::from_secs(3_600));
        let signer = Signer::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
        let (mut der, _) = csr();
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let life = Duration::from_secs(60);
        assert!(matches!(
            signer.sign(&der, "a", "spiffe://td/node/a", now, life, [1; 16]),
            Err(SignError::Request(_))
        ));
        assert!(matches!(
            signer.sign(b"junk", "a", "spiffe://td/node/a", now, life, [1; 16]),
            Err(SignError::Request(_))
        ));
    }

    #[test]
    fn a_signer_without_its_key_or_certificate_is_an_error() {
        let (cert, key) = ca(SystemTime::now() + Duration::from_secs(3_600));
        assert!(matches!(Signer::from_pem(b"", key.as_bytes()), Err(SignError::Certificate(_))));
        assert!(matches!(Signer::from_pem(cert.as_bytes(), b"not a key"), Err(SignError::Key(_))));
    }
}
