//! The `gpu-mem-track` command line: `report`, `plot`, `watch` and `timeline` of a snapshot
//! pickle run here without loading libtorch; `estimate` and `timeline` of a model run the second
//! binary, `gpu-mem-track-estimate`, installed beside this one (git-style).
//!
//! Exit codes: 0 success, 1 error (one line on stderr naming the file or option), 2 usage.
use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(gpu_mem_track_cli::command::run_from(std::env::args_os()))
}
