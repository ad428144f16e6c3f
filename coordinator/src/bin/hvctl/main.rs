//! `hvctl`: the SRE's command line (docs/hvctl.md). Everything but
//! `health` and `watch` goes to the Kubernetes API with the caller's own
//! kubeconfig, so it works whichever coordinator replica leads and needs
//! no certificate of ours; `health` and `watch` ask the coordinator's gRPC
//! services.

mod evict;
mod exit;
mod grpc;
mod kube_api;
mod maintenance;
mod marks;
mod power;
mod show;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::exit::Outcome;
use hv_coordinator::api::power::DesiredPower;

#[derive(Parser, Debug)]
#[command(version, about = "Look at and act on the hypervisor fleet", after_help = exit::HELP)]
pub struct Args {
    /// The kubeconfig to use (default: KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    /// How to print what is read: a table, a wider table, or the objects as JSON or YAML.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(flatten)]
    grpc: grpc::Endpoint,
    #[command(subcommand)]
    command: Cmd,
}

/// How `hvctl` prints what it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Every hypervisor, one line each.
    List {
        /// Only these phases (repeatable).
        #[arg(long = "phase")]
        phases: Vec<String>,
    },
    /// One hypervisor with its health and conditions.
    Get { node: String },
    /// Why NODE is not in service: what holds it, the gates it waits on, and
    /// the next step. Exits 3 when it is not in service.
    Why { node: String },
    /// Phase, health and eviction progress as they change (all nodes, or
    /// the ones named), from the coordinator's gRPC fleet API.
    Watch { nodes: Vec<String> },
    /// The gRPC health of node/NODE (SERVING only while Active with a live
    /// agent). Exits 3 unless SERVING.
    Health { node: String },
    /// Put NODE into maintenance (its VMs are moved off, it is held out of
    /// service), or take it out.
    Maintenance {
        #[command(subcommand)]
        action: maintenance::Action,
    },
    /// Empty NODE by hand with an Eviction (reason AdminRequest); with
    /// --dry-run, only its preflight: the plan per VM, nothing moved.
    Evict(evict::EvictArgs),
    /// Evictions (of NODE, or all), with a table of their VMs.
    Evictions { node: Option<String> },
    /// Retry an Aborted node, or a fencing step that could not be
    /// confirmed: sets the hypervisor.cloud.sap/retry annotation.
    Retry { node: String },
    /// Say that NODE is fenced: you made sure it is powered off (or cut
    /// from its storage and network) by other means. Only for a fencing
    /// under way: it then counts as done past a step that could not be
    /// confirmed; a host whose agent still talks to the coordinator, or a
    /// coordinator that cannot see clearly, does not take it even so.
    /// Sets the hypervisor.cloud.sap/confirm-fenced annotation.
    ConfirmFenced { node: String },
    /// Take NODE's fence off once it is repaired and back (powered on, its
    /// agent running): Nova's forced_down is lifted (Nova allows it once the
    /// host's nova-compute has started and cleaned up after the evacuation),
    /// then its Ceph blocklist entries; the host is then checked again
    /// before it takes VMs. Sets the hypervisor.cloud.sap/clear-fenced
    /// annotation.
    ClearFenced { node: String },
    /// Retire a fenced NODE that will never come back: once its
    /// evacuation is over, its Ceph blocklist entries are lifted (so a
    /// machine reusing its IP can use RBD) as soon as its BMC reads it off
    /// twice; Nova's forced_down stays until it is decommissioned (its Node
    /// deleted, which also asks a retirement) and the fencing record is
    /// kept. Sets the hypervisor.cloud.sap/retire annotation.
    Retire {
        node: String,
        /// The machine is removed or wiped: lift its entries without a BMC
        /// reading (for a host without a BMC, or one that no longer
        /// answers). Also sets hypervisor.cloud.sap/machine-gone.
        #[arg(long)]
        machine_gone: bool,
    },
    /// Hands off NODE while you work on it by hand: the coordinator writes
    /// nothing for it (Nova, Placement, Ceph, its BMC, its Node and pods)
    /// and never fences it, but still judges and reports it, with what it
    /// would do, in its Paused condition. Sets the
    /// hypervisor.cloud.sap/paused annotation, then waits up to 30 s for
    /// the coordinator to say the host is paused (exit 4 when it does not:
    /// until then it may still act).
    Pause {
        node: String,
        /// Why, for the next SRE: shown in the Paused condition.
        #[arg(long)]
        reason: String,
    },
    /// Let the coordinator act on NODE again: removes the
    /// hypervisor.cloud.sap/paused annotation.
    Resume { node: String },
    /// Hibernate NODE once it is Active and empty: disabled in Nova and
    /// powered off through its BMC (sets spec.powerState: Hibernating).
    Hibernate { node: String },
    /// Wake NODE: powered on, its agent and nova-compute back, its checks
    /// run again, then enabled (sets spec.powerState: Running).
    Wake { node: String },
    /// Print a shell completion script: `source <(hvctl completion bash)`.
    Completion { shell: clap_complete::Shell },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(outcome) => outcome.code(),
        Err(e) => {
            eprintln!("hvctl: {e:#}");
            exit::of_error(&e)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<Outcome> {
    let out = args.output;
    match &args.command {
        Cmd::Watch { nodes } => return grpc::watch(&args.grpc, nodes.clone()).await,
        Cmd::Health { node } => return grpc::health(&args.grpc, node).await,
        Cmd::Completion { shell } => {
            clap_complete::generate(*shell, &mut Args::command(), "hvctl", &mut std::io::stdout());
            return Ok(Outcome::Done);
        }
        _ => {}
    }
    match &args.command {
        Cmd::Maintenance { action } => maintenance::check(action)?,
        Cmd::Pause { reason, .. } => marks::check_reason(reason)?,
        _ => {}
    }
    let kube = kube_api::client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    match &args.command {
        Cmd::List { phases } => show::list(&kube, phases, out).await,
        Cmd::Get { node } => show::get(&kube, node, out).await,
        Cmd::Why { node } => show::why(&kube, node, out).await,
        Cmd::Maintenance { action } => maintenance::run(&kube, action).await,
        Cmd::Evict(a) => evict::evict(&kube, a, out).await,
        Cmd::Evictions { node } => evict::list(&kube, node.as_deref(), out).await,
        Cmd::Retry { node } => marks::retry(&kube, node).await,
        Cmd::ConfirmFenced { node } => marks::confirm_fenced(&kube, node).await,
        Cmd::ClearFenced { node } => marks::clear_fenced(&kube, node).await,
        Cmd::Retire { node, machine_gone } => marks::retire(&kube, node, *machine_gone).await,
        Cmd::Pause { node, reason } => marks::pause(&kube, node, reason).await,
        Cmd::Resume { node } => marks::resume(&kube, node).await,
        Cmd::Hibernate { node } => power::set(&kube, node, DesiredPower::Hibernating).await,
        Cmd::Wake { node } => power::set(&kube, node, DesiredPower::Running).await,
        Cmd::Watch { .. } | Cmd::Health { .. } | Cmd::Completion { .. } => Ok(Outcome::Done),
    }
}
