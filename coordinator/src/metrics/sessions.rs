//! The agents' sessions in numbers: how many are live, opened, refused and
//! replaced, the messages they send by kind, and what the agents' outboxes
//! dropped (reported in their heartbeats).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Kind {
    kind: &'static str,
}

/// Cheap to clone: the registry's session table and the gRPC endpoint each
/// hold one. Unregistered (`default`), it counts for nobody.
#[derive(Clone, Default)]
pub struct AgentSessions {
    live: Gauge,
    opened: Counter,
    refused: Counter,
    replaced: Counter,
    messages: Family<Kind, Counter>,
    dropped: Counter,
}

impl AgentSessions {
    /// Its families in `registry` (the coordinator's, or a test's own).
    pub fn register_into(registry: &mut Registry) -> AgentSessions {
        let s = AgentSessions::default();
        registry.register("hv_coordinator_agent_sessions", "Agent sessions live now.", s.live.clone());
        registry.register("hv_coordinator_agent_sessions_opened", "Agent sessions opened.", s.opened.clone());
        registry.register(
            "hv_coordinator_agent_sessions_refused",
            "Agent sessions refused: the client certificate named another node or none, or had expired.",
            s.refused.clone(),
        );
        registry.register(
            "hv_coordinator_agent_sessions_replaced",
            "Agent sessions closed because a newer one for the same node opened.",
            s.replaced.clone(),
        );
        registry.register(
            "hv_coordinator_agent_messages",
            "Messages received from agents, by kind (replays included).",
            s.messages.clone(),
        );
        registry.register(
            "hv_coordinator_agent_outbox_dropped",
            "Messages the agents' outboxes dropped while cut off (from their heartbeats).",
            s.dropped.clone(),
        );
        s
    }

    /// A session opened; `replacing` when it closed an older one of its node.
    pub fn opened(&self, replacing: bool) {
        self.opened.inc();
        if replacing {
            self.replaced.inc();
        } else {
            self.live.inc();
        }
    }

    /// A live session closed (not one already replaced).
    pub fn closed(&self) {
        self.live.dec();
    }

    /// Every session closed at once (leadership lost).
    pub fn all_closed(&self) {
        self.live.set(0);
    }

    pub fn refused(&self) {
        self.refused.inc();
    }

    pub fn message(&self, kind: &'static str) {
        self.messages.get_or_create(&Kind { kind }).inc();
    }

    /// An agent's outbox dropped `n` more messages.
    pub fn dropped(&self, n: u64) {
        self.dropped.inc_by(n);
    }
}
