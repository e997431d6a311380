//! The batch registry: committed batch ids with their content hash and
//! report, in commit order. Entries older than the batch TTL stop counting
//! (a redelivered batch is then planned afresh) and are purged oldest first.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use super::expiry::is_expired;
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
    /// Batch id -> commit number.
    by_id: HashMap<Bytes, u64>,
    /// Commit number -> entry; commit order is also time order.
    in_order: BTreeMap<u64, BatchEntry>,
    next_commit: u64,
    id_bytes: u64,
}

impl BatchRegistry {
    /// The entry for `batch_id`, even if expired.
    pub(crate) fn get(&self, batch_id: &[u8]) -> Option<&BatchEntry> {
        self.by_id.get(batch_id).and_then(|n| self.in_order.get(n))
    }

    /// Registers a batch, replacing an expired entry with the same id.
    pub(crate) fn insert(&mut self, entry: BatchEntry) {
        if let Some(n) = self.by_id.remove(&entry.batch_id) {
            self.in_order.remove(&n);
            self.id_bytes -= entry.batch_id.len() as u64;
        }
        self.id_bytes += entry.batch_id.len() as u64;
        self.by_id.insert(entry.batch_id.clone(), self.next_commit);
        self.in_order.insert(self.next_commit, entry);
        self.next_commit += 1;
    }

    /// Drops entries expired at `now_ms`; returns how many.
    pub(crate) fn purge(&mut self, ttl_ms: Option<u64>, now_ms: u64) -> u64 {
        let mut dropped = 0;
        while let Some(entry) = self.in_order.first_entry() {
            if !is_expired(entry.get().committed_ms, ttl_ms, now_ms) {
                break;
            }
            let entry = entry.remove();
            self.by_id.remove(&entry.batch_id);
            self.id_bytes -= entry.batch_id.len() as u64;
            dropped += 1;
        }
        dropped
    }

    pub(crate) fn in_order(&self) -> impl Iterator<Item = &BatchEntry> {
        self.in_order.values()
    }

    pub(crate) fn len(&self) -> u64 {
        self.in_order.len() as u64
    }

    /// Estimated heap bytes.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let per_entry = (std::mem::size_of::<BatchEntry>()
            + std::mem::size_of::<u64>()
            + std::mem::size_of::<(Bytes, u64)>() * 2) as u64;
        self.in_order.len() as u64 * per_entry + self.id_bytes
    }
}
