//! Whether the node's machine is the one Nova means by its host.
//!
//! A Node's annotation, or a spec, can name any Nova host. Nova's libvirt
//! driver names a host's hypervisor record after what libvirt on that
//! machine calls itself (`virConnectGetHostname`), and the node's agent asks
//! the same libvirt the same question. When the two differ, the node is not
//! the machine that registered the host: activating it would let its
//! fencing power off, and its evacuation rebuild, another machine's VMs.
//! Pure.

/// libvirt's host name on the node against Nova's hypervisor record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Machine {
    /// The same name (DNS names: case and a trailing dot aside).
    Same,
    /// Another machine registered the host.
    Differs { agent: String, nova: String },
    /// One side has not said yet.
    Unknown(Unknown),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// The node's agent has not reported its host name.
    Agent,
    /// Nova has no hypervisor record for the host yet.
    Nova,
}

/// Compares the host name the node's agent reported with Nova's record.
pub fn compare(agent: Option<&str>, nova: Option<&str>) -> Machine {
    let name = |s: &str| s.trim().trim_end_matches('.').to_ascii_lowercase();
    let agent = agent.map(name).filter(|a| !a.is_empty());
    let nova = nova.map(name).filter(|n| !n.is_empty());
    match (agent, nova) {
        (None, _) => Machine::Unknown(Unknown::Agent),
        (_, None) => Machine::Unknown(Unknown::Nova),
        (Some(a), Some(n)) if a == n => Machine::Same,
        (Some(agent), Some(nova)) => Machine::Differs { agent, nova },
    }
}

/// What Nova lists on a host against the domains its agent last reported
/// (with the libvirt driver a domain's UUID is its server's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Servers {
    /// Every server Nova lists was reported by the agent (or Nova lists none).
    Seen,
    /// Some were not reported (started after the agent's last report): shown,
    /// not blocking.
    Partly { unseen: Vec<String> },
    /// Nova lists servers and the agent reported none of them: the host is
    /// not the machine Nova means.
    NoneSeen { nova: usize, agent: usize },
    /// The agent's domains were never recorded: nothing to compare with.
    NotReported,
}

/// Compares the servers Nova lists on a host with the domains its agent
/// last reported (`None`: never reported). Both are UUIDs; case aside.
pub fn servers(nova: &[String], domains: Option<&[String]>) -> Servers {
    let Some(domains) = domains else {
        return if nova.is_empty() { Servers::Seen } else { Servers::NotReported };
    };
    let seen: std::collections::BTreeSet<String> = domains.iter().map(|d| d.to_ascii_lowercase()).collect();
    let unseen: Vec<String> =
        nova.iter().filter(|s| !seen.contains(&s.to_ascii_lowercase())).cloned().collect();
    if unseen.is_empty() {
        Servers::Seen
    } else if unseen.len() == nova.len() {
        Servers::NoneSeen { nova: nova.len(), agent: domains.len() }
    } else {
        Servers::Partly { unseen }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_compare_as_dns_names() {
        let rows: &[(Option<&str>, Option<&str>, Machine)] = &[
            (Some("compute-1"), Some("compute-1"), Machine::Same),
            (Some("Compute-1.example.com."), Some("compute-1.EXAMPLE.com"), Machine::Same),
            (Some(" compute-1 "), Some("compute-1"), Machine::Same),
            (
                Some("compute-2"),
                Some("compute-1"),
                Machine::Differs { agent: "compute-2".into(), nova: "compute-1".into() },
            ),
            // A short name is not its FQDN: Nova's driver records what
            // libvirt said, and the agent asks the same libvirt.
            (
                Some("compute-1"),
                Some("compute-1.example.com"),
                Machine::Differs { agent: "compute-1".into(), nova: "compute-1.example.com".into() },
            ),
            (None, Some("compute-1"), Machine::Unknown(Unknown::Agent)),
            (Some(""), Some("compute-1"), Machine::Unknown(Unknown::Agent)),
            (Some("compute-1"), None, Machine::Unknown(Unknown::Nova)),
            (Some("compute-1"), Some(" "), Machine::Unknown(Unknown::Nova)),
            (None, None, Machine::Unknown(Unknown::Agent)),
        ];
        for (agent, nova, want) in rows {
            assert_eq!(&compare(*agent, *nova), want, "{agent:?} against {nova:?}");
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn servers_against_domains() {
        let a = "aaaaaaaa-0000-0000-0000-000000000001";
        let b = "bbbbbbbb-0000-0000-0000-000000000002";
        let c = "cccccccc-0000-0000-0000-000000000003";
        let rows: Vec<(Vec<String>, Option<Vec<String>>, Servers)> = vec![
            (ids(&[]), None, Servers::Seen),
            (ids(&[]), Some(ids(&[a])), Servers::Seen),
            (ids(&[a, b]), Some(ids(&[b, a, c])), Servers::Seen),
            (ids(&[a]), Some(ids(&[&a.to_uppercase()])), Servers::Seen),
            (ids(&[a, b]), Some(ids(&[a])), Servers::Partly { unseen: ids(&[b]) }),
            (ids(&[a, b]), Some(ids(&[c])), Servers::NoneSeen { nova: 2, agent: 1 }),
            (ids(&[a]), Some(ids(&[])), Servers::NoneSeen { nova: 1, agent: 0 }),
            (ids(&[a]), None, Servers::NotReported),
        ];
        for (nova, domains, want) in rows {
            assert_eq!(servers(&nova, domains.as_deref()), want, "{nova:?} against {domains:?}");
        }
    }
}
