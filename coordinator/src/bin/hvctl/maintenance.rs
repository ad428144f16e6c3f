//! `hvctl maintenance set|clear`: the Hypervisor's `spec.maintenance` and
//! its reason, written over the version read, so that a change made
//! meanwhile (another SRE's, the coordinator's `ha`) is never overwritten.

use hv_coordinator::api::{Hypervisor, MaintenanceMode};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};

use crate::exit::{Outcome, Usage};
use crate::kube_api::{hypervisor, hypervisors};

#[derive(clap::Subcommand, Debug)]
pub enum Action {
    /// Ask for maintenance: the host is disabled in Nova, its VMs moved
    /// off, and it is held empty until cleared.
    Set {
        node: String,
        /// manual (an SRE's work), auto (an update tool's), or termination
        /// (the host is retired: it ends Decommissioned, and cannot be
        /// cleared; needs --yes).
        #[arg(long, value_enum, default_value_t = Mode::Manual)]
        mode: Mode,
        /// Why, for the next SRE: shown in Nova's disabled reason and in
        /// the Hypervisor. Required for manual.
        #[arg(long, default_value = "")]
        reason: String,
        /// Confirm a termination.
        #[arg(long)]
        yes: bool,
        /// Replace a maintenance an update tool (auto) or the health
        /// detector (ha) set.
        #[arg(long)]
        force: bool,
    },
    /// End the maintenance: the host goes back into service (checked
    /// again first where the lifecycle asks for it). Not for a fenced
    /// host: `hvctl clear-fenced` brings one back.
    Clear {
        node: String,
        /// End a maintenance an update tool (auto) or the health detector
        /// (ha) set.
        #[arg(long)]
        force: bool,
    },
}

/// The modes an SRE may ask; `ha` is the health detector's own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Manual,
    Auto,
    Termination,
}

impl Mode {
    fn spec(self) -> MaintenanceMode {
        match self {
            Mode::Manual => MaintenanceMode::Manual,
            Mode::Auto => MaintenanceMode::Auto,
            Mode::Termination => MaintenanceMode::Termination,
        }
    }
}

/// The longest reason: it goes into Nova's disabled reason (255 bytes
/// with our prefix).
const MAX_REASON: usize = 200;

pub async fn run(kube: &kube::Client, action: &Action) -> anyhow::Result<Outcome> {
    check(action)?;
    let (node, mode, reason, force) = match action {
        Action::Set { node, mode, reason, force, .. } => (node, mode.spec(), reason.trim(), *force),
        Action::Clear { node, force } => (node, MaintenanceMode::None, "", *force),
    };
    let mut hv = hypervisor(kube, node).await?;
    // The coordinator writes the status often (a new version each time):
    // a conflict with a change of the status alone is written again over
    // the version read then; a change of the maintenance is somebody
    // else's edit, never overwritten.
    for _ in 0..WRITES {
        if let Some(said) = unchanged(&hv, mode, reason, force)? {
            println!("{node}: {said}");
            return Ok(Outcome::Done);
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": hv.resource_version()},
            "spec": {"maintenance": mode.as_str(), "maintenanceReason": reason},
        });
        match hypervisors(kube).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                println!("{node}: {}", told(mode, reason));
                return Ok(Outcome::Done);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let fresh = hypervisor(kube, node).await?;
                let asked = |h: &Hypervisor| (h.spec.maintenance, h.spec.maintenance_reason.clone());
                if asked(&fresh) != asked(&hv) {
                    anyhow::bail!(
                        "{node}'s maintenance changed while this was asked (somebody else's edit): look again \
                         and run it again"
                    )
                }
                hv = fresh;
            }
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{node} kept changing while this was asked: run it again")
}

/// Writes tried over a status that keeps changing.
const WRITES: usize = 10;

/// The arguments alone, before anything is read: a usage error otherwise.
pub fn check(action: &Action) -> Result<(), Usage> {
    match action {
        Action::Set { mode, reason, yes, .. } => check_set(*mode, reason.trim(), *yes),
        Action::Clear { .. } => Ok(()),
    }
}

fn check_set(mode: Mode, reason: &str, yes: bool) -> Result<(), Usage> {
    if mode == Mode::Manual && reason.is_empty() {
        return Err(Usage("--reason is required for manual maintenance: say why, for the next SRE".into()));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(Usage(format!(
            "--reason is longer than {MAX_REASON} characters: keep it short, link to a ticket"
        )));
    }
    if mode == Mode::Termination && !yes {
        return Err(Usage(
            "termination retires the host: it is emptied, removed from Nova and ends Decommissioned, and cannot \
             be cleared. Add --yes to do it"
                .into(),
        ));
    }
    Ok(())
}

/// What the Hypervisor already says, when nothing is to be written; an
/// error when the change is not one to make here: a termination undone, a
/// fenced host's maintenance ended (its fencing's exits bring it back), or
/// another actor's maintenance replaced without `force`.
fn unchanged(
    hv: &Hypervisor,
    mode: MaintenanceMode,
    reason: &str,
    force: bool,
) -> anyhow::Result<Option<String>> {
    let (name, now) = (hv.name_any(), hv.spec.maintenance);
    if now == MaintenanceMode::Termination && mode != MaintenanceMode::Termination {
        anyhow::bail!("{name} is being retired (maintenance termination): that cannot be undone");
    }
    let fenced = hv.status.as_ref().is_some_and(|s| s.fencing.is_some());
    if fenced && mode == MaintenanceMode::None && now != MaintenanceMode::None {
        anyhow::bail!(
            "{name} is fenced: its maintenance holds its evacuation; bring it back with hvctl clear-fenced {name} \
             (or retire it), not by ending the maintenance"
        );
    }
    let theirs = matches!(now, MaintenanceMode::Auto | MaintenanceMode::Ha);
    if theirs && now != mode && !force {
        let who = if now == MaintenanceMode::Auto { "an update tool" } else { "the health detector" };
        anyhow::bail!("{name}'s maintenance is {who}'s ({}): add --force to replace or end it", now.as_str());
    }
    if now == mode && (mode == MaintenanceMode::None || hv.spec.maintenance_reason == reason) {
        return Ok(Some(match mode {
            MaintenanceMode::None => "not in maintenance".to_string(),
            _ => format!("already in maintenance {}", mode.as_str()),
        }));
    }
    if now == MaintenanceMode::Ha && mode == MaintenanceMode::None {
        eprintln!(
            "hvctl: {}: its maintenance was the health detector's (ha): cleared, the host goes back into \
             service; if it is still unhealthy, it is taken out again",
            hv.name_any()
        );
    }
    Ok(None)
}

fn told(mode: MaintenanceMode, reason: &str) -> String {
    match mode {
        MaintenanceMode::None => {
            "maintenance cleared; it goes back into service (hvctl why shows what it waits on)".to_string()
        }
        _ => format!(
            "maintenance {} asked ({reason}); its VMs are moved off: follow with hvctl evictions, hvctl why",
            mode.as_str()
        ),
    }
}

#[cfg(test)]
mod tests {
    use hv_coordinator::api::HypervisorSpec;

    use super::*;

    fn hv(mode: MaintenanceMode, reason: &str) -> Hypervisor {
        let spec =
            HypervisorSpec { maintenance: mode, maintenance_reason: reason.into(), ..Default::default() };
        Hypervisor::new("n1", spec)
    }

    #[test]
    fn a_set_needs_a_short_reason_and_a_termination_needs_yes() {
        assert!(check_set(Mode::Manual, "", false).is_err());
        assert!(check_set(Mode::Manual, "firmware", false).is_ok());
        assert!(check_set(Mode::Auto, "", false).is_ok());
        assert!(check_set(Mode::Manual, &"x".repeat(201), false).is_err());
        assert!(check_set(Mode::Termination, "retired", false).unwrap_err().to_string().contains("--yes"));
        assert!(check_set(Mode::Termination, "retired", true).is_ok());
    }

    #[test]
    fn nothing_is_written_twice_and_a_termination_is_never_undone() {
        let same =
            unchanged(&hv(MaintenanceMode::Manual, "fw"), MaintenanceMode::Manual, "fw", false).unwrap();
        assert_eq!(same.as_deref(), Some("already in maintenance manual"));
        let other = unchanged(&hv(MaintenanceMode::Manual, "fw"), MaintenanceMode::Manual, "disk", false);
        assert_eq!(other.unwrap(), None);
        assert!(
            unchanged(&hv(MaintenanceMode::None, ""), MaintenanceMode::None, "", false).unwrap().is_some()
        );
        assert!(unchanged(&hv(MaintenanceMode::Termination, "x"), MaintenanceMode::None, "", true).is_err());
    }

    #[test]
    fn another_actors_maintenance_is_replaced_only_with_force() {
        for theirs in [MaintenanceMode::Auto, MaintenanceMode::Ha] {
            let err = unchanged(&hv(theirs, "x"), MaintenanceMode::None, "", false).unwrap_err().to_string();
            assert!(err.contains("--force"), "{err}");
            assert!(unchanged(&hv(theirs, "x"), MaintenanceMode::Manual, "fw", false).is_err());
            assert_eq!(unchanged(&hv(theirs, "x"), MaintenanceMode::None, "", true).unwrap(), None);
        }
    }

    #[test]
    fn a_fenced_hosts_maintenance_is_not_ended_here() {
        let mut fenced = hv(MaintenanceMode::Ha, "dead");
        fenced.status = Some(hv_coordinator::api::HypervisorStatus {
            fencing: Some(Default::default()),
            ..Default::default()
        });
        let err = unchanged(&fenced, MaintenanceMode::None, "", true).unwrap_err().to_string();
        assert!(err.contains("hvctl clear-fenced n1"), "{err}");
    }

    #[test]
    fn a_bad_argument_is_a_usage_error() {
        let set = |reason: &str, mode, yes| Action::Set {
            node: "n1".into(),
            mode,
            reason: reason.into(),
            yes,
            force: false,
        };
        assert!(check(&set("", Mode::Manual, false)).is_err());
        assert!(check(&set("fw", Mode::Termination, false)).is_err());
        assert!(check(&set("fw", Mode::Manual, false)).is_ok());
    }
}
