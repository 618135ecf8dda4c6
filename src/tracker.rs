//! [`MemTracker`]: registry walk, diff, log line, per track point.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::attribution;
use crate::device::{AllocatorCounters, AllocatorReading, DeviceKind, TrackedDevice, DEVICE_READING_MAX_AGE};
use crate::error::{Error, Result};
use crate::ffi::{self, RegistryWalk};
use crate::history::{self, History, HistoryOptions};
use crate::oom::{OomParts, OomSink, OomSubscriber};
use crate::sampler::{DeviceSource, SampledPeak, Sampler};
use crate::site::Site;
use crate::walk::{self, GroupKey, GroupTotals, TensorInfo, Walk};
use gpu_mem_track_gpu::cuda_libraries;
use gpu_mem_track_log::diff::{diff_groups, GroupChange, ViewLines};
use gpu_mem_track_log::log::format::{self, MIB};
use gpu_mem_track_log::log::writer::{launcher_rank, log_file_stem, validate_prefix, TIMESTAMP_FORMAT};
use gpu_mem_track_log::log::{
    AtLine, GroupLine, LogHeader, LogWriter, MemoryField, SourceLocation, TrackFigures, ALLOCATED,
    TENSOR_USED,
};
use gpu_mem_track_log::nvml::{self, NvmlReader, NvmlReading};
use gpu_mem_track_log::reading_cache::ReadingCache;

/// Default log folder, created when missing.
pub const DEFAULT_LOG_DIR: &str = "logs";

/// Configures a [`MemTracker`].
#[derive(Debug, Clone)]
pub struct MemTrackerBuilder {
    device: Option<TrackedDevice>,
    log_dir: Option<PathBuf>,
    detail: bool,
    prefix: String,
    nvml: bool,
    sample_every: Option<Duration>,
    op_names: bool,
    views: ViewLines,
    cpu_memory_limit: Option<u64>,
    rank: Option<u32>,
}

impl Default for MemTrackerBuilder {
    fn default() -> Self {
        MemTrackerBuilder {
            device: None,
            log_dir: None,
            detail: true,
            prefix: String::new(),
            nvml: true,
            sample_every: None,
            op_names: false,
            views: ViewLines::Folded,
            cpu_memory_limit: None,
            rank: None,
        }
    }
}

impl MemTrackerBuilder {
    /// The device to watch (default: `cuda:0` when available, else `cpu`).
    pub fn device(mut self, device: TrackedDevice) -> Self {
        self.device = Some(device);
        self
    }

    /// The folder for log files. It must exist; only the default `logs/` is created.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Print `+`/`-` tensor-group lines (default on). Off: only `At` lines.
    pub fn detail(mut self, on: bool) -> Self {
        self.detail = on;
        self
    }

    /// Print views (tensors whose storage another tensor owns: `.t()`, `.view(..)`, a flattened
    /// activation) as lines of their own, `Memory: 0.0 M`, as Pytorch-Memory-Utils does. Off by
    /// default: a view adds no memory, so it is counted on its storage owner's line instead
    /// (` | (+2 views)`), and a view that comes or goes alone prints nothing.
    pub fn detail_views(mut self, on: bool) -> Self {
        self.views = if on { ViewLines::Separate } else { ViewLines::Folded };
        self
    }

    /// The rank of this process in a distributed job, for the log's name (default: what the
    /// launcher set in `RANK`, `SLURM_PROCID` or `LOCAL_RANK`, else none). The Python package
    /// passes `torch.distributed`'s rank once it is initialised.
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }

    /// Text put before the timestamp in the file name (letters, digits, `-`, `_`, `.`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Read NVML when tracking a CUDA device (default on).
    pub fn nvml(mut self, on: bool) -> Self {
        self.nvml = on;
        self
    }

    /// Starts a background thread that samples the allocator (and NVML on CUDA) every `interval`
    /// and reports the maximum between two track points (` Peak NVML Used Memory` on the `At`
    /// line; [`TrackPoint::sampled`]). Off by default; costs nothing when off.
    pub fn sample_every(mut self, interval: Duration) -> Self {
        self.sample_every = Some(interval);
        self
    }

    /// Groups `+`/`-` lines by the op that made the tensors too, and names it as the line's last
    /// column (`... | torch.float32 | aten::convolution`). Off by default, so default logs stay
    /// byte-compatible with Pytorch-Memory-Utils; `report` reads both.
    pub fn op_names(mut self, on: bool) -> Self {
        self.op_names = on;
        self
    }

    /// Makes the wrapped CPU allocator refuse any allocation that would take the live CPU bytes
    /// past `bytes`, with the error c10's CPU allocator raises when memory runs out
    /// (`c10::OutOfMemoryError`, "DefaultCPUAllocator: not enough memory: ..."), after writing the
    /// out-of-memory block and snapshot: reproduce a GPU's out-of-memory on a laptop. CPU
    /// trackers only; the limit is process-wide (the allocator is) and goes when this tracker is
    /// dropped.
    pub fn cpu_memory_limit(mut self, bytes: u64) -> Self {
        self.cpu_memory_limit = Some(bytes);
        self
    }

    /// Installs the registry and allocator hooks, creates the log file and writes its header.
    /// The file is `<prefix><timestamp>-<device>[-rank<R>]-gpu_mem_track.txt`; the rank is
    /// [`rank`](Self::rank)'s, else from `RANK`, `SLURM_PROCID` or `LOCAL_RANK` when a launcher
    /// set them.
    ///
    /// # Errors
    /// [`LogError::InvalidPrefix`](gpu_mem_track_log::Error::InvalidPrefix) (inside [`Error::Log`]);
    /// [`Error::CudaUnavailable`] / [`Error::NoSuchCudaDevice`] for a CUDA device this process
    /// cannot use; [`LogError::LogDirMissing`](gpu_mem_track_log::Error::LogDirMissing),
    /// `LogDirNotADirectory`, `LogDirUnwritable` for the log folder;
    /// [`Error::Libtorch`] if the hooks cannot be installed; [`Error::InvalidOption`] for a
    /// `cpu_memory_limit` on a CUDA tracker.
    pub fn build(self) -> Result<MemTracker> {
        validate_prefix(&self.prefix)?;
        let device = self.device.unwrap_or_else(TrackedDevice::default_for_this_machine);
        device.check_available()?;
        if self.cpu_memory_limit.is_some() && device != TrackedDevice::Cpu {
            return Err(Error::InvalidOption {
                option: "cpu_memory_limit",
                reason: format!("limits the CPU allocator; this tracker watches {device}"),
            });
        }
        ffi::install()?;
        let dir = match self.log_dir {
            Some(d) => d,
            None => {
                let d = PathBuf::from(DEFAULT_LOG_DIR);
                std::fs::create_dir_all(&d).map_err(|source| gpu_mem_track_log::Error::LogDirUnwritable {
                    path: d.clone(),
                    source,
                })?;
                d
            }
        };
        let timestamp = chrono::Local::now().format(TIMESTAMP_FORMAT).to_string();
        let stem =
            log_file_stem(&self.prefix, &timestamp, &device.file_tag(), self.rank.or_else(launcher_rank));
        let open_nvml = || match (device, self.nvml) {
            (TrackedDevice::Cuda(_), true) => NvmlReader::open().map_err(|e| nvml::warn_once(&e)).ok(),
            _ => None,
        };
        let nvml = open_nvml();
        let sampler = match self.sample_every {
            Some(interval) => Some(
                Sampler::start(DeviceSource::new(device, open_nvml()), interval)
                    .map_err(|source| Error::SamplerStart { source })?,
            ),
            None => None,
        };
        let mut allocator = AllocatorCounters::for_device(device);
        let mut raw = RegistryWalk::new()?;
        // The walks tell a CUDA library's workspace from a tensor of its size by these.
        let workspace_sizes = match device {
            TrackedDevice::Cuda(_) => cuda_libraries::workspace_sizes_from_env(),
            TrackedDevice::Cpu => Vec::new(),
        };
        raw.watch_storage_sizes(&workspace_sizes);
        let (filter_kind, filter_index) = device.shim_filter();
        // The header's total only: no groups, no record per tensor.
        let (_, totals) = raw.take_grouped(filter_kind, filter_index, false)?;
        let reading = allocator.read(Instant::now())?;
        let header = LogHeader {
            timestamp,
            fields: vec![
                MemoryField::from_bytes(TENSOR_USED, totals.tensor_bytes),
                MemoryField::from_bytes(ALLOCATED, reading.allocated),
            ],
        };
        let writer = LogWriter::create_with_header(&dir, &stem, &header)?;
        let log_path = writer.path().to_owned();
        let state = Arc::new(Mutex::new(State {
            raw,
            previous: FxHashMap::default(),
            writer,
            allocator,
            nvml,
            nvml_cache: ReadingCache::new(DEVICE_READING_MAX_AGE),
            last_site: None,
            alloc_retries: reading.alloc_retries.unwrap_or(0),
            ooms: 0,
            workspace_sizes,
        }));
        let sink: Arc<Mutex<dyn OomSink>> = state.clone();
        crate::oom::subscribe(OomSubscriber {
            device,
            detail: self.detail,
            views: self.views,
            op_names: self.op_names,
            log_path: log_path.clone(),
            state: Arc::downgrade(&sink),
        });
        if let TrackedDevice::Cuda(_) = device {
            if let Err(e) = ffi::cuda_oom_observer_attach() {
                tracing::warn!(target: "gpu_mem_track", "CUDA out-of-memory errors will not be logged: {e}");
            }
        }
        if let Some(limit) = self.cpu_memory_limit {
            ffi::cpu_allocator_set_limit(Some(limit));
        }
        Ok(MemTracker {
            device,
            detail: self.detail,
            views: self.views,
            op_names: self.op_names,
            sets_cpu_memory_limit: self.cpu_memory_limit.is_some(),
            log_path,
            warned: AtomicBool::new(false),
            sampler,
            history_stacks: Mutex::new(false),
            optimizer_steps: AtomicU32::new(0),
            state,
        })
    }
}

/// What a tracker keeps between track points (shared with its out-of-memory report).
struct State {
    raw: RegistryWalk,
    /// Groups at the previous block: the next block's `+`/`-` lines are the change from these.
    previous: FxHashMap<GroupKey, GroupTotals>,
    writer: LogWriter,
    allocator: AllocatorCounters,
    nvml: Option<NvmlReader>,
    nvml_cache: ReadingCache<NvmlReading>,
    /// The last track site (the out-of-memory block names it).
    last_site: Option<Site>,
    /// The CUDA allocator's retry count at the previous `At` line.
    alloc_retries: u64,
    /// Out-of-memory blocks written so far.
    ooms: u32,
    /// The sizes a CUDA library's workspace has in this process (none on the CPU).
    workspace_sizes: Vec<u64>,
}

impl OomSink for State {
    fn parts(&mut self) -> OomParts<'_> {
        OomParts {
            raw: &mut self.raw,
            previous: &mut self.previous,
            writer: &mut self.writer,
            last_site: self.last_site.as_ref(),
            ooms: &mut self.ooms,
        }
    }
}

/// What one track call measured (and wrote to the log).
#[derive(Debug, Clone)]
pub struct TrackPoint {
    /// Where it was taken.
    pub site: Site,
    /// Group changes since the previous track point (empty without detail).
    pub changes: Vec<GroupChange>,
    /// Bytes of unique live tensor storages on the device.
    pub tensor_bytes: u64,
    /// Live tensors on the device.
    pub tensor_count: usize,
    /// Allocator counters.
    pub allocator: AllocatorReading,
    /// CUDA: bytes of the workspaces cuBLAS and cuBLASLt keep (`Workspace Memory`).
    pub workspace_bytes: Option<u64>,
    /// Allocated bytes neither tensors nor workspaces explain (`Unattributed Memory`):
    /// `tensor_bytes + workspace_bytes + unattributed_bytes == allocator.allocated` unless tensors
    /// count more than is allocated (storages made outside the allocator).
    pub unattributed_bytes: u64,
    /// NVML reading (CUDA with a driver only).
    pub nvml: Option<NvmlReading>,
    /// Maxima the background sampler saw since the previous track point (when sampling is on).
    pub sampled: Option<SampledPeak>,
    /// cudaMalloc failures the CUDA caching allocator retried since the previous track point
    /// (each released the cache and tried again: memory is getting tight).
    pub alloc_retries_since_previous: u64,
}

impl TrackPoint {
    /// The `At` line this point printed.
    pub fn at_line(&self) -> AtLine {
        AtLine::of_track(SourceLocation::from(&self.site), &self.figures())
    }

    /// What this point measured, as its `At` line and Python's `track()` dict give it.
    pub fn figures(&self) -> TrackFigures {
        TrackFigures {
            tensor_bytes: self.tensor_bytes,
            allocated: self.allocator.allocated,
            peak_allocated: self.allocator.peak_since_previous,
            workspace: self.workspace_bytes,
            unattributed: Some(self.unattributed_bytes),
            reserved: self.allocator.reserved,
            device_free: self.allocator.device_free,
            alloc_retries: self.alloc_retries_since_previous,
            nvml_used: self.nvml.and_then(|n| n.process_used),
            peak_nvml_used: self.sampled.and_then(|s| s.nvml_process_used),
        }
    }

    /// The `+`/`-` lines this point printed.
    pub fn group_lines(&self) -> Vec<GroupLine> {
        self.changes.iter().map(GroupLine::from_change).collect()
    }
}

/// Tracks the memory of one device, line by line, into one log file.
///
/// Thread-safe: concurrent [`track`](Self::track) calls are serialised and each writes one whole
/// block.
pub struct MemTracker {
    device: TrackedDevice,
    detail: bool,
    views: ViewLines,
    op_names: bool,
    sets_cpu_memory_limit: bool,
    log_path: PathBuf,
    warned: AtomicBool,
    sampler: Option<Sampler>,
    history_stacks: Mutex<bool>,
    optimizer_steps: AtomicU32,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for MemTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTracker")
            .field("device", &self.device)
            .field("detail", &self.detail)
            .field("log_path", &self.log_path)
            .finish_non_exhaustive()
    }
}

impl Drop for MemTracker {
    fn drop(&mut self) {
        if self.sets_cpu_memory_limit {
            ffi::cpu_allocator_set_limit(None);
        }
    }
}

impl AsRef<MemTracker> for MemTracker {
    fn as_ref(&self) -> &MemTracker {
        self
    }
}

impl MemTracker {
    /// A builder with the defaults: best device, `logs/`, detail on, no prefix, NVML on.
    pub fn builder() -> MemTrackerBuilder {
        MemTrackerBuilder::default()
    }

    /// The tracked device.
    pub fn device(&self) -> TrackedDevice {
        self.device
    }

    /// The log file this tracker appends to.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// Takes a track point at the caller's line (function name resolved once per call site).
    /// Prefer `track!`, which knows the function at compile time.
    ///
    /// # Errors
    /// [`LogError::LogWrite`](gpu_mem_track_log::Error::LogWrite) when the block cannot be appended; [`Error::Libtorch`] when the
    /// registry walk or the allocator counters cannot be read.
    #[track_caller]
    pub fn track(&self) -> Result<TrackPoint> {
        self.track_at(&Site::caller())
    }

    /// Takes a track point attributed to `site`.
    ///
    /// # Errors
    /// As [`track`](Self::track).
    pub fn track_at(&self, site: &Site) -> Result<TrackPoint> {
        crate::history::note_site(site);
        if ffi::recorder_active() {
            ffi::registry_tag_allocations();
        }
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let (kind, index) = self.device.shim_filter();
        let (groups, totals) = state.raw.take_grouped(kind, index, self.detail)?;
        let snap = Walk::from_groups(groups, totals, self.op_names);
        // One clock read dates both cached readings (free memory and NVML).
        let now = Instant::now();
        let allocator = state.allocator.read(now)?;
        let attribution = attribution::split(
            self.device,
            allocator.allocated,
            snap.tensor_bytes,
            &state.workspace_sizes,
            state.raw.watched(),
        );
        let retries = allocator.alloc_retries.unwrap_or(0);
        let alloc_retries_since_previous = retries.saturating_sub(state.alloc_retries);
        state.alloc_retries = retries;
        let sampled = self.sampler.as_ref().map(Sampler::take_peak);
        let nvml = match (&state.nvml, self.device) {
            (Some(reader), TrackedDevice::Cuda(i)) => state
                .nvml_cache
                .get(allocator.reserved, now, || reader.read(i, std::process::id()))
                .map_err(|e| nvml::warn_once(&e))
                .ok(),
            _ => None,
        };
        let point = TrackPoint {
            site: site.clone(),
            changes: if self.detail {
                diff_groups(&state.previous, &snap.groups, self.views)
            } else {
                Vec::new()
            },
            tensor_bytes: snap.tensor_bytes,
            tensor_count: snap.tensor_count,
            allocator,
            workspace_bytes: matches!(self.device, TrackedDevice::Cuda(_))
                .then_some(attribution.workspace_bytes),
            unattributed_bytes: attribution.unattributed_bytes,
            nvml,
            sampled,
            alloc_retries_since_previous,
        };
        state.writer.append(&format::block(&point.group_lines(), &point.at_line()))?;
        state.previous = snap.groups;
        state.last_site = Some(site.clone());
        drop(guard);
        tracing::info!(
            target: "gpu_mem_track",
            file = site.file,
            line = site.line,
            function = &*site.function,
            tensor_mib = point.tensor_bytes as f64 / MIB,
            allocated_mib = point.allocator.allocated as f64 / MIB,
            peak_allocated_mib = point.allocator.peak_since_previous as f64 / MIB,
            reserved_mib = point.allocator.reserved.map(|r| r as f64 / MIB),
            nvml_used_mib = point.nvml.and_then(|n| n.process_used).map(|r| r as f64 / MIB),
            changed_groups = point.changes.len(),
            "track"
        );
        Ok(point)
    }

    /// Starts recording every allocation and free on the tracked device, keeping the last
    /// `max_entries` (0: all), each tagged with the most recent track site. On the CPU the
    /// wrapped allocator reports them; on CUDA the caching allocator's trace hooks do, with the
    /// segments it reserves and releases.
    ///
    /// Each allocation gets a category: the storages of registered parameters and buffers (see
    /// [`register_varstore`](Self::register_varstore)) and of the parameters' gradients, tensors autograd
    /// saves for backward (activations), inputs marked with [`tag_input`](Self::tag_input), state
    /// kept by [`optimizer_step`](Self::optimizer_step); the rest are temporaries when freed, else
    /// unknown.
    ///
    /// # Errors
    /// [`Error::CudaUnavailable`] on CUDA when there is no GPU or this build has no CUDA headers;
    /// [`Error::Libtorch`] when a recording is already running.
    pub fn record_history(&self, max_entries: usize) -> Result<()> {
        self.record_history_with(HistoryOptions::new(max_entries))
    }

    /// [`record_history`](Self::record_history) with options (native stacks).
    ///
    /// # Errors
    /// As [`record_history`](Self::record_history).
    pub fn record_history_with(&self, options: HistoryOptions) -> Result<()> {
        // Before touching the CUDA hook, which a running recording may be using.
        if ffi::recorder_active() {
            return Err(Error::Libtorch {
                call: "record history",
                message: "an allocation recording is already running".into(),
            });
        }
        match self.device {
            TrackedDevice::Cpu => history::start(DeviceKind::Cpu, options)?,
            TrackedDevice::Cuda(i) => {
                if !ffi::cuda_history_compiled() {
                    return Err(Error::NotInThisBuild {
                        capability: "CUDA memory history",
                        reason: ffi::CUDA_HISTORY_MISSING.to_owned(),
                    });
                }
                ffi::cuda_history_attach(i).map_err(|e| Error::CudaUnavailable {
                    reason: format!("cannot record the memory history of {}: {e}", self.device),
                })?;
                if let Err(e) = history::start(DeviceKind::Cuda, options) {
                    ffi::cuda_history_detach();
                    return Err(e);
                }
            }
        }
        ffi::registry_tag_allocations();
        *self.history_stacks.lock() = options.with_stacks;
        Ok(())
    }

    #[cfg(feature = "tch")]
    /// Marks `tensor` as the input batch in the recorded history (no-op when nothing records, or
    /// when its memory was allocated before the recording started).
    pub fn tag_input(&self, tensor: &tch::Tensor) {
        ffi::recorder_tag_tensor(tensor, gpu_mem_track_log::Category::Input);
    }

    /// [`tag_input`](Self::tag_input) for a tensor given by its `c10::TensorImpl*` (what Python's
    /// `Tensor._cdata` holds), for front ends without tch.
    ///
    /// # Safety
    /// `impl_ptr` must point to a live `c10::TensorImpl` for the duration of the call.
    #[allow(unsafe_code)]
    pub unsafe fn tag_input_impl(&self, impl_ptr: *const std::ffi::c_void) {
        // SAFETY: forwarded from the caller.
        unsafe { ffi::recorder_tag_tensor_impl(impl_ptr, gpu_mem_track_log::Category::Input) }
    }

    /// Runs an optimizer step (`|| opt.step()`): the tensors it makes and keeps are optimizer state,
    /// in the log (their lines say `| optimizer state`) and in a recorded history, where memory it
    /// frees again is temporary. Returns what the closure returns.
    pub fn optimizer_step<R>(&self, step: impl FnOnce() -> R) -> R {
        struct Stepping<'a>(&'a MemTracker);
        impl Drop for Stepping<'_> {
            fn drop(&mut self) {
                self.0.end_optimizer_step();
            }
        }
        self.begin_optimizer_step();
        let _stepping = Stepping(self);
        step()
    }

    /// Marks what is made from now until [`end_optimizer_step`](Self::end_optimizer_step) as an
    /// optimizer step's, as [`optimizer_step`](Self::optimizer_step) does around its closure: for
    /// hooks that see a step begin and end apart (Python's global optimizer step hooks).
    pub fn begin_optimizer_step(&self) {
        // What the step makes and keeps is optimizer state in the log (and in a history).
        ffi::registry_optimizer_step(true);
        if !ffi::recorder_active() {
            return;
        }
        // Gradients live now are tagged before the step can drop them.
        ffi::registry_tag_allocations();
        let n = self.optimizer_steps.fetch_add(1, Ordering::Relaxed) + 1;
        ffi::recorder_set_phase(Some(gpu_mem_track_log::Phase::Optimizer), n);
    }

    /// Ends what [`begin_optimizer_step`](Self::begin_optimizer_step) began.
    pub fn end_optimizer_step(&self) {
        if ffi::recorder_active() {
            ffi::recorder_set_phase(None, self.optimizer_steps.load(Ordering::Relaxed));
        }
        ffi::registry_optimizer_step(false);
    }

    /// Stops recording; the history stays readable.
    ///
    /// # Errors
    /// [`Error::Libtorch`] if the recorder cannot be stopped.
    pub fn stop_history(&self) -> Result<()> {
        history::stop()
    }

    /// The recorded history so far.
    pub fn history(&self) -> History {
        history::read(*self.history_stacks.lock())
    }

    /// Writes the recorded history as a PyTorch memory snapshot pickle (open it in memory_viz).
    ///
    /// # Errors
    /// [`LogError::LogWrite`](gpu_mem_track_log::Error::LogWrite) naming the file.
    pub fn dump_snapshot(&self, path: impl AsRef<Path>) -> Result<()> {
        self.history().dump_snapshot(path.as_ref())
    }

    /// Releases the CUDA caching allocator's unused blocks; returns the reserved bytes released.
    /// On a CPU tracker there is no cache and this returns 0.
    ///
    /// # Errors
    /// [`Error::Libtorch`] when CUDA reports a failure.
    pub fn clear_cache(&self) -> Result<u64> {
        match self.device {
            TrackedDevice::Cpu => Ok(0),
            TrackedDevice::Cuda(i) => {
                let before = ffi::cuda_stats(i, false)?.reserved_current;
                ffi::cuda_empty_cache()?;
                let after = ffi::cuda_stats(i, false)?.reserved_current;
                Ok(before.saturating_sub(after))
            }
        }
    }

    /// Every live tensor on the device, largest storage first.
    ///
    /// # Errors
    /// [`Error::Libtorch`] when the registry cannot be read.
    pub fn live_tensors(&self) -> Result<Vec<TensorInfo>> {
        let mut state = self.state.lock();
        let (kind, index) = self.device.shim_filter();
        let (records, dims) = state.raw.take(kind, index)?;
        Ok(walk::tensor_infos(records, dims))
    }

    /// Writes one line per live tensor on the device (name, shape, dtype, class, bytes, storage)
    /// and a total.
    ///
    /// # Errors
    /// I/O errors of `out`; [`Error::Libtorch`] when the registry cannot be read.
    pub fn print_all_tensors(&self, mut out: impl Write) -> Result<()> {
        let tensors = self.live_tensors()?;
        let io = |source| gpu_mem_track_log::Error::LogWrite {
            path: PathBuf::from("<print_all_tensors writer>"),
            source,
        };
        let mut total = 0u64;
        for t in &tensors {
            if t.owns_storage {
                total += t.storage_nbytes;
            }
            writeln!(
                out,
                "{:<32} | Size:{:<20} | {:<14} | {:<40} | {:>12} B | storage {:#x}{}",
                t.name.as_deref().unwrap_or("-"),
                format::python_tuple(&t.shape),
                t.dtype.torch_name(),
                t.class.to_string(),
                t.nbytes,
                t.storage_id,
                if t.owns_storage { "" } else { " (view: shares storage)" }
            )
            .map_err(io)?;
        }
        writeln!(out, "{} tensors on {}, {} bytes in unique storages", tensors.len(), self.device, total)
            .map_err(io)?;
        Ok(())
    }

    #[cfg(feature = "tch")]
    /// Registers every variable of a `VarStore` by name, so parameters show up even if they were
    /// created before the registry was installed.
    ///
    /// # Errors
    /// [`Error::Libtorch`] when registration fails.
    pub fn register_varstore(&self, vs: &tch::nn::VarStore) -> Result<usize> {
        let vars = vs.variables();
        for (name, t) in &vars {
            ffi::register_tensor(t, name)?;
        }
        ffi::registry_tag_allocations();
        Ok(vars.len())
    }

    #[cfg(feature = "tch")]
    /// Registers a TorchScript module's named parameters and buffers (which `CModule::load`
    /// creates without any op the registry sees).
    ///
    /// # Errors
    /// [`Error::Libtorch`] when the module cannot be walked.
    pub fn register_module(&self, module: &tch::CModule) -> Result<usize> {
        let n = ffi::register_module(module, "")?;
        ffi::registry_tag_allocations();
        Ok(n)
    }

    #[cfg(feature = "tch")]
    /// Registers one tensor under a name.
    ///
    /// # Errors
    /// [`Error::Libtorch`] when registration fails (e.g. a NUL byte in `name`).
    pub fn register(&self, tensor: &tch::Tensor, name: &str) -> Result<()> {
        ffi::register_tensor(tensor, name)?;
        ffi::registry_tag_allocations();
        Ok(())
    }

    /// Logs a failed track as a warning the first time, then at debug level.
    pub(crate) fn report_failure(&self, e: &Error) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(target: "gpu_mem_track", log = %self.log_path.display(), "track failed: {e}");
        } else {
            tracing::debug!(target: "gpu_mem_track", "track failed: {e}");
        }
    }
}

static DEFAULT_TRACKER: OnceLock<Result<MemTracker>> = OnceLock::new();

/// The process-wide tracker used by `track!()` without arguments: built on first use with the
/// defaults unless [`set_default_tracker`] ran before.
///
/// # Errors
/// The build error of the default tracker (the same one on every call).
pub fn default_tracker() -> std::result::Result<&'static MemTracker, &'static Error> {
    DEFAULT_TRACKER.get_or_init(|| MemTracker::builder().build()).as_ref()
}

/// Makes `tracker` the process-wide default. Fails (returning it) if a default already exists.
pub fn set_default_tracker(tracker: MemTracker) -> std::result::Result<(), Box<MemTracker>> {
    let mut slot = Some(tracker);
    DEFAULT_TRACKER.get_or_init(|| Ok(slot.take().expect("taken once")));
    match slot {
        None => Ok(()),
        Some(t) => Err(Box::new(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_mem_track_log::log::{ALLOC_RETRIES, DEVICE_FREE, RESERVED};

    #[test]
    fn cuda_at_lines_show_the_headroom_and_new_allocator_retries() {
        let mut point = TrackPoint {
            site: Site::new("train.rs", 7, "app::main"),
            changes: Vec::new(),
            tensor_bytes: 1 << 20,
            tensor_count: 1,
            allocator: AllocatorReading {
                allocated: 1 << 20,
                peak_since_previous: 2 << 20,
                reserved: Some(4 << 20),
                device_free: Some(300 << 20),
                alloc_retries: Some(5),
            },
            workspace_bytes: Some(0),
            unattributed_bytes: 0,
            nvml: None,
            sampled: None,
            alloc_retries_since_previous: 2,
        };
        let at = point.at_line();
        assert_eq!(at.field(DEVICE_FREE), Some(300.0));
        assert_eq!(at.field(ALLOC_RETRIES), Some(2.0));
        point.alloc_retries_since_previous = 0;
        point.allocator.device_free = None;
        let at = point.at_line();
        assert_eq!((at.field(DEVICE_FREE), at.field(ALLOC_RETRIES)), (None, None));
        assert_eq!(at.field(RESERVED), Some(4.0));
    }
}
