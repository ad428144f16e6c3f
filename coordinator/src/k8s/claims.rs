//! Places under a fleet-wide limit (hosts in `ha` maintenance, fencings
//! started, hosts held for updates) that this process has just given, and
//! that the cache may not show yet: each counts against its limit until
//! its TTL passes, by when the cache shows the object written. Counting
//! and claiming are one step under one lock, so two reconciles cannot both
//! take the last place. A lock poisoned by a panic keeps its claims, and
//! they go on counting (`crate::locked`): a limit never lets more through
//! for it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Claims {
    ttl: Duration,
    held: Mutex<Vec<(String, Instant)>>,
}

/// The live claims, inside [`Claims::with`]'s lock.
pub struct Live<'a>(&'a mut Vec<(String, Instant)>);

impl Claims {
    pub fn new(ttl: Duration) -> Claims {
        Claims { ttl, held: Mutex::new(Vec::new()) }
    }

    /// Runs `f` over the claims younger than the TTL, under the lock.
    pub fn with<R>(&self, f: impl FnOnce(&mut Live<'_>) -> R) -> R {
        let mut held = crate::locked::lock(&self.held);
        held.retain(|(_, at)| at.elapsed() < self.ttl);
        f(&mut Live(&mut held))
    }

    /// Drops `name`'s claim: the write it was for did not happen.
    pub fn forget(&self, name: &str) {
        self.with(|live| live.drop_where(|n| n == name));
    }
}

impl Live<'_> {
    /// The hosts claimed, oldest first.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    /// Claims a place for `name` from now (its older claim replaced).
    pub fn claim(&mut self, name: &str) {
        self.drop_where(|n| n == name);
        self.0.push((name.to_string(), Instant::now()));
    }

    pub fn drop_where(&mut self, gone: impl Fn(&str) -> bool) {
        self.0.retain(|(n, _)| !gone(n));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_counts_until_its_ttl_and_once_per_host() {
        let claims = Claims::new(Duration::from_millis(50));
        claims.with(|l| {
            l.claim("a");
            l.claim("b");
            l.claim("a");
        });
        let names = |c: &Claims| c.with(|l| l.names().map(str::to_string).collect::<Vec<_>>());
        assert_eq!(names(&claims), ["b", "a"]);
        claims.forget("b");
        assert_eq!(names(&claims), ["a"]);
        std::thread::sleep(Duration::from_millis(60));
        assert!(names(&claims).is_empty(), "past its TTL a claim no longer counts");
    }
}
