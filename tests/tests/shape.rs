//! The code's shape, as the style guide sets it: a reconcile reads in one screen. No function in
//! the coordinator's Kubernetes shell (`coordinator/src/k8s/`) is over 60 lines, and none in the
//! workspace's non-test code is over 100. Dependencies point down: the decisions (`lifecycle`,
//! `eviction`, `fence`, `health`, `drain`) name nothing of the shell (`k8s`, `nova`, `fleet`,
//! `metrics`). Test code (`#[cfg(test)]` modules, `#[test]` functions,
//! files of tests) is not held to it: a table of cases is long by nature.

#![allow(clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use syn::visit::Visit;

const SHELL_LIMIT: usize = 60;
const WORKSPACE_LIMIT: usize = 100;
/// The crates whose non-test sources are held to the limits.
const CRATES: [&str; 6] = ["proto", "listen", "tls", "agent", "ceph-probe", "coordinator"];

struct Long {
    file: PathBuf,
    name: String,
    line: usize,
    lines: usize,
}

struct Lengths<'a> {
    file: &'a Path,
    found: Vec<Long>,
    /// Modules declared `#[cfg(test)] mod name;`, whose files hold only tests.
    test_modules: Vec<PathBuf>,
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

impl Lengths<'_> {
    fn measure(&mut self, name: &syn::Ident, sig_start: proc_macro2::Span, body_end: proc_macro2::Span) {
        let (start, end) = (sig_start.start().line, body_end.end().line);
        self.found.push(Long {
            file: self.file.to_path_buf(),
            name: name.to_string(),
            line: start,
            lines: end + 1 - start,
        });
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        } else if m.content.is_none() {
            let stem = self.file.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
            let parent = self.file.parent().unwrap_or(Path::new(""));
            let dir =
                if matches!(stem, "mod" | "lib" | "main") { parent.to_path_buf() } else { parent.join(stem) };
            self.test_modules.push(dir.join(m.ident.to_string()));
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.measure(&f.sig.ident, f.sig.fn_token.span, f.block.brace_token.span.close());
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test(&f.attrs) {
            return;
        }
        self.measure(&f.sig.ident, f.sig.fn_token.span, f.block.brace_token.span.close());
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.measure(&f.sig.ident, f.sig.fn_token.span, block.brace_token.span.close());
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Files that hold only tests, by the workspace's naming.
fn is_test_file(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    name == "tests.rs" || name.ends_with("_tests.rs") || path.components().any(|c| c.as_os_str() == "tests")
}

/// Where a decision module names the shell: `crate::<shell>` paths.
struct ShellPaths<'a> {
    file: &'a Path,
    found: Vec<String>,
}

const SHELL: [&str; 4] = ["k8s", "nova", "fleet", "metrics"];
const DECISIONS: [&str; 5] = ["lifecycle", "eviction", "fence", "health", "drain"];

impl<'ast> Visit<'ast> for ShellPaths<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if !is_test(&f.attrs) {
            syn::visit::visit_item_fn(self, f);
        }
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let names: Vec<String> = p.segments.iter().take(2).map(|s| s.ident.to_string()).collect();
        if let [root, module] = &names[..]
            && root == "crate"
            && SHELL.contains(&module.as_str())
        {
            let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
            self.found.push(format!("{}:{line} crate::{module}", self.file.display()));
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_use_tree(&mut self, t: &'ast syn::UseTree) {
        if let syn::UseTree::Path(p) = t
            && p.ident == "crate"
        {
            let mut names = Vec::new();
            named(&p.tree, &mut names);
            for module in names.iter().filter(|n| SHELL.contains(&n.as_str())) {
                let line = p.ident.span().start().line;
                self.found.push(format!("{}:{line} use crate::{module}", self.file.display()));
            }
        }
        syn::visit::visit_use_tree(self, t);
    }
}

/// The first names a use tree below `crate::` brings in.
fn named(t: &syn::UseTree, out: &mut Vec<String>) {
    match t {
        syn::UseTree::Path(p) => out.push(p.ident.to_string()),
        syn::UseTree::Name(n) => out.push(n.ident.to_string()),
        syn::UseTree::Rename(r) => out.push(r.ident.to_string()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|i| named(i, out)),
        syn::UseTree::Glob(_) => {}
    }
}

#[test]
fn the_decisions_name_nothing_of_the_shell() {
    let root = workspace_root();
    let mut files = Vec::new();
    for module in DECISIONS {
        let dir = root.join("coordinator/src").join(module);
        sources(&dir, &mut files);
        files.push(dir.with_extension("rs"));
    }
    let mut found = Vec::new();
    let mut read = 0;
    for file in files.iter().filter(|f| f.exists()) {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        if is_test_file(relative) || relative.components().any(|c| c.as_os_str() == "tests") {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut paths = ShellPaths { file: relative, found: Vec::new() };
        paths.visit_file(&ast);
        found.extend(paths.found);
        read += 1;
    }
    assert!(read > 20, "read only {read} decision files: the walk measures nothing");
    assert!(found.is_empty(), "decision modules naming the shell:\n{}", found.join("\n"));
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

fn every_function() -> Vec<Long> {
    let root = workspace_root();
    let mut files = Vec::new();
    for krate in CRATES {
        sources(&root.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
    let mut found = Vec::new();
    let mut test_modules = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        if is_test_file(relative) {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut lengths = Lengths { file: relative, found: Vec::new(), test_modules: Vec::new() };
        lengths.visit_file(&ast);
        found.extend(lengths.found);
        test_modules.extend(lengths.test_modules);
    }
    found.retain(|f| !test_modules.iter().any(|m| f.file.with_extension("") == *m || f.file.starts_with(m)));
    found
}

#[test]
fn no_function_in_the_shell_is_over_60_lines_and_none_anywhere_over_100() {
    let all = every_function();
    assert!(all.iter().any(|f| f.name == "reconcile"), "the walk found no reconcile: it measures nothing");
    let mut over: Vec<&Long> = all
        .iter()
        .filter(|f| {
            let shell = f.file.starts_with("coordinator/src/k8s");
            f.lines > if shell { SHELL_LIMIT } else { WORKSPACE_LIMIT }
        })
        .collect();
    over.sort_by_key(|f| std::cmp::Reverse(f.lines));
    let report: Vec<String> = over
        .iter()
        .map(|f| format!("{}:{} {} is {} lines", f.file.display(), f.line, f.name, f.lines))
        .collect();
    assert!(report.is_empty(), "functions over the limit:\n{}", report.join("\n"));
}
