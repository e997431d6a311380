//! Dedup semantics, pure: what each delivery of a batch means (SPEC section 3)
//! and the one record that commits it. Nothing here does I/O; the state is
//! read through [`StateView`].

pub(crate) mod classify;
pub(crate) mod plan;

use bytes::Bytes;

use crate::error::Result;
use crate::index::keys::{KeyEntry, KeyHash};
use crate::log::segments::ValueRef;

/// The committed state a batch is planned against, as of the batch's commit
/// time: expired tombstones and seen ids are already hidden.
pub(crate) trait StateView {
    /// `key`'s hash, which the calls below that take one need: a batch's
    /// key is hashed once for its lookup and the prefetches before it.
    fn key_hash(&self, key: &[u8]) -> KeyHash;
    /// A key's version and live value or tombstone; `hash` is `key_hash(key)`.
    fn key(&self, key: &[u8], hash: KeyHash) -> Option<KeyEntry>;
    /// A stored value's bytes (checksum verified).
    fn read_value(&self, value: ValueRef) -> Result<Bytes>;
    /// Whether a stored value equals `candidate`, whose CRC-32 is `candidate_crc`.
    fn value_equals(&self, value: ValueRef, candidate: &[u8], candidate_crc: u32) -> Result<bool>;
    /// The payload hash recorded for a seen event id.
    fn seen(&self, id_hash: u128) -> Option<u64>;
    /// A hint that `seen(id_hash)` follows shortly.
    fn prefetch_seen(&self, _id_hash: u128) {}
    /// A hint that the lookup of the key hashed `hash` follows in a while:
    /// fetch what it reads first.
    fn prefetch_key(&self, _hash: KeyHash) {}
    /// A hint that the lookup of the key hashed `hash` follows shortly,
    /// after `prefetch_key`: fetch the entry it most likely ends on.
    fn prefetch_key_entry(&self, _hash: KeyHash) {}
    /// The seq at or below which a new-looking `Add` on `key` is `too_late`.
    fn add_floor(&self, key: &[u8]) -> Option<u64>;
}
