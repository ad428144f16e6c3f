//! The one way the end-to-end tests wait for something: poll a probe until
//! it answers, or fail the test saying what was awaited, for how long, what
//! the probe saw last, and whatever `explain` adds (a coordinator's log).
#![allow(clippy::panic)] // failing the calling test is this module's purpose

use std::fmt::Debug;
use std::future::Future;
use std::time::Duration;

/// How often a probe runs.
pub const EVERY: Duration = Duration::from_millis(200);

/// What a probe answers: done with a value, or not yet (with what it saw).
pub enum Poll<T> {
    Ready(T),
    Pending(String),
}

/// Polls `probe` until it is ready; after `timeout` fails the test.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, explain: impl Fn() -> String, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Poll<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Poll::Ready(v) => return v,
            Poll::Pending(seen) => seen,
        };
        if tokio::time::Instant::now() > deadline {
            panic!("waited {timeout:?} for {what}; last seen: {last}\n{}", explain());
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// `Some(v)` is ready; `None` is not, and shows as "nothing".
pub fn ready_if<T>(v: Option<T>) -> Poll<T> {
    match v {
        Some(v) => Poll::Ready(v),
        None => Poll::Pending("nothing".into()),
    }
}

/// Ready with `v` when `done`, else pending with `v` shown.
pub fn ready_when<T: Debug>(done: bool, v: T) -> Poll<T> {
    if done { Poll::Ready(v) } else { Poll::Pending(format!("{v:?}")) }
}

/// `n` random moments of 200 to 2,500 ms (xorshift, seeded from the
/// clock), for kill tests: the test prints them when it fails.
pub fn random_moments(n: usize) -> Vec<u64> {
    let mut seed = jiff::Timestamp::now().as_nanosecond() as u64 | 1;
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            200 + seed % 2300
        })
        .collect()
}
