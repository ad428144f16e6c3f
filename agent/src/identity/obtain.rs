//! One request for a certificate: a new key, a request signed by it, and
//! `IdentityService.Issue` on the port that fits (mutual TLS with the
//! certificate held, else the bootstrap port).

use std::time::{Duration, SystemTime};

use hv_proto::v1::IssueRequest;
use hv_proto::v1::identity_service_client::IdentityServiceClient;
use rcgen::{CertificateParams, KeyPair};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use super::{IdentityConfig, Issued};

#[derive(Debug, thiserror::Error)]
pub enum ObtainError {
    #[error("the token file {0}: {1}")]
    Token(String, std::io::Error),
    #[error("a new key or request: {0}")]
    Key(String),
    #[error("TLS: {0}")]
    Tls(#[from] hv_tls::TlsError),
    #[error("connecting to {0}: {1}")]
    Connect(String, String),
    #[error("the coordinator refused: {0}")]
    Refused(tonic::Status),
    #[error("the coordinator's answer: {0}")]
    Answer(String),
}

/// A new key and the request it signs (DER). Kept until a certificate
/// comes for it: asked again after an answer was lost, the same request
/// with the same token gets its certificate, where another would be a
/// replay.
pub struct Pending {
    key: KeyPair,
    csr_der: Vec<u8>,
}

impl Pending {
    pub fn new() -> Result<Pending, ObtainError> {
        let key = KeyPair::generate().map_err(|e| ObtainError::Key(e.to_string()))?;
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .map_err(|e| ObtainError::Key(e.to_string()))?;
        Ok(Pending { csr_der: csr.der().to_vec(), key })
    }
}

/// A certificate for the node and the key of `pending`, renewing `held` if
/// given. A renewal that fails in any way (the coordinator's CA rotated,
/// the held certificate no longer taken) asks the bootstrap port at once:
/// a renewal refused before the token was looked at leaves it unspent, and
/// one refused after is refused there too.
pub async fn obtain(
    cfg: &IdentityConfig,
    held: Option<&Issued>,
    pending: &Pending,
) -> Result<Issued, ObtainError> {
    let token = std::fs::read_to_string(&cfg.token_file)
        .map_err(|e| ObtainError::Token(cfg.token_file.display().to_string(), e))?;
    let (key, csr_der) = (&pending.key, pending.csr_der.clone());
    let ask = IssueRequest { node: cfg.node.clone(), token: token.trim().to_string(), csr_der };
    let renewed = match held {
        Some(h) => {
            let tls = hv_tls::client::config_in_memory(&cfg.ca, &h.chain_pem, &h.key_pem)?;
            let renewed = issue(&cfg.coordinator, tls, ask.clone()).await;
            if let Err(e) = &renewed {
                tracing::warn!(node = %cfg.node, error = %e, "renewal failed; asking the bootstrap port");
            }
            renewed.ok()
        }
        None => None,
    };
    let chain = match renewed {
        Some(chain) => chain,
        None => issue(&cfg.bootstrap, hv_tls::client::config_without_identity(&cfg.ca)?, ask).await?,
    };
    issued(chain, key.serialize_pem().into_bytes(), &cfg.node)
}

/// `IdentityService.Issue` at `url`: the certificate chain (PEM).
async fn issue(
    url: &str,
    tls: tonic::transport::ClientTlsConfig,
    ask: IssueRequest,
) -> Result<Vec<u8>, ObtainError> {
    let channel = connect(url, tls).await?;
    let answer = IdentityServiceClient::new(channel).issue(ask).await.map_err(ObtainError::Refused)?;
    Ok(answer.into_inner().certificate_chain_pem.into_bytes())
}

async fn connect(
    url: &str,
    tls: tonic::transport::ClientTlsConfig,
) -> Result<tonic::transport::Channel, ObtainError> {
    let failed = |e: String| ObtainError::Connect(url.to_string(), e);
    tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| failed(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(30))
        .tls_config(tls)
        .map_err(|e| failed(e.to_string()))?
        .connect()
        .await
        .map_err(|e| failed(hv_tls::explain(&e)))
}

impl ObtainError {
    /// Whether the coordinator said no for a reason asking again soon will
    /// not change (the token, the pod, the node): asked again after minutes,
    /// not seconds, as each ask costs the API server a review.
    pub fn is_refusal(&self) -> bool {
        use tonic::Code;
        matches!(self, ObtainError::Refused(s)
            if matches!(s.code(), Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument))
    }
}

/// The answer as a certificate for `node`, or why it is none.
pub(super) fn issued(chain_pem: Vec<u8>, key_pem: Vec<u8>, node: &str) -> Result<Issued, ObtainError> {
    let leaf = CertificateDer::pem_slice_iter(&chain_pem)
        .next()
        .ok_or_else(|| ObtainError::Answer("no certificate in it".into()))?
        .map_err(|e| ObtainError::Answer(e.to_string()))?;
    let named = hv_tls::identity::uris_of(&leaf);
    if !named.iter().any(|u| u.ends_with(&format!("/node/{node}"))) {
        return Err(ObtainError::Answer(format!("a certificate for {named:?}, not for node {node}")));
    }
    let (_, not_after) = hv_tls::identity::validity(&leaf)
        .ok_or_else(|| ObtainError::Answer("its validity cannot be read".into()))?;
    Ok(Issued { chain_pem, key_pem, received: SystemTime::now(), not_after })
}
