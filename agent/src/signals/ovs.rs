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

/// What the agent remembers of the bridges between two looks: the required
/// bridges it saw (one gone is missing), and those it saw set as required
/// (one no longer so is reconfigured).
#[derive(Debug, Default)]
pub struct Bridges {
    seen: BTreeSet<String>,
    met: BTreeSet<String>,
    required: Option<Required>,
}

impl Bridges {
    /// What the bridges `present` say under `required`: for each required
    /// bridge ever seen, whether it is missing and whether it is
    /// reconfigured (a start or an end of each); an end of both for one no
    /// longer required.
    ///
    /// Reconfigured means changed: a bridge counts only once the agent saw
    /// it set as required (since its start, or since the requirements
    /// changed). A bridge being created (`add-br`, then its fail mode) or
    /// one found wrong when the agent starts is the checks' business, not a
    /// signal that would empty a healthy host.
    pub fn judge(&mut self, present: &[Bridge], required: &Required) -> Vec<Update> {
        if self.required.as_ref() != Some(required) {
            // What was met under the old requirements still counts for a
            // bridge whose own requirement did not change.
            let old = self.required.take();
            let wants = |r: &Required, b: &str| {
                r.expectations.iter().filter(|e| e.bridge == b).cloned().collect::<Vec<_>>()
            };
            self.met.retain(|b| {
                old.as_ref().is_some_and(|o| {
                    o.bridges.contains(b) && required.bridges.contains(b) && wants(o, b) == wants(required, b)
                })
            });
            self.required = Some(required.clone());
        }
        for p in present.iter().filter(|p| required.bridges.contains(&p.name)) {
            self.seen.insert(p.name.clone());
        }
        let missing = HealthSignalKind::OvsBridgeMissing;
        let reconfigured = HealthSignalKind::OvsBridgeReconfigured;
        let mut out = Vec::new();
        for b in &self.seen {
            let now = present.iter().find(|p| &p.name == b).filter(|_| required.bridges.contains(b));
            if now.is_none() && required.bridges.contains(b) {
                let evidence = format!("bridge {b} is gone (the agent saw it since its start)");
                out.push(Update::hold(missing, b, HealthSeverity::Critical, evidence));
            } else {
                out.push(Update::end(missing, b));
            }
            let wrong: Vec<String> = now
                .map(|p| {
                    let wants = required.expectations.iter().filter(|e| &e.bridge == b);
                    wants.flat_map(|e| ovsdb::mismatches(p, e)).collect()
                })
                .unwrap_or_default();
            if now.is_some() && wrong.is_empty() {
                self.met.insert(b.clone());
            }
            if wrong.is_empty() || !self.met.contains(b) {
                out.push(Update::end(reconfigured, b));
            } else {
                let evidence = format!("bridge {b} reconfigured: {}", wrong.join("; "));
                out.push(Update::hold(reconfigured, b, HealthSeverity::Critical, evidence));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    const MISSING: HealthSignalKind = HealthSignalKind::OvsBridgeMissing;
    const RECONFIGURED: HealthSignalKind = HealthSignalKind::OvsBridgeReconfigured;

    #[test]
    fn a_required_bridge_seen_and_gone_is_critical_and_ends_when_it_is_back() {
        let required = checks(&["br-ex"], Vec::new());
        let all = [bridge("br-int", "", ""), bridge("br-ex", "", ""), bridge("tbr-1", "", "")];
        let mut b = Bridges::default();
        let u = b.judge(&all, &required);
        assert_eq!(u.len(), 4, "two kinds for each required bridge seen, none for tbr-1: {u:?}");
        let u = b.judge(&all[..1], &required);
        assert!(held(&u, MISSING, "br-ex").is_some());
        assert!(held(&u, MISSING, "br-int").is_none());
        assert!(u.iter().all(|x| x.subject != "tbr-1"), "not required, not remembered");
        let back = b.judge(&all, &required);
        assert!(back.iter().all(|x| x.now.is_none()), "{back:?}");
        // No longer required: its signals end, and its going is no signal.
        let u = b.judge(&all[..1], &checks(&[], Vec::new()));
        assert!(held(&u, MISSING, "br-ex").is_none() && u.iter().any(|x| x.subject == "br-ex"));
        assert!(Bridges::default().judge(&[bridge("br-new", "", "")], &required).is_empty(), "a new bridge");
    }

    #[test]
    fn a_required_bridge_seen_as_required_and_then_changed_is_reconfigured_until_it_is_set_back() {
        let mut b = Bridges::default();
        // Before any checks: br-int must be secure, nothing else is looked at.
        let before = Required::before_checks();
        let secure = [bridge("br-int", "secure", ""), bridge("br-ex", "", "")];
        assert!(b.judge(&secure, &before).iter().all(|x| x.now.is_none()));
        let standalone = [bridge("br-int", "standalone", ""), bridge("br-ex", "", "netdev")];
        let u = b.judge(&standalone, &before);
        assert_eq!(
            held(&u, RECONFIGURED, "br-int").as_deref(),
            Some("bridge br-int reconfigured: fail_mode: wanted secure, found standalone")
        );
        assert!(held(&u, RECONFIGURED, "br-ex").is_none());
        assert!(b.judge(&secure, &before).iter().all(|x| x.now.is_none()), "set back");
        // Gone is missing, not also reconfigured.
        let u = b.judge(&[], &before);
        assert!(held(&u, MISSING, "br-int").is_some() && held(&u, RECONFIGURED, "br-int").is_none());
    }

    #[test]
    fn a_change_of_another_bridges_requirement_leaves_a_reconfigured_bridge_reconfigured() {
        let mut b = Bridges::default();
        let before = Required::before_checks();
        b.judge(&[bridge("br-int", "secure", ""), bridge("br-ex", "", "")], &before);
        let standalone = [bridge("br-int", "standalone", ""), bridge("br-ex", "", "")];
        assert!(held(&b.judge(&standalone, &before), RECONFIGURED, "br-int").is_some());
        // The checks arrive: br-int's requirement is the same, br-ex's is new.
        let mut required = before.clone();
        required.bridges.insert("br-ex".into());
        assert_ne!(before, required);
        let u = b.judge(&standalone, &required);
        assert!(held(&u, RECONFIGURED, "br-int").is_some(), "{u:?}");
    }

    #[test]
    fn a_bridge_never_seen_as_required_is_no_signal_a_new_agent_or_a_bridge_being_created() {
        let before = Required::before_checks();
        // An agent started on a host whose br-int is already standalone.
        let mut fresh = Bridges::default();
        assert!(fresh.judge(&[bridge("br-int", "standalone", "")], &before).iter().all(|x| x.now.is_none()));
        // A br-int created by `add-br`, then given its fail mode.
        let mut b = Bridges::default();
        assert!(b.judge(&[bridge("br-int", "", "")], &before).iter().all(|x| x.now.is_none()));
        assert!(b.judge(&[bridge("br-int", "secure", "")], &before).iter().all(|x| x.now.is_none()));
        let u = b.judge(&[bridge("br-int", "", "")], &before);
        assert!(held(&u, RECONFIGURED, "br-int").is_some(), "once seen secure, unset is a change");
    }

    #[test]
    fn the_checks_expectations_replace_the_default_and_only_the_watched_fields_count() {
        let want = |bridge: &str, fail_mode: &str, datapath_type: &str| hv_proto::v1::BridgeExpectation {
            bridge: bridge.into(),
            fail_mode: fail_mode.into(),
            datapath_type: datapath_type.into(),
            ports: vec!["patch-tun".into()],
            external_ids: [("bridge-id".to_string(), "*".to_string())].into(),
        };
        let required = checks(&["br-ex"], vec![want("br-ex", "", "system"), want("tbr-1", "secure", "")]);
        assert_eq!(required.expectations.len(), 1, "tbr-1 is not a bridge the host must have");
        let mut b = Bridges::default();
        let good = [bridge("br-int", "standalone", ""), bridge("br-ex", "", ""), bridge("tbr-1", "", "")];
        let u = b.judge(&good, &required);
        assert!(
            u.iter().all(|x| x.now.is_none()),
            "br-int's fail mode was not asked; ports not watched: {u:?}"
        );
        let netdev = [bridge("br-int", "standalone", ""), bridge("br-ex", "", "netdev")];
        let u = b.judge(&netdev, &required);
        assert_eq!(
            held(&u, RECONFIGURED, "br-ex").as_deref(),
            Some("bridge br-ex reconfigured: datapath_type: wanted system, found netdev")
        );
        // New requirements: what was met under a bridge's old one does not
        // count; a bridge whose own requirement stayed keeps its signal.
        let u = b.judge(
            &netdev,
            &checks(&["br-ex"], vec![want("br-ex", "", "system"), want("br-int", "secure", "")]),
        );
        assert!(held(&u, RECONFIGURED, "br-int").is_none(), "br-int's requirement is new: {u:?}");
        assert!(held(&u, RECONFIGURED, "br-ex").is_some(), "br-ex's stayed: {u:?}");
    }
}
