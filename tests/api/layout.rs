//! The source layout keeps its layers: no module imports, directly or through others, a
//! module that imports it back. Read from the source text (`crate::a::b` and `super::b`
//! paths outside comments and test modules), per module and per submodule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::helpers::repo_root;

/// Module path of a source file: `src/protocol/model.rs` -> ["protocol", "model"].
fn module_of(file: &Path, src: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn path_segments(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let segments: Vec<String> = rest
            .split("::")
            .take(2)
            .map(|s| {
                s.chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect::<String>()
            })
            .take_while(|s| !s.is_empty())
            .collect();
        if !segments.is_empty() {
            out.push(segments);
        }
    }
    out
}

fn graph(depth: usize) -> BTreeMap<String, BTreeSet<String>> {
    let src = repo_root().join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let module = module_of(&file, &src);
        if module == ["lib"] || module == ["main"] {
            continue;
        }
        let me = module[..module.len().min(depth)].join("::");
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        let mut targets: Vec<Vec<String>> = path_segments(&code, "crate::");
        // `super::x` from a/b.rs (or a/b/mod.rs's children) is a::x.
        let parent = &module[..module.len() - 1];
        for s in path_segments(&code, "super::") {
            let mut t = parent.to_vec();
            t.extend(s);
            targets.push(t);
        }
        for t in targets {
            let target = t[..t.len().min(depth)].join("::");
            if target != me && !target.is_empty() {
                edges.entry(me.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// A cycle through `start`, if any (depth-first search).
fn cycle_from(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        edges: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in edges.get(node).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(edges, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    visit(edges, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn the_module_graph_has_no_cycles() {
    for depth in [1, 2, 3] {
        let edges = graph(depth);
        assert!(edges.len() > 10, "read the sources: {edges:?}");
        for module in edges.keys() {
            if let Some(cycle) = cycle_from(&edges, module) {
                panic!(
                    "import cycle: {} -> {}\n(the graph: {edges:#?})",
                    cycle.join(" -> "),
                    module
                );
            }
        }
    }
}

#[test]
fn the_cycle_check_sees_cycles() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert!(cycle_from(&edges, "a").is_none());
    edges.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycle_from(&edges, "a").unwrap(), ["a", "b", "c"]);
    assert_eq!(
        path_segments("use crate::protocol::model::{X}; // crate::no", "crate::"),
        [
            vec!["protocol".to_string(), "model".to_string()],
            vec!["no".to_string()]
        ]
    );
    assert_eq!(code_of("a // crate::x\nb"), "a \nb");
}
