//! # gpu-mem-track
//!
//! Line-by-line memory tracking for programs that train models with [`tch`] (libtorch): every
//! [`track!`] call walks the live tensors on the tracked device, the allocator's counters and
//! NVML's view of the GPU, and appends what changed since the previous call to
//! `logs/<timestamp>-gpu_mem_track.txt`, in the format of the Python tool Pytorch-Memory-Utils
//! (with its bugs fixed), so `tail -f` shows where memory goes.
//!
//! ```
//! use gpu_mem_track::{track, MemTracker, TrackedDevice};
//! use tch::{Device, Kind, Tensor};
//!
//! let dir = std::env::temp_dir();
//! let tracker = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(&dir).build()?;
//! track!(tracker);                                          // header + first block
//! let x = Tensor::zeros([40, 3, 512, 512], (Kind::Float, Device::Cpu));
//! let point = track!(tracker).expect("tracked");
//! assert_eq!(point.tensor_bytes, 40 * 3 * 512 * 512 * 4);
//! drop(x);
//! track!(tracker);
//! assert_eq!(tracker.clear_cache()?, 0);                    // CUDA: empty_cache; CPU: nothing cached
//!
//! let log = std::fs::read_to_string(tracker.log_path()).unwrap();
//! assert!(log.contains("+ | 1 * Size:(40, 3, 512, 512)    | Memory: 120.0 M | <class 'torch.Tensor'> | torch.float32"));
//! assert!(log.contains("- | 1 * Size:(40, 3, 512, 512)    | Memory: 120.0 M"));
//! # std::fs::remove_file(tracker.log_path()).unwrap();
//! # Ok::<(), gpu_mem_track::Error>(())
//! ```
//!
//! ## What a log looks like
//!
//! ```text
//! GPU Memory Track | 22-Nov-26-00:17:51 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb
//!
//! + | 1 * Size:(64, 64, 3, 3)       | Memory: 0.1406 M | <class 'torch.nn.parameter.Parameter'> | torch.float32
//! + | 2 * Size:(64,)                | Memory: 0.0005 M | <class 'torch.nn.parameter.Parameter'> | torch.float32
//!
//! At examples/train.rs line 61: main                    Total Tensor Used Memory:0.1    Mb Total Allocated Memory:0.1    Mb Peak Allocated Memory:0.2    Mb Unattributed Memory:0.0    Mb
//! ```
//!
//! * A `+`/`-` line is the **net** change of one group of tensors with the same shape, dtype and
//!   class since the previous `At` line. Bytes are counted once per storage: a view adds a line
//!   with `Memory: 0.0 M`.
//! * `Total Tensor Used Memory` sums the unique storages of live tensors; `Total Allocated
//!   Memory` is the allocator's own count (exact on CPU through a wrapped allocator, and
//!   `memory_allocated` on CUDA), so the two differ by whatever no tensor owns.
//! * Extensions are appended to the `At` line only: `Peak Allocated Memory` (the highest
//!   allocation since the previous line), `Workspace Memory` (CUDA: the workspaces cuBLAS and
//!   cuBLASLt keep, one per handle and stream), `Unattributed Memory` (what neither tensors nor
//!   workspaces explain: tensors + workspaces + unattributed = `Total Allocated Memory`),
//!   `Reserved Memory` (CUDA) and `NVML Used Memory` (this process, from the driver). Old readers
//!   of the format keep working.
//!
//! ## How live tensors are found
//!
//! libtorch has no garbage-collector walk. A global RecordFunction callback remembers every tensor
//! an op returns through a weak reference; tensors no op returned (parameters loaded by
//! `CModule::load`, tensors created before [`install`]) are added with
//! [`MemTracker::register_module`], [`MemTracker::register_varstore`] and [`MemTracker::register`].
//! The allocator totals cover anything still missed.
//!
//! ## Memory history by category
//!
//! [`MemTracker::record_history`] records every allocation and free; each gets a category from
//! what the tracker knows, and the history opens in PyTorch's memory_viz:
//!
//! ```
//! use gpu_mem_track::history::Category;
//! use gpu_mem_track::{MemTracker, TrackedDevice};
//! use tch::nn::{self, Module, OptimizerConfig};
//! use tch::{Device, Kind, Tensor};
//!
//! let dir = std::env::temp_dir();
//! let tracker = MemTracker::builder().device(TrackedDevice::Cpu).log_dir(&dir).build()?;
//! tracker.record_history(0)?;                   // before the model: its parameters are in it
//! let vs = nn::VarStore::new(Device::Cpu);
//! let net = nn::linear(vs.root(), 64, 10, Default::default());
//! tracker.register_varstore(&vs)?;                 // parameters (and later their grads) get tagged
//! let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
//! let x = Tensor::randn([32, 64], (Kind::Float, Device::Cpu));
//! tracker.tag_input(&x);
//! net.forward(&x).sum(Kind::Float).backward();  // what autograd saves: activations
//! tracker.optimizer_step(|| opt.step());        // what the step keeps: optimizer state
//! tracker.stop_history()?;
//!
//! let trace = tracker.history().trace();
//! let end = trace.timeline().pop().unwrap();
//! let bytes = |c: Category| end.bytes.iter().find(|b| b.0 == c).unwrap().1;
//! assert_eq!(bytes(Category::Parameter), (64 * 10 + 10) * 4);
//! assert_eq!(bytes(Category::Gradient), (64 * 10 + 10) * 4);
//! assert_eq!(bytes(Category::OptimizerState), 2 * (64 * 10 + 10) * 4); // Adam: exp_avg, exp_avg_sq
//! tracker.dump_snapshot(dir.join("doc-history.pickle"))?;
//! # std::fs::remove_file(dir.join("doc-history.pickle")).unwrap();
//! # std::fs::remove_file(tracker.log_path()).unwrap();
//! # Ok::<(), gpu_mem_track::Error>(())
//! ```
//!
//! ## Without a GPU
//!
//! Everything works on CPU. Asking for `cuda:N` without a GPU is
//! [`Error::CudaUnavailable`]; NVML missing on a CUDA tracker is one warning and the NVML field is
//! left out.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod attribution;
mod capabilities;
pub mod device;
mod error;
mod ffi;
pub mod history;
mod oom;
pub mod recorder;
mod registry;
pub mod sampler;
#[cfg(feature = "tch")]
pub mod saved;
pub mod site;
mod tracker;
pub mod walk;

/// SVG/PNG charts of logs and timelines (feature `plot`).
#[cfg(feature = "plot")]
pub use gpu_mem_track_log::plot;
/// The libtorch-free layer, re-exported: the log format, reports, NVML, traces, PyTorch memory snapshots.
pub use gpu_mem_track_log::{diff, log, memviz, nvml, report, watch};

pub use capabilities::{capabilities, Capabilities, BUILD_MARKER, LIBTORCH_VERSION};
pub use device::{
    cpu_allocator_stats, cuda_device_count, empty_cuda_cache, AllocatorReading, DeviceKind, TrackedDevice,
};
pub use error::{Error, Result};
/// The error of the libtorch-free layer, inside [`Error::Log`].
pub use gpu_mem_track_log::Error as LogError;
pub use gpu_mem_track_log::{GroupChange, Sign};
/// Tracks on entry to a function and on every exit (`return`, `?`, end of body, unwinding).
///
/// `#[track_memory]` uses the default tracker; `#[track_memory(tracker = expr)]` any expression
/// that derefs to a `MemTracker` and outlives the call.
pub use gpu_mem_track_macros::track_memory;
pub use registry::{
    forget_tensor_impl, install, is_installed, name_python_class, reads_python_classes,
    register_inductor_buffer_impl, register_tensor_impl, registry_callbacks, registry_entries,
    set_registry_enabled, set_registry_hollow,
};
pub use site::Site;
pub use tracker::{
    default_tracker, set_default_tracker, MemTracker, MemTrackerBuilder, TrackPoint, DEFAULT_LOG_DIR,
};
pub use walk::{DType, GroupKey, TensorClass, TensorInfo, TensorRole};

/// Takes a track point here: `track!()` uses the default tracker, `track!(tracker)` the given one
/// (anything that derefs to a `MemTracker`: the tracker, a reference, an `Arc`, a `LazyLock`).
///
/// File, line and the enclosing function's name are fixed at compile time and cached in a static,
/// so the call costs only the registry walk. Returns `Option<TrackPoint>`: `None` when tracking failed,
/// which is logged through `tracing` (a warning the first time) and never panics.
#[macro_export]
macro_rules! track {
    () => {
        $crate::__private::track_or_warn($crate::default_tracker(), $crate::__site!())
    };
    ($tracker:expr) => {{
        // Deref coercion accepts a tracker, a reference, an `Arc`, a `LazyLock`, ...
        let __gmt_tracker: &$crate::MemTracker = &$tracker;
        $crate::__private::track_or_warn(::core::result::Result::Ok(__gmt_tracker), $crate::__site!())
    }};
}

/// The current [`Site`] as a `&'static Site`, computed once per call site: the one way a call
/// site is named, for `track!` and `#[track_memory]` (whose expansion calls this with the line of
/// the function's name or closing brace, and its mark).
#[doc(hidden)]
#[macro_export]
macro_rules! __site {
    () => {
        $crate::__site!(::core::line!(), ::core::option::Option::None)
    };
    ($line:expr, $mark:expr) => {{
        // A local item's type name is the path of the function it is written in.
        fn __gmt_here() {}
        static SITE: ::std::sync::OnceLock<$crate::Site> = ::std::sync::OnceLock::new();
        SITE.get_or_init(|| {
            $crate::__private::site(::core::file!(), $line, ::std::any::type_name_of_val(&__gmt_here), $mark)
        })
    }};
}

#[doc(hidden)]
pub mod __private {
    use crate::{Error, MemTracker, Site, TrackPoint};

    /// The site `__site!` names: `mark` (`enter`, `exit`) after the function when given.
    pub fn site(file: &'static str, line: u32, function_path: &str, mark: Option<&str>) -> Site {
        let site = Site::new(file, line, function_path);
        match mark {
            Some(mark) => site.marked(mark),
            None => site,
        }
    }

    /// What `track!()` expands to.
    pub fn track_or_warn(tracker: Result<&MemTracker, &Error>, site: &Site) -> Option<TrackPoint> {
        match tracker {
            Ok(t) => t.track_at(site).map_err(|e| t.report_failure(&e)).ok(),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(
                    || tracing::warn!(target: "gpu_mem_track", "default tracker unavailable: {e}"),
                );
                None
            }
        }
    }

    /// Tracks on creation and on drop; what `#[track_memory]` expands to.
    pub struct FunctionGuard<'a> {
        tracker: Result<&'a MemTracker, &'static Error>,
        exit: &'static Site,
    }

    impl<'a> FunctionGuard<'a> {
        /// Tracks at `entry`; tracks at `exit` when dropped.
        pub fn enter(
            tracker: Result<&'a MemTracker, &'static Error>,
            entry: &Site,
            exit: &'static Site,
        ) -> Self {
            track_or_warn(tracker, entry);
            FunctionGuard { tracker, exit }
        }

        /// The default tracker, for the attribute without arguments.
        pub fn default_tracker() -> Result<&'static MemTracker, &'static Error> {
            crate::default_tracker()
        }
    }

    impl Drop for FunctionGuard<'_> {
        fn drop(&mut self) {
            track_or_warn(self.tracker, self.exit);
        }
    }
}
