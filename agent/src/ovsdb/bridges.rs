//! The node's OVS bridges: what exists, the Testing-phase check, and a
//! monitor that reports changes without polling.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::client::{Client, OvsdbError};
use super::wire;

const DB: &str = "Open_vSwitch";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bridge {
    pub name: String,
    /// "system", "netdev", or empty (default).
    pub datapath_type: String,
    pub fail_mode: Option<String>,
    pub ports: Vec<String>,
    pub external_ids: BTreeMap<String, String>,
}

/// The outcome of checking one expected bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeCheck {
    pub bridge: String,
    pub optional: bool,
    pub passed: bool,
    pub message: String,
}

impl Client {
    /// Every bridge with its ports' names.
    pub async fn bridges(&self) -> Result<Vec<Bridge>, OvsdbError> {
        let res = self
            .transact(
                DB,
                vec![
                    json!({"op": "select", "table": "Bridge", "where": [],
                           "columns": ["name", "datapath_type", "fail_mode", "ports", "external_ids"]}),
                    json!({"op": "select", "table": "Port", "where": [], "columns": ["_uuid", "name"]}),
                ],
            )
            .await?;
        let rows = |i: usize| {
            res.get(i).and_then(|r| r.get("rows")).and_then(Value::as_array).cloned().unwrap_or_default()
        };
        let port_names: HashMap<String, String> = rows(1)
            .iter()
            .filter_map(|p| {
                Some((wire::uuid(p.get("_uuid")?)?.to_string(), p.get("name")?.as_str()?.to_string()))
            })
            .collect();
        let mut out: Vec<Bridge> = rows(0)
            .iter()
            .map(|b| {
                let get = |k: &str| b.get(k).cloned().unwrap_or(Value::Null);
                let mut ports: Vec<String> =
                    wire::uuid_set(&get("ports")).iter().filter_map(|u| port_names.get(u).cloned()).collect();
                ports.sort();
                Bridge {
                    name: get("name").as_str().unwrap_or_default().to_string(),
                    datapath_type: get("datapath_type").as_str().unwrap_or_default().to_string(),
                    fail_mode: wire::opt_string(&get("fail_mode")),
                    ports,
                    external_ids: wire::string_map(&get("external_ids")),
                }
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Watch the Bridge table: the current names, then a change per update.
    pub async fn watch_bridges(&self) -> Result<(Vec<String>, BridgeWatch), OvsdbError> {
        let (initial, rx) =
            self.monitor(DB, "hv-agent-bridges", json!({"Bridge": {"columns": ["name"]}})).await?;
        let mut names = HashMap::new();
        apply_updates(&mut names, &initial);
        let mut now: Vec<String> = names.values().cloned().collect();
        now.sort();
        Ok((now, BridgeWatch { names, rx }))
    }
}

/// Check the expected bridges against what exists.
pub fn check_bridges(existing: &[Bridge], required: &[String], optional: &[String]) -> Vec<BridgeCheck> {
    let find = |n: &str| existing.iter().find(|b| b.name == n);
    let describe = |b: &Bridge| {
        format!(
            "present (datapath {}, fail mode {}, {} port(s))",
            if b.datapath_type.is_empty() { "default" } else { &b.datapath_type },
            b.fail_mode.as_deref().unwrap_or("default"),
            b.ports.len()
        )
    };
    let mut out = Vec::new();
    for name in required {
        out.push(match find(name) {
            Some(b) => {
                BridgeCheck { bridge: name.clone(), optional: false, passed: true, message: describe(b) }
            }
            None => BridgeCheck {
                bridge: name.clone(),
                optional: false,
                passed: false,
                message: format!("bridge {name} does not exist in OVSDB"),
            },
        });
    }
    for name in optional.iter().filter(|o| !required.contains(o)) {
        out.push(match find(name) {
            Some(b) => {
                BridgeCheck { bridge: name.clone(), optional: true, passed: true, message: describe(b) }
            }
            None => BridgeCheck {
                bridge: name.clone(),
                optional: true,
                passed: true,
                message: format!("optional bridge {name} is absent"),
            },
        });
    }
    out
}

/// A bridge appeared or disappeared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BridgeChange {
    Added(String),
    Removed(String),
}

pub struct BridgeWatch {
    names: HashMap<String, String>,
    rx: mpsc::Receiver<Value>,
}

impl BridgeWatch {
    /// The next changes; None when the connection is gone.
    pub async fn next(&mut self) -> Option<Vec<BridgeChange>> {
        let updates = self.rx.recv().await?;
        let before = self.names.clone();
        apply_updates(&mut self.names, &updates);
        let mut changes = Vec::new();
        for (uuid, name) in &self.names {
            if !before.contains_key(uuid) {
                changes.push(BridgeChange::Added(name.clone()));
            }
        }
        for (uuid, name) in &before {
            if !self.names.contains_key(uuid) {
                changes.push(BridgeChange::Removed(name.clone()));
            }
        }
        Some(changes)
    }
}

fn apply_updates(names: &mut HashMap<String, String>, updates: &Value) {
    let Some(rows) = updates.get("Bridge").and_then(Value::as_object) else { return };
    for (uuid, row) in rows {
        match row.get("new").and_then(|n| n.get("name")).and_then(Value::as_str) {
            Some(name) => {
                names.insert(uuid.clone(), name.to_string());
            }
            None if row.get("new").is_none() => {
                names.remove(uuid);
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn br(name: &str) -> Bridge {
        Bridge {
            name: name.into(),
            datapath_type: "system".into(),
            fail_mode: Some("secure".into()),
            ports: vec![name.into()],
            external_ids: BTreeMap::new(),
        }
    }

    #[test]
    fn a_missing_required_bridge_fails_by_name_and_optional_ones_pass() {
        let checks =
            check_bridges(&[br("br-int")], &["br-int".into(), "br-ex".into()], &["br-provider".into()]);
        assert!(checks[0].passed && checks[0].message.contains("fail mode secure"));
        assert!(!checks[1].passed);
        assert_eq!(checks[1].message, "bridge br-ex does not exist in OVSDB");
        assert!(checks[2].passed && checks[2].optional);
    }

    #[test]
    fn updates_add_and_remove_rows() {
        let mut names = HashMap::new();
        apply_updates(
            &mut names,
            &json!({"Bridge": {"u1": {"new": {"name": "br-int"}}, "u2": {"new": {"name": "br-ex"}}}}),
        );
        assert_eq!(names.len(), 2);
        apply_updates(&mut names, &json!({"Bridge": {"u2": {"old": {"name": "br-ex"}}}}));
        assert_eq!(names.values().collect::<Vec<_>>(), vec!["br-int"]);
        apply_updates(&mut names, &json!({"Other": {}}));
        assert_eq!(names.len(), 1);
    }
}
