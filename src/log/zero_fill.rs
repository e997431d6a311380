//! Fills the active segment with zeros ahead of its records, so that
//! commit syncs write data alone (DESIGN.md, "Zero-filled segments").
//!
//! The writer extends the active segment with `set_len`, which allocates no
//! blocks: a record written into that hole makes its commit sync allocate
//! blocks and commit the file system's journal for them. A record written
//! over blocks already written and synced needs neither. So under
//! `Durability::Sync` the space ahead of the records is filled with zeros
//! and synced a chunk at a time, on a thread of its own, as PostgreSQL
//! fills its WAL files before it uses them. The zeros read as the unused
//! end of the newest segment, as the hole did.
//!
//! A chunk starts right after a sync of the log returned, at most one per
//! sync: the writer then prepares its next record, and the disk is idle.
//! A fill that runs into a commit sync makes it wait for the zeros.
//!
//! The zeros never land on a record: chunks are claimed under the lock, at
//! least `gap` bytes past the end of the records, which the writer moves
//! before it writes, and a writer that would write into a claimed chunk
//! waits for it. They never make the file longer: chunks end at its length,
//! which the writer lowers, waiting for a claimed chunk beyond it, before
//! it truncates.
//!
//! The filler syncs through a handle of its own. Linux reports a failed
//! write-back to the next sync of each file description, so the commit
//! syncs, which pass the sync gate on the writer's handle, still hear of a
//! failure the filler's sync saw first; the filler's syncs need not pass
//! the gate and run beside theirs. A failed fill only stops the filling;
//! opening the filler's handle, though, is part of opening the store or
//! rotating the log, and fails them as any of their file operations would.
//!
//! A storage that wants all I/O on the caller's thread (the fault tests')
//! gets the same fills inline: before each record is written, the chunks
//! its end makes due.

use std::ops::Range;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::storage::StorageFile;

/// Where fills go, relative to the end of the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reach {
    /// Bytes past the records' end left unfilled, so that the next records
    /// do not wait for a chunk being filled.
    pub gap: u64,
    /// Bytes past the records' end filled up to (within the file).
    pub ahead: u64,
    /// Bytes filled and synced at a time.
    pub chunk: u64,
}

impl Reach {
    /// Filling up to `ahead` bytes past the records, a sixteenth at a time
    /// and a quarter from their end.
    pub(crate) fn new(ahead: u64) -> Self {
        Self {
            gap: (ahead / 4).max(1),
            ahead,
            chunk: (ahead / 16).max(1),
        }
    }
}

/// What the writer and the filler share.
#[derive(Debug)]
struct Fill {
    /// The filler's own handle of the active segment.
    file: Arc<dyn StorageFile>,
    /// Where the records end (the writer moves it before each write).
    records_end: u64,
    /// The file's length: no fill reaches past it.
    len: u64,
    /// Zeros are written and synced from the records' end up to here.
    filled_to: u64,
    /// The chunk being filled.
    claimed: Option<Range<u64>>,
    /// A sync of the log returned with a chunk due, since the last chunk
    /// started.
    is_disk_idle: bool,
    /// The writer is gone, or a fill failed.
    is_stopped: bool,
    reach: Reach,
}

impl Fill {
    /// The next chunk to fill, if one is due.
    fn next_chunk(&self) -> Option<Range<u64>> {
        if self.is_stopped || self.claimed.is_some() {
            return None;
        }
        let start = self.filled_to.max(self.records_end + self.reach.gap);
        let end = (start + self.reach.chunk)
            .min(self.records_end + self.reach.ahead)
            .min(self.len);
        // Whole chunks only (each costs a sync), but for the file's end.
        let is_due = start < end && (end - start == self.reach.chunk || end == self.len);
        is_due.then_some(start..end)
    }

    fn overlaps_claim(&self, range: &Range<u64>) -> bool {
        self.claimed
            .as_ref()
            .is_some_and(|c| c.start < range.end && range.start < c.end)
    }
}

#[derive(Debug)]
struct Shared {
    fill: Mutex<Fill>,
    /// Signalled when the records, the length or a claim change.
    changed: Condvar,
}

/// The filler of one store's log (see the module comment).
#[derive(Debug)]
pub(crate) struct ZeroFill {
    shared: Arc<Shared>,
    /// The filling thread; `None` when fills run inline.
    thread: Option<JoinHandle<()>>,
}

impl ZeroFill {
    /// Starts filling `file`, whose records end at `records_end` and whose
    /// length is `len`, on a thread of its own if `is_background`.
    pub(crate) fn start(
        file: Arc<dyn StorageFile>,
        records_end: u64,
        len: u64,
        reach: Reach,
        is_background: bool,
    ) -> Self {
        let shared = Arc::new(Shared {
            fill: Mutex::new(Fill {
                file,
                records_end,
                len,
                filled_to: records_end,
                claimed: None,
                is_disk_idle: false,
                is_stopped: false,
                reach,
            }),
            changed: Condvar::new(),
        });
        let thread = if is_background {
            let filler = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name("idemkv-zero-fill".into())
                .spawn(move || run(&filler));
            // Without a thread of its own the store does without filling.
            shared.fill.lock().is_stopped = spawned.is_err();
            spawned.ok()
        } else {
            None
        };
        Self { shared, thread }
    }

    /// The writer is about to write `range` (the records' new end is its
    /// end): no chunk is claimed there from now on, and a claimed one is
    /// waited for. Inline, fills the chunks this makes due first.
    pub(crate) fn will_write(&self, range: Range<u64>) {
        let mut fill = self.shared.fill.lock();
        fill.records_end = fill.records_end.max(range.end);
        while fill.overlaps_claim(&range) {
            self.shared.changed.wait(&mut fill);
        }
        if self.thread.is_none() {
            fill_due(&mut fill);
        }
    }

    /// What the sync gate calls after each sync: the filling thread may
    /// start a chunk.
    pub(crate) fn cue(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = Arc::clone(&self.shared);
        move || {
            // Only for a chunk due now: a cue that finds none (or one being
            // filled) is not kept for later, when the disk may be busy.
            let mut fill = shared.fill.lock();
            if fill.next_chunk().is_some() {
                fill.is_disk_idle = true;
                shared.changed.notify_all();
            }
        }
    }

    /// The file was extended to `len`.
    pub(crate) fn extended(&self, len: u64) {
        let mut fill = self.shared.fill.lock();
        fill.len = fill.len.max(len);
        self.shared.changed.notify_all();
    }

    /// The file is about to be cut to `len`: no fill reaches past it once
    /// this returns.
    pub(crate) fn will_truncate(&self, len: u64) {
        let mut fill = self.shared.fill.lock();
        fill.len = len;
        fill.filled_to = fill.filled_to.min(len);
        while fill.claimed.as_ref().is_some_and(|c| c.end > len) {
            self.shared.changed.wait(&mut fill);
        }
    }

    /// Records now go to `file` (a new segment), ending at `records_end`;
    /// it is `len` bytes long. Call `will_truncate` on the old one first.
    pub(crate) fn switch_to(&self, file: Arc<dyn StorageFile>, records_end: u64, len: u64) {
        let mut fill = self.shared.fill.lock();
        while fill.claimed.is_some() {
            self.shared.changed.wait(&mut fill);
        }
        fill.file = file;
        fill.records_end = records_end;
        fill.len = len;
        fill.filled_to = records_end;
        self.shared.changed.notify_all();
    }
}

impl Drop for ZeroFill {
    /// Stops the filling thread and waits for it (and so for a chunk it
    /// is filling).
    fn drop(&mut self) {
        self.shared.fill.lock().is_stopped = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            // A panic there is a bug already reported on that thread.
            let _ = thread.join();
        }
    }
}

/// The filling thread: fills a due chunk after each sync, until stopped.
fn run(shared: &Shared) {
    let mut fill = shared.fill.lock();
    while !fill.is_stopped {
        if fill.is_disk_idle && fill.next_chunk().is_some() {
            fill.is_disk_idle = false;
            fill_next(&mut fill);
            shared.changed.notify_all();
        } else {
            shared.changed.wait(&mut fill);
        }
    }
}

/// Fills every chunk due now, on the caller's thread.
fn fill_due(fill: &mut MutexGuard<'_, Fill>) {
    while fill.next_chunk().is_some() {
        fill_next(fill);
    }
}

/// Claims the next chunk, fills and syncs it with the lock released, and
/// notes the result.
fn fill_next(fill: &mut MutexGuard<'_, Fill>) {
    let Some(chunk) = fill.next_chunk() else {
        return;
    };
    fill.claimed = Some(chunk.clone());
    let file = Arc::clone(&fill.file);
    let filled = MutexGuard::unlocked(fill, || {
        file.fill_zeros(chunk.start, chunk.end - chunk.start)?;
        file.sync_data()
    });
    fill.claimed = None;
    match filled {
        // The file may have been cut meanwhile (it waited for this chunk).
        Ok(()) => fill.filled_to = fill.filled_to.max(chunk.end.min(fill.len)),
        Err(_) => fill.is_stopped = true,
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::storage::{FaultyStorage, OpKind, OpenMode, Storage};

    const LEN: u64 = 64 << 10;
    const MARK: u8 = 0xAA;
    const RECORD: u8 = 0x11;
    const REACH: Reach = Reach {
        gap: 1024,
        ahead: 8192,
        chunk: 1024,
    };
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// A file of `LEN` bytes of `MARK` on disk, the writer's handle and
    /// the filler's.
    fn setup() -> (FaultyStorage, Arc<dyn StorageFile>, Arc<dyn StorageFile>) {
        let storage = FaultyStorage::new();
        storage.create_dir_all(Path::new("/s")).unwrap();
        let path = Path::new("/s/1.seg");
        let file = storage.open(path, OpenMode::CreateNew).unwrap();
        file.append(&[MARK; LEN as usize]).unwrap();
        file.sync_data().unwrap();
        let filler = storage.open(path, OpenMode::Append).unwrap();
        (storage, file, filler)
    }

    fn contents(file: &dyn StorageFile) -> Vec<u8> {
        let mut bytes = vec![0; file.len().unwrap() as usize];
        file.read_at(0, &mut bytes).unwrap();
        bytes
    }

    fn all(bytes: &[u8], range: Range<u64>, byte: u8) -> bool {
        let end = (range.end as usize).min(bytes.len());
        let start = (range.start as usize).min(end);
        bytes.get(start..end).unwrap().iter().all(|&b| b == byte)
    }

    #[test]
    fn fills_ahead_of_the_records_never_over_them_nor_past_the_file() {
        let (storage, file, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, false);
        let mut end = 0;
        for len in [100, 3000, 1, 5000, 777, 20000, 1, 30000, 2000, 4000] {
            let range = end..(end + len).min(LEN);
            let ops_before = storage.op_count() as usize;
            fill.will_write(range.clone());
            for op in storage.ops().iter().skip(ops_before) {
                assert!(
                    op.kind != OpKind::FillZeros || op.offset >= range.end + REACH.gap,
                    "a fill starts `gap` past the records: {op:?}, records end at {}",
                    range.end
                );
            }
            file.write_at(
                range.start,
                &vec![RECORD; (range.end - range.start) as usize],
            )
            .unwrap();
            end = range.end;
            let bytes = contents(file.as_ref());
            assert_eq!(bytes.len() as u64, LEN, "fills never extend the file");
            assert!(all(&bytes, 0..end, RECORD), "no zeros over records");
            let filled = (end + REACH.gap)..(end + REACH.ahead - REACH.chunk);
            assert!(all(&bytes, filled, 0), "filled ahead of {end}");
            assert!(
                all(&bytes, (end + REACH.ahead)..LEN, MARK),
                "nothing filled more than `ahead` past {end}"
            );
        }
        assert!(
            all(&contents(file.as_ref()), end..LEN, 0),
            "filled to the file's end"
        );
    }

    #[test]
    fn after_a_switch_the_new_file_is_filled_ahead_of_its_own_records() {
        let (storage, old, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, false);
        // The old file's records end far in, its fills further still.
        fill.will_write(0..30_000);
        old.write_at(0, &[RECORD; 30_000]).unwrap();
        fill.will_truncate(30_000);
        old.set_len(30_000).unwrap();
        let path = Path::new("/s/2.seg");
        let new = storage.open(path, OpenMode::CreateNew).unwrap();
        new.append(&[MARK; LEN as usize]).unwrap();
        new.sync_data().unwrap();
        fill.switch_to(storage.open(path, OpenMode::Append).unwrap(), 0, LEN);
        fill.will_write(0..100);
        let bytes = contents(new.as_ref());
        let filled = (100 + REACH.gap)..(100 + REACH.ahead - REACH.chunk);
        assert!(all(&bytes, filled, 0), "filled ahead of the new records");
        assert!(
            all(&bytes, (100 + REACH.ahead)..LEN, MARK),
            "nothing filled more than `ahead` past them"
        );
    }

    /// DESIGN.md, "Zero-filled segments": with `step` the extension step,
    /// fills cover `[end + step/4, end + step)` in chunks of `step/16`.
    #[test]
    fn fills_reach_from_a_quarter_step_to_a_step_ahead_in_sixteenths() {
        let step = 4 << 20;
        assert_eq!(
            Reach::new(step),
            Reach {
                gap: step / 4,
                ahead: step,
                chunk: step / 16,
            }
        );
    }

    /// The filling thread starts a chunk on the cue the sync gate gives
    /// after each sync of the log (DESIGN.md, "Zero-filled
    /// segments", When).
    #[test]
    fn a_sync_through_the_gate_cues_the_filling_thread() {
        let (storage, file, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, true);
        let gate = crate::log::sync_gate::SyncGate::new(Some(Box::new(fill.cue())));
        storage.pause_next(OpKind::FillZeros);
        gate.sync(file.as_ref()).unwrap();
        let paused = storage.wait_until_paused(TIMEOUT);
        storage.resume();
        assert!(paused.is_some(), "a chunk is filled after the sync");
    }

    /// Holds the filling thread in the write of its first chunk, runs
    /// `call` on another thread, and asserts that it returns only once the
    /// chunk is let go.
    fn assert_waits_for_the_chunk_being_filled(
        storage: &FaultyStorage,
        fill: &ZeroFill,
        call: impl FnOnce() + Send,
    ) {
        storage.pause_next(OpKind::FillZeros);
        fill.cue()();
        storage
            .wait_until_paused(TIMEOUT)
            .expect("a chunk is being filled");
        let is_through = AtomicBool::new(false);
        std::thread::scope(|scope| {
            let caller = scope.spawn(|| {
                call();
                is_through.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(100));
            let is_early = is_through.load(Ordering::SeqCst);
            storage.resume();
            caller.join().unwrap();
            assert!(!is_early, "it waits for the chunk");
        });
    }

    #[test]
    fn a_writer_waits_for_a_chunk_being_filled_where_it_writes() {
        let (storage, _file, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, true);
        assert_waits_for_the_chunk_being_filled(&storage, &fill, || {
            fill.will_write(0..REACH.gap + 1);
        });
    }

    #[test]
    fn a_cut_waits_for_the_chunk_being_filled_and_nothing_is_filled_past_it() {
        let (storage, file, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, true);
        assert_waits_for_the_chunk_being_filled(&storage, &fill, || fill.will_truncate(100));
        file.set_len(100).unwrap();
        fill.extended(50);
        fill.cue()();
        drop(fill);
        assert_eq!(file.len().unwrap(), 100, "no fill past the cut");
    }

    #[test]
    fn a_failed_fill_stops_the_filling_and_the_writers_next_sync_fails() {
        let (storage, file, filler) = setup();
        let fill = ZeroFill::start(filler, 0, LEN, REACH, false);
        file.write_at(0, &[RECORD; 10]).unwrap();
        storage.inject(crate::storage::Fault::new(
            OpKind::SyncData,
            crate::storage::FaultError::Io,
        ));
        fill.will_write(10..20);
        let fills = |ops: &[crate::storage::OpRecord]| {
            ops.iter().filter(|o| o.kind == OpKind::FillZeros).count()
        };
        let after_failure = fills(&storage.ops());
        assert_eq!(after_failure, 1, "the failed chunk's write, then none");
        fill.will_write(20..3000);
        assert_eq!(fills(&storage.ops()), after_failure, "filling stopped");
        // The filler's failed sync dropped the record's write-back: the
        // writer's handle hears of it.
        assert!(file.sync_data().is_err());
        assert!(file.sync_data().is_ok(), "once");
    }
}
