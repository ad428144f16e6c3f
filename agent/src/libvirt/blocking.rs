//! libvirt's calls block, and a hung libvirtd (one that accepts and never
//! answers) would hang them for ever. They run on blocking threads under a
//! deadline; past it the caller gets an error and moves on. The thread
//! itself cannot be stopped, so each kind of call runs in a [`Lane`]: one
//! at a time, and a new call while the last one still hangs fails at once
//! instead of leaving one more thread behind per attempt.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One kind of libvirt call (the watcher's connection, a snapshot, the
/// checks). Cheap to clone; clones share the lane.
#[derive(Clone, Debug, Default)]
pub struct Lane {
    busy: Arc<AtomicBool>,
}

impl Lane {
    /// Runs `call` on a blocking thread; an error after `deadline`, or at
    /// once while this lane's previous call has not returned.
    pub async fn run<T, F>(&self, what: &str, deadline: Duration, call: F) -> Result<T, String>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, String> + Send + 'static,
    {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(format!("{what}: an earlier libvirt call has not returned yet (libvirtd hangs)"));
        }
        let busy = self.busy.clone();
        let thread = tokio::task::spawn_blocking(move || {
            let out = call();
            busy.store(false, Ordering::Release);
            out
        });
        match tokio::time::timeout(deadline, thread).await {
            Ok(Ok(out)) => out,
            Ok(Err(e)) => {
                self.busy.store(false, Ordering::Release);
                Err(format!("{what}: {e}"))
            }
            Err(_) => Err(format!("{what}: libvirt did not answer within {deadline:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hung_call_times_out_and_blocks_its_lane_until_it_returns() {
        let lane = Lane::default();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let hung = lane.run("snapshot", Duration::from_millis(50), move || {
            let _ = wait.recv();
            Ok(())
        });
        let e = hung.await.err().unwrap_or_default();
        assert!(e.contains("did not answer within 50ms"), "{e}");
        let e = lane.run("snapshot", Duration::from_secs(5), || Ok(1)).await.err().unwrap_or_default();
        assert!(e.contains("has not returned yet"), "no second thread while the first hangs: {e}");
        let _ = release.send(());
        let mut answered = Err(String::new());
        for _ in 0..100 {
            answered = lane.run("snapshot", Duration::from_secs(5), || Ok(1)).await;
            if answered.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(answered, Ok(1), "free again once the hung call returned");
    }
}
