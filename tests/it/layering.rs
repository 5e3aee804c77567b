//! The module layering of docs/ARCHITECTURE.md, checked from the source text:
//! no module cycles and no arrow from a lower floor to a higher one.
//!
//! Floors of the library (`src/`): domain, privacy, io, dataset → pgm, measure
//! → missing, synth, impute, eval, analyze → sql, pipeline → serve. The command line
//! (`src/main.rs`, `src/cli/`) is the binary's, above every floor, and is not
//! scanned; nor is test code (`tests.rs` files and everything after a file's
//! `#[cfg(test)]`), which may use a higher floor's helpers. Arrows inside a
//! floor are allowed when they form no cycle. Within each top-level module
//! the files must not import each other in a cycle either (e.g. `sql::engine`
//! ↔ `sql::imputed`). In `udfs/src` the top-level modules form no cycle.
//!
//! A reference is any `crate::a::b` path (including `use crate::{a, b::c}`
//! groups) or `super::b` naming a sibling file, outside `//` comments.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Floor of each top-level library module (lower numbers are lower floors).
const FLOORS: &[(&str, u8)] = &[
    ("domain", 1),
    ("privacy", 1),
    ("io", 1),
    ("dataset", 1),
    ("pgm", 2),
    ("neural", 2),
    ("measure", 2),
    ("missing", 3),
    ("synth", 3),
    ("impute", 3),
    ("eval", 3),
    ("analyze", 3),
    ("sql", 4),
    ("pipeline", 4),
    ("report", 4),
    ("serve", 5),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's module path relative to its crate root (`sql/engine.rs` → [sql, engine]).
fn module_path(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|c| c.to_string_lossy().to_string()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Non-test, non-comment source text.
fn code(text: &str) -> String {
    let body = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    body.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// Every `crate::`-rooted path in `src`, as its first two segments.
fn crate_paths(src: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // e.g. `dpflow_udfs_crate::`
        }
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the first segment of each top-level item.
            let mut depth = 0;
            let mut item = String::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(segments(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(ch);
            }
            out.push(segments(&item));
        } else {
            out.push(segments(rest));
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

fn segments(s: &str) -> Vec<String> {
    s.trim()
        .split("::")
        .take(2)
        .map(|x| x.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>())
        .take_while(|x| !x.is_empty())
        .collect()
}

/// `super::name` references in a file.
fn super_names(src: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find("super::") {
        rest = &rest[i + "super::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                if let Some(s) = segments(item).first() {
                    out.insert(s.clone());
                }
            }
        } else if let Some(s) = segments(rest).first() {
            out.insert(s.clone());
        }
    }
    out
}

/// Edges between modules of one crate: top-level (a → b) and, inside each
/// top-level module, between its files (a::x → a::y).
struct Graph {
    top: BTreeMap<String, BTreeSet<String>>,
    inner: BTreeMap<String, BTreeSet<String>>,
    /// Where each top-level edge comes from (for messages).
    why: BTreeMap<(String, String), String>,
}

fn graph(root: &Path, skip: &[&str]) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut g = Graph { top: BTreeMap::new(), inner: BTreeMap::new(), why: BTreeMap::new() };
    for f in files {
        let m = module_path(root, &f);
        let Some(top) = m.first().cloned() else { continue };
        if skip.contains(&top.as_str()) || m.last().is_some_and(|x| x == "tests") {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).unwrap());
        let here = m.iter().take(2).cloned().collect::<Vec<_>>().join("::");
        let siblings: BTreeSet<String> = if m.len() >= 2 {
            let dir = f.parent().unwrap();
            std::fs::read_dir(dir)
                .unwrap()
                .filter_map(|e| {
                    let p = e.ok()?.path();
                    let name = p.file_name()?.to_string_lossy().to_string();
                    if p.is_dir() { Some(name) } else { name.strip_suffix(".rs").map(str::to_string) }
                })
                .collect()
        } else {
            BTreeSet::new()
        };
        for p in crate_paths(&text) {
            let target = &p[0];
            if target != &top {
                g.top.entry(top.clone()).or_default().insert(target.clone());
                g.why.entry((top.clone(), target.clone())).or_insert_with(|| f.display().to_string());
            } else if p.len() == 2 && m.len() >= 2 {
                let to = format!("{top}::{}", p[1]);
                if to != here && siblings.contains(&p[1]) {
                    g.inner.entry(here.clone()).or_default().insert(to);
                }
            }
        }
        if m.len() == 2 {
            for s in super_names(&text) {
                let to = format!("{top}::{s}");
                if to != here && siblings.contains(&s) {
                    g.inner.entry(here.clone()).or_default().insert(to);
                }
            }
        }
    }
    g
}

/// A cycle in `edges`, if any, as the list of its nodes.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let i = stack.iter().position(|x| x == m).unwrap();
                    let mut c = stack[i..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = visit(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn library_modules_only_import_their_own_floor_or_lower_and_form_no_cycle() {
    let g = graph(&root().join("src"), &["cli", "main"]);
    let floor: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
    let mut upward = Vec::new();
    for (a, bs) in &g.top {
        let fa = *floor.get(a.as_str()).unwrap_or_else(|| panic!("module `{a}` has no floor in tests/it/layering.rs"));
        for b in bs {
            let fb = *floor.get(b.as_str()).unwrap_or_else(|| panic!("`{a}` imports `crate::{b}`, which has no floor"));
            if fb > fa {
                upward.push(format!("{a} (floor {fa}) → {b} (floor {fb}) in {}", g.why[&(a.clone(), b.clone())]));
            }
        }
    }
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    assert_eq!(find_cycle(&g.top), None, "cycle between library modules");
    assert_eq!(find_cycle(&g.inner), None, "cycle between the files of a library module");
}

#[test]
fn udfs_modules_form_no_cycle() {
    let g = graph(&root().join("udfs/src"), &[]);
    assert_eq!(find_cycle(&g.top), None, "cycle between udfs modules");
    assert_eq!(find_cycle(&g.inner), None, "cycle between the files of a udfs module");
}

#[test]
fn the_library_does_not_declare_the_command_line_or_benchmarks() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    for m in ["mod cli", "mod bench"] {
        assert!(
            !lib.contains(m),
            "src/lib.rs declares `{m}`: the command line belongs to src/main.rs, benchmarks to benches/"
        );
    }
}

#[test]
fn the_checker_sees_cycles_and_upward_arrows() {
    // The parser on the shapes it must recognise.
    assert_eq!(crate_paths("use crate::sql::engine::X;"), vec![vec!["sql".to_string(), "engine".to_string()]]);
    assert_eq!(
        crate_paths("use crate::{io::read, dataset::Dataset, pgm};"),
        vec![vec!["io".to_string(), "read".to_string()], vec!["dataset".into(), "Dataset".into()], vec!["pgm".into()]]
    );
    assert_eq!(super_names("use super::{engine::x, imputed};"), ["engine".to_string(), "imputed".into()].into());
    assert!(code("use crate::a;\n// crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::a"));
    assert!(!code("// crate::b\n#[cfg(test)]\nuse crate::c;").contains("crate::"));
    // Cycle detection on a two-node cycle and on a chain.
    let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    e.entry("a".into()).or_default().insert("b".into());
    assert_eq!(find_cycle(&e), None);
    e.entry("b".into()).or_default().insert("a".into());
    assert!(find_cycle(&e).is_some());
}
