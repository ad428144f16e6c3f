//! Signs that a fenced host lives, beside its agent and its BMC
//! (docs/fencing.md, "A fenced host that shows life"): its kubelet renewing
//! its Lease, its nova-compute reporting to Nova.
//!
//! Nova shows a forced-down service `down` whatever it reports, so its
//! state says nothing. What moves is the row's `updated_at`, written by
//! every report of nova-compute (every `report_interval`, 10 s by
//! default) and by every change of its status, ours or an SRE's. A report
//! is a move of `updated_at` between two reads of the row that change
//! nothing else in it. Nova's times are compared only with Nova's: no
//! clock skew enters. A change of status and a report between the same two
//! reads hide that report; the next one is seen.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::health::Heartbeat;

/// The kubelet renewed its Lease since the host counted fenced (or was
/// fenced again) and lately: within half the Lease's duration, the rule
/// that makes it alive (docs/health.md). `lease.renewed` is when this
/// leader saw the renewal, by its own clock: a leader's first read of a
/// Lease never finds it renewed lately, so a fail-over brings no false
/// sign, and a kubelet's clock running ahead none either.
pub fn kubelet_renewed(lease: Heartbeat, since: Timestamp, now: Timestamp) -> bool {
    lease.renewed > since && now.duration_since(lease.renewed) < lease.duration / 2
}

/// One read of the host's compute service row: what a change of its status
/// changes, and when Nova last wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub forced_down: bool,
    pub updated_at: Option<Timestamp>,
}

/// How long a report seen counts as a sign: Nova's own `service_down_time`
/// (a service that reported within it is up), so a nova-compute that
/// reports every 10 s stays a sign between reports.
pub const REPORT_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// Per host, since when its fencing counts (it counted fenced, or was
/// fenced again), the last read of its row, and when a report was last
/// seen.
#[derive(Debug, Default)]
pub struct Reports {
    last: BTreeMap<String, Look>,
}

#[derive(Debug)]
struct Look {
    since: Timestamp,
    /// When the first read of this fencing was made, by this process.
    first: Timestamp,
    row: Row,
    reported: Option<Timestamp>,
}

impl Reports {
    /// Whether nova-compute reported within [`REPORT_WINDOW`] of `now`, by
    /// this host's reads of the same fencing (`since`), `row` read now
    /// becoming the last. The first read of a fencing shows none: it is
    /// what later reads are compared with.
    pub fn reported_lately(&mut self, host: &str, since: Timestamp, row: Row, now: Timestamp) -> bool {
        let (first, reported) = match self.last.get(host) {
            Some(l) if l.since == since => (l.first, is_report(&l.row, &row).then_some(now).or(l.reported)),
            _ => (now, None),
        };
        self.last.insert(host.to_string(), Look { since, first, row, reported });
        reported.is_some_and(|t| now.duration_since(t) < REPORT_WINDOW)
    }

    /// Whether the host's reads of this fencing (`since`) have watched for
    /// reports for [`REPORT_WINDOW`] at least by `now`: long enough to have
    /// seen one, had nova-compute run.
    pub fn watched(&self, host: &str, since: Timestamp, now: Timestamp) -> bool {
        self.last.get(host).is_some_and(|l| l.since == since && now.duration_since(l.first) >= REPORT_WINDOW)
    }

    /// Forgets the host: it is not looked at for signs of life.
    pub fn forget(&mut self, host: &str) {
        self.last.remove(host);
    }

    /// How many hosts are remembered.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

fn is_report(previous: &Row, now: &Row) -> bool {
    let moved = match (previous.updated_at, now.updated_at) {
        (Some(a), Some(b)) => b > a,
        (None, Some(_)) => true,
        (_, None) => false,
    };
    let status = |r: &Row| (r.enabled, r.disabled_reason.clone(), r.forced_down);
    moved && status(previous) == status(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap_or_default()
    }

    fn row(updated: Option<i64>) -> Row {
        Row {
            enabled: false,
            disabled_reason: Some("hv-lifecycle: fenced".into()),
            forced_down: true,
            updated_at: updated.map(at),
        }
    }

    #[test]
    fn a_renewal_since_the_fencing_and_lately_is_a_sign() {
        let d = jiff::SignedDuration::from_secs(40);
        let lease = |renewed: i64| Heartbeat { renewed: at(renewed), duration: d };
        assert!(kubelet_renewed(lease(30), at(10), at(35)), "since the fencing, 5 s ago");
        assert!(!kubelet_renewed(lease(5), at(10), at(12)), "before the fencing");
        assert!(!kubelet_renewed(lease(10), at(10), at(12)), "at the fencing itself");
        assert!(!kubelet_renewed(lease(30), at(10), at(50)), "20 s ago: half the duration");
        assert!(kubelet_renewed(lease(30), at(10), at(49)));
    }

    /// Reads of one host, each `now` a second after the last.
    fn reads(r: &mut Reports, host: &str, since: Timestamp, rows: &[Row]) -> Vec<bool> {
        let mut out = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            out.push(r.reported_lately(host, since, row.clone(), at(100 + i as i64)));
        }
        out
    }

    #[test]
    fn a_move_of_the_row_with_nothing_else_changed_is_a_report_and_the_first_read_is_none() {
        let mut r = Reports::default();
        let seen = reads(&mut r, "h", at(0), &[row(Some(5)), row(Some(5)), row(Some(15)), row(Some(15))]);
        assert_eq!(seen, [false, false, true, true], "the first read is the baseline; a report stays a sign");
        // Never written, then written with nothing else changed.
        assert_eq!(reads(&mut r, "n", at(0), &[row(None), row(Some(1))]), [false, true]);
        // A read that goes back (a stale answer) or loses the time is none.
        let mut r = Reports::default();
        assert_eq!(reads(&mut r, "h", at(0), &[row(Some(5)), row(Some(4)), row(None)]), [false; 3]);
    }

    #[test]
    fn a_report_is_a_sign_within_the_window_only() {
        let mut r = Reports::default();
        r.reported_lately("h", at(0), row(Some(5)), at(10));
        assert!(r.reported_lately("h", at(0), row(Some(15)), at(20)));
        assert!(r.reported_lately("h", at(0), row(Some(15)), at(79)), "59 s after it was seen");
        assert!(!r.reported_lately("h", at(0), row(Some(15)), at(80)), "60 s after: over");
        assert!(r.reported_lately("h", at(0), row(Some(85)), at(90)), "the next report");
    }

    #[test]
    fn a_host_is_watched_once_its_reads_of_one_fencing_span_the_window() {
        let mut r = Reports::default();
        assert!(!r.watched("h", at(0), at(100)), "never read");
        r.reported_lately("h", at(0), row(Some(5)), at(10));
        r.reported_lately("h", at(0), row(Some(5)), at(30));
        assert!(!r.watched("h", at(0), at(69)), "59 s");
        assert!(r.watched("h", at(0), at(70)), "60 s since the first read");
        assert!(!r.watched("h", at(40), at(70)), "another fencing");
        r.reported_lately("h", at(40), row(Some(5)), at(71));
        assert!(!r.watched("h", at(40), at(100)), "its first read is anew");
    }

    #[test]
    fn a_change_of_status_is_no_report_whoever_made_it() {
        let changes: [fn(&mut Row); 3] = [
            |r| r.enabled = true,
            |r| r.disabled_reason = Some("an SRE's reason".into()),
            |r| r.forced_down = false,
        ];
        for change in changes {
            let mut changed = row(Some(6));
            change(&mut changed);
            // The next report, with that status kept, is seen.
            let next = Row { updated_at: Some(at(16)), ..changed.clone() };
            let mut r = Reports::default();
            assert_eq!(
                reads(&mut r, "h", at(0), &[row(Some(5)), changed.clone(), next]),
                [false, false, true]
            );
        }
    }

    #[test]
    fn a_fencing_again_and_a_forgotten_host_start_from_a_new_baseline() {
        let mut r = Reports::default();
        assert_eq!(reads(&mut r, "h", at(0), &[row(Some(5)), row(Some(15))]), [false, true]);
        assert!(!r.reported_lately("h", at(30), row(Some(40)), at(41)), "fenced again at 30: a new baseline");
        assert!(r.reported_lately("h", at(30), row(Some(50)), at(51)));
        r.forget("h");
        assert!(r.is_empty());
        assert!(!r.reported_lately("h", at(30), row(Some(60)), at(61)), "forgotten: a new baseline");
        assert_eq!(r.len(), 1);
    }
}
