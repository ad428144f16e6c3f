//! A fenced host gone for good, retired by an SRE (docs/fencing.md, "A
//! host gone for good"), as a pure function: what to do next, or what it
//! waits for. Its blocklist entries come off only once its machine is off
//! (its BMC read off twice) or gone (the SRE's word), so a replacement
//! machine that reuses its IP can use RBD, and the old one, should it still
//! run, never gets its disks back. Nova's `forced_down` stays, and the
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

/// `blocklisted`: entries of the fencing are still to lift.
pub fn next(machine: &Machine, blocklisted: bool) -> Next {
    if !blocklisted {
        return Next::Done;
    }
    match machine {
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
    fn the_blocklist_comes_off_only_once_the_machine_is_off_or_gone() {
        let machines = [Machine::Off, Machine::On, Machine::Gone, Machine::Unknown("no BMC".into())];
        for machine in &machines {
            for blocklisted in [false, true] {
                let next = next(machine, blocklisted);
                let want = match (blocklisted, machine) {
                    (false, _) => Some(Next::Done),
                    (true, Machine::Off | Machine::Gone) => Some(Next::LiftBlocklist),
                    (true, _) => None,
                };
                match want {
                    Some(w) => assert_eq!(next, w, "{machine:?} {blocklisted}"),
                    None => assert!(matches!(next, Next::Wait(_)), "{machine:?}: {next:?}"),
                }
            }
        }
        let unknown = next(&Machine::Unknown("no BMC".into()), true);
        assert!(matches!(unknown, Next::Wait(w) if w.contains("no BMC") && w.contains("--machine-gone")));
    }
}
