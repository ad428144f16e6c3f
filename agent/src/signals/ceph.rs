//! Ceph health signals (docs/health.md), from the periodic RBD probe of
//! the configured pools: a pool the probe cannot use is a warning that
//! turns critical when it lasts (the VMs' disks are there; one failed probe
//! may be a hiccup); a probe slower than [`SLOW`] is a warning; a client the
//! cluster has blocklisted is critical at once (no VM of the host can write
//! a block, and it will not pass by itself).

use std::time::Duration;

use hv_proto::v1::{HealthSeverity, HealthSignalKind};

use super::Update;
use crate::ceph::PoolCheck;

/// A pool's probe (open the pool, list its images, open the first; the connection
/// is not counted) slower than this.
pub const SLOW: Duration = Duration::from_secs(2);

/// What one round of pool checks says, a start or an end per pool and kind.
pub fn updates(checks: &[PoolCheck]) -> Vec<Update> {
    let failing = HealthSignalKind::CephProbeFailing;
    let slow = HealthSignalKind::CephProbeSlow;
    let blocklisted = HealthSignalKind::CephBlocklisted;
    let mut out = Vec::new();
    // One client for every pool: said once, by the first pool's check; it
    // ends only when a pool's probe passed (a probe that could not connect
    // says nothing either way).
    if let Some(c) = checks.iter().find(|c| c.blocklisted) {
        out.push(Update::hold(blocklisted, "client", HealthSeverity::Critical, c.message.clone()));
    } else if checks.iter().any(|c| c.passed) {
        out.push(Update::end(blocklisted, "client"));
    }
    for c in checks {
        if c.passed || c.blocklisted {
            out.push(Update::end(failing, &c.pool));
        } else {
            // The probe's message names the error (auth, timeout, missing
            // pool); it stays the same while the cause does.
            let evidence = format!("the RBD probe of pool {} fails: {}", c.pool, c.message);
            out.push(Update::hold(failing, &c.pool, HealthSeverity::Warning, evidence));
        }
        if c.passed && c.latency > SLOW {
            let evidence = format!("the RBD probe of pool {} took longer than {} s", c.pool, SLOW.as_secs());
            out.push(Update::hold(slow, &c.pool, HealthSeverity::Warning, evidence));
        } else {
            out.push(Update::end(slow, &c.pool));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(passed: bool, ms: u64) -> PoolCheck {
        PoolCheck {
            pool: "vms".into(),
            passed,
            message: if passed { "ok".into() } else { "permission denied".into() },
            latency: Duration::from_millis(ms),
            blocklisted: false,
            client_ips: Vec::new(),
        }
    }

    fn holds(u: &[Update], kind: HealthSignalKind) -> bool {
        u.iter().any(|x| x.kind == kind && x.now.is_some())
    }

    #[test]
    fn a_failing_pool_is_a_warning_a_slow_one_too_and_a_good_one_ends_both() {
        let u = updates(&[check(false, 10)]);
        assert!(holds(&u, HealthSignalKind::CephProbeFailing));
        assert!(!holds(&u, HealthSignalKind::CephProbeSlow), "a failure is not also slow");
        let u = updates(&[check(true, 2_500)]);
        assert!(holds(&u, HealthSignalKind::CephProbeSlow) && !holds(&u, HealthSignalKind::CephProbeFailing));
        let u = updates(&[check(true, 5)]);
        assert!(u.iter().all(|x| x.now.is_none()) && u.len() == 3);
        assert_eq!(updates(&[check(false, 5)]).len(), 2, "a failure leaves the blocklist signal as it is");
    }

    #[test]
    fn a_blocklisted_client_is_critical_once_for_every_pool_and_not_also_a_failing_probe() {
        let listed = PoolCheck {
            blocklisted: true,
            message: "client.n at v2:10.0.0.5:0/1 is blocklisted".into(),
            ..check(false, 5)
        };
        let other = PoolCheck { pool: "images".into(), ..listed.clone() };
        let u = updates(&[listed, other]);
        let held: Vec<&Update> = u.iter().filter(|x| x.now.is_some()).collect();
        assert_eq!(held.len(), 1, "{u:?}");
        assert_eq!(held[0].kind, HealthSignalKind::CephBlocklisted);
        assert_eq!(held[0].now.as_ref().map(|n| n.0), Some(HealthSeverity::Critical));
        assert!(held[0].now.as_ref().is_some_and(|n| n.1.contains("blocklisted")));
        // A probe that fails otherwise (no connection) says nothing of it;
        // one that passes ends it.
        let is_blocklist = |x: &Update| x.kind == HealthSignalKind::CephBlocklisted;
        assert!(!updates(&[check(false, 5)]).iter().any(is_blocklist));
        let u = updates(&[check(true, 5)]);
        assert!(u.iter().any(|x| is_blocklist(x) && x.now.is_none()));
        assert!(updates(&[]).is_empty());
    }
}
