//! Which entry of the OSD map's blocklist covers this client, to say so
//! when the OSDs refuse it.
//!
//! The OSDs answer a blocklisted client's object operations (reads too, so
//! the probe's image listing) with ESHUTDOWN; that error is the signal, and
//! the map is read only then, for the evidence. A client is covered when
//! its exact address (IP, port, nonce) is listed, when its IP is listed
//! with port and nonce 0 (every client of that IP), or when its IP falls in
//! a listed CIDR range. The probe is a new process, with a new nonce, at
//! each run: an entry for one exact instance (librbd breaking a lock
//! blocklists one QEMU) never covers it, and shows as that domain's I/O
//! error instead. Pure.

use std::net::IpAddr;

use serde_json::Value;

/// One Ceph entity address: `IP:port/nonce`, the IP in brackets for IPv6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr {
    pub ip: IpAddr,
    pub port: u16,
    pub nonce: u64,
}

impl Addr {
    /// `v2:127.0.0.1:0/123`, `127.0.0.1:0/123` or `[::1]:6789/0`; the
    /// messenger type prefix is ignored, as the blocklist ignores it.
    pub fn parse(s: &str) -> Option<Addr> {
        let s = s.trim();
        let s = ["v1:", "v2:", "any:"].iter().find_map(|p| s.strip_prefix(p)).unwrap_or(s);
        let (host_port, nonce) = s.rsplit_once('/')?;
        let (host, port) = host_port.rsplit_once(':')?;
        let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
        Some(Addr { ip: host.parse().ok()?, port: port.parse().ok()?, nonce: nonce.parse().ok()? })
    }

    /// A client's addresses as `rados_getaddrs` gives them: one address,
    /// or `[a,b]`.
    pub fn parse_vec(s: &str) -> Vec<Addr> {
        let s = s.trim();
        let inner = s.strip_prefix('[').and_then(|x| x.strip_suffix(']')).filter(|x| x.contains(':'));
        // An IPv6 address alone also starts with '['; try it whole first.
        if let Some(one) = Addr::parse(s) {
            return vec![one];
        }
        inner.unwrap_or(s).split(',').filter_map(Addr::parse).collect()
    }
}

/// The blocklist entry that covers one of `own`, from `osd dump`'s JSON.
pub fn listed(own: &[Addr], osd_dump: &Value) -> Option<String> {
    let keys = |field: &str| -> Vec<String> {
        osd_dump
            .get(field)
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let exact = keys("blocklist").into_iter().find(|entry| {
        Addr::parse(entry).is_some_and(|e| {
            own.iter().any(|o| {
                o.ip == e.ip && ((e.port == 0 && e.nonce == 0) || (o.port, o.nonce) == (e.port, e.nonce))
            })
        })
    });
    exact.or_else(|| {
        keys("range_blocklist").into_iter().find(|entry| {
            // `cidr:10.1.0.0:0/16`: the network, port 0, the prefix length.
            let Some(range) = entry.strip_prefix("cidr:").and_then(Addr::parse) else { return false };
            own.iter().any(|o| in_range(o.ip, range.ip, range.nonce))
        })
    })
}

/// Every entry of the OSD map's blocklist (not its ranges).
pub fn entries(osd_dump: &Value) -> Vec<String> {
    osd_dump
        .get("blocklist")
        .and_then(Value::as_object)
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Whether two entries name the same address (`10.0.0.5:0/0` and
/// `any:10.0.0.5:0/0` do).
pub fn same_entry(a: &str, b: &str) -> bool {
    match (Addr::parse(a), Addr::parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

fn in_range(ip: IpAddr, net: IpAddr, bits: u64) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - bits) };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn me() -> Vec<Addr> {
        Addr::parse_vec("v2:10.0.0.5:0/3860369382")
    }

    #[test]
    fn addresses_parse_with_or_without_a_type_and_for_ipv6() {
        assert_eq!(me(), vec![Addr { ip: "10.0.0.5".parse().unwrap(), port: 0, nonce: 3_860_369_382 }]);
        assert_eq!(Addr::parse("[::1]:6789/7").map(|a| (a.port, a.nonce)), Some((6789, 7)));
        assert_eq!(Addr::parse_vec("[v2:10.0.0.5:0/1,v1:10.0.0.5:0/1]").len(), 2);
        assert_eq!(Addr::parse_vec("[::1]:0/1").len(), 1);
        for garbage in ["", "10.0.0.5", "10.0.0.5:0", "x:0/1", "10.0.0.5:99999/1", "[v2:1.2.3.4:0/1"] {
            assert_eq!(Addr::parse(garbage), None, "{garbage}");
        }
    }

    #[test]
    fn the_exact_address_the_whole_ip_or_a_range_blocklist_the_client_and_nothing_else_does() {
        let dump = |entries: &[&str], ranges: &[&str]| {
            let map =
                |xs: &[&str]| xs.iter().map(|x| (x.to_string(), json!("2026-11-24T18:00:00Z"))).collect();
            json!({"blocklist": Value::Object(map(entries)), "range_blocklist": Value::Object(map(ranges))})
        };
        let hit = |entries: &[&str], ranges: &[&str]| listed(&me(), &dump(entries, ranges));
        assert_eq!(hit(&["10.0.0.5:0/3860369382"], &[]).as_deref(), Some("10.0.0.5:0/3860369382"));
        assert_eq!(hit(&["10.0.0.5:0/0"], &[]).as_deref(), Some("10.0.0.5:0/0"));
        assert_eq!(hit(&[], &["cidr:10.0.0.0:0/24"]).as_deref(), Some("cidr:10.0.0.0:0/24"));
        assert_eq!(hit(&[], &["cidr:0.0.0.0:0/0"]).as_deref(), Some("cidr:0.0.0.0:0/0"));
        // Another instance of the same IP, another IP, another range, IPv6.
        assert_eq!(hit(&["10.0.0.5:0/1", "10.0.0.6:0/0", "[::1]:0/0"], &["cidr:10.0.1.0:0/24"]), None);
        assert_eq!(hit(&["10.0.0.5:6800/0"], &[]), None, "a port with nonce 0 is one instance, not the IP");
        assert_eq!(hit(&[], &["cidr:10.0.0.0:0/99", "10.0.0.0:0/8"]), None, "malformed ranges");
        assert_eq!(listed(&me(), &json!({"blocklist": []})), None);
        assert_eq!(listed(&[], &dump(&["10.0.0.5:0/0"], &[])), None);
        assert_eq!(
            entries(&dump(&["10.0.0.5:0/0"], &["cidr:10.0.0.0:0/24"])),
            vec!["10.0.0.5:0/0".to_string()]
        );
        assert!(same_entry("v2:10.0.0.5:0/0", "10.0.0.5:0/0") && !same_entry("10.0.0.5:0/0", "10.0.0.5:0/1"));
    }
}
