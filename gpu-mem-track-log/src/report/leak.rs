//! The leak check: tensor groups whose live count never falls and rises at least twice across at
//! least three visits of the same line.
//!
//! Work is proportional to the changes, not to groups × points: every count change goes into a
//! journal (group, count before); a visit of a line reads the journal from that line's previous
//! visit, so it only looks at the groups that changed in between. A (line, group) pair keeps a
//! summary (first/min/max/last count, rises, whether it ever fell, the counts of the first few
//! visits), never one count per visit.
use std::collections::VecDeque;
use std::fmt::Write as _;

use rustc_hash::FxHashMap;

use super::{clip, dtype_itemsize, LeakSuspect};
use crate::diff::Sign;
use crate::log::GroupLine;

/// Counts of the first visits kept per suspect for display.
pub const LEAK_COUNTS_SHOWN: usize = 8;

/// Journal entries kept; older ones are dropped and a line whose previous visit lies before them
/// starts its check afresh (a line not revisited for half a million changes is no loop line).
const JOURNAL_CAP: usize = 1 << 20;

struct GroupInfo {
    /// `Size:(...) dtype <class '...'>`, cut for display.
    text: String,
    itemsize: Option<u64>,
    /// Elements per tensor; `None` when the product of the shape does not fit in 64 bits.
    elems: Option<u64>,
    live: u64,
    /// A delta pushed the count past `u64::MAX` (saturated there).
    saturated: bool,
    /// Last visit window that looked at this group (dedups a window's journal entries).
    window: u64,
    /// Last block with a `+` line for this group (Pytorch-Memory-Utils blocks).
    plus_block: u64,
}

/// A (line, group) pair's counts over the line's visits.
struct Pair {
    first: u64,
    min: u64,
    max: u64,
    last: u64,
    rises: usize,
    first_rise_visit: usize,
    fell: bool,
    head: Vec<u64>,
}

impl Pair {
    /// A pair first seen changed at visit `k` (1-based): it had `prev` at every earlier visit.
    fn new(prev: u64, k: usize) -> Self {
        Pair {
            first: prev,
            min: prev,
            max: prev,
            last: prev,
            rises: 0,
            first_rise_visit: 0,
            fell: false,
            head: vec![prev; (k - 1).min(LEAK_COUNTS_SHOWN)],
        }
    }

    fn pad_head(&mut self, visits: usize) {
        pad_counts(&mut self.head, self.last, visits);
    }

    /// The counts shown for the first `visits` visits: the head, then the last count repeated.
    fn counts(&self, visits: usize) -> Vec<u64> {
        let mut counts = self.head.clone();
        pad_counts(&mut counts, self.last, visits);
        counts
    }

    /// The count at visit `k`.
    fn see(&mut self, cur: u64, k: usize) {
        self.pad_head(k - 1);
        if self.head.len() < LEAK_COUNTS_SHOWN {
            self.head.push(cur);
        }
        if cur > self.last {
            self.rises += 1;
            if self.first_rise_visit == 0 {
                self.first_rise_visit = k;
            }
        } else if cur < self.last {
            self.fell = true;
        }
        self.last = cur;
        self.min = self.min.min(cur);
        self.max = self.max.max(cur);
    }
}

#[derive(Default)]
struct LineLeak {
    visits: usize,
    /// Journal sequence number at the previous visit.
    cursor: u64,
    pairs: FxHashMap<u32, Pair>,
}

/// Live counts per group and the per-line summaries.
#[derive(Default)]
pub(super) struct LeakTracker {
    ids: FxHashMap<String, u32>,
    groups: Vec<GroupInfo>,
    /// (group, count before the change); `journal[0]` has sequence number `base`.
    journal: VecDeque<(u32, u64)>,
    base: u64,
    lines: Vec<LineLeak>,
    windows: u64,
    blocks: u64,
    key: String,
    block_ids: Vec<u32>,
}

/// Fills `counts` with `last` up to the counts shown for `visits` visits.
fn pad_counts(counts: &mut Vec<u64>, last: u64, visits: usize) {
    let n = counts.len().max(visits.min(LEAK_COUNTS_SHOWN));
    counts.resize(n, last);
}

impl LeakTracker {
    /// The groups with live tensors now: text, count, and bytes of one tensor when the dtype
    /// and shape say.
    pub(super) fn live_groups(&self) -> impl Iterator<Item = (&str, u64, Option<u64>)> {
        self.groups.iter().filter(|g| g.live > 0).map(|g| {
            let bytes = g.itemsize.zip(g.elems).and_then(|(i, e)| i.checked_mul(e));
            (g.text.as_str(), g.live, bytes)
        })
    }

    fn intern(&mut self, c: &GroupLine) -> u32 {
        self.key.clear();
        let _ =
            write!(self.key, "Size:{} {} {}", crate::log::format::python_tuple(&c.shape), c.dtype, c.class);
        if let Some(&id) = self.ids.get(self.key.as_str()) {
            return id;
        }
        let id = self.groups.len() as u32;
        let elems = if c.shape.iter().any(|&d| d < 0) {
            Some(0)
        } else {
            c.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        };
        self.groups.push(GroupInfo {
            text: clip(&self.key),
            itemsize: dtype_itemsize(&c.dtype),
            elems,
            live: 0,
            saturated: false,
            window: 0,
            plus_block: 0,
        });
        self.ids.insert(self.key.clone(), id);
        id
    }

    fn set(&mut self, id: u32, new: u64) {
        let g = &mut self.groups[id as usize];
        if g.live != new {
            self.journal.push_back((id, g.live));
            g.live = new;
        }
    }

    /// Applies one block's `+`/`-` lines (`absolute`: Pytorch-Memory-Utils counts) and visits its
    /// line (`line`: a dense id given by the caller).
    pub(super) fn block(&mut self, changes: &[GroupLine], absolute: bool, line: usize) {
        self.blocks += 1;
        let mut ids = std::mem::take(&mut self.block_ids);
        ids.clear();
        ids.extend(changes.iter().map(|c| self.intern(c)));
        if absolute {
            // `+ n` is the new count, `- m` the old one: a `-` line alone means the group is gone.
            for (c, &id) in changes.iter().zip(&ids) {
                if c.sign == Sign::Plus {
                    self.groups[id as usize].plus_block = self.blocks;
                    self.set(id, c.count);
                }
            }
            for (c, &id) in changes.iter().zip(&ids) {
                if c.sign == Sign::Minus && self.groups[id as usize].plus_block != self.blocks {
                    self.set(id, 0);
                }
            }
        } else {
            for (c, &id) in changes.iter().zip(&ids) {
                let g = &mut self.groups[id as usize];
                let new = match c.sign {
                    Sign::Plus => g.live.checked_add(c.count).unwrap_or_else(|| {
                        g.saturated = true;
                        u64::MAX
                    }),
                    Sign::Minus => g.live.saturating_sub(c.count),
                };
                self.set(id, new);
            }
        }
        self.block_ids = ids;
        self.visit(line);
        self.compact();
    }

    fn visit(&mut self, line: usize) {
        if self.lines.len() <= line {
            self.lines.resize_with(line + 1, LineLeak::default);
        }
        let end = self.base + self.journal.len() as u64;
        let l = &mut self.lines[line];
        if l.visits == 0 || l.cursor < self.base {
            // First visit, or the changes since the previous one were dropped: start afresh.
            l.pairs.clear();
            l.visits = 1;
            l.cursor = end;
            return;
        }
        let k = l.visits + 1;
        self.windows += 1;
        for &(id, before) in self.journal.range((l.cursor - self.base) as usize..) {
            let g = &mut self.groups[id as usize];
            if g.window == self.windows {
                continue;
            }
            g.window = self.windows;
            // `before` of the group's first change in the window is its count at the previous
            // visit; its count now is its count at this one.
            l.pairs.entry(id).or_insert_with(|| Pair::new(before, k)).see(g.live, k);
        }
        l.cursor = end;
        l.visits = k;
    }

    fn compact(&mut self) {
        if self.journal.len() <= JOURNAL_CAP {
            return;
        }
        let end = self.base + self.journal.len() as u64;
        let oldest_needed = self.lines.iter().filter(|l| l.visits > 0).map(|l| l.cursor).min().unwrap_or(end);
        let new_base = oldest_needed.max(end - (JOURNAL_CAP / 2) as u64);
        self.journal.drain(..(new_base - self.base) as usize);
        self.base = new_base;
    }

    /// The suspects, most grown bytes first, with the line texts from `line_text`.
    pub(super) fn suspects(&self, line_text: &[String]) -> Vec<LeakSuspect> {
        let mut out = Vec::new();
        for (line, l) in self.lines.iter().enumerate() {
            if l.visits < 3 {
                continue;
            }
            for (&id, p) in &l.pairs {
                if p.fell || p.rises < 2 {
                    continue;
                }
                let g = &self.groups[id as usize];
                let grown = p.last - p.first;
                let bytes = g
                    .itemsize
                    .map(|s| g.elems.and_then(|e| e.checked_mul(s)).and_then(|b| b.checked_mul(grown)));
                let counts = p.counts(l.visits);
                out.push(LeakSuspect {
                    group: g.text.clone(),
                    at: line_text.get(line).cloned().unwrap_or_default(),
                    counts,
                    visits: l.visits,
                    first: p.first,
                    min: p.min,
                    max: p.max,
                    last: p.last,
                    rises: p.rises,
                    first_rise_visit: p.first_rise_visit,
                    grown_bytes: bytes.map(|b| b.unwrap_or(u64::MAX)),
                    overflow: g.saturated || bytes == Some(None),
                });
            }
        }
        out.sort_by(|a, b| {
            b.grown_bytes.cmp(&a.grown_bytes).then(a.group.cmp(&b.group)).then(a.at.cmp(&b.at))
        });
        out
    }
}
