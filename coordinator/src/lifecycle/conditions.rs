//! Folding desired conditions into the stored ones, the Kubernetes way:
//! `lastTransitionTime` moves only when `status` changes, so an SRE can tell
//! how long a node has been stuck, not how long ago we last reconciled.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::DesiredCondition;

/// Returns `existing` with every desired condition set; conditions of other
/// types (other owners) are kept untouched and in place.
pub fn merge(
    existing: &[Condition],
    desired: &[DesiredCondition],
    now: Timestamp,
    generation: Option<i64>,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = existing.to_vec();
    for d in desired {
        let type_ = d.type_.as_str();
        let status = d.status.as_str();
        match out.iter_mut().find(|c| c.type_ == type_) {
            Some(c) => {
                if c.status != status {
                    c.last_transition_time = Time(now);
                    c.status = status.to_string();
                }
                c.reason = d.reason.to_string();
                c.message = d.message.clone();
                c.observed_generation = generation;
            }
            None => out.push(Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: d.reason.to_string(),
                message: d.message.clone(),
                last_transition_time: Time(now),
                observed_generation: generation,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ConditionStatus, ConditionType};

    fn want(status: ConditionStatus, reason: &'static str) -> DesiredCondition {
        DesiredCondition {
            type_: ConditionType::Tested,
            status,
            reason: reason.to_string(),
            message: String::new(),
        }
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let t2 = Timestamp::from_second(3_000).unwrap();
        let a = merge(&[], &[want(ConditionStatus::False, "Running")], t0, Some(1));
        let b = merge(&a, &[want(ConditionStatus::False, "WaitingForAgent")], t1, Some(2));
        assert_eq!(b[0].last_transition_time.0, t0, "same status keeps the time");
        assert_eq!(b[0].reason, "WaitingForAgent");
        assert_eq!(b[0].observed_generation, Some(2));
        let c = merge(&b, &[want(ConditionStatus::True, "Passed")], t2, Some(2));
        assert_eq!(c[0].last_transition_time.0, t2);
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn foreign_conditions_are_kept() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let foreign = Condition {
            type_: "AgentConnected".into(),
            status: "True".into(),
            reason: "Connected".into(),
            message: String::new(),
            last_transition_time: Time(t0),
            observed_generation: None,
        };
        let out = merge(std::slice::from_ref(&foreign), &[want(ConditionStatus::True, "Passed")], t0, None);
        assert_eq!(out[0], foreign);
        assert_eq!(out[1].type_, "Tested");
    }
}
