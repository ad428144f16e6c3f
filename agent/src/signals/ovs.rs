//! OVS health signals (docs/health.md): a bridge this agent saw and that is
//! gone. The host as the agent first found it is the baseline (as for a
//! read-only `/`): a bridge deleted on purpose stays flagged until the
//! agent restarts; the Testing checks say which bridges a host must have.

use std::collections::BTreeSet;

use hv_proto::v1::{HealthSeverity, HealthSignalKind};

use super::Update;

/// What the bridges `present` say against the ones ever `seen`: a start
/// for each one missing, an end for each one there.
pub fn bridge_updates(seen: &BTreeSet<String>, present: &BTreeSet<String>) -> Vec<Update> {
    let kind = HealthSignalKind::OvsBridgeMissing;
    seen.iter()
        .map(|b| {
            if present.contains(b) {
                Update::end(kind, b)
            } else {
                let evidence = format!("bridge {b} is gone (the agent saw it since its start)");
                Update::hold(kind, b, HealthSeverity::Critical, evidence)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_bridge_seen_and_gone_is_critical_and_ends_when_it_is_back() {
        let seen = set(&["br-ex", "br-int"]);
        let u = bridge_updates(&seen, &set(&["br-int"]));
        assert_eq!(u.len(), 2);
        let gone = u.iter().find(|x| x.subject == "br-ex").unwrap();
        assert_eq!(gone.now.as_ref().map(|n| n.0), Some(HealthSeverity::Critical));
        assert!(u.iter().find(|x| x.subject == "br-int").is_some_and(|x| x.now.is_none()));
        let back = bridge_updates(&seen, &seen);
        assert!(back.iter().all(|x| x.now.is_none()), "{back:?}");
        assert!(bridge_updates(&set(&[]), &set(&["br-new"])).is_empty(), "a new bridge is no signal");
    }
}
