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
//! - server-side apply with field ownership per field manager (`ownership`):
//!   a field a manager applied and omits now is removed unless another
//!   owns it, keyed lists (`x-kubernetes-list-type: map`) merge by key and
//!   their elements are owned one by one, another applier's field is a 409
//!   conflict unless forced, and forcing takes it over;
//! - the garbage collector: when an object goes, the objects whose
//!   ownerReferences name it are deleted (their finalizers respected) once
//!   no other owner of theirs is left (the reference to the gone owner is
//!   removed while one is), or orphaned with `propagationPolicy: Orphan`;
//! - the status subresource: writes to the main resource never change
//!   status, writes to `/status` change nothing else; `metadata.generation`
//!   moves only when something outside metadata and status changes;
//! - finalizers and `deletionTimestamp`: a delete with finalizers marks the
//!   object, the last finalizer removed deletes it;
//! - optimistic concurrency: a write carrying a stale `resourceVersion` is
//!   409 Conflict; errors are `Status` objects with reason and code;
//! - the `eviction` subresource of pods (`eviction`): the validating
//!   webhooks registered for it called over HTTPS with a real
//!   `AdmissionReview` (built from kube's own admission types), then the pod's PodDisruptionBudget, then the
//!   delete; listed in discovery, so `kubectl drain` evicts rather than
//!   deletes;
//! - strategic merge patch without directives, as a merge patch (what
//!   `kubectl cordon` and `uncordon` send);
//! - Nodes, Pods, Namespaces, Secrets, Events (core and events.k8s.io),
//!   Leases (coordination.k8s.io), PodDisruptionBudgets (policy),
//!   DaemonSets and StatefulSets (apps; stored, not run),
//!   ValidatingWebhookConfigurations and every CRD in `deploy/crds/`.
//!
//! Limits (what a real API server does and this one does not):
//! - a Secret is stored as written: `stringData` is not folded into `data`
//!   (tests write `data`), and nothing is encrypted at rest;
//! - a strategic merge patch with directives (`$patch`, `$setElementOrder`,
//!   ...) is rejected (415), and one without replaces lists where the API
//!   server would merge them by key: use merge or JSON patch;
//! - evictions: only webhooks with `clientConfig.url` are called (not a
//!   service), `namespaceSelector`, `objectSelector` and `matchConditions`
//!   are not read; a budget's allowed disruptions are computed at each
//!   eviction from its pods' Ready conditions (no disruption controller, no
//!   `status` written, `unhealthyPodEvictionPolicy` ignored; the API server
//!   honours `maxUnavailable` only for pods of controllers with a scale
//!   subresource and allows no disruption for others, such as a DaemonSet's,
//!   where this computes it the same for all: a budget of 0 is 0 either
//!   way), the webhook's answer is not matched to its request's `uid`, and an
//!   evicted pod is deleted at once (no grace period); nothing runs the pods
//!   of a DaemonSet or StatefulSet;
//! - apply tracks only appliers: fields changed by non-apply writes (PUT,
//!   merge and JSON patch) keep their apply owner, where the API server would
//!   record an `Update` manager; metadata (labels, annotations) is not
//!   tracked; `managedFields` is not shown in objects;
//! - no schema validation, defaulting, pruning, CEL rules, admission or
//!   webhooks but for evictions (the CEL rules are tested with kube-cel in
//!   `tests/tests/crds.rs`);
//! - no OpenAPI document: `kubectl apply` needs `--validate=false`
//!   (`kubectl get` works, with the CRDs' printer columns as a Table);
//! - no authentication or authorization; no pagination (`limit` is ignored,
//!   lists are whole); namespaces need not exist;
//! - the garbage collector runs at once, in the request that removes the
//!   owner; `Foreground` deletion behaves like `Background`, and
//!   `blockOwnerDeletion` is ignored; an object created with an owner
//!   reference to an object that does not exist is kept (the API server's
//!   collector would delete it as dangling);
//! - the watch history keeps the last 10,000 events.

pub mod audit;
mod eviction;
mod ownership;
mod resources;
mod server;
mod store;

pub use resources::ResourceType;
pub use server::StandIn;
