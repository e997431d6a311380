//! Seen event ids: xxh3-128 of the event id -> (payload hash, second seen).
//!
//! Memory is the constraint (at most 32 bytes per id, see DESIGN.md), so the
//! bulk of the ids live in one sorted array of 24-byte entries, a parallel
//! array of 4-byte times and a small bucket directory over the top bits of
//! the hash; only recent inserts live in a hash map. When the map outgrows a
//! fraction of the array it is merged in place, from the back, into the
//! array, and ids expired by then are dropped on the way. A Bloom filter in
//! front (1 to 1.5 bytes per id) answers most lookups of new ids from one
//! cache line.
//!
//! Invariants: `run` is sorted by id and holds no duplicates; `times` is as
//! long as `run`; no id is in both `run` and `recent`; `dir[b]..dir[b + 1]`
//! is exactly the range of `run` whose ids have top bits `b`; the filter
//! answers "maybe" for every id in `run` and `recent`.

use super::PREFETCH_AHEAD;
use super::expiry::{is_expired, secs_to_ms, to_secs_ceil};
use super::id_filter::IdFilter;
use crate::hashing::IdMap;

/// One seen id. `[u64; 2]` rather than `u128` keeps the entry 8-aligned and
/// 24 bytes long.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Entry {
    id: [u64; 2],
    payload: u64,
}
const _: () = assert!(std::mem::size_of::<Entry>() == 24);

/// The seen-id filter of a bulk load, filled with the ids a state file
/// holds while another thread pushes them (`SeenIndex::finish_bulk`).
#[derive(Debug)]
pub(crate) struct BulkFilter(IdFilter);

impl BulkFilter {
    /// An empty filter sized for at most `ids` ids.
    pub(crate) fn new(ids: usize) -> Self {
        Self(IdFilter::with_capacity(ids.saturating_add(ids / 2)))
    }

    pub(crate) fn add(&mut self, id: u128) {
        self.0.add(split(id));
    }
}

/// How many top bits of the id a directory over a run of `len` ids uses:
/// about `BUCKET_ENTRIES` ids per bucket.
fn dir_bits_for(len: usize) -> u32 {
    (len / BUCKET_ENTRIES).max(1).ilog2().min(32)
}

/// The directory bucket of `id` under `dir_bits` top bits.
fn bucket_of(dir_bits: u32, id: [u64; 2]) -> usize {
    if dir_bits == 0 {
        0
    } else {
        (id[0] >> (64 - dir_bits)) as usize
    }
}

/// A recent id's record as the run holds it: the entry and its second.
fn run_record(id: [u64; 2], seen: Seen) -> (Entry, u32) {
    let entry = Entry {
        id,
        payload: seen.payload,
    };
    (entry, seen.at_secs)
}

/// Drains the ids of `recent` that pass `keep` (given their second)
/// into an array sorted by id. The ids are hashes, spread evenly:
/// counting them by their top bits gives each bucket its range, each entry
/// then goes straight from the map into its bucket's range, and each
/// bucket, of about one entry, is sorted on its own (insertion sort while
/// small, so that ids crafted to share their top bits cost a sort, not a
/// quadratic one). 1.2 million inserts into the index: 151 ms -> 131 ms
/// against a comparison sort. Counting first lets the entries go straight
/// into the one array a merge reads, where sorting a copy held them twice
/// (W1's peak RSS 50.3 -> 49.2 MiB).
#[expect(
    clippy::indexing_slicing,
    reason = "buckets come from the top `bits` bits (< starts.len() - 1), and the prefix sums end at the count"
)]
fn drain_sorted(
    recent: &mut IdMap<[u64; 2], Seen>,
    keep: impl Fn(u32) -> bool,
) -> Vec<(Entry, u32)> {
    const SMALL: usize = 16;
    let entries = |(id, s): ([u64; 2], Seen)| keep(s.at_secs).then(|| run_record(id, s));
    if recent.len() < 256 {
        let mut sorted: Vec<(Entry, u32)> = recent.drain().filter_map(entries).collect();
        sorted.sort_unstable_by_key(|(e, _)| e.id);
        return sorted;
    }
    let bits = recent.len().ilog2();
    let mut starts = vec![0usize; (1 << bits) + 1];
    for (&id, s) in recent.iter() {
        if keep(s.at_secs) {
            starts[bucket_of(bits, id) + 1] += 1;
        }
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut sorted = vec![(Entry::default(), 0); starts[starts.len() - 1]];
    let mut next = starts.clone();
    for item in recent.drain().filter_map(entries) {
        let at = &mut next[bucket_of(bits, item.0.id)];
        sorted[*at] = item;
        *at += 1;
    }
    for w in starts.windows(2) {
        let part = &mut sorted[w[0]..w[1]];
        if part.len() <= SMALL {
            for i in 1..part.len() {
                let mut j = i;
                while j > 0 && part[j - 1].0.id > part[j].0.id {
                    part.swap(j - 1, j);
                    j -= 1;
                }
            }
        } else {
            part.sort_unstable_by_key(|(e, _)| e.id);
        }
    }
    sorted
}

/// The id as one integer, for comparisons that compile to two words
/// rather than a slice comparison.
fn as_u128(id: [u64; 2]) -> u128 {
    (u128::from(id[0]) << 64) | u128::from(id[1])
}

/// A 128-bit id as two words, high then low, as the index and its filter
/// hold it.
pub(crate) fn split(id: u128) -> [u64; 2] {
    [(id >> 64) as u64, id as u64]
}

/// Recent inserts merge into the sorted run once they exceed
/// `max(RECENT_MIN, run / RECENT_FRACTION)`.
const RECENT_MIN: usize = 4096;
const RECENT_FRACTION: usize = 16;
/// Target entries per directory bucket.
const BUCKET_ENTRIES: usize = 8;

/// What the index remembers of a seen id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Seen {
    pub payload: u64,
    /// Second (rounded up) of the commit that recorded it.
    pub at_secs: u32,
}

/// A stretch of seen records in id order (`SeenIndex::try_for_each_sorted`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SeenSlice<'a> {
    run: &'a [Entry],
    times: &'a [u32],
}

impl<'a> SeenSlice<'a> {
    pub(crate) fn iter(self) -> impl ExactSizeIterator<Item = (u128, Seen)> + 'a {
        self.run.iter().zip(self.times).map(|(e, &at_secs)| {
            let seen = Seen {
                payload: e.payload,
                at_secs,
            };
            (as_u128(e.id), seen)
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct SeenIndex {
    ttl_ms: Option<u64>,
    run: Vec<Entry>,
    times: Vec<u32>,
    dir: Vec<u32>,
    dir_bits: u32,
    /// The ids are already uniform hashes: the map needs no further hashing.
    recent: IdMap<[u64; 2], Seen>,
    /// Every id in `run` and `recent` (and some that left them).
    filter: IdFilter,
}

impl SeenIndex {
    /// An empty index whose ids expire after `ttl_ms` (`None`: never).
    pub(crate) fn new(ttl_ms: Option<u64>) -> Self {
        Self {
            ttl_ms,
            filter: IdFilter::with_capacity(0),
            ..Self::default()
        }
    }

    /// Asks the CPU to fetch what a lookup of `id` reads first.
    pub(crate) fn prefetch(&self, id: u128) {
        self.filter.prefetch(split(id));
    }

    fn find_in_run(&self, id: [u64; 2]) -> Option<usize> {
        let bucket = self.bucket_of(id);
        let lo = *self.dir.get(bucket)? as usize;
        let hi = *self.dir.get(bucket + 1)? as usize;
        let slice = self.run.get(lo..hi)?;
        slice
            .binary_search_by(|e| e.id.cmp(&id))
            .ok()
            .map(|i| lo + i)
    }

    /// What was recorded for `id`, expired or not.
    pub(crate) fn get(&self, id: u128) -> Option<Seen> {
        let id = split(id);
        if !self.filter.may_contain(id) {
            return None;
        }
        if let Some(&seen) = self.recent.get(&id) {
            return Some(seen);
        }
        let i = self.find_in_run(id)?;
        Some(Seen {
            payload: self.run.get(i)?.payload,
            at_secs: *self.times.get(i)?,
        })
    }

    /// The payload hash recorded for `id` if it is seen and not expired at `now_ms`.
    pub(crate) fn get_live(&self, id: u128, now_ms: u64) -> Option<u64> {
        self.get(id)
            .filter(|s| !is_expired(secs_to_ms(s.at_secs), self.ttl_ms, now_ms))
            .map(|s| s.payload)
    }

    /// Records `id`, replacing an expired record of the same id. `now_ms`
    /// is the commit time of the record that records it, which no later
    /// lookup precedes: a merge this insert starts drops only ids expired
    /// by then. (Not `seen.at_secs`, rounded up: a merge at that second
    /// dropped ids that batches committed later in the same second must
    /// still find, and a redelivered `Add` applied again.)
    pub(crate) fn insert(&mut self, id: u128, seen: Seen, now_ms: u64) {
        let id = split(id);
        if !self.filter.may_contain(id) {
            self.filter.add(id);
        } else if let Some(i) = self.find_in_run(id) {
            let (Some(entry), Some(time)) = (self.run.get_mut(i), self.times.get_mut(i)) else {
                unreachable!("run and times have one slot per id");
            };
            entry.payload = seen.payload;
            *time = seen.at_secs;
            return;
        }
        self.recent.insert(id, seen);
        if self.recent.len() > RECENT_MIN.max(self.run.len() / RECENT_FRACTION) {
            self.merge(now_ms);
        }
        if self.filter.is_full() {
            self.rebuild_filter();
        }
    }

    /// Records a batch record's seen ids (`(id, payload)`), committed at
    /// `committed_ms`.
    pub(crate) fn insert_batch(&mut self, ids: &[(u128, u64)], committed_ms: u64) {
        let at_secs = to_secs_ceil(committed_ms);
        for (i, &(id, payload)) in ids.iter().enumerate() {
            if let Some(&(ahead, _)) = ids.get(i + PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            self.insert(id, Seen { payload, at_secs }, committed_ms);
        }
    }

    /// Sizes the filter afresh for the ids held now (dropping those that left).
    fn rebuild_filter(&mut self) {
        let ids = self
            .run
            .iter()
            .map(|e| e.id)
            .chain(self.recent.keys().copied());
        self.filter = IdFilter::build(self.run.len() + self.recent.len(), ids);
    }

    /// Drops ids expired at `now_ms`; returns how many.
    pub(crate) fn purge(&mut self, now_ms: u64) -> u64 {
        let before = self.len();
        self.merge(now_ms);
        before - self.len()
    }

    pub(crate) fn len(&self) -> u64 {
        (self.run.len() + self.recent.len()) as u64
    }

    /// Every record in id order, handed to `f` as stretches of the sorted
    /// run with each recent id between them, a stretch of its own (for
    /// state files, which load fastest sorted and are written a stretch at
    /// a time: a snapshot of a million ids and 200,000 keys took 15.1 ms of
    /// CPU, syncing included, where merging record by record took 17.4).
    pub(crate) fn try_for_each_sorted<E>(
        &self,
        mut f: impl FnMut(SeenSlice<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut recent: Vec<(Entry, u32)> = self
            .recent
            .iter()
            .map(|(&id, &s)| run_record(id, s))
            .collect();
        recent.sort_unstable_by_key(|(e, _)| e.id);
        let mut from = 0;
        for (entry, at_secs) in &recent {
            let to = self.run_below(entry.id).max(from);
            let (Some(run), Some(times)) = (self.run.get(from..to), self.times.get(from..to))
            else {
                unreachable!("run and times have one slot per id");
            };
            f(SeenSlice { run, times })?;
            f(SeenSlice {
                run: std::slice::from_ref(entry),
                times: std::slice::from_ref(at_secs),
            })?;
            from = to;
        }
        let (Some(run), Some(times)) = (self.run.get(from..), self.times.get(from..)) else {
            unreachable!("run and times have one slot per id");
        };
        f(SeenSlice { run, times })
    }

    /// Every record in id order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u128, Seen)> + '_ {
        let mut all = Vec::new();
        let _ = self.try_for_each_sorted(|part| {
            all.extend(part.iter());
            Ok::<(), ()>(())
        });
        all.into_iter()
    }

    /// How many ids of the run are below `id` (found in its bucket).
    fn run_below(&self, id: [u64; 2]) -> usize {
        let bucket = self.bucket_of(id);
        let range = match (self.dir.get(bucket), self.dir.get(bucket + 1)) {
            (Some(&lo), Some(&hi)) => lo as usize..hi as usize,
            _ => 0..self.run.len(),
        };
        let below_in_range = self
            .run
            .get(range.clone())
            .map_or(0, |part| part.partition_point(|e| e.id < id));
        range.start + below_in_range
    }

    /// Appends a record while loading a state file, after every record
    /// already there; `finish_bulk` must follow.
    pub(crate) fn bulk_push(&mut self, id: u128, seen: Seen) -> Result<(), &'static str> {
        let id = split(id);
        if self.run.last().is_some_and(|last| last.id >= id) {
            return Err("seen ids are not sorted and unique");
        }
        self.run.push(Entry {
            id,
            payload: seen.payload,
        });
        self.times.push(seen.at_secs);
        Ok(())
    }

    /// Ends a bulk load, with the filter of the ids pushed if another thread
    /// built it meanwhile (it is rebuilt if it holds other ids or is sized
    /// too far off).
    pub(crate) fn finish_bulk(&mut self, filter: Option<BulkFilter>) -> Result<(), &'static str> {
        if self
            .recent
            .keys()
            .any(|id| self.run.binary_search_by(|e| e.id.cmp(id)).is_ok())
        {
            return Err("seen id loaded twice");
        }
        self.run.shrink_to_fit();
        self.times.shrink_to_fit();
        self.rebuild_directory();
        match filter {
            Some(BulkFilter(filter)) if self.recent.is_empty() && filter.suits(self.run.len()) => {
                self.filter = filter;
            }
            _ => self.rebuild_filter(),
        }
        Ok(())
    }

    /// Heap bytes held: the arrays and directory exactly, the map by capacity.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let run = self.run.capacity() * std::mem::size_of::<Entry>();
        let times = self.times.capacity() * std::mem::size_of::<u32>();
        let dir = self.dir.capacity() * std::mem::size_of::<u32>();
        // std (SwissTable): one slot of (key, value) plus one control byte per bucket.
        let recent = self.recent.capacity() * (std::mem::size_of::<([u64; 2], Seen)>() + 1);
        (run + times + dir + recent) as u64 + self.filter.memory_bytes()
    }

    fn bucket_of(&self, id: [u64; 2]) -> usize {
        bucket_of(self.dir_bits, id)
    }

    /// Drops ids expired at `now_ms`, moves the recent ids into the sorted
    /// run (in place, from the back) and brings the directory up to date.
    #[expect(
        clippy::indexing_slicing,
        reason = "indices are bounded by the merge loop's invariants"
    )]
    fn merge(&mut self, now_ms: u64) {
        let ttl_ms = self.ttl_ms;
        let is_live = |at_secs: u32| !is_expired(secs_to_ms(at_secs), ttl_ms, now_ms);
        if ttl_ms.is_some() {
            let mut kept = 0;
            for i in 0..self.run.len() {
                if is_live(self.times[i]) {
                    self.run[kept] = self.run[i];
                    self.times[kept] = self.times[i];
                    kept += 1;
                }
            }
            if kept < self.run.len() {
                self.run.truncate(kept);
                self.times.truncate(kept);
                self.rebuild_directory();
            }
        }
        let fresh = drain_sorted(&mut self.recent, is_live);
        self.recent.shrink_to(RECENT_MIN);
        let old_len = self.run.len();
        let new_len = old_len + fresh.len();
        if self.run.capacity() < new_len || self.run.capacity() > new_len + new_len / 4 {
            self.run.shrink_to(new_len);
            self.run.reserve_exact(new_len - self.run.len());
            self.times.shrink_to(new_len);
            self.times.reserve_exact(new_len - self.times.len());
        }
        self.run.resize(new_len, Entry::default());
        self.times.resize(new_len, 0);
        // Merge from the back so that no entry of the old run is overwritten
        // before it is moved: the write cursor never passes the read cursor.
        // The old entries above each fresh id (about RECENT_FRACTION of
        // them) move up in one copy, found by a scan that only compares.
        let (mut i, mut w) = (old_len, new_len);
        for &(entry, at_secs) in fresh.iter().rev() {
            let id = as_u128(entry.id);
            let above = self.run[..i]
                .iter()
                .rev()
                .take_while(|e| as_u128(e.id) > id)
                .count();
            self.run.copy_within(i - above..i, w - above);
            self.times.copy_within(i - above..i, w - above);
            (i, w) = (i - above, w - above - 1);
            (self.run[w], self.times[w]) = (entry, at_secs);
        }
        debug_assert_eq!(i, w, "the old entries below every fresh id stay in place");
        self.update_directory(&fresh);
        #[cfg(debug_assertions)]
        self.check_invariants();
    }

    /// Brings the directory up to date after `fresh` (sorted) went into
    /// the run: each bucket's start moves up by the fresh ids below it,
    /// which reads the directory and `fresh` instead of the whole run
    /// (1.2 million inserts: 163 ms -> 151 ms). A run that has outgrown its
    /// bucket count gets a new directory.
    fn update_directory(&mut self, fresh: &[(Entry, u32)]) {
        if dir_bits_for(self.run.len()) != self.dir_bits || self.dir.is_empty() {
            self.rebuild_directory();
            return;
        }
        let mut below = 0usize;
        for (b, start) in self.dir.iter_mut().enumerate() {
            while fresh
                .get(below)
                .is_some_and(|(e, _)| bucket_of(self.dir_bits, e.id) < b)
            {
                below += 1;
            }
            *start += u32::try_from(below).expect("seen ids fit in u32 indices");
        }
    }

    fn rebuild_directory(&mut self) {
        self.dir_bits = dir_bits_for(self.run.len());
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
    #[cfg(any(test, debug_assertions))]
    pub(crate) fn check_invariants(&self) {
        assert!(
            self.run.windows(2).all(|w| w[0].id < w[1].id),
            "run sorted and unique"
        );
        assert_eq!(self.run.len(), self.times.len(), "one time per id");
        assert!(
            self.run
                .iter()
                .map(|e| e.id)
                .chain(self.recent.keys().copied())
                .all(|id| self.filter.may_contain(id)),
            "the filter holds every id"
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
    use super::super::expiry::to_secs_ceil;
    use super::*;
    use xxhash_rust::xxh3::xxh3_128;

    fn id(i: u64) -> u128 {
        xxh3_128(&i.to_le_bytes())
    }

    fn seen(payload: u64, at_secs: u32) -> Seen {
        Seen { payload, at_secs }
    }

    #[test]
    fn sorted_stretches_hold_every_record_once_in_id_order() {
        let mut index = SeenIndex::new(None);
        let n = 10_000u64;
        for i in 0..n {
            index.insert(id(i), seen(i, 1), secs_to_ms(1));
        }
        assert!(!index.run.is_empty() && !index.recent.is_empty());
        let (mut records, mut stretches) = (Vec::new(), 0);
        index
            .try_for_each_sorted(|part| {
                stretches += 1;
                records.extend(part.iter());
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(
            stretches,
            2 * index.recent.len() + 1,
            "run, recent id, run, ..."
        );
        assert!(records.windows(2).all(|w| w[0].0 < w[1].0), "in id order");
        assert_eq!(records.len() as u64, n);
        let by_id: std::collections::HashMap<u128, Seen> = records.into_iter().collect();
        assert!((0..n).all(|i| by_id.get(&id(i)) == Some(&seen(i, 1))));
        // An error from the callback stops the walk.
        let mut calls = 0;
        let stopped = index.try_for_each_sorted(|_| {
            calls += 1;
            Err(calls)
        });
        assert_eq!((stopped, calls), (Err(1), 1));
    }

    #[test]
    fn every_inserted_id_is_found_across_merges() {
        let mut index = SeenIndex::new(None);
        let n = 50_000u64;
        for i in 0..n {
            assert_eq!(index.get(id(i)), None);
            index.insert(id(i), seen(i, 1), secs_to_ms(1));
        }
        index.check_invariants();
        assert_eq!(index.len(), n);
        for i in 0..n {
            assert_eq!(index.get(id(i)), Some(seen(i, 1)), "id {i}");
        }
        assert_eq!(index.get(xxh3_128(b"never")), None);
    }

    #[test]
    fn draining_sorted_sorts_spread_and_crafted_ids_and_keeps_only_the_live() {
        let seen_at = |i: u32| Seen {
            payload: u64::from(i),
            at_secs: i,
        };
        let spread = (0..5_000u32).map(|i| (split(id(u64::from(i))), seen_at(i)));
        // Ids that share their top bits fill one bucket.
        let crafted =
            (0..3_000u32).map(|i| ([7, u64::from(i.wrapping_mul(2_654_435_761))], seen_at(i)));
        let few = (0..100u32).map(|i| (split(id(u64::from(i))), seen_at(i)));
        for items in [
            spread.collect::<Vec<_>>(),
            crafted.collect(),
            few.collect(),
            Vec::new(),
        ] {
            let keep = |at_secs: u32| !at_secs.is_multiple_of(3);
            let mut want: Vec<(Entry, u32)> = items
                .iter()
                .filter(|(_, s)| keep(s.at_secs))
                .map(|&(id, s)| run_record(id, s))
                .collect();
            want.sort_unstable_by_key(|(e, _)| e.id);
            let mut recent: IdMap<[u64; 2], Seen> = items.into_iter().collect();
            assert_eq!(drain_sorted(&mut recent, keep), want);
            assert!(recent.is_empty());
        }
    }

    #[test]
    fn expired_ids_stop_counting_then_leave_memory() {
        let mut index = SeenIndex::new(Some(10_000));
        for i in 0..20_000u64 {
            let at = if i < 10_000 { 1 } else { 2 };
            index.insert(id(i), seen(i, at), secs_to_ms(at));
        }
        assert_eq!(index.get_live(id(5), 10_999), Some(5));
        assert_eq!(index.get_live(id(5), 11_000), None, "expired at 1 s + 10 s");
        assert_eq!(index.get_live(id(15_000), 11_000), Some(15_000));
        assert_eq!(index.purge(11_000), 10_000);
        index.check_invariants();
        assert_eq!(index.get(id(5)), None);
        assert_eq!(index.get(id(15_000)), Some(seen(15_000, 2)));
        // Merges drop what has expired by the time of the insert that triggers them.
        for i in 20_000..40_000u64 {
            index.insert(id(i), seen(i, 30), secs_to_ms(30));
        }
        assert!(index.len() < 30_000, "ids seen at 2 s left memory by 30 s");
        assert_eq!(index.get_live(id(39_999), 30_000), Some(39_999));
    }

    #[test]
    fn a_merge_that_drops_a_few_expired_ids_keeps_the_directory_exact() {
        // One id in a hundred, seen first, expires before the purge; the
        // run keeps its bucket count, so the directory must be redone for
        // the shorter run, not only moved up for the fresh ids.
        let mut index = SeenIndex::new(Some(10_000));
        let early = |i: u64| i.is_multiple_of(100);
        for i in (0..30_000u64).filter(|&i| early(i)) {
            index.insert(id(i), seen(i, 1), secs_to_ms(1));
        }
        for i in (0..30_000u64).filter(|&i| !early(i)) {
            index.insert(id(i), seen(i, 5), secs_to_ms(5));
        }
        let bits = index.dir_bits;
        assert_eq!(index.purge(12_000), 300);
        assert_eq!(index.dir_bits, bits, "the case this test is about");
        index.check_invariants();
        for i in 0..30_000u64 {
            assert_eq!(index.get(id(i)).is_some(), !early(i), "id {i}");
        }
    }

    #[test]
    fn a_merge_drops_only_ids_expired_at_the_commit_that_starts_it() {
        // Recorded at 0.5 s (stamped 1 s), expiring at 2 s. The insert that
        // starts a merge is committed at 1.001 s (stamped 2 s): the id must
        // outlive the merge, since a batch committed at 1.5 s finds it.
        let mut index = SeenIndex::new(Some(1_000));
        index.insert(id(0), seen(0, 1), 500);
        for i in 1..=RECENT_MIN as u64 {
            index.insert(id(i), seen(i, 2), 1_001);
        }
        assert!(index.recent.len() < RECENT_MIN, "a merge ran");
        assert_eq!(index.get_live(id(0), 1_500), Some(0));
        assert_eq!(index.get_live(id(0), 2_000), None);
    }

    #[test]
    fn reinserting_an_expired_id_replaces_its_record() {
        let mut index = SeenIndex::new(Some(1_000));
        for i in 0..10_000u64 {
            index.insert(id(i), seen(i, 1), secs_to_ms(1));
        }
        index.insert(id(3), seen(33, 50), secs_to_ms(50));
        assert_eq!(index.get_live(id(3), 50_000), Some(33));
        assert_eq!(index.len(), 10_000);
        index.check_invariants();
    }

    #[test]
    fn a_bulk_filter_missing_some_pushed_ids_is_not_kept() {
        // A filter filled on another thread from only part of a state file
        // would answer "certainly not seen" for the ids it missed, and
        // their redeliveries would count as new: the load keeps a filter
        // only if it holds every id pushed (DESIGN.md, "Seen index").
        let mut ids: Vec<u128> = (0..10_000).map(id).collect();
        ids.sort_unstable();
        let mut index = SeenIndex::new(None);
        let mut filter = BulkFilter::new(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            index.bulk_push(id, seen(i as u64, 1)).unwrap();
            if i % 2 == 0 {
                filter.add(id);
            }
        }
        index.finish_bulk(Some(filter)).unwrap();
        index.check_invariants();
        for (i, &id) in ids.iter().enumerate() {
            assert_eq!(index.get(id), Some(seen(i as u64, 1)), "id {i}");
        }
    }

    #[test]
    fn memory_stays_under_32_bytes_per_id() {
        let mut index = SeenIndex::new(None);
        for i in 0..300_000u64 {
            index.insert(id(i), seen(i, 1), secs_to_ms(1));
            if i % 10_007 == 0 && i > 100_000 {
                let per_id = index.memory_bytes() as f64 / index.len() as f64;
                assert!(per_id <= 32.0, "{per_id} bytes per seen id at {i}");
            }
        }
    }

    // Against a plain map: inserts (some of ids seen before, some sharing
    // their top bits, so that buckets fill unevenly), purges and lookups,
    // with time moving forward and ids expiring or not. Enough inserts
    // that the recent map is merged into the run several times, each
    // merge moving stretches of old ids past the fresh ones.
    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]
        #[test]
        fn inserts_purges_and_lookups_agree_with_a_map(
            ttl_secs in proptest::option::of(5u64..60),
            ops in proptest::collection::vec((0u16..12_000, 0u8..4, 0u8..100), 9_000..20_000),
        ) {
            use std::collections::HashMap;
            let ttl_ms = ttl_secs.map(|s| s * 1000);
            let mut index = SeenIndex::new(ttl_ms);
            let mut model: HashMap<u128, Seen> = HashMap::new();
            let id_of = |n: u16| {
                if n.is_multiple_of(7) {
                    // Crafted: the same top 64 bits.
                    (7u128 << 64) | u128::from(n)
                } else {
                    id(u64::from(n))
                }
            };
            // Time in milliseconds, as commits see it: ids are stamped with
            // their second rounded up, and looked up (and merged) at times
            // inside that second.
            let mut now_ms = 1_000u64;
            for (n, dt, action) in ops {
                now_ms += u64::from(dt) * 1000 + u64::from(n % 997);
                let id = id_of(n);
                match action {
                    0 => {
                        let held = index.len();
                        let purged = index.purge(now_ms);
                        model.retain(|_, s| !is_expired(secs_to_ms(s.at_secs), ttl_ms, now_ms));
                        // Every live id stays, every expired one goes (merges
                        // may have dropped some before), and the count says
                        // how many went now.
                        proptest::prop_assert_eq!(index.len(), model.len() as u64);
                        proptest::prop_assert_eq!(purged, held - model.len() as u64);
                    }
                    1..=9 => {
                        let live = |s: &Seen| !is_expired(secs_to_ms(s.at_secs), ttl_ms, now_ms);
                        let want = model.get(&id).filter(|s| live(s)).map(|s| s.payload);
                        proptest::prop_assert_eq!(index.get_live(id, now_ms), want);
                    }
                    _ => {
                        let seen = Seen { payload: u64::from(n) ^ now_ms, at_secs: to_secs_ceil(now_ms) };
                        index.insert(id, seen, now_ms);
                        model.insert(id, seen);
                    }
                }
            }
            index.check_invariants();
            let live = |s: &Seen| !is_expired(secs_to_ms(s.at_secs), ttl_ms, now_ms);
            for (&id, s) in &model {
                let want = live(s).then_some(s.payload);
                proptest::prop_assert_eq!(index.get_live(id, now_ms), want);
            }
            // `iter` is sorted, and holds every live id with its record.
            let held: Vec<(u128, Seen)> = index.iter().collect();
            proptest::prop_assert!(held.windows(2).all(|w| w[0].0 < w[1].0));
            let held: HashMap<u128, Seen> = held.into_iter().collect();
            for (id, s) in model.iter().filter(|(_, s)| live(s)) {
                proptest::prop_assert_eq!(held.get(id), Some(s));
            }
        }
    }
}
