//! Power through a Redfish BMC (DMTF Redfish: `GET` the ComputerSystem for
//! its `PowerState`, `POST` its `ComputerSystem.Reset` action with
//! `ForceOff` to fence, `On` to wake), the interface of every current
//! server BMC.
//!
//! The address is written as bare-metal tooling writes it (Metal3, Ironic):
//! `redfish+https://bmc.example:443/redfish/v1/Systems/1`; plain
//! `redfish://` means HTTPS, `redfish+http://` is for labs only.

use std::time::Duration;

use serde_json::{Value, json};

use super::{PowerActuator, PowerError, PowerState};

/// How to reach one machine's BMC.
#[derive(Clone)]
pub struct Bmc {
    pub address: String,
    pub username: String,
    pub password: String,
    /// PEM of the CA that signed the BMC's certificate; the system's
    /// roots when None.
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any certificate (BMCs often ship self-signed ones). Off
    /// unless the site says so.
    pub insecure: bool,
    /// Per request.
    pub timeout: Duration,
}

impl std::fmt::Debug for Bmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bmc").field("address", &self.address).field("username", &self.username).finish()
    }
}

/// A Redfish ComputerSystem, ready to be asked.
pub struct Redfish {
    http: reqwest::Client,
    /// `https://host:port`
    origin: String,
    /// `/redfish/v1/Systems/…`
    system: String,
    username: String,
    password: String,
}

impl std::fmt::Debug for Redfish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redfish")
            .field("origin", &self.origin)
            .field("system", &self.system)
            .field("username", &self.username)
            .finish()
    }
}

/// `(origin, system path)` of a Redfish BMC address. Pure.
pub fn parse_address(address: &str) -> Result<(String, String), PowerError> {
    let bad = || PowerError::BadAddress(address.to_string());
    let (scheme, rest) = address.split_once("://").ok_or_else(bad)?;
    let http_scheme = match scheme {
        "redfish" | "redfish+https" => "https",
        "redfish+http" => "http",
        _ => return Err(bad()),
    };
    let (host, path) = rest.split_once('/').ok_or_else(bad)?;
    let path = format!("/{}", path.trim_end_matches('/'));
    if host.is_empty() || path.len() < 2 || host.contains(['@', '?', '#']) || path.contains(['?', '#']) {
        return Err(bad());
    }
    Ok((format!("{http_scheme}://{host}"), path))
}

/// The power state in a ComputerSystem's JSON. Pure.
pub fn power_state_of(system: &Value) -> PowerState {
    match system.get("PowerState") {
        Some(Value::String(s)) => match s.as_str() {
            "On" => PowerState::On,
            "Off" => PowerState::Off,
            "PoweringOn" => PowerState::PoweringOn,
            "PoweringOff" => PowerState::PoweringOff,
            other => PowerState::Unknown(other.to_string()),
        },
        Some(other) => PowerState::Unknown(other.to_string()),
        None => PowerState::Unknown("absent".into()),
    }
}

/// What a Redfish error body says (`error.message`, then its extended
/// info), else the start of the body. Pure.
pub fn error_message(body: &[u8]) -> String {
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let said = v.as_ref().and_then(|v| v.get("error")).and_then(|e| {
        e.get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| e.get("@Message.ExtendedInfo")?.get(0)?.get("Message")?.as_str().map(str::to_string))
    });
    said.unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).trim().to_string())
}

impl Redfish {
    pub fn new(bmc: &Bmc) -> Result<Redfish, PowerError> {
        let (origin, system) = parse_address(&bmc.address)?;
        let mut b = reqwest::Client::builder()
            .timeout(bmc.timeout)
            .connect_timeout(bmc.timeout)
            // A redirected power off would be re-sent as a GET, and a proxy
            // between us and a BMC is one more thing that can lie.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .tls_danger_accept_invalid_certs(bmc.insecure);
        if let Some(pem) = &bmc.ca_pem {
            let cas = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| PowerError::BadCa(chain(&e)))?;
            if cas.is_empty() {
                return Err(PowerError::BadCa("no PEM certificate in it".into()));
            }
            b = b.tls_certs_only(cas);
        }
        let http = b.build().map_err(|e| PowerError::BadCa(chain(&e)))?;
        Ok(Redfish { http, origin, system, username: bmc.username.clone(), password: bmc.password.clone() })
    }

    async fn call(&self, req: reqwest::RequestBuilder) -> Result<Vec<u8>, PowerError> {
        let url = self.origin.clone();
        let res = req
            .basic_auth(&self.username, Some(&self.password))
            .header("Accept", "application/json")
            .send()
            .await
            .map_err(|e| PowerError::Unreachable { url: url.clone(), message: chain(&e) })?;
        let status = res.status().as_u16();
        let body = res
            .bytes()
            .await
            .map_err(|e| PowerError::Unreachable { url: url.clone(), message: chain(&e) })?;
        match status {
            200..=299 => Ok(body.to_vec()),
            401 | 403 => Err(PowerError::Refused { url, status }),
            404 => Err(PowerError::NoSystem { url, system: self.system.clone() }),
            _ => Err(PowerError::Status { url, status, message: error_message(&body) }),
        }
    }

    async fn system(&self) -> Result<Value, PowerError> {
        let body = self.call(self.http.get(format!("{}{}", self.origin, self.system))).await?;
        let garbled = |message: String| PowerError::Garbled { url: self.origin.clone(), message };
        let v: Value = serde_json::from_slice(&body).map_err(|e| garbled(e.to_string()))?;
        if !v.is_object() {
            return Err(garbled(format!("a JSON {} instead of an object", kind(&v))));
        }
        Ok(v)
    }
}

impl Redfish {
    /// The system's power and UUID, in one read.
    pub async fn read(&self) -> Result<(PowerState, Option<String>), PowerError> {
        let system = self.system().await?;
        Ok((power_state_of(&system), uuid_of(&system)))
    }
}

/// The system's `UUID`, lowercase (None: absent or not a string). Pure.
pub fn uuid_of(system: &Value) -> Option<String> {
    system
        .get("UUID")
        .and_then(Value::as_str)
        .map(|u| u.trim().to_ascii_lowercase())
        .filter(|u| !u.is_empty())
}

impl PowerActuator for Redfish {
    async fn power_state(&self) -> Result<PowerState, PowerError> {
        Ok(power_state_of(&self.system().await?))
    }

    async fn force_off(&self) -> Result<(), PowerError> {
        self.reset("ForceOff").await
    }

    async fn power_on(&self) -> Result<(), PowerError> {
        self.reset("On").await
    }
}

impl Redfish {
    /// Posts the system's `ComputerSystem.Reset` action with `kind`.
    async fn reset(&self, kind: &str) -> Result<(), PowerError> {
        // The action's URI is the one the system names, where it names one.
        let system = self.system().await?;
        let target = system
            .pointer("/Actions/#ComputerSystem.Reset/target")
            .and_then(Value::as_str)
            .filter(|t| t.starts_with('/'))
            .map(str::to_string)
            .unwrap_or_else(|| format!("{}/Actions/ComputerSystem.Reset", self.system));
        let req = self.http.post(format!("{}{target}", self.origin)).json(&json!({"ResetType": kind}));
        self.call(req).await.map(|_| ())
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// An error with its causes: reqwest's own message alone ("error sending
/// request") does not say whether it was DNS, TCP or TLS.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_as_bare_metal_tooling_writes_them() {
        let ok = |a: &str| parse_address(a).unwrap();
        assert_eq!(
            ok("redfish+https://10.0.0.9:8443/redfish/v1/Systems/1"),
            ("https://10.0.0.9:8443".to_string(), "/redfish/v1/Systems/1".to_string())
        );
        assert_eq!(ok("redfish://bmc-3/redfish/v1/Systems/abc/").1, "/redfish/v1/Systems/abc");
        assert_eq!(ok("redfish+http://[::1]:8000/redfish/v1/Systems/x").0, "http://[::1]:8000");
        for bad in [
            "",
            "https://bmc/redfish/v1/Systems/1",
            "ipmi://bmc",
            "redfish://bmc",
            "redfish://bmc/",
            "redfish:///redfish/v1/Systems/1",
            "redfish://user@bmc/redfish/v1/Systems/1",
            "redfish://bmc/redfish/v1/Systems/1?x=1",
        ] {
            assert!(matches!(parse_address(bad), Err(PowerError::BadAddress(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_systems_uuid_is_read_lowercase_or_not_at_all() {
        assert_eq!(
            uuid_of(&json!({"UUID": " 380E51B9-B6B0-5C89-9E98-AAB1871AD30C "})).as_deref(),
            Some("380e51b9-b6b0-5c89-9e98-aab1871ad30c")
        );
        for v in [json!({}), json!({"UUID": null}), json!({"UUID": ""}), json!({"UUID": 7})] {
            assert_eq!(uuid_of(&v), None, "{v}");
        }
    }

    #[test]
    fn power_states_are_read_and_anything_else_is_unknown_never_off() {
        assert_eq!(power_state_of(&json!({"PowerState": "Off"})), PowerState::Off);
        assert_eq!(power_state_of(&json!({"PowerState": "On"})), PowerState::On);
        assert_eq!(power_state_of(&json!({"PowerState": "PoweringOff"})), PowerState::PoweringOff);
        for other in
            [json!({"PowerState": "off"}), json!({"PowerState": null}), json!({}), json!({"PowerState": 0})]
        {
            assert!(matches!(power_state_of(&other), PowerState::Unknown(_)), "{other}");
        }
    }

    #[test]
    fn redfish_errors_say_what_the_bmc_said() {
        let body =
            br#"{"error": {"code": "Base.1.0.GeneralError", "message": "Fake system nope was not found"}}"#;
        assert_eq!(error_message(body), "Fake system nope was not found");
        let ext = br#"{"error": {"@Message.ExtendedInfo": [{"Message": "busy"}]}}"#;
        assert_eq!(error_message(ext), "busy");
        assert_eq!(error_message(b"<html>502</html>"), "<html>502</html>");
        assert_eq!(error_message(&[b'x'; 500]).len(), 200);
    }
}
