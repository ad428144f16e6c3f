//! Fuzzing, bounded, of the coordinator's handling of what agents send:
//! arbitrary bytes decoded as `AgentMessage`s (and real messages with
//! arbitrary fields) fed to a live session of the registry, and arbitrary
//! node names through the Hello check. `HV_FUZZ_CASES` cases per harness
//! (default 10,000): nothing may panic, the acknowledged sequence never
//! goes back, and what is kept stays bounded.

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::{AgentMessage, CheckReport, CheckResult, HostFacts};
use proptest::prelude::*;
use prost::Message;
use tokio::sync::mpsc;

use super::agent_service::valid_node_name;
use super::registry::{MAX_CHECKS, MAX_MESSAGE, MAX_SHORT, Registry};

fn cases() -> ProptestConfig {
    let n = std::env::var("HV_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// A check's duration and end, anywhere in the types' ranges.
fn times() -> impl Strategy<Value = (Option<prost_types::Duration>, Option<prost_types::Timestamp>)> {
    let duration =
        (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos });
    let at =
        (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos });
    (prop::option::of(duration), prop::option::of(at))
}

fn message() -> impl Strategy<Value = AgentMessage> {
    let text = || (any::<char>(), 0..300usize).prop_map(|(c, n)| c.to_string().repeat(n));
    let long = (any::<char>(), 0..1500usize).prop_map(|(c, n)| c.to_string().repeat(n));
    let report = (any::<u64>(), prop::collection::vec((text(), any::<bool>(), long, times()), 0..70), text())
        .prop_map(|(run, r, hypervisor_uid)| {
            Payload::CheckReport(CheckReport {
                run,
                results: r
                    .into_iter()
                    .map(|(name, passed, message, (duration, finished_at))| CheckResult {
                        name,
                        passed,
                        message,
                        duration,
                        finished_at,
                    })
                    .collect(),
                hypervisor_uid,
            })
        });
    let facts = (text(), text()).prop_map(|(hostname, libvirt_version)| {
        Payload::HostFacts(HostFacts { hostname, libvirt_version, ..Default::default() })
    });
    let raw =
        prop::collection::vec(any::<u8>(), 0..200).prop_map(|b| AgentMessage::decode(b.as_slice()).ok());
    prop_oneof![
        (any::<u64>(), prop_oneof![report, facts]).prop_map(|(seq, p)| Some(AgentMessage {
            seq,
            sent_at: None,
            payload: Some(p)
        })),
        raw,
    ]
    .prop_filter_map("decodable", |m| m)
}

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn any_message_sequence_is_taken_without_panic_and_acks_never_go_back(msgs in prop::collection::vec(message(), 1..6)) {
        let (changed, _rx) = mpsc::unbounded_channel();
        let r = Registry::new(changed);
        let (tx, _out) = mpsc::channel(64);
        let hello = hv_proto::v1::Hello { node: "node-1".into(), boot_id: "boot".into(), ..Default::default() };
        let s = r.open(&hello, tx);
        let mut acked = 0;
        for m in msgs {
            let ack = r.receive("node-1", s.id, m);
            prop_assert!(ack.is_some(), "the live session's messages are answered");
            let ack = ack.unwrap_or_default();
            prop_assert!(ack >= acked, "ack went back from {acked} to {ack}");
            acked = ack;
        }
        let v = r.view("node-1");
        if let Some(c) = v.checks {
            prop_assert!(c.results.len() <= MAX_CHECKS);
            prop_assert!(c.results.iter().all(|x| x.name.len() <= MAX_SHORT + 3 && x.message.len() <= MAX_MESSAGE + 3));
        }
        prop_assert!(v.machine.and_then(|m| m.hostname).unwrap_or_default().len() <= MAX_SHORT);
    }

    #[test]
    fn node_names_are_checked_without_panic(name in ".{0,300}") {
        if valid_node_name(&name) {
            prop_assert!(name.len() <= 253 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'));
        }
    }
}
