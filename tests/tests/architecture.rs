//! The workspace's shape, checked on its sources: no crate's module files name each other in a
//! circle (a file's `crate::a::b`, `super::x` and `self::x` paths, outside comments and its
//! test module, are its edges; a module and its own submodules are left out), and no crate
//! holds more than 35 % of the product's lines (every crate's `.rs` files but the end-to-end
//! tests').

// An integration test crate: its tests are the crate.
#![allow(clippy::tests_outside_test_module)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's crates with their own sources (the end-to-end tests' crate is `tests`).
const CRATES: &[&str] = &[
    "llfree",
    "llfree/bench",
    "guest-mem",
    "guest-mem/bench",
    "virtio-balloon",
    "virtio-mem",
    "vmm-devices",
    "vmm-api",
    "vmm",
    "vmm-cli",
    "vmm-cli/bench",
    "vmm-jailer",
    "test-guest",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(at) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// A module's path in its crate, e.g. `["vm", "vcpu"]`.
type Module = Vec<String>;

/// The module of file `path` in the crate whose sources are `src`.
fn module_of(src: &Path, path: &Path) -> Module {
    let relative = path.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The text of a file without its comments and without a test module at its end.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests {") {
        Some(at) => &text[..at],
        None => &text,
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a file's code names: its `crate::`, `super::` and `self::` paths, each as far
/// as its lowercase segments go (`crate::pool::{Frame, Pool}` names `pool`).
fn named_paths(code: &str, module: &Module) -> Vec<Module> {
    let is_name = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let mut paths = Vec::new();
    for (start, head) in ["crate::", "super::", "self::"]
        .iter()
        .flat_map(|head| code.match_indices(head))
    {
        let before = code[..start].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let mut path: Module = match head {
            "crate::" => Vec::new(),
            "self::" => module.clone(),
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        for segment in code[start + head.len()..].split("::") {
            let name: String = segment.chars().take_while(|&c| is_name(c)).collect();
            match name.as_str() {
                "" => break,
                "super" if name.len() == segment.len() => {
                    path.pop();
                }
                _ => path.push(name.clone()),
            }
            if name.len() != segment.len() {
                break;
            }
        }
        paths.push(path);
    }
    paths
}

/// The circles among the module files of the crate whose sources are `src`, each as its
/// files.
fn circles(src: &Path) -> Vec<Vec<String>> {
    let files: BTreeMap<Module, PathBuf> = rust_files(src)
        .into_iter()
        .map(|path| (module_of(src, &path), path))
        .filter(|(module, _)| !module.iter().any(|m| m == "bin"))
        .collect();
    let resolve = |path: &Module| {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].to_vec())
            .find(|prefix| files.contains_key(prefix))
    };
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, path) in &files {
        let targets = edges.entry(module.clone()).or_default();
        if matches!(module.last().map(String::as_str), Some("tests" | "testing")) {
            continue;
        }
        for named in named_paths(&code_of(path), module) {
            let Some(target) = resolve(&named) else {
                continue;
            };
            // A module and its own submodules name each other by design.
            if target.starts_with(module) || module.starts_with(&target) {
                continue;
            }
            targets.insert(target);
        }
    }
    strongly_connected(&edges)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| component.iter().map(|m| m.join("/")).collect())
        .collect()
}

/// Tarjan's strongly connected components of `edges`.
fn strongly_connected(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct TarjanState<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on_stack: BTreeSet<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(state: &mut TarjanState<'a>, node: &'a Module) {
        let next = state.index.len();
        state.index.insert(node, next);
        state.low.insert(node, next);
        state.stack.push(node);
        state.on_stack.insert(node);
        let edges = state.edges;
        for target in edges.get(node).into_iter().flatten() {
            let Some((target, _)) = edges.get_key_value(target) else {
                continue;
            };
            if !state.index.contains_key(target) {
                visit(state, target);
                let low = state.low[node].min(state.low[target]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(target) {
                let low = state.low[node].min(state.index[target]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            while let Some(member) = state.stack.pop() {
                state.on_stack.remove(member);
                component.push(member.clone());
                if member == node {
                    break;
                }
            }
            state.found.push(component);
        }
    }
    let mut state = TarjanState {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in edges.keys() {
        if !state.index.contains_key(node) {
            visit(&mut state, node);
        }
    }
    state.found
}

#[test]
fn no_crate_s_module_files_name_each_other_in_a_circle() {
    let mut found = Vec::new();
    for krate in CRATES {
        for circle in circles(&workspace().join(krate).join("src")) {
            found.push(format!("{krate}: {}", circle.join(" <-> ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn a_circle_is_found_where_there_is_one() {
    let dir = std::env::temp_dir().join(format!("architecture-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(
        src.join("a.rs"),
        "mod c;\nuse crate::b::Thing; // crate::d in a comment\n",
    )
    .unwrap();
    std::fs::write(src.join("a/c.rs"), "use super::super::b;\n").unwrap();
    std::fs::write(src.join("b.rs"), "pub struct Thing(crate::a::Other);\n").unwrap();
    assert_eq!(circles(&src), vec![vec!["b".to_owned(), "a".to_owned()]]);
    std::fs::write(src.join("b.rs"), "pub struct Thing;\n").unwrap();
    assert!(circles(&src).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn no_crate_holds_more_than_35_percent_of_the_product() {
    let lines = |dir: &Path| -> usize {
        rust_files(dir)
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap().lines().count())
            .sum()
    };
    let root = workspace();
    // A crate's own files, not those of a crate nested in it (llfree/bench in llfree).
    let sizes: Vec<(&str, usize)> = CRATES
        .iter()
        .map(|krate| {
            let nested: usize = CRATES
                .iter()
                .filter(|other| other.starts_with(&format!("{krate}/")))
                .map(|other| lines(&root.join(other)))
                .sum();
            (*krate, lines(&root.join(krate)) - nested)
        })
        .collect();
    let total: usize = sizes.iter().map(|(_, n)| n).sum();
    let (largest, lines) = sizes.iter().max_by_key(|(_, n)| *n).unwrap();
    let share = *lines as f64 / total as f64;
    eprintln!(
        "largest crate: {largest}, {lines} of {total} lines ({:.1} %)",
        share * 100.0
    );
    assert!(share <= 0.35, "{sizes:?}");
}
