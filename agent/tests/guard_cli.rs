//! `hv-agent guard`, the drain guard pod's process: it runs until it is
//! stopped, and a stop ends it at once with success.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn the_guard_sleeps_until_it_is_stopped_and_then_exits_zero() {
    for signal in [nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGINT] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_hv-agent")).arg("guard").spawn().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        assert!(child.try_wait().unwrap().is_none(), "still running before it is stopped");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
        let asked = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(asked.elapsed() < Duration::from_secs(10), "{signal}: not stopped");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0), "{signal}: exits 0, not killed by the signal");
    }
}
