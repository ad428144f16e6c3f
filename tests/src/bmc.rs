//! The test ground's Redfish BMC emulator, driven directly: what a test
//! needs to set up or undo, apart from the code under test.

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
