//! How rolling updates ask for a host, and what a drain may not take
//! (docs/drain.md).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::ConfigError;
use crate::drain::admission::{Protected, Selector};
use crate::drain::guard::GuardConfig;
use crate::drain::signals::{Signal, UpdateSignals};

#[derive(clap::Args, Debug)]
pub struct DrainFlags {
    /// A cordoned Node (`spec.unschedulable`) starts `auto` maintenance,
    /// and its uncordon ends it: for update tools that cordon before they
    /// drain (docs/drain.md). Off: only the annotation
    /// hypervisor.cloud.sap/maintenance-required does.
    #[arg(long)]
    pub cordon_starts_maintenance: bool,
    /// Another sign by which the site's update tool asks for a host, beside
    /// the annotation hypervisor.cloud.sap/maintenance-required (repeatable):
    /// annotation:KEY, label:KEY[=VALUE], or cordon-with:ANNOTATION_KEY (a
    /// cordon with the tool's reason; its uncordon ends it) (docs/drain.md).
    #[arg(long = "update-signal")]
    pub update_signals: Vec<Signal>,
    /// A dependent whose pods the host's VMs need (a network agent):
    /// its lock annotation hypervisor.cloud.sap/lock.COMPONENT stands on the
    /// Node while the host is not evictable (docs/drain.md). Repeatable.
    #[arg(long = "node-lock", value_parser = node_lock)]
    pub node_locks: Vec<String>,
    /// At most this many hosts held for updates at once (an update's ask:
    /// the maintenance-required annotation, a counted cordon, a refused
    /// drain): a host in service whose Node asks past it waits for a place
    /// (docs/drain.md). 0: no limit.
    #[arg(long, default_value_t = 10)]
    pub update_max_held: usize,
    /// HTTPS address of the eviction webhook (docs/drain.md), which the
    /// API server calls for every pod eviction; with --webhook-tls-cert
    /// and --webhook-tls-key. Without it, no webhook is served.
    #[arg(long, env = "HV_WEBHOOK_LISTEN", requires_all = ["webhook_tls_cert", "webhook_tls_key"])]
    pub webhook_listen: Option<SocketAddr>,
    /// PEM certificate (chain) the webhook presents; re-read when it changes.
    #[arg(long, env = "HV_WEBHOOK_TLS_CERT")]
    pub webhook_tls_cert: Option<PathBuf>,
    #[arg(long, env = "HV_WEBHOOK_TLS_KEY")]
    pub webhook_tls_key: Option<PathBuf>,
    /// Label selector (`k=v,k2`) of the hypervisor's own pods that a drain
    /// must not evict while the host is not evictable: nova-compute, the
    /// agent (docs/drain.md). Repeatable.
    #[arg(long = "protected-pods", value_parser = selector)]
    pub protected_pods: Vec<Selector>,
    /// COMPONENT:SELECTOR: a dependent's pods (a network agent), evicted
    /// only once the Node's lock annotation of COMPONENT is gone. Repeatable.
    #[arg(long = "dependent-pods", value_parser = dependent_pods)]
    pub dependent_pods: Vec<(String, Selector)>,
    /// A namespace of protected or dependent pods (repeatable): pods are
    /// watched, read and labelled there only, so the coordinator needs no
    /// right on pods elsewhere (the chart grants them per namespace). None:
    /// any namespace, read cluster-wide.
    #[arg(long = "pod-namespace", value_parser = namespace)]
    pub pod_namespaces: Vec<String>,
    /// Keep a drain guard on every hypervisor (docs/drain.md): one small
    /// Deployment per host, in the coordinator's namespace (--namespace),
    /// whose pod runs this image's `guard` command (the agent's image) and
    /// is protected as the hypervisor's own pods are, so that a drain which
    /// skips DaemonSet pods waits on it too. Without it, no guard is made.
    #[arg(long, env = "HV_DRAIN_GUARD_IMAGE")]
    pub drain_guard_image: Option<String>,
    /// The namespace of the drain guards (default: the coordinator's, as
    /// --namespace says). One of their own keeps the coordinator's right to
    /// label pods away from the agents' pods.
    #[arg(long, value_parser = namespace, requires = "drain_guard_image")]
    pub drain_guard_namespace: Option<String>,
    /// A pull secret of the guard's image, by name (repeatable).
    #[arg(long = "drain-guard-pull-secret", requires = "drain_guard_image")]
    pub drain_guard_pull_secrets: Vec<String>,
}

/// Where the eviction webhook listens, with its certificate files.
pub struct WebhookListen<'a> {
    pub addr: SocketAddr,
    pub cert: &'a std::path::Path,
    pub key: &'a std::path::Path,
}

impl DrainFlags {
    /// A dependent's pods go once the Node carries no lock: without its own
    /// lock, nothing would hold them while VMs remain.
    pub fn check(&self) -> Result<(), ConfigError> {
        match self.dependent_pods.iter().find(|(c, _)| !self.node_locks.contains(c)) {
            Some((c, _)) => Err(ConfigError::DependentWithoutLock(c.clone())),
            None => Ok(()),
        }
    }

    /// The protected pods: the site's, and the install's drain guards
    /// (`guard`), which are the hypervisor's own pods too.
    pub fn protected(&self, guard: Option<&GuardConfig>) -> Protected {
        let mut protected = Protected {
            hypervisor: self.protected_pods.clone(),
            dependents: self.dependent_pods.clone(),
            namespaces: self.pod_namespaces.clone(),
        };
        if let Some(g) = guard {
            if let Ok(s) = crate::drain::guard::selector(&g.instance).parse() {
                protected.hypervisor.push(s);
            }
            // Named namespaces only: without any, pods are read everywhere.
            if !protected.namespaces.is_empty() && !protected.namespaces.contains(&g.namespace) {
                protected.namespaces.push(g.namespace.clone());
            }
        }
        protected
    }

    /// What the drain guards are made of, when asked for: in
    /// --drain-guard-namespace, else `namespace` (the coordinator's), for
    /// the install `instance`.
    pub fn guard(&self, namespace: &str, instance: &str) -> Option<GuardConfig> {
        self.drain_guard_image.as_ref().map(|image| GuardConfig {
            namespace: self.drain_guard_namespace.clone().unwrap_or_else(|| namespace.to_string()),
            image: image.clone(),
            pull_secrets: self.drain_guard_pull_secrets.clone(),
            instance: instance.to_string(),
        })
    }

    pub fn signals(&self) -> UpdateSignals {
        UpdateSignals(self.update_signals.clone())
    }

    /// The webhook's listener, when one is asked for.
    pub fn webhook(&self) -> Option<WebhookListen<'_>> {
        match (self.webhook_listen, &self.webhook_tls_cert, &self.webhook_tls_key) {
            (Some(addr), Some(cert), Some(key)) => Some(WebhookListen { addr, cert, key }),
            _ => None,
        }
    }
}

fn node_lock(s: &str) -> Result<String, String> {
    if crate::drain::locks::valid_component(s) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a component name (letters, digits, -, _, .; alphanumeric at both ends)"))
    }
}

/// A namespace name: a DNS label (lower-case letters, digits and `-`, at
/// most 63, a letter or digit at both ends).
fn namespace(s: &str) -> Result<String, String> {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let ok = s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok { Ok(s.to_string()) } else { Err(format!("{s:?} is not a namespace name")) }
}

fn selector(s: &str) -> Result<Selector, String> {
    s.parse()
}

fn dependent_pods(s: &str) -> Result<(String, Selector), String> {
    let (component, sel) = s.split_once(':').ok_or("expected COMPONENT:SELECTOR")?;
    Ok((node_lock(component)?, sel.parse()?))
}
