//! docs/operations.md against the code. Its "Stuck?" section has a row for
//! every condition reason the coordinator can write on a Hypervisor or an
//! Eviction, under the condition it is written to, and none the code no
//! longer writes; and a row for every phase of an Eviction and a Migration.
//! Every alert of the chart has its `### <AlertName>` heading under
//! `## Alerts`, where the alert's runbook link points.
//!
//! The reasons are read from the sources (syn), not from a list kept by
//! hand: `hv_tests::reasons` says how, and what it cannot read fails the
//! test, naming the site.

#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use hv_tests::reasons::doc::{
    self, ALERTS_HEADING, MONITORING, OPERATIONS, PHASE_TABLES, STUCK_HEADING, TABLE_HEADER,
};
use hv_tests::reasons::{self, SrcFile};

#[test]
fn every_condition_reason_the_code_writes_has_a_row_in_the_stuck_table_and_every_row_is_written() {
    let root = hv_tests::repo_root();
    let files = reasons::coordinator_sources(&root);
    assert!(files.len() > 100, "read only {} files of coordinator/src", files.len());
    let reading = reasons::read(&files);
    assert!(reading.condition_types.len() >= 17, "ConditionType not found: {:?}", reading.condition_types);
    assert!(reading.roots >= 3, "found {} DesiredCondition literals: the walk reads nothing", reading.roots);
    let pairs = &reading.pairs;

    let unread = &reading.unread;
    assert!(
        unread.is_empty(),
        "condition reasons this test cannot read from the code; make each readable (a string literal, a \
         `&str` const, a function returning `&'static str` from a match, a record that stores the condition \
         type beside its reason):\n{}",
        unread.iter().cloned().collect::<Vec<_>>().join("\n")
    );
    let reasons: BTreeSet<&str> = pairs.keys().map(|(_, r)| r.as_str()).collect();
    for known in [
        "Onboarded",
        "StepNotConfirmed",
        "UnknownHypervisor",
        "PausedBySre",
        "Connected",
        "Healthy",
        "NotTheMachine",
    ] {
        assert!(reasons.contains(known), "the walk missed {known}: it reads less than it should");
    }
    assert!(pairs.len() > 80, "found only {} (condition, reason) pairs", pairs.len());
    eprintln!("{} (condition, reason) pairs, {} reasons", pairs.len(), reasons.len());

    let doc = doc::read(&root, OPERATIONS);
    let rows = doc::stuck_rows(&doc);
    assert!(!rows.is_empty(), "{OPERATIONS} has no `{STUCK_HEADING}` section with a `{TABLE_HEADER}` table");
    let mut problems = Vec::new();
    for ((t, r), at) in pairs {
        if !rows.iter().any(|row| &row.reason == r && row.types.contains(t)) {
            let first = at.iter().next().cloned().unwrap_or_default();
            problems.push(format!("no row for reason `{r}` of condition `{t}` (written at {first})"));
        }
    }
    let mut seen = BTreeSet::new();
    for row in &rows {
        if !reasons.contains(row.reason.as_str()) {
            problems.push(format!(
                "{OPERATIONS}:{}: the code writes no condition with reason `{}`",
                row.line, row.reason
            ));
            continue;
        }
        if row.types.is_empty() {
            problems
                .push(format!("{OPERATIONS}:{}: the row for `{}` names no condition", row.line, row.reason));
        }
        for t in &row.types {
            if !pairs.contains_key(&(t.clone(), row.reason.clone())) {
                let under: Vec<&str> =
                    pairs.keys().filter(|(_, r)| r == &row.reason).map(|(t, _)| t.as_str()).collect();
                problems.push(format!(
                    "{OPERATIONS}:{}: `{}` is not written to condition `{t}` (the code writes it to {})",
                    row.line,
                    row.reason,
                    under.join(", ")
                ));
            }
            if !seen.insert((t.clone(), row.reason.clone())) {
                problems
                    .push(format!("{OPERATIONS}:{}: a second row for `{}` of `{t}`", row.line, row.reason));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{OPERATIONS}, section `{STUCK_HEADING}`, against the code:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_alert_of_the_chart_has_its_heading_under_alerts() {
    let root = hv_tests::repo_root();
    let rules = doc::read(&root, MONITORING);
    let alerts = doc::alerts(&rules);
    assert!(alerts.len() >= 10, "found only {} alerts in {MONITORING}", alerts.len());
    let doc = doc::read(&root, OPERATIONS);
    let headings = doc::alert_headings(&doc);
    let missing: Vec<&&str> = alerts.iter().filter(|a| !headings.contains(**a)).collect();
    assert!(
        missing.is_empty(),
        "alerts of {MONITORING} without a `### <AlertName>` heading under `{ALERTS_HEADING}` in {OPERATIONS} \
         (their runbook links point there): {missing:?}"
    );
}

#[test]
fn every_phase_of_an_eviction_and_a_migration_has_a_row() {
    let root = hv_tests::repo_root();
    let files = reasons::coordinator_sources(&root);
    let doc = doc::read(&root, OPERATIONS);
    let mut problems = Vec::new();
    for (name, header) in PHASE_TABLES {
        let variants = reasons::variants(&files, name);
        assert!(variants.len() >= 4, "{name} not found in coordinator/src");
        let rows = doc::phase_rows(&doc, header);
        let named: BTreeSet<String> = rows.iter().map(|(_, phase)| phase.clone()).collect();
        for v in variants.difference(&named) {
            problems.push(format!("{name}::{v} has no row in the `{header}` table"));
        }
        for (n, phase) in &rows {
            if !variants.contains(phase) {
                problems.push(format!("{OPERATIONS}:{n}: `{phase}` is no {name}"));
            }
        }
    }
    assert!(problems.is_empty(), "{OPERATIONS}, section `{STUCK_HEADING}`:\n{}", problems.join("\n"));
}

/// The reading itself, on a made-up source: what it must follow, a record
/// read as it was built, and a reason it cannot read named rather than
/// missed.
#[test]
fn the_reading_follows_reasons_through_their_builders_and_names_what_it_cannot_read() {
    let source = r#"
        pub enum ConditionType { Onboarded, Tested }
        pub struct DesiredCondition { pub type_: ConditionType, pub reason: String }
        impl DesiredCondition {
            pub fn new(type_: ConditionType, reason: &str) -> Self {
                DesiredCondition { type_, reason: reason.to_string() }
            }
        }
        const WAITING: &str = "Waiting";
        pub enum Gate { A, B }
        impl Gate {
            fn reason(self) -> &'static str {
                match self { Gate::A => "GateA", Gate::B => "GateB" }
            }
        }
        pub struct Refusal { pub reason: &'static str }
        fn refused(r: &Refusal) -> DesiredCondition {
            DesiredCondition::new(ConditionType::Tested, r.reason)
        }
        fn check(n: u32) -> Result<(), Refusal> {
            if n > 1 { return Err(Refusal { reason: "TooMany" }); }
            Ok(())
        }
        fn said(gate: Gate, n: u32) -> DesiredCondition {
            let (reason, _) = if n > 0 { (WAITING, 1) } else { (gate.reason(), 2) };
            DesiredCondition::new(ConditionType::Onboarded, reason)
        }
        fn dynamic(n: u32) -> DesiredCondition {
            DesiredCondition::new(ConditionType::Tested, &format!("Run{n}"))
        }
        fn later(mut c: DesiredCondition) -> DesiredCondition {
            c.reason = "Late".into();
            c
        }
        pub struct Stop { pub kind: ConditionType, pub reason: String }
        fn stop(kind: ConditionType, reason: &str) -> Stop {
            Stop { kind, reason: reason.to_string() }
        }
        fn stops() -> (Stop, Stop) {
            (stop(ConditionType::Tested, "Broken"), stop(ConditionType::Onboarded, "Lost"))
        }
        fn again(s: &Stop) -> DesiredCondition {
            DesiredCondition::new(s.kind, &s.reason)
        }
        fn reword(s: &mut Stop) {
            s.reason = "Other".into();
        }
    "#;
    let files = [SrcFile::parse("coordinator/src/made_up.rs", source).expect("the made-up source parses")];
    let reading = reasons::read(&files);
    let pairs: BTreeSet<(String, String)> = reading.pairs.into_keys().collect();
    // A record's type stays with the reason stored beside it: no
    // (Onboarded, Broken), no (Tested, Lost).
    let want: BTreeSet<(String, String)> = [
        ("Onboarded", "Waiting"),
        ("Onboarded", "GateA"),
        ("Onboarded", "GateB"),
        ("Tested", "TooMany"),
        ("Tested", "Broken"),
        ("Onboarded", "Lost"),
    ]
    .into_iter()
    .map(|(t, r)| (t.to_string(), r.to_string()))
    .collect();
    assert_eq!(pairs, want);
    let unread: Vec<String> = reading.unread.into_iter().collect();
    assert_eq!(unread.len(), 3, "{unread:?}");
    assert!(unread.iter().any(|u| u.contains("made_up.rs") && u.contains("format!")), "{unread:?}");
    assert!(
        unread.iter().any(|u| u.contains("(later)") && u.contains("set after it is built")),
        "{unread:?}"
    );
    assert!(
        unread.iter().any(|u| u.contains("(reword)") && u.contains("Stop.reason set apart")),
        "{unread:?}"
    );
}

/// The metrics show hosts by their `Fenced` condition's reason, a bounded
/// label set kept by hand (`fence::record::REASONS`, anything else `Other`):
/// it is every reason the code writes to `Fenced`, and no other. So is the
/// `SchedulingEnabled` reason the unseen gate's figure counts.
#[test]
fn the_fencing_reasons_the_metrics_name_are_those_the_code_writes() {
    let root = hv_tests::repo_root();
    let reading = reasons::read(&reasons::coordinator_sources(&root));
    let written = |t: &str| -> BTreeSet<String> {
        reading.pairs.keys().filter(|(ty, _)| ty == t).map(|(_, r)| r.clone()).collect()
    };
    let fenced = written("Fenced");
    let named: BTreeSet<String> =
        hv_coordinator::fence::record::REASONS.iter().map(|r| r.to_string()).collect();
    assert_eq!(named.len(), hv_coordinator::fence::record::REASONS.len(), "a reason named twice");
    assert_eq!(
        named,
        fenced,
        "fence::record::REASONS against the reasons the code writes to Fenced: named only {:?}, written only {:?}",
        named.difference(&fenced).collect::<Vec<_>>(),
        fenced.difference(&named).collect::<Vec<_>>()
    );
    assert!(
        written("SchedulingEnabled").contains("UnseenHeldBack"),
        "hv_hypervisors_unseen_held_back counts it"
    );
}
