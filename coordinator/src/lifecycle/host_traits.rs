//! The standard traits (os-traits names) a host's reported capabilities
//! give its resource provider, beside `spec.customTraits`. Pure.
//!
//! Nova's libvirt driver sets many traits itself on every update of the
//! provider, and removes those of its own it no longer finds: the CPU
//! flags of its mapping (`HW_CPU_X86_AVX512F`, …), the host's
//! architecture, hyperthreading, Secure Boot, the storage, video and
//! network models. AMD SEV goes on child providers of its own, and recent
//! releases take it off the host's provider. Syncing any of those would
//! fight the driver, so the table holds only what it never reports.

use std::collections::BTreeSet;

use crate::api::hypervisor::HostCapabilities;

/// x86 CPU flags (libvirt's names) whose os-traits name Nova's libvirt
/// driver does not report.
pub const CPU_FLAGS: &[(&str, &str)] = &[
    ("amd-no-ssb", "HW_CPU_X86_AMD_NO_SSB"),
    ("amd-ssbd", "HW_CPU_X86_AMD_SSBD"),
    ("ibpb", "HW_CPU_X86_AMD_IBPB"),
    ("md-clear", "HW_CPU_X86_INTEL_MD_CLEAR"),
    ("pcid", "HW_CPU_X86_INTEL_PCID"),
    ("pdpe1gb", "HW_CPU_X86_PDPE1GB"),
    ("rtm", "HW_CPU_X86_TSX"),
    ("sgx", "HW_CPU_X86_SGX"),
    ("spec-ctrl", "HW_CPU_X86_INTEL_SPEC_CTRL"),
    ("ssbd", "HW_CPU_X86_INTEL_SSBD"),
    ("stibp", "HW_CPU_X86_STIBP"),
    ("virt-ssbd", "HW_CPU_X86_AMD_VIRT_SSBD"),
];

/// A network device with SR-IOV virtual functions.
pub const SRIOV: &str = "HW_NIC_SRIOV";

/// Traits Nova's libvirt driver reports itself (a sample of each kind it
/// owns): never in what we sync.
pub const LEFT_TO_NOVA: &[&str] = &[
    "HW_CPU_X86_AVX512F",
    "HW_CPU_X86_AVX2",
    "HW_CPU_X86_AESNI",
    "HW_CPU_X86_SSE42",
    "HW_CPU_X86_VMX",
    "HW_CPU_X86_SVM",
    "HW_CPU_X86_AMD_SEV",
    "HW_CPU_HYPERTHREADING",
    "HW_ARCH_X86_64",
    "COMPUTE_SECURITY_UEFI_SECURE_BOOT",
    "COMPUTE_NET_VIRTIO_PACKED",
];

/// The traits `caps` gives the host's provider, sorted.
pub fn traits(caps: &HostCapabilities) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if matches!(caps.arch.as_str(), "x86_64" | "i686") {
        for flag in &caps.cpu_features {
            if let Some((_, t)) = CPU_FLAGS.iter().find(|(f, _)| f.eq_ignore_ascii_case(flag)) {
                out.insert(t.to_string());
            }
        }
    }
    if caps.sriov_nics > 0 {
        out.insert(SRIOV.to_string());
    }
    out
}

/// Whether `t` is a trait this table can give (the lifecycle removes only
/// those, and `spec.customTraits` holds only `CUSTOM_` ones).
pub fn is_host_trait(t: &str) -> bool {
    t == SRIOV || CPU_FLAGS.iter().any(|(_, name)| *name == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(arch: &str, flags: &[&str], sriov_nics: u32) -> HostCapabilities {
        HostCapabilities {
            arch: arch.into(),
            cpu_features: flags.iter().map(|f| f.to_string()).collect(),
            sriov_nics,
            ..Default::default()
        }
    }

    #[test]
    fn each_row_of_the_table_and_nothing_nova_reports() {
        for (flag, t) in CPU_FLAGS {
            assert_eq!(traits(&caps("x86_64", &[flag], 0)), BTreeSet::from([t.to_string()]), "{flag}");
            assert!(is_host_trait(t));
            assert!(t.starts_with("HW_CPU_X86_") && !LEFT_TO_NOVA.contains(t));
        }
        let nova_owned = ["avx512f", "avx2", "aes", "sse4.2", "vmx", "svm", "ht", "sev"];
        assert!(traits(&caps("x86_64", &nova_owned, 0)).is_empty(), "the driver reports these");
        assert_eq!(traits(&caps("x86_64", &[], 2)), BTreeSet::from([SRIOV.to_string()]));
        assert!(!LEFT_TO_NOVA.iter().any(|t| is_host_trait(t)));
        assert!(!is_host_trait("CUSTOM_PDPE1GB"), "an operator's custom trait is never ours to remove");
    }

    #[test]
    fn x86_flags_only_on_x86_and_case_does_not_matter() {
        assert!(traits(&caps("aarch64", &["pdpe1gb", "sgx"], 0)).is_empty());
        assert_eq!(
            traits(&caps("i686", &["PDPE1GB"], 0)),
            BTreeSet::from(["HW_CPU_X86_PDPE1GB".to_string()])
        );
        let many = traits(&caps("x86_64", &["pdpe1gb", "md-clear", "avx2", "x"], 1));
        let want = ["HW_CPU_X86_INTEL_MD_CLEAR", "HW_CPU_X86_PDPE1GB", "HW_NIC_SRIOV"];
        assert_eq!(many, want.iter().map(|t| t.to_string()).collect::<BTreeSet<_>>());
    }
}
