//! Seen event ids: xxh3-128 of the event id -> payload hash.
//!
//! Memory is the constraint (at most 32 bytes per id, see DESIGN.md), so the
//! bulk of the ids live in one sorted array of 24-byte entries with a small
//! bucket directory over the top bits of the hash, and only recent inserts
//! live in a hash map. When the map outgrows a fraction of the array it is
//! merged in place, from the back, into the array.
//!
//! Invariants: `run` is sorted by id and holds no duplicates; no id is in
//! both `run` and `recent`; `dir[b]..dir[b + 1]` is exactly the range of
//! `run` whose ids have top bits `b`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// One seen id. `[u64; 2]` rather than `u128` keeps the entry 8-aligned and
/// 24 bytes long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Entry {
    id: [u64; 2],
    payload: u64,
}
const _: () = assert!(std::mem::size_of::<Entry>() == 24);

fn split(id: u128) -> [u64; 2] {
    [(id >> 64) as u64, id as u64]
}

/// The ids are already uniform hashes: the map needs no further hashing.
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

/// Recent inserts merge into the sorted run once they exceed
/// `max(RECENT_MIN, run / RECENT_FRACTION)`.
const RECENT_MIN: usize = 4096;
const RECENT_FRACTION: usize = 16;
/// Target entries per directory bucket.
const BUCKET_ENTRIES: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct SeenIndex {
    run: Vec<Entry>,
    dir: Vec<u32>,
    dir_bits: u32,
    recent: HashMap<[u64; 2], u64, BuildHasherDefault<IdHasher>>,
}

impl SeenIndex {
    /// The payload hash recorded for `id`, if it was seen.
    pub(crate) fn get(&self, id: u128) -> Option<u64> {
        let id = split(id);
        if let Some(&p) = self.recent.get(&id) {
            return Some(p);
        }
        let bucket = self.bucket_of(id);
        let lo = *self.dir.get(bucket)? as usize;
        let hi = *self.dir.get(bucket + 1)? as usize;
        let slice = self.run.get(lo..hi)?;
        slice
            .binary_search_by(|e| e.id.cmp(&id))
            .ok()
            .and_then(|i| slice.get(i))
            .map(|e| e.payload)
    }

    /// Records `id`. The caller has checked that it is not seen yet.
    pub(crate) fn insert(&mut self, id: u128, payload: u64) {
        debug_assert!(self.get(id).is_none(), "seen id inserted twice");
        self.recent.insert(split(id), payload);
        if self.recent.len() > RECENT_MIN.max(self.run.len() / RECENT_FRACTION) {
            self.merge();
        }
    }

    pub(crate) fn len(&self) -> u64 {
        (self.run.len() + self.recent.len()) as u64
    }

    /// Heap bytes held: the run and directory exactly, the map by capacity.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let run = self.run.capacity() * std::mem::size_of::<Entry>();
        let dir = self.dir.capacity() * std::mem::size_of::<u32>();
        // hashbrown: one slot of (key, value) plus one control byte per bucket.
        let recent = self.recent.capacity() * (std::mem::size_of::<([u64; 2], u64)>() + 1);
        (run + dir + recent) as u64
    }

    fn bucket_of(&self, id: [u64; 2]) -> usize {
        if self.dir_bits == 0 {
            0
        } else {
            (id[0] >> (64 - self.dir_bits)) as usize
        }
    }

    /// Moves the recent ids into the sorted run, in place from the back, and
    /// rebuilds the directory.
    #[expect(
        clippy::indexing_slicing,
        reason = "indices are bounded by the merge loop's invariants"
    )]
    fn merge(&mut self) {
        let mut fresh: Vec<Entry> = self
            .recent
            .drain()
            .map(|(id, payload)| Entry { id, payload })
            .collect();
        self.recent.shrink_to(RECENT_MIN);
        fresh.sort_unstable();
        let old_len = self.run.len();
        self.run.reserve_exact(fresh.len());
        self.run.resize(
            old_len + fresh.len(),
            Entry {
                id: [0, 0],
                payload: 0,
            },
        );
        // Merge from the back so that no entry of the old run is overwritten
        // before it is moved: the write cursor never passes the read cursor.
        let (mut i, mut j, mut w) = (old_len, fresh.len(), self.run.len());
        while j > 0 {
            w -= 1;
            if i > 0 && self.run[i - 1].id > fresh[j - 1].id {
                self.run[w] = self.run[i - 1];
                i -= 1;
            } else {
                self.run[w] = fresh[j - 1];
                j -= 1;
            }
        }
        self.rebuild_directory();
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    fn rebuild_directory(&mut self) {
        let buckets_wanted = (self.run.len() / BUCKET_ENTRIES).max(1);
        self.dir_bits = buckets_wanted.ilog2().min(32);
        let buckets = 1usize << self.dir_bits;
        self.dir.clear();
        self.dir.reserve_exact(buckets + 1);
        let mut at = 0usize;
        for b in 0..buckets {
            while self.run.get(at).is_some_and(|e| self.bucket_of(e.id) < b) {
                at += 1;
            }
            self.dir
                .push(u32::try_from(at).expect("seen ids fit in u32 indices"));
        }
        self.dir
            .push(u32::try_from(self.run.len()).expect("seen ids fit in u32 indices"));
    }

    /// Checks the invariants in the module doc (O(n): tests and debug builds).
    #[expect(clippy::indexing_slicing, reason = "windows(2) yields slices of two")]
    pub(crate) fn check_invariants(&self) {
        assert!(
            self.run.windows(2).all(|w| w[0].id < w[1].id),
            "run sorted and unique"
        );
        assert!(
            self.recent
                .keys()
                .all(|id| self.run.binary_search_by(|e| e.id.cmp(id)).is_err()),
            "recent and run disjoint"
        );
        assert_eq!(
            self.dir.len(),
            (1usize << self.dir_bits) + 1,
            "directory size"
        );
        for (b, w) in self.dir.windows(2).enumerate() {
            let bucket = self
                .run
                .get(w[0] as usize..w[1] as usize)
                .expect("directory ranges inside the run");
            assert!(
                bucket.iter().all(|e| self.bucket_of(e.id) == b),
                "entries in their bucket"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_128;

    #[test]
    fn every_inserted_id_is_found_across_merges() {
        let mut seen = SeenIndex::default();
        let n = 50_000u64;
        for i in 0..n {
            let id = xxh3_128(&i.to_le_bytes());
            assert_eq!(seen.get(id), None);
            seen.insert(id, i);
        }
        seen.check_invariants();
        assert_eq!(seen.len(), n);
        for i in 0..n {
            assert_eq!(seen.get(xxh3_128(&i.to_le_bytes())), Some(i), "id {i}");
        }
        assert_eq!(seen.get(xxh3_128(b"never")), None);
    }

    #[test]
    fn memory_stays_under_32_bytes_per_id() {
        let mut seen = SeenIndex::default();
        for i in 0..300_000u64 {
            seen.insert(xxh3_128(&i.to_le_bytes()), i);
        }
        let per_id = seen.memory_bytes() as f64 / seen.len() as f64;
        assert!(per_id <= 32.0, "{per_id} bytes per seen id");
    }
}
