//! Several logs of one job, one per rank: which rank peaks highest, at which line, and which tensor
//! groups it holds at its peak beyond what any other rank holds at its own.
//!
//! The groups alive at a peak are read by streaming the log a second time up to the peak's track
//! point: the first pass keeps no copy of the live groups at every new peak (a log that grows to
//! its end would copy them at every point).
use std::path::Path;

use rustc_hash::FxHashMap;
use serde::Serialize;

use super::leak::LeakTracker;
use super::{Dialect, LogReport};
use crate::error::Result;
use crate::log::{LogEvent, LogReader};

/// A group the highest rank holds more of at its peak than any other rank at its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExtraGroup {
    /// `Size:(...) torch.float32 <class ...>`.
    pub group: String,
    /// Tensors of the group the highest rank holds at its peak.
    pub count: u64,
    /// The most any other rank holds at its peak.
    pub others_most: u64,
    /// The difference in MiB, when the dtype is known.
    pub extra_mib: Option<f64>,
}

/// The rank (log) that peaks highest, and what it holds that the others do not.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HighestRank {
    /// Its log.
    pub log: String,
    /// Its rank, from the file name.
    pub rank: Option<u32>,
    /// Its peak of the main figure, MiB.
    pub peak_mib: f64,
    /// How far above the next highest log's peak, MiB.
    pub above_next_mib: f64,
    /// The line of the peak.
    pub at: String,
    /// 1-based line of the peak's `At` line in its file.
    pub log_line: usize,
    /// Groups it holds more of, most extra memory first (`top` of them).
    pub extra_groups: Vec<ExtraGroup>,
    /// All such groups, listed or not.
    pub extra_groups_total: usize,
}

/// The live groups of the log at `path` at its track point `point` (0-based): group -> (count,
/// bytes of one tensor).
fn groups_at(path: &Path, point: usize, absolute: bool) -> Result<FxHashMap<String, (u64, Option<u64>)>> {
    let mut tracker = LeakTracker::default();
    let mut seen = 0usize;
    for event in LogReader::open(path)? {
        if let LogEvent::Block(b) = event? {
            tracker.block(&b.changes, absolute, 0);
            if seen == point {
                break;
            }
            seen += 1;
        }
    }
    Ok(tracker.live_groups().map(|(g, n, b)| (g.to_owned(), (n, b))).collect())
}

/// The highest of two or more logs with a peak, with the groups it holds beyond the others.
///
/// # Errors
/// A log that can no longer be read on the second pass.
pub(super) fn highest_rank(logs: &[LogReport], top: usize) -> Result<Option<HighestRank>> {
    let mut peaked: Vec<(&LogReport, &super::Peak)> =
        logs.iter().filter_map(|l| l.peak.as_ref().map(|p| (l, p))).collect();
    if peaked.len() < 2 {
        return Ok(None);
    }
    peaked.sort_by(|a, b| b.1.mib.total_cmp(&a.1.mib));
    let held = |l: &LogReport, p: &super::Peak| {
        groups_at(&l.path, p.point, l.dialect == Dialect::PytorchMemoryUtils)
    };
    let (top_log, top_peak) = peaked[0];
    let mine = held(top_log, top_peak)?;
    let mut others_most: FxHashMap<String, u64> = FxHashMap::default();
    for &(l, p) in &peaked[1..] {
        for (group, (count, _)) in held(l, p)? {
            let most = others_most.entry(group).or_default();
            *most = (*most).max(count);
        }
    }
    let mut extra: Vec<ExtraGroup> = mine
        .into_iter()
        .filter_map(|(group, (count, bytes))| {
            let others = others_most.get(&group).copied().unwrap_or(0);
            (count > others).then(|| ExtraGroup {
                extra_mib: bytes.map(|b| (count - others) as f64 * b as f64 / 1048576.0),
                group,
                count,
                others_most: others,
            })
        })
        .collect();
    extra.sort_by(|a, b| {
        b.extra_mib.unwrap_or(0.0).total_cmp(&a.extra_mib.unwrap_or(0.0)).then(a.group.cmp(&b.group))
    });
    let extra_groups_total = extra.len();
    extra.truncate(top);
    Ok(Some(HighestRank {
        log: top_log.path.display().to_string(),
        rank: top_log.rank,
        peak_mib: top_peak.mib,
        above_next_mib: top_peak.mib - peaked[1].1.mib,
        at: top_peak.at.clone(),
        log_line: top_peak.log_line,
        extra_groups: extra,
        extra_groups_total,
    }))
}

/// The text of [`HighestRank`], after the combined table.
pub(super) fn highest_rank_text(h: &HighestRank, s: &mut String) {
    use std::fmt::Write as _;
    let who = h.rank.map_or_else(|| h.log.clone(), |r| format!("rank {r} ({})", h.log));
    let _ = writeln!(
        s,
        "   {who} peaks highest: {:.1} MiB at {} (log line {}), {:.1} MiB above the next",
        h.peak_mib, h.at, h.log_line, h.above_next_mib
    );
    if h.extra_groups.is_empty() {
        s.push_str("   at its peak it holds no tensor group beyond what another log holds at its own\n");
        return;
    }
    s.push_str("   at its peak it holds, beyond the most any other log holds at its own:\n");
    for g in &h.extra_groups {
        let mib = g.extra_mib.map(|m| format!(" (+{m:.1} MiB)")).unwrap_or_default();
        let _ = writeln!(s, "     {} x {} (others at most {}){mib}", g.count, g.group, g.others_most);
    }
    if h.extra_groups_total > h.extra_groups.len() {
        let _ = writeln!(s, "     ... and {} more groups", h.extra_groups_total - h.extra_groups.len());
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::super::{analyse_files, render_text};
    use crate::log::{ALLOCATED, PEAK_ALLOCATED, TENSOR_USED};

    /// A group line: sign, count, shape.
    type Change<'a> = (char, u64, &'a str);

    /// A log of our dialect: each point `(line, group changes, MiB)`.
    fn log(points: &[(u32, &[Change], f64)]) -> String {
        let mut s = format!("GPU Memory Track | t | {TENSOR_USED}:0.0    Mb\n\n");
        for (line, changes, mib) in points {
            for (sign, n, shape) in *changes {
                let _ = writeln!(
                    s,
                    "{sign} | {n} * Size:{shape} | Memory: 0.0 M | <class 'torch.Tensor'> | torch.float32"
                );
            }
            let _ = write!(
                s,
                "\nAt train.py line {line}: step  {TENSOR_USED}:{mib:<7.1}Mb {ALLOCATED}:{mib:<7.1}Mb {PEAK_ALLOCATED}:{mib:<7.1}Mb\n\n"
            );
        }
        s
    }

    #[test]
    fn the_highest_rank_is_named_with_the_groups_it_holds_beyond_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        // Both ranks hold the same two weights; rank 1 also holds a 4 MiB buffer at its peak
        // (line 12), freed by its end; rank 0 peaks at line 11 with one more small tensor.
        let shared: &[Change] = &[('+', 2, "(256, 256)")];
        let rank0 = write(
            "job-cpu-rank0-gpu_mem_track.txt",
            log(&[(10, shared, 0.5), (11, &[('+', 1, "(16,)")], 0.6), (12, &[('-', 1, "(16,)")], 0.5)]),
        );
        let rank1 = write(
            "job-cpu-rank1-gpu_mem_track.txt",
            log(&[
                (10, shared, 0.5),
                (12, &[('+', 1, "(1024, 1024)")], 4.5),
                (13, &[('-', 1, "(1024, 1024)")], 0.5),
            ]),
        );
        let r = analyse_files(&[rank0, rank1], 10).unwrap();
        let h = r.highest_rank.as_ref().unwrap();
        assert_eq!(
            (h.rank, h.peak_mib, h.at.as_str(), h.log_line),
            (Some(1), 4.5, "train.py line 12: step", 9)
        );
        assert!((h.above_next_mib - 3.9).abs() < 1e-9, "{h:?}");
        assert_eq!(h.extra_groups.len(), 1, "{h:?}");
        let g = &h.extra_groups[0];
        assert_eq!(
            (g.group.as_str(), g.count, g.others_most, g.extra_mib),
            ("Size:(1024, 1024) torch.float32 <class 'torch.Tensor'>", 1, 0, Some(4.0))
        );
        let text = render_text(&r);
        assert!(text.contains("rank 1 ("), "{text}");
        assert!(
            text.contains(
                "peaks highest: 4.5 MiB at train.py line 12: step (log line 9), 3.9 MiB above the next"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "1 x Size:(1024, 1024) torch.float32 <class 'torch.Tensor'> (others at most 0) (+4.0 MiB)"
            ),
            "{text}"
        );
        // One log: nothing to compare.
        let alone = analyse_files(&[dir.path().join("job-cpu-rank0-gpu_mem_track.txt")], 10).unwrap();
        assert!(alone.highest_rank.is_none());
    }
}
