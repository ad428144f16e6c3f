//! Before anything moves off a host: is it the machine Nova means?
//!
//! With Nova's libvirt driver a domain's UUID is its server's. When Nova
//! lists servers on the host and the host's agent reported none of them,
//! the Node is not the machine that runs them: moving or evacuating them
//! would act on another machine's VMs (an evacuation would run them twice).
//! Then nothing moves until the agent reports one of them, or an SRE forces
//! past it (`spec.options.force: [machine]`). Servers started after the
//! agent's last report are shown, not blocking. Pure.

use crate::api::condition::DesiredCondition;
use crate::api::{ConditionStatus, ConditionType};
use crate::lifecycle::machine::{Servers, servers};

/// The name `spec.options.force` uses for this check.
pub const MACHINE: &str = "machine";

/// At most this many server UUIDs are named in a message.
const NAMED: usize = 5;

/// The `Machine` condition, and whether it holds the eviction back.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub condition: DesiredCondition,
    pub holds: bool,
}

/// Judges the servers Nova lists on `host` (`nova`) against the domains
/// node `node`'s agent last reported (`domains`; None: never).
pub fn judge(node: &str, host: &str, nova: &[String], domains: Option<&[String]>, forced: bool) -> Verdict {
    let (status, reason, message, holds) = match servers(nova, domains) {
        Servers::Seen => {
            let msg = format!("the {} server(s) Nova lists on host {host} run on node {node}", nova.len());
            (ConditionStatus::True, "Seen", msg, false)
        }
        Servers::Partly { unseen } => {
            let msg = format!(
                "{} of the {} server(s) Nova lists on host {host} were not in node {node}'s last report \
                 (started since?): {}",
                unseen.len(),
                nova.len(),
                named(&unseen)
            );
            (ConditionStatus::True, "PartlySeen", msg, false)
        }
        Servers::NoneSeen { nova: listed, agent } => {
            let mut msg = format!(
                "Nova lists {listed} server(s) on host {host} ({}), and node {node}'s agent last reported \
                 {agent} domain(s), none of them: node {node} is not the machine Nova means by {host}",
                named(nova)
            );
            if forced {
                msg.push_str("; going on: spec.options.force names machine");
                (ConditionStatus::True, "Forced", msg, false)
            } else {
                msg.push_str(
                    ". Nothing moves until its agent reports one of them. Fix the Hypervisor's spec.novaHost; \
                     if the agent's report is known to be stale, add machine to spec.options.force",
                );
                (ConditionStatus::False, "NotTheMachine", msg, true)
            }
        }
        Servers::NotReported => {
            let msg = format!("node {node}'s agent never reported its domains: not compared");
            (ConditionStatus::Unknown, "NotReported", msg, false)
        }
    };
    Verdict { condition: DesiredCondition::new(ConditionType::Machine, status, reason, message), holds }
}

fn named(ids: &[String]) -> String {
    let mut out = ids.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    if ids.len() > NAMED {
        out.push_str(&format!(" and {} more", ids.len() - NAMED));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nova's servers, the agent's domains, forced, the reason, whether it holds.
    type Row = (Vec<String>, Option<Vec<String>>, bool, &'static str, bool);

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_servers_none_of_which_the_agent_saw_hold_the_eviction_unless_forced() {
        let (a, b, c) = (
            "a0000000-0000-0000-0000-000000000001",
            "b0000000-0000-0000-0000-000000000002",
            "c0000000-0000-0000-0000-000000000003",
        );
        let rows: Vec<Row> = vec![
            (ids(&[a, b]), Some(ids(&[a, b])), false, "Seen", false),
            (ids(&[]), Some(ids(&[c])), false, "Seen", false),
            (ids(&[a, b]), Some(ids(&[a])), false, "PartlySeen", false),
            (ids(&[a, b]), Some(ids(&[c])), false, "NotTheMachine", true),
            (ids(&[a]), Some(ids(&[])), false, "NotTheMachine", true),
            (ids(&[a, b]), Some(ids(&[c])), true, "Forced", false),
            (ids(&[a]), None, false, "NotReported", false),
        ];
        for (nova, domains, forced, reason, holds) in rows {
            let v = judge("node-1", "compute-1", &nova, domains.as_deref(), forced);
            assert_eq!(
                (v.condition.reason.as_str(), v.holds),
                (reason, holds),
                "{nova:?} {domains:?} {forced}"
            );
        }
        let held = judge("node-1", "compute-1", &ids(&[a, b]), Some(&ids(&[c])), false);
        let m = &held.condition.message;
        assert!(
            m.contains(a) && m.contains(b) && m.contains("node node-1") && m.contains("host compute-1"),
            "{m}"
        );
        assert_eq!(held.condition.status, ConditionStatus::False);
    }

    #[test]
    fn a_long_list_is_cut_in_the_message() {
        let many: Vec<String> = (0..12).map(|i| format!("{i:08}-0000-0000-0000-000000000000")).collect();
        let v = judge("n", "h", &many, Some(&[]), false);
        assert!(v.condition.message.contains("and 7 more"), "{}", v.condition.message);
    }
}
