//! Reading libvirt's XML: domain devices (what decides migratability) and
//! host capabilities. Pure functions over strings; malformed XML is an
//! error, never a panic.

use hv_proto::v1::{Disk, DiskSource, GuestCpu, HostHardware, NumaCell};

#[derive(Debug, thiserror::Error)]
#[error("libvirt returned XML we cannot read: {0}")]
pub struct XmlError(String);

fn doc(xml: &str) -> Result<roxmltree::Document<'_>, XmlError> {
    roxmltree::Document::parse(xml).map_err(|e| XmlError(e.to_string()))
}

/// Disks and PCI host devices of a domain's XML.
pub fn domain_devices(xml: &str) -> Result<(Vec<Disk>, Vec<String>), XmlError> {
    let d = doc(xml)?;
    let mut disks = Vec::new();
    for disk in d.descendants().filter(|n| n.has_tag_name("disk")) {
        if disk.attribute("device").is_some_and(|dev| dev != "disk") {
            continue; // cdrom, floppy, lun: not VM storage
        }
        let target = disk.children().find(|n| n.has_tag_name("target")).and_then(|t| t.attribute("dev"));
        let source = disk.children().find(|n| n.has_tag_name("source"));
        let (kind, path) = match (disk.attribute("type"), source) {
            (Some("network"), Some(s)) if s.attribute("protocol") == Some("rbd") => {
                (DiskSource::Rbd, s.attribute("name").unwrap_or_default())
            }
            (Some("network"), Some(s)) => (DiskSource::OtherNetwork, s.attribute("name").unwrap_or_default()),
            (Some("file"), Some(s)) => (DiskSource::LocalFile, s.attribute("file").unwrap_or_default()),
            (Some("block"), Some(s)) => (DiskSource::LocalBlock, s.attribute("dev").unwrap_or_default()),
            (Some("volume"), Some(s)) => (DiskSource::LocalFile, s.attribute("volume").unwrap_or_default()),
            _ => (DiskSource::Unspecified, ""),
        };
        disks.push(Disk {
            target: target.unwrap_or_default().to_string(),
            source: kind as i32,
            path: path.to_string(),
            capacity_bytes: 0,
        });
    }
    let mut pci = Vec::new();
    for hd in d.descendants().filter(|n| n.has_tag_name("hostdev") && n.attribute("type") == Some("pci")) {
        let addr = hd
            .children()
            .find(|n| n.has_tag_name("source"))
            .and_then(|s| s.children().find(|n| n.has_tag_name("address")));
        if let Some(a) = addr {
            let part = |k: &str, width: usize| {
                let v = a.attribute(k).unwrap_or("0").trim_start_matches("0x");
                format!("{:0>width$}", v.to_lowercase(), width = width)
            };
            pci.push(format!(
                "{}:{}:{}.{}",
                part("domain", 4),
                part("bus", 2),
                part("slot", 2),
                part("function", 1)
            ));
        }
    }
    Ok((disks, pci))
}

/// Host CPU model, arch, features and NUMA cells from `virConnectGetCapabilities`.
#[derive(Debug, Default, PartialEq)]
pub struct HostCaps {
    pub arch: String,
    pub cpu_model: String,
    pub cpu_features: Vec<String>,
    pub numa_cells: Vec<NumaCell>,
    /// The architectures of the guests it can run.
    pub guest_arches: Vec<String>,
}

pub fn capabilities(xml: &str) -> Result<HostCaps, XmlError> {
    let d = doc(xml)?;
    let host =
        d.descendants().find(|n| n.has_tag_name("host")).ok_or_else(|| XmlError("no <host>".into()))?;
    let cpu = host.children().find(|n| n.has_tag_name("cpu"));
    let text = |n: Option<roxmltree::Node<'_, '_>>, tag: &str| {
        n.and_then(|c| c.children().find(|x| x.has_tag_name(tag)))
            .and_then(|x| x.text())
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    let mut features: Vec<String> = cpu
        .map(|c| {
            c.children()
                .filter(|x| x.has_tag_name("feature"))
                .filter_map(|x| x.attribute("name").map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    features.sort();
    let mut guest_arches: Vec<String> = d
        .descendants()
        .filter(|n| n.has_tag_name("guest"))
        .flat_map(|g| g.children().filter(|a| a.has_tag_name("arch")))
        .filter_map(|a| a.attribute("name").map(str::to_string))
        .collect();
    guest_arches.sort();
    guest_arches.dedup();
    let numa_cells = host
        .descendants()
        .filter(|n| n.has_tag_name("cell") && n.parent().is_some_and(|p| p.has_tag_name("cells")))
        .map(|cell| {
            let mem_kib = cell
                .children()
                .find(|x| x.has_tag_name("memory"))
                .and_then(|m| m.text())
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let cpus = cell
                .children()
                .find(|x| x.has_tag_name("cpus"))
                .and_then(|c| c.attribute("num"))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            NumaCell {
                id: cell.attribute("id").and_then(|i| i.parse().ok()).unwrap_or(0),
                cpus,
                memory_bytes: mem_kib.saturating_mul(1024),
            }
        })
        .collect();
    Ok(HostCaps {
        arch: text(cpu, "arch"),
        cpu_model: text(cpu, "model"),
        cpu_features: features,
        numa_cells,
        guest_arches,
    })
}

/// A domain's guest CPU (its `<cpu>`): the mode, a custom CPU's model and
/// the flags it requires. None without a `<cpu>` element or unreadable XML.
pub fn guest_cpu(domain_xml: &str) -> Option<GuestCpu> {
    let d = roxmltree::Document::parse(domain_xml).ok()?;
    let domain = d.root_element();
    let cpu = domain.children().find(|n| n.has_tag_name("cpu"))?;
    let model = cpu.children().find(|n| n.has_tag_name("model")).and_then(|m| m.text()).map(str::trim);
    // libvirt's default mode is custom when a model is named.
    let mode = cpu.attribute("mode").unwrap_or(if model.is_some() { "custom" } else { "" });
    let mut required_features: Vec<String> = cpu
        .children()
        .filter(|n| n.has_tag_name("feature"))
        .filter(|n| matches!(n.attribute("policy").unwrap_or("require"), "require" | "force"))
        .filter_map(|n| n.attribute("name").map(str::to_string))
        .collect();
    required_features.sort();
    required_features.dedup();
    Some(GuestCpu { mode: mode.to_string(), model: model.unwrap_or_default().to_string(), required_features })
}

/// What the domain capabilities offer guests: SEV, Secure Boot firmware,
/// the usable named CPU models. The coordinator maps them to traits and
/// judges migrations with them. Unreadable XML offers nothing.
pub fn domain_offers(domcaps_xml: &str) -> HostHardware {
    let Ok(d) = roxmltree::Document::parse(domcaps_xml) else {
        return HostHardware::default();
    };
    let sev = d.descendants().any(|n| n.has_tag_name("sev") && n.attribute("supported") == Some("yes"));
    let secure = d
        .descendants()
        .filter(|n| n.has_tag_name("enum") && n.attribute("name") == Some("secure"))
        .any(|e| e.children().any(|v| v.has_tag_name("value") && v.text().map(str::trim) == Some("yes")));
    let mut cpu_models: Vec<String> = d
        .descendants()
        .filter(|n| n.has_tag_name("mode") && n.attribute("name") == Some("custom"))
        .flat_map(|m| m.children())
        .filter(|n| n.has_tag_name("model") && n.attribute("usable") == Some("yes"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .filter(|t| !t.is_empty())
        .collect();
    cpu_models.sort();
    cpu_models.dedup();
    HostHardware {
        domain_capabilities: true,
        amd_sev: sev,
        uefi_secure_boot: secure,
        cpu_models,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = r#"<domain type='kvm'><name>vm</name><devices>
      <disk type='network' device='disk'><source protocol='rbd' name='vms/abc_disk'><host name='10.0.0.1'/></source><target dev='vda'/></disk>
      <disk type='file' device='disk'><source file='/var/lib/nova/instances/abc/disk.eph0'/><target dev='vdb'/></disk>
      <disk type='file' device='cdrom'><source file='/tmp/config.iso'/><target dev='hda'/></disk>
      <disk type='block' device='disk'><source dev='/dev/mapper/x'/><target dev='vdc'/></disk>
      <hostdev mode='subsystem' type='pci' managed='yes'><source><address domain='0x0000' bus='0x3b' slot='0x00' function='0x1'/></source></hostdev>
      <hostdev mode='subsystem' type='usb'><source><vendor id='0x1'/></source></hostdev>
    </devices></domain>"#;

    #[test]
    fn disks_are_classified_and_pci_devices_found() {
        let (disks, pci) = domain_devices(DOMAIN).unwrap();
        let kinds: Vec<(String, i32, String)> =
            disks.iter().map(|d| (d.target.clone(), d.source, d.path.clone())).collect();
        assert_eq!(
            kinds,
            vec![
                ("vda".into(), DiskSource::Rbd as i32, "vms/abc_disk".into()),
                ("vdb".into(), DiskSource::LocalFile as i32, "/var/lib/nova/instances/abc/disk.eph0".into()),
                ("vdc".into(), DiskSource::LocalBlock as i32, "/dev/mapper/x".into()),
            ],
            "the cdrom is not VM storage"
        );
        assert_eq!(pci, vec!["0000:3b:00.1"]);
    }

    #[test]
    fn the_guest_cpu_of_a_domain() {
        let custom = "<domain><cpu mode='custom' match='exact'><model fallback='forbid'>Skylake-Server</model>\
                      <feature policy='require' name='pcid'/><feature policy='disable' name='hle'/>\
                      <feature name='ssbd'/></cpu><devices/></domain>";
        let c = guest_cpu(custom).unwrap_or_default();
        assert_eq!((c.mode.as_str(), c.model.as_str()), ("custom", "Skylake-Server"));
        assert_eq!(c.required_features, ["pcid", "ssbd"], "a disabled flag is not required");
        let model =
            guest_cpu("<domain><cpu mode='host-model' check='partial'/></domain>").unwrap_or_default();
        assert_eq!((model.mode.as_str(), model.model.as_str()), ("host-model", ""));
        let implicit = guest_cpu("<domain><cpu><model>Haswell</model></cpu></domain>").unwrap_or_default();
        assert_eq!(implicit.mode, "custom", "a named model without a mode is custom");
        assert_eq!(guest_cpu("<domain><devices/></domain>"), None);
        assert_eq!(guest_cpu("<broken"), None);
    }

    #[test]
    fn what_the_domain_capabilities_offer() {
        let domcaps = "<domainCapabilities><os><loader><enum name='secure'><value>yes</value></enum></loader></os>\
                       <cpu><mode name='custom' supported='yes'><model usable='yes'>Skylake-Server</model>\
                       <model usable='no'>Icelake-Server</model><model usable='yes'>Haswell</model></mode></cpu>\
                       <features><sev supported='yes'/></features></domainCapabilities>";
        let o = domain_offers(domcaps);
        assert!(o.domain_capabilities && o.amd_sev && o.uefi_secure_boot);
        assert_eq!(o.cpu_models, vec!["Haswell", "Skylake-Server"], "only the usable ones");
        let plain = domain_offers(
            "<domainCapabilities><os><loader><enum name='secure'><value>no</value></enum></loader></os>\
                                   <features><sev supported='no'/></features></domainCapabilities>",
        );
        assert!(plain.domain_capabilities && !plain.amd_sev && !plain.uefi_secure_boot);
        assert_eq!(domain_offers("<broken"), HostHardware::default(), "unreadable offers nothing");
    }

    #[test]
    fn malformed_xml_is_an_error() {
        assert!(domain_devices("<domain><devices>").is_err());
        assert!(capabilities("<capabilities/>").is_err());
    }

    #[test]
    fn host_capabilities() {
        let xml = r#"<capabilities><host><cpu><arch>x86_64</arch><model>Skylake-Server-IBRS</model>
            <feature name='vmx'/><feature name='avx512f'/></cpu>
            <topology><cells num='2'><cell id='0'><memory unit='KiB'>1024</memory><cpus num='4'/></cell>
            <cell id='1'><memory unit='KiB'>2048</memory><cpus num='4'/></cell></cells></topology></host></capabilities>"#;
        let c = capabilities(xml).unwrap();
        assert_eq!(c.arch, "x86_64");
        assert_eq!(c.cpu_model, "Skylake-Server-IBRS");
        assert_eq!(c.cpu_features, vec!["avx512f", "vmx"]);
        assert_eq!(c.numa_cells.len(), 2);
        assert_eq!(c.numa_cells[1].memory_bytes, 2048 * 1024);
        let huge = xml.replace(">2048<", ">18446744073709551615<");
        let c = capabilities(&huge).unwrap();
        assert_eq!(c.numa_cells[1].memory_bytes, u64::MAX, "a cell size past u64 bytes saturates");
    }
}
