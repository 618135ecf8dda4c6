//! Estimates of a program's own code, run on the meta device in the program's own process: what
//! the Python package's `Estimator` records (`with Estimator(): ...`, `estimate(model, ...)`).
//!
//! Between [`InProcessRun::begin`] and [`InProcessRun::finish`], on the thread that began it:
//! - every tensor is on meta (exact sizes, no data, no compute); the meta allocator numbers each
//!   storage and the allocation recorder notes it, and its free when the program drops it: the
//!   lifetimes are the program's own;
//! - the CPU and CUDA mean meta: factories asked for either make meta tensors, copies to either
//!   stay on meta, a CPU tensor made before the run is replaced by a meta twin where an op meets
//!   it (`gpu-mem-track-estimate-sys/csrc/cpu_means_meta.cpp`).
//!
//! The caller knows the program's structure and says it to the recorder: the phase and iteration
//! ([`recorder::set_phase`]), the module running ([`recorder::set_site`], an index into the caller's
//! own list of module paths), and what a tensor is ([`recorder::tag_tensor_impl`]: parameters,
//! buffers, the input). [`InProcessRun::finish`] turns the recording into the [`Estimate`] and
//! [`Trace`] the other estimates give, plus what each site holds at the peak.
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use serde::Serialize;

use gpu_mem_track::recorder::{self, AllocEvent, EventKind};
use gpu_mem_track::DeviceKind;
use gpu_mem_track_log::log::GroupLine;
use gpu_mem_track_log::{Category, Phase, Trace};

use crate::error::Result;
use crate::estimate::{finish_estimate, Estimate, RecorderGuard};
use crate::ffi;
use crate::figures::{CpuTensors, ModelSizes};
use crate::torchscript::peak_tensor_groups;
use gpu_mem_track_gpu::options::EstimateOptions;

pub use crate::ffi::{meta_storage_recorded, resize_meta_storage, UnrecordedMeta};

/// A recording of the program's own code on meta, from [`begin`](Self::begin) to
/// [`finish`](Self::finish). Not `Send`: "the CPU means meta" is a mode of the thread that began it.
pub struct InProcessRun {
    start: Instant,
    meta_counters: ffi::MetaCounters,
    // Dropped in this order: the CPU stops meaning meta, then the recording stops.
    cpu_means_meta: Option<ffi::CpuMeansMeta>,
    // What earlier spans of "the CPU means meta" saw (before a pause).
    cpu_tensors: CpuTensors,
    _recording: RecorderGuard,
    // Last: the next recording (a memory history) does not walk at its peaks.
    _peak_walks: PeakWalks,
}

/// Asks the recorder to walk the live tensors at each new peak while it lives.
struct PeakWalks;

impl PeakWalks {
    fn on() -> Self {
        recorder::walk_peaks(true);
        PeakWalks
    }
}

impl Drop for PeakWalks {
    fn drop(&mut self) {
        recorder::walk_peaks(false);
    }
}

/// What an in-process run gives.
#[derive(Debug, Clone)]
pub struct InProcessEstimate {
    /// The estimate, as for a model file.
    pub estimate: Estimate,
    /// Its categorised trace (what the GPU predictions, `fit` and sharding replay).
    pub trace: Trace,
    /// What each site (module) and category held at the peak, largest first.
    pub peak_by_site: Vec<SitePeak>,
    /// The live tensors at the peak, grouped as the log groups them, largest first.
    pub peak_tensors: Vec<GroupLine>,
}

/// Bytes one site held in one category at the peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SitePeak {
    /// The site index the caller set while the allocation was made (`None`: outside any).
    pub site: Option<usize>,
    /// What the allocation holds.
    pub category: Category,
    /// Live bytes.
    pub bytes: u64,
}

impl InProcessRun {
    /// Starts recording on this thread: installs the live-tensor registry and the meta allocator,
    /// starts the allocation recorder on meta (phase `load`, no site) and makes the CPU and CUDA
    /// mean meta, and walks the live tensors at each new peak.
    ///
    /// # Errors
    /// [`Libtorch`](gpu_mem_track::Error::Libtorch) when another recording runs in the process (one
    /// at a time: an estimate, or a memory history) or libtorch refuses a hook.
    pub fn begin() -> Result<Self> {
        gpu_mem_track::install()?;
        ffi::meta_allocator_install()?;
        let start = Instant::now();
        let meta_counters = ffi::MetaCounters::begin();
        let peak_walks = PeakWalks::on();
        recorder::start(DeviceKind::Meta)?;
        let recording = RecorderGuard;
        recorder::set_phase(Some(Phase::Load), 0);
        recorder::set_site(None);
        let cpu_means_meta = Some(ffi::CpuMeansMeta::begin(true)?);
        Ok(Self {
            start,
            meta_counters,
            cpu_means_meta,
            cpu_tensors: CpuTensors::default(),
            _recording: recording,
            _peak_walks: peak_walks,
        })
    }

    /// Lets the CPU be the CPU on this thread until [`resume`](Self::resume): for code that writes
    /// data into the CPU tensor it makes (Python's `torch.tensor([...])`), which a meta tensor has
    /// no memory for. Allocations are still recorded.
    pub fn pause(&mut self) {
        if let Some(mode) = self.cpu_means_meta.take() {
            let seen = mode.counts();
            self.cpu_tensors.made_on_cpu += seen.made_on_cpu;
            self.cpu_tensors.moved_to_meta += seen.moved_to_meta;
            self.cpu_tensors.examples.extend(seen.examples);
        }
    }

    /// Makes the CPU mean meta again after [`pause`](Self::pause).
    ///
    /// # Errors
    /// [`Libtorch`](gpu_mem_track::Error::Libtorch) when libtorch refuses the mode.
    pub fn resume(&mut self) -> Result<()> {
        if self.cpu_means_meta.is_none() {
            self.cpu_means_meta = Some(ffi::CpuMeansMeta::begin(true)?);
        }
        Ok(())
    }

    /// Ends the recording and turns it into the estimate. `options` says what ran (its input,
    /// precision and mode, as the caller saw them); `sizes` what the model and its optimizer hold.
    pub fn finish(self, options: &EstimateOptions, sizes: ModelSizes) -> InProcessEstimate {
        let InProcessRun { start, meta_counters, cpu_means_meta, mut cpu_tensors, _recording, _peak_walks } =
            self;
        if let Some(seen) = cpu_means_meta.as_ref().map(ffi::CpuMeansMeta::counts) {
            cpu_tensors.made_on_cpu += seen.made_on_cpu;
            cpu_tensors.moved_to_meta += seen.moved_to_meta;
            cpu_tensors.examples.extend(seen.examples);
        }
        cpu_tensors.examples.truncate(8);
        drop(cpu_means_meta);
        recorder::set_site(None);
        drop(_recording);
        drop(_peak_walks);
        let (events, names) = recorder::events();
        let (meta_scalar_reads, cpu_fallback, attention) = meta_counters.since();
        let run = ffi::RunFigures { sizes, meta_scalar_reads, cpu_fallback, cpu_tensors, attention };
        let parameter_ids = recorder::parameter_ids();
        let (estimate, trace) = finish_estimate(options, &run, &events, &names, &parameter_ids, start);
        let peak_by_site = peak_by_site(&events, &trace, estimate.peak.event);
        InProcessEstimate { estimate, trace, peak_by_site, peak_tensors: peak_tensor_groups() }
    }
}

/// What each (site, category) held right after event `peak_event`, largest first. The category of
/// an allocation is the trace's (meta allocations are numbered, so an id names one allocation).
fn peak_by_site(events: &[AllocEvent], trace: &Trace, peak_event: u64) -> Vec<SitePeak> {
    let category: HashMap<i64, Category> =
        trace.events.iter().filter(|e| e.alloc).map(|e| (e.id, e.category)).collect();
    let mut live: HashMap<i64, (Option<usize>, u64)> = HashMap::new();
    let last = usize::try_from(peak_event).unwrap_or(usize::MAX);
    for e in events.iter().take(last.saturating_add(1)) {
        match e.kind {
            // Host memory is never the GPU's (see `AllocEvent::host`).
            EventKind::Alloc if e.size > 0 && !e.host => {
                live.insert(e.id, (e.site, e.size));
            }
            EventKind::Free => {
                live.remove(&e.id);
            }
            _ => {}
        }
    }
    let mut sums: BTreeMap<(Option<usize>, Category), u64> = BTreeMap::new();
    for (id, (site, size)) in live {
        let c = category.get(&id).copied().unwrap_or(Category::Unknown);
        *sums.entry((site, c)).or_default() += size;
    }
    let mut out: Vec<SitePeak> =
        sums.into_iter().map(|((site, category), bytes)| SitePeak { site, category, bytes }).collect();
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)).then(a.category.cmp(&b.category)));
    out
}
