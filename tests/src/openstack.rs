//! Minimal Keystone, Nova and Placement calls for tests: enough to check the
//! ground and, later, to assert on what the coordinator did. Not the
//! coordinator's client (that lives in `coordinator/src/nova/`).

use serde_json::{Value, json};

use crate::env::{Credentials, Keystone};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}: {1}")]
    Http(String, reqwest::Error),
    #[error("{what}: HTTP {status}: {body}")]
    Status { what: String, status: u16, body: String },
    #[error("{0}: no X-Subject-Token in Keystone's answer")]
    NoToken(String),
}

/// A scoped Keystone token.
#[derive(Debug, Clone)]
pub struct Token {
    pub value: String,
    pub body: Value,
}

/// Password authentication, project-scoped: what `openstack` does with a clouds.yaml entry.
pub async fn token(ks: &Keystone, who: &Credentials) -> Result<Token, ApiError> {
    let body = json!({"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": who.username, "domain": {"name": who.user_domain_name}, "password": who.password}}},
        "scope": {"project": {"name": who.project_name, "domain": {"name": who.project_domain_name}}}}});
    let what = format!("POST {}/auth/tokens as {}", ks.auth_url, who.username);
    let resp = reqwest::Client::new()
        .post(format!("{}/auth/tokens", ks.auth_url))
        .json(&body)
        .send()
        .await
        .map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    let value = resp.headers().get("x-subject-token").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status != 201 {
        return Err(ApiError::Status { what, status, body: body.to_string() });
    }
    let value = value.ok_or(ApiError::NoToken(what))?;
    Ok(Token { value, body })
}

/// GET `url` with the token and a microversion header (`compute 2.96`, `placement 1.39`).
pub async fn get(url: &str, token: &Token, microversion: &str) -> Result<Value, ApiError> {
    let what = format!("GET {url}");
    let resp = reqwest::Client::new()
        .get(url)
        .header("X-Auth-Token", &token.value)
        .header("OpenStack-API-Version", microversion)
        .send()
        .await
        .map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| ApiError::Http(what.clone(), e))?;
    if !(200..300).contains(&status) {
        return Err(ApiError::Status { what, status, body: text });
    }
    serde_json::from_str(&text).map_err(|e| ApiError::Status { what, status, body: format!("{e}: {text}") })
}
