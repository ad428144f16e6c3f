//! One Nova host, one Hypervisor (docs/lifecycle.md, "One Nova host, one
//! Hypervisor"). A Hypervisor holds a Nova host once its record names it
//! (`status.lifecycle.novaHost`), and the record is written before anything
//! is written to Nova for that host. Two Hypervisors that name one host
//! reconcile in this process, which alone acts (the leader): their claims
//! are taken here under one lock, and a claim stays counted until the
//! cache shows its record (while its Hypervisor is cached), or for a
//! minute while the cache does not show that Hypervisor at all (not yet, or
//! deleted since). A new leader decides only once its caches are whole,
//! so it sees every record written before its lease began. The check covers this install's Hypervisors (the only
//! ones it caches).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::Hypervisor;

/// How long a claim counts whose Hypervisor the cache does not show.
const UNCACHED: Duration = Duration::from_secs(60);

/// The claims this process made that the cache may not show yet: Nova
/// host → (Hypervisor, when).
#[derive(Default)]
pub struct NovaHosts {
    claimed: Mutex<HashMap<String, (String, Instant)>>,
}

/// The Hypervisor other than `name` whose record names `host`, among
/// `recorded` (each Hypervisor's name and recorded Nova host). Pure.
pub fn holder<'a>(
    name: &str,
    host: &str,
    recorded: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> Option<&'a str> {
    recorded.into_iter().find(|(other, held)| *other != name && *held == Some(host)).map(|(other, _)| other)
}

impl NovaHosts {
    /// The Hypervisor other than `name` that holds `host`: in the cache,
    /// or claimed here lately.
    pub fn holder(&self, hypervisors: &Store<Hypervisor>, name: &str, host: &str) -> Option<String> {
        let mut claimed = crate::locked::lock(&self.claimed);
        claimed.retain(|_, (claimant, at)| pending(hypervisors, claimant, *at));
        held(&claimed, hypervisors, name, host)
    }

    /// Claims `host` for `name` unless another Hypervisor holds it (then
    /// answers which). Checking and claiming are one step under one lock.
    pub fn claim(&self, hypervisors: &Store<Hypervisor>, name: &str, host: &str) -> Result<(), String> {
        let mut claimed = crate::locked::lock(&self.claimed);
        claimed.retain(|_, (claimant, at)| pending(hypervisors, claimant, *at));
        if let Some(other) = held(&claimed, hypervisors, name, host) {
            return Err(other);
        }
        claimed.insert(host.to_string(), (name.to_string(), Instant::now()));
        Ok(())
    }

    /// Drops `name`'s claim of `host`: its record was surely not written.
    pub fn forget(&self, host: &str, name: &str) {
        let mut claimed = crate::locked::lock(&self.claimed);
        if claimed.get(host).is_some_and(|(n, _)| n == name) {
            claimed.remove(host);
        }
    }
}

/// [`NovaHosts::holder`], with the claims' lock held and the claims the
/// cache answers for dropped.
fn held(
    claimed: &HashMap<String, (String, Instant)>,
    hypervisors: &Store<Hypervisor>,
    name: &str,
    host: &str,
) -> Option<String> {
    let claimant = claimed.get(host).map(|(other, _)| other).filter(|other| *other != name);
    claimant.cloned().or_else(|| recorded_holder(hypervisors, name, host))
}

/// Whether a claim of `claimant` made at `at` still counts beside the
/// cache: its Hypervisor is cached without a record (once the record
/// shows, the cache answers), or not cached at all for a minute.
fn pending(hypervisors: &Store<Hypervisor>, claimant: &str, at: Instant) -> bool {
    match hypervisors.get(&kube::runtime::reflector::ObjectRef::new(claimant)) {
        Some(h) => h.status.as_ref().is_none_or(|s| s.lifecycle.nova_host.is_none()),
        None => at.elapsed() < UNCACHED,
    }
}

/// The Hypervisor other than `name` whose record names `host`, as the
/// cache shows them.
pub fn recorded_holder(hypervisors: &Store<Hypervisor>, name: &str, host: &str) -> Option<String> {
    let all = hypervisors.state();
    let names: Vec<String> = all.iter().map(|h| h.name_any()).collect();
    let recorded = all.iter().zip(&names).map(|(h, n)| {
        let held = h.status.as_ref().and_then(|s| s.lifecycle.nova_host.as_deref());
        (n.as_str(), held)
    });
    holder(name, host, recorded).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    use super::*;
    use crate::api::HypervisorSpec;

    fn recorded(name: &str, host: Option<&str>) -> Hypervisor {
        let mut h = Hypervisor::new(name, HypervisorSpec::default());
        let mut status = crate::api::HypervisorStatus::default();
        status.lifecycle.nova_host = host.map(str::to_string);
        h.status = Some(status);
        h
    }

    #[test]
    fn a_host_is_held_by_the_other_hypervisor_whose_record_names_it() {
        let all = [("a", Some("compute-1")), ("b", None), ("c", Some("compute-2"))];
        assert_eq!(holder("b", "compute-1", all), Some("a"));
        assert_eq!(holder("a", "compute-1", all), None, "its own record");
        assert_eq!(holder("b", "compute-3", all), None);
    }

    #[test]
    fn the_first_of_two_claims_wins_and_a_claim_not_recorded_can_be_given_up() {
        let (store, mut writer) = reflector::store::<Hypervisor>();
        for h in [recorded("old", Some("compute-9")), recorded("a", None), recorded("b", None)] {
            writer.apply_watcher_event(&watcher::Event::Apply(h));
        }
        let hosts = NovaHosts::default();
        assert_eq!(hosts.claim(&store, "a", "compute-1"), Ok(()));
        assert_eq!(hosts.claim(&store, "b", "compute-1"), Err("a".into()), "the cache does not show it yet");
        assert_eq!(hosts.claim(&store, "a", "compute-1"), Ok(()), "claimed again by its holder");
        assert_eq!(hosts.holder(&store, "b", "compute-1"), Some("a".into()));
        assert_eq!(hosts.claim(&store, "b", "compute-9"), Err("old".into()), "held in the cache");
        hosts.forget("compute-1", "b");
        assert_eq!(
            hosts.holder(&store, "b", "compute-1"),
            Some("a".into()),
            "only its own claim is given up"
        );
        hosts.forget("compute-1", "a");
        assert_eq!(hosts.claim(&store, "b", "compute-1"), Ok(()));
    }

    #[test]
    fn a_claim_counts_until_the_cache_shows_its_record() {
        let (store, mut writer) = reflector::store::<Hypervisor>();
        writer.apply_watcher_event(&watcher::Event::Apply(recorded("a", None)));
        let hosts = NovaHosts::default();
        assert_eq!(hosts.claim(&store, "a", "compute-1"), Ok(()));
        assert_eq!(hosts.holder(&store, "b", "compute-1"), Some("a".into()), "the cache lags");
        writer.apply_watcher_event(&watcher::Event::Apply(recorded("a", Some("compute-1"))));
        assert_eq!(hosts.holder(&store, "b", "compute-1"), Some("a".into()), "the cache shows it");
        writer.apply_watcher_event(&watcher::Event::Delete(recorded("a", Some("compute-1"))));
        assert_eq!(hosts.holder(&store, "b", "compute-1"), None, "its record gone, and its claim with it");
    }
}
