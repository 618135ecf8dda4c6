//! NVML's view of a GPU (what nvidia-smi shows): device used/total and this process's usage.
//! NVML is loaded at run time; without a driver the tracker warns once and leaves the fields out.
use std::sync::Once;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::Nvml;

use crate::error::{Error, Result};

/// One NVML reading of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvmlReading {
    /// Bytes in use on the whole device (all processes, plus the driver's reservations).
    pub device_used: u64,
    /// Device memory size in bytes.
    pub device_total: u64,
    /// Bytes used by the process asked about, when NVML reports it.
    pub process_used: Option<u64>,
}

/// A handle on NVML.
pub struct NvmlReader {
    // Boxed: the loaded library's symbol table is several KiB.
    nvml: Box<Nvml>,
}

impl NvmlReader {
    /// Loads and initialises NVML.
    ///
    /// # Errors
    /// [`Error::NvmlUnavailable`] when the driver library cannot be loaded or initialised.
    pub fn open() -> Result<Self> {
        Nvml::init()
            .map(|nvml| NvmlReader { nvml: Box::new(nvml) })
            .map_err(|e| Error::NvmlUnavailable(e.to_string()))
    }

    /// The library handle, for the `watch` command's device-wide queries.
    pub(crate) fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Reads the device with CUDA index `cuda_index` and the usage of process `pid` on it.
    ///
    /// # Errors
    /// [`Error::NvmlUnavailable`] when NVML cannot read the device.
    pub fn read(&self, cuda_index: usize, pid: u32) -> Result<NvmlReading> {
        let err =
            |e: nvml_wrapper::error::NvmlError| Error::NvmlUnavailable(format!("device {cuda_index}: {e}"));
        let device = self.nvml.device_by_index(nvml_index(cuda_index)).map_err(err)?;
        let mem = device.memory_info().map_err(err)?;
        let mut process_used = None;
        let procs = device.running_compute_processes().unwrap_or_default();
        let gfx = device.running_graphics_processes().unwrap_or_default();
        for p in procs.iter().chain(gfx.iter()).filter(|p| p.pid == pid) {
            if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                process_used = Some(process_used.unwrap_or(0).max(bytes));
            }
        }
        Ok(NvmlReading { device_used: mem.used, device_total: mem.total, process_used })
    }
}

/// What NVML says a GPU is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlDevice {
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Memory installed, in bytes (nvidia-smi's `Total`).
    pub total_bytes: u64,
    /// Memory the driver and firmware keep for themselves (nvidia-smi's `Reserved`, 0.3-0.6 GiB on
    /// an H100, by driver): CUDA never gives it to a process.
    pub reserved_bytes: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
}

impl NvmlDevice {
    /// The memory CUDA can give processes: the installed memory less the driver's reserve
    /// (`cudaMemGetInfo`'s total, PyTorch's `total_memory`; 81 079 MiB on an H100 80GB HBM3).
    pub fn usable_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.reserved_bytes)
    }
}

impl NvmlReader {
    /// The name, memory and compute capability of CUDA device `cuda_index` (as libtorch numbers
    /// it: `CUDA_VISIBLE_DEVICES` is followed).
    ///
    /// # Errors
    /// [`Error::NvmlUnavailable`] naming the device when NVML cannot describe it.
    pub fn describe(&self, cuda_index: usize) -> Result<NvmlDevice> {
        let err =
            |e: nvml_wrapper::error::NvmlError| Error::NvmlUnavailable(format!("device {cuda_index}: {e}"));
        let device = self.nvml.device_by_index(nvml_index(cuda_index)).map_err(err)?;
        let cc = device.cuda_compute_capability().map_err(err)?;
        let memory = device.memory_info().map_err(err)?;
        Ok(NvmlDevice {
            name: device.name().map_err(err)?,
            total_bytes: memory.total,
            reserved_bytes: memory.reserved,
            compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
        })
    }
}

/// NVML numbers every GPU; CUDA only those in `CUDA_VISIBLE_DEVICES`, renumbered from 0.
fn nvml_index(cuda_index: usize) -> u32 {
    std::env::var("CUDA_VISIBLE_DEVICES")
        .ok()
        .and_then(|v| v.split(',').nth(cuda_index).and_then(|s| s.trim().parse::<u32>().ok()))
        .unwrap_or(cuda_index as u32)
}

/// Logs the first NVML failure of the process as a warning; later ones at debug level.
pub fn warn_once(err: &Error) {
    static WARNED: Once = Once::new();
    let mut first = false;
    WARNED.call_once(|| first = true);
    if first {
        tracing::warn!(target: "gpu_mem_track", "{err}; NVML fields are left out of the log");
    } else {
        tracing::debug!(target: "gpu_mem_track", "{err}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usable_memory_is_the_installed_less_the_drivers_reserve() {
        const MIB: u64 = 1 << 20;
        // An H100 80GB HBM3: nvidia-smi's Total 81 559 MiB, Reserved 480 MiB; PyTorch's
        // total_memory 85 017 493 504 B.
        let h100 = NvmlDevice {
            name: "NVIDIA H100 80GB HBM3".into(),
            total_bytes: 81_559 * MIB,
            reserved_bytes: 480 * MIB,
            compute_capability: (9, 0),
        };
        assert_eq!(h100.usable_bytes(), 85_017_493_504);
        let odd = NvmlDevice { reserved_bytes: h100.total_bytes + 1, ..h100 };
        assert_eq!(odd.usable_bytes(), 0);
    }
}
