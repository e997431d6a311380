//! Key -> (seq, live value location or tombstone), in key order.
//!
//! Memory is the constraint: at most 56 bytes plus the key's own bytes per
//! key held, live or tombstone (DESIGN.md, "Index memory"). `get` and `set`
//! run for every delivery, so they take one hash probe. The index makes no
//! allocation per key:
//!
//! - The **arena** (`arena.rs`) holds one *record* per key, back to back in chunks of
//!   256 KiB: the seq, the value location (with its CRC and fingerprint) or
//!   tombstone time, the key's length and the key's bytes, 34 bytes plus the
//!   key, padded to 4. A record's
//!   *address* is a `u32` counted in 4-byte units (so at most 16 GiB of
//!   records). A record never straddles two chunks, and never moves until a
//!   purge rebuilds the arena.
//! - The **table** (`addr_table.rs`) holds the addresses, hashed by key with
//!   xxh3 and a random seed per index: 4 bytes and one tag byte per bucket.
//!   A lookup compares keys only in the records whose tag matches, usually
//!   one. `prefetch` lets the planner start a later lookup's cache misses.
//! - Key order (`order.rs`) is kept in three sorted lists of addresses: the **run** (the
//!   oldest records), the **mid** (newer) and the **tail** (the newest, at
//!   most 512). A new key is inserted into the tail by binary search. A tail
//!   that outgrows 512 merges into the mid, and a mid that outgrows an
//!   eighth of the run (at least 1,024, at most 32,768 keys) merges into the
//!   run: in place from the back, so that each old entry moves once, after
//!   finding every new entry's place, by one prefetched walk up the list
//!   merged into while it holds at most 8 entries per new one, otherwise by
//!   binary searches run eight at a time so that their cache misses
//!   overlap. A merge into the run costs O(run) moves of 4 bytes, and a
//!   walk of the run or O(mid log run) comparisons: the mid's cap keeps
//!   that pause to tens of milliseconds at ten million keys.
//!   While the mid and the tail are empty, a key above every key in the run
//!   is appended to the run, which then grows by an eighth at a time.
//!   Loading a snapshot or a base segment, whose keys come in order, appends
//!   to the arena and the run and builds the table once at the end.
//!   `range_prefix` binary-searches the three lists and merges the stretches
//!   that match.
//!
//! Per key that is 34 + padding (record header) + 4 (run) + 5.7 to 11.4 (the
//! table, whose power-of-two bucket count is between 8/7 and 16/7 of its
//! length) bytes, plus at most one partly used chunk in all and under a byte
//! for the mid. Chunks grow by doubling up to their full size and are never
//! copied after that. The table doubles by being rebuilt in address order,
//! which reads the arena sequentially; its own resize would read it in
//! bucket order. That rebuild is still one pause of O(n) under the caller's
//! lock, about 0.17 s at seven million keys (it prefetches the buckets it
//! writes, a few records ahead).
//!
//! Why records rather than an array of fixed-size slots beside the key
//! bytes: a slot needs the key's location (8 bytes more per key) and a
//! second cache miss per key comparison, and comparisons are what lookups
//! and merges pay for. Why three levels: with two (the run and an unsorted
//! recent set), a prefix scan must pass over all recent keys, a share of
//! the whole index.
//!
//! A purge that drops anything rebuilds the arena in key order (so that
//! scans then read it sequentially), the run from it, and the table at its
//! smallest size; old and new arenas exist side by side meanwhile.
//!
//! Invariants: keys are unique; the table holds each record's address once,
//! under its key's hash; addresses grow with insertion; every record is in
//! exactly one of the run, the mid and the tail, each sorted by key; the tail
//! holds at most 512 records; `live` counts the live records.

mod arena;
mod order;

use std::fmt;
use std::hash::BuildHasher;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::addr_table::AddrTable;
use super::expiry::{is_expired, secs_to_ms};
use crate::format::ID_BYTES_MAX;
use crate::log::segments::ValueRef;
use arena::{Arena, decode_entry, encode_header, record_key};
use order::{LEVEL_PREFETCH_AHEAD, Level, key_eq, key_less, merge_into};

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
const _: () = assert!(std::mem::size_of::<KeyEntry>() == 40);

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

/// Sizes that shape the index. Tests shrink them to reach every chunk and
/// merge boundary with a few keys.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// Bytes per arena chunk: `1 << chunk_bits`, room for the longest record.
    chunk_bits: u32,
    /// The tail merges into the mid once it holds more records than this.
    tail_max: usize,
    /// The mid merges into the run once it holds more than
    /// `mid_max(run)`: `run / RUN_PER_MID`, within `mid_min..=MID_MAX`.
    mid_min: usize,
}

/// The mid holds up to an eighth of the run, so that a merge into the run
/// finds its places by one walk up the run (see `WALK_PER_FRESH`), and at
/// most `MID_MAX` keys, so that a merge into the mid moves at most 128 KiB
/// and one into a large run stays a pause of tens of milliseconds. Random
/// new keys into a buffered store, against a 128th and no walk: 400,000
/// keys 290-300 ms -> 245-265 ms; 4 million keys 5.6 s -> 5.2 s, batches'
/// median 481 -> 463 us, 99th percentile 15 -> 20 ms, worst 73 -> 75 ms.
const RUN_PER_MID: usize = 8;
const MID_MAX: usize = 1 << 15;

impl Geometry {
    const DEFAULT: Self = Self {
        chunk_bits: 18,
        tail_max: 512,
        mid_min: 1024,
    };

    fn mid_max(&self, run: usize) -> usize {
        (run / RUN_PER_MID).clamp(self.mid_min, MID_MAX.max(self.mid_min))
    }
}

/// Why a new key was refused: its record would need an address past the
/// last (`Arena::push`).
pub(crate) const ARENA_FULL: &str = "key index full: 2^32 addresses, 16 GiB of key records";

/// Records the table rebuild hashes ahead of the one it inserts.
const REBUILD_AHEAD: usize = 16;

fn hash_key(seed: u64, key: &[u8]) -> u64 {
    xxh3_64_with_seed(key, seed)
}

/// A key's hash under one `KeyIndex`'s seed (`KeyIndex::hash`); meaningless in any other.
/// Hashing one (into a map's hasher) feeds it the hash as one `u64`.
#[derive(Debug, Clone, Copy, Default, Hash)]
pub(crate) struct KeyHash(u64);

/// Ordered map of keys, with running counts for stats.
pub(crate) struct KeyIndex {
    /// Seeds the key hash, so that a source cannot aim keys at one bucket.
    seed: u64,
    geometry: Geometry,
    arena: Arena,
    table: AddrTable,
    /// The oldest records, in key order.
    run: Vec<u32>,
    /// Newer records, in key order.
    mid: Vec<u32>,
    /// The newest records, in key order.
    tail: Vec<u32>,
    live: u64,
}

impl Default for KeyIndex {
    fn default() -> Self {
        Self::with_geometry(Geometry::DEFAULT)
    }
}

impl fmt::Debug for KeyIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyIndex")
            .field("live", &self.live_count())
            .field("tombstones", &self.tombstone_count())
            .field("run", &self.run.len())
            .field("mid", &self.mid.len())
            .field("tail", &self.tail.len())
            .field("memory_bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

impl KeyIndex {
    fn with_geometry(geometry: Geometry) -> Self {
        Self {
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            geometry,
            arena: Arena::new(geometry.chunk_bits),
            table: AddrTable::default(),
            run: Vec::new(),
            mid: Vec::new(),
            tail: Vec::new(),
            live: 0,
        }
    }

    fn find(&self, key: &[u8]) -> Option<u32> {
        if self.table.is_empty() {
            // As the pending batches' shadow usually is: no key to hash for.
            return None;
        }
        let arena = &self.arena;
        self.table
            .find(hash_key(self.seed, key), |a| key_eq(arena.key(a), key))
    }

    /// `key`'s hash in this index, for a caller that prefetches a key and
    /// then sets it: one hash serves the three (`*_hashed`).
    pub(crate) fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash(hash_key(self.seed, key))
    }

    /// Asks the CPU to fetch the table lines a lookup of the key hashed
    /// `hash` (by this index) reads first.
    pub(crate) fn prefetch_hashed(&self, hash: KeyHash) {
        self.table.prefetch(hash.0);
    }

    /// Asks the CPU to fetch the record a lookup of the key hashed `hash`
    /// most likely ends on (best after `prefetch_hashed` had time to bring
    /// in the table lines).
    pub(crate) fn prefetch_record_hashed(&self, hash: KeyHash) {
        // The first tag match, keys uncompared: where the lookup most likely ends.
        if let Some(a) = self.table.find(hash.0, |_| true) {
            self.arena.prefetch(a);
        }
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<KeyEntry> {
        self.find(key).map(|a| self.arena.entry(a))
    }

    /// As `get`, for a key hashed by this index.
    pub(crate) fn get_hashed(&self, key: &[u8], KeyHash(hash): KeyHash) -> Option<KeyEntry> {
        debug_assert_eq!(hash, hash_key(self.seed, key), "hashed by this index");
        let arena = &self.arena;
        self.table
            .find(hash, |a| key_eq(arena.key(a), key))
            .map(|a| arena.entry(a))
    }

    /// Sets a key's entry, inserting the key if it is new.
    ///
    /// # Errors
    /// `ARENA_FULL` if the key is new and no address is left for its record.
    #[cfg(test)]
    pub(crate) fn set(&mut self, key: &[u8], entry: KeyEntry) -> Result<(), &'static str> {
        self.set_hashed(key, self.hash(key), entry)
    }

    /// As `set`, for `key` hashed by this index (`hash`).
    pub(crate) fn set_hashed(
        &mut self,
        key: &[u8],
        KeyHash(hash): KeyHash,
        entry: KeyEntry,
    ) -> Result<(), &'static str> {
        debug_assert_eq!(hash, hash_key(self.seed, key), "hashed by this index");
        let arena = &self.arena;
        let found = self.table.find(hash, |a| key_eq(arena.key(a), key));
        let was_live = match found {
            Some(a) => self.arena.set_entry(a, entry),
            None => {
                self.insert(hash, key, entry)?;
                false
            }
        };
        match (was_live, entry.value().is_some()) {
            (false, true) => self.live += 1,
            (true, false) => self.live -= 1,
            _ => {}
        }
        Ok(())
    }

    /// Whether new keys whose records take `bytes` (`record_bytes` of each)
    /// surely fit, with room to spare for the same keys packed in another
    /// order (`Arena::has_room_for`). The planner asks before a batch is
    /// written, so that a record the index cannot take is never logged.
    pub(crate) fn has_room_for(&self, bytes: u64) -> bool {
        self.arena.has_room_for(bytes)
    }

    /// Bytes of arena a new key of `key_len` bytes takes.
    pub(crate) fn record_bytes(key_len: usize) -> u64 {
        arena::record_bytes(key_len) as u64
    }

    fn insert(&mut self, hash: u64, key: &[u8], entry: KeyEntry) -> Result<(), &'static str> {
        assert!(
            key.len() <= ID_BYTES_MAX,
            "key of {} bytes exceeds {ID_BYTES_MAX}",
            key.len()
        );
        // Grown before the push: the rebuild reads every record in the arena.
        if self.table.len() == self.table.capacity() {
            self.rebuild_table(self.table.capacity() + 1);
        }
        let a = self
            .arena
            .push(&encode_header(entry, key.len()), key)
            .ok_or(ARENA_FULL)?;
        self.table.insert_unique(hash, a);
        let arena = &self.arena;
        // Keys that come in order (loading a snapshot or base segment, or a
        // source with increasing keys) extend the run directly.
        if self.tail.is_empty()
            && self.mid.is_empty()
            && self.run.last().is_none_or(|&b| arena.key(b) < key)
        {
            if self.run.len() == self.run.capacity() {
                // An eighth more, not double: the run is 4 bytes of a key's 56.
                self.run.reserve_exact(self.run.len() / 8 + 64);
            }
            self.run.push(a);
            return Ok(());
        }
        let at = self.tail.partition_point(|&b| key_less(arena.key(b), key));
        self.tail.insert(at, a);
        if self.tail.len() > self.geometry.tail_max {
            self.merge_tail();
            if self.mid.len() > self.geometry.mid_max(self.run.len()) {
                self.merge_mid();
            }
        }
        Ok(())
    }

    /// Appends a record while loading a state file, whose keys come sorted
    /// and unique, into an index that holds nothing else; `finish_bulk`
    /// must follow. The table is built once, at the end, reading the arena
    /// in order, rather than looked up and grown key by key.
    pub(crate) fn bulk_push(&mut self, key: &[u8], entry: KeyEntry) -> Result<(), &'static str> {
        let arena = &self.arena;
        if !self.table.is_empty() || !self.tail.is_empty() || !self.mid.is_empty() {
            return Err("keys loaded into an index in use");
        }
        if self.run.last().is_some_and(|&b| arena.key(b) >= key) {
            return Err("keys are not sorted and unique");
        }
        if self.run.len() == self.run.capacity() {
            self.run.reserve_exact(self.run.len() / 8 + 64);
        }
        let a = self
            .arena
            .push(&encode_header(entry, key.len()), key)
            .ok_or(ARENA_FULL)?;
        self.run.push(a);
        self.live += u64::from(entry.value().is_some());
        Ok(())
    }

    /// Ends a bulk load: builds the table.
    pub(crate) fn finish_bulk(&mut self) {
        if self.table.len() < self.run.len() {
            self.rebuild_table(self.run.len());
        }
    }

    /// Live rows and tombstones whose key starts with `prefix`, in key order.
    pub(crate) fn range_prefix<'a>(
        &'a self,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], KeyEntry)> + 'a {
        self.records_with(prefix)
            .map(|record| (record_key(record), decode_entry(record)))
    }

    /// The records whose key starts with `prefix`, in key order: the
    /// matching stretches of the run, the mid and the tail, merged.
    fn records_with<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
        let arena = &self.arena;
        let mut levels = [&self.run, &self.mid, &self.tail].map(|sorted| {
            let start = sorted.partition_point(|&a| arena.key(a) < prefix);
            let mut level = Level {
                rest: sorted.get(start..).unwrap_or_default().iter(),
                head: None,
            };
            level.advance(arena, prefix);
            level
        });
        std::iter::from_fn(move || {
            let mut first: Option<(usize, &[u8])> = None;
            for (i, level) in levels.iter().enumerate() {
                if let Some(key) = level.head.map(record_key)
                    && first.is_none_or(|(_, least)| key_less(key, least))
                {
                    first = Some((i, key));
                }
            }
            let level = levels.get_mut(first?.0)?;
            let record = level.head;
            level.advance(arena, prefix);
            record
        })
    }

    /// Moves live values: for each live key in key order, `to` returns the
    /// value's new location, or `None` to leave it.
    pub(crate) fn relocate(&mut self, mut to: impl FnMut(&[u8], ValueRef) -> Option<ValueRef>) {
        self.merge_tail();
        self.merge_mid();
        for (i, &a) in self.run.iter().enumerate() {
            if let Some(&ahead) = self.run.get(i + LEVEL_PREFETCH_AHEAD) {
                self.arena.prefetch(ahead);
            }
            let entry = self.arena.entry(a);
            if let KeyState::Live(v) = entry.state
                && let Some(moved) = to(self.arena.key(a), v)
            {
                let state = KeyState::Live(moved);
                self.arena.set_entry(a, KeyEntry { state, ..entry });
            }
        }
    }

    /// Drops tombstones expired at `now_ms`; returns how many.
    pub(crate) fn purge_tombstones(&mut self, ttl_ms: Option<u64>, now_ms: u64) -> u64 {
        if ttl_ms.is_none() {
            return 0;
        }
        let is_dropped = |record: &[u8]| decode_entry(record).is_expired_tombstone(ttl_ms, now_ms);
        let arena = &self.arena;
        let dropped = arena
            .records()
            .filter(|&a| is_dropped(arena.record(a)))
            .count();
        if dropped == 0 {
            return 0;
        }
        // Rebuild the arena in key order, without the dropped records.
        let kept = self.table.len() - dropped;
        self.table = AddrTable::default();
        let mut new_arena = arena.empty_like();
        let mut run = Vec::with_capacity(kept);
        for record in self.records_with(b"").filter(|&r| !is_dropped(r)) {
            // Fewer records than the old arena held, in another order, for
            // which `has_room_for` left room.
            let a = new_arena
                .push_copy(record)
                .expect("the kept records fit in a new arena");
            run.push(a);
        }
        assert_eq!(run.len(), kept, "a rebuilt arena holds every kept record");
        self.arena = new_arena;
        self.run = run;
        self.mid = Vec::new();
        self.tail.clear();
        self.rebuild_table(kept);
        dropped as u64
    }

    pub(crate) fn live_count(&self) -> u64 {
        self.live
    }

    pub(crate) fn tombstone_count(&self) -> u64 {
        self.table.len() as u64 - self.live
    }

    /// Heap bytes held, exactly: the arena's chunks and the three levels by
    /// capacity, and the table's allocation.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let levels = self.run.capacity() + self.mid.capacity() + self.tail.capacity();
        let levels = levels * std::mem::size_of::<u32>();
        (self.arena.memory_bytes() + self.table.allocation_size() + levels) as u64
    }

    /// Replaces the table by one with room for `capacity` records, filled
    /// in address order: the arena is read sequentially, where the table's
    /// own resize would read it in bucket order.
    fn rebuild_table(&mut self, capacity: usize) {
        let (seed, arena) = (self.seed, &self.arena);
        let mut table = AddrTable::with_capacity(capacity);
        // The arena is read in order but the table is written at random:
        // hash a few records ahead and prefetch their home buckets, so that
        // those writes overlap their cache misses.
        let mut ahead = std::collections::VecDeque::with_capacity(REBUILD_AHEAD + 1);
        for a in arena.records() {
            let hash = hash_key(seed, arena.key(a));
            table.prefetch(hash);
            ahead.push_back((hash, a));
            if ahead.len() > REBUILD_AHEAD
                && let Some((hash, a)) = ahead.pop_front()
            {
                table.insert_unique(hash, a);
            }
        }
        for (hash, a) in ahead {
            table.insert_unique(hash, a);
        }
        self.table = table;
    }

    /// Merges the tail into the mid.
    fn merge_tail(&mut self) {
        merge_into(&mut self.mid, &self.tail, &self.arena, false);
        self.tail.clear();
    }

    /// Merges the mid into the run. The run is kept at its exact length.
    fn merge_mid(&mut self) {
        merge_into(&mut self.run, &self.mid, &self.arena, true);
        self.mid.clear();
    }

    /// Lowers the arena chunks the index may hold (tests: the real limit
    /// is 16 GiB of key records).
    #[cfg(test)]
    pub(crate) fn limit_arena_chunks(&mut self, chunks_max: usize) {
        self.arena.limit_chunks(chunks_max);
    }

    /// Checks the invariants in the module doc (O(n log n): tests only).
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let arena = &self.arena;
        arena.check_invariants();
        let mut records = Vec::new();
        let mut live = 0;
        for a in arena.records() {
            assert!(records.last() < Some(&a), "addresses grow");
            records.push(a);
            let key = arena.key(a);
            assert!(key.len() <= ID_BYTES_MAX, "key length");
            assert_eq!(self.find(key), Some(a), "record {a} found by its key");
            if let KeyState::Live(_) = arena.entry(a).state {
                live += 1;
            }
        }
        assert_eq!(
            self.table.len(),
            records.len(),
            "one table entry per record"
        );
        assert_eq!(self.live, live, "live count");
        for sorted in [&self.run, &self.mid, &self.tail] {
            assert!(
                sorted.windows(2).all(|w| arena.key(w[0]) < arena.key(w[1])),
                "each level sorted by key, without duplicates"
            );
        }
        let mut levels: Vec<u32> = [&self.run, &self.mid, &self.tail]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        levels.sort_unstable();
        assert_eq!(levels, records, "each record in exactly one level");
        assert!(self.tail.len() <= self.geometry.tail_max, "tail length");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use proptest::sample::select;
    use xxhash_rust::xxh3::xxh3_64;

    use super::order::{insertion_points, insertion_points_by_walk};
    use super::*;

    /// Small chunks and merges, so that a few keys cross every boundary.
    const TINY: Geometry = Geometry {
        chunk_bits: 13,
        tail_max: 2,
        mid_min: 3,
    };

    #[test]
    fn a_new_key_past_the_arena_s_last_address_is_refused_and_the_index_stays_whole() {
        let mut index = KeyIndex::with_geometry(TINY);
        index.limit_arena_chunks(3);
        // Records of 1,052 bytes: 7 fill a chunk of 8 KiB, 21 the three.
        let key = |i: u64| format!("{i:04}").repeat(256).into_bytes();
        let mut held = 0;
        let refusal = loop {
            match index.set(&key(held), live(held, 1)) {
                Ok(()) => held += 1,
                Err(reason) => break reason,
            }
            assert!(held <= 21, "keys past the limit were taken");
        };
        assert_eq!((held, refusal), (21, ARENA_FULL));
        assert_eq!(index.get(&key(held)), None, "the refused key is not held");
        index
            .set(&key(0), live(99, 2))
            .expect("a known key needs no room");
        assert_eq!(index.get(&key(0)), Some(live(99, 2)));
        assert_eq!(
            keys_of(index.range_prefix(b"")),
            (0..held).map(key).collect::<Vec<_>>()
        );
        index.check_invariants();
        let mut loading = KeyIndex::with_geometry(TINY);
        loading.limit_arena_chunks(1);
        let loaded = (0..8).map(|i| loading.bulk_push(&key(i), live(i, 1)));
        assert_eq!(
            loaded.collect::<Vec<_>>(),
            [vec![Ok(()); 7], vec![Err(ARENA_FULL)]].concat(),
            "a state file's keys past the limit"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever `has_room_for` let in fits again when packed in another
        /// order (as a replay after a snapshot or a purge's rebuild packs
        /// it), and it refuses only near the limit that requires.
        #[test]
        fn what_has_room_fits_in_any_order_and_the_room_is_used(
            lens in prop::collection::vec(prop_oneof![Just(ID_BYTES_MAX), 1..=ID_BYTES_MAX], 1..64),
            per_check in 1..4usize,
        ) {
            // Chunks of 8 KiB, which records of up to 4,124 bytes may fill
            // only by half.
            const CHUNKS_MAX: usize = 40;
            let mut index = KeyIndex::with_geometry(TINY);
            index.limit_arena_chunks(CHUNKS_MAX);
            let key = |i: usize, len: usize| {
                let mut k = format!("{i:08}").into_bytes();
                k.resize(len.max(8), b'k');
                k
            };
            let mut keys = Vec::new();
            'fill: for round in 0.. {
                let batch: Vec<Vec<u8>> = (0..per_check)
                    .map(|j| keys.len() + j)
                    .map(|i| key(i, lens[(i + round) % lens.len()]))
                    .collect();
                let bytes = batch.iter().map(|k| KeyIndex::record_bytes(k.len())).sum();
                if !index.has_room_for(bytes) {
                    break 'fill;
                }
                for k in batch {
                    index.set(&k, live(1, 1)).expect("what has room fits");
                    keys.push(k);
                }
            }
            // Refused only once the chunks held, plus at most 4 for the
            // refused keys, could come to half the limit in another order.
            let used = index.arena.chunks_used();
            prop_assert!(used + 4 >= CHUNKS_MAX / 2, "{used} chunks used");
            let mut reversed = keys.clone();
            reversed.reverse();
            let mut shuffled = keys.clone();
            shuffled.sort_by_key(|k| xxh3_64(k));
            // The longest first: each takes a chunk that a shorter one
            // shared with it before.
            let mut longest_first = keys.clone();
            longest_first.sort_by_key(|k| std::cmp::Reverse(k.len()));
            for order in [reversed, shuffled, longest_first] {
                let mut again = KeyIndex::with_geometry(TINY);
                again.limit_arena_chunks(CHUNKS_MAX);
                for k in &order {
                    prop_assert!(again.set(k, live(1, 1)).is_ok(), "repacked");
                }
            }
        }
    }

    fn live(seq: u64, segment: u32) -> KeyEntry {
        KeyEntry {
            seq,
            state: KeyState::Live(ValueRef {
                segment,
                offset: 4,
                len: 1,
                crc: None,
                fingerprint: None,
            }),
        }
    }

    fn deleted(seq: u64, at_secs: u32) -> KeyEntry {
        KeyEntry {
            seq,
            state: KeyState::Deleted { at_secs },
        }
    }

    fn keys_of<'a>(it: impl Iterator<Item = (&'a [u8], KeyEntry)>) -> Vec<Vec<u8>> {
        it.map(|(k, _)| k.to_vec()).collect()
    }

    #[test]
    fn keys_come_back_in_order_across_merges() {
        let mut index = KeyIndex::with_geometry(TINY);
        let n = 2_000u64;
        for i in 0..n {
            let key = format!("k{:016x}", xxh3_64(&i.to_le_bytes()));
            index.set(key.as_bytes(), live(i, 1)).unwrap();
        }
        index.check_invariants();
        let keys = keys_of(index.range_prefix(b""));
        assert_eq!(keys.len() as u64, n);
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "ascending");
        assert_eq!(index.live_count(), n);
    }

    #[test]
    fn a_bulk_load_takes_sorted_keys_only_and_then_works_as_usual() {
        let mut index = KeyIndex::with_geometry(TINY);
        let n = 1_000u64;
        for i in 0..n {
            let entry = if i % 3 == 0 {
                deleted(i, 7)
            } else {
                live(i, 1)
            };
            index
                .bulk_push(format!("k{i:06}").as_bytes(), entry)
                .expect("sorted keys load");
        }
        assert_eq!(
            index.bulk_push(b"k000999", live(1, 1)),
            Err("keys are not sorted and unique")
        );
        assert_eq!(
            index.bulk_push(b"a", live(1, 1)),
            Err("keys are not sorted and unique")
        );
        index.finish_bulk();
        index.check_invariants();
        assert_eq!(index.live_count() + index.tombstone_count(), n);
        assert_eq!(index.get(b"k000004"), Some(live(4, 1)));
        assert_eq!(index.get(b"k000003"), Some(deleted(3, 7)));
        index.set(b"k000004", live(40, 2)).unwrap();
        index.set(b"new", live(1, 1)).unwrap();
        index.check_invariants();
        assert_eq!(index.get(b"k000004"), Some(live(40, 2)));
        assert_eq!(
            index.bulk_push(b"zzz", live(1, 1)),
            Err("keys loaded into an index in use")
        );
    }

    #[test]
    fn prefix_scans_merge_run_mid_and_tail() {
        let mut index = KeyIndex::with_geometry(Geometry {
            tail_max: 100,
            mid_min: 100,
            ..TINY
        });
        for key in ["b", "ab", "a", "abc", "b\0", "a\u{ff}", ""] {
            index.set(key.as_bytes(), live(1, 1)).unwrap();
        }
        index.merge_tail();
        index.merge_mid();
        for key in ["aa", "ba", "abb"] {
            index.set(key.as_bytes(), deleted(2, 5)).unwrap();
        }
        index.merge_tail();
        for key in ["abd", "a\0", "bb"] {
            index.set(key.as_bytes(), live(3, 1)).unwrap();
        }
        assert_eq!(
            (index.run.len(), index.mid.len(), index.tail.len()),
            (7, 3, 3)
        );
        index.check_invariants();
        let scan = |p: &str| keys_of(index.range_prefix(p.as_bytes()));
        let strs = |v: &[&str]| v.iter().map(|s| s.as_bytes().to_vec()).collect::<Vec<_>>();
        assert_eq!(scan("ab"), strs(&["ab", "abb", "abc", "abd"]));
        assert_eq!(
            scan("a"),
            strs(&["a", "a\0", "aa", "ab", "abb", "abc", "abd", "a\u{ff}"])
        );
        assert_eq!(scan("b"), strs(&["b", "b\0", "ba", "bb"]));
        assert_eq!(scan("c"), strs(&[]));
        assert_eq!(scan("").len(), 13);
        assert_eq!(index.tombstone_count(), 3);
    }

    #[test]
    fn purge_drops_expired_tombstones_and_keeps_the_rest_findable() {
        let mut index = KeyIndex::with_geometry(TINY);
        for i in 0..500u32 {
            let key = format!("key{i:03}");
            let entry = if i % 3 == 0 {
                deleted(u64::from(i), i % 2)
            } else {
                live(u64::from(i), i)
            };
            index.set(key.as_bytes(), entry).unwrap();
        }
        // Tombstones at second 0 expire at 1 000 ms with a 1 000 ms TTL;
        // those at second 1 do not yet.
        assert_eq!(index.purge_tombstones(None, 1_000), 0);
        assert_eq!(index.purge_tombstones(Some(1_000), 1_000), 84);
        index.check_invariants();
        assert_eq!(index.get(b"key000"), None);
        assert_eq!(index.get(b"key003"), Some(deleted(3, 1)));
        assert_eq!(index.get(b"key499"), Some(live(499, 499)));
        index.set(b"key000", live(7, 7)).unwrap();
        index.check_invariants();
        assert_eq!(index.get(b"key000"), Some(live(7, 7)));
        assert_eq!(index.live_count(), 334);
        assert_eq!(index.tombstone_count(), 83);
    }

    #[derive(Debug, Clone)]
    enum Step {
        Set(Vec<u8>, KeyEntry),
        Purge {
            ttl_ms: Option<u64>,
            now_ms: u64,
        },
        /// Moves the live values of segments below this one up by 10.
        Relocate(u32),
        Scan(Vec<u8>),
    }

    const ALPHABET: [u8; 4] = [b'a', b'b', 0, 0xff];

    fn short_key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(select(&ALPHABET[..]), 0..5)
    }

    /// Mostly short keys that share prefixes, some up to the longest allowed.
    fn key() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            9 => short_key(),
            1 => (short_key(), 1..=ID_BYTES_MAX, select(&ALPHABET[..])).prop_map(
                |(mut key, len, fill)| {
                    key.resize(len.max(key.len()), fill);
                    key
                }
            ),
        ]
    }

    fn entry() -> impl Strategy<Value = KeyEntry> {
        let state = prop_oneof![
            (
                0..4u32,
                any::<u32>(),
                any::<u32>(),
                proptest::option::of(any::<u32>())
            )
                .prop_map(|(segment, offset, len, crc)| {
                    KeyState::Live(ValueRef {
                        segment,
                        offset,
                        len,
                        crc,
                        fingerprint: None,
                    })
                }),
            (0..20u32).prop_map(|at_secs| KeyState::Deleted { at_secs }),
        ];
        (any::<u64>(), state).prop_map(|(seq, state)| KeyEntry { seq, state })
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            12 => (key(), entry()).prop_map(|(k, e)| Step::Set(k, e)),
            1 => (prop::option::of(0..10_000u64), 0..25_000u64)
                .prop_map(|(ttl_ms, now_ms)| Step::Purge { ttl_ms, now_ms }),
            1 => (0..5u32).prop_map(Step::Relocate),
            2 => prop::collection::vec(select(&ALPHABET[..]), 0..3).prop_map(Step::Scan),
        ]
    }

    fn check_against(index: &KeyIndex, model: &BTreeMap<Vec<u8>, KeyEntry>, probes: &[Vec<u8>]) {
        index.check_invariants();
        let all: Vec<(Vec<u8>, KeyEntry)> = index
            .range_prefix(b"")
            .map(|(k, e)| (k.to_vec(), e))
            .collect();
        let expected: Vec<(Vec<u8>, KeyEntry)> =
            model.iter().map(|(k, e)| (k.clone(), *e)).collect();
        assert_eq!(all, expected, "full iteration");
        let live = model.values().filter(|e| e.value().is_some()).count() as u64;
        assert_eq!(index.live_count(), live, "live count");
        assert_eq!(
            index.tombstone_count(),
            model.len() as u64 - live,
            "tombstone count"
        );
        for (k, e) in model {
            assert_eq!(index.get(k), Some(*e), "get {k:?}");
        }
        for k in probes {
            assert_eq!(index.get(k), model.get(k).copied(), "probe {k:?}");
        }
    }

    /// Keys up to 20 bytes over a few byte values, zeros included:
    /// prefixes, ties on the first 8 bytes and zero padding all come up.
    fn compared_key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(select(&ALPHABET[..]), 0..20)
    }

    /// Two keys: independent, or the second the first with one byte changed.
    fn compared_pair() -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
        prop_oneof![
            (compared_key(), compared_key()),
            (compared_key(), any::<usize>(), select(&ALPHABET[..])).prop_map(|(a, i, byte)| {
                let mut b = a.clone();
                if let Some(at) = i.checked_rem(b.len()) {
                    b[at] = byte;
                }
                (a, b)
            }),
        ]
    }

    proptest! {
        #[test]
        fn a_walk_and_binary_searches_find_the_same_places(
            keys in prop::collection::btree_set(compared_key(), 0..200),
            fresh_picks in prop::collection::vec(any::<bool>(), 200),
        ) {
            // Keys pushed in a shuffled order, so that addresses and key
            // order differ as in a live index.
            let mut arena = Arena::new(TINY.chunk_bits);
            let mut pushed: Vec<(Vec<u8>, u32)> = keys
                .iter()
                .rev()
                .map(|k| (k.clone(), arena.push(&encode_header(live(1, 1), k.len()), k).unwrap()))
                .collect();
            pushed.sort();
            let (mut sorted, mut fresh) = (Vec::new(), Vec::new());
            for ((_, a), is_fresh) in pushed.iter().zip(&fresh_picks) {
                if *is_fresh { fresh.push(*a) } else { sorted.push(*a) }
            }
            prop_assert_eq!(
                insertion_points_by_walk(&sorted, &fresh, &arena),
                insertion_points(&sorted, &fresh, &arena)
            );
        }
    }

    proptest! {
        // Cheap cases, and many: a one-byte difference at each position of
        // each length must come up.
        #![proptest_config(ProptestConfig::with_cases(8192))]

        #[test]
        fn integer_key_compares_agree_with_slice_order((a, b) in compared_pair()) {
            prop_assert_eq!(key_less(&a, &b), a < b);
            prop_assert_eq!(key_eq(&a, &b), a == b);
            prop_assert!(key_eq(&a, &a.clone()));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn index_matches_a_btreemap_model(
            steps in prop::collection::vec(step(), 1..120),
            probes in prop::collection::vec(key(), 0..8),
        ) {
            let mut index = KeyIndex::with_geometry(TINY);
            let mut model: BTreeMap<Vec<u8>, KeyEntry> = BTreeMap::new();
            for step in steps {
                match step {
                    Step::Set(key, entry) => {
                        index.set(&key, entry).unwrap();
                        model.insert(key, entry);
                    }
                    Step::Purge { ttl_ms, now_ms } => {
                        let before = model.len();
                        if ttl_ms.is_some() {
                            model.retain(|_, e| !e.is_expired_tombstone(ttl_ms, now_ms));
                        }
                        let purged = index.purge_tombstones(ttl_ms, now_ms);
                        prop_assert_eq!(purged, (before - model.len()) as u64);
                    }
                    Step::Relocate(below) => {
                        let mut seen = Vec::new();
                        index.relocate(|key, v| {
                            seen.push(key.to_vec());
                            (v.segment < below).then_some(ValueRef {
                                segment: v.segment + 10,
                                ..v
                            })
                        });
                        let live: Vec<Vec<u8>> = model
                            .iter()
                            .filter(|(_, e)| e.value().is_some())
                            .map(|(k, _)| k.clone())
                            .collect();
                        prop_assert_eq!(seen, live, "relocate visits live keys in order");
                        for e in model.values_mut() {
                            if let KeyState::Live(v) = &mut e.state
                                && v.segment < below
                            {
                                v.segment += 10;
                            }
                        }
                    }
                    Step::Scan(prefix) => {
                        let got: Vec<(Vec<u8>, KeyEntry)> = index
                            .range_prefix(&prefix)
                            .map(|(k, e)| (k.to_vec(), e))
                            .collect();
                        let want: Vec<(Vec<u8>, KeyEntry)> = model
                            .range(prefix.clone()..)
                            .take_while(|(k, _)| k.starts_with(&prefix))
                            .map(|(k, e)| (k.clone(), *e))
                            .collect();
                        prop_assert_eq!(got, want, "scan {:?}", prefix);
                    }
                }
                check_against(&index, &model, &probes);
            }
        }
    }

    /// A 12-byte key in random order: "k" and 11 hex digits of a hash.
    fn random_key(i: u64) -> Vec<u8> {
        format!("k{:011x}", xxh3_64(&i.to_le_bytes()) >> 20).into_bytes()
    }

    fn assert_within_budget(index: &KeyIndex, when: &str) -> f64 {
        let keys = index.live_count() + index.tombstone_count();
        let key_bytes: u64 = index.range_prefix(b"").map(|(k, _)| k.len() as u64).sum();
        let per_key = index.memory_bytes() as f64 / keys as f64;
        let budget = 56.0 + key_bytes as f64 / keys as f64;
        assert!(
            per_key <= budget,
            "{per_key:.2} bytes per key {when}, budget {budget:.2}"
        );
        per_key
    }

    #[test]
    fn memory_stays_within_budget_when_keys_arrive_in_order() {
        let mut index = KeyIndex::default();
        let mut keys: Vec<Vec<u8>> = (0..200_000).map(random_key).collect();
        keys.sort();
        keys.dedup();
        for (i, key) in keys.iter().enumerate() {
            index.set(key, live(i as u64, 1)).unwrap();
            if i >= 50_000 && i % 5_003 == 0 {
                assert_within_budget(&index, &format!("at {i} in order"));
            }
        }
        assert_eq!(index.run.len(), keys.len(), "keys in order go to the run");
        index.check_invariants();
        let per_key = assert_within_budget(&index, "after an in-order load");
        println!("key index bytes per key after an in-order load: {per_key:.2}");
    }

    #[test]
    fn memory_stays_within_56_bytes_plus_the_key_per_key() {
        let mut index = KeyIndex::default();
        let n = 200_000u64;
        let mut worst: f64 = 0.0;
        for i in 0..n {
            index.set(&random_key(i), live(i, 1)).unwrap();
            // Below about 50 000 keys the partly used chunks weigh more.
            if i >= 50_000 && i % 5_003 == 0 {
                worst = worst.max(assert_within_budget(&index, &format!("at {i}")));
            }
        }
        let full = assert_within_budget(&index, "after inserts");
        for i in 0..n {
            let j = xxh3_64(&(i + n).to_le_bytes()) % n;
            index.set(&random_key(j), live(i, 2)).unwrap();
        }
        let updated = assert_within_budget(&index, "after updates");
        for i in 0..n * 3 / 4 {
            index.set(&random_key(i), deleted(i, 1)).unwrap();
        }
        let deleted_share = assert_within_budget(&index, "after deletes");
        index.purge_tombstones(Some(1_000), 2_000);
        assert_eq!(index.tombstone_count(), 0);
        let purged = assert_within_budget(&index, "after purge");
        for i in n..n + 50_000 {
            index.set(&random_key(i), live(i, 3)).unwrap();
        }
        let refilled = assert_within_budget(&index, "after refill");
        println!(
            "key index bytes per key (12-byte keys, budget 60): worst while inserting \
             {worst:.2}, at {n} {full:.2}, after updates {updated:.2}, after deletes \
             {deleted_share:.2}, after purge {purged:.2}, after refill {refilled:.2}"
        );
    }
}
