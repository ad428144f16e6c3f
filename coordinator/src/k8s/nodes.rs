//! A `Hypervisor` for every selected Node, named after it and owned by it
//! (DESIGN.md section 3, Initial -> Onboarding).
//!
//! The spec is filled once, at creation, from the coordinator's defaults and
//! the Node's `hypervisor.cloud.sap/*` annotations; from then on the
//! Hypervisor's spec is the one source of truth and SREs edit it there.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};

use super::FIELD_MANAGER;
use crate::api::Hypervisor;
use crate::api::hypervisor::HypervisorSpec;

/// Node annotations read at creation (comma-separated lists).
pub const AGGREGATES_ANNOTATION: &str = "hypervisor.cloud.sap/aggregates";
pub const TRAITS_ANNOTATION: &str = "hypervisor.cloud.sap/custom-traits";
pub const POOLS_ANNOTATION: &str = "hypervisor.cloud.sap/ceph-pools";
pub const SKIP_TESTS_ANNOTATION: &str = "hypervisor.cloud.sap/skip-tests";

/// Defaults for new Hypervisors (coordinator flags).
#[derive(Clone, Debug, Default)]
pub struct Template {
    pub aggregates: Vec<String>,
    pub custom_traits: Vec<String>,
    pub ceph_pools: Vec<String>,
    pub skip_tests: bool,
}

/// Pure: the spec of a new Hypervisor for `node`.
pub fn spec_for(node: &Node, template: &Template) -> HypervisorSpec {
    let ann = node.annotations();
    let list = |key: &str, default: &[String]| -> Vec<String> {
        match ann.get(key) {
            Some(v) => v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect(),
            None => default.to_vec(),
        }
    };
    let mut spec = HypervisorSpec {
        aggregates: list(AGGREGATES_ANNOTATION, &template.aggregates),
        custom_traits: list(TRAITS_ANNOTATION, &template.custom_traits),
        skip_tests: ann.get(SKIP_TESTS_ANNOTATION).map_or(template.skip_tests, |v| v.trim() == "true"),
        high_availability: true,
        ..HypervisorSpec::default()
    };
    spec.ceph.pools = list(POOLS_ANNOTATION, &template.ceph_pools);
    spec
}

/// Creates the Hypervisor of `node` if it does not exist. Never updates one:
/// an existing spec belongs to the SREs.
pub async fn ensure_hypervisor(client: &kube::Client, node: &Node, template: &Template) {
    let Some(name) = node.metadata.name.clone() else { return };
    if node.metadata.deletion_timestamp.is_some() {
        return;
    }
    let api: Api<Hypervisor> = Api::all(client.clone());
    match api.get_opt(&name).await {
        Ok(Some(_)) => return,
        Ok(None) => {}
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "could not look up the Hypervisor");
            return;
        }
    }
    let mut hv = Hypervisor::new(&name, spec_for(node, template));
    hv.metadata.owner_references = node.controller_owner_ref(&()).map(|o| vec![o]);
    let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
    match api.create(&pp, &hv).await {
        Ok(_) => tracing::info!(node = %name, "created Hypervisor for new Node"),
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => tracing::warn!(node = %name, error = %e, "could not create the Hypervisor"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("compute-1".into());
        n.metadata.annotations =
            Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        n
    }

    #[test]
    fn annotations_override_the_template() {
        let t = Template {
            aggregates: vec!["az-1".into()],
            custom_traits: vec![],
            ceph_pools: vec!["vms".into()],
            skip_tests: false,
        };
        let s = spec_for(&node(&[]), &t);
        assert_eq!(
            (s.aggregates.clone(), s.ceph.pools.clone(), s.skip_tests),
            (vec!["az-1".into()], vec!["vms".into()], false)
        );
        let s = spec_for(
            &node(&[
                (AGGREGATES_ANNOTATION, "a, b,,"),
                (TRAITS_ANNOTATION, "CUSTOM_X"),
                (POOLS_ANNOTATION, ""),
                (SKIP_TESTS_ANNOTATION, "true"),
            ]),
            &t,
        );
        assert_eq!(s.aggregates, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(s.custom_traits, vec!["CUSTOM_X".to_string()]);
        assert!(s.ceph.pools.is_empty());
        assert!(s.skip_tests);
        assert_eq!(s.ovs.bridges, vec!["br-int".to_string(), "br-ex".to_string()]);
    }
}
