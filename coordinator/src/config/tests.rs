use std::time::Duration;

use clap::Parser;

use super::*;

fn args(extra: &[&str]) -> Result<Args, clap::Error> {
    let mut argv =
        vec!["hv-coordinator", "--tls-cert", "c.pem", "--tls-key", "k.pem", "--client-ca", "ca.pem"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv)
}

fn check(extra: &[&str]) -> Result<Vec<Warning>, ConfigError> {
    args(extra).unwrap().check()
}

#[test]
fn the_defaults_run_with_mutual_tls_and_no_warning() {
    assert_eq!(check(&[]), Ok(vec![]));
    let a = args(&[]).unwrap();
    assert_eq!(a.leadership.instance().unwrap(), "hv-system.hv-coordinator");
    assert_eq!(a.lifecycle.view_max_age(), Duration::from_secs(30));
    assert_eq!(a.lifecycle_policy().unwrap(), crate::lifecycle::Policy::default());
}

#[test]
fn plain_text_only_by_name_and_with_a_warning() {
    let bare = Args::try_parse_from(["hv-coordinator"]).unwrap();
    assert_eq!(bare.check(), Err(ConfigError::NoGrpcTls));
    let insecure = Args::try_parse_from(["hv-coordinator", "--insecure"]).unwrap();
    assert_eq!(insecure.check(), Ok(vec![Warning::Insecure("0.0.0.0:9090".parse().unwrap())]));
    assert!(args(&["--insecure"]).is_err(), "--insecure with certificates is a usage error");
}

#[test]
fn the_lease_times_must_be_ordered_and_leave_room_to_act() {
    let order = check(&["--lease-duration", "10s", "--lease-renew-deadline", "10s"]);
    assert!(matches!(order, Err(ConfigError::LeaseOrder { .. })), "{order:?}");
    let order = check(&["--lease-retry", "10s"]);
    assert!(matches!(order, Err(ConfigError::LeaseOrder { .. })), "{order:?}");
    // 3 s to connect and a second, beside a 6 s retry, do not fit in 10 s.
    let room = check(&["--lease-retry", "6s"]);
    assert_eq!(
        room,
        Err(ConfigError::NoRoomToAct {
            renew: Duration::from_secs(10),
            retry: Duration::from_secs(6),
            margin: Duration::from_secs(4)
        })
    );
    assert_eq!(check(&["--lease-retry", "5s", "--connect-timeout", "2s"]), Ok(vec![]));
}

#[test]
fn the_install_name_must_be_a_label_value() {
    let long = "n".repeat(60);
    let e = check(&["--namespace", &long]);
    assert!(matches!(e, Err(ConfigError::Instance(_))), "{e:?}");
}

#[test]
fn a_dependent_needs_its_lock() {
    let e = check(&["--dependent-pods", "neutron-l2:app=l2"]);
    assert_eq!(e, Err(ConfigError::DependentWithoutLock("neutron-l2".into())));
    assert_eq!(check(&["--dependent-pods", "neutron-l2:app=l2", "--node-lock", "neutron-l2"]), Ok(vec![]));
    assert!(args(&["--node-lock", "-bad-"]).is_err(), "a lock that is no component name is a usage error");
}

#[test]
fn a_fresh_heartbeat_spans_three_agent_heartbeats() {
    let e = check(&["--fence-fresh-heartbeat", "20s"]);
    assert_eq!(
        e,
        Err(ConfigError::FreshHeartbeatTooShort {
            fresh: Duration::from_secs(20),
            heartbeat: Duration::from_secs(10)
        })
    );
    assert_eq!(check(&["--fence-fresh-heartbeat", "3s", "--agent-heartbeat", "1s"]), Ok(vec![]));
}

#[test]
fn risky_settings_are_warned_of() {
    let w = check(&["--ceph-fence-id", "hv-fence"]).unwrap();
    assert_eq!(w, vec![Warning::CephAnywhere]);
    let w = check(&["--ceph-fence-id", "hv-fence", "--ceph-client-networks", "10.0.0.0/8"]).unwrap();
    assert_eq!(w, vec![]);
    let hook =
        ["--webhook-listen", "0.0.0.0:8443", "--webhook-tls-cert", "w.pem", "--webhook-tls-key", "w.key"];
    assert_eq!(check(&hook).unwrap(), vec![Warning::WebhookProtectsNothing]);
    let mut protected = hook.to_vec();
    protected.extend(["--protected-pods", "app=nova-compute"]);
    assert_eq!(check(&protected).unwrap(), vec![]);
}

#[test]
fn durations_read_as_people_write_them() {
    let a = args(&["--drift-interval", "1m30s", "--busy-interval", "500ms"]).unwrap();
    assert_eq!(a.lifecycle.intervals().drift, Duration::from_secs(90));
    assert_eq!(a.lifecycle.intervals().busy, Duration::from_millis(500));
    let e = args(&["--drift-interval", "often"]).unwrap_err().to_string();
    assert!(e.contains("is not a duration like 10s"), "{e}");
}

#[test]
fn every_flag_the_chart_and_the_tests_pass_still_parses() {
    let flags = [
        "--listen",
        "127.0.0.1:9090",
        "--metrics-listen",
        "127.0.0.1:8080",
        "--trust-domain",
        "example.org",
        "--max-connections",
        "100",
        "--os-cloud",
        "region-1",
        "--clouds-yaml",
        "/etc/clouds.yaml",
        "--openstack-max-in-flight",
        "8",
        "--openstack-timeout",
        "2m",
        "--node-selector",
        "a=b",
        "--aggregate",
        "az-a",
        "--custom-trait",
        "CUSTOM_X",
        "--ceph-pool",
        "vms",
        "--skip-tests",
        "--nova-host-strip-suffix",
        ".local",
        "--registration-timeout",
        "1m",
        "--checks-timeout",
        "1m",
        "--node-not-ready-grace",
        "0s",
        "--health-settle",
        "0s",
        "--unreachable-grace",
        "3s",
        "--cordon-starts-maintenance",
        "--update-signal",
        "annotation:x.y/z",
        "--node-lock",
        "l2",
        "--update-max-held",
        "0",
        "--dependent-pods",
        "l2:app=l2",
        "--protected-pods",
        "app=nova",
        "--ha-maintenance-limit",
        "0",
        "--unseen-max-share",
        "100",
        "--fence-max-domain-share",
        "100",
        "--fence-max-fleet-share",
        "90",
        "--fence-domain-label",
        "example.com/rack",
        "--fence-max-domains",
        "3",
        "--fence-fresh-heartbeat",
        "3s",
        "--fence-power-timeout",
        "5s",
        "--ceph-fence-id",
        "fence",
        "--ceph-fence-conf",
        "/c",
        "--ceph-fence-keyring",
        "/k",
        "--ceph-client-networks",
        "10.0.0.0/8,127.0.0.0/8",
        "--drift-interval",
        "2s",
        "--nova-view-max-age",
        "1s",
        "--busy-interval",
        "1s",
        "--agent-heartbeat",
        "1s",
        "--cluster-max-migrations",
        "3",
        "--default-migration-policy",
        "coldMigrate",
        "--evacuate-by-default",
        "false",
        "--evacuate-rebuild-from-image",
        "--namespace",
        "ns",
        "--lease-name",
        "l",
        "--identity",
        "me",
        "--label-leader-pod",
        "--lease-duration",
        "6s",
        "--lease-renew-deadline",
        "4s",
        "--lease-retry",
        "1s",
        "--kube-timeout",
        "5s",
        "--connect-timeout",
        "1s",
        "--reconcile-concurrency",
        "16",
        "--log-json",
    ];
    let a = args(&flags).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a.check(), Ok(vec![]));
    assert_eq!(a.fencing.ceph().unwrap().id, "fence");
    assert!(!a.fencing.evacuate_by_default);
    let policy = a.fencing.policy().unwrap();
    assert_eq!((policy.max_fleet_share, policy.max_domains), (90, 3));
    assert_eq!(a.fencing.fence_domain_label.as_deref(), Some("example.com/rack"));
    assert!(args(&["--fence-max-domains", "0"]).is_err(), "at least one domain");
    assert!(args(&["--fence-domain-label", "not a label"]).is_err());
    assert_eq!(a.leadership.election("me").renew_deadline, Duration::from_secs(4));
    assert_eq!(a.new_nodes.template("ns.l").aggregates, ["az-a"]);
}
