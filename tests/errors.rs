//! Bad input is a clear, typed error naming the problem, never a panic.
mod common;

use gpu_mem_track::nvml::NvmlReader;
use gpu_mem_track::{cuda_device_count, empty_cuda_cache, track, Error, LogError, MemTracker, TrackedDevice};

fn cpu() -> gpu_mem_track::MemTrackerBuilder {
    MemTracker::builder().device(TrackedDevice::Cpu)
}

#[test]
fn missing_log_folder_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-folder");
    let e = cpu().log_dir(&missing).build().unwrap_err();
    assert!(matches!(e, Error::Log(LogError::LogDirMissing { .. })), "{e:?}");
    assert!(e.to_string().contains("no-such-folder"), "{e}");
}

#[test]
fn a_file_given_as_log_folder_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain.txt");
    std::fs::write(&file, "x").unwrap();
    let e = cpu().log_dir(&file).build().unwrap_err();
    assert!(matches!(e, Error::Log(LogError::LogDirNotADirectory { .. })), "{e:?}");
    assert!(e.to_string().contains("plain.txt"));
}

#[test]
fn unwritable_log_folder_is_named() {
    // /proc refuses new files even for root, unlike a chmod'ed temp folder.
    let e = cpu().log_dir("/proc").build().unwrap_err();
    assert!(matches!(e, Error::Log(LogError::LogDirUnwritable { .. })), "{e:?}");
    assert!(e.to_string().contains("/proc"), "{e}");
}

#[test]
fn invalid_prefixes_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["../escape", "a/b", "with space", ".hidden", "tab\t", "ünï"] {
        let e = cpu().log_dir(dir.path()).prefix(bad).build().unwrap_err();
        assert!(matches!(e, Error::Log(LogError::InvalidPrefix { .. })), "{bad}: {e:?}");
        assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
    }
    let ok = cpu().log_dir(dir.path()).prefix("rank0_gpu-1.").build().unwrap();
    let name = ok.log_path().file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.starts_with("rank0_gpu-1.") && name.ends_with("-gpu_mem_track.txt"), "{name}");
}

#[test]
fn two_trackers_in_the_same_second_get_two_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = cpu().log_dir(dir.path()).build().unwrap();
    let b = cpu().log_dir(dir.path()).build().unwrap();
    assert_ne!(a.log_path(), b.log_path());
    track!(a).unwrap();
    track!(b).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[cfg_attr(gmt_gpu, ignore = "tests the path without a GPU; this machine has one")]
#[test]
fn cuda_requested_without_a_gpu_is_a_clear_error() {
    assert_eq!(cuda_device_count(), 0, "the build found no GPU");
    let dir = tempfile::tempdir().unwrap();
    let e = MemTracker::builder().device(TrackedDevice::Cuda(0)).log_dir(dir.path()).build().unwrap_err();
    assert!(matches!(e, Error::CudaUnavailable { .. }), "{e:?}");
    assert!(e.to_string().starts_with("CUDA is not available"), "{e}");
    let e = empty_cuda_cache().unwrap_err();
    assert!(matches!(e, Error::CudaUnavailable { .. }), "{e:?}");
    // No file was left behind by the failed build.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn unknown_device_names_are_refused() {
    assert_eq!("cuda:3".parse::<TrackedDevice>().unwrap(), TrackedDevice::Cuda(3));
    assert_eq!("CPU".parse::<TrackedDevice>().unwrap(), TrackedDevice::Cpu);
    let e = "tpu:0".parse::<TrackedDevice>().unwrap_err();
    assert!(e.to_string().contains("tpu:0"));
    assert!(TrackedDevice::try_from(tch::Device::Mps).is_err());
}

#[cfg_attr(gmt_gpu, ignore = "tests the path without NVML; this machine has an NVIDIA driver")]
#[test]
fn missing_nvml_is_an_error_from_the_reader_and_tracking_goes_on() {
    match NvmlReader::open() {
        Ok(_) => panic!("NVML loaded although the build found no NVIDIA driver"),
        Err(e) => {
            assert!(matches!(e, LogError::NvmlUnavailable(_)), "{e:?}");
            assert!(e.to_string().starts_with("NVML is not available"), "{e}");
            // A CPU tracker never needs NVML and keeps working.
            let dir = tempfile::tempdir().unwrap();
            let t = cpu().log_dir(dir.path()).build().unwrap();
            let p = track!(t).unwrap();
            assert!(p.nvml.is_none());
            assert!(!std::fs::read_to_string(t.log_path()).unwrap().contains("NVML"));
        }
    }
}
