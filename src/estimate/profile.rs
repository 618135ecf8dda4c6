//! GPU device profiles: what a CUDA device adds on top of the tensors a meta run sees - the
//! cuBLAS workspace taken from the caching allocator at the first matmul and never freed, a
//! bounded cuDNN convolution workspace (unknowable without the GPU, so reported as a range), and
//! the CUDA context and library handles that nvidia-smi shows on top of `reserved`.
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProfile {
    /// Short name (`a100-80g`).
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Memory nvidia-smi shows for the CUDA context, kernels and library handles of a PyTorch
    /// process before any tensor: a per-device constant, measured, not derived.
    pub context_bytes: u64,
}

impl DeviceProfile {
    /// The built-in profiles.
    pub fn presets() -> Vec<DeviceProfile> {
        let p = |name: &str, gib: u64, cc: (u32, u32), ctx_mib: u64| DeviceProfile {
            name: name.into(),
            memory_bytes: gib * GIB,
            compute_capability: cc,
            context_bytes: ctx_mib * MIB,
        };
        vec![
            p("a100-80g", 80, (8, 0), 520),
            p("a100-40g", 40, (8, 0), 520),
            p("h100-80g", 80, (9, 0), 540),
            p("rtx4090", 24, (8, 9), 420),
            p("rtx3090", 24, (8, 6), 400),
            p("l4", 24, (8, 9), 420),
            p("t4", 16, (7, 5), 380),
            p("v100-32g", 32, (7, 0), 400),
        ]
    }

    /// A preset by name (case-insensitive), or a profile from a JSON file with the fields of this
    /// struct (`compute_capability` as `[8, 0]`).
    ///
    /// # Errors
    /// [`Error::EstimateInput`] naming the unknown profile or the unreadable file.
    pub fn find(name_or_path: &str) -> Result<DeviceProfile> {
        let lower = name_or_path.to_ascii_lowercase();
        if let Some(p) = Self::presets().into_iter().find(|p| p.name == lower) {
            return Ok(p);
        }
        let path = Path::new(name_or_path);
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json")) {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::EstimateInput(format!("cannot read profile {}: {e}", path.display())))?;
            return serde_json::from_str(&text)
                .map_err(|e| Error::EstimateInput(format!("profile {}: {e}", path.display())));
        }
        let names: Vec<String> = Self::presets().into_iter().map(|p| p.name).collect();
        Err(Error::EstimateInput(format!(
            "unknown device profile {name_or_path:?} (presets: {}; or a .json file)",
            names.join(", ")
        )))
    }

    /// The cuBLAS workspace PyTorch allocates per handle and stream (one for a single-stream
    /// program): `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KiB:COUNT` pairs, summed) when set, else 32 MiB
    /// on Hopper (sm 9.0) and `:4096:2:16:8` (8 MiB + 128 KiB) elsewhere. cuBLASLt shares it
    /// (the unified workspace is PyTorch's default).
    pub fn cublas_workspace_bytes(&self, workspace_config: Option<&str>) -> u64 {
        let default =
            if self.compute_capability == (9, 0) { 4096 * 8 * 1024 } else { 4096 * 1024 * 2 + 16 * 1024 * 8 };
        let Some(config) = workspace_config else { return default };
        let mut total = 0u64;
        let mut found = false;
        let nums: Vec<&str> = config.split(':').collect();
        // ":4096:8:16:8" -> ["", "4096", "8", "16", "8"]: pairs after the leading empty field.
        for pair in nums.get(1..).unwrap_or(&[]).chunks(2) {
            if let [size, count] = pair {
                if let (Ok(s), Ok(c)) = (size.trim().parse::<u64>(), count.trim().parse::<u64>()) {
                    total += s * 1024 * c;
                    found = true;
                }
            }
        }
        if found {
            total
        } else {
            default
        }
    }
}

/// A prediction that cannot be exact: the bounds, and what the gap is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Range {
    /// Without the uncertain term.
    pub low: u64,
    /// With its largest plausible value.
    pub high: u64,
}

/// What a GPU of a profile would show for an estimated run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuPrediction {
    /// The profile used.
    pub profile: DeviceProfile,
    /// cuBLAS workspace included (0 when the model has no matmul).
    pub cublas_workspace: u64,
    /// `torch.cuda.max_memory_allocated()`: caching-allocator blocks + workspace, without and with
    /// the largest plausible cuDNN workspace.
    pub peak_allocated: Range,
    /// `torch.cuda.max_memory_reserved()`.
    pub peak_reserved: Range,
    /// What nvidia-smi would show: reserved plus the profile's context constant.
    pub nvidia_smi: Range,
    /// Whether the high end fits the device.
    pub fits: bool,
}

/// Segment rounding of the caching allocator for one extra allocation of `bytes`.
fn reserved_for(bytes: u64) -> u64 {
    let rounded = super::caching_allocator::round_size(bytes);
    if bytes == 0 {
        0
    } else {
        super::caching_allocator::segment_size(rounded).max(rounded)
    }
}

/// Combines a caching-allocator replay with a device profile. `has_matmul` says whether the run
/// used cuBLAS; `cudnn_workspace_max` bounds the convolution workspace (0 without convolutions).
pub fn predict(
    profile: &DeviceProfile,
    peak_allocated: u64,
    peak_reserved: u64,
    has_matmul: bool,
    cudnn_workspace_max: u64,
    workspace_config: Option<&str>,
) -> GpuPrediction {
    let cublas = if has_matmul { profile.cublas_workspace_bytes(workspace_config) } else { 0 };
    let low_alloc = peak_allocated + cublas;
    let low_res = peak_reserved + reserved_for(cublas);
    let high_alloc = low_alloc + cudnn_workspace_max;
    let high_res = low_res + reserved_for(cudnn_workspace_max);
    let smi = |r: u64| r + profile.context_bytes;
    GpuPrediction {
        profile: profile.clone(),
        cublas_workspace: cublas,
        peak_allocated: Range { low: low_alloc, high: high_alloc },
        peak_reserved: Range { low: low_res, high: high_res },
        nvidia_smi: Range { low: smi(low_res), high: smi(high_res) },
        fits: smi(high_res) <= profile.memory_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(cc: (u32, u32)) -> DeviceProfile {
        DeviceProfile {
            name: "x".into(),
            memory_bytes: 16 * GIB,
            compute_capability: cc,
            context_bytes: 400 * MIB,
        }
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
    fn cublas_workspace_config_overrides_the_default() {
        let p = profile((8, 0));
        assert_eq!(p.cublas_workspace_bytes(Some(":4096:8")), 32 * MIB);
        assert_eq!(p.cublas_workspace_bytes(Some(":16:8")), 128 * 1024, "the deterministic setting");
        assert_eq!(p.cublas_workspace_bytes(Some(":4096:2:16:8")), 8 * MIB + 128 * 1024);
        assert_eq!(p.cublas_workspace_bytes(Some("garbage")), 8 * MIB + 128 * 1024, "unparsable: default");
    }

    #[test]
    fn ranges_add_the_workspaces_and_the_context() {
        let p = profile((8, 0));
        let g = predict(&p, 100 * MIB, 120 * MIB, true, 64 * MIB, None);
        let ws = 8 * MIB + 128 * 1024;
        assert_eq!(g.cublas_workspace, ws);
        assert_eq!(g.peak_allocated, Range { low: 100 * MIB + ws, high: 100 * MIB + ws + 64 * MIB });
        // The workspace is a large request: a 20 MiB segment; 64 MiB rounds to its own segment.
        assert_eq!(g.peak_reserved, Range { low: 140 * MIB, high: 204 * MIB });
        assert_eq!(g.nvidia_smi.low, 540 * MIB);
        assert!(g.fits);
        let none = predict(&p, 100 * MIB, 120 * MIB, false, 0, None);
        assert_eq!((none.peak_allocated.low, none.peak_allocated.high), (100 * MIB, 100 * MIB));
        let tight = DeviceProfile { memory_bytes: 500 * MIB, ..p };
        assert!(!predict(&tight, 100 * MIB, 120 * MIB, true, 64 * MIB, None).fits);
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
        assert_eq!(DeviceProfile::find(f.to_str().unwrap()).unwrap().memory_bytes, 1000);
        let e = DeviceProfile::find("gtx9000").unwrap_err().to_string();
        assert!(e.contains("gtx9000") && e.contains("a100-80g"), "{e}");
    }
}
