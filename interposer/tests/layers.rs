//! The interposer's layers, checked from its source: every `crate::…` and `super::…` path a
//! file names is an arrow from that file to the module it names, and no arrow may point up a
//! layer or close a circle. The layers, from the bottom:
//!
//! | rank | folder | what |
//! |---|---|---|
//! | 0 | `base/` | CUDA types, the real functions and how they are found, settings, OS helpers |
//! | 1 | `record/` | the "inside a hook" flag, events, the writer |
//! | 2 | `policy/` | log, isolate, guard, launch check |
//! | 3 | `life/` | exit, `_exit`, exec, signals, fork |
//! | 4 | `hooks/` | the exported entry points |
//!
//! Also: every file says in its opening comment which layer it is and what it may use, and
//! README.md's layout section names every file of the tree and no other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LAYERS: &[&str] = &["base", "record", "policy", "life", "hooks"];

fn rank(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    LAYERS.iter().position(|l| *l == top)
}

/// Module path (`policy::isolate`, `policy` for `policy/mod.rs`) of a file below `src/`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap();
    let stem = file.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts.join("::")
}

/// The code of a file without comments (line comments and doc comments; the interposer has no
/// block comments) and without string literals' contents.
fn code_lines(src: &str) -> Vec<String> {
    src.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") {
                String::new()
            } else {
                match l.find("//") {
                    Some(i) if !l[..i].contains('"') => l[..i].to_string(),
                    _ => l.to_string(),
                }
            }
        })
        .collect()
}

/// Every module path named after `crate::`, `$crate::` or `super::` in `code` (brace groups
/// expanded one level), as written (not yet resolved to a file).
fn named_paths(module: &str, is_mod_file: bool, code: &str) -> Vec<String> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    for (prefix, base) in [
        ("crate::", String::new()),
        ("super::", parent(module, is_mod_file)),
    ] {
        let mut from = 0;
        while let Some(i) = code[from..].find(prefix) {
            let at = from + i;
            from = at + prefix.len();
            // `crate::` inside an identifier (`my_crate::`) is not a path start.
            if at > 0 {
                let b = bytes[at - 1];
                if (b.is_ascii_alphanumeric() || b == b'_') && !(prefix == "crate::" && b == b'$') {
                    continue;
                }
            }
            let rest = &code[from..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let path = path.trim_end_matches(':').to_string();
            let after = &rest[path.len()..];
            let join = |p: &str| {
                if base.is_empty() {
                    p.to_string()
                } else if p.is_empty() {
                    base.clone()
                } else {
                    format!("{base}::{p}")
                }
            };
            if after.starts_with("::{") || (path.is_empty() && after.starts_with('{')) {
                let open = rest.find('{').unwrap();
                let close = rest[open..]
                    .find('}')
                    .map(|c| open + c)
                    .unwrap_or(rest.len());
                for item in rest[open + 1..close].split(',') {
                    let item = item.trim();
                    let item = item.split(" as ").next().unwrap().trim();
                    if item.is_empty() || item == "self" || item == "*" {
                        out.push(join(&path));
                    } else {
                        let full = if path.is_empty() {
                            item.to_string()
                        } else {
                            format!("{path}::{item}")
                        };
                        out.push(join(&full));
                    }
                }
            } else {
                out.push(join(&path));
            }
        }
    }
    out
}

/// The module `super` names from `module`.
fn parent(module: &str, is_mod_file: bool) -> String {
    let _ = is_mod_file; // `super` in a/b.rs and in a/b/mod.rs both name `a`
    match module.rfind("::") {
        Some(i) => module[..i].to_string(),
        None => String::new(),
    }
}

/// The longest prefix of `path` that is a module of the tree.
fn resolve(path: &str, modules: &BTreeSet<String>) -> Option<String> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find(|m| modules.contains(m))
}

/// The arrows between modules of `files` (module → source).
fn arrows(files: &BTreeMap<String, (bool, String)>) -> BTreeSet<(String, String)> {
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    let mut edges = BTreeSet::new();
    for (m, (is_mod_file, src)) in files {
        let code = code_lines(src).join("\n");
        for p in named_paths(m, *is_mod_file, &code) {
            if let Some(to) = resolve(&p, &modules)
                && to != *m
                && !to.is_empty()
            {
                edges.insert((m.clone(), to));
            }
        }
    }
    edges
}

/// What is wrong with the arrows: each upward arrow, and each circle.
fn problems(edges: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut out = Vec::new();
    for (a, b) in edges {
        match (rank(a), rank(b)) {
            (Some(ra), Some(rb)) if rb > ra => out.push(format!(
                "{a} (layer {}) uses {b} (layer {}): an arrow pointing up",
                LAYERS[ra], LAYERS[rb]
            )),
            (Some(_), None) => out.push(format!("{a} uses {b}, which is in no layer")),
            _ => {}
        }
    }
    // Circles: depth-first search with colours.
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    fn visit<'a>(
        n: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
        out: &mut Vec<String>,
    ) {
        state.insert(n, 1);
        stack.push(n);
        for &m in next.get(n).map(|v| v.as_slice()).unwrap_or(&[]) {
            match state.get(m).copied().unwrap_or(0) {
                0 => visit(m, next, state, stack, out),
                1 => {
                    let i = stack.iter().position(|s| *s == m).unwrap();
                    out.push(format!("a circle: {} -> {m}", stack[i..].join(" -> ")));
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n, 2);
    }
    let mut state = BTreeMap::new();
    let nodes: Vec<&str> = next.keys().copied().collect();
    for n in nodes {
        if !state.contains_key(n) {
            visit(n, &next, &mut state, &mut Vec::new(), &mut out);
        }
    }
    out
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

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

/// Every source file of the interposer, by module path: (is a `mod.rs`, source).
fn tree() -> BTreeMap<String, (bool, String)> {
    let mut paths = Vec::new();
    rust_files(&src_dir(), &mut paths);
    paths
        .into_iter()
        .filter(|p| p.file_name().unwrap() != "lib.rs")
        .map(|p| {
            let rel = p.strip_prefix(src_dir()).unwrap();
            let src = std::fs::read_to_string(&p).unwrap();
            (module_of(rel), (p.file_name().unwrap() == "mod.rs", src))
        })
        .collect()
}

#[test]
fn no_arrow_points_up_and_none_closes_a_circle() {
    let files = tree();
    assert!(files.len() > 10, "the tree was not found: {:?}", src_dir());
    let edges = arrows(&files);
    // The check sees real arrows: the hooks use the policies, the policies the recorder.
    assert!(edges.contains(&("hooks::process".into(), "base::real".into())));
    assert!(edges.contains(&("policy::isolate::alloc".into(), "record::event".into())));
    let found = problems(&edges);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn every_module_says_its_layer() {
    for (m, (_, src)) in tree() {
        let head: String = src
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n")
            .to_lowercase();
        assert!(
            head.contains("layer"),
            "{m}: its opening comment does not say which layer it is and what it may use"
        );
    }
}

#[test]
fn readme_layout_names_every_file_of_the_tree() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let start = readme
        .find("## Layout")
        .expect("README.md has a Layout section");
    let layout = &readme[start..];
    // The interposer's part of it: from its line to the next top-level folder's.
    let from = layout
        .find("\ninterposer/")
        .expect("the layout names interposer/");
    let mut lines = layout[from + 1..].lines();
    let mut part = vec![lines.next().unwrap()];
    part.extend(lines.take_while(|l| l.starts_with(' ')));
    let layout = part.join("\n");
    let layout = layout.as_str();
    let mut paths = Vec::new();
    rust_files(&src_dir(), &mut paths);
    let mut files: BTreeSet<String> = paths
        .iter()
        .map(|p| {
            p.strip_prefix(src_dir())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.insert("policy/verify.ptx".into());
    for f in &files {
        let name = Path::new(f).file_name().unwrap().to_string_lossy();
        let dir = Path::new(f)
            .parent()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default();
        let named = layout.contains(&format!("src/{f}"))
            || (!dir.is_empty()
                && layout.contains(&format!("src/{dir}/"))
                && layout.contains(&name.to_string()));
        assert!(named, "README.md's layout does not name interposer/src/{f}");
    }
    // And names nothing that is not there.
    for w in layout.split(|c: char| c.is_whitespace() || c == ',') {
        if let Some(rest) = w.strip_prefix("src/")
            && rest.ends_with(".rs")
            && !files.contains(rest)
        {
            panic!("README.md's layout names src/{rest}, which is not in interposer/src");
        }
    }
}

// The check itself: it must see what it is for.

fn files_of(pairs: &[(&str, &str)]) -> BTreeMap<String, (bool, String)> {
    pairs
        .iter()
        .map(|(m, s)| (m.to_string(), (false, s.to_string())))
        .collect()
}

#[test]
fn the_check_finds_an_upward_arrow() {
    let files = files_of(&[
        ("base::real", "use crate::hooks::driver::MEM_FREE;"),
        ("hooks::driver", "use crate::base::real::*;"),
    ]);
    let found = problems(&arrows(&files));
    assert!(found.iter().any(|p| p.contains("pointing up")), "{found:?}");
    assert!(found.iter().any(|p| p.contains("circle")), "{found:?}");
}

#[test]
fn the_check_finds_a_circle_within_a_layer_and_reads_groups_and_super() {
    let files = files_of(&[
        ("policy", "pub fn call() {}"),
        ("policy::isolate", "use super::{guard, log};"),
        ("policy::guard", "fn f() { super::isolate::alloc(); }"),
        (
            "policy::log",
            "use crate::policy::call; // a comment: crate::hooks::x",
        ),
    ]);
    let edges = arrows(&files);
    assert!(edges.contains(&("policy::isolate".into(), "policy::log".into())));
    assert!(edges.contains(&("policy::log".into(), "policy".into())));
    assert!(!edges.iter().any(|(_, b)| b.starts_with("hooks")));
    let found = problems(&edges);
    assert!(
        found
            .iter()
            .any(|p| p.contains("policy::isolate -> policy::guard")),
        "{found:?}"
    );
}

#[test]
fn macro_paths_count_too() {
    let files = files_of(&[("record::event", "$crate::policy::call(x)"), ("policy", "")]);
    let found = problems(&arrows(&files));
    assert!(found.iter().any(|p| p.contains("pointing up")), "{found:?}");
}

/// Issue 29's line: no file of the library over 1,000 lines (tests included), so that each
/// stays one job a newcomer can read.
#[test]
fn no_file_is_over_a_thousand_lines() {
    let mut paths = Vec::new();
    rust_files(&src_dir(), &mut paths);
    assert!(paths.len() > 50, "the tree was read: {paths:?}");
    for p in paths {
        let n = std::fs::read_to_string(&p).unwrap().lines().count();
        assert!(n <= 1000, "{} has {n} lines (at most 1,000)", p.display());
    }
}
