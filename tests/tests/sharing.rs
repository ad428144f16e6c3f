//! One region, many actors, on the real peers (docs/lifecycle.md, "Who
//! owns a disable"): a compute service disabled by nova-compute itself
//! (`AUTO: `) or by an SRE stands, shown on the Hypervisor, counted, and
//! told once; the coordinator follows once that party enables it again;
//! a disable of its own that it finds is repaired.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use hv_coordinator::api::Phase;
use hv_tests::hosts;
use hv_tests::openstack::Admin;
use hv_tests::region::Region;
use hv_tests::wait::{ready_when, until};
use serde_json::json;

const SOON: Duration = Duration::from_secs(60);

/// The tests' drift interval (`--drift-interval`, 2 s) three times over,
/// with a second to spare.
const THREE_DRIFT_INTERVALS: u64 = 7;

#[tokio::test(flavor = "multi_thread")]
async fn a_disable_by_nova_compute_or_an_sre_stands_and_a_disable_of_ours_is_repaired() {
    let region = Region::start("sharing").await;
    let claim = hosts::claim(&region.env).await;
    let host = claim.host.as_str();
    let coord = region.coordinator(None, &["--skip-tests"]);
    let metrics = coord.metrics.clone().unwrap();
    let admin = Admin::login(&region.env).await.unwrap();
    region.create_node(host, &[]).await;
    region.wait_phase(host, Phase::Active, SOON, &coord).await;

    for reason in ["AUTO: Connection to libvirt lost: 1", "firmware check, do not enable -- jdoe"] {
        admin.set_service(host, json!({"status": "disabled", "disabled_reason": reason})).await.unwrap();
        let said = region.wait_condition(host, "SchedulingEnabled", "DisabledElsewhere", &coord).await;
        assert!(said.contains(reason), "Nova's reason shown: {said}");
        // It stands: Nova's service sampled every second.
        for _ in 0..THREE_DRIFT_INTERVALS {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let svc = admin.service(host).await.unwrap().unwrap();
            assert_eq!(
                (svc["status"].as_str(), svc["disabled_reason"].as_str()),
                (Some("disabled"), Some(reason))
            );
        }
        let counted = hv_tests::region::metric(&metrics, "hv_hypervisors_disabled_elsewhere").await;
        assert_eq!(counted, Some(1.0), "counted");
        // That party enables it again: the coordinator follows.
        admin.set_service(host, json!({"status": "enabled"})).await.unwrap();
        region.wait_condition(host, "SchedulingEnabled", "Enabled", &coord).await;
        let hv = region.hypervisor(host).await.unwrap();
        assert_eq!(hv.status.and_then(|s| s.phase), Some(Phase::Active));
    }
    // Told with Nova's reason (a second Event of the same reason on the
    // same object is counted in the first's series by the recorder).
    let events = region.events_for(host).await;
    let told: Vec<_> = events.iter().filter(|e| e.0 == "DisabledElsewhere").collect();
    assert!(told.iter().any(|e| e.1.contains("AUTO: Connection to libvirt lost")), "{events:?}");

    // A disable of ours found (a maintenance's, left behind) is repaired.
    let ours = "hv-lifecycle: maintenance (manual): left behind";
    admin.set_service(host, json!({"status": "disabled", "disabled_reason": ours})).await.unwrap();
    until(
        "our own disable repaired",
        SOON,
        || coord.tail(30),
        || async {
            let svc = admin.service(host).await.unwrap().unwrap_or_default();
            ready_when(svc["status"] == "enabled", svc)
        },
    )
    .await;
    until(
        "a DriftRepaired Event naming the old reason",
        Duration::from_secs(10),
        || coord.tail(10),
        || async {
            let events = region.events_for(host).await;
            ready_when(events.iter().any(|e| e.0 == "DriftRepaired" && e.1.contains("left behind")), events)
        },
    )
    .await;
}
