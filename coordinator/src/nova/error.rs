use thiserror::Error;

/// What went wrong talking to Nova, Placement or Keystone, sorted by what the
/// caller should do about it.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum NovaError {
    /// Keystone rejected our credentials, or the token lacks a role (401/403).
    /// Not retried: a wrong password does not fix itself.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The object does not exist (404).
    #[error("not found: {0}")]
    NotFound(String),
    /// A concurrent change or a state that forbids the call (409).
    #[error("conflict: {0}")]
    Conflict(String),
    /// Not done: the service could not be reached, or answered that it did
    /// nothing (a 5xx to an idempotent call, 408, 429). Worth trying again.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A request that changes something was sent and its outcome is unknown:
    /// the answer was lost (timeout or reset after sending) or was a 5xx.
    /// Never retried blindly: the caller must look at what happened.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The service answered something we cannot use (400, bad JSON, a missing
    /// field at our microversion).
    #[error("unexpected answer: {0}")]
    Invalid(String),
    /// The service does not speak the microversion asked (406): an older
    /// release. A caller with a lower one to fall back on asks again.
    #[error("microversion not supported: {0}")]
    NotAcceptable(String),
    /// clouds.yaml / OS_* configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// Not sent: this replica cannot show that it still holds the leader
    /// lease, and only the leader changes anything.
    #[error("not sent, not the leader: {0}")]
    NotLeader(String),
    /// Not sent: the install observes only (`--mode observe`), and the
    /// call would change something.
    #[error("not sent, this install observes only (--mode observe): {0}")]
    Withheld(String),
}

impl NovaError {
    /// What the error is, for metrics and classification: one word per variant.
    pub fn kind(&self) -> &'static str {
        match self {
            NovaError::Unauthorized(_) => "unauthorized",
            NovaError::NotFound(_) => "not_found",
            NovaError::Conflict(_) => "conflict",
            NovaError::Unavailable(_) => "unavailable",
            NovaError::Unknown(_) => "unknown",
            NovaError::Invalid(_) => "invalid",
            NovaError::NotAcceptable(_) => "not_acceptable",
            NovaError::Config(_) => "config",
            NovaError::NotLeader(_) => "not_leader",
            NovaError::Withheld(_) => "withheld",
        }
    }

    /// Worth trying again after a pause: nothing was done. (An
    /// [`Unknown`](NovaError::Unknown) outcome may be retried only by a call
    /// that is idempotent; the caller of a non-idempotent one must look.)
    pub fn is_transient(&self) -> bool {
        matches!(self, NovaError::Unavailable(_))
    }

    /// From an HTTP status and the body Nova or Placement sent. A 5xx to a
    /// call that changes something (`idempotent` false) leaves its outcome
    /// unknown: Nova may have acted before it failed.
    pub fn from_status(status: u16, what: &str, body: &str, idempotent: bool) -> NovaError {
        let msg = format!("{what}: HTTP {status}: {}", summary(body));
        match status {
            401 | 403 => NovaError::Unauthorized(msg),
            404 => NovaError::NotFound(msg),
            409 => NovaError::Conflict(msg),
            406 => NovaError::NotAcceptable(msg),
            408 | 429 => NovaError::Unavailable(msg),
            500..=599 if idempotent => NovaError::Unavailable(msg),
            500..=599 => NovaError::Unknown(msg),
            _ => NovaError::Invalid(msg),
        }
    }
}

/// The useful part of an OpenStack error body: the first "message" or
/// "detail" found, else the body cut short.
fn summary(body: &str) -> String {
    fn find(v: &serde_json::Value) -> Option<String> {
        match v {
            serde_json::Value::Object(m) => {
                for key in ["message", "detail"] {
                    if let Some(serde_json::Value::String(s)) = m.get(key) {
                        return Some(s.clone());
                    }
                }
                m.values().find_map(find)
            }
            serde_json::Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    let found = serde_json::from_str::<serde_json::Value>(body).ok().and_then(|v| find(&v));
    let text = found.unwrap_or_else(|| body.trim().to_string());
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_what_the_caller_does_next() {
        assert!(matches!(NovaError::from_status(401, "x", "", true), NovaError::Unauthorized(_)));
        assert!(matches!(NovaError::from_status(403, "x", "", true), NovaError::Unauthorized(_)));
        assert!(matches!(NovaError::from_status(404, "x", "", true), NovaError::NotFound(_)));
        assert!(matches!(NovaError::from_status(409, "x", "", true), NovaError::Conflict(_)));
        assert!(NovaError::from_status(503, "x", "", true).is_transient());
        assert!(NovaError::from_status(429, "x", "", false).is_transient(), "429: nothing was done");
        assert!(!NovaError::from_status(400, "x", "", true).is_transient());
    }

    #[test]
    fn a_5xx_to_a_call_that_changes_something_leaves_its_outcome_unknown() {
        let e = NovaError::from_status(500, "POST servers/x/action", "", false);
        assert!(matches!(e, NovaError::Unknown(_)), "{e}");
        assert!(!e.is_transient(), "never retried blindly");
    }

    #[test]
    fn error_text_never_decides_the_kind() {
        // A 503 whose URL and body carry "401" and "403" is still a 503.
        let e = NovaError::from_status(
            503,
            "GET servers/40140340-1401-4403-8401-401403401403",
            r#"{"message": "401 403 Unauthorized"}"#,
            true,
        );
        assert!(matches!(e, NovaError::Unavailable(_)), "{e}");
    }

    #[test]
    fn the_message_is_dug_out_of_openstack_error_bodies() {
        let nova = r#"{"itemNotFound": {"code": 404, "message": "Aggregate 7 could not be found."}}"#;
        let e = NovaError::from_status(404, "GET os-aggregates/7", nova, true);
        assert_eq!(
            e.to_string(),
            "not found: GET os-aggregates/7: HTTP 404: Aggregate 7 could not be found."
        );
        let placement = r#"{"errors": [{"status": 409, "detail": "generation conflict"}]}"#;
        assert!(
            NovaError::from_status(409, "PUT", placement, true).to_string().ends_with("generation conflict")
        );
        assert!(
            NovaError::from_status(500, "GET", "<html>oops</html>", true)
                .to_string()
                .ends_with("<html>oops</html>")
        );
    }
}
