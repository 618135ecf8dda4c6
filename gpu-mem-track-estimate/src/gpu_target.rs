//! The GPUs an estimate is for, as `--device-profile` and Python's `device_profile` name them,
//! resolved once: `auto` reads NVML once and a profile `.json` is read once, and the meta kernels
//! and the GPU figures of one estimate stand for the same GPU.
use gpu_mem_track_gpu::profile::{predict_all, DeviceProfile, GpuPrediction, WorkspaceEnv};
use gpu_mem_track_log::Trace;

use crate::error::Result;
use crate::fit::budget;

/// What `--device-profile` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuTarget {
    /// `cuda` or `none`: the caching allocator model alone, no GPU figures.
    Plain,
    /// `all`: every preset.
    All,
    /// One profile: a preset, `auto` (the GPU NVML describes), or a profile `.json`.
    One(DeviceProfile),
}

impl GpuTarget {
    /// Resolves `device_profile`; `gpu_mem` replaces the memory of one profile.
    ///
    /// # Errors
    /// [`Error::Input`](crate::error::Error::Input) for an unknown profile or an unreadable profile file.
    pub fn resolve(device_profile: &str, gpu_mem: Option<u64>) -> Result<Self> {
        Ok(match device_profile {
            "cuda" | "none" => Self::Plain,
            "all" => Self::All,
            name => Self::One(budget(&DeviceProfile::find(name)?, gpu_mem)),
        })
    }

    /// The compute capability meta runs stand for: the profile's, else a 9.0 GPU's.
    pub fn compute_capability(&self) -> (u32, u32) {
        match self {
            Self::One(p) => p.compute_capability,
            Self::Plain | Self::All => (9, 0),
        }
    }

    /// Meta runs stand for this GPU from now on (`meta_target_compute_capability`).
    pub fn target_meta_kernels(&self) {
        crate::ffi::meta_target_device(self.compute_capability());
    }

    /// The GPU figures of `trace`: none, one per preset, or the one profile's.
    /// `CUBLAS_WORKSPACE_CONFIG` sizes cuBLAS's workspace as on the GPU.
    pub fn predictions(&self, trace: &Trace) -> Vec<GpuPrediction> {
        let config = WorkspaceEnv::read().cublas_config;
        match self {
            Self::Plain => Vec::new(),
            Self::All => predict_all(&DeviceProfile::presets(), trace, config.as_deref()),
            Self::One(p) => predict_all(std::slice::from_ref(p), trace, config.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_resolves_to_what_it_stands_for() {
        assert_eq!(GpuTarget::resolve("cuda", None).unwrap(), GpuTarget::Plain);
        assert_eq!(GpuTarget::resolve("none", None).unwrap(), GpuTarget::Plain);
        assert_eq!(GpuTarget::resolve("all", None).unwrap().compute_capability(), (9, 0));
        let t4 = GpuTarget::resolve("T4", Some(1 << 30)).unwrap();
        let GpuTarget::One(p) = &t4 else { panic!("{t4:?}") };
        assert_eq!((p.name.as_str(), p.memory_bytes, t4.compute_capability()), ("t4", 1 << 30, (7, 5)));
        let err = GpuTarget::resolve("h1000", None).unwrap_err().to_string();
        assert!(err.contains("h1000") && err.contains("h100-80g"), "{err}");
        // No trace, no allocation: no GPU figures for the plain model, one per preset for all.
        let trace = Trace::default();
        assert!(GpuTarget::Plain.predictions(&trace).is_empty());
        assert_eq!(GpuTarget::All.predictions(&trace).len(), DeviceProfile::presets().len());
        assert_eq!(t4.predictions(&trace)[0].profile.name, "t4");
    }
}
