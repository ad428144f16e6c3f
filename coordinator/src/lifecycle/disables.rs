//! Who disabled a compute service, read from the reason Nova shows
//! (docs/lifecycle.md, "Who owns a disable"). A region is shared:
//! nova-compute disables its own service when it loses libvirt (`AUTO: `,
//! and re-enables only what carries that prefix), SREs and other tools
//! disable hosts for their own reasons. We re-enable only what we disabled,
//! as nova-compute does: every disable of ours carries [`OUR_PREFIX`], and
//! its reason is recorded (`status.lifecycle.disabledAs`) before it is sent.

/// The prefix of every reason the coordinator gives a disable.
pub const OUR_PREFIX: &str = "hv-lifecycle: ";

/// The reason Nova gives a compute service it disables as it registers,
/// with `enable_new_services = False` (the setting docs/nova.md asks for):
/// it waits for whoever validates new hosts, which is us.
pub const NEW_SERVICE_REASON: &str = "New compute service disabled due to config option.";

/// Our disable of a host not yet in service (onboarding), and of one that
/// registered again after it was decommissioned: every Hypervisor gives
/// them alike, so a Hypervisor made anew for the same Node (the old one
/// deleted) may find its predecessor's. Ours to lift before the host is
/// first in service, as Nova's new-service disable is.
pub const ONBOARDING: &str = "hv-lifecycle: onboarding, not tested yet";
pub const RE_REGISTERED: &str = "hv-lifecycle: host was decommissioned; re-registered service disabled";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disabler {
    /// The coordinator: ours to lift.
    Us,
    /// Nova, as the service registered: ours to lift before the host is
    /// first in service.
    NewService,
    /// Anyone else (nova-compute's `AUTO: `, an SRE's text, an empty
    /// reason), with Nova's reason: respected, never lifted by us.
    Elsewhere(String),
}

/// Most disable reasons a Hypervisor records.
pub const RECORDED: usize = 4;

/// `recorded` with `reason` as the newest, at most [`RECORDED`] kept.
pub fn record(recorded: &mut Option<Vec<String>>, reason: &str) {
    let recorded = recorded.get_or_insert_with(Vec::new);
    recorded.retain(|r| r != reason);
    recorded.push(reason.to_string());
    let over = recorded.len().saturating_sub(RECORDED);
    recorded.drain(..over);
}

/// Who disabled a service whose reason Nova shows as `reason`, given the
/// reasons of our disables recorded before they were sent (`recorded`).
/// A reason of our form that we have no record of sending is someone
/// else's (another install's, or copied). A Hypervisor without the record
/// (None: made before it existed) goes by the form alone.
pub fn disabler(reason: Option<&str>, recorded: Option<&[String]>) -> Disabler {
    let sent = |r: &str| recorded.is_none_or(|rs| rs.iter().any(|s| s.trim() == r));
    match reason.map(str::trim) {
        Some(r) if r.starts_with(OUR_PREFIX.trim_end()) && sent(r) => Disabler::Us,
        Some(NEW_SERVICE_REASON) => Disabler::NewService,
        Some(r) => Disabler::Elsewhere(r.to_string()),
        None => Disabler::Elsewhere(String::new()),
    }
}

/// Whether the coordinator may enable a disabled service: its own disable,
/// or Nova's for a new service while the host was never in service.
pub fn ours_to_enable(
    reason: Option<&str>,
    recorded: Option<&[String]>,
    in_service_before: bool,
) -> Result<(), String> {
    match disabler(reason, recorded) {
        Disabler::Us => Ok(()),
        Disabler::NewService if !in_service_before => Ok(()),
        Disabler::Elsewhere(r) if !in_service_before && [ONBOARDING, RE_REGISTERED].contains(&r.as_str()) => {
            Ok(())
        }
        Disabler::NewService => Err(NEW_SERVICE_REASON.to_string()),
        Disabler::Elsewhere(r) => Err(r),
    }
}

/// The condition's message for a disable that is not ours.
pub fn elsewhere_message(reason: &str) -> String {
    let reason = if reason.is_empty() { "no reason given" } else { reason };
    format!(
        "disabled in Nova by someone else ({reason}): respected, never re-enabled by the coordinator; it \
         follows once that party enables it again"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_disables_and_nova_s_new_service_one_are_ours_to_lift() {
        let rows: [(Option<&str>, bool, bool); 12] = [
            // (reason, in service before, ours to enable)
            (Some("hv-lifecycle: onboarding, not tested yet"), false, true),
            (Some("hv-lifecycle: maintenance (manual)"), true, true),
            (Some("hv-lifecycle: host unseen (Unreachable: agent gone)"), true, true),
            (Some("hv-lifecycle:x"), true, true),
            (Some(NEW_SERVICE_REASON), false, true),
            (Some(NEW_SERVICE_REASON), true, false),
            (Some("AUTO: Connection to libvirt lost: 1"), false, false),
            (Some("AUTO: Connection to libvirt lost: 1"), true, false),
            (Some("kernel update, do not touch -- jdoe"), true, false),
            (Some("masakari: host failure"), true, false),
            (Some(""), true, false),
            (None, true, false),
        ];
        for (reason, before, want) in rows {
            assert_eq!(ours_to_enable(reason, None, before).is_ok(), want, "{reason:?} {before}");
        }
        assert_eq!(disabler(Some("  hv-lifecycle: drift "), None), Disabler::Us, "Nova may pad it");
        assert_eq!(disabler(Some("HV-LIFECYCLE: x"), None), Disabler::Elsewhere("HV-LIFECYCLE: x".into()));
        assert_eq!(ours_to_enable(None, None, true), Err(String::new()));
        assert!(elsewhere_message("").contains("no reason given"));
        assert!(elsewhere_message("AUTO: x").contains("(AUTO: x)"));
    }

    #[test]
    fn a_disable_of_our_form_is_ours_only_when_we_recorded_sending_it() {
        let mut recorded = Some(Vec::new());
        // Recorded, none sent yet: nothing of our form is ours.
        let form = "hv-lifecycle: onboarding";
        assert_eq!(disabler(Some(form), Some(&[])), Disabler::Elsewhere(form.into()));
        for r in [
            "hv-lifecycle: onboarding",
            "hv-lifecycle: maintenance (auto)",
            "hv-lifecycle: a",
            "hv-lifecycle: b",
        ] {
            record(&mut recorded, r);
        }
        record(&mut recorded, "hv-lifecycle: maintenance (auto)");
        assert_eq!(
            recorded.as_deref().unwrap_or_default(),
            [
                "hv-lifecycle: onboarding",
                "hv-lifecycle: a",
                "hv-lifecycle: b",
                "hv-lifecycle: maintenance (auto)"
            ]
        );
        record(&mut recorded, "hv-lifecycle: c");
        let recorded = recorded.unwrap_or_default();
        assert_eq!(recorded.len(), RECORDED);
        assert_eq!(recorded.first().map(String::as_str), Some("hv-lifecycle: a"), "the oldest goes");
        let recorded = Some(&recorded[..]);
        assert_eq!(disabler(Some(" hv-lifecycle: c "), recorded), Disabler::Us);
        // Of our form, never sent by this Hypervisor: another install's, or copied.
        let copied = "hv-lifecycle: maintenance (manual): not ours";
        assert_eq!(disabler(Some(copied), recorded), Disabler::Elsewhere(copied.into()));
        assert_eq!(ours_to_enable(Some(copied), recorded, true), Err(copied.into()));
        assert_eq!(
            disabler(Some("hv-lifecycle: onboarding"), recorded),
            Disabler::Elsewhere("hv-lifecycle: onboarding".into())
        );
        assert_eq!(disabler(Some(NEW_SERVICE_REASON), recorded), Disabler::NewService);
        // A predecessor's onboarding or re-registration disable, before the
        // host is in service: ours to lift; once in service, not.
        for r in [ONBOARDING, RE_REGISTERED] {
            assert_eq!(ours_to_enable(Some(r), Some(&[]), false), Ok(()), "{r}");
            assert!(ours_to_enable(Some(r), Some(&[]), true).is_err(), "{r}");
        }
    }
}
