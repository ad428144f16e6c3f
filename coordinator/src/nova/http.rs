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

use openstack_sdk::api::{ApiError, QueryAsync, QueryParams, RestEndpoint, raw};
use openstack_sdk::config::{CloudConfig, ConfigFile};
use openstack_sdk::types::{ApiVersion, ServiceType};
use openstack_sdk::{AsyncOpenStack, OpenStackError, RestError};
use serde_json::Value;
use tokio::sync::Mutex;

use super::error::NovaError;

/// Compute API microversion of every call (2.88 dropped the usage fields of
/// os-hypervisors; service ids are UUIDs since 2.53).
pub const COMPUTE_MICROVERSION: (u8, u8) = (2, 96);
/// Placement microversion (1.39: traits with `resource_provider_generation`).
pub const PLACEMENT_MICROVERSION: (u8, u8) = (1, 39);
/// The hypervisor lists' microversion: the last whose detail view names
/// each hypervisor's service host without asking every host for its
/// uptime (2.88 added that, one call to each nova-compute per hypervisor).
pub const HYPERVISOR_DETAIL_MICROVERSION: (u8, u8) = (2, 87);

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
    /// Longest wait for a connection. A call is sent only while the lease
    /// has this much (and a margin) left, so it is on the wire before the
    /// leader's renew deadline.
    pub connect_timeout: Duration,
    /// Attempts for a transient failure (timeouts, 5xx), with doubling pauses.
    pub attempts: u32,
    /// Requests in flight at once; more wait their turn, their timeout not
    /// yet running.
    pub max_in_flight: usize,
    pub first_pause: Duration,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(3),
            attempts: 3,
            first_pause: Duration::from_millis(300),
            max_in_flight: 16,
        }
    }
}

/// A lazily authenticated session. Keystone being down or rejecting us at
/// start-up is an observation, not a crash: every call tries again.
pub struct Cloud {
    source: CloudSource,
    policy: HttpPolicy,
    session: Mutex<Option<Arc<AsyncOpenStack>>>,
    /// When set, a call is sent only while this replica provably holds the
    /// leader lease: a deposed leader asks Nova nothing.
    guard: Option<Arc<crate::k8s::leader::LeaseGuard>>,
    /// `--mode observe`: no call that changes something is sent.
    observing: bool,
    /// `hv-coordinator/VERSION (IDENTITY)`: in the OpenStack services' logs,
    /// which replica asked.
    user_agent: http::HeaderValue,
    metrics: crate::metrics::OpenStackCalls,
    /// Held by each request while it is in flight (`HttpPolicy::max_in_flight`).
    in_flight: tokio::sync::Semaphore,
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
    /// Another microversion than the service's pinned one, for this call.
    microversion: Option<(u8, u8)>,
    /// Set by [`Cloud`] on the way out: who is calling.
    headers: http::HeaderMap,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Compute,
    Placement,
}

impl Call {
    pub fn get(service: Service, path: impl Into<String>) -> Call {
        Call::new(service, http::Method::GET, path.into(), None)
    }
    fn new(service: Service, method: http::Method, path: String, body: Option<Value>) -> Call {
        Call {
            service,
            method,
            path,
            query: Vec::new(),
            body,
            microversion: None,
            headers: http::HeaderMap::new(),
        }
    }
    pub fn with(service: Service, method: http::Method, path: impl Into<String>, body: Value) -> Call {
        Call::new(service, method, path.into(), Some(body))
    }
    pub fn delete(service: Service, path: impl Into<String>) -> Call {
        Call::new(service, http::Method::DELETE, path.into(), None)
    }
    /// Sends this call at `version` rather than the service's pinned one.
    pub fn at_microversion(mut self, version: (u8, u8)) -> Call {
        self.microversion = Some(version);
        self
    }
    pub fn param(mut self, key: &'static str, value: impl Into<String>) -> Call {
        self.query.push((key, value.into()));
        self
    }
    /// "GET os-services", for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    /// Whether sending this call twice does no more than sending it once
    /// (HTTP's idempotent methods). A POST (a server action, an aggregate
    /// change) is not: it is never sent again on an unknown outcome.
    pub fn idempotent(&self) -> bool {
        matches!(
            self.method,
            http::Method::GET | http::Method::HEAD | http::Method::PUT | http::Method::DELETE
        )
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
    fn request_headers(&self) -> Option<&http::HeaderMap> {
        Some(&self.headers)
    }
    fn min_version(&self) -> Option<ApiVersion> {
        let (major, minor) = self.microversion.unwrap_or(match self.service {
            Service::Compute => COMPUTE_MICROVERSION,
            Service::Placement => PLACEMENT_MICROVERSION,
        });
        Some(ApiVersion::new(major, minor))
    }
}

impl Cloud {
    pub fn new(source: CloudSource, policy: HttpPolicy) -> Cloud {
        let user_agent =
            http::HeaderValue::from_static(concat!("hv-coordinator/", env!("CARGO_PKG_VERSION")));
        let in_flight = tokio::sync::Semaphore::new(policy.max_in_flight.max(1));
        Cloud {
            source,
            policy,
            session: Mutex::new(None),
            guard: None,
            observing: false,
            user_agent,
            metrics: Default::default(),
            in_flight,
        }
    }

    /// Names this replica in the User-Agent of every call (its lease identity).
    pub fn with_identity(mut self, identity: &str) -> Cloud {
        let ua = format!("hv-coordinator/{} ({identity})", env!("CARGO_PKG_VERSION"));
        if let Ok(v) = http::HeaderValue::from_str(&ua) {
            self.user_agent = v;
        }
        self
    }

    /// Counts every request sent, and Keystone's authentications, in `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::OpenStackCalls) -> Cloud {
        self.metrics = metrics;
        self
    }

    /// Sends no call that changes something (anything but GET): the install
    /// observes only (`--mode observe`).
    pub fn observing(mut self, on: bool) -> Cloud {
        self.observing = on;
        self
    }

    /// Sends no call unless `guard` says this replica holds the leader
    /// lease with margin to spare.
    pub fn with_lease_guard(mut self, guard: Arc<crate::k8s::leader::LeaseGuard>) -> Cloud {
        self.guard = Some(guard);
        self
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

    /// Sends a call. A call that was not done (`Unavailable`) is sent
    /// again after a pause, a bounded number of times; an idempotent call
    /// whose outcome is unknown too. A POST whose outcome is unknown is
    /// returned as [`NovaError::Unknown`] for the caller to look at what
    /// happened: sending it again could do it twice. A rejected token (401,
    /// which Nova answers before doing anything) is renewed once.
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
                Err(e) if retry_allowed(&call, &e) && attempt < self.policy.attempts => {
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
        if self.observing && call.method != http::Method::GET {
            return Err(NovaError::Withheld(call.describe()));
        }
        // Never closed: the semaphore lives as long as the Cloud.
        let _turn = self.in_flight.acquire().await.map_err(|e| NovaError::Unavailable(e.to_string()))?;
        let session = self.session().await?;
        let what = call.describe();
        // Checked after the session (whose Keystone round may take long) and
        // right before the request leaves.
        if let Some(guard) = &self.guard {
            guard.ensure().map_err(|e| NovaError::NotLeader(format!("{what}: {e}")))?;
        }
        let mut call = call.clone();
        call.headers.insert(http::header::USER_AGENT, self.user_agent.clone());
        let started = std::time::Instant::now();
        let answer = raw(call.clone()).skip_error_check(true).query_async(session.as_ref()).await;
        let status = match &answer {
            Ok(rsp) => rsp.status().as_u16().to_string(),
            Err(e) => classify_call(e, &what, call.idempotent()).kind().to_string(),
        };
        let service = match call.service {
            Service::Compute => "compute",
            Service::Placement => "placement",
        };
        let operation = crate::metrics::operation(call.method.as_str(), &call.path);
        self.metrics.record(service, operation, status, started.elapsed());
        let rsp = answer.map_err(|e| classify_call(&e, &what, call.idempotent()))?;
        let status = rsp.status().as_u16();
        let body = String::from_utf8_lossy(rsp.body()).into_owned();
        tracing::debug!(call = %what, status, "openstack call");
        if !(200..300).contains(&status) {
            return Err(NovaError::from_status(status, &what, &body, call.idempotent()));
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
            .http_connect_timeout(self.policy.connect_timeout.min(self.policy.timeout))
            .connect();
        let started = std::time::Instant::now();
        let connected = connect.await.map_err(classify_connect);
        let status = connected.as_ref().map_or_else(|e| e.kind(), |_| "ok");
        self.metrics.record("identity", "authenticate".into(), status.into(), started.elapsed());
        let session = Arc::new(connected?);
        *slot = Some(session.clone());
        Ok(session)
    }
}

/// Whether a failed call may be sent again: when nothing was done, or when
/// doing it twice is the same as once.
fn retry_allowed(call: &Call, e: &NovaError) -> bool {
    match e {
        NovaError::Unavailable(_) => true,
        NovaError::Unknown(_) => call.idempotent(),
        _ => false,
    }
}

/// A call that got no HTTP answer, by the error's kind (never its text):
/// no connection means nothing was sent; a timeout or a broken connection
/// after sending leaves a change's outcome unknown; Keystone refusing a
/// fresh token is a rejection.
fn classify_call(e: &ApiError<RestError>, what: &str, idempotent: bool) -> NovaError {
    let text = format!("{what}: {e}");
    match e {
        ApiError::Client { source: RestError::Communication { source } } if source.is_connect() => {
            NovaError::Unavailable(text)
        }
        ApiError::Client { source: RestError::Communication { .. } } if idempotent => {
            NovaError::Unavailable(text)
        }
        ApiError::Client { source: RestError::Communication { .. } } => NovaError::Unknown(text),
        ApiError::Client { source: RestError::AuthError { source } } => classify_auth(source, text),
        ApiError::OpenStack { status, .. }
        | ApiError::OpenStackService { status, .. }
        | ApiError::OpenStackUnrecognized { status, .. } => {
            NovaError::from_status(status.as_u16(), what, &e.to_string(), idempotent)
        }
        ApiError::Catalog { .. } => NovaError::Config(text),
        _ => NovaError::Invalid(text),
    }
}

fn classify_auth(e: &openstack_sdk::AuthError, text: String) -> NovaError {
    use openstack_sdk::AuthError;
    match e {
        AuthError::Identity(id) if id.code >= 500 => NovaError::Unavailable(text),
        AuthError::Identity(_) | AuthError::AuthReceipt(_) => NovaError::Unauthorized(text),
        AuthError::AuthValueNotSupplied(_) | AuthError::PluginMalformedRequirement => NovaError::Config(text),
        _ => NovaError::Unavailable(text),
    }
}

/// Keystone said no (a wrong password is not transient) versus Keystone or
/// the network did not answer.
fn classify_connect(e: OpenStackError) -> NovaError {
    let text = format!("keystone: {e}");
    match &e {
        OpenStackError::Communication { .. } | OpenStackError::NoResponse {} => NovaError::Unavailable(text),
        OpenStackError::Http { status } if status.is_server_error() => NovaError::Unavailable(text),
        OpenStackError::Http { .. } => NovaError::Unauthorized(text),
        OpenStackError::AuthError { source } => classify_auth(source, text),
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn post_error(url: &str) -> ApiError<RestError> {
        let e = reqwest::Client::new().post(url).body("{}").send().await.expect_err("the call must fail");
        ApiError::Client { source: RestError::from(e) }
    }

    /// An observing install sends nothing but reads, whatever asks.
    #[tokio::test]
    async fn an_observing_cloud_withholds_every_call_but_a_get() {
        let nowhere =
            CloudSource::CloudsYaml { cloud: "none".into(), file: Some("/nonexistent/clouds.yaml".into()) };
        let cloud = Cloud::new(nowhere, HttpPolicy::default()).observing(true);
        for (method, path) in [
            (http::Method::PUT, "os-services/1"),
            (http::Method::POST, "servers/1/action"),
            (http::Method::DELETE, "os-services/1"),
        ] {
            let call = Call::with(Service::Compute, method.clone(), path, serde_json::json!({}));
            let e = cloud.call(call).await.unwrap_err();
            assert!(matches!(e, NovaError::Withheld(_)), "{method} {path}: {e}");
        }
        let read = cloud.call(Call::get(Service::Compute, "os-services")).await.unwrap_err();
        assert!(matches!(read, NovaError::Config(_)), "a read goes on (and meets the bad config): {read}");
    }

    #[tokio::test]
    async fn a_refused_connection_sent_nothing_whatever_its_url_says() {
        // A port bound then released: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/v2.1/401/403/os-services/401");
        let e = classify_call(&post_error(&url).await, "PUT os-services/401 (401 Unauthorized)", false);
        assert!(matches!(e, NovaError::Unavailable(_)), "{e}");
    }

    #[tokio::test]
    async fn a_connection_cut_after_the_request_left_leaves_a_change_unknown() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v2.1/servers/401/action", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await; // read the request, then hang up
            }
        });
        let e = classify_call(&post_error(&url).await, "POST servers/401/action", false);
        assert!(matches!(e, NovaError::Unknown(_)), "a live migration may have started: {e}");
        let e = classify_call(&post_error(&url).await, "GET servers/401", true);
        assert!(matches!(e, NovaError::Unavailable(_)), "a read is safe to ask again: {e}");
    }
}
