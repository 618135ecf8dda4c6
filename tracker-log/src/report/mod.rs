//! `gpu-mem-track report`: what a log says, summarised: the peak line, the lines where memory grew
//! most, tensor groups that only ever grow at a repeated line (leak suspects), and totals. Reads
//! our logs and the Python tool's (whose `+`/`-` lines carry absolute counts, not deltas).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::diff::Sign;
use crate::log::writer::parse_log_file_name;
use crate::log::{ParsedLog, ALLOCATED, DEVICE_USED, NVML_USED, PEAK_ALLOCATED, TENSOR_USED};

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
    /// Our `At` lines always carry `Peak Allocated Memory`; watch logs have no tensor totals.
    pub fn detect(log: &ParsedLog) -> Dialect {
        let ats = || log.blocks.iter().map(|b| &b.at);
        if log.blocks.is_empty() {
            Dialect::GpuMemTrack
        } else if ats().all(|a| a.field(TENSOR_USED).is_none()) {
            Dialect::Watch
        } else if ats().any(|a| a.field(PEAK_ALLOCATED).is_some()) {
            Dialect::GpuMemTrack
        } else {
            Dialect::PytorchMemoryUtils
        }
    }
}

/// A source location (or watched process) as text.
fn place(file: &str, line: u32, function: &str) -> String {
    format!("{file} line {line}: {function}")
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

/// Growth of the main figure into one line, from the previous track point of the same series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Growth {
    /// Where the growth was seen (the code between the previous line and this one).
    pub at: String,
    /// Largest single growth, MiB.
    pub max_mib: f64,
    /// Sum of the growths seen at this line, MiB.
    pub total_mib: f64,
    /// Times this line was reached.
    pub visits: usize,
}

/// A tensor group whose count rises each time the same line is reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LeakSuspect {
    /// `Size:(...) torch.float32 <class ...>`.
    pub group: String,
    /// The repeated line.
    pub at: String,
    /// Live tensors of the group at each visit.
    pub counts: Vec<u64>,
    /// Growth in bytes from the first to the last visit (when the dtype is known).
    pub grown_bytes: Option<u64>,
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
    /// Largest growths, largest first.
    pub growth: Vec<Growth>,
    /// Groups that only ever grow at a repeated line.
    pub leak_suspects: Vec<LeakSuspect>,
    /// Value of every figure at the last point, MiB.
    pub last: BTreeMap<String, f64>,
    /// Lines that could not be read (partial report).
    pub errors: Vec<String>,
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
    let dialect = Dialect::detect(log);
    let name =
        parse_log_file_name(&path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let main_field = MAIN_FIELDS
        .iter()
        .find(|f| log.blocks.iter().any(|b| b.at.field(f).is_some()))
        .map(|f| f.to_string());
    let at_of = |i: usize| {
        let l = &log.blocks[i].at.location;
        place(&l.file, l.line, &l.function)
    };

    // Peaks of every field.
    let mut peaks: Vec<Peak> = Vec::new();
    for (i, b) in log.blocks.iter().enumerate() {
        for f in &b.at.fields {
            match peaks.iter_mut().find(|p| p.field == f.label) {
                Some(p) if p.mib >= f.mib => {}
                Some(p) => {
                    *p = Peak {
                        field: f.label.clone(),
                        mib: f.mib,
                        at: at_of(i),
                        log_line: b.line_no,
                        point: i,
                    }
                }
                None => peaks.push(Peak {
                    field: f.label.clone(),
                    mib: f.mib,
                    at: at_of(i),
                    log_line: b.line_no,
                    point: i,
                }),
            }
        }
    }
    let peak = main_field.as_ref().and_then(|m| peaks.iter().find(|p| &p.field == m).cloned());

    // Growth into each line from the previous point of the same series (a watch log interleaves
    // one series per process).
    let mut growth: BTreeMap<String, Growth> = BTreeMap::new();
    if let Some(main) = &main_field {
        let mut previous: BTreeMap<&str, f64> = BTreeMap::new();
        for (i, b) in log.blocks.iter().enumerate() {
            let Some(v) = b.at.field(main) else { continue };
            let series = if dialect == Dialect::Watch { b.at.location.file.as_str() } else { "" };
            if let Some(prev) = previous.insert(series, v) {
                let g = growth.entry(at_of(i)).or_insert_with(|| Growth {
                    at: at_of(i),
                    max_mib: f64::MIN,
                    total_mib: 0.0,
                    visits: 0,
                });
                let d = v - prev;
                g.max_mib = g.max_mib.max(d);
                g.total_mib += d.max(0.0);
                g.visits += 1;
            }
        }
    }
    let mut growth: Vec<Growth> = growth.into_values().filter(|g| g.max_mib > 0.0).collect();
    growth.sort_by(|a, b| b.max_mib.total_cmp(&a.max_mib).then(b.total_mib.total_cmp(&a.total_mib)));
    growth.truncate(top);

    let last = log
        .blocks
        .last()
        .map(|b| b.at.fields.iter().map(|f| (f.label.clone(), f.mib)).collect())
        .unwrap_or_default();

    LogReport {
        path: path.to_owned(),
        device: name.device,
        rank: name.rank,
        dialect,
        points: log.blocks.len(),
        main_field,
        peak,
        peaks,
        growth,
        leak_suspects: leak_suspects(log, dialect),
        last,
        errors,
    }
}

type Group = (Vec<i64>, String, String);

fn group_text(g: &Group) -> String {
    format!("Size:{} {} <class '{}'>", crate::log::format::python_tuple(&g.0), g.1, g.2)
}

/// Groups whose live count never falls and rises at least twice across at least three visits of
/// the same line.
fn leak_suspects(log: &ParsedLog, dialect: Dialect) -> Vec<LeakSuspect> {
    let mut live: BTreeMap<Group, u64> = BTreeMap::new();
    // (line, group) -> counts at each visit of the line.
    let mut visits: BTreeMap<(String, Group), Vec<u64>> = BTreeMap::new();
    let mut visits_of_line: BTreeMap<String, usize> = BTreeMap::new();
    for b in &log.blocks {
        let key =
            |c: &crate::log::GroupLine| (c.shape.clone(), c.dtype.clone(), c.class.python_name().to_owned());
        match dialect {
            Dialect::PytorchMemoryUtils => {
                let plus: Vec<Group> = b.changes.iter().filter(|c| c.sign == Sign::Plus).map(key).collect();
                for c in &b.changes {
                    match c.sign {
                        Sign::Plus => {
                            live.insert(key(c), c.count);
                        }
                        Sign::Minus if !plus.contains(&key(c)) => {
                            live.insert(key(c), 0);
                        }
                        Sign::Minus => {}
                    }
                }
            }
            _ => {
                for c in &b.changes {
                    let n = live.entry(key(c)).or_default();
                    *n = match c.sign {
                        Sign::Plus => *n + c.count,
                        Sign::Minus => n.saturating_sub(c.count),
                    };
                }
            }
        }
        let at = place(&b.at.location.file, b.at.location.line, &b.at.location.function);
        let visit = visits_of_line.entry(at.clone()).or_default();
        // Groups first seen after earlier visits had 0 there.
        for (g, &n) in &live {
            let counts = visits.entry((at.clone(), g.clone())).or_default();
            while counts.len() < *visit {
                counts.push(0);
            }
            counts.push(n);
        }
        *visit += 1;
    }
    let mut out = Vec::new();
    for ((at, g), counts) in visits {
        let rises = counts.windows(2).filter(|w| w[1] > w[0]).count();
        let never_falls = counts.windows(2).all(|w| w[1] >= w[0]);
        if counts.len() >= 3 && never_falls && rises >= 2 {
            let per_tensor = dtype_itemsize(&g.1).map(|s| s * g.0.iter().product::<i64>().max(0) as u64);
            let grown = counts.last().unwrap() - counts.first().unwrap();
            out.push(LeakSuspect {
                group: group_text(&g),
                at,
                grown_bytes: per_tensor.map(|b| b * grown),
                counts,
            });
        }
    }
    out.sort_by(|a, b| b.grown_bytes.cmp(&a.grown_bytes).then(a.group.cmp(&b.group)));
    out
}

/// Combines per-log reports.
pub fn combine(logs: Vec<LogReport>) -> CombinedReport {
    let sum_of_peaks_mib = logs.iter().filter_map(|l| l.peak.as_ref().map(|p| p.mib)).sum();
    let highest = logs
        .iter()
        .filter_map(|l| l.peak.as_ref().map(|p| (p.mib, l.path.display().to_string())))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, p)| p);
    CombinedReport { logs, sum_of_peaks_mib, highest }
}

/// Human-readable text of a combined report.
pub fn render_text(r: &CombinedReport) -> String {
    use std::fmt::Write as _;
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
            let _ = writeln!(s, "   max {}: {:.1} MiB at {}", p.field, p.mib, p.at);
        }
        if !l.growth.is_empty() {
            let _ = writeln!(s, "   largest growth of {}:", l.main_field.as_deref().unwrap_or("memory"));
            for g in &l.growth {
                let _ = writeln!(
                    s,
                    "     +{:>9.1} MiB (total {:.1} MiB over {} visits)  {}",
                    g.max_mib, g.total_mib, g.visits, g.at
                );
            }
        }
        if l.leak_suspects.is_empty() {
            s.push_str("   leak suspects: none\n");
        } else {
            s.push_str("   leak suspects (count rises at every visit of the same line):\n");
            for k in &l.leak_suspects {
                let counts: Vec<String> = k.counts.iter().map(u64::to_string).collect();
                let grown =
                    k.grown_bytes.map(|b| format!(", +{:.4} MiB", b as f64 / 1048576.0)).unwrap_or_default();
                let _ = writeln!(s, "     {} at {}: {}{grown}", k.group, k.at, counts.join(" -> "));
            }
        }
        let last: Vec<String> = l.last.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        if !last.is_empty() {
            let _ = writeln!(s, "   at the end: {} (MiB)", last.join(", "));
        }
        for e in &l.errors {
            let _ = writeln!(s, "   skipped: {e}");
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
    }
    s
}
