//! Drains and rolling updates (docs/drain.md): what the coordinator says on
//! a hypervisor's Node so that the operators of its dependents (network
//! agents) know when they may take them away.

pub mod locks;
