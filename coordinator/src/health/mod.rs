//! Node health (docs/health.md): the agent's signals as the coordinator
//! holds them ([`signal`]), what every source adds up to ([`model`]), and
//! the model's inputs and outputs from and to a reconcile ([`observe`]),
//! and the marks kept on the Node ([`marks`]).

pub mod marks;
pub mod model;
pub mod observe;
pub mod signal;

pub use model::{
    AgentSource, Assessment, HealthPolicy, NodeSource, NovaSource, OwnView, Sources, assess, next_status,
};
pub use signal::{Severity, Signal};
