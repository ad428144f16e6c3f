//! The light type reading: a value's type as far as telling which method
//! a call means, and whose field a field is, needs. From parameters,
//! fields, `let` and match patterns, literals and return types.

use syn::{Expr, Pat};

use super::read::{DEPTH, Reader};
use super::syntax::{bindings, binds, line_of, segments};

/// A type as far as the reading needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Ty {
    Named(String, Vec<Ty>),
    Tuple(Vec<Ty>),
    Unknown,
}

impl Ty {
    fn of(t: &syn::Type, owner: Option<&str>) -> Ty {
        match t {
            syn::Type::Reference(r) => Ty::of(&r.elem, owner),
            syn::Type::Paren(p) => Ty::of(&p.elem, owner),
            syn::Type::Group(g) => Ty::of(&g.elem, owner),
            syn::Type::Tuple(t) => Ty::Tuple(t.elems.iter().map(|e| Ty::of(e, owner)).collect()),
            syn::Type::Path(p) => {
                let Some(last) = p.path.segments.last() else { return Ty::Unknown };
                let mut name = last.ident.to_string();
                if name == "Self" {
                    name = owner.unwrap_or_default().to_string();
                }
                let args = match &last.arguments {
                    syn::PathArguments::AngleBracketed(a) => a
                        .args
                        .iter()
                        .filter_map(|g| match g {
                            syn::GenericArgument::Type(t) => Some(Ty::of(t, owner)),
                            _ => None,
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                Ty::Named(name, args)
            }
            _ => Ty::Unknown,
        }
    }

    pub(super) fn name(&self) -> Option<&str> {
        match self {
            Ty::Named(n, _) => Some(n),
            _ => None,
        }
    }

    fn elem(&self, k: usize) -> Ty {
        match self {
            Ty::Tuple(v) => v.get(k).cloned().unwrap_or(Ty::Unknown),
            _ => Ty::Unknown,
        }
    }

    fn arg(&self, k: usize) -> Ty {
        match self {
            Ty::Named(_, a) => a.get(k).cloned().unwrap_or(Ty::Unknown),
            _ => Ty::Unknown,
        }
    }

    /// Through the smart pointers a field access sees through.
    pub(super) fn deref(self) -> Ty {
        match &self {
            Ty::Named(n, a) if matches!(n.as_str(), "Arc" | "Box" | "Rc") && a.len() == 1 => {
                a[0].clone().deref()
            }
            _ => self,
        }
    }
}

impl<'a> Reader<'a> {
    pub(super) fn type_of(&self, e: &'a Expr, f: usize, d: usize) -> Ty {
        if d > DEPTH {
            return Ty::Unknown;
        }
        let d = d + 1;
        let owner = self.idx.fns[f].owner.clone();
        match e {
            Expr::Paren(p) => self.type_of(&p.expr, f, d),
            Expr::Group(g) => self.type_of(&g.expr, f, d),
            Expr::Reference(r) => self.type_of(&r.expr, f, d),
            Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => self.type_of(&u.expr, f, d),
            Expr::Tuple(t) => Ty::Tuple(t.elems.iter().map(|x| self.type_of(x, f, d)).collect()),
            Expr::Struct(s) => Ty::Named(segments(&s.path).last().cloned().unwrap_or_default(), Vec::new()),
            Expr::Path(p) => self.type_of_path(p, e, f, d),
            Expr::Field(x) => match &x.member {
                syn::Member::Named(m) => self.field_type(&self.type_of(&x.base, f, d), &m.to_string()),
                syn::Member::Unnamed(i) => self.type_of(&x.base, f, d).elem(i.index as usize),
            },
            Expr::Call(c) => {
                if let Expr::Path(p) = &*c.func
                    && let Some(t) = self.variant_type(&segments(&p.path), owner.as_deref())
                {
                    return t;
                }
                match self.callee_of_call(c, f) {
                    Some(g) => self.return_type(g),
                    None => Ty::Unknown,
                }
            }
            Expr::MethodCall(m) => self.type_of_method(m, f, d),
            Expr::Match(m) => m
                .arms
                .iter()
                .map(|a| self.type_of(&a.body, f, d))
                .find(|t| *t != Ty::Unknown)
                .unwrap_or(Ty::Unknown),
            Expr::If(i) => match i.then_branch.stmts.last() {
                Some(syn::Stmt::Expr(tail, None)) => self.type_of(tail, f, d),
                _ => Ty::Unknown,
            },
            Expr::Block(b) => match b.block.stmts.last() {
                Some(syn::Stmt::Expr(tail, None)) => self.type_of(tail, f, d),
                _ => Ty::Unknown,
            },
            _ => Ty::Unknown,
        }
    }

    fn type_of_method(&self, m: &'a syn::ExprMethodCall, f: usize, d: usize) -> Ty {
        let recv = || self.type_of(&m.receiver, f, d);
        match m.method.to_string().as_str() {
            "clone" | "to_owned" | "as_ref" | "as_mut" | "as_deref" | "borrow" => recv(),
            "unwrap" | "expect" | "unwrap_or_default" | "unwrap_or" | "unwrap_or_else" => recv().arg(0),
            _ => match self.callee_of_method(m, f, d) {
                Some(g) => self.return_type(g),
                None => Ty::Unknown,
            },
        }
    }

    fn return_type(&self, g: usize) -> Ty {
        let def = &self.idx.fns[g];
        match &def.sig.output {
            syn::ReturnType::Type(_, t) => Ty::of(t, def.owner.as_deref()),
            syn::ReturnType::Default => Ty::Tuple(Vec::new()),
        }
    }

    /// The enum `segs` names a variant of (`Enum::Variant`, `Self::Variant`).
    fn variant_type(&self, segs: &[String], owner: Option<&str>) -> Option<Ty> {
        let [.., en, variant] = segs else { return None };
        let en = if en == "Self" { owner?.to_string() } else { en.clone() };
        let has = self.idx.enums.get(&en)?.iter().any(|x| x.variants.iter().any(|v| v.ident == variant));
        has.then(|| Ty::Named(en, Vec::new()))
    }

    fn type_of_path(&self, p: &'a syn::ExprPath, e: &'a Expr, f: usize, d: usize) -> Ty {
        let segs = segments(&p.path);
        let owner = self.idx.fns[f].owner.clone();
        let [name] = segs.as_slice() else {
            return self.variant_type(&segs, owner.as_deref()).unwrap_or(Ty::Unknown);
        };
        if name == "self" {
            return owner.map_or(Ty::Unknown, |o| Ty::Named(o, Vec::new()));
        }
        let at = line_of(e);
        let local = self.local(f, name, at);
        let pattern = self.pattern_binding(f, name, at);
        let local_line = local.as_ref().and_then(|(_, _, pat)| binds(pat, name)).unwrap_or(0);
        let pattern_line = pattern.as_ref().map_or(0, |(_, _, l)| *l);
        if let Some((path, init, pat)) = local.filter(|_| local_line >= pattern_line) {
            if let Pat::Type(t) = pat
                && path.is_empty()
            {
                return Ty::of(&t.ty, owner.as_deref());
            }
            let mut t = self.type_of(init, f, d);
            for k in path {
                t = t.elem(k);
            }
            return t;
        }
        if let Some((pat, scrutinee, _)) = pattern {
            let t = self.type_of(scrutinee, f, d);
            return self.pattern_type(pat, t, name, owner.as_deref()).unwrap_or(Ty::Unknown);
        }
        match self.param(f, name) {
            Some((_, t)) => Ty::of(t, owner.as_deref()),
            None => Ty::Unknown,
        }
    }

    /// The nearest match arm or `if let` before line `at` binding `name`.
    pub(super) fn pattern_binding(
        &self,
        f: usize,
        name: &str,
        at: usize,
    ) -> Option<(&'a Pat, &'a Expr, usize)> {
        bindings(self.idx.fns[f].body)
            .into_iter()
            .filter(|(_, _, plain)| !*plain)
            .filter_map(|(pat, scrutinee, _)| binds(pat, name).map(|l| (pat, scrutinee, l)))
            .filter(|(_, _, l)| *l <= at)
            .max_by_key(|(_, _, l)| *l)
    }

    fn pattern_type(&self, pat: &Pat, t: Ty, name: &str, owner: Option<&str>) -> Option<Ty> {
        binds(pat, name)?;
        match pat {
            Pat::Ident(i) if i.ident == name => Some(t),
            Pat::Ident(i) => i.subpat.as_ref().and_then(|(_, p)| self.pattern_type(p, t, name, owner)),
            Pat::Reference(r) => self.pattern_type(&r.pat, t, name, owner),
            Pat::Paren(p) => self.pattern_type(&p.pat, t, name, owner),
            Pat::Type(x) => self.pattern_type(&x.pat, Ty::of(&x.ty, owner), name, owner),
            Pat::Or(o) => o.cases.iter().find_map(|c| self.pattern_type(c, t.clone(), name, owner)),
            Pat::Tuple(x) => {
                x.elems.iter().enumerate().find_map(|(k, p)| self.pattern_type(p, t.elem(k), name, owner))
            }
            Pat::TupleStruct(x) => {
                let segs = segments(&x.path);
                let fields = match segs.last().map(String::as_str) {
                    Some("Some" | "Ok") => vec![t.arg(0)],
                    Some("Err") => vec![t.arg(1)],
                    _ => self.variant_fields(&segs, &t, owner)?.into_iter().map(|(_, ty)| ty).collect(),
                };
                x.elems.iter().zip(fields).find_map(|(p, ty)| self.pattern_type(p, ty, name, owner))
            }
            Pat::Struct(x) => {
                let segs = segments(&x.path);
                let fields =
                    self.variant_fields(&segs, &t, owner).or_else(|| self.struct_fields(segs.last()?))?;
                x.fields.iter().find_map(|fp| {
                    let syn::Member::Named(m) = &fp.member else { return None };
                    let key = m.to_string();
                    let ty = fields.iter().find(|(n, _)| n.as_deref() == Some(key.as_str()))?.1.clone();
                    self.pattern_type(&fp.pat, ty, name, owner)
                })
            }
            _ => None,
        }
    }

    /// The fields of the enum variant `segs` names (the enum from the path,
    /// or the matched type `t`): (name, type), names None for a tuple variant.
    fn variant_fields(
        &self,
        segs: &[String],
        t: &Ty,
        owner: Option<&str>,
    ) -> Option<Vec<(Option<String>, Ty)>> {
        let variant = segs.last()?;
        let en = match segs {
            [.., en, _] if en == "Self" => owner?.to_string(),
            [.., en, _] => en.clone(),
            _ => t.name()?.to_string(),
        };
        let enums = self.idx.enums.get(&en)?;
        let v = enums.iter().find_map(|x| x.variants.iter().find(|v| v.ident == variant))?;
        Some(
            v.fields
                .iter()
                .map(|fl| (fl.ident.as_ref().map(ToString::to_string), Ty::of(&fl.ty, Some(en.as_str()))))
                .collect(),
        )
    }

    fn struct_fields(&self, name: &str) -> Option<Vec<(Option<String>, Ty)>> {
        let all = self.idx.structs.get(name)?;
        let [one] = all.as_slice() else { return None };
        Some(
            one.iter()
                .map(|fl| (fl.ident.as_ref().map(ToString::to_string), Ty::of(&fl.ty, Some(name))))
                .collect(),
        )
    }

    fn field_type(&self, base: &Ty, member: &str) -> Ty {
        let Some(name) = base.clone().deref().name().map(str::to_string) else { return Ty::Unknown };
        let Some(all) = self.idx.structs.get(&name) else { return Ty::Unknown };
        let types: Vec<Ty> = all
            .iter()
            .filter_map(|fields| fields.iter().find(|fl| fl.ident.as_ref().is_some_and(|i| i == member)))
            .map(|fl| Ty::of(&fl.ty, Some(name.as_str())))
            .collect();
        match types.as_slice() {
            [one] => one.clone(),
            [first, rest @ ..] if rest.iter().all(|t| t == first) => first.clone(),
            _ => Ty::Unknown,
        }
    }
}
