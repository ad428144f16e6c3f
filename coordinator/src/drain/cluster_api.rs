//! Cluster API's Machines (docs/drain.md, "Cluster API"). Cluster API
//! deletes a Machine to replace it (a rolling update of its
//! MachineDeployment, a remediation, a scale-down) and drains its Node
//! first, skipping DaemonSet pods; but it waits while any annotation
//! `pre-drain.delete.hook.machine.cluster.x-k8s.io/<name>` stands on the
//! Machine. The coordinator keeps its own such hook on every hypervisor's
//! Machine, reads a deletion as an update's ask (its mark on the Node,
//! [`MACHINE_DELETING_ANNOTATION`](crate::api::keys::MACHINE_DELETING_ANNOTATION)),
//! and lifts the hook once the host is emptied and held. Pure: the shell
//! (`k8s::cluster_api`) reads the Machines and writes what [`decide`] says.

/// A Machine as the rule reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineView {
    /// `namespace/name`.
    pub key: String,
    /// Its Node (`status.nodeRef.name`), once it has one.
    pub node: Option<String>,
    /// Its deletion began.
    pub deleting: bool,
    /// The hook's annotation.
    pub hook: Hook,
}

/// The annotation of our hook's name on a Machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    Absent,
    /// Its value names this install.
    Ours,
    /// Its value names another install (or a hand): never touched.
    Theirs,
}

/// What the Machine's host is to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    /// No Hypervisor of this install (no Node, a Node of another cluster
    /// or install, a host that left the install): not ours to hold.
    NotOurs,
    /// A hypervisor of ours; `freed`: emptied and held, on this leader's
    /// own read.
    Ours { freed: bool },
}

/// What to write.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Writes {
    /// Our hook on the Machine: placed (true) or lifted (false).
    pub hook: Option<bool>,
    /// The Node's mark that its Machine is being deleted (the update's
    /// ask): set to the Machine's key.
    pub mark: Option<String>,
}

pub fn decide(m: &MachineView, host: Host) -> Writes {
    let ours = m.hook == Hook::Ours;
    match host {
        // A hook of ours never holds a Machine that is no hypervisor's of
        // this install.
        Host::NotOurs => Writes { hook: ours.then_some(false), mark: None },
        // In service: the hook stands, so that a deletion waits for us; one
        // of that name another wrote is left as it is.
        Host::Ours { .. } if !m.deleting => {
            Writes { hook: (m.hook == Hook::Absent).then_some(true), mark: None }
        }
        // Being deleted: the ask, and the hook lifted once the host is
        // emptied and held. Never placed again once lifted: Cluster API may
        // be draining by then.
        Host::Ours { freed } => Writes { hook: (ours && freed).then_some(false), mark: Some(m.key.clone()) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(deleting: bool, hooked: bool) -> MachineView {
        let hook = if hooked { Hook::Ours } else { Hook::Absent };
        MachineView { key: "capi/worker-abc".into(), node: Some("compute-1".into()), deleting, hook }
    }

    #[test]
    fn the_hook_stands_in_service_and_is_lifted_only_once_a_deleted_machines_host_is_emptied() {
        let ours = |freed| Host::Ours { freed };
        let mark = Some("capi/worker-abc".to_string());
        let rows = [
            (
                "in service, no hook yet: placed",
                machine(false, false),
                ours(false),
                Writes { hook: Some(true), mark: None },
            ),
            ("in service, hooked: nothing", machine(false, true), ours(false), Writes::default()),
            ("held in service, hooked: stays", machine(false, true), ours(true), Writes::default()),
            (
                "deleting, not emptied: asked, held",
                machine(true, true),
                ours(false),
                Writes { hook: None, mark: mark.clone() },
            ),
            (
                "deleting, emptied: lifted",
                machine(true, true),
                ours(true),
                Writes { hook: Some(false), mark: mark.clone() },
            ),
            (
                "deleting, lifted: never placed again",
                machine(true, false),
                ours(false),
                Writes { hook: None, mark: mark.clone() },
            ),
            (
                "not ours, hooked: lifted",
                machine(false, true),
                Host::NotOurs,
                Writes { hook: Some(false), mark: None },
            ),
            ("not ours, deleting: nothing asked", machine(true, false), Host::NotOurs, Writes::default()),
        ];
        for (what, m, host, want) in rows {
            assert_eq!(decide(&m, host), want, "{what}");
        }
        // Another install's hook of the same name: never lifted, never
        // written over.
        let theirs = |deleting| MachineView { hook: Hook::Theirs, ..machine(deleting, false) };
        for host in [Host::NotOurs, ours(false), ours(true)] {
            assert_eq!(decide(&theirs(false), host).hook, None, "{host:?}");
            assert_eq!(decide(&theirs(true), host).hook, None, "{host:?}");
        }
    }
}
