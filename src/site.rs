//! Where a track point is: file, line and the enclosing function.
//!
//! `track!()` gets all three at compile time (`file!()`, `line!()` and the type name of a local
//! item); `MemTracker::track` gets file and line from
//! `#[track_caller]` and resolves the function once per call site through `backtrace`.
use std::panic::Location;
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// A source location of a track call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Site {
    /// File as the compiler names it (relative to the workspace for local crates).
    pub file: &'static str,
    /// 1-based line.
    pub line: u32,
    /// Enclosing function, crate name left out (`main`, `model::Net::forward`).
    pub function: Arc<str>,
}

/// The place a log line names: a site's file, line and function, owned.
impl From<&Site> for gpu_mem_track_log::log::SourceLocation {
    fn from(s: &Site) -> Self {
        gpu_mem_track_log::log::SourceLocation {
            file: s.file.to_owned(),
            line: s.line,
            function: s.function.to_string(),
        }
    }
}

impl Site {
    /// A site from its parts; `function_path` is a full Rust path such as `type_name` returns.
    pub fn new(file: &'static str, line: u32, function_path: &str) -> Self {
        Site { file, line, function: clean_function_path(function_path).into() }
    }

    /// The same site with ` (mark)` after its function: `#[track_memory]` marks the lines of a
    /// function's entry and exit (`train_step (enter)`, `train_step (exit)`).
    pub fn marked(mut self, mark: &str) -> Self {
        self.function = format!("{} ({mark})", self.function).into();
        self
    }

    /// The caller's site, with the function name resolved once per call site and cached.
    #[track_caller]
    pub fn caller() -> Self {
        let loc = Location::caller();
        Site { file: loc.file(), line: loc.line(), function: resolve_function(loc) }
    }
}

/// Turns `krate::module::Type::method::__gmt_here` or `krate::main::{{closure}}` into
/// `module::Type::method` / `main::{{closure}}`: the helper item and the crate name are dropped.
pub fn clean_function_path(path: &str) -> String {
    let path = path.strip_suffix("::__gmt_here").unwrap_or(path);
    let path = strip_hash(path);
    match path.split_once("::") {
        Some((_krate, rest)) if !rest.is_empty() => rest.to_owned(),
        _ => path.to_owned(),
    }
}

/// Drops a trailing `::h0123456789abcdef` symbol hash.
fn strip_hash(path: &str) -> &str {
    match path.rsplit_once("::h") {
        Some((head, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => head,
        _ => path,
    }
}

type CacheKey = (&'static str, u32, u32);

fn resolve_function(loc: &'static Location<'static>) -> Arc<str> {
    static CACHE: Mutex<Option<FxHashMap<CacheKey, Arc<str>>>> = Mutex::new(None);
    let key = (loc.file(), loc.line(), loc.column());
    if let Some(name) = CACHE.lock().as_ref().and_then(|m| m.get(&key).cloned()) {
        return name;
    }
    let name: Arc<str> = function_from_backtrace(loc).into();
    CACHE.lock().get_or_insert_with(FxHashMap::default).insert(key, name.clone());
    name
}

/// Finds the frame at `loc` (by file and line when debug info has them), else the first frame
/// outside this crate, the backtrace crate and the standard library.
fn function_from_backtrace(loc: &Location<'_>) -> String {
    let bt = backtrace::Backtrace::new();
    let mut fallback = None;
    for frame in bt.frames() {
        for sym in frame.symbols() {
            let Some(name) = sym.name() else { continue };
            let name = format!("{name:#}");
            let at_loc = sym
                .filename()
                .is_some_and(|f| f.ends_with(loc.file()) || loc.file().ends_with(&*f.to_string_lossy()))
                && sym.lineno() == Some(loc.line());
            if at_loc {
                return clean_function_path(&name);
            }
            let ours = ["gpu_mem_track::", "backtrace::", "std::", "core::", "<", "alloc::"]
                .iter()
                .any(|p| name.starts_with(p));
            if fallback.is_none() && !ours {
                fallback = Some(name);
            }
        }
    }
    fallback.map(|n| clean_function_path(&n)).unwrap_or_else(|| "<unknown>".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn function_paths_lose_crate_helper_and_hash() {
        assert_eq!(clean_function_path("train::main::__gmt_here"), "main");
        assert_eq!(clean_function_path("mycrate::model::Net::forward::__gmt_here"), "model::Net::forward");
        assert_eq!(clean_function_path("train::main::{{closure}}::__gmt_here"), "main::{{closure}}");
        assert_eq!(clean_function_path("train::main::h0123456789abcdef"), "main");
        assert_eq!(clean_function_path("main"), "main");
    }

    #[inline(never)]
    fn resolve_here() -> Site {
        Site::caller()
    }

    #[test]
    fn caller_site_resolves_enclosing_function_once() {
        let a = resolve_here();
        let b = resolve_here();
        assert!(a.file.ends_with("site.rs"));
        assert!(a.function.ends_with("resolve_here"), "{}", a.function);
        assert!(Arc::ptr_eq(&a.function, &b.function), "second lookup is served from the cache");
    }
}
