//! OVSDB's JSON encoding (RFC 7047 section 5.1): atoms, sets, maps, uuids.

use std::collections::BTreeMap;

use serde_json::Value;

/// `["uuid", "…"]` -> the uuid.
pub fn uuid(v: &Value) -> Option<&str> {
    match v.as_array().map(Vec::as_slice) {
        Some([tag, Value::String(u)]) if tag == "uuid" || tag == "named-uuid" => Some(u),
        _ => None,
    }
}

/// A set column: `["set", [a, b]]`, or a single bare atom (a one-element
/// set is sent without the wrapper), or `["set", []]` when empty.
pub fn set(v: &Value) -> Vec<&Value> {
    match v.as_array().map(Vec::as_slice) {
        Some([tag, Value::Array(items)]) if tag == "set" => items.iter().collect(),
        _ if v.is_null() => Vec::new(),
        _ => vec![v],
    }
}

/// A set of strings; a set column of optional strings is empty when unset.
pub fn string_set(v: &Value) -> Vec<String> {
    set(v).into_iter().filter_map(|a| a.as_str().map(str::to_string)).collect()
}

/// An optional string column (`["set", []]` when absent).
pub fn opt_string(v: &Value) -> Option<String> {
    string_set(v).into_iter().next()
}

/// A map column: `["map", [[k, v], …]]` with string keys and values.
pub fn string_map(v: &Value) -> BTreeMap<String, String> {
    match v.as_array().map(Vec::as_slice) {
        Some([tag, Value::Array(pairs)]) if tag == "map" => pairs
            .iter()
            .filter_map(|p| match p.as_array().map(Vec::as_slice) {
                Some([Value::String(k), Value::String(v)]) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// The uuids of a set-of-references column.
pub fn uuid_set(v: &Value) -> Vec<String> {
    set(v).into_iter().filter_map(|a| uuid(a).map(str::to_string)).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn sets_come_bare_wrapped_or_empty() {
        assert_eq!(string_set(&json!("br-int")), vec!["br-int"]);
        assert_eq!(string_set(&json!(["set", ["a", "b"]])), vec!["a", "b"]);
        assert!(string_set(&json!(["set", []])).is_empty());
        assert_eq!(opt_string(&json!(["set", []])), None);
        assert_eq!(opt_string(&json!("secure")), Some("secure".into()));
        assert_eq!(uuid_set(&json!(["uuid", "u1"])), vec!["u1"]);
        assert_eq!(uuid_set(&json!(["set", [["uuid", "u1"], ["uuid", "u2"]]])), vec!["u1", "u2"]);
    }

    #[test]
    fn maps_and_garbage() {
        let m = string_map(&json!(["map", [["a", "1"], ["b", "2"]]]));
        assert_eq!(m.get("b").map(String::as_str), Some("2"));
        assert!(string_map(&json!(["map", [["a"]]])).is_empty());
        assert!(string_map(&json!(42)).is_empty());
        assert_eq!(uuid(&json!(["uuid"])), None);
    }
}
