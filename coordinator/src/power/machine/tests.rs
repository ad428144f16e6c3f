use super::*;

const LIMITS: Limits = Limits { agent_back: Duration::from_secs(600) };

const STATES: [State; 10] = [
    State::Running,
    State::Stopping,
    State::WaitingForPowerOff,
    State::Hibernating,
    State::StartingMachine,
    State::WaitingForAgent,
    State::WaitingForChecks,
    State::FailedToStop,
    State::FailedToStart,
    State::Unsupported,
];

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
    assert_eq!(go(H, State::Hibernating, &off), (State::Hibernating, None, "Hibernating"));
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
    let down = Seen { agent_connected: false, compute_up: false, ..empty() };
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
    let back = Seen { power: Power::On, ..empty() };
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
    // Powering off asked: it is woken the whole way, through its checks.
    assert_eq!(go(Desired::Running, State::WaitingForPowerOff, &disabled).1, Some(Step::PowerOn));
    // Waking, asked to hibernate with a server on it: it comes back instead.
    let busy = Seen { servers: Some(vec!["vm-1".into()]), power: Power::On, ..disabled };
    let n = decide(Desired::Hibernating, State::StartingMachine, &busy, &LIMITS);
    assert_eq!((n.state, n.step, n.reason), (State::WaitingForAgent, None, "HostNotEmpty"));
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
                    for bits in 0u8..32 {
                        out.push(Seen {
                            bmc: bits & 1 != 0,
                            servers: s.clone(),
                            domains: d,
                            disabled_by_us: bits & 2 != 0,
                            power: p,
                            agent_connected: bits & 4 != 0,
                            compute_up: bits & 8 != 0,
                            checks: c,
                            retry: bits & 16 != 0,
                            in_state_for: if bits & 4 != 0 { LIMITS.agent_back } else { Duration::ZERO },
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
                if n.step == Some(Step::PowerOff) {
                    assert!(desired == Desired::Hibernating && seen.bmc && seen.disabled_by_us, "{case}");
                    assert_eq!(emptiness(&seen), Emptiness::Empty, "{case}");
                }
                if n.step == Some(Step::PowerOn) {
                    assert!(desired == Desired::Running || seen.retry, "{case}");
                }
                if n.state == State::Hibernating && state != State::Hibernating {
                    assert!(state == State::WaitingForPowerOff && seen.power == Power::Off, "{case}");
                }
                // Enabled only through passed checks, or to undo our disable
                // before any power change.
                if n.step == Some(Step::Enable) {
                    let checked = state == State::WaitingForChecks && seen.checks == Checks::Passed;
                    assert!(checked || (state == State::Stopping && seen.disabled_by_us), "{case}");
                }
                assert!(!n.reason.is_empty() && !n.message.is_empty(), "{case}");
            }
        }
    }
}

#[test]
fn every_state_has_a_way_out_for_each_wish() {
    let seens = grid();
    for state in STATES {
        let stable = [State::Running, State::Hibernating, State::Unsupported].contains(&state);
        for desired in [Desired::Running, Desired::Hibernating] {
            let moves = seens.iter().any(|s| decide(desired, state, s, &LIMITS).state != state);
            let settled = matches!(
                (desired, state),
                (Desired::Running, State::Running) | (Desired::Hibernating, State::Hibernating)
            );
            assert!(moves || settled || stable, "{state:?} is a dead end for {desired:?}");
        }
    }
}
