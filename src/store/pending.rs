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
//! it never pays for them.

use std::collections::VecDeque;

use crate::format::record::decode_own_batch;
use crate::index::Index;
use crate::index::expiry::Ttls;

/// One written record, kept until it is published.
#[derive(Debug)]
struct Written {
    lsn_end: u64,
    segment: u32,
    body_at: u32,
    body: Vec<u8>,
    /// The writer applied its seen ids to the index already.
    is_seen_applied: bool,
}

/// The records written but not yet published, and their combined effects.
#[derive(Debug)]
pub(crate) struct Pending {
    ttls: Ttls,
    records: VecDeque<Written>,
    /// The effects of the first `delta_covers` records: entries here shadow the index's.
    delta: Index,
    delta_covers: usize,
}

impl Pending {
    pub(crate) fn new(ttls: Ttls) -> Self {
        Self {
            ttls,
            records: VecDeque::new(),
            delta: Index::new(ttls),
            delta_covers: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Adds a record just written, ending at `lsn_end`; `is_seen_applied`
    /// if the writer applied its seen ids to the index already.
    pub(crate) fn push(
        &mut self,
        body: &[u8],
        segment: u32,
        body_at: u32,
        lsn_end: u64,
        is_seen_applied: bool,
    ) {
        self.records.push_back(Written {
            lsn_end,
            segment,
            body_at,
            body: body.to_vec(),
            is_seen_applied,
        });
    }

    /// The pending records' effects, which shadow `index`.
    pub(crate) fn delta(&mut self, index: &Index) -> &Index {
        for r in self.records.iter().skip(self.delta_covers) {
            apply(&mut self.delta, r, Some(index));
        }
        self.delta_covers = self.records.len();
        &self.delta
    }

    /// Applies to `index`, in log order, every record that ends at or before `lsn`.
    pub(crate) fn publish(&mut self, lsn: u64, index: &mut Index) {
        let mut published = false;
        while self.records.front().is_some_and(|r| r.lsn_end <= lsn) {
            let r = self.records.pop_front().expect("front exists");
            apply(index, &r, None);
            published = true;
        }
        if published {
            self.forget_delta();
        }
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

/// Applies a record, but not the seen ids the writer applied to the index
/// already: the shadow needs none of those either, since a planner that
/// misses an id there finds it in the index.
fn apply(target: &mut Index, r: &Written, under: Option<&Index>) {
    let record = decode_own_batch(&r.body).expect("a written record decodes");
    let applied = if r.is_seen_applied {
        target.apply_visible(&record, r.segment, r.body_at, under)
    } else {
        target.apply_record(&record, r.segment, r.body_at, under)
    };
    applied.expect("a written record applies in log order");
}
