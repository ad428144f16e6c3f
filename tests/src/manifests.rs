//! Rendered chart manifests checked against the Kubernetes API types of
//! k8s-openapi: each object is read into its typed struct and written back;
//! a field the type does not know (a typo, a wrong level of indentation in
//! a template) is lost on the way and named. Objects of other operators'
//! CRDs (cert-manager, Prometheus operator) are checked for their shape
//! only: k8s-openapi has no types for them.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

/// Kinds of other operators' CRDs the chart may render.
const FOREIGN: &[(&str, &str)] = &[
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
];

/// The paths in `original` that `roundtrip` lost.
fn lost(original: &Value, roundtrip: &Value, path: &str, out: &mut Vec<String>) {
    match (original, roundtrip) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let here = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => lost(v, w, &here, out),
                    // An empty value the type leaves out is not a lost field.
                    None if v.is_null() || v == &Value::Object(Default::default()) => {}
                    None if v.as_array().is_some_and(Vec::is_empty) => {}
                    None => out.push(here),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> Result<(), String> {
    let t: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    lost(v, &back, "", &mut out);
    if out.is_empty() { Ok(()) } else { Err(format!("fields the API does not know: {}", out.join(", "))) }
}

/// Checks one object; `Ok` names what it is.
pub fn check(v: &Value) -> Result<String, String> {
    let api = v["apiVersion"].as_str().unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or_default();
    let name = v["metadata"]["name"].as_str().unwrap_or_default();
    let what = format!("{kind} {name} ({api})");
    if name.is_empty() {
        return Err(format!("{what}: no metadata.name"));
    }
    let r = match (api, kind) {
        ("v1", "ServiceAccount") => typed::<ServiceAccount>(v),
        ("v1", "Service") => typed::<Service>(v),
        ("v1", "ConfigMap") => typed::<ConfigMap>(v),
        ("v1", "Secret") => typed::<Secret>(v),
        // The chart's `helm test` hook.
        ("v1", "Pod") => typed::<Pod>(v),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => typed::<CustomResourceDefinition>(v),
        ("apps/v1", "Deployment") => typed::<Deployment>(v),
        ("apps/v1", "DaemonSet") => typed::<DaemonSet>(v),
        ("policy/v1", "PodDisruptionBudget") => typed::<PodDisruptionBudget>(v),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>(v)
        }
        ("flowcontrol.apiserver.k8s.io/v1", "FlowSchema") => {
            typed::<k8s_openapi::api::flowcontrol::v1::FlowSchema>(v)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>(v)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            typed::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>(v)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed::<ClusterRole>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => typed::<ClusterRoleBinding>(v),
        ("rbac.authorization.k8s.io/v1", "Role") => typed::<Role>(v),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed::<RoleBinding>(v),
        _ if FOREIGN.contains(&(api, kind)) => {
            if v["spec"].is_object() {
                Ok(())
            } else {
                Err("no spec object".into())
            }
        }
        _ => Err("a kind this check does not know".into()),
    };
    r.map(|()| what.clone()).map_err(|e| format!("{what}: {e}"))
}

/// Every object of a multi-document YAML text (empty documents skipped).
pub fn objects(yaml: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).map_err(|e| e.to_string())?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_misplaced_field_is_named_and_a_good_object_passes() {
        let good = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: c}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          image: i
          readinessProbe: {httpGet: {path: /readyz, port: metrics}}
"#;
        let objs = objects(&format!("{good}\n---\n")).unwrap();
        assert_eq!(objs.len(), 1);
        assert!(check(&objs[0]).is_ok(), "{:?}", check(&objs[0]));
        // A typo in a field name.
        let bad = good.replace("readinessProbe: {httpGet:", "readinessProbe: {httpGett:");
        let e = check(&objects(&bad).unwrap()[0]).unwrap_err();
        assert!(e.contains(".spec.template.spec.containers[0].readinessProbe.httpGett"), "{e}");
        let unknown = "apiVersion: v1\nkind: Binding\nmetadata: {name: p}\n";
        assert!(check(&objects(unknown).unwrap()[0]).unwrap_err().contains("does not know"));
        let wrong_type = good.replace("image: i", "image: [i]");
        assert!(check(&objects(&wrong_type).unwrap()[0]).is_err());
    }
}
