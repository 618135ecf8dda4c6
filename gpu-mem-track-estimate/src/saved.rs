//! Memory saved for backward: which tensors autograd keeps from a forward pass for the backward
//! pass, by the op that saved them, captured through autograd's saved-variable hooks while (and
//! only while) a closure runs.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::Result;
use crate::ffi;

/// Bytes one op saved for backward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SavedByOp {
    /// The op (`aten::convolution`, `aten::relu`, ...).
    pub op: String,
    /// Bytes of the unique storages it saved first.
    pub bytes: u64,
    /// How many storages.
    pub storages: usize,
}

/// What a forward pass keeps for backward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SavedReport {
    /// Bytes of unique storages saved for backward and still alive, parameters (and the excluded
    /// inputs) left out. A storage saved by several ops counts once, for the first.
    pub total_bytes: u64,
    /// Breakdown by op, largest first; sums to `total_bytes`.
    pub by_op: Vec<SavedByOp>,
    /// Parameter bytes autograd saved too (not counted: they live anyway).
    pub parameter_bytes: u64,
    /// Live bytes the closure left behind, from the CPU and meta allocators: the "ground truth" a
    /// GPU user measures with `memory_allocated()` before and after forward. It also holds the
    /// closure's outputs and anything else it kept.
    pub allocator_delta: i64,
}

fn live_bytes() -> u64 {
    gpu_mem_track::cpu_allocator_stats().map_or(0, |s| s.current) + ffi::meta_allocator_current()
}

/// Runs `forward` and reports what autograd saved for backward in it. The hooks are only active
/// on this thread while `forward` runs; outside, autograd is untouched.
///
/// # Errors
/// [`Libtorch`](gpu_mem_track::Error::Libtorch) if the hooks cannot be installed, or when called
/// inside another capture.
pub fn memory_for_backward<T>(forward: impl FnOnce() -> T) -> Result<(T, SavedReport)> {
    memory_for_backward_excluding(&[], forward)
}

/// As [`memory_for_backward`], leaving out the storages of `inputs` (the batch, say).
///
/// # Errors
/// As [`memory_for_backward`].
pub fn memory_for_backward_excluding<T>(
    inputs: &[&tch::Tensor],
    forward: impl FnOnce() -> T,
) -> Result<(T, SavedReport)> {
    gpu_mem_track::install()?;
    let before = live_bytes();
    let (output, saved) = gpu_mem_track::saved::capture(inputs, forward)?;
    let allocator_delta = live_bytes() as i64 - before as i64;
    let parameter_bytes = saved.parameter_bytes;
    let mut by_op: BTreeMap<String, (u64, usize)> = BTreeMap::new();
    for (bytes, op) in saved.storages {
        let e = by_op.entry(op).or_default();
        e.0 += bytes;
        e.1 += 1;
    }
    let mut by_op: Vec<SavedByOp> =
        by_op.into_iter().map(|(op, (bytes, storages))| SavedByOp { op, bytes, storages }).collect();
    by_op.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.op.cmp(&b.op)));
    let total_bytes = by_op.iter().map(|o| o.bytes).sum();
    Ok((output, SavedReport { total_bytes, by_op, parameter_bytes, allocator_delta }))
}
