//! What a fencing's storage step blocklists, and what a clearing lifts.
//! The site's own list (`spec.fencing.cephAddresses`) when it gives one,
//! else the IPs the host's agent reported its Ceph client at, within the
//! site's Ceph client networks when it names them. An IP any other
//! Hypervisor also has (in its spec, its report or its own fencing) is
//! refused: blocklisting it would cut that host's storage too (a NAT, an
//! address moved, a typo, or an agent reporting another host's IP), and a
//! fencing must never harm a host that is not the dead one.

use std::net::IpAddr;

use ipnet::IpNet;

/// The IP of a blocklist address, and whether the address names every
/// client of that IP (a bare IP, or `IP:0/0` as Ceph reads it) rather than
/// one client instance (`IP:PORT/NONCE`). None: neither form.
fn parse(address: &str) -> Option<(IpAddr, bool)> {
    let a = address.trim();
    let bare = a.strip_prefix('[').and_then(|x| x.strip_suffix(']')).unwrap_or(a);
    if let Ok(ip) = bare.parse() {
        return Some((ip, true));
    }
    let (host_port, nonce) = a.rsplit_once('/')?;
    let (host, port) = host_port.rsplit_once(':')?;
    let ip = host.trim_start_matches('[').trim_end_matches(']').parse().ok()?;
    Some((ip, port == "0" && nonce == "0"))
}

/// Whether `a` and `b` cut a common client: the same entry, or the same IP
/// with either naming every client of it.
fn overlap(a: &str, b: &str) -> bool {
    match (parse(a), parse(b)) {
        (Some((ia, wa)), Some((ib, wb))) => ia == ib && (wa || wb || a.trim() == b.trim()),
        _ => false,
    }
}

/// The addresses to blocklist for a host: `spec` when given, else
/// `learned` (each within one of `networks`, when any is named); refused,
/// with the reason, when one of them overlaps any of `others`' (every
/// other Hypervisor by name, with its spec, learned and fenced addresses),
/// or when there is none at all. Pure.
pub fn ceph_addresses(
    spec: &[String],
    learned: &[String],
    networks: &[IpNet],
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
    // Nothing recorded that Ceph would refuse: a clearing must be able to
    // lift whatever was recorded.
    let bad: Vec<&str> =
        chosen.iter().filter(|a| super::ceph::entry_for(a).is_err()).map(String::as_str).collect();
    if !bad.is_empty() {
        return Err(format!(
            "{} {whence} not a Ceph client address (IP, IP:port/nonce)",
            bad.iter().map(|b| format!("{b:?}")).collect::<Vec<_>>().join(", ")
        ));
    }
    if spec.is_empty() && !networks.is_empty() {
        let outside: Vec<&str> = learned
            .iter()
            .filter(|a| !parse(a).is_some_and(|(ip, _)| networks.iter().any(|n| n.contains(&ip))))
            .map(String::as_str)
            .collect();
        if !outside.is_empty() {
            return Err(format!(
                "its agent reported Ceph address(es) {} outside --ceph-client-networks: not blocklisted on \
                 its word. Give the host's own in spec.fencing.cephAddresses",
                outside.join(", ")
            ));
        }
    }
    let mut shared = Vec::new();
    for a in chosen {
        let holders: Vec<&str> = others
            .iter()
            .filter(|(_, theirs)| theirs.iter().any(|t| overlap(a, t)))
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

/// Most addresses a fencing records (the CRD's limit on the record).
pub const MAX_RECORDED: usize = 32;

/// What the record must gain before the storage step blocklists `chosen`
/// (those not in `recorded` yet), refused past [`MAX_RECORDED`]: addresses
/// that keep changing during a stuck fencing stop it, rather than grow a
/// record the API server would refuse. Pure.
pub fn to_record(recorded: &[String], chosen: &[String]) -> Result<Vec<String>, String> {
    let mut new: Vec<String> = Vec::new();
    for a in chosen.iter().filter(|a| !recorded.contains(a)) {
        if !new.contains(a) {
            new.push(a.clone());
        }
    }
    if recorded.len() + new.len() > MAX_RECORDED {
        return Err(format!(
            "{} Ceph addresses recorded already, {} more asked: more than {MAX_RECORDED}; look at \
             spec.fencing.cephAddresses",
            recorded.len(),
            new.len()
        ));
    }
    Ok(new)
}

/// What a clearing lifts: the addresses its fencing recorded (`recorded`;
/// `old`: a record from before addresses were recorded, whose storage step
/// was taken: the spec's then), never one another host's fencing still
/// holds (`held`), nor one Ceph would refuse. Pure.
pub fn to_lift(recorded: &[String], spec: &[String], old: bool, held: &[String]) -> Vec<String> {
    let mine = if recorded.is_empty() && old { spec } else { recorded };
    mine.iter()
        .filter(|a| super::ceph::entry_for(a).is_ok())
        .filter(|a| !held.iter().any(|h| overlap(a, h)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_ceph_would_refuse_is_never_recorded() {
        let err = ceph_addresses(&v(&["10.0.0.0/24", "0.0.0.0", "10.0.0.1"]), &[], &[], &[]).unwrap_err();
        assert!(
            err.contains("\"10.0.0.0/24\", \"0.0.0.0\" in spec.fencing.cephAddresses not a Ceph"),
            "{err}"
        );
    }

    #[test]
    fn the_sites_addresses_win_else_the_agents_and_none_is_refused() {
        let others = vec![("compute-2".to_string(), v(&["10.0.0.2"]))];
        assert_eq!(ceph_addresses(&v(&["10.1.0.1"]), &v(&["10.0.0.1"]), &[], &others), Ok(v(&["10.1.0.1"])));
        assert_eq!(ceph_addresses(&[], &v(&["10.0.0.1"]), &[], &others), Ok(v(&["10.0.0.1"])));
        let err = ceph_addresses(&[], &[], &[], &others).unwrap_err();
        assert!(err.contains("unknown"), "{err}");
    }

    #[test]
    fn an_agents_word_counts_only_within_the_sites_ceph_networks() {
        let nets: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()];
        assert_eq!(
            ceph_addresses(&[], &v(&["10.0.0.1", "fd00::1"]), &nets, &[]),
            Ok(v(&["10.0.0.1", "fd00::1"]))
        );
        let err = ceph_addresses(&[], &v(&["10.0.0.1", "192.168.1.5"]), &nets, &[]).unwrap_err();
        assert!(err.contains("192.168.1.5 outside") && !err.contains("10.0.0.1,"), "{err}");
        // The site's own list is its own word.
        assert_eq!(ceph_addresses(&v(&["192.168.1.5"]), &[], &nets, &[]), Ok(v(&["192.168.1.5"])));
    }

    #[test]
    fn an_ip_another_host_has_is_never_blocklisted_for_this_one() {
        let others = vec![
            ("compute-2".to_string(), v(&["10.0.0.2"])),
            ("compute-3".to_string(), v(&["10.0.0.3", "fd00::1"])),
        ];
        // The agent reports another host's IP (moved, NATed, or forged).
        let err = ceph_addresses(&[], &v(&["10.0.0.1", "10.0.0.3"]), &[], &others).unwrap_err();
        assert!(err.contains("10.0.0.3 (also compute-3)") && !err.contains("10.0.0.1 ("), "{err}");
        assert!(err.contains("reported by its agent"), "{err}");
        // The site's own typo, IPv6 in brackets, and IP:0/0 (every client of the IP, as Ceph reads it).
        let err = ceph_addresses(&v(&["[fd00::1]"]), &[], &[], &others).unwrap_err();
        assert!(err.contains("also compute-3") && err.contains("spec.fencing.cephAddresses"), "{err}");
        assert!(ceph_addresses(&v(&["10.0.0.2:0/0"]), &[], &[], &others).is_err());
        // Another host known by one client instance of the IP: still its IP.
        let by_instance = vec![("compute-4".to_string(), v(&["10.0.0.4:6800/77"]))];
        assert!(ceph_addresses(&[], &v(&["10.0.0.4"]), &[], &by_instance).is_err());
        // One client instance at another host's IP is one of its clients: refused.
        assert!(ceph_addresses(&v(&["10.0.0.2:6800/4242"]), &[], &[], &others).is_err());
        // Two instances of one IP, each host its own: each cuts its own only.
        let instance = vec![("compute-5".to_string(), v(&["10.0.0.5:6800/1"]))];
        assert_eq!(
            ceph_addresses(&v(&["10.0.0.5:6801/2"]), &[], &[], &instance),
            Ok(v(&["10.0.0.5:6801/2"]))
        );
    }

    #[test]
    fn the_record_gains_only_what_it_lacks_and_never_past_its_limit() {
        assert_eq!(
            to_record(&v(&["10.0.0.1"]), &v(&["10.0.0.1", "10.0.0.2", "10.0.0.2"])),
            Ok(v(&["10.0.0.2"]))
        );
        assert_eq!(
            to_record(&v(&["10.0.0.1"]), &v(&["10.0.0.1"])),
            Ok(vec![]),
            "nothing new: the step itself"
        );
        let full: Vec<String> = (1..=MAX_RECORDED).map(|i| format!("10.0.1.{i}")).collect();
        assert_eq!(to_record(&full, &v(&["10.0.1.1"])), Ok(vec![]));
        let err = to_record(&full, &v(&["10.0.2.1"])).unwrap_err();
        assert!(err.contains("32 Ceph addresses recorded already, 1 more"), "{err}");
    }

    #[test]
    fn a_clearing_lifts_what_its_fencing_recorded_and_never_what_another_fencing_holds() {
        assert_eq!(to_lift(&v(&["10.0.0.1"]), &v(&["10.9.9.9"]), false, &[]), v(&["10.0.0.1"]));
        assert_eq!(to_lift(&[], &v(&["10.9.9.9"]), true, &[]), v(&["10.9.9.9"]), "a record from before");
        assert!(to_lift(&[], &v(&["10.9.9.9"]), false, &[]).is_empty(), "nothing was added");
        assert_eq!(
            to_lift(&v(&["10.0.0.1", "10.0.0.2"]), &[], false, &v(&["10.0.0.2:0/0"])),
            v(&["10.0.0.1"])
        );
        assert_eq!(
            to_lift(&v(&["10.0.0.1", "10.0.0.0/24"]), &[], false, &[]),
            v(&["10.0.0.1"]),
            "never refused"
        );
    }
}
