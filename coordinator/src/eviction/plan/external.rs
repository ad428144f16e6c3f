//! Servers of policy `external`: their owner's tooling moves them. Pure.
//!
//! Each is marked with our `evict-from` metadata key naming the host, so
//! the owner's tooling can find what to move and from where; the eviction
//! waits for it to leave the host or be deleted (Gone), and never moves it.
//! Once it has left, our mark is taken off, and it counts as Migrated only
//! when Nova shows the mark gone: a mark left behind would ask its owner to
//! move it again. A cancelled eviction takes its marks off before it ends.
//! A mark someone else set (naming another host) is never overwritten or
//! taken off. On a fenced host the server is evacuated as any other: nobody
//! can move a server off a dead host but Nova's evacuation.

use super::{Action, Input, Server};
use crate::api::eviction::{VmState, VmStatus};
use crate::api::keys::EVICT_FROM_METADATA;

/// The reason a server waits with.
pub(super) fn waiting(source: &str) -> String {
    format!("policy external: marked {EVICT_FROM_METADATA}={source}; waiting for its owner to move it")
}

/// What Nova shows of a server waiting for its owner.
pub(super) fn advance(vm: &mut VmStatus, srv: &Server, input: &Input<'_>) {
    let Some(host) = srv.elsewhere(input.source) else {
        if input.evacuation.is_some() {
            vm.state = VmState::Pending;
            vm.reason = "the host is fenced: evacuated, not left to its owner".into();
        }
        return;
    };
    if srv.evict_mark.as_deref() == Some(input.source) {
        vm.reason = format!("moved off to {host} by its owner; taking our mark off");
    } else {
        vm.state = VmState::Migrated;
        vm.target_host = Some(host.to_string());
        vm.reason = "moved off by its owner".into();
    }
}

/// The marks to set and to take off; answers whether a mark of ours is
/// still to go (the eviction is not over then).
pub(super) fn marks(vms: &[VmStatus], input: &Input<'_>, actions: &mut Vec<Action>) -> bool {
    let mut pending = false;
    for srv in input.servers {
        let waits = !input.cancelled
            && input.evacuation.is_none()
            && srv.on(input.source)
            && vms.iter().any(|v| v.id == srv.id && v.state == VmState::External);
        let ours = srv.evict_mark.as_deref() == Some(input.source);
        if waits && srv.evict_mark.is_none() {
            actions.push(Action::Mark { server_id: srv.id.clone(), host: input.source.to_string() });
        } else if !waits && ours {
            actions.push(Action::Unmark { server_id: srv.id.clone() });
            pending = true;
        }
    }
    pending
}
