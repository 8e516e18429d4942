//! Module boundaries of the host (`host/src`): dependencies point one way.
//! Reads every `crate::…` and `super::…` path outside comments and test
//! modules and asserts that neither the top-level modules (`api`, `route`,
//! `send`, …) nor the sibling files inside one of them (`api/model.rs`,
//! `api/problem.rs`, …) import each other in a circle.
//!
//! Run alone: `cargo test -p pushonce-tests --test it -- boundaries::`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A directed graph of module names.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// One source file: its module path below the crate root and its code.
struct Source {
    path: Vec<String>,
    code: String,
}

fn host_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../host/src")
}

/// Every `.rs` file under `dir`, with its module path (`a/mod.rs` is `a`).
fn sources(dir: &Path, prefix: &[String], out: &mut Vec<Source>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            let mut sub = prefix.to_vec();
            sub.push(name);
            sources(&path, &sub, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            if name == "tests" {
                // A test module in its own file (`#[cfg(test)] mod tests;`)
                // may import anything, as one at the end of a file may.
                continue;
            }
            let mut module = prefix.to_vec();
            if !matches!(name.as_str(), "mod" | "lib" | "main") {
                module.push(name);
            }
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(Source {
                path: module,
                code: code_of(&text),
            });
        }
    }
}

/// The text without comment lines and without the test module (which sits at
/// the end of a file and may import anything).
fn code_of(text: &str) -> String {
    let before_tests = text.split("#[cfg(test)]").next().unwrap_or_default();
    before_tests
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first segment of each path after `prefix::` in `code`: `prefix::a::b`
/// gives `a`, `prefix::{a, b::c}` gives `a` and `b`.
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let needle = format!("{prefix}::");
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(&needle) {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        rest = &rest[at + needle.len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            found.push(ident(rest));
        }
    }
    found.retain(|s| !s.is_empty());
    found
}

/// The first identifier of each item of a `{…}` group (nested groups skipped).
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = vec![ident(group)];
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => heads.push(ident(group[i + 1..].trim_start())),
            _ => {}
        }
    }
    heads
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A circle in `graph`, as the list of its nodes, if there is one.
fn circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.to_string());
            return Some(found);
        }
        if !done.insert(node.to_string()) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, done, stack) {
                return Some(found);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

fn all_sources() -> Vec<Source> {
    let mut all = Vec::new();
    sources(&host_src(), &[], &mut all);
    assert!(all.len() > 50, "host/src holds the host's modules");
    all
}

/// `top` → the other top-level modules its files name through `crate::`.
fn top_level_graph(all: &[Source]) -> Graph {
    let tops: BTreeSet<&str> = all
        .iter()
        .filter_map(|s| s.path.first().map(String::as_str))
        .collect();
    let mut graph = Graph::new();
    for s in all {
        let Some(top) = s.path.first() else { continue };
        for target in first_segments(&s.code, "crate") {
            if tops.contains(target.as_str()) && &target != top {
                graph.entry(top.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// Inside the top-level module `top`: each file directly in it → the sibling
/// files it names (through `super::` or `crate::top::`).
fn sibling_graph(all: &[Source], top: &str) -> Graph {
    let siblings: BTreeSet<&str> = all
        .iter()
        .filter(|s| s.path.len() >= 2 && s.path[0] == top)
        .map(|s| s.path[1].as_str())
        .collect();
    let mut graph = Graph::new();
    for s in all.iter().filter(|s| s.path.len() == 2 && s.path[0] == top) {
        let me = &s.path[1];
        let named = first_segments(&s.code, "super")
            .into_iter()
            .chain(first_segments(&s.code, &format!("crate::{top}")));
        for target in named {
            if siblings.contains(target.as_str()) && &target != me {
                graph.entry(me.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

#[test]
fn the_reader_sees_paths_and_groups_and_finds_a_circle() {
    let code = code_of(
        "use crate::{api, send::Fallback};\n// crate::store in a comment\nlet x = crate::permit::ms(1);\n#[cfg(test)]\nuse crate::dispatch;",
    );
    assert_eq!(
        first_segments(&code, "crate"),
        ["api", "send", "permit"].map(String::from)
    );
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    assert_eq!(circle(&g), None);
    g.entry("b".into()).or_default().insert("a".into());
    assert_eq!(circle(&g), Some(["a", "b", "a"].map(String::from).to_vec()));
}

#[test]
fn no_two_top_level_modules_of_the_host_import_each_other_in_a_circle() {
    let all = all_sources();
    let graph = top_level_graph(&all);
    assert!(
        graph.get("api").is_some_and(|t| t.contains("permit")),
        "the reader sees api → permit: {graph:?}"
    );
    assert_eq!(circle(&graph), None, "a circle of imports: {graph:#?}");
}

#[test]
fn no_two_files_inside_one_module_import_each_other_in_a_circle() {
    let all = all_sources();
    let tops: BTreeSet<String> = all.iter().filter_map(|s| s.path.first().cloned()).collect();
    for top in tops {
        let graph = sibling_graph(&all, &top);
        assert_eq!(
            circle(&graph),
            None,
            "a circle of imports inside {top}/: {graph:#?}"
        );
    }
}
