//! What CUDA libraries take from PyTorch's caching allocator for themselves: which ops call cuBLAS
//! and how large its workspaces are. The estimator places these workspaces in its GPU replay; the
//! tracker's CUDA history names them (category [`Workspace`](gpu_mem_track_log::Category::Workspace)),
//! and its log's `Workspace Memory` figure counts them ([`attribute`]).
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

/// The environment variables that size cuBLAS's and cuBLASLt's workspaces, as PyTorch reads them:
/// read here and nowhere else, once per estimate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceEnv {
    /// `CUBLAS_WORKSPACE_CONFIG` (`:4096:8`, ...).
    pub cublas_config: Option<String>,
    /// `CUBLASLT_WORKSPACE_SIZE`, in KiB.
    pub cublaslt_size_kib: Option<String>,
    /// `TORCH_CUBLASLT_UNIFIED_WORKSPACE`.
    pub cublaslt_unified: Option<String>,
}

impl WorkspaceEnv {
    /// This process's variables.
    pub fn read() -> Self {
        let var = |name: &str| std::env::var(name).ok();
        WorkspaceEnv {
            cublas_config: var("CUBLAS_WORKSPACE_CONFIG"),
            cublaslt_size_kib: var("CUBLASLT_WORKSPACE_SIZE"),
            cublaslt_unified: var("TORCH_CUBLASLT_UNIFIED_WORKSPACE"),
        }
    }

    /// cuBLAS's workspace per handle on a GPU of `compute_capability`.
    pub fn cublas_workspace(&self, compute_capability: (u32, u32)) -> u64 {
        cublas_workspace_bytes(compute_capability, self.cublas_config.as_deref())
    }

    /// cuBLASLt's workspace per handle (0: unified with cuBLAS's).
    pub fn cublaslt_workspace(&self) -> u64 {
        cublaslt_workspace_bytes(self.cublaslt_size_kib.as_deref(), self.cublaslt_unified.as_deref())
    }
}

/// The sizes a cuBLAS or cuBLASLt workspace can have in this process, read from its environment:
/// for a GPU of unknown compute capability, both defaults (sm 9.0's and the others').
pub fn workspace_sizes_from_env() -> Vec<u64> {
    let env = WorkspaceEnv::read();
    let mut sizes =
        vec![env.cublas_workspace((9, 0)), env.cublas_workspace((8, 0)), env.cublaslt_workspace()];
    sizes.retain(|&s| s > 0);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// A block an allocator has handed out and not taken back: where it starts, its size (what
/// `Total Allocated Memory` counts) and the bytes asked for it (a cached block may be larger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveBlock {
    /// Its first byte's address.
    pub address: u64,
    /// Bytes the block holds.
    pub size: u64,
    /// Bytes its allocation asked for.
    pub requested: u64,
}

/// How a track point's allocated bytes split: live tensors' storages (counted apart), the
/// workspaces CUDA libraries keep, and what nothing the tracker knows of explains.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Bytes of the blocks that are library workspaces.
    pub workspace_bytes: u64,
    /// How many workspaces (one per cuBLAS or cuBLASLt handle and stream).
    pub workspaces: usize,
    /// Allocated bytes neither tensors nor workspaces explain: the allocator's rounding of
    /// blocks, storages no tensor holds (a bare `UntypedStorage`), buffers libraries allocate
    /// without a tensor. Zero when tensors count more than is allocated (storages made outside
    /// the allocator, such as `from_blob`'s).
    pub unattributed_bytes: u64,
}

impl Attribution {
    /// The split when no block is a workspace.
    pub fn without_workspaces(allocated: u64, tensor_bytes: u64) -> Attribution {
        Attribution {
            workspace_bytes: 0,
            workspaces: 0,
            unattributed_bytes: allocated.saturating_sub(tensor_bytes),
        }
    }
}

/// Whether some workspace may be among the allocated bytes that tensors leave unexplained: only
/// then is the allocator's block list worth reading (a snapshot of every segment).
pub fn may_hold_workspace(allocated: u64, tensor_bytes: u64, workspace_sizes: &[u64]) -> bool {
    workspace_sizes.iter().min().is_some_and(|&least| allocated.saturating_sub(tensor_bytes) >= least)
}

/// Splits `allocated` bytes, of which live tensors' storages hold `tensor_bytes`: a block is a
/// library workspace when the bytes asked for it are a workspace size of this process
/// (`workspace_sizes`, see [`workspace_sizes_from_env`]) and no live tensor's storage of that size
/// starts in it (`tensor_data`: the data addresses of those storages). Tensors + workspaces +
/// unattributed = `allocated` whenever tensors count no more than is allocated.
pub fn attribute(
    allocated: u64,
    tensor_bytes: u64,
    blocks: &[LiveBlock],
    workspace_sizes: &[u64],
    tensor_data: &[u64],
) -> Attribution {
    let unexplained = allocated.saturating_sub(tensor_bytes);
    let mut workspace_bytes = 0u64;
    let mut workspaces = 0usize;
    for b in blocks {
        if !workspace_sizes.contains(&b.requested) {
            continue;
        }
        let end = b.address.saturating_add(b.size);
        if tensor_data.iter().any(|&a| a >= b.address && a < end) {
            continue;
        }
        workspace_bytes = workspace_bytes.saturating_add(b.size);
        workspaces += 1;
    }
    // Counters and blocks are read at slightly different moments: never more than is left.
    let workspace_bytes = workspace_bytes.min(unexplained);
    Attribution { workspace_bytes, workspaces, unattributed_bytes: unexplained - workspace_bytes }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1024 * 1024;

    fn block(address: u64, size: u64) -> LiveBlock {
        LiveBlock { address, size, requested: size }
    }

    #[test]
    fn a_workspace_sized_block_no_tensor_holds_is_a_workspace() {
        let sizes = [MIB, 32 * MIB];
        // A tensor of 10 MiB, a 32 MiB cuBLAS workspace, a 1 MiB cuBLASLt one, and a 32 MiB
        // tensor (a workspace's size, but a tensor's data starts in it), in 512-byte-rounded blocks.
        let blocks = [
            LiveBlock { address: 0, size: 10 * MIB + 512, requested: 10 * MIB + 100 },
            block(1 << 30, 32 * MIB),
            block(2 << 30, MIB),
            block(3 << 30, 32 * MIB),
        ];
        let tensor_bytes = 10 * MIB + 100 + 32 * MIB;
        let allocated = blocks.iter().map(|b| b.size).sum::<u64>();
        let a = attribute(allocated, tensor_bytes, &blocks, &sizes, &[3 << 30]);
        assert_eq!(a.workspaces, 2);
        assert_eq!(a.workspace_bytes, 33 * MIB);
        assert_eq!(a.unattributed_bytes, 412, "the first block's rounding");
        assert_eq!(tensor_bytes + a.workspace_bytes + a.unattributed_bytes, allocated);
        // Without the tensor's address the 32 MiB tensor would be taken for a workspace, and
        // the split clamped to what the tensors leave.
        let wrong = attribute(allocated, tensor_bytes, &blocks, &sizes, &[]);
        assert_eq!(wrong.workspaces, 3);
        assert_eq!(tensor_bytes + wrong.workspace_bytes + wrong.unattributed_bytes, allocated);
        assert_eq!(wrong.unattributed_bytes, 0);
    }

    #[test]
    fn blocks_are_read_only_when_a_workspace_could_hide_in_the_gap() {
        assert!(!may_hold_workspace(10 * MIB, 10 * MIB, &[MIB]));
        assert!(may_hold_workspace(11 * MIB, 10 * MIB, &[MIB, 32 * MIB]));
        assert!(!may_hold_workspace(11 * MIB, 10 * MIB, &[]));
        assert!(!may_hold_workspace(MIB, 10 * MIB, &[MIB]), "more tensors than allocated");
        let a = Attribution::without_workspaces(MIB, 10 * MIB);
        assert_eq!((a.workspace_bytes, a.unattributed_bytes), (0, 0));
    }

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
