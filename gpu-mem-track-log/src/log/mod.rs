//! The Pytorch-Memory-Utils log format: writing it ([`mod@format`], [`LogWriter`]) and reading it back
//! ([`parse_log`], or block by block in bounded memory with [`LogReader`]), for our logs and for
//! those of the Python tool.
//!
//! ```text
//! GPU Memory Track | 30-Apr-21-20:25:29 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb
//!
//! + | 1 * Size:(64, 64, 3, 3)       | Memory: 0.1406 M | <class 'torch.nn.parameter.Parameter'> | torch.float32
//!
//! At examples/train.rs line 12: main                    Total Tensor Used Memory:76.4   Mb Total Allocated Memory:76.4   Mb
//! ```
//!
//! # Where each line lives
//!
//! Each kind of line has one file, holding its struct, how it is written and how it is parsed
//! back. To change a line of the log, open its file (under `src/log/`):
//!
//! | Line | File | Struct, writer, parser |
//! |---|---|---|
//! | `GPU Memory Track \| ...` header | `header.rs` | [`LogHeader`], `render`, `parse` |
//! | `+`/`-` group line | `group_line.rs` | [`GroupLine`], `render` (with [`format::python_tuple`], [`format::group_mib`]), `parse` |
//! | `At ...` line and its `Label:value Mb` figures | `at_line.rs` | [`AtLine`], [`MemoryField`], [`SourceLocation`], [`AtField`] (which figure comes from where) and the labels ([`TENSOR_USED`], ...), `render`, `parse` |
//! | out-of-memory block | `oom.rs` | [`oom::OomReport`], [`oom::OomSummary`] |
//! | a `! ` line (a sentence of an out-of-memory block) | `note.rs` | [`format::note_line`], `parse_note_line` |
//! | a block, a whole log (blank lines, order) | `block.rs` | [`LogBlock`], [`ParsedLog`], [`format::block`], [`format::block_with_notes`] |
//! | telling lines apart, reading a file or stream, limits | `reader.rs` | [`parse_log`], [`LogReader`], [`LogEvent`], [`MAX_LINE_BYTES`], ... |
//! | file names, appending to a file | `writer.rs` | [`LogWriter`], [`writer::log_file_stem`], ... |
//!
//! [`mod@format`] gathers the writers of all lines under their historical names.
mod at_line;
mod block;
pub mod format;
mod group_line;
mod header;
mod note;
pub mod oom;
mod reader;
pub mod writer;

pub use at_line::labels::*;
pub use at_line::{AtField, AtLine, MemoryField, SourceLocation, TrackFigures};
pub use block::{LogBlock, ParsedLog};
pub use group_line::GroupLine;
pub use header::LogHeader;
pub use reader::{
    parse_log, parse_log_bytes, parse_log_file, parse_log_lenient, LogEvent, LogParseError, LogReader,
    MAX_BLOCK_CHANGES, MAX_BLOCK_NOTES, MAX_LINE_BYTES,
};
pub use writer::LogWriter;

/// Quoted text in parse error reasons is cut to this many characters, so a message stays one
/// short line whatever the input.
const QUOTED_CHARS: usize = 60;

/// Bytes per MiB: the Python tool divides by 1024² although it prints `Mb`/`M`.
pub const MIB: f64 = 1024.0 * 1024.0;

/// The start of `s` for a parse error message.
fn clip(s: &str) -> String {
    clip_chars(s, QUOTED_CHARS)
}

/// A finite number: `inf` and `NaN` parse as `f64` but are no memory figure.
fn parse_finite(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// The first `chars` characters of `s` (cut on a character boundary, `…` when cut): text quoted
/// from outside input stays one short line whatever the input.
pub(crate) fn clip_chars(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
