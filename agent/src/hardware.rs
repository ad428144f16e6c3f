//! The host's hardware as its `/sys` and `/proc` show it (under
//! `--host-root`): the network controllers with SR-IOV virtual functions,
//! the hugepage pools, the CPU's flags. Added to the facts libvirt gives;
//! what could not be read is said to be so, never counted as absent.

use std::path::Path;

use hv_proto::v1::{HostHardware, HugepagePool};

/// Most hugepage pools kept (a host has two or three sizes).
const MAX_POOLS: usize = 8;
/// Most CPU flags kept (a CPU has a few hundred).
const MAX_FLAGS: usize = 512;

/// Fills the `/sys` and `/proc` parts of `hw` from the tree under `root`.
pub fn read_sys(root: &Path, hw: &mut HostHardware) {
    match sriov_nics(root) {
        Some(n) => (hw.sriov_nics, hw.pci_read) = (n, true),
        None => (hw.sriov_nics, hw.pci_read) = (0, false),
    }
    hw.hugepages = hugepages(root);
    match cpu_flags(root) {
        Some(flags) => (hw.cpu_flags, hw.cpuinfo_read) = (flags, true),
        None => (hw.cpu_flags, hw.cpuinfo_read) = (Vec::new(), false),
    }
}

/// Network controllers (PCI class 0x02) whose function can have virtual
/// functions, whatever driver holds them (vfio, DPDK: no netdev then).
/// None when the PCI devices cannot be listed.
fn sriov_nics(root: &Path) -> Option<u32> {
    let devices = std::fs::read_dir(root.join("sys/bus/pci/devices")).ok()?;
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
    let capable = devices.flatten().filter(|d| {
        let dir = d.path();
        let network = read(&dir, "class").is_some_and(|c| c.trim().starts_with("0x02"));
        let vfs = read(&dir, "sriov_totalvfs").and_then(|t| t.trim().parse::<u32>().ok());
        network && vfs.is_some_and(|n| n > 0)
    });
    Some(u32::try_from(capable.count()).unwrap_or(u32::MAX))
}

/// The first CPU's flags in /proc/cpuinfo (`flags` on x86), sorted; None
/// when the file cannot be read.
fn cpu_flags(root: &Path) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(root.join("proc/cpuinfo")).ok()?;
    let line = text.lines().find(|l| l.split(':').next().is_some_and(|k| k.trim() == "flags"));
    let mut flags: Vec<String> = line
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    flags.sort();
    flags.dedup();
    flags.truncate(MAX_FLAGS);
    Some(flags)
}

/// Each hugepage size with the pages reserved of it (`nr_hugepages`),
/// sorted by size; sizes with none are left out.
fn hugepages(root: &Path) -> Vec<HugepagePool> {
    let Ok(dirs) = std::fs::read_dir(root.join("sys/kernel/mm/hugepages")) else {
        return Vec::new();
    };
    let mut pools: Vec<HugepagePool> = dirs
        .flatten()
        .filter_map(|d| {
            let name = d.file_name().into_string().ok()?;
            let size_kib = name.strip_prefix("hugepages-")?.strip_suffix("kB")?.parse().ok()?;
            let total = std::fs::read_to_string(d.path().join("nr_hugepages")).ok()?.trim().parse().ok()?;
            (total > 0).then_some(HugepagePool { size_kib, total })
        })
        .collect();
    pools.sort_by_key(|p| p.size_kib);
    pools.truncate(MAX_POOLS);
    pools
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let p = root.join(path);
        std::fs::create_dir_all(p.parent().unwrap_or(root)).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(p, text).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn sriov_nics_hugepage_pools_and_cpu_flags_from_sys_and_proc() {
        let dir = std::env::temp_dir().join(format!("hv-hardware-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut hw = HostHardware::default();
        read_sys(&dir, &mut hw);
        assert!(!hw.pci_read && !hw.cpuinfo_read, "nothing to read is not known, not none");
        write(&dir, "sys/bus/pci/devices/0000:3b:00.0/class", "0x020000\n");
        write(&dir, "sys/bus/pci/devices/0000:3b:00.0/sriov_totalvfs", "64\n");
        write(&dir, "sys/bus/pci/devices/0000:3b:00.1/class", "0x020000\n");
        write(&dir, "sys/bus/pci/devices/0000:3b:00.1/sriov_totalvfs", "0\n");
        write(&dir, "sys/bus/pci/devices/0000:5e:00.0/class", "0x010802\n");
        write(&dir, "sys/bus/pci/devices/0000:5e:00.0/sriov_totalvfs", "32\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "16\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-4kB/nr_hugepages", "0\n");
        write(&dir, "sys/kernel/mm/hugepages/junk/nr_hugepages", "3\n");
        write(
            &dir,
            "proc/cpuinfo",
            "processor\t: 0\nflags\t\t: fpu vmx pdpe1gb md_clear\n\nprocessor\t: 1\nflags\t\t: fpu\n",
        );
        read_sys(&dir, &mut hw);
        assert!(hw.pci_read && hw.cpuinfo_read);
        assert_eq!(
            hw.sriov_nics, 1,
            "no VFs, or not a network controller (an NVMe drive), is not an SR-IOV NIC"
        );
        let pools: Vec<(u64, u64)> = hw.hugepages.iter().map(|p| (p.size_kib, p.total)).collect();
        assert_eq!(pools, vec![(2048, 512), (1_048_576, 16)]);
        assert_eq!(hw.cpu_flags, ["fpu", "md_clear", "pdpe1gb", "vmx"], "the first CPU's");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
