//! Power as desired state: empty spare hosts hibernated (powered off
//! through their BMC) and woken before the room runs short. The decisions
//! are pure; the BMC is reached through [`crate::fence::PowerActuator`].

pub mod hibernation;
pub mod machine;
pub mod policy;
pub mod switch;

pub use switch::{PoweredOn, power_on_confirmed};

use crate::api::power::{DesiredPower, HostPower};

/// Whether a host is read on its own (Nova's view of it fresh, never the
/// fleet view's): one about to be powered off, or whose power is changing,
/// is read just before each step.
pub fn read_alone(wish: DesiredPower, state: Option<HostPower>) -> bool {
    let stopping =
        !wish.is_running() && state.is_none_or(|p| matches!(p, HostPower::Running | HostPower::Stopping));
    stopping || state.is_some_and(HostPower::changing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_is_read_alone_from_the_wish_to_hibernate_until_its_power_settles() {
        use HostPower as P;
        let (run, hibernate) = (DesiredPower::Running, DesiredPower::Hibernating);
        assert!(!read_alone(run, None) && !read_alone(run, Some(P::Running)));
        assert!(read_alone(hibernate, None) && read_alone(hibernate, Some(P::Running)));
        assert!(read_alone(hibernate, Some(P::Stopping)) && read_alone(run, Some(P::StartingMachine)));
        for settled in [P::Hibernating, P::FailedToStop, P::FailedToStart, P::Unsupported] {
            assert!(!read_alone(hibernate, Some(settled)), "{settled}");
            assert!(!read_alone(run, Some(settled)), "{settled}");
        }
    }
}
