//! Who disabled a compute service, read from the reason Nova shows
//! (docs/lifecycle.md, "Who owns a disable"). A region is shared:
//! nova-compute disables its own service when it loses libvirt (`AUTO: `,
//! and re-enables only what carries that prefix), SREs and other tools
//! disable hosts for their own reasons. We re-enable only what we disabled,
//! as nova-compute does: every disable of ours carries [`OUR_PREFIX`].

/// The prefix of every reason the coordinator gives a disable.
pub const OUR_PREFIX: &str = "hv-lifecycle: ";

/// The reason Nova gives a compute service it disables as it registers,
/// with `enable_new_services = False` (the setting docs/nova.md asks for):
/// it waits for whoever validates new hosts, which is us.
pub const NEW_SERVICE_REASON: &str = "New compute service disabled due to config option.";

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

/// Who disabled a service whose reason Nova shows as `reason`.
pub fn disabler(reason: Option<&str>) -> Disabler {
    match reason.map(str::trim) {
        Some(r) if r.starts_with(OUR_PREFIX.trim_end()) => Disabler::Us,
        Some(NEW_SERVICE_REASON) => Disabler::NewService,
        Some(r) => Disabler::Elsewhere(r.to_string()),
        None => Disabler::Elsewhere(String::new()),
    }
}

/// Whether the coordinator may enable a disabled service: its own disable,
/// or Nova's for a new service while the host was never in service.
pub fn ours_to_enable(reason: Option<&str>, in_service_before: bool) -> Result<(), String> {
    match disabler(reason) {
        Disabler::Us => Ok(()),
        Disabler::NewService if !in_service_before => Ok(()),
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
            assert_eq!(ours_to_enable(reason, before).is_ok(), want, "{reason:?} {before}");
        }
        assert_eq!(disabler(Some("  hv-lifecycle: drift ")), Disabler::Us, "Nova may pad it");
        assert_eq!(disabler(Some("HV-LIFECYCLE: x")), Disabler::Elsewhere("HV-LIFECYCLE: x".into()));
        assert_eq!(ours_to_enable(None, true), Err(String::new()));
        assert!(elsewhere_message("").contains("no reason given"));
        assert!(elsewhere_message("AUTO: x").contains("(AUTO: x)"));
    }
}
