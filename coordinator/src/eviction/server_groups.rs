//! Server groups in the preflight (docs/eviction.md): where Nova's
//! scheduler would let a member of an affinity or anti-affinity group go.
//! Pure.
//!
//! Nova keeps a group's rule on every move: the anti-affinity filter
//! refuses a host that already runs `max_server_per_host` (default 1) of
//! the group's other members, the affinity filter every host but those the
//! other members run on. Members on the host being emptied are leaving it,
//! so they count only where the preflight places them. The soft policies
//! only weigh hosts, and constrain nothing.

use std::collections::{BTreeMap, BTreeSet};

/// A server group's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    Affinity,
    AntiAffinity {
        max_per_host: u32,
    },
    /// `soft-affinity`, `soft-anti-affinity`, or one this client does not
    /// know: the scheduler only weighs.
    Weighs,
}

/// A group a server is in, as Nova shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub id: String,
    pub name: String,
    pub rule: Rule,
    /// Every member's host, where Nova says one.
    pub members_on: BTreeMap<String, String>,
}

impl Group {
    /// Reads Nova's `policy` and `rules`.
    pub fn rule_of(policy: &str, max_server_per_host: Option<u32>) -> Rule {
        match policy {
            "affinity" => Rule::Affinity,
            "anti-affinity" => Rule::AntiAffinity { max_per_host: max_server_per_host.unwrap_or(1).max(1) },
            _ => Rule::Weighs,
        }
    }

    fn named(&self) -> String {
        if self.name.is_empty() { self.id.clone() } else { format!("{} ({})", self.name, self.id) }
    }

    /// How many of the other members run on each host, not counting those
    /// on `source` (they are leaving).
    fn others_on(&self, me: &str, source: &str) -> BTreeMap<&str, u32> {
        let mut on: BTreeMap<&str, u32> = BTreeMap::new();
        for (member, host) in &self.members_on {
            if member != me && host != source {
                *on.entry(host.as_str()).or_default() += 1;
            }
        }
        on
    }
}

/// Members placed by this preflight so far: (group, host) → how many.
pub type Placed = BTreeMap<(String, String), u32>;

/// Of the `hosts`, those the group lets server `me` go to, given the
/// members placed so far; or why none (a `constraints` finding). An
/// affinity member with another member staying on `source` cannot go
/// anywhere: the group moves together or not at all.
pub fn allowed<'a>(
    group: &Group,
    me: &str,
    source: &str,
    hosts: &[&'a str],
    placed: &Placed,
) -> Result<Vec<&'a str>, String> {
    let others = group.others_on(me, source);
    let here = |h: &str| {
        others.get(h).copied().unwrap_or(0)
            + placed.get(&(group.id.clone(), h.to_string())).copied().unwrap_or(0)
    };
    match group.rule {
        Rule::Weighs => Ok(hosts.to_vec()),
        Rule::AntiAffinity { max_per_host } => {
            let ok: Vec<&str> = hosts.iter().copied().filter(|h| here(h) < max_per_host).collect();
            if ok.is_empty() && !hosts.is_empty() {
                return Err(format!(
                    "anti-affinity group {}: each of the {} admissible hosts already runs {max_per_host} of its members",
                    group.named(),
                    hosts.len()
                ));
            }
            Ok(ok)
        }
        Rule::Affinity => {
            let staying =
                group.members_on.iter().filter(|(m, h)| m.as_str() != me && h.as_str() == source).count();
            if staying > 0 {
                return Err(format!(
                    "affinity group {}: {staying} other member(s) on this host; Nova's scheduler places a member \
                     only where its group runs, so it cannot move alone",
                    group.named()
                ));
            }
            let group_hosts: BTreeSet<&str> = others.keys().copied().collect();
            let placed_on: BTreeSet<&str> = placed
                .iter()
                .filter(|((g, _), n)| g == &group.id && **n > 0)
                .map(|((_, h), _)| h.as_str())
                .collect();
            let ok: Vec<&str> = hosts
                .iter()
                .copied()
                .filter(|h| {
                    (group_hosts.is_empty() && placed_on.is_empty())
                        || group_hosts.contains(h)
                        || placed_on.contains(h)
                })
                .collect();
            if ok.is_empty() && !hosts.is_empty() {
                let on: Vec<&str> = group_hosts.into_iter().collect();
                return Err(format!(
                    "affinity group {}: its members run on {}, none of the admissible hosts",
                    group.named(),
                    on.join(", ")
                ));
            }
            Ok(ok)
        }
    }
}

/// Records a member placed on `host`.
pub fn place(placed: &mut Placed, group: &Group, host: &str) {
    *placed.entry((group.id.clone(), host.to_string())).or_default() += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(rule: Rule, members: &[(&str, &str)]) -> Group {
        Group {
            id: "g".into(),
            name: "web".into(),
            rule,
            members_on: members.iter().map(|(m, h)| (m.to_string(), h.to_string())).collect(),
        }
    }

    const HOSTS: [&str; 3] = ["a", "b", "c"];

    #[test]
    fn anti_affinity_keeps_members_apart_counting_those_placed() {
        let g = group(Rule::AntiAffinity { max_per_host: 1 }, &[("me", "src"), ("x", "a"), ("y", "src")]);
        let mut placed = Placed::new();
        assert_eq!(
            allowed(&g, "me", "src", &HOSTS, &placed),
            Ok(vec!["b", "c"]),
            "y leaves src: it does not count"
        );
        place(&mut placed, &g, "b");
        assert_eq!(allowed(&g, "y", "src", &HOSTS, &placed), Ok(vec!["c"]));
        place(&mut placed, &g, "c");
        let e = allowed(&g, "z", "src", &HOSTS, &placed).unwrap_err();
        assert!(e.contains("anti-affinity group web (g)") && e.contains("3 admissible"), "{e}");
    }

    #[test]
    fn anti_affinity_honours_max_server_per_host() {
        let g = group(Rule::AntiAffinity { max_per_host: 2 }, &[("me", "src"), ("x", "a")]);
        assert_eq!(allowed(&g, "me", "src", &HOSTS, &Placed::new()), Ok(HOSTS.to_vec()));
        let full = group(Rule::AntiAffinity { max_per_host: 2 }, &[("me", "src"), ("x", "a"), ("w", "a")]);
        assert_eq!(allowed(&full, "me", "src", &HOSTS, &Placed::new()), Ok(vec!["b", "c"]));
    }

    #[test]
    fn affinity_goes_where_its_group_runs_or_nowhere_while_a_member_stays() {
        let elsewhere = group(Rule::Affinity, &[("me", "src"), ("x", "b")]);
        assert_eq!(allowed(&elsewhere, "me", "src", &HOSTS, &Placed::new()), Ok(vec!["b"]));
        let gone = group(Rule::Affinity, &[("me", "src"), ("x", "z")]);
        assert!(allowed(&gone, "me", "src", &HOSTS, &Placed::new()).unwrap_err().contains("run on z"));
        let together = group(Rule::Affinity, &[("me", "src"), ("x", "src")]);
        let e = allowed(&together, "me", "src", &HOSTS, &Placed::new()).unwrap_err();
        assert!(e.contains("1 other member(s) on this host"), "{e}");
        let alone = group(Rule::Affinity, &[("me", "src")]);
        assert_eq!(allowed(&alone, "me", "src", &HOSTS, &Placed::new()), Ok(HOSTS.to_vec()));
    }

    #[test]
    fn soft_and_unknown_policies_constrain_nothing() {
        for policy in ["soft-anti-affinity", "soft-affinity", "something-new"] {
            let g = group(Group::rule_of(policy, None), &[("me", "src"), ("x", "a"), ("y", "b"), ("z", "c")]);
            assert_eq!(allowed(&g, "me", "src", &HOSTS, &Placed::new()), Ok(HOSTS.to_vec()), "{policy}");
        }
        assert_eq!(Group::rule_of("anti-affinity", Some(0)), Rule::AntiAffinity { max_per_host: 1 });
        assert_eq!(Group::rule_of("anti-affinity", Some(3)), Rule::AntiAffinity { max_per_host: 3 });
    }
}
