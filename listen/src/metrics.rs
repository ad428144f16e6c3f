//! What both binaries' `/metrics` show beside their own families: the build
//! (`hv_build_info`) and the process, under the names Prometheus' client
//! libraries give it (`process_resident_memory_bytes`, …), so the usual
//! panels and alerts on them work. The process is read at each scrape from
//! `/proc/self` by `sysinfo` (prometheus-client has no process collector,
//! and the one made for it pins an older prometheus-client).

use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// Registers `hv_build_info{binary, version, arch} 1`: which binary this is,
/// its version (the caller's `CARGO_PKG_VERSION`) and the CPU architecture
/// it was built for.
pub fn build_info(registry: &mut Registry, binary: &'static str, version: &'static str) {
    let labels = vec![("binary", binary), ("version", version), ("arch", std::env::consts::ARCH)];
    registry.register(
        "hv_build",
        "The build that runs: the binary, its version and the CPU architecture it was built for.",
        Info::new(labels),
    );
}

/// What the process uses, read at one moment; a figure that could not be
/// read is None, and its family is left out.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Process {
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    /// User and system CPU time since the start.
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// Seconds since the Unix epoch.
    pub start_time_seconds: Option<u64>,
}

impl Process {
    /// This process, now (`/proc/self` on Linux).
    pub fn read() -> Process {
        use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};
        let (Ok(pid), Ok(mut system)) = (sysinfo::get_current_pid(), System::new()) else {
            return Process::default();
        };
        let kind = ProcessRefreshKind::nothing().with_memory().with_cpu().without_tasks();
        system.refresh_processes_specifics(ProcessesToUpdate::Some(&[pid]), false, kind);
        let Some(p) = system.process(pid) else { return Process::default() };
        Process {
            resident_bytes: Some(p.memory()),
            virtual_bytes: Some(p.virtual_memory()),
            cpu_seconds: Some(p.accumulated_cpu_time() as f64 / 1000.0),
            open_fds: p.open_files().map(|n| n as u64),
            max_fds: p.open_files_limit().map(|n| n as u64),
            start_time_seconds: Some(p.start_time()).filter(|s| *s > 0),
        }
    }

    /// Its families, in a registry of their own (made at each scrape).
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes.", self.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes.", self.virtual_bytes),
            ("process_open_fds", "Number of open file descriptors.", self.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors.", self.max_fds),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                self.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                r.register(name, help, ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX)));
            }
        }
        if let Some(cpu) = self.cpu_seconds {
            r.register(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                ConstCounter::new(cpu),
            );
        }
        r
    }
}

/// The process's families as text, read now.
pub fn process() -> Registry {
    Process::read().registry()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Registry) -> String {
        let mut s = String::new();
        let _ = prometheus_client::encoding::text::encode_registry(&mut s, r);
        s
    }

    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn the_build_is_told_with_its_version_and_architecture() {
        let mut r = Registry::default();
        build_info(&mut r, "hv-test", "1.2.3");
        let s = text(&r);
        let want = format!(
            "hv_build_info{{binary=\"hv-test\",version=\"1.2.3\",arch=\"{}\"}} 1",
            std::env::consts::ARCH
        );
        assert!(s.lines().any(|l| l == want), "{want:?} in\n{s}");
        assert!(s.contains("# TYPE hv_build info"), "{s}");
    }

    /// The figures under Prometheus' standard names, each read from this
    /// very process: it runs, so it has memory, CPU time, open files and a
    /// start in the past.
    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_is_read_under_the_standard_names() {
        let started = std::time::SystemTime::now();
        let p = Process::read();
        let s = text(&p.registry());
        let now = started.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default();
        let get = |name: &str| sample(&s, name).unwrap_or(f64::NAN);
        assert!(get("process_resident_memory_bytes") > 1e5, "{s}");
        assert!(get("process_virtual_memory_bytes") >= get("process_resident_memory_bytes"), "{s}");
        assert!(get("process_cpu_seconds_total") >= 0.0, "{s}");
        assert!(get("process_open_fds") >= 3.0, "stdin, stdout, stderr at least: {s}");
        assert!(get("process_max_fds") >= get("process_open_fds"), "{s}");
        let start = get("process_start_time_seconds");
        assert!(start <= now + 1.0 && start > now - 86_400.0, "a test started today: {start} vs {now}\n{s}");
        assert!(s.contains("# TYPE process_cpu_seconds counter"), "{s}");
    }

    #[test]
    fn a_figure_not_read_is_left_out() {
        let p = Process { resident_bytes: Some(4096), cpu_seconds: Some(1.5), ..Process::default() };
        let s = text(&p.registry());
        assert_eq!(sample(&s, "process_resident_memory_bytes"), Some(4096.0), "{s}");
        assert_eq!(sample(&s, "process_cpu_seconds_total"), Some(1.5), "{s}");
        assert!(!s.contains("process_open_fds"), "{s}");
        assert!(!s.contains("process_start_time_seconds"), "{s}");
    }
}
