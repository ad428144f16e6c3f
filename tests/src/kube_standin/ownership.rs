//! Server-side apply with field ownership, as the API server does it for
//! the paths the project's clients use (docs of the API server: "Server-Side
//! Apply", field management):
//!
//! - an apply by manager M sets what it sends, and M owns those fields: the
//!   leaves, lists that are atomic, and each element of a list that merges
//!   by key (`x-kubernetes-list-type: map`, e.g. conditions by `type`);
//! - a field M applied before and omits now is **removed**, unless another
//!   manager owns it too;
//! - setting a field another applier owns to a different value is a 409
//!   conflict naming the field and its owner, unless the apply is forced;
//!   a forced apply takes the field over;
//! - the main resource and the `status` subresource are tracked apart.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// One step into an object: a field, or an element of a keyed list (by the
/// canonical JSON of its key fields).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Seg {
    Field(String),
    Item(String),
}

pub type FieldPath = Vec<Seg>;

/// Fields each applier owns, per (manager, is-status).
pub type Owners = BTreeMap<(String, bool), BTreeSet<FieldPath>>;

fn key_of(item: &Value, keys: &[String]) -> String {
    let k: Vec<Value> = keys.iter().map(|k| item.get(k).cloned().unwrap_or(Value::Null)).collect();
    serde_json::to_string(&k).unwrap_or_default()
}

/// The fields `v` sets, under `dotted` (the dot path used to find keyed lists).
pub fn fieldset(
    v: &Value,
    map_lists: &[(String, Vec<String>)],
    dotted: &str,
    prefix: &FieldPath,
    out: &mut BTreeSet<FieldPath>,
) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                let d = if dotted.is_empty() { k.clone() } else { format!("{dotted}.{k}") };
                let mut p = prefix.clone();
                p.push(Seg::Field(k.clone()));
                fieldset(child, map_lists, &d, &p, out);
            }
        }
        Value::Array(items) => match map_lists.iter().find(|(p, _)| p == dotted) {
            Some((_, keys)) => {
                for item in items {
                    let mut p = prefix.clone();
                    p.push(Seg::Item(key_of(item, keys)));
                    out.insert(p.clone());
                    if let Value::Object(m) = item {
                        for (k, child) in m {
                            let mut q = p.clone();
                            q.push(Seg::Field(k.clone()));
                            fieldset(child, map_lists, &format!("{dotted}.{k}"), &q, out);
                        }
                    }
                }
            }
            None => {
                out.insert(prefix.clone());
            }
        },
        _ => {
            out.insert(prefix.clone());
        }
    }
}

fn step<'a>(v: &'a Value, seg: &Seg, map_lists: &[(String, Vec<String>)], dotted: &str) -> Option<&'a Value> {
    match seg {
        Seg::Field(k) => v.get(k),
        Seg::Item(key) => {
            let keys = &map_lists.iter().find(|(p, _)| p == dotted)?.1;
            v.as_array()?.iter().find(|i| &key_of(i, keys) == key)
        }
    }
}

fn dotted_after(dotted: &str, seg: &Seg) -> String {
    match seg {
        Seg::Field(k) if dotted.is_empty() => k.clone(),
        Seg::Field(k) => format!("{dotted}.{k}"),
        Seg::Item(_) => dotted.to_string(),
    }
}

/// The value at `path`, if any.
pub fn get<'a>(v: &'a Value, path: &FieldPath, map_lists: &[(String, Vec<String>)]) -> Option<&'a Value> {
    let mut cur = v;
    let mut dotted = String::new();
    for seg in path {
        cur = step(cur, seg, map_lists, &dotted)?;
        dotted = dotted_after(&dotted, seg);
    }
    Some(cur)
}

/// Removes the field or keyed element at `path`; nothing when absent.
pub fn remove(v: &mut Value, path: &FieldPath, map_lists: &[(String, Vec<String>)]) {
    let Some((last, parents)) = path.split_last() else { return };
    let mut cur = v;
    let mut dotted = String::new();
    for seg in parents {
        let next = match seg {
            Seg::Field(k) => cur.get_mut(k),
            Seg::Item(key) => {
                let Some(keys) = map_lists.iter().find(|(p, _)| p == &dotted).map(|(_, k)| k.clone()) else {
                    return;
                };
                cur.as_array_mut().and_then(|a| a.iter_mut().find(|i| &key_of(i, &keys) == key))
            }
        };
        let Some(n) = next else { return };
        cur = n;
        dotted = dotted_after(&dotted, seg);
    }
    match last {
        Seg::Field(k) => {
            if let Some(o) = cur.as_object_mut() {
                o.remove(k);
            }
        }
        Seg::Item(key) => {
            let Some(keys) = map_lists.iter().find(|(p, _)| p == &dotted).map(|(_, k)| k.clone()) else {
                return;
            };
            if let Some(a) = cur.as_array_mut() {
                a.retain(|i| &key_of(i, &keys) != key);
            }
        }
    }
}

fn show(path: &FieldPath) -> String {
    path.iter()
        .map(|s| match s {
            Seg::Field(k) => format!(".{k}"),
            Seg::Item(k) => format!("[{k}]"),
        })
        .collect()
}

/// Who applies: a field manager, through the main resource or `/status`,
/// forced or not.
pub struct Applier<'a> {
    pub manager: &'a str,
    pub status: bool,
    pub force: bool,
}

/// What an apply of `applied` (the part it may change) does to `merged`
/// (the live object with `applied` merged in) and to the owners: the
/// conflicts (when not forced), else the fields to remove.
pub fn apply(
    owners: &mut Owners,
    by: &Applier<'_>,
    live: &Value,
    applied: &Value,
    merged: &mut Value,
    map_lists: &[(String, Vec<String>)],
) -> Result<(), String> {
    let (manager, status, force) = (by.manager, by.status, by.force);
    let mut mine = BTreeSet::new();
    fieldset(applied, map_lists, "", &Vec::new(), &mut mine);
    let me = (manager.to_string(), status);
    let mut conflicts = Vec::new();
    for ((other, st), fields) in owners.iter() {
        if (other.as_str(), *st) == (manager, status) || *st != status {
            continue;
        }
        for p in mine.intersection(fields) {
            let differs = get(live, p, map_lists) != get(applied, p, map_lists);
            // An element of a keyed list is the same element whatever its
            // fields say; only leaves conflict.
            if differs && !matches!(p.last(), Some(Seg::Item(_))) {
                conflicts.push(format!("conflict with \"{other}\": {}", show(p)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(format!("Apply failed with {} conflict(s): {}", conflicts.len(), conflicts.join("; ")));
    }
    if force {
        for ((other, st), fields) in owners.iter_mut() {
            if (other.as_str(), *st) != (manager, status) && *st == status {
                fields.retain(|p| {
                    matches!(p.last(), Some(Seg::Item(_)))
                        || !mine.contains(p)
                        || get(live, p, map_lists) == get(applied, p, map_lists)
                });
            }
        }
    }
    let before = owners.get(&me).cloned().unwrap_or_default();
    let owned_by_others: BTreeSet<FieldPath> =
        owners.iter().filter(|(k, _)| **k != me).flat_map(|(_, f)| f.iter().cloned()).collect();
    for p in before.difference(&mine) {
        if !owned_by_others.contains(p)
            && !owned_by_others.iter().any(|o| o.starts_with(p) && o.len() > p.len())
        {
            remove(merged, p, map_lists);
            // A map left empty by the removal goes too (nobody set it empty).
            let mut parent = p.clone();
            while parent.pop().is_some() && !parent.is_empty() {
                if get(merged, &parent, map_lists)
                    .is_some_and(|v| v.as_object().is_some_and(|o| o.is_empty()))
                {
                    remove(merged, &parent, map_lists);
                } else {
                    break;
                }
            }
        }
    }
    owners.insert(me, mine);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lists() -> Vec<(String, Vec<String>)> {
        vec![("status.conditions".into(), vec!["type".into()])]
    }

    #[test]
    fn paths_of_keyed_lists_name_their_elements() {
        let mut out = BTreeSet::new();
        fieldset(
            &json!({"status": {"conditions": [{"type": "A", "status": "True"}], "phase": "X"}}),
            &lists(),
            "",
            &Vec::new(),
            &mut out,
        );
        let shown: Vec<String> = out.iter().map(show).collect();
        assert_eq!(
            shown,
            vec![
                ".status.conditions[[\"A\"]]",
                ".status.conditions[[\"A\"]].status",
                ".status.conditions[[\"A\"]].type",
                ".status.phase"
            ]
        );
    }
}
