//! Signs that a fenced host lives, beside its agent and its BMC
//! (docs/fencing.md, "A fenced host that shows life"): its kubelet renewing
//! its Lease, its nova-compute reporting to Nova. Each is a time the
//! host's own process writes, seen to move between two reads of this
//! process: a first read, after a fail-over or a fencing again, is only
//! what later ones are compared with, and times are compared only with
//! times of the same writer, so no clock skew enters.
//!
//! Nova shows a forced-down service `down` whatever it reports, so its
//! state says nothing. What moves is the row's `updated_at`, written by
//! every report of nova-compute (every `report_interval`, 10 s by
//! default) and by every change of its status, ours or an SRE's. A report
//! is a move of `updated_at` between two reads of the row that change
//! nothing else in it. A change of status and a report between the same
//! two reads hide that report; the next one is seen. The kubelet's Lease
//! is a row whose only field is its renewal time.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};

/// One read of the host's compute service row (what a change of its status
/// changes, and when Nova last wrote it), or of its kubelet's Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub forced_down: bool,
    pub updated_at: Option<Timestamp>,
}

impl Row {
    /// A Lease renewed at `renewed`.
    pub fn renewed(renewed: Timestamp) -> Row {
        Row { enabled: false, disabled_reason: None, forced_down: false, updated_at: Some(renewed) }
    }
}

/// How long a report seen counts as a sign: Nova's own `service_down_time`
/// (a service that reported within it is up), so a nova-compute that
/// reports every 10 s stays a sign between reports; and how long its
/// reads must span before its silence counts.
pub const REPORT_WINDOW: SignedDuration = SignedDuration::from_secs(60);

/// Per host, since when its fencing counts (it counted fenced, or was
/// fenced again), the last read, and when a move was last seen.
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
    moved: Option<Timestamp>,
}

impl Reports {
    /// Whether the row moved within `window` of `now`, by this host's reads
    /// of the same fencing (`since`), `row` read now becoming the last (a
    /// stale read that goes back keeps the newer time). The first read of
    /// a fencing shows none: it is what later reads are compared with.
    pub fn moved_lately(
        &mut self,
        host: &str,
        since: Timestamp,
        row: Row,
        now: Timestamp,
        window: SignedDuration,
    ) -> bool {
        let look = match self.last.remove(host) {
            Some(l) if l.since == since => {
                let moved = is_move(&l.row, &row).then_some(now).or(l.moved);
                let back =
                    same_status(&l.row, &row) && row.updated_at.is_none_or(|t| Some(t) < l.row.updated_at);
                let row = if back { l.row } else { row };
                Look { since, first: l.first, row, moved }
            }
            _ => Look { since, first: now, row, moved: None },
        };
        let lately = look.moved.is_some_and(|t| now.duration_since(t) < window);
        self.last.insert(host.to_string(), look);
        lately
    }

    /// Whether a move was seen within `window` of `now` by the reads of
    /// this fencing, without a new read (one that failed).
    pub fn lately(&self, host: &str, since: Timestamp, now: Timestamp, window: SignedDuration) -> bool {
        self.last
            .get(host)
            .filter(|l| l.since == since)
            .and_then(|l| l.moved)
            .is_some_and(|t| now.duration_since(t) < window)
    }

    /// Whether the host's reads of this fencing (`since`) have watched for
    /// moves for [`REPORT_WINDOW`] at least by `now`: long enough to have
    /// seen a report, had nova-compute run.
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

fn same_status(a: &Row, b: &Row) -> bool {
    (a.enabled, &a.disabled_reason, a.forced_down) == (b.enabled, &b.disabled_reason, b.forced_down)
}

fn is_move(previous: &Row, now: &Row) -> bool {
    let moved = match (previous.updated_at, now.updated_at) {
        (Some(a), Some(b)) => b > a,
        (None, Some(_)) => true,
        (_, None) => false,
    };
    moved && same_status(previous, now)
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
    fn a_lease_renewed_between_two_reads_is_a_sign_and_a_first_read_never_is() {
        let half = jiff::SignedDuration::from_secs(20);
        let mut r = Reports::default();
        // A first read, its renewal "ahead" (a kubelet's clock running
        // ahead) or just now: no sign.
        assert!(!r.moved_lately("h", at(0), Row::renewed(at(500)), at(10), half));
        assert!(!r.moved_lately("h", at(0), Row::renewed(at(500)), at(12), half), "unchanged");
        assert!(r.moved_lately("h", at(0), Row::renewed(at(510)), at(14), half), "renewed since");
        assert!(r.moved_lately("h", at(0), Row::renewed(at(510)), at(33), half));
        assert!(!r.moved_lately("h", at(0), Row::renewed(at(510)), at(34), half), "20 s after it was seen");
    }

    /// Reads of one host, each `now` a second after the last.
    fn reads(r: &mut Reports, host: &str, since: Timestamp, rows: &[Row]) -> Vec<bool> {
        let mut out = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            out.push(r.moved_lately(host, since, row.clone(), at(100 + i as i64), REPORT_WINDOW));
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
        // A read that goes back (a stale answer) or loses the time is none,
        // and the newer time stays what later reads are compared with.
        let mut r = Reports::default();
        let seen = reads(&mut r, "h", at(0), &[row(Some(15)), row(Some(5)), row(None), row(Some(15))]);
        assert_eq!(seen, [false; 4]);
    }

    #[test]
    fn a_report_is_a_sign_within_the_window_only() {
        let mut r = Reports::default();
        r.moved_lately("h", at(0), row(Some(5)), at(10), REPORT_WINDOW);
        assert!(r.moved_lately("h", at(0), row(Some(15)), at(20), REPORT_WINDOW));
        assert!(r.moved_lately("h", at(0), row(Some(15)), at(79), REPORT_WINDOW), "59 s after it was seen");
        assert!(!r.moved_lately("h", at(0), row(Some(15)), at(80), REPORT_WINDOW), "60 s after: over");
        assert!(r.moved_lately("h", at(0), row(Some(85)), at(90), REPORT_WINDOW), "the next report");
        // A read that failed answers from the reads before it.
        assert!(r.lately("h", at(0), at(149), REPORT_WINDOW));
        assert!(!r.lately("h", at(0), at(150), REPORT_WINDOW));
        assert!(!r.lately("h", at(5), at(100), REPORT_WINDOW), "another fencing");
        assert!(!r.lately("other", at(0), at(100), REPORT_WINDOW));
    }

    #[test]
    fn a_host_is_watched_once_its_reads_of_one_fencing_span_the_window() {
        let mut r = Reports::default();
        assert!(!r.watched("h", at(0), at(100)), "never read");
        r.moved_lately("h", at(0), row(Some(5)), at(10), REPORT_WINDOW);
        r.moved_lately("h", at(0), row(Some(5)), at(30), REPORT_WINDOW);
        assert!(!r.watched("h", at(0), at(69)), "59 s");
        assert!(r.watched("h", at(0), at(70)), "60 s since the first read");
        assert!(!r.watched("h", at(40), at(70)), "another fencing");
        r.moved_lately("h", at(40), row(Some(5)), at(71), REPORT_WINDOW);
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
        assert!(
            !r.moved_lately("h", at(30), row(Some(40)), at(41), REPORT_WINDOW),
            "fenced again at 30: a new baseline"
        );
        assert!(r.moved_lately("h", at(30), row(Some(50)), at(51), REPORT_WINDOW));
        r.forget("h");
        assert!(r.is_empty());
        assert!(
            !r.moved_lately("h", at(30), row(Some(60)), at(61), REPORT_WINDOW),
            "forgotten: a new baseline"
        );
        assert_eq!(r.len(), 1);
    }
}
