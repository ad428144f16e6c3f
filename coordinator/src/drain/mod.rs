//! Drains and rolling updates (docs/drain.md): what the coordinator says on
//! a hypervisor's Node so that the operators of its dependents (network
//! agents) know when they may take them away ([`locks`]), and the eviction
//! webhook's decision on a drain the host cannot take yet ([`admission`];
//! its listener is `k8s::webhook`, the protected pods' cache
//! `k8s::protected_pods`). Pure: no module here imports the shell.

pub mod admission;
pub mod cluster_api;
pub mod deadline;
pub mod guard;
pub mod locks;
pub mod signals;
