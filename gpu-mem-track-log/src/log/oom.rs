//! The out-of-memory block: what a tracker appends when an allocation on its device is refused.
//!
//! It is a block old readers already parse: the `+`/`-` lines since the last track point, then
//! `! ` lines in words (skipped by readers that do not know them), then an `At` line at the last
//! track site whose function reads `... >> OUT OF MEMORY in <op>` and whose appended fields carry
//! the figures ([`REQUESTED`] marks the block as an out-of-memory). [`OomReport`] writes it;
//! [`OomSummary::of`] reads it back from a parsed [`LogBlock`]. The `! ` line itself is the `note`
//! module's.
//!
//! ```text
//! + | 2 * Size:(64, 256, 56, 56)      | Memory: 392.0 M | <class 'torch.Tensor'> | torch.float32
//!
//! ! OUT OF MEMORY on cpu in aten::mkldnn_convolution (called as aten::conv2d), after train.rs line 40: step
//! ! asked for 196.0 MiB; 480.2 MiB allocated of the 512.0 MiB limit, 31.8 MiB free
//! ! ...
//! At train.rs line 40: step >> OUT OF MEMORY in aten::mkldnn_convolution  Total Tensor Used Memory:... Requested Memory:196.0  Mb ...
//! ```
use std::fmt::Write as _;

use super::block::block_with_notes;
use super::group_line::python_tuple;
use super::MIB;
use super::{
    AtLine, GroupLine, LogBlock, MemoryField, SourceLocation, ALLOCATED, DEVICE_FREE, DEVICE_TOTAL,
    MEMORY_LIMIT, REQUESTED, RESERVED, TENSOR_USED,
};
use crate::group::TensorClass;

/// What the function text of an out-of-memory `At` line says before the op.
pub const OOM_MARK: &str = ">> OUT OF MEMORY in";

/// Live tensor groups an out-of-memory block lists.
pub const MAX_HOLDERS: usize = 8;

/// A share of reserved memory that is cached but unused, above which the block and `report` call
/// the failure fragmentation.
pub const FRAGMENTED_SHARE: f64 = 0.2;

/// Bytes as a person reads them: `512 B`, `20.0 KiB`, `392.0 MiB`, `14.6 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < MIB {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < MIB * 1024.0 {
        format!("{:.1} MiB", b / MIB)
    } else {
        format!("{:.1} GiB", b / MIB / 1024.0)
    }
}

/// One group of live tensors that holds memory at the failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    /// Tensors in the group.
    pub count: u64,
    /// Sizes of each.
    pub shape: Vec<i64>,
    /// Python dtype name.
    pub dtype: String,
    /// Python class.
    pub class: TensorClass,
    /// Storage bytes the group holds.
    pub bytes: u64,
    /// What the tracker knows they are (`parameters`, `gradients`, `activations saved for
    /// backward`, ...).
    pub what: Option<String>,
    /// The op that made them.
    pub op: Option<String>,
}

/// Everything an out-of-memory block says.
#[derive(Debug, Clone, PartialEq)]
pub struct OomReport {
    /// `cpu`, `cuda:0`.
    pub device: String,
    /// Innermost op running on the failing thread.
    pub op: String,
    /// Outermost op running on it (the call the program made).
    pub top_op: String,
    /// The last track point before the failure (`None` before the first).
    pub last_site: Option<SourceLocation>,
    /// Bytes the refused allocation asked for.
    pub requested: u64,
    /// Bytes of live tensor storages on the device.
    pub tensor_used: u64,
    /// The allocator's live bytes.
    pub allocated: u64,
    /// CUDA: bytes the caching allocator holds.
    pub reserved: Option<u64>,
    /// CPU: the `cpu_memory_limit`.
    pub limit: Option<u64>,
    /// CUDA: the device's memory (or what the memory fraction allows).
    pub device_total: Option<u64>,
    /// Free bytes: CUDA, per the driver; CPU, under the limit.
    pub device_free: Option<u64>,
    /// `PYTORCH_CUDA_ALLOC_CONF`, when set.
    pub alloc_conf: Option<String>,
    /// The `+`/`-` lines since the last track point.
    pub changes: Vec<GroupLine>,
    /// The largest live groups, largest first (at most [`MAX_HOLDERS`]).
    pub holders: Vec<Holder>,
    /// Live groups left out of `holders`, and their bytes.
    pub others: (u64, u64),
    /// Where the snapshot went, or why it could not be written.
    pub snapshot: Result<String, String>,
    /// Out-of-memory blocks in this log before this one.
    pub earlier: u32,
}

impl OomReport {
    /// The whole block: `+`/`-` lines, blank line, `! ` lines, `At` line, blank line.
    pub fn block(&self) -> String {
        block_with_notes(&self.changes, &self.notes(), &self.at_line())
    }

    /// The `At` line: at the last track site, its figures as appended fields.
    pub fn at_line(&self) -> AtLine {
        let location = match &self.last_site {
            Some(s) => SourceLocation {
                file: s.file.clone(),
                line: s.line,
                function: format!("{} {OOM_MARK} {}", s.function, self.op),
            },
            None => SourceLocation {
                file: "<before the first track>".into(),
                line: 0,
                function: format!("{OOM_MARK} {}", self.op),
            },
        };
        let mut fields = vec![
            MemoryField::from_bytes(TENSOR_USED, self.tensor_used),
            MemoryField::from_bytes(ALLOCATED, self.allocated),
            MemoryField::from_bytes(REQUESTED, self.requested),
        ];
        if let Some(r) = self.reserved {
            fields.push(MemoryField::from_bytes(RESERVED, r));
        }
        if let Some(l) = self.limit {
            fields.push(MemoryField::from_bytes(MEMORY_LIMIT, l));
        }
        if let Some(t) = self.device_total {
            fields.push(MemoryField::from_bytes(DEVICE_TOTAL, t));
        }
        if let Some(f) = self.device_free {
            fields.push(MemoryField::from_bytes(DEVICE_FREE, f));
        }
        AtLine { location, fields }
    }

    /// The `! ` lines, in words.
    pub fn notes(&self) -> Vec<String> {
        let mut n = Vec::new();
        let called_as = if self.top_op != self.op && !self.top_op.is_empty() && self.top_op != "<no op>" {
            format!(" (called as {})", self.top_op)
        } else {
            String::new()
        };
        let after = match &self.last_site {
            Some(s) => format!("after {s}"),
            None => "before the first track point".into(),
        };
        let nth =
            if self.earlier > 0 { format!(" (#{} in this log)", self.earlier + 1) } else { String::new() };
        n.push(format!("OUT OF MEMORY{nth} on {} in {}{called_as}, {after}", self.device, self.op));
        let mut figures =
            format!("asked for {}; {} allocated", human_bytes(self.requested), human_bytes(self.allocated));
        if let Some(r) = self.reserved {
            let _ = write!(
                figures,
                ", {} reserved ({} of it cached, unused)",
                human_bytes(r),
                human_bytes(r.saturating_sub(self.allocated))
            );
        }
        match (self.limit, self.device_total) {
            (Some(l), _) => {
                let _ = write!(figures, " of the {} limit (cpu_memory_limit)", human_bytes(l));
            }
            (None, Some(t)) => {
                let _ = write!(figures, " of the device's {}", human_bytes(t));
            }
            (None, None) => {}
        }
        if let Some(f) = self.device_free {
            let source = if self.limit.is_some() { "under the limit" } else { "per the driver" };
            let _ = write!(figures, ", {} free {source}", human_bytes(f));
        }
        n.push(figures);
        if let Some(conf) = &self.alloc_conf {
            n.push(format!("PYTORCH_CUDA_ALLOC_CONF={conf}"));
        }
        if !self.changes.is_empty() {
            let (plus, minus) = self.changes.iter().fold((0.0, 0.0), |(p, m), c| match c.sign {
                crate::diff::Sign::Plus => (p + c.memory_mib, m),
                crate::diff::Sign::Minus => (p, m + c.memory_mib),
            });
            n.push(format!(
                "since the last track point (the lines above): +{} in new tensors, -{} freed",
                human_bytes((plus * MIB) as u64),
                human_bytes((minus * MIB) as u64)
            ));
        }
        n.push("largest live tensor groups (what holds the memory):".into());
        for h in &self.holders {
            let mut line = format!(
                "  {:>10}  {} * {} {} {}",
                human_bytes(h.bytes),
                h.count,
                python_tuple(&h.shape),
                h.dtype,
                h.class.python_name().rsplit('.').next().unwrap_or_default()
            );
            if let Some(w) = &h.what {
                let _ = write!(line, ", {w}");
            }
            if let Some(op) = &h.op {
                let _ = write!(line, ", made by {op}");
            }
            n.push(line);
        }
        if self.others.0 > 0 {
            n.push(format!("  {:>10}  in {} smaller groups", human_bytes(self.others.1), self.others.0));
        }
        if let Some(r) = self.remedy() {
            n.push(format!("remedy: {r}"));
        }
        match &self.snapshot {
            Ok(path) => n.push(format!("snapshot: {path} (drag it into https://pytorch.org/memory_viz)")),
            Err(why) => n.push(format!("no snapshot: {why}")),
        }
        n
    }

    /// What the numbers point to, if anything.
    pub fn remedy(&self) -> Option<String> {
        let cached = self.reserved.map(|r| r.saturating_sub(self.allocated)).unwrap_or(0);
        if let Some(r) = self.reserved {
            if cached >= self.requested && r > 0 && cached as f64 >= FRAGMENTED_SHARE * r as f64 {
                return Some(format!(
                    "fragmentation: {} are cached but unused, more than asked for, yet no free block fits; set \
                     PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or call clear_cache() between phases)",
                    human_bytes(cached)
                ));
            }
        }
        let total = self.limit.or(self.device_total)?;
        if self.allocated.saturating_add(self.requested) as f64 >= 0.8 * total as f64 {
            let biggest = self.holders.first().and_then(|h| h.what.as_deref());
            let hint = match biggest {
                Some(w) if w.starts_with("activations") => {
                    " (activations hold the most: activation checkpointing or mixed precision also help)"
                }
                Some(w) if w.starts_with("optimizer") => {
                    " (optimizer state holds the most: a sharded or 8-bit optimizer helps)"
                }
                _ => "",
            };
            return Some(format!(
                "the tensors need more than there is: {} allocated + {} asked for > {}; use a smaller batch{hint}",
                human_bytes(self.allocated),
                human_bytes(self.requested),
                human_bytes(total)
            ));
        }
        None
    }
}

/// An out-of-memory block as `report` reads it back.
#[derive(Debug, Clone, PartialEq)]
pub struct OomSummary {
    /// The `At` line's place (`file line N: function >> OUT OF MEMORY in op`).
    pub place: String,
    /// Bytes asked for, MiB.
    pub requested_mib: f64,
    /// The `! ` lines.
    pub notes: Vec<String>,
}

impl OomSummary {
    /// The summary of `block` when it is an out-of-memory block.
    pub fn of(block: &LogBlock) -> Option<OomSummary> {
        let requested_mib = block.at.field(REQUESTED)?;
        Some(OomSummary { place: block.at.location.to_string(), requested_mib, notes: block.notes.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::parse_log;

    fn report() -> OomReport {
        OomReport {
            device: "cpu".into(),
            op: "aten::mm".into(),
            top_op: "aten::linear".into(),
            last_site: Some(SourceLocation { file: "train.rs".into(), line: 40, function: "step".into() }),
            requested: 64 << 20,
            tensor_used: 400 << 20,
            allocated: 450 << 20,
            reserved: None,
            limit: Some(512 << 20),
            device_total: None,
            device_free: Some(62 << 20),
            alloc_conf: None,
            changes: Vec::new(),
            holders: vec![Holder {
                count: 2,
                shape: vec![1024, 1024],
                dtype: "torch.float32".into(),
                class: TensorClass::Tensor,
                bytes: 8 << 20,
                what: Some("activations saved for backward".into()),
                op: Some("aten::relu".into()),
            }],
            others: (3, 1 << 20),
            snapshot: Ok("logs/x-oom-snapshot.pickle".into()),
            earlier: 0,
        }
    }

    #[test]
    fn the_block_parses_as_a_block_and_reads_back_as_an_oom() {
        let text =
            format!("GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n{}", report().block());
        let log = parse_log(&text).unwrap();
        let b = &log.blocks[0];
        assert!(b.is_oom());
        assert_eq!(b.at.location.file, "train.rs");
        assert_eq!(b.at.location.function, "step >> OUT OF MEMORY in aten::mm");
        assert_eq!(b.at.field(REQUESTED), Some(64.0));
        assert_eq!(b.at.field(MEMORY_LIMIT), Some(512.0));
        let s = OomSummary::of(b).unwrap();
        assert!(
            s.notes[0].starts_with(
                "OUT OF MEMORY on cpu in aten::mm (called as aten::linear), after train.rs line 40: step"
            ),
            "{:?}",
            s.notes
        );
        assert!(s.notes.iter().any(|n| n.contains("8.0 MiB  2 * (1024, 1024) torch.float32 Tensor, activations saved for backward, made by aten::relu")), "{:?}", s.notes);
        assert!(
            s.notes.iter().any(|n| n.starts_with("remedy: the tensors need more than there is")),
            "{:?}",
            s.notes
        );
        assert_eq!(log.render(), text);
    }

    #[test]
    fn fragmentation_is_named_when_the_cache_could_have_held_the_request() {
        let mut r = report();
        r.limit = None;
        r.device_total = Some(16 << 30);
        r.allocated = 10 << 30;
        r.reserved = Some(14 << 30);
        r.requested = 1 << 30;
        assert!(r.remedy().unwrap().contains("expandable_segments:True"));
        r.reserved = Some((10 << 30) + (512 << 20)); // less cached than asked for: not fragmentation
        assert!(r.remedy().is_none(), "{:?}", r.remedy());
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(20 << 10), "20.0 KiB");
        assert_eq!(human_bytes(392 << 20), "392.0 MiB");
        assert_eq!(human_bytes(15 << 30), "15.0 GiB");
    }
}
