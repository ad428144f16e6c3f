//! The host's BMC for its power as desired state (docs/power.md): read
//! while a power change is awaited, and asked once to power off or on.
//! Both only after the BMC's system is shown to be the host's machine (its
//! UUID against the one the agent reported): a BMC address copied from
//! another machine powers nothing.

use std::time::Duration;

use kube::ResourceExt;

use super::fence::{bmc, system_uuid};
use super::hypervisor::Context;
use crate::api::Hypervisor;
use crate::api::power::HostPower;
use crate::fence::redfish::Redfish;
use crate::fence::{Guarded, PowerActuator, PowerError, PowerState, read_again_if_off, same_machine};
use crate::power::machine::Power;

/// How long one read or ask of the BMC may hold a reconcile.
const BMC_TIMEOUT: Duration = Duration::from_secs(10);

/// The host's power as the machine judges it, read only while a change is
/// awaited or it is hibernated (else `Unread`). Off counts only while a
/// power off is awaited, and then only when read Off twice, a second
/// apart; elsewhere one read is enough (a hibernated host is watched for
/// On, a starting one waited for it);
/// `Failed` when the BMC refuses us or is another machine's, so that the
/// wait ends in its error state with why; a BMC not answering is waited
/// out within the state's bound.
pub async fn reading(ctx: &Context, hv: &Hypervisor) -> Power {
    let state = hv.status.as_ref().and_then(|s| s.power_state);
    if !matches!(
        state,
        Some(HostPower::WaitingForPowerOff | HostPower::StartingMachine | HostPower::Hibernating)
    ) {
        return Power::Unread;
    }
    match read(ctx, hv, state == Some(HostPower::WaitingForPowerOff)).await {
        Ok(PowerState::Off) => Power::Off,
        Ok(PowerState::On) => Power::On,
        Ok(other) => {
            tracing::debug!(power = ?other, "the BMC's power is changing");
            Power::Unread
        }
        Err(Failure::Passing(e)) => {
            tracing::info!(error = %e, "the BMC's power was not read; read again at the next look");
            Power::Unread
        }
        Err(Failure::Final(e)) => {
            tracing::warn!(error = %e, "the BMC cannot tell the host's power");
            Power::Failed
        }
    }
}

/// Asks the BMC to power the host on (`on`) or off, once: nothing is asked
/// when it already is, or is on its way there. Only while this replica
/// leads.
pub async fn ask(ctx: &Context, hv: &Hypervisor, on: bool) -> Result<(), String> {
    let redfish = redfish(ctx, hv).await.map_err(|f| f.to_string())?;
    let (now, uuid) = redfish.read().await.map_err(|e| e.to_string())?;
    same_machine(system_uuid(hv), uuid.as_deref())?;
    let there = if on {
        matches!(now, PowerState::On | PowerState::PoweringOn)
    } else {
        matches!(now, PowerState::Off | PowerState::PoweringOff)
    };
    if there {
        tracing::info!(power = ?now, on, "the host's power is already where it is asked to be");
        return Ok(());
    }
    let guarded = Guarded { inner: &redfish, may_act: || ctx.gate.may_act() };
    let asked = if on { guarded.power_on().await } else { guarded.force_off().await };
    asked.map_err(|e| e.to_string())?;
    tracing::info!(node = %hv.name_any(), on, "power change asked of the BMC");
    Ok(())
}

#[derive(Debug, thiserror::Error)]
enum Failure {
    /// Read again later: a BMC that did not answer now.
    #[error("{0}")]
    Passing(String),
    /// It will not change by waiting: refused, another machine, no BMC.
    #[error("{0}")]
    Final(String),
}

async fn redfish(ctx: &Context, hv: &Hypervisor) -> Result<Redfish, Failure> {
    let spec = hv.spec.fencing.bmc.as_ref().ok_or_else(|| Failure::Final("the host has no BMC".into()))?;
    let mut bmc = bmc(ctx, spec).await.map_err(Failure::Final)?;
    bmc.timeout = BMC_TIMEOUT;
    Redfish::new(&bmc).map_err(|e| Failure::Final(e.to_string()))
}

/// The BMC's power for the host's machine; an Off read again a second
/// later when `off_twice`.
async fn read(ctx: &Context, hv: &Hypervisor, off_twice: bool) -> Result<PowerState, Failure> {
    let redfish = redfish(ctx, hv).await?;
    let (power, uuid) = redfish.read().await.map_err(classify)?;
    same_machine(system_uuid(hv), uuid.as_deref()).map_err(Failure::Final)?;
    if !off_twice {
        return Ok(power);
    }
    read_again_if_off(&redfish, power, Duration::from_secs(1)).await.map_err(classify)
}

fn classify(e: PowerError) -> Failure {
    match e {
        PowerError::Unreachable { .. } | PowerError::Status { .. } | PowerError::Garbled { .. } => {
            Failure::Passing(e.to_string())
        }
        _ => Failure::Final(e.to_string()),
    }
}
