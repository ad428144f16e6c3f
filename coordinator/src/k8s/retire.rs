//! The retirement shell (docs/fencing.md, "A host gone for good"): read the
//! retired host's machine, take the one step [`retire::next`] names, and
//! answer the record, kept, for the reconcile to write.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use super::fence::{FenceOutcome, lift, lifted_by_clearing, nova_compute_reports, power_source};
use super::hypervisor::Context;
use crate::api::Hypervisor;
use crate::api::hypervisor::FencingStatus;
use crate::fence::record::{self, Asked, Retired};
use crate::fence::retire::{self, Machine, Retiring};
use crate::health::PowerSource;

/// One look at a retired host: its blocklist entries lifted once its
/// machine is off or gone and the host shows no life, then nothing more.
/// `kubelet_alive`: this reconcile's verdict; `host`: its Nova host.
pub async fn look(
    ctx: &Context,
    hv: &Hypervisor,
    host: &str,
    r: &FencingStatus,
    asked: &Asked,
    kubelet_alive: bool,
    conditions: &[Condition],
) -> FenceOutcome {
    let (name, now) = (hv.name_any(), Timestamp::now());
    if r.retired() {
        return record::retired(r, &name, now, asked, Retired::Done, conditions);
    }
    if !ctx.gate.open() {
        let again = Some(Duration::from_millis(500));
        return FenceOutcome { record: Some(r.clone()), again, ..FenceOutcome::default() };
    }
    let addresses = lifted_by_clearing(ctx, hv, r);
    let fresh = ctx.fencing.policy.fresh_heartbeat;
    let talks = ctx.registry.view(&name).last_seen.is_some_and(|t| now.duration_since(t) < fresh);
    let since = r.refenced.as_ref().or(r.fenced.as_ref()).map_or(now, |t| t.0);
    // Nova unreadable this look: not watched, so no lift on it.
    let (reports, read) = nova_compute_reports(ctx, &name, host, since).await;
    let nova_watched =
        read && crate::locked::lock(&ctx.fencing.reports).watched(&name, since, Timestamp::now());
    let lives = match (talks, kubelet_alive, reports) {
        (true, _, _) => Some("its agent talks to us"),
        (false, true, _) => Some("its kubelet is alive"),
        (false, false, true) => Some("its nova-compute reports to Nova"),
        (false, false, false) => None,
    };
    let machine = match (machine(ctx, hv).await, asked.machine_gone(r)) {
        (Machine::Unknown(_), true) => Machine::Gone,
        (read, _) => read,
    };
    let s = Retiring {
        machine,
        lives,
        nova_watched,
        blocklisted: !addresses.is_empty() && !r.blocklist_lifted,
        held_elsewhere: addresses.is_empty() && !r.blocklist_lifted && !r.ceph_addresses.is_empty(),
    };
    let step = match retire::next(&s) {
        retire::Next::Wait(why) => Retired::Waiting(why),
        retire::Next::LiftBlocklist => match lift(ctx, &addresses).await {
            Ok(()) => Retired::BlocklistLifted { addresses, machine: found(&s.machine) },
            Err(why) => Retired::Waiting(format!("its blocklist entries could not be lifted: {why}")),
        },
        retire::Next::Done => Retired::Done,
    };
    record::retired(r, &name, Timestamp::now(), asked, step, conditions)
}

/// The machine as its BMC reads it: off only when read off twice, and
/// only from a BMC whose certificate is checked, of the host's own machine.
async fn machine(ctx: &Context, hv: &Hypervisor) -> Machine {
    match hv.spec.fencing.bmc.as_ref() {
        None => return Machine::Unknown("no BMC in spec.fencing.bmc".into()),
        Some(b) if b.insecure => return Machine::Unknown("its BMC's certificate is not checked".into()),
        Some(_) => {}
    }
    match power_source(ctx, hv).await {
        PowerSource::Off => Machine::Off,
        PowerSource::On => Machine::On,
        PowerSource::Unknown => {
            Machine::Unknown("its BMC did not answer, or answers for another machine".into())
        }
    }
}

/// How the machine was found, for the record.
fn found(machine: &Machine) -> String {
    match machine {
        Machine::Off => "its BMC read power off twice".into(),
        Machine::Gone => "an SRE said its machine is removed or wiped".into(),
        Machine::On => "its BMC reads power on".into(),
        Machine::Unknown(why) => why.clone(),
    }
}
