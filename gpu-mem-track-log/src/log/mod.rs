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
pub mod format;
pub mod oom;
mod parse;
pub mod writer;

pub use parse::{
    parse_log, parse_log_bytes, parse_log_file, parse_log_lenient, LogEvent, LogParseError, LogReader,
    MAX_BLOCK_CHANGES, MAX_BLOCK_NOTES, MAX_LINE_BYTES,
};
pub use writer::LogWriter;

use crate::diff::Sign;
use crate::group::TensorClass;

/// Label of the `At` line's first field: bytes of live tensor storages.
pub const TENSOR_USED: &str = "Total Tensor Used Memory";
/// Label of the `At` line's second field: the allocator's live bytes.
pub const ALLOCATED: &str = "Total Allocated Memory";
/// Extension: highest allocated bytes since the previous line.
pub const PEAK_ALLOCATED: &str = "Peak Allocated Memory";
/// Extension (CUDA): bytes held by the caching allocator.
pub const RESERVED: &str = "Reserved Memory";
/// Extension (CUDA + NVML): this process's usage as NVML reports it.
pub const NVML_USED: &str = "NVML Used Memory";
/// Extension (sampler, CUDA + NVML): highest NVML usage of this process since the previous line.
pub const PEAK_NVML_USED: &str = "Peak NVML Used Memory";
/// `gpu-mem-track watch` without processes: the whole device's usage.
pub const DEVICE_USED: &str = "Device Used Memory";
/// `gpu-mem-track watch`, and out-of-memory lines: the device's memory size.
pub const DEVICE_TOTAL: &str = "Device Total Memory";
/// Extension (CUDA): the device's free memory per the driver: the headroom left.
pub const DEVICE_FREE: &str = "Device Free Memory";
/// Extension (CUDA): cudaMalloc failures the caching allocator retried after releasing its cache
/// (a count printed as a figure, shown when it grew since the previous line).
pub const ALLOC_RETRIES: &str = "Alloc Retries";
/// Out-of-memory lines: the bytes the refused allocation asked for. An `At` line with this field
/// closes an out-of-memory block.
pub const REQUESTED: &str = "Requested Memory";
/// Out-of-memory lines (CPU): the limit set with `cpu_memory_limit`.
pub const MEMORY_LIMIT: &str = "Memory Limit";

/// Labels that can open the figures of an `At` line: tracker lines start with the tensor total,
/// `watch` lines with NVML figures.
pub(crate) const FIRST_FIELDS: [&str; 3] = [TENSOR_USED, NVML_USED, DEVICE_USED];

/// A `Label:12.3   Mb` figure of a header or `At` line, in MiB.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryField {
    /// Text before the colon.
    pub label: String,
    /// Value in MiB (bytes / 1024²), as printed.
    pub mib: f64,
}

impl MemoryField {
    /// A field from a byte count.
    pub fn from_bytes(label: &str, bytes: u64) -> Self {
        MemoryField { label: label.to_owned(), mib: bytes as f64 / format::MIB }
    }
}

/// The first line of a log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogHeader {
    /// `%d-%b-%y-%H:%M:%S` local time the log was started.
    pub timestamp: String,
    /// Totals at the start.
    pub fields: Vec<MemoryField>,
}

/// One `+`/`-` line.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLine {
    /// `+` or `-`.
    pub sign: Sign,
    /// Tensors added or removed.
    pub count: u64,
    /// Sizes of each tensor of the group.
    pub shape: Vec<i64>,
    /// Memory added or removed, MiB, as printed.
    pub memory_mib: f64,
    /// Python class.
    pub class: TensorClass,
    /// Python dtype name (`torch.float32`).
    pub dtype: String,
    /// The op that made the tensors (` | aten::convolution`, a last column printed only when the
    /// tracker groups by op).
    pub op: Option<String>,
}

impl GroupLine {
    /// The line of a group's change (its op column only when the group has an op).
    pub fn from_change(c: &crate::diff::GroupChange) -> Self {
        GroupLine {
            sign: c.sign,
            count: c.count,
            shape: c.key.shape.to_vec(),
            memory_mib: c.bytes as f64 / format::MIB,
            class: c.key.class.clone(),
            dtype: c.key.dtype.torch_name(),
            op: c.key.op.as_deref().map(str::to_owned),
        }
    }
}

/// Where a track point was taken.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceLocation {
    /// Source file as the compiler (or Python) named it.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// Enclosing function.
    pub function: String,
}

/// `file line N: function`, as the `At` line names the place (padded there to 50 columns).
impl std::fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} line {}: {}", self.file, self.line, self.function)
    }
}

/// One `At` line.
#[derive(Debug, Clone, PartialEq)]
pub struct AtLine {
    /// Where the track call was.
    pub location: SourceLocation,
    /// `Total Tensor Used Memory`, `Total Allocated Memory`, then extensions.
    pub fields: Vec<MemoryField>,
}

impl AtLine {
    /// A field by label.
    pub fn field(&self, label: &str) -> Option<f64> {
        self.fields.iter().find(|f| f.label == label).map(|f| f.mib)
    }

    /// `Total Tensor Used Memory`, MiB.
    pub fn tensor_used_mib(&self) -> Option<f64> {
        self.field(TENSOR_USED)
    }

    /// `Total Allocated Memory`, MiB.
    pub fn allocated_mib(&self) -> Option<f64> {
        self.field(ALLOCATED)
    }
}

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
        let mut out = format::header(&self.header);
        for b in &self.blocks {
            out.push_str(&format::block_with_notes(&b.changes, &b.notes, &b.at));
        }
        out
    }
}

/// The first `chars` characters of `s` (cut on a character boundary, `…` when cut): text quoted
/// from outside input stays one short line whatever the input.
pub(crate) fn clip_chars(s: &str, chars: usize) -> String {
    match s.char_indices().nth(chars) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}
