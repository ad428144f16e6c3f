//! What Nova says of a migration, typed once: the shell parses Nova's
//! strings into it, the eviction core decides on it.

/// A migration's `status` as Nova reports it, typed once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NovaState {
    /// Accepted, not moving yet (queued, accepted, preparing, pre-migrating).
    Queued,
    /// Under way (running, migrating, post-migrating, confirming, reverting).
    /// Only a live migration's `running` has progress counters.
    Running { live_running: bool },
    /// A live migration switched to post-copy (`running (post-copy)`): the
    /// guest runs on the target already and pulls its last memory from the
    /// source. It can be neither aborted nor forced; it is waited for.
    PostCopy,
    /// A cold migration done and waiting for its confirmation (VERIFY_RESIZE).
    Finished,
    /// A live migration done, or an evacuation whose old host cleaned up.
    Completed,
    /// An evacuation done (`done`): the server rebuilt elsewhere, its old
    /// host not yet cleaned up (Nova makes it `completed` once the host's
    /// nova-compute starts and destroys what was left there).
    Rebuilt,
    /// A cold migration confirmed.
    Confirmed,
    /// failed, error
    Failed,
    /// cancelled, aborted
    Cancelled,
    /// A cold migration reverted.
    Reverted,
    /// Something this client does not know; treated as under way.
    Other(String),
}

impl NovaState {
    /// Nothing more happens after these. A cold migration's `Finished` is
    /// not one: it still waits for its confirmation.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            NovaState::Completed
                | NovaState::Rebuilt
                | NovaState::Confirmed
                | NovaState::Failed
                | NovaState::Cancelled
                | NovaState::Reverted
        )
    }

    pub fn as_str(&self) -> &str {
        match self {
            NovaState::Queued => "queued",
            NovaState::Running { live_running: true } => "running",
            NovaState::Running { live_running: false } => "migrating",
            NovaState::PostCopy => "running (post-copy)",
            NovaState::Finished => "finished",
            NovaState::Completed => "completed",
            NovaState::Rebuilt => "done",
            NovaState::Confirmed => "confirmed",
            NovaState::Failed => "failed",
            NovaState::Cancelled => "cancelled",
            NovaState::Reverted => "reverted",
            NovaState::Other(s) => s,
        }
    }
}

impl From<&str> for NovaState {
    fn from(s: &str) -> Self {
        match s {
            "queued" | "accepted" | "preparing" | "pre-migrating" => NovaState::Queued,
            "running" => NovaState::Running { live_running: true },
            "migrating" | "post-migrating" | "confirming" | "reverting" => {
                NovaState::Running { live_running: false }
            }
            "running (post-copy)" => NovaState::PostCopy,
            "finished" => NovaState::Finished,
            "completed" => NovaState::Completed,
            "done" => NovaState::Rebuilt,
            "confirmed" => NovaState::Confirmed,
            "failed" | "error" => NovaState::Failed,
            "cancelled" | "aborted" => NovaState::Cancelled,
            "reverted" => NovaState::Reverted,
            other => NovaState::Other(other.to_string()),
        }
    }
}

impl std::fmt::Display for NovaState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
