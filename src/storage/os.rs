//! [`Storage`] on the real file system.

use std::any::Any;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::{OpenMode, Storage, StorageFile};

/// The operating system's file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsStorage;

impl Storage for OsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        fs::create_dir_all(dir)
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        Ok(names)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let file = match mode {
            // Not O_APPEND: on Linux, `pwrite` to such a file ignores its
            // offset and appends, and the log writes at offsets.
            OpenMode::CreateNew => OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(path)?,
            OpenMode::Append => OpenOptions::new().read(true).write(true).open(path)?,
            OpenMode::Read => OpenOptions::new().read(true).open(path)?,
        };
        Ok(Arc::new(OsFile { file }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // flock semantics: held per open file description, so a second open in
        // this process conflicts too, and the kernel drops it when we die.
        match file.try_lock() {
            Ok(()) => Ok(Box::new(file)),
            Err(TryLockError::WouldBlock) => Err(io::ErrorKind::WouldBlock.into()),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }
}

#[derive(Debug)]
struct OsFile {
    file: File,
}

impl StorageFile for OsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn append(&self, buf: &[u8]) -> io::Result<()> {
        // One writer per file (the store's locks), so nothing moves the end
        // between the seek and the write.
        let mut file = &self.file;
        file.seek(SeekFrom::End(0))?;
        file.write_all(buf)
    }

    #[cfg(unix)]
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)
    }

    #[cfg(not(unix))]
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(offset))?;
        file.write_all(buf)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    #[cfg(target_os = "linux")]
    fn start_write_back(&self, offset: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: a plain syscall on a descriptor this file owns. With
        // SYNC_FILE_RANGE_WRITE alone it only starts write-back: it neither
        // waits nor consumes a write-back error, which the following
        // fdatasync still reports. Its own result is a hint's, ignored.
        #[expect(unsafe_code, reason = "sync_file_range has no safe wrapper in std")]
        let _ = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset,
                len,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn map(&self, reserve: u64) -> io::Result<Bytes> {
        let len = self.len()?.max(reserve);
        if len == 0 {
            return Ok(Bytes::new());
        }
        let len = usize::try_from(len).map_err(|_| io::Error::other("file too large to map"))?;
        // SAFETY: the map may extend past the end of the file (`reserve`);
        // pages past the end are never touched, because callers only read
        // ranges they wrote, and a mapped file is only ever truncated past
        // what was written to it (a segment's unused preallocated tail;
        // recovery's truncation of a torn tail happens before any map of
        // the truncated region is handed out). The file is private to the
        // store, which holds the directory lock, so no other process
        // shrinks it.
        #[expect(unsafe_code, reason = "memory-mapping is the one unsafe operation")]
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&self.file)? };
        Ok(Bytes::from_owner(map))
    }

    #[cfg(unix)]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
}
