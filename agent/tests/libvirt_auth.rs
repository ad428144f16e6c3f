//! The agent logs in to a libvirtd that asks for TLS client certificates
//! and SASL (SCRAM-SHA-256) credentials, the ground's TLS listener, and
//! says clearly what is wrong when it cannot.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use hv_agent::libvirt::{Libvirt, LibvirtError, LibvirtTarget, SaslCredentials};

fn target(env: &hv_tests::env::TestEnv, pki: &std::path::Path, password: Option<&str>) -> LibvirtTarget {
    let tls = &env.libvirt.tls;
    LibvirtTarget {
        uri: LibvirtTarget::with_pki_dir(&tls.uri, pki),
        sasl: password.map(|p| SaslCredentials { username: tls.sasl.username.clone(), password: p.into() }),
        ..LibvirtTarget::default()
    }
}

#[test]
fn the_right_certificate_and_credentials_log_in_and_wrong_ones_fail_clearly() {
    let env = hv_tests::env::require();
    let tls = &env.libvirt.tls;
    let ok = Libvirt::connect(&target(&env, &tls.pki_dir, Some(&tls.sasl.password))).unwrap();
    // A logged-in connection answers a call that needs the daemon.
    let version = ok.lib_version().unwrap();
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );
    drop(ok);

    match Libvirt::connect(&target(&env, &tls.pki_dir, Some("not-the-password"))) {
        Err(LibvirtError::Auth { who, .. }) => assert_eq!(who, format!("SASL user {}", tls.sasl.username)),
        other => panic!("a wrong password is an authentication error: {:?}", other.err()),
    }
    match Libvirt::connect(&target(&env, &tls.pki_dir, None)) {
        Err(e @ LibvirtError::Auth { .. }) => {
            assert!(e.to_string().contains("no SASL credentials configured"), "{e}")
        }
        other => panic!("no credentials is an authentication error: {:?}", other.err()),
    }
    let e = Libvirt::connect(&target(&env, &tls.wrong_ca_pki_dir, Some(&tls.sasl.password)))
        .err()
        .expect("a client certificate from another CA is refused");
    assert!(matches!(e, LibvirtError::Connect { .. }) && e.to_string().contains("certificate"), "{e}");
}

fn checks(env: &hv_tests::env::TestEnv, password_file: &std::path::Path) -> (bool, String) {
    let tls = &env.libvirt.tls;
    let out = Command::new(env!("CARGO_BIN_EXE_hv-agent"))
        .args(["checks", "--no-test-domain", "--libvirt-uri", &tls.uri, "--ovsdb", &env.ovsdb.tcp])
        .arg("--libvirt-pki-dir")
        .arg(&tls.pki_dir)
        .args(["--libvirt-sasl-username", &tls.sasl.username])
        .arg("--libvirt-sasl-password-file")
        .arg(password_file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text.lines().find(|l| l.starts_with("libvirt-reachable")).unwrap_or_default().to_string();
    (line.contains(" pass "), format!("{line}\n{text}{}", String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn hv_agent_checks_logs_in_with_a_password_file() {
    let env = hv_tests::env::require();
    let dir = std::env::temp_dir().join(format!("hv-sasl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, format!("{}\n", env.libvirt.tls.sasl.password)).unwrap();
    let (passed, text) = checks(&env, &file);
    assert!(passed, "{text}");
    std::fs::write(&file, "wrong\n").unwrap();
    let (passed, text) = checks(&env, &file);
    assert!(!passed, "{text}");
    assert!(text.contains("refused the agent's credentials (SASL user hv-agent)"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}
