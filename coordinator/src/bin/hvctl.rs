//! `hvctl`: the SRE's command line. Reads go to the coordinator's
//! FleetService and health service; `retry` is a write to the Hypervisor
//! (the retry annotation), so it works whichever replica leads.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use hv_coordinator::api::hypervisor::HealthState;
use hv_coordinator::api::keys::{CLEAR_FENCED_ANNOTATION, CONFIRM_FENCED_ANNOTATION, RETRY_ANNOTATION};
use hv_coordinator::api::keys::{MACHINE_GONE_ANNOTATION, PAUSED_ANNOTATION, RETIRE_ANNOTATION};
use hv_coordinator::api::{Hypervisor, Phase};
use hv_proto::v1::fleet_service_client::FleetServiceClient;
use hv_proto::v1::{GetHypervisorRequest, Hypervisor as PbHypervisor, ListHypervisorsRequest, WatchRequest};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[derive(Parser, Debug)]
#[command(version, about = "Look at and act on the hypervisor fleet")]
struct Args {
    /// The coordinator's gRPC endpoint: https:// with a client certificate,
    /// http:// only for a coordinator started with --insecure.
    #[arg(long, env = "HV_COORDINATOR", default_value = "https://127.0.0.1:9090", global = true)]
    coordinator: String,
    /// Your PEM client certificate, from the CA the coordinator trusts.
    #[arg(long, env = "HV_TLS_CERT", global = true)]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "HV_TLS_KEY", global = true)]
    tls_key: Option<PathBuf>,
    /// PEM CA that signed the coordinator's certificate.
    #[arg(long, env = "HV_TLS_CA", global = true)]
    tls_ca: Option<PathBuf>,
    /// Talk plain text to an http:// coordinator started with --insecure.
    #[arg(long, global = true)]
    insecure: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Every hypervisor, one line each.
    List {
        /// Only these phases (repeatable).
        #[arg(long = "phase")]
        phases: Vec<String>,
    },
    /// One hypervisor with its conditions.
    Get { node: String },
    /// Phase changes as they happen (all nodes, or the ones named).
    Watch { nodes: Vec<String> },
    /// The gRPC health of node/NODE (SERVING only while Active with a live agent).
    Health { node: String },
    /// Retry an Aborted node, or a fencing step that could not be
    /// confirmed: sets the hypervisor.cloud.sap/retry annotation (uses KUBECONFIG).
    Retry { node: String },
    /// Say that NODE is fenced: you made sure it is powered off (or cut
    /// from its storage and network) by other means. Only for a fencing
    /// under way: it then counts as done past a step that could not be
    /// confirmed; a host whose agent still talks to the coordinator, or a
    /// coordinator that cannot see clearly, does not take it even so.
    /// Sets the hypervisor.cloud.sap/confirm-fenced annotation (uses KUBECONFIG).
    ConfirmFenced { node: String },
    /// Take NODE's fence off once it is repaired and back (powered on, its
    /// agent running): Nova's forced_down is lifted (Nova allows it once the
    /// host's nova-compute has started and cleaned up after the evacuation),
    /// then its Ceph blocklist entries; the host is then checked again
    /// before it takes VMs. Sets the hypervisor.cloud.sap/clear-fenced
    /// annotation (uses KUBECONFIG).
    ClearFenced { node: String },
    /// Retire a fenced NODE that will never come back: once its
    /// evacuation is over, its Ceph blocklist entries are lifted (so a
    /// machine reusing its IP can use RBD) as soon as its BMC reads it off
    /// twice; Nova's forced_down stays until it is decommissioned (its Node
    /// deleted, which also asks a retirement) and the fencing record is
    /// kept. Sets the hypervisor.cloud.sap/retire annotation (uses KUBECONFIG).
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
    /// hypervisor.cloud.sap/paused annotation (uses KUBECONFIG), then waits
    /// up to 30 s for the coordinator to say the host is paused (exit 2
    /// when it does not: until then it may still act).
    Pause {
        node: String,
        /// Why, for the next SRE: shown in the Paused condition.
        #[arg(long)]
        reason: String,
    },
    /// Let the coordinator act on NODE again: removes the
    /// hypervisor.cloud.sap/paused annotation (uses KUBECONFIG).
    Resume { node: String },
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("hvctl: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// TLS for an https:// coordinator: the three files are needed.
fn client_tls(
    coordinator: &str,
    insecure: bool,
    files: (&Option<PathBuf>, &Option<PathBuf>, &Option<PathBuf>),
) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    match (coordinator.starts_with("https://"), insecure) {
        (true, true) => anyhow::bail!("--insecure talks plain text; {coordinator} asks for TLS"),
        (false, false) => anyhow::bail!(
            "{coordinator} is plain text: use https://, or --insecure for a coordinator without TLS"
        ),
        (false, true) => {
            eprintln!(
                "hvctl: warning: --insecure: plain text, no certificate; anyone on the way can read and answer"
            );
            return Ok(None);
        }
        (true, false) => {}
    }
    let (Some(cert), Some(key), Some(ca)) = files else {
        anyhow::bail!(
            "{coordinator} is TLS: give --tls-cert, --tls-key and --tls-ca (or HV_TLS_CERT, HV_TLS_KEY, HV_TLS_CA)"
        );
    };
    let files = hv_tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
    Ok(Some(hv_tls::client::config(&files)?))
}

/// The coordinator's channel; only the commands that ask it need its
/// certificates.
async fn channel(args: &Args) -> anyhow::Result<tonic::transport::Channel> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(args.coordinator.clone())?;
    if let Some(tls) =
        client_tls(&args.coordinator, args.insecure, (&args.tls_cert, &args.tls_key, &args.tls_ca))?
    {
        endpoint = endpoint.tls_config(tls)?;
    }
    endpoint
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("coordinator {}: {}", args.coordinator, hv_tls::explain(&e)))
}

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match &args.command {
        Cmd::List { phases } => list(FleetServiceClient::new(channel(&args).await?), phases.clone()).await?,
        Cmd::Get { node } => {
            let mut c = FleetServiceClient::new(channel(&args).await?);
            print_one(&c.get_hypervisor(GetHypervisorRequest { name: node.clone() }).await?.into_inner());
        }
        Cmd::Watch { nodes } => watch(FleetServiceClient::new(channel(&args).await?), nodes.clone()).await?,
        Cmd::Health { node } => return health(HealthClient::new(channel(&args).await?), node).await,
        Cmd::Retry { node } => {
            let token = jiff::Timestamp::now().to_string();
            annotate(node, RETRY_ANNOTATION, &token).await?;
            println!("retry requested for {node} ({RETRY_ANNOTATION}={token})");
        }
        Cmd::ConfirmFenced { node } => confirm_fenced(node).await?,
        Cmd::ClearFenced { node } => clear_fenced(node).await?,
        Cmd::Retire { node, machine_gone } => retire(node, *machine_gone).await?,
        Cmd::Pause { node, reason } => return pause(node, reason).await,
        Cmd::Resume { node } => resume(node).await?,
    }
    Ok(ExitCode::SUCCESS)
}

type Fleet = FleetServiceClient<tonic::transport::Channel>;

async fn list(mut c: Fleet, phases: Vec<String>) -> anyhow::Result<()> {
    let list = c.list_hypervisors(ListHypervisorsRequest { phases }).await?.into_inner();
    println!(
        "{:<24} {:<15} {:<12} {:<12} {:>9} {:<6} LIBVIRT",
        "NAME", "PHASE", "HEALTH", "MAINTENANCE", "INSTANCES", "AGENT"
    );
    for h in list.hypervisors {
        println!(
            "{:<24} {:<15} {:<12} {:<12} {:>9} {:<6} {}",
            h.name,
            h.phase,
            dash(&h.health),
            dash(&h.maintenance),
            h.instances,
            if h.agent_connected { "yes" } else { "no" },
            dash(&h.libvirt_version)
        );
    }
    Ok(())
}

async fn watch(mut c: Fleet, nodes: Vec<String>) -> anyhow::Result<()> {
    let mut stream = c.watch(WatchRequest { names: nodes }).await?.into_inner();
    while let Some(ev) = stream.message().await? {
        let Some(h) = ev.hypervisor else { continue };
        let at = jiff::Timestamp::now().strftime("%H:%M:%S");
        if ev.initial {
            println!("{at} {:<20} {}", h.name, h.phase);
        } else {
            println!("{at} {:<20} {:<11} -> {:<11} {}", h.name, ev.previous_phase, h.phase, ev.reason);
        }
    }
    Ok(())
}

/// Exit 2 unless SERVING.
async fn health(mut c: HealthClient<tonic::transport::Channel>, node: &str) -> anyhow::Result<ExitCode> {
    let service = format!("node/{node}");
    let status = c.check(HealthCheckRequest { service: service.clone() }).await?.into_inner().status();
    println!("{service}: {}", status.as_str_name());
    if status != tonic_health::pb::health_check_response::ServingStatus::Serving {
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// The Hypervisor `node`, through KUBECONFIG.
async fn hypervisors() -> anyhow::Result<Api<Hypervisor>> {
    Ok(Api::all(kube::Client::try_default().await?))
}

async fn annotate(node: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    hypervisors().await?.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Who asked, and when: the value of an SRE's annotation.
fn signed_now() -> String {
    let who = std::env::var("USER").unwrap_or_else(|_| "an SRE".into());
    format!("{} by {who}", jiff::Timestamp::now())
}

async fn confirm_fenced(node: &str) -> anyhow::Result<()> {
    let hv = hypervisors().await?.get(node).await?;
    let Some(fencing) = hv.status.as_ref().and_then(|s| s.fencing.as_ref()) else {
        anyhow::bail!("{node}: no fencing under way, nothing to confirm (only a Failed host is fenced)");
    };
    // A fenced host that showed life is fenced again on an SRE's word too.
    if fencing.fenced.is_some() && fencing.revival.is_none() {
        println!("{node} is fenced already");
        return Ok(());
    }
    let value = signed_now();
    annotate(node, CONFIRM_FENCED_ANNOTATION, &value).await?;
    println!("{node} confirmed fenced by hand ({CONFIRM_FENCED_ANNOTATION}={value})");
    Ok(())
}

async fn clear_fenced(node: &str) -> anyhow::Result<()> {
    let hv = hypervisors().await?.get(node).await?;
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
    annotate(node, CLEAR_FENCED_ANNOTATION, &value).await?;
    println!(
        "clearing of {node}'s fence asked ({CLEAR_FENCED_ANNOTATION}={value}); its Fenced condition says how it goes"
    );
    Ok(())
}

async fn retire(node: &str, machine_gone: bool) -> anyhow::Result<()> {
    let hv = hypervisors().await?.get(node).await?;
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
            return Ok(());
        }
        Some(_) => {}
    }
    let value = signed_now();
    // The machine's word first: a retirement never starts without it when it was given.
    if machine_gone {
        annotate(node, MACHINE_GONE_ANNOTATION, &value).await?;
    }
    annotate(node, RETIRE_ANNOTATION, &value).await?;
    let wait = if machine_gone { "" } else { " once its BMC reads it off" };
    println!(
        "retirement of {node} asked ({RETIRE_ANNOTATION}={value}): its blocklist entries are lifted{wait} after \
         its evacuation; its Fenced condition says how it goes"
    );
    Ok(())
}

/// The longest reason a pause takes: it is shown in a condition and in
/// Events, whose notes hold 1 kB.
const MAX_REASON: usize = 200;

/// How long `pause` waits for the coordinator to say the host is paused.
const ACKNOWLEDGED_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

async fn pause(node: &str, reason: &str) -> anyhow::Result<ExitCode> {
    let reason = reason.trim();
    if reason.is_empty() {
        anyhow::bail!("--reason is empty: say why, for the next SRE (it is shown in the Paused condition)");
    }
    if reason.chars().count() > MAX_REASON {
        anyhow::bail!("--reason is longer than {MAX_REASON} characters: keep it short, link to a ticket");
    }
    let hv = hypervisors().await?.get(node).await?;
    for warning in pause_warnings(&hv) {
        eprintln!("hvctl: {node}: {warning}");
    }
    let value = format!("{reason} ({})", signed_now());
    annotate(node, PAUSED_ANNOTATION, &value).await?;
    println!("{node}: {PAUSED_ANNOTATION}={value}");
    // Each Hypervisor is reconciled one look at a time: once a look says
    // paused, no earlier one is still acting.
    let started = std::time::Instant::now();
    while started.elapsed() < ACKNOWLEDGED_WITHIN {
        let hv = hypervisors().await?.get(node).await?;
        let said = hv.status.iter().flat_map(|s| &s.conditions).find(|c| c.type_ == "Paused");
        if let Some(c) = said.filter(|c| c.status == "True" && c.message.contains(&value)) {
            println!("{node} paused: {}", c.message);
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    eprintln!(
        "hvctl: {node}: the annotation is set, but no coordinator said the host is paused within {}s \
         (none leads, or it lags): until its Paused condition says so, it may still act",
        ACKNOWLEDGED_WITHIN.as_secs()
    );
    Ok(ExitCode::from(2))
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

async fn resume(node: &str) -> anyhow::Result<()> {
    let hv = hypervisors().await?.get(node).await?;
    if !hv.annotations().contains_key(PAUSED_ANNOTATION) {
        println!("{node} is not paused");
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {PAUSED_ANNOTATION: null}}});
    hypervisors().await?.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    println!("{node} resumed: the coordinator acts on it again");
    Ok(())
}

/// The host's `Fenced` condition says its agent talks again.
fn talks(hv: &Hypervisor) -> bool {
    let conditions = hv.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    let fenced = hv_coordinator::api::condition::ConditionType::Fenced.as_str();
    conditions.iter().any(|c| c.type_ == fenced && c.reason == "FencedAgentTalking")
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

fn print_one(h: &PbHypervisor) {
    println!("name:        {}", h.name);
    println!("phase:       {}", h.phase);
    let since = h.health_since.as_ref().and_then(|t| jiff::Timestamp::new(t.seconds, 0).ok());
    match since {
        Some(t) => println!("health:      {} since {t}", dash(&h.health)),
        None => println!("health:      {}", dash(&h.health)),
    }
    for line in &h.health_evidence {
        println!("  {line}");
    }
    println!("maintenance: {}", dash(&h.maintenance));
    println!("instances:   {}", h.instances);
    println!("agent:       {}", if h.agent_connected { "connected" } else { "not connected" });
    println!("libvirt:     {}", dash(&h.libvirt_version));
    println!("service id:  {}", dash(&h.service_id));
    println!("conditions:");
    for c in &h.conditions {
        println!("  {:<18} {:<7} {:<22} {}", c.r#type, c.status, c.reason, c.message);
    }
}

#[cfg(test)]
mod tests {
    use super::client_tls;

    #[test]
    fn plain_text_only_when_asked_for_by_name() {
        let none = (&None, &None, &None);
        assert!(client_tls("https://c:9090", false, none).unwrap_err().to_string().contains("--tls-cert"));
        assert!(client_tls("http://c:9090", false, none).unwrap_err().to_string().contains("--insecure"));
        assert!(client_tls("http://c:9090", true, none).unwrap().is_none());
        assert!(client_tls("https://c:9090", true, none).is_err());
    }
}
