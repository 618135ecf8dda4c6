//! What CUDA libraries take from PyTorch's caching allocator for themselves: which ops call cuBLAS
//! and how large its workspaces are. The estimator places these workspaces in its GPU replay; the
//! tracker's CUDA history names them (category [`Workspace`](crate::trace::Category::Workspace)).
//!
//! Sources: PyTorch 2.13, `aten/src/ATen/cuda/CublasHandlePool.cpp`. A cuBLAS handle's workspace
//! (`getChosenWorkspaceSize`) and its cuBLASLt workspace (`getCUDABlasLtWorkspace`) are allocated
//! through the caching allocator once per (handle, stream), by the first matmul that fetches the
//! handle, and kept until the process ends.

/// Ops whose kernels call cuBLAS (the innermost op an allocation is recorded under).
pub const CUBLAS_OPS: [&str; 8] = [
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::addmv",
    "aten::_scaled_dot_product_attention_math",
];

/// Autograd nodes whose backward computes its gradients with matmuls.
pub const MATMUL_BACKWARD_NODES: [&str; 7] = [
    "MmBackward0",
    "AddmmBackward0",
    "BmmBackward0",
    "BaddbmmBackward0",
    "AddmvBackward0",
    "MvBackward0",
    "LinearBackward0",
];

/// Whether an op name is `name` or one of its overloads (`aten::mm.out`).
pub fn is_op(op: &str, name: &str) -> bool {
    op.strip_prefix(name).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// Whether `op` (an op name, any overload) is one whose kernel calls cuBLAS.
pub fn calls_cublas(op: &str) -> bool {
    CUBLAS_OPS.iter().any(|name| is_op(op, name))
}

/// The cuBLAS workspace PyTorch allocates per handle and stream on a GPU of this compute
/// capability: `CUBLAS_WORKSPACE_CONFIG` (`:SIZE_KIB:COUNT` pairs) when it parses, else 32 MiB on
/// sm 9.0 and `:4096:2:16:8` (8 MiB + 128 KiB) elsewhere (`parseChosenWorkspaceSize`).
pub fn cublas_workspace_bytes(compute_capability: (u32, u32), workspace_config: Option<&str>) -> u64 {
    let default =
        if compute_capability == (9, 0) { 4096 * 8 * 1024 } else { 4096 * 1024 * 2 + 16 * 1024 * 8 };
    let Some(config) = workspace_config else { return default };
    let mut total = 0u64;
    let mut found = false;
    let fields: Vec<&str> = config.split(':').collect();
    // ":4096:8:16:8" -> ["", "4096", "8", "16", "8"]: pairs after the leading empty field.
    for pair in fields.get(1..).unwrap_or(&[]).chunks(2) {
        if let [size, count] = pair {
            if let (Ok(s), Ok(c)) = (size.trim().parse::<u64>(), count.trim().parse::<u64>()) {
                // Saturating: an absurd setting reads as "more than any GPU", never wraps.
                total = s.saturating_mul(1024).saturating_mul(c).saturating_add(total);
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

/// The cuBLASLt workspace PyTorch allocates per handle and stream, apart from the cuBLAS one:
/// `CUBLASLT_WORKSPACE_SIZE` KiB when set (an unparsable value: the default), else 1 MiB; none
/// when `TORCH_CUBLASLT_UNIFIED_WORKSPACE` is `1`/`true`, which makes cuBLASLt use the cuBLAS
/// workspace (`parseCUDABlasLtWorkspaceSize`, `getCUDABlasLtWorkspace`).
pub fn cublaslt_workspace_bytes(size_kib: Option<&str>, unified: Option<&str>) -> u64 {
    if unified.is_some_and(|u| matches!(u.trim().to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes"))
    {
        return 0;
    }
    size_kib.and_then(|s| s.trim().parse::<u64>().ok()).map_or(1024 * 1024, |k| k.saturating_mul(1024))
}

/// The sizes a cuBLAS or cuBLASLt workspace can have in this process, read from its environment:
/// for a GPU of unknown compute capability, both defaults (sm 9.0's and the others').
pub fn workspace_sizes_from_env() -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok();
    let config = var("CUBLAS_WORKSPACE_CONFIG");
    let mut sizes = vec![
        cublas_workspace_bytes((9, 0), config.as_deref()),
        cublas_workspace_bytes((8, 0), config.as_deref()),
        cublaslt_workspace_bytes(
            var("CUBLASLT_WORKSPACE_SIZE").as_deref(),
            var("TORCH_CUBLASLT_UNIFIED_WORKSPACE").as_deref(),
        ),
    ];
    sizes.retain(|&s| s > 0);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1024 * 1024;

    #[test]
    fn ops_are_matched_by_name_and_overload_not_prefix() {
        assert!(calls_cublas("aten::mm") && calls_cublas("aten::mm.out") && calls_cublas("aten::addmm"));
        assert!(!calls_cublas("aten::mmm") && !calls_cublas("aten::mul") && !calls_cublas("aten::mm_extra"));
    }

    #[test]
    fn workspace_sizes_follow_pytorchs_rules() {
        assert_eq!(cublas_workspace_bytes((9, 0), None), 32 * MIB, "Hopper: 32 MiB");
        assert_eq!(cublas_workspace_bytes((8, 6), None), 8 * MIB + 128 * 1024);
        assert_eq!(cublas_workspace_bytes((8, 0), Some(":4096:8")), 32 * MIB);
        assert_eq!(cublas_workspace_bytes((8, 0), Some(":16:8")), 128 * 1024, "the deterministic setting");
        assert_eq!(
            cublas_workspace_bytes((8, 0), Some("garbage")),
            8 * MIB + 128 * 1024,
            "unparsable: default"
        );
        assert_eq!(cublas_workspace_bytes((8, 0), Some(":18446744073709551615:2")), u64::MAX, "saturates");
        assert_eq!(cublaslt_workspace_bytes(None, None), MIB);
        assert_eq!(cublaslt_workspace_bytes(Some("4096"), None), 4 * MIB);
        assert_eq!(cublaslt_workspace_bytes(Some("lots"), None), MIB, "unparsable: default");
        assert_eq!(cublaslt_workspace_bytes(Some("4096"), Some("1")), 0, "unified: the cuBLAS one");
        assert_eq!(cublaslt_workspace_bytes(None, Some("0")), MIB);
    }
}
