//! The code's layering holds: no import cycle between the modules of any library crate, no module
//! reaches up to its crate's root (the facade that re-exports them), the C boundary
//! (`gpu_mem_track_sys::` and `gpu_mem_track_estimate_sys::`, their `GMT_*` codes) is read in the
//! tracker's `src/ffi/` and the estimator's `src/ffi.rs` only, and the crates stack one way:
//! log < GPU model < tracker < estimator < command line, the GPU model without libtorch,
//! and in C++ the tracker's shim < the estimator's native code; and no import cycle between the
//! Python package's modules (read from the text below the test of the crates').
//!
//! It reads text only: it is the testkit's, so `cargo test -p gpu-mem-track-testkit` gives the
//! verdict without libtorch or torch.
//!
//! A module's imports are the `crate::` paths in its files outside `#[cfg(test)]` (tests may
//! reach anywhere), grouped ones (`crate::{a, b::C}`) included; submodules count as their
//! top-level module. A second graph has a node per module file and reads `super::` and `self::`
//! paths too, so a circle between two files of one module is found as well. A name the root re-exports (`crate::MemTracker`) is an import of the module
//! that defines it, and an import through the root, which only the root may make.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The workspace's root: this test lives in `gpu-mem-track-testkit/tests/`, and reads text only,
/// so the verdict needs neither libtorch nor torch.
fn root() -> &'static Path {
    gpu_mem_track_testkit::workspace_root()
}

/// The library crates' sources: the log layer, the GPU model, the tracker, the estimator.
const LIBRARY_SOURCES: [&str; 4] =
    ["gpu-mem-track-log/src", "gpu-mem-track-gpu/src", "src", "gpu-mem-track-estimate/src"];

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

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect()
}

/// The first segment of every `crate::` path in `text`, comments included (a doc link is a
/// dependency too); in a group (`crate::{a::B, C}`) the first segment of each member.
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, m) in text.match_indices("crate::") {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue; // `mycrate::`
        }
        let rest = &text[i + m.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                out.extend(group.split(',').map(|member| ident(member.trim())));
            }
            None => {
                out.insert(ident(rest));
            }
        }
    }
    out.remove("");
    out
}

/// What the crate root (`lib.rs`) re-exports with `pub use`: name -> the top-level module it
/// comes from (`None`: another crate).
fn root_reexports(src_dir: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, Option<String>> {
    let root = std::fs::read_to_string(src_dir.join("lib.rs")).expect("lib.rs");
    let mut out = BTreeMap::new();
    for (i, m) in root.match_indices("pub use ") {
        let item = &root[i + m.len()..];
        let item =
            item[..item.find(';').unwrap_or(item.len())].split_whitespace().collect::<Vec<_>>().join(" ");
        let source = ident(&item);
        let source = modules.contains(&source).then_some(source);
        let names = match (item.find('{'), item.rfind('}')) {
            (Some(open), Some(close)) if open < close => item[open + 1..close].to_owned(),
            _ => item.rsplit("::").next().unwrap_or("").to_owned(),
        };
        for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            // `a::B as C` exports C; `a::B` exports B.
            let exported = name.rsplit(" as ").next().unwrap_or(name);
            let exported = exported.rsplit("::").next().unwrap_or(exported).trim();
            out.insert(exported.to_owned(), source.clone());
        }
    }
    out
}

/// One crate's imports: edges module -> module, and the imports that go through the root
/// (file, name).
struct Imports {
    graph: BTreeMap<String, BTreeSet<String>>,
    through_root: Vec<(String, String)>,
}

fn imports(src_dir: &Path) -> Imports {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| top_module(src_dir, f)).collect();
    let reexports = root_reexports(src_dir, &modules);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut through_root = Vec::new();
    for file in &files {
        let Some(from) = top_module(src_dir, file) else { continue };
        let edges = graph.entry(from.clone()).or_default();
        for name in crate_paths(&code(file)) {
            let to = if modules.contains(&name) {
                Some(name)
            } else {
                // Defined in or re-exported by the root: up a layer.
                through_root.push((file.display().to_string(), name.clone()));
                reexports.get(&name).cloned().flatten()
            };
            edges.extend(to.filter(|to| *to != from));
        }
    }
    Imports { graph, through_root }
}

/// Edges module -> module it imports, for one crate.
fn import_graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    imports(src_dir).graph
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

/// A file's module path inside its crate: `[]` for the root, `["log", "oom"]` for `log/oom.rs`
/// (`log/mod.rs` is `["log"]`); `None` for a binary.
fn module_path(src_dir: &Path, file: &Path) -> Option<Vec<String>> {
    let rel = file.strip_prefix(src_dir).ok()?;
    let mut segments: Vec<String> =
        rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    if segments.first().is_some_and(|f| f == "main.rs" || f == "bin") {
        return None;
    }
    let last = segments.pop()?;
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        f => segments.push(f.trim_end_matches(".rs").to_owned()),
    }
    Some(segments)
}

/// Every `crate::`, `self::` and `super::` path in `text` (comments included), resolved against
/// the module `at`: its segments from the crate root, a group (`super::{a::B, c}`) giving one path
/// per member.
fn module_paths(text: &str, at: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("::") {
        let before = &text[..i];
        let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |p| p + 1);
        let head = &before[start..];
        if !matches!(head, "crate" | "self" | "super") || before[..start].ends_with("::") {
            continue; // not the first segment of such a path
        }
        let mut base: Vec<String> = match head {
            "crate" => Vec::new(),
            _ => at.to_vec(),
        };
        let mut rest = &text[i + 2..];
        if head == "super" {
            base.pop();
        }
        while let Some(r) = rest.strip_prefix("super::") {
            base.pop();
            rest = r;
        }
        let members: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => {
                group[..group.find('}').unwrap_or(group.len())].split(',').map(str::trim).collect()
            }
            None => vec![rest],
        };
        for member in members {
            let mut path = base.clone();
            let mut m = member;
            loop {
                let id = ident(m);
                if id.is_empty() {
                    break;
                }
                m = &m[id.len()..];
                path.push(id);
                match m.strip_prefix("::") {
                    Some(r) => m = r,
                    None => break,
                }
            }
            out.push(path);
        }
    }
    out
}

/// Edges module -> module for every module file of one crate, `super::` and `self::` paths
/// included: a path goes to the longest module it starts with. A module's paths into its own
/// submodules are its structure (declaring and re-exporting them), not edges.
fn module_graph(src_dir: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(src_dir, &mut files);
    let modules: BTreeMap<Vec<String>, PathBuf> =
        files.iter().filter_map(|f| Some((module_path(src_dir, f)?, f.clone()))).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, file) in &modules {
        let edges = graph.entry(from.join("::")).or_default();
        for path in module_paths(&code(file), from) {
            let to = (0..=path.len()).rev().map(|n| &path[..n]).find(|p| modules.contains_key(*p));
            if let Some(to) = to.filter(|to| !to.starts_with(from)) {
                edges.insert(to.join("::"));
            }
        }
    }
    graph
}

#[test]
fn no_import_cycle_between_module_files() {
    for crate_src in LIBRARY_SOURCES {
        let graph = module_graph(&root().join(crate_src));
        assert!(graph.len() > 8, "{crate_src}: found only {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{crate_src}: import cycle {}", cycle.join(" -> "));
        }
    }
}

/// A test of the test: a `super::` circle planted between two files of a copy of the log crate is
/// found, and so is one through `self::` in a `mod.rs`.
#[test]
fn a_planted_super_circle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("log")).unwrap();
    let write = |rel: &str, text: &str| std::fs::write(src.join(rel), text).unwrap();
    write("lib.rs", "pub mod log;\npub mod other;\n");
    write("other.rs", "use crate::log::a::A;\n");
    write("log/mod.rs", "mod a;\nmod b;\npub use self::a::A;\n");
    write("log/a.rs", "use super::b::B;\npub struct A;\n");
    write("log/b.rs", "use super::{a::A, c};\nuse super::super::other::X;\npub struct B;\n");
    let graph = module_graph(&src);
    assert_eq!(graph["log::a"], BTreeSet::from(["log::b".to_owned()]));
    // `c` is no module (yet): the path goes to the module it is in, `log`.
    let b: BTreeSet<String> = ["log", "log::a", "other"].into_iter().map(String::from).collect();
    assert_eq!(graph["log::b"], b);
    assert!(graph["log"].is_empty(), "a mod.rs re-exporting its own submodule is no edge: {graph:?}");
    let cycle = find_cycle(&graph).expect("log::a -> log::b -> log::a");
    assert!(cycle.contains(&"log::a".to_owned()) && cycle.contains(&"log::b".to_owned()), "{cycle:?}");
    // Broken the way the log crate broke block <-> oom: what both need moves to a third file.
    write("log/b.rs", "use super::c::C;\npub struct B;\n");
    write("log/c.rs", "pub struct C;\n");
    write("log/mod.rs", "mod a;\nmod b;\nmod c;\n");
    assert_eq!(find_cycle(&module_graph(&src)), None);
}

#[test]
fn no_import_cycle_between_modules() {
    for crate_src in LIBRARY_SOURCES {
        let graph = import_graph(&root().join(crate_src));
        assert!(graph.len() > 5, "{crate_src}: found only {graph:?}");
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{crate_src}: import cycle {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn no_module_imports_through_the_crate_root() {
    for crate_src in LIBRARY_SOURCES {
        let src = root().join(crate_src);
        let found = imports(&src).through_root;
        assert!(found.is_empty(), "{crate_src}: imports through the crate root: {found:?}");
        let modules: BTreeSet<String> = ["error", "tracker", "walk", "tch_model", "saved", "size"]
            .into_iter()
            .map(String::from)
            .collect();
        let reexports = root_reexports(&src, &modules);
        assert!(reexports.len() >= 3, "{crate_src}: re-exports not read: {reexports:?}");
    }
    // The root's own re-exports are read as the modules they come from.
    let src = root().join("src");
    let all: BTreeSet<String> = ["error", "tracker", "site", "walk"].into_iter().map(String::from).collect();
    let reexports = root_reexports(&src, &all);
    assert_eq!(reexports.get("MemTracker"), Some(&Some("tracker".to_owned())));
    assert_eq!(reexports.get("Site"), Some(&Some("site".to_owned())));
    assert_eq!(reexports.get("LogError"), Some(&None));
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
    assert_eq!(crate_paths("use crate::{error::Error, MemTracker};\nx(crate::Site::new())"), {
        ["error", "MemTracker", "Site"].into_iter().map(String::from).collect::<BTreeSet<_>>()
    });
}

#[test]
fn only_ffi_reads_the_c_boundary() {
    let mut files = Vec::new();
    for dir in [
        "src",
        "gpu-mem-track-log/src",
        "gpu-mem-track-cli/src",
        "gpu-mem-track-estimate/src",
        "gpu-mem-track-estimate/tests",
        "gpu-mem-track-estimate/benches",
        "gpu-mem-track-estimate/examples",
        "tests",
        "benches",
        "examples",
        "tracker-macros/src",
        "gpu-mem-track-testkit/src",
        "gpu-mem-track-testkit/tests",
    ] {
        rust_files(&root().join(dir), &mut files);
    }
    let tracker_ffi = root().join("src/ffi");
    let estimator_ffi = root().join("gpu-mem-track-estimate/src/ffi.rs");
    let this = root().join("gpu-mem-track-testkit/tests/layers.rs");
    // Either -sys crate: the tracker's shim or the estimator's native code.
    let reads_sys = |f: &Path| {
        let text = std::fs::read_to_string(f).expect("readable source");
        text.contains("gpu_mem_track_sys") || text.contains("gpu_mem_track_estimate_sys")
    };
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.starts_with(&tracker_ffi) && **f != estimator_ffi && **f != this)
        .filter(|f| reads_sys(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "a -sys crate used outside the ffi modules: {offenders:?}");
    for ffi in [tracker_ffi.join("mod.rs"), tracker_ffi.join("registry.rs"), estimator_ffi.clone()] {
        assert!(reads_sys(&ffi), "{} no longer wraps a -sys crate?", ffi.display());
    }
    let estimator_ffi = std::fs::read_to_string(&estimator_ffi).expect("the estimator's ffi.rs");
    assert!(
        estimator_ffi.contains("gpu_mem_track_estimate_sys"),
        "the estimator's ffi no longer wraps its -sys crate"
    );
}

/// The tracker crate is `track!`, `MemTracker`, the sampler, the memory history and snapshots: the
/// estimator is its own crate on top of it, never the other way round.
#[test]
fn the_estimator_is_a_crate_above_the_tracker() {
    let root = root();
    assert!(!root.join("src/estimate").exists() && !root.join("src/estimate.rs").exists());
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    assert!(!lib.contains("mod estimate"), "the tracker declares an estimate module");
    let manifest = |p: &str| std::fs::read_to_string(root.join(p)).expect("manifest");
    let deps = |text: &str| -> BTreeSet<String> {
        let deps = text.split("\n[dependencies]").nth(1).unwrap_or("");
        let deps = &deps[..deps.find("\n[").unwrap_or(deps.len())];
        deps.lines().filter_map(|l| l.split(['=', '.']).next()).map(|n| n.trim().to_owned()).collect()
    };
    let tracker = deps(&manifest("Cargo.toml"));
    let tracker_sys = deps(&manifest("gpu-mem-track-sys/Cargo.toml"));
    let estimator = deps(&manifest("gpu-mem-track-estimate/Cargo.toml"));
    let estimator_sys = deps(&manifest("gpu-mem-track-estimate-sys/Cargo.toml"));
    let log = deps(&manifest("gpu-mem-track-log/Cargo.toml"));
    // No estimator crate under the tracker (what `cargo tree -p gpu-mem-track` would show).
    for (name, deps) in [("gpu-mem-track", &tracker), ("gpu-mem-track-sys", &tracker_sys)] {
        assert!(!deps.iter().any(|d| d.starts_with("gpu-mem-track-estimate")), "{name}: {deps:?}");
    }
    assert!(tracker.contains("gpu-mem-track-log") && tracker.contains("gpu-mem-track-sys"), "{tracker:?}");
    for dep in ["gpu-mem-track", "gpu-mem-track-sys", "gpu-mem-track-estimate-sys"] {
        assert!(estimator.contains(dep), "the estimator does not depend on {dep}: {estimator:?}");
    }
    // The estimator's native code builds on the tracker's shim, never the other way round.
    assert!(estimator_sys.contains("gpu-mem-track-sys"), "{estimator_sys:?}");
    assert!(!log.iter().any(|d| d.starts_with("gpu-mem-track") || d == "tch"), "{log:?}");
}

/// The estimator reaches the tracker's shim only through the tracker's safe API (the
/// saved-for-backward capture is `gpu_mem_track::saved`): its `ffi.rs` calls its own `-sys`
/// crate's functions, and of the tracker's `-sys` crate names only the shared error type.
#[test]
fn the_estimator_calls_the_trackers_shim_through_the_tracker() {
    let ffi = std::fs::read_to_string(root().join("gpu-mem-track-estimate/src/ffi.rs")).expect("ffi.rs");
    let direct: BTreeSet<&str> = ffi
        .match_indices("sys::gmt_")
        .filter(|(at, _)| !ffi[..*at].ends_with('e')) // `esys::`: the estimator's own
        .map(|(at, _)| {
            let rest = &ffi[at + 5..];
            &rest[..rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len())]
        })
        .collect();
    assert_eq!(direct, BTreeSet::from(["gmt_error"]), "the estimator calls the tracker's shim directly");
    let tracker = std::fs::read_to_string(root().join("src/ffi/saved.rs")).expect("src/ffi/saved.rs");
    assert!(tracker.contains("gmt_saved_capture_begin"));
}

/// The names in a manifest's `[dependencies]` table.
fn manifest_dependencies(path: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(path)).expect("manifest");
    let deps = text.split("\n[dependencies]").nth(1).unwrap_or("");
    let deps = &deps[..deps.find("\n[").unwrap_or(deps.len())];
    deps.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split(['=', '.']).next())
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The GPU model (caching allocator, CUDA libraries' workspaces, device profiles, sharding) needs
/// no libtorch: it sits on the log layer, below the tracker and the estimator, and the log layer
/// does not reach up to it.
#[test]
fn the_gpu_model_sits_below_the_estimator_without_libtorch() {
    let gpu = manifest_dependencies("gpu-mem-track-gpu/Cargo.toml");
    assert!(gpu.contains("gpu-mem-track-log"), "{gpu:?}");
    for libtorch in [
        "gpu-mem-track",
        "gpu-mem-track-sys",
        "gpu-mem-track-estimate",
        "gpu-mem-track-estimate-sys",
        "tch",
        "torch-sys",
    ] {
        assert!(!gpu.contains(libtorch), "the GPU model depends on {libtorch}: {gpu:?}");
    }
    for user in ["Cargo.toml", "gpu-mem-track-estimate/Cargo.toml", "gpu-mem-track-cli/Cargo.toml"] {
        assert!(
            manifest_dependencies(user).contains("gpu-mem-track-gpu"),
            "{user} does not use the GPU model"
        );
    }
    assert!(!manifest_dependencies("gpu-mem-track-log/Cargo.toml").contains("gpu-mem-track-gpu"));
    for moved in ["caching_allocator.rs", "cuda_libraries.rs"] {
        assert!(
            !root().join("gpu-mem-track-log/src").join(moved).exists(),
            "{moved} is back in the log crate"
        );
    }
    for moved in ["gpu_runtime.rs", "profile.rs", "sharding.rs", "main.rs"] {
        assert!(
            !root().join("gpu-mem-track-estimate/src").join(moved).exists(),
            "{moved} is back in the estimator"
        );
    }
}

/// The estimator is a library: the command line (clap, anyhow, progress bars) is the CLI
/// package's, which builds the binary that runs models behind its `estimate` feature.
#[test]
fn the_estimator_library_has_no_command_line() {
    let estimator = manifest_dependencies("gpu-mem-track-estimate/Cargo.toml");
    for cli in ["clap", "anyhow", "indicatif", "gpu-mem-track-cli"] {
        assert!(!estimator.contains(cli), "the estimator depends on {cli}: {estimator:?}");
    }
    assert!(!root().join("gpu-mem-track-cli/src/estimator_help").exists());
}

/// What users build runs no test harness: the published build scripts probe nothing (no Python,
/// no program at all; the test cfgs come from `GMT_TEST_CFGS`, which `scripts/dev` sets), and no
/// package's tests include another's files: what they share is `gpu-mem-track-testkit`.
#[test]
fn no_test_harness_in_shipped_code() {
    let root = root();
    for script in ["build.rs", "gpu-mem-track-estimate/build.rs", "gpu-mem-track-cli/build.rs"] {
        let text = std::fs::read_to_string(root.join(script)).expect("build script");
        for probe in ["Command::", "std::process", "\"python"] {
            assert!(!text.contains(probe), "{script} runs something ({probe})");
        }
    }
    let testkit = std::fs::read_to_string(root.join("gpu-mem-track-testkit/Cargo.toml")).expect("testkit");
    assert!(testkit.contains("publish = false"), "the testkit is never published");
    let mut files = Vec::new();
    for dir in [
        "tests",
        "gpu-mem-track-log/tests",
        "gpu-mem-track-gpu",
        "gpu-mem-track-estimate/tests",
        "gpu-mem-track-cli/tests",
        "gpu-mem-track-py",
        "gpu-mem-track-testkit/tests",
    ] {
        if root.join(dir).is_dir() {
            rust_files(&root.join(dir), &mut files);
        }
    }
    for file in files {
        let text = std::fs::read_to_string(&file).expect("test file");
        for (i, _) in text.match_indices("#[path = \"") {
            let target = &text[i + 10..];
            let target = &target[..target.find('"').unwrap_or(target.len())];
            assert!(!target.starts_with("../../"), "{} includes {target} of another package", file.display());
        }
    }
}

/// The C++ files of a -sys crate: every `.cpp` and `.h` under its `csrc/`.
fn cpp_files(crate_dir: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "cpp" || e == "h") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root().join(crate_dir).join("csrc"), &mut out);
    out.sort();
    out
}

/// The tracker's shim compiles none of the estimator's C++ and calls none of it: no file of
/// gpu-mem-track-sys includes an estimator header or names a function the estimator's header
/// declares (where the estimator needs a point of the tracker, it installs a hook).
#[test]
fn the_tracker_shim_never_calls_the_estimator() {
    let estimator_header = std::fs::read_to_string(root().join("gpu-mem-track-estimate-sys/csrc/estimate.h"))
        .expect("the estimator's C header");
    // `gmt_...(` declared there: an identifier starting `gmt_` right before a parenthesis.
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let declared: BTreeSet<String> = estimator_header
        .match_indices("gmt_")
        .filter(|(at, _)| !estimator_header[..*at].ends_with(ident))
        .filter_map(|(at, _)| {
            let rest = &estimator_header[at..];
            let end = rest.find(|c: char| !ident(c)).unwrap_or(rest.len());
            rest[end..].starts_with('(').then(|| rest[..end].to_owned())
        })
        .collect();
    assert!(declared.contains("gmt_estimate_torchscript") && declared.len() > 15, "{declared:?}");
    let estimator_files: BTreeSet<String> = cpp_files("gpu-mem-track-estimate-sys")
        .iter()
        .map(|f| f.file_name().expect("a file name").to_string_lossy().into_owned())
        .collect();
    let build = std::fs::read_to_string(root().join("gpu-mem-track-sys/build.rs")).expect("build.rs");
    for file in cpp_files("gpu-mem-track-sys") {
        let text = std::fs::read_to_string(&file).expect("readable C++");
        let name = file.file_name().expect("a file name").to_string_lossy().into_owned();
        assert!(!estimator_files.contains(&name), "{name} is in both -sys crates");
        for estimator_file in &estimator_files {
            assert!(
                !text.contains(&format!("\"{estimator_file}\"")),
                "{} includes {estimator_file}",
                file.display()
            );
            assert!(
                !build.contains(estimator_file.as_str()),
                "gpu-mem-track-sys/build.rs compiles {estimator_file}"
            );
        }
        for function in &declared {
            assert!(
                !text.contains(&format!("{function}(")),
                "{} calls the estimator's {function}",
                file.display()
            );
        }
    }
}

/// Each C++ file does one job: none is over 700 lines.
#[test]
fn no_cpp_file_is_over_700_lines() {
    for file in cpp_files("gpu-mem-track-sys").into_iter().chain(cpp_files("gpu-mem-track-estimate-sys")) {
        let lines = std::fs::read_to_string(&file).expect("readable C++").lines().count();
        assert!(lines <= 700, "{}: {lines} lines", file.display());
    }
}

// The Python package: no import cycle between its modules.
//
// Its imports are read as text (no Python runs): `import gpu_mem_track._x`, `from . import x`,
// `from ._x import y`, `from .integrations.z import w`, `from gpu_mem_track import ...`, those
// inside functions included (a deferred import is still a cycle: it only moves the failure to
// the first call), and only those under `if TYPE_CHECKING:` left out (they never run). Strings
// and comments are blanked first, so an import in a docstring is none. `from P import n` is an
// import of the module `P.n` where that is a file, else of `P` itself (`n` is then defined in, or
// re-exported by, `P/__init__.py`): so a module taking a name from the package root imports
// `__init__.py`, a cycle only if `__init__.py` imports it back. Importing `a.b.c` runs
// `a/__init__.py` and `a/b/__init__.py` first, but those are already running or done whenever a
// module below them is imported from inside the package, so only the module named is an edge.
// The compiled extension (maturin's `module-name`) is a module with no source: no edge.

/// One module's import of another: where it is and what it says, for the failure message.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PyImport {
    line: usize,
    statement: String,
}

/// Edges file -> file it imports (paths relative to the package folder, `integrations/__init__.py`),
/// each with the first statement making it.
type PyGraph = BTreeMap<String, BTreeMap<String, PyImport>>;

/// `text` with every string literal's contents and every comment removed, line breaks kept (a
/// triple-quoted string's too), so only code is left where it was.
fn python_code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' {
            let triple = i + 2 < chars.len() && chars[i + 1] == c && chars[i + 2] == c;
            let quote = if triple { 3 } else { 1 };
            out.extend(std::iter::repeat_n(c, quote));
            i += quote;
            loop {
                match chars.get(i) {
                    None => break,
                    Some('\\') => i += 2,
                    Some('\n') if !triple => break, // unterminated: leave the line as it is
                    Some('\n') => {
                        out.push('\n');
                        i += 1;
                    }
                    Some(&q) if q == c && (!triple || chars[i..].starts_with(&[c, c, c])) => {
                        i += quote;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            out.extend(std::iter::repeat_n(c, quote));
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The logical lines of code (brackets and `\` joined): (first line's number, indentation, text).
fn python_logical_lines(code: &str) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize, String)> = None;
    let mut depth = 0i32;
    for (n, line) in code.lines().enumerate() {
        let (continued, line) = match line.trim_end().strip_suffix('\\') {
            Some(l) => (true, l),
            None => (false, line),
        };
        let entry =
            current.get_or_insert_with(|| (n + 1, line.len() - line.trim_start().len(), String::new()));
        entry.2.push(' ');
        entry.2.push_str(line.trim());
        for c in line.chars() {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            }
        }
        if depth <= 0 && !continued {
            depth = 0;
            let (line, indent, text) = current.take().expect("a line");
            if !text.trim().is_empty() {
                out.push((line, indent, text.trim().to_owned()));
            }
        }
    }
    out.extend(current.filter(|c| !c.2.trim().is_empty()));
    out
}

/// The position of the first `:` outside brackets in `s`.
fn python_top_level_colon(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ':' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    None
}

/// The simple statements of one logical line: split at `;`, and a compound statement's header
/// (`if x:`, `try:`, `def f():`) taken off a body written on the same line.
fn python_statements(line: &str) -> Vec<String> {
    const COMPOUND: [&str; 11] =
        ["if", "elif", "else", "try", "except", "finally", "with", "for", "while", "def", "class"];
    let mut out = Vec::new();
    for statement in line.split(';') {
        let mut s = statement.trim();
        loop {
            let keyword = ident(s);
            let compound = COMPOUND.contains(&keyword.as_str())
                || (keyword == "async"
                    && ["def", "with", "for"].contains(&ident(s[5..].trim_start()).as_str()));
            match python_top_level_colon(s).filter(|_| compound) {
                Some(colon) if !s[colon + 1..].trim().is_empty() => s = s[colon + 1..].trim(),
                _ => break,
            }
        }
        if !s.is_empty() {
            out.push(s.to_owned());
        }
    }
    out
}

/// Whether a logical line opens a block that runs only for type checkers.
fn python_type_checking_only(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("if ") else { return false };
    let Some(colon) = python_top_level_colon(rest) else { return false };
    matches!(rest[..colon].trim(), "TYPE_CHECKING" | "typing.TYPE_CHECKING" | "_typing.TYPE_CHECKING")
}

/// What one import statement imports: (the module named, the names taken from it; none for
/// `import m`), the module spelled as written (`..x`, `.`, `gpu_mem_track._x`).
fn python_import(statement: &str) -> Vec<(String, Vec<String>)> {
    let names = |list: &str| -> Vec<String> {
        list.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|n| n.split_whitespace().next().unwrap_or("").to_owned())
            .filter(|n| !n.is_empty())
            .collect()
    };
    if let Some(rest) = statement.strip_prefix("import ") {
        names(rest).into_iter().map(|m| (m, Vec::new())).collect()
    } else if let Some(rest) = statement.strip_prefix("from ") {
        let mut parts = rest.splitn(2, " import ");
        let (Some(module), Some(list)) = (parts.next(), parts.next()) else { return Vec::new() };
        vec![(module.trim().replace(' ', ""), names(list))]
    } else {
        Vec::new()
    }
}

/// The import graph of the Python package in `package_dir` (the folder holding its
/// `__init__.py`). `native`: dotted names of modules without a source file (the extension).
fn python_import_graph(package_dir: &Path, native: &[String]) -> PyGraph {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "__pycache__") {
                    walk(&path, out);
                }
            } else if path.extension().is_some_and(|e| e == "py") {
                out.push(path);
            }
        }
    }
    let package = package_dir.file_name().expect("the package's folder").to_string_lossy().into_owned();
    let mut files = Vec::new();
    walk(package_dir, &mut files);
    // Dotted module name -> (file relative to the package, whether it is a package's __init__).
    let mut modules: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for file in &files {
        let rel =
            file.strip_prefix(package_dir).expect("in the package").to_string_lossy().replace('\\', "/");
        let mut dotted: Vec<&str> = std::iter::once(package.as_str()).chain(rel.split('/')).collect();
        let last = dotted.pop().expect("a file name");
        let is_init = last == "__init__.py";
        if !is_init {
            dotted.push(last.trim_end_matches(".py"));
        }
        modules.insert(dotted.join("."), (rel, is_init));
    }
    let mut graph = PyGraph::new();
    for (name, (rel, is_init)) in &modules {
        let edges = graph.entry(rel.clone()).or_default();
        let text = std::fs::read_to_string(package_dir.join(rel)).expect("a readable module");
        // The package a relative import starts from: the module's own if it is an __init__.
        let here: Vec<&str> = name.split('.').collect();
        let here = if *is_init { &here[..] } else { &here[..here.len() - 1] };
        let mut type_checking: Option<usize> = None;
        for (line, indent, logical) in python_logical_lines(&python_code(&text)) {
            if type_checking.is_some_and(|at| indent > at) {
                continue;
            }
            type_checking = None;
            if python_type_checking_only(&logical) {
                type_checking = Some(indent);
                continue;
            }
            for statement in python_statements(&logical) {
                for (module, taken) in python_import(&statement) {
                    let dots = module.len() - module.trim_start_matches('.').len();
                    let rest = &module[dots..];
                    let base = if dots == 0 {
                        rest.to_owned()
                    } else {
                        let up = here.len().saturating_sub(dots - 1);
                        let mut base: Vec<&str> = here[..up].to_vec();
                        base.extend(rest.split('.').filter(|s| !s.is_empty()));
                        base.join(".")
                    };
                    if base != package && !base.starts_with(&format!("{package}.")) {
                        continue; // torch, typing, ...
                    }
                    let targets: Vec<String> = if taken.is_empty() || taken == ["*"] {
                        vec![base.clone()]
                    } else {
                        taken
                            .iter()
                            .map(|n| format!("{base}.{n}"))
                            .map(|sub| {
                                if modules.contains_key(&sub) || native.contains(&sub) {
                                    sub
                                } else {
                                    base.clone()
                                }
                            })
                            .collect()
                    };
                    for target in targets {
                        if native.contains(&target) {
                            continue;
                        }
                        // `import a.b.c` of a module that is not there: the deepest one that is.
                        let mut target = target.as_str();
                        while !modules.contains_key(target) {
                            match target.rfind('.') {
                                Some(dot) => target = &target[..dot],
                                None => break,
                            }
                        }
                        let Some((to, _)) = modules.get(target) else { continue };
                        if to != rel {
                            edges
                                .entry(to.clone())
                                .or_insert_with(|| PyImport { line, statement: statement.clone() });
                        }
                    }
                }
            }
        }
    }
    graph
}

/// Every cycle of the graph, one per strongly connected component of more than one node (each a
/// path from its first node back to it), found with Tarjan's algorithm.
fn all_cycles<V>(graph: &BTreeMap<String, BTreeMap<String, V>>) -> Vec<Vec<String>> {
    struct State<'g, V> {
        graph: &'g BTreeMap<String, BTreeMap<String, V>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        components: Vec<BTreeSet<&'g str>>,
    }
    fn connect<'g, V>(s: &mut State<'g, V>, node: &'g str) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        let graph = s.graph;
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            let next = next.as_str();
            if !s.index.contains_key(next) {
                connect(s, next);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node, low);
            } else if s.stack.contains(&next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = BTreeSet::new();
            while let Some(n) = s.stack.pop() {
                component.insert(n);
                if n == node {
                    break;
                }
            }
            s.components.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for node in graph.keys() {
        if !s.index.contains_key(node.as_str()) {
            connect(&mut s, node);
        }
    }
    let mut cycles = Vec::new();
    for component in s.components.iter().filter(|c| c.len() > 1) {
        // The shortest way round from the component's first node, breadth first inside it.
        let start = *component.iter().next().expect("a node");
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        'search: while let Some(node) = queue.pop_front() {
            for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
                let next = next.as_str();
                if !component.contains(next) {
                    continue;
                }
                if next == start {
                    let mut path = vec![start.to_owned()];
                    let mut at = node;
                    while at != start {
                        path.push(at.to_owned());
                        at = came_from[at];
                    }
                    path.push(start.to_owned());
                    path.reverse();
                    cycles.push(path);
                    break 'search;
                }
                if next != start && !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
    }
    cycles.sort();
    cycles
}

/// The Python package's cycles, each written out with the statements that close it:
/// `_a.py -> _b.py -> _a.py (_a.py:3 `from ._b import B`; _b.py:9 `from . import _a`)`.
fn python_cycles(package_dir: &Path, native: &[String]) -> Vec<String> {
    let graph = python_import_graph(package_dir, native);
    all_cycles(&graph)
        .into_iter()
        .map(|cycle| {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| {
                    let import = &graph[&w[0]][&w[1]];
                    format!("{}:{} `{}`", w[0], import.line, import.statement)
                })
                .collect();
            format!("{} ({})", cycle.join(" -> "), steps.join("; "))
        })
        .collect()
}

/// The Python package's folder, and its compiled extension's dotted name (maturin's
/// `module-name` in pyproject.toml).
fn python_package() -> (PathBuf, Vec<String>) {
    let py = root().join("gpu-mem-track-py");
    let pyproject =
        std::fs::read_to_string(py.join("pyproject.toml")).expect("gpu-mem-track-py/pyproject.toml");
    let native: Vec<String> = pyproject
        .lines()
        .filter_map(|l| l.trim().strip_prefix("module-name"))
        .filter_map(|l| l.trim().strip_prefix('='))
        .map(|l| l.trim().trim_matches('"').to_owned())
        .collect();
    assert_eq!(native.len(), 1, "maturin's module-name not found in pyproject.toml: {native:?}");
    (py.join("python/gpu_mem_track"), native)
}

#[test]
fn no_import_cycle_between_python_modules() {
    let (package, native) = python_package();
    let graph = python_import_graph(&package, &native);
    // The reading finds the package's imports at all: the root re-exports its modules.
    assert!(graph.len() > 8, "found only {graph:?}");
    assert!(graph["__init__.py"].contains_key("_tracker.py"), "{graph:?}");
    assert!(graph["integrations/__init__.py"].contains_key("_tracker.py"), "{graph:?}");
    let cycles = python_cycles(&package, &native);
    assert!(cycles.is_empty(), "gpu_mem_track: import cycles:\n  {}", cycles.join("\n  "));
}

/// A test of the test: cycles planted in a package of a temporary folder are found, through a
/// deferred import inside a function and through the package root; an import under
/// `if TYPE_CHECKING:`, one in a docstring and the root's re-exports are no edge.
#[test]
fn a_planted_python_import_cycle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let package = dir.path().join("pkg");
    std::fs::create_dir_all(package.join("sub")).unwrap();
    let write = |rel: &str, text: &str| std::fs::write(package.join(rel), text).unwrap();
    write(
        "__init__.py",
        "\"\"\"A package.\n\n    from pkg import A\n\"\"\"\nfrom ._a import A\nfrom ._b import (\n    B,\n    b,\n)\nfrom . import _native\n",
    );
    write("_a.py", "import json\nfrom ._b import B  # B\n\nclass A:\n    pass\n");
    write("_b.py", "def b():\n    from . import _a\n    return _a.A()\n\nclass B:\n    pass\n");
    write(
        "_c.py",
        "from __future__ import annotations\nimport typing\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ._d import D\n    import pkg._d\nelse:\n    x = 1\ns = 'from ._d import D'\n",
    );
    write("_d.py", "import pkg._c as c\nfrom pkg.sub.leaf import thing; from .sub import other\n");
    write("sub/__init__.py", "other = 1\n");
    write("sub/leaf.py", "import os, pkg._e\nthing = 1\n");
    write("_e.py", "if True: from . import A\n");
    let native = vec!["pkg._native".to_owned()];
    let graph = python_import_graph(&package, &native);
    let edges = |from: &str| -> BTreeSet<&str> { graph[from].keys().map(String::as_str).collect() };
    assert_eq!(edges("__init__.py"), BTreeSet::from(["_a.py", "_b.py"]), "{graph:?}");
    assert_eq!(edges("_a.py"), BTreeSet::from(["_b.py"]));
    assert_eq!(edges("_b.py"), BTreeSet::from(["_a.py"]), "the deferred import is read");
    assert_eq!(edges("_c.py"), BTreeSet::new(), "TYPE_CHECKING imports and strings are no edge");
    assert_eq!(edges("_d.py"), BTreeSet::from(["_c.py", "sub/__init__.py", "sub/leaf.py"]));
    assert_eq!(edges("sub/leaf.py"), BTreeSet::from(["_e.py"]));
    assert_eq!(edges("_e.py"), BTreeSet::from(["__init__.py"]), "a name of the root is its __init__");
    assert_eq!(graph["_b.py"]["_a.py"], PyImport { line: 2, statement: "from . import _a".to_owned() });
    let cycles = python_cycles(&package, &native);
    assert_eq!(
        cycles,
        ["_a.py -> _b.py -> _a.py (_a.py:2 `from ._b import B`; _b.py:2 `from . import _a`)"],
        "{graph:?}"
    );
    // Through the root: `_e` takes `A` from __init__, which imports `_e` (by way of `_c`, `_d`,
    // `sub/leaf`); and the deferred import broken, the way `_estimate`/`_estimator` must.
    write("__init__.py", "from ._a import A\nfrom ._d import c\n");
    write("_b.py", "class B:\n    pass\n");
    write("_c.py", "x = 1\n");
    let cycles = python_cycles(&package, &native);
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("__init__.py -> _d.py -> sub/leaf.py -> _e.py -> __init__.py"),
        "{cycles:?}"
    );
    write("_e.py", "from ._a import A\n");
    assert_eq!(python_cycles(&package, &native), Vec::<String>::new());
}

#[test]
fn python_code_blanks_strings_and_comments() {
    let code = python_code("a = 'x # y' # from . import z\nb = \"\"\"\nimport q\n\"\"\"\nc = r'\\'' \n");
    assert_eq!(code, "a = '' \nb = \"\"\"\n\n\"\"\"\nc = r'' \n");
    assert_eq!(
        python_logical_lines("from . import (\n    a,\n    b,\n)\nx = 1 + \\\n  2\n"),
        [(1, 0, "from . import ( a, b, )".to_owned()), (5, 0, "x = 1 + 2".to_owned())]
    );
    assert_eq!(python_statements("try: import a; import b"), ["import a", "import b"]);
    assert_eq!(
        python_import("from ..x import (a as b, c)"),
        [("..x".to_owned(), vec!["a".to_owned(), "c".to_owned()])]
    );
}
