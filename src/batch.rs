//! What a caller hands to `apply_batch` and what it gets back.
//!
//! `Batch` is plain data: deliveries in order plus checkpoint updates. It does
//! no validation; `apply` decides what each delivery means.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};

/// One change an event makes to its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// An after-image that replaces the key's state.
    Put(Bytes),
    /// Removes the key's live row and leaves a tombstone with the event's seq.
    Delete,
    /// Adds a delta to a counter key (an i64 stored as canonical decimal text).
    Add(i64),
    /// A delivery the caller could not even parse (for example a malformed
    /// input line). It is always invalid: refused under `OnConflict::Fail`,
    /// quarantined with `reason` under `OnConflict::Quarantine`.
    Malformed { reason: String },
}

/// One arrival of an event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Delivery {
    /// The event's idempotency key.
    pub event_id: Bytes,
    /// The business key the event changes.
    pub key: Bytes,
    /// The source's version of the key's state; larger is newer.
    pub seq: u64,
    /// What the event does.
    pub op: Op,
}

/// An ordered list of deliveries plus checkpoint updates, under one batch id.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    id: Bytes,
    deliveries: Vec<Delivery>,
    checkpoints: Vec<(Bytes, Bytes)>,
    source_slots: SourceSlots,
    /// Spare room that the builder copies ids, keys and values into: one
    /// allocation serves many deliveries instead of three per delivery.
    arena: BytesMut,
}

/// Where each checkpoint source sits in a batch's `checkpoints`, once the
/// batch sets more sources than a scan finds quickly, so that setting `n`
/// sources costs O(n) rather than O(n^2). It is derived from `checkpoints`
/// and takes no part in comparing batches.
#[derive(Debug, Clone, Default)]
struct SourceSlots(Option<HashMap<Bytes, usize>>);

impl PartialEq for SourceSlots {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SourceSlots {}

/// Sources a batch finds by scanning its checkpoints; past this many, by `SourceSlots`.
const SOURCES_SCANNED_MAX: usize = 16;

/// Bytes the builder's arena grows by when it runs out.
const ARENA_CHUNK_BYTES: usize = 16 * 1024;

fn bytes_of(value: impl AsRef<[u8]>) -> Bytes {
    Bytes::copy_from_slice(value.as_ref())
}

impl Batch {
    /// Copies `bytes` into the arena and returns them as their own `Bytes`.
    fn copy_in(&mut self, bytes: &[u8]) -> Bytes {
        if self.arena.capacity() < bytes.len() {
            self.arena.reserve(bytes.len().max(ARENA_CHUNK_BYTES));
        }
        self.arena.extend_from_slice(bytes);
        self.arena.split().freeze()
    }
}

impl Batch {
    /// An empty batch with the given id.
    pub fn new(id: impl AsRef<[u8]>) -> Self {
        Self {
            id: bytes_of(id),
            deliveries: Vec::new(),
            checkpoints: Vec::new(),
            source_slots: SourceSlots::default(),
            arena: BytesMut::new(),
        }
    }

    /// Appends a `Put` delivery.
    #[must_use]
    pub fn put(
        mut self,
        event_id: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        seq: u64,
        value: impl AsRef<[u8]>,
    ) -> Self {
        let value = self.copy_in(value.as_ref());
        self.push(event_id, key, seq, Op::Put(value));
        self
    }

    /// Appends a `Delete` delivery.
    #[must_use]
    pub fn delete(mut self, event_id: impl AsRef<[u8]>, key: impl AsRef<[u8]>, seq: u64) -> Self {
        self.push(event_id, key, seq, Op::Delete);
        self
    }

    /// Appends an `Add` delivery.
    #[must_use]
    pub fn add(
        mut self,
        event_id: impl AsRef<[u8]>,
        key: impl AsRef<[u8]>,
        seq: u64,
        delta: i64,
    ) -> Self {
        self.push(event_id, key, seq, Op::Add(delta));
        self
    }

    /// Appends a delivery that is known to be malformed (see [`Op::Malformed`]).
    #[must_use]
    pub fn malformed(mut self, event_id: impl AsRef<[u8]>, reason: impl Into<String>) -> Self {
        self.push(
            event_id,
            b"",
            0,
            Op::Malformed {
                reason: reason.into(),
            },
        );
        self
    }

    /// Sets the position of `source`; the last setting of a source in a batch wins.
    #[must_use]
    pub fn checkpoint(mut self, source: impl AsRef<[u8]>, position: impl AsRef<[u8]>) -> Self {
        self.set_checkpoint(source, position);
        self
    }

    /// Appends a delivery (non-builder form).
    pub fn push(&mut self, event_id: impl AsRef<[u8]>, key: impl AsRef<[u8]>, seq: u64, op: Op) {
        let event_id = self.copy_in(event_id.as_ref());
        let key = self.copy_in(key.as_ref());
        self.push_delivery(Delivery {
            event_id,
            key,
            seq,
            op,
        });
    }

    /// Appends a prepared delivery.
    pub fn push_delivery(&mut self, delivery: Delivery) {
        self.deliveries.push(delivery);
    }

    /// Sets the position of `source` (non-builder form).
    pub fn set_checkpoint(&mut self, source: impl AsRef<[u8]>, position: impl AsRef<[u8]>) {
        let source = bytes_of(source);
        let position = bytes_of(position);
        let slot = match &self.source_slots.0 {
            Some(slots) => slots.get(&source).copied(),
            None => self.checkpoints.iter().position(|(s, _)| *s == source),
        };
        match slot.and_then(|i| self.checkpoints.get_mut(i)) {
            Some(slot) => slot.1 = position,
            None => {
                if let Some(slots) = &mut self.source_slots.0 {
                    slots.insert(source.clone(), self.checkpoints.len());
                }
                self.checkpoints.push((source, position));
                if self.source_slots.0.is_none() && self.checkpoints.len() > SOURCES_SCANNED_MAX {
                    let slots = self.checkpoints.iter().enumerate();
                    self.source_slots.0 = Some(slots.map(|(i, (s, _))| (s.clone(), i)).collect());
                }
            }
        }
    }

    /// The batch id.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// The deliveries, in order.
    pub fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    /// The checkpoint updates, in the order their sources were first set.
    pub fn checkpoints(&self) -> &[(Bytes, Bytes)] {
        &self.checkpoints
    }

    /// Number of deliveries.
    pub fn len(&self) -> usize {
        self.deliveries.len()
    }

    /// The hash a committed batch is known by (DESIGN.md, "Hashes"): its
    /// deliveries and checkpoints, not its id. A batch whose id committed
    /// with this hash is a replay; with another, a `BatchConflict`.
    /// `LogEntry::content_hash` is the committed one, so a caller can tell
    /// whether a batch is the one its id committed without applying it.
    pub fn content_hash(&self) -> u128 {
        crate::apply::classify::hash_batch(self).0
    }

    /// Whether the batch has no deliveries.
    pub fn is_empty(&self) -> bool {
        self.deliveries.is_empty()
    }
}

/// What `apply_batch` did with each delivery of a batch.
///
/// For every committed batch the eight counts add up to the number of deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct BatchReport {
    pub inserted: u64,
    pub updated: u64,
    pub unchanged: u64,
    pub stale: u64,
    pub duplicates: u64,
    pub deleted: u64,
    pub added: u64,
    pub rejected: u64,
    /// The batch id had already committed with the same content; nothing changed.
    pub replayed: bool,
}

impl BatchReport {
    /// The sum of the eight counts: the number of deliveries the report
    /// covers (saturating at `u64::MAX`, which no store's report reaches).
    pub fn deliveries(&self) -> u64 {
        self.counts()
            .iter()
            .fold(0, |sum, &n| sum.saturating_add(n))
    }

    /// The eight counts in declaration order.
    pub fn counts(&self) -> [u64; 8] {
        [
            self.inserted,
            self.updated,
            self.unchanged,
            self.stale,
            self.duplicates,
            self.deleted,
            self.added,
            self.rejected,
        ]
    }

    /// Builds a report from counts in declaration order.
    pub fn from_counts(counts: [u64; 8]) -> Self {
        let [
            inserted,
            updated,
            unchanged,
            stale,
            duplicates,
            deleted,
            added,
            rejected,
        ] = counts;
        Self {
            inserted,
            updated,
            unchanged,
            stale,
            duplicates,
            deleted,
            added,
            rejected,
            replayed: false,
        }
    }

    /// Adds another report's counts to this one (for running totals),
    /// each saturating at `u64::MAX`.
    pub fn accumulate(&mut self, other: &BatchReport) {
        let mut counts = self.counts();
        for (total, part) in counts.iter_mut().zip(other.counts()) {
            *total = total.saturating_add(part);
        }
        let replayed = self.replayed;
        *self = Self::from_counts(counts);
        self.replayed = replayed;
    }
}

/// A delivery that was quarantined instead of applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantineEntry {
    /// The batch it arrived in.
    pub batch_id: Bytes,
    /// Its index within that batch.
    pub index: u64,
    /// Its event id (for a malformed delivery: whatever label the caller gave).
    pub event_id: Bytes,
    /// Why it was refused, for example `conflicting_event` or `invalid: empty key`.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_sums_saturate_instead_of_panicking() {
        let full = BatchReport::from_counts([u64::MAX, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(full.deliveries(), u64::MAX);
        let mut total = BatchReport::from_counts([u64::MAX - 1, 0, 0, 0, 0, 0, 0, 0]);
        total.accumulate(&BatchReport::from_counts([5, 2, 0, 0, 0, 0, 0, 0]));
        assert_eq!(total.counts()[..2], [u64::MAX, 2]);
    }

    #[test]
    fn report_counts_are_in_declaration_order_both_ways() {
        let report = BatchReport::from_counts([1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            (
                report.inserted,
                report.updated,
                report.unchanged,
                report.stale,
                report.duplicates,
                report.deleted,
                report.added,
                report.rejected,
            ),
            (1, 2, 3, 4, 5, 6, 7, 8)
        );
        assert_eq!(report.counts(), [1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(!report.replayed);
        let mut total = BatchReport {
            replayed: true,
            ..report
        };
        total.accumulate(&report);
        assert_eq!(total.counts(), [2, 4, 6, 8, 10, 12, 14, 16]);
        assert!(total.replayed, "accumulating keeps the total's flag");
    }

    #[test]
    fn built_deliveries_hold_their_own_bytes() {
        let batch = Batch::new("B")
            .put("e1", "k1", 1, "v1")
            .delete("e2", "k2", 2)
            .add("e3", "k3", 3, -4)
            .malformed("e4", "bad line")
            .put("e5", "k5", 5, "");
        let delivery = |event_id: &str, key: &str, seq, op| Delivery {
            event_id: bytes_of(event_id),
            key: bytes_of(key),
            seq,
            op,
        };
        let malformed = Op::Malformed {
            reason: "bad line".into(),
        };
        let want = [
            delivery("e1", "k1", 1, Op::Put(bytes_of("v1"))),
            delivery("e2", "k2", 2, Op::Delete),
            delivery("e3", "k3", 3, Op::Add(-4)),
            delivery("e4", "", 0, malformed),
            delivery("e5", "k5", 5, Op::Put(Bytes::new())),
        ];
        assert_eq!(batch.deliveries(), &want[..]);
        assert_eq!(batch.len(), 5);
        assert_eq!(batch.id(), b"B");
    }

    #[test]
    fn many_sources_keep_the_order_they_were_first_set_in_and_their_last_position() {
        let sources = 3 * SOURCES_SCANNED_MAX;
        let mut batch = Batch::new("B");
        for round in 0..3u8 {
            for i in 0..sources {
                // The first and last rounds set every source, the middle one every other.
                if round != 1 || i % 2 == 0 {
                    batch.set_checkpoint(format!("s{i}"), [round, i as u8]);
                }
            }
        }
        let want: Vec<(Bytes, Bytes)> = (0..sources)
            .map(|i| (bytes_of(format!("s{i}")), bytes_of([2, i as u8])))
            .collect();
        assert_eq!(batch.checkpoints(), &want[..]);

        // A batch that set each source once is the same batch.
        let mut once = Batch::new("B");
        for (source, position) in &want[..SOURCES_SCANNED_MAX] {
            once.set_checkpoint(source, position);
        }
        let mut rest = once.clone();
        for (source, position) in &want[SOURCES_SCANNED_MAX..] {
            rest.set_checkpoint(source, position);
        }
        assert_eq!(rest, batch);
        assert_ne!(once, batch);
    }
}
