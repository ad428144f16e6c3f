//! What the fencing and evacuation tests share: a host's fencing means on
//! the ground (its BMC and a Ceph address), the coordinator with short
//! graces, a kubelet gone silent, and waits on the fencing record.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test helper that fails fails its test

use std::collections::BTreeMap;
use std::time::Duration;

use hv_coordinator::api::Hypervisor;
use hv_coordinator::api::hypervisor::FencingStatus;
use hv_coordinator::api::keys::BMC_SECRET_LABEL;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::env::TestEnv;
use crate::hosts;
use crate::region::{Proc, Region};
use crate::wait::{Poll, until};

/// Ceph addresses the tests fence, no client of the ground being there:
/// one per test, as tests running at once would otherwise lift each
/// other's entries.
pub mod address {
    pub const CONTROLLER: &str = "127.0.0.2";
    /// The controller test's host whose stream alone is cut (never fenced:
    /// two hosts never share an address, fencing refuses that).
    pub const CONTROLLER_CUT: &str = "127.0.0.6";
    /// A client no test fences: it must go on while others are.
    pub const NEVER_FENCED: &str = "127.0.0.8";
    pub const BENCH_NO_BMC: &str = "127.0.0.3";
    pub const EVACUATION: &str = "127.0.0.4";
    pub const EVACUATION_KILL: &str = "127.0.0.5";
    pub const EVACUATION_REVIVAL: &str = "127.0.0.11";
    pub const HALF_FENCED: &str = "127.0.0.12";
    pub const EVACUATION_REPORTS: &str = "127.0.0.13";
    /// A paused host's, and an observed one's: never blocklisted.
    pub const PAUSED: &str = "127.0.0.14";
    pub const OBSERVED: &str = "127.0.0.15";
}

/// Sets the fencing means of `host`'s Hypervisor: its BMC on the ground
/// (credentials in a Secret of the coordinator's namespace) and `ceph`, a
/// Ceph address no client of the ground uses, in its spec (None: the
/// addresses its agent reports).
pub async fn give_fencing_means(region: &Region, host: &str, ceph: Option<&str>) {
    let env = &region.env;
    let secrets: Api<Secret> =
        Api::namespaced(region.kube.client.clone(), crate::rbac::COORDINATOR_NAMESPACE);
    let name = format!("bmc-{host}");
    let data = BTreeMap::from([
        ("username".to_string(), ByteString(env.bmc.username.clone().into_bytes())),
        ("password".to_string(), ByteString(env.bmc.password.clone().into_bytes())),
        ("ca.crt".to_string(), ByteString(std::fs::read(&env.bmc.ca_file).unwrap())),
    ]);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(BMC_SECRET_LABEL.to_string(), "true".to_string())])),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    // Applied: an earlier test's Secret for this host (the API server
    // outlives tests) is taken over with the same credentials.
    secrets.patch(&name, &PatchParams::apply("hv-tests").force(), &Patch::Apply(&secret)).await.unwrap();
    let hvs: Api<Hypervisor> = Api::all(region.kube.client.clone());
    let patch = serde_json::json!({"spec": {"fencing": {
        "bmc": {"address": env.bmc.address(host), "credentialsSecret": name},
        "cephAddresses": ceph.map(|c| vec![c])}}});
    hvs.patch(host, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Claims `n` hosts of the ground.
pub async fn claim_hosts(env: &TestEnv, n: usize) -> Vec<hosts::Claim> {
    let mut claims = Vec::new();
    for _ in 0..n {
        claims.push(hosts::claim(env).await);
    }
    claims
}

/// The coordinator for the controller tests: short graces (a Node not
/// Ready counts after 1 s, the agent's heartbeat is stale after 3 s), no ha
/// maintenance; plus `extra`.
pub fn fencing_coordinator(region: &Region, extra: &[&str]) -> Proc {
    fencing_coordinator_via(region, &crate::env::Via::default(), extra)
}

/// The same, reaching its peers through the fault proxies `via` names.
pub fn fencing_coordinator_via(region: &Region, via: &crate::env::Via, extra: &[&str]) -> Proc {
    let mut args = vec![
        "--node-not-ready-grace",
        "1s",
        "--unreachable-grace",
        "3s",
        "--ha-maintenance-limit",
        "0",
        "--fence-fresh-heartbeat",
        "3s",
    ];
    args.extend_from_slice(extra);
    region.coordinator_via(region.grpc_port, None, via, &args)
}

/// `host`'s kubelet stops posting: the Node lifecycle controller turns its
/// Node's Ready Unknown.
pub async fn kubelet_silent(region: &Region, host: &str) {
    region.kubelet_stops(host).await;
}

/// Waits until `host`'s fencing record is such that `done`; answers it.
pub async fn wait_fencing(
    region: &Region,
    host: &str,
    what: &str,
    done: impl Fn(&FencingStatus) -> bool,
    coord: &Proc,
) -> FencingStatus {
    until(
        what,
        Duration::from_secs(90),
        || coord.tail(30),
        || async {
            match region.hypervisor(host).await.and_then(|h| h.status).and_then(|s| s.fencing) {
                Some(f) if done(&f) => Poll::Ready(f),
                other => Poll::Pending(format!("{other:?}")),
            }
        },
    )
    .await
}

pub async fn wait_power(env: &TestEnv, host: &str, want: &str) {
    until(&format!("{host}'s system powered {want}"), Duration::from_secs(30), String::new, || async {
        match crate::bmc::power_state(env, host).await {
            Ok(s) if s == want => Poll::Ready(()),
            other => Poll::Pending(format!("{other:?}")),
        }
    })
    .await;
}
