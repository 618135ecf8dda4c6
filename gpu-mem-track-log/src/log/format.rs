//! The writers of every kind of log line, in one place: byte-compatible with
//! Pytorch-Memory-Utils' `gpu_mem_track.py` except for its number truncation, which is fixed
//! here.
//!
//! Each line is written (and parsed) in its own file of [`crate::log`]; this module re-exports
//! those writers under the names they have always had, and [`MIB`]. The line functions
//! here are the same as the `render` methods: [`header`] is [`LogHeader::render`], [`group_line`]
//! is [`GroupLine::render`], [`at_line`] is [`AtLine::render`].
pub use super::block::{block, block_with_notes};
pub use super::group_line::{group_mib, python_tuple};
pub use super::note::note_line;
pub use super::MIB;
use super::{AtLine, GroupLine, LogHeader};

/// The header line and the blank line after it ([`LogHeader::render`]).
pub fn header(h: &LogHeader) -> String {
    h.render()
}

/// One `+`/`-` line with its newline; ` | <op>` last when the line names its op
/// ([`GroupLine::render`]).
pub fn group_line(g: &GroupLine) -> String {
    g.render()
}

/// The `At` line without newline ([`AtLine::render`]).
pub fn at_line(at: &AtLine) -> String {
    at.render()
}
