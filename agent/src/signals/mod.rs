//! Health signals (docs/health.md): what the agent sees that says its host
//! is sick, sent to the coordinator as `HealthSignal` messages when a
//! condition starts and when it ends.
//!
//! One task holds the signals ([`Held`]): the libvirt and OVSDB watchers
//! send it [`Update`]s, the host probe ([`host`]) runs in it every
//! [`HOST_PROBE`]. Only changes are sent, and every signal that holds is
//! sent again every [`RESEND`], so a coordinator that took over (its
//! registry empty) learns them without waiting for a change.

pub mod ceph;
pub mod domain;
pub mod host;
pub mod ovs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hv_proto::v1::agent_message::Payload;
use hv_proto::v1::{HealthSeverity, HealthSignal, HealthSignalKind};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::backoff::timestamp_now;
use crate::session::SessionHandle;

pub const HOST_PROBE: Duration = Duration::from_secs(10);
pub const RESEND: Duration = Duration::from_secs(60);
/// A peer (libvirtd, ovsdb-server) lost, or a Ceph pool the probe cannot
/// use, for this long is critical, not a restart or a hiccup.
pub const PEER_LOST_CRITICAL: Duration = Duration::from_secs(300);

/// A signal starting (or changing) or ending.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    pub kind: HealthSignalKind,
    pub subject: String,
    /// The severity and evidence while it holds; None: it ended.
    pub now: Option<(HealthSeverity, String)>,
}

impl Update {
    pub fn hold(kind: HealthSignalKind, subject: &str, severity: HealthSeverity, evidence: String) -> Update {
        Update { kind, subject: subject.to_string(), now: Some((severity, evidence)) }
    }

    pub fn end(kind: HealthSignalKind, subject: &str) -> Update {
        Update { kind, subject: subject.to_string(), now: None }
    }
}

/// The signals that hold, each with when it started.
#[derive(Debug, Default)]
pub struct Held(BTreeMap<(i32, String), (HealthSeverity, String, Instant)>);

impl Held {
    /// Applies `u`; the message to send when it changes something.
    pub fn apply(&mut self, u: Update, now: Instant) -> Option<HealthSignal> {
        let key = (u.kind as i32, u.subject.clone());
        match u.now {
            Some((severity, evidence)) => {
                let since = match self.0.get(&key) {
                    Some((s, e, _)) if *s == severity && *e == evidence => return None,
                    // A peer still lost keeps the severity it was raised to.
                    Some((HealthSeverity::Critical, _, _))
                        if is_peer(key.0) && severity == HealthSeverity::Warning =>
                    {
                        return None;
                    }
                    Some((_, _, since)) => *since,
                    None => now,
                };
                self.0.insert(key, (severity, evidence.clone(), since));
                Some(message(u.kind as i32, &u.subject, true, severity, evidence))
            }
            None => {
                self.0.remove(&key)?;
                Some(message(u.kind as i32, &u.subject, false, HealthSeverity::Unspecified, String::new()))
            }
        }
    }

    /// A peer lost for [`PEER_LOST_CRITICAL`] becomes critical.
    pub fn escalate(&mut self, now: Instant) -> Vec<HealthSignal> {
        let mut out = Vec::new();
        for ((kind, subject), (severity, evidence, since)) in &mut self.0 {
            if is_peer(*kind)
                && *severity == HealthSeverity::Warning
                && now.duration_since(*since) >= PEER_LOST_CRITICAL
            {
                *severity = HealthSeverity::Critical;
                *evidence = format!("{evidence} (for {} min)", PEER_LOST_CRITICAL.as_secs() / 60);
                out.push(message(*kind, subject, true, *severity, evidence.clone()));
            }
        }
        out
    }

    /// Every signal that holds, as messages.
    pub fn all(&self) -> Vec<HealthSignal> {
        self.0.iter().map(|((k, s), (sev, ev, _))| message(*k, s, true, *sev, ev.clone())).collect()
    }
}

/// Kinds that start as a warning and turn critical when they last.
fn is_peer(kind: i32) -> bool {
    [
        HealthSignalKind::LibvirtUnreachable as i32,
        HealthSignalKind::OvsdbUnreachable as i32,
        HealthSignalKind::CephProbeFailing as i32,
    ]
    .contains(&kind)
}

fn message(
    kind: i32,
    subject: &str,
    active: bool,
    severity: HealthSeverity,
    evidence: String,
) -> HealthSignal {
    HealthSignal {
        kind,
        subject: subject.to_string(),
        active,
        severity: severity as i32,
        evidence,
        observed_at: Some(timestamp_now()),
    }
}

/// What a peer's connection says: lost is a warning (critical after
/// [`PEER_LOST_CRITICAL`]), back ends it.
pub fn peer(kind: HealthSignalKind, connected: bool, why: &str) -> Update {
    if connected {
        Update::end(kind, "")
    } else {
        Update::hold(kind, "", HealthSeverity::Warning, format!("connection lost: {why}"))
    }
}

/// Holds the signals and sends their changes until `updates` closes.
pub async fn run(mut updates: mpsc::Receiver<Update>, host_root: PathBuf, handle: SessionHandle) {
    let mut held = Held::default();
    let mut baseline = host::Baseline::default();
    let mut probe = tokio::time::interval(HOST_PROBE);
    let mut resend = tokio::time::interval_at(Instant::now() + RESEND, RESEND);
    loop {
        let mut out = Vec::new();
        tokio::select! {
            u = updates.recv() => match u {
                Some(u) => out.extend(held.apply(u, Instant::now())),
                None => return,
            },
            _ = probe.tick() => {
                let root = host_root.clone();
                let mut b = std::mem::take(&mut baseline);
                // Reading procfs and sysfs may block: off the runtime's threads.
                let (found, b) = tokio::task::spawn_blocking(move || (host::probe(&root, &mut b), b))
                    .await
                    .unwrap_or_default();
                baseline = b;
                let now = Instant::now();
                out.extend(found.into_iter().filter_map(|u| held.apply(u, now)));
                out.extend(held.escalate(now));
            }
            _ = resend.tick() => out.extend(held.all()),
        }
        for s in out {
            tracing::info!(kind = s.kind, subject = %s.subject, active = s.active, evidence = %s.evidence, "health signal");
            handle.push(Payload::HealthSignal(s)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_changes_are_sent_and_a_lost_peer_turns_critical_after_five_minutes() {
        let mut h = Held::default();
        let t0 = Instant::now();
        let lost = peer(HealthSignalKind::LibvirtUnreachable, false, "eof");
        let first = h.apply(lost.clone(), t0).unwrap();
        assert!(first.active);
        assert_eq!(first.severity, HealthSeverity::Warning as i32);
        assert_eq!(h.apply(lost.clone(), t0), None, "the same again is not a change");
        assert!(h.escalate(t0 + Duration::from_secs(299)).is_empty());
        let up = h.escalate(t0 + PEER_LOST_CRITICAL);
        assert_eq!(up.len(), 1);
        assert_eq!(up[0].severity, HealthSeverity::Critical as i32);
        assert!(h.escalate(t0 + PEER_LOST_CRITICAL * 2).is_empty(), "once");
        assert_eq!(h.apply(lost.clone(), t0 + PEER_LOST_CRITICAL * 2), None, "a repeat does not lower it");
        assert_eq!(h.all()[0].severity, HealthSeverity::Critical as i32);
        assert_eq!(h.all().len(), 1);
        let back = h.apply(peer(HealthSignalKind::LibvirtUnreachable, true, ""), t0).unwrap();
        assert!(!back.active);
        assert_eq!(h.apply(peer(HealthSignalKind::LibvirtUnreachable, true, ""), t0), None, "nothing to end");
        assert!(h.all().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_evidence_is_sent_and_keeps_its_start() {
        let mut h = Held::default();
        let t0 = Instant::now();
        let k = HealthSignalKind::OvsdbUnreachable;
        h.apply(Update::hold(k, "", HealthSeverity::Warning, "a".into()), t0);
        let changed =
            h.apply(Update::hold(k, "", HealthSeverity::Warning, "b".into()), t0 + Duration::from_secs(200));
        assert_eq!(changed.map(|m| m.evidence), Some("b".to_string()));
        assert_eq!(h.escalate(t0 + PEER_LOST_CRITICAL).len(), 1, "timed from the first");
    }
}
