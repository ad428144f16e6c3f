//! Health signals of the host itself (docs/health.md), read from procfs and
//! sysfs under a root directory (`--host-root`, `/` on a host; a fake tree
//! in tests): memory errors (EDAC), a read-only root, load, memory pressure.
//! A file that cannot be read says nothing: the signal stays as it was.

use std::collections::BTreeMap;
use std::path::Path;

use hv_proto::v1::{HealthSeverity, HealthSignalKind};

use super::Update;

/// Uncorrected errors: any. Corrected ones: this many since the agent started.
pub const CORRECTED_ERRORS: u64 = 100;
/// The 1-minute load average per CPU above which the host is loaded.
pub const LOAD_PER_CPU: f64 = 4.0;
/// The share of memory available below which memory is short.
pub const MEMORY_AVAILABLE: f64 = 0.05;

/// What the probe remembers from its first reading: error counts, and
/// whether `/` was read-only (an image-based OS mounts it so by design).
#[derive(Debug, Default)]
pub struct Baseline {
    corrected: BTreeMap<String, u64>,
    uncorrected: BTreeMap<String, u64>,
    root_read_only: Option<bool>,
}

/// Every host signal as it stands now, under `root`. Evidence names the
/// threshold crossed, not the current value, so that it does not change
/// from one probe to the next.
pub fn probe(root: &Path, baseline: &mut Baseline) -> Vec<Update> {
    let mut out = memory_errors(root, baseline);
    out.extend(read_only_root(root, baseline));
    out.extend(load(root));
    out.extend(memory_pressure(root));
    out
}

fn read(root: &Path, path: &str) -> Option<String> {
    std::fs::read_to_string(root.join(path)).ok()
}

fn count(root: &Path, path: &str) -> Option<u64> {
    read(root, path)?.trim().parse().ok()
}

/// EDAC: one subject per memory controller (`mc0`, ...). The counts are
/// since boot: an old error an SRE already dealt with must not come back
/// at every agent start, so only errors since the agent started count.
fn memory_errors(root: &Path, baseline: &mut Baseline) -> Vec<Update> {
    let kind = HealthSignalKind::MemoryErrors;
    let dir = root.join("sys/devices/system/edac/mc");
    let Ok(entries) = std::fs::read_dir(&dir) else { return Vec::new() };
    let mut mcs: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.len() > 2 && n.starts_with("mc") && n[2..].bytes().all(|b| b.is_ascii_digit()))
        .collect();
    mcs.sort();
    let mut out = Vec::new();
    for mc in mcs {
        let ue = count(root, &format!("sys/devices/system/edac/mc/{mc}/ue_count"));
        let ce = count(root, &format!("sys/devices/system/edac/mc/{mc}/ce_count"));
        let (Some(ue), Some(ce)) = (ue, ce) else { continue };
        let new_ue = ue.saturating_sub(*baseline.uncorrected.entry(mc.clone()).or_insert(ue));
        let new_ce = ce.saturating_sub(*baseline.corrected.entry(mc.clone()).or_insert(ce));
        out.push(if new_ue > 0 {
            let note = format!("uncorrected memory errors on {mc} since the agent started");
            Update::hold(kind, &mc, HealthSeverity::Critical, note)
        } else if new_ce >= CORRECTED_ERRORS {
            let note =
                format!("{CORRECTED_ERRORS} or more corrected memory errors on {mc} since the agent started");
            Update::hold(kind, &mc, HealthSeverity::Warning, note)
        } else {
            Update::end(kind, &mc)
        });
    }
    out
}

/// The root filesystem as mounted last over `/` (a later mount hides an
/// earlier one), in init's mount table (the host's, not the container's).
/// Only a change from read-write counts.
fn read_only_root(root: &Path, baseline: &mut Baseline) -> Option<Update> {
    let kind = HealthSignalKind::RootReadOnly;
    let mounts = read(root, "proc/1/mounts")?;
    let (device, options) = mounts.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() >= 4 && f[1] == "/").then(|| (f[0].to_string(), f[3].to_string()))
    })?;
    let read_only = options.split(',').any(|o| o == "ro");
    let at_start = *baseline.root_read_only.get_or_insert(read_only);
    Some(if read_only && !at_start {
        Update::hold(kind, "", HealthSeverity::Critical, format!("/ is mounted read-only ({device})"))
    } else {
        Update::end(kind, "")
    })
}

fn load(root: &Path) -> Option<Update> {
    let kind = HealthSignalKind::LoadHigh;
    let load1: f64 = read(root, "proc/loadavg")?.split_whitespace().next()?.parse().ok()?;
    let cpus = read(root, "proc/cpuinfo")?.lines().filter(|l| l.starts_with("processor")).count().max(1);
    Some(if load1 > LOAD_PER_CPU * cpus as f64 {
        let note = format!("1-minute load above {LOAD_PER_CPU} per CPU ({cpus} CPUs)");
        Update::hold(kind, "", HealthSeverity::Warning, note)
    } else {
        Update::end(kind, "")
    })
}

fn memory_pressure(root: &Path) -> Option<Update> {
    let kind = HealthSignalKind::MemoryPressure;
    let info = read(root, "proc/meminfo")?;
    let kib = |key: &str| -> Option<u64> {
        let line = info.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()
    };
    let (total, available) = (kib("MemTotal:")?, kib("MemAvailable:")?);
    // Static hugepages are in MemTotal and never in MemAvailable: on a KVM
    // host they are the guests' memory, set aside on purpose.
    let pages = kib("HugePages_Total:").unwrap_or(0) * kib("Hugepagesize:").unwrap_or(0);
    let total = total.saturating_sub(pages);
    if total == 0 {
        return None;
    }
    let share = available as f64 / total as f64;
    Some(if share < MEMORY_AVAILABLE {
        let note =
            format!("less than {:.0} % of memory available (hugepages aside)", MEMORY_AVAILABLE * 100.0);
        Update::hold(kind, "", HealthSeverity::Warning, note)
    } else {
        Update::end(kind, "")
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A fake host tree in a fresh directory.
    fn tree(files: &[(&str, &str)]) -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("hv-host-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        root
    }

    fn state(u: &[Update], kind: HealthSignalKind, subject: &str) -> Option<Option<HealthSeverity>> {
        u.iter().find(|x| x.kind == kind && x.subject == subject).map(|x| x.now.as_ref().map(|n| n.0))
    }

    const HEALTHY: &[(&str, &str)] = &[
        ("proc/1/mounts", "sysfs /sys sysfs rw 0 0\n/dev/sda1 / ext4 rw,relatime 0 0\n"),
        ("proc/loadavg", "0.52 0.40 0.33 1/123 4567\n"),
        ("proc/cpuinfo", "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n"),
        ("proc/meminfo", "MemTotal:       65536000 kB\nMemFree:  100 kB\nMemAvailable:   32768000 kB\n"),
        ("sys/devices/system/edac/mc/mc0/ue_count", "0\n"),
        ("sys/devices/system/edac/mc/mc0/ce_count", "7\n"),
    ];

    #[test]
    fn a_healthy_host_ends_every_signal() {
        let root = tree(HEALTHY);
        let u = probe(&root, &mut Baseline::default());
        for (kind, subject) in [
            (HealthSignalKind::MemoryErrors, "mc0"),
            (HealthSignalKind::RootReadOnly, ""),
            (HealthSignalKind::LoadHigh, ""),
            (HealthSignalKind::MemoryPressure, ""),
        ] {
            assert_eq!(state(&u, kind, subject), Some(None), "{kind:?}");
        }
    }

    #[test]
    fn each_threshold_crossed_holds_its_signal() {
        let mut base = Baseline::default();
        probe(&tree(HEALTHY), &mut base);
        let mut files = HEALTHY.to_vec();
        files[0] = ("proc/1/mounts", "/dev/sda1 / ext4 rw 0 0\n/dev/sda1 / ext4 ro,relatime 0 0\n");
        files[1] = ("proc/loadavg", "8.10 3.0 1.0 1/1 1\n");
        files[3] = ("proc/meminfo", "MemTotal: 1000000 kB\nMemAvailable: 49999 kB\n");
        files[4] = ("sys/devices/system/edac/mc/mc0/ue_count", "2\n");
        let u = probe(&tree(&files), &mut base);
        assert_eq!(state(&u, HealthSignalKind::RootReadOnly, ""), Some(Some(HealthSeverity::Critical)));
        assert_eq!(state(&u, HealthSignalKind::LoadHigh, ""), Some(Some(HealthSeverity::Warning)));
        assert_eq!(state(&u, HealthSignalKind::MemoryPressure, ""), Some(Some(HealthSeverity::Warning)));
        assert_eq!(state(&u, HealthSignalKind::MemoryErrors, "mc0"), Some(Some(HealthSeverity::Critical)));
        let texts: Vec<&str> = u.iter().filter_map(|x| x.now.as_ref().map(|n| n.1.as_str())).collect();
        assert!(texts.contains(&"/ is mounted read-only (/dev/sda1)"), "{texts:?}");
        assert!(texts.contains(&"1-minute load above 4 per CPU (2 CPUs)"), "{texts:?}");
        assert!(texts.contains(&"uncorrected memory errors on mc0 since the agent started"), "{texts:?}");
        assert!(texts.contains(&"less than 5 % of memory available (hugepages aside)"), "{texts:?}");
        // The same state with other figures says the same: no news.
        files[1] = ("proc/loadavg", "9.30 3.0 1.0 1/1 1\n");
        files[3] = ("proc/meminfo", "MemTotal: 1000000 kB\nMemAvailable: 30000 kB\n");
        assert_eq!(u, probe(&tree(&files), &mut base));
    }

    #[test]
    fn what_was_so_at_the_start_is_the_host_as_built() {
        let mut files = HEALTHY.to_vec();
        files[0] = ("proc/1/mounts", "/dev/sda1 / ext4 ro,relatime 0 0\n");
        files[4] = ("sys/devices/system/edac/mc/mc0/ue_count", "3\n");
        // 48 of 64 GiB in hugepages for guests; 8 of the other 16 available.
        files[3] = (
            "proc/meminfo",
            "MemTotal: 67108864 kB\nMemAvailable: 8388608 kB\nHugePages_Total: 24576\nHugepagesize: 2048 kB\n",
        );
        let mut base = Baseline::default();
        let u = probe(&tree(&files), &mut base);
        assert_eq!(
            state(&u, HealthSignalKind::RootReadOnly, ""),
            Some(None),
            "an image-based OS's / is read-only"
        );
        assert_eq!(state(&u, HealthSignalKind::MemoryErrors, "mc0"), Some(None), "an old error, dealt with");
        assert_eq!(state(&u, HealthSignalKind::MemoryPressure, ""), Some(None), "hugepages are not pressure");
        files[4] = ("sys/devices/system/edac/mc/mc0/ue_count", "4\n");
        let u = probe(&tree(&files), &mut base);
        let new = state(&u, HealthSignalKind::MemoryErrors, "mc0");
        assert_eq!(new, Some(Some(HealthSeverity::Critical)), "a new one counts");
    }

    #[test]
    fn corrected_errors_count_from_the_agent_start_and_at_the_bound() {
        let mut files = HEALTHY.to_vec();
        let mut base = Baseline::default();
        assert_eq!(
            state(&probe(&tree(&files), &mut base), HealthSignalKind::MemoryErrors, "mc0"),
            Some(None)
        );
        files[5] = ("sys/devices/system/edac/mc/mc0/ce_count", "106\n");
        let u = probe(&tree(&files), &mut base);
        assert_eq!(state(&u, HealthSignalKind::MemoryErrors, "mc0"), Some(None), "99 since the start");
        files[5] = ("sys/devices/system/edac/mc/mc0/ce_count", "107\n");
        let u = probe(&tree(&files), &mut base);
        assert_eq!(state(&u, HealthSignalKind::MemoryErrors, "mc0"), Some(Some(HealthSeverity::Warning)));
        // Exactly at the load bound is not above it.
        files[1] = ("proc/loadavg", "8.00 1 1 1/1 1\n");
        assert_eq!(state(&probe(&tree(&files), &mut base), HealthSignalKind::LoadHigh, ""), Some(None));
    }

    #[test]
    fn what_cannot_be_read_says_nothing() {
        let root =
            tree(&[("proc/loadavg", "garbage\n"), ("proc/meminfo", "MemTotal: 0 kB\nMemAvailable: 0 kB\n")]);
        assert!(probe(&root, &mut Baseline::default()).is_empty());
        assert!(probe(Path::new("/nonexistent-hv-root"), &mut Baseline::default()).is_empty());
    }
}
