//! Node health (docs/health.md): the agent's signals as the coordinator
//! holds them ([`signal`]), what every source adds up to ([`model`]), and
//! the model's inputs and outputs from and to a reconcile ([`observe`]),
//! the marks kept on the Node ([`marks`]), and what a Degraded verdict
//! asks for ([`respond`]).

pub mod marks;
pub mod model;
pub mod observe;
pub mod respond;
pub mod signal;

pub use model::{
    AgentSource, Assessment, HealthPolicy, Heartbeat, NodeSource, NovaSource, OwnView, PowerSource, Sources,
    assess, next_status,
};
pub use observe::AgentView;
pub use signal::{Severity, Signal};
