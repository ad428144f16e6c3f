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
    /// No answer, a timeout or a 5xx. Retried a bounded number of times.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The service answered something we cannot use (400, bad JSON, a missing
    /// field at our microversion).
    #[error("unexpected answer: {0}")]
    Invalid(String),
    /// clouds.yaml / OS_* configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
}

impl NovaError {
    /// Worth trying again after a pause.
    pub fn is_transient(&self) -> bool {
        matches!(self, NovaError::Unavailable(_))
    }

    /// From an HTTP status and the body Nova or Placement sent.
    pub fn from_status(status: u16, what: &str, body: &str) -> NovaError {
        let msg = format!("{what}: HTTP {status}: {}", summary(body));
        match status {
            401 | 403 => NovaError::Unauthorized(msg),
            404 => NovaError::NotFound(msg),
            409 => NovaError::Conflict(msg),
            408 | 429 | 500..=599 => NovaError::Unavailable(msg),
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
        assert!(matches!(NovaError::from_status(401, "x", ""), NovaError::Unauthorized(_)));
        assert!(matches!(NovaError::from_status(403, "x", ""), NovaError::Unauthorized(_)));
        assert!(matches!(NovaError::from_status(404, "x", ""), NovaError::NotFound(_)));
        assert!(matches!(NovaError::from_status(409, "x", ""), NovaError::Conflict(_)));
        assert!(NovaError::from_status(503, "x", "").is_transient());
        assert!(NovaError::from_status(429, "x", "").is_transient());
        assert!(!NovaError::from_status(400, "x", "").is_transient());
    }

    #[test]
    fn the_message_is_dug_out_of_openstack_error_bodies() {
        let nova = r#"{"itemNotFound": {"code": 404, "message": "Aggregate 7 could not be found."}}"#;
        let e = NovaError::from_status(404, "GET os-aggregates/7", nova);
        assert_eq!(
            e.to_string(),
            "not found: GET os-aggregates/7: HTTP 404: Aggregate 7 could not be found."
        );
        let placement = r#"{"errors": [{"status": 409, "detail": "generation conflict"}]}"#;
        assert!(NovaError::from_status(409, "PUT", placement).to_string().ends_with("generation conflict"));
        assert!(
            NovaError::from_status(500, "GET", "<html>oops</html>")
                .to_string()
                .ends_with("<html>oops</html>")
        );
    }
}
