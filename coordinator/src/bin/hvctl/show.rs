//! What hvctl prints: tables for a person, the objects as JSON or YAML
//! for a script. The text is made by pure functions of the objects read.

use std::fmt::Write as _;

use hv_coordinator::api::ready::{self, HostReady};
use hv_coordinator::api::{Eviction, Hypervisor};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::ListParams;
use serde::Serialize;

use crate::Output;
use crate::exit::Outcome;
use crate::kube_api::{evictions, hypervisor, hypervisors};

/// `value` as JSON or YAML, or the text `table` makes.
pub fn emit<T: Serialize>(out: Output, value: &T, table: impl FnOnce() -> String) -> anyhow::Result<()> {
    match out {
        Output::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Output::Yaml => print!("{}", serde_norway::to_string(value)?),
        Output::Table | Output::Wide => print!("{}", table()),
    }
    Ok(())
}

/// A list of objects as `kubectl get -o json` prints one.
pub fn list_of<T: Serialize>(items: &[T]) -> serde_json::Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items})
}

pub async fn list(kube: &kube::Client, phases: &[String], out: Output) -> anyhow::Result<Outcome> {
    let mut all = hypervisors(kube).list(&ListParams::default()).await?.items;
    all.retain(|h| phases.is_empty() || phases.iter().any(|p| p == phase(h)));
    all.sort_by_key(ResourceExt::name_any);
    emit(out, &list_of(&all), || table(&all, out == Output::Wide))?;
    Ok(Outcome::Done)
}

fn phase(h: &Hypervisor) -> &'static str {
    h.status.as_ref().and_then(|s| s.phase).unwrap_or_default().as_str()
}

/// One line per hypervisor; wide adds its versions and service.
pub fn table(all: &[Hypervisor], wide: bool) -> String {
    let mut s = format!(
        "{:<24} {:<15} {:<12} {:<12} {:>9} {:<6} {:<18}",
        "NAME", "PHASE", "HEALTH", "MAINTENANCE", "INSTANCES", "AGENT", "READY"
    );
    s.push_str(if wide { " LIBVIRT    SERVICE\n" } else { "\n" });
    for h in all {
        let st = h.status.clone().unwrap_or_default();
        let _ = write!(
            s,
            "{:<24} {:<15} {:<12} {:<12} {:>9} {:<6} {:<18}",
            h.name_any(),
            phase(h),
            st.health.as_ref().map_or("-".into(), |x| x.state.to_string()),
            dash(h.spec.maintenance.as_str()),
            st.instances.as_ref().map_or(0, |i| i.count),
            if st.agent.as_ref().is_some_and(|a| a.connected) { "yes" } else { "no" },
            ready::host(&st).0.reason(),
        );
        if wide {
            let _ = write!(
                s,
                " {:<10} {}",
                st.libvirt_version.as_deref().unwrap_or("-"),
                st.service_id.as_deref().unwrap_or("-")
            );
        }
        s.push('\n');
    }
    s
}

pub async fn get(kube: &kube::Client, node: &str, out: Output) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    emit(out, &hv, || describe(&hv))?;
    Ok(Outcome::Done)
}

/// One hypervisor, for a person.
pub fn describe(hv: &Hypervisor) -> String {
    let st = hv.status.clone().unwrap_or_default();
    let mut s = String::new();
    let _ = writeln!(s, "name:        {}", hv.name_any());
    let _ = writeln!(s, "phase:       {}", phase(hv));
    match st.health.as_ref() {
        Some(h) => {
            match &h.since {
                Some(t) => _ = writeln!(s, "health:      {} since {}", h.state, t.0),
                None => _ = writeln!(s, "health:      {}", h.state),
            }
            for line in &h.evidence {
                let _ = writeln!(s, "  {line}");
            }
        }
        None => _ = writeln!(s, "health:      -"),
    }
    let _ = writeln!(s, "maintenance: {}", dash(hv.spec.maintenance.as_str()));
    let _ = writeln!(s, "instances:   {}", st.instances.as_ref().map_or(0, |i| i.count));
    let agent = st.agent.as_ref().is_some_and(|a| a.connected);
    let _ = writeln!(s, "agent:       {}", if agent { "connected" } else { "not connected" });
    let _ = writeln!(s, "libvirt:     {}", st.libvirt_version.as_deref().unwrap_or("-"));
    let _ = writeln!(s, "service id:  {}", st.service_id.as_deref().unwrap_or("-"));
    let _ = writeln!(s, "conditions:");
    for c in &st.conditions {
        let _ = writeln!(s, "  {:<18} {:<7} {:<22} {}", c.type_, c.status, c.reason, c.message);
    }
    s
}

/// What `hvctl why` says of a host.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Why {
    pub node: String,
    pub in_service: bool,
    pub reason: &'static str,
    pub phase: &'static str,
    /// The condition that holds the host.
    pub holding: Option<Said>,
    /// Other conditions that hold it back now: hands off, an update's
    /// deadline, a lost signal.
    pub gates: Vec<Said>,
    /// The eviction under way on it, if any.
    pub eviction: Option<String>,
    pub next: String,
}

/// One condition, as shown.
#[derive(Debug, Serialize, PartialEq)]
pub struct Said {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

impl From<&Condition> for Said {
    fn from(c: &Condition) -> Self {
        Said {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
        }
    }
}

pub async fn why(kube: &kube::Client, node: &str, out: Output) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    let all = evictions(kube).list(&ListParams::default()).await?.items;
    let running = all.iter().find(|e| e.spec.hypervisor == node && e.is_running());
    let w = explain(&hv, running);
    emit(out, &w, || why_text(&w))?;
    Ok(Outcome::answer(w.in_service))
}

/// Why the host is or is not in service ([`ready::host`]), with its gates
/// and the next step.
pub fn explain(hv: &Hypervisor, running: Option<&Eviction>) -> Why {
    let node = hv.name_any();
    let st = hv.status.clone().unwrap_or_default();
    let (why, holding) = ready::host(&st);
    let holding_type = holding.map(|c| c.type_.clone());
    let gates = st
        .conditions
        .iter()
        .filter(|c| Some(&c.type_) != holding_type.as_ref() && gate(c))
        .map(Said::from)
        .collect();
    let eviction = running.map(|e| {
        let s = e.status.clone().unwrap_or_default();
        let phase = s.phase.unwrap_or_default();
        let progress = s.progress.unwrap_or_default();
        let waiting = e.unmet_message();
        format!(
            "{} {phase:?} {progress}{}",
            e.name_any(),
            if waiting.is_empty() { String::new() } else { format!(": {waiting}") }
        )
    });
    Why {
        in_service: why == HostReady::InService,
        reason: why.reason(),
        phase: phase(hv),
        holding: holding.map(Said::from),
        gates,
        eviction,
        next: why.next_step().replace("NODE", &node),
        node,
    }
}

/// A condition that holds a host back whatever its phase.
fn gate(c: &Condition) -> bool {
    matches!(
        (c.type_.as_str(), c.status.as_str()),
        ("Paused" | "UpdateDrain" | "Aborted", "True")
            | ("AgentConnected" | "NodeHealthy" | "SchedulingEnabled" | "Deleting", "False")
            | ("Fenced", _)
    )
}

pub fn why_text(w: &Why) -> String {
    let mut s = match w.in_service {
        true => format!("{}: in service ({})\n", w.node, w.phase),
        false => format!("{}: not in service: {} (phase {})\n", w.node, w.reason, w.phase),
    };
    if let Some(c) = &w.holding {
        let _ = writeln!(s, "  held by:  {} {} ({}): {}", c.type_, c.status, c.reason, c.message);
    }
    for c in &w.gates {
        let _ = writeln!(s, "  gate:     {} {} ({}): {}", c.type_, c.status, c.reason, c.message);
    }
    if let Some(e) = &w.eviction {
        let _ = writeln!(s, "  eviction: {e}");
    }
    let _ = writeln!(s, "  next:     {}", w.next);
    s
}

/// A dry run's plan: the Preflight condition as recorded (and any other
/// condition that is not True: what held the preflight), then each VM.
pub fn plan(ev: &Eviction) -> String {
    let st = ev.status.clone().unwrap_or_default();
    let mut s = String::new();
    // The preflight's verdict, and whatever held it or refused the run.
    let said = |c: &&Condition| c.type_ == "Preflight" || (c.type_ != "Ready" && c.status != "True");
    for c in st.conditions.iter().filter(said) {
        let _ = writeln!(s, "{} {} ({}): {}", c.type_, c.status, c.reason, c.message);
    }
    let _ = writeln!(s, "{:<38} {:<20} {:<12} {:<20} FINDING", "VM", "NAME", "POLICY", "FITS ON");
    for v in &st.preflight {
        let policy = serde_json::to_value(v.policy)
            .ok()
            .and_then(|p| p.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<38} {:<20} {:<12} {:<20} {}",
            v.id,
            dash(&v.name),
            policy,
            v.fits_on.as_deref().unwrap_or("-"),
            v.finding.as_deref().unwrap_or("-")
        );
    }
    s
}

/// The evictions, newest first; with `vms`, each one's VMs beneath it.
pub fn evictions_table(all: &[Eviction], vms: bool) -> String {
    let mut s = format!(
        "{:<36} {:<20} {:<13} {:<10} {:<9} {}\n",
        "NAME", "NODE", "REASON", "PHASE", "MOVED", "WAITING"
    );
    for e in all {
        let st = e.status.clone().unwrap_or_default();
        let _ = writeln!(
            s,
            "{:<36} {:<20} {:<13} {:<10} {:<9} {}",
            e.name_any(),
            e.spec.hypervisor,
            e.spec.reason.as_str(),
            format!("{:?}", st.phase.unwrap_or_default()),
            format!("{}/{}", st.migrated, st.total),
            dash(&e.unmet_message())
        );
        if vms && !st.vms.is_empty() {
            let _ = writeln!(
                s,
                "  {:<38} {:<20} {:<14} {:>8} {:<20} REASON",
                "VM", "NAME", "STATE", "ATTEMPTS", "TARGET"
            );
            for v in &st.vms {
                let _ = writeln!(
                    s,
                    "  {:<38} {:<20} {:<14} {:>8} {:<20} {}",
                    v.id,
                    dash(&v.name),
                    format!("{:?}", v.state),
                    v.attempts,
                    v.target_host.as_deref().unwrap_or("-"),
                    dash(&v.reason)
                );
            }
        }
    }
    s
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[cfg(test)]
mod tests {
    use hv_coordinator::api::HypervisorStatus;
    use hv_coordinator::api::hypervisor::Phase;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn cond(t: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason}!"),
            last_transition_time: Time(jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    fn hv(phase: Phase, conditions: Vec<Condition>) -> Hypervisor {
        let mut h = Hypervisor::new("n1", Default::default());
        h.status = Some(HypervisorStatus { phase: Some(phase), conditions, ..Default::default() });
        h
    }

    #[test]
    fn why_names_the_holding_condition_the_gates_and_the_next_step() {
        let h = hv(
            Phase::Aborted,
            vec![
                cond("Aborted", "True", "TestsFailed"),
                cond("Paused", "True", "PausedBySre"),
                cond("AgentConnected", "True", "Connected"),
            ],
        );
        let w = explain(&h, None);
        assert!(!w.in_service);
        assert_eq!(w.reason, "Aborted");
        assert_eq!(w.holding.as_ref().map(|c| c.reason.as_str()), Some("TestsFailed"));
        assert_eq!(w.gates.iter().map(|g| g.type_.as_str()).collect::<Vec<_>>(), ["Paused"]);
        assert!(w.next.contains("hvctl retry n1"), "{}", w.next);
        let text = why_text(&w);
        assert!(text.starts_with("n1: not in service: Aborted (phase Aborted)"), "{text}");
        assert!(text.contains("  held by:  Aborted True (TestsFailed): TestsFailed!"), "{text}");
    }

    #[test]
    fn a_host_in_service_says_so() {
        let h = hv(
            Phase::Active,
            vec![cond("AgentConnected", "True", "Connected"), cond("SchedulingEnabled", "True", "Enabled")],
        );
        let w = explain(&h, None);
        assert!(w.in_service);
        assert!(w.gates.is_empty() && w.holding.is_none());
        assert_eq!(why_text(&w).lines().next(), Some("n1: in service (Active)"));
    }

    #[test]
    fn the_table_shows_health_and_the_ready_reason() {
        let h = hv(Phase::Active, vec![cond("AgentConnected", "False", "Disconnected")]);
        let t = table(&[h], false);
        let row = t.lines().nth(1).unwrap_or_default();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            ["n1", "Active", "-", "-", "0", "no", "AgentDisconnected"]
        );
    }
}
