//! hv-agent: the per-node agent.
//!
//! `hv-agent checks` runs the Testing-phase checks once against the given
//! endpoints and prints a table (or JSON): an SRE's first tool on a
//! suspicious node. `hv-agent run` is the DaemonSet's process: it watches
//! libvirt, OVSDB and Ceph and streams everything to the coordinator.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use hv_agent::ceph::CephClient;
use hv_agent::checks::{self, Endpoints};
use hv_agent::libvirt::{LibvirtTarget, SaslCredentials};
use hv_proto::v1::{BridgeExpectation, CheckConfig};

/// Per-node hypervisor agent.
#[derive(Parser, Debug)]
#[command(name = "hv-agent", version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the validation checks once and print the results; exit 0 only if all passed.
    Checks(Box<ChecksCommand>),
    /// Watch the node and stream it to the coordinator (the DaemonSet's command).
    Run(Box<RunArgs>),
    /// Do nothing until stopped (SIGTERM or SIGINT), then exit 0: the
    /// coordinator's drain guard pod, which a drain must evict and which
    /// waits on the host's VMs (docs/drain.md).
    Guard,
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// This node's name: the Kubernetes Node it runs on (its Nova host may differ; the coordinator maps it).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The coordinator's gRPC endpoint (https; http only with --insecure).
    #[arg(long, env = "HV_COORDINATOR", default_value = "https://hv-coordinator.hv-system:9090")]
    coordinator: String,
    /// This agent's PEM certificate: its URI SAN spiffe://DOMAIN/node/NODE
    /// names the node it speaks for. Re-read at each connection.
    #[arg(long, env = "HV_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "HV_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// PEM CA that signed the coordinator's certificate.
    #[arg(long, env = "HV_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// The coordinator's bootstrap port (https): this node's certificate
    /// comes from the coordinator, on the pod's token, instead of
    /// --tls-cert and --tls-key; renewed at two thirds of its life.
    #[arg(long, env = "HV_IDENTITY_URL", conflicts_with_all = ["tls_cert", "tls_key", "insecure"])]
    identity_url: Option<String>,
    /// The pod's projected ServiceAccount token for the coordinator's
    /// audience, read at each request (the kubelet renews it).
    #[arg(long, env = "HV_TOKEN_FILE", default_value = "/var/run/secrets/hv-agent/token")]
    token_file: PathBuf,
    /// Where the certificate from the coordinator is kept for a restarted
    /// container: a memory-backed volume of the pod, never the host's disk.
    #[arg(long, env = "HV_IDENTITY_DIR", default_value = "/run/hv-agent/identity")]
    identity_dir: PathBuf,
    /// Talk to the coordinator in plain text, without a certificate (a
    /// coordinator started with --insecure). A laboratory's setting.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"])]
    insecure: bool,
    /// Heartbeat interval (the coordinator's Welcome may override it), e.g. 10s.
    #[arg(long, env = "HV_HEARTBEAT", default_value = "10s", value_parser = parse_duration)]
    heartbeat: Duration,
    /// Full inventory snapshot interval (events trigger one too), e.g. 60s.
    #[arg(long, env = "HV_INVENTORY_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    inventory_interval: Duration,
    /// Messages kept until the coordinator acknowledges them.
    #[arg(long, env = "HV_BUFFER", default_value_t = 10_000)]
    buffer: usize,
    /// Address of /healthz and /metrics.
    #[arg(long, env = "HV_HEALTH_LISTEN", default_value = "0.0.0.0:9464")]
    health_listen: std::net::SocketAddr,
    /// Where the host's /proc and /sys are, for its health signals
    /// (docs/health.md): the host's root, or where it is mounted in a container.
    #[arg(long, env = "HV_HOST_ROOT", default_value = "/")]
    host_root: std::path::PathBuf,
    /// Log as JSON (production) instead of text.
    #[arg(long, env = "HV_LOG_JSON")]
    log_json: bool,
    #[command(flatten)]
    peers: ChecksArgs,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a duration like 10s, 500ms, 2m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(|| format!("{s:?} is too long"))?),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m)")),
    };
    if d.is_zero() {
        return Err(format!("{s:?}: must be longer than zero"));
    }
    Ok(d)
}

#[derive(clap::Args, Debug)]
struct ChecksCommand {
    #[command(flatten)]
    peers: ChecksArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Where the node's peers are, and what the checks expect of them.
#[derive(clap::Args, Debug)]
struct ChecksArgs {
    /// libvirt URI: qemu+tls://HOST/system (client certificate), qemu+tcp://HOST:16509/system,
    /// or ch+… for Cloud Hypervisor.
    #[arg(long, env = "HV_LIBVIRT_URI", default_value = "qemu+tcp://127.0.0.1:16509/system")]
    libvirt_uri: String,
    /// Directory with the TLS client certificate for qemu+tls:// (cacert.pem, clientcert.pem,
    /// clientkey.pem; libvirt's names). Default: libvirt's own paths.
    #[arg(long, env = "HV_LIBVIRT_PKI_DIR")]
    libvirt_pki_dir: Option<PathBuf>,
    /// SASL user name, for a libvirtd with auth_tls or auth_tcp = "sasl".
    #[arg(long, env = "HV_LIBVIRT_SASL_USERNAME")]
    libvirt_sasl_username: Option<String>,
    /// File holding the SASL password (first line); the variable HV_LIBVIRT_SASL_PASSWORD is
    /// read when no file is given.
    #[arg(long, env = "HV_LIBVIRT_SASL_PASSWORD_FILE")]
    libvirt_sasl_password_file: Option<PathBuf>,
    /// Longest a libvirt connection or snapshot may take before it counts as failed (a hung
    /// libvirtd); the checks get four times this.
    #[arg(long, env = "HV_LIBVIRT_DEADLINE", default_value = "30s", value_parser = parse_duration)]
    libvirt_deadline: Duration,
    /// Lowest acceptable libvirt version.
    #[arg(long, env = "HV_MIN_LIBVIRT_VERSION", default_value = "8.0.0")]
    min_libvirt_version: String,
    /// Skip defining and starting a small test domain.
    #[arg(long)]
    no_test_domain: bool,
    /// OVSDB remote (tcp:HOST:PORT or unix:PATH).
    #[arg(long, env = "HV_OVSDB", default_value = "unix:/run/openvswitch/db.sock")]
    ovsdb: String,
    /// A bridge that must exist (repeatable).
    #[arg(long = "bridge", default_values = ["br-int", "br-ex"])]
    bridges: Vec<String>,
    /// A bridge that is checked when present (repeatable).
    #[arg(long = "optional-bridge", default_values = ["br-provider"])]
    optional_bridges: Vec<String>,
    /// Fail mode a bridge must have, BRIDGE=secure|standalone (repeatable; "" clears the default).
    #[arg(long = "bridge-fail-mode", default_values = ["br-int=secure"], value_parser = pair)]
    bridge_fail_modes: Vec<(String, String)>,
    /// Datapath type a bridge must have, BRIDGE=system|netdev (repeatable).
    #[arg(long = "bridge-datapath", value_parser = pair)]
    bridge_datapaths: Vec<(String, String)>,
    /// A port that must be on a bridge, BRIDGE=PORT (repeatable).
    #[arg(long = "bridge-port", value_parser = pair)]
    bridge_ports: Vec<(String, String)>,
    /// An external_ids key the Open_vSwitch row must carry, KEY=VALUE or KEY=* for any value
    /// (repeatable), e.g. ovn-bridge-mappings=*.
    #[arg(long = "ovs-external-id", value_parser = pair)]
    ovs_external_ids: Vec<(String, String)>,
    /// Ceph configuration file.
    #[arg(long, env = "HV_CEPH_CONF", default_value = "/etc/ceph/ceph.conf")]
    ceph_conf: PathBuf,
    /// Ceph client id, without `client.` (the node's restricted client).
    #[arg(long, env = "HV_CEPH_ID")]
    ceph_id: Option<String>,
    /// Keyring of that client (default /etc/ceph/ceph.client.ID.keyring).
    #[arg(long, env = "HV_CEPH_KEYRING")]
    ceph_keyring: Option<PathBuf>,
    /// An RBD pool that must be readable (repeatable).
    #[arg(long = "pool")]
    pools: Vec<String>,
    /// The helper that runs the RBD checks out of process (default: next to hv-agent).
    #[arg(long, env = "HV_CEPH_PROBE")]
    ceph_probe: Option<PathBuf>,
}

/// `KEY=VALUE`, split at the first `=`.
fn pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

/// The bridge expectations the flags describe, one per bridge.
fn expectations(a: &ChecksArgs) -> Vec<BridgeExpectation> {
    let mut out: Vec<BridgeExpectation> = Vec::new();
    let mut entry = |bridge: &str| -> usize {
        match out.iter().position(|e| e.bridge == bridge) {
            Some(i) => i,
            None => {
                out.push(BridgeExpectation { bridge: bridge.to_string(), ..Default::default() });
                out.len() - 1
            }
        }
    };
    let mut set = Vec::new();
    for (b, m) in &a.bridge_fail_modes {
        set.push((entry(b), 0, m.clone()));
    }
    for (b, d) in &a.bridge_datapaths {
        set.push((entry(b), 1, d.clone()));
    }
    for (b, p) in &a.bridge_ports {
        set.push((entry(b), 2, p.clone()));
    }
    for (i, field, value) in set {
        match field {
            0 => out[i].fail_mode = value,
            1 => out[i].datapath_type = value,
            _ => out[i].ports.push(value),
        }
    }
    out.sort_by(|a, b| a.bridge.cmp(&b.bridge));
    out
}

/// The SASL credentials the flags name; an unreadable password file is an error.
fn sasl(a: &ChecksArgs) -> Result<Option<SaslCredentials>, String> {
    let Some(username) = a.libvirt_sasl_username.clone() else { return Ok(None) };
    let password = match &a.libvirt_sasl_password_file {
        Some(f) => std::fs::read_to_string(f)
            .map_err(|e| format!("reading the libvirt SASL password from {}: {e}", f.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        None => std::env::var("HV_LIBVIRT_SASL_PASSWORD").map_err(|_| {
            "--libvirt-sasl-username needs --libvirt-sasl-password-file or HV_LIBVIRT_SASL_PASSWORD"
                .to_string()
        })?,
    };
    Ok(Some(SaslCredentials { username, password }))
}

fn endpoints(a: &ChecksArgs) -> Result<(Endpoints, CheckConfig), String> {
    let ceph = a.ceph_id.clone().map(|id| CephClient {
        conf: a.ceph_conf.clone(),
        keyring: Some(a.ceph_keyring.clone().unwrap_or_else(|| checks::default_keyring(&id))),
        id,
        timeout: Duration::from_secs(10),
    });
    let uri = match &a.libvirt_pki_dir {
        Some(dir) => LibvirtTarget::with_pki_dir(&a.libvirt_uri, dir),
        None => a.libvirt_uri.clone(),
    };
    let ep = Endpoints {
        libvirt: LibvirtTarget { uri, sasl: sasl(a)?, deadline: a.libvirt_deadline },
        libvirt_lane: Default::default(),
        ovsdb_remote: a.ovsdb.clone(),
        ceph,
        ceph_probe: a.ceph_probe.clone().unwrap_or_else(hv_agent::ceph::default_probe),
    };
    let cfg = CheckConfig {
        min_libvirt_version: a.min_libvirt_version.clone(),
        bridges: a.bridges.clone(),
        optional_bridges: a.optional_bridges.clone(),
        ceph_pools: a.pools.clone(),
        start_test_domain: !a.no_test_domain,
        bridge_expectations: expectations(a),
        ovs_external_ids: a.ovs_external_ids.iter().cloned().collect(),
    };
    Ok((ep, cfg))
}

/// Where the session's certificate comes from.
#[derive(Debug)]
enum SessionCert {
    Insecure,
    Files(hv_tls::TlsFiles),
    FromCoordinator(hv_agent::identity::IdentityConfig),
}

/// The session's TLS from the flags: a certificate from files or from the
/// coordinator, or plain text only when asked for by name, and URL schemes
/// that say the same.
fn session_cert(r: &RunArgs) -> Result<SessionCert, String> {
    let Some(bootstrap) = &r.identity_url else {
        return Ok(session_tls(r)?.map_or(SessionCert::Insecure, SessionCert::Files));
    };
    let Some(ca) = &r.tls_ca else {
        return Err("--identity-url needs --tls-ca, the CA of the coordinator's certificate".into());
    };
    for url in [bootstrap, &r.coordinator] {
        if !url.starts_with("https://") {
            return Err(format!("a certificate from the coordinator is asked for over https://, not {url}"));
        }
    }
    Ok(SessionCert::FromCoordinator(hv_agent::identity::IdentityConfig {
        node: r.node.clone(),
        bootstrap: bootstrap.clone(),
        coordinator: r.coordinator.clone(),
        ca: ca.clone(),
        token_file: r.token_file.clone(),
        dir: r.identity_dir.clone(),
        backoff: Default::default(),
    }))
}

/// The session's TLS from files: a certificate, or plain text only
/// when asked for by name, and a URL scheme that says the same.
fn session_tls(r: &RunArgs) -> Result<Option<hv_tls::TlsFiles>, String> {
    let https = r.coordinator.starts_with("https://");
    if r.insecure {
        if https {
            return Err(format!("--insecure talks plain text; {} asks for TLS", r.coordinator));
        }
        tracing::warn!(coordinator = %r.coordinator, "--insecure: no client certificate; the coordinator cannot tell this agent from anyone");
        return Ok(None);
    }
    let (Some(cert), Some(key), Some(ca)) = (&r.tls_cert, &r.tls_key, &r.tls_ca) else {
        return Err("the session needs --tls-cert, --tls-key and --tls-ca (or --insecure for a coordinator without TLS)".into());
    };
    if !https {
        return Err(format!("with a certificate the coordinator's URL is https://, not {}", r.coordinator));
    }
    Ok(Some(hv_tls::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() }))
}

/// The drain guard's process: as small as a process can be, and stopped
/// at once (a container's first process has no default signal action).
fn guard() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hv-agent: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let stopped = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok::<_, std::io::Error>(())
    });
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hv-agent guard: cannot wait for a signal: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match args.command {
        Command::Run(r) => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            if r.log_json {
                tracing_subscriber::fmt().json().with_env_filter(filter).init();
            } else {
                tracing_subscriber::fmt().with_env_filter(filter).init();
            }
            let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("hv-agent: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let (ep, cfg) = match endpoints(&r.peers) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("hv-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            let (tls, identity) = match session_cert(&r) {
                Ok(SessionCert::Insecure) => (None, None),
                Ok(SessionCert::Files(files)) => (Some(hv_agent::session::SessionTls::Files(files)), None),
                Ok(SessionCert::FromCoordinator(id)) => (None, Some(id)),
                Err(e) => {
                    eprintln!("hv-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            let agent = hv_agent::run::AgentConfig {
                session: hv_agent::session::SessionConfig {
                    coordinator: r.coordinator.clone(),
                    node: r.node.clone(),
                    agent_version: env!("CARGO_PKG_VERSION").into(),
                    boot_id: format!("{:016x}", (hv_agent::backoff::draw() * 1e16) as u64),
                    heartbeat: r.heartbeat,
                    buffer: r.buffer,
                    backoff: Default::default(),
                    tls,
                },
                endpoints: ep,
                ceph_pools: cfg.ceph_pools,
                inventory_interval: r.inventory_interval,
                health_listen: r.health_listen,
                host_root: r.host_root.clone(),
                identity,
            };
            match rt.block_on(hv_agent::run::run(agent)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("hv-agent: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Guard => guard(),
        Command::Checks(a) => {
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("hv-agent: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let (ep, cfg) = match endpoints(&a.peers) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("hv-agent: {e}");
                    return ExitCode::from(2);
                }
            };
            let outcomes = rt.block_on(checks::run(&ep, &cfg));
            if a.json {
                match serde_json::to_string_pretty(&outcomes) {
                    Ok(s) => println!("{s}"),
                    Err(e) => eprintln!("hv-agent: {e}"),
                }
            } else {
                print!("{}", checks::table(&outcomes));
            }
            if outcomes.iter().all(|o| o.passed) { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Args::command().debug_assert();
    }

    #[test]
    fn a_certificate_from_the_coordinator_is_asked_for_over_https_with_its_ca() {
        use clap::Parser;
        let run = |extra: &[&str]| {
            let mut argv = vec!["hv-agent", "run", "--node", "n1"];
            argv.extend_from_slice(extra);
            let super::Command::Run(r) =
                super::Args::try_parse_from(argv).map_err(|e| e.to_string())?.command
            else {
                panic!("not run")
            };
            super::session_cert(&r).map(|c| format!("{c:?}"))
        };
        let asked = run(&["--identity-url", "https://c:9091", "--tls-ca", "ca.pem"]).unwrap();
        assert!(asked.contains("FromCoordinator") && asked.contains("c:9091"), "{asked}");
        assert!(
            asked.contains("/var/run/secrets/hv-agent/token"),
            "the chart's token path by default: {asked}"
        );
        assert!(run(&["--identity-url", "https://c:9091"]).unwrap_err().contains("--tls-ca"));
        assert!(
            run(&["--identity-url", "http://c:9091", "--tls-ca", "ca.pem"]).unwrap_err().contains("https://")
        );
        let with_files = [
            "--identity-url",
            "https://c:9091",
            "--tls-ca",
            "ca.pem",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k",
        ];
        assert!(run(&with_files).is_err(), "one source of certificates");
    }

    #[test]
    fn the_session_is_tls_unless_insecure_is_asked_for_by_name() {
        use clap::Parser;
        let run = |extra: &[&str]| {
            let mut argv = vec!["hv-agent", "run", "--node", "n1"];
            argv.extend_from_slice(extra);
            let super::Command::Run(r) = super::Args::parse_from(argv).command else { panic!("not run") };
            super::session_tls(&r)
        };
        let certs = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"];
        assert!(run(&[]).unwrap_err().contains("--tls-cert"), "no certificate, no session");
        let tls = run(&certs).unwrap().unwrap();
        assert_eq!(tls.cert, std::path::PathBuf::from("c.pem"));
        let http = [&certs[..], &["--coordinator", "http://c:9090"]].concat();
        assert!(run(&http).unwrap_err().contains("https://"));
        assert_eq!(run(&["--insecure", "--coordinator", "http://c:9090"]), Ok(None));
        assert!(run(&["--insecure"]).unwrap_err().contains("plain text"), "the default URL is https");
        let both = [&certs[..], &["--insecure"]].concat();
        assert!(
            super::Args::try_parse_from([&["hv-agent", "run", "--node", "n1"][..], &both].concat()).is_err()
        );
    }

    #[test]
    fn durations() {
        assert_eq!(super::parse_duration("500ms"), Ok(std::time::Duration::from_millis(500)));
        assert_eq!(super::parse_duration("2m"), Ok(std::time::Duration::from_secs(120)));
        assert!(super::parse_duration("ten").is_err());
        assert!(super::parse_duration("5h").is_err());
        assert!(super::parse_duration("0s").is_err(), "a zero deadline or heartbeat is refused");
        assert!(super::parse_duration("18446744073709551615m").is_err(), "too long, not a panic");
    }

    #[test]
    fn bridge_flags_become_one_expectation_per_bridge() {
        use clap::Parser;
        let args = super::Args::parse_from([
            "hv-agent",
            "checks",
            "--bridge-datapath",
            "br-int=netdev",
            "--bridge-port",
            "br-int=patch-tun",
            "--bridge-fail-mode",
            "br-ex=standalone",
        ]);
        let super::Command::Checks(c) = args.command else { panic!("not checks") };
        let e = super::expectations(&c.peers);
        assert_eq!(e.len(), 2, "{e:?}");
        assert_eq!((e[0].bridge.as_str(), e[0].fail_mode.as_str()), ("br-ex", "standalone"));
        assert_eq!((e[1].bridge.as_str(), e[1].datapath_type.as_str()), ("br-int", "netdev"));
        assert_eq!(e[1].fail_mode, "", "giving the flag replaces the default br-int=secure");
        assert_eq!(e[1].ports, vec!["patch-tun".to_string()]);
        let d = super::Args::parse_from(["hv-agent", "checks"]);
        let super::Command::Checks(c) = d.command else { panic!("not checks") };
        let e = super::expectations(&c.peers);
        assert_eq!((e[0].bridge.as_str(), e[0].fail_mode.as_str()), ("br-int", "secure"), "the default");
        assert!(super::pair("novalue").is_err());
    }
}
