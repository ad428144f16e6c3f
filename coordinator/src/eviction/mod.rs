//! Eviction, pure (DESIGN.md section 4): [`preflight::preflight`] decides
//! whether every VM of the host could be placed elsewhere, and
//! [`plan::step`] decides, for one Eviction, which VM moves next, which
//! migration is stuck and what every VM's record says. The shell that runs
//! them against Nova is `k8s::eviction`.

pub mod plan;
pub mod preflight;
