//! Minimal Keystone, Nova and Placement calls for tests: enough to check the
//! ground and, later, to assert on what the coordinator did. Not the
//! coordinator's client (that lives in `coordinator/src/nova/`).

use serde_json::{Value, json};

use crate::env::{Credentials, Keystone};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}: {1}")]
    Http(String, reqwest::Error),
    #[error("{what}: HTTP {status}: {body}")]
    Status { what: String, status: u16, body: String },
    #[error("{0}: no X-Subject-Token in Keystone's answer")]
    NoToken(String),
}

/// A scoped Keystone token.
#[derive(Debug, Clone)]
pub struct Token {
    pub value: String,
    pub body: Value,
}

/// Password authentication, project-scoped: what `openstack` does with a clouds.yaml entry.
/// The image the tests boot from: one of Nova's fixture images with no
/// architecture property. The ground's machines are libvirt's test driver,
/// which runs i686 guests only: an image asking for x86_64 is one the
/// preflight's OS validation rightly finds no host for.
pub const IMAGE: &str = "a2459075-d96c-40d5-893e-577ff92e721c";
/// Nova's fixture image that asks for x86_64 guests (`architecture`).
pub const X86_64_IMAGE: &str = "155d900f-4e14-4e4c-a73d-069cbf4541e6";

pub async fn token(ks: &Keystone, who: &Credentials) -> Result<Token, ApiError> {
    let body = json!({"auth": {
        "identity": {"methods": ["password"], "password": {"user": {
            "name": who.username, "domain": {"name": who.user_domain_name}, "password": who.password}}},
        "scope": {"project": {"name": who.project_name, "domain": {"name": who.project_domain_name}}}}});
    let what = format!("POST {}/auth/tokens as {}", ks.auth_url, who.username);
    let resp = reqwest::Client::new()
        .post(format!("{}/auth/tokens", ks.auth_url))
        .json(&body)
        .send()
        .await
        .map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    let value = resp.headers().get("x-subject-token").and_then(|v| v.to_str().ok()).map(str::to_string);
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if status != 201 {
        return Err(ApiError::Status { what, status, body: body.to_string() });
    }
    let value = value.ok_or(ApiError::NoToken(what))?;
    Ok(Token { value, body })
}

/// GET `url` with the token and a microversion header (`compute 2.96`, `placement 1.39`).
pub async fn get(url: &str, token: &Token, microversion: &str) -> Result<Value, ApiError> {
    send(reqwest::Method::GET, url, token, microversion, None).await
}

/// Any call with the token, a microversion header and an optional JSON body;
/// answers the JSON body (`Null` when empty).
pub async fn send(
    method: reqwest::Method,
    url: &str,
    token: &Token,
    microversion: &str,
    body: Option<Value>,
) -> Result<Value, ApiError> {
    let what = format!("{method} {url}");
    let mut req = reqwest::Client::new()
        .request(method, url)
        .header("X-Auth-Token", &token.value)
        .header("OpenStack-API-Version", microversion);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req.send().await.map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| ApiError::Http(what.clone(), e))?;
    if !(200..300).contains(&status) {
        return Err(ApiError::Status { what, status, body: text });
    }
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_str(&text).map_err(|e| ApiError::Status { what, status, body: format!("{e}: {text}") })
}

/// The region as an administrator sees it, to set up scenarios and to check
/// what the coordinator did, independently of the coordinator's client.
pub struct Admin {
    pub token: Token,
    pub nova: crate::env::Nova,
}

impl Admin {
    pub async fn login(env: &crate::env::TestEnv) -> Result<Admin, ApiError> {
        Ok(Admin { token: token(&env.keystone, &env.keystone.admin).await?, nova: env.nova.clone() })
    }

    fn compute(&self, path: &str) -> String {
        format!("{}/{path}", self.nova.compute_url)
    }

    fn mv(&self) -> String {
        format!("compute {}", self.nova.compute_microversion)
    }

    /// Every compute service's id by its host, and every hypervisor's id
    /// by its service's host (the ids a Hypervisor's status records).
    pub async fn compute_ids(&self) -> Result<std::collections::HashMap<String, (String, String)>, ApiError> {
        let services = get(&self.compute("os-services?binary=nova-compute"), &self.token, &self.mv()).await?;
        let mut ids: std::collections::HashMap<String, (String, String)> = Default::default();
        for s in services["services"].as_array().cloned().unwrap_or_default() {
            let host = s["host"].as_str().unwrap_or_default().to_string();
            ids.insert(host, (s["id"].as_str().unwrap_or_default().to_string(), String::new()));
        }
        let mut url = self.compute("os-hypervisors/detail?limit=1000");
        loop {
            // 2.87: from 2.88 on, each listed hypervisor costs an uptime call
            // to its nova-compute, and simulated hosts have none.
            let page = get(&url, &self.token, "compute 2.87").await?;
            for h in page["hypervisors"].as_array().cloned().unwrap_or_default() {
                let host = h["service"]["host"].as_str().unwrap_or_default();
                if let Some(entry) = ids.get_mut(host) {
                    entry.1 = h["id"].as_str().unwrap_or_default().to_string();
                }
            }
            let next = page["hypervisors_links"].as_array().and_then(|l| {
                l.iter().find(|x| x["rel"] == "next").and_then(|x| x["href"].as_str().map(str::to_string))
            });
            match next {
                Some(n) => url = n,
                None => return Ok(ids),
            }
        }
    }

    /// Nova's hypervisor record of `host` (2.53+: found by the service's
    /// host), if it has one.
    pub async fn hypervisor_of(&self, host: &str) -> Result<Option<Value>, ApiError> {
        let url = self.compute(&format!("os-hypervisors/detail?hypervisor_hostname_pattern={host}"));
        let v = match get(&url, &self.token, "compute 2.87").await {
            Ok(v) => v,
            Err(ApiError::Status { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let listed = v["hypervisors"].as_array().cloned().unwrap_or_default();
        Ok(listed.into_iter().find(|h| h["service"]["host"] == host))
    }

    /// Compute service and hypervisor records, with no nova-compute behind
    /// them, for `{prefix}00000` to `{prefix}{count-1:05}` (those missing),
    /// reported up while the region runs: the scale benchmark's hosts.
    pub async fn simulate_hosts(&self, prefix: &str, count: usize) -> Result<u64, ApiError> {
        let url = format!("{}/simulated-hosts", self.nova.control_url);
        let what = format!("POST {url}");
        let resp = reqwest::Client::new()
            .post(&url)
            .json(&json!({"prefix": prefix, "count": count}))
            .send()
            .await
            .map_err(|e| ApiError::Http(what.clone(), e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| ApiError::Http(what.clone(), e))?;
        if status != 200 {
            return Err(ApiError::Status { what, status, body: text });
        }
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        Ok(v["created"].as_u64().unwrap_or_default())
    }

    /// A resource provider `name` with `uuid` in Placement, as a new
    /// nova-compute creates for its hypervisor; one that exists is left.
    pub async fn ensure_provider(&self, name: &str, uuid: &str) -> Result<(), ApiError> {
        let url = format!("{}/resource_providers", self.nova.placement_url);
        let body = json!({"name": name, "uuid": uuid});
        match send(reqwest::Method::POST, &url, &self.token, "placement 1.20", Some(body)).await {
            Err(ApiError::Status { status: 409, .. }) => Ok(()),
            other => other.map(|_| ()),
        }
    }

    pub async fn create_aggregate(&self, name: &str) -> Result<i64, ApiError> {
        let body = json!({"aggregate": {"name": name}});
        let v =
            send(reqwest::Method::POST, &self.compute("os-aggregates"), &self.token, &self.mv(), Some(body))
                .await?;
        Ok(v["aggregate"]["id"].as_i64().unwrap_or_default())
    }

    /// Names of the aggregates `host` is in.
    pub async fn aggregates_of(&self, host: &str) -> Result<Vec<String>, ApiError> {
        let v = get(&self.compute("os-aggregates"), &self.token, &self.mv()).await?;
        let mut names = Vec::new();
        for a in v["aggregates"].as_array().cloned().unwrap_or_default() {
            let hosts = a["hosts"].as_array().cloned().unwrap_or_default();
            if hosts.iter().any(|h| h.as_str() == Some(host)) {
                names.push(a["name"].as_str().unwrap_or_default().to_string());
            }
        }
        Ok(names)
    }

    /// The nova-compute service record of `host` (`status`, `disabled_reason`, `id`), if any.
    pub async fn service(&self, host: &str) -> Result<Option<Value>, ApiError> {
        let url = self.compute(&format!("os-services?binary=nova-compute&host={host}"));
        let v = get(&url, &self.token, &self.mv()).await?;
        Ok(v["services"].as_array().and_then(|a| a.first().cloned()))
    }

    pub async fn set_service(&self, host: &str, body: Value) -> Result<(), ApiError> {
        let id = self.service(host).await?.map(|s| s["id"].as_str().unwrap_or_default().to_string());
        let url = self.compute(&format!("os-services/{}", id.unwrap_or_default()));
        send(reqwest::Method::PUT, &url, &self.token, &self.mv(), Some(body)).await.map(|_| ())
    }

    /// Traits on the resource provider named `host`.
    pub async fn traits_of(&self, host: &str) -> Result<Vec<String>, ApiError> {
        let (url, mv) = self.provider_traits(host).await?;
        let v = get(&url, &self.token, &mv).await?;
        Ok(v["traits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect())
    }

    /// The traits URL of the resource provider named `host`, and the
    /// microversion header to use on it.
    async fn provider_traits(&self, host: &str) -> Result<(String, String), ApiError> {
        let mv = format!("placement {}", self.nova.placement_microversion);
        let url = format!("{}/resource_providers?name={host}", self.nova.placement_url);
        let rps = get(&url, &self.token, &mv).await?;
        let uuid = rps["resource_providers"][0]["uuid"].as_str().unwrap_or_default().to_string();
        Ok((format!("{}/resource_providers/{uuid}/traits", self.nova.placement_url), mv))
    }

    /// Adds `trait_` to the resource provider named `host`, as an operator
    /// would by hand (read, then written under the provider's generation).
    pub async fn add_trait(&self, host: &str, trait_: &str) -> Result<(), ApiError> {
        self.change_traits(host, |t| t.push(trait_.to_string())).await
    }

    /// Takes `traits` off the resource provider named `host`.
    pub async fn remove_traits(&self, host: &str, traits: &[&str]) -> Result<(), ApiError> {
        self.change_traits(host, |t| t.retain(|x| !traits.contains(&x.as_str()))).await
    }

    async fn change_traits(&self, host: &str, change: impl FnOnce(&mut Vec<String>)) -> Result<(), ApiError> {
        let (url, mv) = self.provider_traits(host).await?;
        let v = get(&url, &self.token, &mv).await?;
        let mut traits: Vec<String> = v["traits"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect();
        let before = traits.clone();
        change(&mut traits);
        if traits == before {
            return Ok(());
        }
        let body = serde_json::json!({"traits": traits, "resource_provider_generation": v["resource_provider_generation"]});
        send(reqwest::Method::PUT, &url, &self.token, &mv, Some(body)).await.map(|_| ())
    }

    /// Boots a server on `host` (admin's `host` field, 2.74+) from the
    /// fixture image, without networks; answers its id once it is ACTIVE.
    pub async fn boot_on(&self, name: &str, host: &str, flavor: &str) -> Result<String, ApiError> {
        self.boot_in(name, host, flavor, None).await
    }

    /// The same, in the availability zone `zone` if given (the server is
    /// then pinned to it).
    pub async fn boot_in(
        &self,
        name: &str,
        host: &str,
        flavor: &str,
        zone: Option<&str>,
    ) -> Result<String, ApiError> {
        self.boot_image(name, host, flavor, zone, IMAGE).await
    }

    /// The same, from the fixture image `image`.
    pub async fn boot_image(
        &self,
        name: &str,
        host: &str,
        flavor: &str,
        zone: Option<&str>,
        image: &str,
    ) -> Result<String, ApiError> {
        let mut body = json!({"server": {"name": name, "imageRef": image,
            "flavorRef": flavor, "networks": "none", "host": host}});
        if let Some(z) = zone {
            body["server"]["availability_zone"] = json!(z);
        }
        let v = send(reqwest::Method::POST, &self.compute("servers"), &self.token, &self.mv(), Some(body))
            .await?;
        let id = v["server"]["id"].as_str().unwrap_or_default().to_string();
        self.wait_active(name, id).await
    }

    /// Boots a server onto `host` whatever its state (`nova:HOST`, an
    /// admin's forced host: no scheduler filter, so a disabled host too),
    /// as a server that lands on a host while it is being emptied.
    pub async fn boot_forced(&self, name: &str, host: &str, flavor: &str) -> Result<String, ApiError> {
        let body = json!({"server": {"name": name, "imageRef": IMAGE,
            "flavorRef": flavor, "networks": "none", "availability_zone": format!("nova:{host}")}});
        let v = send(reqwest::Method::POST, &self.compute("servers"), &self.token, &self.mv(), Some(body))
            .await?;
        let id = v["server"]["id"].as_str().unwrap_or_default().to_string();
        self.wait_active(name, id).await
    }

    /// Creates an anti-affinity server group that lets `max_per_host` of
    /// its members share a host (compute 2.64's `rules`); answers its id.
    pub async fn create_anti_affinity_group(
        &self,
        name: &str,
        max_per_host: u32,
    ) -> Result<String, ApiError> {
        let body = json!({"server_group": {"name": name, "policy": "anti-affinity",
            "rules": {"max_server_per_host": max_per_host}}});
        let v = send(
            reqwest::Method::POST,
            &self.compute("os-server-groups"),
            &self.token,
            &self.mv(),
            Some(body),
        )
        .await?;
        Ok(v["server_group"]["id"].as_str().unwrap_or_default().to_string())
    }

    /// Boots a server in server group `group` onto `host` of `zone`,
    /// through the scheduler and its group filters.
    pub async fn boot_in_group(
        &self,
        name: &str,
        (zone, host): (&str, &str),
        flavor: &str,
        group: &str,
    ) -> Result<String, ApiError> {
        let body = json!({"server": {"name": name, "imageRef": IMAGE, "flavorRef": flavor,
            "networks": "none", "availability_zone": zone, "host": host},
            "os:scheduler_hints": {"group": group}});
        let v = send(reqwest::Method::POST, &self.compute("servers"), &self.token, &self.mv(), Some(body))
            .await?;
        let id = v["server"]["id"].as_str().unwrap_or_default().to_string();
        self.wait_active(name, id).await
    }

    /// Waits up to 30 s for a booted server to be ACTIVE; ERROR is an error.
    async fn wait_active(&self, name: &str, id: String) -> Result<String, ApiError> {
        for _ in 0..300 {
            let s = self.server(&id).await?;
            match s["status"].as_str() {
                Some("ACTIVE") => return Ok(id),
                Some("ERROR") => {
                    return Err(ApiError::Status {
                        what: format!("boot {name}"),
                        status: 500,
                        body: s.to_string(),
                    });
                }
                _ => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
            }
        }
        Err(ApiError::Status {
            what: format!("boot {name}"),
            status: 408,
            body: "not ACTIVE within 30s".into(),
        })
    }

    /// The ids of every server Nova shows on `host`, all projects.
    pub async fn servers_on(&self, host: &str) -> Result<Vec<String>, ApiError> {
        let url = self.compute(&format!("servers?host={host}&all_tenants=1"));
        let v = get(&url, &self.token, &self.mv()).await?;
        Ok(v["servers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["id"].as_str().map(str::to_string))
            .collect())
    }

    pub async fn server(&self, id: &str) -> Result<Value, ApiError> {
        Ok(get(&self.compute(&format!("servers/{id}")), &self.token, &self.mv()).await?["server"].clone())
    }

    /// Creates an aggregate that is also an availability zone.
    pub async fn create_zone(&self, name: &str) -> Result<i64, ApiError> {
        let body = json!({"aggregate": {"name": name, "availability_zone": name}});
        let v =
            send(reqwest::Method::POST, &self.compute("os-aggregates"), &self.token, &self.mv(), Some(body))
                .await?;
        Ok(v["aggregate"]["id"].as_i64().unwrap_or_default())
    }

    /// Every aggregate: (id, name, availability zone, hosts).
    pub async fn aggregates(&self) -> Result<Vec<(i64, String, Option<String>, Vec<String>)>, ApiError> {
        let v = get(&self.compute("os-aggregates"), &self.token, &self.mv()).await?;
        Ok(v["aggregates"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let hosts = a["hosts"].as_array().into_iter().flatten();
                (
                    a["id"].as_i64().unwrap_or_default(),
                    a["name"].as_str().unwrap_or_default().to_string(),
                    a["availability_zone"].as_str().map(str::to_string),
                    hosts.filter_map(|h| h.as_str().map(str::to_string)).collect(),
                )
            })
            .collect())
    }

    pub async fn add_to_aggregate(&self, id: i64, host: &str) -> Result<(), ApiError> {
        let body = json!({"add_host": {"host": host}});
        let url = self.compute(&format!("os-aggregates/{id}/action"));
        send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(body)).await.map(|_| ())
    }

    pub async fn remove_from_aggregate(&self, id: i64, host: &str) -> Result<(), ApiError> {
        let body = json!({"remove_host": {"host": host}});
        let url = self.compute(&format!("os-aggregates/{id}/action"));
        send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(body)).await.map(|_| ())
    }

    /// Creates a flavor with `extra_specs`; answers its id.
    pub async fn create_flavor(
        &self,
        name: &str,
        ram_mb: u64,
        extra_specs: Value,
    ) -> Result<String, ApiError> {
        let body = json!({"flavor": {"name": name, "ram": ram_mb, "vcpus": 1, "disk": 1}});
        let v = send(reqwest::Method::POST, &self.compute("flavors"), &self.token, &self.mv(), Some(body))
            .await?;
        let id = v["flavor"]["id"].as_str().unwrap_or_default().to_string();
        if extra_specs.as_object().is_some_and(|o| !o.is_empty()) {
            let url = self.compute(&format!("flavors/{id}/os-extra_specs"));
            let body = json!({"extra_specs": extra_specs});
            send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(body)).await?;
        }
        Ok(id)
    }

    /// Hosts of enabled, up nova-compute services.
    pub async fn enabled_hosts(&self) -> Result<Vec<String>, ApiError> {
        let v = get(&self.compute("os-services?binary=nova-compute"), &self.token, &self.mv()).await?;
        Ok(v["services"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["status"] == "enabled" && s["state"] == "up")
            .filter_map(|s| s["host"].as_str().map(str::to_string))
            .collect())
    }

    /// Stops a server; answers once Nova shows it SHUTOFF.
    pub async fn stop(&self, id: &str) -> Result<(), ApiError> {
        let url = self.compute(&format!("servers/{id}/action"));
        send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(json!({"os-stop": null}))).await?;
        for _ in 0..300 {
            if self.server(id).await?["status"] == "SHUTOFF" {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(ApiError::Status {
            what: format!("stop {id}"),
            status: 408,
            body: "not SHUTOFF within 30s".into(),
        })
    }

    /// Sets one metadata key on a server.
    pub async fn set_metadata(&self, id: &str, key: &str, value: &str) -> Result<(), ApiError> {
        let body = json!({"metadata": {key: value}});
        let url = self.compute(&format!("servers/{id}/metadata"));
        send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(body)).await.map(|_| ())
    }

    /// Live-migrates a server to a host the scheduler picks (an admin doing
    /// it by hand, not the eviction).
    pub async fn live_migrate(&self, id: &str) -> Result<(), ApiError> {
        let body = json!({"os-migrateLive": {"host": null, "block_migration": "auto"}});
        let url = self.compute(&format!("servers/{id}/action"));
        send(reqwest::Method::POST, &url, &self.token, &self.mv(), Some(body)).await.map(|_| ())
    }

    /// Live-migrates `id` onto `host` past the scheduler, as an operator
    /// can at compute 2.67 (`force`): the one way a server still lands on a
    /// host that is disabled. Waits until it is ACTIVE there.
    pub async fn live_migrate_forced(&self, id: &str, host: &str) -> Result<(), ApiError> {
        let body = json!({"os-migrateLive": {"host": host, "block_migration": "auto", "force": true}});
        let url = self.compute(&format!("servers/{id}/action"));
        send(reqwest::Method::POST, &url, &self.token, "compute 2.67", Some(body)).await?;
        for _ in 0..600 {
            let s = self.server(id).await?;
            if s["status"] == "ACTIVE" && s["OS-EXT-SRV-ATTR:host"].as_str() == Some(host) {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(ApiError::Status {
            what: format!("move {id} to {host}"),
            status: 408,
            body: "not there within 60s".into(),
        })
    }

    /// Nova's migrations of one server (`migration_type`, `status`, ...).
    pub async fn migrations_of(&self, id: &str) -> Result<Vec<Value>, ApiError> {
        let url = self.compute(&format!("os-migrations?instance_uuid={id}"));
        Ok(get(&url, &self.token, &self.mv()).await?["migrations"].as_array().cloned().unwrap_or_default())
    }

    /// The names of the actions Nova recorded on a server, oldest first
    /// (`live-migration`, `live_migration_force_complete`, ...).
    pub async fn actions_of(&self, id: &str) -> Result<Vec<String>, ApiError> {
        let url = self.compute(&format!("servers/{id}/os-instance-actions"));
        let list = get(&url, &self.token, &self.mv()).await?["instanceActions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let mut named: Vec<(String, String)> = list
            .iter()
            .map(|a| {
                (
                    a["start_time"].as_str().unwrap_or_default().to_string(),
                    a["action"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        named.sort();
        Ok(named.into_iter().map(|(_, a)| a).collect())
    }

    /// The server's metadata.
    pub async fn metadata_of(&self, id: &str) -> Result<serde_json::Map<String, Value>, ApiError> {
        let url = self.compute(&format!("servers/{id}/metadata"));
        Ok(get(&url, &self.token, &self.mv()).await?["metadata"].as_object().cloned().unwrap_or_default())
    }

    /// The resource providers named `host` (none once it is deleted).
    pub async fn providers_named(&self, host: &str) -> Result<Vec<Value>, ApiError> {
        let mv = format!("placement {}", self.nova.placement_microversion);
        let url = format!("{}/resource_providers?name={host}", self.nova.placement_url);
        Ok(get(&url, &self.token, &mv).await?["resource_providers"].as_array().cloned().unwrap_or_default())
    }

    pub async fn delete_server(&self, id: &str) -> Result<(), ApiError> {
        send(reqwest::Method::DELETE, &self.compute(&format!("servers/{id}")), &self.token, &self.mv(), None)
            .await
            .map(|_| ())
    }
}

/// What the region's control port can do to a fake host's nova-compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeHost {
    /// Stop it: Nova's service group sees it down after `service_down_time`.
    Stop,
    /// Start it (again); a host whose compute service was deleted registers
    /// a new one, as a re-installed host does.
    Start,
}

/// Acts on the fake host `host` through the region's control port.
pub async fn fake_host(nova: &crate::env::Nova, host: &str, what: FakeHost) -> Result<(), ApiError> {
    let verb = match what {
        FakeHost::Stop => "stop",
        FakeHost::Start => "start",
    };
    let url = format!("{}/hosts/{host}/{verb}", nova.control_url);
    let what = format!("POST {url}");
    let resp = reqwest::Client::new().post(&url).send().await.map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Err(ApiError::Status { what, status, body });
    }
    Ok(())
}

/// Lets Nova run up to `at_once` live migrations at once from the next one
/// on (its `max_concurrent_live_migrations`, region-wide on the ground: see
/// the region's control port). For a benchmark that has the ground to itself.
pub async fn live_migrations_at_once(nova: &crate::env::Nova, at_once: u32) -> Result<(), ApiError> {
    control_post(nova, "live-migrations", json!({"at_once": at_once})).await
}

/// Holds `server`'s live migrations from the next one on: each runs
/// `seconds` unless aborted, or forced to complete where `obey_force` (a
/// guest whose memory changes faster than it is copied; see the region's
/// control port).
pub async fn hold_live_migrations(
    nova: &crate::env::Nova,
    server: &str,
    seconds: u32,
    obey_force: bool,
) -> Result<(), ApiError> {
    let body = json!({"server": server, "seconds": seconds, "obey_force": obey_force});
    control_post(nova, "live-migrations/hold", body).await
}

/// POSTs `body` to the region's control port at `path`.
async fn control_post(nova: &crate::env::Nova, path: &str, body: Value) -> Result<(), ApiError> {
    let url = format!("{}/{path}", nova.control_url);
    let what = format!("POST {url}");
    let resp = reqwest::Client::new()
        .post(&url)
        .json(&body)
        .send()
        .await
        .map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Err(ApiError::Status { what, status, body });
    }
    Ok(())
}

/// The fake hosts whose nova-compute is stopped now.
pub async fn stopped_fake_hosts(nova: &crate::env::Nova) -> Result<Vec<String>, ApiError> {
    let url = format!("{}/hosts", nova.control_url);
    let what = format!("GET {url}");
    let resp = reqwest::get(&url).await.map_err(|e| ApiError::Http(what.clone(), e))?;
    let status = resp.status().as_u16();
    if status != 200 {
        let body = resp.text().await.unwrap_or_default();
        return Err(ApiError::Status { what, status, body });
    }
    let states: std::collections::BTreeMap<String, String> =
        resp.json().await.map_err(|e| ApiError::Http(what.clone(), e))?;
    Ok(states.into_iter().filter(|(_, s)| s == "stopped").map(|(h, _)| h).collect())
}

/// One request the Nova API took, from its request log.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct NovaRequest {
    pub at: jiff::Timestamp,
    pub method: String,
    pub path: String,
    pub status: Option<u16>,
    pub user_agent: String,
}

/// Every request the ground's Nova API took so far (its own log, written as
/// each request arrives).
pub fn nova_requests(env: &crate::env::TestEnv) -> Vec<NovaRequest> {
    let text = std::fs::read_to_string(env.dir.join("logs/nova-api-requests.jsonl")).unwrap_or_default();
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}
