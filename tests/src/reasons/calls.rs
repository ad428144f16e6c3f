//! Which function a call means: from its path, or from its receiver's
//! type; and, the other way, every call of a function.

use syn::Expr;

use super::read::Reader;
use super::sources::{CallKind, FnDef};
use super::syntax::{bindings, binds, segments};

impl<'a> Reader<'a> {
    pub(super) fn callee_of_call(&self, c: &'a syn::ExprCall, f: usize) -> Option<usize> {
        match self.candidates_of_call(c, f).as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// The functions a call may mean: its path's (a type's, a module's, or
    /// a free function's, those of its own file first), of its arity.
    fn candidates_of_call(&self, c: &'a syn::ExprCall, f: usize) -> Vec<usize> {
        let Expr::Path(p) = &*c.func else { return Vec::new() };
        let segs = segments(&p.path);
        let Some(name) = segs.last() else { return Vec::new() };
        let arity = c.args.len();
        let here = self.idx.fns[f].file;
        let named = |g: &&FnDef<'_>| &g.name == name;
        let candidates: Vec<usize> = match segs.len() {
            1 => {
                // A closure of that name in the caller is not a function.
                if bindings(self.idx.fns[f].body).iter().any(|(pat, _, _)| binds(pat, name).is_some()) {
                    return Vec::new();
                }
                self.pick(|g| named(&g) && g.owner.is_none(), arity, here)
            }
            n => {
                let qual = &segs[n - 2];
                let owner = if qual == "Self" { self.idx.fns[f].owner.clone() } else { Some(qual.clone()) };
                let by_type = self.pick(|g| named(&g) && g.owner == owner, arity, here);
                if by_type.is_empty() {
                    self.pick(
                        |g| named(&g) && g.owner.is_none() && &self.files[g.file].module == qual,
                        arity,
                        here,
                    )
                } else {
                    by_type
                }
            }
        };
        candidates
    }

    /// The functions `keep` takes with `arity` parameters (not counting
    /// `self`); those in file `here` when some are.
    fn pick(&self, keep: impl Fn(&FnDef<'_>) -> bool, arity: usize, here: usize) -> Vec<usize> {
        let all: Vec<usize> =
            (0..self.idx.fns.len()).filter(|g| keep(&self.idx.fns[*g]) && self.arity(*g) == arity).collect();
        let local: Vec<usize> = all.iter().copied().filter(|g| self.idx.fns[*g].file == here).collect();
        if local.is_empty() { all } else { local }
    }

    pub(super) fn callee_of_method(&self, m: &'a syn::ExprMethodCall, f: usize, d: usize) -> Option<usize> {
        match self.candidates_of_method(m, f, d).as_slice() {
            [one] => Some(*one),
            _ => None,
        }
    }

    /// The methods a method call may mean: its receiver's type's, or, that
    /// type unknown, every method of that name; of its arity.
    fn candidates_of_method(&self, m: &'a syn::ExprMethodCall, f: usize, d: usize) -> Vec<usize> {
        let name = m.method.to_string();
        let arity = m.args.len();
        let receiver_ty = self.type_of(&m.receiver, f, d).deref();
        let methods = |g: &FnDef<'_>| g.name == name && g.sig.receiver().is_some();
        let found: Vec<usize> = match receiver_ty.name() {
            Some(t) => (0..self.idx.fns.len())
                .filter(|g| methods(&self.idx.fns[*g]) && self.idx.fns[*g].owner.as_deref() == Some(t))
                .collect(),
            None => (0..self.idx.fns.len()).filter(|g| methods(&self.idx.fns[*g])).collect(),
        };
        found.into_iter().filter(|g| self.arity(*g) == arity).collect()
    }

    /// The calls whose callee is `g`. A call that may mean `g` among
    /// others cannot be read: it is named.
    pub(super) fn callers_of(&self, g: usize) -> Vec<usize> {
        if let Some(c) = self.callers.borrow().get(&g) {
            return c.clone();
        }
        let name = &self.idx.fns[g].name;
        let mut found = Vec::new();
        for (c, site) in self.idx.calls.iter().enumerate().filter(|(_, s)| &s.name() == name) {
            let candidates = match site.kind {
                CallKind::Call(x) => self.candidates_of_call(x, site.within),
                CallKind::Method(x) => self.candidates_of_method(x, site.within, 0),
            };
            match candidates.as_slice() {
                [one] if *one == g => found.push(c),
                many if many.contains(&g) => {
                    let at = self.at(site.within, site.line());
                    self.unread.borrow_mut().insert(format!(
                        "{at}: a call of `{name}` that may be {}, whose parameters feed a condition, or \
                         another of {} functions of that name (the receiver's type?)",
                        self.at_fn(g),
                        many.len()
                    ));
                }
                _ => {}
            }
        }
        self.callers.borrow_mut().insert(g, found.clone());
        found
    }
}
