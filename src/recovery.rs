//! Reading the whole log back: open (load a snapshot, replay), verify (check
//! only) and repair (salvage the longest valid prefix). All three walk the
//! log the same way.
//!
//! | case                                               | open               | verify     | repair          |
//! |----------------------------------------------------|--------------------|------------|-----------------|
//! | only zeros after the last record, newest segment   | cut, not reported  | end        | end             |
//! | torn or checksum-failing final record, newest seg  | truncated, dropped | Corruption | cut there       |
//! | newest segment with a torn header and no records   | header rewritten   | Corruption | segment dropped |
//! | bad record or header anywhere else                 | Corruption         | Corruption | cut there       |
//! | record that decodes badly or contradicts the index | Corruption         | Corruption | cut there       |
//! | a segment id missing from the sequence             | Corruption         | Corruption | cut there       |
//! | bad record inside a base segment                   | Corruption         | Corruption | base dropped    |
//! | segments older than the newest base segment        | deleted            | ignored    | ignored         |
//! | leftover `*.tmp` file                              | deleted            | ignored    | ignored         |
//! | missing, torn, corrupt or stale snapshot           | full replay        | Corruption | moved aside     |
//!
//! "Cut" moves the dropped bytes into `lost+found/<repair time in ms>/`
//! rather than deleting them, so that no repair overwrites an earlier one's.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::FORMAT_VERSION;
use crate::format::record::{KIND_BATCH, decode_batch};
use crate::format::segment::{
    FRAME_HEADER_LEN, FileKind, SEGMENT_HEADER_LEN, decode_frame, decode_segment_header,
    encode_segment_header, newer_format_version,
};
use crate::format::state::StateEnd;
use crate::index::Index;
use crate::index::expiry::Ttls;
use crate::index::keys::KeyState;
use crate::index::seen::SeenIndex;
use crate::log::names::{
    SNAPSHOT_FILE, SYNC_FAILED_FILE, TMP_SUFFIX, is_own_temporary, parse_segment_file_name,
    segment_file_name,
};
use crate::log::reader::{SegmentReader, data_end};
use crate::log::segments::SegmentMaps;
use crate::state_file::{LoadError, StateLoader};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::store::RepairReport;

/// One segment as the walk left it.
#[derive(Debug)]
pub(crate) struct WalkedSegment {
    pub id: u32,
    /// `None` if its header could not be read.
    pub kind: Option<FileKind>,
    pub file: Arc<dyn StorageFile>,
    /// Bytes up to the end of the last valid record.
    pub valid_len: u64,
    /// Bytes up to the last one that is not zero, as walked: what a cut
    /// at `valid_len` discards besides the zeros of a preallocated extension.
    pub data_len: u64,
    /// How far the last valid record's frame says the segment was synced
    /// (the header's end if none was walked): what follows may read back
    /// from the page cache without being on the disk.
    pub synced_to: u64,
}

/// Where and why a walk stopped early.
#[derive(Debug)]
pub(crate) struct Problem {
    pub segment: u32,
    /// The offending byte.
    pub offset: u64,
    /// Start of the record that holds `offset`: the valid prefix ends
    /// here, and a repair cuts here.
    pub record_at: u64,
    pub reason: Cow<'static, str>,
    /// The problem is in the newest segment and nothing valid follows it:
    /// a write cut short by a crash.
    pub is_tail: bool,
}

impl Problem {
    fn at(segment: u32, offset: u64, reason: impl Into<Cow<'static, str>>) -> Self {
        Self {
            segment,
            offset,
            record_at: offset,
            reason: reason.into(),
            is_tail: false,
        }
    }

    /// The problem lies inside the record whose frame starts at `record_at`.
    fn in_record(self, record_at: u32) -> Self {
        Self {
            record_at: u64::from(record_at),
            ..self
        }
    }

    fn into_error(self) -> Error {
        corruption(
            u64::from(self.segment),
            segment_file_name(self.segment),
            self.offset,
            self.reason,
        )
    }
}

fn corruption(
    segment: u64,
    file: String,
    offset: u64,
    reason: impl Into<Cow<'static, str>>,
) -> Error {
    Error::Corruption {
        segment,
        file,
        offset,
        reason: reason.into().into_owned(),
    }
}

/// The result of walking the log.
#[derive(Debug)]
pub(crate) struct Walk {
    /// Segments walked, in order; the last may be where the problem is.
    pub segments: Vec<WalkedSegment>,
    /// Records read (snapshot and skipped segments not included).
    pub records: u64,
    /// Bytes of log records replayed: what a snapshot now would spare the next open.
    pub log_bytes: u64,
    pub problem: Option<Problem>,
}

/// A segment file opened and mapped, with its header decoded.
struct Opened {
    id: u32,
    file: Arc<dyn StorageFile>,
    map: Bytes,
    kind: Result<FileKind, &'static str>,
}

/// Segment ids in the directory, ascending.
pub(crate) fn list_segments(storage: &dyn Storage, dir: &Path) -> Result<Vec<u32>> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    let mut ids: Vec<u32> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Refuses a store that a later idemkv wrote: a segment or `SNAPSHOT` whose
/// intact header names a newer format version. Open, verify and repair ask
/// first, before they delete or move anything.
fn refuse_newer_format(storage: &dyn Storage, dir: &Path) -> Result<()> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    let files = names
        .iter()
        .filter(|n| *n == SNAPSHOT_FILE || parse_segment_file_name(n).is_some());
    for name in files {
        let path = dir.join(name);
        let read = storage.open(&path, OpenMode::Read).and_then(|file| {
            let mut header = [0u8; SEGMENT_HEADER_LEN];
            file.read_at(0, &mut header).map(|()| header)
        });
        let header = match read {
            Ok(header) => header,
            // A file too short for a header is for the walk to judge.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => continue,
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        if let Some(version) = newer_format_version(&header) {
            return Err(Error::UnsupportedFormat {
                path,
                version,
                supported: FORMAT_VERSION,
            });
        }
    }
    Ok(())
}

/// Opens every segment. Returns those from the newest base segment on, and
/// the ids of the older ones, which that base made obsolete.
fn open_segments(
    storage: &dyn Storage,
    dir: &Path,
    writable: bool,
) -> Result<(Vec<Opened>, Vec<u32>)> {
    let ids = list_segments(storage, dir)?;
    let mut opened = Vec::with_capacity(ids.len());
    for (i, &id) in ids.iter().enumerate() {
        let path = dir.join(segment_file_name(id));
        let mode = if writable && i + 1 == ids.len() {
            OpenMode::Append
        } else {
            OpenMode::Read
        };
        let file = storage
            .open(&path, mode)
            .map_err(|e| Error::io("open", &path, e))?;
        let map = file.map(0).map_err(|e| Error::io("map", &path, e))?;
        let kind = decode_segment_header(&map, id);
        opened.push(Opened {
            id,
            file,
            map,
            kind,
        });
    }
    let base_at = opened
        .iter()
        .rposition(|o| o.kind == Ok(FileKind::Base))
        .unwrap_or(0);
    let current = opened.split_off(base_at);
    Ok((current, opened.iter().map(|o| o.id).collect()))
}

/// Replays `opened` into `index`, skipping what a snapshot already covers
/// (`start`: segment id and offset). Stops at the first problem. Only the
/// log's newest segment may end in a torn record or in zeros: `has_newest`
/// says whether the last of `opened` is it (not when compaction walks the
/// sealed segments below its cut).
fn walk(
    opened: Vec<Opened>,
    index: &mut Index,
    start: Option<(u32, u64)>,
    has_newest: bool,
) -> Walk {
    let mut walk = Walk {
        segments: Vec::new(),
        records: 0,
        log_bytes: 0,
        problem: None,
    };
    let count = opened.len();
    // The log starts at segment 1 or at a base segment: anything else means
    // its first segments are missing.
    let mut expected = opened.first().map(|o| match o.kind {
        Ok(FileKind::Base) => o.id,
        _ => 1,
    });
    for (i, o) in opened.into_iter().enumerate() {
        let is_newest = has_newest && i + 1 == count;
        if Some(o.id) != expected {
            let missing = expected.unwrap_or(o.id);
            walk.problem = Some(Problem::at(missing, 0, "segment file missing"));
            break;
        }
        expected = o.id.checked_add(1);
        let file_len = o.map.len() as u64;
        let mut segment = WalkedSegment {
            id: o.id,
            kind: o.kind.ok(),
            file: Arc::clone(&o.file),
            valid_len: file_len,
            data_len: data_end(&o.map, 0) as u64,
            synced_to: SEGMENT_HEADER_LEN as u64,
        };
        let mut from = SEGMENT_HEADER_LEN as u64;
        let result = match o.kind {
            // A header cut short, with nothing after it but the zeros of
            // the segment's extension.
            Err(reason) => Err(Problem {
                is_tail: is_newest && data_end(&o.map, SEGMENT_HEADER_LEN) <= SEGMENT_HEADER_LEN,
                ..Problem::at(o.id, 0, reason)
            }),
            Ok(FileKind::Snapshot) => Err(Problem::at(
                o.id,
                0,
                "a segment file with a snapshot header",
            )),
            Ok(FileKind::Base) if i > 0 => {
                Err(Problem::at(o.id, 0, "a base segment after log segments"))
            }
            Ok(kind) => match start {
                Some((s, _)) if o.id < s || (kind == FileKind::Base && o.id == s) => {
                    // Covered by the snapshot: nothing of it is replayed.
                    from = file_len;
                    Ok(file_len)
                }
                // Nothing was replayed before the snapshot's position: the
                // index's log time is still the snapshot's.
                Some((s, offset))
                    if o.id == s
                        && let Some(reason) =
                            snapshot_position_problem(&o.map, o.id, offset, index.log_time_ms) =>
                {
                    Err(Problem::at(o.id, offset, reason))
                }
                Some((s, offset)) if o.id == s => {
                    from = offset;
                    // The snapshot's install synced the log up to its
                    // position first: no frame needs to claim that.
                    segment.synced_to = offset;
                    replay(
                        SegmentReplay {
                            walked: &mut MapWalk::new(o.file.as_ref(), &o.map),
                            id: o.id,
                            kind,
                            from: offset as usize,
                            is_newest,
                        },
                        index,
                        (&mut walk.records, &mut segment.synced_to),
                    )
                }
                _ => replay(
                    SegmentReplay {
                        walked: &mut MapWalk::new(o.file.as_ref(), &o.map),
                        id: o.id,
                        kind,
                        from: SEGMENT_HEADER_LEN,
                        is_newest,
                    },
                    index,
                    (&mut walk.records, &mut segment.synced_to),
                ),
            },
        };
        if o.kind == Ok(FileKind::Log)
            && let Ok(end) = result
        {
            walk.log_bytes += end.saturating_sub(from);
        }
        match result {
            Ok(valid_len) => segment.valid_len = valid_len,
            Err(problem) => {
                segment.valid_len = problem.record_at;
                walk.problem = Some(problem);
            }
        }
        walk.segments.push(segment);
        if walk.problem.is_some() {
            break;
        }
    }
    walk
}

/// What is wrong with `offset` in log segment `id` as the position a
/// snapshot taken at `log_time_ms` covers, if anything. It must be the
/// header's end or the end of a whole record (frame and body checksums
/// hold): a snapshot skips the records before it unread, and one whose
/// position lay in zeros where the newest segment lost its last records (or
/// the zeros of its preallocated extension) was trusted, its values there
/// read as damaged, and the records appended after the hole were dropped by
/// the next repair. And that record must be a batch committed at the
/// snapshot's log time, which is the commit time of the last batch it
/// covers (the log's clock never goes back): a snapshot copied from another
/// store whose log had the same shape was trusted, and its seen ids made
/// this store's new events count as duplicates.
fn snapshot_position_problem(
    map: &[u8],
    id: u32,
    offset: u64,
    log_time_ms: u64,
) -> Option<&'static str> {
    match record_ending_at(map, id, offset) {
        None => Some("snapshot position is not the end of a record"),
        Some(None) => None,
        Some(Some((kind, body))) => {
            let committed_ms = (kind == KIND_BATCH)
                .then(|| decode_batch(body).ok())
                .flatten()
                .map(|batch| batch.committed_ms);
            (committed_ms != Some(log_time_ms)).then_some(
                "the batch that ends at the snapshot's position was not committed at its log time: a snapshot of another store",
            )
        }
    }
}

/// The kind and body of the whole record (frame and body checksums hold)
/// that ends at `offset` in segment `id`: `Some(None)` at the header's end
/// or past the file (which `replay` reports), `None` if no record ends
/// there. Scans back to the nearest valid frame only (a frame names its own
/// offset, so other candidates fail at once): the last record, if `offset`
/// ends one; otherwise a record that `offset` lies inside or that ends
/// before it with no record after, and either way the answer is `None`.
fn record_ending_at(map: &[u8], id: u32, offset: u64) -> Option<Option<(u8, &[u8])>> {
    let end = usize::try_from(offset).ok()?;
    if end == SEGMENT_HEADER_LEN || end > map.len() {
        return Some(None);
    }
    let last_start = end.checked_sub(FRAME_HEADER_LEN)?;
    let (at, frame) = (SEGMENT_HEADER_LEN..=last_start).rev().find_map(|at| {
        let frame = decode_frame(map.get(at..end)?, id, u32::try_from(at).ok()?)?;
        Some((at, frame))
    })?;
    let body = map.get(at + FRAME_HEADER_LEN..end)?;
    let is_whole = at + FRAME_HEADER_LEN + frame.body_len as usize == end
        && crc32fast::hash(body) == frame.body_crc;
    is_whole.then_some(Some((frame.kind, body)))
}

/// Bytes of a map read between two releases of its pages: loading a file
/// through its map holds about this much of it in the process's memory,
/// rather than all of it. Opening a store of 200,000 keys and 600,000 seen
/// ids (`tests/memory.rs`) peaked 25 MiB above what the open store holds
/// without releases, 10 MiB with one every 4 MiB, 7 MiB with one every MiB
/// (about 25 `madvise` calls for its snapshot).
const RELEASE_EVERY: usize = 1 << 20;

/// A file's map being read through, whose pages are released behind the
/// reader (`StorageFile::release_pages`).
struct MapWalk<'a> {
    file: &'a dyn StorageFile,
    map: &'a [u8],
    released: usize,
}

impl<'a> MapWalk<'a> {
    fn new(file: &'a dyn StorageFile, map: &'a [u8]) -> Self {
        Self {
            file,
            map,
            released: 0,
        }
    }

    /// The walk has read everything before `position`.
    fn passed(&mut self, position: usize) {
        if position >= self.released + RELEASE_EVERY {
            self.file.release_pages(self.map, position);
            self.released = position;
        }
    }
}

/// A batch record's seen ids and its commit time, on their way to the
/// thread that inserts them.
type SeenIds = (Vec<(u128, u64)>, u64);

/// Records a replay hands to the seen-id thread ahead of it: enough to
/// keep it busy, little memory.
const SEEN_QUEUE_RECORDS: usize = 16;

/// One segment's records to replay: the segment as walked, its id and
/// kind, where its records start, and whether it is the log's newest.
struct SegmentReplay<'w, 'm> {
    walked: &'w mut MapWalk<'m>,
    id: u32,
    kind: FileKind,
    from: usize,
    is_newest: bool,
}

/// Replays one segment's records from `from`; returns where they end.
///
/// A log segment's seen ids go into the index on a thread of their own
/// while this one checks, decodes and applies the rest of the records
/// (the seen ids are a part of the index nothing else in a batch record
/// touches, and they are half the work): the reopen of W1's store after a
/// crash, 179 records replayed, took 62-65 ms where it took 82-86. The
/// records reach that thread in log order, and only those applied here.
fn replay(
    segment: SegmentReplay<'_, '_>,
    index: &mut Index,
    counters: (&mut u64, &mut u64),
) -> Result<u64, Problem> {
    if segment.kind != FileKind::Log {
        return replay_records(segment, index, None, counters);
    }
    std::thread::scope(|scope| {
        let (queue, queued) = mpsc::sync_channel::<SeenIds>(SEEN_QUEUE_RECORDS);
        let (give_seen, take_seen) = mpsc::channel::<SeenIndex>();
        let spawned = std::thread::Builder::new()
            .name("idemkv-replay-seen".into())
            .spawn_scoped(scope, move || {
                let mut seen = take_seen.recv().unwrap_or_default();
                for (ids, committed_ms) in queued {
                    seen.insert_batch(&ids, committed_ms);
                }
                seen
            });
        // Without a thread the seen ids go in here, with the rest.
        let Ok(inserter) = spawned else {
            return replay_records(segment, index, None, counters);
        };
        // The thread waits for the seen ids before anything else, so this
        // send cannot fail.
        let _ = give_seen.send(std::mem::take(&mut index.seen));
        let replayed = replay_records(segment, index, Some(queue), counters);
        index.seen = inserter
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        replayed
    })
}

/// `replay`'s loop over the records; a batch record's seen ids go to
/// `seen_queue` if there is one, into `index` if not.
fn replay_records(
    segment: SegmentReplay<'_, '_>,
    index: &mut Index,
    seen_queue: Option<mpsc::SyncSender<SeenIds>>,
    (records, synced_to): (&mut u64, &mut u64),
) -> Result<u64, Problem> {
    let SegmentReplay {
        walked,
        id,
        kind,
        from,
        is_newest,
    } = segment;
    let map = walked.map;
    if from > map.len() {
        return Err(Problem::at(
            id,
            from as u64,
            "snapshot position beyond the end of the segment",
        ));
    }
    let mut reader = SegmentReader::starting_at(map, id, from);
    let mut loader = StateLoader::new(FileKind::Base);
    while let Some(item) = reader.next() {
        let record = match item {
            Ok(record) => record,
            // The newest log segment's unused extension: its records end here.
            Err(bad) if bad.is_zeroed && is_newest && kind == FileKind::Log => break,
            Err(bad) => {
                return Err(Problem {
                    is_tail: is_newest && bad.is_tail && kind == FileKind::Log,
                    ..Problem::at(id, bad.offset, bad.reason)
                });
            }
        };
        let at_body = |offset: usize| u64::from(record.body_at) + offset as u64;
        match (kind, record.kind) {
            (FileKind::Log, KIND_BATCH) => {
                let mut batch = decode_batch(record.body).map_err(|e| {
                    Problem::at(id, at_body(e.offset), e.what).in_record(record.offset)
                })?;
                index
                    .apply_visible(&batch, id, record.body_at, None)
                    .map_err(|reason| Problem::at(id, u64::from(record.offset), reason))?;
                match &seen_queue {
                    Some(queue) => {
                        let ids = std::mem::take(&mut batch.seen);
                        // Refused only if the thread panicked, which
                        // `replay` passes on once it joined it.
                        if queue.send((ids, batch.committed_ms)).is_err() {
                            break;
                        }
                    }
                    None => index.apply_seen(&batch),
                }
            }
            (FileKind::Base, k) if k != KIND_BATCH => loader
                .apply(index, &record, id)
                .map_err(|e| Problem::at(id, e.offset, e.what).in_record(e.record_offset))?,
            _ => {
                return Err(Problem::at(
                    id,
                    u64::from(record.offset),
                    "record of the wrong kind for its segment",
                ));
            }
        }
        *records += 1;
        *synced_to = (*synced_to).max(u64::from(record.synced_to));
        walked.passed(reader.position() as usize);
    }
    if kind == FileKind::Base && loader.end().is_none() {
        return Err(Problem::at(
            id,
            reader.position(),
            "base segment has no end record",
        ));
    }
    Ok(reader.position())
}

/// What a loaded snapshot claims of the log, to be checked against it.
struct LoadedSnapshot {
    end: StateEnd,
    /// The file's size.
    bytes: u64,
    /// For each segment its value references point into, the furthest byte.
    ref_extents: std::collections::BTreeMap<u32, u64>,
}

/// The snapshot file and a map of it. Failing here says nothing of its
/// bytes: the same file may read at the next open.
fn read_snapshot(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<(Arc<dyn StorageFile>, Bytes), Cow<'static, str>> {
    let path = dir.join(SNAPSHOT_FILE);
    let file = storage
        .open(&path, OpenMode::Read)
        .map_err(|e| format!("cannot open: {e}"))?;
    let map = file.map(0).map_err(|e| format!("cannot map: {e}"))?;
    Ok((file, map))
}

/// Loads the snapshot `read_snapshot` read into `index`; returns what it
/// claims, or why it cannot be used.
fn load_snapshot(
    file: &dyn StorageFile,
    map: &Bytes,
    index: &mut Index,
) -> Result<LoadedSnapshot, Cow<'static, str>> {
    if decode_segment_header(map, 0)? != FileKind::Snapshot {
        return Err("not a snapshot file".into());
    }
    // Keys load on a second thread while this one loads the seen ids.
    std::thread::scope(|scope| {
        let failed =
            |e: LoadError| format!("{} in the record at offset {}", e.what, e.record_offset);
        let mut loader = StateLoader::with_key_thread(FileKind::Snapshot, scope, index, map.len());
        let mut walked = MapWalk::new(file, map);
        for item in SegmentReader::new(map, 0) {
            let record = match item {
                Ok(record) => record,
                Err(bad) => {
                    // A key record before the bad one may have failed first.
                    loader.join_keys(index).map_err(failed)?;
                    return Err(format!("{} at offset {}", bad.reason, bad.offset).into());
                }
            };
            loader.apply(index, &record, 0).map_err(failed)?;
            walked.passed(record.body_at as usize + record.body.len());
        }
        loader.join_keys(index).map_err(failed)?;
        let end = loader.end().ok_or("snapshot has no end record")?;
        Ok(LoadedSnapshot {
            end,
            bytes: map.len() as u64,
            ref_extents: loader.ref_extents().cloned().unwrap_or_default(),
        })
    })
}

/// Checks that a snapshot belongs to this log and that every value it
/// refers to lies inside the walked segments.
fn check_snapshot(snapshot: &LoadedSnapshot, walk: &Walk) -> Result<(), &'static str> {
    let end = &snapshot.end;
    if walk.segments.first().map(|s| s.id) != Some(end.first_segment) {
        return Err("snapshot belongs to an older log");
    }
    let covered = walk
        .segments
        .iter()
        .find(|s| s.id == end.covered_segment)
        .ok_or("snapshot covers a missing segment")?;
    if covered.valid_len < end.covered_offset {
        return Err("snapshot covers more than the segment holds");
    }
    let len_of = |id: u32| {
        walk.segments
            .iter()
            .find(|s| s.id == id)
            .map(|s| s.valid_len)
    };
    for (&segment, &extent) in &snapshot.ref_extents {
        if len_of(segment).is_none_or(|len| extent > len) {
            return Err("snapshot refers to a value outside the log");
        }
    }
    Ok(())
}

/// Whether a snapshot was loaded (its size), or why not (`None` if there was none).
pub(crate) type SnapshotUse = Option<Result<u64, Cow<'static, str>>>;

/// What `open` found.
#[derive(Debug)]
pub(crate) struct Recovered {
    pub index: Index,
    pub walk: Walk,
    /// Bytes of a torn final record that were cut off.
    pub torn_bytes: u64,
    pub snapshot: SnapshotUse,
}

/// What `replay_log` rebuilt, and from what.
struct Replayed {
    index: Index,
    walk: Walk,
    snapshot: SnapshotUse,
    /// The snapshot loaded but does not fit this log, or could not be
    /// read at all, so that a later open might find it fitting (see `recover`).
    snapshot_is_stale: bool,
}

/// Replays the segments below `below` (all of them if `None`), from the
/// snapshot if it can be trusted. A walk from a snapshot that meets any
/// problem but a torn tail (which `recover` then cuts) is abandoned for a
/// full replay, which then reports the problem.
fn replay_log(
    storage: &dyn Storage,
    dir: &Path,
    ttls: Ttls,
    writable: bool,
    below: Option<u32>,
) -> Result<Replayed> {
    let open = || -> Result<Vec<Opened>> {
        let (mut opened, _) = open_segments(storage, dir, writable)?;
        if let Some(cut) = below {
            opened.retain(|o| o.id < cut);
        }
        Ok(opened)
    };
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    let (mut snapshot, mut snapshot_is_stale) = (None, false);
    if names.iter().any(|n| n == SNAPSHOT_FILE) {
        let mut index = Index::new(ttls);
        let loaded = read_snapshot(storage, dir)
            .inspect_err(|_| snapshot_is_stale = true)
            .and_then(|(file, map)| load_snapshot(file.as_ref(), &map, &mut index));
        let reason = match loaded {
            Ok(snapshot) => {
                let start = (snapshot.end.covered_segment, snapshot.end.covered_offset);
                let walk = walk(open()?, &mut index, Some(start), below.is_none());
                snapshot_is_stale = true;
                match (&walk.problem, check_snapshot(&snapshot, &walk)) {
                    (Some(p), _) if !p.is_tail => {
                        format!("the log after it does not replay: {}", p.reason).into()
                    }
                    (_, Ok(())) => {
                        return Ok(Replayed {
                            index,
                            walk,
                            snapshot: Some(Ok(snapshot.bytes)),
                            snapshot_is_stale: false,
                        });
                    }
                    (_, Err(reason)) => reason.into(),
                }
            }
            Err(reason) => reason,
        };
        snapshot = Some(Err(reason));
    }
    let mut index = Index::new(ttls);
    let walk = walk(open()?, &mut index, None, below.is_none());
    Ok(Replayed {
        index,
        walk,
        snapshot,
        snapshot_is_stale,
    })
}

/// Opens the log for `open`: removes what an interrupted compaction or
/// snapshot left behind, loads the snapshot if it can be trusted, replays
/// the rest, and cuts off a torn tail of the newest segment (syncing the
/// cut). Anything else wrong is `Corruption`.
pub(crate) fn recover(storage: &dyn Storage, dir: &Path, ttls: Ttls) -> Result<Recovered> {
    refuse_newer_format(storage, dir)?;
    remove_leftovers(storage, dir)?;
    let (_, obsolete) = open_segments(storage, dir, false)?;
    let Replayed {
        index,
        mut walk,
        snapshot,
        snapshot_is_stale,
    } = replay_log(storage, dir, ttls, true, None)?;
    if let Some(problem) = walk.problem.take_if(|p| !p.is_tail) {
        // The segments below the newest base stay until it has loaded: an
        // interrupted compaction left them, and if the base is damaged they
        // are the intact log that a repair, which drops the base, keeps.
        return Err(problem.into_error());
    }
    if !obsolete.is_empty() {
        for id in obsolete {
            let path = dir.join(segment_file_name(id));
            storage
                .remove_file(&path)
                .map_err(|e| Error::io("remove", &path, e))?;
        }
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }

    let mut torn_bytes = 0;
    let is_cut = walk.problem.is_some();
    if let Some(problem) = walk.problem.take() {
        let segment = walk
            .segments
            .last_mut()
            .expect("a tail problem is in a walked segment");
        let path = dir.join(segment_file_name(segment.id));
        torn_bytes = segment.data_len.saturating_sub(problem.offset);
        if problem.offset < SEGMENT_HEADER_LEN as u64 {
            // The segment's creation was cut short: write its header again.
            segment
                .file
                .set_len(0)
                .map_err(|e| Error::io("truncate", &path, e))?;
            segment
                .file
                .append(&encode_segment_header(segment.id, FileKind::Log))
                .map_err(|e| Error::io("write", &path, e))?;
            segment.file.sync_data().map_err(|e| {
                note_sync_failure(storage, dir);
                Error::io("sync", &path, e)
            })?;
        } else {
            // Replaced by a copy of its valid records, not truncated: a
            // value an earlier open in this process handed out may lie in
            // the cut bytes (a final record damaged since), and a map of a
            // shortened file faults when it is read there.
            segment.file = rewrite_segment(storage, dir, segment.id, problem.offset)?;
        }
        segment.valid_len = problem.offset.max(SEGMENT_HEADER_LEN as u64);
        segment.kind = Some(FileKind::Log);
    } else if let Some(newest) = walk
        .segments
        .last_mut()
        .filter(|s| s.kind == Some(FileKind::Log))
    {
        // Zeros after the last record: the unused part of the segment's
        // preallocated extension. Cut off, so that the store maps only
        // bytes that hold records; unsynced, because if a power loss brings
        // them back they are zeros again.
        let path = dir.join(segment_file_name(newest.id));
        let len = newest.file.len().map_err(|e| Error::io("stat", &path, e))?;
        if len > newest.valid_len {
            newest
                .file
                .set_len(newest.valid_len)
                .map_err(|e| Error::io("truncate", &path, e))?;
        }
    }
    let is_rejected = matches!(snapshot, Some(Err(_)));
    if snapshot_is_stale || (is_rejected && is_cut) {
        // A snapshot that loads but does not fit the log (the log lost
        // records it covers) goes before anything is appended: once the
        // log grew past the position it names, a later open could find it
        // fitting and skip every record written before that position. So
        // does one that could not be read (it may read next time), or any
        // rejected one when this open cut the log. It holds nothing the
        // log does not: a snapshot only saves time.
        remove_durably(storage, dir, SNAPSHOT_FILE)?;
    }
    if storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?
        .iter()
        .any(|n| n == SYNC_FAILED_FILE)
    {
        if let Some(newest) = walk
            .segments
            .last_mut()
            .filter(|s| s.kind == Some(FileKind::Log))
        {
            newest.file = rewrite_segment(storage, dir, newest.id, newest.valid_len)?;
        }
        remove_durably(storage, dir, SYNC_FAILED_FILE)?;
    }
    Ok(Recovered {
        index,
        walk,
        torn_bytes,
        snapshot,
    })
}

/// The state of the sealed segments below `cut`, for compaction, with each
/// segment's id and length. Any problem is `Corruption`: sealed segments are whole.
pub(crate) fn state_before(
    storage: &dyn Storage,
    dir: &Path,
    ttls: Ttls,
    cut: u32,
) -> Result<(Index, Vec<(u32, u64)>)> {
    let Replayed {
        index, mut walk, ..
    } = replay_log(storage, dir, ttls, false, Some(cut))?;
    if let Some(problem) = walk.problem.take() {
        return Err(problem.into_error());
    }
    let segments = walk.segments.iter().map(|s| (s.id, s.valid_len)).collect();
    Ok((index, segments))
}

/// Loads a base segment from its map; the error says why it does not load.
pub(crate) fn load_base(
    file: &dyn StorageFile,
    map: &[u8],
    id: u32,
    ttls: Ttls,
) -> Result<Index, Cow<'static, str>> {
    if decode_segment_header(map, id)? != FileKind::Base {
        return Err("not a base segment".into());
    }
    let mut index = Index::new(ttls);
    let (mut records, mut synced_to) = (0, 0);
    replay(
        SegmentReplay {
            walked: &mut MapWalk::new(file, map),
            id,
            kind: FileKind::Base,
            from: SEGMENT_HEADER_LEN,
            is_newest: false,
        },
        &mut index,
        (&mut records, &mut synced_to),
    )
    .map_err(|p| p.reason)?;
    file.release_pages(map, map.len());
    Ok(index)
}

/// Leaves the note that makes the next open rewrite the newest segment: a
/// failed sync may have left pages that read back but never reach the disk.
/// Best effort: the disk is failing.
pub(crate) fn note_sync_failure(storage: &dyn Storage, dir: &Path) {
    let path = dir.join(SYNC_FAILED_FILE);
    if let Ok(file) = storage.open(&path, OpenMode::CreateNew) {
        let _ = file.sync_data();
        let _ = storage.sync_dir(dir);
    }
}

/// Writes segment `id`'s first `len` bytes to a new file that replaces it.
///
/// After a failed sync the kernel may have marked the segment's unsynced
/// pages clean: they read back, but will never reach the disk, and no later
/// sync covers them. A copy holds them in pages of its own, which its sync
/// does write.
fn rewrite_segment(
    storage: &dyn Storage,
    dir: &Path,
    id: u32,
    len: u64,
) -> Result<Arc<dyn StorageFile>> {
    let path = dir.join(segment_file_name(id));
    let tmp = dir.join(format!("{}{TMP_SUFFIX}", segment_file_name(id)));
    let file = storage
        .open(&path, OpenMode::Read)
        .map_err(|e| Error::io("open", &path, e))?;
    let map = file.map(0).map_err(|e| Error::io("map", &path, e))?;
    let bytes = map
        .get(..len as usize)
        .ok_or_else(|| Error::io("read", &path, std::io::ErrorKind::UnexpectedEof.into()))?;
    write_new_file(storage, &tmp, bytes)?;
    storage
        .rename(&tmp, &path)
        .map_err(|e| Error::io("rename", &tmp, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    storage
        .open(&path, OpenMode::Append)
        .map_err(|e| Error::io("open", &path, e))
}

/// Removes `name` from `dir` and syncs `dir`, so that the removal outlives
/// a power loss.
fn remove_durably(storage: &dyn Storage, dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    storage
        .remove_file(&path)
        .map_err(|e| Error::io("remove", &path, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))
}

/// Removes temporary files that an interrupted compaction or snapshot left.
fn remove_leftovers(storage: &dyn Storage, dir: &Path) -> Result<()> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    for name in names.iter().filter(|n| is_own_temporary(n)) {
        let path = dir.join(name);
        storage
            .remove_file(&path)
            .map_err(|e| Error::io("remove", &path, e))?;
    }
    Ok(())
}

/// Directory that repair moves dropped bytes into.
pub(crate) const LOST_FOUND_DIR: &str = "lost+found";

/// Cuts the log at its first problem, keeping the longest valid prefix. The
/// dropped bytes, and the snapshot (which may cover them), are moved into
/// `lost+found/`, not deleted.
///
/// A pass that drops the newest base whole uncovers the segments an
/// interrupted compaction left below it (open deletes them only once the
/// base loads): they are the log then, and the next pass repairs them in
/// turn, into the same `lost+found` directory, until a pass finds the log
/// whole. Each pass that finds a problem drops a segment or cuts one to its
/// valid records, so the passes end.
pub(crate) fn repair(storage: &dyn Storage, dir: &Path, now_ms: u64) -> Result<RepairReport> {
    let mut report = repair_pass(storage, dir, now_ms, None)?;
    // A bound, should a pass ever leave its problem in place: each pass
    // that finds one removes or cuts a file of the directory.
    let files = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?
        .len();
    let mut found_one = report.first_bad.is_some();
    for _ in 0..=files {
        if !found_one {
            break;
        }
        let lost = report.lost_found.clone();
        let next = repair_pass(storage, dir, now_ms, lost.as_deref())?;
        report.records_kept = next.records_kept;
        report.bytes_dropped += next.bytes_dropped;
        report.segments_dropped += next.segments_dropped;
        found_one = next.first_bad.is_some();
    }
    Ok(report)
}

/// One pass of `repair`, moving what it drops into `lost_found` if given,
/// else into a fresh directory.
fn repair_pass(
    storage: &dyn Storage,
    dir: &Path,
    now_ms: u64,
    lost_found: Option<&Path>,
) -> Result<RepairReport> {
    refuse_newer_format(storage, dir)?;
    // An interrupted repair may have left its copy of the segment it cuts.
    remove_leftovers(storage, dir)?;
    let (opened, _) = open_segments(storage, dir, true)?;
    let kinds: Vec<(u32, Result<FileKind, &'static str>)> =
        opened.iter().map(|o| (o.id, o.kind)).collect();
    let mut walk = walk(opened, &mut Index::default(), None, true);
    let mut report = RepairReport {
        records_kept: walk.records,
        ..RepairReport::default()
    };
    let Some(problem) = walk.problem.take() else {
        // A whole log: a snapshot that does not fit it is all there is to move.
        if snapshot_problem(storage, dir, &walk)?.is_some() {
            let lost = match lost_found {
                Some(lost) => lost.to_owned(),
                None => fresh_lost_found(storage, dir, now_ms)?,
            };
            let from = dir.join(SNAPSHOT_FILE);
            let file = storage
                .open(&from, OpenMode::Read)
                .map_err(|e| Error::io("open", &from, e))?;
            report.bytes_dropped = file.len().map_err(|e| Error::io("stat", &from, e))?;
            storage
                .rename(&from, &lost.join(SNAPSHOT_FILE))
                .map_err(|e| Error::io("rename", &from, e))?;
            storage
                .sync_dir(dir)
                .map_err(|e| Error::io("sync directory", dir, e))?;
            storage
                .sync_dir(&lost)
                .map_err(|e| Error::io("sync directory", &lost, e))?;
            report.lost_found = Some(lost);
        }
        return Ok(report);
    };
    report.first_bad = Some((u64::from(problem.segment), problem.offset));
    let lost = match lost_found {
        Some(lost) => lost.to_owned(),
        None => fresh_lost_found(storage, dir, now_ms)?,
    };
    report.lost_found = Some(lost.clone());

    // The segment holding the problem keeps its valid prefix, if it has one:
    // a log segment can be cut between records, a base segment cannot.
    let is_base = kinds
        .iter()
        .any(|&(id, k)| id == problem.segment && k == Ok(FileKind::Base));
    if is_base
        && walk
            .segments
            .first()
            .is_some_and(|s| s.id == problem.segment)
    {
        // Every record the walk read was in this base (one anywhere else
        // is refused before a record of it is read), and it goes whole.
        report.records_kept = 0;
    }
    let cut = walk
        .segments
        .iter()
        .find(|s| s.id == problem.segment)
        .filter(|_| !is_base && problem.record_at >= SEGMENT_HEADER_LEN as u64);
    // Every other segment of the log that the walk did not keep goes,
    // wherever its id sorts: one below the log's first id (a stray
    // `0000000000.seg`) is as much in the way as one after the problem.
    let kept: Vec<u32> = walk
        .segments
        .iter()
        .map(|s| s.id)
        .filter(|&id| id != problem.segment || cut.is_some())
        .collect();
    let dropped: Vec<u32> = kinds
        .iter()
        .map(|&(id, _)| id)
        .filter(|id| !kept.contains(id))
        .collect();

    // Order matters for a crash in the middle: the snapshot goes first (it
    // may cover what is dropped), then whole segments from the newest down,
    // so that what remains is always a prefix of the log; the cut comes last.
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    let mut moved: Vec<String> = names.into_iter().filter(|n| n == SNAPSHOT_FILE).collect();
    moved.extend(dropped.iter().rev().map(|&id| segment_file_name(id)));
    report.segments_dropped = dropped.len() as u64;
    for name in moved {
        let from = dir.join(&name);
        let file = storage
            .open(&from, OpenMode::Read)
            .map_err(|e| Error::io("open", &from, e))?;
        report.bytes_dropped += file.len().map_err(|e| Error::io("stat", &from, e))?;
        storage
            .rename(&from, &lost.join(&name))
            .map_err(|e| Error::io("rename", &from, e))?;
        storage
            .sync_dir(dir)
            .map_err(|e| Error::io("sync directory", dir, e))?;
    }
    if let Some(s) = cut {
        let path = dir.join(segment_file_name(s.id));
        let map = s.file.map(0).map_err(|e| Error::io("map", &path, e))?;
        let tail = map.get(problem.record_at as usize..).unwrap_or_default();
        let tail_path = lost.join(format!(
            "{}.{}.tail",
            segment_file_name(s.id),
            problem.record_at
        ));
        write_new_file(storage, &tail_path, tail)?;
        // The copy is durable, name included, before the original is cut.
        storage
            .sync_dir(&lost)
            .map_err(|e| Error::io("sync directory", &lost, e))?;
        report.bytes_dropped += tail.len() as u64;
        drop(map);
        // A copy of the kept records replaces the segment, as at open: the
        // values an open of this store handed out before may lie in the
        // dropped records, and they stay readable in the old file.
        rewrite_segment(storage, dir, s.id, problem.record_at)?;
    }
    storage
        .sync_dir(&lost)
        .map_err(|e| Error::io("sync directory", &lost, e))?;
    Ok(report)
}

/// A new, empty directory under `lost+found/` for one repair, named by the
/// repair's time (with a suffix if an earlier repair used that time).
fn fresh_lost_found(storage: &dyn Storage, dir: &Path, now_ms: u64) -> Result<PathBuf> {
    let root = dir.join(LOST_FOUND_DIR);
    for attempt in 0u32.. {
        let name = if attempt == 0 {
            now_ms.to_string()
        } else {
            format!("{now_ms}-{attempt}")
        };
        let candidate = root.join(name);
        let is_free = match storage.list_dir(&candidate) {
            Ok(entries) => entries.is_empty(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(Error::io("list", &candidate, e)),
        };
        if is_free {
            storage
                .create_dir_all(&candidate)
                .map_err(|e| Error::io("create directory", &candidate, e))?;
            storage
                .sync_dir(&root)
                .map_err(|e| Error::io("sync directory", &root, e))?;
            storage
                .sync_dir(dir)
                .map_err(|e| Error::io("sync directory", dir, e))?;
            return Ok(candidate);
        }
    }
    unreachable!("some suffix is free")
}

fn write_new_file(storage: &dyn Storage, path: &PathBuf, bytes: &[u8]) -> Result<()> {
    let file = storage
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", path, e))?;
    file.append(bytes)
        .map_err(|e| Error::io("write", path, e))?;
    file.sync_data().map_err(|e| Error::io("sync", path, e))
}

/// Checks every record, and the snapshot if there is one, without changing
/// anything: any problem, a torn tail included, is `Corruption`.
pub(crate) fn verify(storage: &dyn Storage, dir: &Path) -> Result<Walk> {
    refuse_newer_format(storage, dir)?;
    let (opened, _) = open_segments(storage, dir, false)?;
    let mut walk = walk(opened, &mut Index::default(), None, true);
    if let Some(problem) = walk.problem.take() {
        return Err(problem.into_error());
    }
    if let Some(reason) = snapshot_problem(storage, dir, &walk)? {
        return Err(corruption(0, SNAPSHOT_FILE.to_owned(), 0, reason));
    }
    Ok(walk)
}

/// Why the snapshot in `dir` does not load or does not fit the walked log;
/// `None` if it does, or if there is none.
fn snapshot_problem(
    storage: &dyn Storage,
    dir: &Path,
    walk: &Walk,
) -> Result<Option<Cow<'static, str>>> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    if !names.iter().any(|n| n == SNAPSHOT_FILE) {
        return Ok(None);
    }
    let mut scratch = Index::default();
    Ok(read_snapshot(storage, dir)
        .and_then(|(file, map)| load_snapshot(file.as_ref(), &map, &mut scratch))
        .and_then(|snapshot| {
            check_snapshot(&snapshot, walk).map_err(Cow::Borrowed)?;
            Ok(snapshot.end)
        })
        .and_then(|end| check_snapshot_values(&scratch, &end, walk))
        .err())
}

/// Checks what open checks of the snapshot's bytes (its covered position
/// ends a whole record), then reads every value it refers to, as a `get`
/// would: its stored checksum must hold, and match the one the snapshot
/// keeps. Open cannot afford the reads; verify reads the whole log anyway.
/// Without them, a snapshot that fits the log's shape but not its bytes
/// (copied from another store, or covering records lost to zeros) passed
/// verify, and every read of its values failed.
fn check_snapshot_values(
    snapshot: &Index,
    end: &StateEnd,
    walk: &Walk,
) -> Result<(), Cow<'static, str>> {
    let maps = SegmentMaps::new(0);
    for s in &walk.segments {
        let map = s
            .file
            .map(0)
            .map_err(|e| format!("cannot map segment {}: {e}", s.id))?;
        if s.id == end.covered_segment
            && s.kind == Some(FileKind::Log)
            && let Some(reason) =
                snapshot_position_problem(&map, s.id, end.covered_offset, end.log_time_ms)
        {
            return Err(reason.into());
        }
        maps.insert(s.id, Arc::clone(&s.file), map);
    }
    for (key, entry) in snapshot.keys.range_prefix(b"") {
        if let KeyState::Live(value) = entry.state {
            maps.read(value).map_err(|e| {
                format!(
                    "the value of key {:?} does not read back: {e}",
                    String::from_utf8_lossy(key)
                )
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::encode_frame;

    /// The body of an empty batch `id` committed at `committed_ms`.
    fn batch_body(id: &str, committed_ms: u64) -> Vec<u8> {
        use crate::format::record;
        let mut body = Vec::new();
        record::encode_batch_head(&mut body, id.as_bytes(), 7, committed_ms, [0; 8]);
        record::encode_seen(&mut body, &[]);
        record::encode_writes_count(&mut body, 0);
        record::encode_checkpoints(&mut body, std::iter::empty());
        record::encode_quarantine(&mut body, &[]);
        record::encode_adds(&mut body, &[]);
        body
    }

    /// Segment 3: a header of zeros (not read here), records of bodies
    /// `bodies` one after the other, then `zeros` zero bytes; with where
    /// each record ends.
    fn segment(bodies: &[&[u8]], zeros: usize) -> (Vec<u8>, Vec<u64>) {
        let mut file = vec![0u8; SEGMENT_HEADER_LEN];
        let mut ends = Vec::new();
        for body in bodies {
            let at = file.len();
            let mut frame = [0u8; FRAME_HEADER_LEN];
            encode_frame(&mut frame, KIND_BATCH, body, 3, at as u32, 0);
            file.extend_from_slice(&frame);
            file.extend_from_slice(body);
            ends.push(file.len() as u64);
        }
        file.resize(file.len() + zeros, 0);
        (file, ends)
    }

    #[test]
    fn a_snapshot_position_must_end_a_whole_batch_committed_at_the_snapshot_s_log_time() {
        let (first, second) = (batch_body("B1", 1_000), batch_body("B2, longer", 2_000));
        let (file, ends) = segment(&[&first, &second], 4096);
        let header_end = SEGMENT_HEADER_LEN as u64;
        let problem =
            |file: &[u8], id, at, log_time_ms| snapshot_position_problem(file, id, at, log_time_ms);
        let not_an_end = Some("snapshot position is not the end of a record");
        for (at, log_time_ms) in [(header_end, 5), (ends[0], 1_000), (ends[1], 2_000)] {
            assert_eq!(problem(&file, 3, at, log_time_ms), None, "{at}");
        }
        // A record of another time at the position: another store's log.
        for (at, log_time_ms) in [(ends[0], 2_000), (ends[1], 1_000), (ends[1], 2_001)] {
            let reason = problem(&file, 3, at, log_time_ms).expect("refused");
            assert!(reason.contains("another store"), "{at}: {reason}");
        }
        let inside = [header_end + 1, ends[0] - 1, ends[0] + 5, ends[1] - 1];
        let in_zeros = [ends[1] + 1, ends[1] + 1000, file.len() as u64];
        for at in inside.into_iter().chain(in_zeros) {
            assert_eq!(problem(&file, 3, at, 2_000), not_an_end, "{at}");
        }
        assert_eq!(
            problem(&file, 4, ends[1], 2_000),
            not_an_end,
            "another segment's frames"
        );
        // A record whose body was damaged ends nothing.
        let mut damaged = file.clone();
        damaged[ends[1] as usize - 2] ^= 1;
        assert_eq!(problem(&damaged, 3, ends[1], 2_000), not_an_end);
        assert_eq!(problem(&damaged, 3, ends[0], 1_000), None);
    }
}
