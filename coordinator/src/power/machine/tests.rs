use super::*;

const LIMITS: Limits = Limits {
    read_empty: Duration::from_secs(600),
    power_off: Duration::from_secs(300),
    power_on: Duration::from_secs(300),
    agent_back: Duration::from_secs(600),
    checks: Duration::from_secs(900),
    ask_again: Duration::from_secs(60),
};

const STATES: [State; 10] = State::ALL;

/// An empty host with a BMC, its agent and nova-compute up.
fn empty() -> Seen {
    Seen {
        bmc: true,
        servers: Some(vec![]),
        domains: Some(0),
        agent_connected: true,
        compute_up: true,
        ..Seen::default()
    }
}

fn go(desired: Desired, state: State, seen: &Seen) -> (State, Option<Step>, &'static str) {
    let n = decide(desired, state, seen, &LIMITS);
    (n.state, n.step, n.reason)
}

#[test]
fn an_empty_host_hibernates_disabled_first_then_powered_off_and_read_off() {
    use Desired::Hibernating as H;
    let seen = empty();
    assert_eq!(go(H, State::Running, &seen), (State::Stopping, Some(Step::Disable), "Stopping"));
    let disabled = Seen { disabled_by_us: true, ..seen.clone() };
    assert_eq!(
        go(H, State::Stopping, &disabled),
        (State::WaitingForPowerOff, Some(Step::PowerOff), "WaitingForPowerOff")
    );
    assert_eq!(
        go(H, State::WaitingForPowerOff, &disabled),
        (State::WaitingForPowerOff, None, "WaitingForPowerOff")
    );
    let off = Seen { power: Power::Off, ..disabled.clone() };
    assert_eq!(go(H, State::WaitingForPowerOff, &off), (State::Hibernating, None, "Hibernating"));
    let down = Seen { agent_connected: false, compute_up: false, domains: None, ..off.clone() };
    assert_eq!(go(H, State::Hibernating, &down), (State::Hibernating, None, "Hibernating"));
    let failed = Seen { power: Power::Failed, ..disabled };
    assert_eq!(go(H, State::WaitingForPowerOff, &failed), (State::FailedToStop, None, "FailedToStop"));
}

#[test]
fn a_host_with_a_server_refuses_naming_it_and_an_unread_source_decides_nothing() {
    use Desired::Hibernating as H;
    let busy = Seen { servers: Some(vec!["vm-1 (6f1c…)".into()]), ..empty() };
    let n = decide(H, State::Running, &busy, &LIMITS);
    assert_eq!((n.state, n.step, n.reason), (State::Running, None, "HostNotEmpty"));
    assert_eq!(n.message, "not hibernated: Nova lists servers on it: vm-1 (6f1c…)");
    let domain = Seen { domains: Some(1), ..empty() };
    assert!(decide(H, State::Running, &domain, &LIMITS).message.ends_with("its agent reports 1 domains"));
    for unread in [Seen { servers: None, ..empty() }, Seen { domains: None, ..empty() }] {
        assert_eq!(go(H, State::Running, &unread), (State::Running, None, "EmptinessUnknown"));
        assert_eq!(go(H, State::Stopping, &unread), (State::Stopping, None, "EmptinessUnknown"));
        // Never read empty: given up, our disable undone.
        let late = Seen { disabled_by_us: true, in_state_for: LIMITS.read_empty, ..unread };
        assert_eq!(go(H, State::Stopping, &late), (State::Running, Some(Step::Enable), "EmptinessUnknown"));
    }
    // A server that lands while it is being disabled: our disable undone.
    let landed = Seen { disabled_by_us: true, ..busy };
    assert_eq!(go(H, State::Stopping, &landed), (State::Running, Some(Step::Enable), "HostNotEmpty"));
}

#[test]
fn without_a_bmc_hibernation_is_unsupported_and_nothing_is_disabled() {
    let no_bmc = Seen { bmc: false, ..empty() };
    assert_eq!(go(Desired::Hibernating, State::Running, &no_bmc), (State::Unsupported, None, "NoBmc"));
    let disabled = Seen { disabled_by_us: true, ..no_bmc };
    assert_eq!(
        go(Desired::Hibernating, State::Stopping, &disabled),
        (State::Running, Some(Step::Enable), "NoBmc")
    );
    assert_eq!(go(Desired::Running, State::Unsupported, &disabled), (State::Running, None, "Running"));
}

#[test]
fn waking_powers_on_waits_for_the_agent_runs_the_checks_then_enables() {
    use Desired::Running as R;
    let down = Seen { agent_connected: false, compute_up: false, disabled_by_us: true, ..empty() };
    assert_eq!(
        go(R, State::Hibernating, &down),
        (State::StartingMachine, Some(Step::PowerOn), "StartingMachine")
    );
    assert_eq!(go(R, State::StartingMachine, &down), (State::StartingMachine, None, "StartingMachine"));
    let on = Seen { power: Power::On, ..down.clone() };
    assert_eq!(go(R, State::StartingMachine, &on), (State::WaitingForAgent, None, "WaitingForAgent"));
    let failed = Seen { power: Power::Failed, ..down.clone() };
    assert_eq!(go(R, State::StartingMachine, &failed), (State::FailedToStart, None, "FailedToStart"));
    assert_eq!(go(R, State::WaitingForAgent, &on), (State::WaitingForAgent, None, "WaitingForAgent"));
    let half = Seen { agent_connected: true, in_state_for: LIMITS.agent_back, ..on.clone() };
    let n = decide(R, State::WaitingForAgent, &half, &LIMITS);
    assert_eq!((n.state, n.reason), (State::FailedToStart, "AgentNotBack"));
    assert_eq!(n.message, "nova-compute not back 600 s after power on");
    let back = Seen { power: Power::On, disabled_by_us: true, ..empty() };
    assert_eq!(
        go(R, State::WaitingForAgent, &back),
        (State::WaitingForChecks, Some(Step::RunChecks), "WaitingForChecks")
    );
    let running = Seen { checks: Checks::Running, ..back.clone() };
    assert_eq!(go(R, State::WaitingForChecks, &running), (State::WaitingForChecks, None, "WaitingForChecks"));
    let passed = Seen { checks: Checks::Passed, ..back.clone() };
    assert_eq!(go(R, State::WaitingForChecks, &passed), (State::Running, Some(Step::Enable), "Running"));
    let bad = Seen { checks: Checks::Failed, ..back };
    assert_eq!(go(R, State::WaitingForChecks, &bad), (State::FailedToStart, None, "ChecksFailed"));
}

#[test]
fn error_states_are_left_by_a_retry_or_the_opposite_wish() {
    let retry = Seen { retry: true, disabled_by_us: true, ..empty() };
    assert_eq!(go(Desired::Running, State::FailedToStart, &retry).0, State::StartingMachine);
    assert_eq!(go(Desired::Hibernating, State::FailedToStop, &retry).1, Some(Step::PowerOff));
    assert_eq!(go(Desired::Running, State::FailedToStop, &empty()).0, State::StartingMachine);
    assert_eq!(
        go(Desired::Hibernating, State::FailedToStart, &Seen { disabled_by_us: true, ..empty() }).0,
        State::WaitingForPowerOff
    );
    // Without either, they stay, and say how out.
    let n = decide(Desired::Running, State::FailedToStart, &empty(), &LIMITS);
    assert!(n.message.contains("retry"), "{n:?}");
}

#[test]
fn a_wish_reversed_midway_undoes_only_what_was_done() {
    let disabled = Seen { disabled_by_us: true, ..empty() };
    assert_eq!(
        go(Desired::Running, State::Stopping, &disabled),
        (State::Running, Some(Step::Enable), "Running")
    );
    assert_eq!(go(Desired::Running, State::Stopping, &empty()), (State::Running, None, "Running"));
    // Powering off asked: it is woken the whole way, through its checks,
    // once read Off (a power off landing after the power on would leave it
    // dark); past the bound, an error the wish to run moves.
    assert_eq!(
        go(Desired::Running, State::WaitingForPowerOff, &disabled),
        (State::WaitingForPowerOff, None, "WaitingForPowerOff")
    );
    let off = Seen { power: Power::Off, ..disabled.clone() };
    assert_eq!(go(Desired::Running, State::WaitingForPowerOff, &off).1, Some(Step::PowerOn));
    let late = Seen { in_state_for: LIMITS.power_off, ..disabled.clone() };
    assert_eq!(go(Desired::Running, State::WaitingForPowerOff, &late).0, State::FailedToStop);
    // Powered on behind our back while hibernated: read again.
    let on = Seen { power: Power::On, ..disabled.clone() };
    assert_eq!(
        go(Desired::Hibernating, State::Hibernating, &on),
        (State::WaitingForAgent, None, "PoweredOnElsewhere")
    );
    // Waking, asked to hibernate with a server on it: it comes back instead.
    let busy = Seen { servers: Some(vec!["vm-1".into()]), power: Power::On, ..disabled };
    let n = decide(Desired::Hibernating, State::StartingMachine, &busy, &LIMITS);
    assert_eq!((n.state, n.step, n.reason), (State::WaitingForAgent, None, "HostNotEmpty"));
}

#[test]
fn a_host_disabled_by_its_owner_is_powered_off_without_our_disable_and_woken_without_our_enable() {
    let theirs = Seen { disabled_by_others: true, ..empty() };
    assert_eq!(
        go(Desired::Hibernating, State::Running, &theirs),
        (State::WaitingForPowerOff, Some(Step::PowerOff), "WaitingForPowerOff")
    );
    let passed = Seen { checks: Checks::Passed, ..theirs };
    assert_eq!(go(Desired::Running, State::WaitingForChecks, &passed), (State::Running, None, "Running"));
}

#[test]
fn a_host_powered_on_is_never_enabled_before_its_checks_pass_whatever_the_wishes() {
    // Its checks not passed, asked to hibernate: disabled where it stands,
    // not through Stopping, whose undo would enable it.
    let enabled = empty();
    let n = decide(Desired::Hibernating, State::WaitingForChecks, &enabled, &LIMITS);
    assert_eq!((n.state, n.step), (State::WaitingForChecks, Some(Step::Disable)));
    let disabled = Seen { disabled_by_us: true, ..enabled };
    assert_eq!(go(Desired::Running, State::WaitingForChecks, &disabled).1, Some(Step::RunChecks));
}

#[test]
fn every_wait_is_bounded() {
    let past = |limit: Duration| Seen { in_state_for: limit, disabled_by_us: true, ..empty() };
    let n = decide(
        Desired::Hibernating,
        State::WaitingForPowerOff,
        &Seen { power: Power::On, ..past(LIMITS.power_off) },
        &LIMITS,
    );
    assert_eq!((n.state, n.reason), (State::FailedToStop, "FailedToStop"));
    assert_eq!(n.message, "not read Off 300 s after power off was asked");
    let n = decide(Desired::Running, State::StartingMachine, &past(LIMITS.power_on), &LIMITS);
    assert_eq!(
        (n.state, n.message.as_str()),
        (State::FailedToStart, "not read On 300 s after power on was asked")
    );
    let n = decide(
        Desired::Running,
        State::WaitingForChecks,
        &Seen { checks: Checks::Running, ..past(LIMITS.checks) },
        &LIMITS,
    );
    assert_eq!((n.state, n.reason), (State::FailedToStart, "ChecksNotDone"));
}

/// Every Seen of a grid over the inputs that matter.
fn grid() -> Vec<Seen> {
    let mut out = Vec::new();
    let servers = [None, Some(vec![]), Some(vec!["vm".to_string()])];
    let domains = [None, Some(0), Some(2)];
    let powers = [Power::Unread, Power::Off, Power::On, Power::Failed];
    let checks = [Checks::NotRun, Checks::Running, Checks::Passed, Checks::Failed];
    for s in &servers {
        for d in domains {
            for p in powers {
                for c in checks {
                    for bits in 0u8..128 {
                        out.push(Seen {
                            bmc: bits & 1 != 0,
                            servers: s.clone(),
                            domains: d,
                            disabled_by_us: bits & 2 != 0,
                            disabled_by_others: bits & 64 != 0,
                            power: p,
                            agent_connected: bits & 4 != 0,
                            compute_up: bits & 8 != 0,
                            checks: c,
                            retry: bits & 16 != 0,
                            in_state_for: if bits & 32 != 0 {
                                Duration::from_secs(3600)
                            } else {
                                Duration::ZERO
                            },
                        });
                    }
                }
            }
        }
    }
    out
}

#[test]
fn over_every_input_power_goes_off_only_on_an_empty_disabled_host_and_on_only_by_wish() {
    for desired in [Desired::Running, Desired::Hibernating] {
        for state in STATES {
            for seen in grid() {
                let n = decide(desired, state, &seen, &LIMITS);
                let case = format!("{desired:?} {state:?} {seen:?} -> {n:?}");
                let occupied = matches!(emptiness(&seen), Emptiness::Occupied(_));
                match n.step {
                    Some(Step::PowerOff) => {
                        assert!(desired == Desired::Hibernating && seen.bmc, "{case}");
                        assert!(seen.disabled_by_us || seen.disabled_by_others, "{case}");
                        assert_eq!(emptiness(&seen), Emptiness::Empty, "{case}");
                    }
                    Some(Step::PowerOn) => assert!(desired == Desired::Running || occupied, "{case}"),
                    // Enabled only where we disabled it, through passed
                    // checks, or to undo our disable before any power change.
                    Some(Step::Enable) => {
                        let checked = state == State::WaitingForChecks && seen.checks == Checks::Passed;
                        assert!(seen.disabled_by_us && (checked || state == State::Stopping), "{case}");
                        assert!(
                            desired == Desired::Running || occupied || state == State::Stopping,
                            "{case}"
                        );
                    }
                    Some(Step::Disable) => {
                        assert!(!seen.disabled_by_us && !seen.disabled_by_others, "{case}")
                    }
                    Some(Step::RunChecks) | None => {}
                }
                if n.state == State::Stopping {
                    assert!(matches!(state, State::Running | State::Unsupported | State::Stopping), "{case}");
                }
                if n.state == State::Hibernating && state != State::Hibernating {
                    assert!(state == State::WaitingForPowerOff && seen.power == Power::Off, "{case}");
                }
                assert!(!n.reason.is_empty() && !n.message.is_empty(), "{case}");
            }
        }
    }
}

/// With every wait past its bound and a retry asked, whatever the BMC
/// reads and whether or not its agent can report: every state moves, is a
/// stable one (a host in service waits to be read empty while it serves),
/// or is an error state the other wish moves.
#[test]
fn every_state_has_a_way_out_for_each_wish() {
    let stuck = |domains: Option<u32>, power: Power| Seen {
        domains,
        power,
        disabled_by_us: true,
        agent_connected: domains.is_some(),
        compute_up: domains.is_some(),
        retry: true,
        in_state_for: Duration::from_secs(86_400),
        ..empty()
    };
    for state in STATES {
        for desired in [Desired::Running, Desired::Hibernating] {
            for domains in [None, Some(0)] {
                for power in [Power::Unread, Power::On, Power::Off] {
                    let seen = stuck(domains, power);
                    let moved = decide(desired, state, &seen, &LIMITS).state != state;
                    let settled = matches!(state, State::Running | State::Hibernating | State::Unsupported);
                    let other = match desired {
                        Desired::Running => Desired::Hibernating,
                        Desired::Hibernating => Desired::Running,
                    };
                    let error = matches!(state, State::FailedToStop | State::FailedToStart)
                        && decide(other, state, &seen, &LIMITS).state != state;
                    assert!(
                        moved || settled || error,
                        "{state:?} is a dead end for {desired:?} with {seen:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_power_change_lost_on_the_way_is_asked_again_by_the_same_rules() {
    let secs = Duration::from_secs;
    let off_asked = |power, after| Seen { power, in_state_for: secs(after), disabled_by_us: true, ..empty() };
    let h = Desired::Hibernating;
    // Still On a minute after the ask (a failover between the write and the ask).
    assert_eq!(go(h, State::WaitingForPowerOff, &off_asked(Power::On, 30)).1, None);
    assert_eq!(go(h, State::WaitingForPowerOff, &off_asked(Power::On, 61)).1, Some(Step::PowerOff));
    assert_eq!(go(h, State::WaitingForPowerOff, &off_asked(Power::Unread, 61)).1, None);
    // Past its bound: failed, not asked again.
    assert_eq!(go(h, State::WaitingForPowerOff, &off_asked(Power::On, 300)).0, State::FailedToStop);
    // A server on it meanwhile: never powered off.
    let busy = Seen { servers: Some(vec!["vm-1".into()]), ..off_asked(Power::On, 61) };
    assert_eq!(go(h, State::WaitingForPowerOff, &busy).1, None);
    // Woken meanwhile: the power off is not asked again.
    assert_ne!(
        go(Desired::Running, State::WaitingForPowerOff, &off_asked(Power::On, 61)).1,
        Some(Step::PowerOff)
    );

    let on_asked = |power, after| Seen { power, in_state_for: secs(after), ..empty() };
    let r = Desired::Running;
    assert_eq!(go(r, State::StartingMachine, &on_asked(Power::Off, 30)).1, None);
    assert_eq!(go(r, State::StartingMachine, &on_asked(Power::Off, 61)).1, Some(Step::PowerOn));
    assert_eq!(go(r, State::StartingMachine, &on_asked(Power::Off, 300)).0, State::FailedToStart);
    assert_ne!(go(h, State::StartingMachine, &on_asked(Power::Off, 61)).1, Some(Step::PowerOn));
}
