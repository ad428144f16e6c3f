//! The host's hardware as its `/sys` shows it (under `--host-root`): the
//! network devices with SR-IOV virtual functions and the hugepage pools.
//! Added to the facts libvirt gives; what cannot be read counts as absent.

use std::path::Path;

use hv_proto::v1::{HostHardware, HugepagePool};

/// Most hugepage pools kept (a host has two or three sizes).
const MAX_POOLS: usize = 8;

/// Fills the `/sys` parts of `hw` from the tree under `root`.
pub fn read_sys(root: &Path, hw: &mut HostHardware) {
    hw.sriov_nics = sriov_nics(root);
    hw.hugepages = hugepages(root);
}

/// Network devices whose PCI function can have virtual functions.
fn sriov_nics(root: &Path) -> u32 {
    let Ok(nics) = std::fs::read_dir(root.join("sys/class/net")) else {
        return 0;
    };
    let capable = nics.flatten().filter(|nic| {
        std::fs::read_to_string(nic.path().join("device/sriov_totalvfs"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .is_some_and(|n| n > 0)
    });
    u32::try_from(capable.count()).unwrap_or(u32::MAX)
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
    fn sriov_nics_and_hugepage_pools_from_sys() {
        let dir = std::env::temp_dir().join(format!("hv-hardware-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut hw = HostHardware::default();
        read_sys(&dir, &mut hw);
        assert_eq!((hw.sriov_nics, hw.hugepages.len()), (0, 0), "nothing to read is nothing offered");
        write(&dir, "sys/class/net/ens1f0/device/sriov_totalvfs", "64\n");
        write(&dir, "sys/class/net/ens1f1/device/sriov_totalvfs", "0\n");
        write(&dir, "sys/class/net/lo/mtu", "65536\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages", "16\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512\n");
        write(&dir, "sys/kernel/mm/hugepages/hugepages-4kB/nr_hugepages", "0\n");
        write(&dir, "sys/kernel/mm/hugepages/junk/nr_hugepages", "3\n");
        read_sys(&dir, &mut hw);
        assert_eq!(hw.sriov_nics, 1, "a function with no VFs is not SR-IOV capable");
        let pools: Vec<(u64, u64)> = hw.hugepages.iter().map(|p| (p.size_kib, p.total)).collect();
        assert_eq!(pools, vec![(2048, 512), (1_048_576, 16)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
