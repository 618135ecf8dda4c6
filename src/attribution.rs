//! What the `At` line's `Workspace Memory` and `Unattributed Memory` say: how a track point's
//! allocated bytes split between live tensors, the workspaces CUDA libraries keep in the
//! allocator, and what nothing the tracker knows of explains, so that the three add up to
//! `Total Allocated Memory`.
//!
//! A workspace is a block the allocator handed out whose requested size is a workspace size of
//! this process ([`workspace_sizes_from_env`](gpu_mem_track_gpu::cuda_libraries::workspace_sizes_from_env))
//! and in which no live tensor's storage of that size starts: the tracker's grouped walks collect
//! the data addresses of the storages of those sizes as they go (`RegistryWalk::watched`), at no
//! cost to the others.
use gpu_mem_track_gpu::cuda_libraries::{self, Attribution, LiveBlock};

use crate::device::TrackedDevice;
use crate::error::Result;
use crate::ffi;

/// The blocks the device's allocator has handed out and not taken back: on the CPU the wrapped
/// allocator's live allocations, on CUDA the caching allocator's allocated blocks.
///
/// # Errors
/// [`Error::Libtorch`](crate::error::Error::Libtorch) when the CUDA allocator's snapshot cannot be read.
pub(crate) fn live_blocks(device: TrackedDevice) -> Result<Vec<LiveBlock>> {
    Ok(match device {
        TrackedDevice::Cpu => ffi::cpu_allocator_live()
            .into_iter()
            .map(|(address, size)| LiveBlock { address, size, requested: size })
            .collect(),
        TrackedDevice::Cuda(index) => ffi::cuda_blocks(index)?
            .iter()
            .filter(|b| b.allocated)
            .map(|b| LiveBlock {
                address: b.address,
                size: b.size,
                // Snapshots that do not say: the block's own size.
                requested: if b.requested_size == 0 { b.size } else { b.requested_size },
            })
            .collect(),
    })
}

/// The split of `allocated` bytes on `device`, of which live tensors hold `tensor_bytes`;
/// `tensor_data` holds the data addresses of the live storages whose size is one of
/// `workspace_sizes` (what the last walk watched). The block list is read only when a workspace
/// could hide in what the tensors leave unexplained; when it cannot be read, everything left is
/// unattributed (with one warning).
pub(crate) fn split(
    device: TrackedDevice,
    allocated: u64,
    tensor_bytes: u64,
    workspace_sizes: &[u64],
    tensor_data: &[u64],
) -> Attribution {
    if !cuda_libraries::may_hold_workspace(allocated, tensor_bytes, workspace_sizes) {
        return Attribution::without_workspaces(allocated, tensor_bytes);
    }
    match live_blocks(device) {
        Ok(blocks) => {
            cuda_libraries::attribute(allocated, tensor_bytes, &blocks, workspace_sizes, tensor_data)
        }
        Err(e) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(target: "gpu_mem_track", "CUDA workspaces are counted as unattributed memory: {e}");
            });
            Attribution::without_workspaces(allocated, tensor_bytes)
        }
    }
}

// A fake workspace on the CPU: the mechanism the CUDA tracker uses, with a workspace size of
// the test's choosing, through the wrapped CPU allocator (exact byte counts: its own process).
#[cfg(all(test, feature = "tch"))]
mod tests {
    use super::*;
    use crate::device::DeviceKind;
    use crate::ffi::RegistryWalk;
    use tch::{Device, Kind, Tensor};

    const SIZE: u64 = 3 << 20; // no tensor of the test process's other code has it

    /// A walk, then the split of what the allocator counts: (allocated, tensor bytes, split).
    fn walk_and_split(raw: &mut RegistryWalk) -> (u64, u64, Attribution) {
        let (_, totals) = raw.take_grouped(DeviceKind::Cpu, -1, false).unwrap();
        let allocated = ffi::cpu_allocator_stats().current;
        let a = split(TrackedDevice::Cpu, allocated, totals.tensor_bytes, &[SIZE], raw.watched());
        (allocated, totals.tensor_bytes, a)
    }

    #[test]
    fn a_block_of_a_workspace_size_no_tensor_holds_is_a_workspace() {
        ffi::install().unwrap();
        let mut raw = RegistryWalk::new().unwrap();
        raw.watch_storage_sizes(&[SIZE]);
        let floats = i64::try_from(SIZE / 4).unwrap();
        // A library's buffer: allocated through the allocator, held by no tensor the registry saw.
        ffi::set_registry_enabled(false).unwrap();
        let workspace = Tensor::zeros([floats], (Kind::Float, Device::Cpu));
        ffi::set_registry_enabled(true).unwrap();
        let (allocated, tensors, a) = walk_and_split(&mut raw);
        assert_eq!((a.workspaces, a.workspace_bytes), (1, SIZE));
        assert_eq!(tensors + a.workspace_bytes + a.unattributed_bytes, allocated);

        // A tensor of the same size is a tensor: the walk saw where its data is.
        let tensor = Tensor::ones([floats], (Kind::Float, Device::Cpu));
        let (allocated, tensors, a) = walk_and_split(&mut raw);
        assert!(raw.watched().contains(&(tensor.data_ptr() as u64)), "{:?}", raw.watched());
        assert_eq!((a.workspaces, a.workspace_bytes), (1, SIZE), "the tensor is not a second workspace");
        assert_eq!(tensors + a.workspace_bytes + a.unattributed_bytes, allocated);

        // Without its data address, the tensor's block would pass for a second workspace.
        let blind = split(TrackedDevice::Cpu, allocated, tensors, &[SIZE], &[]);
        assert_eq!(blind.workspaces, 2, "{blind:?}");
        drop((workspace, tensor));
    }
}
