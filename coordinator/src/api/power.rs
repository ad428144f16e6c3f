//! The host's power as desired state (docs/power.md): what the spec asks
//! (`spec.powerState`) and where the host stands (`status.powerState`),
//! laid out as Hive's hibernation.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the spec asks of the host's power.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum DesiredPower {
    /// Powered on and in service (the default).
    #[default]
    Running,
    /// Emptied hosts only: disabled in Nova and powered off through its BMC.
    Hibernating,
}

impl DesiredPower {
    pub fn is_running(&self) -> bool {
        *self == DesiredPower::Running
    }
}

/// Where the host's power stands: stable (`Running`, `Hibernating`),
/// under way, or stopped on an error until retried or asked the other way.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum HostPower {
    Running,
    /// Being disabled in Nova, its emptiness read again.
    Stopping,
    /// Power off asked; waiting for the BMC to read Off twice.
    WaitingForPowerOff,
    Hibernating,
    /// Power on asked; waiting for the BMC to read On.
    StartingMachine,
    /// Its agent and nova-compute not back yet.
    WaitingForAgent,
    /// Its checks run again before it is enabled.
    WaitingForChecks,
    /// A power off that failed: the host stays disabled.
    FailedToStop,
    /// A wake that failed: the host stays disabled.
    FailedToStart,
    /// Hibernation asked of a host without a BMC.
    Unsupported,
}

impl HostPower {
    pub const ALL: [HostPower; 10] = [
        HostPower::Running,
        HostPower::Stopping,
        HostPower::WaitingForPowerOff,
        HostPower::Hibernating,
        HostPower::StartingMachine,
        HostPower::WaitingForAgent,
        HostPower::WaitingForChecks,
        HostPower::FailedToStop,
        HostPower::FailedToStart,
        HostPower::Unsupported,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HostPower::Running => "Running",
            HostPower::Stopping => "Stopping",
            HostPower::WaitingForPowerOff => "WaitingForPowerOff",
            HostPower::Hibernating => "Hibernating",
            HostPower::StartingMachine => "StartingMachine",
            HostPower::WaitingForAgent => "WaitingForAgent",
            HostPower::WaitingForChecks => "WaitingForChecks",
            HostPower::FailedToStop => "FailedToStop",
            HostPower::FailedToStart => "FailedToStart",
            HostPower::Unsupported => "Unsupported",
        }
    }

    /// Powered as usual: its agent is expected and its health judged
    /// (`Stopping`: not asked to power off yet, a server may still land).
    /// Every other state has the host asked to power off, off, or on its
    /// way back, disabled in Nova and empty.
    pub fn in_service(self) -> bool {
        matches!(self, HostPower::Running | HostPower::Unsupported | HostPower::Stopping)
    }

    /// A change under way, read back every few seconds.
    pub fn changing(self) -> bool {
        !matches!(
            self,
            HostPower::Running
                | HostPower::Unsupported
                | HostPower::Hibernating
                | HostPower::FailedToStop
                | HostPower::FailedToStart
        )
    }
}

impl std::fmt::Display for HostPower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the lifecycle remembers of the host's power between reconciles.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerRecord {
    /// When `status.powerState` was entered: every wait is bounded from it.
    pub since: Time,
    /// The test run a wake started: only its pass enables the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_run: Option<u64>,
    /// When the BMC last read the host Off twice: only an agent session
    /// opened since counts as the host back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub off_since: Option<Time>,
}
