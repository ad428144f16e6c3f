//! What a Degraded verdict asks for (docs/health.md, "What each state
//! does"): `spec.maintenance: ha`, set by the coordinator with the signal as
//! the reason, so the host is disabled and emptied by the Eviction
//! machinery and waits for an SRE in Maintenance. Pure.
//!
//! Lost sight (Unreachable, Failed) is the lifecycle's to act on
//! (`lifecycle::decide`, the unseen hold): it keeps the host in Active and
//! disabled, and moves nothing.

use crate::api::hypervisor::HealthState;
use crate::api::{MaintenanceMode, Phase};
use crate::lifecycle::HealthObs;

/// Prefix of the maintenance reasons the coordinator writes.
pub const REASON_PREFIX: &str = "hv-health: ";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Nothing,
    /// Set `spec.maintenance: ha` with this reason.
    Maintain {
        reason: String,
    },
    /// It would, but too many hosts are being emptied for health already.
    Capped {
        message: String,
    },
}

/// The host as the response sees it.
#[derive(Clone, Debug)]
pub struct Host<'a> {
    pub name: &'a str,
    pub phase: Phase,
    pub maintenance: MaintenanceMode,
    /// Its Node is being deleted: the lifecycle decommissions it already.
    pub terminating: bool,
    /// This reconcile's verdict; None when not judged now.
    pub health: Option<&'a HealthObs>,
}

/// Whether a host counts against `--ha-maintenance-limit`: in `ha`
/// maintenance set for its health (its reason ours), until an SRE clears it
/// (a host waiting in Maintenance for its repair counts), unless
/// decommissioned.
pub fn counts_against_limit(maintenance: MaintenanceMode, reason: &str, phase: Option<Phase>) -> bool {
    maintenance == MaintenanceMode::Ha
        && reason.starts_with(REASON_PREFIX)
        && phase != Some(Phase::Decommissioned)
}

/// `in_flight`: counts the other hosts in `ha` maintenance for health (a
/// scan of the fleet, asked only for a Degraded host that would be put
/// there); `limit`: how many may be at once (`--ha-maintenance-limit`).
/// A burst of hosts turning Degraded together is more likely one fault of
/// ours (an agent release, a shared network or storage hiccup) than as many
/// hardware faults, and emptying them all would leave the region nowhere to
/// schedule: past the limit the verdict is recorded and nothing is done.
pub fn respond(host: &Host<'_>, in_flight: impl FnOnce() -> usize, limit: usize) -> Response {
    // A dependency not Ready Degrades the host without emptying it.
    let Some(h) = host.health.filter(|h| h.state == HealthState::Degraded && h.empties) else {
        return Response::Nothing;
    };
    // In service or about to be: Testing's host is disabled anyway and
    // its checks decide; Maintenance, Onboarding and the rest are not judged.
    let in_service = matches!(host.phase, Phase::Ready | Phase::Active | Phase::Evicting);
    if !in_service || host.maintenance.is_requested() || host.terminating {
        return Response::Nothing;
    }
    let in_flight = in_flight();
    if in_flight >= limit {
        return Response::Capped {
            message: format!(
                "{} is Degraded ({}), but {in_flight} host(s) are already in ha maintenance for health \
                 (--ha-maintenance-limit {limit}): not put into ha maintenance. Many hosts at once \
                 is more likely one shared fault; look at them, or set spec.maintenance by hand",
                host.name, h.summary
            ),
        };
    }
    Response::Maintain { reason: truncate(&format!("{REASON_PREFIX}{}", h.summary), 200) }
}

/// The fleet gate on unseen holds: `lost` of `judged` hosts are
/// Unreachable or Failed (this one counted). Past `max_share` percent (and
/// at least two hosts), a cut of our own (the coordinator from its agents,
/// an expired certificate, a bad agent release) or a fault shared by the
/// fleet (Nova's message bus) is likelier than as many lost hosts, and no
/// further host is disabled for it. Answers why it holds back.
pub fn unseen_gate(lost: usize, judged: usize, max_share: u8) -> Option<String> {
    (lost >= 2 && lost * 100 > judged * usize::from(max_share)).then(|| {
        format!(
            "{lost} of {judged} judged hosts are Unreachable or Failed, more than --unseen-max-share \
             {max_share}%: no host is disabled for being unseen (a cut of our own or a shared fault \
             is likelier)"
        )
    })
}

fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(state: HealthState) -> HealthObs {
        HealthObs {
            state,
            since: None,
            summary: "root-read-only / (critical): / is mounted read-only".into(),
            hold_back: None,
            empties: true,
        }
    }

    /// Every phase × mode × verdict (and none) × terminating or not ×
    /// under and at the limit: only a judged Degraded host in service, with
    /// no maintenance set and its Node not being deleted, is put into `ha`,
    /// and only under the limit.
    #[test]
    fn only_a_judged_degraded_host_in_service_without_maintenance_is_put_into_ha_under_the_limit() {
        let modes = [
            MaintenanceMode::None,
            MaintenanceMode::Manual,
            MaintenanceMode::Auto,
            MaintenanceMode::Ha,
            MaintenanceMode::Termination,
        ];
        let states =
            [HealthState::Healthy, HealthState::Degraded, HealthState::Unreachable, HealthState::Failed];
        let verdicts: Vec<Option<HealthObs>> = states.iter().map(|s| Some(obs(*s))).chain([None]).collect();
        let mut maintained = 0;
        for phase in Phase::ALL {
            for maintenance in modes {
                for health in &verdicts {
                    for terminating in [false, true] {
                        for (in_flight, limit) in [(0, 3), (2, 3), (3, 3), (0, 0)] {
                            let host = Host {
                                name: "node-1",
                                phase,
                                maintenance,
                                terminating,
                                health: health.as_ref(),
                            };
                            let wants = health.as_ref().is_some_and(|h| h.state == HealthState::Degraded)
                                && matches!(phase, Phase::Ready | Phase::Active | Phase::Evicting)
                                && maintenance == MaintenanceMode::None
                                && !terminating;
                            let asked = std::cell::Cell::new(false);
                            let counted = || {
                                asked.set(true);
                                in_flight
                            };
                            match respond(&host, counted, limit) {
                                Response::Nothing => assert!(!wants, "{host:?}"),
                                Response::Maintain { reason } => {
                                    assert!(wants && in_flight < limit, "{host:?} {in_flight}/{limit}");
                                    assert!(reason.starts_with("hv-health: root-read-only"), "{reason}");
                                    maintained += 1;
                                }
                                Response::Capped { message } => {
                                    assert!(wants && in_flight >= limit, "{host:?}");
                                    assert!(message.contains("--ha-maintenance-limit"), "{message}");
                                }
                            }
                            assert_eq!(
                                asked.get(),
                                wants,
                                "the fleet is counted only when it matters: {host:?}"
                            );
                        }
                    }
                }
            }
        }
        assert_eq!(maintained, 3 * 2, "three phases, two settings under the limit");
    }

    #[test]
    fn a_host_degraded_only_by_a_dependency_is_not_emptied() {
        let h = HealthObs { empties: false, ..obs(HealthState::Degraded) };
        let host = Host {
            name: "node-1",
            phase: Phase::Active,
            maintenance: MaintenanceMode::None,
            terminating: false,
            health: Some(&h),
        };
        assert_eq!(respond(&host, || 0, 5), Response::Nothing);
        let sick = HealthObs { empties: true, ..h.clone() };
        let host = Host { health: Some(&sick), ..host };
        assert!(matches!(respond(&host, || 0, 5), Response::Maintain { .. }), "the same host, sick itself");
    }

    #[test]
    fn the_unseen_gate_holds_back_past_the_share_and_never_for_one_host() {
        assert_eq!(unseen_gate(1, 1, 50), None, "one host alone is never held back");
        assert_eq!(unseen_gate(1, 2, 0), None);
        assert_eq!(unseen_gate(2, 4, 50), None, "exactly half is not more than half");
        assert!(unseen_gate(3, 4, 50).is_some_and(|m| m.starts_with("3 of 4 judged hosts")));
        assert!(unseen_gate(2, 100, 1).is_some());
        assert_eq!(unseen_gate(100, 100, 100), None, "100 % never holds back");
        for judged in 0..50 {
            for lost in 0..=judged {
                let held = unseen_gate(lost, judged, 50).is_some();
                assert_eq!(held, lost >= 2 && 2 * lost > judged, "{lost}/{judged}");
            }
        }
    }

    #[test]
    fn the_reason_fits_nova_and_is_cut_on_a_character_boundary() {
        let mut h = obs(HealthState::Degraded);
        h.summary = "é".repeat(300);
        let host = Host {
            name: "n",
            phase: Phase::Active,
            maintenance: MaintenanceMode::None,
            terminating: false,
            health: Some(&h),
        };
        let Response::Maintain { reason } = respond(&host, || 0, 1) else { panic!("not maintained") };
        assert!(reason.len() <= 200 && reason.starts_with(REASON_PREFIX), "{}", reason.len());
    }
}
