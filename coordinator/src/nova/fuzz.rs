//! Fuzzing, bounded, of everything that reads Nova's and Placement's
//! answers: each answer type parsed from arbitrary JSON and from a real
//! answer with one field replaced by arbitrary JSON, error bodies,
//! timestamps, and the room arithmetic over whatever inventory numbers
//! Placement gives. `HV_FUZZ_CASES` cases per harness (default 10,000):
//! nothing may panic; a parse is a value or a typed error.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::capacity::{AggregateRow, Inventory, ProviderRow};
use super::error::NovaError;
use super::host::{Aggregate, ComputeService, HypervisorRef, Provider, ProviderTraits, ServerRef};
use super::http::field;
use super::servers::{NovaMigration, Progress, ServerDetail, parse_nova_time};

fn cases() -> ProptestConfig {
    let n = std::env::var("HV_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,16}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_:-]{1,10}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Every answer type, from `v` under `key`.
fn parse_all(v: &Value) {
    let _ = field::<Vec<ComputeService>>(v.clone(), "services", "x");
    let _ = field::<Vec<HypervisorRef>>(v.clone(), "hypervisors", "x");
    let _ = field::<Vec<Aggregate>>(v.clone(), "aggregates", "x");
    let _ = field::<Vec<AggregateRow>>(v.clone(), "aggregates", "x");
    let _ = field::<Vec<Provider>>(v.clone(), "resource_providers", "x");
    let _ = field::<Vec<ProviderRow>>(v.clone(), "resource_providers", "x");
    let _ = serde_json::from_value::<ProviderTraits>(v.clone());
    let _ = field::<Vec<ServerRef>>(v.clone(), "servers", "x");
    if let Ok(servers) = field::<Vec<ServerDetail>>(v.clone(), "servers", "x") {
        for s in servers {
            let srv = s.into_server();
            assert!(srv.host.as_deref() != Some(""), "an empty host is no host");
        }
    }
    let _ = field::<Vec<NovaMigration>>(v.clone(), "migrations", "x");
    let _ = field::<Vec<Progress>>(v.clone(), "migrations", "x");
    if let Ok(inv) = field::<std::collections::BTreeMap<String, Inventory>>(v.clone(), "inventories", "x") {
        for i in inv.values() {
            let _ = i.room(7);
        }
    }
}

fn real_server() -> Value {
    json!({"servers": [{
        "id": "u1", "name": "vm", "OS-EXT-SRV-ATTR:host": "compute-1", "status": "ACTIVE", "locked": false,
        "metadata": {"hypervisor.cloud.sap:eviction": "live"}, "pinned_availability_zone": "az1", "tenant_id": "p",
        "image": {"id": "i"},
        "flavor": {"ram": 2048, "vcpus": 2, "disk": 20, "ephemeral": 0, "swap": "", "extra_specs": {"trait:CUSTOM_X": "required"}}
    }], "migrations": [{"id": 1, "status": "running", "instance_uuid": "u1", "created_at": "2026-11-23T11:00:00.000000"}],
       "inventories": {"MEMORY_MB": {"total": 8192, "reserved": 512, "allocation_ratio": 1.5, "max_unit": 8192}}})
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn nova_and_placement_answers_never_panic_on_arbitrary_json(v in json(), key in prop::sample::select(vec![
        "services", "hypervisors", "aggregates", "resource_providers", "servers", "migrations", "inventories", "traits",
    ])) {
        parse_all(&v);
        parse_all(&json!({ key: v }));
        parse_all(&json!({ key: [v] }));
    }

    #[test]
    fn a_real_answer_with_any_field_replaced_never_panics(path in prop::sample::select(vec![
        "/servers/0/flavor", "/servers/0/flavor/ram", "/servers/0/flavor/swap", "/servers/0/flavor/extra_specs",
        "/servers/0/flavor/disk", "/servers/0/flavor/ephemeral", "/servers/0/flavor/vcpus",
        "/servers/0/image", "/servers/0/OS-EXT-SRV-ATTR:host", "/servers/0/metadata", "/servers/0",
        "/migrations/0/status", "/migrations/0/created_at", "/migrations/0/id",
        "/inventories/MEMORY_MB/allocation_ratio", "/inventories/MEMORY_MB/total", "/inventories/MEMORY_MB/reserved",
    ]), with in json()) {
        let mut v = real_server();
        if let Some(slot) = v.pointer_mut(path) {
            *slot = with;
        }
        parse_all(&v);
    }

    #[test]
    fn error_bodies_and_timestamps_never_panic(status in any::<u16>(), body in ".{0,300}", idem in any::<bool>(), t in ".{0,40}") {
        let e = NovaError::from_status(status, "GET servers", &body, idem);
        prop_assert!(e.to_string().len() < 800, "the message is cut short");
        let _ = parse_nova_time(&t);
    }

    #[test]
    fn room_never_overflows_and_never_exceeds_capacity(total in any::<u64>(), reserved in any::<u64>(), ratio in any::<f64>(), max_unit in any::<u64>(), used in any::<u64>()) {
        let r = crate::eviction::preflight::room(total, reserved, ratio, max_unit, used);
        if (0.0..=1.0).contains(&ratio) {
            prop_assert!(r.free <= total.saturating_sub(reserved), "{r:?}");
        }
        if !ratio.is_finite() || ratio <= 0.0 {
            prop_assert_eq!(r.free, 0, "no room from a nonsense ratio");
        }
    }
}
