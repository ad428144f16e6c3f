//! The standard traits (os-traits names) a host's reported capabilities
//! give its resource provider, beside `spec.customTraits`. Pure.
//!
//! Nova's libvirt driver sets many traits itself on every update of the
//! provider, and removes those of its own it no longer finds: the CPU
//! flags of its mapping (`HW_CPU_X86_AVX512F`, …), the host's
//! architecture, hyperthreading, Secure Boot, the storage, video and
//! network models. AMD SEV goes on child providers of its own, and recent
//! releases take it off the host's provider. Syncing any of those would
//! fight the driver, so the table holds only what it never reports, and of
//! that only what is the host's own, whatever CPU its guests are given:
//! the CPU flags outside the driver's mapping that are about what a guest
//! sees (the speculation mitigations, TSX, PCID) depend on the guest CPU
//! configured and are left out.

use std::collections::BTreeSet;

use crate::api::hypervisor::HostCapabilities;

/// x86 CPU flags (the kernel's names, as /proc/cpuinfo lists them) whose
/// trait Nova's libvirt driver does not report: the host's 1 GiB pages.
pub const CPU_FLAGS: &[(&str, &str)] = &[("pdpe1gb", "HW_CPU_X86_PDPE1GB")];

/// A network device with SR-IOV virtual functions.
pub const SRIOV: &str = "HW_NIC_SRIOV";

/// Traits Nova's libvirt driver reports itself (every CPU flag of its
/// mapping, SEV on its child providers, and a sample of the others it
/// owns): never in what we sync.
pub const LEFT_TO_NOVA: &[&str] = &[
    "HW_CPU_X86_3DNOW",
    "HW_CPU_X86_ABM",
    "HW_CPU_X86_AESNI",
    "HW_CPU_X86_AMXBF16",
    "HW_CPU_X86_AMXINT8",
    "HW_CPU_X86_AMXTILE",
    "HW_CPU_X86_AVX",
    "HW_CPU_X86_AVX2",
    "HW_CPU_X86_AVX512BW",
    "HW_CPU_X86_AVX512CD",
    "HW_CPU_X86_AVX512DQ",
    "HW_CPU_X86_AVX512ER",
    "HW_CPU_X86_AVX512F",
    "HW_CPU_X86_AVX512PF",
    "HW_CPU_X86_AVX512VL",
    "HW_CPU_X86_AVX512VNNI",
    "HW_CPU_X86_AVX512VBMI",
    "HW_CPU_X86_AVX512IFMA",
    "HW_CPU_X86_AVX512VBMI2",
    "HW_CPU_X86_AVX512BITALG",
    "HW_CPU_X86_AVX512VAES",
    "HW_CPU_X86_AVX512GFNI",
    "HW_CPU_X86_AVX512VPCLMULQDQ",
    "HW_CPU_X86_AVX512VPOPCNTDQ",
    "HW_CPU_X86_BMI",
    "HW_CPU_X86_BMI2",
    "HW_CPU_X86_CLMUL",
    "HW_CPU_X86_F16C",
    "HW_CPU_X86_FMA3",
    "HW_CPU_X86_FMA4",
    "HW_CPU_X86_MMX",
    "HW_CPU_X86_MPX",
    "HW_CPU_X86_SHA",
    "HW_CPU_X86_SSE",
    "HW_CPU_X86_SSE2",
    "HW_CPU_X86_SSE3",
    "HW_CPU_X86_SSE41",
    "HW_CPU_X86_SSE42",
    "HW_CPU_X86_SSE4A",
    "HW_CPU_X86_SSSE3",
    "HW_CPU_X86_SVM",
    "HW_CPU_X86_AMD_SVM",
    "HW_CPU_X86_TBM",
    "HW_CPU_X86_VMX",
    "HW_CPU_X86_INTEL_VMX",
    "HW_CPU_X86_XOP",
    "HW_CPU_X86_AMD_SEV",
    "HW_CPU_X86_AMD_SEV_ES",
    "HW_CPU_X86_AMD_SEV_SNP",
    "HW_CPU_HYPERTHREADING",
    "HW_ARCH_X86_64",
    "COMPUTE_SECURITY_UEFI_SECURE_BOOT",
    "COMPUTE_NET_VIRTIO_PACKED",
];

/// The traits `caps` and the CPU's flags (`cpu_flags`, None when not
/// read) give the host's provider; None when what they come from was not
/// read (the PCI devices; on x86, the CPU's flags).
pub fn traits(caps: &HostCapabilities, cpu_flags: Option<&[String]>) -> Option<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    if matches!(caps.arch.as_str(), "x86_64" | "i686") {
        for flag in cpu_flags? {
            if let Some((_, t)) = CPU_FLAGS.iter().find(|(f, _)| f.eq_ignore_ascii_case(flag)) {
                out.insert(t.to_string());
            }
        }
    }
    if caps.sriov_nics? > 0 {
        out.insert(SRIOV.to_string());
    }
    Some(out)
}

/// Whether `t` is a trait this table can give (the lifecycle removes only
/// those, and `spec.customTraits` holds only `CUSTOM_` ones).
pub fn is_host_trait(t: &str) -> bool {
    t == SRIOV || CPU_FLAGS.iter().any(|(_, name)| *name == t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(arch: &str, sriov_nics: Option<u32>) -> HostCapabilities {
        HostCapabilities { arch: arch.into(), sriov_nics, ..Default::default() }
    }

    fn flags(names: &[&str]) -> Vec<String> {
        names.iter().map(|f| f.to_string()).collect()
    }

    fn set(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|f| f.to_string()).collect())
    }

    #[test]
    fn each_row_of_the_table_and_nothing_nova_reports() {
        for (flag, t) in CPU_FLAGS {
            assert_eq!(traits(&caps("x86_64", Some(0)), Some(&flags(&[flag]))), set(&[t]), "{flag}");
            assert!(is_host_trait(t) && !LEFT_TO_NOVA.contains(t));
        }
        let nova_owned = ["avx512f", "avx2", "aes", "sse4_2", "vmx", "svm", "ht", "sev", "md_clear", "pcid"];
        assert_eq!(traits(&caps("x86_64", Some(0)), Some(&flags(&nova_owned))), set(&[]));
        assert_eq!(traits(&caps("x86_64", Some(2)), Some(&[])), set(&[SRIOV]));
        assert!(!LEFT_TO_NOVA.iter().any(|t| is_host_trait(t)));
        assert!(!is_host_trait("CUSTOM_PDPE1GB"), "an operator's custom trait is never ours to remove");
    }

    #[test]
    fn what_was_not_read_is_not_known() {
        assert_eq!(
            traits(&caps("x86_64", None), Some(&flags(&["pdpe1gb"]))),
            None,
            "the PCI devices not read"
        );
        assert_eq!(traits(&caps("x86_64", Some(1)), None), None, "the CPU's flags not read");
        assert_eq!(traits(&caps("aarch64", Some(1)), None), set(&[SRIOV]), "no x86 flag to read there");
        assert_eq!(traits(&caps("aarch64", Some(0)), Some(&flags(&["pdpe1gb"]))), set(&[]));
    }
}
