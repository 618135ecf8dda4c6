//! The `! ` line: one sentence of an out-of-memory block, written between a block's blank line and
//! its `At` line, and read back by the log reader.
use super::clip_chars;

/// A `! ` line is cut to this many characters when read back.
const MAX_NOTE_CHARS: usize = 2_000;

/// One `! ` line (a sentence of an out-of-memory block) with its newline. Line breaks in `text`
/// become spaces, so a note stays one line.
pub fn note_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    out.push_str("! ");
    out.extend(text.chars().map(|c| if c == '\n' || c == '\r' { ' ' } else { c }));
    out.push('\n');
    out
}

/// The text of a `!` line (without its line ending): what follows the `!` and one optional space,
/// cut to `MAX_NOTE_CHARS` characters; `None` when `l` is not a `!` line.
pub(super) fn parse_note_line(l: &str) -> Option<String> {
    let note = l.strip_prefix('!')?;
    Some(clip_chars(note.strip_prefix(' ').unwrap_or(note), MAX_NOTE_CHARS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_stays_one_line_and_reads_back() {
        let line = note_line("two\nlines");
        assert_eq!(line, "! two lines\n");
        assert_eq!(parse_note_line(line.trim_end_matches('\n')).as_deref(), Some("two lines"));
        assert_eq!(parse_note_line("!bare").as_deref(), Some("bare"));
        assert_eq!(parse_note_line("At a.rs line 1: f"), None);
    }
}
