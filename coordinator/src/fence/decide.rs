//! When to fence a host, how far, and what holds it back (docs/fencing.md):
//! pure, over what the shell observed and what the status recorded.
//!
//! A fencing is a sequence of steps, each confirmed before the next (Nova
//! `forced_down`, the host's Ceph clients blocklisted, power off through its
//! BMC; a step the host has no means for is not in its sequence). Every
//! step is idempotent (it reads the state first or repeats harmlessly), so
//! a step done twice after a fail-over costs nothing, and a step is asked
//! again until its confirmation is recorded.
//!
//! The gates are the reasons not to fence a host that looks dead, each
//! answered with what holds and why: it lives (its agent or its kubelet
//! talks), our own view is partial, most of its zone or of the fleet looks
//! dead at once, or hosts of more failure domains than the policy allows
//! are being fenced already. Hosts of one failure domain (a rack) lost
//! together are fenced together: no rate holds the last of them back. A step that cannot be confirmed stops the
//! sequence until an SRE either retries it or confirms the host is fenced
//! by hand, as masakari and Pacemaker's manual fencing confirmation do.

use jiff::SignedDuration;

use crate::api::hypervisor::{FenceStep, HealthState};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FencePolicy {
    /// An agent heartbeat younger than this means the host talks to us:
    /// never fenced, and a fencing under way stops.
    pub fresh_heartbeat: SignedDuration,
    /// More than this percent of a zone's hosts lost at once (and at least
    /// two): nothing in it is fenced.
    pub max_domain_share: u8,
    /// More than this percent of the fleet's hosts lost at once (and at
    /// least two): nothing is fenced.
    pub max_fleet_share: u8,
    /// Hosts of at most this many failure domains are fenced at once; a new
    /// fencing in another waits for them.
    pub max_domains: usize,
}

impl Default for FencePolicy {
    fn default() -> Self {
        FencePolicy {
            fresh_heartbeat: SignedDuration::from_secs(30),
            max_domain_share: 50,
            max_fleet_share: 50,
            max_domains: 2,
        }
    }
}

/// The steps a host's fencing takes, in order: Nova always; its storage
/// when it uses Ceph; its power when the site gives it a BMC.
pub fn sequence(uses_ceph: bool, has_bmc: bool) -> Vec<FenceStep> {
    let mut out = vec![FenceStep::NovaForcedDown];
    if uses_ceph {
        out.push(FenceStep::CephBlocklisted);
    }
    if has_bmc {
        out.push(FenceStep::PoweredOff);
    }
    out
}

/// What the host and the fleet look like to this reconcile.
#[derive(Clone, Debug)]
pub struct Situation<'a> {
    pub health: HealthState,
    /// Age of the agent's last heartbeat this process saw; None: none seen.
    pub heartbeat_age: Option<SignedDuration>,
    /// The host's kubelet is alive (its Lease renewed lately, or its Node
    /// Ready): the host runs, whatever else is lost.
    pub kubelet_alive: bool,
    /// Why the coordinator cannot trust its own view (Nova unreachable or
    /// refusing us, the first moments of a leadership, the host not
    /// judged); None when it can.
    pub blind: Option<&'a str>,
    /// The other managed hosts' agents: (connected, all).
    pub other_agents: (usize, usize),
    /// The host's zone (else every managed host): its name, its hosts lost
    /// (Unreachable or Failed, this one included) and all its hosts.
    pub domain: (&'a str, usize, usize),
    /// The fleet's hosts lost (Unreachable or Failed, this one included)
    /// and all its hosts.
    pub fleet: (usize, usize),
    /// The host's failure domain (its rack, by the site's topology label;
    /// a host without one is a domain of its own).
    pub failure_domain: &'a str,
    /// The failure domains with a host to fence (Failed, or its fencing
    /// under way), each once, and whether a fencing is under way there.
    pub fencing_domains: &'a [(&'a str, bool)],
    /// The host's sequence ([`sequence`]).
    pub steps: &'a [FenceStep],
    /// From status: whether a fencing of this host is under way (started
    /// and not cleared by an SRE), the steps confirmed, and the step that
    /// failed with why (it stands until an SRE retries).
    pub under_way: bool,
    pub confirmed: &'a [FenceStep],
    pub failed: Option<(FenceStep, &'a str)>,
    /// From status: the host counted fenced (by hand or not). It stays so
    /// until an SRE clears the fencing.
    pub fenced: Option<bool>,
    /// An SRE confirmed the host fenced (`hvctl confirm-fenced`) since this
    /// fencing started; it counts only for a fencing under way.
    pub confirmed_by_hand: bool,
    /// From status: the fenced host showed life again and is not fenced
    /// again yet.
    pub revived: bool,
    /// A sign of life the fenced host shows now (its agent talking, its
    /// kubelet renewing its Lease, its nova-compute reporting to Nova, its
    /// BMC reading power on) since it counted fenced or was last fenced
    /// again, while its servers are being evacuated; None: none.
    pub life: Option<&'a str>,
    /// An SRE confirmed it off again since it showed life.
    pub refenced_by_hand: bool,
    /// From status: it was fenced again once already in this fencing.
    pub refenced_before: bool,
}

/// A reason not to fence now; each is a condition reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceHold {
    FreshHeartbeat,
    KubeletAlive,
    OwnViewPartial,
    NoAgentQuorum,
    FailureDomainLost,
    FleetLost,
    OtherDomainsFirst,
}

impl FenceHold {
    pub fn reason(self) -> &'static str {
        match self {
            FenceHold::FreshHeartbeat => "AgentHeartbeatFresh",
            FenceHold::KubeletAlive => "KubeletAlive",
            FenceHold::OwnViewPartial => "CoordinatorBlind",
            FenceHold::NoAgentQuorum => "NoAgentQuorum",
            FenceHold::FailureDomainLost => "FailureDomainLost",
            FenceHold::FleetLost => "FleetShareLost",
            FenceHold::OtherDomainsFirst => "OtherDomainsFirst",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not a host to fence, and no fencing under way.
    Nothing,
    /// It would be fenced (or fenced further), but this holds it back.
    HeldBack { gate: FenceHold, message: String },
    /// Take this step (start the fencing first when none is under way).
    Take(FenceStep),
    /// A step failed to be confirmed: nothing more until an SRE retries it
    /// or confirms the host fenced by hand.
    Stuck { step: FenceStep, message: String },
    /// Every step confirmed, or an SRE confirmed it: the host's VMs may be
    /// rebuilt elsewhere.
    Fenced { by_hand: bool },
    /// The fenced host shows life while its servers are evacuated: recorded
    /// first (no evacuation starts from then), then it is fenced again.
    ShowsLife { sign: String },
    /// An SRE confirmed the host that showed life off again.
    FencedAgain,
}

pub fn decide(s: &Situation<'_>, policy: &FencePolicy) -> Decision {
    let held = |gate: FenceHold, message: String| Decision::HeldBack { gate, message };
    let wanted = s.under_way || s.health == HealthState::Failed;
    if !wanted {
        return Decision::Nothing;
    }
    // Fenced stays fenced, whatever is seen since (the shell says so when
    // its agent talks again): only an SRE clears it. One that shows life
    // while its servers are evacuated is fenced again before they go on:
    // its servers not moved yet may restart there.
    if let Some(by_hand) = s.fenced.filter(|_| s.under_way) {
        return match (s.revived, s.life) {
            (false, None) => Decision::Fenced { by_hand },
            (false, Some(sign)) => Decision::ShowsLife { sign: sign.to_string() },
            (true, _) => fence_again(s),
        };
    }
    // A host that talks to us is alive: whatever was done stands (an SRE
    // looks), nothing more is, not even on a confirmation by hand.
    if let Some(age) = s.heartbeat_age.filter(|a| *a < policy.fresh_heartbeat) {
        let message = format!(
            "its agent's last heartbeat is {} s old (under {} s): a host that talks to us is not fenced",
            age.as_secs(),
            policy.fresh_heartbeat.as_secs()
        );
        return held(FenceHold::FreshHeartbeat, message);
    }
    // Nor is a host whose kubelet lives: a fencing under way when it comes
    // back (or begun on a verdict its Lease now belies) stops there.
    if s.kubelet_alive {
        let message = "its kubelet is alive (its Lease renewed lately, or its Node Ready): a live host is \
                       never fenced; what was done stands (an SRE looks)";
        return held(FenceHold::KubeletAlive, message.into());
    }
    // Confirmed steps are those of a fencing under way.
    let confirmed: &[FenceStep] = if s.under_way { s.confirmed } else { &[] };
    let cuts = s.steps.iter().any(|step| *step != FenceStep::NovaForcedDown);
    if s.under_way && cuts && s.steps.iter().all(|step| confirmed.contains(step)) {
        return Decision::Fenced { by_hand: false };
    }
    if let Some(why) = s.blind {
        return held(FenceHold::OwnViewPartial, format!("the coordinator's own view is partial: {why}"));
    }
    // An SRE's word, past a step that cannot be confirmed, once we see
    // enough to know the host is not talking to us.
    if s.under_way && s.confirmed_by_hand {
        return Decision::Fenced { by_hand: true };
    }
    let (connected, others) = s.other_agents;
    if others == 0 || connected * 2 <= others {
        let message = format!(
            "{connected} of the {others} other hosts' agents are connected (more than half are needed): \
             the coordinator may be the one cut off"
        );
        return held(FenceHold::NoAgentQuorum, message);
    }
    let (domain, lost, hosts) = s.domain;
    if lost >= 2 && lost * 100 > hosts * usize::from(policy.max_domain_share) {
        let message = format!(
            "{lost} of the {hosts} hosts of {domain} are lost at once (more than {}%): a network or \
             control-plane fault is likelier than as many dead hosts",
            policy.max_domain_share
        );
        return held(FenceHold::FailureDomainLost, message);
    }
    let (lost, hosts) = s.fleet;
    if lost >= 2 && lost * 100 > hosts * usize::from(policy.max_fleet_share) {
        let message = format!(
            "{lost} of the fleet's {hosts} hosts are lost at once (more than {}%): a network or \
             control-plane fault is likelier than as many dead hosts",
            policy.max_fleet_share
        );
        return held(FenceHold::FleetLost, message);
    }
    if !s.under_way
        && let Some(message) = domain_waits(s.failure_domain, s.fencing_domains, policy.max_domains)
    {
        return held(FenceHold::OtherDomainsFirst, message);
    }
    if let Some((step, why)) = s.failed {
        let message = format!(
            "{step} could not be confirmed: {why}. Retry it (hvctl retry), or make sure the host is \
             fenced and say so (hvctl confirm-fenced)"
        );
        return Decision::Stuck { step, message };
    }
    match s.steps.iter().find(|step| !confirmed.contains(step)) {
        Some(step) => Decision::Take(*step),
        None => nothing_cuts(),
    }
}

/// Why a new fencing in failure domain `own` waits for others: hosts of
/// more than `max` domains (`domains`, whether a fencing is under way in
/// each) are to be fenced, and `own` comes after them (those under way
/// first, then by name, so every reconcile ranks alike); None when it may
/// start. The shell asks it again under the claims' lock before a fencing
/// starts.
pub fn domain_waits(own: &str, domains: &[(&str, bool)], max: usize) -> Option<String> {
    let mut ranked: Vec<(&str, bool)> = domains.to_vec();
    if !ranked.iter().any(|(d, _)| *d == own) {
        ranked.push((own, false));
    }
    ranked.sort_by_key(|(d, under_way)| (!under_way, *d));
    let rank = ranked.iter().position(|(d, _)| *d == own)?;
    if rank < max {
        return None;
    }
    let first: Vec<&str> = ranked.iter().take(max).map(|(d, _)| *d).collect();
    Some(format!(
        "hosts of {} failure domains are to be fenced at once; at most {max} at a time: {own} waits for {}",
        ranked.len(),
        first.join(", ")
    ))
}

/// The gates that hold a host whatever other failure domains do: a host
/// they hold takes no place among the domains being fenced, or a zone's
/// fault, a stuck step or a host that lives would keep every other domain
/// waiting.
const HOLDS_ALONE: [FenceHold; 6] = [
    FenceHold::FreshHeartbeat,
    FenceHold::KubeletAlive,
    FenceHold::OwnViewPartial,
    FenceHold::NoAgentQuorum,
    FenceHold::FailureDomainLost,
    FenceHold::FleetLost,
];

/// How another host counts among the failure domains being fenced, from
/// what its status shows: `Some(true)`, a fencing that goes on;
/// `Some(false)`, a Failed host in service that would start one; None,
/// neither (fenced, a step not confirmed, held by a gate of its own, or
/// nothing to fence). `fencing`: its record, whether it counts fenced;
/// `reason`: its `Fenced` condition's reason.
pub fn domain_place(failed_in_service: bool, fencing: Option<bool>, reason: Option<&str>) -> Option<bool> {
    let held = reason.is_some_and(|r| r == STUCK || HOLDS_ALONE.iter().any(|g| g.reason() == r));
    match fencing {
        Some(true) => None,
        Some(false) => (!held).then_some(true),
        None => (failed_in_service && !held).then_some(false),
    }
}

/// The reason of a step that stands not confirmed (for an SRE).
pub const STUCK: &str = "StepNotConfirmed";

/// A host's failure domain: its rack (the value of the site's topology
/// label), within its zone where it has one; a host without a rack, or
/// with an empty one, is a domain of its own.
pub fn failure_domain(host: &str, zone: Option<&str>, rack: Option<&str>) -> String {
    let (zone, rack) = (zone.filter(|z| !z.is_empty()), rack.filter(|r| !r.is_empty()));
    match (zone, rack) {
        (Some(zone), Some(rack)) => format!("{zone}/{rack}"),
        (None, Some(rack)) => rack.to_string(),
        (_, None) => host.to_string(),
    }
}

/// A fenced host that showed life, fenced again: its power off (read
/// twice) where it has a BMC, whatever it shows meanwhile (it was fenced:
/// its servers may already run elsewhere); else an SRE's word once it no
/// longer shows life. Not held by any gate: the gates keep a live host from
/// being fenced, and this one is fenced already.
fn fence_again(s: &Situation<'_>) -> Decision {
    if s.refenced_by_hand && s.life.is_none() {
        return Decision::FencedAgain;
    }
    // Life again after its power was read off: the BMC may not be this
    // host's, or something turns it on. Not a loop of power offs, each
    // letting evacuations through: an SRE's word.
    if s.refenced_before {
        let message = "fenced, fenced again after it showed life, and showing life once more: its BMC may \
                       not be this host's, or something turns it back on. Make sure it is off, then say so \
                       (hvctl confirm-fenced)";
        return Decision::Stuck { step: FenceStep::PoweredOff, message: message.into() };
    }
    if let Some((step, why)) = s.failed {
        let message = format!(
            "fenced, then showed life again; {step} could not be confirmed: {why}. Retry it (hvctl \
             retry), or make sure the host is off and say so (hvctl confirm-fenced)"
        );
        return Decision::Stuck { step, message };
    }
    if s.steps.contains(&FenceStep::PoweredOff) {
        return Decision::Take(FenceStep::PoweredOff);
    }
    let message = "fenced, then showed life again while its servers are evacuated, and it has no BMC \
                   (spec.fencing.bmc): make sure it is off, then say so (hvctl confirm-fenced)";
    Decision::Stuck { step: FenceStep::PoweredOff, message: message.into() }
}

/// Every step confirmed, and none cut the host off: Nova's `forced_down`
/// alone stops nothing (a host that runs still writes to its volumes), so
/// with neither storage to cut nor a BMC only an SRE can say it is off.
fn nothing_cuts() -> Decision {
    let message = "the host has no BMC (spec.fencing.bmc) and no Ceph storage to cut off: Nova's \
                   forced_down alone does not stop it. Make sure it is off, then say so (hvctl confirm-fenced)";
    Decision::Stuck { step: FenceStep::PoweredOff, message: message.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [FenceStep; 3] =
        [FenceStep::NovaForcedDown, FenceStep::CephBlocklisted, FenceStep::PoweredOff];

    fn failed_host() -> Situation<'static> {
        Situation {
            health: HealthState::Failed,
            heartbeat_age: Some(SignedDuration::from_mins(5)),
            kubelet_alive: false,
            blind: None,
            other_agents: (9, 10),
            domain: ("az-1", 1, 10),
            fleet: (1, 10),
            failure_domain: "rack-1",
            fencing_domains: &[("rack-1", false)],
            steps: &ALL,
            under_way: false,
            confirmed: &[],
            failed: None,
            fenced: None,
            confirmed_by_hand: false,
            revived: false,
            life: None,
            refenced_by_hand: false,
            refenced_before: false,
        }
    }

    fn gate(d: &Decision) -> Option<FenceHold> {
        match d {
            Decision::HeldBack { gate, .. } => Some(*gate),
            _ => None,
        }
    }

    #[test]
    fn a_rack_is_a_failure_domain_within_its_zone_and_a_host_without_one_its_own() {
        assert_eq!(failure_domain("n1", Some("az-1"), Some("r7")), "az-1/r7");
        assert_eq!(failure_domain("n1", Some("az-2"), Some("r7")), "az-2/r7", "another zone's rack 7");
        assert_eq!(failure_domain("n1", None, Some("r7")), "r7");
        assert_eq!(failure_domain("n1", Some("az-1"), None), "n1");
        assert_eq!(failure_domain("n1", Some("az-1"), Some("")), "n1", "an empty rack is none");
        assert_eq!(failure_domain("n1", Some(""), Some("r7")), "r7");
    }

    #[test]
    fn only_a_fencing_that_can_go_on_takes_a_place_among_the_domains() {
        // Under way and moving, or a Failed host in service that would start.
        assert_eq!(domain_place(false, Some(false), Some("InProgress")), Some(true));
        assert_eq!(domain_place(false, Some(false), None), Some(true));
        assert_eq!(domain_place(true, None, None), Some(false));
        assert_eq!(domain_place(true, None, Some("OtherDomainsFirst")), Some(false), "waiting its turn");
        // Fenced, stuck, held by a gate of its own, or nothing to fence.
        assert_eq!(domain_place(true, Some(true), None), None);
        assert_eq!(domain_place(false, Some(false), Some(STUCK)), None);
        for gate in HOLDS_ALONE {
            assert_eq!(domain_place(true, None, Some(gate.reason())), None, "{gate:?}");
            assert_eq!(domain_place(false, Some(false), Some(gate.reason())), None, "{gate:?}");
        }
        assert_eq!(domain_place(false, None, None), None);
        assert_eq!(
            domain_waits("r3", &[("r1", true), ("r2", false)], 2).map(|m| m.contains("r3 waits for r1, r2")),
            Some(true)
        );
        assert_eq!(domain_waits("r3", &[("r1", true), ("r2", false)], 3), None);
    }

    #[test]
    fn the_sequence_has_nova_first_then_storage_then_power_where_the_host_has_them() {
        assert_eq!(sequence(true, true), ALL);
        assert_eq!(sequence(false, true), [FenceStep::NovaForcedDown, FenceStep::PoweredOff]);
        assert_eq!(sequence(false, false), [FenceStep::NovaForcedDown]);
    }

    #[test]
    fn a_failed_host_is_fenced_step_by_step_and_then_fenced() {
        let p = FencePolicy::default();
        let mut s = failed_host();
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown));
        s.under_way = true;
        s.confirmed = &ALL[..1];
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::CephBlocklisted));
        s.confirmed = &ALL[..2];
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::PoweredOff));
        s.confirmed = &ALL;
        assert_eq!(decide(&s, &p), Decision::Fenced { by_hand: false });
        // Fenced stays fenced, whatever the verdict does meanwhile.
        s.health = HealthState::Unreachable;
        s.domain = ("az-1", 8, 10);
        assert_eq!(decide(&s, &p), Decision::Fenced { by_hand: false });
    }

    #[test]
    fn only_a_failed_host_starts_a_fencing() {
        let p = FencePolicy::default();
        for health in [HealthState::Healthy, HealthState::Degraded, HealthState::Unreachable] {
            let s = Situation { health, ..failed_host() };
            assert_eq!(decide(&s, &p), Decision::Nothing, "{health}");
            // Under way, it goes on: the verdict may move between Failed and Unreachable.
            let s = Situation { health, under_way: true, ..failed_host() };
            assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown), "{health}");
        }
    }

    #[test]
    fn a_confirmation_by_hand_counts_only_for_a_fencing_under_way_seen_clearly_and_fenced_stays() {
        let p = FencePolicy::default();
        // Left over from an earlier fencing, or given before one: no step skipped.
        let s = Situation { confirmed_by_hand: true, ..failed_host() };
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown));
        let s = Situation { confirmed_by_hand: true, health: HealthState::Unreachable, ..failed_host() };
        assert_eq!(decide(&s, &p), Decision::Nothing);
        // Under way, but the coordinator has just taken over: held until it sees.
        let s =
            Situation { under_way: true, confirmed_by_hand: true, blind: Some("took over"), ..failed_host() };
        assert_eq!(gate(&decide(&s, &p)), Some(FenceHold::OwnViewPartial));
        // Recorded fenced: it stands, even when the agent talks again or
        // the confirmation is taken away.
        let s = Situation {
            under_way: true,
            fenced: Some(true),
            heartbeat_age: Some(SignedDuration::from_secs(1)),
            ..failed_host()
        };
        assert_eq!(decide(&s, &p), Decision::Fenced { by_hand: true });
    }

    #[test]
    fn nova_alone_is_no_fencing_an_sre_must_confirm_a_host_with_nothing_to_cut() {
        let p = FencePolicy::default();
        let only_nova = sequence(false, false);
        let s = Situation { steps: &only_nova, ..failed_host() };
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown));
        let s = Situation { under_way: true, confirmed: &only_nova, ..s };
        let Decision::Stuck { message, .. } = decide(&s, &p) else { panic!("{:?}", decide(&s, &p)) };
        assert!(message.contains("no BMC") && message.contains("hvctl confirm-fenced"), "{message}");
        let s = Situation { confirmed_by_hand: true, ..s };
        assert_eq!(decide(&s, &p), Decision::Fenced { by_hand: true });
    }

    #[test]
    fn each_gate_holds_a_fencing_back_and_says_why() {
        let p = FencePolicy::default();
        let cases: [(Situation<'static>, FenceHold, &str); 9] = [
            (
                Situation { heartbeat_age: Some(SignedDuration::from_secs(3)), ..failed_host() },
                FenceHold::FreshHeartbeat,
                "3 s old",
            ),
            (
                Situation { kubelet_alive: true, under_way: true, ..failed_host() },
                FenceHold::KubeletAlive,
                "kubelet is alive",
            ),
            (
                Situation { blind: Some("Nova: connection refused"), ..failed_host() },
                FenceHold::OwnViewPartial,
                "Nova",
            ),
            (Situation { other_agents: (5, 10), ..failed_host() }, FenceHold::NoAgentQuorum, "5 of the 10"),
            (Situation { other_agents: (0, 0), ..failed_host() }, FenceHold::NoAgentQuorum, "0 of the 0"),
            (
                Situation { domain: ("az-2", 6, 10), ..failed_host() },
                FenceHold::FailureDomainLost,
                "6 of the 10 hosts of az-2",
            ),
            (
                Situation { domain: ("az-2", 2, 3), ..failed_host() },
                FenceHold::FailureDomainLost,
                "2 of the 3",
            ),
            (Situation { fleet: (6, 10), ..failed_host() }, FenceHold::FleetLost, "6 of the fleet's 10"),
            (
                Situation {
                    failure_domain: "rack-c",
                    fencing_domains: &[("rack-c", false), ("rack-b", false), ("rack-a", true)],
                    ..failed_host()
                },
                FenceHold::OtherDomainsFirst,
                "rack-c waits for rack-a, rack-b",
            ),
        ];
        for (s, want, says) in cases {
            let d = decide(&s, &p);
            assert_eq!(gate(&d), Some(want), "{d:?}");
            let Decision::HeldBack { message, .. } = d else { unreachable!() };
            assert!(message.contains(says), "{message}");
        }
        // The edges that pass: half of a zone or of the fleet, one host
        // alone in its own, a heartbeat exactly as old as the bound, no
        // heartbeat ever seen; a whole rack of six lost in a fleet of 16
        // (each of its hosts fenced at once), a domain whose fencing is
        // under way ahead of others before it by name.
        for s in [
            Situation { domain: ("az-2", 5, 10), ..failed_host() },
            Situation { fleet: (5, 10), ..failed_host() },
            Situation {
                domain: ("az-1", 6, 16),
                fleet: (6, 16),
                fencing_domains: &[("rack-1", true), ("rack-2", false)],
                ..failed_host()
            },
            Situation {
                failure_domain: "rack-z",
                fencing_domains: &[("rack-a", false), ("rack-b", false), ("rack-z", true)],
                ..failed_host()
            },
            Situation { fencing_domains: &[("node-9", false), ("rack-1", false)], ..failed_host() },
            Situation { domain: ("az-2", 1, 1), ..failed_host() },
            Situation { heartbeat_age: Some(p.fresh_heartbeat), ..failed_host() },
            Situation { heartbeat_age: None, ..failed_host() },
            Situation { other_agents: (1, 1), ..failed_host() },
        ] {
            assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown), "{s:?}");
        }
        // Waiting for other domains is for starting: a fencing under way
        // goes on (its own domain ranks first then, whatever it is told).
        let fencing_domains = &[("rack-a", true), ("rack-b", true), ("rack-1", false)];
        let s = Situation { fencing_domains, under_way: true, ..failed_host() };
        assert_eq!(decide(&s, &p), Decision::Take(FenceStep::NovaForcedDown));
        let one = FencePolicy { max_domains: 1, ..p };
        let s = Situation { fencing_domains: &[("rack-0", false), ("rack-1", false)], ..failed_host() };
        assert_eq!(gate(&decide(&s, &one)), Some(FenceHold::OtherDomainsFirst), "by name: rack-0 first");
    }

    #[test]
    fn a_fenced_host_that_shows_life_is_fenced_again_before_its_evacuation_goes_on() {
        let p = FencePolicy::default();
        let fenced = Situation { under_way: true, confirmed: &ALL, fenced: Some(false), ..failed_host() };
        assert_eq!(decide(&fenced, &p), Decision::Fenced { by_hand: false });
        // Life is recorded first, whatever would hold a fencing back.
        let talks = Some(SignedDuration::from_secs(1));
        let lives =
            Situation { life: Some("its agent talks"), heartbeat_age: talks, kubelet_alive: true, ..fenced };
        assert_eq!(decide(&lives, &p), Decision::ShowsLife { sign: "its agent talks".into() });
        // Then its power goes off again, whatever it shows meanwhile; an
        // SRE's word while it shows life does not count.
        let revived = Situation { revived: true, refenced_by_hand: true, ..lives.clone() };
        assert_eq!(decide(&revived, &p), Decision::Take(FenceStep::PoweredOff));
        let dark = Situation { life: None, refenced_by_hand: false, ..revived.clone() };
        assert_eq!(decide(&dark, &p), Decision::Take(FenceStep::PoweredOff), "off, read twice");
        // Without a BMC: an SRE's word, once it no longer shows life.
        let no_bmc = sequence(true, false);
        let s =
            Situation { steps: &no_bmc, confirmed: &no_bmc, revived: true, refenced_by_hand: true, ..lives };
        let Decision::Stuck { message, .. } = decide(&s, &p) else { panic!("{:?}", decide(&s, &p)) };
        assert!(message.contains("no BMC") && message.contains("hvctl confirm-fenced"), "{message}");
        let s = Situation { life: None, ..s };
        assert_eq!(decide(&s, &p), Decision::FencedAgain);
        // A power off again not confirmed: it stands until a retry or an
        // SRE's word.
        let failed = Some((FenceStep::PoweredOff, "the BMC said On"));
        let s = Situation { failed, ..dark.clone() };
        let Decision::Stuck { message, .. } = decide(&s, &p) else { panic!("{:?}", decide(&s, &p)) };
        assert!(message.contains("the BMC said On") && message.contains("hvctl retry"), "{message}");
        let s = Situation { refenced_by_hand: true, ..s };
        assert_eq!(decide(&s, &p), Decision::FencedAgain);
        // Life once more after it was fenced again: no second power off
        // (a lying BMC would let evacuations through at each turn), an
        // SRE's word.
        let twice = Situation { refenced_before: true, ..dark.clone() };
        let Decision::Stuck { message, .. } = decide(&twice, &p) else { panic!("{:?}", decide(&twice, &p)) };
        assert!(message.contains("once more") && message.contains("hvctl confirm-fenced"), "{message}");
        let twice = Situation { refenced_by_hand: true, ..twice };
        assert_eq!(decide(&twice, &p), Decision::FencedAgain);
    }

    #[test]
    fn a_step_not_confirmed_stops_the_sequence_until_a_retry_or_a_confirmation_by_hand() {
        let p = FencePolicy::default();
        let s = Situation {
            under_way: true,
            confirmed: &ALL[..1],
            failed: Some((FenceStep::CephBlocklisted, "Ceph refused: access denied")),
            ..failed_host()
        };
        let Decision::Stuck { step, message } = decide(&s, &p) else { panic!() };
        assert_eq!(step, FenceStep::CephBlocklisted);
        assert!(message.contains("access denied") && message.contains("hvctl confirm-fenced"), "{message}");
        let by_hand = Situation { confirmed_by_hand: true, ..s.clone() };
        assert_eq!(decide(&by_hand, &p), Decision::Fenced { by_hand: true });
        // An SRE's word does not outweigh a host that talks to us.
        let alive = Situation { heartbeat_age: Some(SignedDuration::from_secs(1)), ..by_hand };
        assert_eq!(gate(&decide(&alive, &p)), Some(FenceHold::FreshHeartbeat));
    }

    /// (revived, life, refenced by hand, refenced before): what a fenced
    /// host that shows life adds.
    fn revivals() -> Vec<(bool, Option<&'static str>, bool, bool)> {
        let mut out = Vec::new();
        for revived in [false, true] {
            for life in [None, Some("agent")] {
                for by_hand in [false, true] {
                    for before in [false, true] {
                        out.push((revived, life, by_hand, before));
                    }
                }
            }
        }
        out
    }

    /// Every combination of the inputs that matter: a step is taken only in
    /// order, never past a gate, never on a live host; fenced only when
    /// every step is confirmed or an SRE said so.
    #[test]
    fn no_step_is_ever_taken_out_of_order_past_a_gate_or_on_a_live_host() {
        let p = FencePolicy::default();
        // Healthy and Degraded are alike here: neither lost.
        let healths = [HealthState::Degraded, HealthState::Unreachable, HealthState::Failed];
        let heartbeats = [None, Some(SignedDuration::from_secs(5)), Some(SignedDuration::from_mins(3))];
        let blinds = [None, Some("Nova down")];
        let agents = [(0, 0), (2, 4), (3, 4)];
        // The zone's share and the fleet's: all pass, the zone's held, the fleet's held.
        let shares = [(("d", 1, 1), (1, 10)), (("d", 3, 4), (3, 10)), (("d", 2, 4), (6, 10))];
        let ahead: [&[(&str, bool)]; 2] = [&[("d", false)], &[("a", true), ("b", true), ("d", false)]];
        let sequences =
            [sequence(true, true), sequence(true, false), sequence(false, true), sequence(false, false)];
        let failures = [None, Some((FenceStep::PoweredOff, "BMC said On"))];
        let mut seen = 0;
        for steps in &sequences {
            for health in healths {
                for (heartbeat_age, kubelet_alive) in
                    heartbeats.iter().flat_map(|h| [(*h, false), (*h, true)])
                {
                    for blind in blinds {
                        for other_agents in agents {
                            for (domain, fleet) in shares {
                                for fencing_domains in ahead {
                                    for (under_way, fenced) in
                                        [(false, None), (true, None), (true, Some(false)), (true, Some(true))]
                                    {
                                        for confirmed in (0..=steps.len()).map(|n| &steps[..n]) {
                                            for failed in failures {
                                                for (confirmed_by_hand, revival) in [false, true]
                                                    .into_iter()
                                                    .flat_map(|c| revivals().into_iter().map(move |r| (c, r)))
                                                {
                                                    let (revived, life, refenced_by_hand, refenced_before) =
                                                        revival;
                                                    let s = Situation {
                                                        health,
                                                        heartbeat_age,
                                                        kubelet_alive,
                                                        blind,
                                                        other_agents,
                                                        domain,
                                                        fleet,
                                                        failure_domain: "d",
                                                        fencing_domains,
                                                        steps,
                                                        under_way,
                                                        confirmed,
                                                        failed,
                                                        fenced,
                                                        confirmed_by_hand,
                                                        revived,
                                                        life,
                                                        refenced_by_hand,
                                                        refenced_before,
                                                    };
                                                    check(&s, &decide(&s, &p), &p);
                                                    seen += 1;
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // Per sequence of 3, 2, 2 and 1 steps: one confirmed set more than steps.
        assert_eq!(seen, 3 * 3 * 2 * 2 * 3 * 3 * 2 * 4 * 2 * 2 * revivals().len() * (4 + 3 + 3 + 2));
    }

    fn fleet_under_share(s: &Situation<'_>, p: &FencePolicy) -> bool {
        let (lost, hosts) = s.fleet;
        lost < 2 || lost * 100 <= hosts * usize::from(p.max_fleet_share)
    }

    /// The failure domains whose fencings go before the host's: those under
    /// way before those not, then by name.
    fn ahead(s: &Situation<'_>) -> usize {
        let mine = s.fencing_domains.iter().any(|(d, busy)| *d == s.failure_domain && *busy);
        let before = |d: &str, busy: bool| (busy && !mine) || (busy == mine && d < s.failure_domain);
        s.fencing_domains.iter().filter(|(d, busy)| *d != s.failure_domain && before(d, *busy)).count()
    }

    fn check(s: &Situation<'_>, d: &Decision, p: &FencePolicy) {
        let confirmed: &[FenceStep] = if s.under_way { s.confirmed } else { &[] };
        let talks = s.heartbeat_age.is_some_and(|a| a < p.fresh_heartbeat);
        let live = talks || s.kubelet_alive;
        let cuts = s.steps.iter().any(|x| *x != FenceStep::NovaForcedDown);
        // Every gate open on a host to fence: something happens.
        let (_, lost, hosts) = s.domain;
        let open = !live
            && s.blind.is_none()
            && s.other_agents.0 * 2 > s.other_agents.1
            && (lost < 2 || lost * 100 <= hosts * usize::from(p.max_domain_share))
            && fleet_under_share(s, p)
            && (s.under_way || ahead(s) < p.max_domains);
        let wanted = s.under_way || s.health == HealthState::Failed;
        if open && wanted {
            assert!(
                matches!(
                    d,
                    Decision::Take(_)
                        | Decision::Fenced { .. }
                        | Decision::Stuck { .. }
                        | Decision::ShowsLife { .. }
                        | Decision::FencedAgain
                ),
                "{s:?}"
            );
        }
        let fenced = s.under_way && s.fenced.is_some();
        let again_by_hand = s.refenced_by_hand && s.life.is_none();
        match d {
            // A fenced host that showed life: only its power off again.
            Decision::Take(step) if fenced => {
                assert!(s.revived && *step == FenceStep::PoweredOff && s.steps.contains(step), "{s:?}");
                assert!(s.failed.is_none() && !again_by_hand && !s.refenced_before, "at most once: {s:?}");
            }
            Decision::ShowsLife { .. } => assert!(fenced && !s.revived && s.life.is_some(), "{s:?}"),
            Decision::FencedAgain => assert!(fenced && s.revived && again_by_hand, "{s:?}"),
            Decision::Take(step) => {
                assert!(!live && s.blind.is_none() && s.failed.is_none() && s.fenced.is_none(), "{s:?}");
                assert!(!(s.under_way && s.confirmed_by_hand), "{s:?}");
                assert!(s.under_way || s.health == HealthState::Failed, "{s:?}");
                assert!(s.other_agents.0 * 2 > s.other_agents.1, "{s:?}");
                let (_, lost, hosts) = s.domain;
                assert!(lost < 2 || lost * 100 <= hosts * usize::from(p.max_domain_share), "{s:?}");
                assert!(fleet_under_share(s, p), "{s:?}");
                assert!(s.under_way || ahead(s) < p.max_domains, "{s:?}");
                let i = s.steps.iter().position(|x| x == step).unwrap_or(usize::MAX);
                assert!(s.steps[..i].iter().all(|x| confirmed.contains(x)), "out of order: {s:?}");
                assert!(!confirmed.contains(step), "{s:?}");
            }
            Decision::Fenced { by_hand } => match s.fenced {
                // Recorded: it stands, as recorded, unless it shows life.
                Some(recorded) => {
                    assert!(s.under_way && *by_hand == recorded, "{s:?}");
                    assert!(!s.revived && s.life.is_none(), "evacuated while it lives: {s:?}");
                }
                None => {
                    assert!(!live && s.under_way, "{s:?}");
                    assert!(!*by_hand || (s.confirmed_by_hand && s.blind.is_none()), "{s:?}");
                    assert!(*by_hand || (cuts && s.steps.iter().all(|x| confirmed.contains(x))), "{s:?}");
                }
            },
            Decision::Stuck { .. } if fenced => {
                assert!(s.revived && !again_by_hand, "{s:?}");
                let no_bmc = !s.steps.contains(&FenceStep::PoweredOff);
                assert!(s.failed.is_some() || no_bmc || s.refenced_before, "{s:?}");
            }
            Decision::Stuck { .. } => {
                let nothing_cuts = !cuts && s.steps.iter().all(|x| confirmed.contains(x));
                assert!((s.failed.is_some() || nothing_cuts) && !live && s.fenced.is_none(), "{s:?}")
            }
            Decision::HeldBack { gate, .. } => {
                assert!(s.fenced.is_none(), "{s:?}");
                assert!(*gate != FenceHold::FreshHeartbeat || talks, "{s:?}");
                assert!(*gate != FenceHold::KubeletAlive || s.kubelet_alive, "{s:?}");
                assert!(*gate != FenceHold::FleetLost || !fleet_under_share(s, p), "{s:?}");
                let waits = !s.under_way && ahead(s) >= p.max_domains;
                assert!(*gate != FenceHold::OtherDomainsFirst || waits, "{s:?}")
            }
            Decision::Nothing => assert!(!s.under_way && s.health != HealthState::Failed, "{s:?}"),
        }
    }
}
