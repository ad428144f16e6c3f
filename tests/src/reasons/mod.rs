//! The condition reasons the coordinator writes, read from its sources
//! (syn), not from a list kept by hand; and the pages that must name them
//! ([`doc`]). `tests/tests/reasons.rs` holds the one against the other.
//!
//! Every `DesiredCondition { type_, reason, .. }` built in non-test code of
//! the coordinator is a root (conditions are written only through
//! `api::condition::merge` of these; a Kubernetes `Condition` built anywhere
//! else, or a reason set after the fact, is named). Its type and reason are
//! followed back as far as the syntax says: string literals and `&str`
//! consts; `let` bindings, tuples included; `match`, `if` and block values;
//! a function's return values (a reason, or a tuple holding one), with its
//! parameters bound to the call's arguments; a parameter, to the argument of
//! every call of its function (so `DesiredCondition::new`, the lifecycle's
//! `Draft::set` and fencing's `cond` are read where they are called); a
//! struct's field, to every struct literal and assignment that fills it;
//! a type and a reason that are two fields of one value (a stored record),
//! together, to every literal that builds it, so each keeps its own;
//! `to_string()` of a type, to its `Display`. Which function a call means
//! comes from its path, or from its receiver's type, read from parameters,
//! fields, patterns, literals and return types. What cannot be read is
//! named, with its site: a reason the syntax cannot follow is one a page may
//! miss. So is a call that may mean such a function among others of its
//! name. Such a site is made readable in the code, not told here: a list of
//! exceptions kept by hand would be the list this reading replaces.
//!
//! The reading, file by file: `sources` finds the non-test sources and
//! indexes their functions, calls and fields; `syntax` has the small
//! readers of one expression or pattern; `read` follows a value back to
//! its strings, `calls` tells which function a call means, `types` reads
//! the type of a value as far as that needs; `pairs` pairs each root's
//! condition types with its reasons.

#![allow(clippy::expect_used, clippy::panic)] // a source that does not read fails the test reading it

use std::collections::{BTreeMap, BTreeSet};

mod calls;
pub mod doc;
mod pairs;
mod read;
mod sources;
mod syntax;
mod types;

pub use sources::{SrcFile, coordinator_sources};

/// What the reading of the sources found.
pub struct Reading {
    /// Every (condition type, reason) written, with where its reason is
    /// written (`file:line (function)`).
    pub pairs: BTreeMap<(String, String), BTreeSet<String>>,
    /// What could not be read, each naming its site: a reason the pages
    /// may miss.
    pub unread: BTreeSet<String>,
    /// The variants of `ConditionType`: none, and nothing was read.
    pub condition_types: BTreeSet<String>,
    /// How many `DesiredCondition` literals the reading started from.
    pub roots: usize,
}

/// The (condition, reason) pairs `files` write, and what could not be read.
pub fn read(files: &[SrcFile]) -> Reading {
    let reader = read::Reader::new(files);
    let pairs = reader.pairs();
    Reading {
        pairs,
        unread: reader.unread.take(),
        condition_types: reader.variants.clone(),
        roots: reader.idx.roots.len(),
    }
}

/// The variants of the enum `name` (the first of that name) in `files`.
pub fn variants(files: &[SrcFile], name: &str) -> BTreeSet<String> {
    sources::index(files)
        .enums
        .get(name)
        .and_then(|e| e.first())
        .map(|e| e.variants.iter().map(|v| v.ident.to_string()).collect())
        .unwrap_or_default()
}
