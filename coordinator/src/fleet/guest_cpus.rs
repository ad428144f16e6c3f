//! The guest CPUs of a host's domains, grouped by CPU: what the
//! preflight's OS validation asks of a host a VM moves to
//! (docs/eviction.md). Pure; bounded, as an agent is authenticated, not
//! trusted to be small.

use std::collections::BTreeMap;

use hv_proto::v1::Domain;

use crate::api::hypervisor::GuestCpuStatus;

/// Most distinct guest CPUs kept of one host (a host runs a few).
pub const MAX_GROUPS: usize = 16;
/// Most flags kept of one guest CPU.
pub const MAX_FEATURES: usize = 64;

/// The domains with a guest CPU, grouped by it; each group's domains
/// sorted. Domains without a `<cpu>` ask nothing and are left out.
pub fn groups(domains: &[Domain]) -> Vec<GuestCpuStatus> {
    let mut by_cpu: BTreeMap<(String, String, Vec<String>), Vec<String>> = BTreeMap::new();
    for d in domains {
        let Some(cpu) = d.cpu.as_ref().filter(|c| !c.mode.trim().is_empty()) else { continue };
        let uuid = d.uuid.trim().to_ascii_lowercase();
        if uuid.len() != 36 {
            continue;
        }
        let mut features: Vec<String> =
            cpu.required_features.iter().filter(|f| !f.is_empty() && f.len() <= 64).cloned().collect();
        features.sort();
        features.dedup();
        features.truncate(MAX_FEATURES);
        let key = (cut(&cpu.mode, 32), cut(&cpu.model, 64), features);
        by_cpu.entry(key).or_default().push(uuid);
    }
    // At most MAX_DOMAINS domains in all, as the domains' own list.
    let mut room = crate::fleet::registry::MAX_DOMAINS;
    let mut out = Vec::new();
    for ((mode, model, features), mut domains) in by_cpu.into_iter().take(MAX_GROUPS) {
        domains.sort();
        domains.dedup();
        domains.truncate(room);
        room -= domains.len();
        if domains.is_empty() {
            break;
        }
        out.push(GuestCpuStatus { mode, model, features, domains });
    }
    out
}

fn cut(s: &str, max: usize) -> String {
    s.trim().chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hv_proto::v1::GuestCpu;

    fn domain(n: u8, mode: &str, model: &str, features: &[&str]) -> Domain {
        Domain {
            uuid: format!("00000000-0000-0000-0000-0000000000{n:02}"),
            cpu: Some(GuestCpu {
                mode: mode.into(),
                model: model.into(),
                required_features: features.iter().map(|f| f.to_string()).collect(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn grouped_by_cpu_bounded_and_without_the_cpuless() {
        let domains = [
            domain(2, "host-model", "", &[]),
            domain(1, "host-model", "", &[]),
            domain(3, "custom", "Haswell", &["pcid", "pcid", ""]),
            domain(4, "", "", &[]),
            Domain { uuid: "not-a-uuid".into(), ..domain(5, "host-model", "", &[]) },
        ];
        let g = groups(&domains);
        assert_eq!(g.len(), 2);
        assert_eq!(
            (g[0].mode.as_str(), g[0].model.as_str(), g[0].features.clone()),
            ("custom", "Haswell", vec!["pcid".to_string()])
        );
        assert_eq!(
            g[1].domains,
            ["00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"]
        );
        let many: Vec<Domain> = (0..40).map(|i| domain(i, "custom", &format!("M{i}"), &[])).collect();
        assert_eq!(groups(&many).len(), MAX_GROUPS);
        let crowded: Vec<Domain> = (0..3000u32)
            .map(|i| Domain {
                uuid: format!("00000000-0000-0000-0000-{i:012}"),
                ..domain(0, "custom", &format!("M{}", i % 3), &[])
            })
            .collect();
        let total: usize = groups(&crowded).iter().map(|g| g.domains.len()).sum();
        assert_eq!(total, crate::fleet::registry::MAX_DOMAINS, "bounded in all, as the domains are");
    }
}
