//! Keeps a libvirt connection with events alive: open, keepalive,
//! subscribe, report; when the connection drops (libvirtd restarted, link
//! lost, keepalive timeout) report it at once and reconnect with jittered
//! exponential backoff.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

use super::events::{LibvirtEvent, init_event_loop, subscribe};
use super::{Libvirt, LibvirtTarget};
use crate::backoff::{Backoff, draw};

/// How long opening and subscribing may take.

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Connected { libvirt_version: String },
    Lost { reason: String },
    Domain(LibvirtEvent),
}

/// Watch `uri` until `out` is closed. `live` tells whether the connection
/// is up right now (for `/healthz`).
pub async fn watch(
    target: LibvirtTarget,
    backoff: Backoff,
    out: mpsc::Sender<WatchEvent>,
    live: Arc<AtomicBool>,
) {
    if let Err(e) = init_event_loop() {
        let _ = out.send(WatchEvent::Lost { reason: format!("libvirt event loop: {e}") }).await;
        return;
    }
    let mut attempt = 0u32;
    let mut reported_down = false;
    let lane = super::blocking::Lane::default();
    loop {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let t = target.clone();
        // A libvirtd that accepts and never answers must not hang the
        // watcher: past the deadline the attempt counts as failed (the
        // blocking call's late result is dropped, closing it).
        let opened = lane
            .run("libvirt connection", t.deadline, move || {
                let lv = Libvirt::connect(&t).map_err(|e| e.to_string())?;
                lv.conn.set_keep_alive(5, 3).map_err(|e| format!("keepalive: {e}"))?;
                let sub = subscribe(&lv.conn, tx)?;
                let version = lv.lib_version().map_err(|e| e.to_string())?;
                Ok((lv, sub, version))
            })
            .await;
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
