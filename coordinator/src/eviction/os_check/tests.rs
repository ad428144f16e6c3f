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
    let image = image(img);
    rejection(&Asks { live: true, runs_on: Some(src), cpu, image: &image }, Some(dst), &[])
}

fn asks<'a>(runs_on: Option<&'a HostSoftware>, image: &'a BTreeMap<String, String>) -> Asks<'a> {
    Asks { live: true, runs_on, cpu: None, image }
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
    let none = image(&[]);
    assert_eq!(rejection(&asks(Some(&src), &none), None, &[]), None, "target without capabilities");
    assert_eq!(rejection(&asks(None, &none), Some(&old), &[]), None, "source without capabilities");
    let cpu = GuestCpu::HostPassthrough;
    let a = Asks { cpu: Some(&cpu), ..asks(None, &none) };
    assert_eq!(rejection(&a, Some(&old), &[]), None);
}

#[test]
fn a_cold_move_defines_the_domain_anew() {
    let src = sw("9.0.0", "10.0.0", "Skylake", &["avx2"]);
    let old = sw("1.0.0", "1.0.0", "Other", &[]);
    let none = image(&[]);
    let cpu = GuestCpu::HostPassthrough;
    let cold = Asks { live: false, cpu: Some(&cpu), ..asks(Some(&src), &none) };
    assert_eq!(rejection(&cold, Some(&old), &[]), None, "neither the software nor the CPU matter");
    let arm = image(&[("hw_architecture", "aarch64")]);
    let runs_arm = HostSoftware { guest_arches: set(&["x86_64", "aarch64"]), ..src.clone() };
    let cold = Asks { live: false, ..asks(Some(&runs_arm), &arm) };
    assert!(rejection(&cold, Some(&old), &[]).is_some(), "the image's properties do");
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
    assert_eq!(judge(&src, Some(&pass), &[], &src), None);
    // host-model: libvirt's to work out on the target; the flags a host
    // lists beyond its model do not compare across models.
    let model = GuestCpu::HostModel;
    assert_eq!(judge(&src, Some(&model), &[], &other_model_more_flags), None);
    assert_eq!(judge(&src, Some(&model), &[], &same_model_fewer_flags), None);
    let custom = |m: &str, _required: &[&str]| GuestCpu::Custom { model: m.into() };
    assert_eq!(judge(&src, Some(&custom("Haswell", &["avx512f"])), &[], &same_model_fewer_flags), None);
    let unusable = judge(&src, Some(&custom("Cascadelake", &[])), &[], &same_model_fewer_flags);
    assert!(unusable.is_some_and(|r| r.contains("Cascadelake is not usable")));
    let unknown_models = HostSoftware { cpu_models: None, ..same_model_fewer_flags };
    assert_eq!(
        judge(&src, Some(&custom("Cascadelake", &[])), &[], &unknown_models),
        None,
        "models not known"
    );
}

#[test]
fn the_images_properties_as_novas_filters_read_them() {
    let dst = sw("8.2.2", "10.0.0", "Skylake", &[]);
    // The source not known: every image rule is judged.
    let on = |img: &[(&str, &str)]| {
        let img = image(img);
        rejection(&asks(None, &img), Some(&dst), &[])
    };
    assert!(on(&[("hw_architecture", "aarch64")]).is_some_and(|r| r.contains("aarch64")));
    assert_eq!(on(&[("hw_architecture", "x86_64")]), None);
    assert_eq!(on(&[("architecture", "i386")]), None, "an x86_64 host runs i686 guests");
    assert_eq!(on(&[("hw_architecture", "amd64")]), None, "amd64 is x86_64");
    assert_eq!(on(&[("img_hv_type", "kvm")]), None, "libvirt's QEMU is Nova's kvm");
    assert!(on(&[("img_hv_type", "vmware")]).is_some());
    assert_eq!(on(&[("img_hv_requested_version", ">=8.0,<9")]), None);
    assert_eq!(
        on(&[("img_hv_requested_version", ">=9.0")]).as_deref(),
        Some("with a hypervisor outside the image's >=9.0")
    );
    assert_eq!(on(&[("img_hv_requested_version", "~junk")]), None, "unreadable: not judged");
    // Where libvirt says which guests it runs, that is the answer.
    let x86 = image(&[("architecture", "x86_64")]);
    let only_i686 = HostSoftware { arch: "i686".into(), guest_arches: set(&["i686"]), ..dst.clone() };
    assert!(rejection(&asks(None, &x86), Some(&only_i686), &[]).is_some());
    let both = HostSoftware { guest_arches: set(&["i686", "x86_64"]), ..only_i686 };
    assert_eq!(rejection(&asks(None, &x86), Some(&both), &[]), None);
}

#[test]
fn an_aggregate_naming_an_image_property_isolates_it() {
    let windows = vec![image(&[("os_type", "windows"), ("filter_tenant_id", "p1")])];
    let linux_image = image(&[("os_type", "linux")]);
    let r = rejection(&asks(None, &linux_image), None, &windows);
    assert_eq!(
        r.as_deref(),
        Some("in aggregates for os_type=windows, not linux"),
        "without capabilities too"
    );
    let windows_image = image(&[("os_type", "windows")]);
    assert_eq!(rejection(&asks(None, &windows_image), None, &windows), None);
    let none = image(&[]);
    assert_eq!(rejection(&asks(None, &none), None, &windows), None, "a property the image lacks passes");
    // The host's aggregates together, as Nova takes them.
    let both = vec![image(&[("os_type", "windows")]), image(&[("os_type", "linux")])];
    assert_eq!(rejection(&asks(None, &linux_image), None, &both), None);
    let spaced = vec![image(&[("hw_machine_type", "q35, pc")])];
    let pc = image(&[("hw_machine_type", "pc")]);
    assert_eq!(rejection(&asks(None, &pc), None, &spaced), None);
}

#[test]
fn an_image_rule_its_own_host_fails_is_not_judged() {
    let i686_only =
        HostSoftware { arch: "i686".into(), guest_arches: set(&["i686"]), ..sw("8.2.2", "10.0.0", "", &[]) };
    let x86 = image(&[("architecture", "x86_64")]);
    assert_eq!(rejection(&asks(Some(&i686_only), &x86), Some(&i686_only), &[]), None, "it runs there now");
    let runs_both = HostSoftware { guest_arches: set(&["i686", "x86_64"]), ..i686_only.clone() };
    let r = rejection(&asks(Some(&runs_both), &x86), Some(&i686_only), &[]);
    assert_eq!(r.as_deref(), Some("running no guest of the image's architecture x86_64"));
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
