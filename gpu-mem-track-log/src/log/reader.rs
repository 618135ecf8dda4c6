//! Reads logs back, whole or block by block: ours and those written by Pytorch-Memory-Utils
//! (whose `-` lines end in a space and whose numbers are truncated rather than rounded).
//!
//! This file tells the kinds of line apart and gathers them into blocks; each kind is parsed in
//! its own file (`header.rs`, `group_line.rs`, `at_line.rs`, the `! ` lines in `oom.rs`).
use std::path::{Path, PathBuf};

use super::at_line::is_at_line;
use super::group_line::is_group_line;
use super::note::parse_note_line;
use super::{AtLine, GroupLine, LogBlock, LogHeader, ParsedLog};
pub use crate::error::LogParseError;
use crate::error::{Error, Result};

fn err(line: usize, text: &str, reason: impl Into<String>) -> LogParseError {
    let text: String = text.chars().take(100).collect();
    LogParseError { path: None, line, reason: reason.into(), text }
}

/// Parses a log strictly: the first bad line is an error.
///
/// # Errors
/// [`LogParseError`] naming the first line that is not in the format.
pub fn parse_log(text: &str) -> Result<ParsedLog, LogParseError> {
    let (log, errors) = parse_inner(text, true);
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(log.expect("strict parse without errors yields a log")),
    }
}

/// Parses what can be parsed: bad lines are skipped and returned as errors. `None` when even the
/// header is missing.
pub fn parse_log_lenient(text: &str) -> (Option<ParsedLog>, Vec<LogParseError>) {
    parse_inner(text, false)
}

/// Parses raw bytes strictly; text that is not UTF-8 is an error naming its line.
///
/// # Errors
/// [`LogParseError`] for invalid UTF-8 or the first line not in the format.
pub fn parse_log_bytes(bytes: &[u8]) -> Result<ParsedLog, LogParseError> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_log(text),
        Err(e) => {
            let good = &bytes[..e.valid_up_to()];
            let line = good.iter().filter(|&&b| b == b'\n').count() + 1;
            let start = good.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
            let text = String::from_utf8_lossy(&bytes[start..bytes.len().min(start + 100)]);
            Err(err(line, &text, "not UTF-8 text (is this a gpu_mem_track log?)"))
        }
    }
}

/// Reads and parses a log file strictly.
///
/// # Errors
/// [`Error::LogRead`] when the file cannot be read, [`Error::LogParse`] (with the path) when it
/// is not a log.
pub fn parse_log_file(path: impl AsRef<Path>) -> Result<ParsedLog> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| Error::LogRead { path: path.to_owned(), source })?;
    parse_log_bytes(&bytes).map_err(|mut e| {
        e.path = Some(path.to_owned());
        Error::LogParse(e)
    })
}

fn parse_inner(text: &str, strict: bool) -> (Option<ParsedLog>, Vec<LogParseError>) {
    let mut errors = Vec::new();
    let mut parser = LineParser::default();
    let mut log: Option<ParsedLog> = None;
    let mut lines = text.lines().enumerate();
    loop {
        let event = match lines.next() {
            Some((i, l)) => parser.line(i + 1, l.strip_suffix('\r').unwrap_or(l)),
            None => match parser.finish() {
                None => return (log, errors),
                end => end,
            },
        };
        match event {
            None => {}
            Some(Ok(LogEvent::Header(header))) => {
                log = Some(ParsedLog { header, blocks: Vec::new(), trailing_changes: Vec::new() })
            }
            Some(Ok(LogEvent::Block(b))) => log.as_mut().expect("blocks follow the header").blocks.push(b),
            Some(Ok(LogEvent::Trailing(changes))) => {
                log.as_mut().expect("trailing lines follow the header").trailing_changes = changes;
                return (log, errors);
            }
            Some(Ok(LogEvent::Skipped(e))) => {
                errors.push(e);
                if strict {
                    return (None, errors);
                }
            }
            Some(Err(e)) => {
                errors.push(e);
                return (None, errors);
            }
        }
    }
}

/// What one line (or the end of the input) gave: an item of the log, or `Err` when the input is
/// not a log (its first non-blank line is not a header, or it has none), after which nothing more
/// is read.
type LineResult = Option<std::result::Result<LogEvent, LogParseError>>;

/// Group lines one block may hold before further ones are skipped: a block of a real log has one
/// line per tensor group (hundreds), so this only bounds the memory a damaged file can take.
pub const MAX_BLOCK_CHANGES: usize = 100_000;

/// The line-by-line state shared by [`parse_log`] and [`LogReader`]: whether the header was seen,
/// and the group lines of the block being read.
#[derive(Default)]
struct LineParser {
    in_body: bool,
    pending: Vec<GroupLine>,
    notes: Vec<String>,
}

/// `! ` lines one block may hold before further ones are skipped (an out-of-memory block has a
/// dozen).
pub const MAX_BLOCK_NOTES: usize = 1_000;

impl LineParser {
    /// One line, without its line ending; `n` is its 1-based number.
    /// After an `Err` its callers stop reading.
    fn line(&mut self, n: usize, l: &str) -> LineResult {
        if !self.in_body {
            if l.trim().is_empty() {
                return None;
            }
            return match LogHeader::parse(l) {
                Ok(h) => {
                    self.in_body = true;
                    Some(Ok(LogEvent::Header(h)))
                }
                Err(reason) => Some(Err(err(n, l, reason))),
            };
        }
        let parsed = if l.trim().is_empty() {
            return None;
        } else if is_group_line(l) {
            match GroupLine::parse(l) {
                Ok(_) if self.pending.len() >= MAX_BLOCK_CHANGES => {
                    Err(format!("more than {MAX_BLOCK_CHANGES} group lines before one `At` line; skipped"))
                }
                Ok(g) => {
                    self.pending.push(g);
                    return None;
                }
                Err(e) => Err(e),
            }
        } else if let Some(note) = parse_note_line(l) {
            if self.notes.len() >= MAX_BLOCK_NOTES {
                Err(format!("more than {MAX_BLOCK_NOTES} `!` lines before one `At` line; skipped"))
            } else {
                self.notes.push(note);
                return None;
            }
        } else if is_at_line(l) {
            AtLine::parse(l).map(|at| {
                LogEvent::Block(LogBlock {
                    changes: self.take_pending(),
                    notes: std::mem::take(&mut self.notes),
                    at,
                    line_no: n,
                })
            })
        } else {
            Err("not a `+`/`-` group line, a `!` line, an `At` line or a blank line".to_owned())
        };
        Some(Ok(parsed.unwrap_or_else(|reason| LogEvent::Skipped(err(n, l, reason)))))
    }

    /// The end of the input: the group lines after the last `At` line, or `Err` for an input
    /// without a header.
    fn finish(&mut self) -> LineResult {
        if !self.in_body {
            return Some(Err(err(1, "", "empty file: no `GPU Memory Track | ...` header")));
        }
        let trailing = self.take_pending();
        (!trailing.is_empty()).then_some(Ok(LogEvent::Trailing(trailing)))
    }

    fn take_pending(&mut self) -> Vec<GroupLine> {
        std::mem::take(&mut self.pending)
    }
}

/// Lines longer than this are skipped unread (a log line is a few hundred bytes), so a file with
/// no line breaks cannot make [`LogReader`] hold it whole.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// One item of a log read by [`LogReader`].
#[derive(Debug, Clone, PartialEq)]
pub enum LogEvent {
    /// The first line (always the first item of a log).
    Header(LogHeader),
    /// A track point.
    Block(LogBlock),
    /// A line that is not in the format, skipped (a partial report names it).
    Skipped(LogParseError),
    /// Group lines after the last `At` line (a log cut off mid-block); the last item, when any.
    Trailing(Vec<GroupLine>),
}

/// Reads a log one block at a time, so a log of any size is read in bounded memory.
///
/// Tolerates what [`parse_log_lenient`] tolerates and more: CRLF line ends, NUL bytes, lines that
/// are not UTF-8 (read lossily, as `String::from_utf8_lossy` would), a last line cut short and
/// over-long lines (skipped, see [`MAX_LINE_BYTES`]). Items are
/// `Ok(`[`LogEvent`]`)`; a file that cannot be read or has no header ends with one `Err`
/// ([`Error::LogRead`], [`Error::LogParse`], naming the path given to [`LogReader::with_path`]).
///
/// ```
/// use gpu_mem_track_log::log::{LogEvent, LogReader};
/// let text = "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\r\n\r\n\
///             At a.rs line 1: f  Total Tensor Used Memory:1.0    Mb\r\njunk\n";
/// let items: Vec<_> = LogReader::new(text.as_bytes()).collect::<Result<_, _>>()?;
/// assert!(matches!(items[0], LogEvent::Header(_)));
/// assert!(matches!(&items[1], LogEvent::Block(b) if b.at.tensor_used_mib() == Some(1.0)));
/// assert!(matches!(&items[2], LogEvent::Skipped(e) if e.line == 4));
/// # Ok::<(), gpu_mem_track_log::Error>(())
/// ```
pub struct LogReader<R> {
    reader: R,
    path: Option<PathBuf>,
    parser: LineParser,
    line_no: usize,
    buf: Vec<u8>,
    finished: bool,
}

impl LogReader<std::io::BufReader<std::fs::File>> {
    /// Streams the log file at `path`, named in its errors.
    ///
    /// # Errors
    /// [`Error::LogRead`] naming the file when it cannot be opened.
    pub fn open(path: &Path) -> Result<Self> {
        let file =
            std::fs::File::open(path).map_err(|source| Error::LogRead { path: path.to_owned(), source })?;
        Ok(LogReader::new(std::io::BufReader::with_capacity(1 << 16, file)).with_path(path))
    }
}

impl<R: std::io::BufRead> LogReader<R> {
    /// A reader over `reader`.
    pub fn new(reader: R) -> Self {
        LogReader {
            reader,
            path: None,
            parser: LineParser::default(),
            line_no: 0,
            buf: Vec::new(),
            finished: false,
        }
    }

    /// Names the file in fatal errors.
    pub fn with_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = Some(path.into());
        self
    }

    fn path(&self) -> PathBuf {
        self.path.clone().unwrap_or_else(|| PathBuf::from("<input>"))
    }

    /// The error that ends a read of something that is not a log, naming the path when known.
    fn not_a_log(&self, mut e: LogParseError) -> Error {
        e.path = self.path.clone();
        Error::LogParse(e)
    }

    /// Reads one line into `buf` (without its `\n`), at most [`MAX_LINE_BYTES`] of it; returns
    /// `Ok(None)` at the end, `Ok(Some(false))` for a line that was too long (its rest is
    /// consumed and dropped).
    fn read_line(&mut self) -> std::io::Result<Option<bool>> {
        self.buf.clear();
        let mut too_long = false;
        let mut any = false;
        loop {
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if chunk.is_empty() {
                return Ok(any.then_some(!too_long));
            }
            any = true;
            let (take, end) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (chunk.len(), false),
            };
            if !too_long {
                if self.buf.len() + take > MAX_LINE_BYTES {
                    too_long = true;
                    let room = MAX_LINE_BYTES - self.buf.len();
                    self.buf.extend_from_slice(&chunk[..room]);
                } else {
                    self.buf.extend_from_slice(&chunk[..take]);
                }
            }
            self.reader.consume(take + usize::from(end));
            if end {
                // `str::lines` drops the `\r` of a `\r\n` end; the parser drops one more.
                if !too_long && self.buf.last() == Some(&b'\r') {
                    self.buf.pop();
                }
                return Ok(Some(!too_long));
            }
        }
    }
}

impl<R: std::io::BufRead> Iterator for LogReader<R> {
    type Item = Result<LogEvent>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.finished {
            let whole = match self.read_line() {
                Ok(Some(whole)) => whole,
                Ok(None) => {
                    self.finished = true;
                    return self.parser.finish().map(|r| r.map_err(|e| self.not_a_log(e)));
                }
                Err(source) => {
                    self.finished = true;
                    return Some(Err(Error::LogRead { path: self.path(), source }));
                }
            };
            self.line_no += 1;
            let n = self.line_no;
            let text = String::from_utf8_lossy(&self.buf);
            let text = text.strip_suffix('\r').unwrap_or(&text);
            let parsed = if whole {
                self.parser.line(n, text)
            } else if self.parser.in_body {
                Some(Ok(LogEvent::Skipped(err(n, text, format!("line longer than {MAX_LINE_BYTES} bytes")))))
            } else {
                Some(Err(err(
                    n,
                    text,
                    format!("first line longer than {MAX_LINE_BYTES} bytes: not a gpu_mem_track log"),
                )))
            };
            match parsed {
                None => {}
                Some(Ok(event)) => return Some(Ok(event)),
                Some(Err(e)) => {
                    self.finished = true;
                    return Some(Err(self.not_a_log(e)));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::Sign;
    use crate::group::TensorClass;
    use crate::log::{SourceLocation, ALLOCATED, TENSOR_USED};

    /// Written by hand from `gpu_mem_track.py`'s format strings: `-` lines end with a space,
    /// numbers are `str(x)[:6]`, the first header says `Total Used Memory` as old versions did.
    const PYTHON_LOG: &str = "GPU Memory Track | 30-Apr-21-20:25:29 | Total Tensor Used Memory:0.0    Mb Total Used Memory:0.0    Mb\n\
\n\
\n\
At main.py line 10: <module>                          Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n\
\n\
+ | 1 * Size:(64, 64, 3, 3)       | Memory: 0.1406 M | <class 'torch.nn.parameter.Parameter'> | torch.float32\n\
+ | 8 * Size:(512,)               | Memory: 0.0156 M | <class 'torch.nn.parameter.Parameter'> | torch.float32\n\
+ | 1 * Size:(14,)                | Memory: 1.3351 M | <class 'torch.Tensor'> | torch.uint8\n\
\n\
At main.py line 12: <module>                          Total Tensor Used Memory:76.4   Mb Total Allocated Memory:76.4   Mb\n\
\n\
- | 2 * Size:(40, 3, 512, 512)    | Memory: 240.0 M | <class 'torch.Tensor'> | torch.float32 \n\
\n\
At /data/u/my project/train.py line 37: train_step                Total Tensor Used Memory:63.0   Mb Total Allocated Memory:63.0   Mb\n\
\n";

    #[test]
    fn reads_the_python_tools_log() {
        let log = parse_log(PYTHON_LOG).unwrap();
        assert_eq!(log.header.timestamp, "30-Apr-21-20:25:29");
        assert_eq!(log.header.fields[1].label, "Total Used Memory");
        assert_eq!(log.blocks.len(), 3);
        assert!(log.blocks[0].changes.is_empty());
        let b1 = &log.blocks[1];
        assert_eq!(b1.changes.len(), 3);
        assert_eq!(b1.changes[0].shape, vec![64, 64, 3, 3]);
        assert_eq!(b1.changes[0].class, TensorClass::Parameter);
        assert_eq!(b1.changes[1].count, 8);
        assert_eq!(b1.changes[1].shape, vec![512]);
        assert_eq!(b1.changes[2].memory_mib, 1.3351); // the Python tool's truncation, read as printed
        assert_eq!(
            b1.at.location,
            SourceLocation { file: "main.py".into(), line: 12, function: "<module>".into() }
        );
        assert_eq!(b1.at.tensor_used_mib(), Some(76.4));
        let b2 = &log.blocks[2];
        assert_eq!(b2.changes[0].sign, Sign::Minus);
        assert_eq!(b2.changes[0].dtype, "torch.float32");
        assert_eq!(b2.at.location.file, "/data/u/my project/train.py");
        assert_eq!(b2.at.location.function, "train_step");
        assert_eq!(b2.at.field(ALLOCATED), Some(63.0));
        assert_eq!(b2.at.field(TENSOR_USED), Some(63.0));
    }

    #[test]
    fn bad_lines_name_their_line_number() {
        let e =
            parse_log("GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\nhello\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.to_string().contains("line 3"), "{e}");
        let e = parse_log("").unwrap_err();
        assert!(e.reason.contains("empty"), "{e}");
        let e = parse_log("not a log\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_log_bytes(b"GPU Memory Track | t | \n\xff\xfe garbage").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("UTF-8"));
        let e = parse_log("GPU Memory Track | t | \n+ | 1 * Size:(4,) | Memory: x M | <class 'torch.Tensor'> | torch.float32\n")
            .unwrap_err();
        assert!(e.reason.contains("bad memory figure"), "{e}");
    }

    #[test]
    fn truncated_log_parses_leniently_with_trailing_changes() {
        let cut = &PYTHON_LOG[..PYTHON_LOG.find("- | 2").unwrap() + 40];
        let (log, errors) = parse_log_lenient(cut);
        let log = log.unwrap();
        assert_eq!(log.blocks.len(), 2);
        assert_eq!(errors.len(), 1, "the cut-off line is reported: {errors:?}");
        assert_eq!(errors[0].line, 12);
    }
}
