//! Whether an agent gets a certificate for its node (pure): what the API
//! server said of its token, the pod the token is bound to, that pod's
//! owner and Node, and whether the token was used before
//! (docs/decisions/0020-agent-certificates-from-the-cluster.md).
//!
//! Every certificate is signed on a token the API server vouches for, of
//! the agents' ServiceAccount, bound to a running pod of the agents'
//! DaemonSet on the very node asked for, whose Node is not going away. A
//! token is good for one certificate on the bootstrap port; on the mutual
//! TLS port the caller already holds the node's certificate, and renews it
//! with a token it may have shown before.

pub mod sign;

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What the API server's TokenReview said of a token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reviewed {
    pub authenticated: bool,
    /// The API server's reason when not authenticated (expired, bad
    /// signature, its pod gone).
    pub error: String,
    pub username: String,
    /// The audiences the token was found valid for, of those asked.
    pub audiences: Vec<String>,
    /// The pod the token is bound to (the `authentication.kubernetes.io`
    /// extras), if any.
    pub pod_name: Option<String>,
    pub pod_uid: Option<String>,
    /// The token's own id (its `jti`), if the API server names it.
    pub credential_id: Option<String>,
}

/// The pod a token is bound to, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSeen {
    pub uid: String,
    /// The controller owning it: (kind, name, uid).
    pub controller: Option<(String, String, String)>,
    pub node_name: Option<String>,
    pub phase: Option<String>,
    pub deleting: bool,
}

/// The Node asked for, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeSeen {
    Present,
    Deleting,
    Missing,
}

/// Who may ask: the agents' ServiceAccount and DaemonSet, and the audience
/// their tokens are for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Agents {
    pub namespace: String,
    pub service_account: String,
    pub daemon_set: String,
    pub audience: String,
}

impl Agents {
    /// The user name the API server gives the agents' tokens.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.service_account)
    }
}

/// One request, as it came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ask {
    pub node: String,
    pub via: Via,
}

/// The port a request came in on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Via {
    /// Server TLS only: the caller has no certificate yet.
    Bootstrap,
    /// Mutual TLS: a renewal, by a caller whose certificate names this
    /// node (None: it names none).
    Renewal(Option<String>),
}

/// Why no certificate was signed; [`Refusal::reason`] is the metric's label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no node named in the request")]
    NoNode,
    #[error("the API server does not vouch for the token: {0}")]
    TokenInvalid(String),
    #[error("the token is not for audience {0}")]
    WrongAudience(String),
    #[error("the token is {0}'s, not the agents' ServiceAccount's")]
    WrongAccount(String),
    #[error("the token is bound to no pod")]
    NotBound,
    #[error("the token names no credential id; a token that cannot be told apart cannot be used once")]
    NoCredentialId,
    #[error("the token's pod {0} is gone")]
    PodGone(String),
    #[error("pod {0} is not a pod of the agents' DaemonSet {1}")]
    PodNotOurs(String, String),
    #[error("pod {0} is not running ({1})")]
    PodNotRunning(String, String),
    #[error("pod {pod} runs on node {bound}, not on {asked}")]
    WrongNode { pod: String, bound: String, asked: String },
    #[error("node {0} is gone or being deleted: no certificate is signed for it again")]
    NodeGone(String),
    #[error("the token was used for a certificate already")]
    Replayed,
    #[error(
        "the token lives {0:?}, longer than the {1:?} allowed: a projected token of the chart's lives 10 minutes"
    )]
    LongLived(Duration, Duration),
    #[error("the client certificate speaks for {0}, not for the node asked for")]
    OtherCertificate(String),
    #[error("the certificate request cannot be used: {0}")]
    BadRequest(String),
}

impl Refusal {
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::NoNode | Refusal::BadRequest(_) => "bad_request",
            Refusal::TokenInvalid(_) => "token_invalid",
            Refusal::WrongAudience(_) => "wrong_audience",
            Refusal::WrongAccount(_) => "wrong_account",
            Refusal::NotBound | Refusal::NoCredentialId => "token_not_bound",
            Refusal::PodGone(_) => "pod_gone",
            Refusal::PodNotOurs(..) => "pod_not_ours",
            Refusal::PodNotRunning(..) => "pod_not_running",
            Refusal::WrongNode { .. } => "wrong_node",
            Refusal::NodeGone(_) => "node_gone",
            Refusal::Replayed => "replayed",
            Refusal::LongLived(..) => "token_long_lived",
            Refusal::OtherCertificate(_) => "other_certificate",
        }
    }

    /// Every label [`Refusal::reason`] gives, for metrics that start at 0.
    pub const REASONS: [&'static str; 13] = [
        "token_long_lived",
        "bad_request",
        "other_certificate",
        "token_invalid",
        "wrong_audience",
        "wrong_account",
        "token_not_bound",
        "pod_gone",
        "pod_not_ours",
        "pod_not_running",
        "wrong_node",
        "node_gone",
        "replayed",
    ];

    /// Whether the caller is told it is not authenticated (its token), as
    /// opposed to authenticated but not allowed (its pod, its node).
    pub fn is_unauthenticated(&self) -> bool {
        matches!(
            self,
            Refusal::TokenInvalid(_)
                | Refusal::WrongAudience(_)
                | Refusal::NotBound
                | Refusal::NoCredentialId
                | Refusal::Replayed
                | Refusal::LongLived(..)
        )
    }
}

/// A token's claims as it carries them, read without checking its
/// signature: good only for refusing early, and, once the API server
/// vouched for the token, for how long it lives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    pub iat: u64,
    pub exp: u64,
    /// Its id, as the API server names it (`JTI=…`).
    pub credential_id: Option<String>,
}

/// What needs no API server: the request's port and node, and the token's
/// own times (unsigned claims: a forged token is refused early, never let
/// through). Answers how long the token is to be remembered.
pub fn before_review(
    ask: &Ask,
    claims: Option<&Claims>,
    now: u64,
    max: Duration,
) -> Result<Duration, Refusal> {
    if ask.node.is_empty() {
        return Err(Refusal::NoNode);
    }
    match &ask.via {
        Via::Renewal(Some(shown)) if shown != &ask.node => {
            return Err(Refusal::OtherCertificate(shown.clone()));
        }
        Via::Renewal(None) => return Err(Refusal::OtherCertificate("no node".into())),
        Via::Bootstrap | Via::Renewal(Some(_)) => {}
    }
    let c = claims.ok_or_else(|| Refusal::TokenInvalid("not a token: its claims cannot be read".into()))?;
    if c.exp <= now {
        return Err(Refusal::TokenInvalid("the token has expired".into()));
    }
    let life = Duration::from_secs(c.exp.saturating_sub(c.iat));
    if life > max {
        return Err(Refusal::LongLived(life, max));
    }
    Ok(Duration::from_secs(c.exp - now))
}

/// What the token alone says: the pod to read next (name, uid), or why not.
pub fn vouched_pod(review: &Reviewed, agents: &Agents) -> Result<(String, String), Refusal> {
    if !review.authenticated {
        return Err(Refusal::TokenInvalid(review.error.clone()));
    }
    if !review.audiences.iter().any(|a| a == &agents.audience) {
        return Err(Refusal::WrongAudience(agents.audience.clone()));
    }
    if review.username != agents.username() {
        return Err(Refusal::WrongAccount(review.username.clone()));
    }
    match (&review.pod_name, &review.pod_uid) {
        (Some(name), Some(uid)) if !name.is_empty() && !uid.is_empty() => Ok((name.clone(), uid.clone())),
        _ => Err(Refusal::NotBound),
    }
}

/// Whether the pod the token is bound to (read as `pod`, None when gone)
/// may have a certificate for the node asked, whose Node is `node`.
pub fn pod_may_have(
    pod_ref: (&str, &str),
    pod: Option<&PodSeen>,
    daemon_set_uid: Option<&str>,
    agents: &Agents,
    node: NodeSeen,
    asked: &str,
) -> Result<(), Refusal> {
    let (name, uid) = pod_ref;
    let pod = match pod {
        Some(p) if p.uid == uid => p,
        _ => return Err(Refusal::PodGone(name.into())),
    };
    let ours = match (&pod.controller, daemon_set_uid) {
        (Some((kind, owner, owner_uid)), Some(ds_uid)) => {
            kind == "DaemonSet" && owner == &agents.daemon_set && owner_uid == ds_uid
        }
        _ => false,
    };
    if !ours {
        return Err(Refusal::PodNotOurs(name.into(), agents.daemon_set.clone()));
    }
    let phase = pod.phase.clone().unwrap_or_else(|| "no phase".into());
    if pod.deleting || phase != "Running" {
        let state = if pod.deleting { format!("{phase}, being deleted") } else { phase };
        return Err(Refusal::PodNotRunning(name.into(), state));
    }
    let bound = pod.node_name.clone().unwrap_or_default();
    if bound != asked {
        return Err(Refusal::WrongNode { pod: name.into(), bound, asked: asked.into() });
    }
    match node {
        NodeSeen::Present => Ok(()),
        NodeSeen::Deleting | NodeSeen::Missing => Err(Refusal::NodeGone(asked.into())),
    }
}

/// A token's claims (`iat`, `exp`, `jti`), read without checking its
/// signature.
pub fn token_claims(token: &str) -> Option<Claims> {
    use base64::Engine;
    let claims = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims.trim_end_matches('=')).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let credential_id = v.get("jti").and_then(|j| j.as_str()).map(|j| format!("JTI={j}"));
    Some(Claims { iat: v.get("iat")?.as_u64()?, exp: v.get("exp")?.as_u64()?, credential_id })
}

/// The credential ids that got a certificate on the bootstrap port, each
/// with the request it was for, kept until its token ends: the same token
/// with another request is a replay; with the same request, the caller
/// asking again for an answer it lost (the request proves its key).
#[derive(Debug, Default)]
pub struct Used {
    /// Each id: until when it is kept, and the request (DER) it answered.
    ids: HashMap<String, (Instant, Vec<u8>)>,
}

impl Used {
    /// Records `id` as used now for `request`, kept for `keep` (its token's
    /// remaining life); answers whether it is newly taken (false: the same
    /// request again). Another request for a used id is
    /// [`Refusal::Replayed`]. Ids whose tokens have ended are forgotten first.
    pub fn take(&mut self, id: &str, now: Instant, keep: Duration, request: &[u8]) -> Result<bool, Refusal> {
        self.ids.retain(|_, (until, _)| *until > now);
        match self.ids.get(id) {
            Some((_, asked)) if asked == request => Ok(false),
            Some(_) => Err(Refusal::Replayed),
            None => {
                self.ids.insert(id.to_string(), (now + keep, request.to_vec()));
                Ok(true)
            }
        }
    }

    /// Records `id` as used now for `request`, whether it was or not (a
    /// renewal: its caller holds the node's certificate already).
    pub fn mark(&mut self, id: &str, now: Instant, keep: Duration, request: &[u8]) {
        let until = self.ids.get(id).map_or(now, |(until, _)| *until).max(now + keep);
        self.ids.insert(id.to_string(), (until, request.to_vec()));
    }

    /// Whether `id` got a certificate for another request than `request`,
    /// and its token still lives.
    pub fn refuses(&self, id: &str, now: Instant, request: &[u8]) -> bool {
        self.ids.get(id).is_some_and(|(until, asked)| *until > now && asked != request)
    }

    /// Gives `id` back: its certificate could not be signed after all.
    pub fn give_back(&mut self, id: &str) {
        self.ids.remove(id);
    }

    /// The ids kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests;
