//! The one way the coordinator takes a lock ([`lock`]), and what a lock
//! poisoned by a panic means: a decision cut short halfway. The data is
//! taken as it stands (each critical section is a single update of a map
//! or a value, so it is whole), and the process fails closed: it decides
//! nothing more ([`poisoned`] shuts the leader gate, `k8s::Gate`), and
//! `/healthz` fails, so the kubelet restarts it and another replica takes
//! over the lease. Nothing is let through on a lock's word after that.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

static POISONED: AtomicBool = AtomicBool::new(false);

/// The lock's guard; a poisoned lock is noted ([`poisoned`]) and its data
/// taken as it stands.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    lock_noting(m, &POISONED)
}

/// Whether a lock of this process was found poisoned.
pub fn poisoned() -> bool {
    POISONED.load(Ordering::Acquire)
}

fn lock_noting<'a, T>(m: &'a Mutex<T>, flag: &AtomicBool) -> MutexGuard<'a, T> {
    m.lock().unwrap_or_else(|p: PoisonError<MutexGuard<'a, T>>| {
        if !flag.swap(true, Ordering::AcqRel) {
            tracing::error!(
                "a lock was poisoned by a panic: this process decides nothing more and asks to be restarted"
            );
        }
        p.into_inner()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_is_noted_and_its_data_taken_as_it_stands() {
        let flag = AtomicBool::new(false);
        let m = std::sync::Arc::new(Mutex::new(vec![1]));
        *lock_noting(&m, &flag) = vec![1, 2];
        assert!(!flag.load(Ordering::Acquire), "a healthy lock notes nothing");
        let held = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = held.lock();
            panic!("a decision cut short");
        })
        .join();
        assert_eq!(*lock_noting(&m, &flag), vec![1, 2]);
        assert!(flag.load(Ordering::Acquire), "the poison is noted");
    }
}
