//! Internals exposed for the benchmarks (behind the `testing` feature; not
//! part of the API and not covered by any compatibility promise).

use crate::batch::Batch;

/// The seen-event index on its own.
#[derive(Debug, Default)]
pub struct SeenIndex(crate::index::seen::SeenIndex);

impl SeenIndex {
    /// An empty index whose ids never expire.
    pub fn new() -> Self {
        Self(crate::index::seen::SeenIndex::new(None))
    }

    /// Records an id (hash of an event id) with its payload hash.
    pub fn insert(&mut self, id: u128, payload: u64) {
        self.0.insert(
            id,
            crate::index::seen::Seen {
                payload,
                at_secs: 0,
            },
            0,
        );
    }

    /// The payload hash recorded for an id.
    pub fn get(&self, id: u128) -> Option<u64> {
        self.0.get(id).map(|s| s.payload)
    }

    /// Heap bytes held.
    pub fn memory_bytes(&self) -> u64 {
        self.0.memory_bytes()
    }
}

/// Encodes `batch` as the record a store would write if every delivery were
/// a new put or delete (no planning): the cost of encoding alone.
pub fn encode_batch_record(buf: &mut Vec<u8>, batch: &Batch) {
    use crate::batch::Op;
    use crate::format::record::{self, ValueSource, WriteSource};
    let (content_hash, hashes) = crate::apply::classify::hash_batch(batch);
    buf.clear();
    record::encode_batch_head(buf, batch.id(), content_hash, 0, [0; 8]);
    let seen: Vec<(u128, u64)> = hashes.iter().map(|h| (h.id, h.payload)).collect();
    record::encode_seen(buf, &seen);
    record::encode_writes_count(buf, batch.len());
    for d in batch.deliveries() {
        let op = match &d.op {
            Op::Put(v) => WriteSource::Put(ValueSource::Bytes(v)),
            _ => WriteSource::Delete,
        };
        record::encode_write(buf, &d.key, d.seq, op);
    }
    record::encode_checkpoints(
        buf,
        batch.checkpoints().iter().map(|(s, p)| (&s[..], &p[..])),
    );
    record::encode_quarantine(buf, &[]);
    record::encode_adds(buf, &[]);
}
