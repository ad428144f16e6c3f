//! Small readers of one expression, pattern or body: where it is, how it
//! reads in a message, what a pattern binds, what a body returns.

use proc_macro2::Span;
use syn::visit::Visit;
use syn::{Expr, Pat};

pub(super) fn line(span: Span) -> usize {
    span.start().line
}

/// The line of the first token of `e`.
pub(super) fn line_of(e: &Expr) -> usize {
    struct First(Option<usize>);
    impl<'ast> Visit<'ast> for First {
        fn visit_ident(&mut self, i: &'ast proc_macro2::Ident) {
            self.0.get_or_insert(line(i.span()));
        }
        fn visit_lit(&mut self, l: &'ast syn::Lit) {
            self.0.get_or_insert(line(l.span()));
        }
    }
    let mut first = First(None);
    first.visit_expr(e);
    first.0.unwrap_or(0)
}

/// A short rendering of `e`, for messages.
pub(super) fn show(e: &Expr) -> String {
    let list = |args: &syn::punctuated::Punctuated<Expr, syn::Token![,]>| {
        args.iter().map(show).collect::<Vec<_>>().join(", ")
    };
    match e {
        Expr::Path(p) => p.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::"),
        Expr::Field(f) => match &f.member {
            syn::Member::Named(n) => format!("{}.{n}", show(&f.base)),
            syn::Member::Unnamed(i) => format!("{}.{}", show(&f.base), i.index),
        },
        Expr::MethodCall(m) => format!("{}.{}({})", show(&m.receiver), m.method, list(&m.args)),
        Expr::Call(c) => format!("{}({})", show(&c.func), list(&c.args)),
        Expr::Reference(r) => format!("&{}", show(&r.expr)),
        Expr::Paren(p) => format!("({})", show(&p.expr)),
        Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => format!("{:?}", s.value()),
        Expr::Macro(m) => format!(
            "{}!(…)",
            m.mac.path.segments.iter().map(|s| s.ident.to_string()).collect::<Vec<_>>().join("::")
        ),
        Expr::Tuple(t) => format!("({})", list(&t.elems)),
        Expr::Match(_) => "match …".into(),
        Expr::If(_) => "if …".into(),
        Expr::Block(_) => "{ … }".into(),
        _ => "…".into(),
    }
}

pub(super) fn segments(p: &syn::Path) -> Vec<String> {
    p.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// Where `name` is bound in `pat`: the tuple positions down to it.
pub(super) fn position(pat: &Pat, name: &str) -> Option<(Vec<usize>, usize)> {
    match pat {
        Pat::Ident(i) if i.ident == name => Some((Vec::new(), line(i.ident.span()))),
        Pat::Type(t) => position(&t.pat, name),
        Pat::Reference(r) => position(&r.pat, name),
        Pat::Paren(p) => position(&p.pat, name),
        Pat::Tuple(t) => t.elems.iter().enumerate().find_map(|(k, p)| {
            position(p, name).map(|(mut path, l)| {
                path.insert(0, k);
                (path, l)
            })
        }),
        _ => None,
    }
}

/// Whether `pat` binds `name` anywhere (and on which line).
pub(super) fn binds(pat: &Pat, name: &str) -> Option<usize> {
    struct Finds<'n>(&'n str, Option<usize>);
    impl<'ast> Visit<'ast> for Finds<'_> {
        fn visit_pat_ident(&mut self, i: &'ast syn::PatIdent) {
            if i.ident == self.0 {
                self.1.get_or_insert(line(i.ident.span()));
            }
            syn::visit::visit_pat_ident(self, i);
        }
    }
    let mut f = Finds(name, None);
    f.visit_pat(pat);
    f.1
}

/// Every `let`, match arm and `if let` pattern of a body with the value
/// it binds from: (pattern, value, whether it is a plain `let`).
pub(super) fn bindings(body: &syn::Block) -> Vec<(&Pat, &Expr, bool)> {
    struct B<'a>(Vec<(&'a Pat, &'a Expr, bool)>);
    impl<'a> Visit<'a> for B<'a> {
        fn visit_local(&mut self, l: &'a syn::Local) {
            if let Some(init) = &l.init {
                self.0.push((&l.pat, &init.expr, true));
            }
            syn::visit::visit_local(self, l);
        }
        fn visit_expr_match(&mut self, m: &'a syn::ExprMatch) {
            for arm in &m.arms {
                self.0.push((&arm.pat, &m.expr, false));
            }
            syn::visit::visit_expr_match(self, m);
        }
        fn visit_expr_let(&mut self, l: &'a syn::ExprLet) {
            self.0.push((&l.pat, &l.expr, false));
            syn::visit::visit_expr_let(self, l);
        }
    }
    let mut b = B(Vec::new());
    b.visit_block(body);
    b.0
}

/// A function's values: its tail, and every `return` (not a closure's).
pub(super) fn returned(body: &syn::Block) -> Vec<&Expr> {
    struct R<'a>(Vec<&'a Expr>);
    impl<'a> Visit<'a> for R<'a> {
        fn visit_expr_return(&mut self, r: &'a syn::ExprReturn) {
            if let Some(e) = &r.expr {
                self.0.push(e);
            }
            syn::visit::visit_expr_return(self, r);
        }
        fn visit_expr_closure(&mut self, _: &'a syn::ExprClosure) {}
        fn visit_item_fn(&mut self, _: &'a syn::ItemFn) {}
    }
    let mut r = R(Vec::new());
    r.visit_block(body);
    if let Some(syn::Stmt::Expr(tail, None)) = body.stmts.last() {
        r.0.push(tail);
    }
    r.0
}

pub(super) fn diverges(e: &Expr) -> bool {
    match e {
        Expr::Return(_) | Expr::Break(_) | Expr::Continue(_) => true,
        Expr::Macro(m) => m.mac.path.segments.last().is_some_and(|s| {
            matches!(s.ident.to_string().as_str(), "panic" | "unreachable" | "todo" | "unimplemented")
        }),
        _ => false,
    }
}

/// The base and the name of the field `e` reads (`a.reason`, through `&`,
/// parentheses, `.clone()` and `.as_str()`).
pub(super) fn field_of(e: &Expr) -> Option<(&Expr, String)> {
    match e {
        Expr::Reference(r) => field_of(&r.expr),
        Expr::Paren(p) => field_of(&p.expr),
        Expr::Group(g) => field_of(&g.expr),
        Expr::MethodCall(m) if m.args.is_empty() && (m.method == "clone" || m.method == "as_str") => {
            field_of(&m.receiver)
        }
        Expr::Field(f) => match &f.member {
            syn::Member::Named(n) => Some((&f.base, n.to_string())),
            syn::Member::Unnamed(_) => None,
        },
        _ => None,
    }
}

/// The value a struct literal gives its field `name`.
pub(super) fn field_value<'e>(s: &'e syn::ExprStruct, name: &str) -> Option<&'e Expr> {
    s.fields.iter().find(|fv| matches!(&fv.member, syn::Member::Named(i) if i == name)).map(|fv| &fv.expr)
}
