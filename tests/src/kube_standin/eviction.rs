//! The `eviction` subresource of pods, as `kubectl drain` uses it: the
//! validating admission webhooks registered for `pods/eviction` are called
//! over HTTPS with an `AdmissionReview`, then the pod's
//! PodDisruptionBudget is checked, then the pod is deleted.
//!
//! As the API server does: a webhook's denial is the answer (its status
//! code, at least 400, and "admission webhook NAME denied the request:
//! MESSAGE"); a webhook that cannot be called is skipped under
//! `failurePolicy: Ignore` and fails the eviction otherwise; a budget with
//! no disruption left is 429 "Cannot evict pod as it would violate the
//! pod's disruption budget."; a pod with more than one budget is 500.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{ValidatingWebhook, ValidatingWebhookConfiguration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::store::{ApiError, Key, Store};

fn index(s: &Store, group: &str, plural: &str) -> Option<usize> {
    s.types.iter().position(|t| t.group == group && t.plural == plural)
}

/// Whether a rule of `hook` covers a CREATE of `pods/eviction` in v1.
fn covers(hook: &ValidatingWebhook) -> bool {
    let any = |v: &Option<Vec<String>>, want: &str| v.iter().flatten().any(|x| x == "*" || x == want);
    hook.rules.iter().flatten().any(|r| {
        any(&r.operations, "CREATE")
            && any(&r.api_groups, "")
            && any(&r.api_versions, "v1")
            && r.resources
                .iter()
                .flatten()
                .any(|x| ["pods/eviction", "*/eviction", "*/*"].contains(&x.as_str()))
    })
}

fn reason(code: u16) -> &'static str {
    match code {
        429 => "TooManyRequests",
        403 => "Forbidden",
        400..=499 => "BadRequest",
        _ => "InternalError",
    }
}

pub(super) async fn evict(
    store: &Mutex<Store>,
    pod_key: &Key,
    body: &[u8],
    now: &str,
) -> Result<(u16, Value), ApiError> {
    let eviction: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, "BadRequest", format!("the body is not an Eviction: {e}")))?;
    if eviction.pointer("/metadata/name").and_then(Value::as_str).is_some_and(|n| n != pod_key.2) {
        return Err(ApiError::new(400, "BadRequest", "name in URL does not match name in Eviction object"));
    }
    // A server-side dry run (`kubectl drain --dry-run=server`) deletes nothing.
    let dry_run =
        eviction.pointer("/deleteOptions/dryRun").and_then(Value::as_array).is_some_and(|d| !d.is_empty());
    let (pod, hooks) = {
        let s = store.lock().await;
        let pod = s.get(pod_key)?;
        let hooks: Vec<ValidatingWebhook> =
            match index(&s, "admissionregistration.k8s.io", "validatingwebhookconfigurations") {
                Some(i) => s
                    .list(i, None)
                    .into_iter()
                    .filter_map(|c| serde_json::from_value::<ValidatingWebhookConfiguration>(c).ok())
                    .flat_map(|c| c.webhooks.unwrap_or_default())
                    .filter(covers)
                    .collect(),
                None => Vec::new(),
            };
        (pod, hooks)
    };
    // The webhooks, without the store's lock: they may read it back.
    let review = review(pod_key, &eviction, dry_run, now)?;
    for hook in &hooks {
        match call(hook, &review).await {
            Ok(resp) if resp.pointer("/response/allowed") == Some(&json!(true)) => {}
            Ok(resp) => {
                let status = resp.pointer("/response/status").cloned().unwrap_or(Value::Null);
                let code = status.get("code").and_then(Value::as_u64).unwrap_or(0).clamp(400, 599) as u16;
                let said = status.get("message").and_then(Value::as_str).unwrap_or("without explanation");
                return Err(ApiError::new(
                    code,
                    reason(code),
                    format!("admission webhook \"{}\" denied the request: {said}", hook.name),
                ));
            }
            Err(e) if hook.failure_policy.as_deref() == Some("Ignore") => {
                eprintln!("kube stand-in: webhook {} failed, ignored: {e}", hook.name);
            }
            Err(e) => {
                return Err(ApiError::new(
                    500,
                    "InternalError",
                    format!("Internal error occurred: failed calling webhook \"{}\": {e}", hook.name),
                ));
            }
        }
    }
    let mut s = store.lock().await;
    let pod = s.get(pod_key).map(|_| pod)?;
    if pod.pointer("/metadata/deletionTimestamp").is_none() {
        check_budgets(&s, pod_key, &pod)?;
        if !dry_run {
            s.delete(pod_key, now, false)?;
        }
    }
    Ok((201, json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})))
}

/// The `AdmissionReview` the API server sends a webhook for an eviction,
/// built from kube's own types (the ones a webhook parses it with).
fn review(pod_key: &Key, eviction: &Value, dry_run: bool, now: &str) -> Result<Value, ApiError> {
    use k8s_openapi::api::policy::v1::Eviction;
    use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
    use kube::core::{GroupVersionKind, GroupVersionResource, TypeMeta};
    let object: Eviction = serde_json::from_value(eviction.clone())
        .map_err(|e| ApiError::new(400, "BadRequest", format!("the body is not an Eviction: {e}")))?;
    let kind = GroupVersionKind::gvk("policy", "v1", "Eviction");
    let resource = GroupVersionResource::gvr("", "v1", "pods");
    let options = json!({"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"});
    let request = AdmissionRequest::<Eviction> {
        types: TypeMeta { api_version: "admission.k8s.io/v1".into(), kind: "AdmissionReview".into() },
        uid: format!("{}-{now}", pod_key.2),
        kind: kind.clone(),
        resource: resource.clone(),
        sub_resource: Some("eviction".into()),
        request_kind: Some(kind),
        request_resource: Some(resource),
        request_sub_resource: Some("eviction".into()),
        name: pod_key.2.clone(),
        namespace: Some(pod_key.1.clone()),
        operation: Operation::Create,
        user_info: k8s_openapi::api::authentication::v1::UserInfo {
            username: Some("kubectl".into()),
            ..Default::default()
        },
        object: Some(object),
        old_object: None,
        dry_run,
        options: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(options)),
    };
    let review = AdmissionReview {
        types: TypeMeta { api_version: "admission.k8s.io/v1".into(), kind: "AdmissionReview".into() },
        request: Some(request),
        response: None,
    };
    serde_json::to_value(review).map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}

async fn call(hook: &ValidatingWebhook, review: &Value) -> Result<Value, String> {
    let cfg = &hook.client_config;
    let url = cfg.url.as_deref().ok_or("only clientConfig.url is served here, not a service")?;
    let timeout = Duration::from_secs(hook.timeout_seconds.unwrap_or(10).clamp(1, 30) as u64);
    let mut b = reqwest::Client::builder().timeout(timeout).no_proxy();
    if let Some(ca) = &cfg.ca_bundle {
        b = b.tls_certs_only(reqwest::Certificate::from_pem_bundle(&ca.0).map_err(|e| e.to_string())?);
    }
    let client = b.build().map_err(|e| e.to_string())?;
    let resp = client.post(url).json(review).send().await.map_err(|e| hv_tls::explain(&e))?;
    if !resp.status().is_success() {
        return Err(format!("the webhook answered {}", resp.status()));
    }
    resp.json::<Value>().await.map_err(|e| e.to_string())
}

/// The pod's PodDisruptionBudget, if it has one, must allow a disruption.
fn check_budgets(s: &Store, pod_key: &Key, pod: &Value) -> Result<(), ApiError> {
    let Some(pdbs) = index(s, "policy", "poddisruptionbudgets") else { return Ok(()) };
    let labels = |o: &Value| -> std::collections::BTreeMap<String, String> {
        o.pointer("/metadata/labels")
            .cloned()
            .and_then(|l| serde_json::from_value(l).ok())
            .unwrap_or_default()
    };
    let budgets: Vec<PodDisruptionBudget> = s
        .list(pdbs, Some(&pod_key.1))
        .into_iter()
        .filter_map(|b| serde_json::from_value::<PodDisruptionBudget>(b).ok())
        .filter(|b| {
            b.spec.as_ref().and_then(|s| s.selector.as_ref()).is_some_and(|sel| selects(sel, &labels(pod)))
        })
        .collect();
    let budget = match budgets.as_slice() {
        [] => return Ok(()),
        [b] => b,
        _ => {
            return Err(ApiError::new(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            ));
        }
    };
    let spec = budget.spec.clone().unwrap_or_default();
    let Some(sel) = spec.selector.as_ref() else { return Ok(()) };
    let matched: Vec<Value> = s
        .list(pod_key.0, Some(&pod_key.1))
        .into_iter()
        .filter(|p| p.pointer("/metadata/deletionTimestamp").is_none() && selects(sel, &labels(p)))
        .collect();
    let ready = |p: &Value| {
        p.pointer("/status/conditions").and_then(Value::as_array).into_iter().flatten().any(|c| {
            c.get("type").and_then(Value::as_str) == Some("Ready")
                && c.get("status").and_then(Value::as_str) == Some("True")
        })
    };
    let expected = matched.len() as i64;
    let healthy = matched.iter().filter(|p| ready(p)).count() as i64;
    let scaled = |v: &IntOrString| match v {
        IntOrString::Int(n) => i64::from(*n),
        IntOrString::String(p) => {
            let pct = p.trim_end_matches('%').parse::<i64>().unwrap_or(0);
            (pct * expected + 99) / 100
        }
    };
    let allowed = match (&spec.min_available, &spec.max_unavailable) {
        (Some(min), _) => healthy - scaled(min),
        (None, Some(max)) => healthy - (expected - scaled(max)),
        (None, None) => healthy - expected,
    };
    if allowed < 1 {
        return Err(ApiError::new(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
        ));
    }
    Ok(())
}

/// A LabelSelector (matchLabels and matchExpressions) over `labels`.
fn selects(sel: &LabelSelector, labels: &std::collections::BTreeMap<String, String>) -> bool {
    let by_labels = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    by_labels && by_exprs
}
