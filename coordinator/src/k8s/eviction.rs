//! The Eviction controller: the imperative shell around
//! [`eviction::plan::step`](crate::eviction::plan::step). One reconcile
//! observes the servers and their migrations in Nova, steps, creates a
//! `Migration` object for each new attempt *before* asking Nova, aborts
//! stuck ones, and writes the Eviction's and the Migrations' status.
//!
//! Before anything moves, the preflight (`eviction::preflight`) checks
//! against Nova and Placement that every VM has somewhere to go.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::FIELD_MANAGER;
use crate::api::eviction::{EvictionPhase, EvictionStatus, MigrationPolicy, VmState, VmStatus};
use crate::api::{Eviction, Migration, MigrationPhase, MigrationSpec, MigrationStatus};
use crate::eviction::plan::{self, Action, AttemptObs, Input};
use crate::eviction::preflight::preflight;
use crate::metrics::{Metrics, tally};
use crate::nova::servers::{NovaMigration, is_final_status};
use crate::nova::{NovaClient, NovaError};

/// Keeps a deleted Eviction until its in-flight migrations are aborted.
pub const FINALIZER: &str = "hypervisor.cloud.sap/eviction";

pub struct EvictionContext {
    pub client: kube::Client,
    pub nova: Arc<NovaClient>,
    pub migrations: Store<Migration>,
    /// Migrations in flight across all evictions at once.
    pub cluster_max: u32,
    /// Our own status writes, for reconciles the cache has not caught up
    /// with: a stale record would ask for an attempt twice.
    pub written: super::written::Written<Eviction>,
    pub metrics: Arc<Metrics>,
    /// Policy of VMs whose server and Eviction name none.
    pub default_policy: MigrationPolicy,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Nova: {0}")]
    Nova(#[from] NovaError),
}

/// Name of the Migration object of one attempt.
pub fn migration_name(eviction: &str, server_id: &str, attempt: u32) -> String {
    let short: String = server_id.chars().take(8).collect();
    format!("{eviction}-{short}-{attempt}")
}

pub async fn reconcile(ev: Arc<Eviction>, ctx: Arc<EvictionContext>) -> Result<Requeue, Error> {
    let ev = ctx.written.freshest(ev);
    let name = ev.name_any();
    let api: Api<Eviction> = Api::all(ctx.client.clone());
    let status = ev.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let deleting = ev.metadata.deletion_timestamp.is_some();
    let has_finalizer = ev.finalizers().iter().any(|f| f == FINALIZER);
    if !deleting && !has_finalizer && !phase.is_final() {
        let mut finalizers = ev.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        return Ok(Requeue::requeue(Duration::from_millis(100)));
    }
    if phase.is_final() {
        if has_finalizer {
            remove_finalizer(&api, &ev).await?;
        }
        // Over, except a failed preflight: nothing moved, and a spec change
        // (e.g. `force`) runs it again.
        let rerun = !deleting
            && phase == EvictionPhase::Failed
            && preflight_failed(&status)
            && ev.metadata.generation != status.observed_generation;
        if !rerun {
            return Ok(Requeue::await_change());
        }
        let mut s = status.clone();
        s.phase = Some(EvictionPhase::Pending);
        s.completed_at = None;
        write_status(&api, &name, &s).await?;
        return Ok(Requeue::requeue(Duration::from_millis(100)));
    }
    let source = ev.spec.hypervisor.clone();
    let now = Timestamp::now();

    if !deleting && matches!(phase, EvictionPhase::Pending | EvictionPhase::Preflight) {
        return run_preflight(&api, &ctx, &ev, status, now).await;
    }

    // Nothing moves before the host stops taking new VMs (the lifecycle
    // disables it when it sees this Eviction).
    if phase == EvictionPhase::Disabling && !deleting {
        match ctx.nova.service_enabled(&source).await {
            Ok(Some(true)) => return Ok(Requeue::requeue(Duration::from_secs(1))),
            Ok(Some(false)) => {}
            Ok(None) => {
                let mut s = status.clone();
                s.phase = Some(EvictionPhase::Failed);
                s.progress = Some("no compute service".into());
                write_status(&api, &name, &s).await?;
                return Ok(Requeue::await_change());
            }
            Err(e) => {
                tracing::warn!(eviction = %name, error = %e, "Nova not usable; retrying");
                return Ok(Requeue::requeue(Duration::from_secs(5)));
            }
        }
    }

    let mut servers = ctx.nova.servers_on(&source).await?;
    for vm in status.vms.iter().filter(|v| !plan::is_final(v.state)) {
        if !servers.iter().any(|s| s.id == vm.id)
            && let Some(s) = ctx.nova.server(&vm.id).await?
        {
            servers.push(s);
        }
    }
    let mut attempts = Vec::new();
    let mut mig_status = Vec::new();
    let moving: Vec<&VmStatus> = status.vms.iter().filter(|v| v.state == VmState::Migrating).collect();
    // One os-migrations call for every VM in flight (10 min of slack for
    // clock skew; every attempt of this eviction was created after its start).
    let from_host = if moving.is_empty() {
        Vec::new()
    } else {
        let start = status.started_at.as_ref().map_or(now, |t| t.0);
        ctx.nova.migrations_from(&source, start - jiff::SignedDuration::from_mins(10)).await?
    };
    for vm in moving {
        let (obs, st) = observe_attempt(&ctx, &name, vm, &from_host, now).await?;
        attempts.extend(obs);
        mig_status.push((migration_name(&name, &vm.id, vm.attempts), st));
    }
    let elsewhere = ctx
        .migrations
        .state()
        .iter()
        .filter(|m| m.spec.eviction != name)
        .filter(|m| {
            matches!(
                m.status.as_ref().and_then(|s| s.phase),
                Some(MigrationPhase::Running | MigrationPhase::Pending)
            )
        })
        .count();
    let slots = ctx.cluster_max.saturating_sub(u32::try_from(elsewhere).unwrap_or(u32::MAX));
    let mut options = ev.spec.options.clone();
    options.default_policy.get_or_insert(ctx.default_policy);
    let step = plan::step(&Input {
        source: &source,
        options: &options,
        vms: &status.vms,
        servers: &servers,
        attempts: &attempts,
        slots,
        cancelled: deleting,
        now,
    });

    // Record each new attempt before asking Nova, so a crash in between
    // can never lead to a second request for the same attempt.
    let mut s = status.clone();
    s.vms = step.vms.clone();
    s.phase = Some(step.phase);
    fill_counts(&mut s, now);
    // Unchanged records are not written again: every write wakes the
    // Hypervisor's reconcile, which asks Nova about the host.
    if s != status {
        let written = write_status(&api, &name, &s).await?;
        ctx.written.remember(ev.metadata.resource_version.clone(), written);
    }
    ctx.metrics.add(&tally(&status.vms, &step, now));
    for (mname, st) in mig_status {
        write_migration_status(&ctx.client, &mname, &st).await;
    }
    for action in &step.actions {
        match action {
            Action::Migrate { server_id, attempt, live, block_migration } => {
                let vm = step.vms.iter().find(|v| &v.id == server_id).cloned().unwrap_or_default();
                let mname = migration_name(&name, server_id, *attempt);
                let mut m = Migration::new(
                    &mname,
                    MigrationSpec {
                        eviction: name.clone(),
                        server_id: server_id.clone(),
                        server_name: vm.name.clone(),
                        source_host: source.clone(),
                        attempt: *attempt,
                        policy: if *live {
                            MigrationPolicy::LiveMigrate
                        } else {
                            MigrationPolicy::ColdMigrate
                        },
                        block_migration: *block_migration,
                        memory_bytes: vm.memory_bytes,
                    },
                );
                m.metadata.owner_references = ev.controller_owner_ref(&()).map(|o| vec![o]);
                let mapi: Api<Migration> = Api::all(ctx.client.clone());
                let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
                match mapi.create(&pp, &m).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
                let mut st = MigrationStatus {
                    phase: Some(MigrationPhase::Pending),
                    started_at: Some(Time(now)),
                    last_progress_at: Some(Time(now)),
                    ..Default::default()
                };
                match ctx.nova.migrate(server_id, *live).await {
                    Ok(()) => {
                        tracing::info!(eviction = %name, server = %server_id, attempt, "migration requested")
                    }
                    Err(e) => {
                        tracing::warn!(eviction = %name, server = %server_id, attempt, error = %e, "migration refused");
                        st.phase = Some(MigrationPhase::Failed);
                        st.nova_status = Some("refused".into());
                        st.message = e.to_string();
                        st.finished_at = Some(Time(now));
                    }
                }
                write_migration_status(&ctx.client, &mname, &st).await;
            }
            Action::ConfirmResize { server_id, attempt } => {
                ctx.nova.confirm_resize(server_id).await?;
                tracing::info!(eviction = %name, server = %server_id, attempt, "cold migration confirmed");
            }
            Action::Abort { server_id, attempt, nova_migration_id, why } => {
                let mname = migration_name(&name, server_id, *attempt);
                if let Some(id) = nova_migration_id {
                    ctx.nova.abort_migration(server_id, *id).await?;
                }
                tracing::warn!(eviction = %name, server = %server_id, attempt, reason = %why, "migration aborted");
                let mut st = ctx
                    .migrations
                    .get(&ObjectRef::new(&mname))
                    .and_then(|m| m.status.clone())
                    .unwrap_or_default();
                st.phase = Some(MigrationPhase::Aborted);
                st.message = why.clone();
                write_migration_status(&ctx.client, &mname, &st).await;
            }
        }
    }
    if deleting && step.phase == EvictionPhase::Cancelled {
        remove_finalizer(&api, &ev).await?;
        return Ok(Requeue::await_change());
    }
    Ok(Requeue::requeue(if step.phase.is_final() {
        Duration::from_secs(300)
    } else {
        Duration::from_secs(1)
    }))
}

/// Type of the Eviction condition that carries the preflight's verdict.
pub const PREFLIGHT: &str = "Preflight";

fn preflight_failed(s: &EvictionStatus) -> bool {
    s.conditions.iter().any(|c| c.type_ == PREFLIGHT && c.status == "False")
}

/// Could every VM be placed elsewhere? Failing stops the eviction before
/// anything moves, with a condition naming each VM and why.
async fn run_preflight(
    api: &Api<Eviction>,
    ctx: &EvictionContext,
    ev: &Eviction,
    status: EvictionStatus,
    now: Timestamp,
) -> Result<Requeue, Error> {
    let name = ev.name_any();
    let source = &ev.spec.hypervisor;
    let servers = ctx.nova.servers_on(source).await?;
    let candidates = ctx.nova.candidates(source).await?;
    let o = &ev.spec.options;
    let default = o.default_policy.unwrap_or(ctx.default_policy);
    let report = preflight(&servers, default, &candidates, &o.force);
    let mut s = status;
    s.observed_generation = ev.metadata.generation;
    s.started_at.get_or_insert(Time(now));
    if report.findings.is_empty() {
        tracing::info!(eviction = %name, node = %source, summary = %report.summary, "preflight passed");
        set_condition(
            &mut s.conditions,
            PREFLIGHT,
            true,
            "Passed",
            report.summary,
            now,
            ev.metadata.generation,
        );
        s.phase = Some(EvictionPhase::Disabling);
        write_status(api, &name, &s).await?;
        return Ok(Requeue::requeue(Duration::from_millis(100)));
    }
    const SHOWN: usize = 20;
    let mut msg = format!("{} VM(s) cannot be moved: ", report.findings.len());
    let lines: Vec<String> = report.findings.iter().take(SHOWN).map(ToString::to_string).collect();
    msg.push_str(&lines.join("; "));
    if report.findings.len() > SHOWN {
        msg.push_str(&format!("; and {} more", report.findings.len() - SHOWN));
    }
    msg.push_str(
        ". Fix it and delete this Eviction (maintenance makes a new one), \
         or list the checks to skip in spec.options.force",
    );
    tracing::warn!(eviction = %name, node = %source, findings = report.findings.len(), message = %msg, "preflight failed");
    set_condition(&mut s.conditions, PREFLIGHT, false, "Failed", msg, now, ev.metadata.generation);
    s.phase = Some(EvictionPhase::Failed);
    s.progress = Some("preflight failed".into());
    s.completed_at = Some(Time(now));
    write_status(api, &name, &s).await?;
    Ok(Requeue::await_change())
}

/// Sets one condition; `lastTransitionTime` moves only with its status.
fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    now: Timestamp,
    generation: Option<i64>,
) {
    let status = if ok { "True" } else { "False" }.to_string();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
                c.status = status;
            }
            c.reason = reason.into();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message,
            last_transition_time: Time(now),
            observed_generation: generation,
        }),
    }
}

pub fn error_policy(ev: Arc<Eviction>, error: &Error, _ctx: Arc<EvictionContext>) -> Requeue {
    tracing::warn!(eviction = %ev.name_any(), error = %error, "eviction reconcile failed");
    Requeue::requeue(Duration::from_secs(5))
}

/// What Nova shows of one VM's current attempt, and the Migration status to record.
async fn observe_attempt(
    ctx: &EvictionContext,
    eviction: &str,
    vm: &VmStatus,
    from_host: &[NovaMigration],
    now: Timestamp,
) -> Result<(Option<AttemptObs>, MigrationStatus), Error> {
    let mname = migration_name(eviction, &vm.id, vm.attempts);
    let mut st =
        ctx.migrations.get(&ObjectRef::new(&mname)).and_then(|m| m.status.clone()).unwrap_or_default();
    let asked = vm.attempt_started.as_ref().map_or(now, |t| t.0);
    let abort_requested = st.phase == Some(MigrationPhase::Aborted);
    if st.phase == Some(MigrationPhase::Failed) && st.nova_migration_id.is_none() {
        // Nova refused the request outright.
        let obs = AttemptObs {
            server_id: vm.id.clone(),
            attempt: vm.attempts,
            nova_migration_id: None,
            nova_status: Some("error".into()),
            started_at: asked,
            last_progress_at: asked,
            progress_reported: false,
            abort_requested,
        };
        return Ok((Some(obs), st));
    }
    let mut migrations =
        from_host.iter().filter(|m| m.instance_uuid.as_deref() == Some(vm.id.as_str())).cloned();
    let found = match st.nova_migration_id {
        Some(id) => migrations.find(|m| m.id == id),
        // The newest one Nova created since we asked (Nova's clock and ours
        // are both UTC; a few seconds of slack for skew).
        None => migrations.find(|m| {
            m.created_at
                .as_deref()
                .and_then(|c| format!("{}Z", c.trim_end_matches('Z')).parse::<Timestamp>().ok())
                .is_some_and(|c| c.as_second() + 5 >= asked.as_second())
        }),
    };
    let Some(m) = found else {
        return Ok((None, st));
    };
    st.nova_migration_id = Some(m.id);
    st.nova_status = Some(m.status.clone());
    st.target_host = m.dest_compute.clone().or(st.target_host);
    if !abort_requested {
        st.phase = Some(match m.status.as_str() {
            "completed" | "confirmed" => MigrationPhase::Completed,
            "failed" | "error" | "reverted" => MigrationPhase::Failed,
            "cancelled" | "aborted" => MigrationPhase::Cancelled,
            _ => MigrationPhase::Running,
        });
    }
    let mut progress_reported = false;
    if is_final_status(&m.status) {
        st.finished_at.get_or_insert(Time(now));
    } else if m.status != "running" {
        // Counters exist only while a live migration runs: nothing to ask.
    } else if let Some(p) = ctx.nova.progress_of(&vm.id).await?.into_iter().find(|p| p.id == m.id) {
        progress_reported = p.memory_processed_bytes.is_some() || p.disk_processed_bytes.is_some();
        let moved = p.memory_processed_bytes != st.memory_processed_bytes
            || p.memory_remaining_bytes != st.memory_remaining_bytes
            || p.disk_processed_bytes != st.disk_processed_bytes;
        if moved {
            st.last_progress_at = Some(Time(now));
        }
        st.memory_total_bytes = p.memory_total_bytes;
        st.memory_processed_bytes = p.memory_processed_bytes;
        st.memory_remaining_bytes = p.memory_remaining_bytes;
        st.disk_total_bytes = p.disk_total_bytes;
        st.disk_processed_bytes = p.disk_processed_bytes;
        st.disk_remaining_bytes = p.disk_remaining_bytes;
    }
    let obs = AttemptObs {
        server_id: vm.id.clone(),
        attempt: vm.attempts,
        nova_migration_id: Some(m.id),
        nova_status: Some(m.status),
        started_at: st.started_at.as_ref().map_or(asked, |t| t.0),
        last_progress_at: st.last_progress_at.as_ref().map_or(asked, |t| t.0),
        progress_reported,
        abort_requested,
    };
    Ok((Some(obs), st))
}

fn fill_counts(s: &mut EvictionStatus, now: Timestamp) {
    let count =
        |state: VmState| u32::try_from(s.vms.iter().filter(|v| v.state == state).count()).unwrap_or(u32::MAX);
    s.total = u32::try_from(s.vms.len()).unwrap_or(u32::MAX);
    s.migrated = count(VmState::Migrated);
    s.gone = count(VmState::Gone);
    s.non_migratable = count(VmState::NonMigratable);
    s.in_flight = count(VmState::Migrating);
    s.progress = Some(format!("{}/{}", s.migrated, s.total));
    s.started_at.get_or_insert(Time(now));
    if s.phase.is_some_and(|p| p.is_final()) {
        s.completed_at.get_or_insert(Time(now));
    }
}

async fn write_status(api: &Api<Eviction>, name: &str, status: &EvictionStatus) -> Result<Eviction, Error> {
    let patch = serde_json::json!({
        "apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Eviction", "status": status,
    });
    Ok(api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await?)
}

async fn write_migration_status(client: &kube::Client, name: &str, status: &MigrationStatus) {
    let api: Api<Migration> = Api::all(client.clone());
    let patch = serde_json::json!({
        "apiVersion": "hypervisor.cloud.sap/v1alpha1", "kind": "Migration", "status": status,
    });
    if let Err(e) =
        api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await
    {
        tracing::warn!(migration = %name, error = %e, "could not write Migration status");
    }
}

async fn remove_finalizer(api: &Api<Eviction>, ev: &Eviction) -> Result<(), Error> {
    let finalizers: Vec<String> = ev.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
    api.patch(&ev.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}
