//! An agent's health signal as the coordinator holds it: a kind by name, a
//! severity it understands, bounded evidence.

use hv_proto::v1::{HealthSeverity, HealthSignal, HealthSignalKind};
use jiff::Timestamp;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Warning,
    Critical,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    /// "domain-io-error", ... (see [`kind_name`]).
    pub kind: String,
    pub subject: String,
    pub severity: Severity,
    pub evidence: String,
    /// When the coordinator took it in.
    pub since: Timestamp,
    /// When the agent last said it holds (it says so every minute).
    pub refreshed: Timestamp,
    /// A critical one asks for the host to be emptied (`ha` maintenance).
    /// The agent's do; a dependency not Ready does not: it Degrades the
    /// host, and its own controller is the one to bring it back.
    pub empties: bool,
}

/// A signal not said again for this long is no longer believed: its end
/// may have been dropped from a full outbox.
pub const STALE_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_secs(150);

/// A signal's identity: one of each kind per subject holds at a time.
pub type Key = (i32, String);

/// The kind's name: `domain-io-error` for HEALTH_SIGNAL_KIND_DOMAIN_IO_ERROR;
/// a number this coordinator does not know (a newer agent's) as `kind-N`.
pub fn kind_name(kind: i32) -> String {
    match HealthSignalKind::try_from(kind) {
        Ok(k) if k != HealthSignalKind::Unspecified => {
            k.as_str_name().trim_start_matches("HEALTH_SIGNAL_KIND_").to_ascii_lowercase().replace('_', "-")
        }
        _ => format!("kind-{kind}"),
    }
}

/// What a message does to the signals held: `(key, Some(signal))` sets it,
/// `(key, None)` clears it. A severity or a kind this coordinator does not
/// know is a warning: nothing is done on what is not understood. Subject and evidence
/// are cut to bounds (an agent is authenticated, not trusted to be small).
pub fn apply(s: &HealthSignal, now: Timestamp) -> (Key, Option<Signal>) {
    let subject = crate::api::bounded(&s.subject, 128);
    let key = (s.kind, subject.clone());
    if !s.active {
        return (key, None);
    }
    // Kind 0 names nothing: it sets no signal.
    if s.kind == HealthSignalKind::Unspecified as i32 {
        return (key, None);
    }
    let known = HealthSignalKind::try_from(s.kind).is_ok();
    let severity = match HealthSeverity::try_from(s.severity) {
        Ok(HealthSeverity::Critical) if known => Severity::Critical,
        _ => Severity::Warning,
    };
    let signal = Signal {
        kind: kind_name(s.kind),
        subject,
        severity,
        evidence: crate::api::bounded(&s.evidence, 512),
        since: now,
        refreshed: now,
        empties: true,
    };
    (key, Some(signal))
}

/// An agent's clock farther than this from the coordinator's: TLS
/// validity, Nova's service heartbeats and every time we record depend on
/// the hosts' clocks agreeing.
pub const MAX_CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(5);

/// What a heartbeat sent at `sent_at` (the agent's clock) and taken in at
/// `now` says of the agent's clock: a warning past [`MAX_CLOCK_SKEW`] either
/// way, cleared within it. A heartbeat that waited in the agent's outbox
/// while it was cut off arrives late: the caller skips the first moments of
/// a session.
pub fn clock_skew(sent_at: Timestamp, now: Timestamp) -> (Key, Option<Signal>) {
    let key = (HealthSignalKind::ClockSkew as i32, String::new());
    let behind = now.duration_since(sent_at);
    if behind.abs() <= MAX_CLOCK_SKEW {
        return (key, None);
    }
    let way = if behind.is_negative() { "ahead of" } else { "behind" };
    let signal = Signal {
        kind: kind_name(key.0),
        subject: String::new(),
        severity: Severity::Warning,
        evidence: format!(
            "the agent's clock is more than {} s {way} the coordinator's",
            MAX_CLOCK_SKEW.as_secs()
        ),
        since: now,
        refreshed: now,
        empties: true,
    };
    (key, Some(signal))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_off_by_more_than_five_seconds_either_way_is_a_warning() {
        let now = Timestamp::from_second(1_800_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let at = |secs: i64| now.checked_add(jiff::SignedDuration::from_secs(secs)).unwrap_or(now);
        assert_eq!(clock_skew(at(-5), now).1, None);
        assert_eq!(clock_skew(at(5), now).1, None);
        let behind = clock_skew(at(-6), now).1.map(|g| (g.kind, g.severity, g.evidence));
        assert_eq!(
            behind,
            Some((
                "clock-skew".into(),
                Severity::Warning,
                "the agent's clock is more than 5 s behind the coordinator's".into()
            ))
        );
        let ahead = clock_skew(at(3600), now).1.map(|g| g.evidence);
        assert_eq!(ahead.as_deref(), Some("the agent's clock is more than 5 s ahead of the coordinator's"));
    }

    #[test]
    fn kinds_by_name_unknown_ones_by_number() {
        assert_eq!(kind_name(HealthSignalKind::DomainIoError as i32), "domain-io-error");
        assert_eq!(kind_name(HealthSignalKind::RootReadOnly as i32), "root-read-only");
        assert_eq!(kind_name(0), "kind-0");
        assert_eq!(kind_name(999), "kind-999");
    }

    #[test]
    fn only_a_known_critical_is_critical_and_inactive_clears() {
        let now = Timestamp::UNIX_EPOCH;
        let mut s = HealthSignal {
            kind: HealthSignalKind::MemoryErrors as i32,
            subject: "mc0".into(),
            active: true,
            severity: HealthSeverity::Critical as i32,
            evidence: "x".repeat(10_000),
            observed_at: None,
        };
        let (key, got) = apply(&s, now);
        assert_eq!(key, (HealthSignalKind::MemoryErrors as i32, "mc0".to_string()));
        let got = got.unwrap_or_else(|| panic!("active"));
        assert_eq!(got.severity, Severity::Critical);
        assert!(got.evidence.len() <= 520, "bounded: {}", got.evidence.len());
        for unknown in [0, 7, -1] {
            s.severity = unknown;
            assert_eq!(apply(&s, now).1.map(|g| g.severity), Some(Severity::Warning));
        }
        s.severity = HealthSeverity::Critical as i32;
        s.kind = 999;
        assert_eq!(
            apply(&s, now).1.map(|g| (g.kind, g.severity)),
            Some(("kind-999".into(), Severity::Warning))
        );
        s.kind = 0;
        assert_eq!(apply(&s, now).1, None, "kind 0 sets nothing");
        s.kind = HealthSignalKind::MemoryErrors as i32;
        s.active = false;
        assert_eq!(apply(&s, now).1, None);
    }
}
