//! Applying written records to the index on a thread of the store's own.
//!
//! A batch becomes visible when its record is applied to the index (under
//! `Durability::Sync`, once a sync covered it). For W1's 1,000-delivery
//! batches that is a third of `apply_batch`'s CPU time, and the batch's
//! caller need not wait for it: it only needs whoever reads next to see
//! the batch. So the writer takes the index's write lock and hands the
//! lock, with the records, to this thread, then returns. Every reader, and
//! the next batch's planning, waits for the lock as it would have waited
//! for the application; meanwhile the caller does its own work (reads and
//! parses its next batch) on another core.
//!
//! A caller that calls again at once gains nothing: its next batch waits
//! for the lock, and the wake-ups and the index's cache lines moving
//! between cores made such a caller's W1 10-15% slower; so did `idemkv
//! ingest`, which read its checkpoint back after each batch, by 12-20%. So
//! the writer notes, as it plans, whether the thread is still applying the
//! last handoff ([`Publisher::read_for_planning`]), and so does a read by
//! the thread that handed it off ([`Publisher::read`]); after
//! `OVERTAKEN_IN_A_ROW` such handoffs, the writer applies the next records
//! on its own thread, then tries a handoff again ([`Pace`]). Reads from
//! other threads do not count: they would wait for an application on the
//! writer's thread just the same.
//!
//! Records that together come to less than `HANDOFF_BYTES_MIN` are applied
//! on the caller's thread: waking this one would cost more than applying
//! them.
//!
//! At most one handoff is outstanding: the next needs the write lock, which
//! the thread holds until it has applied the last one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, channel};
use std::thread::{JoinHandle, ThreadId};

use parking_lot::lock_api::ArcRwLockWriteGuard;
use parking_lot::{Mutex, RawRwLock, RwLock, RwLockReadGuard};

use super::group_commit::GroupCommit;
use crate::format::record::{BatchRecord, decode_own_batch};
use crate::index::Index;

/// Records under this many bytes, together, are applied on the caller's
/// thread.
const HANDOFF_BYTES_MIN: usize = 32 << 10;

/// Handoffs overtaken in a row before records are applied on the caller's
/// thread: one alone may just have been long (a rebuild of the seen ids'
/// filter).
const OVERTAKEN_IN_A_ROW: u32 = 2;

/// Records applied on the caller's thread after handoffs were overtaken,
/// at first and at most: the run doubles each time the handoff that ends
/// it is overtaken too.
const INLINE_RUN_MIN: u32 = 8;
const INLINE_RUN_MAX: u32 = 256;

/// One record written to the log, to be applied to the index.
#[derive(Debug)]
pub(crate) struct Record {
    pub segment: u32,
    pub body_at: u32,
    pub body: Vec<u8>,
    /// The writer applied its seen ids to the index already.
    pub is_seen_applied: bool,
}

impl Record {
    /// Applies the record to `target` (over `under`, for a shadow of it),
    /// but not the seen ids the writer applied to the index already: a
    /// shadow needs none of those either, since a planner that misses an
    /// id there finds it in the index.
    pub(crate) fn apply(
        &self,
        target: &mut Index,
        under: Option<&Index>,
    ) -> Result<(), &'static str> {
        let record = decode_own_batch(&self.body).map_err(|e| e.what)?;
        if self.is_seen_applied {
            target.apply_visible(&record, self.segment, self.body_at, under)
        } else {
            target.apply_record(&record, self.segment, self.body_at, under)
        }
    }
}

fn apply_all(index: &mut Index, records: &[Record]) -> Result<(), &'static str> {
    records.iter().try_for_each(|r| r.apply(index, None))
}

/// Records handed to the thread, with the index's write lock.
struct Handoff {
    index: ArcRwLockWriteGuard<RawRwLock, Index>,
    records: Vec<Record>,
}

/// Whether to hand records off, from how the last handoffs went.
#[derive(Debug, Default)]
struct Pace {
    /// The last records published were handed off, and no planning has
    /// looked since whether the thread was done with them.
    is_unchecked: bool,
    overtaken_in_a_row: u32,
    /// The run of records applied on the caller's thread after the last
    /// overtaken handoffs (0 after one that was not overtaken).
    inline_run: u32,
    /// Records of that run still to apply there.
    inline_left: u32,
    /// The thread that made the last handoff: the caller it returned to.
    handed_by: Option<ThreadId>,
}

impl Pace {
    /// The index is wanted (a batch is being planned, or the caller the
    /// last handoff returned to reads); `is_busy`: the thread is still
    /// applying the last handoff.
    fn wanted(&mut self, is_busy: bool) {
        if !std::mem::take(&mut self.is_unchecked) {
            return;
        }
        if is_busy {
            self.overtaken_in_a_row += 1;
            if self.overtaken_in_a_row >= OVERTAKEN_IN_A_ROW {
                self.inline_run = (self.inline_run * 2).clamp(INLINE_RUN_MIN, INLINE_RUN_MAX);
                self.inline_left = self.inline_run;
            }
        } else {
            self.overtaken_in_a_row = 0;
            self.inline_run = 0;
        }
    }

    /// Whether records of `bytes` together would go to the thread now.
    fn would_hand_off(&self, bytes: usize) -> bool {
        bytes >= HANDOFF_BYTES_MIN && self.inline_left == 0
    }

    /// Whether records of `bytes` together go to the thread (noted as
    /// handed off if so).
    fn hands_off(&mut self, bytes: usize) -> bool {
        if bytes < HANDOFF_BYTES_MIN {
            return false;
        }
        if self.inline_left > 0 {
            self.inline_left -= 1;
            return false;
        }
        self.is_unchecked = true;
        true
    }
}

/// Publishes written records: applies them to the index on the writer's
/// thread, or hands them with the index's write lock to a thread of its own.
pub(super) struct Publisher {
    /// `None` if the thread could not be spawned: every record is then
    /// applied on the caller's thread.
    handoffs: Option<Sender<Handoff>>,
    thread: Option<JoinHandle<()>>,
    /// Set from a handoff until the thread has applied it.
    is_busy: Arc<AtomicBool>,
    /// Taken by writers, under the writer lock, and by readers while the
    /// thread applies a handoff; never across anything but its own fields.
    pace: Mutex<Pace>,
}

impl Publisher {
    /// Starts the thread. A record that fails to apply there (or panics)
    /// poisons `commit`: the index is no longer the log's.
    pub(super) fn new(commit: Arc<GroupCommit>) -> Self {
        let (handoffs, received) = channel::<Handoff>();
        let is_busy = Arc::new(AtomicBool::new(false));
        let is_busy_there = Arc::clone(&is_busy);
        let thread = std::thread::Builder::new()
            .name("idemkv-publish".into())
            .spawn(move || {
                let mut has_failed = false;
                for Handoff { mut index, records } in received {
                    // After a failure nothing more goes in: the store
                    // refuses writes from then on.
                    if !has_failed && let Err(problem) = apply_caught(&mut index, &records) {
                        has_failed = true;
                        commit.poison(format!(
                            "applying a written batch to the index failed: {problem}"
                        ));
                    }
                    // Before the lock goes: the next handoff, which needs
                    // it, sets the flag again.
                    is_busy_there.store(false, Ordering::Release);
                    drop(index);
                }
            });
        Self {
            handoffs: thread.is_ok().then_some(handoffs),
            thread: thread.ok(),
            is_busy,
            pace: Mutex::default(),
        }
    }

    /// The index, read locked for planning a batch, once the thread has
    /// applied what it was handed. Notes first whether it is still at it
    /// (see the module doc). Called under the writer lock.
    pub(super) fn read_for_planning<'a>(
        &self,
        index: &'a RwLock<Index>,
    ) -> RwLockReadGuard<'a, Index> {
        self.pace
            .lock()
            .wanted(self.is_busy.load(Ordering::Acquire));
        index.read()
    }

    /// The index, read locked for a reader, once the thread has applied
    /// what it was handed. Notes a read that comes, while the thread is
    /// still at it, from the thread that handed it off (see the module doc).
    pub(super) fn read<'a>(&self, index: &'a RwLock<Index>) -> RwLockReadGuard<'a, Index> {
        if self.is_busy.load(Ordering::Acquire) {
            let mut pace = self.pace.lock();
            if pace.handed_by == Some(std::thread::current().id()) {
                pace.wanted(true);
            }
        }
        index.read()
    }

    /// Applies `records`, in log order, to `index`: on the thread or on
    /// the caller's (see the module doc). Either way, once this returns,
    /// no one reads the index without them: the thread holds its write
    /// lock until they are in. Called under the writer lock.
    ///
    /// # Panics
    /// If a record applied here does not apply: the writer planned it
    /// against this index and decoded it before writing it.
    pub(super) fn publish(&self, index: &Arc<RwLock<Index>>, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let bytes = records.iter().map(|r| r.body.len()).sum();
        match self.hands_off(bytes) {
            Some(to) => self.hand_off(to, index, records),
            None => apply_all(&mut index.write(), &records)
                .expect("a written record applies in log order"),
        }
    }

    /// As `publish`, for one record just written, which the writer has
    /// decoded already (`record`, from `body`): applied here, it is
    /// neither copied nor decoded again.
    ///
    /// # Panics
    /// As `publish`.
    pub(super) fn publish_decoded(
        &self,
        index: &Arc<RwLock<Index>>,
        record: &BatchRecord<'_>,
        body: &[u8],
        segment: u32,
        body_at: u32,
    ) {
        match self.hands_off(body.len()) {
            Some(to) => {
                let record = Record {
                    segment,
                    body_at,
                    body: body.to_vec(),
                    is_seen_applied: false,
                };
                self.hand_off(to, index, vec![record]);
            }
            None => index
                .write()
                .apply_record(record, segment, body_at, None)
                .expect("a planned record applies to the index it was planned against"),
        }
    }

    /// Whether records of `bytes` together would go to the thread if
    /// published now.
    pub(super) fn would_hand_off(&self, bytes: usize) -> bool {
        self.handoffs.is_some() && self.pace.lock().would_hand_off(bytes)
    }

    /// Where records of `bytes` together go, if they go to the thread.
    fn hands_off(&self, bytes: usize) -> Option<&Sender<Handoff>> {
        let to = self.handoffs.as_ref()?;
        let mut pace = self.pace.lock();
        let hands_off = pace.hands_off(bytes);
        if hands_off {
            pace.handed_by = Some(std::thread::current().id());
        }
        hands_off.then_some(to)
    }

    fn hand_off(&self, to: &Sender<Handoff>, index: &Arc<RwLock<Index>>, records: Vec<Record>) {
        let handoff = Handoff {
            index: index.write_arc(),
            records,
        };
        self.is_busy.store(true, Ordering::Release);
        to.send(handoff)
            .expect("the thread runs until the publisher is dropped");
    }
}

impl Drop for Publisher {
    /// Lets the thread apply what it was handed, then ends it.
    fn drop(&mut self) {
        drop(self.handoffs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// `apply_all`, with a panic turned into an error: the thread must go on
/// releasing the locks it is handed.
fn apply_caught(index: &mut Index, records: &[Record]) -> Result<(), &'static str> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply_all(index, records)))
        .unwrap_or(Err("it panicked"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{self, ValueSource, WriteSource};
    use crate::index::expiry::Ttls;
    use crate::log::sync_gate::SyncGate;

    const LARGE: usize = HANDOFF_BYTES_MIN;

    /// Whether the next large record goes to the thread, as the writer
    /// foresees it when it writes the record and as it is decided.
    fn hands_off(pace: &mut Pace) -> bool {
        let foreseen = pace.would_hand_off(LARGE);
        let decided = pace.hands_off(LARGE);
        assert_eq!(foreseen, decided);
        decided
    }

    /// Runs `handoffs` handoffs of a caller whose planning finds the thread
    /// busy (`overtaken`) or not; returns how many records it applied on
    /// its own thread before each handoff.
    fn inline_runs(
        pace: &mut Pace,
        overtaken: impl Fn(usize) -> bool,
        handoffs: usize,
    ) -> Vec<u32> {
        let mut runs = Vec::new();
        for i in 0..handoffs {
            let mut inline = 0;
            while !hands_off(pace) {
                inline += 1;
                pace.wanted(false);
            }
            runs.push(inline);
            pace.wanted(overtaken(i));
        }
        runs
    }

    #[test]
    fn a_caller_that_leaves_the_thread_time_hands_off_every_large_record() {
        let mut pace = Pace::default();
        assert_eq!(inline_runs(&mut pace, |_| false, 50), vec![0; 50]);
        let small = LARGE - 1;
        assert!(
            !pace.would_hand_off(small) && !pace.hands_off(small),
            "small records stay"
        );
        pace.wanted(false);
        assert!(pace.hands_off(LARGE));
    }

    #[test]
    fn one_overtaken_handoff_alone_changes_nothing() {
        let mut pace = Pace::default();
        let runs = inline_runs(&mut pace, |i| i % 2 == 0, 20);
        assert_eq!(runs, vec![0; 20]);
    }

    #[test]
    fn a_caller_that_overtakes_the_thread_applies_runs_that_double_up_to_the_longest() {
        let mut pace = Pace::default();
        let runs = inline_runs(&mut pace, |_| true, 10);
        assert_eq!(runs, vec![0, 0, 8, 16, 32, 64, 128, 256, 256, 256]);
        // A handoff that finds the caller away again ends it.
        let mut pace = Pace::default();
        let runs = inline_runs(&mut pace, |i| !(3..6).contains(&i), 10);
        assert_eq!(runs, vec![0, 0, 8, 16, 0, 0, 0, 0, 8, 16]);
    }

    /// A key of 4,096 bytes: its record takes 4,124 bytes of the key index.
    fn long_key(k: usize) -> Vec<u8> {
        format!("{k:04}").repeat(1024).into_bytes()
    }

    /// A record that puts `keys` (by `long_key` number).
    fn record_putting(keys: std::ops::Range<usize>) -> Record {
        let mut body = Vec::new();
        let counts = [keys.len() as u64, 0, 0, 0, 0, 0, 0, 0];
        record::encode_batch_head(&mut body, b"B", 7, 1_000, counts);
        record::encode_seen(&mut body, &[]);
        record::encode_writes_count(&mut body, keys.len());
        for k in keys {
            let value = WriteSource::Put(ValueSource::Bytes(b"v"));
            record::encode_write(&mut body, &long_key(k), 1, value);
        }
        record::encode_checkpoints(&mut body, std::iter::empty());
        record::encode_quarantine(&mut body, &[]);
        record::encode_adds(&mut body, &[]);
        Record {
            segment: 1,
            body_at: 32,
            body,
            is_seen_applied: false,
        }
    }

    fn index() -> Arc<RwLock<Index>> {
        Arc::new(RwLock::new(Index::new(Ttls {
            seen_ms: None,
            batch_ms: None,
            tombstone_ms: None,
        })))
    }

    #[test]
    fn records_handed_off_are_in_the_index_for_its_next_reader() {
        let commit = Arc::new(GroupCommit::new(Arc::new(SyncGate::new(None))));
        let publisher = Publisher::new(Arc::clone(&commit));
        let index = index();
        for round in 0..20 {
            let keys = round * 10..round * 10 + 10;
            publisher.pace.lock().is_unchecked = false;
            publisher.publish(&index, vec![record_putting(keys.clone())]);
            assert!(
                publisher.pace.lock().is_unchecked,
                "round {round} handed off"
            );
            let index = index.read();
            assert!(
                keys.map(long_key).all(|k| index.keys.get(&k).is_some()),
                "round {round}"
            );
        }
        assert!(commit.check().is_ok());
    }

    #[test]
    fn only_the_handing_thread_s_reads_while_the_thread_applies_count_as_overtaking() {
        let commit = Arc::new(GroupCommit::new(Arc::new(SyncGate::new(None))));
        for is_same_thread in [true, false] {
            let publisher = Publisher::new(Arc::clone(&commit));
            let index = index();
            for round in 0..OVERTAKEN_IN_A_ROW as usize {
                let keys = round * 10..round * 10 + 10;
                publisher.publish(&index, vec![record_putting(keys)]);
                drop(index.write());
                // As if the thread were still applying it when read.
                publisher.is_busy.store(true, Ordering::Release);
                if is_same_thread {
                    drop(publisher.read(&index));
                } else {
                    std::thread::scope(|s| s.spawn(|| drop(publisher.read(&index))).join())
                        .expect("read");
                }
                publisher.is_busy.store(false, Ordering::Release);
            }
            assert_eq!(
                publisher.pace.lock().inline_left,
                if is_same_thread { INLINE_RUN_MIN } else { 0 },
                "reads from the handing thread: {is_same_thread}"
            );
            // A planning later finds nothing left to check.
            drop(publisher.read_for_planning(&index));
            assert!(publisher.would_hand_off(LARGE) != is_same_thread);
        }
    }

    #[test]
    fn a_record_that_fails_to_apply_on_the_thread_poisons_the_store_and_the_lock_goes() {
        let commit = Arc::new(GroupCommit::new(Arc::new(SyncGate::new(None))));
        let publisher = Publisher::new(Arc::clone(&commit));
        let index = index();
        // One chunk of 256 KiB, which 63 such keys fill.
        index.write().keys.limit_arena_chunks(1);
        publisher.publish(&index, vec![record_putting(0..70)]);
        drop(index.read());
        let refused = commit.check().expect_err("poisoned");
        assert!(
            refused
                .to_string()
                .contains("applying a written batch to the index failed"),
            "{refused}"
        );
        // Later handoffs are not applied over the broken index, and still
        // release the lock.
        publisher.publish(&index, vec![record_putting(100..110)]);
        assert!(index.write().keys.get(&long_key(100)).is_none());
    }
}
