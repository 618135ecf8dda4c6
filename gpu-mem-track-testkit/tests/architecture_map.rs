//! `docs/architecture.md`'s map stays true: every source file of the workspace is named there, and
//! every file, macro and code item it names exists.
//!
//! The source files are the `.rs` files under each workspace member's `src/`, the `.cpp` and `.h`
//! files under its `csrc/`, and the `.py` files of the Python package (`gpu-mem-track-py/python/`).
//! The doc names a file the way it does today: by its path from the workspace root, from its crate,
//! or by a shorter tail of it down to the bare file name (`src/ffi/registry.rs`, `csrc/shim.h`,
//! `log/reader.rs`, `_tracker.py`); a `mod.rs` or an `__init__.py`, which is its folder's entry, by
//! its folder (`report/`, `integrations/`) or a path with the folder in it. A file name that
//! several files share (`lib.rs`, `error.rs`) is named for all of them by any mention.
//!
//! What the doc names is read from its inline code spans (`` `...` ``), and from its fenced code
//! blocks (the code map) the tokens that can only be code: macros (`__site!`), attributes
//! (`#[track_memory]`), file names with a source extension, folders (`log/`):
//! - a macro `name!` (or `name!()`) needs a `macro_rules! name`;
//! - an attribute `#[name]` is used (`#[name`) or defined (`fn name`) in the sources;
//! - a path (with a `/`, or a file name ending `.rs`, `.cpp`, `.h`, `.py`, `.toml`) exists from
//!   the workspace root, a member, a member's `src/` or the Python package's folder; a bare file
//!   name exists anywhere in the workspace;
//! - a package name (`gpu-mem-track-cli`) is a package's or a binary's `name` in a manifest;
//! - a code path or call (`MemTracker::track_at`, `gpu_mem_track.estimate()`,
//!   `estimate(device_profile=...)`) or an identifier that can only be code (`AtField`,
//!   `take_grouped`, `GMT_TEST_CFGS`: an underscore or a capital letter) has each of its segments
//!   (and keyword arguments) as a word of the sources.
//!
//! Plain words (`tch`, `report`, `estimate`), commands, log-line patterns and anything with a space
//! are prose, and not checked. The sources searched are the workspace's code (`.rs`, `.cpp`, `.h`,
//! `.py`, `.pyi`, `.toml`, and the scripts), not its Markdown.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names of libtorch's or PyTorch's own the doc explains with, which no file here mentions.
const EXTERNAL: [&str; 1] = ["THPVariable_clear"];

/// The source file extensions a name in the doc is taken as a file by.
const SOURCE_EXTENSIONS: [&str; 5] = ["rs", "cpp", "h", "py", "toml"];

fn root() -> &'static Path {
    gpu_mem_track_testkit::workspace_root()
}

fn doc() -> String {
    std::fs::read_to_string(root().join("docs/architecture.md")).expect("docs/architecture.md")
}

/// Every file under `dir` (a folder that is not there: none), skipping version control, build
/// outputs, virtual environments and caches.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let path = entry.expect("directory entry").path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() {
            if !(name.starts_with('.') || ["target", "__pycache__", "node_modules"].contains(&name.as_str()))
            {
                walk(&path, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// `path` relative to the workspace root, with `/`.
fn relative(path: &Path) -> String {
    path.strip_prefix(root()).expect("in the workspace").to_string_lossy().replace('\\', "/")
}

/// The workspace's members (`.` for the root package), from the root manifest's `members`.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let at = manifest.find("\nmembers").expect("a members list");
    let list = &manifest[at..];
    let list = &list[list.find('[').expect("[") + 1..list.find(']').expect("]")];
    let members: Vec<String> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty() && !m.starts_with('#'))
        .collect();
    assert!(members.len() > 5 && members.contains(&".".to_owned()), "{members:?}");
    members
}

/// The source files the map must name, relative to the workspace root.
fn source_files() -> Vec<String> {
    let mut files = Vec::new();
    for member in members() {
        let dir = root().join(&member);
        let mut found = Vec::new();
        walk(&dir.join("src"), &mut found);
        files.extend(found.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")).map(|f| relative(f)));
        found.clear();
        walk(&dir.join("csrc"), &mut found);
        files.extend(
            found
                .iter()
                .filter(|f| f.extension().is_some_and(|e| e == "cpp" || e == "h"))
                .map(|f| relative(f)),
        );
    }
    let mut python = Vec::new();
    walk(&root().join("gpu-mem-track-py/python"), &mut python);
    files.extend(python.iter().filter(|f| f.extension().is_some_and(|e| e == "py")).map(|f| relative(f)));
    files.sort();
    files.dedup();
    files
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The doc's path-like tokens: each longest run of path characters, a sentence's closing `.`
/// taken off.
fn path_tokens(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !path_char(c))
        .map(|t| t.trim_end_matches('.').trim_start_matches("./"))
        .filter(|t| t.chars().any(|c| c.is_ascii_alphanumeric()))
        .map(str::to_owned)
        .collect()
}

/// Whether `token` names the source file `file` (both relative to the workspace root).
fn names_file(token: &str, file: &str) -> bool {
    let tail_of = |whole: &str, tail: &str| whole == tail || whole.ends_with(&format!("/{tail}"));
    let (folder, name) = file.rsplit_once('/').unwrap_or(("", file));
    if name == "mod.rs" || name == "__init__.py" {
        match token.strip_suffix('/') {
            Some(dir) => tail_of(folder, dir),
            None => token.contains('/') && tail_of(file, token),
        }
    } else {
        tail_of(file, token)
    }
}

/// The doc's inline code spans (outside fenced blocks), and the text of its fenced blocks.
fn spans_and_blocks(doc: &str) -> (Vec<String>, String) {
    let mut prose = String::new();
    let mut blocks = String::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let to = if fenced { &mut blocks } else { &mut prose };
        to.push_str(line);
        to.push('\n');
    }
    let spans = prose.split('`').skip(1).step_by(2).map(|s| s.trim().to_owned()).collect();
    (spans, blocks)
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') && s.chars().all(ident_char)
}

/// What the workspace has, to check names against.
struct Sources {
    /// Every identifier-like word of the code.
    words: BTreeSet<String>,
    /// The code itself, file by file (relative path -> text).
    code: BTreeMap<String, String>,
    /// Every file name in the workspace (`reader.rs`).
    file_names: BTreeSet<String>,
    /// Package and binary names of the manifests.
    packages: BTreeSet<String>,
    /// Where a relative path may start: the root, each member, its `src/`, the Python package.
    bases: Vec<PathBuf>,
}

fn sources() -> Sources {
    let mut all = Vec::new();
    walk(root(), &mut all);
    let mut code = BTreeMap::new();
    let mut file_names = BTreeSet::new();
    for file in &all {
        let rel = relative(file);
        file_names.insert(file.file_name().expect("a file name").to_string_lossy().into_owned());
        let ext = file.extension().map(|e| e.to_string_lossy().into_owned());
        let is_code = match ext.as_deref() {
            Some("rs" | "cpp" | "h" | "py" | "pyi" | "toml" | "sh") => true,
            None => rel.starts_with("scripts/"),
            _ => false,
        };
        // This file names what does not exist, to see it found.
        let this = rel == "gpu-mem-track-testkit/tests/architecture_map.rs";
        if is_code && !this && !rel.starts_with("docs/") && !rel.starts_with("logs/") {
            if let Ok(text) = std::fs::read_to_string(file) {
                code.insert(rel, text);
            }
        }
    }
    let mut words = BTreeSet::new();
    for text in code.values() {
        words.extend(text.split(|c: char| !ident_char(c)).filter(|w| !w.is_empty()).map(str::to_owned));
    }
    let mut packages = BTreeSet::new();
    for (rel, text) in &code {
        if rel.ends_with("Cargo.toml") || rel.ends_with("pyproject.toml") {
            for line in text.lines() {
                if let Some(value) =
                    line.trim().strip_prefix("name").map(str::trim).and_then(|l| l.strip_prefix('='))
                {
                    packages.insert(value.trim().trim_matches('"').to_owned());
                }
            }
        }
    }
    let mut bases = vec![root().to_path_buf(), root().join("gpu-mem-track-py/python/gpu_mem_track")];
    for member in members() {
        bases.push(root().join(&member));
        bases.push(root().join(&member).join("src"));
    }
    bases.push(root().join("gpu-mem-track-py/python"));
    Sources { words, code, file_names, packages, bases }
}

impl Sources {
    fn has_word(&self, word: &str) -> bool {
        self.words.contains(word) || EXTERNAL.contains(&word)
    }

    fn has_macro(&self, name: &str) -> bool {
        let definition = format!("macro_rules! {name}");
        self.code.iter().filter(|(f, _)| f.ends_with(".rs")).any(|(_, text)| {
            text.match_indices(&definition).any(|(at, m)| !text[at + m.len()..].starts_with(ident_char))
        })
    }

    fn has_attribute(&self, name: &str) -> bool {
        let used = format!("#[{name}");
        let defined = format!("fn {name}");
        self.code.values().any(|text| {
            [&used, &defined].iter().any(|pattern| {
                text.match_indices(pattern.as_str())
                    .any(|(at, m)| !text[at + m.len()..].starts_with(ident_char))
            })
        })
    }

    /// Whether a path the doc names exists: from a base if it has a `/`, else anywhere.
    fn has_path(&self, path: &str) -> bool {
        let trimmed = path.trim_end_matches('/');
        if !trimmed.contains('/') && !path.ends_with('/') {
            return self.file_names.contains(trimmed);
        }
        self.bases.iter().any(|base| {
            let at = base.join(trimmed);
            if path.ends_with('/') {
                at.is_dir()
            } else {
                at.exists()
            }
        })
    }
}

/// A path as the doc writes one: path characters only, a component with a letter, and a `/` or a
/// source extension (`csrc/`, `src/ffi/registry.rs`, `at_line.rs`).
fn as_path(word: &str) -> Option<&str> {
    if !word.chars().all(path_char) || !word.split('/').any(|c| c.chars().any(|c| c.is_ascii_alphabetic())) {
        return None;
    }
    if word.starts_with('-') || word.starts_with('.') {
        return None; // `--help`, `.cpp`
    }
    let source_file = word.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && !stem.ends_with('/') && SOURCE_EXTENSIONS.contains(&ext)
    });
    (word.contains('/') || source_file).then_some(word)
}

/// What one inline code span names, and whether it exists: `None` where it names no code.
fn check_span(span: &str, sources: &Sources) -> Option<Result<(), String>> {
    let verdict = |ok: bool, why: String| Some(if ok { Ok(()) } else { Err(why) });
    // A macro: `track!`, `track!()`.
    if let Some(name) = span.strip_suffix("!()").or_else(|| span.strip_suffix('!')) {
        if is_ident(name) {
            return verdict(sources.has_macro(name), format!("`{span}`: no `macro_rules! {name}`"));
        }
    }
    // An attribute: `#[track_memory]`, `#[cfg(test)]`.
    if let Some(inner) = span.strip_prefix("#[").and_then(|s| s.strip_suffix(']')) {
        let name: String = inner.chars().take_while(|c| ident_char(*c)).collect();
        if is_ident(&name) {
            return verdict(
                sources.has_attribute(&name),
                format!("`{span}`: no attribute `{name}` in the sources"),
            );
        }
    }
    // An include: `<torch/script.h>`.
    if span.starts_with('<') && span.ends_with(".h>") {
        let found = sources.code.values().any(|t| t.contains(&format!("#include {span}")));
        return verdict(found, format!("`{span}`: included nowhere"));
    }
    // A path: `csrc/shim.h`, `scripts/ci/check-memory-viz SNAPSHOT.pickle` (its first word).
    let first = span.split_whitespace().next().unwrap_or("");
    if let Some(path) = as_path(first) {
        return verdict(sources.has_path(path), format!("`{span}`: no such file or folder"));
    }
    if span.contains(char::is_whitespace) {
        return None; // a command, a log line's pattern, prose
    }
    // A package or binary: `gpu-mem-track-cli`.
    if span.starts_with("gpu-mem-track") && span.split('-').all(|w| !w.is_empty() && is_ident(w)) {
        return verdict(
            sources.packages.contains(span),
            format!("`{span}`: no package or binary of that name"),
        );
    }
    // A code path, maybe called: `MemTracker::track_at`, `estimate(device_profile=...)`, `crate::`.
    let (head, args) = match span.find('(') {
        Some(open) if span.ends_with(')') => (&span[..open], Some(&span[open + 1..span.len() - 1])),
        _ => (span, None),
    };
    let head = head.strip_suffix("::").unwrap_or(head);
    let segments: Vec<&str> = head.split("::").flat_map(|s| s.split('.')).collect();
    if segments.is_empty() || !segments.iter().all(|s| is_ident(s)) {
        return None;
    }
    let keywords: Vec<&str> = args
        .into_iter()
        .flat_map(|a| a.split(','))
        .filter_map(|a| a.split_once('=').map(|(k, _)| k.trim()))
        .filter(|k| is_ident(k))
        .collect();
    let code_like = segments.len() > 1
        || args.is_some()
        || segments[0].contains('_')
        || segments[0].chars().any(|c| c.is_ascii_uppercase());
    if !code_like {
        return None; // a plain word: `tch`, `report`
    }
    let missing: Vec<&str> =
        segments.iter().chain(&keywords).copied().filter(|w| !sources.has_word(w)).collect();
    verdict(missing.is_empty(), format!("`{span}`: {} in no source", missing.join(", ")))
}

/// What a fenced block (the code map) names that can only be code: macros, attributes, source
/// file names and folders.
fn check_block_token(token: &str, sources: &Sources) -> Option<Result<(), String>> {
    let verdict = |ok: bool, why: String| Some(if ok { Ok(()) } else { Err(why) });
    if let Some(name) = token.strip_suffix('!') {
        if is_ident(name) && name.len() > 1 {
            return verdict(
                sources.has_macro(name),
                format!("`{token}` (code map): no `macro_rules! {name}`"),
            );
        }
    }
    if token.starts_with("#[") {
        return check_span(token, sources);
    }
    let path = as_path(token)?;
    let is_folder = path.ends_with('/');
    let is_file = path.rsplit_once('.').is_some_and(|(_, ext)| SOURCE_EXTENSIONS.contains(&ext));
    (is_folder || is_file).then(|| {
        if sources.has_path(path) {
            Ok(())
        } else {
            Err(format!("`{token}` (code map): no such file or folder"))
        }
    })
}

/// The tokens of a fenced block: path-like runs, macros (`__site!`, `track!()`) and attributes.
fn block_tokens(block: &str) -> Vec<String> {
    let mut out: Vec<String> = path_tokens(block).into_iter().collect();
    for (at, _) in block.match_indices('!') {
        let before = &block[..at];
        let start = before.rfind(|c: char| !ident_char(c)).map_or(0, |p| p + 1);
        if start < at && !block[at + 1..].starts_with('=') {
            out.push(format!("{}!", &block[start..at]));
        }
    }
    for (at, _) in block.match_indices("#[") {
        let rest = &block[at..];
        if let Some(close) = rest.find(']') {
            out.push(rest[..=close].to_owned());
        }
    }
    out
}

#[test]
fn every_source_file_is_named_in_the_architecture_doc() {
    let doc = doc();
    let tokens = path_tokens(&doc);
    let files = source_files();
    assert!(files.len() > 80, "found only {files:?}");
    for expected in [
        "src/tracker.rs",
        "gpu-mem-track-sys/csrc/shim.h",
        "gpu-mem-track-py/python/gpu_mem_track/__init__.py",
    ] {
        assert!(files.contains(&expected.to_owned()), "{expected} not among the source files: {files:?}");
    }
    let missing: Vec<&String> = files.iter().filter(|f| !tokens.iter().any(|t| names_file(t, f))).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name these source files; give each a line in its crate's part of the \
         Code map (or its C++ table), by file name with what it does (a mod.rs or __init__.py by its folder, \
         `report/`):\n  {}",
        missing.iter().map(|f| f.as_str()).collect::<Vec<_>>().join("\n  ")
    );
}

#[test]
fn everything_the_architecture_doc_names_exists() {
    let doc = doc();
    let sources = sources();
    let (spans, blocks) = spans_and_blocks(&doc);
    assert!(spans.len() > 100 && blocks.contains("gpu-mem-track-log/"), "{spans:?}");
    let mut checked = 0;
    let mut stale = BTreeSet::new();
    for span in &spans {
        match check_span(span, &sources) {
            Some(Ok(())) => checked += 1,
            Some(Err(why)) => {
                stale.insert(why);
            }
            None => {}
        }
    }
    for token in block_tokens(&blocks) {
        match check_block_token(&token, &sources) {
            Some(Ok(())) => checked += 1,
            Some(Err(why)) => {
                stale.insert(why);
            }
            None => {}
        }
    }
    assert!(checked > 150, "only {checked} names checked");
    assert!(
        stale.is_empty(),
        "docs/architecture.md names what the sources do not have (renamed or removed? correct the doc):\n  {}",
        stale.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

/// A test of the test: the rules tell a named file from an unnamed one, and a stale name from a
/// live one.
#[test]
fn the_map_rules_see_what_is_missing_and_what_is_stale() {
    // Naming a file.
    assert!(names_file("reader.rs", "gpu-mem-track-log/src/log/reader.rs"));
    assert!(names_file("log/reader.rs", "gpu-mem-track-log/src/log/reader.rs"));
    assert!(names_file("src/ffi/registry.rs", "src/ffi/registry.rs"));
    assert!(!names_file("der.rs", "gpu-mem-track-log/src/log/reader.rs"), "a tail is whole components");
    assert!(!names_file("src/ffi/registry.rs", "gpu-mem-track-sys/csrc/registry.cpp"));
    assert!(names_file("report/", "gpu-mem-track-log/src/report/mod.rs"));
    assert!(names_file(
        "integrations/__init__.py",
        "gpu-mem-track-py/python/gpu_mem_track/integrations/__init__.py"
    ));
    assert!(
        !names_file("__init__.py", "gpu-mem-track-py/python/gpu_mem_track/integrations/__init__.py"),
        "a package's __init__.py is named by its folder"
    );
    assert!(!names_file("mod.rs", "gpu-mem-track-log/src/report/mod.rs"));
    assert!(!names_file("log/", "gpu-mem-track-log/src/report/mod.rs"));
    assert_eq!(
        path_tokens("reader.rs (reading logs back), writer.rs; report/ (Analyser, leak.rs). `csrc/shim.h`"),
        [
            "csrc/shim.h",
            "leak.rs",
            "reader.rs",
            "report/",
            "writer.rs",
            "back",
            "logs",
            "reading",
            "Analyser"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
    // Checking what is named, against the real sources.
    let sources = sources();
    let ok = |span: &str| check_span(span, &sources);
    assert_eq!(ok("track!"), Some(Ok(())));
    assert_eq!(ok("track!()"), Some(Ok(())));
    assert!(matches!(ok("choice_names!"), Some(Err(_))), "a macro that does not exist");
    assert_eq!(ok("#[track_memory]"), Some(Ok(())));
    assert!(matches!(ok("#[no_such_attribute]"), Some(Err(_))));
    assert_eq!(ok("csrc/shim.h"), Some(Ok(())));
    assert_eq!(ok("src/ffi/"), Some(Ok(())));
    assert_eq!(ok("at_line.rs"), Some(Ok(())));
    assert!(matches!(ok("src/ffi/gone.rs"), Some(Err(_))));
    assert!(matches!(ok("gone.rs"), Some(Err(_))));
    assert_eq!(ok("scripts/ci/check-memory-viz SNAPSHOT.pickle"), Some(Ok(())));
    assert_eq!(ok("MemTracker::track_at"), Some(Ok(())));
    assert!(matches!(ok("MemTracker::track_gone"), Some(Err(_))));
    assert_eq!(ok("estimate(device_profile=...)"), Some(Ok(())));
    assert!(matches!(ok("estimate(gone_argument=...)"), Some(Err(_))));
    assert_eq!(ok("take_grouped"), Some(Ok(())));
    assert!(matches!(ok("GoneType"), Some(Err(_))));
    assert_eq!(ok("gpu-mem-track-cli"), Some(Ok(())));
    assert!(matches!(ok("gpu-mem-track-gone"), Some(Err(_))));
    for prose in
        ["tch", "report", "--json", "estimate --device-profile", "At <file> line <n>: <function>", ".cpp"]
    {
        assert_eq!(ok(prose), None, "{prose} is prose");
    }
    let block = "src/  tracker.rs (MemTracker, track!), named by __site!\n      ffi/  gone.rs, gone_too!, #[track_memory]";
    let verdicts: BTreeMap<String, bool> = block_tokens(block)
        .into_iter()
        .filter_map(|t| Some((t.clone(), check_block_token(&t, &sources)?.is_ok())))
        .collect();
    let expected: BTreeMap<String, bool> = [
        ("src/", true),
        ("tracker.rs", true),
        ("track!", true),
        ("__site!", true),
        ("ffi/", true),
        ("gone.rs", false),
        ("gone_too!", false),
        ("#[track_memory]", true),
    ]
    .into_iter()
    .map(|(t, ok)| (t.to_owned(), ok))
    .collect();
    assert_eq!(verdicts, expected);
}
