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
    /// This reconcile's verdict; None when not judged now.
    pub health: Option<&'a HealthObs>,
}

/// `in_flight`: other hosts in `ha` maintenance not yet in Maintenance (being
/// emptied); `limit`: how many may be at once (`--ha-maintenance-limit`).
/// A burst of hosts turning Degraded together is more likely one fault of
/// ours (an agent release, a shared network or storage hiccup) than as many
/// hardware faults, and emptying them all would leave the region nowhere to
/// schedule: past the limit the verdict is recorded and nothing is done.
pub fn respond(host: &Host<'_>, in_flight: usize, limit: usize) -> Response {
    let Some(h) = host.health.filter(|h| h.state == HealthState::Degraded) else {
        return Response::Nothing;
    };
    // In service or about to be: Testing's host is disabled anyway and
    // its checks decide; Maintenance, Onboarding and the rest are not judged.
    let in_service = matches!(host.phase, Phase::Ready | Phase::Active | Phase::Evicting);
    if !in_service || host.maintenance.is_requested() {
        return Response::Nothing;
    }
    if in_flight >= limit {
        return Response::Capped {
            message: format!(
                "{} is Degraded ({}), but {in_flight} host(s) are already being emptied for health \
                 (--ha-maintenance-limit {limit}): not put into ha maintenance. Many hosts at once \
                 is more likely one shared fault; look at them, or set spec.maintenance by hand",
                host.name, h.summary
            ),
        };
    }
    Response::Maintain { reason: truncate(&format!("{REASON_PREFIX}{}", h.summary), 200) }
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
        }
    }

    /// Every phase × every mode × every verdict (and none) × under and at
    /// the limit: only a judged Degraded host in service, with no
    /// maintenance set, is put into `ha`, and only under the limit.
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
        let mut maintained = 0;
        for phase in Phase::ALL {
            for mode in modes {
                for state in states.iter().map(|s| Some(obs(*s))).chain([None]) {
                    for (in_flight, limit) in [(0, 3), (2, 3), (3, 3), (0, 0)] {
                        let host = Host { name: "node-1", phase, maintenance: mode, health: state.as_ref() };
                        let r = respond(&host, in_flight, limit);
                        let wants = state.as_ref().is_some_and(|h| h.state == HealthState::Degraded)
                            && matches!(phase, Phase::Ready | Phase::Active | Phase::Evicting)
                            && mode == MaintenanceMode::None;
                        match r {
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
                    }
                }
            }
        }
        assert_eq!(maintained, 3 * 2, "three phases, two settings under the limit");
    }

    #[test]
    fn the_reason_fits_nova_and_is_cut_on_a_character_boundary() {
        let mut h = obs(HealthState::Degraded);
        h.summary = "é".repeat(300);
        let host =
            Host { name: "n", phase: Phase::Active, maintenance: MaintenanceMode::None, health: Some(&h) };
        let Response::Maintain { reason } = respond(&host, 0, 1) else { panic!("not maintained") };
        assert!(reason.len() <= 200 && reason.starts_with(REASON_PREFIX), "{}", reason.len());
    }
}
