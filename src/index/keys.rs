//! Key -> (seq, value location). Tombstones are entries without a value.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::log::segments::ValueRef;

/// A key's current version and, when live, where its value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    pub seq: u64,
    /// `None` is a tombstone.
    pub value: Option<ValueRef>,
}

/// Ordered map of keys, with running counts for stats.
#[derive(Debug, Default)]
pub(crate) struct KeyIndex {
    map: BTreeMap<Box<[u8]>, KeyEntry>,
    live: u64,
    key_bytes: u64,
}

impl KeyIndex {
    pub(crate) fn get(&self, key: &[u8]) -> Option<KeyEntry> {
        self.map.get(key).copied()
    }

    /// Sets a key's entry. Versions never go backwards.
    pub(crate) fn set(&mut self, key: &[u8], entry: KeyEntry) {
        let old = match self.map.get_mut(key) {
            Some(slot) => Some(std::mem::replace(slot, entry)),
            None => {
                self.key_bytes += key.len() as u64;
                self.map.insert(key.into(), entry);
                None
            }
        };
        debug_assert!(
            old.is_none_or(|o| o.seq <= entry.seq),
            "key version went backwards"
        );
        let was_live = old.is_some_and(|o| o.value.is_some());
        match (was_live, entry.value.is_some()) {
            (false, true) => self.live += 1,
            (true, false) => self.live -= 1,
            _ => {}
        }
    }

    /// Live rows and tombstones whose key starts with `prefix`, in key order.
    pub(crate) fn range_prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], KeyEntry)> + 'a {
        self.map
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(k, e)| (&k[..], *e))
    }

    pub(crate) fn live_count(&self) -> u64 {
        self.live
    }

    pub(crate) fn tombstone_count(&self) -> u64 {
        self.map.len() as u64 - self.live
    }

    /// Estimated heap bytes: each key's own allocation plus a B-tree slot
    /// (boxed key pointer and entry), at the B-tree's typical two-thirds fill.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let slot = (std::mem::size_of::<Box<[u8]>>() + std::mem::size_of::<KeyEntry>()) as u64;
        let n = self.map.len() as u64;
        self.key_bytes + n * (slot * 3 / 2 + 8)
    }
}
