//! A GPU that is not there: an [`NvmlSource`] with a fixed device and processes whose usage
//! changes with every sample. `gpu-mem-track watch --simulate-nvml N` runs on it, so the watch
//! loop (files, rotation, memory use over weeks) can be exercised and measured without a driver.
use crate::error::Result;
use crate::watch::{DeviceMemory, NvmlSource, ProcessMemory};

/// A simulated 80 GiB device with `processes` training processes.
#[derive(Debug, Clone)]
pub struct SimulatedNvml {
    processes: u32,
    samples: u64,
}

/// Device size of the simulated GPU.
pub const SIMULATED_TOTAL: u64 = 80 << 30;
/// First process id of the simulated processes.
pub const SIMULATED_FIRST_PID: u32 = 100_000;

impl SimulatedNvml {
    /// A device with `processes` processes (pids from [`SIMULATED_FIRST_PID`]).
    pub fn new(processes: u32) -> Self {
        SimulatedNvml { processes, samples: 0 }
    }

    /// Usage of process `k` at sample `n`: a base, plus a saw tooth (activations of a training
    /// step) that peaks every 10 samples.
    fn process_used(k: u32, n: u64) -> u64 {
        let base = (2 + u64::from(k % 8)) << 30;
        base + (n % 10) * (256 << 20)
    }
}

impl NvmlSource for SimulatedNvml {
    fn device_memory(&mut self, _index: u32) -> Result<DeviceMemory> {
        self.samples += 1;
        let used =
            (0..self.processes).map(|k| Self::process_used(k, self.samples)).sum::<u64>() + (500 << 20);
        Ok(DeviceMemory { used: used.min(SIMULATED_TOTAL), total: SIMULATED_TOTAL })
    }

    fn processes(&mut self, _index: u32) -> Result<Vec<ProcessMemory>> {
        Ok((0..self.processes)
            .map(|k| ProcessMemory {
                pid: SIMULATED_FIRST_PID + k,
                used: Some(Self::process_used(k, self.samples)),
            })
            .collect())
    }

    fn process_name(&mut self, pid: u32) -> String {
        format!("simulated rank {}", pid.saturating_sub(SIMULATED_FIRST_PID))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_follows_the_saw_tooth_and_sums_to_the_device() {
        let mut s = SimulatedNvml::new(2);
        let d = s.device_memory(0).unwrap();
        let p = s.processes(0).unwrap();
        assert_eq!(p.iter().map(|p| p.used.unwrap()).sum::<u64>() + (500 << 20), d.used);
        assert_eq!(p[0].used, Some((2 << 30) + (256 << 20)));
        assert_eq!(s.process_name(SIMULATED_FIRST_PID + 1), "simulated rank 1");
    }
}
