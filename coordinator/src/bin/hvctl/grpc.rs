//! The two verbs that ask the coordinator itself: the gRPC health of a
//! node, and the fleet API's watch.

use std::path::PathBuf;

use hv_proto::v1::fleet_service_client::FleetServiceClient;
use hv_proto::v1::{HypervisorEvent, WatchRequest};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::exit::{Outcome, Usage};

/// Where the coordinator's gRPC services are, and how to reach them.
#[derive(clap::Args, Debug)]
pub struct Endpoint {
    /// The coordinator's gRPC endpoint (health, watch): https:// with a
    /// client certificate, http:// only for a coordinator started with --insecure.
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
}

/// TLS for an https:// coordinator: the three files are needed.
fn client_tls(
    coordinator: &str,
    insecure: bool,
    files: (&Option<PathBuf>, &Option<PathBuf>, &Option<PathBuf>),
) -> anyhow::Result<Option<tonic::transport::ClientTlsConfig>> {
    match (coordinator.starts_with("https://"), insecure) {
        (true, true) => {
            return Err(Usage(format!("--insecure talks plain text; {coordinator} asks for TLS")).into());
        }
        (false, false) => {
            return Err(Usage(format!(
                "{coordinator} is plain text: use https://, or --insecure for a coordinator without TLS"
            ))
            .into());
        }
        (false, true) => {
            eprintln!(
                "hvctl: warning: --insecure: plain text, no certificate; anyone on the way can read and answer"
            );
            return Ok(None);
        }
        (true, false) => {}
    }
    let (Some(cert), Some(key), Some(ca)) = files else {
        return Err(Usage(format!(
            "{coordinator} is TLS: give --tls-cert, --tls-key and --tls-ca (or HV_TLS_CERT, HV_TLS_KEY, HV_TLS_CA)"
        ))
        .into());
    };
    let files = hv_tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
    Ok(Some(hv_tls::client::config(&files)?))
}

async fn channel(e: &Endpoint) -> anyhow::Result<tonic::transport::Channel> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(e.coordinator.clone())?;
    if let Some(tls) = client_tls(&e.coordinator, e.insecure, (&e.tls_cert, &e.tls_key, &e.tls_ca))? {
        endpoint = endpoint.tls_config(tls)?;
    }
    endpoint
        .connect()
        .await
        .map_err(|err| anyhow::anyhow!("coordinator {}: {}", e.coordinator, hv_tls::explain(&err)))
}

/// No unless SERVING.
pub async fn health(e: &Endpoint, node: &str) -> anyhow::Result<Outcome> {
    let mut c = HealthClient::new(channel(e).await?);
    let service = format!("node/{node}");
    let status = c.check(HealthCheckRequest { service: service.clone() }).await?.into_inner().status();
    println!("{service}: {}", status.as_str_name());
    Ok(Outcome::answer(status == ServingStatus::Serving))
}

pub async fn watch(e: &Endpoint, nodes: Vec<String>) -> anyhow::Result<Outcome> {
    let mut c = FleetServiceClient::new(channel(e).await?);
    let mut stream = c.watch(WatchRequest { names: nodes }).await?.into_inner();
    while let Some(ev) = stream.message().await? {
        let at = jiff::Timestamp::now().strftime("%H:%M:%S");
        if let Some(line) = line(&ev) {
            println!("{at} {line}");
        }
    }
    Ok(Outcome::Done)
}

/// One watch event as a line: a phase change, a health change, or an
/// eviction's progress.
pub fn line(ev: &HypervisorEvent) -> Option<String> {
    let h = ev.hypervisor.as_ref()?;
    let health = if h.health.is_empty() { "-" } else { h.health.as_str() };
    Some(match ev.kind.as_str() {
        _ if ev.initial => format!("{:<20} {:<11} health {health}", h.name, h.phase),
        "health" => format!("{:<20} health {} -> {health}", h.name, dash(&ev.previous_health)),
        "eviction" => {
            let e = ev.eviction.as_ref()?;
            let mut s =
                format!("{:<20} eviction {} {}: {}/{} moved", h.name, e.name, e.phase, e.migrated, e.total);
            if e.in_flight > 0 {
                s.push_str(&format!(", {} in flight", e.in_flight));
            }
            if e.non_migratable > 0 {
                s.push_str(&format!(", {} non-migratable", e.non_migratable));
            }
            s
        }
        _ => format!("{:<20} {:<11} -> {:<11} {}", h.name, ev.previous_phase, h.phase, ev.reason),
    })
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

#[cfg(test)]
mod tests {
    use hv_proto::v1::{EvictionProgress, Hypervisor};

    use super::*;

    #[test]
    fn plain_text_only_when_asked_for_by_name() {
        let none = (&None, &None, &None);
        assert!(client_tls("https://c:9090", false, none).unwrap_err().to_string().contains("--tls-cert"));
        assert!(client_tls("http://c:9090", false, none).unwrap_err().to_string().contains("--insecure"));
        assert!(client_tls("http://c:9090", true, none).unwrap().is_none());
        assert!(client_tls("https://c:9090", true, none).is_err());
    }

    #[test]
    fn a_watch_shows_phase_health_and_eviction_progress() {
        let h = |phase: &str, health: &str| {
            Some(Hypervisor {
                name: "n1".into(),
                phase: phase.into(),
                health: health.into(),
                ..Default::default()
            })
        };
        let phase = HypervisorEvent {
            hypervisor: h("Evicting", "Healthy"),
            previous_phase: "Active".into(),
            reason: "maintenance".into(),
            kind: "phase".into(),
            ..Default::default()
        };
        assert!(line(&phase).unwrap().contains("Active      -> Evicting    maintenance"));
        let health = HypervisorEvent {
            hypervisor: h("Active", "Degraded"),
            kind: "health".into(),
            previous_health: "Healthy".into(),
            ..Default::default()
        };
        assert!(line(&health).unwrap().ends_with("health Healthy -> Degraded"));
        let progress = HypervisorEvent {
            hypervisor: h("Evicting", ""),
            kind: "eviction".into(),
            eviction: Some(EvictionProgress {
                name: "n1-manual-1".into(),
                phase: "Migrating".into(),
                migrated: 2,
                total: 5,
                in_flight: 1,
                non_migratable: 0,
            }),
            ..Default::default()
        };
        assert!(line(&progress).unwrap().ends_with("eviction n1-manual-1 Migrating: 2/5 moved, 1 in flight"));
    }
}
