//! A fenced host gone for good, retired by an SRE (docs/fencing.md, "A
//! host gone for good"), as a pure function: what to do next, or what it
//! waits for. Its blocklist entries come off only once its machine is off
//! (its BMC read off twice) or gone (the SRE's word, unless its BMC reads
//! on), and the host shows no life (its agent, its kubelet, its
//! nova-compute's reports, watched long enough to see one), so a replacement
//! machine that reuses its IP can use RBD, and the old one, should it still
//! run, never gets its disks back. Nova's `forced_down` stays until the
//! host is decommissioned (which waits for the retirement), and the
//! fencing record is kept: the retirement never waits for Nova's `done`
//! evacuations, which only the old host's nova-compute would settle.

/// The retired host's machine, as the shell found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Machine {
    /// Its BMC (certificate checked, the host's own machine) read off twice.
    Off,
    /// Its BMC reads power on (or on its way).
    On,
    /// The SRE said the machine is removed or wiped.
    Gone,
    /// Not known, and why: no BMC, one not trusted, or not readable.
    Unknown(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing can be done yet; why.
    Wait(String),
    /// Lift the host's blocklist entries: the machine is off or gone.
    LiftBlocklist,
    /// Nothing is left to do: the host counts retired.
    Done,
}

/// What the shell saw of a retired host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retiring<'a> {
    /// Its machine: a BMC that reads on outweighs an SRE's word that it is
    /// gone.
    pub machine: Machine,
    /// A sign that the host lives (its agent talking, its kubelet alive,
    /// its nova-compute reporting to Nova): a host gone for good shows
    /// none, whatever was said of it.
    pub lives: Option<&'a str>,
    /// Its nova-compute has been watched for reports for Nova's own
    /// `service_down_time` at least: a quiet moment is no proof.
    pub nova_watched: bool,
    /// Entries of the fencing still to lift.
    pub blocklisted: bool,
    /// Entries of the fencing not lifted that another host's fencing holds
    /// too: they go with that one's clearing.
    pub held_elsewhere: bool,
}

pub fn next(s: &Retiring<'_>) -> Next {
    if let Some(sign) = s.lives {
        return Next::Wait(format!(
            "the host shows life ({sign}): a host gone for good shows none; its blocklist entries stay"
        ));
    }
    if !s.blocklisted {
        return match s.held_elsewhere {
            true => Next::Wait(
                "its blocklist entries are held by another host's fencing too: they are lifted with that one's \
                 clearing"
                    .into(),
            ),
            false => Next::Done,
        };
    }
    match &s.machine {
        Machine::Off | Machine::Gone if !s.nova_watched => Next::Wait(format!(
            "its nova-compute is watched for reports to Nova for {} s before its blocklist entries are lifted",
            super::signs::REPORT_WINDOW.as_secs()
        )),
        Machine::Off | Machine::Gone => Next::LiftBlocklist,
        Machine::On => Next::Wait(
            "its BMC reads power on: its blocklist entries stay until the machine is powered off".into(),
        ),
        Machine::Unknown(why) => Next::Wait(format!(
            "its machine cannot be read ({why}): its blocklist entries stay until its BMC reads it off, or \
             an SRE says it is removed or wiped (hvctl retire --machine-gone)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blocklist_comes_off_only_once_the_machine_is_off_or_gone_and_the_host_shows_no_life() {
        let machines = [Machine::Off, Machine::On, Machine::Gone, Machine::Unknown("no BMC".into())];
        for machine in machines {
            for lives in [None, Some("its agent talks to us")] {
                for blocklisted in [false, true] {
                    for (held_elsewhere, nova_watched) in
                        [(false, false), (false, true), (true, false), (true, true)]
                    {
                        let s = Retiring {
                            machine: machine.clone(),
                            lives,
                            nova_watched,
                            blocklisted,
                            held_elsewhere,
                        };
                        let next = next(&s);
                        let want = match (lives, blocklisted, held_elsewhere, nova_watched, &machine) {
                            (Some(_), ..) => None,
                            (None, false, false, _, _) => Some(Next::Done),
                            (None, false, true, _, _) => None,
                            (None, true, _, false, _) => None,
                            (None, true, _, true, Machine::Off | Machine::Gone) => Some(Next::LiftBlocklist),
                            (None, true, _, true, _) => None,
                        };
                        match want {
                            Some(w) => assert_eq!(next, w, "{s:?}"),
                            None => assert!(matches!(next, Next::Wait(_)), "{s:?}: {next:?}"),
                        }
                    }
                }
            }
        }
        let unknown = next(&Retiring {
            machine: Machine::Unknown("no BMC".into()),
            lives: None,
            nova_watched: true,
            blocklisted: true,
            held_elsewhere: false,
        });
        assert!(matches!(unknown, Next::Wait(w) if w.contains("no BMC") && w.contains("--machine-gone")));
    }
}
