//! Batches written to the log but not yet durable, and so not yet visible.
//!
//! Under `Durability::Sync` a batch becomes visible to readers only once a
//! sync covers it: until then its record waits here, and the writer (and
//! only the writer) plans later batches against its effects. Publishing
//! applies the covered records to the index in log order. A batch whose sync
//! fails is never published.
//!
//! The writer applies a large record's seen ids to the index as it writes
//! the record (`Index::apply_seen`) if nothing is pending before it, so
//! that seen ids still go in in log order: no reader sees them, and the
//! work overlaps the disk's write-back. Publishing, and the effects below,
//! then apply the rest (`Index::apply_visible`). Such a record is the
//! oldest pending one, so the effects never hold an older entry for one of
//! its ids that would shadow the index's.
//!
//! The effects (`delta`) are built only when a planner needs them: a lone
//! writer's previous batch is always published before it plans the next, so
//! it never pays for them; and a batch that touches none of the pending
//! records' batch ids, keys or seen ids (a small Bloom filter over them
//! says so) is planned against the published index alone, since the
//! effects shadow nothing it reads.

use std::collections::VecDeque;

use xxhash_rust::xxh3::xxh3_128;

use super::publisher::Record;
use crate::apply::classify::DeliveryHash;
use crate::batch::Delivery;
use crate::format::record::decode_own_batch;
use crate::index::Index;
use crate::index::expiry::Ttls;
use crate::index::id_filter::IdFilter;
use crate::index::seen::split;

/// What the filter of touched ids is sized for: a few hundred 10-delivery
/// batches' worth, in 8 KiB. Past it, false positives grow (each costs
/// building the effects), never false negatives.
const TOUCHED_IDS: usize = 8192;

/// One written record, kept until it is published.
#[derive(Debug)]
struct Written {
    lsn_end: u64,
    record: Record,
    /// Key index bytes its new keys take once published (`Plan::new_key_bytes`).
    new_key_bytes: u64,
}

/// The records written but not yet published, and their combined effects.
#[derive(Debug)]
pub(crate) struct Pending {
    ttls: Ttls,
    records: VecDeque<Written>,
    /// The effects of the first `delta_covers` records: entries here shadow the index's.
    delta: Index,
    delta_covers: usize,
    /// Stands for the effects when a batch touches none of them.
    empty: Index,
    /// The batch ids, keys and seen ids of the first `touched_covers`
    /// records: added only when a planner asks (a lone writer never
    /// does), cleared whenever records are published.
    touched: IdFilter,
    touched_covers: usize,
    /// The commit time of the newest record pushed.
    log_time_ms: u64,
    /// The records' `new_key_bytes` summed: key index room they will take.
    new_key_bytes: u64,
}

impl Pending {
    pub(crate) fn new(ttls: Ttls) -> Self {
        Self {
            ttls,
            records: VecDeque::new(),
            delta: Index::new(ttls),
            delta_covers: 0,
            empty: Index::new(ttls),
            touched: IdFilter::with_capacity(TOUCHED_IDS),
            touched_covers: 0,
            log_time_ms: 0,
            new_key_bytes: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The commit time of the newest record pushed (0 if none).
    pub(crate) fn log_time_ms(&self) -> u64 {
        self.log_time_ms
    }

    /// Key index bytes the pending records' new keys will take once
    /// published: a planner counts them against the room the index has.
    pub(crate) fn new_key_bytes(&self) -> u64 {
        self.new_key_bytes
    }

    /// Adds a record just written, committed at `committed_ms` and ending
    /// at `lsn_end`; `is_seen_applied` if the writer applied its seen ids
    /// to the index already; whose new keys take `new_key_bytes`.
    #[expect(clippy::too_many_arguments, reason = "one record's facts, named")]
    pub(crate) fn push(
        &mut self,
        body: &[u8],
        committed_ms: u64,
        segment: u32,
        body_at: u32,
        lsn_end: u64,
        is_seen_applied: bool,
        new_key_bytes: u64,
    ) {
        self.log_time_ms = self.log_time_ms.max(committed_ms);
        self.new_key_bytes += new_key_bytes;
        self.records.push_back(Written {
            lsn_end,
            record: Record {
                segment,
                body_at,
                body: body.to_vec(),
                is_seen_applied,
            },
            new_key_bytes,
        });
    }

    /// What shadows `index` for planning the batch `batch_id` of
    /// `deliveries` (hashed as `hashes`): the pending records' effects, or
    /// nothing if the batch touches none of them.
    pub(crate) fn overlay(
        &mut self,
        index: &Index,
        batch_id: &[u8],
        deliveries: &[Delivery],
        hashes: &[DeliveryHash],
    ) -> &Index {
        if self.delta_covers < self.records.len() && !self.touches(batch_id, deliveries, hashes) {
            return &self.empty;
        }
        self.delta(index)
    }

    /// Whether the batch may read anything a pending record wrote: its
    /// batch id, an event id or a key (no false negatives).
    fn touches(
        &mut self,
        batch_id: &[u8],
        deliveries: &[Delivery],
        hashes: &[DeliveryHash],
    ) -> bool {
        for r in self.records.iter().skip(self.touched_covers) {
            let record = decode_own_batch(&r.record.body).expect("a written record decodes");
            self.touched.add(split(xxh3_128(record.batch_id)));
            for w in &record.writes {
                self.touched.add(split(xxh3_128(w.key)));
            }
            for &(id, _) in &record.seen {
                self.touched.add(split(id));
            }
        }
        self.touched_covers = self.records.len();
        self.touched.may_contain(split(xxh3_128(batch_id)))
            || deliveries.iter().zip(hashes).any(|(d, h)| {
                self.touched.may_contain(split(h.id))
                    || self.touched.may_contain(split(xxh3_128(&d.key)))
            })
    }

    /// The pending records' effects, which shadow `index`.
    fn delta(&mut self, index: &Index) -> &Index {
        for r in self.records.iter().skip(self.delta_covers) {
            r.record
                .apply(&mut self.delta, Some(index))
                .expect("a written record applies in log order");
        }
        self.delta_covers = self.records.len();
        &self.delta
    }

    /// Takes, in log order, every record that ends at or before `lsn`
    /// (durable now), for the caller to apply to the index before anyone
    /// reads it again.
    pub(crate) fn take_published(&mut self, lsn: u64) -> Vec<Record> {
        let mut published = Vec::new();
        while self.records.front().is_some_and(|r| r.lsn_end <= lsn) {
            let r = self.records.pop_front().expect("front exists");
            self.new_key_bytes -= r.new_key_bytes;
            published.push(r.record);
        }
        if !published.is_empty() {
            self.forget_delta();
            // Rebuilt from the records still pending when next asked, so
            // that published ones do not fill it up.
            self.touched.clear();
            self.touched_covers = 0;
        }
        published
    }

    /// Drops the shadow, to be rebuilt on top of the index when next needed:
    /// after the index changed under it (publishing, or compaction moving
    /// values that the shadow's version bumps point at).
    pub(crate) fn forget_delta(&mut self) {
        if self.delta_covers > 0 {
            self.delta = Index::new(self.ttls);
            self.delta_covers = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pending;
    use crate::Batch;
    use crate::apply::classify::hash_batch;
    use crate::format::record::{self, ValueSource, WriteSource};
    use crate::index::Index;
    use crate::index::expiry::Ttls;
    use xxhash_rust::xxh3::xxh3_128;

    const TTLS: Ttls = Ttls {
        seen_ms: None,
        batch_ms: None,
        tombstone_ms: None,
    };

    /// The body of a record of batch `batch_id` that recorded event `event`
    /// and put `key`.
    fn body(batch_id: &str, event: &str, key: &str) -> Vec<u8> {
        let mut buf = Vec::new();
        record::encode_batch_head(
            &mut buf,
            batch_id.as_bytes(),
            7,
            1_000,
            [1, 0, 0, 0, 0, 0, 0, 0],
        );
        record::encode_seen(&mut buf, &[(xxh3_128(event.as_bytes()), 9)]);
        record::encode_writes_count(&mut buf, 1);
        record::encode_write(
            &mut buf,
            key.as_bytes(),
            1,
            WriteSource::Put(ValueSource::Bytes(b"v")),
        );
        record::encode_checkpoints(&mut buf, std::iter::empty());
        record::encode_quarantine(&mut buf, &[]);
        record::encode_adds(&mut buf, &[]);
        buf
    }

    /// Applies the records durable at `lsn` to `index`, as the store's publisher does.
    fn publish(pending: &mut Pending, lsn: u64, index: &mut Index) {
        for record in pending.take_published(lsn) {
            record.apply(index, None).expect("applies");
        }
    }

    /// Whether the overlay for `batch` holds `key` (rather than nothing).
    fn overlay_holds(pending: &mut Pending, index: &Index, batch: &Batch, key: &str) -> bool {
        let (_, hashes) = hash_batch(batch);
        let overlay = pending.overlay(index, batch.id(), batch.deliveries(), &hashes);
        overlay.keys.get(key.as_bytes()).is_some()
    }

    #[test]
    fn the_overlay_follows_records_pushed_after_others_were_published() {
        let mut index = Index::new(TTLS);
        let mut pending = Pending::new(TTLS);
        pending.push(&body("A", "ea", "ka"), 1_000, 1, 100, 10, false, 0);
        pending.push(&body("B", "eb", "kb"), 1_000, 1, 200, 20, false, 0);
        let elsewhere = Batch::new("X").put("ex", "kx", 1, "v");
        assert!(
            !overlay_holds(&mut pending, &index, &elsewhere, "kb"),
            "touches neither"
        );
        let on_b = Batch::new("Y").put("ey", "kb", 2, "v");
        assert!(
            overlay_holds(&mut pending, &index, &on_b, "kb"),
            "touches B's key"
        );
        publish(&mut pending, 10, &mut index);
        assert!(index.keys.get(b"ka").is_some(), "A is published");
        assert!(
            pending.touched.is_empty(),
            "to be rebuilt from B when next asked"
        );
        pending.push(&body("C", "ec", "kc"), 1_000, 1, 300, 30, false, 0);
        for (batch, key) in [
            (Batch::new("Z").put("ez", "kc", 2, "v"), "kc"),
            (Batch::new("Z").put("ec", "kz", 2, "v"), "kc"),
            (Batch::new("C"), "kc"),
            (Batch::new("Z").put("ez", "kb", 2, "v"), "kb"),
        ] {
            assert!(
                overlay_holds(&mut pending, &index, &batch, key),
                "{batch:?}"
            );
            // The effects are now built for every pending record; start over.
            pending.forget_delta();
        }
        assert!(!overlay_holds(&mut pending, &index, &elsewhere, "kc"));
        publish(&mut pending, 30, &mut index);
        assert!(
            pending.is_empty() && pending.touched.is_empty(),
            "nothing pending, nothing touched"
        );
    }
}
