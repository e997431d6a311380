//! How a store is opened: durability, conflict policy, limits, clock and storage.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::storage::{OsStorage, Storage};

/// When `apply_batch` may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Data is synced to stable storage before `apply_batch` returns: a
    /// committed batch survives power loss. Concurrent callers share syncs.
    #[default]
    Sync,
    /// Data is handed to the OS before `apply_batch` returns: a committed
    /// batch survives a crash of the process, not a power loss.
    Buffered,
}

/// What to do with a delivery that cannot be applied: a conflicting event id
/// (same id, other payload) or an invalid event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnConflict {
    /// Fail the whole batch; nothing of it is applied.
    #[default]
    Fail,
    /// Store the delivery in the quarantine, count it `rejected`, commit the rest.
    Quarantine,
}

/// Options for [`Store::open`](crate::Store::open).
///
/// Fields are public so that `Options { durability, ..Options::default() }`
/// works; each also has a builder method of the same name.
#[derive(Debug, Clone)]
pub struct Options {
    /// When `apply_batch` returns (default: `Sync`).
    pub durability: Durability,
    /// Policy for conflicting and invalid deliveries (default: `Fail`).
    pub on_conflict: OnConflict,
    /// A segment is sealed and a new one started once it reaches this size
    /// (at most 4 GiB − 1: a larger one acts as that).
    pub segment_bytes_max: u64,
    /// Largest value a `Put` may carry (at most 512 MiB, half the largest
    /// record: a larger one acts as that).
    pub value_bytes_max: usize,
    /// How long a seen event id proves a redelivery a duplicate (default 7
    /// days; `None`: forever). See DESIGN.md, "Expiry".
    pub seen_ttl: Option<Duration>,
    /// How long a committed batch id makes a redelivered batch a replay
    /// (default 7 days; `None`: forever).
    pub batch_ttl: Option<Duration>,
    /// How long a tombstone holds back older puts (default `None`: forever).
    /// An expired tombstone lets a put older than the delete resurrect the key.
    pub tombstone_ttl: Option<Duration>,
    /// Once this many bytes of log were written since the last snapshot (or
    /// compaction), and at least as many as that snapshot holds,
    /// `apply_batch` writes a snapshot after its batch commits, so that an
    /// open after a crash replays at most about this much log (default
    /// 32 MiB; `None`: snapshots only on close and
    /// [`Store::snapshot`](crate::Store::snapshot)). Writers pause while
    /// the index is written to the page cache, not for its sync.
    pub snapshot_log_bytes: Option<u64>,
    /// Under `Durability::Sync`, fill the newest log segment with zeros
    /// ahead of its records, on a thread of the store's own, so that commit
    /// syncs find the blocks they write allocated and write data alone
    /// (DESIGN.md, "Zero-filled segments"; default `true`). Turn it off on
    /// copy-on-write file systems (btrfs, ZFS), where every overwrite
    /// allocates anyway and the zeros would be written for nothing. Linux
    /// only: it relies on Linux reporting a write-back error to every open
    /// file description.
    pub zero_fill: bool,
    /// Time source, recorded in each batch record.
    pub clock: Arc<dyn Clock>,
    /// All file-system access goes through this.
    pub storage: Arc<dyn Storage>,
}

const WEEK: Duration = Duration::from_secs(7 * 24 * 60 * 60);

impl Default for Options {
    fn default() -> Self {
        Self {
            durability: Durability::Sync,
            on_conflict: OnConflict::Fail,
            segment_bytes_max: 64 << 20,
            value_bytes_max: 1 << 20,
            seen_ttl: Some(WEEK),
            batch_ttl: Some(WEEK),
            tombstone_ttl: None,
            snapshot_log_bytes: Some(32 << 20),
            zero_fill: true,
            clock: Arc::new(SystemClock),
            storage: Arc::new(OsStorage),
        }
    }
}

/// The largest segment: offsets in a segment are `u32`.
const SEGMENT_BYTES_LIMIT: u64 = u32::MAX as u64;
/// The largest value: half the largest record body, so that a batch holding
/// one fails on that delivery, which names it, rather than as a whole.
const VALUE_BYTES_LIMIT: usize = crate::format::RECORD_BODY_BYTES_MAX / 2;

impl Options {
    /// The options as the store applies them: sizes beyond what the format
    /// holds capped (`u64::MAX` for a segment made `open` fail to map it).
    pub(crate) fn within_limits(mut self) -> Self {
        self.segment_bytes_max = self.segment_bytes_max.min(SEGMENT_BYTES_LIMIT);
        self.value_bytes_max = self.value_bytes_max.min(VALUE_BYTES_LIMIT);
        self
    }

    /// Sets [`Options::durability`].
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets [`Options::on_conflict`].
    #[must_use]
    pub fn on_conflict(mut self, on_conflict: OnConflict) -> Self {
        self.on_conflict = on_conflict;
        self
    }

    /// Sets [`Options::segment_bytes_max`].
    #[must_use]
    pub fn segment_bytes_max(mut self, bytes: u64) -> Self {
        self.segment_bytes_max = bytes;
        self
    }

    /// Sets [`Options::value_bytes_max`].
    #[must_use]
    pub fn value_bytes_max(mut self, bytes: usize) -> Self {
        self.value_bytes_max = bytes;
        self
    }

    /// Sets [`Options::seen_ttl`].
    #[must_use]
    pub fn seen_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.seen_ttl = ttl;
        self
    }

    /// Sets [`Options::batch_ttl`].
    #[must_use]
    pub fn batch_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.batch_ttl = ttl;
        self
    }

    /// Sets [`Options::tombstone_ttl`].
    #[must_use]
    pub fn tombstone_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.tombstone_ttl = ttl;
        self
    }

    /// Sets [`Options::snapshot_log_bytes`].
    #[must_use]
    pub fn snapshot_log_bytes(mut self, bytes: Option<u64>) -> Self {
        self.snapshot_log_bytes = bytes;
        self
    }

    /// Sets [`Options::zero_fill`].
    #[must_use]
    pub fn zero_fill(mut self, zero_fill: bool) -> Self {
        self.zero_fill = zero_fill;
        self
    }

    /// Sets [`Options::clock`].
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Sets [`Options::storage`].
    #[must_use]
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }
}
