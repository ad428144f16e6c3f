//! Shared timing helpers: jittered exponential backoff for every reconnect
//! loop (libvirt, OVSDB, the coordinator session), and wall-clock
//! timestamps for the protocol.

use std::time::Duration;

/// Exponential backoff with jitter, as a pure function of the attempt and a
/// jitter draw in [0, 1).
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    /// Share of the delay that is randomised (0.0 – 1.0).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { base: Duration::from_millis(500), max: Duration::from_secs(30), jitter: 0.3 }
    }
}

impl Backoff {
    pub fn delay(&self, attempt: u32, draw: f64) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.min(16)).min(self.max);
        let draw = draw.clamp(0.0, 1.0);
        exp.mul_f64(1.0 - self.jitter * draw)
    }
}

/// A cheap uniform draw in [0, 1) without a random-number dependency.
pub fn draw() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// Now, as a protocol timestamp.
pub fn timestamp_now() -> prost_types::Timestamp {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_caps_and_jitters_down() {
        let b = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(2), jitter: 0.5 };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(100));
        assert_eq!(b.delay(3, 0.0), Duration::from_millis(800));
        assert_eq!(b.delay(10, 0.0), Duration::from_secs(2));
        assert_eq!(b.delay(40, 0.0), Duration::from_secs(2), "no overflow");
        assert_eq!(b.delay(3, 1.0), Duration::from_millis(400));
        let d = draw();
        assert!((0.0..1.0).contains(&d));
    }
}
