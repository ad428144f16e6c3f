//! Keeps a libvirt connection with events alive: open, keepalive,
//! subscribe, report; when the connection drops (libvirtd restarted, link
//! lost, keepalive timeout) report it at once and reconnect with jittered
//! exponential backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;

use super::Libvirt;
use super::events::{LibvirtEvent, init_event_loop, subscribe};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Connected { libvirt_version: String },
    Lost { reason: String },
    Domain(LibvirtEvent),
}

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

/// Watch `uri` until `out` is closed. `live` tells whether the connection
/// is up right now (for `/healthz`).
pub async fn watch(uri: String, backoff: Backoff, out: mpsc::Sender<WatchEvent>, live: Arc<AtomicBool>) {
    if let Err(e) = init_event_loop() {
        let _ = out.send(WatchEvent::Lost { reason: format!("libvirt event loop: {e}") }).await;
        return;
    }
    let mut attempt = 0u32;
    let mut reported_down = false;
    loop {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let u = uri.clone();
        let opened = tokio::task::spawn_blocking(move || -> Result<_, String> {
            let lv = Libvirt::open(&u).map_err(|e| e.to_string())?;
            lv.conn.set_keep_alive(5, 3).map_err(|e| format!("keepalive: {e}"))?;
            let sub = subscribe(&lv.conn, tx)?;
            let version = lv.lib_version().map_err(|e| e.to_string())?;
            Ok((lv, sub, version))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match opened {
            Ok((lv, sub, version)) => {
                attempt = 0;
                live.store(true, Ordering::Relaxed);
                if out.send(WatchEvent::Connected { libvirt_version: version }).await.is_err() {
                    return;
                }
                let reason = loop {
                    match rx.recv().await {
                        Some(LibvirtEvent::Closed { reason }) => break reason,
                        Some(ev) => {
                            if out.send(WatchEvent::Domain(ev)).await.is_err() {
                                return;
                            }
                        }
                        None => break "event channel closed".to_string(),
                    }
                };
                live.store(false, Ordering::Relaxed);
                drop(sub);
                drop(lv);
                if out.send(WatchEvent::Lost { reason }).await.is_err() {
                    return;
                }
                reported_down = true;
            }
            Err(reason) => {
                live.store(false, Ordering::Relaxed);
                if !reported_down {
                    reported_down = true;
                    if out.send(WatchEvent::Lost { reason }).await.is_err() {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(backoff.delay(attempt, draw())).await;
        attempt = attempt.saturating_add(1);
        if out.is_closed() {
            return;
        }
    }
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
