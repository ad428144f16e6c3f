//! Health signals from libvirt's domain lifecycle events (docs/health.md):
//! a domain paused on an I/O error says the host's storage path is broken;
//! a crashed QEMU or a panicked guest is worth showing, not acting on.

use hv_proto::v1::{Domain, DomainEventKind, HealthSeverity, HealthSignalKind};

use super::Update;

/// What a domain event starts or ends. `uuid` is the subject.
pub fn updates(kind: DomainEventKind, reason: &str, uuid: &str, name: &str) -> Vec<Update> {
    use DomainEventKind as K;
    let io = HealthSignalKind::DomainIoError;
    let crashed = HealthSignalKind::DomainCrashed;
    match kind {
        K::Suspended if reason == "io-error" => vec![Update::hold(
            io,
            uuid,
            HealthSeverity::Critical,
            format!("domain {name} paused on an I/O error"),
        )],
        K::Crashed => vec![
            Update::hold(crashed, uuid, HealthSeverity::Warning, format!("domain {name}: {reason}")),
            // A crashed QEMU is no longer paused on anything.
            Update::end(io, uuid),
        ],
        K::Resumed | K::Stopped | K::MigratedOut => vec![Update::end(io, uuid)],
        K::Started | K::MigratedIn => vec![Update::end(io, uuid), Update::end(crashed, uuid)],
        K::Undefined => vec![Update::end(io, uuid), Update::end(crashed, uuid)],
        K::Suspended | K::Defined | K::Unspecified => Vec::new(),
    }
}

/// What the first snapshot after libvirt (re)connected says: a domain
/// already paused on an I/O error, with no event to say it (it paused
/// before the agent started, or while it was cut off). Only starts: the
/// events end it, and a later snapshot may be older than the last event.
pub fn from_inventory(domains: &[Domain]) -> Vec<Update> {
    let io = HealthSignalKind::DomainIoError;
    domains
        .iter()
        .filter(|d| d.paused_on_io_error)
        .map(|d| {
            let evidence = format!("domain {} paused on an I/O error", d.name);
            Update::hold(io, &d.uuid, HealthSeverity::Critical, evidence)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_finds_a_domain_already_paused_on_an_io_error_with_the_events_words() {
        let paused =
            Domain { uuid: "u1".into(), name: "i-1".into(), paused_on_io_error: true, ..Default::default() };
        let running = Domain { uuid: "u2".into(), name: "i-2".into(), ..Default::default() };
        let u = from_inventory(&[paused, running]);
        assert_eq!(
            u,
            updates(DomainEventKind::Suspended, "io-error", "u1", "i-1"),
            "the event's signal, only"
        );
    }

    fn holds(u: &[Update], kind: HealthSignalKind) -> Option<HealthSeverity> {
        u.iter().find(|x| x.kind == kind).and_then(|x| x.now.as_ref().map(|n| n.0))
    }

    fn ends(u: &[Update], kind: HealthSignalKind) -> bool {
        u.iter().any(|x| x.kind == kind && x.now.is_none())
    }

    #[test]
    fn an_io_error_pause_is_critical_until_the_domain_runs_or_goes() {
        use DomainEventKind as K;
        use HealthSignalKind::{DomainCrashed as Crash, DomainIoError as Io};
        let paused = updates(K::Suspended, "io-error", "u1", "vm-1");
        assert_eq!(holds(&paused, Io), Some(HealthSeverity::Critical));
        assert_eq!(paused[0].subject, "u1");
        assert!(paused[0].now.as_ref().is_some_and(|n| n.1.contains("vm-1 paused on an I/O error")));
        assert!(updates(K::Suspended, "paused", "u1", "vm-1").is_empty(), "an ordinary pause says nothing");
        for k in [K::Resumed, K::Stopped, K::Started, K::Undefined, K::MigratedOut, K::MigratedIn, K::Crashed]
        {
            assert!(ends(&updates(k, "x", "u1", "vm-1"), Io), "{k:?} ends the I/O error");
        }
        let crashed = updates(K::Crashed, "panicked", "u1", "vm-1");
        assert_eq!(holds(&crashed, Crash), Some(HealthSeverity::Warning));
        assert!(ends(&updates(K::Started, "booted", "u1", "vm-1"), Crash));
        assert!(ends(&updates(K::Undefined, "removed", "u1", "vm-1"), Crash));
        assert!(
            !ends(&updates(K::Stopped, "shutdown", "u1", "vm-1"), Crash),
            "a crash stays shown while stopped"
        );
    }
}
