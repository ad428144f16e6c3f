//! What the agent has said and the coordinator has not yet made durable.
//!
//! Every message gets the next sequence number and stays here until the
//! coordinator acknowledges it (`Ack.seq` covers everything up to it), so
//! after a reconnect exactly the unacknowledged tail is replayed, in order.
//! The buffer is bounded: when full, heartbeats go first (the next one says
//! the same), then snapshots superseded by a newer one of the same kind
//! (facts, inventory), and only then the oldest event. Every drop is
//! counted, and the count travels in the next heartbeat.

use std::collections::VecDeque;

use hv_proto::v1::AgentMessage;
use hv_proto::v1::agent_message::Payload;

#[derive(Debug)]
pub struct Outbox {
    next_seq: u64,
    acked: u64,
    /// Highest seq handed to the current stream (reset on reconnect).
    sent: u64,
    buf: VecDeque<AgentMessage>,
    cap: usize,
    dropped: u64,
}

fn is_heartbeat(m: &AgentMessage) -> bool {
    matches!(m.payload, Some(Payload::Heartbeat(_)))
}

fn snapshot_kind(m: &AgentMessage) -> Option<u8> {
    match m.payload {
        Some(Payload::HostFacts(_)) => Some(1),
        Some(Payload::Inventory(_)) => Some(2),
        _ => None,
    }
}

impl Outbox {
    pub fn new(cap: usize) -> Self {
        Outbox { next_seq: 1, acked: 0, sent: 0, buf: VecDeque::new(), cap: cap.max(2), dropped: 0 }
    }

    /// Messages dropped so far because the buffer was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Messages held, not yet acknowledged.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Queue a payload; returns its sequence number.
    pub fn push(&mut self, payload: Payload, sent_at: Option<prost_types::Timestamp>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let msg = AgentMessage { seq, sent_at, payload: Some(payload) };
        if self.buf.len() >= self.cap {
            self.make_room(&msg);
        }
        self.buf.push_back(msg);
        seq
    }

    fn make_room(&mut self, incoming: &AgentMessage) {
        let victim = self
            .buf
            .iter()
            .position(is_heartbeat)
            .or_else(|| {
                // A snapshot with a newer one of its kind behind it (or coming in).
                self.buf.iter().enumerate().find_map(|(i, m)| {
                    let k = snapshot_kind(m)?;
                    let newer = self.buf.iter().skip(i + 1).any(|n| snapshot_kind(n) == Some(k))
                        || snapshot_kind(incoming) == Some(k);
                    newer.then_some(i)
                })
            })
            .unwrap_or(0);
        if self.buf.remove(victim).is_some() {
            self.dropped += 1;
        }
    }

    /// The coordinator made everything up to `seq` durable.
    pub fn ack(&mut self, seq: u64) {
        if seq <= self.acked {
            return;
        }
        self.acked = seq.min(self.next_seq.saturating_sub(1));
        while self.buf.front().is_some_and(|m| m.seq <= self.acked) {
            self.buf.pop_front();
        }
    }

    /// A new stream starts: everything unacknowledged will be sent again.
    pub fn rewind(&mut self) {
        self.sent = self.acked;
    }

    /// The messages not yet handed to the current stream, in order.
    pub fn take_unsent(&mut self) -> Vec<AgentMessage> {
        // The buffer is ordered by seq: find the first unsent one, don't scan.
        let start = self.buf.partition_point(|m| m.seq <= self.sent);
        let out: Vec<AgentMessage> = self.buf.range(start..).cloned().collect();
        if let Some(last) = out.last() {
            self.sent = last.seq;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use hv_proto::v1::{DomainEvent, Heartbeat, Inventory};

    use super::*;

    fn ev(n: &str) -> Payload {
        Payload::DomainEvent(DomainEvent { name: n.into(), ..Default::default() })
    }
    fn hb() -> Payload {
        Payload::Heartbeat(Heartbeat::default())
    }
    fn names(b: &Outbox) -> Vec<String> {
        b.buf
            .iter()
            .map(|m| match &m.payload {
                Some(Payload::DomainEvent(e)) => e.name.clone(),
                Some(Payload::Heartbeat(_)) => "hb".into(),
                Some(Payload::Inventory(i)) => format!("inv{}", i.domains.len()),
                _ => "?".into(),
            })
            .collect()
    }

    #[test]
    fn sequence_numbers_rise_and_acks_trim() {
        let mut b = Outbox::new(10);
        assert_eq!(b.push(ev("a"), None), 1);
        assert_eq!(b.push(ev("b"), None), 2);
        assert_eq!(b.push(ev("c"), None), 3);
        b.ack(2);
        assert_eq!(names(&b), vec!["c"]);
        b.ack(1); // stale ack: no effect
        assert_eq!(b.acked(), 2);
        b.ack(99); // never beyond what was sent
        assert_eq!(b.acked(), 3);
        assert!(b.is_empty());
    }

    #[test]
    fn replay_after_reconnect_sends_the_unacked_tail_once() {
        let mut b = Outbox::new(10);
        for n in ["a", "b", "c", "d"] {
            b.push(ev(n), None);
        }
        let first: Vec<u64> = b.take_unsent().iter().map(|m| m.seq).collect();
        assert_eq!(first, vec![1, 2, 3, 4]);
        assert!(b.take_unsent().is_empty(), "nothing twice on one stream");
        b.ack(2);
        b.rewind(); // the stream broke
        let replay: Vec<u64> = b.take_unsent().iter().map(|m| m.seq).collect();
        assert_eq!(replay, vec![3, 4]);
        b.push(ev("e"), None);
        assert_eq!(b.take_unsent().iter().map(|m| m.seq).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn heartbeats_go_before_snapshots_before_events_and_drops_are_counted() {
        let mut b = Outbox::new(4);
        b.push(ev("a"), None);
        b.push(hb(), None);
        b.push(Payload::Inventory(Inventory { domains: vec![] }), None);
        b.push(ev("b"), None);
        b.push(ev("c"), None); // full: the heartbeat goes
        assert_eq!(names(&b), vec!["a", "inv0", "b", "c"]);
        b.push(Payload::Inventory(Inventory { domains: vec![Default::default()] }), None); // the old snapshot goes
        assert_eq!(names(&b), vec!["a", "b", "c", "inv1"]);
        b.push(ev("d"), None); // only events left to drop: the oldest
        assert_eq!(names(&b), vec!["b", "c", "inv1", "d"]);
        assert_eq!(b.dropped(), 3);
    }
}
