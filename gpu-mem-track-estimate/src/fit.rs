//! The largest batch (or sequence length) that fits a GPU: a search over meta runs, each judged
//! on the high end of its GPU prediction (what nvidia-smi would show with the largest plausible
//! cuDNN workspaces), so a size that fits here fits with margin.
//!
//! Peak memory grows about linearly with the batch (and between linearly and quadratically with
//! the sequence), so the search extrapolates from the probes made so far (a secant step) and falls
//! back to bisection whenever a step does not halve the bracket: ResNet-50 training needs 6-8
//! meta runs rather than the 15-20 of doubling and bisection.
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ffi;
#[cfg(feature = "tch")]
use crate::tch_model::{training_step, TchStepOptions};
use crate::torchscript::torchscript_trace;
use gpu_mem_track_gpu::device_replay::FirstOom;
pub use gpu_mem_track_gpu::options::FitDimension;
use gpu_mem_track_gpu::options::{EstimateOptions, Mode, Optimizer};
use gpu_mem_track_gpu::profile::{predict, DeviceProfile, GpuPrediction};
use gpu_mem_track_gpu::sharding::{per_rank_trace, Parallelism};

/// `shape` with `dimension` (the first for the batch, the second for the sequence) set to `value`.
///
/// # Errors
/// [`Error::Input`] when the shape has no such dimension.
pub fn with_dimension(dimension: FitDimension, shape: &[i64], value: i64) -> Result<Vec<i64>> {
    let index = match dimension {
        FitDimension::Batch => 0,
        FitDimension::Seq => 1,
    };
    let mut s = shape.to_vec();
    match s.get_mut(index) {
        Some(d) => *d = value,
        None => {
            return Err(Error::Input(format!(
                "input shape {shape:?} has no {} dimension (varying `seq` needs [batch, seq, ...])",
                if dimension == FitDimension::Batch { "batch" } else { "sequence" }
            )))
        }
    }
    Ok(s)
}

/// One meta run of the search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FitProbe {
    /// The size tried.
    pub value: i64,
    /// Whether the high end fits the device.
    pub fits: bool,
    /// The high end of what nvidia-smi would show.
    pub needed: u64,
    /// The high end of peak allocated plus the CUDA context: what the device needs for the
    /// tensors and workspaces alone, without the caching allocator's rounding and free blocks.
    pub allocated_needed: u64,
    /// Where a run of this size would fail on the device, when it does not fit
    /// ([`GpuPrediction::first_oom`]).
    pub first_oom: Option<FirstOom>,
}

/// Which figure keeps the next size off the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FitBinding {
    /// Peak allocated (the tensors and the cuDNN and cuBLAS workspaces) with the CUDA context
    /// is above the device's memory: no allocator could place the run.
    Allocated,
    /// Peak allocated fits; what the caching allocator reserves for it (blocks rounded up,
    /// segments split by earlier frees, workspaces in segments of their own) does not.
    Reserved,
}

/// What the search found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitResult {
    /// The varied dimension.
    pub dimension: FitDimension,
    /// Device memory the runs were judged against.
    pub memory_bytes: u64,
    /// The largest size that fits; `None` when even 1 does not.
    pub largest: Option<i64>,
    /// The prediction at `largest` (or at 1 when nothing fits).
    pub prediction: GpuPrediction,
    /// The search stopped at the `max` it was given, which fits.
    pub reached_max: bool,
    /// Which figure the smallest size that does not fit is above the device by; `None` when
    /// every size tried fits.
    pub binds: Option<FitBinding>,
    /// Every probe, in order.
    pub probes: Vec<FitProbe>,
}

/// Searches `1..=max` for the largest value whose `probe` fits, assuming memory grows with the
/// value. `on_probe` sees each probe as it finishes (for progress).
///
/// # Errors
/// The first error of `probe`, or [`Error::Input`] for `max < 1`.
pub fn search_largest(
    dimension: FitDimension,
    max: i64,
    mut probe: impl FnMut(i64) -> Result<GpuPrediction>,
    mut on_probe: impl FnMut(&FitProbe),
) -> Result<FitResult> {
    if max < 1 {
        return Err(Error::Input(format!("the largest size to try must be at least 1, not {max}")));
    }
    let mut probes: Vec<FitProbe> = Vec::new();
    let mut run = |v: i64, probes: &mut Vec<FitProbe>| -> Result<GpuPrediction> {
        let g = probe(v)?;
        let p = FitProbe {
            value: v,
            fits: g.fits,
            needed: g.nvidia_smi.high,
            allocated_needed: g.peak_allocated.high.saturating_add(g.profile.context_bytes),
            first_oom: g.first_oom.clone(),
        };
        on_probe(&p);
        probes.push(p);
        Ok(g)
    };
    let first = run(1, &mut probes)?;
    let memory_bytes = first.profile.memory_bytes;
    if !first.fits {
        return Ok(FitResult {
            dimension,
            memory_bytes,
            largest: None,
            prediction: first,
            reached_max: false,
            binds: binding(&probes, memory_bytes),
            probes,
        });
    }
    // Invariant: `lo` fits; `hi` does not (or is max + 1, never tried).
    let (mut lo, mut lo_g, mut hi) = (1i64, first, max.saturating_add(1));
    let mut bisect_next = false;
    while hi - lo > 1 {
        let width = hi - lo;
        let guess = if bisect_next { None } else { secant(&probes, memory_bytes, lo, hi) };
        let v = guess.unwrap_or(lo + width / 2).clamp(lo + 1, hi - 1);
        let g = run(v, &mut probes)?;
        if g.fits {
            lo = v;
            lo_g = g;
        } else {
            hi = v;
        }
        // A secant step that left more than half of a real bracket (one probe failed): bisect
        // next time. Before any failure the bracket's top is only `max`.
        bisect_next = !bisect_next && hi <= max && (hi - lo) * 2 > width;
    }
    let reached_max = lo == max;
    let binds = binding(&probes, memory_bytes);
    Ok(FitResult { dimension, memory_bytes, largest: Some(lo), prediction: lo_g, reached_max, binds, probes })
}

/// The smallest size tried that does not fit, if any.
pub fn smallest_too_large(probes: &[FitProbe]) -> Option<&FitProbe> {
    probes.iter().filter(|p| !p.fits).min_by_key(|p| p.value)
}

/// Which figure the smallest size that does not fit is above `memory_bytes` by.
fn binding(probes: &[FitProbe], memory_bytes: u64) -> Option<FitBinding> {
    let p = smallest_too_large(probes)?;
    Some(if p.allocated_needed > memory_bytes { FitBinding::Allocated } else { FitBinding::Reserved })
}

/// Where the line through the two probes nearest the bracket crosses the memory limit, aiming
/// just below it so that the next probe is likely to fit; `None` when the probes give no slope.
fn secant(probes: &[FitProbe], limit: u64, lo: i64, hi: i64) -> Option<i64> {
    let mut near: Vec<&FitProbe> = probes.iter().filter(|p| p.value >= lo && p.value <= hi).collect();
    if near.len() < 2 {
        near = probes.iter().rev().take(2).collect();
    }
    near.sort_by_key(|p| p.value);
    let (a, b) = (near.first()?, near.last()?);
    if b.value == a.value || b.needed <= a.needed {
        // No slope yet (or flat): grow geometrically while nothing failed.
        return (hi > lo.saturating_mul(2)).then(|| lo.saturating_mul(4));
    }
    let slope = (b.needed - a.needed) as f64 / (b.value - a.value) as f64;
    let v = b.value as f64 + (limit as f64 - b.needed as f64) / slope;
    v.is_finite().then(|| v.floor().clamp(i64::MIN as f64, i64::MAX as f64) as i64)
}

/// A memory size from a command line (`24GiB`, `16000MiB`, `40GB`, bytes): the libtorch-free
/// layer's parser, shared with the `watch` command's sizes.
pub use gpu_mem_track_log::units::parse_memory_size;

/// The device a search judges against: `profile` with its memory replaced by `memory_bytes` when
/// given (`--gpu-mem 24GiB`).
pub fn budget(profile: &DeviceProfile, memory_bytes: Option<u64>) -> DeviceProfile {
    DeviceProfile { memory_bytes: memory_bytes.unwrap_or(profile.memory_bytes), ..profile.clone() }
}

/// A run that fails at a size above 1 (a model with a fixed context length, say) names the size
/// and how to stay below it.
fn beyond_the_model(e: Error, value: i64) -> Error {
    match e {
        Error::Input(m) if value > 1 => Error::Input(format!(
            "{m} (the search tried {value}; a maximum for the search keeps it below what the model can take)"
        )),
        e => e,
    }
}

/// The prediction for one run's trace on `profile`, per rank when `parallelism` is given.
fn judge(
    trace: &gpu_mem_track_log::Trace,
    optimizer: Optimizer,
    profile: &DeviceProfile,
    parallelism: Option<&Parallelism>,
) -> GpuPrediction {
    let config = gpu_mem_track_gpu::profile::WorkspaceEnv::read().cublas_config;
    match parallelism {
        Some(p) => predict(profile, &per_rank_trace(trace, optimizer, p).0, config.as_deref()),
        None => predict(profile, trace, config.as_deref()),
    }
}

/// The largest batch (or sequence) of a TorchScript model that fits `profile`, for the mode of
/// `options` (inference, or training steps with its optimizer). The varied dimension of
/// `options.input_shape` is ignored.
///
/// ```no_run
/// # use gpu_mem_track_estimate::{*, fit::*, profile::DeviceProfile};
/// let options = EstimateOptions { input_shape: vec![1, 3, 224, 224], mode: Mode::Train(Optimizer::Sgd), ..Default::default() };
/// let gpu = budget(&DeviceProfile::find("rtx4090")?, None);
/// let r = fit_torchscript("resnet50.pt".as_ref(), &options, FitDimension::Batch, &gpu, None, 4096, |_| {})?;
/// println!("largest batch: {:?}", r.largest);
/// # Ok::<(), gpu_mem_track_estimate::Error>(())
/// ```
///
/// # Errors
/// As [`estimate_torchscript_traced`](crate::torchscript::estimate_torchscript_traced), and for a shape without
/// the varied dimension.
pub fn fit_torchscript(
    path: &Path,
    options: &EstimateOptions,
    dimension: FitDimension,
    profile: &DeviceProfile,
    parallelism: Option<&Parallelism>,
    max: i64,
    on_probe: impl FnMut(&FitProbe),
) -> Result<FitResult> {
    with_dimension(dimension, &options.input_shape, 1)?;
    let optimizer = match options.mode {
        Mode::Train(o) => o,
        Mode::Inference => Optimizer::Sgd,
    };
    ffi::meta_target_device(profile.compute_capability);
    search_largest(
        dimension,
        max,
        |v| {
            let o = EstimateOptions {
                input_shape: with_dimension(dimension, &options.input_shape, v)?,
                ..options.clone()
            };
            let trace = torchscript_trace(path, &o).map_err(|e| beyond_the_model(e, v))?;
            Ok(judge(&trace, optimizer, profile, parallelism))
        },
        on_probe,
    )
}

#[cfg(feature = "tch")]
/// As [`fit_torchscript`] for a tch model's training step ([`training_step`]): the
/// varied dimension is set in both the input and the target shape.
///
/// # Errors
/// As [`training_step`], and for a shape without the varied dimension.
pub fn fit_training_step<M>(
    build: impl Fn(&tch::nn::Path) -> M,
    loss: impl Fn(&M, &tch::Tensor, &tch::Tensor) -> tch::Tensor,
    options: &TchStepOptions,
    dimension: FitDimension,
    profile: &DeviceProfile,
    max: i64,
    on_probe: impl FnMut(&FitProbe),
) -> Result<FitResult> {
    with_dimension(dimension, &options.input_shape, 1)?;
    ffi::meta_target_device(profile.compute_capability);
    search_largest(
        dimension,
        max,
        |v| {
            let o = TchStepOptions {
                input_shape: with_dimension(dimension, &options.input_shape, v)?,
                target_shape: with_dimension(dimension, &options.target_shape, v)
                    .unwrap_or(options.target_shape.clone()),
                ..options.clone()
            };
            let (_, trace) = training_step(&build, &loss, &o).map_err(|e| beyond_the_model(e, v))?;
            Ok(judge(&trace, options.optimizer, profile, None))
        },
        on_probe,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mem_track_gpu::profile::Range;

    const GIB: u64 = 1 << 30;

    /// A prediction needing `base + per * v` bytes on a 24 GiB device.
    fn linear(base: u64, per: u64) -> impl FnMut(i64) -> Result<GpuPrediction> {
        move |v| {
            let needed = base + per * v as u64;
            let r = Range { low: needed, high: needed };
            Ok(GpuPrediction {
                profile: DeviceProfile {
                    name: "t".into(),
                    memory_bytes: 24 * GIB,
                    compute_capability: (8, 9),
                    context_bytes: 0,
                    nccl_communicator_bytes: 0,
                },
                cublas_workspace: 0,
                cudnn_workspace_max: 0,
                baseline_allocated: 0,
                peak_allocated: r,
                peak_delta: r,
                peak_reserved: r,
                communicators: 0,
                communication_bytes: 0,
                nvidia_smi: r,
                fits: needed <= 24 * GIB,
                usable_bytes: 24 * GIB,
                first_oom: None,
            })
        }
    }

    #[test]
    fn the_search_finds_the_exact_largest_size_in_few_probes() {
        // 1 GiB + 100 MiB per sample: (24 GiB - 1 GiB) / 100 MiB = 235.52 -> 235.
        let r = search_largest(FitDimension::Batch, 100_000, linear(GIB, 100 << 20), |_| {}).unwrap();
        assert_eq!(r.largest, Some(235));
        assert!(!r.reached_max);
        assert!(r.probes.len() <= 6, "{:?}", r.probes);
        // Every probe above the answer failed, every one at or below fitted.
        assert!(r.probes.iter().all(|p| p.fits == (p.value <= 235)));
    }

    #[test]
    fn the_figure_that_binds_is_the_one_above_the_device() {
        // 1 GiB + 100 MiB per sample allocated; reserved 8 GiB more (fragmentation, say): the
        // allocated figure alone would take 235, the reserved one binds at 154.
        let mut fragmented = {
            let mut lin = linear(GIB, 100 << 20);
            move |v: i64| {
                let mut g = lin(v)?;
                let reserved = g.peak_allocated.high + 8 * GIB;
                g.peak_reserved = Range { low: reserved, high: reserved };
                g.nvidia_smi = g.peak_reserved;
                g.fits = reserved <= 24 * GIB;
                Ok(g)
            }
        };
        let r = search_largest(FitDimension::Batch, 100_000, &mut fragmented, |_| {}).unwrap();
        assert_eq!((r.largest, r.binds), (Some(153), Some(FitBinding::Reserved)));
        let r = search_largest(FitDimension::Batch, 100_000, linear(GIB, 100 << 20), |_| {}).unwrap();
        assert_eq!((r.largest, r.binds), (Some(235), Some(FitBinding::Allocated)));
        // The context counts with the allocated figure.
        let mut with_context = {
            let mut lin = linear(GIB, 100 << 20);
            move |v: i64| {
                let mut g = lin(v)?;
                g.profile.context_bytes = GIB / 2;
                g.nvidia_smi = Range { low: g.nvidia_smi.low + GIB / 2, high: g.nvidia_smi.high + GIB / 2 };
                g.fits = g.nvidia_smi.high <= 24 * GIB;
                Ok(g)
            }
        };
        let r = search_largest(FitDimension::Batch, 100_000, &mut with_context, |_| {}).unwrap();
        assert_eq!((r.largest, r.binds), (Some(230), Some(FitBinding::Allocated)));
        let all = search_largest(FitDimension::Batch, 64, linear(GIB, 1), |_| {}).unwrap();
        assert_eq!(all.binds, None);
        let none = search_largest(FitDimension::Batch, 1000, linear(30 * GIB, 1), |_| {}).unwrap();
        assert_eq!(none.binds, Some(FitBinding::Allocated));
    }

    #[test]
    fn nothing_fits_and_everything_fits_are_said() {
        let none = search_largest(FitDimension::Batch, 1000, linear(30 * GIB, 1), |_| {}).unwrap();
        assert_eq!((none.largest, none.probes.len()), (None, 1));
        let all = search_largest(FitDimension::Batch, 64, linear(GIB, 1), |_| {}).unwrap();
        assert_eq!(all.largest, Some(64));
        assert!(all.reached_max);
        assert!(search_largest(FitDimension::Batch, 0, linear(GIB, 1), |_| {}).is_err());
    }

    #[test]
    fn superlinear_growth_still_converges() {
        // Quadratic in the sequence: 1 KiB * v^2 -> floor(sqrt(24 GiB / 1 KiB)) = floor(5016.6) = 5016.
        let mut quad = {
            let mut lin = linear(0, 0);
            move |v: i64| {
                let mut g = lin(v)?;
                let needed = 1024 * (v as u64) * (v as u64);
                g.nvidia_smi = Range { low: needed, high: needed };
                g.fits = needed <= 24 * GIB;
                Ok(g)
            }
        };
        let r = search_largest(FitDimension::Seq, 1 << 20, &mut quad, |_| {}).unwrap();
        assert_eq!(r.largest, Some(5016));
        assert!(r.probes.len() <= 30, "{}", r.probes.len());
    }

    #[test]
    fn the_varied_dimension_must_exist() {
        assert_eq!(with_dimension(FitDimension::Seq, &[4, 128], 512).unwrap(), vec![4, 512]);
        let e = with_dimension(FitDimension::Seq, &[4], 512).unwrap_err().to_string();
        assert!(e.contains("no sequence dimension (varying `seq`"), "{e}");
    }
}
