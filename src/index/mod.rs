//! In-memory state rebuilt from the log: keys, seen event ids, the batch
//! registry, checkpoints, the quarantine and the counters' add marks. No I/O
//! happens here.
//!
//! Invariant: the index equals the result of applying every committed record,
//! in log order, with [`Index::apply_record`]; live commits and recovery both
//! go through that one function. (Under `Sync`, a large record's seen ids
//! may go in before it is durable, with `apply_seen`, and the rest once it
//! is, with `apply_visible`: see `store/pending.rs`.) Expiry decisions
//! depend only on the records' commit times, never on when memory was
//! purged.

pub(crate) mod add_marks;
pub(crate) mod addr_table;
pub(crate) mod batches;
pub(crate) mod expiry;
pub(crate) mod id_filter;
pub(crate) mod keys;
pub(crate) mod seen;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::batch::{BatchReport, QuarantineEntry};
use crate::format::record::{BatchRecord, WriteView};
use crate::hashing::{FINGERPRINT_BYTES_MAX, Fingerprint};
use crate::log::segments::ValueRef;
use add_marks::AddMarks;
use batches::{BatchEntry, BatchRegistry};
use expiry::{COMMIT_MS_MAX, Ttls, is_expired, to_secs_ceil};
use keys::{KeyEntry, KeyHash, KeyIndex, KeyState};
use seen::SeenIndex;

/// How many entries ahead a batch's index lookups prefetch: far enough for
/// a cache miss to resolve, near enough that the lines are still cached.
pub(crate) const PREFETCH_AHEAD: usize = 8;

/// The key hashes of the writes from the one applied now to the one
/// prefetched furthest ahead, by write number.
#[derive(Default)]
struct HashRing([KeyHash; 2 * PREFETCH_AHEAD]);

impl HashRing {
    fn put(&mut self, i: usize, hash: KeyHash) {
        if let Some(slot) = self.0.get_mut(i % (2 * PREFETCH_AHEAD)) {
            *slot = hash;
        }
    }

    fn at(&self, i: usize) -> KeyHash {
        self.0
            .get(i % (2 * PREFETCH_AHEAD))
            .copied()
            .unwrap_or_default()
    }
}

/// Everything the store knows in memory.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub ttls: Ttls,
    /// The latest commit time applied: the log's clock, which never goes back.
    pub log_time_ms: u64,
    pub keys: KeyIndex,
    pub seen: SeenIndex,
    pub batches: BatchRegistry,
    pub checkpoints: BTreeMap<Bytes, Bytes>,
    pub quarantine: Vec<QuarantineEntry>,
    pub add_marks: AddMarks,
    /// Whether the records applied here fingerprint the values they put
    /// (`ValueRef::fingerprint`): the store's index does once it is open,
    /// on the thread that publishes; an open's replay does not (a million
    /// values hashed for comparisons that may never come), nor does the
    /// pending batches' shadow, which the writer builds on its own thread.
    pub fingerprints_values: bool,
}

/// What a purge dropped from memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Purged {
    pub seen_ids: u64,
    pub batch_ids: u64,
    pub tombstones: u64,
}

impl Index {
    /// An empty index with the given TTLs.
    pub(crate) fn new(ttls: Ttls) -> Self {
        Self {
            ttls,
            seen: SeenIndex::new(ttls.seen_ms),
            add_marks: AddMarks::new(ttls.seen_ms),
            ..Self::default()
        }
    }

    /// A key's entry as planning at `now_ms` sees it: an expired tombstone is no entry.
    pub(crate) fn key_at(&self, key: &[u8], now_ms: u64) -> Option<KeyEntry> {
        self.unexpired(self.keys.get(key), now_ms)
    }

    /// As `key_at`, for a key hashed by this index's keys.
    pub(crate) fn key_at_hashed(&self, key: &[u8], hash: KeyHash, now_ms: u64) -> Option<KeyEntry> {
        self.unexpired(self.keys.get_hashed(key, hash), now_ms)
    }

    fn unexpired(&self, entry: Option<KeyEntry>, now_ms: u64) -> Option<KeyEntry> {
        entry.filter(|e| !e.is_expired_tombstone(self.ttls.tombstone_ms, now_ms))
    }

    /// The committed batch with this id, unless its record has expired at `now_ms`.
    pub(crate) fn batch_at(&self, batch_id: &[u8], now_ms: u64) -> Option<BatchEntry<'_>> {
        self.batches
            .get(batch_id)
            .filter(|e| !is_expired(e.committed_ms, self.ttls.batch_ms, now_ms))
    }

    /// Applies one committed batch record whose body starts at `body_at` in
    /// `segment`. `under` is the index this one shadows, if any (the pending
    /// batches' effects shadow the published index): a version bump finds
    /// the unchanged value there, and a counter's add mark its history.
    ///
    /// Fails only if the record contradicts the index (a bump of a key with
    /// no live row, a commit time going back), which recovery reports as
    /// corruption. A batch id already registered is replaced: the writer only
    /// commits it again once the old entry expired, and the TTL it used may
    /// differ from the one this index was opened with.
    pub(crate) fn apply_record(
        &mut self,
        record: &BatchRecord<'_>,
        segment: u32,
        body_at: u32,
        under: Option<&Index>,
    ) -> Result<(), &'static str> {
        self.apply_visible(record, segment, body_at, under)?;
        self.apply_seen(record);
        Ok(())
    }

    /// Records a batch record's seen ids: the part of `apply_record` that no
    /// reader sees, which a writer applies while the disk writes the record
    /// back (`apply_visible` publishes the rest once it is durable). Records must
    /// come in log order here too: a later record may record an id again.
    pub(crate) fn apply_seen(&mut self, record: &BatchRecord<'_>) {
        self.seen.insert_batch(&record.seen, record.committed_ms);
    }

    /// Everything of `apply_record` but the seen ids.
    pub(crate) fn apply_visible(
        &mut self,
        record: &BatchRecord<'_>,
        segment: u32,
        body_at: u32,
        under: Option<&Index>,
    ) -> Result<(), &'static str> {
        let now_ms = record.committed_ms;
        if now_ms < self.log_time_ms {
            return Err("commit time earlier than the previous record's");
        }
        if now_ms > COMMIT_MS_MAX {
            // No writer makes one: it refuses such a clock (`ClockOutOfRange`).
            return Err("commit time past the latest the log records");
        }
        let at_secs = to_secs_ceil(now_ms);
        // A key lookup reads the table, then the record it points to: the
        // table lines are fetched `PREFETCH_AHEAD` writes ahead, the record
        // half as far. Each key is hashed once, into `hashes` (a ring).
        let mut hashes = HashRing::default();
        for (i, w) in record.writes.iter().enumerate().take(PREFETCH_AHEAD) {
            hashes.put(i, self.keys.hash(w.key));
        }
        for (i, w) in record.writes.iter().enumerate() {
            if let Some(ahead) = record.writes.get(i + PREFETCH_AHEAD) {
                let hash = self.keys.hash(ahead.key);
                self.keys.prefetch_hashed(hash);
                hashes.put(i + PREFETCH_AHEAD, hash);
            }
            if i + PREFETCH_AHEAD / 2 < record.writes.len() {
                self.keys
                    .prefetch_record_hashed(hashes.at(i + PREFETCH_AHEAD / 2));
            }
            let state = match w.op {
                WriteView::Put {
                    value,
                    value_at,
                    crc,
                } => {
                    let offset = u32::try_from(value_at)
                        .ok()
                        .and_then(|at| body_at.checked_add(at))
                        .ok_or("value offset out of range")?;
                    let len = u32::try_from(value.len()).map_err(|_| "value too long")?;
                    KeyState::Live(ValueRef {
                        segment,
                        offset,
                        len,
                        crc: Some(crc),
                        fingerprint: (self.fingerprints_values
                            && value.len() <= FINGERPRINT_BYTES_MAX)
                            .then(|| Fingerprint::of(value)),
                    })
                }
                WriteView::Delete => KeyState::Deleted { at_secs },
                WriteView::Bump => self
                    .keys
                    .get(w.key)
                    .or_else(|| under.and_then(|u| u.keys.get(w.key)))
                    .and_then(|e| e.value())
                    .map(KeyState::Live)
                    .ok_or("version bump of a key with no live row")?,
            };
            self.keys
                .set_hashed(w.key, hashes.at(i), KeyEntry { seq: w.seq, state })?;
        }
        for &(key, seq) in &record.adds {
            // A shadow's mark starts from the mark it shadows, so that its
            // floor is the one the shadowed index will have once this
            // record is applied to it.
            if let Some(under) = under {
                self.add_marks.inherit(key, &under.add_marks);
            }
            self.add_marks.record(key, seq, now_ms);
        }
        for &(source, position) in &record.checkpoints {
            self.checkpoints.insert(
                Bytes::copy_from_slice(source),
                Bytes::copy_from_slice(position),
            );
        }
        if !record.quarantine.is_empty() {
            let batch_id = Bytes::copy_from_slice(record.batch_id);
            for q in &record.quarantine {
                self.quarantine.push(QuarantineEntry {
                    batch_id: batch_id.clone(),
                    index: q.index,
                    event_id: Bytes::copy_from_slice(q.event_id),
                    reason: String::from_utf8_lossy(q.reason).into_owned(),
                });
            }
        }
        self.batches.insert(
            record.batch_id,
            record.content_hash,
            &BatchReport::from_counts(record.counts),
            now_ms,
        );
        self.log_time_ms = now_ms;
        Ok(())
    }

    /// Drops from memory what has expired at `now_ms`. Changes no decision.
    pub(crate) fn purge_expired(&mut self, now_ms: u64) -> Purged {
        Purged {
            seen_ids: self.seen.purge(now_ms),
            batch_ids: self.batches.purge(self.ttls.batch_ms, now_ms),
            tombstones: self.keys.purge_tombstones(self.ttls.tombstone_ms, now_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::record::{self, ValueSource, WriteSource, decode_own_batch};

    /// A record that puts `value` under `key` at seq 1, then bumps `bumped` (if any) to seq 2.
    fn record_putting(key: &[u8], value: &[u8], bumped: Option<&[u8]>) -> Vec<u8> {
        let mut body = Vec::new();
        let writes = 1 + usize::from(bumped.is_some());
        record::encode_batch_head(&mut body, b"B", 7, 1_000, [1, 0, 0, 0, 0, 0, 0, 0]);
        record::encode_seen(&mut body, &[]);
        record::encode_writes_count(&mut body, writes);
        let put = WriteSource::Put(ValueSource::Bytes(value));
        record::encode_write(&mut body, key, 1, put);
        if let Some(bumped) = bumped {
            record::encode_write(&mut body, bumped, 2, WriteSource::Bump);
        }
        record::encode_checkpoints(&mut body, std::iter::empty());
        record::encode_quarantine(&mut body, &[]);
        record::encode_adds(&mut body, &[]);
        body
    }

    fn fingerprint_of(index: &Index, key: &[u8]) -> Option<Fingerprint> {
        index
            .keys
            .get(key)
            .and_then(|e| e.value())
            .and_then(|v| v.fingerprint)
    }

    /// The store's index takes each value's fingerprint as it applies a
    /// put (of at most `FINGERPRINT_BYTES_MAX`), and a bump keeps it; an
    /// index that does not fingerprint (an open's replay) leaves it unknown.
    #[test]
    fn values_are_fingerprinted_only_where_asked_and_bumps_keep_them() {
        let limit = vec![7u8; FINGERPRINT_BYTES_MAX];
        let over = vec![7u8; FINGERPRINT_BYTES_MAX + 1];
        let mut live = Index {
            fingerprints_values: true,
            ..Index::default()
        };
        for (key, value) in [(&b"limit"[..], &limit), (b"over", &over)] {
            let body = record_putting(key, value, None);
            let decoded = decode_own_batch(&body).unwrap();
            live.apply_record(&decoded, 1, 32, None).unwrap();
        }
        assert_eq!(
            fingerprint_of(&live, b"limit"),
            Some(Fingerprint::of(&limit))
        );
        assert_eq!(fingerprint_of(&live, b"over"), None, "left to the read");

        let first = record_putting(b"k", b"first value", None);
        let second = record_putting(b"j", b"other value", Some(b"k"));
        let mut replayed = Index::default();
        let mut live = Index {
            fingerprints_values: true,
            ..Index::default()
        };
        for (index, body) in [(&mut replayed, &first), (&mut live, &first)] {
            let decoded = decode_own_batch(body).unwrap();
            index.apply_record(&decoded, 1, 32, None).unwrap();
        }
        assert_eq!(fingerprint_of(&replayed, b"k"), None);
        assert_eq!(
            fingerprint_of(&live, b"k"),
            Some(Fingerprint::of(b"first value"))
        );
        let decoded = decode_own_batch(&second).unwrap();
        live.apply_record(&decoded, 1, 500, None).unwrap();
        assert_eq!(live.keys.get(b"k").map(|e| e.seq), Some(2));
        assert_eq!(
            fingerprint_of(&live, b"k"),
            Some(Fingerprint::of(b"first value")),
            "a bump keeps the value, and its fingerprint"
        );
        assert_eq!(
            fingerprint_of(&live, b"j"),
            Some(Fingerprint::of(b"other value"))
        );
    }
}
