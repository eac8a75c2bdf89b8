//! The floor plan: no import circle between the source files of any crate, and no
//! source file grows past the size where it starts holding several jobs. `cargo test -p
//! colibri-floor-plan` checks it; `cargo run -p colibri-floor-plan` prints what it finds.
//!
//! Checked: no import circle between the source files of any crate, and no
//! source file grows past the size where it starts holding several jobs.
//!
//! A file depends on another when it names an item defined there — through `use`, or a path
//! anywhere in its code (`crate::…`, `super::…`, a module it imported). Re-exports are
//! followed to the file that defines the item, so `pub use` in a `mod.rs` or `lib.rs` is a
//! door, not a dependency of everyone who walks through it; a declaration `mod x;` is not a
//! dependency either. Test modules (`#[cfg(test)]`) are left out: they sit above the code they
//! test. Paths inside macro invocations are not seen (an under-count, never a false circle).
//!
//! The same graph is what `ARCHITECTURE.md` describes as layers; this test is how it stays
//! true. It prints every circle it finds with the edges that close it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use quote::ToTokens;
use syn::visit::Visit;

/// Source files longer than this hold more than one job (kernels and tests excepted).
pub const MAX_LINES: usize = 1200;

/// The crates whose source trees are checked, relative to the workspace root.
const CRATES: &[&str] = &["engine", "daemon", "client", "proto", "tests"];

type ModPath = Vec<String>;

/// One `use` binding: the local name, the path it stands for, whether it is a glob.
type Binding = (String, ModPath, bool);

/// One module (a file, or an inline `mod x { … }` inside one).
#[derive(Default)]
struct Module {
    file: PathBuf,
    /// Child modules by name.
    children: BTreeSet<String>,
    /// Names of items defined here (fn, struct, enum, trait, const, static, type, union, macro).
    items: BTreeSet<String>,
    /// `use` bindings: local name → the path it stands for (absolute, resolved at collection).
    uses: BTreeMap<String, ModPath>,
    /// `use x::*`: the absolute module paths globbed in.
    globs: Vec<ModPath>,
}

struct Crate {
    modules: BTreeMap<ModPath, Module>,
    /// Paths each module names, absolute (resolved against that module's position).
    refs: Vec<(ModPath, ModPath)>,
}

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && {
            let text = a.meta.to_token_stream().to_string();
            text.contains("test") && !text.contains("not (test") && !text.contains("not(test")
        }
    })
}

/// Turns a path as written in module `at` into an absolute module path (first segment
/// "crate"), or None when it names something outside the crate (std, another crate, a local).
fn absolute(
    krate: &BTreeMap<ModPath, Module>,
    at: &ModPath,
    segs: &[String],
    local_uses: &BTreeMap<String, ModPath>,
) -> Option<ModPath> {
    let first = segs.first()?;
    let mut base: ModPath = match first.as_str() {
        "crate" => vec!["crate".into()],
        "self" => at.clone(),
        "super" => {
            let mut p = at.clone();
            let mut rest = segs;
            while rest.first().map(|s| s == "super") == Some(true) {
                p.pop()?;
                rest = &rest[1..];
            }
            let mut out = p;
            out.extend(rest.iter().cloned());
            return Some(out);
        }
        name => {
            if let Some(bound) = local_uses.get(name) {
                let mut out = bound.clone();
                out.extend(segs[1..].iter().cloned());
                return Some(out);
            }
            if krate.get(at).map(|m| m.children.contains(name)) == Some(true) {
                let mut out = at.clone();
                out.extend(segs.iter().cloned());
                return Some(out);
            }
            return None;
        }
    };
    base.extend(segs[1..].iter().cloned());
    Some(base)
}

/// The file that defines what `path` names, following re-exports; None when outside the crate.
fn defining_file(krate: &Crate, path: &ModPath, depth: usize) -> Option<PathBuf> {
    if depth > 16 {
        return None;
    }
    // Descend through modules as far as the path names them.
    let mut at: ModPath = vec!["crate".into()];
    if path.first().map(String::as_str) != Some("crate") {
        return None;
    }
    let mut i = 1;
    while i < path.len() {
        let mut next = at.clone();
        next.push(path[i].clone());
        if krate.modules.contains_key(&next) {
            at = next;
            i += 1;
        } else {
            break;
        }
    }
    let module = krate.modules.get(&at)?;
    if i == path.len() {
        return Some(module.file.clone());
    }
    let name = &path[i];
    if module.items.contains(name) {
        return Some(module.file.clone());
    }
    if let Some(bound) = module.uses.get(name) {
        if bound.first().map(String::as_str) != Some("crate") {
            return None; // re-export of another crate's item
        }
        let mut follow = bound.clone();
        follow.extend(path[i + 1..].iter().cloned());
        return defining_file(krate, &follow, depth + 1);
    }
    for glob in &module.globs {
        let mut follow = glob.clone();
        follow.extend(path[i..].iter().cloned());
        if let Some(f) = defining_file(krate, &follow, depth + 1) {
            if f != module.file {
                return Some(f);
            }
        }
    }
    // A method, an enum variant, an associated item or something a macro made: the module's file.
    Some(module.file.clone())
}

fn use_tree(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Binding>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_tree(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                let bind = prefix.last().cloned().unwrap_or_default();
                out.push((bind, prefix.clone(), false));
            } else {
                let mut p = prefix.clone();
                p.push(name.clone());
                out.push((name, p, false));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut p = prefix.clone();
            let name = r.ident.to_string();
            if name != "self" {
                p.push(name);
            }
            out.push((r.rename.to_string(), p, false));
        }
        syn::UseTree::Glob(_) => out.push((String::new(), prefix.clone(), true)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                use_tree(t, prefix, out);
            }
        }
    }
}

/// Collects modules (first pass: names only) from a parsed file.
fn collect_modules(
    items: &[syn::Item],
    at: ModPath,
    file: &Path,
    dir: &Path,
    modules: &mut BTreeMap<ModPath, Module>,
    asts: &mut Vec<(ModPath, PathBuf, Vec<syn::Item>)>,
) {
    let mut module = Module {
        file: file.to_path_buf(),
        ..Default::default()
    };
    for item in items {
        match item {
            syn::Item::Mod(m) => {
                if is_cfg_test(&m.attrs) {
                    continue;
                }
                let name = m.ident.to_string();
                module.children.insert(name.clone());
                let mut child = at.clone();
                child.push(name.clone());
                if let Some((_, inner)) = &m.content {
                    collect_modules(inner, child, file, &dir.join(&name), modules, asts);
                } else {
                    let candidates = [
                        dir.join(format!("{name}.rs")),
                        dir.join(&name).join("mod.rs"),
                    ];
                    let path_attr = m.attrs.iter().find(|a| a.path().is_ident("path"));
                    let found = if path_attr.is_some() {
                        None
                    } else {
                        candidates.iter().find(|p| p.exists()).cloned()
                    };
                    if let Some(path) = found {
                        let text = std::fs::read_to_string(&path).unwrap();
                        let parsed = syn::parse_file(&text)
                            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                        collect_modules(
                            &parsed.items,
                            child,
                            &path,
                            &dir.join(&name),
                            modules,
                            asts,
                        );
                    }
                }
            }
            syn::Item::Fn(f) if !is_cfg_test(&f.attrs) => {
                module.items.insert(f.sig.ident.to_string());
            }
            syn::Item::Struct(s) => {
                module.items.insert(s.ident.to_string());
            }
            syn::Item::Enum(e) => {
                module.items.insert(e.ident.to_string());
            }
            syn::Item::Trait(t) => {
                module.items.insert(t.ident.to_string());
            }
            syn::Item::Const(c) => {
                module.items.insert(c.ident.to_string());
            }
            syn::Item::Static(s) => {
                module.items.insert(s.ident.to_string());
            }
            syn::Item::Type(t) => {
                module.items.insert(t.ident.to_string());
            }
            syn::Item::Union(u) => {
                module.items.insert(u.ident.to_string());
            }
            syn::Item::Macro(m) => {
                if let Some(id) = &m.ident {
                    module.items.insert(id.to_string());
                }
            }
            _ => {}
        }
    }
    modules.insert(at.clone(), module);
    asts.push((at, file.to_path_buf(), items.to_vec()));
}

/// Every path a module's own code names (not its inline child modules', which are visited
/// as modules of their own).
struct PathCollector {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathCollector {
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.segments.len() >= 2 || p.leading_colon.is_none() {
            self.paths
                .push(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}
    fn visit_item_use(&mut self, _: &'ast syn::ItemUse) {}
    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}
}

fn skip_test_item(item: &syn::Item) -> bool {
    match item {
        syn::Item::Fn(f) => is_cfg_test(&f.attrs),
        syn::Item::Impl(i) => is_cfg_test(&i.attrs),
        syn::Item::Use(u) => is_cfg_test(&u.attrs),
        syn::Item::Const(c) => is_cfg_test(&c.attrs),
        syn::Item::Struct(s) => is_cfg_test(&s.attrs),
        _ => false,
    }
}

fn load_crate(root: &Path) -> Option<Crate> {
    let src = root.join("src");
    let entry = ["lib.rs", "main.rs"]
        .iter()
        .map(|f| src.join(f))
        .find(|p| p.exists())?;
    let mut modules = BTreeMap::new();
    let mut asts = Vec::new();
    // A crate with both a library and a binary: the binary (main.rs) is a crate of its own,
    // above the library, and only imports it.
    let text = std::fs::read_to_string(&entry).unwrap();
    let parsed = syn::parse_file(&text).unwrap();
    collect_modules(
        &parsed.items,
        vec!["crate".into()],
        &entry,
        &src,
        &mut modules,
        &mut asts,
    );
    // Second pass: bindings (which need every module's name) and references.
    let mut refs = Vec::new();
    let mut bindings: Vec<(ModPath, Vec<Binding>)> = Vec::new();
    for (at, _, items) in &asts {
        let mut out = Vec::new();
        for item in items {
            if let syn::Item::Use(u) = item {
                if is_cfg_test(&u.attrs) {
                    continue;
                }
                let mut prefix = Vec::new();
                if u.leading_colon.is_some() {
                    continue;
                }
                use_tree(&u.tree, &mut prefix, &mut out);
            }
        }
        bindings.push((at.clone(), out));
    }
    // Resolve bindings to absolute paths: in Rust 2018+ a `use` path starts with crate/self/
    // super, a child module, or another crate.
    for (at, list) in &bindings {
        let empty = BTreeMap::new();
        let mut resolved = BTreeMap::new();
        let mut globs = Vec::new();
        for (name, path, glob) in list {
            let Some(abs) = absolute(&modules, at, path, &empty) else {
                continue;
            };
            refs.push((at.clone(), abs.clone()));
            if *glob {
                globs.push(abs);
            } else {
                resolved.insert(name.clone(), abs);
            }
        }
        let m = modules.get_mut(at).unwrap();
        m.uses = resolved;
        m.globs = globs;
    }
    for (at, _, items) in &asts {
        let mut collector = PathCollector { paths: Vec::new() };
        for item in items {
            if skip_test_item(item) {
                continue;
            }
            collector.visit_item(item);
        }
        let uses = modules[at].uses.clone();
        for segs in collector.paths {
            if segs.len() < 2 && !uses.contains_key(&segs[0]) {
                continue;
            }
            if let Some(abs) = absolute(&modules, at, &segs, &uses) {
                refs.push((at.clone(), abs));
            }
        }
    }
    Some(Crate { modules, refs })
}

/// Strongly connected components with more than one file (Tarjan).
fn circles(edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct T<'a> {
        edges: &'a BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: HashMap<&'a PathBuf, usize>,
        low: HashMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on: BTreeSet<&'a PathBuf>,
        n: usize,
        out: Vec<Vec<PathBuf>>,
    }
    fn strong<'a>(t: &mut T<'a>, v: &'a PathBuf) {
        t.index.insert(v, t.n);
        t.low.insert(v, t.n);
        t.n += 1;
        t.stack.push(v);
        t.on.insert(v);
        if let Some(ws) = t.edges.get(v) {
            for w in ws {
                if !t.index.contains_key(w) {
                    strong(t, w);
                    let l = t.low[w].min(t.low[v]);
                    t.low.insert(v, l);
                } else if t.on.contains(w) {
                    let l = t.index[w].min(t.low[v]);
                    t.low.insert(v, l);
                }
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        n: 0,
        out: Vec::new(),
    };
    let nodes: Vec<&PathBuf> = edges.keys().collect();
    for v in nodes {
        if !t.index.contains_key(v) {
            strong(&mut t, v);
        }
    }
    t.out
}

/// The workspace root (this crate lives in tools/floor_plan).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn file_graph(krate: &Crate) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for m in krate.modules.values() {
        edges.entry(m.file.clone()).or_default();
    }
    for (from, to) in &krate.refs {
        let Some(src) = krate.modules.get(from).map(|m| m.file.clone()) else {
            continue;
        };
        if let Some(dst) = defining_file(krate, to, 0) {
            if dst != src {
                edges.entry(src).or_default().insert(dst);
            }
        }
    }
    edges
}

/// The report of one circle: its files and the edges among them.
fn describe(circle: &[PathBuf], edges: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> String {
    let root = workspace();
    let rel = |p: &PathBuf| p.strip_prefix(&root).unwrap_or(p).display().to_string();
    let set: BTreeSet<&PathBuf> = circle.iter().collect();
    let mut s = format!("circle of {} files:\n", circle.len());
    for f in circle {
        let to: Vec<String> = edges[f]
            .iter()
            .filter(|t| set.contains(t))
            .map(rel)
            .collect();
        s.push_str(&format!("  {} -> {}\n", rel(f), to.join(", ")));
    }
    s
}

/// Every import circle in the checked crates, described; empty when there is none.
pub fn circle_report() -> String {
    let mut report = String::new();
    for name in CRATES {
        let Some(krate) = load_crate(&workspace().join(name)) else {
            continue;
        };
        let edges = file_graph(&krate);
        for c in circles(&edges) {
            report.push_str(&describe(&c, &edges));
        }
    }
    report
}

/// Each crate's files by floor: floor 0 names nothing else in its crate, floor n names only
/// files on lower floors (a file's floor is its longest chain of imports down). Only
/// meaningful once there is no circle; files in a circle are left out.
pub fn floors() -> String {
    let root = workspace();
    let mut out = String::new();
    for name in CRATES {
        let Some(krate) = load_crate(&root.join(name)) else {
            continue;
        };
        let edges = file_graph(&krate);
        let mut floor: BTreeMap<PathBuf, usize> = BTreeMap::new();
        // Repeated relaxation: a DAG settles in at most |files| rounds.
        for _ in 0..=edges.len() {
            let mut changed = false;
            for (f, to) in &edges {
                let known: Option<usize> = to
                    .iter()
                    .map(|t| floor.get(t).map(|x| x + 1))
                    .try_fold(0usize, |m, x| x.map(|x| m.max(x)));
                if let Some(level) = known {
                    if floor.get(f) != Some(&level) {
                        floor.insert(f.clone(), level);
                        changed = true;
                    }
                }
            }
            if !changed {
                break;
            }
        }
        let top = floor.values().copied().max().unwrap_or(0);
        out.push_str(&format!("{name}:\n"));
        for level in 0..=top {
            let files: Vec<String> = floor
                .iter()
                .filter(|(_, l)| **l == level)
                .map(|(f, _)| {
                    let rel = f.strip_prefix(root.join(name).join("src")).unwrap_or(f);
                    rel.display().to_string()
                })
                .collect();
            out.push_str(&format!("  floor {level}: {}\n", files.join(" ")));
        }
    }
    out
}

/// Source files over [`MAX_LINES`] outside kernels and tests, with their line counts.
pub fn long_files() -> Vec<String> {
    let mut long = Vec::new();
    for name in CRATES {
        let src = workspace().join(name).join("src");
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let p = e.path();
                if p.is_dir() {
                    // Kernels are long by nature (one ISA's tiles side by side).
                    if p.file_name().map(|n| n == "kernels") != Some(true) {
                        stack.push(p);
                    }
                } else if p.extension().map(|x| x == "rs") == Some(true) {
                    let name = p.file_name().unwrap().to_string_lossy();
                    if name == "tests.rs" || name.ends_with("_tests.rs") {
                        continue;
                    }
                    let lines = std::fs::read_to_string(&p).unwrap().lines().count();
                    if lines > MAX_LINES {
                        let root = workspace();
                        let rel = p.strip_prefix(&root).unwrap_or(&p).display().to_string();
                        long.push(format!("{rel} ({lines} lines)"));
                    }
                }
            }
        }
    }
    long.sort();
    long
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_import_circle_in_any_crate() {
        let report = circle_report();
        assert!(report.is_empty(), "import circles:\n{report}");
    }

    #[test]
    fn no_source_file_holds_several_jobs() {
        let long = long_files();
        assert!(
            long.is_empty(),
            "files over {MAX_LINES} lines: {}",
            long.join(", ")
        );
    }

    #[test]
    fn the_checker_sees_a_circle() {
        // Two files naming each other's items form a circle; a parent that only declares and
        // re-exports its child does not.
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("a")).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "mod a;\nmod b;\nmod c;\npub use a::Thing;\n",
        )
        .unwrap();
        std::fs::write(src.join("a/mod.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
        std::fs::write(
            src.join("a/inner.rs"),
            "pub struct Thing;\nfn f() { crate::b::g(); }\n",
        )
        .unwrap();
        std::fs::write(src.join("b.rs"), "use crate::Thing;\npub fn g() {}\n").unwrap();
        std::fs::write(src.join("c.rs"), "fn h() { let _ = crate::Thing; }\n").unwrap();
        let krate = load_crate(dir.path()).unwrap();
        let edges = file_graph(&krate);
        let found = circles(&edges);
        assert_eq!(found.len(), 1, "{found:?}");
        let names: Vec<String> = found[0]
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["inner.rs", "b.rs"], "{names:?}");
    }
}
