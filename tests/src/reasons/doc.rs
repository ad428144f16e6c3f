//! The pages that must name what the code writes: docs/operations.md's
//! "Stuck?" section (a table of condition reasons, and one per phase of an
//! Eviction and a Migration) and its alert headings, and the alerts of the
//! chart's monitoring template whose runbook links point there.

#![allow(clippy::panic)] // a page that does not read as a table fails the test reading it

use std::collections::BTreeSet;
use std::path::Path;

pub const OPERATIONS: &str = "docs/operations.md";
pub const MONITORING: &str = "deploy/helm/hv/templates/monitoring.yaml";
pub const STUCK_HEADING: &str = "## Stuck?";
pub const ALERTS_HEADING: &str = "## Alerts";
/// The first cells of the header of the Stuck section's reason tables.
pub const TABLE_HEADER: &str = "| Condition | Reason |";

/// The phases an SRE meets on an Eviction and a Migration, each a table of
/// the Stuck section: a row per variant of the phase's enum.
pub const PHASE_TABLES: [(&str, &str); 2] =
    [("EvictionPhase", "| Eviction phase |"), ("MigrationPhase", "| Migration phase |")];

/// A row of the Stuck section's `| Condition | Reason |` tables.
pub struct Row {
    pub line: usize,
    /// The condition types of its first cell, each in backticks.
    pub types: Vec<String>,
    /// The one reason of its second cell.
    pub reason: String,
}

/// The lines of the section under `heading`, numbered from 1.
fn section<'d>(doc: &'d str, heading: &str) -> Vec<(usize, &'d str)> {
    let mut lines = doc.lines().enumerate().map(|(k, l)| (k + 1, l));
    if !lines.by_ref().any(|(_, l)| l.trim_end() == heading) {
        return Vec::new();
    }
    lines.take_while(|(_, l)| !l.starts_with("## ")).collect()
}

/// The words of a cell in backticks.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The rows of the Stuck section's tables whose header starts `header`:
/// (line, cells).
fn table_rows<'d>(doc: &'d str, header: &str) -> Vec<(usize, Vec<&'d str>)> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for (n, l) in section(doc, STUCK_HEADING) {
        let l = l.trim();
        if !l.starts_with('|') {
            in_table = false;
            continue;
        }
        if l.starts_with('|') && l.contains("---") && !l.contains('`') {
            continue;
        }
        if l.starts_with(header) {
            in_table = true;
            continue;
        }
        if in_table {
            rows.push((n, l.trim_matches('|').split('|').map(str::trim).collect()));
        }
    }
    rows
}

/// The rows of the Stuck section's tables headed `| Condition | Reason |`.
pub fn stuck_rows(doc: &str) -> Vec<Row> {
    table_rows(doc, TABLE_HEADER)
        .into_iter()
        .map(|(n, cells)| {
            let reasons = cells.get(1).map(|c| ticked(c)).unwrap_or_default();
            let [reason] = reasons.as_slice() else {
                panic!("{OPERATIONS}:{n}: a Stuck row names one reason, in backticks, in its second cell");
            };
            let types = cells.first().map(|c| ticked(c)).unwrap_or_default();
            Row { line: n, types, reason: reason.clone() }
        })
        .collect()
}

/// The file at `relative` from the workspace `root`.
pub fn read(root: &Path, relative: &str) -> String {
    std::fs::read_to_string(root.join(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// The rows of the Stuck section's table headed `header` (a phase table):
/// (line, the first word in backticks of its first cell).
pub fn phase_rows(doc: &str, header: &str) -> Vec<(usize, String)> {
    table_rows(doc, header)
        .into_iter()
        .map(|(n, cells)| (n, cells.first().and_then(|c| ticked(c).into_iter().next()).unwrap_or_default()))
        .collect()
}

/// The `### ` headings under `## Alerts`.
pub fn alert_headings(doc: &str) -> BTreeSet<&str> {
    section(doc, ALERTS_HEADING)
        .into_iter()
        .filter_map(|(_, l)| l.strip_prefix("### "))
        .map(str::trim)
        .collect()
}

/// The alerts a rules file defines (`- alert: <Name>`).
pub fn alerts(rules: &str) -> Vec<&str> {
    rules.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(str::trim).collect()
}
