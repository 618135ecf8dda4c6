//! GPU device profiles and what a run would show on one: the run's trace replayed through the
//! caching allocator model with the GPU libraries' own allocations in it (the cuBLAS and cuBLASLt
//! workspaces at the first matmul of each thread, kept; a bounded cuDNN workspace at each
//! convolution, reported as a range), and
//! the CUDA context and library handles that nvidia-smi shows on top of `reserved`. A run that
//! does not fit is replayed again against the memory the allocator can have (the device's, less
//! the context) to name the allocation where PyTorch would raise `torch.OutOfMemoryError`.
use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::cuda_libraries;
use crate::device_replay::{replay_on_device, replay_with_runtime, FirstOom, GpuReplay};
use crate::error::{Error, Result};
use crate::runtime::{place_runtime_allocations, RuntimeAllocation, RuntimeKind, RuntimeSizes};
use gpu_mem_track_log::Trace;

const MIB: u64 = 1 << 20;
#[cfg(test)]
const GIB: u64 = 1 << 30;
/// What a training step on the H100 held beyond its reserved memory (see [`DeviceProfile::presets`]).
const MEASURED_CONTEXT_MIB: u64 = 758;

/// A GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// Short name (`a100-80g`).
    pub name: String,
    /// The memory CUDA gives processes on the device, in bytes: `cudaMemGetInfo`'s total, which
    /// PyTorch reports as `total_memory` and in its out-of-memory message ("a total capacity of
    /// 79.18 GiB" on an H100 80GB HBM3). It is less than the memory installed (nvidia-smi's
    /// `Total`) by what the driver reserves for itself.
    pub memory_bytes: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Memory nvidia-smi shows a training process holding beyond PyTorch's reserved memory: the
    /// CUDA context, the kernels loaded, the cuBLAS and cuDNN handles. A per-device constant; see
    /// [`DeviceProfile::presets`] for where each comes from.
    pub context_bytes: u64,
    /// GPU memory one NCCL communicator holds outside the caching allocator (its channels'
    /// send and receive buffers), which nvidia-smi shows: a documented figure until a GPU measures
    /// it (see [`NCCL_COMMUNICATOR_BYTES`]). A profile file may leave it out.
    #[serde(default = "nccl_communicator_bytes")]
    pub nccl_communicator_bytes: u64,
}

/// The NCCL communicator's buffers, from NCCL's defaults rather than a measurement: 16 channels
/// (what NCCL opens on an 8-GPU NVLink node), each with a ring and a tree connection to receive
/// on, each connection with the buffers of NCCL's three protocols: Simple (`NCCL_BUFFSIZE`, 4 MiB),
/// LL (512 KiB) and LL128 (4 800 KiB). 294 MiB. Fewer channels (PCIe, 2 GPUs) take less; NVLS and
/// CollNet, more.
pub const NCCL_COMMUNICATOR_BYTES: u64 = 16 * 2 * ((4 << 20) + (512 << 10) + (4800 << 10));

fn nccl_communicator_bytes() -> u64 {
    NCCL_COMMUNICATOR_BYTES
}

impl DeviceProfile {
    /// The built-in profiles. Their memory is what CUDA gives a process on that GPU, as PyTorch
    /// reports it on Linux (it moves by up to 0.3 GiB with the driver): measured by this project
    /// on the H100 (driver for CUDA 13.0), and for the others the figure public `total_memory`
    /// print-outs and out-of-memory messages of that GPU agree on.
    ///
    /// Their context: measured on the H100 (torch 2.11, CUDA 13.0, 2026-11-27), where a training
    /// step with convolutions and matmuls held 758 MiB beyond its reserved memory from its second
    /// step on, 518 MiB of it before any tensor (the CUDA context) and 240 MiB once cuBLAS and
    /// cuDNN had loaded; the other GPUs: their context before any tensor with the same 240 MiB.
    pub fn presets() -> Vec<DeviceProfile> {
        let p = |name: &str, mib: u64, cc: (u32, u32), ctx_mib: u64| DeviceProfile {
            name: name.into(),
            memory_bytes: mib * MIB,
            compute_capability: cc,
            context_bytes: ctx_mib * MIB,
            nccl_communicator_bytes: NCCL_COMMUNICATOR_BYTES,
        };
        vec![
            p("a100-80g", 81_158, (8, 0), 760), // 79.26 GiB (SXM4; PCIe 79.14-79.15)
            p("a100-40g", 40_339, (8, 0), 760), // 39.39 GiB (SXM4; PCIe 39.38)
            p("h100-80g", 81_079, (9, 0), MEASURED_CONTEXT_MIB), // 79.18 GiB, H100 80GB HBM3 (SXM), measured
            p("h200", 143_156, (9, 0), MEASURED_CONTEXT_MIB), // 139.80 GiB
            p("rtx4090", 24_207, (8, 9), 660),  // 23.64 GiB
            p("rtx3090", 24_259, (8, 6), 640),  // 23.69 GiB
            p("l40s", 45_373, (8, 9), 660),     // 44.31 GiB
            p("l4", 22_518, (8, 9), 660),       // 21.99 GiB
            p("a10g", 22_587, (8, 6), 640),     // 22.06 GiB
            p("t4", 15_095, (7, 5), 620),       // 14.74 GiB
            p("v100-32g", 32_510, (7, 0), 640), // 31.75 GiB
        ]
    }

    /// A preset by name (case-insensitive), or a profile from a JSON file with the fields of this
    /// struct (`compute_capability` as `[8, 0]`).
    ///
    /// # Errors
    /// [`Error::Profile`] naming the unknown profile or the unreadable file.
    pub fn find(name_or_path: &str) -> Result<DeviceProfile> {
        let lower = name_or_path.to_ascii_lowercase();
        if lower == AUTO {
            return Ok(Self::auto());
        }
        if let Some(p) = Self::presets().into_iter().find(|p| p.name == lower) {
            return Ok(p);
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::Profile(format!("cannot read profile {}: {e}", path.display())))?;
            return serde_json::from_str(&text)
                .map_err(|e| Error::Profile(format!("profile {}: {e}", path.display())));
        }
        let names: Vec<String> = Self::presets().into_iter().map(|p| p.name).collect();
        Err(Error::Profile(format!(
            "unknown device profile {name_or_path:?} (presets: {}; or a .json file)",
            names.join(", ")
        )))
    }

    /// The cuBLAS workspace PyTorch allocates per handle and stream (one for a single-stream
    /// program): `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT` pairs, summed) when set, else 32 MiB
    /// on Hopper (sm 9.0) and `:4096:2:16:8` (8 MiB + 128 KiB) elsewhere
    /// (`CublasHandlePool.cpp`, `parseChosenWorkspaceSize`). cuBLASLt's own workspace is apart
    /// from it unless `TORCH_CUBLASLT_UNIFIED_WORKSPACE=1` (`getCUDABlasLtWorkspace`); see
    /// [`runtime`](crate::runtime) for when it is taken.
    pub fn cublas_workspace_bytes(&self, workspace_config: Option<&str>) -> u64 {
        cuda_libraries::cublas_workspace_bytes(self.compute_capability, workspace_config)
    }

    /// The cuBLAS and cuBLASLt workspaces this GPU takes under `env`; with the high-end cuDNN
    /// workspace at each convolution when `cudnn_workspaces`.
    pub fn runtime_sizes(&self, env: &WorkspaceEnv, cudnn_workspaces: bool) -> RuntimeSizes {
        RuntimeSizes {
            cublas_workspace: env.cublas_workspace(self.compute_capability),
            cublaslt_workspace: env.cublaslt_workspace(),
            cudnn_workspaces,
        }
    }
}

pub use cuda_libraries::{cublaslt_workspace_bytes, WorkspaceEnv};

/// The profile name that stands for the first GPU CUDA shows this process (else [`FALLBACK`]): the command
/// line's default.
pub const AUTO: &str = "auto";

/// The profile `auto` gives on a machine without a GPU.
pub const FALLBACK: &str = "rtx4090";

impl DeviceProfile {
    /// The first GPU CUDA shows this process (`cuda:0`), as NVML describes it (name, memory,
    /// compute capability; the context reserve of the preset of the same compute capability, else
    /// 500 MiB); without one, the [`FALLBACK`] preset. Read through NVML, so no libtorch is needed:
    /// a GPU machine with a CPU-only libtorch gets its GPU.
    pub fn auto() -> DeviceProfile {
        let fallback = || Self::find(FALLBACK).expect("the fallback is a preset");
        if !cuda_shows_a_device(std::env::var("CUDA_VISIBLE_DEVICES").ok().as_deref()) {
            return fallback();
        }
        let Ok(gpu) = gpu_mem_track_log::nvml::NvmlReader::open().and_then(|n| n.describe(0)) else {
            return fallback();
        };
        let context_bytes = Self::presets()
            .into_iter()
            .find(|p| p.compute_capability == gpu.compute_capability)
            .map_or(MEASURED_CONTEXT_MIB * MIB, |p| p.context_bytes); // a GPU no preset shares: the H100's
        DeviceProfile {
            name: gpu.name.to_ascii_lowercase(),
            memory_bytes: gpu.usable_bytes(),
            compute_capability: gpu.compute_capability,
            context_bytes,
            nccl_communicator_bytes: NCCL_COMMUNICATOR_BYTES,
        }
    }
}

/// Whether CUDA shows this process a device under `CUDA_VISIBLE_DEVICES` (`None`: unset, every
/// device): CUDA reads the list up to its first invalid entry, so a first entry that is neither an
/// index nor a `GPU-`/`MIG-` UUID (`""`, `-1`, SLURM's `NoDevFiles`) hides them all.
fn cuda_shows_a_device(visible: Option<&str>) -> bool {
    let Some(list) = visible else { return true };
    let first = list.split(',').next().unwrap_or("").trim();
    first.parse::<u32>().is_ok() || first.starts_with("GPU-") || first.starts_with("MIG-")
}

/// A prediction that cannot be exact: the bounds, and what the gap is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    /// Without the uncertain term.
    pub low: u64,
    /// With its largest plausible value.
    pub high: u64,
}

impl Range {
    /// How far a figure a GPU measured lies outside this prediction of it, in % of the measured
    /// figure; both 0 when it lies inside (or the measurement is 0).
    pub fn miss(&self, measured: u64) -> Miss {
        let pct = |gap: u64| if measured == 0 { 0.0 } else { gap as f64 / measured as f64 * 100.0 };
        Miss { above: pct(measured.saturating_sub(self.high)), below: pct(self.low.saturating_sub(measured)) }
    }
}

/// How far a measurement lies outside a predicted [`Range`], in % of the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Miss {
    /// Above the high end: the prediction was under the GPU, the side that tells a user a run
    /// fits when it does not.
    pub above: f64,
    /// Below the low end: the prediction was over the GPU.
    pub below: f64,
}

impl Miss {
    /// The larger of the two (one of them is always 0).
    pub fn either(&self) -> f64 {
        self.above.max(self.below)
    }
}

/// What a GPU of a profile would show for an estimated run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPrediction {
    /// The profile used.
    pub profile: DeviceProfile,
    /// cuBLAS workspace placed at the first matmul of each thread (0 when the model has none).
    pub cublas_workspace: u64,
    /// The largest cuDNN workspace the high end places at a convolution (0 without any).
    pub cudnn_workspace_max: u64,
    /// `torch.cuda.memory_allocated()` once parameters, buffers and input are loaded, as the
    /// allocator rounds them into blocks.
    pub baseline_allocated: u64,
    /// `torch.cuda.max_memory_allocated()`: without and with the cuDNN workspaces.
    pub peak_allocated: Range,
    /// `max_memory_allocated() - baseline_allocated`: what the run adds to the loaded model.
    pub peak_delta: Range,
    /// `torch.cuda.max_memory_reserved()`.
    pub peak_reserved: Range,
    /// The NCCL communicators this rank holds (the trace's; 0 for a single process).
    pub communicators: u32,
    /// Their buffers (`communicators` times the profile's figure for one): GPU memory outside the
    /// caching allocator.
    pub communication_bytes: u64,
    /// What nvidia-smi would show: reserved plus the profile's context constant and the
    /// communicators' buffers.
    pub nvidia_smi: Range,
    /// Whether the high end fits the device.
    pub fits: bool,
    /// Memory the caching allocator can reserve: the device's less the context constant and the
    /// communicators' buffers.
    pub usable_bytes: u64,
    /// When the run does not fit: the first allocation the caching allocator cannot place within
    /// `usable_bytes` even after releasing its cache and retrying, as PyTorch does - where a GPU
    /// run would raise `torch.OutOfMemoryError` (replayed with the high end's cuDNN workspaces,
    /// each left out where it cannot be placed, as cuDNN then picks an engine needing less).
    /// `None` when it fits, and when `fits` is false only because the cache is kept: every
    /// allocation is placed once cached segments are released under pressure.
    pub first_oom: Option<FirstOom>,
}

/// Replays a run's trace on a GPU of `profile`: the cuBLAS and cuBLASLt workspaces at the first
/// matmul of each thread (`CUBLASLT_WORKSPACE_SIZE` and `TORCH_CUBLASLT_UNIFIED_WORKSPACE` are read
/// from the environment, see [`cublaslt_workspace_bytes`]), and for
/// the high end a cuDNN workspace at each convolution, go through the caching allocator model with
/// every tensor (see [`runtime`](crate::runtime) for each rule and its PyTorch source).
/// `workspace_config` is `CUBLAS_WORKSPACE_CONFIG`.
pub fn predict(profile: &DeviceProfile, trace: &Trace, workspace_config: Option<&str>) -> GpuPrediction {
    predict_all(std::slice::from_ref(profile), trace, workspace_config).remove(0)
}

/// [`predict`] for several GPUs. The replays depend on a GPU only through its cuBLAS workspace
/// size, which the presets share (4 sizes for 16 GPUs): each size is replayed once.
pub fn predict_all(
    profiles: &[DeviceProfile],
    trace: &Trace,
    workspace_config: Option<&str>,
) -> Vec<GpuPrediction> {
    let mut replays: HashMap<u64, Replays> = HashMap::new();
    let cublaslt_workspace = cuda_libraries::WorkspaceEnv::read().cublaslt_workspace();
    profiles
        .iter()
        .map(|profile| {
            let cublas_workspace = profile.cublas_workspace_bytes(workspace_config);
            let replays = replays.entry(cublas_workspace).or_insert_with(|| {
                Replays::new(
                    trace,
                    RuntimeSizes { cublas_workspace, cublaslt_workspace, cudnn_workspaces: true },
                )
            });
            predict_from(profile, trace, replays)
        })
        .collect()
}

/// A trace replayed with one cuBLAS workspace size: without and with the cuDNN workspaces.
struct Replays {
    high_runtime: Vec<RuntimeAllocation>,
    cublas: u64,
    cudnn_workspace_max: u64,
    low: GpuReplay,
    high: GpuReplay,
}

impl Replays {
    fn new(trace: &Trace, sizes: RuntimeSizes) -> Replays {
        // One placement for the high end; the low end is it without the cuDNN workspaces.
        let high_runtime = place_runtime_allocations(trace, sizes);
        let low_runtime: Vec<_> =
            high_runtime.iter().copied().filter(|r| r.kind != RuntimeKind::CudnnWorkspace).collect();
        let cublas =
            low_runtime.iter().find(|r| r.kind == RuntimeKind::CublasWorkspace).map_or(0, |r| r.bytes);
        let cudnn_workspace_max = high_runtime
            .iter()
            .filter(|r| r.kind == RuntimeKind::CudnnWorkspace)
            .map(|r| r.bytes)
            .max()
            .unwrap_or(0);
        let low = replay_with_runtime(trace, &low_runtime);
        // Without convolutions both ends are the same replay.
        let high = if low_runtime.len() == high_runtime.len() {
            low
        } else {
            replay_with_runtime(trace, &high_runtime)
        };
        Replays { high_runtime, cublas, cudnn_workspace_max, low, high }
    }
}

fn predict_from(profile: &DeviceProfile, trace: &Trace, replays: &Replays) -> GpuPrediction {
    let Replays { high_runtime, cublas, cudnn_workspace_max, low, high } = replays;
    let (cublas, cudnn_workspace_max) = (*cublas, *cudnn_workspace_max);
    // A different placement can, in rare layouts, split blocks differently: keep the range ordered.
    let range = |a: u64, b: u64| Range { low: a.min(b), high: a.max(b) };
    let peak_allocated = range(low.peak_allocated, high.peak_allocated);
    let peak_reserved = range(low.peak_reserved, high.peak_reserved);
    let communication_bytes = u64::from(trace.communicators).saturating_mul(profile.nccl_communicator_bytes);
    let outside = profile.context_bytes.saturating_add(communication_bytes);
    let smi = |r: u64| r.saturating_add(outside);
    let fits = smi(peak_reserved.high) <= profile.memory_bytes;
    let usable_bytes = profile.memory_bytes.saturating_sub(outside);
    // A run that fits never reaches the capacity: the replay would be the high end's again.
    let first_oom = if fits { None } else { replay_on_device(trace, high_runtime, Some(usable_bytes)).1 };
    GpuPrediction {
        profile: profile.clone(),
        cublas_workspace: cublas,
        cudnn_workspace_max,
        baseline_allocated: low.baseline_allocated,
        peak_allocated,
        peak_delta: Range {
            low: peak_allocated.low.saturating_sub(low.baseline_allocated),
            high: peak_allocated.high.saturating_sub(low.baseline_allocated),
        },
        peak_reserved,
        communicators: trace.communicators,
        communication_bytes,
        nvidia_smi: Range { low: smi(peak_reserved.low), high: smi(peak_reserved.high) },
        fits,
        usable_bytes,
        first_oom,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preset_holds_what_cuda_gives_a_process_not_the_memory_installed() {
        // torch.cuda.get_device_properties(0).total_memory on an H100 80GB HBM3 (driver for CUDA
        // 13.0, 2026-11-27): nvidia-smi's 81 559 MiB less the driver's reserve.
        assert_eq!(DeviceProfile::find("h100-80g").unwrap().memory_bytes, 85_017_493_504);
        let gib = |name: &str| DeviceProfile::find(name).unwrap().memory_bytes as f64 / GIB as f64;
        // PyTorch's "a total capacity of ... GiB" on the other GPUs, to its two decimals.
        for (name, total) in [("h200", 139.80), ("a100-80g", 79.26), ("rtx4090", 23.64), ("t4", 14.74)] {
            assert_eq!(format!("{:.2}", gib(name)), format!("{total:.2}"), "{name}");
        }
        for p in DeviceProfile::presets() {
            assert!(p.memory_bytes % MIB == 0 && p.context_bytes < p.memory_bytes / 10, "{p:?}");
        }
    }

    #[test]
    fn cuda_visible_devices_hides_every_device_from_its_first_invalid_entry() {
        for shown in [None, Some("0"), Some("3,1"), Some(" 2 "), Some("GPU-8f2a61c4"), Some("MIG-1c2d")] {
            assert!(cuda_shows_a_device(shown), "{shown:?}");
        }
        for hidden in ["", "-1", "NoDevFiles", "none", ",0"] {
            assert!(!cuda_shows_a_device(Some(hidden)), "{hidden:?}");
        }
    }
    use gpu_mem_track_log::{Category, Phase, TraceEvent};

    fn profile(cc: (u32, u32)) -> DeviceProfile {
        DeviceProfile {
            name: "x".into(),
            memory_bytes: 16 * GIB,
            compute_capability: cc,
            context_bytes: 400 * MIB,
            nccl_communicator_bytes: NCCL_COMMUNICATOR_BYTES,
        }
    }

    #[test]
    fn a_miss_is_measured_in_percent_of_the_measurement_on_the_side_it_lies() {
        let r = Range { low: 90, high: 110 };
        assert_eq!(r.miss(100), Miss { above: 0.0, below: 0.0 });
        assert_eq!(r.miss(110), Miss { above: 0.0, below: 0.0 });
        assert_eq!(r.miss(125), Miss { above: 12.0, below: 0.0 });
        assert_eq!(r.miss(80), Miss { above: 0.0, below: 12.5 });
        assert_eq!(r.miss(80).either(), 12.5);
        assert_eq!(r.miss(0), Miss { above: 0.0, below: 0.0 });
    }

    #[test]
    fn cublas_workspace_follows_the_compute_capability() {
        assert_eq!(profile((9, 0)).cublas_workspace_bytes(None), 32 * MIB, "Hopper: 32 MiB");
        for cc in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (10, 0)] {
            assert_eq!(
                profile(cc).cublas_workspace_bytes(None),
                8 * MIB + 128 * 1024,
                "{cc:?}: :4096:2:16:8"
            );
        }
    }

    #[test]
    fn cublas_workspace_config_overrides_the_profiles_default() {
        // The rules themselves: gpu_mem_track_gpu::cuda_libraries.
        assert_eq!(profile((8, 0)).cublas_workspace_bytes(Some(":4096:8")), 32 * MIB);
        assert_eq!(profile((9, 0)).cublas_workspace_bytes(Some(":16:8")), 128 * 1024);
    }

    fn event(alloc: bool, id: i64, bytes: u64, phase: Phase, op: &str) -> TraceEvent {
        TraceEvent {
            alloc,
            id,
            size: bytes,
            phase,
            iteration: 1,
            op: op.into(),
            top_op: op.into(),
            category: Category::Unknown,
        }
    }

    #[test]
    fn prediction_replays_the_workspaces_and_adds_the_context() {
        let p = profile((8, 0));
        // Parameters 4 MiB; a convolution output of 30 MiB while the 4 MiB input is live; then a
        // small classifier matmul.
        let trace = Trace {
            events: vec![
                event(true, 1, 4 * MIB, Phase::Load, "aten::empty"),
                event(true, 2, 4 * MIB, Phase::Input, "aten::empty"),
                event(true, 3, 30 * MIB, Phase::Forward, "aten::convolution_overrideable"),
                event(false, 2, 4 * MIB, Phase::Forward, "aten::relu"),
                event(true, 4, 4096, Phase::Forward, "aten::addmm"),
            ],
            ..Trace::default()
        };
        let g = predict(&p, &trace, None);
        let ws = 8 * MIB + 128 * 1024;
        assert_eq!(g.cublas_workspace, ws);
        assert_eq!(g.cudnn_workspace_max, 30 * MIB);
        assert_eq!(g.baseline_allocated, 8 * MIB);
        // Low: 38 MiB at the convolution; the workspaces come when 34 MiB are live (34 + 8.1 of
        // cuBLAS + 1 of cuBLASLt).
        assert_eq!(g.peak_allocated.low, 34 * MIB + 4096 + ws + MIB);
        // High: a 30 MiB workspace inside the convolution: 68 MiB.
        assert_eq!(g.peak_allocated.high, 68 * MIB);
        assert_eq!(g.peak_delta.high, 60 * MIB);
        assert!(g.nvidia_smi.low >= g.peak_reserved.low + 400 * MIB);
        assert!(g.fits);
        assert_eq!((g.usable_bytes, g.first_oom.as_ref()), (16 * GIB - 400 * MIB, None));
        // A rank holding 3 NCCL communicators: nvidia-smi shows their buffers too, and the caching
        // allocator has that much less to reserve.
        let ranked = predict(&p, &Trace { communicators: 3, ..trace.clone() }, None);
        assert_eq!(ranked.communication_bytes, 3 * NCCL_COMMUNICATOR_BYTES);
        assert_eq!(ranked.nvidia_smi.high, g.nvidia_smi.high + 3 * NCCL_COMMUNICATOR_BYTES);
        assert_eq!(ranked.usable_bytes, g.usable_bytes - 3 * NCCL_COMMUNICATOR_BYTES);
        assert_eq!(NCCL_COMMUNICATOR_BYTES, 294 * MIB);
        // 50 MiB usable: 20 MiB (parameters, input) + 30 MiB (convolution) segments; the 30 MiB
        // cuDNN workspace is left out (a smaller engine runs); the matmul's 4 KiB output needs a
        // 2 MiB small-pool segment that nothing cached can make room for.
        let tight = DeviceProfile { memory_bytes: 450 * MIB, ..p.clone() };
        let g = predict(&tight, &trace, None);
        assert!(!g.fits);
        let oom = g.first_oom.expect("an OOM at the matmul");
        assert_eq!((oom.op.as_str(), oom.phase, oom.iteration), ("aten::addmm", Phase::Forward, 1));
        assert_eq!((oom.requested, oom.segment, oom.short_by), (4096, 2 * MIB, 2 * MIB));
        assert_eq!((oom.capacity, oom.reserved_after_retry), (50 * MIB, 50 * MIB));
        // 60 MiB usable: the high end's reserved peak (82 MiB, the workspace kept cached) is above
        // it, but every allocation is placed: not fitting is not an OOM.
        let g = predict(&DeviceProfile { memory_bytes: 460 * MIB, ..p.clone() }, &trace, None);
        assert!(!g.fits && g.peak_reserved.high == 82 * MIB);
        assert_eq!(g.first_oom, None);
        let no_matmul = Trace { events: trace.events[..4].to_vec(), ..Trace::default() };
        assert_eq!(predict(&p, &no_matmul, None).cublas_workspace, 0);
    }

    #[test]
    fn profiles_come_from_presets_or_json_files() {
        assert_eq!(DeviceProfile::find("A100-80G").unwrap().compute_capability, (8, 0));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("mine.json");
        std::fs::write(
            &f,
            r#"{"name":"mine","memory_bytes":1000,"compute_capability":[9,0],"context_bytes":5}"#,
        )
        .unwrap();
        let mine = DeviceProfile::find(f.to_str().unwrap()).unwrap();
        assert_eq!((mine.memory_bytes, mine.nccl_communicator_bytes), (1000, NCCL_COMMUNICATOR_BYTES));
        let e = DeviceProfile::find("gtx9000").unwrap_err().to_string();
        assert!(e.contains("gtx9000") && e.contains("a100-80g"), "{e}");
    }
}
