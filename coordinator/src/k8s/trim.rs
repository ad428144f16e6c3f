//! What the caches drop of each object before keeping it.
//!
//! The coordinator keeps every selected Node, every Hypervisor, Eviction
//! and Migration in memory, thousands of them in a large region. Of a real
//! Node it reads the conditions, the cordon, labels and annotations; the
//! API server also sends its managed fields and, in its status, the list of
//! every container image on the host and its volumes: often tens of KiB a
//! Node, read by nobody here. The managed fields of our own objects (a few
//! KiB each) are dropped the same way. The caches are read, never written
//! back whole, so nothing dropped here reaches the API server.

use k8s_openapi::api::core::v1::Node;
use kube::Resource;

/// Drops the managed fields of any object.
pub fn unmanaged<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// Drops a Node's managed fields, image list and volumes.
pub fn node(n: &mut Node) {
    unmanaged(n);
    if let Some(status) = n.status.as_mut() {
        status.images = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_keeps_what_the_lifecycle_reads_and_loses_the_rest() {
        let mut n: Node = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "compute-1",
                "labels": {"hypervisor.cloud.sap/managed": "true"},
                "annotations": {"hypervisor.cloud.sap/maintenance-required": "true"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                                   "fieldsV1": {"f:status": {}}}]
            },
            "spec": {"unschedulable": true},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["registry.example/nova-compute:1"], "sizeBytes": 1}],
                "volumesInUse": ["kubernetes.io/csi/x"],
                "volumesAttached": [{"name": "kubernetes.io/csi/x", "devicePath": ""}]
            }
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let before = crate::k8s::hypervisor::node_obs(&n, &Default::default());
        node(&mut n);
        assert_eq!(
            before,
            crate::k8s::hypervisor::node_obs(&n, &Default::default()),
            "what the lifecycle reads"
        );
        assert!(n.metadata.managed_fields.is_none());
        let status = n.status.as_ref().unwrap_or_else(|| panic!("status kept"));
        assert!(
            status.images.is_none() && status.volumes_in_use.is_none() && status.volumes_attached.is_none()
        );
        assert_eq!(status.addresses.as_ref().map(Vec::len), Some(1));
        assert_eq!(n.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
        assert!(n.metadata.labels.is_some() && n.metadata.annotations.is_some());
    }
}
