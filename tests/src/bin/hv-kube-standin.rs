//! Runs the Kubernetes API stand-in as a process, for `make demo` and for
//! looking around with `kubectl`: it writes a kubeconfig that points at it.
//! Its limits are in `hv_tests::kube_standin`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

/// Kubernetes API stand-in (tests and the local demo only; see its limits in the docs).
#[derive(Parser, Debug)]
#[command(name = "hv-kube-standin", version, about)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Directory of CRD YAML files to serve.
    #[arg(long, default_value = "deploy/crds")]
    crds: PathBuf,
    /// Write a kubeconfig for kubectl here.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s = hv_tests::kube_standin::StandIn::start(&args.crds, args.listen)
        .await
        .map_err(|e| anyhow::anyhow!("starting the stand-in: {e}"))?;
    if let Some(path) = &args.kubeconfig {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hv-standin\n  cluster:\n    server: {url}\n\
             contexts:\n- name: hv-standin\n  context:\n    cluster: hv-standin\n    user: hv\n\
             current-context: hv-standin\nusers:\n- name: hv\n  user: {{}}\n",
            url = s.url()
        );
        std::fs::write(path, kc)?;
    }
    println!("{}", s.url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
