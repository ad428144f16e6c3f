//! The resource types the stand-in serves: built-ins and the project's CRDs.

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub status_subresource: bool,
    pub short_names: Vec<String>,
    /// JSON paths (dot-separated) of lists merged by key under apply, with their keys.
    pub map_lists: Vec<(String, Vec<String>)>,
    /// Printer columns for `kubectl get` (after NAME), from the CRD.
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub type_: String,
    /// A simple `.a.b.c` path.
    pub json_path: String,
    pub priority: i32,
}

impl ResourceType {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    fn builtin(group: &str, version: &str, plural: &str, kind: &str, namespaced: bool, status: bool) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            status_subresource: status,
            short_names: Vec::new(),
            map_lists: vec![("status.conditions".into(), vec!["type".into()])],
            columns: vec![Column {
                name: "Age".into(),
                type_: "date".into(),
                json_path: ".metadata.creationTimestamp".into(),
                priority: 0,
            }],
        }
    }
}

pub fn builtins() -> Vec<ResourceType> {
    vec![
        ResourceType::builtin("", "v1", "nodes", "Node", false, true),
        ResourceType::builtin("", "v1", "pods", "Pod", true, true),
        ResourceType::builtin("", "v1", "namespaces", "Namespace", false, true),
        ResourceType::builtin("", "v1", "secrets", "Secret", true, false),
        ResourceType::builtin("", "v1", "events", "Event", true, false),
        ResourceType::builtin("events.k8s.io", "v1", "events", "Event", true, false),
        ResourceType::builtin("coordination.k8s.io", "v1", "leases", "Lease", true, false),
        ResourceType::builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", true, true),
        ResourceType::builtin("apps", "v1", "daemonsets", "DaemonSet", true, true),
        ResourceType::builtin("apps", "v1", "statefulsets", "StatefulSet", true, true),
        ResourceType::builtin(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "ValidatingWebhookConfiguration",
            false,
            false,
        ),
    ]
}

/// Every CRD YAML file in `dir`, as resource types (served versions only).
pub fn from_crd_dir(dir: &Path) -> Result<Vec<ResourceType>, String> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        let crd: CustomResourceDefinition =
            serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for v in crd.spec.versions.iter().filter(|v| v.served) {
            let mut map_lists = Vec::new();
            if let Some(schema) = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()) {
                collect_map_lists(schema, "", &mut map_lists);
            }
            out.push(ResourceType {
                group: crd.spec.group.clone(),
                version: v.name.clone(),
                plural: crd.spec.names.plural.clone(),
                singular: crd
                    .spec
                    .names
                    .singular
                    .clone()
                    .unwrap_or_else(|| crd.spec.names.kind.to_lowercase()),
                kind: crd.spec.names.kind.clone(),
                namespaced: crd.spec.scope == "Namespaced",
                status_subresource: v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(),
                short_names: crd.spec.names.short_names.clone().unwrap_or_default(),
                map_lists,
                columns: v
                    .additional_printer_columns
                    .iter()
                    .flatten()
                    .map(|c| Column {
                        name: c.name.clone(),
                        type_: c.type_.clone(),
                        json_path: c.json_path.clone(),
                        priority: c.priority.unwrap_or(0),
                    })
                    .collect(),
            });
        }
    }
    Ok(out)
}

fn collect_map_lists(s: &JSONSchemaProps, path: &str, out: &mut Vec<(String, Vec<String>)>) {
    if s.x_kubernetes_list_type.as_deref() == Some("map") {
        out.push((path.to_string(), s.x_kubernetes_list_map_keys.clone().unwrap_or_default()));
    }
    for (k, v) in s.properties.iter().flatten() {
        let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
        collect_map_lists(v, &p, out);
    }
}
