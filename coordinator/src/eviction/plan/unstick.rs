//! What is done about a stuck live migration: forced to complete first,
//! aborted if that did not end it. Pure.
//!
//! Forcing asks Nova to finish the copy now (post-copy where the host
//! permits it, else the guest paused for the last of its memory): a VM
//! whose memory changes faster than it can be copied then still moves,
//! where an abort would leave it on the host and the update stalled. Nova
//! takes it only while the migration is `running`, so one still queued or
//! preparing is aborted. A cancelled eviction aborts: forcing would move a
//! VM nobody wants moved any more.

use super::{Action, AttemptObs, Input, secs};
use crate::api::eviction::VmStatus;
use crate::eviction::NovaState;

/// The action for this stuck attempt (`why` says how it is stuck), if any
/// now; the record's reason says what is done.
pub(super) fn unstick(vm: &mut VmStatus, att: &AttemptObs, input: &Input<'_>, why: String) -> Option<Action> {
    let o = input.options;
    let running = att.nova_status == Some(NovaState::Running { live_running: true });
    let mut why = why;
    match (att.forced_at, att.nova_migration_id) {
        (None, Some(id)) if o.force_complete && !input.cancelled && running => {
            vm.reason = format!("{why}; forcing it to complete");
            return Some(Action::ForceComplete {
                server_id: vm.id.clone(),
                attempt: vm.attempts,
                nova_migration_id: id,
                why: vm.reason.clone(),
            });
        }
        (Some(at), _) if !input.cancelled => {
            // Still copying after the force (a large guest's last memory):
            // judged from its last progress, not from the force.
            let moved = if att.progress_reported { at.max(att.last_progress_at) } else { at };
            let since = input.now.duration_since(moved);
            if since <= secs(o.progress_timeout_seconds) {
                vm.reason = format!("{why}; forced to complete, waiting for it to end");
                return None;
            }
            why = format!(
                "{why}; still not ended {}s after it was forced to complete, without progress",
                since.as_secs()
            );
        }
        _ => {}
    }
    vm.reason = why.clone();
    Some(Action::Abort {
        server_id: vm.id.clone(),
        attempt: vm.attempts,
        nova_migration_id: att.nova_migration_id,
        why,
    })
}
