//! The verbs that are an annotation on the Hypervisor: retry, the
//! fencing's confirm, clear and retire, and pause and resume. The
//! coordinator acts on the annotation, whichever replica leads.

use hv_coordinator::api::Hypervisor;
use hv_coordinator::api::Phase;
use hv_coordinator::api::hypervisor::HealthState;
use hv_coordinator::api::keys::{CLEAR_FENCED_ANNOTATION, CONFIRM_FENCED_ANNOTATION, RETRY_ANNOTATION};
use hv_coordinator::api::keys::{MACHINE_GONE_ANNOTATION, PAUSED_ANNOTATION, RETIRE_ANNOTATION};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};

use crate::exit::{Outcome, Usage};
use crate::kube_api::{hypervisor, hypervisors};

async fn annotate(kube: &kube::Client, node: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    hypervisors(kube).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

pub async fn retry(kube: &kube::Client, node: &str) -> anyhow::Result<Outcome> {
    hypervisor(kube, node).await?;
    let token = jiff::Timestamp::now().to_string();
    annotate(kube, node, RETRY_ANNOTATION, &token).await?;
    println!("retry requested for {node} ({RETRY_ANNOTATION}={token})");
    Ok(Outcome::Done)
}

/// Who asked, and when: the value of an SRE's annotation.
fn signed_now() -> String {
    let who = std::env::var("USER").unwrap_or_else(|_| "an SRE".into());
    format!("{} by {who}", jiff::Timestamp::now())
}

pub async fn confirm_fenced(kube: &kube::Client, node: &str) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    let Some(fencing) = hv.status.as_ref().and_then(|s| s.fencing.as_ref()) else {
        anyhow::bail!("{node}: no fencing under way, nothing to confirm (only a Failed host is fenced)");
    };
    // A fenced host that showed life is fenced again on an SRE's word too.
    if fencing.fenced.is_some() && fencing.revival.is_none() {
        println!("{node} is fenced already");
        return Ok(Outcome::Done);
    }
    let value = signed_now();
    annotate(kube, node, CONFIRM_FENCED_ANNOTATION, &value).await?;
    println!("{node} confirmed fenced by hand ({CONFIRM_FENCED_ANNOTATION}={value})");
    Ok(Outcome::Done)
}

pub async fn clear_fenced(kube: &kube::Client, node: &str) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    let Some(fencing) = hv.status.as_ref().and_then(|s| s.fencing.as_ref()) else {
        anyhow::bail!("{node}: not fenced, nothing to clear");
    };
    if fencing.retirement.is_some() {
        eprintln!(
            "hvctl: {node} was retired: this clearing cancels its retirement (its blocklist entries, if lifted, \
             stay lifted), and the host comes back once it is repaired"
        );
    }
    let value = signed_now();
    annotate(kube, node, CLEAR_FENCED_ANNOTATION, &value).await?;
    println!(
        "clearing of {node}'s fence asked ({CLEAR_FENCED_ANNOTATION}={value}); its Fenced condition says how it goes"
    );
    Ok(Outcome::Done)
}

pub async fn retire(kube: &kube::Client, node: &str, machine_gone: bool) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    let fencing = hv.status.as_ref().and_then(|s| s.fencing.as_ref());
    match fencing {
        None => anyhow::bail!(
            "{node}: not fenced. Only a fenced host is retired; one in service is decommissioned by deleting its Node"
        ),
        Some(_) if talks(&hv) => anyhow::bail!(
            "{node}: its agent talks to the coordinator (Fenced: FencedAgentTalking): a host gone for good does not; \
             look at the host"
        ),
        Some(f) if f.fenced.is_none() => anyhow::bail!(
            "{node}: its fencing is still under way. Once you made sure it is off, say so (hvctl confirm-fenced {node}), \
             then retire it"
        ),
        Some(f) if f.retired() && !machine_gone => {
            println!("{node} is retired already");
            return Ok(Outcome::Done);
        }
        Some(_) => {}
    }
    let value = signed_now();
    // The machine's word first: a retirement never starts without it when it was given.
    if machine_gone {
        annotate(kube, node, MACHINE_GONE_ANNOTATION, &value).await?;
    }
    annotate(kube, node, RETIRE_ANNOTATION, &value).await?;
    let wait = if machine_gone { "" } else { " once its BMC reads it off" };
    println!(
        "retirement of {node} asked ({RETIRE_ANNOTATION}={value}): its blocklist entries are lifted{wait} after \
         its evacuation; its Fenced condition says how it goes"
    );
    Ok(Outcome::Done)
}

/// The longest reason a pause takes: it is shown in a condition and in
/// Events, whose notes hold 1 kB.
const MAX_REASON: usize = 200;

/// How long `pause` waits for the coordinator to say the host is paused.
const ACKNOWLEDGED_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// A pause's reason, before anything is read: a usage error otherwise.
pub fn check_reason(reason: &str) -> Result<(), Usage> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(Usage(
            "--reason is empty: say why, for the next SRE (it is shown in the Paused condition)".into(),
        ));
    }
    if reason.chars().count() > MAX_REASON {
        return Err(Usage(format!(
            "--reason is longer than {MAX_REASON} characters: keep it short, link to a ticket"
        )));
    }
    Ok(())
}

pub async fn pause(kube: &kube::Client, node: &str, reason: &str) -> anyhow::Result<Outcome> {
    check_reason(reason)?;
    let reason = reason.trim();
    let hv = hypervisor(kube, node).await?;
    for warning in pause_warnings(&hv) {
        eprintln!("hvctl: {node}: {warning}");
    }
    let value = format!("{reason} ({})", signed_now());
    annotate(kube, node, PAUSED_ANNOTATION, &value).await?;
    println!("{node}: {PAUSED_ANNOTATION}={value}");
    // Each Hypervisor is reconciled one look at a time: once a look says
    // paused, no earlier one is still acting.
    let started = std::time::Instant::now();
    while started.elapsed() < ACKNOWLEDGED_WITHIN {
        let hv = hypervisor(kube, node).await?;
        let said = hv.status.iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "Paused");
        if let Some(c) = said.filter(|c| c.status == "True" && c.message.contains(&value)) {
            println!("{node} paused: {}", c.message);
            return Ok(Outcome::Done);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    eprintln!(
        "hvctl: {node}: the annotation is set, but no coordinator said the host is paused within {}s \
         (none leads, or it lags): until its Paused condition says so, it may still act",
        ACKNOWLEDGED_WITHIN.as_secs()
    );
    Ok(Outcome::TimedOut)
}

/// What a pause holds back that an SRE should know of first.
fn pause_warnings(hv: &Hypervisor) -> Vec<&'static str> {
    let Some(status) = hv.status.as_ref() else { return Vec::new() };
    let mut warnings = Vec::new();
    if status.fencing.is_some() {
        warnings.push("its fencing stops where it is, and its servers are not evacuated while it is paused");
    }
    if status.health.as_ref().is_some_and(|h| h.state == HealthState::Failed) {
        warnings.push(
            "it is Failed: paused, it is neither fenced nor disabled, and Nova may still place VMs on it",
        );
    }
    if status.phase == Some(Phase::Evicting) {
        warnings.push("its eviction stops asking Nova anything: migrations in flight go on unwatched");
    }
    warnings
}

pub async fn resume(kube: &kube::Client, node: &str) -> anyhow::Result<Outcome> {
    let hv = hypervisor(kube, node).await?;
    if !hv.annotations().contains_key(PAUSED_ANNOTATION) {
        println!("{node} is not paused");
        return Ok(Outcome::Done);
    }
    let patch = serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}});
    hypervisors(kube).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    println!("{node} resumed: the coordinator acts on it again");
    Ok(Outcome::Done)
}

/// The host's `Fenced` condition says its agent talks again.
fn talks(hv: &Hypervisor) -> bool {
    let conditions = hv.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let fenced = hv_coordinator::api::condition::ConditionType::Fenced.as_str();
    conditions.iter().any(|c| c.type_ == fenced && c.reason == "FencedAgentTalking")
}
