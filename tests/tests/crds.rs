//! The CRD YAML in `deploy/crds/` is what the API server will load: it must
//! parse as apiextensions.k8s.io/v1 objects, be structural, carry the status
//! subresource and the printer columns, match the Rust types exactly (no
//! hand edits), and its CEL rules must accept and refuse what they claim to.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use hv_coordinator::api;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use serde_json::{Value, json};

fn committed() -> BTreeMap<String, (String, CustomResourceDefinition)> {
    let dir = hv_tests::repo_root().join("deploy/crds");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("deploy/crds exists") {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let crd: CustomResourceDefinition = serde_norway::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not a v1 CustomResourceDefinition: {e}", path.display()));
        out.insert(crd.metadata.name.clone().unwrap(), (text, crd));
    }
    out
}

#[test]
fn committed_yaml_is_exactly_what_the_types_generate() {
    let files = committed();
    let generated = api::crds();
    assert_eq!(files.len(), generated.len(), "one file per CRD, no strays");
    for crd in generated {
        let name = crd.metadata.name.clone().unwrap();
        let (text, _) =
            files.get(&name).unwrap_or_else(|| panic!("deploy/crds/{name}.yaml missing; run `make crds`"));
        let want = api::crd_yaml(&crd).unwrap();
        if *text != want {
            let end = std::iter::repeat("<end of file>");
            let (n, (have, should)) = text
                .lines()
                .chain(end.clone())
                .zip(want.lines().chain(end))
                .enumerate()
                .find(|(_, (a, b))| a != b)
                .unwrap();
            panic!(
                "deploy/crds/{name}.yaml drifted from the Rust types; run `make crds`.\n\
                 first difference at line {}:\n  committed: {have}\n  generated: {should}",
                n + 1
            );
        }
    }
}

/// Kubernetes' structural schema rules, as far as they matter here: every
/// node has a type (unless it preserves unknown fields or is int-or-string),
/// and nothing uses the constructs a structural schema forbids at the root.
fn assert_structural(path: &str, s: &JSONSchemaProps) {
    let escaped =
        s.x_kubernetes_preserve_unknown_fields == Some(true) || s.x_kubernetes_int_or_string == Some(true);
    assert!(s.type_.is_some() || escaped, "{path}: no type");
    assert!(s.ref_path.is_none(), "{path}: $ref is not allowed");
    for (k, v) in s.properties.iter().flatten() {
        assert_structural(&format!("{path}.{k}"), v);
    }
    if let Some(items) = &s.items {
        match items {
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrArray::Schema(i) => {
                assert_structural(&format!("{path}[]"), i)
            }
            other => panic!("{path}: tuple items are not structural: {other:?}"),
        }
    }
    for sub in [&s.all_of, &s.any_of, &s.one_of].into_iter().flatten().flatten() {
        assert!(sub.type_.is_none() || sub.type_ == s.type_, "{path}: a type inside allOf/anyOf/oneOf");
    }
}

#[test]
fn crds_are_structural_with_status_and_columns() {
    for (name, (_, crd)) in committed() {
        assert_eq!(crd.spec.scope, "Cluster", "{name}");
        assert_eq!(crd.spec.versions.len(), 1, "{name}");
        let v = &crd.spec.versions[0];
        assert!(v.served && v.storage, "{name}");
        assert!(
            v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
            "{name}: status subresource"
        );
        let schema = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("schema");
        assert_structural(&name, schema);
        let props = schema.properties.as_ref().expect("properties");
        assert!(props.contains_key("spec") && props.contains_key("status"), "{name}");
        let cols: Vec<&str> =
            v.additional_printer_columns.iter().flatten().map(|c| c.name.as_str()).collect();
        assert!(cols.contains(&"Phase") && cols.contains(&"Age"), "{name}: {cols:?}");
    }
    let hv = &committed()["hypervisors.hypervisor.cloud.sap"].1;
    assert_eq!(hv.spec.names.short_names.as_deref(), Some(&["hv".to_string()][..]));
    let cols: Vec<String> =
        hv.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
    for want in ["Phase", "Maintenance", "Instances", "Agent", "Age"] {
        assert!(cols.iter().any(|c| c == want), "Hypervisor column {want} missing: {cols:?}");
    }
    let ev = &committed()["evictions.hypervisor.cloud.sap"].1;
    let cols: Vec<String> =
        ev.spec.versions[0].additional_printer_columns.iter().flatten().map(|c| c.name.clone()).collect();
    for want in ["Node", "Reason", "Phase", "Migrated", "Age"] {
        assert!(cols.iter().any(|c| c == want), "Eviction column {want} missing: {cols:?}");
    }
}

#[test]
fn conditions_merge_per_type_under_server_side_apply() {
    let hv = &committed()["hypervisors.hypervisor.cloud.sap"].1;
    let schema = hv.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap();
    let status = &schema.properties.as_ref().unwrap()["status"];
    let conds = &status.properties.as_ref().unwrap()["conditions"];
    assert_eq!(conds.x_kubernetes_list_type.as_deref(), Some("map"));
    assert_eq!(conds.x_kubernetes_list_map_keys.as_deref(), Some(&["type".to_string()][..]));
}

// ------------------------------------------------------------------ CEL

fn schema_of(crd: &str) -> Value {
    let (_, c) = &committed()[crd];
    serde_json::to_value(c.spec.versions[0].schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap())
        .unwrap()
}

fn check(crd: &str, obj: Value, old: Option<Value>) -> Result<(), String> {
    kube_cel::Validator::new().validate(&schema_of(crd), &obj, old.as_ref()).map_err(|e| e.to_string())
}

fn hv(spec: Value) -> Value {
    json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"}, "spec": spec})
}

const HV: &str = "hypervisors.hypervisor.cloud.sap";

#[test]
fn cel_manual_maintenance_needs_a_reason() {
    let err = check(HV, hv(json!({"maintenance": "manual"})), None).unwrap_err();
    assert!(err.contains("maintenanceReason is required"), "{err}");
    check(HV, hv(json!({"maintenance": "manual", "maintenanceReason": "firmware"})), None).unwrap();
    check(HV, hv(json!({"maintenance": "auto"})), None).unwrap();
    check(HV, hv(json!({})), None).unwrap();
}

#[test]
fn cel_termination_cannot_be_undone() {
    let old = hv(json!({"maintenance": "termination"}));
    for new in ["", "manual", "auto", "ha"] {
        let obj = hv(json!({"maintenance": new, "maintenanceReason": "x"}));
        let err = check(HV, obj, Some(old.clone())).unwrap_err();
        assert!(err.contains("cannot be undone"), "{new}: {err}");
    }
    check(HV, hv(json!({"maintenance": "termination", "skipTests": true})), Some(old)).unwrap();
    // Entering termination, or leaving other modes, is fine.
    check(HV, hv(json!({"maintenance": "termination"})), Some(hv(json!({"maintenance": "auto"})))).unwrap();
    check(HV, hv(json!({"maintenance": ""})), Some(hv(json!({"maintenance": "auto"})))).unwrap();
}

#[test]
fn cel_custom_traits_must_be_custom() {
    check(HV, hv(json!({"customTraits": ["CUSTOM_HANA", "CUSTOM_GPU_A100"]})), None).unwrap();
    for bad in ["HW_CPU_X86_AVX2", "custom_lower", "CUSTOM_", "CUSTOM_A-B"] {
        let err = check(HV, hv(json!({"customTraits": [bad]})), None).unwrap_err();
        assert!(err.contains("customTraits"), "{bad}: {err}");
    }
}

#[test]
fn cel_eviction_target_is_immutable() {
    let ev = |h: &str| {
        json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction", "metadata": {"name": "e"},
               "spec": {"hypervisor": h, "reason": "AdminRequest"}})
    };
    let crd = "evictions.hypervisor.cloud.sap";
    check(crd, ev("node-1"), None).unwrap();
    check(crd, ev("node-1"), Some(ev("node-1"))).unwrap();
    let err = check(crd, ev("node-2"), Some(ev("node-1"))).unwrap_err();
    assert!(err.contains("immutable"), "{err}");
}

#[test]
fn cel_eviction_reason_is_immutable_and_force_names_known_checks() {
    let ev = |reason: &str, force: Value| {
        json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction", "metadata": {"name": "e"},
               "spec": {"hypervisor": "node-1", "reason": reason, "options": {"force": force}}})
    };
    let crd = "evictions.hypervisor.cloud.sap";
    check(crd, ev("AdminRequest", json!(["capacity", "constraints"])), None).unwrap();
    let err = check(crd, ev("RollingUpdate", json!([])), Some(ev("AdminRequest", json!([])))).unwrap_err();
    assert!(err.contains("spec.reason is immutable"), "{err}");
    let err =
        check(crd, ev("AdminRequest", json!(["capcity"])), Some(ev("AdminRequest", json!([])))).unwrap_err();
    assert!(err.contains("force entries"), "{err}");
    let bare = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction", "metadata": {"name": "e"},
                      "spec": {"hypervisor": "node-1", "reason": "AdminRequest"}});
    check(crd, bare, None).unwrap();
}

#[test]
fn typed_round_trip_of_a_full_hypervisor() {
    let obj = json!({
        "apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "node-1"},
        "spec": {"aggregates": ["az-a"], "customTraits": ["CUSTOM_HANA"], "maintenance": "ha"},
        "status": {"phase": "Active", "instances": {"count": 2, "ids": ["a", "b"]},
                   "lifecycle": {"testRun": 3, "appliedAggregates": ["az-a"]}}
    });
    let h: api::Hypervisor = serde_json::from_value(obj).unwrap();
    assert_eq!(h.spec.maintenance, api::MaintenanceMode::Ha);
    assert_eq!(h.spec.libvirt.minimum_version, "8.0.0", "defaults apply when absent");
    assert_eq!(h.spec.ovs.expectations[0].bridge, "br-int", "br-int expected secure by default");
    assert_eq!(h.spec.ovs.bridges, vec!["br-int", "br-ex"]);
    let st = h.status.unwrap();
    assert_eq!(st.phase, Some(api::Phase::Active));
    assert_eq!(st.lifecycle.test_run, 3);
    // An unknown phase is a clear deserialization error, not a panic.
    let bad = json!({"apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Hypervisor", "metadata": {"name": "n"},
                     "spec": {}, "status": {"phase": "Exploded"}});
    let err = serde_json::from_value::<api::Hypervisor>(bad).unwrap_err().to_string();
    assert!(err.contains("Exploded"), "{err}");
}
