//! The logical-state digest: xxh3-128 over live rows in key order (key, seq,
//! value), then checkpoints in source order. It depends on nothing else: not
//! on history, segment layout, tombstones or compaction.

use std::fmt;

use xxhash_rust::xxh3::Xxh3;

/// A 128-bit digest of a store's logical state; displays as 32 lowercase hex chars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub u128);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Builds a digest from the state fed to it in canonical order.
pub(crate) struct DigestBuilder {
    hasher: Xxh3,
    rows_done: bool,
}

impl DigestBuilder {
    pub(crate) fn new() -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(b"idemkv-digest-v1");
        Self {
            hasher,
            rows_done: false,
        }
    }

    fn field(&mut self, bytes: &[u8]) {
        self.hasher.update(&(bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
    }

    /// Feeds one live row; rows must come in ascending key order.
    pub(crate) fn row(&mut self, key: &[u8], seq: u64, value: &[u8]) {
        debug_assert!(!self.rows_done, "rows must come before checkpoints");
        self.hasher.update(b"R");
        self.field(key);
        self.hasher.update(&seq.to_le_bytes());
        self.field(value);
    }

    /// Feeds one checkpoint; checkpoints come after all rows, in ascending source order.
    pub(crate) fn checkpoint(&mut self, source: &[u8], position: &[u8]) {
        self.rows_done = true;
        self.hasher.update(b"C");
        self.field(source);
        self.field(position);
    }

    pub(crate) fn finish(self) -> Digest {
        Digest(self.hasher.digest128())
    }
}
