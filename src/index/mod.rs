//! In-memory state rebuilt from the log: keys, seen event ids, the batch
//! registry, checkpoints and the quarantine. No I/O happens here.
//!
//! Invariant: the index equals the result of applying every committed record,
//! in log order, with [`Index::apply_record`]; live commits and recovery both
//! go through that one function.

pub(crate) mod batches;
pub(crate) mod keys;
pub(crate) mod seen;

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::batch::{BatchReport, QuarantineEntry};
use crate::format::record::{BatchRecord, WriteView};
use crate::log::segments::ValueRef;
use batches::{BatchEntry, BatchRegistry};
use keys::{KeyEntry, KeyIndex};
use seen::SeenIndex;

/// Everything the store knows in memory.
#[derive(Debug, Default)]
pub(crate) struct Index {
    pub keys: KeyIndex,
    pub seen: SeenIndex,
    pub batches: BatchRegistry,
    pub checkpoints: BTreeMap<Bytes, Bytes>,
    pub quarantine: Vec<QuarantineEntry>,
}

impl Index {
    /// Applies one committed batch record whose body starts at `body_at` in `segment`.
    ///
    /// Fails only if the record contradicts the index (a bump of a key with
    /// no live row), which recovery reports as corruption.
    pub(crate) fn apply_record(
        &mut self,
        record: &BatchRecord<'_>,
        segment: u32,
        body_at: u32,
    ) -> Result<(), &'static str> {
        if self.batches.get(record.batch_id).is_some() {
            return Err("batch id committed twice");
        }
        for w in &record.writes {
            let entry = match w.op {
                WriteView::Put { value, value_at } => {
                    let offset = u32::try_from(value_at)
                        .ok()
                        .and_then(|at| body_at.checked_add(at))
                        .ok_or("value offset out of range")?;
                    let len = u32::try_from(value.len()).map_err(|_| "value too long")?;
                    KeyEntry {
                        seq: w.seq,
                        value: Some(ValueRef {
                            segment,
                            offset,
                            len,
                        }),
                    }
                }
                WriteView::Delete => KeyEntry {
                    seq: w.seq,
                    value: None,
                },
                WriteView::Bump => {
                    let live = self
                        .keys
                        .get(w.key)
                        .and_then(|e| e.value)
                        .ok_or("version bump of a key with no live row")?;
                    KeyEntry {
                        seq: w.seq,
                        value: Some(live),
                    }
                }
            };
            self.keys.set(w.key, entry);
        }
        for &(id, payload) in &record.seen {
            self.seen.insert(id, payload);
        }
        for &(source, position) in &record.checkpoints {
            self.checkpoints.insert(
                Bytes::copy_from_slice(source),
                Bytes::copy_from_slice(position),
            );
        }
        let batch_id = Bytes::copy_from_slice(record.batch_id);
        for q in &record.quarantine {
            self.quarantine.push(QuarantineEntry {
                batch_id: batch_id.clone(),
                index: q.index,
                event_id: Bytes::copy_from_slice(q.event_id),
                reason: String::from_utf8_lossy(q.reason).into_owned(),
            });
        }
        self.batches.insert(BatchEntry {
            batch_id,
            content_hash: record.content_hash,
            report: BatchReport::from_counts(record.counts),
            committed_ms: record.committed_ms,
        });
        Ok(())
    }
}
