//! The marks the coordinator keeps on a hypervisor's Node, so that
//! Kubernetes-side tooling can select healthy hypervisors without asking
//! the coordinator: the label [`SCHEDULABLE_LABEL`] while the host is judged
//! Healthy, and the annotation [`HEARTBEAT_ANNOTATION`] with the time the agent was
//! last heard from, written at most every [`HEARTBEAT_EVERY`] (a Node write
//! per agent heartbeat would load the API server for nothing). And the
//! label [`HIBERNATED_LABEL`] while its power is managed (docs/power.md).

use crate::api::keys::{HEARTBEAT_ANNOTATION, HIBERNATED_LABEL, SCHEDULABLE_LABEL};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::Node;
use serde_json::{Map, Value, json};

pub const HEARTBEAT_EVERY: SignedDuration = SignedDuration::from_secs(60);

/// The marks as the Node carries them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    pub schedulable: bool,
    pub heartbeat: Option<Timestamp>,
    pub hibernated: bool,
}

pub fn of(node: &Node) -> Marks {
    let labels = node.metadata.labels.as_ref();
    let annotations = node.metadata.annotations.as_ref();
    Marks {
        schedulable: labels.and_then(|l| l.get(SCHEDULABLE_LABEL)).is_some_and(|v| v == "true"),
        heartbeat: annotations.and_then(|a| a.get(HEARTBEAT_ANNOTATION)).and_then(|v| v.parse().ok()),
        hibernated: labels.and_then(|l| l.get(HIBERNATED_LABEL)).is_some_and(|v| v == "true"),
    }
}

/// The merge patch that brings the Node's marks to what `healthy`, the
/// agent's `last_heard` and `hibernated` say, or None when nothing needs
/// writing.
pub fn patch(now: &Marks, healthy: bool, last_heard: Option<Timestamp>, hibernated: bool) -> Option<Value> {
    let mut labels = Map::new();
    if now.schedulable != healthy {
        labels.insert(SCHEDULABLE_LABEL.into(), if healthy { json!("true") } else { Value::Null });
    }
    if now.hibernated != hibernated {
        labels.insert(HIBERNATED_LABEL.into(), if hibernated { json!("true") } else { Value::Null });
    }
    let mut annotations = Map::new();
    if let Some(heard) = last_heard {
        let stale = now.heartbeat.is_none_or(|t| heard.duration_since(t) >= HEARTBEAT_EVERY);
        if stale {
            let at = heard.round(jiff::Unit::Second).unwrap_or(heard);
            annotations.insert(HEARTBEAT_ANNOTATION.into(), json!(at.to_string()));
        }
    }
    metadata_patch(labels, annotations)
}

/// The merge patch of a Node's `labels` and `annotations` to write (a null
/// value removes one), or None when there is none: the one shape of every
/// mark the coordinator keeps on Nodes.
pub fn metadata_patch(labels: Map<String, Value>, annotations: Map<String, Value>) -> Option<Value> {
    if labels.is_empty() && annotations.is_empty() {
        return None;
    }
    let mut metadata = Map::new();
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    Some(json!({ "metadata": metadata }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap_or_default()
    }

    #[test]
    fn the_label_follows_health_and_the_heartbeat_is_written_once_a_minute() {
        let none = Marks::default();
        let p = patch(&none, true, Some(at(0)), false).unwrap_or_default();
        assert_eq!(p["metadata"]["labels"][SCHEDULABLE_LABEL], "true");
        assert_eq!(p["metadata"]["annotations"][HEARTBEAT_ANNOTATION], at(0).to_string());
        let marked = Marks { schedulable: true, heartbeat: Some(at(0)), hibernated: false };
        assert_eq!(patch(&marked, true, Some(at(59)), false), None, "within the minute: nothing to write");
        let p = patch(&marked, true, Some(at(60)), false).unwrap_or_default();
        assert!(p["metadata"].get("labels").is_none());
        assert_eq!(p["metadata"]["annotations"][HEARTBEAT_ANNOTATION], at(60).to_string());
        let p = patch(&marked, false, None, false).unwrap_or_default();
        assert_eq!(p["metadata"]["labels"][SCHEDULABLE_LABEL], Value::Null, "not Healthy: the label goes");
        assert!(p["metadata"].get("annotations").is_none(), "no agent heard: the last time stays");
        assert_eq!(patch(&Marks::default(), false, None, false), None);
        // Hibernated: the label set, then removed once back in service.
        let p = patch(&Marks::default(), false, None, true).unwrap_or_default();
        assert_eq!(p["metadata"]["labels"][HIBERNATED_LABEL], "true");
        let off = Marks { hibernated: true, ..Marks::default() };
        assert_eq!(patch(&off, false, None, true), None);
        let p = patch(&off, false, None, false).unwrap_or_default();
        assert_eq!(p["metadata"]["labels"][HIBERNATED_LABEL], Value::Null);
    }

    #[test]
    fn marks_are_read_back_from_the_node() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n",
            "labels": {SCHEDULABLE_LABEL: "true", HIBERNATED_LABEL: "true"},
            "annotations": {HEARTBEAT_ANNOTATION: at(5).to_string()}}}))
        .unwrap_or_default();
        assert_eq!(of(&node), Marks { schedulable: true, heartbeat: Some(at(5)), hibernated: true });
        let garbage: Node = serde_json::from_value(json!({"metadata": {"name": "n",
            "labels": {SCHEDULABLE_LABEL: "yes"}, "annotations": {HEARTBEAT_ANNOTATION: "yesterday"}}}))
        .unwrap_or_default();
        assert_eq!(of(&garbage), Marks::default(), "only our own values count");
    }
}
