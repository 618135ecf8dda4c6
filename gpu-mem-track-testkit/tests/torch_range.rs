//! The supported torch and tch ranges are stated in many places: the READMEs, the docs, the Python
//! build backends' messages, pyproject's torch requirement, the workspace's tch requirement,
//! comments. `scripts/ci/torch-pairs.tsv` is the one copy. This test derives every range from it,
//! finds every statement of one in the repository's text files (what `git ls-files` lists, new
//! files too) and fails, naming file:line, where one disagrees.
//!
//! What it recognises as a statement (after joining wrapped lines and dropping comment markers):
//! - a torch range: `2.X to 2.Y` (or `through`, `..`; not followed by a unit such as `ms`), and
//!   `torch 2.X-2.Y` (a dash only after `torch`, `libtorch` or `PyTorch`). It must be one of the
//!   TSV's ranges: every row (the Python package), the rows with a tch release (the Rust crate),
//!   the rows before them (the Python package only), the rows after them (no tch release yet);
//! - a torch requirement `torch>=2.X,<2.Y`: every row (`<2.Y` one above the last), or one minor
//!   (`torch>=2.13,<2.14`, a pinned wheel) of a row;
//! - a tch range `tch 0.A to 0.B` (or `-`), a tch requirement `>=0.A, <0.B` after `tch` or
//!   `torch-sys`, `tch 0.A or later`, and Cargo.toml's `0.A (torch 2.X) to 0.B (torch 2.Y`;
//! - a pair: `tch 0.A + torch 2.X`, `0.A + 2.X`, `tch 0.A: torch 2.X`, `0.A (torch 2.X)`,
//!   `torch 2.X (tch 0.A`: a row of the TSV;
//! - `(tch 0.A to 0.B, libtorch 2.X and later)`, `2.X and later: no tch`, and `newest PyTorch
//!   (2.X, 2.Y)`: the first row with tch, the first without one after them, the rows after them.
//!
//! [`ANCHORS`] are the statements code reads or prints: each must be found where it is, so that
//! rewording one out of the patterns fails too. [`NOT_SUPPORT_RANGES`] are ranges of torch
//! versions that say something else than what is supported.
use std::path::Path;
use std::process::Command;

use gpu_mem_track_testkit::workspace_root;

const PAIRS: &str = "scripts/ci/torch-pairs.tsv";
/// This file: its tests plant wrong ranges on purpose.
const THIS: &str = "gpu-mem-track-testkit/tests/torch_range.rs";

/// Ranges of torch versions that state no supported range: (file, the range as written, why).
const NOT_SUPPORT_RANGES: &[(&str, &str, &str)] = &[(
    "gpu-mem-track-sys/csrc/registry_walk.cpp",
    "2.9 to 2.15",
    "the TensorImpl byte offsets the walk prefetches, as read from those releases' headers",
)];

/// What must be stated, and how, on every line of a file holding some text: (file, text, kind).
/// A torch range here must be the Python package's (every row).
const ANCHORS: &[(&str, &str, Kind)] = &[
    ("gpu-mem-track-py/build_backend/gmt_build.py", "SUPPORTED = ", Kind::TorchRange),
    ("gpu-mem-track-py/build_backend/torch_guard.py", "SUPPORTED = ", Kind::TorchRange),
    ("gpu-mem-track-py/pyproject.toml", "dependencies = ", Kind::TorchRequirement),
    ("Cargo.toml", "tch = \">=", Kind::TchRequirement),
    ("Cargo.toml", "torch-sys = \">=", Kind::TchRequirement),
    ("Cargo.toml", "0.22 (torch ", Kind::TchRange),
    ("tests/fixtures/dependent/Cargo.toml", "tch = \">=", Kind::TchRequirement),
];

/// What torch-pairs.tsv says, in minor versions (torch 2.X, tch 0.A).
#[derive(Debug)]
struct Ranges {
    /// Every row, first to last: the Python package's range.
    package: (u32, u32),
    /// The rows with a tch release: the Rust crate's.
    rust: (u32, u32),
    /// Those rows' tch releases, oldest to newest.
    tch: (u32, u32),
    /// The rows before the first tch release (the Python package only), if any.
    python_only: Option<(u32, u32)>,
    /// The rows after the last (no tch release builds against them yet).
    no_tch: Vec<u32>,
    /// (tch, torch) of each row with a tch release.
    pairs: Vec<(u32, u32)>,
}

impl Ranges {
    /// The TSV's torch ranges, each with what it is.
    fn torch_ranges(&self) -> Vec<((u32, u32), &'static str)> {
        let mut all = vec![
            (self.package, "every row (the Python package)"),
            (self.rust, "the rows with a tch release"),
        ];
        if let Some(r) = self.python_only {
            all.push((r, "the rows before them (the Python package only)"));
        }
        if let (Some(&first), Some(&last)) = (self.no_tch.first(), self.no_tch.last()) {
            all.push(((first, last), "the rows after them (no tch release)"));
        }
        all
    }

    fn torch_ranges_said(&self) -> String {
        let all = self.torch_ranges();
        let said: Vec<String> =
            all.iter().map(|((lo, hi), what)| format!("2.{lo} to 2.{hi}, {what}")).collect();
        said.join("; ")
    }
}

/// `minor` of `major.minor[.patch]`, or why not.
fn minor_of(version: &str, major: u32) -> Result<u32, String> {
    let mut parts = version.split('.');
    let ma = parts.next().and_then(|p| p.parse::<u32>().ok());
    let mi = parts.next().and_then(|p| p.parse::<u32>().ok());
    match (ma, mi) {
        (Some(ma), Some(mi)) if ma == major => Ok(mi),
        _ => Err(format!("{PAIRS}: `{version}` is no {major}.X version")),
    }
}

/// Reads torch-pairs.tsv (`#` lines are comments, the first other line names the columns) and
/// checks what the ranges rely on: one row a minor, oldest first; the rows with a tch release
/// consecutive, their tch releases never older than the row before's.
fn ranges(tsv: &str) -> Result<Ranges, String> {
    let mut lines = tsv.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or(format!("{PAIRS}: no header line"))?.split('\t').collect();
    let column =
        |name: &str| header.iter().position(|h| *h == name).ok_or(format!("{PAIRS}: no `{name}` column"));
    let (torch_col, tch_col) = (column("torch")?, column("tch")?);
    let mut rows: Vec<(u32, Option<u32>)> = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split('\t').collect();
        let cell =
            |i: usize| cells.get(i).copied().ok_or(format!("{PAIRS}: a row without column {i}: {line}"));
        let torch = minor_of(cell(torch_col)?, 2)?;
        let tch = match cell(tch_col)? {
            "none" => None,
            v => Some(minor_of(v, 0)?),
        };
        rows.push((torch, tch));
    }
    if let Some(w) = rows.windows(2).find(|w| w[1].0 != w[0].0 + 1) {
        return Err(format!("{PAIRS}: one row a minor, oldest first, but 2.{} follows 2.{}", w[1].0, w[0].0));
    }
    let with: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].1.is_some()).collect();
    let (&first, &last) = match (with.first(), with.last()) {
        (Some(f), Some(l)) => (f, l),
        _ => return Err(format!("{PAIRS}: no row with a tch release")),
    };
    if with.len() != last - first + 1 {
        return Err(format!("{PAIRS}: the rows with a tch release are not consecutive"));
    }
    let pairs: Vec<(u32, u32)> =
        rows[first..=last].iter().map(|&(torch, tch)| (tch.unwrap_or(0), torch)).collect();
    if pairs.windows(2).any(|w| w[1].0 < w[0].0) {
        return Err(format!("{PAIRS}: a tch release older than the row before's"));
    }
    Ok(Ranges {
        package: (rows[0].0, rows[rows.len() - 1].0),
        rust: (rows[first].0, rows[last].0),
        tch: (pairs[0].0, pairs[pairs.len() - 1].0),
        python_only: (first > 0).then(|| (rows[0].0, rows[first - 1].0)),
        no_tch: rows[last + 1..].iter().map(|r| r.0).collect(),
        pairs,
    })
}

/// A file's text as one line: each line's indentation and comment markers (`//!`, `///`, `//`,
/// `#`, `*`) dropped and whitespace runs made one space, so that a statement wrapped across lines
/// or comment lines reads as one.
struct Flat {
    text: String,
    /// Where each line begins in `text`.
    starts: Vec<usize>,
}

impl Flat {
    fn new(source: &str) -> Flat {
        let (mut text, mut starts) = (String::new(), Vec::new());
        for line in source.lines() {
            let mut rest = line.trim_start();
            while let Some(r) = ["//!", "///", "//", "#", "*"].iter().find_map(|m| rest.strip_prefix(m)) {
                rest = r.trim_start();
            }
            if !text.is_empty() && !text.ends_with(' ') {
                text.push(' ');
            }
            starts.push(text.len());
            let mut space = false;
            for c in rest.chars() {
                if c.is_whitespace() {
                    space = true;
                    continue;
                }
                if space {
                    text.push(' ');
                    space = false;
                }
                text.push(c);
            }
        }
        Flat { text, starts }
    }

    /// The line (from 1) of an offset in `text`.
    fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset).max(1)
    }
}

/// A version number in the text: `major.minor` with any patch.
#[derive(Debug)]
struct Ver {
    start: usize,
    end: usize,
    major: u32,
    minor: u32,
}

fn versions(text: &str) -> Vec<Ver> {
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        // A number's start: not within a word or another number (`..` before it is a separator).
        let starts = b[i].is_ascii_digit()
            && (i == 0
                || !(word(b[i - 1]) || b[i - 1] == b'.')
                || (i >= 2 && b[i - 1] == b'.' && b[i - 2] == b'.'));
        if !starts {
            i += 1;
            continue;
        }
        let start = i;
        let mut fields = Vec::new();
        loop {
            let s = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            fields.push(&text[s..i]);
            if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
                i += 1;
            } else {
                break;
            }
        }
        if fields.len() >= 2 && !(i < b.len() && word(b[i])) {
            if let (Ok(major), Ok(minor)) = (fields[0].parse(), fields[1].parse()) {
                out.push(Ver { start, end: i, major, minor });
            }
        }
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    TorchRange,
    TorchRequirement,
    TchRange,
    TchRequirement,
    Pair,
    TchFrom,
    RustFrom,
    NoTchFrom,
    NoTch,
}

/// One statement found: where (an offset in the flat text), what, the torch (or tch) minors it
/// names, and what is wrong with it.
#[derive(Debug)]
struct Stmt {
    offset: usize,
    kind: Kind,
    said: String,
    values: Vec<u32>,
    problem: Option<String>,
}

/// The word before `pos` (letters, digits, `-`, `_`), lowercase.
fn word_before(text: &str, pos: usize) -> String {
    let before = text[..pos].trim_end();
    let n = before.chars().rev().take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_').count();
    before.chars().skip(before.chars().count() - n).collect::<String>().to_lowercase()
}

/// The last `n` characters before `pos`.
fn tail(text: &str, pos: usize, n: usize) -> String {
    let before = &text[..pos];
    let count = before.chars().count();
    before.chars().skip(count.saturating_sub(n)).collect()
}

/// Whether a unit (of a measured figure, not a version) follows `pos`.
fn unit_after(text: &str, pos: usize) -> bool {
    let rest = text[pos..].strip_prefix(' ').unwrap_or(&text[pos..]);
    let unit: String =
        rest.chars().take_while(|c| c.is_alphabetic() || *c == '%').collect::<String>().to_lowercase();
    const UNITS: [&str; 18] = [
        "ms", "s", "µs", "us", "ns", "x", "%", "kb", "mb", "gb", "kib", "mib", "gib", "min", "h", "times",
        "seconds", "minutes",
    ];
    UNITS.contains(&unit.as_str())
}

const TORCH_WORDS: [&str; 3] = ["torch", "libtorch", "pytorch"];

/// Every statement of a range in `text` (a [`Flat`] text), checked against `r`.
fn scan(text: &str, r: &Ranges) -> Vec<Stmt> {
    let v = versions(text);
    let gap = |a: &Ver, b: &Ver| text[a.end..b.start].trim().to_string();
    let mut out = Vec::new();
    let mut push = |a: &Ver, b: &Ver, kind: Kind, values: Vec<u32>, problem: Option<String>| {
        let said = text[a.start..b.end].to_string();
        out.push(Stmt { offset: a.start, kind, said, values, problem });
    };
    let pair_problem = |tch: u32, torch: u32| {
        (!r.pairs.contains(&(tch, torch)))
            .then(|| format!("names the pair tch 0.{tch} + torch 2.{torch}, which is no row of {PAIRS}"))
    };
    // `name` is torch (2.X) or tch (0.A).
    let want = |name: &str, said: (u32, u32), want: (u32, u32)| {
        let major = if name == "tch" { 0 } else { 2 };
        (said != want).then(|| {
            let ((s0, s1), (w0, w1)) = (said, want);
            format!("states {name} {major}.{s0} to {major}.{s1}; {PAIRS} says {major}.{w0} to {major}.{w1}")
        })
    };
    let mut i = 0;
    while i < v.len() {
        let a = &v[i];
        let (b, c, d) = (v.get(i + 1), v.get(i + 2), v.get(i + 3));
        // Cargo.toml's `0.A (torch 2.X) to 0.B (torch 2.Y`.
        if let (Some(b), Some(c), Some(d)) = (b, c, d) {
            let is_pair = |x: &Ver, y: &Ver| {
                x.major == 0 && y.major == 2 && ["(torch", "(libtorch"].contains(&gap(x, y).as_str())
            };
            if is_pair(a, b) && is_pair(c, d) && gap(b, c) == ") to" {
                let problem = want("tch", (a.minor, c.minor), r.tch)
                    .or_else(|| want("torch", (b.minor, d.minor), r.rust))
                    .or_else(|| pair_problem(a.minor, b.minor))
                    .or_else(|| pair_problem(c.minor, d.minor));
                push(a, d, Kind::TchRange, vec![a.minor, c.minor, b.minor, d.minor], problem);
                i += 4;
                continue;
            }
        }
        if let Some(b) = b {
            let g = gap(a, b);
            let before = text[..a.start].trim_end();
            // `torch>=2.X,<2.Y`; `>=0.A, <0.B` after `tch` or `torch-sys`.
            if let Some(pre) = before.strip_suffix(">=").map(str::trim_end) {
                if g.replace(' ', "") == ",<" && a.major == b.major {
                    if a.major == 2 && pre.ends_with("torch") {
                        let (lo, hi) = (a.minor, b.minor);
                        let problem = if hi == lo + 1 {
                            (lo < r.package.0 || lo > r.package.1).then(|| {
                                format!(
                                    "pins torch 2.{lo}, which is no row of {PAIRS} (2.{} to 2.{})",
                                    r.package.0, r.package.1
                                )
                            })
                        } else {
                            want("torch", (lo, hi.saturating_sub(1)), r.package).map(|p| {
                                format!(
                                    "{p} (the requirement is `torch>=2.{},<2.{}`)",
                                    r.package.0,
                                    r.package.1 + 1
                                )
                            })
                        };
                        push(a, b, Kind::TorchRequirement, vec![lo, hi], problem);
                        i += 2;
                        continue;
                    }
                    let t = tail(text, pre.len(), 14);
                    if a.major == 0 && (t.contains("tch") || t.contains("torch-sys")) {
                        let problem = want("tch", (a.minor, b.minor.saturating_sub(1)), r.tch).map(|p| {
                            format!("{p} (the requirement is `>=0.{}, <0.{}`)", r.tch.0, r.tch.1 + 1)
                        });
                        push(a, b, Kind::TchRequirement, vec![a.minor, b.minor], problem);
                        i += 2;
                        continue;
                    }
                }
            }
            let dash = ["-", "–", "—"].contains(&g.as_str());
            let words = ["to", "through", ".."].contains(&g.as_str());
            let prefix = word_before(text, a.start);
            // A torch range.
            if a.major == 2 && b.major == 2 && a.minor < b.minor {
                let torch_before = TORCH_WORDS.contains(&prefix.as_str());
                if (dash && torch_before) || (words && !unit_after(text, b.end)) {
                    let said = (a.minor, b.minor);
                    let problem = (!r.torch_ranges().iter().any(|(range, _)| *range == said)).then(|| {
                        format!(
                            "states torch 2.{} to 2.{}, none of {PAIRS}'s ranges: {}",
                            said.0,
                            said.1,
                            r.torch_ranges_said()
                        )
                    });
                    push(a, b, Kind::TorchRange, vec![said.0, said.1], problem);
                    i += 2;
                    continue;
                }
            }
            // A tch range, with the torch its first release binds.
            if a.major == 0 && b.major == 0 && prefix == "tch" && (dash || words) {
                push(a, b, Kind::TchRange, vec![a.minor, b.minor], want("tch", (a.minor, b.minor), r.tch));
                i += 2;
                if let Some(c) = c {
                    let later =
                        text[c.end..].starts_with(" and later") || text[c.end..].starts_with(" or later");
                    if [", libtorch", ", torch"].contains(&gap(b, c).as_str()) && c.major == 2 && later {
                        let problem = (c.minor != r.rust.0).then(|| {
                            format!("states libtorch 2.{} and later for the tch range; {PAIRS}'s first row with a tch release is 2.{}", c.minor, r.rust.0)
                        });
                        push(c, c, Kind::RustFrom, vec![c.minor], problem);
                        i += 1;
                    }
                }
                continue;
            }
            // A pair.
            let tch_first = a.major == 0 && b.major == 2;
            let torch_first = a.major == 2 && b.major == 0;
            let pair = if tch_first
                && (["(torch", "(libtorch", "+"].contains(&g.as_str())
                    || (prefix == "tch"
                        && ["+ torch", "+ libtorch", ": torch", ": libtorch"].contains(&g.as_str())))
            {
                Some((a.minor, b.minor))
            } else if torch_first
                && TORCH_WORDS.contains(&prefix.as_str())
                && ["(tch", "+ tch"].contains(&g.as_str())
            {
                Some((b.minor, a.minor))
            } else {
                None
            };
            if let Some((tch, torch)) = pair {
                push(a, b, Kind::Pair, vec![tch, torch], pair_problem(tch, torch));
                i += 2;
                continue;
            }
        }
        let after = &text[a.end..];
        // `tch 0.A or later`; `2.X and later: no tch`.
        if a.major == 0
            && (after.starts_with(" and later") || after.starts_with(" or later"))
            && tail(text, a.start, 100).contains("tch")
        {
            let problem = (a.minor != r.tch.0)
                .then(|| format!("states tch 0.{} or later; {PAIRS}'s oldest tch is 0.{}", a.minor, r.tch.0));
            push(a, a, Kind::TchFrom, vec![a.minor], problem);
        } else if a.major == 2 && after.starts_with(" and later: no tch") {
            let first = r.no_tch.first().copied();
            let problem = (Some(a.minor) != first).then(|| match first {
                Some(f) => format!(
                    "states that tch stops at 2.{}; {PAIRS}'s first row without tch after the pairs is 2.{f}",
                    a.minor
                ),
                None => format!("states that tch stops at 2.{}; in {PAIRS} the last row has one", a.minor),
            });
            push(a, a, Kind::NoTchFrom, vec![a.minor], problem);
        } else if a.major == 2 && text[..a.start].to_lowercase().ends_with("newest pytorch (") {
            // `newest PyTorch (2.X, 2.Y)`: the rows after the last tch release.
            let mut j = i;
            while j + 1 < v.len()
                && v[j + 1].major == 2
                && [",", "and", ", and"].contains(&gap(&v[j], &v[j + 1]).as_str())
            {
                j += 1;
            }
            if text[v[j].end..].starts_with(')') {
                let said: Vec<u32> = v[i..=j].iter().map(|x| x.minor).collect();
                let problem = (said != r.no_tch).then(|| {
                    let list: Vec<String> = r.no_tch.iter().map(|m| format!("2.{m}")).collect();
                    format!("names the newest PyTorch without tch; {PAIRS}'s rows after the last tch release are {}", list.join(", "))
                });
                push(a, &v[j], Kind::NoTch, said, problem);
                i = j + 1;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The repository's files: tracked and new ones (`git ls-files`), else every file but build
/// outputs and virtualenvs.
fn files(root: &Path) -> Vec<String> {
    let git = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .output();
    let mut out: Vec<String> = match git {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect(),
        _ => {
            let mut all = Vec::new();
            walk(root, root, &mut all);
            all
        }
    };
    out.sort();
    out.dedup();
    out
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let skip = ["target", "dist", "logs", "node_modules", "__pycache__"].contains(&name.as_str())
                || name.starts_with(".venv")
                || name == ".git";
            if !skip {
                walk(root, &path, out);
            }
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

/// Every problem in the repository at `root`, as `file:line: ...` lines.
fn problems(root: &Path, r: &Ranges) -> Vec<String> {
    let mut problems = Vec::new();
    let mut allowed_seen = vec![false; NOT_SUPPORT_RANGES.len()];
    for rel in files(root) {
        if rel == PAIRS || rel == THIS || rel.ends_with(".lock") {
            continue;
        }
        let Ok(bytes) = std::fs::read(root.join(&rel)) else { continue };
        if bytes.len() > 4 << 20 || bytes.contains(&0) {
            continue;
        }
        let Ok(source) = String::from_utf8(bytes) else { continue };
        let flat = Flat::new(&source);
        let stmts = scan(&flat.text, r);
        for s in &stmts {
            let Some(problem) = &s.problem else { continue };
            let allowed = NOT_SUPPORT_RANGES.iter().position(|(f, said, _)| *f == rel && *said == s.said);
            match allowed {
                Some(k) if s.kind == Kind::TorchRange => allowed_seen[k] = true,
                _ => problems.push(format!("{rel}:{}: `{}` {problem}", flat.line(s.offset), s.said)),
            }
        }
        for (file, needle, kind) in ANCHORS.iter().filter(|(f, _, _)| *f == rel) {
            for (n, _) in source.lines().enumerate().filter(|(_, l)| l.contains(needle)) {
                let found = stmts.iter().find(|s| flat.line(s.offset) == n + 1 && s.kind == *kind);
                match found {
                    None => problems.push(format!(
                        "{file}:{}: no {kind:?} found on this line, which must state one (ANCHORS in {THIS})",
                        n + 1
                    )),
                    Some(s) if s.kind == Kind::TorchRange && s.values[..] != [r.package.0, r.package.1] => {
                        problems.push(format!(
                            "{file}:{}: `{}` must be the Python package's range, every row of {PAIRS}: 2.{} to 2.{}",
                            n + 1,
                            s.said,
                            r.package.0,
                            r.package.1
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
    }
    for (k, (file, said, _)) in NOT_SUPPORT_RANGES.iter().enumerate() {
        if !allowed_seen[k] {
            problems.push(format!(
                "{file}: no longer states `{said}`: drop it from NOT_SUPPORT_RANGES in {THIS}"
            ));
        }
    }
    problems
}

#[test]
fn every_stated_torch_range_matches_torch_pairs_tsv() {
    let root = workspace_root();
    let Ok(tsv) = std::fs::read_to_string(root.join(PAIRS)) else {
        // Test binaries that run away from the checkout (the GPU bundle) have no repository.
        assert!(
            std::env::var_os("GMT_TEST_FIXTURES").is_some(),
            "{PAIRS} is missing from {}",
            root.display()
        );
        return;
    };
    let r = ranges(&tsv).unwrap_or_else(|e| panic!("{e}"));
    for (file, needle, _) in ANCHORS {
        let source = std::fs::read_to_string(root.join(file)).unwrap_or_default();
        assert!(source.contains(needle), "{file} has no line with `{needle}`: update ANCHORS in {THIS}");
    }
    let problems = problems(root, &r);
    assert!(
        problems.is_empty(),
        "{} statement(s) of the torch range disagree with {PAIRS}, the one copy: correct them (or the TSV); \
         a range of torch versions that states no supported range goes into NOT_SUPPORT_RANGES in {THIS}, \
         with why.\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checks on a table of their own, so that they hold whatever the real one says.
mod patterns {
    use super::*;

    const TSV: &str = "# a comment\ntorch\ttch\tcheck\n2.6.0\tnone\t-\n2.7.1\tnone\t-\n2.8.0\tnone\t-\n\
        2.9.0\t0.22.0\t-\n2.10.0\t0.23.0\t-\n2.11.0\t0.24.0\t-\n2.12.0\t0.26.0\tbypass\n2.13.0\t0.26.0\t-\n\
        2.14.0\tnone\t-\n2.15.0\tnone\t-\n";

    fn check(source: &str) -> Vec<Stmt> {
        scan(&Flat::new(source).text, &ranges(TSV).unwrap())
    }

    #[test]
    fn the_table_gives_each_range() {
        let r = ranges(TSV).unwrap();
        assert_eq!((r.package, r.rust, r.tch, r.python_only), ((6, 15), (9, 13), (22, 26), Some((6, 8))));
        assert_eq!(r.no_tch, [14, 15]);
        assert!(ranges("torch\ttch\n2.6.0\tnone\n2.8.0\t0.22.0\n").is_err(), "a minor left out");
        assert!(ranges("torch\ttch\n2.6.0\t0.21.0\n2.7.0\tnone\n2.8.0\t0.22.0\n").is_err(), "tch rows apart");
    }

    /// Each statement the repository makes, as written, and a wrong one of the same form.
    #[test]
    fn each_form_is_checked() {
        let cases: [(&str, &str, Kind); 16] = [
            ("Install it beside the torch you have (2.6 to 2.15); it", "(2.6 to 2.14)", Kind::TorchRange),
            ("SUPPORTED = \"torch 2.6 to 2.15\"", "torch 2.5 to 2.14", Kind::TorchRange),
            (
                "every minor of `scripts/ci/torch-pairs.tsv`, 2.6\n#   to 2.15) build",
                "2.6 to 2.16",
                Kind::TorchRange,
            ),
            ("(scripts/ci/torch-pairs.tsv: 2.9 to 2.13; 2.14", "2.9 to 2.12;", Kind::TorchRange),
            ("torch 2.6-2.8 have none", "torch 2.6-2.9 have none", Kind::TorchRange),
            ("dependencies = [\"torch>=2.6,<2.16\"]", "[\"torch>=2.6,<2.15\"]", Kind::TorchRequirement),
            (
                "requiring exactly its minor (`torch>=2.13,<2.14`)",
                "(`torch>=2.16,<2.17`)",
                Kind::TorchRequirement,
            ),
            ("tch = \">=0.22, <0.27\"", "tch = \">=0.22, <0.26\"", Kind::TchRequirement),
            (
                "asks for `tch` and `torch-sys` `>=0.22, <0.27`, so",
                "`torch-sys` `>=0.21, <0.27`",
                Kind::TchRequirement,
            ),
            (
                "# one. 0.22 (torch 2.9) to 0.26 (torch 2.13, and",
                "0.22 (torch 2.9) to 0.26 (torch 2.14, and",
                Kind::TchRange,
            ),
            ("`Cargo.toml` (tch 0.22 to 0.26, [compat", "(tch 0.22 to 0.25, [", Kind::TchRange),
            (
                "the pair tests of the tch 0.22 + torch 2.9 and 0.24 + 2.11 pairs",
                "0.24 + 2.12 pairs",
                Kind::Pair,
            ),
            (
                "in the minor version your tch pins (tch 0.26: torch 2.13); to",
                "(tch 0.26: torch 2.11)",
                Kind::Pair,
            ),
            (
                "(tch has no release for it in the range the Rust crate accepts, 0.22 and later: the",
                "a rust-bert built against tch 0.23 or later",
                Kind::TchFrom,
            ),
            ("2.9 to 2.13; 2.14 and later: no tch builds", "2.15 and later: no tch", Kind::NoTchFrom),
            ("- The newest PyTorch (2.14, 2.15) has no tch", "The newest PyTorch (2.15) has", Kind::NoTch),
        ];
        for (right, wrong, kind) in cases {
            let found = check(right);
            assert!(found.iter().any(|s| s.kind == kind), "{right:?}: no {kind:?} found: {found:?}");
            assert!(found.iter().all(|s| s.problem.is_none()), "{right:?}: {found:?}");
            let found = check(wrong);
            assert!(
                found.iter().any(|s| s.kind == kind && s.problem.is_some()),
                "{wrong:?} passed: {found:?}"
            );
        }
        let sys = check("(tch 0.22 to 0.26,\nlibtorch 2.9 and later), branches");
        assert_eq!(
            sys.iter().map(|s| (s.kind, s.problem.is_none())).collect::<Vec<_>>(),
            [(Kind::TchRange, true), (Kind::RustFrom, true)]
        );
        let sys = check("(tch 0.22 to 0.26, libtorch 2.10 and later)");
        assert!(sys.iter().any(|s| s.kind == Kind::RustFrom && s.problem.is_some()), "{sys:?}");
    }

    /// What is no range statement stays out.
    #[test]
    fn other_numbers_are_no_range() {
        for text in [
            "Before 2026-11-28 the same mix took 2.4-2.6 ms",
            "it fell from 2.1 to 2.4 s, then 2.2 to 2.9x",
            "`burn-tch = \"0.22\"`, Burn 0.19-0.22) get tch 0.22",
            "(`DeviceAllocator::getMemoryInfo`, libtorch 2.10 and later).",
            "torch 2.6 pins `sympy==1.13.1` itself; Python 3.9 or later",
            "`torch==2.13.0` (tch 0.26's), with `torchvision==0.28.0`",
            "foo = \">=0.3, <0.5\"",
            "version 2.13 to 2.10 downgrade",
        ] {
            let found = check(text);
            assert!(found.is_empty(), "{text:?}: {found:?}");
        }
    }
}
