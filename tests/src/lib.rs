//! hv-tests: end-to-end tests across real peers, and their harness.
//!
//! Tests live in `tests/tests/`. This library holds what they share.

#![forbid(unsafe_code)]

use std::path::PathBuf;

/// The repository root (the workspace this crate sits in).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}
