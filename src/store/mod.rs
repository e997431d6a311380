//! `Store`: the public handle. (skeleton)
#![allow(unused)]
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::{Batch, BatchReport, Digest, Options, QuarantineEntry, Result};

/// A key's current live state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key's version.
    pub seq: u64,
    /// The value bytes (for a counter: canonical decimal text of an i64).
    pub value: Bytes,
}

/// An open store. `Send + Sync`: share it across threads by reference or `Arc`.
#[derive(Debug)]
pub struct Store {}

/// Iterator over live rows in key order, from [`Store::scan_prefix`].
#[derive(Debug)]
pub struct Scan {}

impl Iterator for Scan {
    type Item = Result<(Bytes, Record)>;
    fn next(&mut self) -> Option<Self::Item> {
        todo!()
    }
}

/// One committed batch, as listed by [`Store::log`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub batch_id: Bytes,
    pub report: BatchReport,
    /// The clock reading the batch committed under (ms since the Unix epoch).
    pub committed_ms: u64,
}

/// Bytes of index memory per entry kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexBytes {
    pub keys: u64,
    pub seen: u64,
    pub batches: u64,
}

/// Counts and sizes, from [`Store::stats`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    pub live_keys: u64,
    pub tombstones: u64,
    pub seen_ids: u64,
    pub batches: u64,
    pub checkpoints: u64,
    pub quarantined: u64,
    pub segments: u64,
    pub disk_bytes: u64,
    pub index_bytes: IndexBytes,
}

/// What [`Store::verify`] read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    pub segments: u64,
    pub records: u64,
    pub bytes: u64,
}

/// What [`Store::repair`] kept and dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepairReport {
    pub records_kept: u64,
    /// Segment id and offset of the first bad record, if any.
    pub first_bad: Option<(u64, u64)>,
    pub bytes_dropped: u64,
    pub segments_dropped: u64,
    /// Where dropped bytes were moved instead of deleted.
    pub lost_found: Option<PathBuf>,
}

impl Store {
    pub fn open(dir: impl AsRef<Path>, options: Options) -> Result<Store> { todo!() }
    pub fn apply_batch(&self, batch: &Batch) -> Result<BatchReport> { todo!() }
    pub fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Record>> { todo!() }
    pub fn scan_prefix(&self, prefix: impl AsRef<[u8]>) -> Scan { todo!() }
    pub fn checkpoint(&self, source: impl AsRef<[u8]>) -> Result<Option<Bytes>> { todo!() }
    pub fn batch(&self, batch_id: impl AsRef<[u8]>) -> Result<Option<BatchReport>> { todo!() }
    pub fn log(&self) -> Vec<LogEntry> { todo!() }
    pub fn digest(&self) -> Result<Digest> { todo!() }
    pub fn quarantine(&self) -> Vec<QuarantineEntry> { todo!() }
    pub fn stats(&self) -> Stats { todo!() }
    pub fn verify(&self) -> Result<VerifyReport> { todo!() }
    pub fn repair(dir: impl AsRef<Path>, options: Options) -> Result<RepairReport> { todo!() }
    pub fn dir(&self) -> &Path { todo!() }
}
