//! A block (one track point) and a whole log: how the lines of the other files are put together.
//!
//! A block is its `+`/`-` lines (`group_line.rs`), a blank line, the `! ` lines of an
//! out-of-memory block (`oom.rs`), its `At` line (`at_line.rs`) and a blank line. A log is its
//! header (`header.rs`) then its blocks. Reading them back is in `reader.rs`.
use super::note::note_line;
use super::{AtLine, GroupLine, LogHeader, REQUESTED};

/// A track point: the group lines printed for it, then its `At` line.
#[derive(Debug, Clone, PartialEq)]
pub struct LogBlock {
    /// Changes since the previous block.
    pub changes: Vec<GroupLine>,
    /// `! ` lines before the `At` line (the words of an out-of-memory block), without the `! `.
    pub notes: Vec<String>,
    /// The `At` line.
    pub at: AtLine,
    /// 1-based line number of the `At` line in the file (0 when not read from a file).
    pub line_no: usize,
}

impl LogBlock {
    /// Whether this block reports an out-of-memory (its `At` line has a [`REQUESTED`] field).
    pub fn is_oom(&self) -> bool {
        self.at.field(REQUESTED).is_some()
    }

    /// The block's text, as [`block_with_notes`] writes it.
    pub fn render(&self) -> String {
        block_with_notes(&self.changes, &self.notes, &self.at)
    }
}

/// A whole log.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedLog {
    /// The first line.
    pub header: LogHeader,
    /// Every track point, in file order.
    pub blocks: Vec<LogBlock>,
    /// Group lines after the last `At` line (a log cut off mid-block).
    pub trailing_changes: Vec<GroupLine>,
}

impl ParsedLog {
    /// Writes the log in our format: for a log we wrote, this is the file's exact text.
    pub fn render(&self) -> String {
        let mut out = self.header.render();
        for b in &self.blocks {
            out.push_str(&b.render());
        }
        out
    }
}

/// A whole block as one string: group lines, blank line, `At` line, blank line.
pub fn block(changes: &[GroupLine], at: &AtLine) -> String {
    block_with_notes(changes, &[], at)
}

/// A whole block with `! ` lines between the blank line and the `At` line (an out-of-memory
/// block; [`block`] when `notes` is empty).
pub fn block_with_notes(changes: &[GroupLine], notes: &[String], at: &AtLine) -> String {
    let mut out = String::with_capacity(changes.len() * 100 + notes.len() * 100 + 160);
    for g in changes {
        out.push_str(&g.render());
    }
    out.push('\n');
    for n in notes {
        out.push_str(&note_line(n));
    }
    out.push_str(&at.render());
    out.push_str("\n\n");
    out
}
