//! The code's shape, as the style guide sets it: a reconcile reads in one screen. No function in
//! the coordinator's Kubernetes shell (`coordinator/src/k8s/`) is over 60 lines, and none in the
//! workspace's non-test code is over 100. Dependencies point down: the decisions (`lifecycle`,
//! `eviction`, `fence`, `health`, `drain`) name nothing of the shell (`k8s`, `nova`, `fleet`,
//! `metrics`), whatever the path (`crate::`, `super::`, inside a macro). Test code
//! (`#[cfg(test)]` modules and the files they are, `#[test]` functions) is not held to it: a
//! table of cases is long by nature. The benchmarks are: they are programs an SRE runs.

#![allow(clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use syn::visit::Visit;

const SHELL_LIMIT: usize = 60;
const WORKSPACE_LIMIT: usize = 100;
/// The crates whose non-test sources are held to the limits.
const CRATES: [&str; 6] = ["proto", "listen", "tls", "agent", "ceph-probe", "coordinator"];
/// The benchmarks' sources, held to the workspace's limit too.
const BENCHES: [&str; 2] = ["agent/benches", "tests/examples"];

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

/// Whether `file` (relative to the root) is a module declared `#[cfg(test)]`,
/// or inside one.
fn in_test_module(file: &Path, test_modules: &[PathBuf]) -> bool {
    let module = file.with_extension("");
    let module = if module.file_name().is_some_and(|n| n == "mod") {
        module.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        module
    };
    test_modules.iter().any(|m| module.starts_with(m))
}

/// Every module path declared `#[cfg(test)] mod name;` in `files`.
fn test_modules(root: &Path, files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for file in files {
        let relative = file.strip_prefix(root).unwrap_or(file);
        let text = std::fs::read_to_string(file).expect("read a source file");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut lengths = Lengths { file: relative, found: Vec::new(), test_modules: Vec::new() };
        lengths.visit_file(&ast);
        out.extend(lengths.test_modules);
    }
    out
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
        let names: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if shell_named(&names).is_some() {
            let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
            self.found.push(format!("{}:{line} {}", self.file.display(), names.join("::")));
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_use_tree(&mut self, t: &'ast syn::UseTree) {
        let mut paths = Vec::new();
        use_paths(t, &mut Vec::new(), &mut paths);
        for names in paths.iter().filter(|n| shell_named(n).is_some()) {
            self.found.push(format!("{}: use {}", self.file.display(), names.join("::")));
        }
    }
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // A macro's body is tokens, not paths: read as its text.
        let text = m.tokens.to_string();
        for module in SHELL {
            let named = ["crate", "super"].iter().any(|root| {
                let at = format!("{root} :: {module}");
                text.match_indices(&at).any(|(i, _)| {
                    let next = text[i + at.len()..].chars().next();
                    next.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
                })
            });
            if named {
                let name = m.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
                self.found.push(format!("{}: {name}!(… {module} …)", self.file.display()));
            }
        }
        syn::visit::visit_macro(self, m);
    }
}

/// The shell module a path names, when it starts at the crate's root or
/// climbs to it (`crate::`, `super::`, `self::`) and then names one.
fn shell_named(names: &[String]) -> Option<&str> {
    let relative = names.first().is_some_and(|n| matches!(n.as_str(), "crate" | "super" | "self"));
    let first = names.iter().find(|n| !matches!(n.as_str(), "crate" | "super" | "self"))?;
    (relative && SHELL.contains(&first.as_str())).then_some(first.as_str())
}

/// Every path a use tree brings in, from its root.
fn use_paths(t: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match t {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => out.push([prefix.clone(), vec![n.ident.to_string()]].concat()),
        syn::UseTree::Rename(r) => out.push([prefix.clone(), vec![r.ident.to_string()]].concat()),
        syn::UseTree::Glob(_) => out.push(prefix.clone()),
        syn::UseTree::Group(g) => g.items.iter().for_each(|i| use_paths(i, prefix, out)),
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
    files.retain(|f| f.exists());
    let mut all = Vec::new();
    sources(&root.join("coordinator/src"), &mut all);
    let tests = test_modules(&root, &all);
    let mut found = Vec::new();
    let mut read = 0;
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        if in_test_module(relative, &tests) {
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
    for benches in BENCHES {
        sources(&root.join(benches), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
    let mut found = Vec::new();
    let mut test_modules = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file);
        let text = std::fs::read_to_string(file).expect("read a source file");
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{} does not parse: {e}", file.display()));
        let mut lengths = Lengths { file: relative, found: Vec::new(), test_modules: Vec::new() };
        lengths.visit_file(&ast);
        found.extend(lengths.found);
        test_modules.extend(lengths.test_modules);
    }
    found.retain(|f| !in_test_module(&f.file, &test_modules));
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
