//! Host facts and the domain inventory from the real libvirtd of the test
//! ground, over TCP, with its test driver loaded from our fixture.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use hv_agent::libvirt::Libvirt;
use hv_proto::v1::{DiskSource, DomainState};

/// libvirtd (running as `nobody`) reads the fixture itself: copy it where
/// it can, whatever the permissions of the checkout. Copied once per
/// process: the tests run at once, and a copy truncates the file that
/// libvirtd may be reading for another test ("Document is empty").
fn fixture_uri(env: &hv_tests::env::TestEnv) -> String {
    static URI: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    URI.get_or_init(|| {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node.xml");
        let dst = env.libvirt.dir.join(format!("fixture-node-{}.xml", std::process::id()));
        std::fs::copy(&src, &dst).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644)).unwrap();
        format!("test+tcp://{}:{}{}", env.libvirt.host, env.libvirt.port, dst.display())
    })
    .clone()
}

#[test]
fn facts_over_tcp() {
    let env = hv_tests::env::require();
    let lv = Libvirt::open(&fixture_uri(&env)).unwrap();
    let f = lv.facts().unwrap();
    assert!(f.libvirt_version.starts_with("9."), "{}", f.libvirt_version);
    assert_eq!(f.hypervisor_type, "TEST");
    assert_eq!(f.cpus, 16);
    assert_eq!(f.memory_bytes, 64 << 30);
    assert!(!f.hostname.is_empty());
}

#[test]
fn inventory_shows_disks_devices_and_states() {
    let env = hv_tests::env::require();
    let lv = Libvirt::open(&fixture_uri(&env)).unwrap();
    let doms = lv.inventory().unwrap();
    let names: Vec<&str> = doms.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, vec!["vm-gpu", "vm-local", "vm-off", "vm-rbd"]);
    let by = |n: &str| doms.iter().find(|d| d.name == n).unwrap();
    let rbd = by("vm-rbd");
    assert_eq!(rbd.uuid, "11111111-1111-4111-8111-111111111111");
    assert_eq!((rbd.vcpus, rbd.memory_bytes), (4, 4 << 30));
    assert_eq!(rbd.disks[0].source, DiskSource::Rbd as i32);
    assert_eq!(rbd.disks[0].path, "vms/vm-rbd_disk");
    assert_eq!(rbd.state, DomainState::Running as i32);
    assert_eq!(by("vm-local").disks[0].source, DiskSource::LocalFile as i32);
    assert_eq!(by("vm-gpu").pci_host_devices, vec!["0000:3b:00.1"]);
    assert_eq!(by("vm-off").state, DomainState::Shutoff as i32);
}

#[test]
fn an_unreachable_libvirt_is_a_clear_error() {
    let err = Libvirt::open("qemu+tcp://127.0.0.1:1/system").err().unwrap().to_string();
    assert!(err.contains("connecting to libvirt at qemu+tcp://127.0.0.1:1/system"), "{err}");
}
