//! Power as desired state: empty spare hosts hibernated (powered off
//! through their BMC) and woken before the room runs short. The decisions
//! are pure; the BMC is reached through [`crate::fence::PowerActuator`].

pub mod hibernation;
pub mod machine;
pub mod switch;

pub use switch::{PoweredOn, power_on_confirmed};
