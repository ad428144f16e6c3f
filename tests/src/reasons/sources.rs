//! The coordinator's non-test sources, and their index: its functions,
//! calls, consts, types, and where a struct's field is filled.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use syn::Expr;
use syn::visit::Visit;

use super::syntax::{line, line_of};

/// A parsed source file: its path from the workspace root, and the name of
/// its module (which picks among consts of one name).
pub struct SrcFile {
    pub(super) path: PathBuf,
    pub(super) module: String,
    pub(super) ast: syn::File,
}

impl SrcFile {
    /// `text` parsed, as the file at `path` (from the workspace root).
    pub fn parse(path: &str, text: &str) -> syn::Result<SrcFile> {
        Ok(SrcFile::new(PathBuf::from(path), syn::parse_file(text)?))
    }

    fn new(path: PathBuf, ast: syn::File) -> SrcFile {
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let module = if stem == "mod" {
            path.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()).unwrap_or_default().into()
        } else {
            stem
        };
        SrcFile { path, module, ast }
    }
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.is_ident("test") || path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        path.is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test"))
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module paths declared `#[cfg(test)] mod name;` in `file`.
fn test_modules_of(file: &Path, ast: &syn::File) -> Vec<PathBuf> {
    struct Mods<'p> {
        file: &'p Path,
        found: Vec<PathBuf>,
    }
    impl<'ast> Visit<'ast> for Mods<'_> {
        fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
            if !is_test(&m.attrs) {
                syn::visit::visit_item_mod(self, m);
            } else if m.content.is_none() {
                let stem = self.file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
                let parent = self.file.parent().unwrap_or(Path::new(""));
                let dir = if matches!(stem, "mod" | "lib" | "main") {
                    parent.to_path_buf()
                } else {
                    parent.join(stem)
                };
                self.found.push(dir.join(m.ident.to_string()));
            }
        }
    }
    let mut mods = Mods { file, found: Vec::new() };
    mods.visit_file(ast);
    mods.found
}

fn in_test_module(file: &Path, test_modules: &[PathBuf]) -> bool {
    let module = file.with_extension("");
    let module = if module.file_name().is_some_and(|n| n == "mod") {
        module.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        module
    };
    test_modules.iter().any(|m| module.starts_with(m))
}

/// The coordinator's non-test source files, parsed.
pub fn coordinator_sources(root: &Path) -> Vec<SrcFile> {
    let mut paths = Vec::new();
    rust_files(&root.join("coordinator/src"), &mut paths);
    paths.sort();
    let mut parsed = Vec::new();
    let mut tests = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path).expect("read a source file");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()));
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        tests.extend(test_modules_of(&relative, &ast));
        parsed.push((relative, ast));
    }
    parsed
        .into_iter()
        .filter(|(p, _)| !in_test_module(p, &tests))
        .map(|(path, ast)| SrcFile::new(path, ast))
        .collect()
}

pub(super) struct FnDef<'a> {
    pub(super) file: usize,
    pub(super) name: String,
    /// The type of its `impl` (or its trait), for a method.
    pub(super) owner: Option<String>,
    pub(super) sig: &'a syn::Signature,
    pub(super) body: &'a syn::Block,
}

pub(super) enum CallKind<'a> {
    Call(&'a syn::ExprCall),
    Method(&'a syn::ExprMethodCall),
}

pub(super) struct CallSite<'a> {
    pub(super) kind: CallKind<'a>,
    /// The function it is made in.
    pub(super) within: usize,
}

impl<'a> CallSite<'a> {
    pub(super) fn name(&self) -> String {
        match self.kind {
            CallKind::Call(c) => match &*c.func {
                Expr::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default(),
                _ => String::new(),
            },
            CallKind::Method(m) => m.method.to_string(),
        }
    }

    pub(super) fn line(&self) -> usize {
        match self.kind {
            CallKind::Call(c) => line_of(&c.func),
            CallKind::Method(m) => line(m.method.span()),
        }
    }

    pub(super) fn args(&self) -> Vec<&'a Expr> {
        match self.kind {
            CallKind::Call(c) => c.args.iter().collect(),
            CallKind::Method(m) => m.args.iter().collect(),
        }
    }
}

/// A struct literal, or an assignment to a field: where a field is filled.
pub(super) struct Fill<'a> {
    /// The struct literal's type, or the assigned field's base.
    pub(super) target: FillTarget<'a>,
    pub(super) field: String,
    pub(super) value: &'a Expr,
    pub(super) within: Option<usize>,
}

pub(super) enum FillTarget<'a> {
    Literal(String),
    Base(&'a Expr),
}

/// A struct literal: where a value of its type is built, all its fields
/// at once.
pub(super) struct Literal<'a> {
    pub(super) expr: &'a syn::ExprStruct,
    pub(super) file: usize,
    pub(super) within: Option<usize>,
}

#[derive(Default)]
pub(super) struct Index<'a> {
    pub(super) fns: Vec<FnDef<'a>>,
    pub(super) consts: Vec<(usize, String, &'a Expr)>,
    pub(super) structs: HashMap<String, Vec<&'a syn::Fields>>,
    pub(super) enums: HashMap<String, Vec<&'a syn::ItemEnum>>,
    /// A type's `Display::fmt`.
    pub(super) display: HashMap<String, usize>,
    pub(super) calls: Vec<CallSite<'a>>,
    pub(super) fills: Vec<Fill<'a>>,
    /// Struct literals by the name of their type (`Self` read as the
    /// `impl`'s).
    pub(super) literals: HashMap<String, Vec<Literal<'a>>>,
    /// `DesiredCondition { .. }` literals, with the function they are in.
    pub(super) roots: Vec<(&'a syn::ExprStruct, usize)>,
    /// Per file, the names `ConditionType` is imported as.
    pub(super) aliases: HashMap<usize, BTreeSet<String>>,
    /// Kubernetes `Condition { .. }` literals: (file, line).
    pub(super) bare_conditions: Vec<(usize, usize)>,
}

fn type_name(t: &syn::Type) -> Option<String> {
    match t {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        syn::Type::Reference(r) => type_name(&r.elem),
        syn::Type::Paren(p) => type_name(&p.elem),
        syn::Type::Group(g) => type_name(&g.elem),
        _ => None,
    }
}

struct Indexer<'a, 'i> {
    idx: &'i mut Index<'a>,
    file: usize,
    owners: Vec<Option<String>>,
    /// The `impl` is `Display for …`.
    displays: Vec<bool>,
    within: Vec<usize>,
}

impl<'a> Indexer<'a, '_> {
    fn add_fn(&mut self, sig: &'a syn::Signature, body: &'a syn::Block, method: bool) -> usize {
        let owner = if method { self.owners.last().cloned().flatten() } else { None };
        let id = self.idx.fns.len();
        let name = sig.ident.to_string();
        if method
            && self.displays.last() == Some(&true)
            && name == "fmt"
            && let Some(o) = &owner
        {
            self.idx.display.insert(o.clone(), id);
        }
        self.idx.fns.push(FnDef { file: self.file, name, owner, sig, body });
        id
    }
}

impl<'a> Visit<'a> for Indexer<'a, '_> {
    fn visit_item_mod(&mut self, m: &'a syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_impl(&mut self, i: &'a syn::ItemImpl) {
        if is_test(&i.attrs) {
            return;
        }
        let display = i
            .trait_
            .as_ref()
            .is_some_and(|(_, p, _)| p.segments.last().is_some_and(|s| s.ident == "Display"));
        self.owners.push(type_name(&i.self_ty));
        self.displays.push(display);
        syn::visit::visit_item_impl(self, i);
        self.displays.pop();
        self.owners.pop();
    }
    fn visit_item_trait(&mut self, t: &'a syn::ItemTrait) {
        self.owners.push(Some(t.ident.to_string()));
        self.displays.push(false);
        syn::visit::visit_item_trait(self, t);
        self.displays.pop();
        self.owners.pop();
    }
    fn visit_item_fn(&mut self, f: &'a syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let id = self.add_fn(&f.sig, &f.block, false);
        self.within.push(id);
        syn::visit::visit_item_fn(self, f);
        self.within.pop();
    }
    fn visit_impl_item_fn(&mut self, f: &'a syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        let id = self.add_fn(&f.sig, &f.block, true);
        self.within.push(id);
        syn::visit::visit_impl_item_fn(self, f);
        self.within.pop();
    }
    fn visit_trait_item_fn(&mut self, f: &'a syn::TraitItemFn) {
        if let Some(body) = &f.default {
            let id = self.add_fn(&f.sig, body, true);
            self.within.push(id);
            syn::visit::visit_trait_item_fn(self, f);
            self.within.pop();
        }
    }
    fn visit_item_const(&mut self, c: &'a syn::ItemConst) {
        self.idx.consts.push((self.file, c.ident.to_string(), &c.expr));
        syn::visit::visit_item_const(self, c);
    }
    fn visit_impl_item_const(&mut self, c: &'a syn::ImplItemConst) {
        self.idx.consts.push((self.file, c.ident.to_string(), &c.expr));
        syn::visit::visit_impl_item_const(self, c);
    }
    fn visit_item_struct(&mut self, s: &'a syn::ItemStruct) {
        self.idx.structs.entry(s.ident.to_string()).or_default().push(&s.fields);
    }
    fn visit_item_enum(&mut self, e: &'a syn::ItemEnum) {
        self.idx.enums.entry(e.ident.to_string()).or_default().push(e);
    }
    fn visit_item_use(&mut self, u: &'a syn::ItemUse) {
        fn renames(t: &syn::UseTree, out: &mut Vec<String>) {
            match t {
                syn::UseTree::Path(p) => renames(&p.tree, out),
                syn::UseTree::Rename(r) if r.ident == "ConditionType" => out.push(r.rename.to_string()),
                syn::UseTree::Group(g) => g.items.iter().for_each(|i| renames(i, out)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        renames(&u.tree, &mut out);
        self.idx.aliases.entry(self.file).or_default().extend(out);
    }
    fn visit_expr_call(&mut self, c: &'a syn::ExprCall) {
        if let Some(&within) = self.within.last() {
            self.idx.calls.push(CallSite { kind: CallKind::Call(c), within });
        }
        syn::visit::visit_expr_call(self, c);
    }
    fn visit_expr_method_call(&mut self, m: &'a syn::ExprMethodCall) {
        if let Some(&within) = self.within.last() {
            self.idx.calls.push(CallSite { kind: CallKind::Method(m), within });
        }
        syn::visit::visit_expr_method_call(self, m);
    }
    fn visit_expr_struct(&mut self, s: &'a syn::ExprStruct) {
        let name = s.path.segments.last().map(|x| x.ident.to_string()).unwrap_or_default();
        let within = self.within.last().copied();
        if name == "DesiredCondition"
            && let Some(f) = within
        {
            self.idx.roots.push((s, f));
        }
        if s.path.segments.len() == 1 && name == "Condition" {
            self.idx.bare_conditions.push((self.file, line(s.brace_token.span.open())));
        }
        let built = match self.owners.last() {
            Some(Some(owner)) if name == "Self" => owner.clone(),
            _ => name.clone(),
        };
        let literal = Literal { expr: s, file: self.file, within };
        self.idx.literals.entry(built).or_default().push(literal);
        for fv in &s.fields {
            if let syn::Member::Named(field) = &fv.member {
                let target = FillTarget::Literal(name.clone());
                self.idx.fills.push(Fill { target, field: field.to_string(), value: &fv.expr, within });
            }
        }
        syn::visit::visit_expr_struct(self, s);
    }
    fn visit_expr_assign(&mut self, a: &'a syn::ExprAssign) {
        if let Expr::Field(f) = &*a.left
            && let syn::Member::Named(field) = &f.member
        {
            let within = self.within.last().copied();
            let target = FillTarget::Base(&f.base);
            self.idx.fills.push(Fill { target, field: field.to_string(), value: &a.right, within });
        }
        syn::visit::visit_expr_assign(self, a);
    }
}

pub(super) fn index(files: &[SrcFile]) -> Index<'_> {
    let mut idx = Index::default();
    for (file, src) in files.iter().enumerate() {
        let mut ix =
            Indexer { idx: &mut idx, file, owners: Vec::new(), displays: Vec::new(), within: Vec::new() };
        ix.visit_file(&src.ast);
    }
    idx
}
