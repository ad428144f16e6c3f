//! One authenticated OpenStack session, through the `openstack_sdk` crate.
//!
//! The SDK does what every OpenStack tool must do the same way: read
//! clouds.yaml or the `OS_*` variables, authenticate against Keystone, pick
//! the endpoint of each service from the catalog (region and interface
//! honoured) and send the microversion header. We send our own small
//! requests through it (see [`Call`]) rather than the SDK's generated
//! per-API crates: we use eleven calls, and their bodies are parsed here
//! against the microversions we pin, so a field that vanished is an error
//! instead of a silent zero.

use std::borrow::Cow;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openstack_sdk::api::{QueryAsync, QueryParams, RestEndpoint, raw};
use openstack_sdk::config::{CloudConfig, ConfigFile};
use openstack_sdk::types::{ApiVersion, ServiceType};
use openstack_sdk::{AsyncOpenStack, OpenStackError};
use serde_json::Value;
use tokio::sync::Mutex;

use super::error::NovaError;

/// Compute API microversion of every call (2.88 dropped the usage fields of
/// os-hypervisors; service ids are UUIDs since 2.53).
pub const COMPUTE_MICROVERSION: (u8, u8) = (2, 96);
/// Placement microversion (1.39: traits with `resource_provider_generation`).
pub const PLACEMENT_MICROVERSION: (u8, u8) = (1, 39);

/// Where the credentials come from, as OpenStack tools look for them.
#[derive(Clone, Debug)]
pub enum CloudSource {
    /// A named cloud from clouds.yaml: the file given, else the usual places
    /// (`./clouds.yaml`, `~/.config/openstack/`, `/etc/openstack/`).
    CloudsYaml { cloud: String, file: Option<PathBuf> },
    /// `OS_AUTH_URL`, `OS_USERNAME`, `OS_PASSWORD`, `OS_PROJECT_NAME`, ...
    Env,
}

impl CloudSource {
    fn load(&self) -> Result<CloudConfig, NovaError> {
        match self {
            CloudSource::Env => CloudConfig::from_env()
                .map_err(|e| NovaError::Config(format!("OS_* environment variables: {e}"))),
            CloudSource::CloudsYaml { cloud, file } => {
                let files = match file {
                    Some(path) => ConfigFile::builder()
                        .add_source(path)
                        .map_err(|e| NovaError::Config(format!("{}: {e}", path.display())))?
                        .build()
                        .map_err(|e| NovaError::Config(format!("{}: {e}", path.display()))),
                    None => ConfigFile::new().map_err(|e| NovaError::Config(format!("clouds.yaml: {e}"))),
                }?;
                files
                    .get_cloud_config(cloud)
                    .map_err(|e| NovaError::Config(format!("cloud {cloud}: {e}")))?
                    .ok_or_else(|| NovaError::Config(format!("cloud {cloud} is not in clouds.yaml")))
            }
        }
    }
}

/// Tunables of the HTTP side.
#[derive(Clone, Debug)]
pub struct HttpPolicy {
    pub timeout: Duration,
    /// Attempts for a transient failure (timeouts, 5xx), with doubling pauses.
    pub attempts: u32,
    pub first_pause: Duration,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy { timeout: Duration::from_secs(30), attempts: 3, first_pause: Duration::from_millis(300) }
    }
}

/// A lazily authenticated session. Keystone being down or rejecting us at
/// start-up is an observation, not a crash: every call tries again.
pub struct Cloud {
    source: CloudSource,
    policy: HttpPolicy,
    session: Mutex<Option<Arc<AsyncOpenStack>>>,
}

/// One request: a method, a path relative to the service's catalog endpoint,
/// query parameters and a JSON body.
#[derive(Clone, Debug)]
pub struct Call {
    pub service: Service,
    pub method: http::Method,
    pub path: String,
    pub query: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Compute,
    Placement,
}

impl Call {
    pub fn get(service: Service, path: impl Into<String>) -> Call {
        Call { service, method: http::Method::GET, path: path.into(), query: Vec::new(), body: None }
    }
    pub fn with(service: Service, method: http::Method, path: impl Into<String>, body: Value) -> Call {
        Call { service, method, path: path.into(), query: Vec::new(), body: Some(body) }
    }
    pub fn delete(service: Service, path: impl Into<String>) -> Call {
        Call { service, method: http::Method::DELETE, path: path.into(), query: Vec::new(), body: None }
    }
    pub fn param(mut self, key: &'static str, value: impl Into<String>) -> Call {
        self.query.push((key, value.into()));
        self
    }
    /// "GET os-services", for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

impl RestEndpoint for Call {
    fn method(&self) -> http::Method {
        self.method.clone()
    }
    fn endpoint(&self) -> Cow<'static, str> {
        self.path.clone().into()
    }
    fn service_type(&self) -> ServiceType {
        match self.service {
            Service::Compute => ServiceType::Compute,
            Service::Placement => ServiceType::Placement,
        }
    }
    fn parameters(&self) -> QueryParams<'_> {
        let mut q = QueryParams::default();
        for (k, v) in &self.query {
            q.push(*k, v.as_str());
        }
        q
    }
    fn body(&self) -> Result<Option<(&'static str, Vec<u8>)>, openstack_sdk::api::BodyError> {
        match &self.body {
            None => Ok(None),
            Some(v) => Ok(Some(("application/json", serde_json::to_vec(v)?))),
        }
    }
    fn min_version(&self) -> Option<ApiVersion> {
        let (major, minor) = match self.service {
            Service::Compute => COMPUTE_MICROVERSION,
            Service::Placement => PLACEMENT_MICROVERSION,
        };
        Some(ApiVersion::new(major, minor))
    }
}

impl Cloud {
    pub fn new(source: CloudSource, policy: HttpPolicy) -> Cloud {
        Cloud { source, policy, session: Mutex::new(None) }
    }

    /// Fails when the configuration cannot work at all (no such cloud, no
    /// auth URL); says nothing of whether Keystone accepts it.
    pub fn check_config(&self) -> Result<(), NovaError> {
        self.source.load().map(|_| ())
    }

    /// Sends a call, retrying transient failures; answers the JSON body
    /// (`Value::Null` for an empty one).
    /// Calls and parses the answer's `key` (every list and object Nova and
    /// Placement answer is wrapped in one).
    pub async fn fetch<T: serde::de::DeserializeOwned>(&self, call: Call, key: &str) -> Result<T, NovaError> {
        let what = call.describe();
        field(self.call(call).await?, key, &what)
    }

    pub async fn call(&self, call: Call) -> Result<Value, NovaError> {
        let mut pause = self.policy.first_pause;
        let mut reauthenticated = false;
        let mut attempt = 1;
        loop {
            match self.once(&call).await {
                Err(NovaError::Unauthorized(_)) if !reauthenticated => {
                    // An expired or revoked token: authenticate afresh, once.
                    *self.session.lock().await = None;
                    reauthenticated = true;
                }
                Err(e) if e.is_transient() && attempt < self.policy.attempts => {
                    tracing::debug!(call = %call.describe(), error = %e, attempt, "retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn once(&self, call: &Call) -> Result<Value, NovaError> {
        let session = self.session().await?;
        let what = call.describe();
        let rsp =
            raw(call.clone()).skip_error_check(true).query_async(session.as_ref()).await.map_err(|e| {
                let text = e.to_string();
                if text.contains("401")
                    || text.contains("403")
                    || text.to_lowercase().contains("unauthorized")
                {
                    NovaError::Unauthorized(format!("{what}: {text}"))
                } else {
                    NovaError::Unavailable(format!("{what}: {text}"))
                }
            })?;
        let status = rsp.status().as_u16();
        let body = String::from_utf8_lossy(rsp.body()).into_owned();
        tracing::debug!(call = %what, status, "openstack call");
        if !(200..300).contains(&status) {
            return Err(NovaError::from_status(status, &what, &body));
        }
        if body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&body).map_err(|e| NovaError::Invalid(format!("{what}: {e}")))
    }

    async fn session(&self) -> Result<Arc<AsyncOpenStack>, NovaError> {
        let mut slot = self.session.lock().await;
        if let Some(s) = slot.as_ref() {
            return Ok(s.clone());
        }
        let cfg = self.source.load()?;
        let connect = AsyncOpenStack::builder(&cfg)
            .disable_auth_cache(true)
            .http_timeout(self.policy.timeout)
            .http_connect_timeout(self.policy.timeout.min(Duration::from_secs(10)))
            .connect();
        let session = Arc::new(connect.await.map_err(classify_connect)?);
        *slot = Some(session.clone());
        Ok(session)
    }
}

/// Keystone said no (a wrong password is not transient) versus Keystone or
/// the network did not answer.
fn classify_connect(e: OpenStackError) -> NovaError {
    use openstack_sdk::AuthError;
    let text = format!("keystone: {e}");
    match &e {
        OpenStackError::Communication { .. } | OpenStackError::NoResponse {} => NovaError::Unavailable(text),
        OpenStackError::Http { status } if status.is_server_error() => NovaError::Unavailable(text),
        OpenStackError::Http { .. } => NovaError::Unauthorized(text),
        OpenStackError::AuthError { source } => match source {
            AuthError::Identity(id) if id.code >= 500 => NovaError::Unavailable(text),
            AuthError::Identity(_) | AuthError::AuthReceipt(_) => NovaError::Unauthorized(text),
            AuthError::AuthValueNotSupplied(_) | AuthError::PluginMalformedRequirement => {
                NovaError::Config(text)
            }
            _ => NovaError::Unavailable(text),
        },
        _ => NovaError::Unavailable(text),
    }
}

/// The answer's `key`, parsed; a missing key or a wrong shape is Invalid,
/// naming the call.
pub(super) fn field<T: serde::de::DeserializeOwned>(v: Value, key: &str, what: &str) -> Result<T, NovaError> {
    let inner = v
        .get(key)
        .cloned()
        .ok_or_else(|| NovaError::Invalid(format!("{what}: no \"{key}\" in the answer")))?;
    serde_json::from_value(inner).map_err(|e| NovaError::Invalid(format!("{what}: {e}")))
}
