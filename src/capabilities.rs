//! What this build and this machine can do: the libtorch and tch it was built with, whether CUDA
//! and the CUDA memory-history hooks were compiled in, and whether NVML loads. A build against a
//! libtorch without the CUDA headers, or an older libtorch, leaves things out; this says which and
//! why instead of a cargo warning nobody reads.
//!
//! ```
//! let caps = gpu_mem_track::capabilities();
//! println!("{caps}");
//! assert!(caps.libtorch_version.starts_with("2."));
//! ```
use std::fmt;

use crate::ffi;

/// The libtorch version the shim was compiled against (from its headers), e.g. `2.13.0`.
pub const LIBTORCH_VERSION: &str = ffi::LIBTORCH_VERSION;

/// `gpu-mem-track built against torch <version>`, kept in the compiled file's bytes: a front end
/// that must refuse a torch of another minor version before it loads its compiled part (the Python
/// package) reads it from the file.
pub const BUILD_MARKER: &str = ffi::BUILD_MARKER;

/// What [`capabilities`] found. Build-time facts come from the build script of
/// `gpu-mem-track-sys`; the rest is probed when called.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The libtorch version the shim was compiled against (from its headers), e.g. `2.13.0`.
    pub libtorch_version: &'static str,
    /// The libtorch_cpu file this process runs on, as the dynamic loader names it.
    pub libtorch_loaded_from: Option<String>,
    /// The torch-sys (so tch) version of this build, from the build's `Cargo.lock`; `None` when
    /// the build script found no lockfile above its target folder.
    pub tch_version: Option<&'static str>,
    /// Whether `LIBTORCH_BYPASS_VERSION_CHECK` was set at build time: a libtorch newer than the
    /// one the tch release was generated for.
    pub version_check_bypassed: bool,
    /// Whether the libtorch in use ships CUDA (`libtorch_cuda` is linked).
    pub cuda_compiled: bool,
    /// CUDA devices libtorch sees now (0 without a GPU or driver).
    pub cuda_devices: usize,
    /// Whether the CUDA caching-allocator hooks (memory history on GPUs) were compiled in.
    pub cuda_history_compiled: bool,
    /// Why they were not (which headers were missing and how to get them).
    pub cuda_history_missing: Option<&'static str>,
    /// Whether the allocator reports the device's free and total memory (libtorch 2.10 and later).
    pub cuda_memory_info: bool,
    /// `Ok` when NVML (the NVIDIA driver's management library) loads, else why not.
    pub nvml: Result<(), String>,
}

/// Probes this build and machine; cheap (NVML is opened and closed once).
pub fn capabilities() -> Capabilities {
    let cuda_history_compiled = ffi::cuda_history_compiled();
    Capabilities {
        libtorch_version: ffi::LIBTORCH_VERSION,
        libtorch_loaded_from: ffi::libtorch_location(),
        tch_version: Some(ffi::TORCH_SYS_VERSION).filter(|v| !v.is_empty()),
        version_check_bypassed: ffi::TORCH_VERSION_CHECK_BYPASSED,
        cuda_compiled: ffi::libtorch_has_cuda(),
        cuda_devices: ffi::cuda_device_count(),
        cuda_history_compiled,
        cuda_history_missing: (!cuda_history_compiled)
            .then_some(ffi::CUDA_HISTORY_MISSING)
            .filter(|m| !m.is_empty()),
        cuda_memory_info: ffi::CUDA_MEMORY_INFO,
        nvml: gpu_mem_track_log::nvml::NvmlReader::open().map(drop).map_err(|e| e.to_string()),
    }
}

impl fmt::Display for Capabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let yes = |b: bool| if b { "yes" } else { "no" };
        write!(f, "libtorch        {}", self.libtorch_version)?;
        if self.version_check_bypassed {
            write!(f, " (tch's version check bypassed)")?;
        }
        writeln!(f)?;
        if let Some(path) = &self.libtorch_loaded_from {
            writeln!(f, "  loaded from   {path}")?;
        }
        writeln!(
            f,
            "tch             {}",
            self.tch_version.unwrap_or("unknown (no Cargo.lock above the target folder)")
        )?;
        writeln!(f, "CUDA            {} ({} device(s) visible)", yes(self.cuda_compiled), self.cuda_devices)?;
        match (self.cuda_history_compiled, self.cuda_history_missing) {
            (true, _) => writeln!(f, "CUDA history    yes")?,
            (false, Some(why)) => writeln!(f, "CUDA history    no: {why}")?,
            (false, None) => writeln!(f, "CUDA history    no")?,
        }
        if !self.cuda_memory_info {
            writeln!(f, "device memory   free/total not reported (DeviceAllocator::getMemoryInfo needs libtorch 2.10)")?;
        }
        match &self.nvml {
            Ok(()) => write!(f, "NVML            yes"),
            Err(e) => write!(f, "NVML            no: {e}"),
        }
    }
}
