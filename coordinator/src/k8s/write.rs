//! The one way this coordinator writes to Kubernetes objects it does not
//! create whole: their status, and a finalizer of ours.
//!
//! - **Status** is written by server-side apply under our field manager,
//!   carrying the resourceVersion the reconcile read: a write over an object
//!   that changed since (a newer leader's write, an SRE's edit) is a 409 and
//!   the reconcile runs again on fresh data. A deposed leader therefore
//!   cannot overwrite the new leader's status.
//! - **Finalizers** are added and removed by a JSON patch that first tests
//!   the resourceVersion: a concurrent change to the list is a conflict
//!   (read again, try again), never a lost finalizer of somebody else.
//! - **A maintenance** the coordinator sets on a Hypervisor (health's `ha`)
//!   is the same JSON patch over the version read: an SRE's own edit since
//!   is a conflict, never overwritten.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::FIELD_MANAGER;

/// Writes `status` of `name`, over the version `read` (None: no precondition,
/// for objects only this coordinator ever writes, such as a Migration it
/// just created).
pub async fn status<K>(
    api: &Api<K>,
    name: &str,
    read: Option<&str>,
    status: &impl Serialize,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(rv) = read {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch)).await
}

/// The JSON patch that adds (`present`) or removes `finalizer` on `obj` as
/// read, or None when it is already so.
pub fn finalizer_patch<K: Resource>(obj: &K, finalizer: &str, present: bool) -> Option<json_patch::Patch> {
    let list = obj.meta().finalizers.clone().unwrap_or_default();
    let at = list.iter().position(|f| f == finalizer);
    let rv = obj.meta().resource_version.clone().unwrap_or_default();
    let test = serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv});
    let change = match (present, at) {
        (true, Some(_)) | (false, None) => return None,
        (true, None) if obj.meta().finalizers.is_none() => {
            serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
        }
        (true, None) => {
            serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
        }
        (false, Some(i)) => serde_json::json!({"op": "remove", "path": format!("/metadata/finalizers/{i}")}),
    };
    serde_json::from_value(serde_json::json!([test, change])).ok()
}

/// Adds or removes our `finalizer`; on a conflict reads the object again
/// and retries (a few times; after that the error is the caller's, and the
/// next reconcile tries again). Answers the object as written, or None when
/// nothing had to change (or it is gone).
pub async fn finalizer<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    present: bool,
) -> Result<Option<K>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut obj = obj.clone();
    let mut last = None;
    for _ in 0..3 {
        let Some(patch) = finalizer_patch(&obj, finalizer, present) else { return Ok(None) };
        let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        match api.patch(&obj.name_any(), &pp, &Patch::<()>::Json(patch)).await {
            Ok(written) => return Ok(Some(written)),
            // 409: the version moved; 422: the test op failed (same meaning).
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => {
                match api.get_opt(&obj.name_any()).await? {
                    Some(fresh) => obj = fresh,
                    None => return Ok(None),
                }
                last = Some(kube::Error::Api(e));
            }
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    tracing::warn!(object = %obj.name_any(), finalizer, "the finalizers kept changing; will try again");
    Err(last.unwrap_or_else(|| kube::Error::Service("finalizer: the object kept changing".into())))
}

/// Removes the owner reference to `owner_uid` from `obj`, leaving any
/// other, over the version read (a conflict is the caller's to retry).
pub async fn drop_owner<K>(api: &Api<K>, obj: &K, owner_uid: &str) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(patch) = drop_owner_patch(obj, owner_uid) else { return Ok(()) };
    let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    api.patch(&obj.name_any(), &pp, &Patch::<()>::Json(patch)).await.map(|_| ())
}

/// The JSON patch that removes the owner reference to `owner_uid`, or None
/// when `obj` has none.
pub fn drop_owner_patch<K: Resource>(obj: &K, owner_uid: &str) -> Option<json_patch::Patch> {
    let at = obj.meta().owner_references.as_ref()?.iter().position(|o| o.uid == owner_uid)?;
    let rv = obj.meta().resource_version.clone().unwrap_or_default();
    serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "remove", "path": format!("/metadata/ownerReferences/{at}")},
    ]))
    .ok()
}

/// Sets `spec.maintenance` to `mode` with `reason` over the version of `hv`
/// read (a conflict is the caller's: decide again on fresh data).
pub async fn maintenance(
    api: &Api<crate::api::Hypervisor>,
    hv: &crate::api::Hypervisor,
    mode: crate::api::MaintenanceMode,
    reason: &str,
) -> Result<crate::api::Hypervisor, kube::Error> {
    let rv = hv.meta().resource_version.clone().unwrap_or_default();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/spec/maintenance", "value": mode.as_str()},
        {"op": "add", "path": "/spec/maintenanceReason", "value": reason},
    ]))
    .map_err(kube::Error::SerdeError)?;
    let pp = PatchParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    api.patch(&hv.name_any(), &pp, &Patch::<()>::Json(patch)).await
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn cm(finalizers: Option<&[&str]>) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some("x".into());
        c.metadata.resource_version = Some("7".into());
        c.metadata.finalizers = finalizers.map(|f| f.iter().map(|s| s.to_string()).collect());
        c
    }

    fn ops(p: Option<json_patch::Patch>) -> serde_json::Value {
        serde_json::to_value(p).unwrap_or_default()
    }

    #[test]
    fn finalizer_patches_test_the_version_and_touch_only_our_entry() {
        let add_first = ops(finalizer_patch(&cm(None), "ours", true));
        assert_eq!(
            add_first[0],
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(add_first[1]["path"], "/metadata/finalizers");
        let add = ops(finalizer_patch(&cm(Some(&["theirs"])), "ours", true));
        assert_eq!(
            add[1],
            serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": "ours"})
        );
        let remove = ops(finalizer_patch(&cm(Some(&["theirs", "ours"])), "ours", false));
        assert_eq!(remove[1], serde_json::json!({"op": "remove", "path": "/metadata/finalizers/1"}));
        assert!(finalizer_patch(&cm(Some(&["ours"])), "ours", true).is_none());
        assert!(finalizer_patch(&cm(Some(&["theirs"])), "ours", false).is_none());
    }

    #[test]
    fn dropping_an_owner_touches_only_its_reference_over_the_version_read() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let owner = |uid: &str| OwnerReference { uid: uid.into(), name: uid.into(), ..Default::default() };
        let mut c = cm(None);
        assert!(drop_owner_patch(&c, "node-uid").is_none(), "no owners");
        c.metadata.owner_references = Some(vec![owner("theirs"), owner("node-uid")]);
        let p = ops(drop_owner_patch(&c, "node-uid"));
        assert_eq!(
            p[0],
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
        );
        assert_eq!(p[1], serde_json::json!({"op": "remove", "path": "/metadata/ownerReferences/1"}));
        assert!(drop_owner_patch(&c, "other").is_none());
    }
}
