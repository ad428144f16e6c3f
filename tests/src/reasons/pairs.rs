//! From the roots (`DesiredCondition { type_, reason, .. }`) to the
//! (condition type, reason) pairs: each root's types paired with its
//! reasons, parameters bound call by call so a call's type stays with its
//! reason; and what writes a condition past the roots, named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use syn::Expr;
use syn::visit::Visit;

use super::read::{DEPTH, Reader, Val, Want};
use super::sources::FillTarget;
use super::syntax::{field_of, field_value, line, line_of, show};

/// (condition type, reason), each with where its reason is written.
type Pairs = BTreeMap<(String, String), BTreeSet<String>>;

impl<'a> Reader<'a> {
    /// Every (condition type, reason) the roots write, each with where its
    /// reason is written.
    pub(super) fn pairs(&self) -> Pairs {
        let mut out = BTreeMap::new();
        for &(root, f) in &self.idx.roots {
            let (Some(t), Some(r)) = (field_value(root, "type_"), field_value(root, "reason")) else {
                let at = self.at(f, line(root.brace_token.span.open()));
                self.unread.borrow_mut().insert(format!("{at}: a DesiredCondition without type_ and reason"));
                continue;
            };
            self.pair_exprs(t, r, f, 0, &mut out);
        }
        self.written_elsewhere();
        out
    }

    /// The pairs a condition type and a reason read in `f` make: two fields
    /// of one value read together (`record_pairs`); else each read on its
    /// own, every type paired with every reason.
    fn pair_exprs(&self, t: &'a Expr, r: &'a Expr, f: usize, d: usize, out: &mut Pairs) {
        if !self.record_pairs(t, r, f, d, out) {
            let types = self.values(t, f, Want::Type, None, d);
            let reasons = self.values(r, f, Want::Reason, None, d);
            self.pair_up(types, reasons, f, d, out);
        }
    }

    /// A condition type and a reason that are two fields of one value
    /// (`a.condition` and `&a.reason` of a stored record): read together
    /// from each literal that builds a value of its type, so the type a
    /// literal stores stays with the reason it stores beside it, as a
    /// call's arguments do. Either field set apart from its literal, or a
    /// value built otherwise, is named. False when they are not so.
    fn record_pairs(&self, t: &'a Expr, r: &'a Expr, f: usize, d: usize, out: &mut Pairs) -> bool {
        let (Some((base, tf)), Some((other, rf))) = (field_of(t), field_of(r)) else { return false };
        if show(base) != show(other) {
            return false;
        }
        if d > DEPTH {
            let at = self.at(f, line_of(t));
            self.unread.borrow_mut().insert(format!("{at}: `{}`: followed too deep", show(t)));
            return true;
        }
        let Some(owner) = self.type_of(base, f, d).deref().name().map(str::to_string) else { return false };
        let mut named = Vec::new();
        for fill in self.idx.fills.iter().filter(|fl| fl.field == tf || fl.field == rf) {
            let (FillTarget::Base(b), Some(w)) = (&fill.target, fill.within) else { continue };
            if self.type_of(b, w, d).deref().name() == Some(owner.as_str()) {
                let at = self.at(w, line_of(fill.value));
                named.push(format!(
                    "{at}: {owner}.{} set apart from the literal that pairs {tf} with {rf}",
                    fill.field
                ));
            }
        }
        let literals = self.idx.literals.get(&owner).map(Vec::as_slice).unwrap_or_default();
        if literals.is_empty() {
            named.push(format!("{}: `{}`: no code builds a {owner}", self.at(f, line_of(t)), show(t)));
        }
        for lit in literals {
            match (lit.within, field_value(lit.expr, &tf), field_value(lit.expr, &rf)) {
                (Some(w), Some(tv), Some(rv)) => self.pair_exprs(tv, rv, w, d + 1, out),
                _ => {
                    let path = self.files[lit.file].path.display();
                    let at = format!("{path}:{}", line(lit.expr.brace_token.span.open()));
                    named.push(format!("{at}: a {owner} built outside a function or from another (`..`)"));
                }
            }
        }
        self.unread.borrow_mut().extend(named);
        true
    }

    /// Whether function `f` names `DesiredCondition`, outside the module
    /// that defines it and merges it into the status.
    fn mentions_conditions(&self, f: usize) -> bool {
        struct Names(bool);
        impl<'ast> Visit<'ast> for Names {
            fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
                self.0 |= i == "DesiredCondition";
            }
        }
        let def = &self.idx.fns[f];
        if self.files[def.file].path == Path::new("coordinator/src/api/condition.rs") {
            return false;
        }
        let mut names = Names(false);
        names.visit_signature(def.sig);
        names.visit_block(def.body);
        names.0
    }

    /// A condition whose reason or type is changed after it is built, or a
    /// Kubernetes condition built outside `merge`: neither is read here.
    fn written_elsewhere(&self) {
        for fill in &self.idx.fills {
            let (FillTarget::Base(base), Some(w)) = (&fill.target, fill.within) else { continue };
            if !matches!(fill.field.as_str(), "reason" | "type_") {
                continue;
            }
            let at = self.at(w, line_of(fill.value));
            match self.type_of(base, w, 0).deref().name() {
                Some("DesiredCondition") => {
                    let what = format!("{at}: a condition's {} set after it is built", fill.field);
                    self.unread.borrow_mut().insert(what);
                }
                // Of an unknown type, in a function that handles conditions
                // (their sink, `merge`, aside): it may be one.
                None if self.mentions_conditions(w) => {
                    let what =
                        format!("{at}: `{}` set on a value whose type this test cannot tell", fill.field);
                    self.unread.borrow_mut().insert(what);
                }
                None => {}
                Some(_) => {}
            }
        }
        for (file, l) in &self.idx.bare_conditions {
            let path = &self.files[*file].path;
            if path != Path::new("coordinator/src/api/condition.rs") {
                self.unread.borrow_mut().insert(format!(
                    "{}:{l}: a Kubernetes Condition built outside api::condition::merge",
                    path.display()
                ));
            }
        }
    }

    fn pair_up(&self, types: Vec<Val>, reasons: Vec<Val>, f: usize, d: usize, out: &mut Pairs) {
        let lits = |v: &[Val]| -> Vec<(String, String)> {
            v.iter()
                .filter_map(|x| match x {
                    Val::Lit(s, at) => Some((s.clone(), at.clone())),
                    Val::Param(_) => None,
                })
                .collect()
        };
        for (t, _) in lits(&types) {
            for (r, at) in lits(&reasons) {
                out.entry((t.clone(), r)).or_default().insert(at);
            }
        }
        if !types.iter().chain(&reasons).any(|v| matches!(v, Val::Param(_))) {
            return;
        }
        if d > DEPTH {
            self.unread
                .borrow_mut()
                .insert(format!("{}: followed too deep through its callers", self.at_fn(f)));
            return;
        }
        let callers = self.callers_of(f);
        if callers.is_empty() {
            self.unread
                .borrow_mut()
                .insert(format!("{}: a parameter feeds a condition, and nothing calls it", self.at_fn(f)));
        }
        for c in callers {
            let site = &self.idx.calls[c];
            let args = site.args();
            let bind = |vals: &[Val], want: Want| -> Vec<Val> {
                vals.iter()
                    .flat_map(|v| match v {
                        Val::Lit(..) => vec![v.clone()],
                        Val::Param(k) => match args.get(*k) {
                            Some(a) => self.values(a, site.within, want, None, d + 1),
                            None => Vec::new(),
                        },
                    })
                    .collect()
            };
            if let ([Val::Param(i)], [Val::Param(j)]) = (types.as_slice(), reasons.as_slice())
                && let (Some(t), Some(r)) = (args.get(*i).copied(), args.get(*j).copied())
            {
                // A type and a reason the call hands on their own: read
                // together, as fields of one record may be.
                self.pair_exprs(t, r, site.within, d + 1, out);
            } else {
                let (t2, r2) = (bind(&types, Want::Type), bind(&reasons, Want::Reason));
                self.pair_up(t2, r2, site.within, d + 1, out);
            }
        }
    }
}
