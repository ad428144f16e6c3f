//! How a Node says that an update asks for its host (docs/drain.md, "An
//! update's ask"): the protocol's annotation
//! (`hypervisor.cloud.sap/maintenance-required`) always, and whatever the
//! site's update tool leaves instead, named with `--update-signal`: an
//! annotation, a label, or a cordon that comes with an annotation saying
//! why (so that an SRE's own cordon empties nothing). A plain cordon is
//! `--cordon-starts-maintenance`, and the eviction webhook's refused drain
//! a third way (`crate::api::keys::DRAIN_REFUSED_ANNOTATION`); both are the lifecycle's rule.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use std::time::Duration;

use crate::api::keys::{MACHINE_DELETING_ANNOTATION, MAINTENANCE_REQUIRED_ANNOTATION};

/// One sign an update tool leaves on a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// `annotation:KEY`: the Node carries the annotation, whatever its value.
    Annotation(String),
    /// `label:KEY` or `label:KEY=VALUE`: the Node carries the label (with
    /// that value).
    Label(String, Option<String>),
    /// `cordon-with:KEY`: the Node is cordoned and carries the annotation
    /// (the tool's reason); the uncordon ends it.
    CordonWith(String),
    /// `node-condition:TYPE`: the Node's condition TYPE is `True`.
    NodeCondition(String),
    /// `gardener-mcm[:TIMEOUT]`: Gardener's machine-controller-manager
    /// drains the Node: it set the Node's condition `Terminating` to `True`
    /// before its drain, and stops waiting for the budgets TIMEOUT later
    /// (its `--machine-drain-timeout`, 2 h by default; docs/drain.md).
    GardenerMcm { drain_timeout: Duration },
    /// `cluster-api`: the Node's Machine is being deleted, as the
    /// coordinator marks it ([`MACHINE_DELETING_ANNOTATION`]); its pre-drain
    /// hook holds Cluster API's drain until the host is emptied and held.
    ClusterApi,
}

/// Gardener MCM's drain timeout when the signal names none (its own default).
pub const MCM_DRAIN_TIMEOUT: Duration = Duration::from_secs(2 * 3600);

/// The Node condition Gardener MCM sets before it drains the Node.
pub const MCM_CONDITION: &str = "Terminating";

impl std::str::FromStr for Signal {
    type Err = String;

    fn from_str(s: &str) -> Result<Signal, String> {
        use super::admission::{label_key as key, label_value as value};
        match s.split_once(':') {
            Some(("annotation", k)) => Ok(Signal::Annotation(key(k)?)),
            Some(("cordon-with", k)) => Ok(Signal::CordonWith(key(k)?)),
            Some(("node-condition", t)) if condition_type(t) => Ok(Signal::NodeCondition(t.to_string())),
            Some(("gardener-mcm", t)) => Ok(Signal::GardenerMcm { drain_timeout: mcm_timeout(t)? }),
            None if s == "gardener-mcm" => Ok(Signal::GardenerMcm { drain_timeout: MCM_DRAIN_TIMEOUT }),
            None if s == "cluster-api" => Ok(Signal::ClusterApi),
            Some(("label", kv)) => match kv.split_once('=') {
                Some((k, v)) => Ok(Signal::Label(key(k)?, Some(value(v)?))),
                None => Ok(Signal::Label(key(kv)?, None)),
            },
            _ => Err(format!(
                "{s:?}: an update signal is annotation:KEY, label:KEY[=VALUE], cordon-with:ANNOTATION_KEY, \
                 node-condition:TYPE, gardener-mcm[:DRAIN_TIMEOUT] or cluster-api"
            )),
        }
    }
}

/// MCM's drain timeout: a duration of at most a week (MCM's own is hours).
fn mcm_timeout(t: &str) -> Result<Duration, String> {
    let d = crate::config::duration(t)?;
    if d > MCM_LONGEST_TIMEOUT || d.is_zero() {
        return Err(format!("gardener-mcm:{t}: a drain timeout is more than 0 and at most 168h"));
    }
    Ok(d)
}

/// The longest MCM drain timeout taken.
const MCM_LONGEST_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A Node condition type: letters, digits, `.`, `-`, `_`, `/`.
fn condition_type(t: &str) -> bool {
    !t.is_empty() && t.len() <= 316 && t.chars().all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
}

/// The signs the site's update tools leave, beside the protocol's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpdateSignals(pub Vec<Signal>);

impl UpdateSignals {
    /// Whether the Node carries an update's ask. Pure.
    pub fn ask(&self, node: &Node) -> bool {
        let annotations = node.annotations();
        let labels = node.labels();
        let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        let condition = |t: &str| {
            let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
            conditions.into_iter().flatten().any(|c| c.type_ == t && c.status == "True")
        };
        annotations.contains_key(MAINTENANCE_REQUIRED_ANNOTATION)
            || self.0.iter().any(|s| match s {
                Signal::Annotation(k) => annotations.contains_key(k),
                Signal::Label(k, None) => labels.contains_key(k),
                Signal::Label(k, Some(v)) => labels.get(k) == Some(v),
                Signal::CordonWith(k) => cordoned && annotations.contains_key(k),
                Signal::NodeCondition(t) => condition(t),
                Signal::GardenerMcm { .. } => condition(MCM_CONDITION),
                Signal::ClusterApi => annotations.contains_key(MACHINE_DELETING_ANNOTATION),
            })
    }

    /// Gardener MCM's drain timeout, when its signal is named.
    pub fn mcm_drain_timeout(&self) -> Option<Duration> {
        self.0.iter().find_map(|s| match s {
            Signal::GardenerMcm { drain_timeout } => Some(*drain_timeout),
            _ => None,
        })
    }

    /// Whether Cluster API's Machines are read (`cluster-api`).
    pub fn cluster_api(&self) -> bool {
        self.0.contains(&Signal::ClusterApi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(cordoned: bool, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        let map =
            |kv: &[(&str, &str)]| Some(kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        n.metadata.labels = map(labels);
        n.metadata.annotations = map(annotations);
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            unschedulable: Some(cordoned),
            ..Default::default()
        });
        n
    }

    #[test]
    fn a_node_asks_by_the_protocols_annotation_or_a_sign_the_site_names() {
        let none = UpdateSignals::default();
        let site = UpdateSignals(
            [
                "label:os-update=pending",
                "label:reboot-needed",
                "annotation:example.com/update",
                "cordon-with:example.com/why",
            ]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect(),
        );
        let rows: [(&str, Node, bool, bool); 9] = [
            ("nothing", node(false, &[], &[]), false, false),
            (
                "the protocol's annotation",
                node(false, &[], &[(MAINTENANCE_REQUIRED_ANNOTATION, "")]),
                true,
                true,
            ),
            ("a label with its value", node(false, &[("os-update", "pending")], &[]), false, true),
            ("a label with another value", node(false, &[("os-update", "done")], &[]), false, false),
            ("a label, any value", node(false, &[("reboot-needed", "")], &[]), false, true),
            ("an annotation", node(false, &[], &[("example.com/update", "x")]), false, true),
            ("a cordon with its reason", node(true, &[], &[("example.com/why", "kernel")]), false, true),
            (
                "a reason left after the uncordon",
                node(false, &[], &[("example.com/why", "kernel")]),
                false,
                false,
            ),
            ("an SRE's plain cordon", node(true, &[], &[]), false, false),
        ];
        for (what, n, by_default, by_site) in rows {
            assert_eq!(none.ask(&n), by_default, "{what}, no site signals");
            assert_eq!(site.ask(&n), by_site, "{what}, the site's signals");
        }
    }

    #[test]
    fn signals_are_parsed_or_refused_with_the_forms_they_take() {
        assert_eq!("label:a=b".parse(), Ok(Signal::Label("a".into(), Some("b".into()))));
        assert_eq!("label:a".parse(), Ok(Signal::Label("a".into(), None)));
        assert_eq!("annotation:x.io/y".parse(), Ok(Signal::Annotation("x.io/y".into())));
        assert_eq!("cordon-with:x.io/why".parse(), Ok(Signal::CordonWith("x.io/why".into())));
        assert_eq!("node-condition:Terminating".parse(), Ok(Signal::NodeCondition("Terminating".into())));
        assert_eq!("gardener-mcm".parse(), Ok(Signal::GardenerMcm { drain_timeout: MCM_DRAIN_TIMEOUT }));
        assert_eq!(
            "gardener-mcm:3h".parse(),
            Ok(Signal::GardenerMcm { drain_timeout: Duration::from_secs(3 * 3600) })
        );
        assert_eq!("cluster-api".parse(), Ok(Signal::ClusterApi));
        for bad in [
            "",
            "cordon",
            "label:",
            "annotation:a b",
            "taint:x",
            "label:a/b/c",
            "label:a=b c",
            "label:a=b=c",
            "label:x/",
            "annotation:/x",
            "node-condition:",
            "node-condition:a b",
            "gardener-mcm:soon",
            "gardener-mcm:0s",
            "gardener-mcm:99999999h",
            "cluster-api:x",
        ] {
            let e = bad.parse::<Signal>();
            assert!(e.is_err(), "{bad:?}");
        }
        assert!("nope".parse::<Signal>().unwrap_err().contains("annotation:KEY, label:KEY[=VALUE]"));
    }
}
