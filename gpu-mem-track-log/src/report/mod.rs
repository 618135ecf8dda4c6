//! `gpu-mem-track report`: what a log says, summarised: the peak line, the lines where memory grew
//! most, tensor groups that only ever grow at a repeated line (leak suspects), and totals. Reads
//! our logs and the Python tool's (whose `+`/`-` lines carry absolute counts, not deltas).
//!
//! [`Analyser`] takes a log one block at a time ([`analyse_file`] streams a file through it with
//! [`LogReader`]), so the work is proportional to the log's changes and the
//! memory to its distinct lines and groups, whatever its length. A report is bounded too: lists
//! are cut to `top` (at most [`MAX_LISTED`]), skipped lines to [`MAX_ERRORS_KEPT`], text taken
//! from the log to [`MAX_TEXT_CHARS`] characters.
mod leak;
mod ranks;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::BufRead;
use std::path::{Path, PathBuf};

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::error::Result;
use crate::log::oom::FRAGMENTED_SHARE;
use crate::log::writer::parse_log_file_name;
use crate::log::{
    clip_chars, LogBlock, LogEvent, LogReader, MemoryField, ParsedLog, ALLOCATED, ALLOC_RETRIES, DEVICE_FREE,
    DEVICE_USED, NVML_USED, PEAK_ALLOCATED, REQUESTED, RESERVED, TENSOR_USED,
};

pub use leak::LEAK_COUNTS_SHOWN;
pub use ranks::{ExtraGroup, HighestRank};

/// Longest list (growth lines, leak suspects) a report holds, whatever `top` asks for.
pub const MAX_LISTED: usize = 100;
/// Skipped lines a report quotes; the rest are counted.
pub const MAX_ERRORS_KEPT: usize = 5;
/// Text from the log (places, groups, labels, skipped lines) is cut to this many characters.
pub const MAX_TEXT_CHARS: usize = 120;
/// Figures (labels) a report follows; further labels of a damaged log are ignored.
pub const MAX_FIELDS: usize = 32;
/// Out-of-memory blocks a report quotes (the rest are counted), and `! ` lines quoted per block.
pub const MAX_OOMS_KEPT: usize = 5;
/// `! ` lines a report quotes per out-of-memory block.
pub const MAX_NOTES_KEPT: usize = 40;

/// An out-of-memory block of a log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Oom {
    /// The place of its `At` line (`file line N: function >> OUT OF MEMORY in op`).
    pub at: String,
    /// 1-based line of its `At` line in the file.
    pub log_line: usize,
    /// Bytes asked for, MiB.
    pub requested_mib: f64,
    /// Its `! ` lines (the first [`MAX_NOTES_KEPT`]).
    pub notes: Vec<String>,
}

/// The track point with the least free device memory (CUDA logs with `Device Free Memory`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Headroom {
    /// Free device memory there, MiB.
    pub free_mib: f64,
    /// The line.
    pub at: String,
    /// 1-based line of its `At` line in the file.
    pub log_line: usize,
}

/// Reserved memory far above allocated memory where reserved memory peaks: the caching
/// allocator holds memory the tensors do not use.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fragmentation {
    /// Reserved memory at its peak, MiB.
    pub reserved_mib: f64,
    /// Allocated memory at that point, MiB.
    pub allocated_mib: f64,
    /// The line.
    pub at: String,
}

/// The start of `s`, at most [`MAX_TEXT_CHARS`] characters (cut on a character boundary, `…`
/// when cut).
pub(crate) fn clip(s: &str) -> String {
    clip_chars(s, MAX_TEXT_CHARS)
}

/// How a log's `+`/`-` counts are meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// gpu-mem-track: counts are net changes.
    GpuMemTrack,
    /// Pytorch-Memory-Utils: `+ n` is the group's new count, `- m` its old one.
    PytorchMemoryUtils,
    /// `gpu-mem-track watch`: NVML samples, no tensor lines.
    Watch,
}

impl Dialect {
    /// Our `At` lines always carry `Peak Allocated Memory`; watch logs have no tensor totals. The
    /// first `At` line with a tensor total decides (so a stream is read in one pass).
    pub fn detect(log: &ParsedLog) -> Dialect {
        let decided = log.blocks.iter().find_map(Dialect::of_block);
        Dialect::or_default(decided, log.blocks.len())
    }

    /// The dialect an `At` line shows, if it has a tensor total.
    fn of_block(b: &LogBlock) -> Option<Dialect> {
        b.at.field(TENSOR_USED)?;
        Some(if b.at.field(PEAK_ALLOCATED).is_some() {
            Dialect::GpuMemTrack
        } else {
            Dialect::PytorchMemoryUtils
        })
    }

    /// No tensor total anywhere: a watch log, or ours when there are no points at all.
    fn or_default(decided: Option<Dialect>, points: usize) -> Dialect {
        decided.unwrap_or(if points == 0 { Dialect::GpuMemTrack } else { Dialect::Watch })
    }
}

/// The block where a figure is highest.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peak {
    /// Field label.
    pub field: String,
    /// Value, MiB.
    pub mib: f64,
    /// Where.
    pub at: String,
    /// 1-based line of the `At` line in the file.
    pub log_line: usize,
    /// 0-based index of the track point.
    pub point: usize,
}

/// Rises of the main figure into one line, from the previous track point of the same series:
/// what the code before this line allocates per visit. A rise freed again later (activations of
/// a training step) is no growth of the run; [`Growth::last_level_mib`] minus
/// [`Growth::first_level_mib`] says whether the level at this line stays or climbs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    /// Where the rise was seen (the code between the previous line and this one).
    pub at: String,
    /// Largest single rise, MiB.
    pub max_mib: f64,
    /// Sum of the rises seen at this line, MiB (memory allocated here in all, not memory kept).
    pub total_mib: f64,
    /// Times this line was reached after another track point.
    pub visits: usize,
    /// The figure at the first of those visits, MiB.
    pub first_level_mib: f64,
    /// The figure at the last of those visits, MiB.
    pub last_level_mib: f64,
}

/// Net growth of the main figure over the run: what stays allocated.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetGrowth {
    /// The figure.
    pub field: String,
    /// At the first track point, MiB.
    pub first_mib: f64,
    /// At the last track point, MiB.
    pub last_mib: f64,
    /// `last_mib - first_mib`.
    pub net_mib: f64,
}

/// A tensor group whose count rises each time the same line is reached (and never falls there).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeakSuspect {
    /// `Size:(...) torch.float32 <class ...>`.
    pub group: String,
    /// The repeated line.
    pub at: String,
    /// Live tensors of the group at the first visits ([`LEAK_COUNTS_SHOWN`] at most; all of them
    /// for a line visited no more often).
    pub counts: Vec<u64>,
    /// Visits of the line.
    pub visits: usize,
    /// Count at the first visit.
    pub first: u64,
    /// Lowest count at a visit.
    pub min: u64,
    /// Highest count at a visit.
    pub max: u64,
    /// Count at the last visit.
    pub last: u64,
    /// Visits at which the count was higher than at the previous one.
    pub rises: usize,
    /// The first of those visits (1-based).
    pub first_rise_visit: usize,
    /// Growth in bytes from the first to the last visit (when the dtype is known); `u64::MAX`
    /// when it does not fit (see `overflow`).
    pub grown_bytes: Option<u64>,
    /// A count or the byte figure passed `u64::MAX` and was held there.
    pub overflow: bool,
}

/// Everything `report` says about one log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogReport {
    /// The file.
    pub path: PathBuf,
    /// Device tag from the file name.
    pub device: Option<String>,
    /// Rank from the file name.
    pub rank: Option<u32>,
    /// How the log was written.
    pub dialect: Dialect,
    /// Track points (or watch samples).
    pub points: usize,
    /// The figure ranked for peak and growth.
    pub main_field: Option<String>,
    /// The peak of the main figure.
    pub peak: Option<Peak>,
    /// The peak of every figure present.
    pub peaks: Vec<Peak>,
    /// Largest rises into a line, largest first (`top` of them).
    pub growth: Vec<Growth>,
    /// The main figure's change from the first track point to the last (not for watch logs,
    /// whose points interleave processes).
    pub net_growth: Option<NetGrowth>,
    /// Groups that only ever grow at a repeated line, most grown bytes first (`top` of them).
    pub leak_suspects: Vec<LeakSuspect>,
    /// All leak suspects found, listed or not.
    pub leak_suspects_total: usize,
    /// Value of every figure at the last point, MiB.
    pub last: BTreeMap<String, f64>,
    /// Lines that could not be read (partial report): the first [`MAX_ERRORS_KEPT`].
    pub errors: Vec<String>,
    /// All lines that could not be read.
    pub errors_total: usize,
    /// Out-of-memory blocks, in file order: the first [`MAX_OOMS_KEPT`].
    pub ooms: Vec<Oom>,
    /// All out-of-memory blocks.
    pub ooms_total: usize,
    /// The track point with the least free device memory (out-of-memory blocks left out).
    pub least_headroom: Option<Headroom>,
    /// Set when reserved exceeds allocated by more than [`FRAGMENTED_SHARE`] of it at the
    /// reserved peak.
    pub fragmentation: Option<Fragmentation>,
}

/// Several logs at once (one per rank or GPU).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CombinedReport {
    /// One report per log.
    pub logs: Vec<LogReport>,
    /// Sum of the logs' main-figure peaks, MiB: what the job needs if all peaks coincide.
    pub sum_of_peaks_mib: f64,
    /// The log with the highest peak.
    pub highest: Option<String>,
    /// Of two or more logs read from files: the highest, its peak's line and the tensor groups
    /// it holds there beyond the others at theirs.
    pub highest_rank: Option<HighestRank>,
}

/// Bytes per element of a Python dtype name, when known.
pub fn dtype_itemsize(dtype: &str) -> Option<u64> {
    let name = dtype.strip_prefix("torch.").unwrap_or(dtype);
    Some(match name {
        "bool" | "uint8" | "int8" | "quint8" | "qint8" => 1,
        "float16" | "half" | "bfloat16" | "int16" | "uint16" => 2,
        "float32" | "float" | "int32" | "uint32" | "qint32" | "complex32" => 4,
        "float64" | "double" | "int64" | "long" | "uint64" | "complex64" => 8,
        "complex128" => 16,
        n if n.starts_with("float8") => 1,
        _ => return None,
    })
}

const MAIN_FIELDS: [&str; 4] = [ALLOCATED, TENSOR_USED, NVML_USED, DEVICE_USED];

/// Analyses one parsed log. `errors` are the lenient parser's complaints, kept in the report.
pub fn analyse(path: &Path, log: &ParsedLog, errors: Vec<String>, top: usize) -> LogReport {
    let mut a = Analyser::new(path, top);
    for b in &log.blocks {
        a.push_block(b);
    }
    for e in errors {
        a.push_error(e);
    }
    a.finish()
}

/// Reads a log file block by block and analyses it, in memory bounded by the log's distinct
/// lines and groups (not its length).
///
/// # Errors
/// [`Error::LogRead`](crate::error::Error::LogRead) when the file cannot be opened or read, [`Error::LogParse`](crate::error::Error::LogParse) (naming the
/// file) when it has no `GPU Memory Track | ...` header. Lines that are not in the format are
/// skipped and listed in the report.
pub fn analyse_file(path: &Path, top: usize) -> Result<LogReport> {
    analyse_events(path, LogReader::open(path)?, top)
}

/// [`analyse_file`] over any reader; `path` names the log in the report and in errors.
///
/// # Errors
/// As [`analyse_file`].
pub fn analyse_reader(path: &Path, reader: impl BufRead, top: usize) -> Result<LogReport> {
    analyse_events(path, LogReader::new(reader).with_path(path), top)
}

fn analyse_events(
    path: &Path,
    events: impl Iterator<Item = Result<LogEvent>>,
    top: usize,
) -> Result<LogReport> {
    let mut a = Analyser::new(path, top);
    for event in events {
        match event? {
            LogEvent::Block(b) => a.push_block(&b),
            LogEvent::Skipped(e) => a.push_error(e.to_string()),
            LogEvent::Header(_) | LogEvent::Trailing(_) => {}
        }
    }
    Ok(a.finish())
}

/// The highest value of one figure so far.
struct PeakAcc {
    label: String,
    mib: f64,
    line: usize,
    log_line: usize,
    point: usize,
}

/// Rises of one candidate main figure.
struct GrowthAcc {
    field: &'static str,
    seen: bool,
    first: f64,
    last: f64,
    /// Previous value per series (watch logs: per process).
    previous: FxHashMap<String, f64>,
    lines: FxHashMap<usize, Growth>,
}

/// Builds a [`LogReport`] from blocks fed one at a time: [`analyse`] and [`analyse_file`] are
/// this over a parsed log and over a stream.
///
/// ```
/// use gpu_mem_track_log::log::{LogEvent, LogReader};
/// use gpu_mem_track_log::report::Analyser;
/// let text = "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n\
///             At a.rs line 1: f  Total Tensor Used Memory:1.0    Mb\n";
/// let mut a = Analyser::new("a.txt".as_ref(), 10);
/// for event in LogReader::new(text.as_bytes()) {
///     if let LogEvent::Block(b) = event? {
///         a.push_block(&b);
///     }
/// }
/// assert_eq!(a.finish().points, 1);
/// # Ok::<(), gpu_mem_track_log::Error>(())
/// ```
pub struct Analyser {
    path: PathBuf,
    top: usize,
    points: usize,
    dialect: Option<Dialect>,
    line_ids: FxHashMap<String, usize>,
    line_text: Vec<String>,
    place: String,
    peaks: Vec<PeakAcc>,
    growth: Vec<GrowthAcc>,
    last: Vec<MemoryField>,
    leaks: leak::LeakTracker,
    errors: Vec<String>,
    errors_total: usize,
    ooms: Vec<Oom>,
    ooms_total: usize,
    least_headroom: Option<Headroom>,
    /// (reserved, allocated, line) at the highest reserved figure so far.
    reserved_peak: Option<(f64, f64, usize)>,
}

impl Analyser {
    /// An analyser for the log at `path` (named in the report; device and rank come from its
    /// name), listing `top` growth lines and leak suspects (at most [`MAX_LISTED`]).
    pub fn new(path: &Path, top: usize) -> Self {
        Analyser {
            path: path.to_owned(),
            top: top.min(MAX_LISTED),
            points: 0,
            dialect: None,
            line_ids: FxHashMap::default(),
            line_text: Vec::new(),
            place: String::new(),
            peaks: Vec::new(),
            growth: MAIN_FIELDS
                .iter()
                .map(|&field| GrowthAcc {
                    field,
                    seen: false,
                    first: 0.0,
                    last: 0.0,
                    previous: FxHashMap::default(),
                    lines: FxHashMap::default(),
                })
                .collect(),
            last: Vec::new(),
            leaks: leak::LeakTracker::default(),
            errors: Vec::new(),
            errors_total: 0,
            ooms: Vec::new(),
            ooms_total: 0,
            least_headroom: None,
            reserved_peak: None,
        }
    }

    /// A line of the log that could not be read: the first [`MAX_ERRORS_KEPT`] are quoted (cut
    /// to a short line), the rest counted.
    pub fn push_error(&mut self, error: impl Into<String>) {
        self.errors_total += 1;
        if self.errors.len() < MAX_ERRORS_KEPT {
            self.errors.push(clip_chars(&error.into(), 2 * MAX_TEXT_CHARS));
        }
    }

    /// The next track point.
    pub fn push_block(&mut self, b: &LogBlock) {
        let point = self.points;
        self.points += 1;
        if self.dialect.is_none() {
            self.dialect = Dialect::of_block(b);
        }
        let loc = &b.at.location;
        self.place.clear();
        let _ = write!(self.place, "{loc}");
        let line = match self.line_ids.get(self.place.as_str()) {
            Some(&id) => id,
            None => {
                let id = self.line_text.len();
                self.line_text.push(clip(&self.place));
                self.line_ids.insert(self.place.clone(), id);
                id
            }
        };

        for f in &b.at.fields {
            let label = if f.label.len() > MAX_TEXT_CHARS { clip(&f.label) } else { f.label.clone() };
            let new = PeakAcc { label, mib: f.mib, line, log_line: b.line_no, point };
            match self.peaks.iter().position(|p| p.label == new.label) {
                Some(i) if self.peaks[i].mib >= f.mib => {}
                Some(i) => self.peaks[i] = new,
                None if self.peaks.len() < MAX_FIELDS => self.peaks.push(new),
                None => {}
            }
        }

        // A line without a tensor total is a watch sample: one series per process.
        let series = if b.at.field(TENSOR_USED).is_some() { "" } else { loc.file.as_str() };
        for g in &mut self.growth {
            let Some(v) = b.at.field(g.field) else { continue };
            if !g.seen {
                g.seen = true;
                g.first = v;
            }
            g.last = v;
            let prev = match g.previous.get_mut(series) {
                Some(p) => Some(std::mem::replace(p, v)),
                None => {
                    g.previous.insert(series.to_owned(), v);
                    None
                }
            };
            if let Some(prev) = prev {
                let acc = g.lines.entry(line).or_insert_with(|| Growth {
                    at: String::new(),
                    max_mib: f64::MIN,
                    total_mib: 0.0,
                    visits: 0,
                    first_level_mib: v,
                    last_level_mib: v,
                });
                let d = v - prev;
                acc.max_mib = acc.max_mib.max(d);
                acc.total_mib += d.max(0.0);
                acc.visits += 1;
                acc.last_level_mib = v;
            }
        }

        if let Some(requested_mib) = b.at.field(REQUESTED) {
            self.ooms_total += 1;
            if self.ooms.len() < MAX_OOMS_KEPT {
                self.ooms.push(Oom {
                    at: self.line_text[line].clone(),
                    log_line: b.line_no,
                    requested_mib,
                    notes: b
                        .notes
                        .iter()
                        .take(MAX_NOTES_KEPT)
                        .map(|n| clip_chars(n, 2 * MAX_TEXT_CHARS))
                        .collect(),
                });
            }
        } else if let Some(free_mib) = b.at.field(DEVICE_FREE) {
            if self.least_headroom.as_ref().is_none_or(|h| free_mib < h.free_mib) {
                self.least_headroom =
                    Some(Headroom { free_mib, at: self.line_text[line].clone(), log_line: b.line_no });
            }
        }
        if let (Some(reserved), Some(allocated)) = (b.at.field(RESERVED), b.at.field(ALLOCATED)) {
            if self.reserved_peak.is_none_or(|(r, _, _)| reserved > r) {
                self.reserved_peak = Some((reserved, allocated, line));
            }
        }

        self.last.clone_from(&b.at.fields);
        let absolute = self.dialect == Some(Dialect::PytorchMemoryUtils);
        self.leaks.block(&b.changes, absolute, line);
    }

    /// The report.
    pub fn finish(self) -> LogReport {
        let dialect = Dialect::or_default(self.dialect, self.points);
        let name = parse_log_file_name(
            &self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        );
        let at = |line: usize| self.line_text.get(line).cloned().unwrap_or_default();
        let main = self.growth.iter().find(|g| g.seen);
        let main_field = main.map(|g| g.field.to_owned());
        let peaks: Vec<Peak> = self
            .peaks
            .iter()
            .map(|p| Peak {
                field: p.label.clone(),
                mib: p.mib,
                at: at(p.line),
                log_line: p.log_line,
                point: p.point,
            })
            .collect();
        let peak = main_field.as_ref().and_then(|m| peaks.iter().find(|p| &p.field == m).cloned());

        let mut growth: Vec<Growth> = main
            .map(|g| {
                g.lines
                    .iter()
                    .filter(|(_, acc)| acc.max_mib > 0.0)
                    .map(|(&line, acc)| Growth { at: at(line), ..acc.clone() })
                    .collect()
            })
            .unwrap_or_default();
        growth.sort_by(|a, b| {
            b.max_mib.total_cmp(&a.max_mib).then(b.total_mib.total_cmp(&a.total_mib)).then(a.at.cmp(&b.at))
        });
        growth.truncate(self.top);
        let net_growth = main.filter(|_| dialect != Dialect::Watch).map(|g| NetGrowth {
            field: g.field.to_owned(),
            first_mib: g.first,
            last_mib: g.last,
            net_mib: g.last - g.first,
        });

        let mut leak_suspects = self.leaks.suspects(&self.line_text);
        let leak_suspects_total = leak_suspects.len();
        leak_suspects.truncate(self.top);

        let last = self.last.iter().take(MAX_FIELDS).map(|f| (clip(&f.label), f.mib)).collect();
        let fragmentation = self
            .reserved_peak
            .filter(|&(reserved, allocated, _)| {
                reserved > 0.0 && reserved - allocated > FRAGMENTED_SHARE * reserved
            })
            .map(|(reserved_mib, allocated_mib, line)| Fragmentation {
                reserved_mib,
                allocated_mib,
                at: at(line),
            });

        LogReport {
            path: self.path,
            device: name.device,
            rank: name.rank,
            dialect,
            points: self.points,
            main_field,
            peak,
            peaks,
            growth,
            net_growth,
            leak_suspects,
            leak_suspects_total,
            last,
            errors: self.errors,
            errors_total: self.errors_total,
            ooms: self.ooms,
            ooms_total: self.ooms_total,
            least_headroom: self.least_headroom,
            fragmentation,
        }
    }
}

/// The report of several logs (one per rank or GPU), each streamed from its file: what
/// `gpu-mem-track report` prints, from the command line and from Python.
///
/// # Errors
/// The first log that cannot be read.
pub fn analyse_files(paths: &[PathBuf], top: usize) -> Result<CombinedReport> {
    let reports = paths.iter().map(|path| analyse_file(path, top)).collect::<Result<Vec<_>>>()?;
    let highest_rank = ranks::highest_rank(&reports, top.min(MAX_LISTED))?;
    Ok(CombinedReport { highest_rank, ..combine(reports) })
}

/// Combines per-log reports.
pub fn combine(logs: Vec<LogReport>) -> CombinedReport {
    let sum_of_peaks_mib = logs.iter().filter_map(|l| l.peak.as_ref().map(|p| p.mib)).sum();
    let highest = logs
        .iter()
        .filter_map(|l| l.peak.as_ref().map(|p| (p.mib, l.path.display().to_string())))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p);
    CombinedReport { logs, sum_of_peaks_mib, highest, highest_rank: None }
}

/// One growth line: what the code before the line allocates per visit, and whether the level at
/// the line stays (freed again later) or climbs from its first visit to its last.
fn growth_text(g: &Growth) -> String {
    if g.visits <= 1 {
        return format!("allocates {:.1} MiB (1 visit)", g.max_mib);
    }
    let kept = g.last_level_mib - g.first_level_mib;
    let fate = if kept.abs() < 0.05 {
        format!("freed again later (the level here stays at {:.1} MiB)", g.last_level_mib)
    } else if kept > 0.0 {
        format!(
            "the level here grows {:+.1} MiB from the first visit to the last ({:.1} -> {:.1} MiB)",
            kept, g.first_level_mib, g.last_level_mib
        )
    } else {
        format!("freed again later; the level here falls {:.1} MiB from the first visit to the last", -kept)
    };
    format!(
        "allocates up to {:.1} MiB per visit ({} visits, {:.1} MiB allocated in all); {fate}",
        g.max_mib, g.visits, g.total_mib
    )
}

/// One leak suspect: its first counts, then a summary.
fn leak_text(k: &LeakSuspect) -> String {
    let mut counts: Vec<String> = k.counts.iter().map(u64::to_string).collect();
    if k.visits > k.counts.len() {
        counts.push(format!("... -> {}", k.last));
    }
    let grown = match k.grown_bytes {
        Some(_) if k.overflow => {
            ", +more than 16 EiB (overflow: the figures do not fit in 64 bits)".to_owned()
        }
        Some(b) => format!(", +{:.4} MiB", b as f64 / 1048576.0),
        None if k.overflow => ", count overflow (held at 18446744073709551615)".to_owned(),
        None => String::new(),
    };
    format!(
        "{} ({} visits, rising at {} of them from visit {}; first {}, min {}, max {}, last {}){grown}",
        counts.join(" -> "),
        k.visits,
        k.rises,
        k.first_rise_visit,
        k.first,
        k.min,
        k.max,
        k.last
    )
}

/// Human-readable text of a combined report.
pub fn render_text(r: &CombinedReport) -> String {
    let mut s = String::new();
    for l in &r.logs {
        let _ = writeln!(s, "== {}", l.path.display());
        let origin = match (&l.device, l.rank) {
            (Some(d), Some(r)) => format!("{d}, rank {r}, "),
            (Some(d), None) => format!("{d}, "),
            (None, Some(r)) => format!("rank {r}, "),
            (None, None) => String::new(),
        };
        let _ = writeln!(s, "   {origin}{} track points, {:?} format", l.points, l.dialect);
        for o in &l.ooms {
            let _ = writeln!(
                s,
                "   OUT OF MEMORY at {} (log line {}): asked for {:.1} MiB",
                o.at, o.log_line, o.requested_mib
            );
            for n in &o.notes {
                let _ = writeln!(s, "     | {n}");
            }
        }
        if l.ooms_total > l.ooms.len() {
            let _ = writeln!(s, "   ... and {} more out-of-memory blocks", l.ooms_total - l.ooms.len());
        }
        match &l.peak {
            Some(p) => {
                let _ = writeln!(
                    s,
                    "   peak {}: {:.1} MiB at {} (log line {})",
                    p.field, p.mib, p.at, p.log_line
                );
            }
            None => s.push_str("   no track points\n"),
        }
        for p in l.peaks.iter().filter(|p| Some(&p.field) != l.main_field.as_ref()) {
            if p.field == ALLOC_RETRIES {
                // A count the log writes in the figure column, not memory.
                let _ = writeln!(s, "   max {}: {} at {}", p.field, p.mib.round(), p.at);
            } else {
                let _ = writeln!(s, "   max {}: {:.1} MiB at {}", p.field, p.mib, p.at);
            }
        }
        if let Some(h) = &l.least_headroom {
            let _ = writeln!(
                s,
                "   least headroom: {:.1} MiB of device memory free at {} (log line {})",
                h.free_mib, h.at, h.log_line
            );
        }
        if let Some(f) = &l.fragmentation {
            let _ = writeln!(
                s,
                "   warning: fragmentation: at the reserved peak ({:.1} MiB, at {}) only {:.1} MiB are allocated: {:.0}% of \
                 the reserve is cached but unused (try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
                f.reserved_mib,
                f.at,
                f.allocated_mib,
                100.0 * (f.reserved_mib - f.allocated_mib) / f.reserved_mib
            );
        }
        let field = l.main_field.as_deref().unwrap_or("memory");
        if let Some(n) = &l.net_growth {
            let _ = writeln!(
                s,
                "   net growth of {} over the run (memory that stays): {:+.1} MiB ({:.1} MiB at the first track point, {:.1} MiB at the last)",
                n.field, n.net_mib, n.first_mib, n.last_mib
            );
        }
        if !l.growth.is_empty() {
            let _ = writeln!(
                s,
                "   largest rises of {field} into a line (allocated since the previous track point; not necessarily kept):"
            );
            for g in &l.growth {
                let _ = writeln!(s, "     {}  at {}", growth_text(g), g.at);
            }
        }
        if l.leak_suspects.is_empty() {
            s.push_str("   leak suspects: none\n");
        } else {
            s.push_str("   leak suspects (count rises at every visit of the same line):\n");
            for k in &l.leak_suspects {
                let _ = writeln!(s, "     {} at {}: {}", k.group, k.at, leak_text(k));
            }
            if l.leak_suspects_total > l.leak_suspects.len() {
                let _ = writeln!(
                    s,
                    "     ... and {} more leak suspects",
                    l.leak_suspects_total - l.leak_suspects.len()
                );
            }
        }
        let last: Vec<String> = l.last.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        if !last.is_empty() {
            let _ = writeln!(s, "   at the end: {} (MiB)", last.join(", "));
        }
        for e in &l.errors {
            let _ = writeln!(s, "   skipped: {e}");
        }
        if l.errors_total > l.errors.len() {
            let _ = writeln!(s, "   ... and {} more skipped lines", l.errors_total - l.errors.len());
        }
    }
    if r.logs.len() > 1 {
        let _ = writeln!(s, "== combined ({} logs)", r.logs.len());
        for l in &r.logs {
            let p = l
                .peak
                .as_ref()
                .map(|p| format!("{:>10.1} MiB  {}", p.mib, p.at))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "   {:<60} {p}",
                l.path.file_name().map(|f| f.to_string_lossy()).unwrap_or_default()
            );
        }
        let _ = writeln!(
            s,
            "   sum of peaks: {:.1} MiB; highest: {}",
            r.sum_of_peaks_mib,
            r.highest.as_deref().unwrap_or("-")
        );
        if let Some(h) = &r.highest_rank {
            ranks::highest_rank_text(h, &mut s);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::parse_log;

    fn at(place: &str, fields: &[(&str, f64)]) -> String {
        let mut s = format!("At {place:<50}");
        for (label, mib) in fields {
            let _ = write!(s, " {label}:{mib:<7.1}Mb");
        }
        s + "\n\n"
    }

    #[test]
    fn oom_comes_first_and_least_headroom_and_fragmentation_are_named() {
        let t = TENSOR_USED;
        let a = ALLOCATED;
        let mut text = "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n".to_owned();
        text += &at("a.rs line 1: f", &[(t, 100.0), (a, 100.0), (RESERVED, 200.0), (DEVICE_FREE, 900.0)]);
        text += &at("a.rs line 2: f", &[(t, 300.0), (a, 300.0), (RESERVED, 1000.0), (DEVICE_FREE, 40.0)]);
        text += &at("a.rs line 3: f", &[(t, 200.0), (a, 200.0), (RESERVED, 900.0), (DEVICE_FREE, 120.0)]);
        text += "! OUT OF MEMORY on cuda:0 in aten::mm, after a.rs line 3: f\n";
        text += &at(
            "a.rs line 3: f >> OUT OF MEMORY in aten::mm",
            &[(t, 200.0), (a, 200.0), (REQUESTED, 512.0), (RESERVED, 900.0), (DEVICE_FREE, 10.0)],
        );
        let log = parse_log(&text).unwrap();
        let r = analyse(Path::new("x-cuda0-gpu_mem_track.txt"), &log, Vec::new(), 10);
        assert_eq!(r.ooms_total, 1);
        assert_eq!(r.ooms[0].requested_mib, 512.0);
        assert_eq!(
            r.ooms[0].notes,
            vec!["OUT OF MEMORY on cuda:0 in aten::mm, after a.rs line 3: f".to_owned()]
        );
        // The out-of-memory block itself is not the least headroom of the run's lines.
        let h = r.least_headroom.as_ref().unwrap();
        assert_eq!((h.free_mib, h.at.as_str()), (40.0, "a.rs line 2: f"));
        let f = r.fragmentation.as_ref().unwrap();
        assert_eq!((f.reserved_mib, f.allocated_mib), (1000.0, 300.0));
        let text = render_text(&combine(vec![r]));
        let oom = text.find("OUT OF MEMORY at a.rs line 3: f >> OUT OF MEMORY in aten::mm").unwrap();
        assert!(oom < text.find("peak").unwrap(), "{text}");
        assert!(text.contains("least headroom: 40.0 MiB"), "{text}");
        assert!(text.contains("warning: fragmentation"), "{text}");
    }

    #[test]
    fn alloc_retries_are_a_count_not_memory() {
        let mut text = "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n".to_owned();
        text += &at("a.rs line 1: f", &[(TENSOR_USED, 900.0), (ALLOCATED, 900.0), (ALLOC_RETRIES, 3.0)]);
        let r = analyse(Path::new("x.txt"), &parse_log(&text).unwrap(), Vec::new(), 10);
        let text = render_text(&combine(vec![r]));
        assert!(text.contains("max Alloc Retries: 3 at a.rs line 1: f"), "{text}");
        assert!(!text.contains("Alloc Retries: 3.0 MiB"), "{text}");
    }

    #[test]
    fn no_fragmentation_warning_when_the_reserve_is_used() {
        let mut text = "GPU Memory Track | t | Total Tensor Used Memory:0.0    Mb\n\n".to_owned();
        text += &at("a.rs line 1: f", &[(TENSOR_USED, 900.0), (ALLOCATED, 900.0), (RESERVED, 1000.0)]);
        let r = analyse(Path::new("x.txt"), &parse_log(&text).unwrap(), Vec::new(), 10);
        assert!(r.fragmentation.is_none() && r.ooms.is_empty() && r.least_headroom.is_none());
    }
}
