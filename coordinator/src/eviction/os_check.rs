//! The preflight's OS validation (docs/eviction.md): can a target host run
//! the VM as it runs now? Pure.
//!
//! Judged on what the hosts' agents report (`status.machine.capabilities`)
//! and what Nova says of the VM's image (compute 2.98):
//! - for a VM that moves live (its domain goes as it is), the hypervisor
//!   software: the same hypervisor type and architecture, a hypervisor
//!   (QEMU) and libvirt no older than the source's (Nova's conductor
//!   refuses an older one too, after the host was disabled); and the guest
//!   CPU, as far as the hosts' reports can say: the source's model (and its
//!   listed flags) for host-passthrough, a usable named model for custom;
//! - for every move, the image: `hw_architecture` among the guest
//!   architectures libvirt runs on the target, `img_hv_type` and
//!   `img_hv_requested_version` as Nova's ImagePropertiesFilter reads them,
//!   and each image property the target's aggregates name in their
//!   metadata (`os_type=windows`), as AggregateImagePropertiesIsolation.
//!   An image rule the VM's own host fails too is not judged.
//!
//! What is not known is not judged: a target without reported
//! capabilities, a VM whose guest CPU its agent did not report, an image
//! Nova does not show (before 2.98).

use std::collections::{BTreeMap, BTreeSet};

/// A host's hypervisor software and CPU, as its agent reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostSoftware {
    pub hypervisor_type: String,
    pub hypervisor_version: String,
    pub libvirt_version: String,
    pub arch: String,
    /// The architectures of the guests it can run (none: not known).
    pub guest_arches: BTreeSet<String>,
    pub cpu_model: String,
    pub cpu_features: BTreeSet<String>,
    /// Usable named CPU models; None when not known.
    pub cpu_models: Option<BTreeSet<String>>,
}

impl From<&crate::api::hypervisor::HostCapabilities> for HostSoftware {
    fn from(c: &crate::api::hypervisor::HostCapabilities) -> HostSoftware {
        HostSoftware {
            hypervisor_type: c.hypervisor_type.clone(),
            hypervisor_version: c.hypervisor_version.clone(),
            libvirt_version: c.libvirt_version.clone(),
            arch: c.arch.clone(),
            guest_arches: c.guest_arches.iter().map(|a| canonical_arch(a)).collect(),
            cpu_model: c.cpu_model.clone(),
            cpu_features: c.cpu_features.iter().cloned().collect(),
            cpu_models: c.cpu_models.as_ref().map(|m| m.iter().cloned().collect()),
        }
    }
}

/// A VM's guest CPU, from its domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuestCpu {
    HostPassthrough,
    HostModel,
    /// A named model; the flags it requires are not compared (libvirt
    /// lists a host's flags beyond its own model only).
    Custom {
        model: String,
    },
}

/// Each domain's guest CPU, by its UUID (a Nova server's id), as `machine`
/// records them.
pub fn guest_cpus(machine: &crate::api::hypervisor::MachineStatus) -> BTreeMap<String, GuestCpu> {
    let mut out = BTreeMap::new();
    for g in machine.guest_cpus.iter().flatten() {
        let cpu = match g.mode.as_str() {
            "host-passthrough" => GuestCpu::HostPassthrough,
            "host-model" => GuestCpu::HostModel,
            "custom" if !g.model.is_empty() => GuestCpu::Custom { model: g.model.clone() },
            // Another mode (maximum) asks what libvirt decides: not judged.
            _ => continue,
        };
        for d in &g.domains {
            out.insert(d.clone(), cpu.clone());
        }
    }
    out
}

/// What a VM asks of a host it moves to, as far as this check knows.
#[derive(Clone, Copy, Debug)]
pub struct Asks<'a> {
    /// It moves live: the hypervisor software and the guest CPU matter
    /// (a cold move defines the domain anew on the target).
    pub live: bool,
    /// The software and CPU of the host it runs on.
    pub runs_on: Option<&'a HostSoftware>,
    pub cpu: Option<&'a GuestCpu>,
    /// Its image's properties.
    pub image: &'a BTreeMap<String, String>,
}

/// Why `target` (its software, its aggregates' metadata) cannot run the
/// VM. None: it can, or it is not known. An image rule the VM's own host
/// fails too is not judged: it is not one the scheduler holds to here.
pub fn rejection(
    asks: &Asks<'_>,
    target: Option<&HostSoftware>,
    aggregates: &[BTreeMap<String, String>],
) -> Option<String> {
    isolated(asks.image, aggregates).or_else(|| {
        let t = target?;
        let image = image_props(asks.image, t)
            .filter(|_| asks.runs_on.is_none_or(|s| image_props(asks.image, s).is_none()));
        image.or_else(|| {
            let s = asks.runs_on.filter(|_| asks.live)?;
            software(s, t).or_else(|| guest_cpu(asks.cpu?, s, t))
        })
    })
}

fn software(s: &HostSoftware, t: &HostSoftware) -> Option<String> {
    if !s.hypervisor_type.is_empty() && !t.hypervisor_type.eq_ignore_ascii_case(&s.hypervisor_type) {
        return Some(format!("running another hypervisor than the source's {}", s.hypervisor_type));
    }
    if !s.arch.is_empty() && !t.arch.is_empty() && s.arch != t.arch {
        return Some(format!("of another architecture than the source's {}", s.arch));
    }
    if older(&t.hypervisor_version, &s.hypervisor_version) {
        return Some(format!("with a hypervisor older than the source's {}", s.hypervisor_version));
    }
    if older(&t.libvirt_version, &s.libvirt_version) {
        return Some(format!("with a libvirt older than the source's {}", s.libvirt_version));
    }
    None
}

/// `a` is a version before `b`; false when either is not one.
fn older(a: &str, b: &str) -> bool {
    matches!((version(a), version(b)), (Some(a), Some(b)) if padded(&a, &b) < padded(&b, &a))
}

/// `v` with zeros to the length of `other`: 8.2 is 8.2.0.
fn padded(v: &[u64], other: &[u64]) -> Vec<u64> {
    (0..v.len().max(other.len())).map(|i| v.get(i).copied().unwrap_or(0)).collect()
}

fn version(v: &str) -> Option<Vec<u64>> {
    let parts: Option<Vec<u64>> = v.trim().split('.').map(|p| p.parse().ok()).collect();
    parts.filter(|p| !p.is_empty())
}

fn image_props(image: &BTreeMap<String, String>, t: &HostSoftware) -> Option<String> {
    if let Some(arch) = image.get("hw_architecture").or_else(|| image.get("architecture"))
        && !runs_arch(t, &canonical_arch(arch))
    {
        return Some(format!("running no guest of the image's architecture {arch}"));
    }
    if let Some(hv) = image.get("img_hv_type").or_else(|| image.get("hypervisor_type"))
        && !t.hypervisor_type.is_empty()
        && !same_hypervisor(hv, &t.hypervisor_type)
    {
        return Some(format!("not of the image's hypervisor type {hv}"));
    }
    let wanted = image.get("img_hv_requested_version").or_else(|| image.get("hypervisor_version_requires"));
    if let Some(want) = wanted
        && let Some(have) = version(&t.hypervisor_version)
        && satisfies(&have, want) == Some(false)
    {
        return Some(format!("with a hypervisor outside the image's {want}"));
    }
    None
}

/// Whether the host runs guests of `arch` (canonical): among its guest
/// architectures where they are known, else its own (or i686 on x86_64).
/// A host whose architecture is not known is not judged.
fn runs_arch(t: &HostSoftware, arch: &str) -> bool {
    if !t.guest_arches.is_empty() {
        return t.guest_arches.contains(arch);
    }
    let own = canonical_arch(&t.arch);
    t.arch.is_empty() || own == arch || (own == "x86_64" && arch == "i686")
}

/// An architecture's name as Nova canonicalizes it (`amd64` is x86_64).
fn canonical_arch(a: &str) -> String {
    match a.trim().to_ascii_lowercase().as_str() {
        "amd64" | "x86-64" => "x86_64".into(),
        "i386" | "i486" | "i586" | "x86_32" | "x86" => "i686".into(),
        "arm64" => "aarch64".into(),
        other => other.to_string(),
    }
}

/// Nova's names for what libvirt calls QEMU.
fn same_hypervisor(image: &str, libvirt: &str) -> bool {
    let canon = |s: &str| match s.to_ascii_lowercase().as_str() {
        "kvm" | "qemu" => "qemu".to_string(),
        other => other.to_string(),
    };
    canon(image) == canon(libvirt)
}

/// Whether `have` meets every term of `predicate` (`>=8.0,<9.0`); None
/// when the predicate cannot be read.
fn satisfies(have: &[u64], predicate: &str) -> Option<bool> {
    let mut all = true;
    for term in predicate.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let at = term.find(|c: char| c.is_ascii_digit())?;
        let (op, v) = term.split_at(at);
        let v = version(v)?;
        let (a, b) = (padded(have, &v), padded(&v, have));
        all &= match op.trim() {
            ">=" => a >= b,
            "<=" => a <= b,
            ">" => a > b,
            "<" => a < b,
            "==" | "=" | "" => a == b,
            "!=" => a != b,
            _ => return None,
        };
    }
    Some(all)
}

/// Each image property the target's aggregates name in their metadata
/// must have the image's value among theirs (all its aggregates' values
/// together, comma-separated); a property the image does not set passes.
fn isolated(image: &BTreeMap<String, String>, aggregates: &[BTreeMap<String, String>]) -> Option<String> {
    let mut allowed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (key, values) in aggregates.iter().flatten() {
        allowed.entry(key.as_str()).or_default().extend(values.split(',').map(str::trim));
    }
    allowed.into_iter().find_map(|(key, values)| {
        let value = image.get(key)?;
        (!values.contains(value.as_str())).then(|| {
            let named = values.into_iter().collect::<Vec<_>>().join(",");
            format!("in aggregates for {key}={named}, not {value}")
        })
    })
}

/// The guest CPU against the target's, only where the hosts' reports
/// can say: the flags libvirt lists of a host are those beyond its named
/// model, so they compare only between hosts of the same model.
fn guest_cpu(cpu: &GuestCpu, s: &HostSoftware, t: &HostSoftware) -> Option<String> {
    match cpu {
        GuestCpu::HostPassthrough if s.cpu_model.is_empty() || t.cpu_model.is_empty() => None,
        GuestCpu::HostPassthrough if t.cpu_model != s.cpu_model => {
            Some(format!("with another CPU than the source's {} (host-passthrough)", s.cpu_model))
        }
        GuestCpu::HostPassthrough => {
            let missing: Vec<String> = s.cpu_features.difference(&t.cpu_features).cloned().collect();
            (!missing.is_empty()).then(|| format!("without the source's CPU flags {}", short(&missing)))
        }
        GuestCpu::Custom { model, .. }
            if t.cpu_models.as_ref().is_some_and(|usable| !usable.contains(model)) =>
        {
            Some(format!("where the guest's CPU model {model} is not usable"))
        }
        // A host-model guest's CPU is libvirt's to work out on the target.
        GuestCpu::Custom { .. } | GuestCpu::HostModel => None,
    }
}

/// At most three names, and how many more.
fn short(names: &[String]) -> String {
    let shown = names.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > 3 { format!("{shown} and {} more", names.len() - 3) } else { shown }
}

#[cfg(test)]
mod tests;
