//! Following a value back to the strings it may be: a reason, or a
//! condition type's name, each with where it is written; or a parameter
//! of the function it is read in, for its callers to bind.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use syn::visit::Visit;
use syn::{Expr, Pat};

use super::sources::{FillTarget, Index, SrcFile, index};
use super::syntax::{bindings, binds, diverges, line, line_of, position, returned, segments, show};

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    Reason,
    Type,
}

/// A value read: a string (a reason, or a condition type's name) and where
/// it is written, or the enclosing function's parameter.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Val {
    Lit(String, String),
    Param(usize),
}

pub(super) const DEPTH: usize = 48;

pub(super) struct Reader<'a> {
    pub(super) files: &'a [SrcFile],
    pub(super) idx: Index<'a>,
    pub(super) variants: BTreeSet<String>,
    pub(super) unread: RefCell<BTreeSet<String>>,
    pub(super) callers: RefCell<HashMap<usize, Vec<usize>>>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(files: &'a [SrcFile]) -> Reader<'a> {
        let idx = index(files);
        let variants = idx
            .enums
            .get("ConditionType")
            .and_then(|v| v.first())
            .map(|e| e.variants.iter().map(|v| v.ident.to_string()).collect())
            .unwrap_or_default();
        Reader {
            files,
            idx,
            variants,
            unread: RefCell::new(BTreeSet::new()),
            callers: RefCell::new(HashMap::new()),
        }
    }

    pub(super) fn at(&self, f: usize, l: usize) -> String {
        let def = &self.idx.fns[f];
        format!("{}:{l} ({})", self.files[def.file].path.display(), def.name)
    }

    pub(super) fn at_fn(&self, f: usize) -> String {
        self.at(f, line(self.idx.fns[f].sig.ident.span()))
    }

    fn fail(&self, f: usize, e: &Expr, why: &str) -> Vec<Val> {
        self.unread.borrow_mut().insert(format!("{}: `{}`: {why}", self.at(f, line_of(e)), show(e)));
        Vec::new()
    }

    pub(super) fn param(&self, f: usize, name: &str) -> Option<(usize, &'a syn::Type)> {
        let typed = self.idx.fns[f].sig.inputs.iter().filter_map(|a| match a {
            syn::FnArg::Typed(t) => Some(t),
            syn::FnArg::Receiver(_) => None,
        });
        typed.enumerate().find_map(|(k, t)| match &*t.pat {
            Pat::Ident(i) if i.ident == name => Some((k, &*t.ty)),
            _ => None,
        })
    }

    pub(super) fn arity(&self, f: usize) -> usize {
        self.idx.fns[f].sig.inputs.iter().filter(|a| matches!(a, syn::FnArg::Typed(_))).count()
    }

    /// The nearest `let` before line `at` that binds `name`: its pattern
    /// position and value.
    pub(super) fn local(&self, f: usize, name: &str, at: usize) -> Option<(Vec<usize>, &'a Expr, &'a Pat)> {
        let body = self.idx.fns[f].body;
        bindings(body)
            .into_iter()
            .filter(|(_, _, plain)| *plain)
            .filter_map(|(pat, init, _)| position(pat, name).map(|(path, l)| (path, l, init, pat)))
            .filter(|(_, l, _, _)| *l <= at)
            .max_by_key(|(_, l, _, _)| *l)
            .map(|(path, _, init, pat)| (path, init, pat))
    }

    pub(super) fn values(
        &self,
        e: &'a Expr,
        f: usize,
        want: Want,
        pos: Option<usize>,
        depth: usize,
    ) -> Vec<Val> {
        if depth > DEPTH {
            return self.fail(f, e, "followed too deep");
        }
        let d = depth + 1;
        match e {
            Expr::Paren(p) => self.values(&p.expr, f, want, pos, d),
            Expr::Group(g) => self.values(&g.expr, f, want, pos, d),
            Expr::Reference(r) => self.values(&r.expr, f, want, pos, d),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.values(&u.expr, f, want, pos, d),
            Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. })
                if want == Want::Reason && pos.is_none() =>
            {
                vec![Val::Lit(s.value(), self.at(f, line(s.span())))]
            }
            Expr::Tuple(t) => match pos.and_then(|k| t.elems.iter().nth(k)) {
                Some(x) => self.values(x, f, want, None, d),
                None => self.fail(f, e, "a tuple where one value was expected"),
            },
            Expr::Match(m) => m.arms.iter().flat_map(|a| self.values(&a.body, f, want, pos, d)).collect(),
            Expr::If(i) => {
                let mut out = self.block(&i.then_branch, f, want, pos, d, e);
                if let Some((_, other)) = &i.else_branch {
                    out.extend(self.values(other, f, want, pos, d));
                }
                out
            }
            Expr::Block(b) => self.block(&b.block, f, want, pos, d, e),
            Expr::Unsafe(b) => self.block(&b.block, f, want, pos, d, e),
            _ if diverges(e) => Vec::new(),
            Expr::Path(p) => self.path(p, e, f, want, pos, d),
            Expr::Field(x) => self.field(x, e, f, want, pos, d),
            Expr::Call(c) => self.call(c, e, f, want, pos, d),
            Expr::MethodCall(m) => self.method(m, e, f, want, pos, d),
            _ => self.fail(f, e, "not a form this test reads"),
        }
    }

    fn block(
        &self,
        b: &'a syn::Block,
        f: usize,
        want: Want,
        pos: Option<usize>,
        d: usize,
        e: &'a Expr,
    ) -> Vec<Val> {
        match b.stmts.last() {
            Some(syn::Stmt::Expr(tail, None)) => self.values(tail, f, want, pos, d),
            Some(syn::Stmt::Expr(last, Some(_))) if diverges(last) => Vec::new(),
            Some(syn::Stmt::Macro(m))
                if m.mac
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "panic" || s.ident == "unreachable") =>
            {
                Vec::new()
            }
            _ => self.fail(f, e, "a block with no value"),
        }
    }

    fn type_leaf(&self, f: usize, segs: &[String]) -> Option<String> {
        let [.., owner, variant] = segs else { return None };
        let file = self.idx.fns[f].file;
        let aliased = self.idx.aliases.get(&file).is_some_and(|a| a.contains(owner));
        ((owner == "ConditionType" || aliased) && self.variants.contains(variant)).then(|| variant.clone())
    }

    fn path(
        &self,
        p: &'a syn::ExprPath,
        e: &'a Expr,
        f: usize,
        want: Want,
        pos: Option<usize>,
        d: usize,
    ) -> Vec<Val> {
        let segs = segments(&p.path);
        if want == Want::Type
            && let Some(v) = self.type_leaf(f, &segs)
        {
            return vec![Val::Lit(v, self.at(f, line_of(e)))];
        }
        if let [name] = segs.as_slice() {
            let at = line_of(e);
            let local = self.local(f, name, at);
            let local_line = local.as_ref().and_then(|(_, _, pat)| binds(pat, name)).unwrap_or(0);
            if self.pattern_binding(f, name, at).is_some_and(|(_, _, l)| l > local_line) {
                return self.fail(
                    f,
                    e,
                    "bound by a match arm or an `if let`, which this test does not follow",
                );
            }
            if let Some((path, init, _)) = local {
                return match (path.as_slice(), pos) {
                    ([], pos) => self.values(init, f, want, pos, d),
                    ([k], None) => self.values(init, f, want, Some(*k), d),
                    _ => self.fail(f, e, "bound deeper in a pattern than this test reads"),
                };
            }
            if let Some((k, _)) = self.param(f, name) {
                return match pos {
                    None => vec![Val::Param(k)],
                    Some(_) => self.fail(f, e, "a tuple parameter"),
                };
            }
        }
        if want == Want::Reason
            && pos.is_none()
            && let Some(v) = self.constant(f, &segs, e)
        {
            return v;
        }
        self.fail(f, e, "a name this test cannot follow (a closure's parameter, a pattern's binding?)")
    }

    /// A `&str` const named by `segs` (its last segment; a module before it
    /// picks among several of that name).
    fn constant(&self, f: usize, segs: &[String], e: &'a Expr) -> Option<Vec<Val>> {
        let name = segs.last()?;
        let mut found: Vec<&(usize, String, &Expr)> =
            self.idx.consts.iter().filter(|(_, n, _)| n == name).collect();
        if found.len() > 1 {
            let module = segs.len().checked_sub(2).map(|k| &segs[k]);
            let file = self.idx.fns[f].file;
            let pick: Vec<_> = match module {
                Some(m) => found.iter().copied().filter(|(fi, _, _)| &self.files[*fi].module == m).collect(),
                None => found.iter().copied().filter(|(fi, _, _)| *fi == file).collect(),
            };
            if !pick.is_empty() {
                found = pick;
            }
        }
        let texts: BTreeSet<(String, String)> = found
            .iter()
            .filter_map(|(fi, _, x)| match x {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => {
                    Some((s.value(), format!("{}:{}", self.files[*fi].path.display(), line(s.span()))))
                }
                _ => None,
            })
            .collect();
        let values: BTreeSet<&String> = texts.iter().map(|(v, _)| v).collect();
        match values.len() {
            0 => None,
            1 => Some(texts.into_iter().take(1).map(|(v, at)| Val::Lit(v, at)).collect()),
            _ => Some(self.fail(f, e, "several consts of this name")),
        }
    }

    fn field(
        &self,
        x: &'a syn::ExprField,
        e: &'a Expr,
        f: usize,
        want: Want,
        pos: Option<usize>,
        d: usize,
    ) -> Vec<Val> {
        let syn::Member::Named(member) = &x.member else {
            return self.fail(f, e, "a tuple field");
        };
        if want != Want::Reason || pos.is_some() {
            return self.fail(f, e, "a field where a condition type or a tuple was expected");
        }
        let Some(owner) = self.type_of(&x.base, f, d).deref().name().map(str::to_string) else {
            return self.fail(f, e, "a field of a value whose type this test cannot read");
        };
        let member = member.to_string();
        let mut out = Vec::new();
        let mut any = false;
        for fill in self.idx.fills.iter().filter(|fl| fl.field == member) {
            let target = match &fill.target {
                FillTarget::Literal(n) => Some(n.clone()),
                FillTarget::Base(b) => {
                    fill.within.and_then(|w| self.type_of(b, w, d).deref().name().map(str::to_string))
                }
            };
            if target.as_deref() != Some(owner.as_str()) {
                continue;
            }
            any = true;
            let Some(w) = fill.within else {
                continue;
            };
            let vals = self.values(fill.value, w, Want::Reason, None, d);
            out.extend(if w == f { vals } else { self.closed(vals, w, Want::Reason, d) });
        }
        if !any {
            return self.fail(f, e, &format!("no code fills {owner}.{member}"));
        }
        out
    }

    /// `vals` of function `g` with its parameters replaced by what every
    /// call of `g` gives them.
    fn closed(&self, vals: Vec<Val>, g: usize, want: Want, d: usize) -> Vec<Val> {
        if d > DEPTH {
            self.unread
                .borrow_mut()
                .insert(format!("{}: followed too deep through its callers", self.at_fn(g)));
            return Vec::new();
        }
        let mut out = Vec::new();
        for v in vals {
            match v {
                Val::Lit(..) => out.push(v),
                Val::Param(k) => {
                    for c in self.callers_of(g) {
                        let site = &self.idx.calls[c];
                        let Some(arg) = site.args().get(k).copied() else { continue };
                        let got = self.values(arg, site.within, want, None, d + 1);
                        out.extend(self.closed(got, site.within, want, d + 1));
                    }
                }
            }
        }
        out
    }

    /// `vals` read in the callee `g`, its parameters bound to `args`, read
    /// in `f`.
    fn bound(
        &self,
        vals: Vec<Val>,
        args: &[&'a Expr],
        f: usize,
        want: Want,
        d: usize,
        e: &'a Expr,
    ) -> Vec<Val> {
        let mut out = Vec::new();
        for v in vals {
            match v {
                Val::Lit(..) => out.push(v),
                Val::Param(k) => match args.get(k) {
                    Some(a) => out.extend(self.values(a, f, want, None, d)),
                    None => out.extend(self.fail(f, e, "a parameter without its argument")),
                },
            }
        }
        out
    }

    fn returns(&self, g: usize, want: Want, pos: Option<usize>, d: usize) -> Vec<Val> {
        returned(self.idx.fns[g].body).into_iter().flat_map(|r| self.values(r, g, want, pos, d)).collect()
    }

    fn call(
        &self,
        c: &'a syn::ExprCall,
        e: &'a Expr,
        f: usize,
        want: Want,
        pos: Option<usize>,
        d: usize,
    ) -> Vec<Val> {
        let Some(g) = self.callee_of_call(c, f) else {
            return self.fail(f, e, "a call of a function this test cannot find");
        };
        let args: Vec<&Expr> = c.args.iter().collect();
        let vals = self.returns(g, want, pos, d);
        self.bound(vals, &args, f, want, d, e)
    }

    fn method(
        &self,
        m: &'a syn::ExprMethodCall,
        e: &'a Expr,
        f: usize,
        want: Want,
        pos: Option<usize>,
        d: usize,
    ) -> Vec<Val> {
        let name = m.method.to_string();
        if m.args.is_empty()
            && matches!(name.as_str(), "to_string" | "into" | "clone" | "to_owned" | "as_str" | "as_ref")
        {
            if name == "to_string"
                && let Some(fmt) =
                    self.type_of(&m.receiver, f, d).name().and_then(|n| self.idx.display.get(n))
            {
                return self.display(*fmt, e, f, d);
            }
            return self.values(&m.receiver, f, want, pos, d);
        }
        let Some(g) = self.callee_of_method(m, f, d) else {
            return self.fail(f, e, "a method this test cannot tell (the receiver's type?)");
        };
        let args: Vec<&Expr> = m.args.iter().collect();
        let vals = self.returns(g, want, pos, d);
        self.bound(vals, &args, f, want, d, e)
    }

    /// The texts a type's `Display` writes: what its `fmt` hands `write_str`.
    fn display(&self, fmt: usize, e: &'a Expr, f: usize, d: usize) -> Vec<Val> {
        struct W<'a>(Option<&'a Expr>);
        impl<'a> Visit<'a> for W<'a> {
            fn visit_expr_method_call(&mut self, m: &'a syn::ExprMethodCall) {
                if m.method == "write_str" && self.0.is_none() {
                    self.0 = m.args.first();
                }
                syn::visit::visit_expr_method_call(self, m);
            }
        }
        let mut w = W(None);
        w.visit_block(self.idx.fns[fmt].body);
        match w.0 {
            Some(arg) => self.values(arg, fmt, Want::Reason, None, d),
            None => self.fail(f, e, "a Display that does not hand its text to write_str"),
        }
    }
}
