//! Servers of policy `external`: their owner's tooling moves them. Pure.
//!
//! Each is marked with our `evict-from` metadata key naming the host, so
//! the owner's tooling can find what to move and from where; the eviction
//! waits for it to leave the host (Migrated) or be deleted (Gone), and
//! never moves it. The mark is taken off once it has left or the eviction
//! is cancelled, and the eviction does not end while a mark of ours
//! remains: a mark left behind would ask the owner to move it again.

use super::{Action, Input};
use crate::api::eviction::{VmState, VmStatus};
use crate::api::keys::EVICT_FROM_METADATA;

/// The reason a server waits with.
pub(super) fn waiting(source: &str) -> String {
    format!("policy external: marked {EVICT_FROM_METADATA}={source}; waiting for its owner to move it")
}

/// The marks to set and to take off; answers whether a mark of ours is
/// still to go (the eviction is not over then).
pub(super) fn marks(vms: &[VmStatus], input: &Input<'_>, actions: &mut Vec<Action>) -> bool {
    let mut pending = false;
    for srv in input.servers {
        let waits = !input.cancelled
            && srv.on(input.source)
            && vms.iter().any(|v| v.id == srv.id && v.state == VmState::External);
        let ours = srv.evict_mark.as_deref() == Some(input.source);
        if waits && !ours {
            actions.push(Action::Mark { server_id: srv.id.clone(), host: input.source.to_string() });
        } else if !waits && ours {
            actions.push(Action::Unmark { server_id: srv.id.clone() });
            pending = true;
        }
    }
    pending
}
