//! `hvctl evict` and `hvctl evictions`: an Eviction made by hand, its dry
//! run (the preflight alone, as the coordinator records it), and the
//! evictions with their VMs.

use std::time::Duration;

use hv_coordinator::api::eviction::EvictionOptions;
use hv_coordinator::api::{Eviction, EvictionPhase, EvictionReason, EvictionSpec};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::Output;
use crate::exit::Outcome;
use crate::kube_api::{evictions, hypervisor};
use crate::show;

#[derive(clap::Args, Debug)]
pub struct EvictArgs {
    node: String,
    /// Only the preflight: print where each VM would fit, or what stops
    /// it, as the coordinator records it; nothing is disabled or moved.
    /// Exits 3 when some VM cannot move.
    #[arg(long)]
    dry_run: bool,
    /// Put the host back into service once it is emptied (default: it
    /// stays disabled).
    #[arg(long)]
    re_enable: bool,
    /// Skip a preflight check (capacity, constraints, compatibility, os,
    /// machine); repeatable. Use with care.
    #[arg(long = "force")]
    force: Vec<String>,
    /// How long a dry run waits for its plan.
    #[arg(long, default_value = "120s", value_parser = humantime_secs)]
    timeout: Duration,
    /// Keep the dry run's Eviction (it is deleted once printed).
    #[arg(long)]
    keep: bool,
}

fn humantime_secs(s: &str) -> Result<Duration, String> {
    let n = s.strip_suffix('s').unwrap_or(s);
    n.parse::<u64>().map(Duration::from_secs).map_err(|_| format!("{s}: seconds, such as 120s"))
}

pub async fn evict(kube: &kube::Client, a: &EvictArgs, out: Output) -> anyhow::Result<Outcome> {
    hypervisor(kube, &a.node).await?;
    let ev = made(kube, a).await?;
    let name = ev.name_any();
    if !a.dry_run {
        println!("eviction/{name} created: {} is emptied; follow with hvctl evictions {}", a.node, a.node);
        return Ok(Outcome::Done);
    }
    let ended = planned(kube, &name, a.timeout).await;
    if let Ok(Some(ev)) = &ended {
        show::emit(out, ev, || show::plan(ev))?;
    }
    if !a.keep
        && let Err(e) = evictions(kube).delete(&name, &DeleteParams::default()).await
    {
        eprintln!("hvctl: warning: the dry run eviction/{name} is left: {e}");
    }
    let Some(ev) = ended? else {
        eprintln!(
            "hvctl: no plan within {}s: does a coordinator lead? (hvctl why {})",
            a.timeout.as_secs(),
            a.node
        );
        return Ok(Outcome::TimedOut);
    };
    answer(&ev)
}

/// A dry run's answer: every VM can move (Done), some cannot or the
/// preflight could not be judged (No), or it ended otherwise (refused).
fn answer(ev: &Eviction) -> anyhow::Result<Outcome> {
    let s = ev.status.clone().unwrap_or_default();
    if s.phase != Some(EvictionPhase::Planned) {
        anyhow::bail!("the dry run ended {:?}: {}", s.phase.unwrap_or_default(), ev.unmet_message());
    }
    let judged = s.conditions.iter().any(|c| c.type_ == "Preflight" && c.status == "True");
    Ok(Outcome::answer(judged && s.preflight.iter().all(|v| v.finding.is_none())))
}

/// The Eviction, made; for a dry run, first asked of the API server with
/// its own dry run, so that a CRD without `spec.dryRun` (which would drop
/// the field and make a real eviction of it) is found before anything is
/// made.
async fn made(kube: &kube::Client, a: &EvictArgs) -> anyhow::Result<Eviction> {
    // A dry run that a coordinator too old to know it ran for real would
    // at least give its host back.
    let re_enable = Some(a.re_enable || a.dry_run);
    let options = EvictionOptions { re_enable, force: a.force.clone(), ..Default::default() };
    let spec = EvictionSpec {
        hypervisor: a.node.clone(),
        reason: EvictionReason::AdminRequest,
        options,
        dry_run: a.dry_run,
    };
    let kind = if a.dry_run { "dry-run" } else { "hvctl" };
    let mut ev = Eviction::new("", spec);
    ev.metadata.name = None;
    ev.metadata.generate_name = Some(format!("{}-{kind}-", a.node));
    if a.dry_run {
        let tried = evictions(kube).create(&PostParams { dry_run: true, ..Default::default() }, &ev).await?;
        if !tried.spec.dry_run {
            anyhow::bail!(
                "the cluster's Eviction CRD has no spec.dryRun: this would be a real eviction. Upgrade the CRDs \
                 (and the coordinator) first"
            );
        }
    }
    let ev = evictions(kube).create(&PostParams::default(), &ev).await?;
    if a.dry_run && !ev.spec.dry_run {
        anyhow::bail!("eviction/{} was made without spec.dryRun: delete it now", ev.name_any());
    }
    Ok(ev)
}

/// The dry run once it ended, or None when it did not in time.
async fn planned(kube: &kube::Client, name: &str, timeout: Duration) -> anyhow::Result<Option<Eviction>> {
    let started = std::time::Instant::now();
    while started.elapsed() < timeout {
        let ev = evictions(kube).get(name).await?;
        if ev.status.as_ref().and_then(|s| s.phase).is_some_and(EvictionPhase::is_final) {
            return Ok(Some(ev));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(None)
}

pub async fn list(kube: &kube::Client, node: Option<&str>, out: Output) -> anyhow::Result<Outcome> {
    let mut all = evictions(kube).list(&ListParams::default()).await?.items;
    all.retain(|e| node.is_none_or(|n| e.spec.hypervisor == n));
    all.sort_by_key(|e| std::cmp::Reverse(e.creation_timestamp()));
    let vms = node.is_some() || out == Output::Wide;
    show::emit(out, &show::list_of(&all), || show::evictions_table(&all, vms))?;
    Ok(Outcome::Done)
}
