//! Public value types returned by the store's read and maintenance calls.

use std::path::PathBuf;

use bytes::Bytes;

use crate::batch::BatchReport;

/// A key's current live state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The key's version.
    pub seq: u64,
    /// The value bytes (for a counter: canonical decimal text of an i64).
    pub value: Bytes,
}

/// One committed batch, as listed by [`Store::log`](crate::Store::log).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LogEntry {
    pub batch_id: Bytes,
    /// The batch's `Batch::content_hash`.
    pub content_hash: u128,
    pub report: BatchReport,
    /// The clock reading the batch committed under (ms since the Unix epoch).
    pub committed_ms: u64,
}

/// Bytes of index memory per entry kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexBytes {
    /// Keys (live rows and tombstones).
    pub keys: u64,
    /// Seen event ids.
    pub seen: u64,
    /// The batch registry.
    pub batches: u64,
}

/// Counts and sizes, from [`Store::stats`](crate::Store::stats).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stats {
    pub live_keys: u64,
    /// Tombstones held, expired ones included until a compaction drops them.
    pub tombstones: u64,
    /// Seen event ids held in memory. Expired ids count until the seen
    /// index's next merge or a compaction lets them go, so the figure
    /// depends on when those ran (a snapshot's load starts with no merge
    /// pending), not only on the batches; under `Durability::Sync` it
    /// includes the ids of a large record waiting for its sync (DESIGN.md,
    /// "Write path"). What an id decides never depends on it.
    pub seen_ids: u64,
    /// Batch ids held, expired ones included until a compaction drops them.
    pub batches: u64,
    pub checkpoints: u64,
    pub quarantined: u64,
    pub segments: u64,
    /// Bytes of all segment files and the snapshot: their lengths, so the
    /// newest segment counts the space it is extended by ahead of its records
    /// (up to 4 MiB, a hole on file systems that have them; cut at close).
    pub disk_bytes: u64,
    /// Commit syncs since open; concurrent callers share them (group commit).
    pub syncs: u64,
    pub index_bytes: IndexBytes,
    /// Bytes of a torn final record that `open` discarded (not counting
    /// zeros after it, the unused part of a preallocated segment).
    pub torn_bytes_discarded: u64,
    /// Log records `open` replayed (those after the snapshot, if one was loaded).
    pub records_replayed_at_open: u64,
    /// `open` loaded the snapshot and replayed only the log after it.
    pub opened_from_snapshot: bool,
    /// Why `open` found a snapshot but did not trust it (it replayed the whole log).
    pub snapshot_rejected: Option<String>,
}

/// What a verify pass read; any problem is an error instead.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VerifyReport {
    pub segments: u64,
    pub records: u64,
    pub bytes: u64,
}

/// What [`Store::repair`](crate::Store::repair) kept and dropped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RepairReport {
    /// Records in the salvaged prefix.
    pub records_kept: u64,
    /// Segment id and offset of the first bad byte found, if any (it may lie
    /// inside the record that repair cut, which starts at or before it).
    pub first_bad: Option<(u64, u64)>,
    pub bytes_dropped: u64,
    pub segments_dropped: u64,
    /// Where the dropped bytes were moved instead of being deleted.
    pub lost_found: Option<PathBuf>,
}
