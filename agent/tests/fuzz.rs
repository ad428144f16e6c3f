//! Fuzzing, bounded, of every parser that takes the agent's outside input:
//! the OVSDB stream decoder and message classifier, OVSDB's JSON encoding
//! and the Bridge rows, libvirt's XML, and the coordinator's messages. Each
//! harness is a proptest run of `HV_FUZZ_CASES` cases (default 10,000) over
//! arbitrary bytes, arbitrary JSON and mutated real inputs: nothing may
//! panic, valid input must survive being cut anywhere, and what comes out
//! stays bounded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;

use hv_agent::libvirt::xml;
use hv_agent::ovsdb::{self, Decoder, Incoming, wire};
use proptest::prelude::*;
use prost::Message;
use serde_json::Value;

fn cases() -> ProptestConfig {
    let n = std::env::var("HV_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// Arbitrary JSON, a few levels deep.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![Just("uuid"), Just("set"), Just("map"), Just("named-uuid"), Just("echo"), Just("update")]
            .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("method".to_string()),
                    Just("params".to_string()),
                    Just("id".to_string()),
                    Just("result".to_string()),
                    Just("error".to_string()),
                    Just("rows".to_string()),
                    Just("name".to_string()),
                    Just("_uuid".to_string()),
                    Just("ports".to_string()),
                    Just("new".to_string()),
                    Just("Bridge".to_string()),
                    "[a-z_]{1,8}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn ovsdb_decoder_never_panics_on_arbitrary_bytes_cut_anywhere(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut d = Decoder::default();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        at.sort();
        let mut last = 0;
        for cut in at.into_iter().chain([bytes.len()]) {
            if d.feed(&bytes[last..cut]).is_err() {
                break;
            }
            last = cut;
        }
    }

    #[test]
    fn ovsdb_decoder_reassembles_valid_messages_cut_anywhere(
        msgs in prop::collection::vec(json(), 1..6),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        // What a server sends: values back to back (objects and arrays, as
        // JSON-RPC does; bare scalars would need a separator).
        let msgs: Vec<Value> = msgs.into_iter().map(|m| serde_json::json!({"id": 1, "result": m})).collect();
        let wire: Vec<u8> = msgs.iter().flat_map(|m| serde_json::to_vec(m).unwrap()).collect();
        // What each message decodes to whole (floats round through text).
        let msgs: Vec<Value> =
            msgs.iter().map(|m| serde_json::from_slice(&serde_json::to_vec(m).unwrap()).unwrap()).collect();
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(wire.len() + 1)).collect();
        at.sort();
        let (mut d, mut got, mut last) = (Decoder::default(), Vec::new(), 0);
        for cut in at.into_iter().chain([wire.len()]) {
            got.extend(d.feed(&wire[last..cut]).unwrap());
            last = cut;
        }
        prop_assert_eq!(got, msgs);
    }

    #[test]
    fn ovsdb_messages_and_encoding_never_panic_on_arbitrary_json(v in json(), w in json()) {
        let _ = Incoming::of(v.clone());
        let _ = wire::uuid(&v);
        let _ = wire::set(&v);
        let _ = wire::string_set(&v);
        let _ = wire::opt_string(&v);
        let _ = wire::string_map(&v);
        let _ = wire::uuid_set(&v);
        let bridges = ovsdb::bridges_from(&[v.clone(), w.clone()]);
        prop_assert!(bridges.windows(2).all(|b| b[0].name <= b[1].name));
        let mut rows = HashMap::new();
        ovsdb::apply_updates(&mut rows, &v);
        ovsdb::apply_updates(&mut rows, &w);
        let exp = ovsdb::Expectation { bridge: "br-int".into(), fail_mode: "secure".into(), ..Default::default() };
        for b in &bridges {
            let _ = ovsdb::mismatches(b, &exp);
        }
    }

    #[test]
    fn an_echo_is_always_answered_with_its_id_and_params(id in json(), params in json()) {
        let msg = serde_json::json!({"method": "echo", "id": id, "params": params});
        match Incoming::of(msg) {
            Incoming::Echo(reply) => {
                prop_assert_eq!(&reply["id"], &id);
                prop_assert_eq!(&reply["result"], &params);
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }

    #[test]
    fn libvirt_xml_never_panics_on_arbitrary_text(text in ".{0,400}") {
        let _ = xml::domain_devices(&text);
        let _ = xml::capabilities(&text);
        let _ = xml::domain_offers(&text);
        let _ = xml::guest_cpu(&text);
    }

    #[test]
    fn libvirt_xml_never_panics_on_mutated_real_xml(
        cut in any::<prop::sample::Index>(),
        insert in prop::sample::select(vec!["<", ">", "'", "&", "<disk type='network'>", "</devices>", "<address domain='0xZZ'/>", "\u{0}", "é"]),
    ) {
        let real = include_str!("fixtures/node.xml");
        let mut at = cut.index(real.len() + 1);
        while !real.is_char_boundary(at) {
            at -= 1;
        }
        let mutated = format!("{}{insert}{}", &real[..at], &real[at..]);
        let _ = xml::domain_devices(&mutated);
        let _ = xml::capabilities(&mutated);
        let _ = xml::domain_devices(&real[..at]);
    }

    #[test]
    fn coordinator_messages_from_arbitrary_bytes_never_panic_the_agent(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        use hv_proto::v1::coordinator_message::Payload as Down;
        if let Ok(m) = hv_proto::v1::CoordinatorMessage::decode(bytes.as_slice()) {
            let interval = match m.payload {
                Some(Down::Welcome(w)) => w.heartbeat_interval,
                Some(Down::Configure(c)) => c.heartbeat_interval,
                _ => None,
            };
            if let Some(d) = interval.and_then(|d| std::time::Duration::try_from(d).ok()) {
                let beat = hv_agent::session::bounded_heartbeat(d);
                prop_assert!(beat <= std::time::Duration::from_secs(3600));
                let _ = tokio::time::Instant::now() + beat;
            }
        }
    }
}
