//! The batch registry: every committed batch id with its content hash and
//! report, in commit order.

use std::collections::HashMap;

use bytes::Bytes;

use crate::batch::BatchReport;

/// One committed batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchEntry {
    pub batch_id: Bytes,
    pub content_hash: u128,
    pub report: BatchReport,
    pub committed_ms: u64,
}

#[derive(Debug, Default)]
pub(crate) struct BatchRegistry {
    by_id: HashMap<Bytes, usize>,
    in_order: Vec<BatchEntry>,
    id_bytes: u64,
}

impl BatchRegistry {
    pub(crate) fn get(&self, batch_id: &[u8]) -> Option<&BatchEntry> {
        self.by_id.get(batch_id).and_then(|&i| self.in_order.get(i))
    }

    /// Registers a batch; the caller has checked that its id is new.
    pub(crate) fn insert(&mut self, entry: BatchEntry) {
        let previous = self
            .by_id
            .insert(entry.batch_id.clone(), self.in_order.len());
        assert!(previous.is_none(), "batch id registered twice");
        self.id_bytes += entry.batch_id.len() as u64;
        self.in_order.push(entry);
    }

    pub(crate) fn in_order(&self) -> &[BatchEntry] {
        &self.in_order
    }

    pub(crate) fn len(&self) -> u64 {
        self.in_order.len() as u64
    }

    /// Estimated heap bytes.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let per_entry =
            (std::mem::size_of::<BatchEntry>() + std::mem::size_of::<(Bytes, usize)>() * 2) as u64;
        self.in_order.len() as u64 * per_entry + self.id_bytes
    }
}
