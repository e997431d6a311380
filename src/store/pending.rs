//! Batches written to the log but not yet durable, and so not yet visible.
//!
//! Under `Durability::Sync` a batch becomes visible to readers only once a
//! sync covers it: until then its effects live here, where the writer (and
//! only the writer) plans later batches against them. Publishing applies the
//! covered records to the index in log order. A batch whose sync fails is
//! never published.

use std::collections::VecDeque;

use crate::format::record::{BatchRecord, decode_batch};
use crate::index::Index;
use crate::index::expiry::Ttls;

/// One written record, kept until it is published.
#[derive(Debug)]
struct Written {
    lsn_end: u64,
    segment: u32,
    body_at: u32,
    body: Vec<u8>,
}

/// The records written but not yet published, and their combined effects.
#[derive(Debug)]
pub(crate) struct Pending {
    ttls: Ttls,
    records: VecDeque<Written>,
    /// The effects of `records` alone: entries here shadow the index's.
    pub delta: Index,
}

impl Pending {
    pub(crate) fn new(ttls: Ttls) -> Self {
        Self {
            ttls,
            records: VecDeque::new(),
            delta: Index::new(ttls),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Adds a record just written, ending at `lsn_end`.
    pub(crate) fn push(
        &mut self,
        record: &BatchRecord<'_>,
        body: &[u8],
        segment: u32,
        body_at: u32,
        lsn_end: u64,
        index: &Index,
    ) {
        self.delta
            .apply_record(record, segment, body_at, Some(index))
            .expect("a planned record applies to the state it was planned against");
        self.records.push_back(Written {
            lsn_end,
            segment,
            body_at,
            body: body.to_vec(),
        });
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
            // Rebuild the shadow of what is still pending on top of the new index.
            self.delta = Index::new(self.ttls);
            for r in &self.records {
                apply(&mut self.delta, r, Some(index));
            }
        }
    }
}

fn apply(target: &mut Index, r: &Written, under: Option<&Index>) {
    let record = decode_batch(&r.body).expect("a written record decodes");
    target
        .apply_record(&record, r.segment, r.body_at, under)
        .expect("a written record applies in log order");
}
