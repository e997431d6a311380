//! `apply_batch`: plan against the index, encode one record, write it,
//! apply it to the index, then wait for the group sync.

use std::sync::Arc;

use super::group_commit::SyncHooks;
use super::{PlanView, Store};
use crate::apply::classify::hash_batch;
use crate::apply::plan::{PlanOptions, plan};
use crate::batch::{Batch, BatchReport};
use crate::error::{Error, Result, Shown, display_id};
use crate::format::record::{self, KIND_BATCH, QuarantineView};
use crate::format::segment::FRAME_HEADER_LEN;
use crate::format::{ID_BYTES_MAX, POSITION_BYTES_MAX, RECORD_BODY_BYTES_MAX};
use crate::index::expiry::COMMIT_MS_MAX;
use crate::log::names::segment_file_name;
use crate::options::Durability;

/// The smallest record whose seen ids a writer applies while the disk
/// writes it back ahead of the sync. For a lone writer of 1,000-delivery
/// batches (130 KB records) that overlap saved 2-7% of a durable run; for
/// 10-delivery batches it saved nothing, and with 8 such writers the extra
/// index lock per batch cost 10% (DESIGN.md, "Write path").
const OVERLAP_RECORD_BYTES_MIN: u64 = 32 << 10;

fn invalid_batch(batch: &Batch, reason: impl Into<String>) -> Error {
    Error::InvalidBatch {
        batch_id: display_id(batch.id()),
        reason: reason.into(),
    }
}

/// Checks what belongs to the batch as a whole.
fn validate(batch: &Batch) -> Result<()> {
    if batch.id().is_empty() {
        return Err(invalid_batch(batch, "empty batch id"));
    }
    if batch.id().len() > ID_BYTES_MAX {
        return Err(invalid_batch(
            batch,
            format!("batch id longer than {ID_BYTES_MAX} bytes"),
        ));
    }
    for (source, position) in batch.checkpoints() {
        if source.is_empty() || source.len() > ID_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!(
                    "checkpoint source {} is {} bytes; it must be 1 to {ID_BYTES_MAX}",
                    Shown(&display_id(source)),
                    source.len()
                ),
            ));
        }
        if position.len() > POSITION_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!(
                    "checkpoint position of source {} is {} bytes, over {POSITION_BYTES_MAX}",
                    Shown(&display_id(source)),
                    position.len()
                ),
            ));
        }
    }
    Ok(())
}

impl Store {
    /// Applies a batch: all of it in one log record, or nothing.
    ///
    /// Each delivery is counted once in the report (SPEC section 3). A batch
    /// id that already committed with the same content returns the stored
    /// report with `replayed = true` and changes nothing. Under
    /// `Durability::Sync` the batch is on stable storage when this returns.
    ///
    /// ```
    /// # fn main() -> Result<(), idemkv::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = idemkv::Store::open(dir.path(), idemkv::Options::default())?;
    /// let batch = idemkv::Batch::new("B1").put("e1", "k", 1, "v").add("e2", "visits", 1, 5);
    /// let first = store.apply_batch(&batch)?;
    /// assert_eq!((first.inserted, first.added, first.replayed), (1, 1, false));
    /// let again = store.apply_batch(&batch)?;
    /// assert!(again.replayed);
    /// assert_eq!(&store.get("visits")?.unwrap().value[..], b"5");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `ConflictingEvent` / `InvalidEvent` under `OnConflict::Fail`,
    /// `BatchConflict` for a reused batch id, `InvalidBatch` for a bad batch
    /// id or checkpoint, `Io` or `Poisoned` when the disk fails. On any error
    /// nothing of the batch is applied. After a failed sync the disk may
    /// still have written the batch's record, so a later `open` may find
    /// the batch committed. Apply it again after reopening: if it did
    /// commit, that is a replay.
    pub fn apply_batch(&self, batch: &Batch) -> Result<BatchReport> {
        validate(batch)?;
        let (content_hash, hashes) = hash_batch(batch);
        let mut guard = self.writer.lock();
        let writer = &mut *guard;
        self.commit.check()?;

        let (planned, committed_ms) = {
            let index = self.publisher.read_for_planning(&self.index);
            // The log's clock never goes back, whatever the clock says.
            let now_ms = self
                .options
                .clock
                .now_ms()
                .max(index.log_time_ms)
                .max(writer.pending.log_time_ms());
            if now_ms > COMMIT_MS_MAX {
                return Err(Error::ClockOutOfRange {
                    now_ms,
                    max_ms: COMMIT_MS_MAX,
                });
            }
            let pending = writer
                .pending
                .overlay(&index, batch.id(), batch.deliveries(), &hashes);
            let committed = match pending.batches.get(batch.id()) {
                Some(_) => pending.batch_at(batch.id(), now_ms),
                None => index.batch_at(batch.id(), now_ms),
            };
            if let Some(committed) = committed {
                if committed.content_hash != content_hash {
                    return Err(Error::BatchConflict {
                        batch_id: display_id(batch.id()),
                    });
                }
                let report = BatchReport {
                    replayed: true,
                    ..committed.report
                };
                drop(index);
                // The original may still be waiting for its sync.
                let lsn = self.commit.written_lsn();
                drop(guard);
                self.wait_durable(lsn)?;
                return Ok(report);
            }
            let options = PlanOptions {
                on_conflict: self.options.on_conflict,
                value_bytes_max: self.options.value_bytes_max,
            };
            let view = PlanView {
                index: &index,
                pending,
                maps: &self.maps,
                now_ms,
            };
            let planned = plan(batch, &hashes, &view, options)?;
            // Refused before it is logged: a record whose keys the index
            // could not take would fail every replay of it too.
            let new_key_bytes = planned.new_key_bytes + writer.pending.new_key_bytes();
            if !index.keys.has_room_for(new_key_bytes) {
                return Err(invalid_batch(
                    batch,
                    format!(
                        "the key index is full: its new keys need {} bytes of key records, \
                         past the room kept below 16 GiB",
                        planned.new_key_bytes
                    ),
                ));
            }
            (planned, now_ms)
        };

        let mut buf = writer.log.begin();
        record::encode_batch_head(
            &mut buf,
            batch.id(),
            content_hash,
            committed_ms,
            planned.report.counts(),
        );
        record::encode_seen(&mut buf, &planned.seen);
        record::encode_writes_count(&mut buf, planned.writes.len());
        for w in &planned.writes {
            record::encode_write(&mut buf, w.key, w.seq, w.op);
        }
        record::encode_checkpoints(
            &mut buf,
            batch.checkpoints().iter().map(|(s, p)| (&s[..], &p[..])),
        );
        let rejects: Vec<QuarantineView<'_>> = planned
            .rejects
            .iter()
            .map(|r| QuarantineView {
                index: r.index,
                event_id: r.event_id,
                reason: r.reason.as_bytes(),
            })
            .collect();
        record::encode_quarantine(&mut buf, &rejects);
        record::encode_adds(&mut buf, &planned.adds);
        let body_len = buf.len() - FRAME_HEADER_LEN;
        if body_len > RECORD_BODY_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!("record of {body_len} bytes exceeds {RECORD_BODY_BYTES_MAX}"),
            ));
        }

        let placed = writer
            .log
            .place(&mut buf, KIND_BATCH, self.sync_claim())
            .inspect_err(|e| self.poison("segment rotation failed", e))?;
        if let Some(file) = &placed.new_segment {
            // Sealing the old segment synced everything before this record.
            self.publish_locked(writer, placed.lsn_start);
            let path = self.dir.join(segment_file_name(placed.segment));
            let map = file
                .map(self.maps_reserve())
                .map_err(|e| Error::io("map", path, e))
                .inspect_err(|e| self.poison("map failed", e))?;
            self.maps.insert(placed.segment, Arc::clone(file), map);
        }
        // Decode what we are about to write with recovery's decoder, so that
        // a record that would not replay is never written; only the value
        // CRCs, computed from these very bytes a moment ago, are not
        // computed again (`decode_own_batch`).
        let body = buf.get(FRAME_HEADER_LEN..).unwrap_or_default();
        let written = record::decode_own_batch(body).map_err(|e| {
            invalid_batch(batch, format!("encoded record fails to decode: {}", e.what))
        })?;
        let lsn_end = writer
            .log
            .write(&buf, &placed)
            .inspect_err(|e| self.poison("append failed", e))?;
        match self.options.durability {
            Durability::Buffered => self.publisher.publish_decoded(
                &self.index,
                &written,
                body,
                placed.segment,
                placed.body_at,
            ),
            Durability::Sync => {
                // A large record with nothing pending before it (a lone
                // writer's): the disk starts on it while its seen ids, which
                // no reader sees, go into the index, unless the publishing
                // thread is to apply them after the caller returns. In log
                // order: every earlier record is published, and later ones
                // apply theirs when they are. The rest waits for the sync,
                // in `pending`.
                let is_lone_large =
                    placed.record_len >= OVERLAP_RECORD_BYTES_MIN && writer.pending.is_empty();
                if is_lone_large {
                    writer.log.start_write_back(&placed);
                }
                let is_early = is_lone_large && !self.publisher.would_hand_off(body.len());
                if is_early {
                    self.index.write().apply_seen(&written);
                }
                writer.pending.push(
                    body,
                    written.committed_ms,
                    placed.segment,
                    placed.body_at,
                    lsn_end,
                    is_early,
                    planned.new_key_bytes,
                );
            }
        }
        self.commit.written(lsn_end, writer.log.active_file());
        drop(written);
        writer.log.finish(buf);
        let snapshot_due = self.is_snapshot_due(writer);
        drop(guard);

        self.wait_durable(lsn_end)?;
        if snapshot_due {
            self.snapshot_if_due();
        }
        Ok(planned.report)
    }

    /// How far the log is synced, if syncs are what make batches durable.
    fn sync_claim(&self) -> Option<u64> {
        match self.options.durability {
            Durability::Sync => Some(self.commit.synced_lsn()),
            Durability::Buffered => None,
        }
    }

    fn wait_durable(&self, lsn: u64) -> Result<()> {
        match self.options.durability {
            Durability::Sync => self.commit.wait_durable(lsn, self),
            Durability::Buffered => Ok(()),
        }
    }

    /// Refuses further writes after a failed write or sync. A failed sync
    /// may have dropped dirty pages that still read back from the page
    /// cache, so it also leaves a note for the next `open`, which then
    /// rewrites the newest segment (best effort: the disk is failing).
    pub(super) fn poison(&self, what: &str, error: &Error) {
        self.commit.poison(format!("{what}: {error}"));
        if matches!(error, Error::Io { op: "sync", .. }) {
            self.note_sync_failure();
        }
    }

    fn note_sync_failure(&self) {
        crate::recovery::note_sync_failure(self.options.storage.as_ref(), &self.dir);
    }

    /// As `publish`, for a caller that holds the writer lock; also notes `lsn` as durable.
    pub(super) fn publish_locked(&self, writer: &mut super::Writer, lsn: u64) {
        let published = writer.pending.take_published(lsn);
        self.publisher.publish(&self.index, published);
        self.commit.durable(lsn);
    }

    pub(super) fn maps_reserve(&self) -> u64 {
        self.options
            .segment_bytes_max
            .saturating_add(super::MAP_SLACK_BYTES)
    }
}

impl SyncHooks for Store {
    /// Publishes the pending batches up to `lsn` (now durable).
    fn published(&self, lsn: u64) {
        let mut writer = self.writer.lock();
        self.publish_locked(&mut writer, lsn);
    }

    fn sync_failed(&self) {
        self.note_sync_failure();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Options;

    /// A key of 4,096 bytes: its record takes 4,124 bytes of the key index.
    fn long_key(i: usize) -> String {
        format!("{i:04}").repeat(1024)
    }

    /// A batch that puts `keys` (by `long_key` number), as events of its own.
    fn putting(id: &str, keys: std::ops::Range<usize>) -> Batch {
        keys.fold(Batch::new(id), |b, i| {
            b.put(format!("{id}-{i}"), long_key(i), 1, "v")
        })
    }

    fn is_full(result: &Result<BatchReport>) -> bool {
        matches!(result, Err(Error::InvalidBatch { reason, .. })
            if reason.starts_with("the key index is full"))
    }

    #[test]
    fn a_batch_whose_new_keys_the_index_cannot_take_is_refused_before_it_is_logged() {
        for durability in [Durability::Buffered, Durability::Sync] {
            let dir = tempfile::tempdir().unwrap();
            let options = Options::default().durability(durability);
            let store = Store::open(dir.path(), options.clone()).unwrap();
            // Three chunks of 256 KiB, of which two may be held (63 such
            // keys fill one): a batch of new keys is refused once the
            // second is opened, by the seventh batch.
            store.index.write().keys.limit_arena_chunks(3);
            let mut held = 0;
            let refused = loop {
                let batch = putting(&format!("B{held}"), held..held + 10);
                match store.apply_batch(&batch) {
                    Ok(_) => held += 10,
                    refused => break refused,
                }
                assert!(held <= 80, "{durability:?}: keys past the limit were taken");
            };
            assert!(is_full(&refused), "{durability:?}: {refused:?}");
            assert_eq!(held, 70, "{durability:?}");
            let records = store.verify().unwrap().records;
            assert_eq!(
                store.log().len(),
                7,
                "{durability:?}: the refused batch is not held"
            );
            // Keys the index holds take no room: updates still commit.
            let update = Batch::new("update").put("u", long_key(0), 2, "w");
            assert_eq!(store.apply_batch(&update).unwrap().updated, 1);
            assert_eq!(store.verify().unwrap().records, records + 1);
            store.close().unwrap();

            let store = Store::open(dir.path(), options).unwrap();
            assert_eq!(store.stats().live_keys, 70, "{durability:?}");
            assert_eq!(&store.get(long_key(0)).unwrap().unwrap().value[..], b"w");
            assert!(store.get(long_key(70)).unwrap().is_none());
        }
    }

    #[cfg(feature = "testing")]
    #[test]
    fn the_new_keys_of_batches_waiting_for_their_sync_count_against_the_room() {
        use std::time::Duration;

        use crate::storage::{FaultyStorage, OpKind};

        let storage = FaultyStorage::new();
        let options = Options::default()
            .storage(Arc::new(storage.clone()))
            .durability(Durability::Sync)
            // The held sync is A's commit sync.
            .zero_fill(false);
        let store = Store::open("/db", options).unwrap();
        // One chunk of 256 KiB may be held: 40 such keys fit, 80 do not.
        store.index.write().keys.limit_arena_chunks(2);
        storage.pause_next(OpKind::SyncData);
        std::thread::scope(|scope| {
            let a = scope.spawn(|| store.apply_batch(&putting("A", 0..40)));
            let held = storage.wait_until_paused(Duration::from_secs(20));
            // Refused at once; taken, it would wait for the held sync.
            let b = scope.spawn(|| store.apply_batch(&putting("B", 40..80)));
            let waited = std::time::Instant::now();
            while !b.is_finished() && waited.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(1));
            }
            storage.resume();
            assert!(held.is_some(), "A's commit sync was held");
            let b = b.join().unwrap();
            assert!(is_full(&b), "B planned while A was pending: {b:?}");
            assert_eq!(a.join().unwrap().unwrap().inserted, 40);
        });
        assert_eq!(store.stats().live_keys, 40);
    }
}
