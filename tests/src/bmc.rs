//! The test ground's Redfish BMC emulator: driven directly, for what a
//! test needs to set up or undo apart from the code under test; and how
//! the code under test reaches it, watched.

#![allow(clippy::panic)] // a test without the ground's CA fails

use crate::env::TestEnv;

fn http(env: &TestEnv) -> Result<reqwest::Client, String> {
    let ca = std::fs::read(&env.bmc.ca_file).map_err(|e| format!("{}: {e}", env.bmc.ca_file.display()))?;
    let ca = reqwest::Certificate::from_pem(&ca).map_err(|e| e.to_string())?;
    reqwest::Client::builder().tls_certs_only([ca]).build().map_err(|e| e.to_string())
}

/// `host`'s system's `PowerState` as the emulator reports it (`On`, `Off`).
pub async fn power_state(env: &TestEnv, host: &str) -> Result<String, String> {
    let system = env.bmc.systems.get(host).ok_or_else(|| format!("no BMC system for {host}"))?;
    let res = http(env)?
        .get(format!("{}{system}", env.bmc.url))
        .basic_auth(&env.bmc.username, Some(&env.bmc.password))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: serde_json::Value = res.json().await.map_err(|e| e.to_string())?;
    v["PowerState"].as_str().map(str::to_string).ok_or_else(|| format!("no PowerState in {v}"))
}

/// Asks `host`'s system to power on (the emulator's fake driver lands it
/// up to 11 s later); nothing when it is on.
pub async fn power_on(env: &TestEnv, host: &str) -> Result<(), String> {
    reset(env, host, "On").await
}

/// Cuts `host`'s power (a forced off, as a power loss), landing up to 11 s later.
pub async fn power_off(env: &TestEnv, host: &str) -> Result<(), String> {
    reset(env, host, "ForceOff").await
}

async fn reset(env: &TestEnv, host: &str, kind: &str) -> Result<(), String> {
    let system = env.bmc.systems.get(host).ok_or_else(|| format!("no BMC system for {host}"))?;
    let res = http(env)?
        .post(format!("{}{system}/Actions/ComputerSystem.Reset", env.bmc.url))
        .basic_auth(&env.bmc.username, Some(&env.bmc.password))
        .json(&serde_json::json!({"ResetType": kind}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if res.status().is_success() { Ok(()) } else { Err(format!("{kind} {host}: HTTP {}", res.status())) }
}

/// How the code under test reaches `host`'s BMC: the emulator's address
/// for its system, its credentials, the ground's CA.
pub fn bmc_of(env: &TestEnv, host: &str) -> hv_coordinator::fence::Bmc {
    hv_coordinator::fence::Bmc {
        address: env.bmc.address(host),
        username: env.bmc.username.clone(),
        password: env.bmc.password.clone(),
        ca_pem: Some(
            std::fs::read(&env.bmc.ca_file).unwrap_or_else(|e| panic!("{}: {e}", env.bmc.ca_file.display())),
        ),
        insecure: false,
        timeout: std::time::Duration::from_secs(5),
    }
}

/// An actuator under test, with every state it read and how often it
/// asked for power off and on.
pub struct Watched<'a, A> {
    pub inner: &'a A,
    pub seen: std::sync::Mutex<Vec<hv_coordinator::fence::PowerState>>,
    pub offs: std::sync::atomic::AtomicU32,
    pub ons: std::sync::atomic::AtomicU32,
}

impl<'a, A> Watched<'a, A> {
    pub fn new(inner: &'a A) -> Self {
        Watched { inner, seen: Default::default(), offs: Default::default(), ons: Default::default() }
    }

    /// The states read, in order.
    pub fn seen(&self) -> Vec<hv_coordinator::fence::PowerState> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    pub fn offs(&self) -> u32 {
        self.offs.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn ons(&self) -> u32 {
        self.ons.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl<A: hv_coordinator::fence::PowerActuator> hv_coordinator::fence::PowerActuator for Watched<'_, A> {
    async fn power_state(
        &self,
    ) -> Result<hv_coordinator::fence::PowerState, hv_coordinator::fence::PowerError> {
        let state = self.inner.power_state().await?;
        if let Ok(mut s) = self.seen.lock() {
            s.push(state.clone());
        }
        Ok(state)
    }

    async fn force_off(&self) -> Result<(), hv_coordinator::fence::PowerError> {
        self.offs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.force_off().await
    }

    async fn power_on(&self) -> Result<(), hv_coordinator::fence::PowerError> {
        self.ons.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.power_on().await
    }
}

/// The ground's machine `host` following its BMC, as a real machine does:
/// when the emulator reads it Off, its agent, its nova-compute and its
/// kubelet stop; read On again, they start (the agent with `peers`). The
/// emulator's state is the truth: whoever powers the system (the code
/// under test) drives the fake host. Runs for as long as it is polled: a
/// test runs it beside its own steps (`tokio::select!`).
pub async fn machine_follows_bmc(
    region: &crate::region::Region,
    host: &str,
    peers: &crate::region::AgentPeers,
) {
    use crate::openstack::{FakeHost, fake_host};
    let mut agent = Some(region.agent(host, peers));
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let Ok(state) = power_state(&region.env, host).await else { continue };
        match (agent.is_some(), state.as_str()) {
            (true, "Off") => {
                if let Some(mut a) = agent.take() {
                    a.kill();
                }
                fake_host(&region.env.nova, host, FakeHost::Stop).await.unwrap_or_else(|e| panic!("{e}"));
                region.kwok_lets_go(host).await;
            }
            (false, "On") => {
                fake_host(&region.env.nova, host, FakeHost::Start).await.unwrap_or_else(|e| panic!("{e}"));
                region.kwok_manages(host, true).await;
                agent = Some(region.agent(host, peers));
            }
            _ => {}
        }
    }
}
