//! The only code that calls the operating system for files.
//!
//! Everything the engine does to disk (create, write, sync, truncate, rename,
//! remove, directory sync, lock, map) goes through [`Storage`] and
//! [`StorageFile`], so that tests can substitute an implementation that injects
//! faults or simulates power loss. This module knows nothing of formats.

#[cfg(feature = "testing")]
mod faulty;
mod os;

#[cfg(feature = "testing")]
pub use faulty::{CrashPolicy, Fault, FaultError, FaultyStorage, OpKind, OpRecord, Repeat};
pub use os::OsStorage;

use std::any::Any;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create a new file; fail if it exists.
    CreateNew,
    /// Open an existing file for reading and writing (`append` writes at
    /// its end, `write_at` anywhere).
    Append,
    /// Open an existing file for reading only.
    Read,
}

/// A file system, as far as the engine needs one.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the entries in `dir` (files only, no order promised).
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens or creates a file.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>>;
    /// Atomically replaces `to` with `from`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (created if missing) that lasts until
    /// the returned guard drops or the process dies. A lock already held, by
    /// this process or another, is `ErrorKind::WouldBlock`.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>>;
}

/// An open file.
#[expect(
    clippy::len_without_is_empty,
    reason = "an empty file is not a case the engine asks about"
)]
pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Appends all of `buf` at the end of the file.
    fn append(&self, buf: &[u8]) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, extending the file if it ends
    /// before `offset + buf.len()` (a gap reads as zeros). The log writes
    /// its records this way into a segment extended ahead of them
    /// (DESIGN.md, "Preallocated segments").
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the file's data durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Starts writing `len` bytes at `offset` back to the disk and returns
    /// at once: a hint that a `sync_data` follows, so that the disk works
    /// while the caller does something else first. It makes nothing durable
    /// and reports nothing (`sync_data` reports a failed write-back). The
    /// default does nothing.
    fn start_write_back(&self, _offset: u64, _len: u64) {}
    /// Truncates or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Maps the file for reading. Bytes `..self.len()` at the time of the call
    /// are readable; `reserve` is a hint of how far the file may grow, and an
    /// implementation may map that far so that later appends need no remap.
    /// Callers never read past what they know was written.
    fn map(&self, reserve: u64) -> io::Result<Bytes>;
    /// Reads exactly `buf.len()` bytes at `offset`, inside what was written.
    /// Unlike reading through a map, this brings no page into the process:
    /// the engine uses it for scattered small reads, so that the log's pages
    /// do not pile up in its resident memory. The default reads through a
    /// map.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let map = self.map(0)?;
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| map.get(start..start.checked_add(buf.len())?))
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}
