//! `Store`: the public handle. It owns the directory lock, the commit order
//! and the locking between writers and readers; every other layer is reached
//! through it.
//!
//! Locks, always taken in this order: `maintenance` (compaction, snapshots,
//! verify), `writer` (serialises `apply_batch`; holds the log writer and the
//! pending batches), then `index` (read while planning, written only to
//! publish records). Commit syncs run under none of them (see
//! `group_commit`), so readers never wait for the disk; a segment rotation
//! syncs under the writer lock.
//!
//! Visibility: under `Durability::Sync` a batch is published to the index,
//! and so to readers, only after a sync covers it (see `pending`); under
//! `Durability::Buffered` as soon as it is written.

mod group_commit;
mod installer;
mod maintenance;
mod pending;
mod publisher;
mod types;
mod write;

pub use types::{IndexBytes, LogEntry, Record, RepairReport, Stats, VerifyReport};

use std::any::Any;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};

use crate::apply::StateView;
use crate::batch::{BatchReport, QuarantineEntry};
use crate::digest::{Digest, DigestBuilder};
use crate::error::{Error, Result};
use crate::format::segment::{FileKind, SEGMENT_HEADER_LEN};
use crate::index::Index;
use crate::index::expiry::Ttls;
use crate::index::keys::{KeyEntry, KeyHash};
use crate::log::names::{
    LOCK_FILE, PARENTS_UNSYNCED_FILE, parse_segment_file_name, segment_file_name,
};
use crate::log::segments::{SegmentMaps, ValueRef};
use crate::log::writer::{LogWriter, create_segment, new_segment_len};
use crate::options::Options;
use crate::recovery;
use crate::storage::{OpenMode, Storage};
use group_commit::GroupCommit;

/// An open store. `Send + Sync`: share it between threads by reference or in an `Arc`.
pub struct Store {
    dir: PathBuf,
    options: Options,
    /// In an `Arc` so that its write lock can be handed to the publisher.
    index: Arc<RwLock<Index>>,
    publisher: publisher::Publisher,
    maps: SegmentMaps,
    writer: Mutex<Writer>,
    commit: Arc<GroupCommit>,
    /// Serialises compaction, snapshots and verify.
    maintenance: Mutex<()>,
    /// Syncs and renames automatic snapshots into place (under `maintenance`).
    installer: installer::Installer,
    /// Set by `close`, so that drop does not write a second snapshot.
    closed: AtomicBool,
    opened: OpenReport,
    /// Held for the store's lifetime; dropping it releases the directory.
    _lock: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// What the writer lock guards: the log's append side and the batches
/// written but not yet published.
#[derive(Debug)]
struct Writer {
    log: LogWriter,
    pending: pending::Pending,
    /// Bytes of log that the next open would replay, as of `unsaved_since`
    /// (the lsn of the last snapshot or compaction cut, or open).
    unsaved_bytes: u64,
    unsaved_since: u64,
    /// Size of the last snapshot written or loaded (0 if none): automatic
    /// snapshots wait for at least this much new log.
    last_snapshot_bytes: u64,
    /// Where the log ended when the last snapshot failed, if one failed
    /// since the last that succeeded: the next waits for as much new log.
    failed_snapshot_at: Option<u64>,
}

impl Writer {
    /// Bytes of log that a snapshot now would spare the next open.
    fn unsaved_log_bytes(&self) -> u64 {
        self.unsaved_bytes + (self.log.position().2 - self.unsaved_since)
    }

    /// A snapshot or base segment now covers everything up to `lsn`.
    fn saved_at(&mut self, lsn: u64) {
        self.unsaved_bytes = 0;
        self.unsaved_since = lsn;
    }

    /// A snapshot failed to be written or installed, with the log ending here.
    fn snapshot_failed(&mut self) {
        self.failed_snapshot_at = Some(self.log.position().2);
    }

    /// Bytes of log written since a snapshot last failed (all, if none did).
    fn log_bytes_since_failed_snapshot(&self) -> u64 {
        self.failed_snapshot_at
            .map_or(u64::MAX, |at| self.log.position().2 - at)
    }
}

/// What `open` did, for `stats`.
#[derive(Debug)]
struct OpenReport {
    torn_bytes_discarded: u64,
    records_replayed: u64,
    snapshot: recovery::SnapshotUse,
}

/// How long `open` keeps trying a held lock before it answers `Locked`.
///
/// The lock is an `flock`, held by an open file description. A process that
/// forks (to start any child) shares its descriptions with the child until
/// the child execs, so a store closed just then stays locked for that
/// instant. A short wait hides that window; a real second writer is refused
/// after it.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(250);

/// Creates the store directory `dir` if it is missing (durably), then locks it.
fn create_and_lock_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn Any + Send + Sync>> {
    // A directory made here is durable once its parent is synced (POSIX
    // promises no more; a journaling file system happens to do it), or the
    // log written into it could vanish with it in a power loss.
    let mut created = 0usize;
    for d in dir.ancestors().take_while(|d| !d.as_os_str().is_empty()) {
        match storage.list_dir(d) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => created += 1,
            Err(e) => return Err(Error::io("list", d, e)),
        }
    }
    storage
        .create_dir_all(dir)
        .map_err(|e| Error::io("create directory", dir, e))?;
    if created > 0 {
        // Before the syncs: an open after one failed finds the directory
        // and creates nothing, so only this note tells it to sync again.
        // It needs to outlive only the page cache, as `SYNC_FAILED` does.
        let note = dir.join(PARENTS_UNSYNCED_FILE);
        match storage.open(&note, OpenMode::CreateNew) {
            Ok(file) => file
                .append(created.to_string().as_bytes())
                .map_err(|e| Error::io("write", &note, e))?,
            // Another process creating the same store wrote it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(Error::io("create", &note, e)),
        }
    }
    let lock = lock_dir(storage, dir)?;
    sync_created_parents(storage, dir)?;
    Ok(lock)
}

/// Syncs the parents of the directories an open created, as its note in
/// `dir` says (all of `dir`'s ancestors if it cannot be read as a count),
/// then removes the note (unsynced: a later open finding it again only
/// syncs again). Without a note, a directory that holds no segment yet
/// may be one whose creator died before writing the note: all of its
/// ancestors are synced, as a new store's open does once. Caller holds
/// the lock.
fn sync_created_parents(storage: &dyn Storage, dir: &Path) -> Result<()> {
    let note = dir.join(PARENTS_UNSYNCED_FILE);
    let levels = match storage.open(&note, OpenMode::Read) {
        Ok(file) => {
            let mut text = [0u8; 20];
            let len = file.len().map_err(|e| Error::io("read", &note, e))?;
            let text = text.get_mut(..len as usize).unwrap_or_default();
            file.read_at(0, text)
                .map_err(|e| Error::io("read", &note, e))?;
            std::str::from_utf8(text)
                .ok()
                .and_then(|t| t.parse().ok())
                .unwrap_or(usize::MAX)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let names = storage
                .list_dir(dir)
                .map_err(|e| Error::io("list", dir, e))?;
            if names.iter().any(|n| parse_segment_file_name(n).is_some()) {
                return Ok(());
            }
            // How many levels that creator made is unknown, so all are
            // synced, up to one this process may not open: a new store
            // under a directory it cannot read must still open.
            return match sync_parents(storage, dir, usize::MAX) {
                Err(Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::PermissionDenied =>
                {
                    Ok(())
                }
                synced => synced,
            };
        }
        Err(e) => return Err(Error::io("open", &note, e)),
    };
    sync_parents(storage, dir, levels)?;
    storage
        .remove_file(&note)
        .map_err(|e| Error::io("remove", &note, e))
}

/// Syncs the parent directory of `dir` and of its ancestors, `levels` of them in all.
fn sync_parents(storage: &dyn Storage, dir: &Path, levels: usize) -> Result<()> {
    let created = dir.ancestors().take_while(|d| !d.as_os_str().is_empty());
    for d in created.take(levels) {
        let parent = match d.parent() {
            Some(p) if p.as_os_str().is_empty() => Path::new("."),
            Some(p) => p,
            None => continue,
        };
        storage
            .sync_dir(parent)
            .map_err(|e| Error::io("sync directory", parent, e))?;
    }
    Ok(())
}

/// Locks the existing store directory `dir`: verify and repair of a path
/// that names no directory fail, where creating one would answer for a
/// typo with an empty store that checks out.
fn lock_existing_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn Any + Send + Sync>> {
    storage
        .list_dir(dir)
        .map_err(|e| Error::io("open store directory", dir, e))?;
    lock_dir(storage, dir)
}

/// Takes the lock of the directory `dir`, which exists.
fn lock_dir(storage: &dyn Storage, dir: &Path) -> Result<Box<dyn Any + Send + Sync>> {
    let path = dir.join(LOCK_FILE);
    let started = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(1);
    loop {
        match storage.lock(&path) {
            Ok(guard) => return Ok(guard),
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock && started.elapsed() < LOCK_PATIENCE =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(50));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(Error::Locked {
                    dir: dir.to_owned(),
                });
            }
            Err(e) => return Err(Error::io("lock", &path, e)),
        }
    }
}

/// Margin mapped past a segment's size limit, so that a record that starts
/// near the limit is usually readable without a remap.
const MAP_SLACK_BYTES: u64 = 16 << 20;

/// `dir` made absolute against the current directory of the moment: every
/// file the store later creates, renames or removes is joined onto it, and
/// a relative path would follow a later change of the process's current
/// directory into another directory, or another store whose lock this one
/// does not hold. An empty path is refused, not taken for `.`.
fn absolute_dir(dir: &Path) -> Result<PathBuf> {
    std::path::absolute(dir).map_err(|e| Error::io("resolve", dir, e))
}

impl Store {
    /// Opens (or creates) the store in `dir`, replaying its log.
    ///
    /// A torn final record is discarded; anything else that fails its
    /// checksum is `Error::Corruption`, and nothing is opened.
    ///
    /// # Errors
    /// `Locked` if another `Store` (in any process) has `dir` open,
    /// `Corruption` for damaged committed data, `Io` for the OS's errors.
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> {
        let options = options.within_limits();
        let dir = absolute_dir(dir.as_ref())?;
        let storage = Arc::clone(&options.storage);
        let lock = create_and_lock_dir(storage.as_ref(), &dir)?;
        let ttls = Ttls::new(options.seen_ttl, options.batch_ttl, options.tombstone_ttl);
        let recovered = recovery::recover(storage.as_ref(), &dir, ttls)?;
        let mut walk = recovered.walk;
        let reserve = options.segment_bytes_max.saturating_add(MAP_SLACK_BYTES);
        let maps = SegmentMaps::new(reserve);

        // Appends go to the newest log segment; a new one is started if there
        // is none, or if the newest segment is a base (after a repair).
        let newest = walk.segments.last().map(|s| (s.id, s.kind));
        // How long the active segment's file is: recovery cut an existing
        // one to its last record (dropping any preallocated zeros).
        let mut allocated = None;
        if let None | Some((_, Some(FileKind::Base))) = newest {
            let id = newest
                .map_or(Some(1), |(id, _)| id.checked_add(1))
                .ok_or_else(|| {
                    Error::io(
                        "create",
                        &dir,
                        std::io::Error::other("segment ids exhausted"),
                    )
                })?;
            let len = new_segment_len(options.segment_bytes_max);
            let file = create_segment(storage.as_ref(), &dir, id, len).inspect_err(|e| {
                // As after any failed sync of the log (`Store::poison`): the
                // header's page reads back from the page cache without being
                // on the disk, and no later sync writes it, so the next open
                // must write the segment again.
                if matches!(e, Error::Io { op: "sync", .. }) {
                    recovery::note_sync_failure(storage.as_ref(), &dir);
                }
            })?;
            allocated = Some(len);
            walk.segments.push(recovery::WalkedSegment {
                id,
                kind: Some(FileKind::Log),
                file,
                valid_len: SEGMENT_HEADER_LEN as u64,
                data_len: SEGMENT_HEADER_LEN as u64,
                synced_to: SEGMENT_HEADER_LEN as u64,
            });
        }
        let last = walk.segments.len() - 1;
        for (i, s) in walk.segments.iter().enumerate() {
            let map_reserve = if i == last { reserve } else { 0 };
            let map = s
                .file
                .map(map_reserve)
                .map_err(|e| Error::io("map", dir.join(segment_file_name(s.id)), e))?;
            maps.insert(s.id, Arc::clone(&s.file), map);
        }
        let active = walk.segments.pop().expect("at least one segment");
        // Frames written from now on claim the segment synced up to where it
        // ends now (see `LogWriter::place`): make that true. The records
        // after what the last frame claims may read back from the page
        // cache without being on the disk (a sync failed, and the process
        // died before its `SYNC_FAILED` marker was durable): a sync would
        // not write those pages, so they are written again first.
        let active_path = dir.join(segment_file_name(active.id));
        let unsure_from = active.synced_to.max(SEGMENT_HEADER_LEN as u64);
        if active.valid_len > unsure_from {
            let len = usize::try_from(active.valid_len - unsure_from)
                .map_err(|_| Error::io("read", &active_path, io::ErrorKind::OutOfMemory.into()))?;
            let mut unsure = vec![0; len];
            active
                .file
                .read_at(unsure_from, &mut unsure)
                .map_err(|e| Error::io("read", &active_path, e))?;
            active
                .file
                .write_at(unsure_from, &unsure)
                .map_err(|e| Error::io("write", &active_path, e))?;
        }
        active.file.sync_data().map_err(|e| {
            recovery::note_sync_failure(storage.as_ref(), &dir);
            Error::io("sync", active_path, e)
        })?;
        // So must the directory entries the store now builds on. A failed
        // directory sync (of a new segment's creation, at open, a rotation
        // or compaction's cut, or after recovery renamed a copy over a
        // segment or removed a stale snapshot) leaves its entries in the
        // page cache only, where this open finds them as if they were
        // durable and has nothing to do again; a power loss after batches
        // acknowledged in that segment would take the segment, or the copy,
        // back, or bring the snapshot back to be trusted.
        storage
            .sync_dir(&dir)
            .map_err(|e| Error::io("sync directory", &dir, e))?;
        let log = LogWriter::new(
            dir.clone(),
            Arc::clone(&storage),
            options.segment_bytes_max,
            active.file,
            active.id,
            active.valid_len,
            allocated.unwrap_or(active.valid_len),
            // Linux reports a write-back error to every file description
            // (the filler's own handle relies on it, see `zero_fill.rs`).
            cfg!(target_os = "linux")
                && options.zero_fill
                && options.durability == crate::options::Durability::Sync,
        )?;
        let commit = Arc::new(GroupCommit::new(Arc::clone(log.sync_gate())));
        let last_snapshot_bytes = match recovered.snapshot {
            Some(Ok(bytes)) => bytes,
            _ => 0,
        };
        // Only automatic snapshots are installed in the background.
        let installer = installer::Installer::new(
            storage.allows_background_io() && options.snapshot_log_bytes.is_some(),
        );
        Ok(Store {
            dir,
            options,
            index: Arc::new(RwLock::new(Index {
                fingerprints_values: true,
                ..recovered.index
            })),
            publisher: publisher::Publisher::new(Arc::clone(&commit)),
            maps,
            writer: Mutex::new(Writer {
                log,
                pending: pending::Pending::new(ttls),
                unsaved_bytes: walk.log_bytes,
                unsaved_since: 0,
                last_snapshot_bytes,
                failed_snapshot_at: None,
            }),
            commit,
            maintenance: Mutex::new(()),
            installer,
            closed: AtomicBool::new(false),
            opened: OpenReport {
                torn_bytes_discarded: recovered.torn_bytes,
                records_replayed: walk.records,
                snapshot: recovered.snapshot,
            },
            _lock: lock,
        })
    }

    /// The index, read locked for a reader: once the publishing thread
    /// has applied what it holds (see `publisher.rs`).
    fn read_index(&self) -> parking_lot::RwLockReadGuard<'_, Index> {
        self.publisher.read(&self.index)
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A key's live row, or `None` if it is absent or deleted.
    ///
    /// # Errors
    /// `Corruption` if the value's bytes fail their checksum.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Record>> {
        // The value is read under the index lock: compaction moves values
        // and swaps maps under the write lock.
        let index = self.read_index();
        let Some(entry) = index.keys.get(key.as_ref()) else {
            return Ok(None);
        };
        match entry.value() {
            Some(value) => Ok(Some(Record {
                seq: entry.seq,
                value: self.maps.read(value)?,
            })),
            None => Ok(None),
        }
    }

    /// Live rows whose key starts with `prefix`, in key order, as of the
    /// call. Values are not copied: each row's bytes point into the segment
    /// maps, and stay valid however long the caller keeps them.
    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Scan {
        let index = self.read_index();
        let rows: Vec<Result<(Bytes, Record)>> = index
            .keys
            .range_prefix(prefix.as_ref())
            .filter_map(|(k, e)| {
                let value = e.value()?;
                let row = self
                    .maps
                    .read(value)
                    .map(|value| (Bytes::copy_from_slice(k), Record { seq: e.seq, value }));
                Some(row)
            })
            .collect();
        Scan {
            rows: rows.into_iter(),
        }
    }

    /// The position last committed for `source`.
    ///
    /// # Errors
    /// Infallible today; reserved for reads that touch the disk.
    pub fn checkpoint(&self, source: impl AsRef<[u8]>) -> Result<Option<Bytes>> {
        Ok(self.read_index().checkpoints.get(source.as_ref()).cloned())
    }

    /// All checkpoints, by source.
    pub fn checkpoints(&self) -> Vec<(Bytes, Bytes)> {
        self.read_index()
            .checkpoints
            .iter()
            .map(|(s, p)| (s.clone(), p.clone()))
            .collect()
    }

    /// The report a committed batch returned when it committed (`replayed` false).
    ///
    /// # Errors
    /// Infallible today; reserved for reads that touch the disk.
    pub fn batch(&self, batch_id: impl AsRef<[u8]>) -> Result<Option<BatchReport>> {
        Ok(self
            .read_index()
            .batches
            .get(batch_id.as_ref())
            .map(|e| e.report))
    }

    /// Every committed batch in commit order, with its report.
    pub fn log(&self) -> Vec<LogEntry> {
        self.read_index()
            .batches
            .in_order()
            .map(|e| LogEntry {
                batch_id: Bytes::copy_from_slice(e.batch_id),
                content_hash: e.content_hash,
                report: e.report,
                committed_ms: e.committed_ms,
            })
            .collect()
    }

    /// The digest of the logical state: live rows (key, seq, value) in key
    /// order, then checkpoints. Equal states have equal digests. The pages
    /// of the values it reads leave the process's resident memory when it
    /// returns.
    ///
    /// # Errors
    /// `Corruption` if a value fails its checksum.
    pub fn digest(&self) -> Result<Digest> {
        let index = self.read_index();
        let mut builder = DigestBuilder::new();
        for (key, entry) in index.keys.range_prefix(b"") {
            if let Some(v) = entry.value() {
                builder.row(key, entry.seq, &self.maps.read(v)?);
            }
        }
        for (source, position) in &index.checkpoints {
            builder.checkpoint(source, position);
        }
        // The pages of every live value were mapped in; none is needed now.
        self.maps.release_pages();
        Ok(builder.finish())
    }

    /// Deliveries that were quarantined instead of applied, in commit order.
    pub fn quarantine(&self) -> Vec<QuarantineEntry> {
        self.read_index().quarantine.clone()
    }

    /// Counts, sizes on disk and index memory.
    pub fn stats(&self) -> Stats {
        let (segment_bytes, segments) = self.maps.disk_bytes();
        let disk_bytes = segment_bytes + self.snapshot_bytes();
        let syncs = self.commit.syncs();
        let index = self.read_index();
        Stats {
            live_keys: index.keys.live_count(),
            tombstones: index.keys.tombstone_count(),
            seen_ids: index.seen.len(),
            batches: index.batches.len(),
            checkpoints: index.checkpoints.len() as u64,
            quarantined: index.quarantine.len() as u64,
            segments,
            disk_bytes,
            syncs,
            index_bytes: IndexBytes {
                keys: index.keys.memory_bytes(),
                seen: index.seen.memory_bytes(),
                batches: index.batches.memory_bytes(),
            },
            torn_bytes_discarded: self.opened.torn_bytes_discarded,
            records_replayed_at_open: self.opened.records_replayed,
            opened_from_snapshot: matches!(self.opened.snapshot, Some(Ok(_))),
            snapshot_rejected: match &self.opened.snapshot {
                Some(Err(reason)) => Some(reason.to_string()),
                _ => None,
            },
        }
    }

    /// Reads and checks every record of the open store. Writers wait meanwhile.
    ///
    /// # Errors
    /// `Corruption` naming segment and offset at the first bad byte.
    pub fn verify(&self) -> Result<VerifyReport> {
        let _maintenance = self.lock_maintenance();
        let _writer = self.writer.lock();
        verify_report(recovery::verify(self.options.storage.as_ref(), &self.dir)?)
    }

    /// Reads and checks every record of the store in `dir` without opening
    /// it (and without discarding a torn tail, which is reported).
    ///
    /// # Errors
    /// `Locked` if the store is open; `Io` if `dir` is not a directory;
    /// `Corruption` at the first bad byte.
    pub fn verify_dir(dir: impl AsRef<Path>, options: &Options) -> Result<VerifyReport> {
        let dir = absolute_dir(dir.as_ref())?;
        let _lock = lock_existing_dir(options.storage.as_ref(), &dir)?;
        verify_report(recovery::verify(options.storage.as_ref(), &dir)?)
    }

    /// Salvages the longest valid prefix of the log in `dir`: cuts it at the
    /// first bad record and moves everything after into `lost+found/`.
    ///
    /// # Errors
    /// `Locked` if the store is open; `Io` if `dir` is not a directory or
    /// the cut cannot be made.
    pub fn repair(dir: impl AsRef<Path>, options: Options) -> Result<RepairReport> {
        let dir = absolute_dir(dir.as_ref())?;
        let _lock = lock_existing_dir(options.storage.as_ref(), &dir)?;
        recovery::repair(options.storage.as_ref(), &dir, options.clock.now_ms())
    }
}

fn verify_report(walk: recovery::Walk) -> Result<VerifyReport> {
    let mut bytes = 0;
    for s in &walk.segments {
        bytes += s.valid_len;
    }
    Ok(VerifyReport {
        segments: walk.segments.len() as u64,
        records: walk.records,
        bytes,
    })
}

/// Iterator over live rows in key order, from [`Store::scan_prefix`]: a
/// consistent snapshot taken when the scan starts.
#[derive(Debug)]
pub struct Scan {
    rows: std::vec::IntoIter<Result<(Bytes, Record)>>,
}

impl Iterator for Scan {
    type Item = Result<(Bytes, Record)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rows.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.rows.size_hint()
    }
}

/// The committed state as the planner reads it at `now_ms`: the published
/// index, shadowed by the pending batches' effects. Caller holds the writer
/// lock and the index read lock.
struct PlanView<'a> {
    index: &'a Index,
    pending: &'a Index,
    maps: &'a SegmentMaps,
    now_ms: u64,
}

impl StateView for PlanView<'_> {
    fn key_hash(&self, key: &[u8]) -> KeyHash {
        self.index.keys.hash(key)
    }

    /// The pending batches' shadow hashes under its own seed, and only
    /// when it holds keys at all (for a lone writer it holds none).
    fn key(&self, key: &[u8], hash: KeyHash) -> Option<KeyEntry> {
        match self.pending.keys.get(key) {
            Some(_) => self.pending.key_at(key, self.now_ms),
            None => self.index.key_at_hashed(key, hash, self.now_ms),
        }
    }

    /// A pending batch's `Add` may have expired by now (its sync may take
    /// longer than `seen_ttl`), so the pending mark decides where there is
    /// one: it started from the published mark.
    fn add_floor(&self, key: &[u8]) -> Option<u64> {
        let marks = if self.pending.add_marks.contains(key) {
            &self.pending.add_marks
        } else {
            &self.index.add_marks
        };
        marks.floor(key, self.now_ms)
    }

    fn read_value(&self, value: ValueRef) -> Result<Bytes> {
        self.maps.read(value)
    }

    fn value_equals(&self, value: ValueRef, candidate: &[u8], candidate_crc: u32) -> Result<bool> {
        self.maps.equals(value, candidate, candidate_crc)
    }

    fn prefetch_seen(&self, id_hash: u128) {
        self.index.seen.prefetch(id_hash);
    }

    fn prefetch_key(&self, hash: KeyHash) {
        self.index.keys.prefetch_hashed(hash);
    }

    fn prefetch_key_entry(&self, hash: KeyHash) {
        self.index.keys.prefetch_record_hashed(hash);
    }

    fn seen(&self, id_hash: u128) -> Option<u64> {
        match self.pending.seen.get(id_hash) {
            Some(_) => self.pending.seen.get_live(id_hash, self.now_ms),
            None => self.index.seen.get_live(id_hash, self.now_ms),
        }
    }
}
