//! HTTP in front of the store: routing of Kubernetes API paths, discovery,
//! and the verbs. One `tokio::sync::Mutex` guards the store; watches read
//! the history and subscribe under that lock, so no event falls in between.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::{Mutex, broadcast, mpsc};

use super::audit::{Access, Audit};
use super::resources::{self, ResourceType};
use super::store::{ApiError, Key, Part, Store, WatchEvent};

type Body = BoxBody<Bytes, Infallible>;

/// A running stand-in. Dropping it stops the server.
pub struct StandIn {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    /// Serve the built-in resources and the CRDs in `crd_dir` on `addr`
    /// (port 0 picks a free one).
    pub async fn start(crd_dir: &Path, addr: SocketAddr) -> Result<StandIn, String> {
        Self::start_with_history(crd_dir, addr, 10_000).await
    }

    /// As [`start`](Self::start), keeping only `history` watch events (so
    /// that tests can reach 410 Gone quickly).
    pub async fn start_with_history(
        crd_dir: &Path,
        addr: SocketAddr,
        history: usize,
    ) -> Result<StandIn, String> {
        Self::start_recording(crd_dir, addr, history, None).await
    }

    /// As [`start_with_history`](Self::start_with_history), recording who
    /// asked for what in `audit` (see [`super::audit`]).
    pub async fn start_recording(
        crd_dir: &Path,
        addr: SocketAddr,
        history: usize,
        audit: Option<std::path::PathBuf>,
    ) -> Result<StandIn, String> {
        let audit = Arc::new(Audit::to(audit));
        let mut types = resources::builtins();
        types.extend(resources::from_crd_dir(crd_dir)?);
        let store = Arc::new(Mutex::new(Store::new(types, history)));
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("binding {addr}: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let limits = hv_listen::Limits { max_connections: 1024, ..Default::default() };
        let task = tokio::spawn(hv_listen::accept_loop(listener, limits, move |req| {
            let (store, audit) = (store.clone(), audit.clone());
            async move {
                match handle(store, &audit, req).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                }
            }
        }));
        Ok(StandIn { addr, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kube client for this server (namespace `default`).
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        let uri = self.url().parse::<http::Uri>().map_err(|e| kube::Error::Service(Box::new(e)))?;
        kube::Client::try_from(kube::Config::new(uri))
    }
}

fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    r
}

fn error(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.body())
}

/// A parsed resource path.
struct Target {
    resource: usize,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// `pods/{name}/eviction`.
    eviction: bool,
}

enum Route {
    Version,
    CoreVersions,
    Groups,
    Resources { group: String, version: String },
    Object(Target),
}

fn route(store: &Store, path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return Ok(Route::Version),
        ["api"] => return Ok(Route::CoreVersions),
        ["apis"] => return Ok(Route::Groups),
        ["api", v] => return Ok(Route::Resources { group: String::new(), version: v.to_string() }),
        ["apis", g, v] => return Ok(Route::Resources { group: g.to_string(), version: v.to_string() }),
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("the server could not find the requested resource ({path})"),
            ));
        }
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..] => (Some(ns.to_string()), {
            let mut v = vec![*plural];
            v.extend_from_slice(tail);
            v
        }),
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return Err(ApiError::new(404, "NotFound", format!("no route for {path}"))),
    };
    let resource = store
        .types
        .iter()
        .position(|t| t.group == group && t.version == version && t.plural == plural)
        .ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!("the server doesn't have a resource type \"{plural}\" in {group}/{version}"),
            )
        })?;
    let rt = &store.types[resource];
    match sub {
        None => {}
        Some("status") if rt.status_subresource => {}
        Some("eviction") if rt.group.is_empty() && rt.plural == "pods" => {}
        Some(s) => return Err(ApiError::new(404, "NotFound", format!("{plural} has no subresource {s}"))),
    }
    if rt.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::new(
            404,
            "NotFound",
            format!("{plural} is namespaced: use /namespaces/NS/{plural}/{{name}}"),
        ));
    }
    if !rt.namespaced && namespace.is_some() {
        return Err(ApiError::new(404, "NotFound", format!("{plural} is cluster-scoped")));
    }
    Ok(Route::Object(Target {
        resource,
        namespace,
        name,
        status: sub == Some("status"),
        eviction: sub == Some("eviction"),
    }))
}

fn query(req: &Request<Incoming>) -> BTreeMap<String, String> {
    req.uri()
        .query()
        .map(|q| {
            q.split('&')
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (percent_decode(k), percent_decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                    }
                    _ => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Equality-based label selectors (`a=b`, `a==b`, `a!=b`, `a`, `!a`) and
/// `metadata.name` / `metadata.namespace` field selectors.
fn matches(obj: &Value, labels: Option<&str>, fields: Option<&str>) -> bool {
    let label = |k: &str| obj.pointer("/metadata/labels").and_then(|l| l.get(k)).and_then(Value::as_str);
    for term in labels.unwrap_or("").split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let ok = if let Some((k, v)) = term.split_once("!=") {
            label(k.trim()) != Some(v.trim())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            label(k.trim()) == Some(v.trim())
        } else if let Some(k) = term.strip_prefix('!') {
            label(k.trim()).is_none()
        } else {
            label(term).is_some()
        };
        if !ok {
            return false;
        }
    }
    for term in fields.unwrap_or("").split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let (k, v, eq) = match term.split_once("!=") {
            Some((k, v)) => (k, v, false),
            None => match term.split_once("==").or_else(|| term.split_once('=')) {
                Some((k, v)) => (k, v, true),
                None => return false,
            },
        };
        let have =
            obj.pointer(&format!("/{}", k.trim().replace('.', "/"))).and_then(Value::as_str).unwrap_or("");
        if (have == v.trim()) != eq {
            return false;
        }
    }
    true
}

async fn handle(
    store: Arc<Mutex<Store>>,
    audit: &Audit,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let q = query(&req);
    let user = super::audit::user(req.headers());
    let table =
        req.headers().get("accept").and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("as=Table"));
    let method = req.method().clone();
    let ctype = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let path = req.uri().path().to_string();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Ok(error(&ApiError::new(400, "BadRequest", format!("reading the body: {e}")))),
    };
    let route = {
        let s = store.lock().await;
        route(&s, &path)
    };
    let route = match route {
        Ok(r) => r,
        Err(e) => return Ok(error(&e)),
    };
    if let Route::Object(t) = &route {
        let rt = &store.lock().await.types[t.resource];
        let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
        audit.record(Access {
            user,
            verb: super::audit::verb(&method, t.name.is_some(), watch).into(),
            group: rt.group.clone(),
            resource: rt.plural.clone(),
            subresource: match (t.status, t.eviction) {
                (true, _) => "status".into(),
                (_, true) => "eviction".into(),
                _ => String::new(),
            },
            namespace: t.namespace.clone().unwrap_or_default(),
            name: t.name.clone().unwrap_or_default(),
        });
    }
    let resp = match route {
        Route::Version => json_response(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-hv-standin", "platform": "linux/amd64"}),
        ),
        Route::CoreVersions => json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        ),
        Route::Groups => groups(&*store.lock().await),
        Route::Resources { group, version } => resource_list(&*store.lock().await, &group, &version),
        Route::Object(t) if t.eviction => {
            let key =
                (t.resource, t.namespace.clone().unwrap_or_default(), t.name.clone().unwrap_or_default());
            match method {
                Method::POST => match super::eviction::evict(&store, &key, &body, &now()).await {
                    Ok((code, v)) => json_response(code, &v),
                    Err(e) => error(&e),
                },
                m => error(&ApiError::new(405, "MethodNotAllowed", format!("{m} on pods/eviction"))),
            }
        }
        Route::Object(t) => match (method, t.name.is_some()) {
            (Method::GET, false) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
                watch(store, t, &q).await
            }
            (Method::GET, false) if table => {
                let s = store.lock().await;
                let items = selected(&s, &t, &q);
                json_response(200, &as_table(&s.types[t.resource], &items, s.resource_version()))
            }
            (Method::GET, true) if table => {
                let s = store.lock().await;
                let key =
                    (t.resource, t.namespace.clone().unwrap_or_default(), t.name.clone().unwrap_or_default());
                match s.get(&key) {
                    Ok(o) => json_response(200, &as_table(&s.types[t.resource], &[o], s.resource_version())),
                    Err(e) => error(&e),
                }
            }
            (Method::GET, false) => list(&*store.lock().await, &t, &q),
            (m, _) => match object_verb(&store, &t, &m, &ctype, &body, &q).await {
                Ok((code, v)) => json_response(code, &v),
                Err(e) => error(&e),
            },
        },
    };
    Ok(resp)
}

fn groups(s: &Store) -> Response<Body> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in s.types.iter().filter(|t| !t.group.is_empty()) {
        let vs = seen.entry(t.group.clone()).or_default();
        if !vs.contains(&t.version) {
            vs.push(t.version.clone());
        }
    }
    let groups: Vec<Value> = seen
        .iter()
        .map(|(g, vs)| {
            let versions: Vec<Value> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json_response(200, &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
}

fn resource_list(s: &Store, group: &str, version: &str) -> Response<Body> {
    let mut resources = Vec::new();
    for t in s.types.iter().filter(|t| t.group == group && t.version == version) {
        resources.push(json!({"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "shortNames": t.short_names, "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}));
        if t.status_subresource {
            resources.push(
                json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if t.group.is_empty() && t.plural == "pods" {
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
    }
    if resources.is_empty() {
        return error(&ApiError::new(404, "NotFound", format!("no group version {group}/{version}")));
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    json_response(
        200,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

fn selected(s: &Store, t: &Target, q: &BTreeMap<String, String>) -> Vec<Value> {
    s.list(t.resource, t.namespace.as_deref())
        .into_iter()
        .filter(|o| {
            matches(o, q.get("labelSelector").map(String::as_str), q.get("fieldSelector").map(String::as_str))
        })
        .collect()
}

/// A `meta.k8s.io/v1` Table, what `kubectl get` asks for to print columns.
fn as_table(rt: &ResourceType, items: &[Value], rv: u64) -> Value {
    let mut defs =
        vec![json!({"name": "Name", "type": "string", "format": "name", "description": "", "priority": 0})];
    for c in &rt.columns {
        defs.push(
            json!({"name": c.name, "type": c.type_, "format": "", "description": "", "priority": c.priority}),
        );
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![o.pointer("/metadata/name").cloned().unwrap_or(Value::Null)];
            for c in &rt.columns {
                let ptr = c.json_path.replace('.', "/");
                let v = o.pointer(&ptr).cloned().unwrap_or(Value::Null);
                cells.push(if c.type_ == "date" && !v.is_null() { age(&v) } else { v });
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": o.get("metadata").cloned().unwrap_or(Value::Null)}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": defs, "rows": rows})
}

fn age(v: &Value) -> Value {
    let Some(t) = v.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) else { return v.clone() };
    let secs = jiff::Timestamp::now().duration_since(t).as_secs().max(0);
    json!(match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    })
}

fn list(s: &Store, t: &Target, q: &BTreeMap<String, String>) -> Response<Body> {
    let rt = &s.types[t.resource];
    let items = selected(s, t, q);
    json_response(
        200,
        &json!({"kind": format!("{}List", rt.kind), "apiVersion": rt.api_version(),
        "metadata": {"resourceVersion": s.resource_version().to_string()}, "items": items}),
    )
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

async fn watch(store: Arc<Mutex<Store>>, t: Target, q: &BTreeMap<String, String>) -> Response<Body> {
    let labels = q.get("labelSelector").cloned();
    let fields = q.get("fieldSelector").cloned();
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = q.get("timeoutSeconds").and_then(|v| v.parse::<u64>().ok()).unwrap_or(1800);
    let from = q.get("resourceVersion").filter(|v| !v.is_empty() && *v != "0").map(|v| v.parse::<u64>());
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let keep = {
        let labels = labels.clone();
        let fields = fields.clone();
        let ns = t.namespace.clone();
        let resource = t.resource;
        move |e: &WatchEvent| {
            e.resource == resource
                && ns.as_ref().is_none_or(|n| *n == e.namespace)
                && matches(&e.object, labels.as_deref(), fields.as_deref())
        }
    };
    let (initial, sub, api_version, kind, mut last_rv) = {
        let s = store.lock().await;
        let rt = &s.types[t.resource];
        let initial: Result<Vec<(&'static str, Value)>, ApiError> = match from {
            None => Ok(s
                .list(t.resource, t.namespace.as_deref())
                .into_iter()
                .filter(|o| matches(o, labels.as_deref(), fields.as_deref()))
                .map(|o| ("ADDED", o))
                .collect()),
            Some(Err(_)) => Err(ApiError::new(400, "BadRequest", "resourceVersion is not a number")),
            Some(Ok(rv)) => s
                .since(t.resource, rv)
                .map(|evs| evs.into_iter().filter(&keep).map(|e| (e.kind, e.object)).collect()),
        };
        (initial, s.events.subscribe(), rt.api_version(), rt.kind.clone(), s.resource_version())
    };
    tokio::spawn(async move {
        let mut sub: broadcast::Receiver<WatchEvent> = sub;
        match initial {
            Ok(evs) => {
                for (k, o) in evs {
                    if tx.send(watch_line(k, &o)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(watch_line("ERROR", &e.body())).await;
                return;
            }
        }
        let deadline = tokio::time::sleep(Duration::from_secs(timeout));
        tokio::pin!(deadline);
        let every = Duration::from_secs(5);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = tick.tick(), if bookmarks => {
                    let bm = json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(watch_line("BOOKMARK", &bm)).await.is_err() { return; }
                }
                ev = sub.recv() => match ev {
                    Ok(e) => {
                        last_rv = e.rv;
                        if keep(&e) && tx.send(watch_line(e.kind, &e.object)).await.is_err() { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let gone = ApiError::new(410, "Expired", "the watch fell behind; relist");
                        let _ = tx.send(watch_line("ERROR", &gone.body())).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let stream =
        tokio_stream::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |b| Ok(Frame::data(b)));
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    r
}

/// A strategic merge patch directive anywhere in `v` (a key starting `$`).
fn has_directive(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, v)| k.starts_with('$') || has_directive(v)),
        Value::Array(a) => a.iter().any(has_directive),
        _ => false,
    }
}

async fn object_verb(
    store: &Mutex<Store>,
    t: &Target,
    method: &Method,
    ctype: &str,
    body: &Bytes,
    q: &BTreeMap<String, String>,
) -> Result<(u16, Value), ApiError> {
    let parse = || -> Result<Value, ApiError> {
        serde_json::from_slice(body)
            .or_else(|_| serde_norway::from_slice(body))
            .map_err(|e| ApiError::new(400, "BadRequest", format!("the body is not JSON or YAML: {e}")))
    };
    let part = if t.status { Part::Status } else { Part::Main };
    let ns = t.namespace.clone().unwrap_or_default();
    let mut s = store.lock().await;
    let key = |name: &str| -> Key { (t.resource, ns.clone(), name.to_string()) };
    match (method, &t.name) {
        (&Method::POST, None) => {
            let obj = parse()?;
            s.create(t.resource, &ns, obj, &now()).map(|v| (201, v))
        }
        (&Method::GET, Some(name)) => s.get(&key(name)).map(|v| (200, v)),
        (&Method::PUT, Some(name)) => {
            let obj = parse()?;
            if obj.pointer("/metadata/name").and_then(Value::as_str).is_some_and(|n| n != name) {
                return Err(ApiError::new(400, "BadRequest", "the name in the body does not match the URL"));
            }
            s.update(&key(name), obj, part).map(|v| (200, v))
        }
        (&Method::DELETE, Some(name)) => {
            // DeleteOptions in the body: propagationPolicy Orphan leaves the
            // dependents (Background and Foreground delete them).
            let orphan = serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|o| o.get("propagationPolicy").and_then(Value::as_str).map(|p| p == "Orphan"))
                .unwrap_or(false);
            s.delete(&key(name), &now(), orphan).map(|v| (200, v))
        }
        (&Method::PATCH, Some(name)) => {
            let k = key(name);
            let media = ctype.split(';').next().unwrap_or("").trim();
            match media {
                // kubectl cordon's patch: without directives (`$patch`,
                // `$setElementOrder`, ...) a strategic merge patch of maps is
                // a merge patch; lists would be replaced, not merged by key.
                "application/strategic-merge-patch+json" if !has_directive(&parse()?) => {
                    let mut doc = s.get(&k)?;
                    json_patch::merge(&mut doc, &parse()?);
                    s.update(&k, doc, part).map(|v| (200, v))
                }
                "application/merge-patch+json" => {
                    let mut doc = s.get(&k)?;
                    json_patch::merge(&mut doc, &parse()?);
                    s.update(&k, doc, part).map(|v| (200, v))
                }
                "application/json-patch+json" => {
                    let mut doc = s.get(&k)?;
                    let p: json_patch::Patch = serde_json::from_slice(body)
                        .map_err(|e| ApiError::new(400, "BadRequest", format!("not a JSON patch: {e}")))?;
                    json_patch::patch(&mut doc, &p)
                        .map_err(|e| ApiError::new(422, "Invalid", format!("JSON patch failed: {e}")))?;
                    s.update(&k, doc, part).map(|v| (200, v))
                }
                "application/apply-patch+yaml" => {
                    let Some(manager) = q.get("fieldManager").filter(|m| !m.is_empty()) else {
                        return Err(ApiError::new(
                            400,
                            "BadRequest",
                            "fieldManager is required for apply patch",
                        ));
                    };
                    let force = q.get("force").is_some_and(|f| f == "true");
                    s.apply(&k, parse()?, manager, force, part, &now())
                }
                "application/strategic-merge-patch+json" => Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "the hv Kubernetes stand-in does not implement strategic merge patch directives; use merge or JSON patch",
                )),
                other => Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("unsupported patch type {other:?}"),
                )),
            }
        }
        (m, None) => Err(ApiError::new(405, "MethodNotAllowed", format!("{m} on a collection"))),
        (m, Some(_)) => Err(ApiError::new(405, "MethodNotAllowed", format!("{m} on an object"))),
    }
}
