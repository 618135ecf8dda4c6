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

/// The one table of the `At` line's figures: each line is a variant of [`AtField`] with its doc,
/// its label, the constant of that label (in [`labels`]), and, for the figures a track point
/// measures, the key of Python's `track()` dict, the unit and how [`TrackFigures`] gives it
/// (`None`: not measured here, and not written). The order is the order of the line. A new figure
/// is one line here, plus its measurement in [`TrackFigures`].
macro_rules! at_fields {
    (@figure $figures:ident) => { None };
    (@figure $figures:ident $f:ident $figure:expr) => {{ let $f: &TrackFigures = $figures; $figure }};
    (@key) => { None };
    (@key $key:literal) => { Some($key) };
    (@mib) => { MIB };
    (@mib bytes) => { MIB };
    (@mib count) => { 1.0 };
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident => $label:literal, $konst:ident $(, track $key:literal ($unit:ident) = |$f:ident| $figure:expr)?;
    )+) => {
        /// A figure an `At` line may carry, by label: the first two are those of
        /// Pytorch-Memory-Utils, the others are appended by this tool (readers that do not know a
        /// label skip it).
        ///
        /// [`AtField::label`] is the text before the colon; the `pub const` labels of
        /// [`crate::log`] ([`TENSOR_USED`], [`ALLOCATED`], ...) are the same strings.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum AtField {
            $( $(#[doc = $doc])* $variant, )+
        }

        impl AtField {
            /// Every field, in the order an `At` line writes them.
            pub const ALL: [AtField; [$(stringify!($variant)),+].len()] = [$(AtField::$variant),+];

            /// The text before the colon, as written in the log.
            pub const fn label(self) -> &'static str {
                match self { $(AtField::$variant => $label),+ }
            }

            /// The key of Python's `track()` dict for a figure a track point measures (`None`: a
            /// figure of `watch` or out-of-memory lines only).
            pub const fn key(self) -> Option<&'static str> {
                match self { $(AtField::$variant => at_fields!(@key $($key)?)),+ }
            }

            /// What a track point measured of this figure: bytes, or a count (`None`: not
            /// measured where it ran, or not a track point's figure; such figures are not written).
            pub fn of(self, figures: &TrackFigures) -> Option<u64> {
                match self { $(AtField::$variant => at_fields!(@figure figures $($f $figure)?)),+ }
            }

            /// The figure's value as printed: MiB for bytes, the count itself for a count.
            fn printed(self, value: u64) -> f64 {
                match self { $(AtField::$variant => value as f64 / at_fields!(@mib $($unit)?)),+ }
            }
        }

        /// The labels of the `At` line's figures, one constant each (re-exported by [`crate::log`]).
        pub mod labels {
            use super::AtField;
            $(
                #[doc = concat!("The label of [`AtField::", stringify!($variant), "`]: `", $label, "`.")]
                pub const $konst: &str = AtField::$variant.label();
            )+
        }
        pub use labels::*;
    };
}

at_fields! {
    /// `Total Tensor Used Memory`: bytes of the unique live tensor storages on the device, which
    /// the tracker counts itself from its snapshot of live tensors (the Python tool's first
    /// figure).
    TensorUsed => "Total Tensor Used Memory", TENSOR_USED, track "tensor_bytes" (bytes) = |f| Some(f.tensor_bytes);
    /// `Total Allocated Memory`: the allocator's live bytes: on CPU the wrapped CPU allocator's
    /// count, on CUDA the caching allocator's `memory_allocated`.
    Allocated => "Total Allocated Memory", ALLOCATED, track "allocated" (bytes) = |f| Some(f.allocated);
    /// `Peak Allocated Memory`: the highest [`AtField::Allocated`] since the previous line, from
    /// the same allocator (the wrapped CPU allocator's peak window, the CUDA caching allocator's
    /// peak statistic).
    PeakAllocated => "Peak Allocated Memory", PEAK_ALLOCATED, track "peak_allocated" (bytes) = |f| Some(f.peak_allocated);
    /// `Workspace Memory` (CUDA): bytes of the workspaces cuBLAS and cuBLASLt keep in the caching
    /// allocator, one per handle and stream, apart from tensors (see
    /// `gpu_mem_track_gpu::cuda_libraries::attribute`).
    Workspace => "Workspace Memory", WORKSPACE, track "workspace_bytes" (bytes) = |f| f.workspace;
    /// `Unattributed Memory`: the allocated bytes that neither tensors nor workspaces explain, so
    /// that tensors + workspaces + unattributed = [`AtField::Allocated`].
    Unattributed => "Unattributed Memory", UNATTRIBUTED, track "unattributed_bytes" (bytes) = |f| f.unattributed;
    /// `Reserved Memory` (CUDA): bytes the CUDA caching allocator holds (`memory_reserved`),
    /// allocated or cached.
    Reserved => "Reserved Memory", RESERVED, track "reserved" (bytes) = |f| f.reserved;
    /// `Device Free Memory`: the headroom left: on CUDA the device's free memory per the driver;
    /// in a CPU out-of-memory line, what is left under the `cpu_memory_limit`.
    DeviceFree => "Device Free Memory", DEVICE_FREE, track "device_free" (bytes) = |f| f.device_free;
    /// `Alloc Retries` (CUDA): `cudaMalloc` failures the CUDA caching allocator retried after
    /// releasing its cache, since the previous line (a count printed as a figure, shown when it
    /// grew).
    AllocRetries => "Alloc Retries", ALLOC_RETRIES, track "alloc_retries" (count) = |f| (f.alloc_retries > 0).then_some(f.alloc_retries);
    /// `NVML Used Memory` (CUDA + NVML): this process's usage as NVML reports it; in `watch` logs,
    /// the usage of the process the line names.
    NvmlUsed => "NVML Used Memory", NVML_USED, track "nvml_used" (bytes) = |f| f.nvml_used;
    /// `Peak NVML Used Memory` (CUDA + NVML, with the sampler on): the highest NVML usage of this
    /// process the background sampler saw since the previous line.
    PeakNvmlUsed => "Peak NVML Used Memory", PEAK_NVML_USED, track "peak_nvml_used" (bytes) = |f| f.peak_nvml_used;
    /// `Device Used Memory`: the whole device's usage per NVML, written by `gpu-mem-track watch`
    /// when it watches the device rather than processes.
    DeviceUsed => "Device Used Memory", DEVICE_USED;
    /// `Device Total Memory`: the device's memory size: per NVML in `watch` logs; per the driver
    /// (or what the memory fraction allows) in CUDA out-of-memory lines.
    DeviceTotal => "Device Total Memory", DEVICE_TOTAL;
    /// `Requested Memory`: the bytes the refused allocation asked for, as the out-of-memory
    /// observer saw them. An `At` line with this field closes an out-of-memory block.
    Requested => "Requested Memory", REQUESTED;
    /// `Memory Limit` (CPU out-of-memory lines): the limit set with `cpu_memory_limit`, as the
    /// out-of-memory observer saw it.
    MemoryLimit => "Memory Limit", MEMORY_LIMIT;
}

impl AtField {
    /// The fields that can open the figures of an `At` line: tracker lines start with the tensor
    /// total, `watch` lines with NVML figures. The parser finds the end of the place by them.
    const FIRST: [AtField; 3] = [AtField::TensorUsed, AtField::NvmlUsed, AtField::DeviceUsed];

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
/// it into the line, and Python's `track()` into its dict, both through the table of
/// [`AtField`]s, so how a measurement becomes text lives here with the rest of the line.
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
        let fields = AtField::ALL
            .into_iter()
            .filter_map(|f| {
                f.of(figures).map(|v| MemoryField { label: f.label().to_owned(), mib: f.printed(v) })
            })
            .collect();
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

    /// Each figure of the table that a track point measures is written, in the table's order,
    /// read back by the parser, and has a key of Python's dict: a new table line is all three.
    #[test]
    fn every_measured_field_of_the_table_is_written_and_parsed_back() {
        let figures = TrackFigures {
            tensor_bytes: 1 << 20,
            allocated: 2 << 20,
            peak_allocated: 3 << 20,
            workspace: Some(4 << 20),
            unattributed: Some(5 << 20),
            reserved: Some(6 << 20),
            device_free: Some(7 << 20),
            alloc_retries: 8,
            nvml_used: Some(9 << 20),
            peak_nvml_used: Some(10 << 20),
        };
        let location = SourceLocation { file: "train.py".into(), line: 3, function: "step".into() };
        let at = AtLine::of_track(location, &figures);
        let measured: Vec<AtField> = AtField::ALL.into_iter().filter(|f| f.of(&figures).is_some()).collect();
        let written: Vec<&str> = at.fields.iter().map(|f| f.label.as_str()).collect();
        assert_eq!(written, measured.iter().map(|f| f.label()).collect::<Vec<_>>());
        assert_eq!(measured.len(), AtField::ALL.iter().filter(|f| f.key().is_some()).count());
        let parsed = AtLine::parse(&at.render()).unwrap();
        for (i, f) in measured.iter().enumerate() {
            assert!(f.key().is_some(), "{f}: measured, so Python's dict has it");
            assert_eq!(parsed.field(f.label()), Some(i as f64 + 1.0), "{f}");
        }
        // Not measured: not written; a count of 0 retries is not written either.
        let none = TrackFigures { tensor_bytes: 1, ..TrackFigures::default() };
        let at = AtLine::of_track(SourceLocation { file: "a".into(), line: 1, function: "f".into() }, &none);
        assert_eq!(at.fields.len(), 3, "{:?}", at.fields);
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
