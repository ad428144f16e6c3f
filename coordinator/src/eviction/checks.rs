//! Why an Eviction cannot run, decided before anything is asked of Nova:
//! its target is not a Hypervisor this coordinator manages, its reason is
//! one it may not use, or its options are outside their bounds (a server
//! that skipped the CRD's validation, or `maxParallel: 0`, would otherwise
//! stall it silently). Each refusal becomes the `Target` condition of a
//! Failed Eviction.

use crate::api::eviction::{EvictionOptions, EvictionReason};

/// The checks `spec.options.force` may name.
pub const FORCEABLE: [&str; 5] =
    ["capacity", "constraints", "compatibility", super::preflight::OS, super::machine::MACHINE];

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// What the shell found about the Eviction's target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The Hypervisor named by `spec.hypervisor` exists.
    pub managed: bool,
    /// The Eviction is the Hypervisor's own (created by its lifecycle for
    /// maintenance: the Hypervisor is its controller).
    pub owned_by_hypervisor: bool,
    /// Another Hypervisor holds the Nova host this one names, and this
    /// one has recorded none: that one's name (docs/lifecycle.md, "One Nova
    /// host, one Hypervisor").
    pub held_by: Option<String>,
}

pub fn check(
    hypervisor: &str,
    reason: EvictionReason,
    o: &EvictionOptions,
    target: &Target,
) -> Result<(), Refusal> {
    if !target.managed {
        return Err(Refusal {
            reason: "UnknownHypervisor",
            message: format!(
                "no Hypervisor named {hypervisor}: an Eviction can only empty a host this coordinator manages"
            ),
        });
    }
    if let Some(holder) = &target.held_by {
        return Err(Refusal {
            reason: "NovaHostHeldElsewhere",
            message: format!(
                "the Nova host Hypervisor {hypervisor} names is held by Hypervisor {holder}: emptying it would move \
                 that host's servers; see {hypervisor}'s Onboarded condition"
            ),
        });
    }
    if reason == EvictionReason::Decommission && !target.owned_by_hypervisor {
        return Err(Refusal {
            reason: "DecommissionReserved",
            message:
                "reason Decommission is the lifecycle's own (spec.maintenance: termination, or deleting \
                      the Node); a hand-made Eviction may use NodeFailure, RollingUpdate or AdminRequest"
                    .into(),
        });
    }
    validate(o).map_err(|message| Refusal { reason: "InvalidSpec", message })
}

/// Options within the bounds the CRD declares.
pub fn validate(o: &EvictionOptions) -> Result<(), String> {
    match sanitized(o).1 {
        None => Ok(()),
        Some(problems) => Err(problems),
    }
}

/// The options with every field outside its bounds replaced by its default
/// and unknown `force` entries dropped, and what was wrong (None: nothing).
/// A running eviction whose spec was edited out of bounds follows its
/// migrations in flight with these, and starts nothing new.
pub fn sanitized(o: &EvictionOptions) -> (EvictionOptions, Option<String>) {
    let d = EvictionOptions::default();
    let mut clean = o.clone();
    let mut bad = Vec::new();
    if !(1..=32).contains(&o.max_parallel) {
        bad.push(format!("spec.options.maxParallel is {} (1 to 32)", o.max_parallel));
        clean.max_parallel = d.max_parallel;
    }
    if !(1..=20).contains(&o.max_attempts) {
        bad.push(format!("spec.options.maxAttempts is {} (1 to 20)", o.max_attempts));
        clean.max_attempts = d.max_attempts;
    }
    if o.progress_timeout_seconds == 0 {
        bad.push("spec.options.progressTimeoutSeconds is 0 (at least 1)".to_string());
        clean.progress_timeout_seconds = d.progress_timeout_seconds;
    }
    if o.completion_timeout_per_gib_seconds == 0 {
        bad.push("spec.options.completionTimeoutPerGiBSeconds is 0 (at least 1)".to_string());
        clean.completion_timeout_per_gib_seconds = d.completion_timeout_per_gib_seconds;
    }
    for f in o.force.iter().filter(|f| !FORCEABLE.contains(&f.as_str())) {
        bad.push(format!("spec.options.force names {f:?} (one of {})", FORCEABLE.join(", ")));
    }
    clean.force.retain(|f| FORCEABLE.contains(&f.as_str()));
    (clean, if bad.is_empty() { None } else { Some(bad.join("; ")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OURS: Target = Target { managed: true, owned_by_hypervisor: true, held_by: None };
    const BY_HAND: Target = Target { managed: true, owned_by_hypervisor: false, held_by: None };

    #[test]
    fn an_unknown_host_and_a_hand_made_decommission_are_refused() {
        let o = EvictionOptions::default();
        let unknown = Target { managed: false, owned_by_hypervisor: false, held_by: None };
        assert_eq!(
            check("db-7", EvictionReason::AdminRequest, &o, &unknown).map_err(|r| r.reason),
            Err("UnknownHypervisor")
        );
        assert_eq!(
            check("c-1", EvictionReason::Decommission, &o, &BY_HAND).map_err(|r| r.reason),
            Err("DecommissionReserved")
        );
        assert!(check("c-1", EvictionReason::Decommission, &o, &OURS).is_ok());
        for r in [EvictionReason::AdminRequest, EvictionReason::RollingUpdate, EvictionReason::NodeFailure] {
            assert!(check("c-1", r, &o, &BY_HAND).is_ok(), "{r:?}");
        }
    }

    #[test]
    fn an_eviction_of_a_host_another_hypervisor_holds_is_refused_naming_it() {
        let held = Target { managed: true, owned_by_hypervisor: true, held_by: Some("compute-3".into()) };
        for r in [EvictionReason::AdminRequest, EvictionReason::NodeFailure, EvictionReason::Decommission] {
            let refused = check("twin", r, &EvictionOptions::default(), &held).unwrap_err();
            assert_eq!(refused.reason, "NovaHostHeldElsewhere");
            assert!(refused.message.contains("held by Hypervisor compute-3"), "{}", refused.message);
        }
    }

    #[test]
    fn options_outside_their_bounds_are_named() {
        let o = EvictionOptions {
            max_parallel: 0,
            max_attempts: 21,
            force: vec!["capcity".into()],
            ..Default::default()
        };
        let e = validate(&o).unwrap_err();
        assert!(
            e.contains("maxParallel is 0") && e.contains("maxAttempts is 21") && e.contains("\"capcity\""),
            "{e}"
        );
        let zero = EvictionOptions {
            progress_timeout_seconds: 0,
            completion_timeout_per_gib_seconds: 0,
            ..Default::default()
        };
        let e = validate(&zero).unwrap_err();
        assert!(e.contains("progressTimeoutSeconds") && e.contains("completionTimeoutPerGiBSeconds"), "{e}");
        assert!(validate(&EvictionOptions::default()).is_ok());
        let (clean, problems) = sanitized(&zero);
        assert!(problems.is_some());
        assert_eq!(clean, EvictionOptions::default(), "every field out of bounds falls back to its default");
        let (clean, _) = sanitized(&o);
        assert_eq!((clean.max_parallel, clean.max_attempts), (2, 3));
        assert!(clean.force.is_empty(), "an unknown check is never skipped");
        assert_eq!(
            check("c", EvictionReason::AdminRequest, &o, &OURS).map_err(|r| r.reason),
            Err("InvalidSpec")
        );
    }
}
