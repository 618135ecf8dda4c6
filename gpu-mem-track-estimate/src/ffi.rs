//! Safe wrappers over `gpu-mem-track-estimate-sys` (the estimator's C++) and what the estimator
//! reads of the tracker's shim through `gpu-mem-track-sys` (its error and table helpers): TorchScript
//! and static estimates, tch models moved to meta, the shim's optimizers, the meta
//! allocator, hand-written meta kernels and the CPU-means-meta mode, saved-for-backward capture.
//! The only module of this crate with `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::ffi::{c_int, CStr, CString};
#[cfg(feature = "tch")]
use std::ptr::NonNull;

use gpu_mem_track::recorder::{self, AllocEvent};
use gpu_mem_track::DeviceKind;
use gpu_mem_track_estimate_sys as esys;
use gpu_mem_track_log::DType;
use gpu_mem_track_sys as sys;
use sys::copy_table;

use crate::error::{Error, Result};
use crate::exported;
use crate::figures::{AttentionKernels, CpuTensors, FallbackOp, ModelSizes, StaticEstimate};

use sys::safe::bytes;

/// A failed shim call is the tracker's [`Libtorch`](gpu_mem_track::Error::Libtorch) error: one
/// error for libtorch's failures, whichever crate made the call.
impl From<sys::safe::ShimError> for Error {
    fn from(e: sys::safe::ShimError) -> Self {
        Error::Tracker(e.into())
    }
}

/// Turns a shim error (owned C string or null) into a typed error.
fn check(call: &'static str, err: sys::gmt_error) -> Result<()> {
    // SAFETY: `err` is what a shim call returned (every caller passes a call's result).
    Ok(unsafe { sys::safe::check(call, err) }?)
}

/// [`check`] for a call that names its failure's kind (`gmt_failure`): a model the run rejects is
/// [`Error::Input`] (its message, on one line), an op without a kernel on meta is
/// [`Error::MissingMetaKernel`] (`all` left for the caller, who can read the graph).
fn check_run(
    call: &'static str,
    err: sys::gmt_error,
    failure: i32,
    failed_op: &[std::os::raw::c_char],
) -> Result<()> {
    if err.is_null() || failure == esys::GMT_FAILURE_NONE {
        return check(call, err);
    }
    // SAFETY: a non-null error is a malloc'd string the shim handed over.
    let message = unsafe { take_shim_string(err) };
    Err(match failure {
        esys::GMT_FAILURE_NO_META_KERNEL => {
            Error::MissingMetaKernel { op: fixed_c_str(failed_op), all: Vec::new() }
        }
        _ => Error::Input(message.lines().filter(|l| !l.trim().is_empty()).collect::<Vec<_>>().join(" ")),
    })
}

fn c_string(call: &'static str, s: &str) -> Result<CString> {
    Ok(sys::safe::c_string(call, s)?)
}

/// The optimizers the shim implements for tch estimates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptimizerKind {
    None,
    Sgd,
    SgdMomentum,
    Adam,
    AdamW,
}

impl From<gpu_mem_track_gpu::options::Optimizer> for OptimizerKind {
    fn from(o: gpu_mem_track_gpu::options::Optimizer) -> Self {
        match o {
            gpu_mem_track_gpu::options::Optimizer::Sgd => OptimizerKind::Sgd,
            gpu_mem_track_gpu::options::Optimizer::SgdMomentum => OptimizerKind::SgdMomentum,
            gpu_mem_track_gpu::options::Optimizer::Adam => OptimizerKind::Adam,
            gpu_mem_track_gpu::options::Optimizer::AdamW => OptimizerKind::AdamW,
        }
    }
}

impl OptimizerKind {
    fn code(self) -> i32 {
        match self {
            OptimizerKind::None => esys::GMT_OPT_NONE,
            OptimizerKind::Sgd => esys::GMT_OPT_SGD,
            OptimizerKind::SgdMomentum => esys::GMT_OPT_SGD_MOMENTUM,
            OptimizerKind::Adam => esys::GMT_OPT_ADAM,
            OptimizerKind::AdamW => esys::GMT_OPT_ADAMW,
        }
    }
}

/// `.item()` calls on meta tensors since the process started (each returned 0).
fn meta_scalar_reads() -> u64 {
    // SAFETY: reads an atomic counter.
    bytes(unsafe { esys::gmt_meta_scalar_reads() })
}

/// Whether LSTM and GRU on meta take cuDNN's path, as on a CUDA device (the default), or
/// PyTorch's own, as on the CPU.
pub(crate) fn meta_rnn_follows_cudnn(on: bool) {
    // SAFETY: stores an atomic flag.
    unsafe { esys::gmt_meta_rnn_follows_cudnn(c_int::from(on)) }
}

/// The GPU meta runs stand for, by compute capability (attention's kernel choice).
pub(crate) fn meta_target_device((major, minor): (u32, u32)) {
    let int = |v: u32| c_int::try_from(v).unwrap_or(c_int::MAX);
    // SAFETY: stores an atomic.
    unsafe { esys::gmt_meta_target_device(int(major), int(minor)) }
}

/// `scaled_dot_product_attention` calls on meta since the process started, per kernel taken.
fn meta_attention_kernels() -> AttentionKernels {
    let mut calls = [0i64; 3];
    // SAFETY: `calls` holds the three elements the shim writes.
    unsafe { esys::gmt_meta_attention_kernels(calls.as_mut_ptr()) };
    AttentionKernels { flash: bytes(calls[0]), efficient: bytes(calls[1]), math: bytes(calls[2]) }
}

/// What the shim reports of a TorchScript (or tch) run besides its recording.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunFigures {
    pub sizes: ModelSizes,
    /// `.item()` calls on meta tensors during the run (each returned 0).
    pub meta_scalar_reads: u64,
    /// Ops that ran their CPU kernel for want of a Meta kernel during the run.
    pub cpu_fallback: Vec<FallbackOp>,
    /// CPU tensors made or met while the CPU meant meta.
    pub cpu_tensors: CpuTensors,
    /// The kernel each attention call took during the run.
    pub attention: AttentionKernels,
}

/// Calls and bytes of every op that went through the meta-via-CPU fallback since the process
/// started, by op.
fn meta_fallback_counts() -> Vec<FallbackOp> {
    copy_table(|cap| {
        let mut ops = vec![std::ptr::null(); cap];
        let mut calls = vec![0i64; cap];
        let mut sizes = vec![0i64; cap];
        // SAFETY: the three buffers hold `cap` elements; the shim fills at most `cap` under its lock.
        let n = unsafe {
            esys::gmt_meta_fallback_counts(ops.as_mut_ptr(), calls.as_mut_ptr(), sizes.as_mut_ptr(), cap)
        };
        let counts = (0..n.min(cap))
            .map(|i| FallbackOp {
                // SAFETY: non-null names are map keys that live (unmoved) for the process.
                op: if ops[i].is_null() {
                    String::new()
                } else {
                    unsafe { CStr::from_ptr(ops[i]) }.to_string_lossy().into_owned()
                },
                calls: bytes(calls[i]),
                bytes: bytes(sizes[i]),
            })
            .collect();
        (n, counts)
    })
}

/// The cuDNN workspace bound of each convolution call the meta kernels ran since the table was
/// last taken, by the allocation id of the call's first output; empties the table.
pub(crate) fn take_conv_workspaces() -> std::collections::BTreeMap<i64, u64> {
    let table = copy_table(|cap| {
        let mut ids = vec![0i64; cap];
        let mut sizes = vec![0i64; cap];
        // SAFETY: both buffers hold `cap` elements; the shim fills at most `cap` under its lock.
        let n = unsafe { esys::gmt_conv_workspaces(ids.as_mut_ptr(), sizes.as_mut_ptr(), cap) };
        (n, ids.into_iter().zip(sizes.into_iter().map(bytes)).take(n.min(cap)).collect())
    });
    // SAFETY: takes the shim's lock; no pointers.
    unsafe { esys::gmt_conv_workspaces_clear() };
    table
}

/// The fallback's counts since `before` (a run's own), busiest first.
fn meta_fallback_since(before: &[FallbackOp]) -> Vec<FallbackOp> {
    let mut out: Vec<FallbackOp> = meta_fallback_counts()
        .into_iter()
        .filter_map(|mut now| {
            if let Some(b) = before.iter().find(|b| b.op == now.op) {
                now.calls -= b.calls.min(now.calls);
                now.bytes -= b.bytes.min(now.bytes);
            }
            (now.calls > 0).then_some(now)
        })
        .collect();
    out.sort_by(|a, b| b.calls.cmp(&a.calls).then(a.op.cmp(&b.op)));
    out
}

/// What the meta kernels count, taken when a run starts and compared when it ends. Taking it
/// also empties the convolution workspace table, which a failed run before may have left filled.
pub(crate) struct MetaCounters {
    scalar_reads: u64,
    fallback: Vec<FallbackOp>,
    attention: AttentionKernels,
}

impl MetaCounters {
    pub(crate) fn begin() -> Self {
        take_conv_workspaces();
        MetaCounters {
            scalar_reads: meta_scalar_reads(),
            fallback: meta_fallback_counts(),
            attention: meta_attention_kernels(),
        }
    }

    /// The run's scalar reads of meta tensors, its CPU fallback counts (busiest first) and its
    /// attention kernels.
    pub(crate) fn since(&self) -> (u64, Vec<FallbackOp>, AttentionKernels) {
        let attention = meta_attention_kernels().since(&self.attention);
        (meta_scalar_reads() - self.scalar_reads, meta_fallback_since(&self.fallback), attention)
    }
}

/// Options of a TorchScript estimate, owned on the Rust side.
pub(crate) struct EstimateCall<'a> {
    pub path: &'a std::path::Path,
    pub input_shape: &'a [i64],
    pub dtype: DType,
    pub input_is_index: bool,
    pub train: bool,
    pub optimizer: OptimizerKind,
    pub iterations: i32,
    pub device_kind: DeviceKind,
    pub eager_lifetimes: bool,
}

/// Runs a TorchScript model with the allocation recorder on; returns its sizes, the recorded
/// events and the op names they refer to.
pub(crate) fn estimate_torchscript(
    call: &EstimateCall<'_>,
) -> Result<(RunFigures, Vec<AllocEvent>, Vec<String>)> {
    let path = c_string("estimate", &call.path.to_string_lossy())?;
    let opts = esys::gmt_estimate_options {
        path: path.as_ptr(),
        input_shape: call.input_shape.as_ptr(),
        input_ndim: call.input_shape.len() as i32,
        dtype: call.dtype.scalar_type(),
        input_is_index: call.input_is_index as i32,
        train: call.train as i32,
        optimizer: call.optimizer.code(),
        iterations: call.iterations,
        device_kind: call.device_kind.code(),
        eager_lifetimes: call.eager_lifetimes as i32,
    };
    // A torch.export archive: its program, built in the C++ before the run.
    let program = if exported::is_exported_program(call.path) {
        Some(ExportedProgram::read(call.path, call.input_shape)?)
    } else {
        None
    };
    let mut opts = opts;
    if let Some(input) = program.as_ref().and_then(|p| p.input_dtype) {
        // The program says what its input is: integer token ids or floats.
        opts.input_is_index = i32::from(!matches!(input, 5 | 6 | 7 | 15));
    }
    let meta = MetaCounters::begin();
    let cpu_before = cpu_means_meta_counts();
    let mut raw = esys::gmt_estimate_result::default();
    match &program {
        Some(p) => {
            // SAFETY: `program` is live; `opts` points at live buffers (`path`, `input_shape`) for
            // the call; `raw` is a valid out-pointer.
            let err = unsafe { esys::gmt_estimate_exported(p.raw.as_ptr(), &opts, &mut raw) };
            check_run("estimate", err, raw.failure, &raw.failed_op)?
        }
        None => {
            // SAFETY: as above.
            let err = unsafe { esys::gmt_estimate_torchscript(&opts, &mut raw) };
            check_run("estimate", err, raw.failure, &raw.failed_op)?
        }
    }
    let (meta_scalar_reads, cpu_fallback, attention) = meta.since();
    let run = RunFigures {
        sizes: ModelSizes {
            param_count: bytes(raw.param_count),
            param_bytes: bytes(raw.param_bytes),
            buffer_bytes: bytes(raw.buffer_bytes),
            input_bytes: bytes(raw.input_bytes),
            grad_bytes: bytes(raw.grad_bytes),
            optimizer_state_bytes: bytes(raw.optimizer_state_bytes),
        },
        meta_scalar_reads,
        cpu_fallback,
        attention,
        cpu_tensors: {
            // The shim's mode ran on this thread inside the call.
            let (made, moved) = cpu_means_meta_counts();
            CpuTensors {
                made_on_cpu: u64::try_from(made - cpu_before.0).unwrap_or(0),
                moved_to_meta: u64::try_from(moved - cpu_before.1).unwrap_or(0),
                examples: take_cpu_means_meta_examples(),
            }
        },
    };
    let (events, names) = recorder::events();
    Ok((run, events, names))
}

/// A torch.export program built in the estimator's C++ (`exported_program.cpp`), freed on drop.
pub(crate) struct ExportedProgram {
    raw: std::ptr::NonNull<std::ffi::c_void>,
    /// The first user input's c10::ScalarType.
    input_dtype: Option<i32>,
}

impl ExportedProgram {
    /// Reads a `.pt2` archive's program and builds it, for a run on an input of `input_shape`.
    pub(crate) fn read(path: &std::path::Path, input_shape: &[i64]) -> Result<Self> {
        let c_path = c_string("read a torch.export archive", &path.to_string_lossy())?;
        let mut json: *mut std::os::raw::c_char = std::ptr::null_mut();
        // SAFETY: `c_path` lives across the call; `json` is a valid out-pointer.
        check("read a torch.export archive", unsafe {
            esys::gmt_exported_program_json(c_path.as_ptr(), &mut json)
        })?;
        // SAFETY: set by the shim on success, owned by us.
        let text = unsafe { take_shim_string(json) };
        let program = exported::parse(&text, path)?;
        match program.first_input() {
            // Static shapes are baked into the graph (views, expands): another input would not run.
            Some(i) if !i.dynamic && i.sizes != input_shape => {
                return Err(Error::Input(format!(
                    "{} was exported for an input of {:?}: a torch.export program's shapes are fixed when it \
                     is exported, so estimate it with --input {} (or export it for the shape to estimate, or \
                     with a dynamic batch dimension)",
                    path.display(),
                    i.sizes,
                    i.sizes.iter().map(i64::to_string).collect::<Vec<_>>().join("x")
                )))
            }
            None => {
                return Err(Error::Input(format!("{}: the program takes no tensor input", path.display())))
            }
            _ => {}
        }
        Self::build(&program)
    }

    fn build(p: &exported::Program) -> Result<Self> {
        // SAFETY: allocation; null on failure.
        let raw = std::ptr::NonNull::new(unsafe { esys::gmt_exported_program_new() }).ok_or_else(|| {
            Error::from(sys::safe::ShimError {
                call: "torch.export program",
                message: "out of memory".into(),
            })
        })?;
        let built = ExportedProgram { raw, input_dtype: p.first_input().map(|i| i.dtype) };
        for ph in &p.placeholders {
            let name = c_string("torch.export placeholder", &ph.name)?;
            // SAFETY: `built.raw` is live; the name and both dims buffers live across the call and
            // hold `sizes.len()` elements (the parser checked that both lists have one length).
            check("torch.export placeholder", unsafe {
                esys::gmt_exported_program_placeholder(
                    built.raw.as_ptr(),
                    name.as_ptr(),
                    ph.role as i32,
                    ph.sizes.as_ptr(),
                    ph.strides.as_ptr(),
                    ph.sizes.len().min(ph.strides.len()),
                    ph.dtype,
                    i32::from(ph.requires_grad),
                )
            })?;
        }
        for n in &p.nodes {
            built.node(n)?;
        }
        // SAFETY: `built.raw` is live; the buffer holds `outputs.len()` ids.
        check("torch.export outputs", unsafe {
            esys::gmt_exported_program_outputs(built.raw.as_ptr(), p.outputs.as_ptr(), p.outputs.len())
        })?;
        Ok(built)
    }

    fn node(&self, n: &exported::Node) -> Result<()> {
        use exported::Arg;
        let (op, overload) =
            (c_string("torch.export node", &n.op)?, c_string("torch.export node", &n.overload)?);
        // Every buffer an argument points at, kept alive until the call returns.
        let mut names = Vec::with_capacity(n.args.len());
        let mut strings = Vec::new();
        let mut int_lists: Vec<Vec<i64>> = Vec::new();
        let mut float_lists: Vec<Vec<f64>> = Vec::new();
        let mut raw = Vec::with_capacity(n.args.len());
        for (name, a) in &n.args {
            names.push(c_string("torch.export argument", name)?);
            let mut r = esys::gmt_exported_arg {
                kind: esys::GMT_EXPORTED_ARG_NONE,
                name: std::ptr::null(),
                i: 0,
                f: 0.0,
                ints: std::ptr::null(),
                floats: std::ptr::null(),
                n: 0,
                s: std::ptr::null(),
            };
            let mut ints = |v: Vec<i64>, r: &mut esys::gmt_exported_arg| {
                r.n = v.len();
                int_lists.push(v);
                r.ints = int_lists.last().map_or(std::ptr::null(), |l| l.as_ptr());
            };
            match a {
                Arg::None => {}
                Arg::Tensor(id) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_TENSOR, *id),
                Arg::Tensors(ids) => {
                    r.kind = esys::GMT_EXPORTED_ARG_TENSORS;
                    ints(ids.clone(), &mut r);
                }
                Arg::OptionalTensors(ids) => {
                    r.kind = esys::GMT_EXPORTED_ARG_OPTIONAL_TENSORS;
                    ints(ids.clone(), &mut r);
                }
                Arg::Int(v) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_INT, *v),
                Arg::Ints(v) => {
                    r.kind = esys::GMT_EXPORTED_ARG_INTS;
                    ints(v.clone(), &mut r);
                }
                Arg::Float(v) => (r.kind, r.f) = (esys::GMT_EXPORTED_ARG_FLOAT, *v),
                Arg::Floats(v) => {
                    r.kind = esys::GMT_EXPORTED_ARG_FLOATS;
                    r.n = v.len();
                    float_lists.push(v.clone());
                    r.floats = float_lists.last().map_or(std::ptr::null(), |l| l.as_ptr());
                }
                Arg::Bool(v) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_BOOL, i64::from(*v)),
                Arg::Bools(v) => {
                    r.kind = esys::GMT_EXPORTED_ARG_BOOLS;
                    ints(v.iter().map(|&b| i64::from(b)).collect(), &mut r);
                }
                Arg::Str(v) | Arg::Device(v, _) => {
                    r.kind = if matches!(a, Arg::Str(_)) {
                        esys::GMT_EXPORTED_ARG_STRING
                    } else {
                        esys::GMT_EXPORTED_ARG_DEVICE
                    };
                    if let Arg::Device(_, index) = a {
                        r.i = *index;
                    }
                    strings.push(c_string("torch.export argument", v)?);
                    r.s = strings.last().map_or(std::ptr::null(), |s| s.as_ptr());
                }
                Arg::ScalarType(v) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_SCALAR_TYPE, i64::from(*v)),
                Arg::MemoryFormat(v) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_MEMORY_FORMAT, i64::from(*v)),
                Arg::Layout(v) => (r.kind, r.i) = (esys::GMT_EXPORTED_ARG_LAYOUT, i64::from(*v)),
            }
            raw.push(r);
        }
        for (r, name) in raw.iter_mut().zip(&names) {
            r.name = name.as_ptr();
        }
        let outputs: Vec<i64> = n.outputs.iter().flatten().copied().collect();
        // SAFETY: `self.raw` is live; every pointer in `raw` points into `names`, `strings`,
        // `int_lists` or `float_lists` (vectors whose heap buffers do not move when the outer
        // vectors grow), all alive until the call returns; the C++ copies what it keeps.
        check("torch.export node", unsafe {
            esys::gmt_exported_program_node(
                self.raw.as_ptr(),
                op.as_ptr(),
                overload.as_ptr(),
                raw.as_ptr(),
                raw.len(),
                outputs.as_ptr(),
                outputs.len(),
                n.frees.as_ptr(),
                n.frees.len(),
                n.values,
            )
        })
    }
}

impl Drop for ExportedProgram {
    fn drop(&mut self) {
        // SAFETY: made by gmt_exported_program_new, freed once.
        unsafe { esys::gmt_exported_program_free(self.raw.as_ptr()) }
    }
}

/// Forward passes of TorchScript models this process has run.
pub(crate) fn forward_passes() -> u64 {
    // SAFETY: reads an atomic counter.
    bytes(unsafe { esys::gmt_estimate_forward_passes() })
}

#[cfg(feature = "tch")]
/// Live bytes on the meta device (tracking meta allocator).
pub(crate) fn meta_allocator_current() -> u64 {
    // SAFETY: reads an atomic counter.
    bytes(unsafe { esys::gmt_meta_allocator_current() })
}

/// Static TorchScript estimate (shape propagation + liveness).
pub(crate) fn estimate_static(
    path: &std::path::Path,
    shape: &[i64],
    dtype: DType,
    is_index: bool,
) -> Result<StaticEstimate> {
    let path = c_string("static estimate", &path.to_string_lossy())?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut out: esys::gmt_static_result = unsafe { std::mem::zeroed() };
    // SAFETY: `path` and `shape` are live for the call; `out` is a valid out-pointer.
    let err = unsafe {
        esys::gmt_estimate_static(
            path.as_ptr(),
            shape.as_ptr(),
            shape.len() as i32,
            dtype.scalar_type(),
            is_index as i32,
            &mut out,
        )
    };
    check_run("static estimate", err, out.failure, &[])?;
    Ok(StaticEstimate {
        activation_peak: bytes(out.activation_peak),
        param_bytes: bytes(out.param_bytes),
        nodes: bytes(out.nodes),
        unknown_shapes: bytes(out.unknown_shapes),
        peak_op: fixed_c_str(&out.peak_op),
        seconds: out.seconds,
    })
}

/// A fixed-size C string field as text.
fn fixed_c_str(field: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = field.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(feature = "tch")]
/// Moves a tch variable's data to the meta device or the CPU in place (same variable, new
/// storage), converting floating dtypes to `scalar_type` (-1 keeps them).
pub(crate) fn tensor_to_device_in_place(
    t: &tch::Tensor,
    device_kind: DeviceKind,
    dtype: Option<DType>,
) -> Result<()> {
    let scalar_type = dtype.map_or(-1, DType::scalar_type);
    // SAFETY: `as_ptr` is tch's live at::Tensor*; set_data mutates the TensorImpl behind it, which
    // is what every handle on this variable shares (the intent: the VarStore sees the new data).
    check("move to device", unsafe {
        esys::gmt_tensor_to_device_in_place(t.as_ptr() as *mut c_void, device_kind.code(), scalar_type)
    })
}

#[cfg(feature = "tch")]
/// Tags a tensor's allocation as a parameter in the current recording.
pub(crate) fn tag_parameter_tensor(t: &tch::Tensor) -> Result<()> {
    // SAFETY: a live at::Tensor* borrowed for the call.
    check("tag parameter", unsafe { esys::gmt_tag_parameter_tensor(t.as_ptr() as *const c_void) })
}

#[cfg(feature = "tch")]
/// A new tensor on the meta device or the CPU (random floats, zero integers).
pub(crate) fn make_tensor(shape: &[i64], dtype: DType, device_kind: DeviceKind) -> Result<tch::Tensor> {
    let (scalar_type, device_kind) = (dtype.scalar_type(), device_kind.code());
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `shape` lives for the call; `out` receives a new at::Tensor* we take ownership of.
    check("make tensor", unsafe {
        esys::gmt_make_tensor(shape.as_ptr(), shape.len() as i32, scalar_type, device_kind, &mut out)
    })?;
    // SAFETY: the shim allocated a fresh at::Tensor with `new`; tch frees it with delete.
    Ok(unsafe { tch::Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

#[cfg(feature = "tch")]
/// Optimizer state driven by the shim (the same foreach updates as TorchScript estimates).
pub(crate) struct ShimOptimizer(NonNull<c_void>);

#[cfg(feature = "tch")]
impl ShimOptimizer {
    pub(crate) fn new(kind: OptimizerKind) -> Result<Self> {
        // SAFETY: allocation; null on failure.
        NonNull::new(unsafe { esys::gmt_optimizer_new(kind.code()) }).map(ShimOptimizer).ok_or_else(|| {
            Error::from(sys::safe::ShimError { call: "optimizer", message: "out of memory".into() })
        })
    }

    pub(crate) fn step(&mut self, params: &[tch::Tensor]) -> Result<()> {
        let ptrs: Vec<*const c_void> = params.iter().map(|t| t.as_ptr() as *const c_void).collect();
        // SAFETY: `self.0` is a live optimizer we own; the tensor pointers are borrowed for the call.
        check("optimizer step", unsafe {
            esys::gmt_optimizer_step(self.0.as_ptr(), ptrs.as_ptr(), ptrs.len())
        })
    }

    pub(crate) fn state_bytes(&self) -> u64 {
        // SAFETY: reads the live optimizer's state sizes.
        unsafe { esys::gmt_optimizer_state_bytes(self.0.as_ptr()) }.max(0) as u64
    }
}

#[cfg(feature = "tch")]
impl Drop for ShimOptimizer {
    fn drop(&mut self) {
        // SAFETY: allocated by gmt_optimizer_new, freed once.
        unsafe { esys::gmt_optimizer_free(self.0.as_ptr()) }
    }
}

#[cfg(feature = "tch")]
/// Drops the gradients of `params` (set_to_none), returning the bytes they held.
pub(crate) fn grads_set_to_none(params: &[tch::Tensor]) -> Result<u64> {
    let ptrs: Vec<*const c_void> = params.iter().map(|t| t.as_ptr() as *const c_void).collect();
    let mut bytes = 0i64;
    // SAFETY: tensor pointers borrowed for the call; `bytes` is a valid out-pointer.
    check("zero_grad", unsafe { esys::gmt_grads_set_to_none(ptrs.as_ptr(), ptrs.len(), &mut bytes) })?;
    Ok(bytes.max(0) as u64)
}

pub(crate) fn meta_allocator_install() -> Result<()> {
    // SAFETY: idempotent installation.
    check("meta allocator", unsafe { esys::gmt_meta_allocator_install() })
}

/// Resizes a meta storage as a GPU storage resizes: a new allocation of `nbytes` (none for 0)
/// replaces the old one, and the recorder sees both (`UntypedStorage.resize_`, with which FSDP frees
/// and re-allocates unsharded parameters; libtorch's own meta resize only sets the size).
///
/// # Errors
/// [`Error::Tracker`] for a storage that is not on meta or not resizable, or an `nbytes` over
/// `i64::MAX`.
///
/// # Safety
/// `storage_impl` is a live `c10::StorageImpl*` (Python's `UntypedStorage._cdata`) that no other
/// thread uses during the call.
pub unsafe fn resize_meta_storage(storage_impl: *mut c_void, nbytes: u64) -> Result<()> {
    let nbytes =
        i64::try_from(nbytes).map_err(|_| Error::Input(format!("storage size {nbytes} B is over 2^63")))?;
    // SAFETY: the caller's promise; the shim checks the device and resizability.
    check("meta storage resize", unsafe { esys::gmt_meta_storage_resize(storage_impl, nbytes) })
}

/// Whether the meta storage `storage_impl` holds recorded memory: `Some(false)` for one made while
/// unrecorded (the program's own meta tensors, which stand for no GPU memory), `None` when the
/// tracking allocator made no block of it (an empty storage, or one not on meta).
///
/// # Safety
/// `storage_impl` is a live `c10::StorageImpl*` (Python's `UntypedStorage._cdata`) for the call.
pub unsafe fn meta_storage_recorded(storage_impl: *const c_void) -> Option<bool> {
    // SAFETY: the caller's promise; the shim only reads the storage's device and DataPtr.
    match unsafe { esys::gmt_meta_storage_recorded(storage_impl) } {
        1 => Some(true),
        0 => Some(false),
        _ => None,
    }
}

/// While alive, meta allocations this thread makes (and their frees) are not recorded: tensors
/// that stand for no memory on any device, as the global-shape fakes DTensor's sharding
/// propagation runs an op on to learn its output's shape. Guards nest.
pub struct UnrecordedMeta {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl UnrecordedMeta {
    /// Starts an unrecorded span on this thread.
    pub fn begin() -> Self {
        // SAFETY: bumps a thread-local counter, undone on drop on this thread (the guard is not Send).
        unsafe { esys::gmt_meta_unrecorded_begin() };
        Self { _not_send: std::marker::PhantomData }
    }
}

impl Drop for UnrecordedMeta {
    fn drop(&mut self) {
        // SAFETY: ends the span `begin` started on this thread.
        unsafe { esys::gmt_meta_unrecorded_end() }
    }
}

/// The ops with a hand-written meta kernel in the shim.
pub(crate) fn meta_kernels_registered() -> Vec<String> {
    let mut n = 0usize;
    // SAFETY: returns a static array of `n` static NUL-terminated names.
    let names = unsafe { esys::gmt_meta_kernels_registered(&mut n) };
    (0..n)
        // SAFETY: `i < n`, and every entry is a static C string.
        .map(|i| unsafe { CStr::from_ptr(*names.add(i)) }.to_string_lossy().into_owned())
        .collect()
}

/// Runs every hand-written meta kernel against the CPU kernel of the same op
/// (`gpu-mem-track-estimate-sys/csrc/meta_kernel_check.cpp`): one `(op, shapes, verdict)` a case, verdict `ok` or what
/// differs.
pub(crate) fn meta_kernels_check() -> Result<Vec<(String, String, String)>> {
    let mut report: *mut std::os::raw::c_char = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; on success the shim stores a malloc'ed string we own.
    check("meta kernel check", unsafe { esys::gmt_meta_kernels_check(&mut report) })?;
    // SAFETY: set by the shim on success (or left null), owned by us.
    let text = unsafe { take_shim_string(report) };
    Ok(report_fields(&text)
        .map(|mut f| {
            f.resize(3, String::new());
            (std::mem::take(&mut f[0]), std::mem::take(&mut f[1]), std::mem::take(&mut f[2]))
        })
        .collect())
}

/// "The CPU means meta" on this thread while the guard lives: factories asked for the CPU make
/// meta tensors and CPU tensors that reach an op become meta twins (`gpu-mem-track-estimate-sys/csrc/cpu_means_meta.cpp`).
/// Thread-local in libtorch, so the guard stays on the thread that made it.
pub(crate) struct CpuMeansMeta {
    made_before: i64,
    moved_before: i64,
    _not_send: std::marker::PhantomData<*const ()>,
}

fn cpu_means_meta_counts() -> (i64, i64) {
    let (mut made, mut moved) = (0i64, 0i64);
    // SAFETY: two valid out-pointers; reads this thread's counters.
    unsafe { esys::gmt_cpu_means_meta_counts(&mut made, &mut moved) };
    (made, moved)
}

impl CpuMeansMeta {
    /// `copies_too`: copies to the CPU (`to`, `_to_copy`) stay on meta as well (TorchScript).
    pub(crate) fn begin(copies_too: bool) -> Result<Self> {
        let (made_before, moved_before) = cpu_means_meta_counts();
        // SAFETY: sets this thread's dispatch-key state; undone by `end` on drop, on this thread.
        check("cpu means meta", unsafe { esys::gmt_cpu_means_meta_begin(i32::from(copies_too)) })?;
        // The examples of an earlier span are not this one's.
        let _ = take_cpu_means_meta_examples();
        Ok(Self { made_before, moved_before, _not_send: std::marker::PhantomData })
    }

    /// What this span saw so far.
    pub(crate) fn counts(&self) -> CpuTensors {
        let (made, moved) = cpu_means_meta_counts();
        CpuTensors {
            made_on_cpu: u64::try_from(made - self.made_before).unwrap_or(0),
            moved_to_meta: u64::try_from(moved - self.moved_before).unwrap_or(0),
            examples: take_cpu_means_meta_examples(),
        }
    }
}

fn take_cpu_means_meta_examples() -> Vec<String> {
    // SAFETY: the shim returns a malloc'ed NUL-terminated string (or null), owned by us.
    let text = unsafe { take_shim_string(esys::gmt_cpu_means_meta_examples()) };
    text.lines().map(str::to_owned).collect()
}

/// Copies out and frees a string the shim allocated; null is the empty string.
///
/// # Safety
/// As [`sys::take_string`].
unsafe fn take_shim_string(raw: *mut std::os::raw::c_char) -> String {
    // SAFETY: the caller's promise.
    unsafe { sys::take_string(raw) }.unwrap_or_default()
}

/// Tab-separated lines of a shim report, as fields.
fn report_fields(text: &str) -> impl Iterator<Item = Vec<String>> + '_ {
    text.lines().map(|l| l.split('\t').map(str::to_owned).collect())
}

/// Every aten op of a TorchScript model's forward that can run neither on meta nor on the CPU
/// through the fallback: `(schema, where it is called)`.
pub(crate) fn script_ops_without_meta(path: &std::path::Path) -> Result<Vec<(String, String)>> {
    let path = c_string("ops without meta", &path.to_string_lossy())?;
    let mut report: *mut std::os::raw::c_char = std::ptr::null_mut();
    // SAFETY: `path` lives across the call; `report` is a valid out-pointer.
    check("ops without meta", unsafe { esys::gmt_script_ops_without_meta(path.as_ptr(), &mut report) })?;
    // SAFETY: set by the shim on success (or left null), owned by us.
    let text = unsafe { take_shim_string(report) };
    Ok(report_fields(&text)
        .map(|mut f| {
            f.resize(2, String::new());
            (std::mem::take(&mut f[0]), std::mem::take(&mut f[1]))
        })
        .collect())
}

impl Drop for CpuMeansMeta {
    fn drop(&mut self) {
        // SAFETY: the matching end of `begin`, on the same thread (the guard is not Send).
        unsafe { esys::gmt_cpu_means_meta_end() }
    }
}
