//! [`FaultyStorage`]: an in-memory disk with a page cache, for fault-injection
//! and crash tests (behind the `testing` feature).
//!
//! What it models:
//! - Each file has *durable* bytes (what survives a power loss) and *current*
//!   bytes (what reads see), plus the list of writes and truncations made
//!   since its last `sync_data`, which makes them durable.
//! - Directory entries (create, rename, remove, the lock file) change the
//!   *current* namespace at once and the *durable* one only at `sync_dir` of
//!   their directory. A rename across directories is durable in each
//!   directory separately: syncing only the target's leaves both names.
//! - A failed `sync_data` (injected, not a crash) forgets the file's unsynced
//!   writes: they stay readable but never become durable, as Linux does after
//!   an fsync error. Nothing is retried for the caller. The next sync of
//!   each other open handle of the file fails too, once (Linux reports a
//!   write-back error to each file description).
//! - Background I/O: none (`allows_background_io` is false), so that the
//!   engine's operations come in the same order in every run.
//! - Faults: fail the n-th operation of a kind with EIO or ENOSPC, once or
//!   from then on; a write may first write a prefix of its buffer.
//! - A crash at global operation n: that operation and every later one fail
//!   with EIO (the process died there); a write at n may first write a
//!   prefix of its buffer. [`FaultyStorage::crash_image`] then gives the disk
//!   as a power loss or a process crash leaves it ([`CrashPolicy`]).
//! - Bit rot: [`FaultyStorage::corrupt`] flips bits of durable bytes.
//! - Every operation is counted and traced ([`OpRecord`]), so a test can run
//!   a workload once to count its operations, then cut at each of them.
//! - An operation can be held when it starts while other threads go on
//!   ([`FaultyStorage::pause_next`]), and a data sync once it is done but
//!   before it returns ([`FaultyStorage::pause_after_next_sync`]), to
//!   interleave threads deterministically (for example, a record appended
//!   while another writer's sync is held). Several can be held at once,
//!   and let go one by one ([`FaultyStorage::resume_op`]) or all together.
//!
//! What it does not model: permissions (EACCES is only injected), disk
//! capacity (ENOSPC is only injected), hard links, directories as entries (`create_dir_all` is
//! immediate and durable, and directories cannot be removed), torn directory
//! updates, and the liveness of memory maps: `map` returns a copy of the
//! current bytes, so later writes (and `corrupt`) are not seen through an
//! earlier map, unlike `mmap`. The copy ends at the furthest write, leaving
//! out space that only `set_len` added, so that no map holds zeros that a
//! later write replaces. Locks are per `FaultyStorage`, not per process.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex, MutexGuard};

use super::{OpenMode, Storage, StorageFile};

/// The kinds of operation that are counted, traced and can be made to fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `Storage::create_dir_all`.
    CreateDir,
    /// `Storage::list_dir`.
    List,
    /// `Storage::open`, any mode.
    Open,
    /// `StorageFile::append` or `StorageFile::write_at`.
    Write,
    /// `StorageFile::fill_zeros`: a write of zeros that fills space
    /// ahead of later writes.
    FillZeros,
    /// `StorageFile::sync_data`.
    SyncData,
    /// `StorageFile::set_len`.
    SetLen,
    /// `StorageFile::len`.
    Len,
    /// `StorageFile::map`.
    Map,
    /// `StorageFile::read_at`.
    Read,
    /// `Storage::rename`.
    Rename,
    /// `Storage::remove_file`.
    Remove,
    /// `Storage::sync_dir`.
    SyncDir,
    /// `Storage::lock`.
    Lock,
}

/// The error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultError {
    /// EIO (errno 5): the device failed.
    Io,
    /// ENOSPC (errno 28): the disk is full.
    NoSpace,
    /// EACCES (errno 13): the process may not open the path.
    PermissionDenied,
}

impl FaultError {
    /// The `io::Error` the operation returns.
    pub fn to_io_error(self) -> io::Error {
        match self {
            FaultError::Io => io::Error::from_raw_os_error(5),
            FaultError::NoSpace => io::Error::from_raw_os_error(28),
            FaultError::PermissionDenied => io::Error::from_raw_os_error(13),
        }
    }
}

/// How often an armed fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// The first matching operation fails; later ones succeed.
    Once,
    /// The first matching operation and every later one of its kind fail.
    Always,
}

/// A fault to inject with [`FaultyStorage::inject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Which operations fail.
    pub kind: OpKind,
    /// Operations of `kind` to let through first, counted from when the
    /// fault is injected (0: the next one fails).
    pub skip: u64,
    /// The error returned.
    pub error: FaultError,
    /// Once, or from then on.
    pub repeat: Repeat,
    /// For `Write`: bytes of the buffer written before the error; for
    /// `SyncData`: bytes of the file's unsynced writes, from the oldest,
    /// made durable before the error.
    pub written_bytes: usize,
}

impl Fault {
    /// The next operation of `kind` fails once with `error`.
    pub fn new(kind: OpKind, error: FaultError) -> Self {
        Self {
            kind,
            skip: 0,
            error,
            repeat: Repeat::Once,
            written_bytes: 0,
        }
    }

    /// Lets `skip` operations of the kind through first.
    #[must_use]
    pub fn skip(mut self, skip: u64) -> Self {
        self.skip = skip;
        self
    }

    /// Fails every matching operation from the first one on.
    #[must_use]
    pub fn always(mut self) -> Self {
        self.repeat = Repeat::Always;
        self
    }

    /// A failing write first writes `bytes` bytes of its buffer; a failing
    /// `sync_data` first makes the first `bytes` bytes of the file's
    /// unsynced writes durable, as a disk may have written some of a failed
    /// sync's pages (the rest stays readable and never reaches the disk).
    #[must_use]
    pub fn written_bytes(mut self, bytes: usize) -> Self {
        self.written_bytes = bytes;
        self
    }
}

/// What of the unsynced state a crash leaves on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Power loss: the durable namespace and each file's durable bytes;
    /// every unsynced write and directory entry is lost.
    PowerLoss,
    /// Process crash: the OS keeps its page cache, so the current namespace
    /// and all bytes written survive and read back; the disk gets every
    /// write still waiting for write-back, but not what a failed sync
    /// dropped (on Linux those pages stay cached, marked clean), which a
    /// power loss of the image then loses.
    ProcessCrash,
    /// Power loss while the disk was writing back: the current namespace
    /// (entries reached the disk), and each file's durable bytes plus the
    /// first `bytes` bytes of its unsynced writes in write order. The write
    /// in progress at that byte is torn; later writes and truncations are lost.
    Torn {
        /// Bytes of each file's unsynced writes that reached the disk.
        bytes: u64,
    },
    /// Power loss after the disk wrote back out of order: the current
    /// namespace, and each file's durable bytes plus only the last `writes`
    /// of its unsynced writes, at the offsets they were made at. Earlier
    /// unsynced writes are holes of zeros; the file is as long as its durable
    /// bytes or the end of the last surviving write, whichever is longer.
    /// Unsynced truncations are lost.
    Reordered {
        /// How many of each file's last unsynced writes survive.
        writes: usize,
    },
}

/// One operation as the trace recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRecord {
    /// Global index, from 0, in the order operations started.
    pub index: u64,
    /// What it was.
    pub kind: OpKind,
    /// The path it was about (for `rename`, the source).
    pub path: PathBuf,
    /// For `Write`: where the bytes went.
    pub offset: u64,
    /// For `Write`: the buffer's length; for `SetLen`: the new length.
    pub bytes: u64,
    /// For `Open`: the mode.
    pub mode: Option<OpenMode>,
    /// Whether it failed (fault or crash).
    pub failed: bool,
}

/// An in-memory file system with injectable faults and crash images.
/// Cloning shares the disk, so a test can keep a handle to arm faults while
/// a store runs on a clone.
#[derive(Clone, Default)]
pub struct FaultyStorage {
    shared: Arc<Shared>,
}

impl fmt::Debug for FaultyStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let disk = self.shared.disk.lock();
        f.debug_struct("FaultyStorage")
            .field("files", &disk.current.len())
            .field("ops", &disk.ops.len())
            .field("crash", &disk.crash)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
enum Unsynced {
    Write { at: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// How far `map` shows the file: to the end of the furthest write.
    /// Space that only `set_len` added is left out, because a real map
    /// shows what is written there later and a copy made now would not.
    mapped: usize,
    /// Writes and truncations since the last `sync_data`, oldest first.
    unsynced: Vec<Unsynced>,
    /// Failed syncs of the file so far: each handle reports the ones it
    /// has not reported yet at its next sync.
    failed_syncs: u64,
}

#[derive(Debug, Clone, Copy)]
struct Crash {
    at: u64,
    torn_bytes: Option<usize>,
}

#[derive(Debug)]
struct Armed {
    fault: Fault,
    skip_left: u64,
}

#[derive(Debug, Default)]
struct Disk {
    /// File contents by inode number; never shrinks, so open handles of
    /// removed files keep working.
    inodes: Vec<Inode>,
    current: BTreeMap<PathBuf, usize>,
    durable: BTreeMap<PathBuf, usize>,
    dirs: BTreeSet<PathBuf>,
    locks: BTreeSet<PathBuf>,
    /// Every operation so far; its length is the global operation counter.
    ops: Vec<OpRecord>,
    faults: Vec<Armed>,
    crash: Option<Crash>,
    /// The armed pause, not yet reached.
    pause: Option<Pause>,
    /// Operations held until resumed, oldest first.
    held: Vec<u64>,
}

/// A test's hold on an operation, to interleave threads deterministically.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Hold the next operation of this kind.
    Next(OpKind),
    /// Hold the next data sync once it has taken effect or failed, before
    /// it returns.
    NextSyncDone,
    /// Data sync `index` is to be held when it is done.
    SyncDone(u64),
}

/// The disk, and the condition variable that paused operations wait on.
#[derive(Debug, Default)]
struct Shared {
    disk: Mutex<Disk>,
    pause: Condvar,
    /// See [`FaultyStorage::allow_background_io`].
    allows_background_io: std::sync::atomic::AtomicBool,
}

/// What the gate decided for one operation.
enum Gate {
    Go,
    Fail {
        error: io::Error,
        written_bytes: Option<usize>,
        /// The process died: nothing else happens, not even the side
        /// effects of an fsync error.
        is_crash: bool,
    },
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).expect("in-memory file sizes fit in usize")
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("no such file: {}", path.display()),
    )
}

/// Writes `bytes` at `at` into `buf`, zero-filling any gap before it.
fn write_at(buf: &mut Vec<u8>, at: u64, bytes: &[u8]) {
    let at = to_usize(at);
    let end = at + bytes.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf.get_mut(at..end)
        .expect("the buffer was just extended to cover the write")
        .copy_from_slice(bytes);
}

/// `base` with the first `budget` bytes of `writes` applied in order.
fn replay(base: &[u8], writes: &[Unsynced], budget: u64) -> Vec<u8> {
    let mut out = base.to_vec();
    let mut left = budget;
    for w in writes {
        match w {
            Unsynced::Write { at, bytes } => {
                let n = (bytes.len() as u64).min(left);
                write_at(
                    &mut out,
                    *at,
                    bytes.get(..to_usize(n)).expect("n is at most the length"),
                );
                left -= n;
                if n < bytes.len() as u64 {
                    break;
                }
            }
            Unsynced::SetLen(len) => out.resize(to_usize(*len), 0),
        }
    }
    out
}

impl Inode {
    fn image(&self, policy: CrashPolicy) -> Vec<u8> {
        match policy {
            CrashPolicy::PowerLoss => self.durable.clone(),
            CrashPolicy::ProcessCrash => self.current.clone(),
            CrashPolicy::Torn { bytes } => replay(&self.durable, &self.unsynced, bytes),
            CrashPolicy::Reordered { writes } => {
                let all: Vec<&Unsynced> = self
                    .unsynced
                    .iter()
                    .filter(|w| matches!(w, Unsynced::Write { .. }))
                    .collect();
                let mut out = self.durable.clone();
                for w in all.iter().skip(all.len().saturating_sub(writes)) {
                    if let Unsynced::Write { at, bytes } = w {
                        write_at(&mut out, *at, bytes);
                    }
                }
                out
            }
        }
    }
}

impl Disk {
    fn has_parent_dir(&self, path: &Path) -> bool {
        path.parent().is_some_and(|p| self.dirs.contains(p))
    }

    fn new_inode(&mut self) -> usize {
        self.inodes.push(Inode::default());
        self.inodes.len() - 1
    }

    fn inode(&self, ino: usize) -> &Inode {
        self.inodes
            .get(ino)
            .expect("inode numbers come from new_inode")
    }

    fn inode_mut(&mut self, ino: usize) -> &mut Inode {
        self.inodes
            .get_mut(ino)
            .expect("inode numbers come from new_inode")
    }

    fn ino_of(&self, path: &Path) -> io::Result<usize> {
        self.current
            .get(path)
            .copied()
            .ok_or_else(|| not_found(path))
    }
}

/// Holds operation `index` until the test resumes it; the pause that
/// caught it is spent, so that another may be armed meanwhile.
fn hold(shared: &Shared, disk: &mut MutexGuard<'_, Disk>, index: u64) {
    disk.pause = None;
    disk.held.push(index);
    shared.pause.notify_all();
    while disk.held.contains(&index) {
        shared.pause.wait(disk);
    }
}

/// Counts and traces an operation, holds it while a test has it paused,
/// and decides whether it fails.
fn gate(
    shared: &Shared,
    disk: &mut MutexGuard<'_, Disk>,
    kind: OpKind,
    path: &Path,
    offset: u64,
    bytes: u64,
    mode: Option<OpenMode>,
) -> Gate {
    let index = disk.ops.len() as u64;
    disk.ops.push(OpRecord {
        index,
        kind,
        path: path.to_owned(),
        offset,
        bytes,
        mode,
        failed: false,
    });
    if disk.pause == Some(Pause::Next(kind)) {
        hold(shared, disk, index);
    }
    if disk.pause == Some(Pause::NextSyncDone) && kind == OpKind::SyncData {
        disk.pause = Some(Pause::SyncDone(index));
    }

    let mut gate = Gate::Go;
    if let Some(crash) = disk.crash
        && index >= crash.at
    {
        gate = Gate::Fail {
            error: io::Error::from_raw_os_error(5),
            written_bytes: if index == crash.at {
                crash.torn_bytes
            } else {
                None
            },
            is_crash: true,
        };
    } else {
        let mut fired = None;
        for (i, armed) in disk.faults.iter_mut().enumerate() {
            if armed.fault.kind != kind {
                continue;
            }
            if armed.skip_left > 0 {
                armed.skip_left -= 1;
                continue;
            }
            if fired.is_none() {
                fired = Some(i);
            }
        }
        if let Some(i) = fired {
            let fault = disk.faults.get(i).expect("index from the loop").fault;
            if fault.repeat == Repeat::Once {
                disk.faults.remove(i);
            }
            gate = Gate::Fail {
                error: fault.error.to_io_error(),
                written_bytes: Some(fault.written_bytes),
                is_crash: false,
            };
        }
    }
    if let Gate::Fail { .. } = gate {
        disk.ops
            .get_mut(to_usize(index))
            .expect("the record pushed above")
            .failed = true;
    }
    gate
}

/// [`gate`] for operations that write nothing before failing.
fn check(
    shared: &Shared,
    disk: &mut MutexGuard<'_, Disk>,
    kind: OpKind,
    path: &Path,
) -> io::Result<()> {
    match gate(shared, disk, kind, path, 0, 0, None) {
        Gate::Go => Ok(()),
        Gate::Fail { error, .. } => Err(error),
    }
}

impl FaultyStorage {
    /// An empty disk with no faults armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms a fault. Several may be armed; the first armed that matches fires.
    pub fn inject(&self, fault: Fault) {
        self.shared.disk.lock().faults.push(Armed {
            fault,
            skip_left: fault.skip,
        });
    }

    /// Disarms every fault (not a crash: a crashed process stays dead).
    pub fn heal(&self) {
        self.shared.disk.lock().faults.clear();
    }

    /// The process dies at global operation `index`: it and every later
    /// operation fail with EIO.
    pub fn crash_at(&self, index: u64) {
        self.shared.disk.lock().crash = Some(Crash {
            at: index,
            torn_bytes: None,
        });
    }

    /// Like [`crash_at`](Self::crash_at), but if operation `index` is an
    /// write, its first `torn_bytes` bytes are written before it fails.
    pub fn crash_at_torn(&self, index: u64, torn_bytes: usize) {
        self.shared.disk.lock().crash = Some(Crash {
            at: index,
            torn_bytes: Some(torn_bytes),
        });
    }

    /// Whether an armed crash has happened.
    pub fn has_crashed(&self) -> bool {
        let disk = self.shared.disk.lock();
        disk.crash.is_some_and(|c| disk.ops.len() as u64 > c.at)
    }

    /// Holds the next operation of `kind` when it starts (before it takes
    /// effect or fails), until [`resume`](Self::resume): other threads go on
    /// meanwhile. For interleaving threads deterministically.
    pub fn pause_next(&self, kind: OpKind) {
        self.shared.disk.lock().pause = Some(Pause::Next(kind));
    }

    /// Holds the next data sync once it is done (its pages on the disk, or
    /// dropped if it fails), before it returns to its caller, until
    /// [`resume`](Self::resume). A failed sync held this way is the instant
    /// in which the kernel has dropped the pages but the caller does not
    /// know yet.
    pub fn pause_after_next_sync(&self) {
        self.shared.disk.lock().pause = Some(Pause::NextSyncDone);
    }

    /// Waits until the pause armed last by [`pause_next`](Self::pause_next)
    /// or [`pause_after_next_sync`](Self::pause_after_next_sync) holds an
    /// operation; returns its index, or `None` if none was within
    /// `timeout`. Another pause may be armed while one holds an operation.
    pub fn wait_until_paused(&self, timeout: std::time::Duration) -> Option<u64> {
        let deadline = std::time::Instant::now() + timeout;
        let mut disk = self.shared.disk.lock();
        loop {
            if disk.pause.is_none()
                && let Some(&index) = disk.held.last()
            {
                return Some(index);
            }
            if self
                .shared
                .pause
                .wait_until(&mut disk, deadline)
                .timed_out()
            {
                return None;
            }
        }
    }

    /// Lets stores on this disk do I/O on threads of their own (filling
    /// log segments with zeros, installing snapshots), which by default
    /// they do on the caller's thread. For tests of that background work;
    /// their operations no longer come in the same order in every run.
    pub fn allow_background_io(&self) {
        self.shared
            .allows_background_io
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Lets every held operation go on (and disarms a pause not yet reached).
    pub fn resume(&self) {
        let mut disk = self.shared.disk.lock();
        disk.pause = None;
        disk.held.clear();
        self.shared.pause.notify_all();
    }

    /// Lets held operation `index` go on, and no other.
    pub fn resume_op(&self, index: u64) {
        self.shared.disk.lock().held.retain(|&i| i != index);
        self.shared.pause.notify_all();
    }

    /// Operations started so far (the next one gets this index).
    pub fn op_count(&self) -> u64 {
        self.shared.disk.lock().ops.len() as u64
    }

    /// Operations of `kind` started so far (without copying the log of
    /// every operation, as `ops` does).
    pub fn op_count_of(&self, kind: OpKind) -> usize {
        self.shared
            .disk
            .lock()
            .ops
            .iter()
            .filter(|o| o.kind == kind)
            .count()
    }

    /// Every operation so far, in order.
    pub fn ops(&self) -> Vec<OpRecord> {
        self.shared.disk.lock().ops.clone()
    }

    /// A new disk holding what `policy` says a crash leaves of this one:
    /// everything on it is durable, no fault is armed and no lock held.
    pub fn crash_image(&self, policy: CrashPolicy) -> FaultyStorage {
        let disk = self.shared.disk.lock();
        let namespace = match policy {
            CrashPolicy::PowerLoss => &disk.durable,
            _ => &disk.current,
        };
        let mut image = Disk {
            dirs: disk.dirs.clone(),
            ..Disk::default()
        };
        let mut renumbered: BTreeMap<usize, usize> = BTreeMap::new();
        for (path, &ino) in namespace {
            let new_ino = match renumbered.get(&ino) {
                Some(&n) => n,
                None => {
                    let old = disk.inode(ino);
                    let bytes = old.image(policy);
                    // After a process crash the page cache still holds what a
                    // failed sync dropped: it reads back, but only the writes
                    // pending write-back reach the disk, and a later sync
                    // writes no page that is not written again.
                    let durable = match policy {
                        CrashPolicy::ProcessCrash => replay(&old.durable, &old.unsynced, u64::MAX),
                        _ => bytes.clone(),
                    };
                    let n = image.new_inode();
                    let inode = image.inode_mut(n);
                    inode.durable = durable;
                    inode.mapped = bytes.len();
                    inode.current = bytes;
                    renumbered.insert(ino, n);
                    n
                }
            };
            image.current.insert(path.clone(), new_ino);
            image.durable.insert(path.clone(), new_ino);
        }
        FaultyStorage {
            shared: Arc::new(Shared {
                disk: Mutex::new(image),
                ..Shared::default()
            }),
        }
    }

    /// Bit rot: XORs the byte at `offset` of the file's durable bytes (and of
    /// its current bytes, as if the cache were dropped) with `xor_mask`.
    ///
    /// # Errors
    /// `NotFound` for a missing file, `InvalidInput` for an offset past its
    /// durable bytes.
    pub fn corrupt(&self, path: impl AsRef<Path>, offset: u64, xor_mask: u8) -> io::Result<()> {
        let path = path.as_ref();
        let mut disk = self.shared.disk.lock();
        let ino = disk.ino_of(path)?;
        let inode = disk.inode_mut(ino);
        let at = to_usize(offset);
        let byte = inode.durable.get_mut(at).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "offset {offset} is past the durable bytes of {}",
                    path.display()
                ),
            )
        })?;
        *byte ^= xor_mask;
        if let Some(byte) = inode.current.get_mut(at) {
            *byte ^= xor_mask;
        }
        Ok(())
    }

    /// Every file in the current namespace, in path order.
    pub fn files(&self) -> Vec<PathBuf> {
        self.shared.disk.lock().current.keys().cloned().collect()
    }

    /// A file's current length, if it exists.
    pub fn file_len(&self, path: impl AsRef<Path>) -> Option<u64> {
        let disk = self.shared.disk.lock();
        let ino = disk.ino_of(path.as_ref()).ok()?;
        Some(disk.inode(ino).current.len() as u64)
    }

    /// A file's current bytes, if it exists.
    pub fn read_file(&self, path: impl AsRef<Path>) -> Option<Vec<u8>> {
        let disk = self.shared.disk.lock();
        let ino = disk.ino_of(path.as_ref()).ok()?;
        Some(disk.inode(ino).current.clone())
    }

    /// A file's durable bytes, if its durable entry exists.
    pub fn read_durable_file(&self, path: impl AsRef<Path>) -> Option<Vec<u8>> {
        let disk = self.shared.disk.lock();
        let ino = disk.durable.get(path.as_ref()).copied()?;
        Some(disk.inode(ino).durable.clone())
    }
}

impl Storage for FaultyStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::CreateDir, dir)?;
        for a in dir.ancestors() {
            disk.dirs.insert(a.to_owned());
        }
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::List, dir)?;
        if !disk.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(disk
            .current
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name())
            .map(|n| n.to_string_lossy().into_owned())
            .collect())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        let mut disk = self.shared.disk.lock();
        if let Gate::Fail { error, .. } = gate(
            &self.shared,
            &mut disk,
            OpKind::Open,
            path,
            0,
            0,
            Some(mode),
        ) {
            return Err(error);
        }
        let ino = match mode {
            OpenMode::CreateNew => {
                if !disk.has_parent_dir(path) {
                    return Err(not_found(path));
                }
                if disk.current.contains_key(path) {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("file exists: {}", path.display()),
                    ));
                }
                let ino = disk.new_inode();
                disk.current.insert(path.to_owned(), ino);
                ino
            }
            OpenMode::Append | OpenMode::Read => disk.ino_of(path)?,
        };
        let failed_syncs = disk.inode(ino).failed_syncs;
        Ok(Arc::new(FaultyFile {
            shared: Arc::clone(&self.shared),
            ino,
            path: path.to_owned(),
            is_writable: mode != OpenMode::Read,
            reported_failed_syncs: failed_syncs.into(),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Rename, from)?;
        let ino = disk.ino_of(from)?;
        if !disk.has_parent_dir(to) {
            return Err(not_found(to));
        }
        disk.current.remove(from);
        disk.current.insert(to.to_owned(), ino);
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Remove, path)?;
        disk.ino_of(path)?;
        disk.current.remove(path);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::SyncDir, dir)?;
        if !disk.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        let in_dir = |p: &PathBuf| p.parent() == Some(dir);
        disk.durable.retain(|p, _| !in_dir(p));
        let entries: Vec<(PathBuf, usize)> = disk
            .current
            .iter()
            .filter(|(p, _)| in_dir(p))
            .map(|(p, &ino)| (p.clone(), ino))
            .collect();
        disk.durable.extend(entries);
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Lock, path)?;
        if disk.locks.contains(path) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        if !disk.current.contains_key(path) {
            if !disk.has_parent_dir(path) {
                return Err(not_found(path));
            }
            let ino = disk.new_inode();
            disk.current.insert(path.to_owned(), ino);
        }
        disk.locks.insert(path.to_owned());
        Ok(Box::new(LockGuard {
            shared: Arc::clone(&self.shared),
            path: path.to_owned(),
        }))
    }

    /// No unless [`allow_background_io`](FaultyStorage::allow_background_io)
    /// was called: every operation comes from the threads the test drives,
    /// so that a run's operations, counted once, can be cut at each index.
    fn allows_background_io(&self) -> bool {
        self.shared
            .allows_background_io
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Releases a lock of the lock table when dropped.
struct LockGuard {
    shared: Arc<Shared>,
    path: PathBuf,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.shared.disk.lock().locks.remove(&self.path);
    }
}

/// An open file of a [`FaultyStorage`]: it follows its inode, so it keeps
/// working after a rename or removal, as on POSIX.
struct FaultyFile {
    shared: Arc<Shared>,
    ino: usize,
    path: PathBuf,
    is_writable: bool,
    /// The inode's `failed_syncs` as this handle last reported them.
    reported_failed_syncs: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for FaultyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyFile")
            .field("path", &self.path)
            .field("ino", &self.ino)
            .finish_non_exhaustive()
    }
}

impl FaultyFile {
    /// Writes `buf` at `at` (the end of the file if `None`), through the
    /// gate, as an operation of `kind`: `Write`, or `FillZeros`, which a
    /// later `map` does not show (as it does not show space `set_len`
    /// added: a real map shows what is written there later).
    fn write(&self, at: Option<u64>, buf: &[u8], kind: OpKind) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        let at = at.unwrap_or(disk.inode(self.ino).current.len() as u64);
        let gate = gate(
            &self.shared,
            &mut disk,
            kind,
            &self.path,
            at,
            buf.len() as u64,
            None,
        );
        let (written, result) = match gate {
            Gate::Go => (buf, Ok(())),
            Gate::Fail {
                error,
                written_bytes,
                ..
            } => {
                let n = written_bytes.unwrap_or(0).min(buf.len());
                (buf.get(..n).expect("n is at most the length"), Err(error))
            }
        };
        self.check_writable()?;
        if !written.is_empty() {
            let inode = disk.inode_mut(self.ino);
            write_at(&mut inode.current, at, written);
            if kind == OpKind::Write {
                inode.mapped = inode.mapped.max(to_usize(at) + written.len());
            }
            inode.unsynced.push(Unsynced::Write {
                at,
                bytes: written.to_vec(),
            });
        }
        result
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.is_writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("file opened read-only: {}", self.path.display()),
            ))
        }
    }
}

impl StorageFile for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Len, &self.path)?;
        Ok(disk.inode(self.ino).current.len() as u64)
    }

    fn append(&self, buf: &[u8]) -> io::Result<()> {
        self.write(None, buf, OpKind::Write)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.write(Some(offset), buf, OpKind::Write)
    }

    /// One `FillZeros` operation; a fill past the file's length is the
    /// caller's bug, refused.
    fn fill_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let file_len = {
            let disk = self.shared.disk.lock();
            disk.inode(self.ino).current.len() as u64
        };
        if offset.saturating_add(len) > file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("zeros past the end of {}", self.path.display()),
            ));
        }
        self.write(Some(offset), &vec![0; to_usize(len)], OpKind::FillZeros)
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        // The index `gate` gives this operation (others may come while it is held).
        let index = disk.ops.len() as u64;
        let gate = gate(
            &self.shared,
            &mut disk,
            OpKind::SyncData,
            &self.path,
            0,
            0,
            None,
        );
        let inode = disk.inode_mut(self.ino);
        let reported = self
            .reported_failed_syncs
            .swap(inode.failed_syncs, std::sync::atomic::Ordering::SeqCst);
        let result = match gate {
            Gate::Go => {
                inode.durable = replay(&inode.durable, &inode.unsynced, u64::MAX);
                inode.unsynced.clear();
                if reported < inode.failed_syncs {
                    // Another handle's sync failed since this one's last:
                    // its pages may be lost, and this handle hears of it.
                    Err(io::Error::from_raw_os_error(5))
                } else {
                    Ok(())
                }
            }
            Gate::Fail {
                error,
                is_crash,
                written_bytes,
            } => {
                if !is_crash {
                    // An fsync error drops the dirty pages' write-back: what
                    // was unsynced stays readable but never reaches the
                    // disk, but for what the disk wrote before the error.
                    let written = written_bytes.unwrap_or(0) as u64;
                    inode.durable = replay(&inode.durable, &inode.unsynced, written);
                    inode.unsynced.clear();
                    inode.failed_syncs += 1;
                    self.reported_failed_syncs
                        .store(inode.failed_syncs, std::sync::atomic::Ordering::SeqCst);
                }
                Err(error)
            }
        };
        if disk.pause == Some(Pause::SyncDone(index)) {
            hold(&self.shared, &mut disk, index);
        }
        result
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        match gate(
            &self.shared,
            &mut disk,
            OpKind::SetLen,
            &self.path,
            0,
            len,
            None,
        ) {
            Gate::Go => {}
            Gate::Fail { error, .. } => return Err(error),
        }
        self.check_writable()?;
        let inode = disk.inode_mut(self.ino);
        inode.current.resize(to_usize(len), 0);
        inode.mapped = inode.mapped.min(to_usize(len));
        inode.unsynced.push(Unsynced::SetLen(len));
        Ok(())
    }

    fn map(&self, _reserve: u64) -> io::Result<Bytes> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Map, &self.path)?;
        let inode = disk.inode(self.ino);
        Ok(Bytes::copy_from_slice(
            inode.current.get(..inode.mapped).unwrap_or(&inode.current),
        ))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut disk = self.shared.disk.lock();
        check(&self.shared, &mut disk, OpKind::Read, &self.path)?;
        let bytes = usize::try_from(offset)
            .ok()
            .and_then(|start| {
                let current = &disk.inode(self.ino).current;
                current.get(start..start.checked_add(buf.len())?)
            })
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/db")
    }

    fn setup() -> (FaultyStorage, Arc<dyn StorageFile>) {
        let s = FaultyStorage::new();
        s.create_dir_all(&dir()).unwrap();
        let f = s.open(&dir().join("a"), OpenMode::CreateNew).unwrap();
        (s, f)
    }

    #[test]
    fn power_loss_keeps_only_synced_bytes_and_entries() {
        let (s, f) = setup();
        f.append(b"hello").unwrap();
        f.sync_data().unwrap();
        f.append(b" world").unwrap();
        // The entry is not durable yet.
        assert!(s.crash_image(CrashPolicy::PowerLoss).files().is_empty());
        s.sync_dir(&dir()).unwrap();
        let image = s.crash_image(CrashPolicy::PowerLoss);
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"hello");
        let image = s.crash_image(CrashPolicy::ProcessCrash);
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"hello world");
        let image = s.crash_image(CrashPolicy::Torn { bytes: 3 });
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"hello wo");
    }

    #[test]
    fn reordered_image_leaves_holes_for_lost_earlier_writes() {
        let (s, f) = setup();
        f.append(b"ab").unwrap();
        f.append(b"cd").unwrap();
        f.append(b"ef").unwrap();
        let image = s.crash_image(CrashPolicy::Reordered { writes: 1 });
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"\0\0\0\0ef");
        let image = s.crash_image(CrashPolicy::Reordered { writes: 0 });
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"");
    }

    #[test]
    fn faults_fire_on_the_nth_operation_of_their_kind() {
        let (s, f) = setup();
        s.inject(
            Fault::new(OpKind::Write, FaultError::NoSpace)
                .skip(1)
                .written_bytes(2),
        );
        f.append(b"one").unwrap();
        let e = f.append(b"two").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(28));
        f.append(b"three").unwrap();
        assert_eq!(s.read_file(dir().join("a")).unwrap(), b"onetwthree");
        s.inject(Fault::new(OpKind::SyncData, FaultError::Io).always());
        assert_eq!(f.sync_data().unwrap_err().raw_os_error(), Some(5));
        assert!(f.sync_data().is_err());
        s.heal();
        f.sync_data().unwrap();
    }

    #[test]
    fn failed_sync_forgets_unsynced_writes() {
        let (s, f) = setup();
        s.sync_dir(&dir()).unwrap();
        f.append(b"lost").unwrap();
        s.inject(Fault::new(OpKind::SyncData, FaultError::Io));
        f.sync_data().unwrap_err();
        f.append(b"kept").unwrap();
        f.sync_data().unwrap();
        assert_eq!(s.read_file(dir().join("a")).unwrap(), b"lostkept");
        let image = s.crash_image(CrashPolicy::PowerLoss);
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"\0\0\0\0kept");
    }

    #[test]
    fn a_failed_sync_may_have_written_a_prefix_of_its_writes() {
        let (s, f) = setup();
        s.sync_dir(&dir()).unwrap();
        f.append(b"half").unwrap();
        f.append(b"lost").unwrap();
        s.inject(Fault::new(OpKind::SyncData, FaultError::Io).written_bytes(6));
        f.sync_data().unwrap_err();
        assert_eq!(s.read_file(dir().join("a")).unwrap(), b"halflost");
        let image = s.crash_image(CrashPolicy::PowerLoss);
        assert_eq!(image.read_file(dir().join("a")).unwrap(), b"halflo");
    }

    #[test]
    fn crash_fails_everything_from_its_operation_on() {
        let (s, f) = setup();
        let n = s.op_count();
        s.crash_at_torn(n + 1, 2);
        f.append(b"xy").unwrap();
        assert!(f.append(b"abc").is_err());
        assert!(s.has_crashed());
        assert!(f.sync_data().is_err());
        assert!(s.list_dir(&dir()).is_err());
        assert_eq!(s.read_file(dir().join("a")).unwrap(), b"xyab");
        let ops = s.ops();
        let last = ops.last().unwrap();
        assert_eq!((last.kind, last.failed), (OpKind::List, true));
    }

    #[test]
    fn renames_and_removals_become_durable_at_sync_dir() {
        let (s, f) = setup();
        f.append(b"x").unwrap();
        f.sync_data().unwrap();
        s.sync_dir(&dir()).unwrap();
        s.rename(&dir().join("a"), &dir().join("b")).unwrap();
        let image = s.crash_image(CrashPolicy::PowerLoss);
        assert_eq!(image.files(), vec![dir().join("a")]);
        s.sync_dir(&dir()).unwrap();
        let image = s.crash_image(CrashPolicy::PowerLoss);
        assert_eq!(image.files(), vec![dir().join("b")]);
        s.remove_file(&dir().join("b")).unwrap();
        assert_eq!(f.map(0).unwrap(), Bytes::from_static(b"x"));
        s.sync_dir(&dir()).unwrap();
        assert!(s.crash_image(CrashPolicy::PowerLoss).files().is_empty());
    }

    #[test]
    fn a_paused_operation_waits_while_others_go_on() {
        let (s, f) = setup();
        s.pause_next(OpKind::SyncData);
        let syncer = {
            let f = Arc::clone(&f);
            std::thread::spawn(move || f.sync_data())
        };
        let held = s
            .wait_until_paused(std::time::Duration::from_secs(10))
            .unwrap();
        f.append(b"meanwhile").unwrap();
        s.crash_at(held);
        s.resume();
        assert!(syncer.join().unwrap().is_err());
        let ops = s.ops();
        assert_eq!(ops[held as usize].kind, OpKind::SyncData);
        assert!(ops[held as usize].failed);
        assert_eq!(ops[held as usize + 1].kind, OpKind::Write);
        assert!(!ops[held as usize + 1].failed);
    }

    #[test]
    fn lock_is_exclusive_until_dropped() {
        let (s, _f) = setup();
        let guard = s.lock(&dir().join("LOCK")).unwrap();
        let e = s.lock(&dir().join("LOCK")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        drop(guard);
        s.lock(&dir().join("LOCK")).unwrap();
    }

    #[test]
    fn corrupt_flips_durable_bits() {
        let (s, f) = setup();
        f.append(b"abc").unwrap();
        f.sync_data().unwrap();
        s.corrupt(dir().join("a"), 1, 0x01).unwrap();
        assert_eq!(s.read_file(dir().join("a")).unwrap(), b"acc");
        assert!(s.corrupt(dir().join("a"), 3, 0x01).is_err());
    }
}
