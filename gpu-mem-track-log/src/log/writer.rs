//! Appends blocks to a `*-gpu_mem_track.txt` file: one `write` per block, then a flush, with the
//! file opened in append mode, so concurrent writers and crashes leave only whole blocks.
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::log::LogHeader;

/// `strftime` format of the timestamp in file names and headers (`30-Apr-21-20:25:29`).
pub const TIMESTAMP_FORMAT: &str = "%d-%b-%y-%H:%M:%S";
/// Suffix of every log file name.
pub const FILE_SUFFIX: &str = "gpu_mem_track.txt";

/// An open log file.
#[derive(Debug)]
pub struct LogWriter {
    path: PathBuf,
    file: File,
}

impl LogWriter {
    /// A new log in `dir` (as [`create`](Self::create)) that starts with its header line: how
    /// every log of this project (the tracker's, `watch`'s) is opened.
    ///
    /// # Errors
    /// As [`create`](Self::create) and [`append`](Self::append).
    pub fn create_with_header(dir: &Path, stem: &str, header: &LogHeader) -> Result<Self> {
        let mut writer = Self::create(dir, stem)?;
        writer.append(&header.render())?;
        Ok(writer)
    }

    /// Creates `<dir>/<stem>-gpu_mem_track.txt` (adding `-2`, `-3`, ... before the suffix if that
    /// name is taken), never appending to another run's file. See [`log_file_stem`].
    ///
    /// # Errors
    /// [`Error::LogDirMissing`], [`Error::LogDirNotADirectory`], [`Error::LogDirUnwritable`].
    pub fn create(dir: &Path, stem: &str) -> Result<Self> {
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::LogDirMissing { path: dir.to_owned() })
            }
            Err(source) => return Err(Error::LogDirUnwritable { path: dir.to_owned(), source }),
            Ok(m) if !m.is_dir() => return Err(Error::LogDirNotADirectory { path: dir.to_owned() }),
            Ok(_) => {}
        }
        for n in 1u32.. {
            let name =
                if n == 1 { format!("{stem}-{FILE_SUFFIX}") } else { format!("{stem}-{n}-{FILE_SUFFIX}") };
            let path = dir.join(name);
            match OpenOptions::new().append(true).create_new(true).open(&path) {
                Ok(file) => return Ok(LogWriter { path, file }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 10_000 => continue,
                Err(source) => return Err(Error::LogDirUnwritable { path: dir.to_owned(), source }),
            }
        }
        unreachable!("the loop returns")
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one whole block with a single write, then flushes. A write that fails part-way (a
    /// full disk, `ulimit -f`) is undone: the file is cut back to where the block started, so the
    /// log keeps only whole blocks and later blocks can still be appended.
    ///
    /// # Errors
    /// [`Error::LogWrite`] naming the file (with the OS error of the write; the block is not in
    /// the file).
    pub fn append(&mut self, block: &str) -> Result<()> {
        // Append mode writes at the end; this handle is the file's only writer, so the end before
        // the write is where this block starts.
        let start = self.file.metadata().map(|m| m.len()).ok();
        let written = self.file.write_all(block.as_bytes()).and_then(|()| self.file.flush());
        written.map_err(|source| {
            if let Some(start) = start {
                // Best effort: if even this fails the OS error above is still the one to report.
                let _ = self.file.set_len(start);
            }
            Error::LogWrite { path: self.path.clone(), source }
        })
    }
}

/// Checks a file-name prefix: letters, digits, `-`, `_`, `.`; not starting with `.`; at most 100.
///
/// # Errors
/// [`Error::InvalidPrefix`] saying what is wrong.
pub fn validate_prefix(prefix: &str) -> Result<()> {
    let bad = |reason| Err(Error::InvalidPrefix { prefix: prefix.to_owned(), reason });
    if prefix.len() > 100 {
        return bad("longer than 100 bytes");
    }
    if prefix.starts_with('.') {
        return bad("starts with `.` (hidden file or path traversal)");
    }
    if !prefix.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return bad("only ASCII letters, digits, `-`, `_` and `.` are allowed in a file name prefix");
    }
    Ok(())
}

/// The rank of this process in a distributed job, from the usual launcher variables:
/// `RANK` (torchrun, and most launchers), else `SLURM_PROCID`, else `LOCAL_RANK`.
pub fn launcher_rank() -> Option<u32> {
    ["RANK", "SLURM_PROCID", "LOCAL_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok().and_then(|s| s.trim().parse().ok()))
}

/// `<prefix><timestamp>-<device>[-rank<R>]`: one file per device and rank, so the processes of a
/// multi-GPU or multi-node job can share a log folder.
pub fn log_file_stem(prefix: &str, timestamp: &str, device_tag: &str, rank: Option<u32>) -> String {
    match rank {
        Some(r) => format!("{prefix}{timestamp}-{device_tag}-rank{r}"),
        None => format!("{prefix}{timestamp}-{device_tag}"),
    }
}

/// What a log's file name says about its origin.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogFileName {
    /// Device tag (`cpu`, `cuda0`, `gpu0`), when present.
    pub device: Option<String>,
    /// Rank, when the job had one.
    pub rank: Option<u32>,
}

/// Reads the device and rank tags out of a log file name (absent in the Python tool's names).
pub fn parse_log_file_name(name: &str) -> LogFileName {
    let stem = name.strip_suffix(FILE_SUFFIX).unwrap_or(name).trim_end_matches('-');
    let mut out = LogFileName::default();
    for part in stem.rsplit('-').take(3) {
        if let Some(r) = part.strip_prefix("rank").and_then(|r| r.parse().ok()) {
            out.rank = Some(r);
        } else if part == "cpu"
            || ["cuda", "gpu"].iter().any(|p| {
                part.strip_prefix(p).is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            })
        {
            out.device = Some(part.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_carry_device_and_rank_and_read_back() {
        let stem = log_file_stem("job-", "22-Nov-26-00:35:47", "cuda1", Some(3));
        assert_eq!(stem, "job-22-Nov-26-00:35:47-cuda1-rank3");
        let name = format!("{stem}-{FILE_SUFFIX}");
        assert_eq!(parse_log_file_name(&name), LogFileName { device: Some("cuda1".into()), rank: Some(3) });
        let plain = "30-Apr-21-20:25:29-gpu_mem_track.txt";
        assert_eq!(parse_log_file_name(plain), LogFileName::default());
        let cpu = format!("{}-{FILE_SUFFIX}", log_file_stem("", "22-Nov-26-00:35:47", "cpu", None));
        assert_eq!(parse_log_file_name(&cpu).device.as_deref(), Some("cpu"));
    }
}
