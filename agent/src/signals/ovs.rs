//! OVS health signals (docs/health.md): a bridge the host must have (br-int,
//! and the bridges of the last checks the coordinator asked for) that the
//! agent saw and that is gone, or that no longer has the fail mode or
//! datapath type those checks demand. Bridges that come and go with the VMs
//! (a trunk's `tbr-*`) are none of its business.

use std::collections::BTreeSet;

use hv_proto::v1::{CheckConfig, HealthSeverity, HealthSignalKind};

use super::Update;
use crate::ovsdb::{self, Bridge, Expectation};

/// The bridges a host must have and how they must be set.
#[derive(Clone, Debug, PartialEq)]
pub struct Required {
    pub bridges: BTreeSet<String>,
    /// Only the watched fields (fail mode, datapath type) are kept.
    pub expectations: Vec<Expectation>,
}

impl Required {
    /// Before any checks were asked: br-int, in fail mode secure.
    pub fn before_checks() -> Required {
        Required::new(&[], ovsdb::default_expectations())
    }

    /// From the last checks the coordinator asked for: br-int and the
    /// bridges they named, as they must be set.
    pub fn from_checks(cfg: &CheckConfig) -> Required {
        Required::new(&cfg.bridges, cfg.bridge_expectations.iter().map(Expectation::from).collect())
    }

    fn new(named: &[String], expectations: Vec<Expectation>) -> Required {
        let bridges: BTreeSet<String> =
            std::iter::once("br-int".to_string()).chain(named.iter().cloned()).collect();
        let expectations = expectations
            .into_iter()
            .filter(|e| bridges.contains(&e.bridge))
            .map(|e| Expectation { ports: Vec::new(), external_ids: Default::default(), ..e })
            .collect();
        Required { bridges, expectations }
    }
}

/// What the bridges `present` say of the required ones ever `seen`: for
/// each, whether it is missing and whether it is reconfigured (a start or
/// an end of each); for every other one seen, an end of both.
pub fn bridge_updates(seen: &BTreeSet<String>, present: &[Bridge], required: &Required) -> Vec<Update> {
    let missing = HealthSignalKind::OvsBridgeMissing;
    let reconfigured = HealthSignalKind::OvsBridgeReconfigured;
    let mut out = Vec::new();
    for b in seen {
        let now = present.iter().find(|p| &p.name == b);
        let must = required.bridges.contains(b);
        match now {
            None if must => {
                let evidence = format!("bridge {b} is gone (the agent saw it since its start)");
                out.push(Update::hold(missing, b, HealthSeverity::Critical, evidence));
            }
            _ => out.push(Update::end(missing, b)),
        }
        let wrong: Vec<String> = match now {
            Some(p) if must => required
                .expectations
                .iter()
                .filter(|e| &e.bridge == b)
                .flat_map(|e| ovsdb::mismatches(p, e))
                .collect(),
            _ => Vec::new(),
        };
        if wrong.is_empty() {
            out.push(Update::end(reconfigured, b));
        } else {
            let evidence = format!("bridge {b} reconfigured: {}", wrong.join("; "));
            out.push(Update::hold(reconfigured, b, HealthSeverity::Critical, evidence));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn bridge(name: &str, fail_mode: &str, datapath: &str) -> Bridge {
        Bridge {
            name: name.into(),
            datapath_type: datapath.into(),
            fail_mode: (!fail_mode.is_empty()).then(|| fail_mode.to_string()),
            ports: Vec::new(),
            external_ids: Default::default(),
        }
    }

    fn held(u: &[Update], kind: HealthSignalKind, subject: &str) -> Option<String> {
        u.iter().find(|x| x.kind == kind && x.subject == subject).and_then(|x| x.now.as_ref()).map(|n| {
            assert_eq!(n.0, HealthSeverity::Critical);
            n.1.clone()
        })
    }

    fn checks(bridges: &[&str], expectations: Vec<hv_proto::v1::BridgeExpectation>) -> Required {
        Required::from_checks(&CheckConfig {
            bridges: bridges.iter().map(|b| b.to_string()).collect(),
            bridge_expectations: expectations,
            ..Default::default()
        })
    }

    #[test]
    fn a_required_bridge_seen_and_gone_is_critical_and_ends_when_it_is_back() {
        let seen = set(&["br-ex", "br-int", "tbr-1"]);
        let required = checks(&["br-ex"], Vec::new());
        let all = [bridge("br-int", "", ""), bridge("br-ex", "", ""), bridge("tbr-1", "", "")];
        let u = bridge_updates(&seen, &all[..1], &required);
        assert_eq!(u.len(), 6, "two kinds for each bridge seen");
        let missing = HealthSignalKind::OvsBridgeMissing;
        assert!(held(&u, missing, "br-ex").is_some());
        assert!(held(&u, missing, "tbr-1").is_none(), "not required");
        assert!(held(&u, missing, "br-int").is_none());
        let back = bridge_updates(&seen, &all, &required);
        assert!(back.iter().all(|x| x.now.is_none()), "{back:?}");
        assert!(bridge_updates(&set(&[]), &all, &required).is_empty(), "a new bridge is no signal");
    }

    #[test]
    fn a_required_bridge_no_longer_set_as_the_checks_demand_is_reconfigured_until_it_is_again() {
        let seen = set(&["br-ex", "br-int", "tbr-1"]);
        let reconfigured = HealthSignalKind::OvsBridgeReconfigured;
        // Before any checks: br-int must be secure, nothing else is looked at.
        let before = Required::before_checks();
        let standalone =
            [bridge("br-int", "standalone", ""), bridge("br-ex", "", "netdev"), bridge("tbr-1", "", "")];
        let u = bridge_updates(&seen, &standalone, &before);
        assert_eq!(
            held(&u, reconfigured, "br-int").as_deref(),
            Some("bridge br-int reconfigured: fail_mode: wanted secure, found standalone")
        );
        assert!(held(&u, reconfigured, "br-ex").is_none() && held(&u, reconfigured, "tbr-1").is_none());
        // The checks' own expectations: br-ex's datapath; the ports and
        // external_ids are not watched; an expectation of a bridge the
        // host need not have is no signal.
        let want = |bridge: &str, fail_mode: &str, datapath_type: &str| hv_proto::v1::BridgeExpectation {
            bridge: bridge.into(),
            fail_mode: fail_mode.into(),
            datapath_type: datapath_type.into(),
            ports: vec!["patch-tun".into()],
            external_ids: [("bridge-id".to_string(), "*".to_string())].into(),
        };
        let required = checks(&["br-ex"], vec![want("br-ex", "", "system"), want("tbr-1", "secure", "")]);
        let u = bridge_updates(&seen, &standalone, &required);
        assert!(held(&u, reconfigured, "br-int").is_none(), "the checks did not ask for br-int's fail mode");
        assert_eq!(
            held(&u, reconfigured, "br-ex").as_deref(),
            Some("bridge br-ex reconfigured: datapath_type: wanted system, found netdev")
        );
        assert!(held(&u, reconfigured, "tbr-1").is_none());
        let fixed = [bridge("br-int", "standalone", ""), bridge("br-ex", "", ""), bridge("tbr-1", "", "")];
        assert!(bridge_updates(&seen, &fixed, &required).iter().all(|x| x.now.is_none()));
        // Gone is missing, not also reconfigured.
        let u = bridge_updates(&seen, &fixed[..1], &required);
        assert!(held(&u, reconfigured, "br-ex").is_none());
        assert!(held(&u, HealthSignalKind::OvsBridgeMissing, "br-ex").is_some());
    }
}
