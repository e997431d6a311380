//! Key -> (seq, live value location or tombstone).

use std::collections::BTreeMap;
use std::ops::Bound;

use super::expiry::{is_expired, secs_to_ms};
use crate::log::segments::ValueRef;

/// A key's current version and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntry {
    pub seq: u64,
    pub state: KeyState,
}

/// A live row's value location, or a tombstone with the second it was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyState {
    Live(ValueRef),
    Deleted { at_secs: u32 },
}
const _: () = assert!(std::mem::size_of::<KeyEntry>() == 24);

impl KeyEntry {
    /// The live value's location; `None` for a tombstone.
    pub(crate) fn value(&self) -> Option<ValueRef> {
        match self.state {
            KeyState::Live(v) => Some(v),
            KeyState::Deleted { .. } => None,
        }
    }

    /// Whether this is a tombstone that has expired at `now_ms`.
    pub(crate) fn is_expired_tombstone(&self, ttl_ms: Option<u64>, now_ms: u64) -> bool {
        match self.state {
            KeyState::Live(_) => false,
            KeyState::Deleted { at_secs } => is_expired(secs_to_ms(at_secs), ttl_ms, now_ms),
        }
    }
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

    /// Sets a key's entry.
    pub(crate) fn set(&mut self, key: &[u8], entry: KeyEntry) {
        let old = match self.map.get_mut(key) {
            Some(slot) => Some(std::mem::replace(slot, entry)),
            None => {
                self.key_bytes += key.len() as u64;
                self.map.insert(key.into(), entry);
                None
            }
        };
        let was_live = old.is_some_and(|o| o.value().is_some());
        match (was_live, entry.value().is_some()) {
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

    /// Moves live values: for each live key in key order, `to` returns the
    /// value's new location, or `None` to leave it.
    pub(crate) fn relocate(&mut self, mut to: impl FnMut(&[u8], ValueRef) -> Option<ValueRef>) {
        for (key, entry) in &mut self.map {
            if let KeyState::Live(v) = entry.state
                && let Some(moved) = to(key, v)
            {
                entry.state = KeyState::Live(moved);
            }
        }
    }

    /// Drops tombstones expired at `now_ms`; returns how many.
    pub(crate) fn purge_tombstones(&mut self, ttl_ms: Option<u64>, now_ms: u64) -> u64 {
        if ttl_ms.is_none() {
            return 0;
        }
        let before = self.map.len();
        let mut freed = 0u64;
        self.map.retain(|k, e| {
            let keep = !e.is_expired_tombstone(ttl_ms, now_ms);
            if !keep {
                freed += k.len() as u64;
            }
            keep
        });
        self.key_bytes -= freed;
        (before - self.map.len()) as u64
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
