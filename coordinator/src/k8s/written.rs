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
    map: Mutex<HashMap<String, (String, Arc<K>)>>,
}

impl<K> Default for Written<K> {
    fn default() -> Self {
        Written { map: Mutex::new(HashMap::new()) }
    }
}

impl<K: Resource> Written<K> {
    /// `obj` from the cache, or our newer write of it.
    pub fn freshest(&self, obj: Arc<K>) -> Arc<K> {
        let Some(name) = obj.meta().name.clone() else { return obj };
        let Ok(mut map) = self.map.lock() else { return obj };
        match map.get(&name) {
            Some((base, ours)) if obj.meta().resource_version.as_deref() == Some(base.as_str()) => {
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

    /// Remembers `ours`, written over the version `base`.
    pub fn remember(&self, base: Option<String>, ours: K) {
        let (Some(base), Some(name)) = (base, ours.meta().name.clone()) else { return };
        if let Ok(mut map) = self.map.lock() {
            map.insert(name, (base, Arc::new(ours)));
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
}
