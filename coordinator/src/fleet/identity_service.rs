//! `IdentityService.Issue`: an agent's certificate for its node
//! (docs/decisions/0020-agent-certificates-from-the-cluster.md).
//!
//! Observe (the token reviewed, the pod, the DaemonSet and the Node read
//! fresh), decide ([`crate::identity`]), sign. Served twice: on the
//! bootstrap port (server TLS only), where a token is good for one
//! certificate, and on the gRPC port (mutual TLS), where the caller's
//! certificate must name the node it renews. Only the leader signs: the
//! record of tokens used lives in one place.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hv_proto::v1::identity_service_server::IdentityService;
use hv_proto::v1::{IssueRequest, IssueResponse};
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::identity::sign::{Issued, SignError, Signer};
use crate::identity::{self, Agents, Ask, NodeSeen, PodSeen, Refusal, Reviewed, Used, Via};
use crate::metrics::AgentCertificates;

/// The largest token and certificate request taken: a projected token is
/// about 1 KiB, a request for an EC key well under.
const MAX_TOKEN_BYTES: usize = 16 * 1024;
const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// The API server's answers an issuance needs.
#[tonic::async_trait]
pub trait Vouch: Send + Sync {
    async fn review(&self, token: &str, audience: &str) -> Result<Reviewed, kube::Error>;
    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<PodSeen>, kube::Error>;
    async fn daemon_set_uid(&self, namespace: &str, name: &str) -> Result<Option<String>, kube::Error>;
    async fn node(&self, name: &str) -> Result<NodeSeen, kube::Error>;
}

/// The signing CA's files (a Secret's `tls.crt` and `tls.key`), read at
/// each issuance: a rotated one signs from the next.
#[derive(Clone, Debug)]
pub struct SignerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl SignerFiles {
    pub fn load(&self) -> Result<Signer, SignError> {
        let cert = std::fs::read(&self.cert)
            .map_err(|e| SignError::Certificate(format!("{}: {e}", self.cert.display())))?;
        let key =
            std::fs::read(&self.key).map_err(|e| SignError::Key(format!("{}: {e}", self.key.display())))?;
        Signer::from_pem(&cert, &key)
    }
}

/// What both ports share.
pub struct Issuer {
    pub vouch: Arc<dyn Vouch>,
    pub agents: Agents,
    pub trust_domain: String,
    pub signer: SignerFiles,
    /// How long a certificate lives.
    pub life: Duration,
    /// The longest-lived token taken.
    pub max_token_life: Duration,
    pub leader: watch::Receiver<bool>,
    pub used: Mutex<Used>,
    /// Issuances under way; past [`MAX_IN_FLIGHT`] a caller is told to come
    /// back (each costs the API server a review and three reads).
    pub in_flight: tokio::sync::Semaphore,
    pub metrics: AgentCertificates,
}

/// Issuances under way at once.
pub const MAX_IN_FLIGHT: usize = 32;

/// The largest message the service decodes.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;

/// Why an issuance did not happen.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Sign(#[from] SignError),
    #[error("this replica stopped leading")]
    NotLeader,
}

impl Failure {
    /// The kind counted in `hv_coordinator_agent_certificate_errors_total`.
    fn kind(&self) -> &'static str {
        match self {
            Failure::Refused(_) => "refused",
            Failure::Kube(e) => crate::k8s::measured::kube_error_kind(e),
            Failure::Sign(_) => "signer",
            Failure::NotLeader => "not_leader",
        }
    }
}

impl Issuer {
    /// Observe, decide, sign. What needs no API server is judged first, a
    /// token already used included (its id read from its own claims: a
    /// forged one is only refused sooner).
    async fn issue(&self, ask: &Ask, token: &str, csr_der: &[u8]) -> Result<Issued, Failure> {
        let claims = identity::token_claims(token);
        let epoch = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let keep = identity::before_review(ask, claims.as_ref(), epoch, self.max_token_life)?;
        let claimed = claims.and_then(|c| c.credential_id);
        if ask.via == Via::Bootstrap
            && claimed
                .as_deref()
                .is_some_and(|id| crate::locked::lock(&self.used).refuses(id, Instant::now(), csr_der))
        {
            return Err(Refusal::Replayed.into());
        }
        let review = self.vouch.review(token, &self.agents.audience).await?;
        let (pod, uid) = identity::vouched_pod(&review, &self.agents)?;
        let ns = &self.agents.namespace;
        let (seen, ds, node) = tokio::try_join!(
            self.vouch.pod(ns, &pod),
            self.vouch.daemon_set_uid(ns, &self.agents.daemon_set),
            self.vouch.node(&ask.node),
        )?;
        identity::pod_may_have((&pod, &uid), seen.as_ref(), ds.as_deref(), &self.agents, node, &ask.node)?;
        let id = review.credential_id.ok_or(Refusal::NoCredentialId)?;
        if !*self.leader.borrow() {
            // Leadership ended while the API server answered.
            return Err(Failure::NotLeader);
        }
        let newly = self.take(&id, &ask.via, keep, csr_der)?;
        let now = SystemTime::now();
        let uri = hv_tls::node_uri(&self.trust_domain, &ask.node);
        let signed =
            self.signer.load().and_then(|s| s.sign(csr_der, &ask.node, &uri, now, self.life, serial()));
        if signed.is_err() && newly {
            crate::locked::lock(&self.used).give_back(&id);
        }
        Ok(signed?)
    }

    /// The token's id taken for `request` (bootstrap) or noted (renewal):
    /// whether it is newly taken.
    fn take(&self, id: &str, via: &Via, keep: Duration, request: &[u8]) -> Result<bool, Refusal> {
        let mut used = crate::locked::lock(&self.used);
        match via {
            Via::Bootstrap => used.take(id, Instant::now(), keep, request),
            Via::Renewal(_) => {
                used.mark(id, Instant::now(), keep, request);
                Ok(false)
            }
        }
    }
}

/// Random, positive serial numbers.
fn serial() -> [u8; 16] {
    let mut s = [0u8; 16];
    // A failing system random source leaves zeros; the key's own hash
    // then tells certificates apart (each issuance has a new key).
    let _ = aws_lc_rs::rand::fill(&mut s);
    s
}

/// The service on one port.
pub struct IdentityEndpoint {
    pub issuer: Arc<Issuer>,
    /// The gRPC port (mutual TLS: renewals), or the bootstrap port.
    pub mutual: bool,
}

#[tonic::async_trait]
impl IdentityService for IdentityEndpoint {
    async fn issue(&self, request: Request<IssueRequest>) -> Result<Response<IssueResponse>, Status> {
        if !*self.issuer.leader.borrow() {
            return Err(Status::unavailable("this coordinator replica is not the leader; retry"));
        }
        let Ok(_turn) = self.issuer.in_flight.try_acquire() else {
            self.issuer.metrics.error("busy");
            return Err(Status::resource_exhausted("too many certificates asked for at once; retry"));
        };
        let via = match self.mutual {
            true => {
                let certs = request.peer_certs();
                let leaf = certs.as_deref().and_then(|c| c.first());
                Via::Renewal(leaf.and_then(|c| hv_tls::node_of(c, &self.issuer.trust_domain)))
            }
            false => Via::Bootstrap,
        };
        let req = request.into_inner();
        if req.token.len() > MAX_TOKEN_BYTES || req.csr_der.len() > MAX_REQUEST_BYTES {
            return Err(self.refused(&req.node, &Refusal::BadRequest("token or request too large".into())));
        }
        if !super::agent_service::valid_node_name(&req.node) {
            return Err(self.refused(&req.node, &Refusal::NoNode));
        }
        if req.token.is_empty() {
            return Err(self.refused(&req.node, &Refusal::TokenInvalid("no token".into())));
        }
        let ask = Ask { node: req.node.clone(), via };
        let span = tracing::info_span!("issue", node = %req.node, renewal = self.mutual);
        match self.issuer.issue(&ask, &req.token, &req.csr_der).instrument(span).await {
            Ok(issued) => Ok(Response::new(self.issued(&req.node, issued))),
            Err(Failure::Refused(r)) => Err(self.refused(&req.node, &r)),
            Err(Failure::Sign(SignError::Request(e))) => {
                Err(self.refused(&req.node, &Refusal::BadRequest(e)))
            }
            Err(e) => {
                self.issuer.metrics.error(e.kind());
                tracing::error!(node = %req.node, error = %e, kind = e.kind(), "no certificate signed");
                // What went wrong is the log's, not an unauthenticated caller's.
                Err(Status::unavailable("no certificate signed now; retry"))
            }
        }
    }
}

impl IdentityEndpoint {
    fn issued(&self, node: &str, issued: Issued) -> IssueResponse {
        self.issuer.metrics.issued(self.mutual);
        tracing::info!(node = %node, renewal = self.mutual, not_after = ?issued.not_after, "agent certificate signed");
        IssueResponse {
            certificate_chain_pem: issued.chain_pem,
            not_before: Some(prost_types::Timestamp::from(issued.not_before)),
            not_after: Some(prost_types::Timestamp::from(issued.not_after)),
        }
    }

    fn refused(&self, node: &str, r: &Refusal) -> Status {
        self.issuer.metrics.refused(r.reason());
        let shown = crate::api::bounded(node, 64);
        tracing::warn!(node = %shown, reason = r.reason(), why = %r, "agent certificate refused");
        match r {
            Refusal::BadRequest(_) | Refusal::NoNode => Status::invalid_argument(r.to_string()),
            r if r.is_unauthenticated() => Status::unauthenticated(r.to_string()),
            r => Status::permission_denied(r.to_string()),
        }
    }
}

#[cfg(test)]
mod tests;
