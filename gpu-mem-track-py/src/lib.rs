//! `gpu_mem_track._native`: the thin pyo3 layer of the `gpu_mem_track` Python package over the
//! tracker (the `gpu-mem-track` crate without tch). The Pythonic API (`MemTracker`, the gc
//! walk, the caller's frame, the version check) is in `python/gpu_mem_track/`; this module only
//! turns Python values into the tracker's types and its errors into Python exceptions.
//!
//! Threads: a call that walks the registry keeps the GIL for the whole walk. Under the GIL a
//! tensor with a Python object cannot die, so `track()` reads those without pinning them
//! (`gpu_mem_track::walk::with_gil_held`: a pin would take the GIL once more); and a pin's
//! release, which may need the GIL, never waits for it under the registry's lock, which the op
//! callback (on any thread, never waiting for the GIL) takes. The other calls detach.
use std::collections::HashSet;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use gpu_mem_track::{Error, LogError, MemTracker, Site, TrackPoint, TrackedDevice};
use pyo3::exceptions::{PyException, PyFileNotFoundError, PyNotADirectoryError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyType};

pyo3::create_exception!(
    _native,
    GpuMemTrackError,
    PyException,
    "A failure of gpu-mem-track itself (libtorch refused a hook, CUDA unavailable, a capability \
     this build lacks); the message names what was wrong."
);

/// The torch release this extension was compiled against, as a marker the package finds in the
/// file's bytes when the extension cannot even be loaded (a torch of another minor version).
#[used]
static BUILT_AGAINST: &str = gpu_mem_track::BUILD_MARKER;

/// The tracker's error as the Python exception a Python user expects: bad options are `ValueError`,
/// log-folder and file problems `OSError` subclasses, the rest [`GpuMemTrackError`].
fn to_py(e: Error) -> PyErr {
    let message = e.to_string();
    match &e {
        Error::InvalidOption { .. } | Error::UnsupportedDevice(_) | Error::NoSuchCudaDevice { .. } => {
            PyValueError::new_err(message)
        }
        Error::Log(log) => match log {
            LogError::InvalidPrefix { .. } => PyValueError::new_err(message),
            LogError::LogDirMissing { .. } => PyFileNotFoundError::new_err(message),
            LogError::LogDirNotADirectory { .. } => PyNotADirectoryError::new_err(message),
            LogError::LogDirUnwritable { .. }
            | LogError::LogWrite { .. }
            | LogError::SnapshotWrite { .. }
            | LogError::LogRead { .. } => PyOSError::new_err(message),
            _ => GpuMemTrackError::new_err(message),
        },
        _ => GpuMemTrackError::new_err(message),
    }
}

/// A Python file name as the `&'static str` a [`Site`] holds: each distinct name is leaked once
/// (a program has as many as it has source files).
fn intern_file(file: &str) -> &'static str {
    static FILES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut files = FILES.lock().unwrap_or_else(|p| p.into_inner());
    let set = files.get_or_insert_with(HashSet::new);
    if let Some(known) = set.get(file) {
        return known;
    }
    let leaked: &'static str = Box::leak(file.to_owned().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// One tracker: the Rust `MemTracker` (one log file).
#[pyclass(name = "Tracker", module = "gpu_mem_track._native", frozen)]
struct PyTracker {
    inner: MemTracker,
}

impl PyTracker {
    /// One track at `site`, its walk under the GIL that a `&self` method of a pyclass holds (the
    /// methods that call it never detach).
    fn track_holding_gil(&self, site: &Site) -> PyResult<TrackPoint> {
        // SAFETY: pyo3 runs every method of this class with the GIL held, and track_at runs no
        // Python code, so the GIL stays held for the whole call.
        unsafe { gpu_mem_track::walk::with_gil_held(|| self.inner.track_at(site)) }.map_err(to_py)
    }
}

#[pymethods]
impl PyTracker {
    /// `device`: `cpu` or `cuda:N`; `log_dir` must exist; `prefix` goes before the timestamp;
    /// `rank`: the process's rank for the log's name (else the launcher's variables say it).
    #[new]
    #[pyo3(signature = (device, log_dir, prefix="", detail=true, nvml=true, op_names=false, sample_every=None, cpu_memory_limit=None, views=false, rank=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        _py: Python<'_>,
        device: &str,
        log_dir: PathBuf,
        prefix: &str,
        detail: bool,
        nvml: bool,
        op_names: bool,
        sample_every: Option<f64>,
        cpu_memory_limit: Option<u64>,
        views: bool,
        rank: Option<u32>,
    ) -> PyResult<Self> {
        let device: TrackedDevice = device.parse().map_err(to_py)?;
        let mut builder = MemTracker::builder()
            .device(device)
            .log_dir(log_dir)
            .prefix(prefix)
            .detail(detail)
            .nvml(nvml)
            .op_names(op_names)
            .detail_views(views);
        if let Some(seconds) = sample_every {
            let interval =
                Duration::try_from_secs_f64(seconds).ok().filter(|d| !d.is_zero()).ok_or_else(|| {
                    PyValueError::new_err(format!(
                        "sample_every={seconds}: must be a positive number of seconds"
                    ))
                })?;
            builder = builder.sample_every(interval);
        }
        if let Some(bytes) = cpu_memory_limit {
            builder = builder.cpu_memory_limit(bytes);
        }
        if let Some(rank) = rank {
            builder = builder.rank(rank);
        }
        // SAFETY: as in `track`: building walks the registry once, under the GIL `_py` holds.
        let inner = unsafe { gpu_mem_track::walk::with_gil_held(|| builder.build()) }.map_err(to_py)?;
        Ok(PyTracker { inner })
    }

    /// Appends one block for `file` line `line` in `function`; returns its figures.
    fn track<'py>(
        &self,
        py: Python<'py>,
        file: &str,
        line: u32,
        function: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let point =
            self.track_holding_gil(&Site { file: intern_file(file), line, function: function.into() })?;
        point_dict(py, &point)
    }

    /// The seconds each of `times` tracks takes in Rust alone, at the site `file:line` (for the
    /// benchmark: the Rust tracker's `track!()` on the Python program's own tensors, without the Python
    /// call, the caller's frame and the returned dict).
    fn time_tracks(&self, file: &str, line: u32, function: &str, times: usize) -> PyResult<Vec<f64>> {
        let site = Site { file: intern_file(file), line, function: function.into() };
        let mut seconds = Vec::with_capacity(times);
        for _ in 0..times {
            let started = std::time::Instant::now();
            self.track_holding_gil(&site)?;
            seconds.push(started.elapsed().as_secs_f64());
        }
        Ok(seconds)
    }

    /// Marks what is made from now on as an optimizer step's: what it keeps is optimizer state.
    fn begin_optimizer_step(&self, py: Python<'_>) {
        py.detach(|| self.inner.begin_optimizer_step());
    }

    /// Ends what `begin_optimizer_step` began.
    fn end_optimizer_step(&self, py: Python<'_>) {
        py.detach(|| self.inner.end_optimizer_step());
    }

    /// Releases the CUDA caching allocator's unused blocks; the bytes released (0 on the CPU).
    fn clear_cache(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.clear_cache()).map_err(to_py)
    }

    /// One line per live tensor on the device and a total, as text.
    fn tensors_text(&self) -> PyResult<String> {
        let mut out = Vec::new();
        self.inner.print_all_tensors(&mut out).map_err(to_py)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Bytes in the storages of the live tensors on the device, each storage counted once.
    fn tensor_bytes(&self) -> PyResult<u64> {
        let tensors = self.inner.live_tensors().map_err(to_py)?;
        Ok(tensors.iter().filter(|t| t.owns_storage).map(|t| t.storage_nbytes).sum())
    }

    /// Starts recording every allocation and free (the last `max_entries`, 0: all).
    fn record_history(&self, py: Python<'_>, max_entries: usize) -> PyResult<()> {
        py.detach(|| self.inner.record_history(max_entries)).map_err(to_py)
    }

    /// Stops recording; what was recorded stays.
    fn stop_history(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.stop_history()).map_err(to_py)
    }

    /// Writes the recorded history as a PyTorch memory snapshot pickle.
    fn dump_snapshot(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.detach(|| self.inner.dump_snapshot(&path)).map_err(to_py)
    }

    /// Marks the tensor whose `c10::TensorImpl*` is `cdata` as the input batch in the history.
    fn tag_input(&self, cdata: usize) {
        // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
        unsafe { self.inner.tag_input_impl(cdata as *const c_void) }
    }

    /// The log file.
    #[getter]
    fn log_path(&self) -> PathBuf {
        self.inner.log_path().to_owned()
    }

    /// The tracked device (`cpu`, `cuda:N`).
    #[getter]
    fn device(&self) -> String {
        self.inner.device().to_string()
    }
}

/// A track point's figures (bytes; a key for each figure of the `At` line's table, `None` where
/// not measured), its tensor count, and the lines it wrote.
fn point_dict<'py>(py: Python<'py>, point: &TrackPoint) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let figures = point.figures();
    for field in gpu_mem_track::log::AtField::ALL {
        if let Some(key) = field.key() {
            d.set_item(key, field.of(&figures))?;
        }
    }
    d.set_item("tensor_count", point.tensor_count)?;
    let lines: Vec<String> = point.group_lines().iter().map(|l| l.render()).collect();
    d.set_item("lines", lines)?;
    d.set_item("at", point.at_line().render())?;
    Ok(d)
}

/// The estimator's error as a Python exception: bad input (shape, option, profile) is
/// `ValueError`, a model file that cannot be read `OSError`, the rest [`GpuMemTrackError`].
fn estimate_error(e: gpu_mem_track_estimate::Error) -> PyErr {
    use gpu_mem_track_estimate::Error as E;
    let message = e.to_string();
    match e {
        E::Input(_) => PyValueError::new_err(message),
        E::Tracker(e) => to_py(e),
        _ => GpuMemTrackError::new_err(message),
    }
}

/// A phase the Python estimator names (`forward`, `optimizer`, ...), parsed as the log parses it.
fn phase_named(name: &str) -> PyResult<gpu_mem_track_estimate::Phase> {
    name.parse().map_err(PyValueError::new_err)
}

/// An in-process estimate while it records (`gpu_mem_track.Estimator`): the program's own code on
/// meta, on the thread that began it (the CPU and CUDA mean meta there).
#[pyclass(name = "Recording", module = "gpu_mem_track._native", unsendable)]
struct PyRecording {
    run: Option<gpu_mem_track_estimate::in_process::InProcessRun>,
}

/// What the model and its optimizer hold, as the Python side counted them (a dict).
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct PySizes {
    param_count: u64,
    param_bytes: u64,
    buffer_bytes: u64,
    input_bytes: u64,
    grad_bytes: u64,
    optimizer_state_bytes: u64,
}

impl From<PySizes> for gpu_mem_track_estimate::ModelSizes {
    fn from(s: PySizes) -> Self {
        gpu_mem_track_estimate::ModelSizes {
            param_count: s.param_count,
            param_bytes: s.param_bytes,
            buffer_bytes: s.buffer_bytes,
            input_bytes: s.input_bytes,
            grad_bytes: s.grad_bytes,
            optimizer_state_bytes: s.optimizer_state_bytes,
        }
    }
}

/// What the Python `Estimator` asks of an estimate (a dict, `EstimateRequest` in `_native.pyi`):
/// the options of the run it recorded, the GPU, and one rank of a data-parallel job.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
struct PyEstimateRequest {
    input_shape: Vec<i64>,
    input_is_index: bool,
    /// The dtype the model runs in (a `Precision` name).
    dtype: String,
    /// `None` for inference.
    optimizer: Option<String>,
    device_profile: String,
    gpu_memory: Option<u64>,
    world_size: u64,
    shard: String,
    precision: String,
    /// The NCCL communicators the program's process groups hold on this rank (0: one process).
    communicators: u32,
}

impl PyEstimateRequest {
    /// The run's options and the request, each name parsed by its Rust type (a `ValueError`
    /// naming the option otherwise).
    fn parse(
        self,
    ) -> PyResult<(gpu_mem_track_estimate::EstimateOptions, gpu_mem_track_estimate::EstimateRequest, u32)>
    {
        use gpu_mem_track_estimate::sharding::Parallelism;
        use gpu_mem_track_estimate::{
            EstimateDevice, EstimateOptions, EstimateRequest, GpuTarget, Lifetimes, Mode,
        };
        let mode = match &self.optimizer {
            Some(o) => Mode::Train(parse_named("optimizer", o)?),
            None => Mode::Inference,
        };
        let options = EstimateOptions {
            input_shape: self.input_shape,
            input_is_index: self.input_is_index,
            precision: parse_named("dtype", &self.dtype)?,
            mode,
            device: EstimateDevice::Meta,
            lifetimes: Lifetimes::Eager,
        };
        let parallelism = Parallelism::asked_of_recorded_run(
            self.world_size,
            parse_named("shard", &self.shard)?,
            parse_named("precision", &self.precision)?,
        );
        let gpu = GpuTarget::resolve(&self.device_profile, self.gpu_memory).map_err(estimate_error)?;
        Ok((options, EstimateRequest { gpu, parallelism, caching_allocator_line: true }, self.communicators))
    }
}

/// `value` parsed as the Rust type of option `option`; its error names the option.
fn parse_named<T: std::str::FromStr<Err = String>>(option: &str, value: &str) -> PyResult<T> {
    value.parse().map_err(|e| PyValueError::new_err(format!("{option}: {e}")))
}

#[pymethods]
impl PyRecording {
    /// Starts recording on this thread.
    #[new]
    fn new() -> PyResult<Self> {
        let run = gpu_mem_track_estimate::in_process::InProcessRun::begin().map_err(estimate_error)?;
        Ok(PyRecording { run: Some(run) })
    }

    /// Ends the recording: the estimate of what ran, as `request` asks (`EstimateRequest` in
    /// `_native.pyi`); `sites` names the site indexes (module paths).
    fn finish(
        &mut self,
        py: Python<'_>,
        request: PyEstimateRequest,
        sizes: PySizes,
        sites: Vec<String>,
    ) -> PyResult<PyFinished> {
        let run = self.run.take().ok_or_else(|| GpuMemTrackError::new_err("this recording has finished"))?;
        // Read before the run ends, but the run ends whatever they say (dropping it stops it).
        let (options, request, communicators) = request.parse()?;
        let mut done = run.finish(&options, sizes.into());
        done.trace.communicators = communicators;
        py.detach(|| PyFinished::new(done, &sites, &request))
    }

    /// Lets the CPU be the CPU on this thread until `resume` (Python's from-data constructors).
    fn pause(&mut self) {
        if let Some(run) = self.run.as_mut() {
            run.pause();
        }
    }

    /// Makes the CPU mean meta again.
    fn resume(&mut self) -> PyResult<()> {
        match self.run.as_mut() {
            Some(run) => run.resume().map_err(estimate_error),
            None => Ok(()),
        }
    }

    /// Ends the recording without an estimate (the block raised).
    fn cancel(&mut self) {
        self.run = None;
    }
}

/// An in-process estimate once recorded: its JSON (`estimate --json`'s object, with `breakdown`)
/// and text, and the GPU prediction `fit` compares.
#[pyclass(name = "Finished", module = "gpu_mem_track._native", frozen)]
struct PyFinished {
    json: String,
    text: String,
    fits: Option<bool>,
    needed: u64,
    prediction: Option<gpu_mem_track_estimate::profile::GpuPrediction>,
}

impl PyFinished {
    /// The report of an in-process run, with its per-module breakdown.
    fn new(
        done: gpu_mem_track_estimate::in_process::InProcessEstimate,
        sites: &[String],
        request: &gpu_mem_track_estimate::EstimateRequest,
    ) -> PyResult<Self> {
        use gpu_mem_track_estimate::{EstimateReport, ModuleBytes, RecordedRun};
        let site_name = |s: Option<usize>| s.and_then(|i| sites.get(i)).cloned().unwrap_or_default();
        let breakdown = done
            .peak_by_site
            .iter()
            .map(|p| ModuleBytes { module: site_name(p.site), category: p.category, bytes: p.bytes })
            .collect();
        let run = RecordedRun {
            estimate: done.estimate,
            trace: done.trace,
            peak_tensors: Some(done.peak_tensors),
            breakdown: Some(breakdown),
            static_estimate: None,
        };
        let report = EstimateReport::new(run, request);
        let json = report.json().map_err(|e| GpuMemTrackError::new_err(e.to_string()))?;
        let prediction = report.prediction().cloned();
        Ok(PyFinished {
            json: json.to_string(),
            text: report.text(None),
            fits: prediction.as_ref().map(|g| g.fits),
            needed: prediction.as_ref().map_or(0, |g| g.nvidia_smi.high),
            prediction,
        })
    }
}

#[pymethods]
impl PyFinished {
    /// `estimate --json`'s object, with `breakdown` (module, category, bytes at the peak).
    #[getter]
    fn json(&self) -> &str {
        &self.json
    }

    /// The text `estimate` prints.
    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// Whether the high end fits the GPU asked for (`None` without one).
    #[getter]
    fn fits(&self) -> Option<bool> {
        self.fits
    }

    /// What nvidia-smi would show at the high end (0 without a GPU asked for).
    #[getter]
    fn needed(&self) -> u64 {
        self.needed
    }
}

/// The largest value in `1..=max` whose `probe(value)` (a [`PyFinished`] for one GPU) fits, as
/// `gpu-mem-track fit` searches; returns the JSON of its result. `dimension`: `batch` or `seq`.
#[pyfunction]
#[pyo3(signature = (probe, max, dimension="batch"))]
fn fit_search(py: Python<'_>, probe: Bound<'_, PyAny>, max: i64, dimension: &str) -> PyResult<String> {
    use gpu_mem_track_estimate::fit::{search_largest, FitDimension};
    let dimension: FitDimension =
        dimension.parse().map_err(|e| PyValueError::new_err(format!("dimension: {e}")))?;
    // A Python error inside a probe ends the search; it is raised as it was.
    let mut raised: Option<PyErr> = None;
    let result = search_largest(
        dimension,
        max,
        |v| {
            let finished = probe.call1((v,)).and_then(|f| {
                let f = f.cast_into::<PyFinished>()?;
                Ok(f.get().prediction.clone())
            });
            match finished {
                Ok(Some(g)) => Ok(g),
                Ok(None) => Err(gpu_mem_track_estimate::Error::Input(
                    "fit needs one GPU profile (device= a profile name or file, not 'cuda' or 'all')".into(),
                )),
                Err(e) => {
                    raised = Some(e);
                    Err(gpu_mem_track_estimate::Error::Input("a probe raised".into()))
                }
            }
        },
        |_| {},
    );
    if let Some(e) = raised {
        return Err(e);
    }
    let r = result.map_err(estimate_error)?;
    let _ = py;
    serde_json::to_string(&r).map_err(|e| GpuMemTrackError::new_err(e.to_string()))
}

/// Meta runs stand for the GPU of `device_profile` from now on: attention takes the kernel that
/// GPU picks. A profile that does not resolve stands for a 9.0 GPU; its error comes from
/// `Recording.finish`, which reads it again.
#[pyfunction]
fn meta_target_device(device_profile: &str) {
    match gpu_mem_track_estimate::GpuTarget::resolve(device_profile, None) {
        Ok(target) => target.target_meta_kernels(),
        Err(_) => gpu_mem_track_estimate::meta_target_compute_capability((9, 0)),
    }
}

/// Tags the events recorded from now on with a phase and iteration (the Python estimator's hooks).
#[pyfunction]
fn recording_phase(phase: &str, iteration: u32) -> PyResult<()> {
    gpu_mem_track::recorder::set_phase(Some(phase_named(phase)?), iteration);
    Ok(())
}

/// Tags the events recorded from now on with a site index (the module running), or none.
#[pyfunction]
#[pyo3(signature = (site=None))]
fn recording_site(site: Option<usize>) {
    gpu_mem_track::recorder::set_site(site);
}

/// Sets the site (module path index) of the recorded allocation of the tensor whose
/// `c10::TensorImpl*` is `cdata`: the module owning a parameter, its gradient, its optimizer state.
#[pyfunction]
fn recording_owner(cdata: usize, site: usize) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("recording_owner: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::recorder::site_tensor_impl(cdata as *const c_void, Some(site)) };
    Ok(())
}

/// Resizes the meta storage whose `c10::StorageImpl*` is `cdata` (`UntypedStorage._cdata`) to
/// `nbytes` as a GPU storage resizes: the old allocation is freed and a new one made, both
/// recorded (FSDP frees and re-allocates unsharded parameters this way).
#[pyfunction]
fn meta_storage_resize(cdata: usize, nbytes: u64) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("meta_storage_resize: null StorageImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a storage the Python caller holds for this call, under
    // the GIL.
    unsafe { gpu_mem_track_estimate::in_process::resize_meta_storage(cdata as *mut c_void, nbytes) }
        .map_err(estimate_error)
}

/// Whether the meta storage `cdata` (`UntypedStorage._cdata`) holds recorded memory: `False` for
/// one made unrecorded (the program's own meta tensors), `None` without a block of the estimate's
/// allocator (empty, or not meta).
#[pyfunction]
fn meta_storage_recorded(cdata: usize) -> PyResult<Option<bool>> {
    if cdata == 0 {
        return Err(PyValueError::new_err("meta_storage_recorded: null StorageImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a storage the Python caller holds for this call.
    Ok(unsafe { gpu_mem_track_estimate::in_process::meta_storage_recorded(cdata as *const c_void) })
}

/// `with Unrecorded():` meta allocations this thread makes in the block are not recorded, nor
/// their frees: tensors that stand for no memory on any device (DTensor's sharding propagation's
/// global-shape fakes).
#[pyclass(name = "Unrecorded", module = "gpu_mem_track._native", unsendable)]
struct PyUnrecorded {
    guards: Vec<gpu_mem_track_estimate::in_process::UnrecordedMeta>,
}

#[pymethods]
impl PyUnrecorded {
    #[new]
    fn new() -> Self {
        Self { guards: Vec::new() }
    }

    fn __enter__(mut slf: PyRefMut<'_, Self>) -> PyRefMut<'_, Self> {
        slf.guards.push(gpu_mem_track_estimate::in_process::UnrecordedMeta::begin());
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&mut self, _exc: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.guards.pop();
        false
    }
}

/// Tags the recorded allocation of the tensor whose `c10::TensorImpl*` is `cdata` (`parameter`,
/// `buffer`, `input`, `gradient`, and what FSDP and DDP make: `sharded_parameter`, ...,
/// `ddp_bucket`). The first tag of an allocation stays.
#[pyfunction]
fn recording_tag(cdata: usize, category: &str) -> PyResult<()> {
    use gpu_mem_track_log::Category;
    // What the Python side tags; the rest the recorder judges from phases and lifetimes.
    const TAGGED: [Category; 11] = [
        Category::Parameter,
        Category::Buffer,
        Category::Input,
        Category::Gradient,
        Category::ShardedParameter,
        Category::UnshardedParameter,
        Category::ShardedGradient,
        Category::UnshardedGradient,
        Category::DdpBucket,
        Category::AllGatherBuffer,
        Category::ReduceScatterBuffer,
    ];
    let category = Category::from_name(category).filter(|c| TAGGED.contains(c)).ok_or_else(|| {
        let names: Vec<&str> = TAGGED.iter().map(|c| c.name()).collect();
        PyValueError::new_err(format!("unknown category {category:?} (use {})", names.join(", ")))
    })?;
    if cdata == 0 {
        return Err(PyValueError::new_err("recording_tag: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::recorder::tag_tensor_impl(cdata as *const c_void, category) };
    Ok(())
}

/// Tags the recorded allocation of the tensor whose `c10::TensorImpl*` is `cdata` as host memory
/// (FSDP's CPU offload): left out of the GPU figures, counted in `host_peak`.
#[pyfunction]
fn recording_host(cdata: usize) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("recording_host: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::recorder::tag_tensor_impl_host(cdata as *const c_void) };
    Ok(())
}

/// Whether the recorded allocation of the tensor whose `c10::TensorImpl*` is `cdata` is host
/// memory (`recording_host`).
#[pyfunction]
fn recording_is_host(cdata: usize) -> PyResult<bool> {
    if cdata == 0 {
        return Err(PyValueError::new_err("recording_is_host: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    Ok(unsafe { gpu_mem_track::recorder::tensor_impl_is_host(cdata as *const c_void) })
}

/// The canonical words of each option an estimate takes (`optimizer`, `dtype`, `precision`,
/// `shard`, ..., `category`, `phase`), from the Rust types: Python lists none itself.
#[pyfunction]
fn vocabulary() -> std::collections::BTreeMap<&'static str, Vec<String>> {
    use gpu_mem_track_estimate::vocabulary::{words, OPTIONS};
    OPTIONS.iter().map(|o| (*o, words(o).unwrap_or_default())).collect()
}

/// The canonical word of `value` for `option` (`canonical("optimizer", "sgd-momentum")` is
/// `"momentum"`); `ValueError` naming the option and its words otherwise.
#[pyfunction]
fn canonical(option: &str, value: &str) -> PyResult<String> {
    gpu_mem_track_estimate::vocabulary::canonical(option, value).map_err(PyValueError::new_err)
}

/// The `torch.optim` class name and keyword arguments (besides the parameters) of the optimizer
/// `name` (any of its spellings).
#[pyfunction]
fn torch_optimizer(name: &str) -> PyResult<(&'static str, std::collections::BTreeMap<&'static str, f64>)> {
    let optimizer: gpu_mem_track_estimate::Optimizer = parse_named("optimizer", name)?;
    let (class, kwargs) = optimizer.torch_optimizer();
    Ok((class, kwargs.iter().copied().collect()))
}

/// The torch dtype (`torch.float16`) of the precision `name` (any of its spellings).
#[pyfunction]
fn precision_dtype(name: &str) -> PyResult<String> {
    let precision: gpu_mem_track_estimate::Precision = parse_named("dtype", name)?;
    Ok(precision.dtype().torch_name())
}

/// Installs the live-tensor registry (once per process; later calls do nothing).
#[pyfunction]
fn install() -> PyResult<()> {
    gpu_mem_track::install().map_err(to_py)
}

/// Registers a live tensor by its `c10::TensorImpl*` (`Tensor._cdata`) under `name` (may be empty).
#[pyfunction]
#[pyo3(signature = (cdata, name=""))]
fn register_tensor(cdata: usize, name: &str) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("register_tensor: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::register_tensor_impl(cdata as *mut c_void, name) }.map_err(to_py)
}

/// Registers a buffer inductor's generated code allocated (`empty_strided_cpu`, past the
/// dispatcher) by its `c10::TensorImpl*` (`Tensor._cdata`): its log line says `inductor buffer`.
#[pyfunction]
fn register_inductor_buffer(cdata: usize) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("register_inductor_buffer: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::register_inductor_buffer_impl(cdata as *mut c_void) }.map_err(to_py)
}

/// Takes a live tensor, by its `c10::TensorImpl*` (`Tensor._cdata`), out of the registry: for
/// `torch.utils.swap_tensors`, which refuses tensors held weakly.
#[pyfunction]
fn forget_tensor(cdata: usize) -> PyResult<()> {
    if cdata == 0 {
        return Err(PyValueError::new_err("forget_tensor: null TensorImpl pointer"));
    }
    // SAFETY: `cdata` is the `_cdata` of a tensor the Python caller holds for this call.
    unsafe { gpu_mem_track::forget_tensor_impl(cdata as *mut c_void) }.map_err(to_py)
}

/// Names Python tensor classes for the log's class column, as `repr(cls)` does
/// (`module.qualname`); the classes are kept alive for the process (the registry keys them by
/// address). Classes named before keep their name.
#[pyfunction]
fn name_classes(py: Python<'_>, classes: Vec<Bound<'_, PyType>>) -> PyResult<()> {
    static KEPT: Mutex<Vec<Py<PyType>>> = Mutex::new(Vec::new());
    let mut named = Vec::with_capacity(classes.len());
    {
        let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
        for cls in classes {
            if kept.iter().any(|k| k.is(&cls)) {
                continue;
            }
            let module: String = cls.getattr("__module__")?.extract()?;
            let qualname: String = cls.getattr("__qualname__")?.extract()?;
            let name = if module == "builtins" { qualname } else { format!("{module}.{qualname}") };
            named.push((cls.as_ptr() as usize, name));
            kept.push(cls.unbind());
        }
    }
    // Without the GIL: the registry's lock may be held by a walk waiting for it.
    py.detach(|| {
        named.iter().try_for_each(|(ty, name)| {
            // SAFETY: KEPT holds a reference on each type for the rest of the process.
            unsafe { gpu_mem_track::name_python_class(*ty as *const c_void, name) }
        })
    })
    .map_err(to_py)
}

/// Whether this build reads the Python class of each tensor (built against torch 2.10 or later);
/// before, a leaf that requires grad reads as a Parameter.
#[pyfunction]
fn reads_python_classes() -> bool {
    gpu_mem_track::reads_python_classes()
}

/// Pauses (`False`) or resumes the registry's per-op callback (benchmarks).
#[pyfunction]
fn set_registry_enabled(enabled: bool) -> PyResult<()> {
    gpu_mem_track::set_registry_enabled(enabled).map_err(to_py)
}

/// Op callbacks the registry has received since it was installed.
#[pyfunction]
fn registry_callbacks() -> u64 {
    gpu_mem_track::registry_callbacks()
}

/// Bytes the wrapped CPU allocator holds now (0 before the registry is installed).
#[pyfunction]
fn cpu_allocated() -> u64 {
    gpu_mem_track::cpu_allocator_stats().map_or(0, |s| s.current)
}

/// `gpu-mem-track report` on `logs`: the text it prints and its `--json` dict, as JSON text.
/// Reading the logs detaches from the interpreter (a log may be long).
#[pyfunction]
#[pyo3(signature = (logs, top=5))]
fn report(py: Python<'_>, logs: Vec<PathBuf>, top: usize) -> PyResult<(String, String)> {
    use gpu_mem_track_log::report::{analyse_files, render_text};
    if logs.is_empty() {
        return Err(PyValueError::new_err("report(): give at least one log file"));
    }
    let combined = py.detach(|| analyse_files(&logs, top)).map_err(|e| to_py(Error::Log(e)))?;
    let json = serde_json::to_string(&combined).map_err(|e| GpuMemTrackError::new_err(e.to_string()))?;
    Ok((render_text(&combined), json))
}

/// Runs the `gpu-mem-track` command line (report, plot, watch, timeline) on `args`, the program
/// name first; returns its exit code.
#[pyfunction]
fn cli(py: Python<'_>, args: Vec<String>) -> u8 {
    py.detach(|| gpu_mem_track_cli::command::run_from(args))
}

/// What this build and this machine can do, as text.
#[pyfunction]
fn capabilities() -> String {
    gpu_mem_track::capabilities().to_string()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("TORCH_VERSION", gpu_mem_track::LIBTORCH_VERSION)?;
    m.add("BUILD_MARKER", BUILT_AGAINST)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("GpuMemTrackError", m.py().get_type::<GpuMemTrackError>())?;
    m.add("DEFAULT_GPU_TARGET", gpu_mem_track_estimate::vocabulary::DEFAULT_GPU_TARGET)?;
    m.add("NOT_ONE_GPU", gpu_mem_track_estimate::vocabulary::NOT_ONE_GPU.to_vec())?;
    m.add_class::<PyTracker>()?;
    m.add_class::<PyRecording>()?;
    m.add_class::<PyFinished>()?;
    m.add_class::<PyUnrecorded>()?;
    m.add_function(wrap_pyfunction!(meta_storage_resize, m)?)?;
    m.add_function(wrap_pyfunction!(meta_storage_recorded, m)?)?;
    m.add_function(wrap_pyfunction!(fit_search, m)?)?;
    m.add_function(wrap_pyfunction!(recording_phase, m)?)?;
    m.add_function(wrap_pyfunction!(meta_target_device, m)?)?;
    m.add_function(wrap_pyfunction!(recording_site, m)?)?;
    m.add_function(wrap_pyfunction!(recording_tag, m)?)?;
    m.add_function(wrap_pyfunction!(recording_host, m)?)?;
    m.add_function(wrap_pyfunction!(recording_is_host, m)?)?;
    m.add_function(wrap_pyfunction!(recording_owner, m)?)?;
    m.add_function(wrap_pyfunction!(vocabulary, m)?)?;
    m.add_function(wrap_pyfunction!(canonical, m)?)?;
    m.add_function(wrap_pyfunction!(torch_optimizer, m)?)?;
    m.add_function(wrap_pyfunction!(precision_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(install, m)?)?;
    m.add_function(wrap_pyfunction!(register_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(register_inductor_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(forget_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(name_classes, m)?)?;
    m.add_function(wrap_pyfunction!(reads_python_classes, m)?)?;
    m.add_function(wrap_pyfunction!(set_registry_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(registry_callbacks, m)?)?;
    m.add_function(wrap_pyfunction!(capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_allocated, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(report, m)?)?;
    Ok(())
}
