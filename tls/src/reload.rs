//! A value made from files, made again when one of the files changes.
//!
//! cert-manager and the kubelet replace a Secret's files in place (a new
//! target behind a symlink), so a file's modification time, size or inode
//! changes with each rotation. Each use looks at the files (one `stat` per
//! file) and reloads when they changed. A reload that fails (files caught
//! half-written, a key that does not match its certificate) keeps the value
//! in use and says so once per change.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::TlsError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

fn stamps(paths: &[PathBuf]) -> Vec<Option<Stamp>> {
    paths
        .iter()
        .map(|p| {
            std::fs::metadata(p).ok().map(|m| Stamp {
                modified: m.modified().ok(),
                len: m.len(),
                inode: m.ino(),
            })
        })
        .collect()
}

type Load<T> = Box<dyn Fn(&[PathBuf]) -> Result<T, TlsError> + Send + Sync>;

pub(crate) struct Reloading<T> {
    what: &'static str,
    paths: Vec<PathBuf>,
    load: Load<T>,
    /// The stamps last looked at, and the value in use.
    state: Mutex<(Vec<Option<Stamp>>, Arc<T>)>,
}

impl<T> std::fmt::Debug for Reloading<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloading").field("what", &self.what).field("paths", &self.paths).finish()
    }
}

impl<T> Reloading<T> {
    /// Loads now: a value that cannot be made at start is an error.
    pub(crate) fn new(
        what: &'static str,
        paths: Vec<PathBuf>,
        load: impl Fn(&[PathBuf]) -> Result<T, TlsError> + Send + Sync + 'static,
    ) -> Result<Reloading<T>, TlsError> {
        let seen = stamps(&paths);
        let value = Arc::new(load(&paths)?);
        Ok(Reloading { what, paths, load: Box::new(load), state: Mutex::new((seen, value)) })
    }

    /// The value for the files as they are now.
    pub(crate) fn get(&self) -> Arc<T> {
        let now = stamps(&self.paths);
        // The pair is only ever replaced whole, so a panic elsewhere under
        // the lock leaves it consistent: the last good value still serves,
        // and a handshake does not fail for a panic that is not its own.
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if state.0 != now {
            state.0 = now;
            match (self.load)(&self.paths) {
                Ok(v) => {
                    state.1 = Arc::new(v);
                    tracing::info!(what = self.what, files = ?self.paths, "reloaded after its files changed");
                }
                Err(e) => {
                    tracing::warn!(what = self.what, error = %e, "files changed but do not load; keeping the ones in use")
                }
            }
        }
        state.1.clone()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_changed_file_is_read_again_and_a_broken_one_keeps_the_last_good_value() {
        let dir = std::env::temp_dir().join(format!("hv-tls-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("value");
        std::fs::write(&file, "1").unwrap();
        let r = Reloading::new("test", vec![file.clone()], |p| {
            let text = std::fs::read_to_string(&p[0])
                .map_err(|source| TlsError::Read { path: p[0].clone(), source })?;
            text.trim().parse::<u32>().map_err(|e| TlsError::Pem { path: p[0].clone(), what: e.to_string() })
        })
        .unwrap();
        assert_eq!(*r.get(), 1);
        // Replaced as a Secret volume does: a new file renamed over the old.
        let next = dir.join("next");
        std::fs::write(&next, "22").unwrap();
        std::fs::rename(&next, &file).unwrap();
        assert_eq!(*r.get(), 22);
        std::fs::write(&next, "not a number").unwrap();
        std::fs::rename(&next, &file).unwrap();
        assert_eq!(*r.get(), 22, "a broken file keeps the value in use");
        std::fs::remove_file(&file).unwrap();
        assert_eq!(*r.get(), 22, "so does a missing one");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
