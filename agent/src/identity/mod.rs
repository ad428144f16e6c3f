//! The agent's certificate from the coordinator (docs/agent-identity.md).
//!
//! The agent proves it is the agent pod on its node with its projected
//! ServiceAccount token, and gets a short-lived client certificate naming
//! that node. It renews at two thirds of the certificate's life (less a
//! draw of its own, so that agents started together do not renew
//! together) over mutual TLS with the certificate it holds; the session
//! then moves to the new one. The key never leaves the pod: it is kept in
//! memory and in the pod's own directory (`--identity-dir`, a memory-backed
//! volume), so a restarted container goes on with it and nothing is left
//! on the host when the pod goes.

mod obtain;
mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;

use crate::backoff::{Backoff, draw};

pub use obtain::ObtainError;

/// A certificate from the coordinator, with its key.
#[derive(Clone, PartialEq, Eq)]
pub struct Issued {
    /// The certificate, then its CA (PEM).
    pub chain_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// When it was received: its life for renewal counts from here (its
    /// notBefore is set back for clocks that differ).
    pub received: SystemTime,
    pub not_after: SystemTime,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("received", &self.received)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// The certificate the session uses now; None until the first arrives.
pub type Current = watch::Receiver<Option<Arc<Issued>>>;

/// Where and how to ask.
#[derive(Clone, Debug)]
pub struct IdentityConfig {
    pub node: String,
    /// The coordinator's bootstrap port (server TLS only).
    pub bootstrap: String,
    /// The coordinator's gRPC port: renewals, over mutual TLS.
    pub coordinator: String,
    /// The CA of the coordinator's certificate.
    pub ca: PathBuf,
    /// The projected token, read at each request (the kubelet renews it).
    pub token_file: PathBuf,
    /// Where the certificate and key are kept for a restarted container.
    pub dir: PathBuf,
    pub backoff: Backoff,
}

/// The backoff after the coordinator refused: 5 s, doubling, at most
/// 5 minutes.
const REFUSED: Backoff = Backoff { base: Duration::from_secs(5), max: Duration::from_secs(300), jitter: 0.3 };

/// When to renew `issued`: at two thirds of its life from when it was
/// received, less up to a twelfth of that life by `spread` (0..1).
pub fn renew_at(issued: &Issued, spread: f64) -> SystemTime {
    let life = issued.not_after.duration_since(issued.received).unwrap_or_default();
    let early = life.mul_f64(spread.clamp(0.0, 1.0) / 12.0);
    issued.received + (life * 2 / 3).saturating_sub(early)
}

/// Whether `issued` can still open a session at `now` (with a margin for
/// the handshake).
pub fn usable(issued: &Issued, now: SystemTime) -> bool {
    issued.not_after > now + Duration::from_secs(10)
}

/// The certificate kept in `cfg.dir` by an earlier container of this pod,
/// if it is still usable: the start of [`run`]'s channel.
pub fn kept(cfg: &IdentityConfig) -> Option<Arc<Issued>> {
    let issued = store::load(&cfg.dir, &cfg.node)?;
    usable(&issued, SystemTime::now()).then(|| Arc::new(issued))
}

/// Obtains the certificate and renews it for as long as the process runs.
pub async fn run(cfg: IdentityConfig, current: watch::Sender<Option<Arc<Issued>>>) {
    let spread = draw();
    let mut attempt = 0u32;
    let mut pending: Option<obtain::Pending> = None;
    loop {
        let held = current.borrow().clone();
        if let Some(h) = held.as_ref().filter(|h| usable(h, SystemTime::now())) {
            let wait = renew_at(h, spread).duration_since(SystemTime::now()).unwrap_or_default();
            if !wait.is_zero() && attempt == 0 {
                tokio::time::sleep(wait).await;
            }
        }
        let held = held.filter(|h| usable(h, SystemTime::now()));
        let asked = match pending.take().map_or_else(obtain::Pending::new, Ok) {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(node = %cfg.node, error = %e, "no key made; retrying");
                tokio::time::sleep(cfg.backoff.delay(attempt, draw())).await;
                attempt = attempt.saturating_add(1);
                continue;
            }
        };
        match obtain::obtain(&cfg, held.as_deref(), &asked).await {
            Ok(issued) => {
                tracing::info!(node = %cfg.node, not_after = ?issued.not_after, renewal = held.is_some(), "certificate obtained");
                if let Err(e) = store::save(&cfg.dir, &issued) {
                    tracing::warn!(node = %cfg.node, error = %e, "certificate not kept for a restart");
                }
                attempt = 0;
                current.send_replace(Some(Arc::new(issued)));
            }
            Err(e) => {
                tracing::warn!(node = %cfg.node, error = %e, renewal = held.is_some(), "no certificate; retrying");
                let backoff = if e.is_refusal() { REFUSED } else { cfg.backoff };
                pending = Some(asked);
                tokio::time::sleep(backoff.delay(attempt, draw())).await;
                attempt = attempt.saturating_add(1);
            }
        }
        if current.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(received: SystemTime, life: Duration) -> Issued {
        Issued { chain_pem: Vec::new(), key_pem: Vec::new(), received, not_after: received + life }
    }

    #[test]
    fn renewal_comes_at_two_thirds_less_the_nodes_own_draw() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let day = issued(t, Duration::from_secs(86_400));
        assert_eq!(renew_at(&day, 0.0), t + Duration::from_secs(57_600), "16 h into 24");
        assert_eq!(renew_at(&day, 1.0), t + Duration::from_secs(57_600 - 7_200), "at most 2 h earlier");
        assert_eq!(renew_at(&day, 7.0), renew_at(&day, 1.0), "a draw past 1 counts as 1");
        let two_minutes = issued(t, Duration::from_secs(120));
        assert_eq!(renew_at(&two_minutes, 0.0), t + Duration::from_secs(80));
        let past = issued(t, Duration::ZERO);
        assert_eq!(renew_at(&past, 0.5), t, "an ended one is renewed at once");
    }

    #[test]
    fn a_certificate_about_to_end_opens_no_session() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let c = issued(t, Duration::from_secs(60));
        assert!(usable(&c, t));
        assert!(!usable(&c, t + Duration::from_secs(55)));
        assert!(!usable(&c, t + Duration::from_secs(120)));
    }
}
