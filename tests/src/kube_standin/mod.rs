//! A stand-in for the Kubernetes API server, for tests and `make demo`.
//!
//! No kube-apiserver can be installed here (not in Debian, PyPI, npm or
//! crates, and there is no container engine), so this serves the subset of
//! the API that kube-rs clients, `kube::runtime::Controller` and `kubectl
//! get` use, over plain HTTP on 127.0.0.1, unchanged on their side.
//!
//! What it does:
//! - discovery: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/{group}/{version}`;
//! - get, list (label and field selectors), watch (from a resourceVersion,
//!   with bookmarks when asked, `timeoutSeconds`, and an `ERROR` event with
//!   410 Gone when the version is older than the retained history);
//! - create (with `generateName`), replace, delete; merge patch (RFC 7386),
//!   JSON patch (RFC 6902, `test` included) and server-side apply, on the
//!   main resource and on `/status`;
//! - the status subresource: writes to the main resource never change
//!   status, writes to `/status` change nothing else; `metadata.generation`
//!   moves only when something outside metadata and status changes;
//! - finalizers and `deletionTimestamp`: a delete with finalizers marks the
//!   object, the last finalizer removed deletes it;
//! - optimistic concurrency: a write carrying a stale `resourceVersion` is
//!   409 Conflict; errors are `Status` objects with reason and code;
//! - Nodes, Pods, Namespaces, Events (core and events.k8s.io), Leases
//!   (coordination.k8s.io) and every CRD in `deploy/crds/`.
//!
//! Limits (what a real API server does and this one does not):
//! - strategic merge patch is rejected (415): use merge or JSON patch;
//! - server-side apply merges the applied object into the live one (maps
//!   recursively, lists replaced whole, except `x-kubernetes-list-type: map`
//!   lists of the CRDs, merged by key); it tracks no field ownership, so it
//!   never reports conflicts and never removes fields a manager stopped applying;
//! - no schema validation, defaulting, pruning, CEL rules, admission or
//!   webhooks (the CEL rules are tested with kube-cel in `tests/tests/crds.rs`);
//! - no OpenAPI document: `kubectl apply` needs `--validate=false`
//!   (`kubectl get` works, with the CRDs' printer columns as a Table);
//! - no authentication or authorization; no pagination (`limit` is ignored,
//!   lists are whole); namespaces need not exist;
//! - no garbage collection by owner references;
//! - the watch history keeps the last 10,000 events.

mod resources;
mod server;
mod store;

pub use resources::ResourceType;
pub use server::StandIn;
