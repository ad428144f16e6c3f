//! What a fencing's storage step blocklists. The site's own list
//! (`spec.fencing.cephAddresses`) when it gives one, else the IPs the
//! host's agent reported its Ceph client at. An IP any other Hypervisor
//! also has is refused: blocklisting it would cut that host's storage too
//! (a NAT, an address moved, a typo, or an agent reporting another host's
//! IP), and a fencing must never harm a host that is not the dead one.

use std::net::IpAddr;

/// The IP of a blocklist address: a bare IP, or one client instance's
/// `IP:PORT/NONCE` (None: neither).
fn ip_of(address: &str) -> Option<IpAddr> {
    let a = address.trim();
    let bare = a.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(a);
    if let Ok(ip) = bare.parse() {
        return Some(ip);
    }
    let (host_port, _nonce) = a.rsplit_once('/')?;
    let (host, _port) = host_port.rsplit_once(':')?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// Whether `address` names every client of its IP (not one instance).
fn whole_ip(address: &str) -> bool {
    let a = address.trim();
    a.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(a).parse::<IpAddr>().is_ok()
}

/// The addresses to blocklist for a host: `spec` when given, else
/// `learned`; refused, with the reason, when a whole IP among them is one
/// of `others`' (every other Hypervisor by name, with its spec and learned
/// addresses), or when there is none at all. Pure.
pub fn ceph_addresses(
    spec: &[String],
    learned: &[String],
    others: &[(String, Vec<String>)],
) -> Result<Vec<String>, String> {
    let (chosen, whence) = if spec.is_empty() {
        (learned, "reported by its agent")
    } else {
        (spec, "in spec.fencing.cephAddresses")
    };
    if chosen.is_empty() {
        return Err("the host uses Ceph and its Ceph client addresses are unknown: its agent never \
                    reported them and spec.fencing.cephAddresses is empty"
            .into());
    }
    let mut shared = Vec::new();
    for a in chosen.iter().filter(|a| whole_ip(a)) {
        let ip = ip_of(a);
        let holders: Vec<&str> = others
            .iter()
            .filter(|(_, theirs)| theirs.iter().any(|t| ip_of(t) == ip))
            .map(|(name, _)| name.as_str())
            .collect();
        if !holders.is_empty() {
            shared.push(format!("{a} (also {})", holders.join(", ")));
        }
    }
    if !shared.is_empty() {
        return Err(format!(
            "its Ceph address(es) {whence} belong to other hosts too: {}; blocklisting them would cut \
             those hosts' storage. Give this host's own in spec.fencing.cephAddresses",
            shared.join("; ")
        ));
    }
    Ok(chosen.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_sites_addresses_win_else_the_agents_and_none_is_refused() {
        let others = vec![("compute-2".to_string(), v(&["10.0.0.2"]))];
        assert_eq!(ceph_addresses(&v(&["10.1.0.1"]), &v(&["10.0.0.1"]), &others), Ok(v(&["10.1.0.1"])));
        assert_eq!(ceph_addresses(&[], &v(&["10.0.0.1"]), &others), Ok(v(&["10.0.0.1"])));
        let err = ceph_addresses(&[], &[], &others).unwrap_err();
        assert!(err.contains("unknown"), "{err}");
    }

    #[test]
    fn an_ip_another_host_has_is_never_blocklisted_for_this_one() {
        let others = vec![
            ("compute-2".to_string(), v(&["10.0.0.2"])),
            ("compute-3".to_string(), v(&["10.0.0.3", "fd00::1"])),
        ];
        // The agent reports another host's IP (moved, NATed, or forged).
        let err = ceph_addresses(&[], &v(&["10.0.0.1", "10.0.0.3"]), &others).unwrap_err();
        assert!(err.contains("10.0.0.3 (also compute-3)") && !err.contains("10.0.0.1 ("), "{err}");
        assert!(err.contains("reported by its agent"), "{err}");
        // The site's own typo, and IPv6 in brackets.
        let err = ceph_addresses(&v(&["[fd00::1]"]), &[], &others).unwrap_err();
        assert!(err.contains("also compute-3") && err.contains("spec.fencing.cephAddresses"), "{err}");
        // Another host known by one client instance of the IP: still its IP.
        let by_instance = vec![("compute-4".to_string(), v(&["10.0.0.4:6800/77"]))];
        assert!(ceph_addresses(&[], &v(&["10.0.0.4"]), &by_instance).is_err());
        // One client instance of a shared IP cuts that instance only: allowed.
        assert_eq!(ceph_addresses(&v(&["10.0.0.2:0/4242"]), &[], &others), Ok(v(&["10.0.0.2:0/4242"])));
    }
}
