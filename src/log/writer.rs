//! Appends blocks to a `*-gpu_mem_track.txt` file: one `write` per block, then a flush, with the
//! file opened in append mode, so concurrent writers and crashes leave only whole blocks.
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

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
    /// Creates `<dir>/<prefix><timestamp>-gpu_mem_track.txt` (adding `-2`, `-3`, ... before the
    /// suffix if that name is taken), never appending to another run's file.
    ///
    /// # Errors
    /// [`Error::LogDirMissing`], [`Error::LogDirNotADirectory`], [`Error::LogDirUnwritable`].
    pub fn create(dir: &Path, prefix: &str, timestamp: &str) -> Result<Self> {
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::LogDirMissing { path: dir.to_owned() })
            }
            Err(source) => return Err(Error::LogDirUnwritable { path: dir.to_owned(), source }),
            Ok(m) if !m.is_dir() => return Err(Error::LogDirNotADirectory { path: dir.to_owned() }),
            Ok(_) => {}
        }
        for n in 1u32.. {
            let name = if n == 1 {
                format!("{prefix}{timestamp}-{FILE_SUFFIX}")
            } else {
                format!("{prefix}{timestamp}-{n}-{FILE_SUFFIX}")
            };
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

    /// Appends one whole block with a single write, then flushes.
    ///
    /// # Errors
    /// [`Error::LogWrite`] naming the file.
    pub fn append(&mut self, block: &str) -> Result<()> {
        self.file
            .write_all(block.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|source| Error::LogWrite { path: self.path.clone(), source })
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
