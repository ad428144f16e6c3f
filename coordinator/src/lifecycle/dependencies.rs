//! The pods a host must have Ready before it takes VMs
//! (`--node-dependency`): its network agent (OVS, OVN), which a VM
//! scheduled there cannot do without. Pure.
//!
//! A host in Ready is enabled only once each dependency has a Ready pod
//! on its Node; one that stops being Ready on an Active host is a health
//! signal that Degrades the host without emptying it (docs/lifecycle.md).

use std::fmt;

use crate::drain::admission::Selector;

/// Pods of a namespace by labels, one of which must run Ready on the host.
#[derive(Clone, Debug)]
pub struct Dependency {
    pub namespace: String,
    pub selector: Selector,
}

impl std::str::FromStr for Dependency {
    type Err = String;

    /// `NAMESPACE/SELECTOR`, as in `openstack/app=neutron-ovs-agent`.
    fn from_str(s: &str) -> Result<Dependency, String> {
        let (namespace, selector) =
            s.split_once('/').ok_or_else(|| format!("{s:?}: expected NAMESPACE/SELECTOR"))?;
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        let is_name = namespace.len() <= 63
            && edge(namespace.chars().next())
            && edge(namespace.chars().last())
            && namespace.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !is_name {
            return Err(format!("{namespace:?} is not a namespace name"));
        }
        if selector.trim().is_empty() {
            return Err(format!("{s:?}: the selector is empty (it would match every pod)"));
        }
        Ok(Dependency { namespace: namespace.to_string(), selector: selector.parse()? })
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.selector.as_str())
    }
}

/// A pod of a dependency on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodState {
    pub name: String,
    /// Its `Ready` condition is True and it is not being deleted.
    pub ready: bool,
}

/// What `dep` lacks on the host, `pods` being its pods there: None once
/// one of them is Ready.
pub fn unmet(dep: &Dependency, pods: &[PodState]) -> Option<String> {
    if pods.iter().any(|p| p.ready) {
        return None;
    }
    if pods.is_empty() {
        return Some(format!("{dep}: no pod on the node"));
    }
    let mut names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    names.sort_unstable();
    Some(format!("{dep}: {} not Ready", names.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep() -> Dependency {
        "openstack/app=ovs-agent".parse().unwrap_or_else(|e: String| panic!("{e}"))
    }

    fn pod(name: &str, ready: bool) -> PodState {
        PodState { name: name.into(), ready }
    }

    #[test]
    fn parsed_and_refused() {
        assert_eq!(dep().to_string(), "openstack/app=ovs-agent");
        for bad in ["app=ovs-agent", "Open/app=x", "openstack/", "-x/app=y", "openstack/=x"] {
            assert!(bad.parse::<Dependency>().is_err(), "{bad}");
        }
    }

    #[test]
    fn one_ready_pod_meets_it_and_otherwise_it_says_what_lacks() {
        assert_eq!(unmet(&dep(), &[]).as_deref(), Some("openstack/app=ovs-agent: no pod on the node"));
        let waiting = [pod("ovs-b", false), pod("ovs-a", false)];
        assert_eq!(
            unmet(&dep(), &waiting).as_deref(),
            Some("openstack/app=ovs-agent: ovs-a, ovs-b not Ready")
        );
        assert_eq!(unmet(&dep(), &[pod("ovs-a", false), pod("ovs-b", true)]), None, "a rollout's new pod");
    }
}
