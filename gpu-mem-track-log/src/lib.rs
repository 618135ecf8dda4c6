//! # gpu-mem-track-log
//!
//! The part of [gpu-mem-track](https://github.com/) that needs no libtorch: the
//! Pytorch-Memory-Utils log format (writing lines, parsing them back, the diff vocabulary), the
//! `report`, `plot` and `watch` commands' logic, NVML readings, allocation traces with their
//! categories and one replay of live/peak bytes, and PyTorch memory-snapshot pickles (writing and
//! reading). What a trace becomes on a GPU (the caching allocator model, the CUDA libraries'
//! workspaces, device profiles) is `gpu-mem-track-gpu`, built on this crate.
//!
//! Logs of any size are read block by block ([`log::LogReader`], [`report::analyse_file`]), in
//! memory bounded by their distinct lines and tensor groups.
//!
//! The `gpu-mem-track` binary is built on this crate alone, so `report`, `plot`, `watch` and
//! `timeline SNAPSHOT.pickle` start without loading libtorch. The tch-facing library
//! (`gpu_mem_track`) builds on it and re-exports what its users need.
//!
//! ```
//! use gpu_mem_track_log::log::{parse_log, format};
//! use gpu_mem_track_log::report::{analyse, render_text, combine};
//!
//! // `At` lines pad the place to 50 columns, as Pytorch-Memory-Utils does.
//! let at = format!("At {:<50} Total Tensor Used Memory:4.0    Mb Total Allocated Memory:4.0    Mb", "train.rs line 12: main");
//! let text = format!(
//!     "GPU Memory Track | 30-Apr-21-20:25:29 | Total Tensor Used Memory:0.0    Mb Total Allocated Memory:0.0    Mb\n\n\
//!      + | 1 * Size:(1024, 1024)         | Memory: 4.0 M | <class 'torch.Tensor'> | torch.float32\n\n{at}\n\n"
//! );
//! let log = parse_log(&text)?;
//! assert_eq!(log.blocks[0].changes[0].shape, vec![1024, 1024]);
//! assert_eq!(log.render(), text);          // our own format reads back to the same text
//! let report = combine(vec![analyse("x.txt".as_ref(), &log, Vec::new(), 10)]);
//! assert!(render_text(&report).contains("train.rs line 12: main"));
//! # Ok::<(), gpu_mem_track_log::log::LogParseError>(())
//! ```
#![warn(missing_docs)]

pub mod diff;
mod error;
pub mod group;
pub mod log;
pub mod memviz;
pub mod nvml;
mod pickle;
#[cfg(feature = "plot")]
pub mod plot;
pub mod reading_cache;
pub mod report;
pub mod simulated_nvml;
pub mod trace;
pub mod units;
pub mod watch;

pub use diff::{diff_groups, GroupChange, Sign, ViewLines};
pub use error::{Error, Result};
pub use group::{DType, GroupKey, GroupTotals, TensorClass, TensorRole};
pub use trace::{Category, Phase, Replay, TimelinePoint, Trace, TraceEvent};
