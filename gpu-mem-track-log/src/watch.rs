//! `gpu-mem-track watch`: logs NVML memory of a GPU, or of processes on it, at an interval, into
//! the same `*-gpu_mem_track.txt` format (no tensor lines; one `At` line per process and sample),
//! for jobs that cannot be recompiled (a Python training run on the same GPU, say).
//!
//! The NVML calls sit behind [`NvmlSource`] so the loop, rotation and shutdown can be tested
//! with recorded readings on a machine without a GPU.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::error::{Error, Result};
use crate::log::format;
use crate::log::writer::{log_file_stem, validate_prefix, LogWriter, TIMESTAMP_FORMAT};
use crate::log::{AtLine, LogHeader, MemoryField, SourceLocation, DEVICE_TOTAL, DEVICE_USED, NVML_USED};
use crate::nvml::NvmlReader;

/// Memory of a whole device, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceMemory {
    /// In use by all processes and the driver.
    pub used: u64,
    /// Size of the device memory.
    pub total: u64,
}

/// One process's usage of a device, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    /// Process id.
    pub pid: u32,
    /// Bytes used, when the driver reports it.
    pub used: Option<u64>,
}

/// What `watch` needs from NVML.
pub trait NvmlSource {
    /// Used and total memory of device `index` (NVML numbering).
    ///
    /// # Errors
    /// [`Error::NvmlUnavailable`] when the device cannot be read.
    fn device_memory(&mut self, index: u32) -> Result<DeviceMemory>;
    /// Compute and graphics processes on device `index`.
    ///
    /// # Errors
    /// [`Error::NvmlUnavailable`] when the device cannot be read.
    fn processes(&mut self, index: u32) -> Result<Vec<ProcessMemory>>;
    /// A short name for a process (its command line where readable).
    fn process_name(&mut self, pid: u32) -> String;
}

fn nvml_err(index: u32) -> impl Fn(nvml_wrapper::error::NvmlError) -> Error {
    move |e| Error::NvmlUnavailable(format!("device {index}: {e}"))
}

/// The real NVML, through the tracker's reader.
impl NvmlSource for NvmlReader {
    fn device_memory(&mut self, index: u32) -> Result<DeviceMemory> {
        let m = self.nvml().device_by_index(index).and_then(|d| d.memory_info()).map_err(nvml_err(index))?;
        Ok(DeviceMemory { used: m.used, total: m.total })
    }

    fn processes(&mut self, index: u32) -> Result<Vec<ProcessMemory>> {
        let d = self.nvml().device_by_index(index).map_err(nvml_err(index))?;
        let mut out: Vec<ProcessMemory> = Vec::new();
        let compute = d.running_compute_processes().map_err(nvml_err(index))?;
        let graphics = d.running_graphics_processes().unwrap_or_default();
        for p in compute.into_iter().chain(graphics) {
            let used = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            };
            match out.iter_mut().find(|o| o.pid == p.pid) {
                Some(o) => o.used = o.used.max(used),
                None => out.push(ProcessMemory { pid: p.pid, used }),
            }
        }
        Ok(out)
    }

    fn process_name(&mut self, pid: u32) -> String {
        local_process_name(pid)
            .or_else(|| self.nvml().sys_process_name(pid, 64).ok())
            .unwrap_or_else(|| format!("pid {pid}"))
    }
}

/// The command line of a local process, shortened, from `/proc`.
pub fn local_process_name(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = raw
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let first = args.first()?;
    let prog = Path::new(first).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let mut name = std::iter::once(prog).chain(args.iter().skip(1).cloned()).collect::<Vec<_>>().join(" ");
    if name.len() > 60 {
        let cut = (0..=57).rev().find(|&i| name.is_char_boundary(i)).unwrap_or(0);
        name.truncate(cut);
        name.push_str("...");
    }
    Some(name)
}

/// Which memory `watch` logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    /// The whole device.
    Device,
    /// These processes (0 when a process is not on the GPU).
    Pids(Vec<u32>),
    /// Every process NVML lists on the device at each sample.
    AllProcesses,
}

/// Settings of a watch run.
#[derive(Debug, Clone)]
pub struct WatchConfig {
    /// NVML device index.
    pub device: u32,
    /// What to log.
    pub target: WatchTarget,
    /// Time between samples.
    pub interval: Duration,
    /// Stop after this long (None: until stopped).
    pub duration: Option<Duration>,
    /// Stop after this many samples (None: no limit).
    pub max_samples: Option<u64>,
    /// Folder of the log files (must exist).
    pub log_dir: PathBuf,
    /// File-name prefix.
    pub prefix: String,
    /// Start a new file once the current one reaches this size.
    pub rotate_bytes: Option<u64>,
}

/// What a watch run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSummary {
    /// Samples taken.
    pub samples: u64,
    /// Log files written, in order.
    pub files: Vec<PathBuf>,
    /// Why the loop ended.
    pub stopped_by: StopReason,
}

/// Why a watch loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// `--duration` elapsed.
    Duration,
    /// `--samples` reached.
    Samples,
    /// A signal (Ctrl-C, SIGTERM) or the caller set the stop flag.
    Stopped,
}

fn open_log(cfg: &WatchConfig, header_fields: Vec<MemoryField>) -> Result<LogWriter> {
    let timestamp = chrono::Local::now().format(TIMESTAMP_FORMAT).to_string();
    let stem = log_file_stem(&cfg.prefix, &timestamp, &format!("gpu{}", cfg.device), None) + "-watch";
    LogWriter::create_with_header(&cfg.log_dir, &stem, &LogHeader { timestamp, fields: header_fields })
}

fn device_fields(mem: DeviceMemory) -> [MemoryField; 2] {
    [MemoryField::from_bytes(DEVICE_USED, mem.used), MemoryField::from_bytes(DEVICE_TOTAL, mem.total)]
}

/// One sample as a block of `At` lines (one per process, or one for the device).
fn sample_block(source: &mut dyn NvmlSource, cfg: &WatchConfig, index: u64) -> Result<String> {
    let mem = source.device_memory(cfg.device)?;
    let device = format!("gpu{}", cfg.device);
    let line = u32::try_from(index).unwrap_or(u32::MAX);
    let at = |file: String, function: String, fields: Vec<MemoryField>| AtLine {
        location: SourceLocation { file, line, function },
        fields,
    };
    let mut ats = Vec::new();
    match &cfg.target {
        WatchTarget::Device => ats.push(at(device, "device".into(), device_fields(mem).to_vec())),
        target => {
            let running = source.processes(cfg.device)?;
            let pids: Vec<u32> = match target {
                WatchTarget::Pids(p) => p.clone(),
                _ => running.iter().map(|p| p.pid).collect(),
            };
            for pid in pids {
                let used = running.iter().find(|p| p.pid == pid).and_then(|p| p.used).unwrap_or(0);
                let mut fields = vec![MemoryField::from_bytes(NVML_USED, used)];
                fields.extend(device_fields(mem));
                ats.push(at(format!("{device}/pid{pid}"), source.process_name(pid), fields));
            }
            if ats.is_empty() {
                // Keep the timeline continuous when no process is on the GPU.
                ats.push(at(device, "no processes".into(), device_fields(mem).to_vec()));
            }
        }
    }
    Ok(ats.iter().map(|a| format::block(&[], a)).collect())
}

/// Sleeps up to `d`, waking early when `stop` is set; returns whether it was set.
fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        let now = Instant::now();
        if now >= end {
            return false;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(50)));
    }
}

/// Runs the watch loop until the duration or sample count is reached or `stop` is set. Every
/// sample is appended whole, so stopping at any moment leaves complete files.
///
/// # Errors
/// [`Error::InvalidPrefix`], log-folder errors, [`Error::LogWrite`], and
/// [`Error::NvmlUnavailable`] when the device cannot be read at the first sample.
pub fn run_watch(source: &mut dyn NvmlSource, cfg: &WatchConfig, stop: &AtomicBool) -> Result<WatchSummary> {
    validate_prefix(&cfg.prefix)?;
    // Fail before creating a file when NVML cannot read the device at all.
    let first = source.device_memory(cfg.device)?;
    let mut writer = open_log(cfg, device_fields(first).to_vec())?;
    let mut files = vec![writer.path().to_owned()];
    let mut written = 0u64;
    let start = Instant::now();
    let mut samples = 0u64;
    let stopped_by = loop {
        if stop.load(Ordering::Relaxed) {
            break StopReason::Stopped;
        }
        if cfg.max_samples.is_some_and(|m| samples >= m) {
            break StopReason::Samples;
        }
        if cfg.duration.is_some_and(|d| start.elapsed() >= d) {
            break StopReason::Duration;
        }
        let block = sample_block(source, cfg, samples + 1)?;
        if cfg.rotate_bytes.is_some_and(|max| written > 0 && written + block.len() as u64 > max) {
            writer = open_log(cfg, device_fields(source.device_memory(cfg.device)?).to_vec())?;
            files.push(writer.path().to_owned());
            written = 0;
        }
        writer.append(&block)?;
        written += block.len() as u64;
        samples += 1;
        let wait = match cfg.duration {
            Some(d) => cfg.interval.min(d.saturating_sub(start.elapsed())),
            None => cfg.interval,
        };
        if cfg.max_samples.is_some_and(|m| samples >= m) {
            continue;
        }
        if sleep_unless_stopped(wait, stop) {
            break StopReason::Stopped;
        }
    };
    Ok(WatchSummary { samples, files, stopped_by })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::parse_log_file;

    /// Replays recorded readings: the only test double in the project, since real NVML needs a GPU.
    struct Recorded {
        device: Vec<DeviceMemory>,
        procs: Vec<Vec<ProcessMemory>>,
        calls: usize,
    }

    impl NvmlSource for Recorded {
        // Each sample reads the device first, so `calls` is the sample number (0: the check at start).
        fn device_memory(&mut self, _index: u32) -> Result<DeviceMemory> {
            let i = self.calls.min(self.device.len() - 1);
            self.calls += 1;
            Ok(self.device[i])
        }
        fn processes(&mut self, _index: u32) -> Result<Vec<ProcessMemory>> {
            let i = (self.calls - 1).min(self.procs.len() - 1);
            Ok(self.procs[i].clone())
        }
        fn process_name(&mut self, pid: u32) -> String {
            format!("python train.py --rank {}", pid % 10)
        }
    }

    const MIB: u64 = 1 << 20;

    fn recorded(n: usize) -> Recorded {
        Recorded {
            device: (0..n)
                .map(|i| DeviceMemory { used: (1000 + 10 * i as u64) * MIB, total: 24_000 * MIB })
                .collect(),
            procs: (0..n)
                .map(|i| {
                    vec![
                        ProcessMemory { pid: 4242, used: Some((500 + 10 * i as u64) * MIB) },
                        ProcessMemory { pid: 777, used: Some(300 * MIB) },
                    ]
                })
                .collect(),
            calls: 0,
        }
    }

    fn config(dir: &Path, target: WatchTarget) -> WatchConfig {
        WatchConfig {
            device: 0,
            target,
            interval: Duration::ZERO,
            duration: None,
            max_samples: Some(5),
            log_dir: dir.to_owned(),
            prefix: String::new(),
            rotate_bytes: None,
        }
    }

    #[test]
    fn logs_requested_processes_in_the_tracker_format() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        let s = run_watch(&mut recorded(5), &config(dir.path(), WatchTarget::Pids(vec![4242, 9])), &stop)
            .unwrap();
        assert_eq!((s.samples, s.files.len(), s.stopped_by), (5, 1, StopReason::Samples));
        let name = s.files[0].file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.ends_with("-gpu0-watch-gpu_mem_track.txt"), "{name}");
        let log = parse_log_file(&s.files[0]).unwrap();
        assert_eq!(log.blocks.len(), 10, "two processes per sample");
        let b = &log.blocks[8];
        assert_eq!(b.at.location.file, "gpu0/pid4242");
        assert_eq!(b.at.location.line, 5);
        assert_eq!(b.at.location.function, "python train.py --rank 2");
        assert_eq!(b.at.field(NVML_USED), Some(540.0));
        assert_eq!(b.at.field(DEVICE_TOTAL), Some(24000.0));
        assert_eq!(log.blocks[9].at.field(NVML_USED), Some(0.0), "pid 9 is not on the GPU");
        assert!(log.blocks.iter().all(|b| b.changes.is_empty()));
    }

    #[test]
    fn all_processes_and_device_modes() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        let s = run_watch(&mut recorded(5), &config(dir.path(), WatchTarget::AllProcesses), &stop).unwrap();
        let log = parse_log_file(&s.files[0]).unwrap();
        assert_eq!(log.blocks.len(), 10);
        assert_eq!(log.blocks[1].at.location.file, "gpu0/pid777");
        let dir = tempfile::tempdir().unwrap();
        let s = run_watch(&mut recorded(5), &config(dir.path(), WatchTarget::Device), &stop).unwrap();
        let log = parse_log_file(&s.files[0]).unwrap();
        assert_eq!(log.blocks.len(), 5);
        assert_eq!(log.blocks[4].at.field(DEVICE_USED), Some(1040.0));
    }

    #[test]
    fn rotation_starts_new_complete_files() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        let mut cfg = config(dir.path(), WatchTarget::Pids(vec![4242]));
        cfg.max_samples = Some(12);
        cfg.rotate_bytes = Some(600); // about three samples per file
        let s = run_watch(&mut recorded(12), &cfg, &stop).unwrap();
        assert!(s.files.len() >= 3, "{:?}", s.files);
        let mut total = 0;
        for f in &s.files {
            let log = parse_log_file(f).unwrap();
            assert!(!log.blocks.is_empty());
            assert!(std::fs::read_to_string(f).unwrap().ends_with("\n\n"));
            total += log.blocks.len();
        }
        assert_eq!(total, 12);
    }

    #[test]
    fn stop_flag_ends_the_loop_with_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let mut cfg = config(dir.path(), WatchTarget::Device);
        cfg.max_samples = None;
        cfg.interval = Duration::from_millis(5);
        let flag = std::sync::Arc::clone(&stop);
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(60));
            flag.store(true, Ordering::Relaxed);
        });
        let s = run_watch(&mut recorded(1000), &cfg, &stop).unwrap();
        stopper.join().unwrap();
        assert_eq!(s.stopped_by, StopReason::Stopped);
        assert!(s.samples >= 2);
        let log = parse_log_file(&s.files[0]).unwrap();
        assert_eq!(log.blocks.len() as u64, s.samples);
    }

    #[test]
    fn duration_bounds_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let stop = AtomicBool::new(false);
        let mut cfg = config(dir.path(), WatchTarget::Device);
        cfg.max_samples = None;
        cfg.interval = Duration::from_millis(10);
        cfg.duration = Some(Duration::from_millis(50));
        let s = run_watch(&mut recorded(1000), &cfg, &stop).unwrap();
        assert_eq!(s.stopped_by, StopReason::Duration);
        assert!((2..=7).contains(&s.samples), "{}", s.samples);
    }
}
