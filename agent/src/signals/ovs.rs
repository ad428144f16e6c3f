//! OVS health signals (docs/health.md): a bridge the host must have (br-int,
//! and the bridges of the last checks the coordinator asked for) that the
//! agent saw and that is gone. Bridges that come and go with the VMs (a
//! trunk's `tbr-*`) are none of its business.

use std::collections::BTreeSet;

use hv_proto::v1::{HealthSeverity, HealthSignalKind};

use super::Update;

/// What the bridges `present` say of the `expected` ones ever `seen`: a
/// start for each one missing, an end for every other one seen.
pub fn bridge_updates(
    seen: &BTreeSet<String>,
    present: &BTreeSet<String>,
    expected: &BTreeSet<String>,
) -> Vec<Update> {
    let kind = HealthSignalKind::OvsBridgeMissing;
    seen.iter()
        .map(|b| {
            if present.contains(b) || !expected.contains(b) {
                Update::end(kind, b)
            } else {
                let evidence = format!("bridge {b} is gone (the agent saw it since its start)");
                Update::hold(kind, b, HealthSeverity::Critical, evidence)
            }
        })
        .collect()
}

/// The bridges a host must have: br-int, and those the last checks named.
pub fn expected(checked: &[String]) -> BTreeSet<String> {
    std::iter::once("br-int".to_string()).chain(checked.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_expected_bridge_seen_and_gone_is_critical_and_ends_when_it_is_back() {
        let seen = set(&["br-ex", "br-int", "tbr-1"]);
        let expected = expected(&["br-ex".to_string()]);
        let u = bridge_updates(&seen, &set(&["br-int"]), &expected);
        assert_eq!(u.len(), 3);
        let gone = u.iter().find(|x| x.subject == "br-ex").unwrap();
        assert_eq!(gone.now.as_ref().map(|n| n.0), Some(HealthSeverity::Critical));
        assert!(u.iter().find(|x| x.subject == "tbr-1").is_some_and(|x| x.now.is_none()), "not expected");
        assert!(u.iter().find(|x| x.subject == "br-int").is_some_and(|x| x.now.is_none()));
        let back = bridge_updates(&seen, &seen, &expected);
        assert!(back.iter().all(|x| x.now.is_none()), "{back:?}");
        assert!(
            bridge_updates(&set(&[]), &set(&["br-new"]), &expected).is_empty(),
            "a new bridge is no signal"
        );
    }
}
