//! Reads logs back: ours and those written by Pytorch-Memory-Utils (whose `-` lines end in a space
//! and whose numbers are truncated rather than rounded).
use std::fmt;
use std::path::{Path, PathBuf};

use super::{
    AtLine, GroupLine, LogBlock, LogHeader, MemoryField, ParsedLog, SourceLocation, FIRST_FIELDS, TENSOR_USED,
};
use crate::diff::Sign;
use crate::error::{Error, Result};
use crate::group::TensorClass;

/// A line that is not in the log format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogParseError {
    /// File the text came from, when known.
    pub path: Option<PathBuf>,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
    /// The start of the offending line.
    pub text: String,
}

impl fmt::Display for LogParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{}:", p.display())?;
        }
        write!(f, "line {}: {}: {:?}", self.line, self.reason, self.text)
    }
}

impl std::error::Error for LogParseError {}

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
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)));
    let header = loop {
        match lines.next() {
            None => {
                errors.push(err(1, "", "empty file: no `GPU Memory Track | ...` header"));
                return (None, errors);
            }
            Some((_, l)) if l.trim().is_empty() => continue,
            Some((n, l)) => match parse_header(l) {
                Ok(h) => break h,
                Err(reason) => {
                    errors.push(err(n, l, reason));
                    return (None, errors);
                }
            },
        }
    };
    let mut log = ParsedLog { header, blocks: Vec::new(), trailing_changes: Vec::new() };
    let mut pending = Vec::new();
    for (n, l) in lines {
        let parsed = if l.trim().is_empty() {
            Ok(())
        } else if l.starts_with("+ |") || l.starts_with("- |") {
            parse_group_line(l).map(|g| pending.push(g))
        } else if let Some(rest) = l.strip_prefix("At ") {
            parse_at(rest)
                .map(|at| log.blocks.push(LogBlock { changes: std::mem::take(&mut pending), at, line_no: n }))
        } else {
            Err("not a `+`/`-` group line, an `At` line or a blank line".to_owned())
        };
        if let Err(reason) = parsed {
            errors.push(err(n, l, reason));
            if strict {
                return (None, errors);
            }
        }
    }
    log.trailing_changes = pending;
    (Some(log), errors)
}

fn parse_header(l: &str) -> Result<LogHeader, String> {
    let rest = l
        .strip_prefix("GPU Memory Track | ")
        .ok_or("not a gpu_mem_track log: the first line must start with `GPU Memory Track | `")?;
    let (timestamp, fields) = rest.split_once(" | ").ok_or("header has no ` | ` after the timestamp")?;
    Ok(LogHeader { timestamp: timestamp.trim().to_owned(), fields: parse_fields(fields)? })
}

/// `Label:12.3   Mb Label2:0.0    Mb ...`
fn parse_fields(mut s: &str) -> Result<Vec<MemoryField>, String> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return Ok(out);
        }
        let colon = s.find(':').ok_or_else(|| format!("expected `Label:value Mb`, found {s:?}"))?;
        let label = s[..colon].trim();
        let after = &s[colon + 1..];
        let mb = after.find("Mb").ok_or_else(|| format!("field {label:?} has no `Mb` unit"))?;
        let value = after[..mb].trim();
        let mib = value.parse::<f64>().map_err(|_| format!("field {label:?} has a bad number {value:?}"))?;
        if label.is_empty() {
            return Err("a memory field has no label".into());
        }
        out.push(MemoryField { label: label.to_owned(), mib });
        s = &after[mb + 2..];
    }
}

fn parse_group_line(l: &str) -> Result<GroupLine, String> {
    let sign = if l.starts_with('+') { Sign::Plus } else { Sign::Minus };
    let parts: Vec<&str> = l[3..].split(" | ").map(str::trim).collect();
    let [count_shape, memory, class, dtype] = parts[..] else {
        return Err(format!("a group line has 5 `|`-separated columns, this one has {}", parts.len() + 1));
    };
    let (count, shape) = count_shape.split_once(" * Size:").ok_or("expected `N * Size:(...)`")?;
    let count = count.trim().parse::<u64>().map_err(|_| format!("bad tensor count {count:?}"))?;
    let shape = parse_shape(shape.trim())?;
    let memory = memory
        .strip_prefix("Memory:")
        .and_then(|m| m.trim().strip_suffix('M'))
        .ok_or("expected `Memory: <MiB> M`")?
        .trim();
    let memory_mib = memory.parse::<f64>().map_err(|_| format!("bad memory figure {memory:?}"))?;
    let class = class
        .strip_prefix("<class '")
        .and_then(|c| c.strip_suffix("'>"))
        .ok_or("expected a class like `<class 'torch.Tensor'>`")?;
    if dtype.is_empty() {
        return Err("missing dtype column".into());
    }
    Ok(GroupLine {
        sign,
        count,
        shape,
        memory_mib,
        class: TensorClass::from_python_name(class),
        dtype: dtype.to_owned(),
    })
}

/// `()`, `(512,)`, `(64, 3)`; also `torch.Size([64, 3])`.
fn parse_shape(s: &str) -> Result<Vec<i64>, String> {
    let inner = s
        .strip_prefix("torch.Size([")
        .and_then(|x| x.strip_suffix("])"))
        .or_else(|| s.strip_prefix('(').and_then(|x| x.strip_suffix(')')))
        .ok_or_else(|| format!("bad shape {s:?}: expected a tuple like (64, 3)"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse::<i64>().map_err(|_| format!("bad dimension {d:?} in shape {s:?}")))
        .collect()
}

fn parse_at(rest: &str) -> Result<AtLine, String> {
    let idx = FIRST_FIELDS
        .iter()
        .filter_map(|label| rest.find(&format!(" {label}:")))
        .min()
        .ok_or_else(|| format!("`At` line has no `{TENSOR_USED}` field"))?;
    let place = rest[..idx].trim_end();
    let fields = parse_fields(&rest[idx..])?;
    let line_at = place.rfind(" line ").ok_or("`At` line has no `<file> line <n>: <function>` location")?;
    let (file, after) = (&place[..line_at], &place[line_at + 6..]);
    let (num, function) = after.split_once(':').ok_or("`At` location has no `:` after the line number")?;
    let line = num.trim().parse::<u32>().map_err(|_| format!("bad line number {num:?}"))?;
    Ok(AtLine {
        location: SourceLocation { file: file.to_owned(), line, function: function.trim().to_owned() },
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{ALLOCATED, TENSOR_USED};

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
