//! The code's layering holds: no import cycle between the modules of either library crate, and
//! the C boundary (`gpu_mem_track_sys::`, its `GMT_*` codes) is read in `src/ffi.rs` only.
//!
//! A module's imports are the `crate::<module>` paths in its files outside `#[cfg(test)]` (tests
//! may reach anywhere); submodules count as their top-level module.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src_dir` belongs to (`None`: the crate root or a binary).
fn top_module(src_dir: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src_dir).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    match first.as_str() {
        "lib.rs" | "main.rs" | "bin" => None,
        f => Some(f.trim_end_matches(".rs").to_owned()),
    }
}

/// The file's text before its unit-test module (a lone `#[cfg(test)]` item does not end the code).
fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    match text.find("#[cfg(test)]\nmod ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// `crate::name` paths in `text`, comments included (a doc link is a dependency too).
fn crate_paths(text: &str) -> BTreeSet<String> {
    text.match_indices("crate::")
        .filter(|(i, _)| !text[..*i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        .map(|(i, m)| {
            text[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty() && name.starts_with(|c: char| c.is_ascii_lowercase()))
        .collect()
}

/// Edges module -> module it imports, for one crate.
fn import_graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src_dir, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let Some(from) = top_module(src_dir, file) else { continue };
        let to: Vec<String> =
            crate_paths(&code(file)).into_iter().filter(|m| *m != from && modules.contains(m)).collect();
        graph.entry(from).or_default().extend(to);
    }
    graph
}

/// A cycle of the graph, if it has one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut cycle = path[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_import_cycle_between_modules() {
    for crate_src in ["src", "gpu-mem-track-log/src"] {
        let graph = import_graph(&Path::new(ROOT).join(crate_src));
        assert!(graph.len() > 5, "{crate_src}: found only {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{crate_src}: import cycle {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn cycle_finder_sees_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .fold(BTreeMap::new(), |mut g, (from, to)| {
            g.entry(from.to_owned()).or_insert_with(BTreeSet::new).insert(to.to_owned());
            g
        });
    let cycle = find_cycle(&graph).expect("a -> b -> c -> a");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    assert_eq!(crate_paths("use crate::log::{x}; // see [`y`](crate::trace::Y), mycrate::no"), {
        ["log", "trace"].into_iter().map(String::from).collect::<BTreeSet<_>>()
    });
}

#[test]
fn only_ffi_reads_the_c_boundary() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "gpu-mem-track-log/src",
        "gpu-mem-track-cli/src",
        "tests",
        "benches",
        "examples",
        "tracker-macros/src",
    ] {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    let ffi = Path::new(ROOT).join("src/ffi.rs");
    let this = Path::new(ROOT).join("tests/layers.rs");
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| **f != ffi && **f != this)
        .filter(|f| {
            let text = std::fs::read_to_string(f).expect("readable source");
            text.contains("gpu_mem_track_sys")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "gpu_mem_track_sys used outside src/ffi.rs: {offenders:?}");
    let ffi_text = std::fs::read_to_string(&ffi).expect("src/ffi.rs");
    assert!(ffi_text.contains("gpu_mem_track_sys"), "src/ffi.rs no longer wraps gpu_mem_track_sys?");
}
