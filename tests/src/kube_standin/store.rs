//! The stand-in's state: objects, resource versions and the event history,
//! with the API server's object semantics (see the module doc in `mod.rs`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::ownership::{self, Owners};
use super::resources::ResourceType;

/// A `Status` error, as the API server sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into() }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{}.{} \"{name}\" not found", rt.plural, rt.group))
    }

    pub fn body(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

/// Object key: resource index in the table, namespace ("" if cluster-scoped), name.
pub type Key = (usize, String, String);

#[derive(Debug, Clone)]
pub struct WatchEvent {
    pub rv: u64,
    pub resource: usize,
    pub namespace: String,
    pub kind: &'static str,
    pub object: Value,
}

pub struct Store {
    pub types: Vec<ResourceType>,
    objects: BTreeMap<Key, Value>,
    /// Who applied which fields of each object (`ownership`).
    owners: BTreeMap<Key, Owners>,
    /// Objects deleted with `propagationPolicy: Orphan` while finalizers
    /// held them: their dependents are orphaned, not deleted, when they go.
    orphaning: BTreeSet<Key>,
    rv: u64,
    history: VecDeque<WatchEvent>,
    /// The oldest resourceVersion from which a watch can still resume.
    oldest: u64,
    uid_seq: u64,
    history_limit: usize,
    pub events: broadcast::Sender<WatchEvent>,
}

/// Which part of an object a write may change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
}

impl Store {
    pub fn new(types: Vec<ResourceType>, history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(4096);
        Store {
            types,
            objects: BTreeMap::new(),
            owners: BTreeMap::new(),
            orphaning: BTreeSet::new(),
            rv: 1,
            history: VecDeque::new(),
            oldest: 1,
            uid_seq: 0,
            history_limit: history_limit.max(1),
            events,
        }
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn get(&self, key: &Key) -> Result<Value, ApiError> {
        self.objects.get(key).cloned().ok_or_else(|| ApiError::not_found(&self.types[key.0], &key.2))
    }

    pub fn list(&self, resource: usize, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, ns, _), _)| *r == resource && namespace.is_none_or(|n| n == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Events after `rv` for a resource, or Gone when they are no longer kept.
    pub fn since(&self, resource: usize, rv: u64) -> Result<Vec<WatchEvent>, ApiError> {
        if rv + 1 < self.oldest {
            return Err(ApiError::new(
                410,
                "Expired",
                format!("too old resource version: {rv} ({})", self.oldest),
            ));
        }
        Ok(self.history.iter().filter(|e| e.resource == resource && e.rv > rv).cloned().collect())
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn emit(&mut self, resource: usize, namespace: &str, kind: &'static str, object: Value, rv: u64) {
        let ev = WatchEvent { rv, resource, namespace: namespace.to_string(), kind, object };
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.oldest = old.rv + 1;
            }
        }
        let _ = self.events.send(ev);
    }

    pub fn create(
        &mut self,
        resource: usize,
        namespace: &str,
        mut obj: Value,
        now: &str,
    ) -> Result<Value, ApiError> {
        let rt = self.types[resource].clone();
        let meta = metadata_mut(&mut obj)?;
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) => {
                    self.uid_seq += 1;
                    format!("{prefix}{:05x}", self.uid_seq)
                }
                None => return Err(ApiError::new(422, "Invalid", "metadata.name: Required value")),
            },
        };
        let key = (resource, namespace.to_string(), name.clone());
        if self.objects.contains_key(&key) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{}.{} \"{name}\" already exists", rt.plural, rt.group),
            ));
        }
        self.uid_seq += 1;
        let rv = self.bump();
        let meta = metadata_mut(&mut obj)?;
        meta.insert("name".into(), json!(name));
        if rt.namespaced {
            meta.insert("namespace".into(), json!(namespace));
        }
        meta.insert("uid".into(), json!(format!("00000000-0000-4000-8000-{:012x}", self.uid_seq)));
        meta.insert("creationTimestamp".into(), json!(now));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        set_type_meta(&mut obj, &rt);
        self.objects.insert(key, obj.clone());
        self.emit(resource, namespace, "ADDED", obj.clone(), rv);
        Ok(obj)
    }

    /// Replace `key` with `new` as a write to `part`: the other part keeps
    /// its live value, server-owned metadata is kept, a stale
    /// resourceVersion is a conflict.
    pub fn update(&mut self, key: &Key, mut new: Value, part: Part) -> Result<Value, ApiError> {
        let rt = self.types[key.0].clone();
        let live = self.get(key)?;
        if let Some(rv) = new.pointer("/metadata/resourceVersion").and_then(Value::as_str) {
            let live_rv = live.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("");
            if !rv.is_empty() && rv != live_rv {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {}.{} \"{}\": the object has been modified; \
                         please apply your changes to the latest version and try again",
                        rt.plural, rt.group, key.2
                    ),
                ));
            }
        }
        if !new.is_object() {
            return Err(ApiError::new(400, "BadRequest", "the body is not an object"));
        }
        // Status isolation.
        if rt.status_subresource {
            match part {
                Part::Main => copy_field(&live, &mut new, "status"),
                Part::Status => {
                    let status = new.get("status").cloned();
                    new = live.clone();
                    match status {
                        Some(s) => new["status"] = s,
                        None => {
                            if let Some(o) = new.as_object_mut() {
                                o.remove("status");
                            }
                        }
                    }
                }
            }
        }
        // Server-owned metadata.
        for field in ["uid", "creationTimestamp", "deletionTimestamp", "namespace", "name", "generation"] {
            let v = live.pointer(&format!("/metadata/{field}")).cloned();
            let meta = metadata_mut(&mut new)?;
            match v {
                Some(v) => meta.insert(field.into(), v),
                None => meta.remove(field),
            };
        }
        if part == Part::Main && spec_changed(&live, &new) {
            let g = live.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(1) + 1;
            metadata_mut(&mut new)?.insert("generation".into(), json!(g));
        }
        set_type_meta(&mut new, &rt);
        if new == live {
            return Ok(live); // a no-op write: no new version, no event
        }
        let rv = self.bump();
        metadata_mut(&mut new)?.insert("resourceVersion".into(), json!(rv.to_string()));
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let no_finalizers =
            new.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
        if deleting && no_finalizers {
            self.objects.remove(key);
            self.emit(key.0, &key.1, "DELETED", new.clone(), rv);
            let orphan = self.orphaning.remove(key);
            self.collect_garbage(key, &new, orphan, now_of(&new));
            return Ok(new);
        }
        self.objects.insert(key.clone(), new.clone());
        self.emit(key.0, &key.1, "MODIFIED", new.clone(), rv);
        Ok(new)
    }

    /// Delete, or mark for deletion while finalizers remain. Its dependents
    /// (objects whose ownerReferences name it) are deleted when it goes, or
    /// orphaned (the reference removed) when `orphan`.
    pub fn delete(&mut self, key: &Key, now: &str, orphan: bool) -> Result<Value, ApiError> {
        let mut live = self.get(key)?;
        let finalizers =
            live.pointer("/metadata/finalizers").and_then(Value::as_array).is_some_and(|f| !f.is_empty());
        if finalizers {
            if orphan {
                self.orphaning.insert(key.clone());
            }
            if live.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(live);
            }
            let rv = self.bump();
            let meta = metadata_mut(&mut live)?;
            meta.insert("deletionTimestamp".into(), json!(now));
            meta.insert("resourceVersion".into(), json!(rv.to_string()));
            self.objects.insert(key.clone(), live.clone());
            self.emit(key.0, &key.1, "MODIFIED", live.clone(), rv);
            return Ok(live);
        }
        let rv = self.bump();
        self.objects.remove(key);
        metadata_mut(&mut live)?.insert("resourceVersion".into(), json!(rv.to_string()));
        self.emit(key.0, &key.1, "DELETED", live.clone(), rv);
        self.collect_garbage(key, &live, orphan, now);
        Ok(live)
    }

    /// The garbage collector, for an owner that is gone: each dependent
    /// (ownerReferences naming its uid) is deleted in the background (its
    /// own finalizers respected, its own dependents after it), or orphaned.
    /// Like the API server's, it runs after the owner is removed; unlike it,
    /// at once and in the same call.
    fn collect_garbage(&mut self, owner_key: &Key, owner: &Value, orphan: bool, now: &str) {
        self.owners.remove(owner_key);
        let Some(uid) = owner.pointer("/metadata/uid").and_then(Value::as_str).map(str::to_string) else {
            return;
        };
        let dependents: Vec<Key> = self
            .objects
            .iter()
            .filter(|(_, v)| {
                v.pointer("/metadata/ownerReferences").and_then(Value::as_array).is_some_and(|refs| {
                    refs.iter().any(|r| r.get("uid").and_then(Value::as_str) == Some(uid.as_str()))
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for dep in dependents {
            let Ok(mut obj) = self.get(&dep) else { continue };
            // As the API server's collector: a dependent goes only when none
            // of its owners is left; while one is, only the reference to the
            // gone owner is removed.
            if orphan || self.has_another_owner(&obj, &uid) {
                if let Some(refs) = obj.pointer_mut("/metadata/ownerReferences").and_then(Value::as_array_mut)
                {
                    refs.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
                }
                let _ = self.update(&dep, obj, Part::Main);
            } else {
                let _ = self.delete(&dep, now, false);
            }
        }
    }

    /// Whether `obj` names an owner other than `gone` that still exists.
    fn has_another_owner(&self, obj: &Value, gone: &str) -> bool {
        let refs = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array);
        refs.into_iter().flatten().filter_map(|r| r.get("uid").and_then(Value::as_str)).any(|uid| {
            uid != gone
                && self
                    .objects
                    .values()
                    .any(|o| o.pointer("/metadata/uid").and_then(Value::as_str) == Some(uid))
        })
    }

    /// Server-side apply of `applied` by `manager` to `part` of the object
    /// (created when missing), with field ownership (`ownership`).
    pub fn apply(
        &mut self,
        key: &Key,
        applied: Value,
        manager: &str,
        force: bool,
        part: Part,
        now: &str,
    ) -> Result<(u16, Value), ApiError> {
        let rt = self.types[key.0].clone();
        let status = part == Part::Status;
        // The part an apply may change: status through /status, the rest
        // (not status, when it is a subresource) through the object.
        let mut mine = applied.clone();
        if let Some(o) = mine.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
            o.remove("metadata");
            if status {
                o.retain(|k, _| k == "status");
            } else if rt.status_subresource {
                o.remove("status");
            }
        }
        if !self.contains(key) {
            if status {
                return Err(ApiError::not_found(&rt, &key.2));
            }
            let mut obj = applied;
            obj["metadata"]["name"] = json!(key.2);
            let created = self.create(key.0, &key.1, obj, now)?;
            let owners = self.owners.entry(key.clone()).or_default();
            let mut merged = created.clone();
            let by = ownership::Applier { manager, status, force: true };
            let _ = ownership::apply(owners, &by, &Value::Null, &mine, &mut merged, &rt.map_lists);
            return Ok((201, created));
        }
        let live = self.get(key)?;
        let mut merged = apply_merge(&live, &applied, &rt.map_lists, "");
        let owners = self.owners.entry(key.clone()).or_default();
        let mut trial = owners.clone();
        let by = ownership::Applier { manager, status, force };
        ownership::apply(&mut trial, &by, &live, &mine, &mut merged, &rt.map_lists)
            .map_err(|m| ApiError::new(409, "Conflict", m))?;
        // Apply carries no precondition unless the applied object names a version.
        if applied.pointer("/metadata/resourceVersion").is_none() {
            merged["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
        }
        let out = self.update(key, merged, part)?;
        self.owners.insert(key.clone(), trial);
        Ok((200, out))
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.objects.contains_key(key)
    }
}

/// `deletionTimestamp` of an object, for dependents deleted with it.
fn now_of(obj: &Value) -> &str {
    obj.pointer("/metadata/deletionTimestamp").and_then(Value::as_str).unwrap_or("1970-01-01T00:00:00Z")
}

fn metadata_mut(obj: &mut Value) -> Result<&mut Map<String, Value>, ApiError> {
    let o =
        obj.as_object_mut().ok_or_else(|| ApiError::new(400, "BadRequest", "the body is not an object"))?;
    let meta = o.entry("metadata").or_insert_with(|| json!({}));
    meta.as_object_mut().ok_or_else(|| ApiError::new(400, "BadRequest", "metadata is not an object"))
}

fn set_type_meta(obj: &mut Value, rt: &ResourceType) {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(rt.api_version()));
        o.insert("kind".into(), json!(rt.kind));
    }
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    if let Some(o) = to.as_object_mut() {
        match from.get(field) {
            Some(v) => o.insert(field.into(), v.clone()),
            None => o.remove(field),
        };
    }
}

/// Anything outside metadata and status changed: the "spec" in the broad sense.
fn spec_changed(live: &Value, new: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            for f in ["metadata", "status", "apiVersion", "kind"] {
                o.remove(f);
            }
        }
        v
    };
    strip(live) != strip(new)
}

/// Server-side apply, simplified: `applied` is merged into `live` (maps
/// recursively, lists replaced, except the map-lists named in `map_lists`,
/// merged by their keys).
pub fn apply_merge(live: &Value, applied: &Value, map_lists: &[(String, Vec<String>)], path: &str) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            let mut out = l.clone();
            for (k, v) in a {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                let merged = match l.get(k) {
                    Some(lv) => apply_merge(lv, v, map_lists, &p),
                    None => v.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(a)) => match map_lists.iter().find(|(p, _)| p == path) {
            Some((_, keys)) => {
                let key_of = |v: &Value| {
                    keys.iter().map(|k| v.get(k).cloned().unwrap_or(Value::Null)).collect::<Vec<_>>()
                };
                let mut out = l.clone();
                for item in a {
                    match out.iter_mut().find(|x| key_of(x) == key_of(item)) {
                        Some(x) => *x = apply_merge(x, item, map_lists, path),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
            None => applied.clone(),
        },
        _ => applied.clone(),
    }
}
