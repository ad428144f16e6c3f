//! The eviction webhook's decision (docs/drain.md): may this pod be evicted
//! from its Node now, and should its host's maintenance start? Pure: the
//! shell (`k8s::webhook`) reads the pod, the Node, the Hypervisor and its
//! Eviction, and writes the ask.
//!
//! A drain takes every pod off a Node, and a container does not wait for a
//! finalizer: once nova-compute or a network agent is evicted from a host
//! that still runs VMs, those VMs are unmanaged or cut off. So a protected
//! pod goes only once its host may lose it, by the same rule the Node's
//! marks say to everyone else (`drain::locks`): the hypervisor's own pods
//! once the host is evictable (the label, and what the Hypervisor says
//! agrees: held, no VM counted, no eviction running), a dependent's once
//! every lock on the Node is gone. Everything else is never refused here.

use std::collections::BTreeSet;

use crate::api::Phase;
use crate::api::eviction::EvictionPhase;

/// What a pod is to its host, by the labels the site names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// Not named: evicted as Kubernetes would.
    Unprotected,
    /// One of the hypervisor's own pods (nova-compute, our agent): needed
    /// while VMs live on the host.
    Hypervisor,
    /// A dependent (a network agent) under the node lock protocol: needed
    /// while any lock annotation stands on its Node (its own, or another
    /// operator's).
    Dependent { component: String },
}

/// The Eviction of the host as the webhook tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionView {
    pub name: String,
    pub phase: EvictionPhase,
    pub migrated: u32,
    pub total: u32,
    /// Why it stopped, when it failed.
    pub message: String,
}

impl EvictionView {
    /// Not in a final phase.
    pub fn is_running(&self) -> bool {
        !self.phase.is_final()
    }
}

/// The pod's host as the webhook sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    pub node: String,
    /// The Hypervisor's phase; None: the Node is no hypervisor.
    pub phase: Option<Phase>,
    /// VMs on the host as the Hypervisor's status counts them.
    pub vms: Option<u32>,
    /// The Node's `hypervisor.cloud.sap/evictable` label.
    pub evictable: Option<bool>,
    /// The components whose lock annotation stands on the Node.
    pub locks: BTreeSet<String>,
    pub cordoned: bool,
    /// Something already asks for the host to be emptied (an SRE's
    /// maintenance, an update's annotation, a cordon the site counts, or an
    /// earlier refused drain).
    pub asked: bool,
    /// The host's latest Eviction.
    pub eviction: Option<EvictionView>,
    /// Why an update's ask of this host would wait now
    /// (`--update-max-held`).
    pub update_wait: Option<String>,
    /// An SRE paused the host (docs/operations.md), with their reason:
    /// nothing will move its VMs, so a drain is not told otherwise and its
    /// Node is not marked.
    pub paused: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// 429: the evicting client (kubectl drain) tries again.
    Refuse {
        message: String,
        /// Ask for the host's `auto` maintenance (the drain's mark on the
        /// Node): the drain is under way, so the host must be emptied.
        ask: bool,
    },
}

pub fn decide(pod: &PodKind, host: &Host) -> Verdict {
    let Some(phase) = host.phase else { return Verdict::Allow };
    // The Node's label, written from Nova's count, and the Hypervisor's
    // own view must agree: a label left behind never frees a busy host.
    let held = held(phase);
    let running = host.eviction.as_ref().is_some_and(|e| e.is_running());
    let emptied = host.evictable == Some(true) && held && host.vms.unwrap_or(0) == 0 && !running;
    let blocked_by = match pod {
        PodKind::Unprotected => return Verdict::Allow,
        PodKind::Hypervisor if emptied => return Verdict::Allow,
        PodKind::Hypervisor => String::new(),
        // A dependent waits for the host to be freed as the hypervisor's
        // own pods do, and then for every lock: a lock lifted by hand, or
        // not yet written (a host just back into service), frees nothing.
        PodKind::Dependent { .. } if host.locks.is_empty() && emptied => return Verdict::Allow,
        PodKind::Dependent { .. } if host.locks.is_empty() => String::new(),
        PodKind::Dependent { .. } => {
            let locks: Vec<&str> = host.locks.iter().map(String::as_str).collect();
            format!("node lock{} {} held; ", if locks.len() == 1 { "" } else { "s" }, locks.join(", "))
        }
    };
    // A drain asks for the host only through its cordon, so that the
    // uncordon after the update ends the ask (docs/drain.md).
    let ask = !emptied && host.cordoned && !host.asked;
    let in_service = matches!(phase, Phase::Active | Phase::Ready);
    let next = match &host.update_wait {
        Some(why) if ask && in_service => format!("; maintenance asked, it waits for a place: {why}"),
        Some(why) if host.asked && in_service => format!("; its maintenance waits for a place: {why}"),
        _ if ask => "; maintenance started: its VMs will be moved away, then its pods may go".to_string(),
        _ if !emptied && !host.cordoned && !host.asked => {
            "; cordon the Node (kubectl drain does) to start its maintenance".to_string()
        }
        _ => String::new(),
    };
    if let Some(why) = &host.paused {
        let message = format!(
            "hypervisor {}: {blocked_by}{}; paused by an SRE ({why}): nothing moves its VMs until `hvctl resume`",
            host.node,
            state(phase, host)
        );
        return Verdict::Refuse { message, ask: false };
    }
    let message = format!("hypervisor {}: {blocked_by}{}{next}", host.node, state(phase, host));
    Verdict::Refuse { message, ask }
}

/// Out of service, held there: the phases in which a host may lose its pods.
fn held(phase: Phase) -> bool {
    matches!(phase, Phase::Initial | Phase::Maintenance | Phase::Aborted | Phase::Decommissioned)
}

/// What is happening on the host, in a drain's words.
fn state(phase: Phase, host: &Host) -> String {
    let vms = |n: u32| if n == 1 { "1 VM".to_string() } else { format!("{n} VMs") };
    match (&host.eviction, host.vms) {
        (Some(e), _) if e.is_running() && e.total > 0 => {
            format!("evacuating, {} of {} moved", e.migrated, vms(e.total))
        }
        (Some(e), _) if e.is_running() => format!("eviction {} {:?}", e.name, e.phase),
        (Some(e), Some(n)) if e.phase == EvictionPhase::Failed && n > 0 => {
            format!("eviction {} failed ({}); {} remain, an SRE must act", e.name, e.message, vms(n))
        }
        (_, Some(0)) if host.evictable == Some(true) && held(phase) => format!("{phase}, empty"),
        (_, Some(0)) => format!("{phase}, empty, not yet held out of service"),
        (_, Some(n)) => format!("{phase} with {}", vms(n)),
        (_, None) => format!("{phase}, VMs not counted yet"),
    }
}

/// An equality-based label selector, as `kubectl` writes one: `k=v`,
/// `k==v`, `k!=v`, `k` (exists), `!k` (absent), joined by commas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<Term>,
    /// As given: the API server's label selector for the watch.
    text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Term {
    Is(String, String),
    Not(String, String),
    Exists(String),
    Absent(String),
}

/// A label (or annotation) key as the API server checks one: an optional
/// DNS prefix and `/`, then a name of at most 63 characters that begins and
/// ends with a letter or digit.
pub fn label_key(k: &str) -> Result<String, String> {
    let k = k.trim();
    let (prefix, name) = k.split_once('/').unwrap_or(("", k));
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    // A DNS subdomain: dot-separated labels of lower-case letters, digits
    // and `-`, each beginning and ending with a letter or digit.
    let dns_label = |l: &str| {
        let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        edge(l.chars().next())
            && edge(l.chars().last())
            && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let prefix_ok = !k.contains('/') || (prefix.len() <= 253 && prefix.split('.').all(dns_label));
    if name_ok && prefix_ok && k.matches('/').count() <= 1 {
        Ok(k.to_string())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

/// A label value as the API server checks one (it would refuse a watch or
/// a selector with another at every retry): empty, or at most 63 letters,
/// digits, `-`, `_` and `.`, beginning and ending with a letter or digit.
pub fn label_value(v: &str) -> Result<String, String> {
    let v = v.trim();
    let edge = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    let ok = v.len() <= 63
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && edge(v.chars().next())
        && edge(v.chars().last());
    if ok { Ok(v.to_string()) } else { Err(format!("{v:?} is not a label value")) }
}

impl std::str::FromStr for Selector {
    type Err = String;

    fn from_str(s: &str) -> Result<Selector, String> {
        let terms = s
            .split(',')
            .map(str::trim)
            .map(|t| {
                if let Some((k, v)) = t.split_once("!=") {
                    Ok(Term::Not(label_key(k)?, label_value(v)?))
                } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                    Ok(Term::Is(label_key(k)?, label_value(v)?))
                } else if let Some(k) = t.strip_prefix('!') {
                    Ok(Term::Absent(label_key(k)?))
                } else {
                    Ok(Term::Exists(label_key(t)?))
                }
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Selector { terms, text: s.trim().to_string() })
    }
}

impl Selector {
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.terms.iter().all(|t| match t {
            Term::Is(k, v) => labels.get(k) == Some(v),
            Term::Not(k, v) => labels.get(k) != Some(v),
            Term::Exists(k) => labels.contains_key(k),
            Term::Absent(k) => !labels.contains_key(k),
        })
    }
}

/// The pods the site names: its own (`--protected-pods`) and the
/// dependents' (`--dependent-pods COMPONENT:SELECTOR`).
#[derive(Clone, Debug, Default)]
pub struct Protected {
    pub hypervisor: Vec<Selector>,
    pub dependents: Vec<(String, Selector)>,
    /// Only pods in these namespaces are protected (`--pod-namespace`);
    /// empty: any namespace.
    pub namespaces: Vec<String>,
}

impl Protected {
    /// A pod's kind by its labels; a dependent's selector wins (its lock is
    /// the finer rule).
    pub fn kind(&self, labels: &std::collections::BTreeMap<String, String>) -> PodKind {
        if let Some((c, _)) = self.dependents.iter().find(|(_, s)| s.matches(labels)) {
            return PodKind::Dependent { component: c.clone() };
        }
        if self.hypervisor.iter().any(|s| s.matches(labels)) {
            return PodKind::Hypervisor;
        }
        PodKind::Unprotected
    }

    /// Whether pods in namespace `ns` may be protected at all: the
    /// coordinator reads and labels pods nowhere else.
    pub fn covers(&self, ns: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == ns)
    }

    /// Where the protected pods are watched: each named namespace, or the
    /// whole cluster (None) when none is named.
    pub fn watched(&self) -> Vec<Option<&str>> {
        match self.namespaces.is_empty() {
            true => vec![None],
            false => self.namespaces.iter().map(|n| Some(n.as_str())).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.hypervisor.is_empty() && self.dependents.is_empty()
    }

    /// Every selector, the hypervisor's and the dependents'.
    pub fn selectors(&self) -> impl Iterator<Item = &Selector> {
        self.hypervisor.iter().chain(self.dependents.iter().map(|(_, s)| s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use EvictionPhase::*;

    fn host(phase: Option<Phase>, vms: Option<u32>, evictable: Option<bool>) -> Host {
        Host {
            node: "compute-3".into(),
            phase,
            vms,
            evictable,
            locks: BTreeSet::new(),
            cordoned: true,
            asked: false,
            eviction: None,
            update_wait: None,
            paused: None,
        }
    }

    #[test]
    fn a_paused_host_holds_a_drain_without_asking_for_its_maintenance() {
        let mut h = host(Some(Phase::Active), Some(2), Some(false));
        h.paused = Some("bios -- jdoe".into());
        match decide(&PodKind::Hypervisor, &h) {
            Verdict::Refuse { message, ask } => {
                assert!(!ask, "nothing is asked of a paused host");
                assert!(message.contains("paused by an SRE (bios -- jdoe)"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Held empty before the pause: its pods may go, as any host's.
        let mut held = host(Some(Phase::Maintenance), Some(0), Some(true));
        held.paused = Some("bios".into());
        assert_eq!(decide(&PodKind::Hypervisor, &held), Verdict::Allow);
    }

    fn eviction(phase: EvictionPhase, migrated: u32, total: u32) -> Option<EvictionView> {
        Some(EvictionView {
            name: "compute-3-auto-1".into(),
            phase,
            migrated,
            total,
            message: "no room".into(),
        })
    }

    fn dependent() -> PodKind {
        PodKind::Dependent { component: "neutron-l2".into() }
    }

    /// The table: pod kind × host state × eviction state, with what a
    /// drain is told.
    #[test]
    fn the_decision_table() {
        let refuse = |m: &str, ask: bool| Verdict::Refuse { message: m.to_string(), ask };
        let active = host(Some(Phase::Active), Some(12), Some(false));
        let mut evicting = host(Some(Phase::Evicting), Some(5), Some(false));
        evicting.eviction = eviction(Migrating, 7, 12);
        evicting.asked = true;
        let mut failed = host(Some(Phase::Evicting), Some(5), Some(false));
        failed.eviction = eviction(Failed, 7, 12);
        failed.asked = true;
        let mut emptied = host(Some(Phase::Maintenance), Some(0), Some(true));
        emptied.eviction = eviction(Succeeded, 12, 12);
        emptied.asked = true;
        let mut locked = emptied.clone();
        locked.locks.insert("neutron-l2".into());
        let mut foreign = locked.clone();
        foreign.locks.insert("ovn-bgp".into());
        let mut stale_label = active.clone();
        (stale_label.evictable, stale_label.asked) = (Some(true), true);
        let mut stale_running = evicting.clone();
        stale_running.evictable = Some(true);
        let mut uncordoned = active.clone();
        uncordoned.cordoned = false;
        let mut preparing = evicting.clone();
        preparing.eviction = eviction(Disabling, 0, 0);
        let no_hypervisor = host(None, None, None);
        let empty_active = host(Some(Phase::Active), Some(0), Some(false));
        let onboarding = host(Some(Phase::Onboarding), None, Some(false));
        // Uncordoned after its update: still labelled evictable, no lock yet.
        let mut back_in_service = host(Some(Phase::Onboarding), Some(0), Some(true));
        (back_in_service.cordoned, back_in_service.asked) = (false, false);
        let held_with_vms = {
            let mut h = host(Some(Phase::Maintenance), Some(2), Some(false));
            h.asked = true;
            h
        };
        let full = "2 hosts are held for updates (--update-max-held 2): compute-1, compute-2";
        let mut waits = active.clone();
        waits.update_wait = Some(full.into());
        let mut waiting = waits.clone();
        waiting.asked = true;
        let rows: Vec<(&str, PodKind, &Host, Verdict)> = vec![
            (
                "the fleet's update limit reached: asked, told it waits",
                PodKind::Hypervisor,
                &waits,
                refuse(
                    &format!(
                        "hypervisor compute-3: Active with 12 VMs; maintenance asked, it waits for a place: {full}"
                    ),
                    true,
                ),
            ),
            (
                "still waiting for a place",
                PodKind::Hypervisor,
                &waiting,
                refuse(
                    &format!(
                        "hypervisor compute-3: Active with 12 VMs; its maintenance waits for a place: {full}"
                    ),
                    false,
                ),
            ),
            ("other pods always go", PodKind::Unprotected, &active, Verdict::Allow),
            ("other pods always go, mid-eviction", PodKind::Unprotected, &evicting, Verdict::Allow),
            ("a Node that is no hypervisor", PodKind::Hypervisor, &no_hypervisor, Verdict::Allow),
            (
                "VMs, cordoned: refused, maintenance asked",
                PodKind::Hypervisor,
                &active,
                refuse(
                    "hypervisor compute-3: Active with 12 VMs; maintenance started: its VMs will be moved away, \
                     then its pods may go",
                    true,
                ),
            ),
            (
                "VMs, not cordoned: refused, told how to start",
                PodKind::Hypervisor,
                &uncordoned,
                refuse(
                    "hypervisor compute-3: Active with 12 VMs; cordon the Node (kubectl drain does) to start its \
                     maintenance",
                    false,
                ),
            ),
            (
                "mid-eviction: progress",
                PodKind::Hypervisor,
                &evicting,
                refuse("hypervisor compute-3: evacuating, 7 of 12 VMs moved", false),
            ),
            (
                "an eviction not yet moving",
                PodKind::Hypervisor,
                &preparing,
                refuse("hypervisor compute-3: eviction compute-3-auto-1 Disabling", false),
            ),
            (
                "a failed eviction: an SRE must act",
                PodKind::Hypervisor,
                &failed,
                refuse(
                    "hypervisor compute-3: eviction compute-3-auto-1 failed (no room); 5 VMs remain, an SRE must act",
                    false,
                ),
            ),
            (
                "held with VMs left",
                PodKind::Hypervisor,
                &held_with_vms,
                refuse("hypervisor compute-3: Maintenance with 2 VMs", false),
            ),
            (
                "empty but in service: held first",
                PodKind::Hypervisor,
                &empty_active,
                refuse(
                    "hypervisor compute-3: Active, empty, not yet held out of service; maintenance started: its VMs \
                     will be moved away, then its pods may go",
                    true,
                ),
            ),
            (
                "on its way into service",
                PodKind::Hypervisor,
                &onboarding,
                refuse(
                    "hypervisor compute-3: Onboarding, VMs not counted yet; maintenance started: its VMs will be \
                     moved away, then its pods may go",
                    true,
                ),
            ),
            ("emptied and held: the pods go", PodKind::Hypervisor, &emptied, Verdict::Allow),
            ("a dependent without its lock", dependent(), &emptied, Verdict::Allow),
            (
                "a dependent waits for its lock, whoever holds it",
                dependent(),
                &locked,
                refuse("hypervisor compute-3: node lock neutron-l2 held; Maintenance, empty", false),
            ),
            (
                "the hypervisor's pods do not wait for a dependent's lock",
                PodKind::Hypervisor,
                &locked,
                Verdict::Allow,
            ),
            (
                "a dependent waits for every lock, another operator's too",
                dependent(),
                &foreign,
                refuse(
                    "hypervisor compute-3: node locks neutron-l2, ovn-bgp held; Maintenance, empty",
                    false,
                ),
            ),
            (
                "no lock on the Node, VMs remain: a lock lifted by hand frees nothing",
                dependent(),
                &active,
                refuse(
                    "hypervisor compute-3: Active with 12 VMs; maintenance started: its VMs will be moved away, \
                     then its pods may go",
                    true,
                ),
            ),
            (
                "a dependent of a host on its way back into service, its lock not yet written",
                dependent(),
                &back_in_service,
                refuse(
                    "hypervisor compute-3: Onboarding, empty, not yet held out of service; cordon the Node \
                     (kubectl drain does) to start its maintenance",
                    false,
                ),
            ),
            (
                "a label left behind: the Hypervisor shows VMs",
                PodKind::Hypervisor,
                &stale_label,
                refuse("hypervisor compute-3: Active with 12 VMs", false),
            ),
            (
                "a label left behind: an eviction runs",
                PodKind::Hypervisor,
                &stale_running,
                refuse("hypervisor compute-3: evacuating, 7 of 12 VMs moved", false),
            ),
        ];
        for (name, pod, h, want) in rows {
            assert_eq!(decide(&pod, h), want, "{name}");
        }
        let mut dep_active = active.clone();
        dep_active.locks.insert("neutron-l2".into());
        assert_eq!(
            decide(&dependent(), &dep_active),
            refuse(
                "hypervisor compute-3: node lock neutron-l2 held; Active with 12 VMs; maintenance started: its VMs \
                 will be moved away, then its pods may go",
                true
            ),
            "a dependent's refused drain asks for the host too"
        );
    }

    /// Every combination: what never changes whatever the state.
    #[test]
    fn over_every_combination_the_rules_hold() {
        let phases = [
            None,
            Some(Phase::Initial),
            Some(Phase::Onboarding),
            Some(Phase::Testing),
            Some(Phase::Aborted),
            Some(Phase::Ready),
            Some(Phase::Active),
            Some(Phase::Maintenance),
            Some(Phase::Evicting),
            Some(Phase::Decommissioned),
        ];
        let evictions = [
            None,
            eviction(Pending, 0, 0),
            eviction(Migrating, 3, 9),
            eviction(Succeeded, 9, 9),
            eviction(Failed, 3, 9),
            eviction(Cancelled, 0, 9),
        ];
        let pods = [PodKind::Unprotected, PodKind::Hypervisor, dependent()];
        let mut n = 0;
        for phase in phases {
            for vms in [None, Some(0), Some(1), Some(40)] {
                for evictable in [None, Some(false), Some(true)] {
                    for ev in &evictions {
                        for (cordoned, asked, locked) in (0..8).map(|b| (b & 1 != 0, b & 2 != 0, b & 4 != 0))
                        {
                            let mut h = host(phase, vms, evictable);
                            (h.cordoned, h.asked, h.eviction) = (cordoned, asked, ev.clone());
                            if locked {
                                h.locks.insert("neutron-l2".into());
                            }
                            for pod in &pods {
                                n += 1;
                                let v = decide(pod, &h);
                                let allowed = v == Verdict::Allow;
                                let held = matches!(
                                    phase,
                                    Some(
                                        Phase::Initial
                                            | Phase::Maintenance
                                            | Phase::Aborted
                                            | Phase::Decommissioned
                                    )
                                );
                                let running = ev.as_ref().is_some_and(|e| e.is_running());
                                let busy = matches!(vms, Some(n) if n > 0) || running || !held;
                                // Safe: no protected pod of a hypervisor leaves
                                // while anything says it still needs it.
                                if phase.is_some()
                                    && *pod == PodKind::Hypervisor
                                    && (busy || evictable != Some(true))
                                {
                                    assert!(!allowed, "{h:?}");
                                }
                                if phase.is_some()
                                    && matches!(pod, PodKind::Dependent { .. })
                                    && (locked || busy || evictable != Some(true))
                                {
                                    assert!(!allowed, "a lock stands, or the host is not freed: {h:?}");
                                }
                                // Live: what is not protected, or no longer
                                // needed, is never held up.
                                if phase.is_none() || *pod == PodKind::Unprotected {
                                    assert!(allowed, "{pod:?} {h:?}");
                                }
                                if *pod == PodKind::Hypervisor && !busy && evictable == Some(true) {
                                    assert!(allowed, "emptied and held: {h:?}");
                                }
                                if matches!(pod, PodKind::Dependent { .. })
                                    && !locked
                                    && !busy
                                    && evictable == Some(true)
                                {
                                    assert!(allowed, "freed, no lock: {h:?}");
                                }
                                if let Verdict::Refuse { message, ask } = v {
                                    assert!(message.starts_with("hypervisor compute-3: "), "{message}");
                                    assert!(
                                        !ask || (cordoned && !asked),
                                        "asks once, for a cordoned Node: {h:?}"
                                    );
                                    if cordoned && !asked && evictable != Some(true) {
                                        assert!(ask, "a refused drain asks for a host not yet freed: {h:?}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 10 * 4 * 3 * 6 * 8 * 3);
    }

    #[test]
    fn selectors_match_as_kubectl_writes_them() {
        let labels = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let s: Selector = "app=nova-compute, tier!=test,component,!legacy".parse().unwrap();
        assert!(s.matches(&labels(&[("app", "nova-compute"), ("component", "x")])));
        assert!(!s.matches(&labels(&[("app", "nova-compute")])), "component must exist");
        assert!(!s.matches(&labels(&[("app", "nova-compute"), ("component", ""), ("legacy", "1")])));
        assert!(!s.matches(&labels(&[("app", "nova-compute"), ("component", ""), ("tier", "test")])));
        assert!("app.kubernetes.io/name==hv-agent".parse::<Selector>().is_ok());
        for bad in [
            "",
            "a b=c",
            "=x",
            "a/b/c=d",
            "app=x,,y",
            "app=nova compute",
            "app=-x",
            "app=x!",
            "a!=b c",
            "-a.com/x=y",
            "a-.com/x=y",
            "a..com/x=y",
            ".a/x=y",
            "A.com/x=y",
        ] {
            assert!(bad.parse::<Selector>().is_err(), "{bad:?}");
        }
        let p = Protected {
            hypervisor: vec!["app=nova-compute".parse().unwrap()],
            dependents: vec![("neutron-l2".into(), "app=neutron-l2".parse().unwrap())],
            namespaces: Vec::new(),
        };
        assert_eq!(p.kind(&labels(&[("app", "nova-compute")])), PodKind::Hypervisor);
        assert_eq!(p.kind(&labels(&[("app", "neutron-l2")])), dependent());
        assert_eq!(p.kind(&labels(&[("app", "web")])), PodKind::Unprotected);
        assert!(p.covers("anywhere"), "no namespace named: any");
        assert_eq!(p.watched(), vec![None], "watched cluster-wide");
        let named = Protected { namespaces: vec!["openstack".into(), "hv-system".into()], ..p };
        assert!(named.covers("openstack") && named.covers("hv-system") && !named.covers("default"));
        assert_eq!(named.watched(), vec![Some("openstack"), Some("hv-system")], "each namespace, no other");
    }
}
