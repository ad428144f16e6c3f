//! Read-your-writes over a lagging watch cache.
//!
//! A controller's cache learns of our own status write only when the watch
//! event arrives. A reconcile that runs before that would decide again from
//! the state before our write, and could take a transition twice or ask for
//! a migration attempt twice. So each status write is remembered with the
//! resourceVersion it replaced; a reconcile that still gets that older
//! version uses what we wrote instead. Versions are compared for equality
//! only, as Kubernetes requires of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::Resource;

pub struct Written<K> {
    map: Mutex<HashMap<String, Ours<K>>>,
}

/// The versions our latest write of an object replaced (one, or a chain of
/// our own writes in a row), and that write.
type Ours<K> = (Vec<String>, Arc<K>);

impl<K> Default for Written<K> {
    fn default() -> Self {
        Written { map: Mutex::new(HashMap::new()) }
    }
}

impl<K: Resource> Written<K> {
    /// `obj` from the cache, or our newer write of it.
    pub fn freshest(&self, obj: Arc<K>) -> Arc<K> {
        let Some(name) = obj.meta().name.clone() else { return obj };
        let mut map = crate::locked::lock(&self.map);
        match map.get(&name) {
            Some((bases, ours))
                if obj.meta().resource_version.as_ref().is_some_and(|v| bases.contains(v)) =>
            {
                ours.clone()
            }
            Some(_) => {
                // The cache has caught up, or someone else wrote since.
                map.remove(&name);
                obj
            }
            None => obj,
        }
    }

    /// Remembers `ours`, written over the version `base`. Written over our
    /// own last write, the versions that one replaced still answer with
    /// `ours`: a cache two writes behind is as stale as one.
    pub fn remember(&self, base: Option<String>, ours: K) {
        let (Some(base), Some(name)) = (base, ours.meta().name.clone()) else { return };
        {
            let mut map = crate::locked::lock(&self.map);
            let mut bases = match map.remove(&name) {
                Some((earlier, last)) if last.meta().resource_version.as_ref() == Some(&base) => earlier,
                _ => Vec::new(),
            };
            bases.push(base);
            map.insert(name, (bases, Arc::new(ours)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(rv: &str, data: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("x".into());
        c.metadata.resource_version = Some(rv.into());
        c.data = Some([("k".to_string(), data.to_string())].into());
        c
    }

    #[test]
    fn a_stale_cache_is_answered_with_our_write_until_it_catches_up() {
        let w = Written::default();
        w.remember(Some("1".into()), cm("2", "ours"));
        assert_eq!(w.freshest(Arc::new(cm("1", "stale"))).metadata.resource_version.as_deref(), Some("2"));
        assert_eq!(w.freshest(Arc::new(cm("2", "cache"))).data, cm("2", "cache").data, "caught up");
        assert_eq!(
            w.freshest(Arc::new(cm("1", "stale"))).data,
            cm("1", "stale").data,
            "forgotten once caught up"
        );
    }

    #[test]
    fn a_cache_two_of_our_writes_behind_is_answered_with_the_last() {
        let w = Written::default();
        w.remember(Some("1".into()), cm("2", "first"));
        w.remember(Some("2".into()), cm("3", "second"));
        assert_eq!(w.freshest(Arc::new(cm("1", "stale"))).data, cm("3", "second").data);
        assert_eq!(w.freshest(Arc::new(cm("2", "first"))).data, cm("3", "second").data);
        assert_eq!(w.freshest(Arc::new(cm("3", "cache"))).data, cm("3", "cache").data, "caught up");
        // A write over someone else's version starts afresh.
        w.remember(Some("7".into()), cm("8", "later"));
        w.remember(Some("9".into()), cm("10", "after another's"));
        assert_eq!(w.freshest(Arc::new(cm("7", "old"))).data, cm("7", "old").data);
    }
}
