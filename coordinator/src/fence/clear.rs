//! The way back for a fenced host, once an SRE clears its fencing
//! (docs/fencing.md, Recovery), as a pure function: what to undo next, or
//! what it waits for. The fence comes off in the reverse order it went on:
//! Nova's `forced_down` first (Nova refuses it until the host's
//! nova-compute has started and destroyed what was left of its evacuated
//! servers), then the Ceph blocklist; then the record goes, and the host
//! comes back through its checks like any host leaving maintenance. Its
//! power is the SRE's: they brought the host back.

/// What the shell saw of a fencing being cleared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Clearing<'a> {
    /// A running Eviction of the host (its evacuation), by name.
    pub eviction_running: Option<&'a str>,
    /// The host's agent is connected again.
    pub agent_back: bool,
    /// Evacuations off the host since its fencing started that Nova has not
    /// settled: still running, or `done` (rebuilt, the old host not yet
    /// cleaned up). Nova's own check on lifting `forced_down` is kept by
    /// this one, which does not depend on an Eviction being seen.
    pub evacuations_unsettled: usize,
    /// Nova shows the compute service forced down.
    pub forced_down: bool,
    /// Blocklist entries of the fencing still to lift.
    pub blocklisted: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing can be undone yet; why.
    Wait(String),
    LiftForcedDown,
    LiftBlocklist,
    /// Nothing of the fence is left: drop the record.
    Done,
}

pub fn next(s: &Clearing<'_>) -> Next {
    if let Some(ev) = s.eviction_running {
        return Next::Wait(format!(
            "Eviction {ev} still evacuates the host's servers: the fence stays until it is over"
        ));
    }
    if s.evacuations_unsettled > 0 {
        return Next::Wait(format!(
            "{} evacuation(s) off the host are not settled in Nova (running, or rebuilt and the old host \
             not cleaned up yet: its nova-compute must start): the fence stays until they are",
            s.evacuations_unsettled
        ));
    }
    if !s.agent_back {
        return Next::Wait(
            "the host's agent is not connected: the fence stays until the host is back (powered on, \
             its agent running)"
                .into(),
        );
    }
    if s.forced_down {
        Next::LiftForcedDown
    } else if s.blocklisted {
        Next::LiftBlocklist
    } else {
        Next::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_comes_off_in_reverse_order_only_once_the_host_is_back_and_its_evacuation_over() {
        for eviction_running in [None, Some("node-ha-1")] {
            for evacuations_unsettled in [0, 2] {
                for agent_back in [false, true] {
                    for forced_down in [false, true] {
                        for blocklisted in [false, true] {
                            let s = Clearing {
                                eviction_running,
                                agent_back,
                                evacuations_unsettled,
                                forced_down,
                                blocklisted,
                            };
                            let next = next(&s);
                            // Nothing comes off while an evacuation may still
                            // run or leave a copy behind, or the host is away.
                            let hold = eviction_running.is_some() || evacuations_unsettled > 0 || !agent_back;
                            let want = match (hold, forced_down, blocklisted) {
                                (true, ..) => None,
                                (false, true, _) => Some(Next::LiftForcedDown),
                                (false, false, true) => Some(Next::LiftBlocklist),
                                (false, false, false) => Some(Next::Done),
                            };
                            match want {
                                Some(w) => assert_eq!(next, w, "{s:?}"),
                                None => assert!(matches!(next, Next::Wait(_)), "{s:?}: {next:?}"),
                            }
                        }
                    }
                }
            }
        }
        let waiting = next(&Clearing {
            eviction_running: Some("node-ha-1"),
            agent_back: true,
            evacuations_unsettled: 0,
            forced_down: true,
            blocklisted: true,
        });
        assert!(matches!(waiting, Next::Wait(w) if w.contains("node-ha-1")));
    }
}
