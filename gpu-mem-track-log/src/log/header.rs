//! The header: the first line of a log, then a blank line.
//!
//! ```text
//! GPU Memory Track | 30-Apr-21-20:25:29 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb
//! ```
//!
//! Its figures have the `At` line's syntax ([`MemoryField`]).
use super::MemoryField;

/// What starts the first line of every log.
const PREFIX: &str = "GPU Memory Track | ";

/// The first line of a log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogHeader {
    /// `%d-%b-%y-%H:%M:%S` local time the log was started.
    pub timestamp: String,
    /// Totals at the start.
    pub fields: Vec<MemoryField>,
}

impl LogHeader {
    /// The header line and the blank line after it.
    pub fn render(&self) -> String {
        let mut out = format!("{PREFIX}{} |", self.timestamp);
        for f in &self.fields {
            f.push_to(&mut out);
        }
        out.push_str("\n\n");
        out
    }

    /// Reads the header line (without its line ending); the error is the reason a log parse
    /// error gives.
    pub(super) fn parse(l: &str) -> Result<LogHeader, String> {
        let rest = l
            .strip_prefix(PREFIX)
            .ok_or("not a gpu_mem_track log: the first line must start with `GPU Memory Track | `")?;
        let (timestamp, fields) = rest.split_once(" | ").ok_or("header has no ` | ` after the timestamp")?;
        Ok(LogHeader { timestamp: timestamp.trim().to_owned(), fields: MemoryField::parse_all(fields)? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_as_written() {
        let h = LogHeader {
            timestamp: "30-Apr-21-20:25:29".into(),
            fields: vec![MemoryField { label: "Total Tensor Used Memory".into(), mib: 0.0 }],
        };
        let text = h.render();
        assert_eq!(text, "GPU Memory Track | 30-Apr-21-20:25:29 | Total Tensor Used Memory:0.0    Mb\n\n");
        assert_eq!(LogHeader::parse(text.trim_end_matches('\n')), Ok(h));
        assert!(LogHeader::parse("not a log").unwrap_err().contains("GPU Memory Track | "));
    }
}
