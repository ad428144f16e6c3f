//! The leader's pod carries the label `hypervisor.cloud.sap/leader=true`;
//! the Service agents and SREs reach selects that label, and every replica
//! whose label agrees with its role is Ready.
//!
//! Why not "only the leader is Ready": a PodDisruptionBudget counts Ready
//! pods, so with one Ready replica it could never allow the leader's pod to
//! be evicted, and a `kubectl drain` of the leader's node would hang for
//! ever; and a rolling update would wait for a new pod to become Ready,
//! which a follower never would. With the label, the standby is Ready, the
//! budget allows one disruption, the evicted leader hands the lease over
//! on SIGTERM, and the standby labels itself.
//!
//! Safety: a replica is Ready only while its pod's label, as it last wrote
//! it, agrees with its role. A deposed leader that cannot reach the API to
//! take its label off is not Ready, so the Service (which sends only to
//! Ready pods) stops sending to it although it still carries the label;
//! and it exits, and its next start clears the label before it is Ready.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::api::keys::LEADER_LABEL;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;

/// This replica's pod label as it last wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// Not written yet since this process started.
    Unknown,
    Set,
    Cleared,
}

impl Label {
    fn for_role(leading: bool) -> Label {
        if leading { Label::Set } else { Label::Cleared }
    }
}

/// The label state, shared with the readiness endpoint.
#[derive(Debug, Default)]
pub struct LabelState(AtomicU8);

impl LabelState {
    pub fn get(&self) -> Label {
        match self.0.load(Ordering::Relaxed) {
            1 => Label::Set,
            2 => Label::Cleared,
            _ => Label::Unknown,
        }
    }

    fn set(&self, label: Label) {
        let v = match label {
            Label::Unknown => 0,
            Label::Set => 1,
            Label::Cleared => 2,
        };
        self.0.store(v, Ordering::Relaxed);
    }
}

/// Pure: is this replica Ready, and why. `label` is None when the replica
/// does not label its pod (outside a cluster): then only the leader is.
pub fn readiness(leading: bool, label: Option<Label>) -> (bool, &'static str) {
    match (leading, label) {
        (true, None) => (true, "leader"),
        (false, None) => (false, "follower"),
        (true, Some(Label::Set)) => (true, "leader; its pod carries the leader label"),
        (false, Some(Label::Cleared)) => (true, "follower; its pod carries no leader label"),
        (true, Some(Label::Cleared | Label::Unknown)) => (false, "leader; its pod is not labelled yet"),
        (false, Some(Label::Set)) => (false, "follower; its pod still carries the leader label"),
        (false, Some(Label::Unknown)) => (false, "follower; its pod label is not cleared yet"),
    }
}

/// This replica's pod, whose label follows its role.
pub struct LeaderPod {
    api: Api<Pod>,
    name: String,
    pub state: Arc<LabelState>,
}

impl LeaderPod {
    /// `client` must not be the leader-only one: a follower clears its label.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> LeaderPod {
        LeaderPod { api: Api::namespaced(client, namespace), name: name.to_string(), state: Arc::default() }
    }

    /// Writes the label for `leading` (a merge patch: other labels stay).
    pub async fn write(&self, leading: bool) -> Result<(), kube::Error> {
        let value = if leading { serde_json::json!("true") } else { serde_json::Value::Null };
        let patch = serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
        self.api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        self.state.set(Label::for_role(leading));
        tracing::info!(pod = %self.name, leading, "pod label written");
        Ok(())
    }

    /// Keeps the label equal to the role `role` says, retrying a failed
    /// write every `retry`, until the sender of `role` is gone.
    pub async fn follow(&self, mut role: watch::Receiver<bool>, retry: Duration) {
        loop {
            let leading = *role.borrow_and_update();
            let done = self.state.get() == Label::for_role(leading)
                || match self.write(leading).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(pod = %self.name, leading, error = %e, "pod label not written; retrying");
                        false
                    }
                };
            let changed = if done {
                role.changed().await
            } else {
                tokio::select! {
                    r = role.changed() => r,
                    _ = tokio::time::sleep(retry) => Ok(()),
                }
            };
            if changed.is_err() {
                return;
            }
        }
    }
}

impl LeaderPod {
    /// Returns once the label has not been set for `limit` without a
    /// break: a leader that cannot label its pod is out of the Service.
    pub async fn unlabelled_for(&self, limit: Duration) {
        let mut since = None;
        loop {
            let now = tokio::time::Instant::now();
            if self.state.get() == Label::Set {
                since = None;
            } else if now.duration_since(*since.get_or_insert(now)) >= limit {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination: Ready exactly when the label agrees with the role
    /// (or, without labels, when leading).
    #[test]
    fn a_replica_is_ready_only_while_its_label_agrees_with_its_role() {
        let labels = [None, Some(Label::Unknown), Some(Label::Set), Some(Label::Cleared)];
        for leading in [true, false] {
            for label in labels {
                let (ready, why) = readiness(leading, label);
                let expected = match label {
                    None => leading,
                    Some(l) => l == Label::for_role(leading),
                };
                assert_eq!(ready, expected, "leading {leading}, label {label:?}: {why}");
                assert_eq!(why.starts_with("leader"), leading, "{why}");
            }
        }
    }

    #[test]
    fn the_state_reads_back_what_was_set() {
        let s = LabelState::default();
        assert_eq!(s.get(), Label::Unknown);
        for l in [Label::Set, Label::Cleared, Label::Unknown] {
            s.set(l);
            assert_eq!(s.get(), l);
        }
    }
}
