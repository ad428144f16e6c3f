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
        Ok(bridges_from(&res))
    }

    /// The `external_ids` of the Open_vSwitch table's (single) row.
    pub async fn system_external_ids(&self) -> Result<BTreeMap<String, String>, OvsdbError> {
        let res = self
            .transact(DB, vec![json!({"op": "select", "table": "Open_vSwitch", "where": [], "columns": ["external_ids"]})])
            .await?;
        let row = res
            .first()
            .and_then(|r| r.get("rows"))
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .cloned();
        Ok(row.and_then(|r| r.get("external_ids").map(wire::string_map)).unwrap_or_default())
    }

    /// Watch the Bridge table's names, fail modes and datapath types: the
    /// bridges now, then the bridges after each change.
    pub async fn watch_bridges(&self) -> Result<(Vec<Bridge>, BridgeWatch), OvsdbError> {
        let columns = json!({"Bridge": {"columns": ["name", "fail_mode", "datapath_type"]}});
        let (initial, rx) = self.monitor(DB, "hv-agent-bridges", columns).await?;
        let mut rows = HashMap::new();
        apply_updates(&mut rows, &initial);
        let watch = BridgeWatch { rows, rx };
        Ok((watch.bridges(), watch))
    }
}

/// The bridges, with their ports' names, from the answer to the two selects
/// of [`Client::bridges`]. Pure (fuzzed): anything malformed is skipped or
/// empty, never a panic.
pub fn bridges_from(res: &[Value]) -> Vec<Bridge> {
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
    out
}

/// What a bridge must look like beyond existing (from `CheckConfig`).
/// Empty fields are not checked; `"*"` as an external_ids value accepts any
/// non-empty value.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expectation {
    pub bridge: String,
    pub fail_mode: String,
    pub datapath_type: String,
    pub ports: Vec<String>,
    pub external_ids: BTreeMap<String, String>,
}

impl From<&hv_proto::v1::BridgeExpectation> for Expectation {
    fn from(e: &hv_proto::v1::BridgeExpectation) -> Self {
        Expectation {
            bridge: e.bridge.clone(),
            fail_mode: e.fail_mode.clone(),
            datapath_type: e.datapath_type.clone(),
            ports: e.ports.clone(),
            external_ids: e.external_ids.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        }
    }
}

/// The default expectation of an integration bridge: fail mode `secure`.
/// Standalone turns `br-int` into a learning switch as soon as its
/// controller is gone, which bridges traffic between tenants.
pub fn default_expectations() -> Vec<Expectation> {
    vec![Expectation { bridge: "br-int".into(), fail_mode: "secure".into(), ..Default::default() }]
}

/// Why a present bridge does not meet its expectation, one entry per field:
/// "fail_mode: wanted secure, found standalone".
pub fn mismatches(b: &Bridge, want: &Expectation) -> Vec<String> {
    let mut out = Vec::new();
    let found_mode = b.fail_mode.as_deref().unwrap_or("");
    if !want.fail_mode.is_empty() && found_mode != want.fail_mode {
        out.push(format!("fail_mode: wanted {}, found {}", want.fail_mode, or_unset(found_mode)));
    }
    // OVSDB stores "" for the default datapath, which is "system".
    let dp = |d: &str| if d.is_empty() { "system".to_string() } else { d.to_string() };
    if !want.datapath_type.is_empty() && dp(&b.datapath_type) != dp(&want.datapath_type) {
        out.push(format!("datapath_type: wanted {}, found {}", want.datapath_type, dp(&b.datapath_type)));
    }
    for p in want.ports.iter().filter(|p| !b.ports.contains(p)) {
        out.push(format!("ports: wanted {p}, found {}", or_unset(&b.ports.join(","))));
    }
    out.extend(external_id_mismatches("external_ids", &b.external_ids, &want.external_ids));
    out
}

/// Keys of `want` that `found` lacks or holds with another value.
pub fn external_id_mismatches(
    field: &str,
    found: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> Vec<String> {
    want.iter()
        .filter_map(|(k, v)| {
            let have = found.get(k).map(String::as_str).unwrap_or("");
            let ok = if v == "*" { !have.is_empty() } else { have == v };
            (!ok).then(|| {
                let wanted = if v == "*" { "any value".to_string() } else { v.clone() };
                format!("{field}:{k}: wanted {wanted}, found {}", or_unset(have))
            })
        })
        .collect()
}

fn or_unset(s: &str) -> &str {
    if s.is_empty() { "(unset)" } else { s }
}

/// Check the expected bridges against what exists: presence, then each
/// expectation. A failure names the bridge, the field, the wanted and the
/// found value. An expectation for a bridge in neither list checks it when
/// present.
pub fn check_bridges(
    existing: &[Bridge],
    required: &[String],
    optional: &[String],
    expectations: &[Expectation],
) -> Vec<BridgeCheck> {
    let find = |n: &str| existing.iter().find(|b| b.name == n);
    let describe = |b: &Bridge| {
        format!(
            "present (datapath {}, fail mode {}, {} port(s))",
            if b.datapath_type.is_empty() { "default" } else { &b.datapath_type },
            b.fail_mode.as_deref().unwrap_or("default"),
            b.ports.len()
        )
    };
    let judge = |name: &String, is_optional: bool| -> BridgeCheck {
        let Some(b) = find(name) else {
            let message = if is_optional {
                format!("optional bridge {name} is absent")
            } else {
                format!("bridge {name} does not exist in OVSDB")
            };
            return BridgeCheck { bridge: name.clone(), optional: is_optional, passed: is_optional, message };
        };
        let wrong: Vec<String> =
            expectations.iter().filter(|e| &e.bridge == name).flat_map(|e| mismatches(b, e)).collect();
        if wrong.is_empty() {
            BridgeCheck { bridge: name.clone(), optional: is_optional, passed: true, message: describe(b) }
        } else {
            let message = format!("bridge {name}: {}", wrong.join("; "));
            BridgeCheck { bridge: name.clone(), optional: is_optional, passed: false, message }
        }
    };
    let mut names: Vec<(&String, bool)> = required.iter().map(|n| (n, false)).collect();
    for name in optional.iter().chain(expectations.iter().map(|e| &e.bridge)) {
        if !names.iter().any(|(n, _)| *n == name) {
            names.push((name, true));
        }
    }
    names.into_iter().map(|(n, opt)| judge(n, opt)).collect()
}

/// The Bridge table as the monitor sees it. Its rows carry the watched
/// columns only: `ports` and `external_ids` are empty (ports come and go
/// with the VMs; watching them would wake the agent for every VM).
pub struct BridgeWatch {
    rows: HashMap<String, Bridge>,
    rx: mpsc::Receiver<Value>,
}

impl BridgeWatch {
    /// The bridges after the next change; None when the connection is gone.
    pub async fn next(&mut self) -> Option<Vec<Bridge>> {
        let updates = self.rx.recv().await?;
        apply_updates(&mut self.rows, &updates);
        Some(self.bridges())
    }

    fn bridges(&self) -> Vec<Bridge> {
        let mut out: Vec<Bridge> = self.rows.values().cloned().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// Folds a monitor's `table-updates` into the bridges by row uuid: a row
/// with `new` is inserted or replaced (a modify's `new` carries every
/// monitored column), one without is deleted. Pure (fuzzed): a row without
/// a name, or an update that is not an object, is ignored.
pub fn apply_updates(rows: &mut HashMap<String, Bridge>, updates: &Value) {
    let Some(table) = updates.get("Bridge").and_then(Value::as_object) else { return };
    for (uuid, row) in table {
        let Some(row) = row.as_object() else { continue };
        match row.get("new") {
            None => {
                rows.remove(uuid);
            }
            Some(new) => {
                let Some(name) = new.get("name").and_then(Value::as_str) else { continue };
                let get = |k: &str| new.get(k).cloned().unwrap_or(Value::Null);
                let bridge = Bridge {
                    name: name.to_string(),
                    datapath_type: get("datapath_type").as_str().unwrap_or_default().to_string(),
                    fail_mode: wire::opt_string(&get("fail_mode")),
                    ports: Vec::new(),
                    external_ids: BTreeMap::new(),
                };
                rows.insert(uuid.clone(), bridge);
            }
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
        let checks = check_bridges(
            &[br("br-int")],
            &["br-int".into(), "br-ex".into()],
            &["br-provider".into()],
            &default_expectations(),
        );
        assert!(checks[0].passed && checks[0].message.contains("fail mode secure"));
        assert!(!checks[1].passed);
        assert_eq!(checks[1].message, "bridge br-ex does not exist in OVSDB");
        assert!(checks[2].passed && checks[2].optional);
    }

    #[test]
    fn updates_add_modify_and_remove_rows() {
        let mut rows = HashMap::new();
        apply_updates(
            &mut rows,
            &json!({"Bridge": {
                "u1": {"new": {"name": "br-int", "fail_mode": "secure", "datapath_type": ""}},
                "u2": {"new": {"name": "br-ex", "fail_mode": ["set", []], "datapath_type": "netdev"}}}}),
        );
        assert_eq!(rows["u1"].fail_mode.as_deref(), Some("secure"));
        assert_eq!((rows["u2"].fail_mode.as_deref(), rows["u2"].datapath_type.as_str()), (None, "netdev"));
        apply_updates(
            &mut rows,
            &json!({"Bridge": {"u1": {"old": {"fail_mode": "secure"},
                                      "new": {"name": "br-int", "fail_mode": "standalone", "datapath_type": ""}}}}),
        );
        assert_eq!(rows["u1"].fail_mode.as_deref(), Some("standalone"));
        apply_updates(&mut rows, &json!({"Bridge": {"u2": {"old": {"name": "br-ex"}}}}));
        assert_eq!(rows.values().map(|b| b.name.as_str()).collect::<Vec<_>>(), vec!["br-int"]);
        apply_updates(&mut rows, &json!({"Bridge": {"u3": {"new": {"fail_mode": "secure"}}}, "Other": {}}));
        assert_eq!(rows.len(), 1, "a row without a name is ignored");
    }

    #[test]
    fn each_mismatch_names_the_bridge_the_field_the_wanted_and_the_found_value() {
        let mut standalone = br("br-int");
        standalone.fail_mode = Some("standalone".into());
        standalone.datapath_type = String::new();
        let want = Expectation {
            bridge: "br-int".into(),
            fail_mode: "secure".into(),
            datapath_type: "netdev".into(),
            ports: vec!["patch-tun".into()],
            external_ids: BTreeMap::from([("bridge-id".to_string(), "*".to_string())]),
        };
        let checks =
            check_bridges(&[standalone.clone()], &["br-int".into()], &[], std::slice::from_ref(&want));
        assert!(!checks[0].passed);
        assert_eq!(
            checks[0].message,
            "bridge br-int: fail_mode: wanted secure, found standalone; datapath_type: wanted netdev, found system; \
             ports: wanted patch-tun, found br-int; external_ids:bridge-id: wanted any value, found (unset)"
        );
        // Unset fail mode is not secure either.
        standalone.fail_mode = None;
        assert_eq!(
            mismatches(&standalone, &default_expectations()[0]),
            vec!["fail_mode: wanted secure, found (unset)".to_string()]
        );
        // "" and "system" are the same datapath.
        let sys =
            Expectation { bridge: "br-int".into(), datapath_type: "system".into(), ..Default::default() };
        assert!(mismatches(&standalone, &sys).is_empty());
    }

    #[test]
    fn an_expectation_on_an_unlisted_bridge_checks_it_when_present() {
        let want = Expectation { bridge: "br-ex".into(), fail_mode: "secure".into(), ..Default::default() };
        let checks = check_bridges(&[], &[], &[], std::slice::from_ref(&want));
        assert!(checks[0].passed && checks[0].optional, "absent: like an optional bridge");
        let mut ex = br("br-ex");
        ex.fail_mode = Some("standalone".into());
        let checks = check_bridges(&[ex], &[], &[], &[want]);
        assert!(!checks[0].passed, "{:?}", checks[0]);
    }

    #[test]
    fn system_external_ids_match_exactly_or_by_presence() {
        let found = BTreeMap::from([("ovn-bridge-mappings".to_string(), "physnet1:br-ex".to_string())]);
        let want = BTreeMap::from([
            ("ovn-bridge-mappings".to_string(), "*".to_string()),
            ("ovn-encap-type".to_string(), "geneve".to_string()),
        ]);
        assert_eq!(
            external_id_mismatches("external_ids", &found, &want),
            vec!["external_ids:ovn-encap-type: wanted geneve, found (unset)".to_string()]
        );
        let exact = BTreeMap::from([("ovn-bridge-mappings".to_string(), "physnet2:br-ex".to_string())]);
        assert_eq!(
            external_id_mismatches("external_ids", &found, &exact),
            vec!["external_ids:ovn-bridge-mappings: wanted physnet2:br-ex, found physnet1:br-ex".to_string()]
        );
    }
}
