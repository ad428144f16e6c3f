use std::collections::{BTreeMap, BTreeSet};

use super::*;

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn sw(hv: &str, libvirt: &str, model: &str, flags: &[&str]) -> HostSoftware {
    HostSoftware {
        hypervisor_type: "QEMU".into(),
        hypervisor_version: hv.into(),
        libvirt_version: libvirt.into(),
        arch: "x86_64".into(),
        guest_arches: BTreeSet::new(),
        cpu_model: model.into(),
        cpu_features: set(flags),
        cpu_models: Some(set(&["Haswell", "Skylake-Server"])),
    }
}

fn image(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn judge(
    src: &HostSoftware,
    cpu: Option<&GuestCpu>,
    img: &[(&str, &str)],
    dst: &HostSoftware,
) -> Option<String> {
    rejection(Some(src), cpu, &image(img), Some(dst), &[])
}

#[test]
fn never_to_an_older_or_another_hypervisor() {
    let src = sw("8.2.2", "10.0.0", "Skylake", &["avx2"]);
    assert_eq!(judge(&src, None, &[], &src), None, "the same software");
    assert_eq!(
        judge(&src, None, &[], &sw("8.10.0", "10.0.0", "Skylake", &["avx2"])),
        None,
        "8.10 is newer than 8.2"
    );
    let older = judge(&src, None, &[], &sw("8.0.0", "10.0.0", "Skylake", &["avx2"]));
    assert_eq!(older.as_deref(), Some("with a hypervisor older than the source's 8.2.2"));
    let old_libvirt = judge(&src, None, &[], &sw("8.2.2", "9.9.0", "Skylake", &["avx2"]));
    assert_eq!(old_libvirt.as_deref(), Some("with a libvirt older than the source's 10.0.0"));
    let ch = HostSoftware { hypervisor_type: "CH".into(), ..src.clone() };
    assert!(judge(&src, None, &[], &ch).is_some_and(|r| r.contains("another hypervisor")));
    let arm = HostSoftware { arch: "aarch64".into(), ..src.clone() };
    assert!(judge(&src, None, &[], &arm).is_some_and(|r| r.contains("architecture")));
    let unreadable = HostSoftware { hypervisor_version: "?".into(), ..src.clone() };
    assert_eq!(judge(&src, None, &[], &unreadable), None, "not a version: not judged");
}

#[test]
fn what_is_not_known_is_not_judged() {
    let src = sw("9.0.0", "10.0.0", "Skylake", &["avx2"]);
    let old = sw("1.0.0", "1.0.0", "Other", &[]);
    assert_eq!(rejection(Some(&src), None, &image(&[]), None, &[]), None, "target without capabilities");
    assert_eq!(rejection(None, None, &image(&[]), Some(&old), &[]), None, "source without capabilities");
    let cpu = GuestCpu::HostPassthrough;
    assert_eq!(rejection(None, Some(&cpu), &image(&[]), Some(&old), &[]), None);
}

#[test]
fn the_guest_cpu_by_its_mode() {
    let src = sw("8.2.2", "10.0.0", "Skylake", &["avx2", "avx512f"]);
    let same_model_fewer_flags = sw("8.2.2", "10.0.0", "Skylake", &["avx2"]);
    let other_model_more_flags = sw("8.2.2", "10.0.0", "Icelake", &["avx2", "avx512f", "vaes"]);
    let pass = GuestCpu::HostPassthrough;
    assert!(
        judge(&src, Some(&pass), &[], &other_model_more_flags).is_some_and(|r| r.contains("another CPU"))
    );
    assert!(judge(&src, Some(&pass), &[], &same_model_fewer_flags).is_some_and(|r| r.contains("avx512f")));
    let model = GuestCpu::HostModel;
    assert_eq!(judge(&src, Some(&model), &[], &other_model_more_flags), None, "every flag of the source's");
    assert!(judge(&src, Some(&model), &[], &same_model_fewer_flags).is_some_and(|r| r.contains("avx512f")));
    let custom = |m: &str, f: &[&str]| GuestCpu::Custom { model: m.into(), features: set(f) };
    assert_eq!(judge(&src, Some(&custom("Haswell", &["avx2"])), &[], &same_model_fewer_flags), None);
    let unusable = judge(&src, Some(&custom("Cascadelake", &[])), &[], &same_model_fewer_flags);
    assert!(unusable.is_some_and(|r| r.contains("Cascadelake is not usable")));
    let flag = judge(&src, Some(&custom("Haswell", &["avx512f"])), &[], &same_model_fewer_flags);
    assert!(flag.is_some_and(|r| r.contains("avx512f")));
    let unknown_models = HostSoftware { cpu_models: None, ..same_model_fewer_flags };
    assert_eq!(
        judge(&src, Some(&custom("Cascadelake", &[])), &[], &unknown_models),
        None,
        "models not known"
    );
}

#[test]
fn the_images_properties_as_novas_filters_read_them() {
    let src = sw("8.2.2", "10.0.0", "Skylake", &[]);
    let dst = sw("8.2.2", "10.0.0", "Skylake", &[]);
    assert!(
        judge(&src, None, &[("hw_architecture", "aarch64")], &dst).is_some_and(|r| r.contains("aarch64"))
    );
    assert_eq!(judge(&src, None, &[("hw_architecture", "x86_64")], &dst), None);
    assert_eq!(judge(&src, None, &[("architecture", "i386")], &dst), None, "an x86_64 host runs i686 guests");
    assert_eq!(judge(&src, None, &[("hw_architecture", "amd64")], &dst), None, "amd64 is x86_64");
    // Where libvirt says which guests it runs, that is the answer (the
    // test driver: an i686 host running x86_64 guests).
    let test_driver =
        HostSoftware { arch: "i686".into(), guest_arches: set(&["i686", "x86_64"]), ..dst.clone() };
    assert_eq!(judge(&test_driver, None, &[("architecture", "x86_64")], &test_driver), None);
    let only_i686 = HostSoftware { guest_arches: set(&["i686"]), ..test_driver.clone() };
    assert!(judge(&test_driver, None, &[("architecture", "x86_64")], &only_i686).is_some());
    assert_eq!(judge(&src, None, &[("img_hv_type", "kvm")], &dst), None, "libvirt's QEMU is Nova's kvm");
    assert!(judge(&src, None, &[("img_hv_type", "vmware")], &dst).is_some());
    assert_eq!(judge(&src, None, &[("img_hv_requested_version", ">=8.0,<9")], &dst), None);
    let out = judge(&src, None, &[("img_hv_requested_version", ">=9.0")], &dst);
    assert_eq!(out.as_deref(), Some("with a hypervisor outside the image's >=9.0"));
    assert_eq!(
        judge(&src, None, &[("img_hv_requested_version", "~junk")], &dst),
        None,
        "unreadable: not judged"
    );
}

#[test]
fn an_aggregate_naming_an_image_property_isolates_it() {
    let windows = vec![image(&[("os_type", "windows"), ("filter_tenant_id", "p1")])];
    let linux_image = image(&[("os_type", "linux")]);
    let r = rejection(None, None, &linux_image, None, &windows);
    assert_eq!(
        r.as_deref(),
        Some("in an aggregate for os_type=windows, not linux"),
        "without capabilities too"
    );
    assert_eq!(rejection(None, None, &image(&[("os_type", "windows")]), None, &windows), None);
    assert_eq!(rejection(None, None, &image(&[]), None, &windows), None, "a property the image lacks passes");
    let both = vec![image(&[("hw_machine_type", "q35, pc")])];
    assert_eq!(rejection(None, None, &image(&[("hw_machine_type", "pc")]), None, &both), None);
}

#[test]
fn versions_compare_by_number() {
    assert!(older("8.2.2", "8.10.0"));
    assert!(!older("8.10.0", "8.2.2"));
    assert!(!older("8.2", "8.2.0") && !older("8.2.0", "8.2"), "equal but for a trailing zero");
    assert_eq!(satisfies(&[8, 2, 2], ">=8.2.2"), Some(true));
    assert_eq!(satisfies(&[8, 2, 2], "==8.2"), Some(false));
    assert_eq!(satisfies(&[8, 2, 2], "!=8.2.2"), Some(false));
    assert_eq!(satisfies(&[8, 2, 2], "=>8"), None);
}
