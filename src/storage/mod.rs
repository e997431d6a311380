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
    /// Whether the engine may do I/O on a thread of its own (filling the
    /// log with zeros ahead of its records, `log/zero_fill.rs`). A storage
    /// that says no gets that I/O on the caller's thread instead, so that
    /// its operations come in the same order in every run.
    fn allows_background_io(&self) -> bool {
        true
    }
}

/// Zeros for [`StorageFile::fill_zeros`]' default, written from here a
/// piece at a time.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

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
    /// Writes zeros over `len` bytes at `offset`, inside the file's
    /// length: the file system allocates and writes those blocks now, so
    /// that a later `write_at` there and its `sync_data` write data alone
    /// (DESIGN.md, "Zero-filled segments"). The default writes from a
    /// static buffer of zeros.
    fn fill_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut at = offset;
        let end = offset.saturating_add(len);
        while at < end {
            let piece = (end - at).min(ZEROS.len() as u64);
            let zeros = ZEROS
                .get(..piece as usize)
                .expect("a piece is at most the buffer");
            self.write_at(at, zeros)?;
            at += piece;
        }
        Ok(())
    }
    /// Makes the file's data durable. A failed write-back of any of the
    /// file's pages is reported to the next sync of each open handle of the
    /// file, once, as Linux does for each file description.
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
    /// Hints that the caller has read `map[..upto]`, where `map` starts a
    /// map this file returned, and will not soon again: its pages may leave
    /// the process's resident memory (they stay cached, and a later read
    /// brings them back). Loading a snapshot or replaying a segment reads a
    /// whole file through its map, which would otherwise count all of it in
    /// the process's memory until the map goes. Anything else passed in is
    /// left alone. The default does nothing.
    fn release_pages(&self, _map: &[u8], _upto: usize) {}
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
