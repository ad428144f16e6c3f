//! What each client asked of the API, as RBAC sees it: (user, verb, API
//! group, resource, subresource, namespace), the user being the bearer
//! token the client's kubeconfig carries. Written to a file (one JSON line per tuple
//! not seen before by this stand-in), so that every stand-in of a test run
//! adds to one record, from which the chart's RBAC is checked
//! (`hv_tests::rbac`).

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;

use http::Method;

/// One kind of request, as an RBAC rule names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Access {
    pub user: String,
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// The namespace the request named; empty for a cluster-scoped resource
    /// or a request across all namespaces (only a ClusterRole grants those).
    #[serde(default)]
    pub namespace: String,
    /// The object's name; empty for a request on a collection.
    #[serde(default)]
    pub name: String,
}

/// The RBAC verb of a request on a resource (`named`: on one object).
pub fn verb(method: &Method, named: bool, watch: bool) -> &'static str {
    match (method.as_str(), named) {
        ("GET", _) if watch => "watch",
        ("GET" | "HEAD", true) => "get",
        ("GET" | "HEAD", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

/// Where the record goes, and what this stand-in already wrote.
#[derive(Debug, Default)]
pub struct Audit {
    file: Option<PathBuf>,
    seen: Mutex<HashSet<Access>>,
}

impl Audit {
    /// Appends to `file` (None: records nothing).
    pub fn to(file: Option<PathBuf>) -> Audit {
        Audit { file, seen: Mutex::default() }
    }

    pub fn record(&self, access: Access) {
        let Some(file) = &self.file else { return };
        let new = self.seen.lock().map(|mut s| s.insert(access.clone())).unwrap_or(false);
        if !new {
            return;
        }
        // One short line per write with O_APPEND: lines of processes writing
        // at once do not interleave.
        if let (Ok(mut f), Ok(line)) =
            (std::fs::OpenOptions::new().create(true).append(true).open(file), serde_json::to_string(&access))
        {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// The user of a request: its bearer token, or "anonymous".
pub fn user(headers: &http::HeaderMap) -> String {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map_or_else(|| "anonymous".to_string(), str::to_string)
}

/// Every access recorded in `file`.
pub fn read(file: &std::path::Path) -> Vec<Access> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
