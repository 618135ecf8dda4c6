//! The `At` line that closes every block: where the track point was taken, then its figures.
//!
//! ```text
//! At examples/train.rs line 12: main                    Total Tensor Used Memory:76.4   Mb Total Allocated Memory:76.4   Mb
//! ```
//!
//! The place is padded to 50 columns; each figure is ` Label:value Mb` with the value printed as
//! Python's `{x:<7.1f}`. The first two figures are the Python tool's; the others are appended
//! fields ([`AtField`] says where each comes from). The header line's figures share this syntax
//! ([`MemoryField`]).
use std::fmt::Write as _;

use super::MIB;
use super::{clip, parse_finite};

/// A figure an `At` line may carry, by label: the first two are those of Pytorch-Memory-Utils, the
/// others are appended by this tool (readers that do not know a label skip it).
///
/// [`AtField::label`] is the text before the colon; the `pub const` labels of [`crate::log`]
/// ([`TENSOR_USED`], [`ALLOCATED`], ...) are the same strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtField {
    /// `Total Tensor Used Memory`: bytes of the unique live tensor storages on the device, which
    /// the tracker counts itself from its snapshot of live tensors (the Python tool's first
    /// figure).
    TensorUsed,
    /// `Total Allocated Memory`: the allocator's live bytes: on CPU the wrapped CPU allocator's
    /// count, on CUDA the caching allocator's `memory_allocated`.
    Allocated,
    /// `Peak Allocated Memory`: the highest [`AtField::Allocated`] since the previous line, from
    /// the same allocator (the wrapped CPU allocator's peak window, the CUDA caching allocator's
    /// peak statistic).
    PeakAllocated,
    /// `Workspace Memory` (CUDA): bytes of the workspaces cuBLAS and cuBLASLt keep in the caching
    /// allocator, one per handle and stream, apart from tensors (see
    /// `gpu_mem_track_gpu::cuda_libraries::attribute`).
    Workspace,
    /// `Unattributed Memory`: the allocated bytes that neither tensors nor workspaces explain, so
    /// that tensors + workspaces + unattributed = [`AtField::Allocated`].
    Unattributed,
    /// `Reserved Memory` (CUDA): bytes the CUDA caching allocator holds (`memory_reserved`),
    /// allocated or cached.
    Reserved,
    /// `NVML Used Memory` (CUDA + NVML): this process's usage as NVML reports it; in `watch` logs,
    /// the usage of the process the line names.
    NvmlUsed,
    /// `Peak NVML Used Memory` (CUDA + NVML, with the sampler on): the highest NVML usage of this
    /// process the background sampler saw since the previous line.
    PeakNvmlUsed,
    /// `Device Used Memory`: the whole device's usage per NVML, written by `gpu-mem-track watch`
    /// when it watches the device rather than processes.
    DeviceUsed,
    /// `Device Total Memory`: the device's memory size: per NVML in `watch` logs; per the driver
    /// (or what the memory fraction allows) in CUDA out-of-memory lines.
    DeviceTotal,
    /// `Device Free Memory`: the headroom left: on CUDA the device's free memory per the driver;
    /// in a CPU out-of-memory line, what is left under the `cpu_memory_limit`.
    DeviceFree,
    /// `Alloc Retries` (CUDA): `cudaMalloc` failures the CUDA caching allocator retried after
    /// releasing its cache, since the previous line (a count printed as a figure, shown when it
    /// grew).
    AllocRetries,
    /// `Requested Memory`: the bytes the refused allocation asked for, as the out-of-memory
    /// observer saw them. An `At` line with this field closes an out-of-memory block.
    Requested,
    /// `Memory Limit` (CPU out-of-memory lines): the limit set with `cpu_memory_limit`, as the
    /// out-of-memory observer saw it.
    MemoryLimit,
}

impl AtField {
    /// Every field, in the order of the variants.
    pub const ALL: [AtField; 14] = [
        AtField::TensorUsed,
        AtField::Allocated,
        AtField::PeakAllocated,
        AtField::Workspace,
        AtField::Unattributed,
        AtField::Reserved,
        AtField::NvmlUsed,
        AtField::PeakNvmlUsed,
        AtField::DeviceUsed,
        AtField::DeviceTotal,
        AtField::DeviceFree,
        AtField::AllocRetries,
        AtField::Requested,
        AtField::MemoryLimit,
    ];

    /// The fields that can open the figures of an `At` line: tracker lines start with the tensor
    /// total, `watch` lines with NVML figures. The parser finds the end of the place by them.
    const FIRST: [AtField; 3] = [AtField::TensorUsed, AtField::NvmlUsed, AtField::DeviceUsed];

    /// The text before the colon, as written in the log.
    pub const fn label(self) -> &'static str {
        match self {
            AtField::TensorUsed => "Total Tensor Used Memory",
            AtField::Allocated => "Total Allocated Memory",
            AtField::PeakAllocated => "Peak Allocated Memory",
            AtField::Workspace => "Workspace Memory",
            AtField::Unattributed => "Unattributed Memory",
            AtField::Reserved => "Reserved Memory",
            AtField::NvmlUsed => "NVML Used Memory",
            AtField::PeakNvmlUsed => "Peak NVML Used Memory",
            AtField::DeviceUsed => "Device Used Memory",
            AtField::DeviceTotal => "Device Total Memory",
            AtField::DeviceFree => "Device Free Memory",
            AtField::AllocRetries => "Alloc Retries",
            AtField::Requested => "Requested Memory",
            AtField::MemoryLimit => "Memory Limit",
        }
    }

    /// The field a label names; `None` for a label this tool does not write (such as the Python
    /// tool's old `Total Used Memory`).
    pub fn from_label(label: &str) -> Option<AtField> {
        AtField::ALL.into_iter().find(|f| f.label() == label)
    }
}

/// The label, as written in the log.
impl std::fmt::Display for AtField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Label of the `At` line's first field: bytes of live tensor storages ([`AtField::TensorUsed`]).
pub const TENSOR_USED: &str = AtField::TensorUsed.label();
/// Label of the `At` line's second field: the allocator's live bytes ([`AtField::Allocated`]).
pub const ALLOCATED: &str = AtField::Allocated.label();
/// Extension: highest allocated bytes since the previous line ([`AtField::PeakAllocated`]).
pub const PEAK_ALLOCATED: &str = AtField::PeakAllocated.label();
/// Extension (CUDA): bytes of CUDA libraries' workspaces ([`AtField::Workspace`]).
pub const WORKSPACE: &str = AtField::Workspace.label();
/// Extension: allocated bytes neither tensors nor workspaces explain ([`AtField::Unattributed`]).
pub const UNATTRIBUTED: &str = AtField::Unattributed.label();
/// Extension (CUDA): bytes held by the caching allocator ([`AtField::Reserved`]).
pub const RESERVED: &str = AtField::Reserved.label();
/// Extension (CUDA + NVML): this process's usage as NVML reports it ([`AtField::NvmlUsed`]).
pub const NVML_USED: &str = AtField::NvmlUsed.label();
/// Extension (sampler, CUDA + NVML): highest NVML usage of this process since the previous line
/// ([`AtField::PeakNvmlUsed`]).
pub const PEAK_NVML_USED: &str = AtField::PeakNvmlUsed.label();
/// `gpu-mem-track watch` without processes: the whole device's usage ([`AtField::DeviceUsed`]).
pub const DEVICE_USED: &str = AtField::DeviceUsed.label();
/// `gpu-mem-track watch`, and out-of-memory lines: the device's memory size
/// ([`AtField::DeviceTotal`]).
pub const DEVICE_TOTAL: &str = AtField::DeviceTotal.label();
/// Extension (CUDA): the device's free memory per the driver: the headroom left
/// ([`AtField::DeviceFree`]).
pub const DEVICE_FREE: &str = AtField::DeviceFree.label();
/// Extension (CUDA): cudaMalloc failures the caching allocator retried after releasing its cache
/// (a count printed as a figure, shown when it grew since the previous line;
/// [`AtField::AllocRetries`]).
pub const ALLOC_RETRIES: &str = AtField::AllocRetries.label();
/// Out-of-memory lines: the bytes the refused allocation asked for. An `At` line with this field
/// closes an out-of-memory block ([`AtField::Requested`]).
pub const REQUESTED: &str = AtField::Requested.label();
/// Out-of-memory lines (CPU): the limit set with `cpu_memory_limit` ([`AtField::MemoryLimit`]).
pub const MEMORY_LIMIT: &str = AtField::MemoryLimit.label();

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
        MemoryField { label: label.to_owned(), mib: bytes as f64 / MIB }
    }

    /// Appends ` Label:12.3   Mb` (Python's `{x:<7.1f}`), with the leading space.
    pub(super) fn push_to(&self, out: &mut String) {
        let _ = write!(out, " {}:{:<7.1}Mb", self.label, self.mib);
    }

    /// Reads `Label:12.3   Mb Label2:0.0    Mb ...` (the figures of a header or `At` line); the
    /// error is the reason a log parse error gives.
    pub(super) fn parse_all(mut s: &str) -> Result<Vec<MemoryField>, String> {
        let mut out = Vec::new();
        loop {
            s = s.trim_start();
            if s.is_empty() {
                return Ok(out);
            }
            let colon =
                s.find(':').ok_or_else(|| format!("expected `Label:value Mb`, found {:?}", clip(s)))?;
            let label = s[..colon].trim();
            let after = &s[colon + 1..];
            let mb = after.find("Mb").ok_or_else(|| format!("field {:?} has no `Mb` unit", clip(label)))?;
            let value = after[..mb].trim();
            let mib = parse_finite(value)
                .ok_or_else(|| format!("field {:?} has a bad number {:?}", clip(label), clip(value)))?;
            if label.is_empty() {
                return Err("a memory field has no label".into());
            }
            out.push(MemoryField { label: label.to_owned(), mib });
            s = &after[mb + 2..];
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

/// What one track point measured, as its `At` line prints it (`None`: not measured where the
/// tracker runs: no CUDA, no NVML, no sampler). The tracker fills it; [`AtLine::of_track`] turns
/// it into the line, so how a measurement becomes text lives here with the rest of the line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrackFigures {
    /// [`AtField::TensorUsed`].
    pub tensor_bytes: u64,
    /// [`AtField::Allocated`].
    pub allocated: u64,
    /// [`AtField::PeakAllocated`].
    pub peak_allocated: u64,
    /// [`AtField::Workspace`] (CUDA).
    pub workspace: Option<u64>,
    /// [`AtField::Unattributed`].
    pub unattributed: Option<u64>,
    /// [`AtField::Reserved`] (CUDA).
    pub reserved: Option<u64>,
    /// [`AtField::DeviceFree`] (CUDA).
    pub device_free: Option<u64>,
    /// [`AtField::AllocRetries`] since the previous line; printed only when more than 0.
    pub alloc_retries: u64,
    /// [`AtField::NvmlUsed`] (CUDA + NVML).
    pub nvml_used: Option<u64>,
    /// [`AtField::PeakNvmlUsed`] (CUDA + NVML, sampler on).
    pub peak_nvml_used: Option<u64>,
}

/// What starts an `At` line.
const PREFIX: &str = "At ";

/// Whether `l` is an `At` line (what the reader hands to `AtLine::parse`).
pub(super) fn is_at_line(l: &str) -> bool {
    l.starts_with(PREFIX)
}

impl AtLine {
    /// The `At` line of a track point at `location`: the Python tool's two figures, then the
    /// extensions that were measured, in a fixed order.
    pub fn of_track(location: SourceLocation, figures: &TrackFigures) -> AtLine {
        let mut fields = vec![
            MemoryField::from_bytes(TENSOR_USED, figures.tensor_bytes),
            MemoryField::from_bytes(ALLOCATED, figures.allocated),
            MemoryField::from_bytes(PEAK_ALLOCATED, figures.peak_allocated),
        ];
        if let Some(w) = figures.workspace {
            fields.push(MemoryField::from_bytes(WORKSPACE, w));
        }
        if let Some(u) = figures.unattributed {
            fields.push(MemoryField::from_bytes(UNATTRIBUTED, u));
        }
        if let Some(r) = figures.reserved {
            fields.push(MemoryField::from_bytes(RESERVED, r));
        }
        if let Some(free) = figures.device_free {
            fields.push(MemoryField::from_bytes(DEVICE_FREE, free));
        }
        if figures.alloc_retries > 0 {
            // A count, printed in the figure column like the others.
            fields.push(MemoryField { label: ALLOC_RETRIES.to_owned(), mib: figures.alloc_retries as f64 });
        }
        if let Some(used) = figures.nvml_used {
            fields.push(MemoryField::from_bytes(NVML_USED, used));
        }
        if let Some(peak) = figures.peak_nvml_used {
            fields.push(MemoryField::from_bytes(PEAK_NVML_USED, peak));
        }
        AtLine { location, fields }
    }

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

    /// The line without newline: `At <place padded to 50>` then each figure.
    pub fn render(&self) -> String {
        let place = self.location.to_string();
        let mut out = format!("{PREFIX}{place:<50}");
        for f in &self.fields {
            f.push_to(&mut out);
        }
        out
    }

    /// Reads an `At` line (without its line ending); the error is the reason a log parse error
    /// gives.
    pub(super) fn parse(l: &str) -> Result<AtLine, String> {
        let rest = l.strip_prefix(PREFIX).ok_or("not an `At` line")?;
        let idx = AtField::FIRST
            .iter()
            .filter_map(|field| rest.find(&format!(" {}:", field.label())))
            .min()
            .ok_or_else(|| format!("`At` line has no `{TENSOR_USED}` field"))?;
        let place = rest[..idx].trim_end();
        let fields = MemoryField::parse_all(&rest[idx..])?;
        let line_at =
            place.rfind(" line ").ok_or("`At` line has no `<file> line <n>: <function>` location")?;
        let (file, after) = (&place[..line_at], &place[line_at + 6..]);
        let (num, function) =
            after.split_once(':').ok_or("`At` location has no `:` after the line number")?;
        let line = num.trim().parse::<u32>().map_err(|_| format!("bad line number {:?}", clip(num)))?;
        Ok(AtLine {
            location: SourceLocation { file: file.to_owned(), line, function: function.trim().to_owned() },
            fields,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_line_pads_place_and_numbers_like_python() {
        let at = AtLine {
            location: SourceLocation { file: "main.py".into(), line: 10, function: "<module>".into() },
            fields: vec![MemoryField { label: "Total Tensor Used Memory".into(), mib: 0.0 }],
        };
        assert_eq!(
            at.render(),
            "At main.py line 10: <module>                          Total Tensor Used Memory:0.0    Mb"
        );
        assert_eq!(super::super::format::at_line(&at), at.render());
        assert_eq!(AtLine::parse(&at.render()), Ok(at));
    }

    #[test]
    fn field_labels_read_back() {
        for f in AtField::ALL {
            assert_eq!(AtField::from_label(f.label()), Some(f));
            assert_eq!(f.to_string(), f.label());
        }
        assert_eq!(AtField::from_label("Total Used Memory"), None);
        assert_eq!(TENSOR_USED, "Total Tensor Used Memory");
        assert_eq!(ALLOC_RETRIES, "Alloc Retries");
        assert_eq!(MEMORY_LIMIT, "Memory Limit");
    }
}
