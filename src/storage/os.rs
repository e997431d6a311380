//! [`Storage`] on the real file system.

use std::any::Any;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::{OpenMode, Storage, StorageFile};

/// The page size, which `madvise` ranges are aligned to.
#[cfg(target_os = "linux")]
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    #[expect(unsafe_code, reason = "sysconf has no safe wrapper in std")]
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(1)
}

/// Opens `path` so that reading it never updates its access time: the
/// store reads its values back with a `pread` each (compaction, and puts
/// compared with the value they would replace), and each one otherwise
/// checks the time, and after every write to the file also updates it
/// (a dirty inode). `O_NOATIME` is refused to a process that does not own
/// the file; it then opens as usual.
fn open_without_atime(options: &OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match options.clone().custom_flags(libc::O_NOATIME).open(path) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            opened => return opened,
        }
    }
    options.open(path)
}

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
        let mut options = OpenOptions::new();
        match mode {
            // Not O_APPEND: on Linux, `pwrite` to such a file ignores its
            // offset and appends, and the log writes at offsets.
            OpenMode::CreateNew => options.read(true).write(true).create_new(true),
            OpenMode::Append => options.read(true).write(true),
            OpenMode::Read => options.read(true),
        };
        let file = open_without_atime(&options, path)?;
        Ok(Arc::new(OsFile {
            file,
            maps: Arc::default(),
        }))
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
    /// The address ranges of this file's maps still alive, so that
    /// `release_pages` only ever advises memory that is one of them.
    maps: LiveMaps,
}

type LiveMaps = Arc<Mutex<Vec<(usize, usize)>>>;

/// A map of a file, registered in its file's `maps` while it lives.
struct FileMap {
    map: memmap2::Mmap,
    live: LiveMaps,
}

impl FileMap {
    fn range(&self) -> (usize, usize) {
        (self.map.as_ptr() as usize, self.map.len())
    }
}

impl AsRef<[u8]> for FileMap {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        let range = self.range();
        self.live.lock().retain(|&r| r != range);
    }
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
        // what was written to it (a segment's unused preallocated tail).
        // Recovery and repair, which cut records, replace the segment by a
        // copy of what they keep instead (`recovery::rewrite_segment`), so
        // a map of the old file, which values handed out earlier may hold,
        // keeps every page it had. The file is private to the store, which
        // holds the directory lock, so no other process shrinks it.
        #[expect(unsafe_code, reason = "memory-mapping a file has no safe wrapper")]
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(&self.file)? };
        let map = FileMap {
            map,
            live: Arc::clone(&self.maps),
        };
        self.maps.lock().push(map.range());
        Ok(Bytes::from_owner(map))
    }

    #[cfg(target_os = "linux")]
    fn release_pages(&self, map: &[u8], upto: usize) {
        let page = page_size();
        let start = map.as_ptr() as usize;
        let first = start.next_multiple_of(page);
        let end = start + upto.min(map.len());
        let end = end - end % page;
        if end <= first {
            return;
        }
        let maps = self.maps.lock();
        if !maps.iter().any(|&(at, len)| at <= first && end <= at + len) {
            return;
        }
        // SAFETY: [first, end) lies inside a live read-only shared map of
        // this file (checked above, and the lock keeps it alive meanwhile).
        // Dropping such pages changes no byte a reader sees: the next read
        // maps the file's page again from the page cache. Its result is a
        // hint's, ignored.
        #[expect(unsafe_code, reason = "madvise has no safe wrapper in std")]
        let _ =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
    }

    #[cfg(unix)]
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident KiB of the mapping that starts at `at` (from /proc/self/smaps).
    fn resident_kib(at: usize) -> u64 {
        let smaps = fs::read_to_string("/proc/self/smaps").expect("smaps");
        let start = format!("{at:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&start));
        lines
            .find_map(|l| l.strip_prefix("Rss:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .expect("the mapping is listed")
    }

    #[test]
    fn append_writes_at_the_end_whatever_the_file_was_opened_or_cut_to() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        fs::write(&path, b"kept").expect("write");
        let file = OsStorage.open(&path, OpenMode::Append).expect("open");
        file.append(b" one").expect("append");
        file.write_at(0, b"K").expect("write_at");
        file.append(b" two").expect("append");
        assert_eq!(fs::read(&path).expect("read"), b"Kept one two");
        file.set_len(4).expect("cut");
        file.append(b"!").expect("append");
        assert_eq!(fs::read(&path).expect("read"), b"Kept!");
    }

    #[test]
    fn create_new_refuses_an_existing_file_and_leaves_it_alone() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        fs::write(&path, b"kept").expect("write");
        let e = OsStorage
            .open(&path, OpenMode::CreateNew)
            .expect_err("the file exists");
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&path).expect("read"), b"kept");
    }

    #[test]
    fn list_dir_names_files_and_not_directories() {
        let dir = tempfile::tempdir().expect("dir");
        fs::write(dir.path().join("a"), b"").expect("write");
        fs::create_dir(dir.path().join("d")).expect("mkdir");
        assert_eq!(OsStorage.list_dir(dir.path()).expect("list"), ["a"]);
    }

    #[test]
    fn read_at_past_what_was_written_is_an_unexpected_end_of_file() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        fs::write(&path, b"hello").expect("write");
        let file = OsStorage.open(&path, OpenMode::Read).expect("open");
        let mut buf = [0u8; 3];
        file.read_at(2, &mut buf).expect("inside");
        assert_eq!(&buf, b"llo");
        let e = file.read_at(3, &mut buf).expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn reading_a_file_leaves_its_access_time_alone() {
        // An access time older than the file's last change is the one
        // that `relatime`, the usual mount default, updates on a read.
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        fs::write(&path, b"hello").expect("write");
        let long_ago = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400);
        File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_times(fs::FileTimes::new().set_accessed(long_ago)))
            .expect("set the access time");
        for mode in [OpenMode::Read, OpenMode::Append] {
            let file = OsStorage.open(&path, mode).expect("open");
            let mut buf = [0u8; 5];
            file.read_at(0, &mut buf).expect("read");
            assert_eq!(&buf, b"hello");
        }
        let accessed = fs::metadata(&path)
            .and_then(|m| m.accessed())
            .expect("atime");
        assert_eq!(accessed, long_ago);
    }

    #[test]
    fn released_pages_leave_resident_memory_and_read_back_the_same() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &bytes).expect("write");
        let file = OsStorage.open(&path, OpenMode::Read).expect("open");
        let map = file.map(0).expect("map");
        let at = map.as_ptr() as usize;
        assert_eq!(&map[..], &bytes[..], "read every page");
        assert!(resident_kib(at) >= 4 << 10, "{} KiB", resident_kib(at));

        // Half, then a slice that is not a map (left alone), then all.
        file.release_pages(&map, 2 << 20);
        let half = resident_kib(at);
        assert!(half <= 2 << 10, "{half} KiB resident after releasing half");
        let heap = bytes.clone();
        file.release_pages(&heap, heap.len());
        assert_eq!(
            heap, bytes,
            "memory that is no map of the file is untouched"
        );
        file.release_pages(&map, map.len());
        assert_eq!(resident_kib(at), 0);
        assert_eq!(&map[..], &bytes[..], "released pages read back the same");
    }
}
