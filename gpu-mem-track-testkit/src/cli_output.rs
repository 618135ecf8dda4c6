//! What every command-line test checks of a run: its stderr, and the one-line error with exit
//! status 1 that every failure must be.
use std::process::Output;

/// The run's stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit status 1 and exactly one line on stderr, `error: ...` containing `needle`.
pub fn one_line_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(o));
    let e = stderr(o);
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    assert!(e.starts_with("error: ") && e.contains(needle), "{e}");
}
