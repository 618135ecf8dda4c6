//! The README's excerpt of the demo's log (between its `demo-log-excerpt` markers, written by
//! `scripts/figures/readme_sample.py` from a log of `scripts/dev demo`) is a log of today's demo: every
//! line parses as the tracker writes it, and every `At` line names a `track!` of
//! examples/train.rs, at its line, in its function.
use gpu_mem_track_log::log::parse_log;

const README: &str = include_str!("../../README.md");
const DEMO: &str = include_str!("../../examples/train.rs");

fn excerpt() -> Vec<&'static str> {
    let start = README.find("<!-- demo-log-excerpt:start -->").expect("the start marker");
    let end = README.find("<!-- demo-log-excerpt:end -->").expect("the end marker");
    let block = &README[start..end];
    let body = block.split("```text\n").nth(1).and_then(|b| b.split("```").next()).expect("a ```text block");
    body.lines().collect()
}

/// The function whose body holds line `line` (1-based) of the demo: the nearest `fn` above it.
fn function_at(line: usize) -> &'static str {
    DEMO.lines()
        .take(line)
        .filter_map(|l| l.trim_start().strip_prefix("fn ").or_else(|| l.trim_start().strip_prefix("pub fn ")))
        .filter_map(|l| l.split(['(', '<']).next())
        .last()
        .expect("a fn above")
}

#[test]
fn the_readme_log_excerpt_parses_and_names_the_demos_track_points() {
    let lines = excerpt();
    // Lines a reader of the format reads: the excerpt's own "... (N more lines)" notes aside.
    let text: String = lines.iter().filter(|l| !l.starts_with("...")).map(|l| format!("{l}\n")).collect();
    let log = parse_log(&text).unwrap_or_else(|e| panic!("the README's excerpt does not parse: {e}"));
    assert!(log.blocks.len() >= 4, "{} blocks", log.blocks.len());
    assert!(!text.contains("Memory: 0.0 M"), "views are folded by default");
    let mut track_memory_lines = 0;
    for block in &log.blocks {
        let at = &block.at.location;
        assert_eq!(at.file, "examples/train.rs", "{at:?}");
        let source = DEMO.lines().nth(at.line as usize - 1).unwrap_or_else(|| panic!("{at:?}: no such line"));
        let function = at.function.trim_end_matches(" (enter)").trim_end_matches(" (exit)");
        assert_eq!(function_at(at.line as usize), function, "{at:?}");
        if at.function.ends_with(" (enter)") {
            // `#[track_memory]`'s entry line is the `fn` line.
            assert!(source.contains(&format!("fn {function}(")), "{at:?}: {source}");
            track_memory_lines += 1;
        } else {
            assert!(source.contains("track!("), "{at:?} is not a track! line: {source}");
        }
    }
    assert!(track_memory_lines >= 1, "the excerpt shows train_step's entry");
}

/// The README's minimal `src/main.rs` is the dependent fixture crate's `examples/readme.rs`, which
/// the workspace builds (`cargo build --all-targets`), as a user's crate would.
#[test]
fn the_readme_main_rs_is_the_dependent_crates_example() {
    let at = README.find("Then `src/main.rs`:").expect("the README introduces its main.rs");
    let code =
        README[at..].split("```rust\n").nth(1).and_then(|c| c.split("```").next()).expect("a rust block");
    let example = include_str!("../../tests/fixtures/dependent/examples/readme.rs");
    let example =
        example
            .split_once('\n')
            .map_or(example, |(first, rest)| if first.starts_with("//") { rest } else { example });
    assert_eq!(code, example);
}
