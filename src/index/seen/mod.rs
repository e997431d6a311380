//! Seen event ids: xxh3-128 of the event id -> (payload hash, second seen).
//!
//! Memory is the constraint (at most 32 bytes per id, see DESIGN.md), so the
//! bulk of the ids live in one sorted array of 24-byte entries, a parallel
//! array of 4-byte times and a small bucket directory over the top bits of
//! the hash; only recent inserts live in hash maps (one per shard of the
//! top bits). When the maps outgrow a fraction of the array they are
//! merged into it in place, from the back, and ids expired by then are
//! dropped on the way. A merge moves the whole array, so batches of
//! inserts move it on a stretch at a time (`merge.rs`). A Bloom filter in
//! front (1 to 1.5 bytes per id) answers most lookups of new ids from one
//! cache line.
//!
//! Invariants: the run (`run` without the gap of a merge under way) is
//! sorted by id and holds no duplicates; `times` is as long as `run`; no id
//! is in two of the run, the recent maps and the merge's ids not placed
//! yet; each recent id is in its shard's map; `bucket_range(b)` is exactly
//! the range of `run` whose ids have top bits `b`; the filter answers
//! "maybe" for every id held.

mod merge;

use super::PREFETCH_AHEAD;
use super::expiry::{is_expired, secs_to_ms, to_secs_ceil};
use super::id_filter::IdFilter;
use crate::hashing::SeededIdMap;
use merge::Merge;

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
    top_bits(dir_bits, id[0])
}

/// The top `bits` bits of `word`.
fn top_bits(bits: u32, word: u64) -> usize {
    if bits == 0 {
        0
    } else {
        (word >> (64 - bits)) as usize
    }
}

/// The shard of the recent maps that holds `id`.
fn shard_of(id: [u64; 2]) -> usize {
    top_bits(SHARD_BITS, id[0])
}

/// A recent id's record as the run holds it: the entry and its second.
fn run_record(id: [u64; 2], seen: Seen) -> (Entry, u32) {
    let entry = Entry {
        id,
        payload: seen.payload,
    };
    (entry, seen.at_secs)
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

/// Recent inserts are due a merge into the sorted run once they exceed
/// `max(RECENT_MIN, run / RECENT_FRACTION)`.
#[cfg(not(any(test, fuzzing)))]
const RECENT_MIN: usize = 4096;
/// Unit tests hold a few thousand ids, and fuzz inputs a few hundred: their
/// merges, incremental ones among them, start from a few dozen recent ids.
#[cfg(any(test, fuzzing))]
const RECENT_MIN: usize = 64;
const RECENT_FRACTION: usize = 16;
/// Target entries per directory bucket.
const BUCKET_ENTRIES: usize = 8;
/// Entries a batch of inserts moves in the merge under way, per id: a
/// merge moves about `RECENT_FRACTION + 1` entries per id it takes in, and
/// a quarter more per insert ends it before the next merge is due.
const MERGE_MOVES_PER_INSERT: usize = (RECENT_FRACTION + 1) * 5 / 4;
/// The recent ids are held in `1 << SHARD_BITS` maps by their top bits,
/// which a merge sorts out one at a time (`Merge`).
const SHARD_BITS: u32 = 4;
const SHARDS: usize = 1 << SHARD_BITS;

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

/// Recent ids, in one map per shard of their top bits. The ids are
/// already hashes, which the maps only mix under a seed of their own.
type RecentMap = SeededIdMap<[u64; 2], Seen>;
type Shards = [RecentMap; SHARDS];

#[expect(
    clippy::indexing_slicing,
    reason = "shard_of is the top SHARD_BITS bits: below SHARDS"
)]
fn shard(shards: &Shards, id: [u64; 2]) -> &RecentMap {
    &shards[shard_of(id)]
}

#[expect(
    clippy::indexing_slicing,
    reason = "shard_of is the top SHARD_BITS bits: below SHARDS"
)]
fn shard_mut(shards: &mut Shards, id: [u64; 2]) -> &mut RecentMap {
    &mut shards[shard_of(id)]
}

/// A map's bytes by capacity (std's SwissTable: one slot of key and value
/// plus one control byte per bucket).
fn map_bytes(map: &RecentMap) -> usize {
    map.capacity() * (std::mem::size_of::<([u64; 2], Seen)>() + 1)
}

#[derive(Debug, Default)]
pub(crate) struct SeenIndex {
    ttl_ms: Option<u64>,
    run: Vec<Entry>,
    times: Vec<u32>,
    dir: Vec<u32>,
    dir_bits: u32,
    recent: Shards,
    /// The merge of the recent ids that were due last, if it is under way.
    merge: Option<Merge>,
    /// Every id in `run`, `merge` and `recent` (and some that left them).
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

    /// The entries of `run` in `bucket` (the gap of a merge under way left out).
    fn bucket_range(&self, bucket: usize) -> Option<std::ops::Range<usize>> {
        let lo = *self.dir.get(bucket)? as usize;
        let hi = match &self.merge {
            Some(m) if bucket + 1 == m.bucket => m.read,
            _ => *self.dir.get(bucket + 1)? as usize,
        };
        Some(lo..hi)
    }

    fn find_in_run(&self, id: [u64; 2]) -> Option<usize> {
        let range = self.bucket_range(self.bucket_of(id))?;
        let slice = self.run.get(range.clone())?;
        slice
            .binary_search_by(|e| e.id.cmp(&id))
            .ok()
            .map(|i| range.start + i)
    }

    /// What was recorded for `id`, expired or not.
    pub(crate) fn get(&self, id: u128) -> Option<Seen> {
        let id = split(id);
        if !self.filter.may_contain(id) {
            return None;
        }
        if let Some(&seen) = shard(&self.recent, id).get(&id) {
            return Some(seen);
        }
        if let Some(i) = self.find_in_run(id) {
            return Some(Seen {
                payload: self.run.get(i)?.payload,
                at_secs: *self.times.get(i)?,
            });
        }
        self.merge.as_ref()?.find(id)
    }

    /// The payload hash recorded for `id` if it is seen and not expired at `now_ms`.
    pub(crate) fn get_live(&self, id: u128, now_ms: u64) -> Option<u64> {
        self.get(id)
            .filter(|s| !is_expired(secs_to_ms(s.at_secs), self.ttl_ms, now_ms))
            .map(|s| s.payload)
    }

    /// Records `id`, replacing an expired record of the same id, and merges
    /// the recent ids whole if they are due. `now_ms` is the commit time of
    /// the record that records it, which no later lookup precedes: a merge
    /// this insert starts drops only ids expired by then. (Not
    /// `seen.at_secs`, rounded up: a merge at that second dropped ids that
    /// batches committed later in the same second must still find, and a
    /// redelivered `Add` applied again.)
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn insert(&mut self, id: u128, seen: Seen, now_ms: u64) {
        self.record(split(id), seen);
        if self.is_merge_due() {
            self.start_merge(now_ms);
            self.finish_merge();
        }
    }

    /// Records a batch record's seen ids (`(id, payload)`), committed at
    /// `committed_ms`, then moves the merge under way on by about as many
    /// entries as those ids will cost one (starting one if it is due): a
    /// merge moves the whole run, and spread over the records that make the
    /// next one due, it pauses none of them for long (DESIGN.md, "Seen
    /// index").
    pub(crate) fn insert_batch(&mut self, ids: &[(u128, u64)], committed_ms: u64) {
        let at_secs = to_secs_ceil(committed_ms);
        for (i, &(id, payload)) in ids.iter().enumerate() {
            if let Some(&(ahead, _)) = ids.get(i + PREFETCH_AHEAD) {
                self.prefetch(ahead);
            }
            self.record(split(id), Seen { payload, at_secs });
        }
        if self.is_merge_due() {
            self.start_merge(committed_ms);
        }
        self.advance_merge(ids.len().saturating_mul(MERGE_MOVES_PER_INSERT));
    }

    /// Records `id` where it is held (a re-recorded id: its old record
    /// expired), or else in its shard's recent map.
    fn record(&mut self, id: [u64; 2], seen: Seen) {
        if !self.filter.may_contain(id) {
            self.filter.add(id);
        } else if let Some(i) = self.find_in_run(id) {
            let (Some(entry), Some(time)) = (self.run.get_mut(i), self.times.get_mut(i)) else {
                unreachable!("run and times have one slot per id");
            };
            entry.payload = seen.payload;
            *time = seen.at_secs;
            return;
        } else if self.merge.as_mut().is_some_and(|m| m.replace(id, seen)) {
            return;
        }
        shard_mut(&mut self.recent, id).insert(id, seen);
        if self.filter.is_full() {
            self.rebuild_filter();
        }
    }

    /// How many ids the recent maps hold.
    fn recent_len(&self) -> usize {
        self.recent.iter().map(|shard| shard.len()).sum()
    }

    fn is_merge_due(&self) -> bool {
        self.recent_len() > RECENT_MIN.max(self.run_len() / RECENT_FRACTION)
    }

    /// Ids held outside the recent maps: in the run, or to be placed in it.
    fn run_len(&self) -> usize {
        self.merge.as_ref().map_or(self.run.len(), |m| m.end)
    }

    /// The run as its two stretches of entries and times, below and above
    /// the gap of a merge under way (the second is empty if none is).
    fn run_parts(&self) -> [(&[Entry], &[u32]); 2] {
        let len = self.run.len();
        let gap = self.merge.as_ref().map_or(len..len, |m| m.gap(len));
        let part = |range: std::ops::Range<usize>| {
            let (Some(run), Some(times)) = (self.run.get(range.clone()), self.times.get(range))
            else {
                unreachable!("run and times have one slot per id, the gap inside them");
            };
            (run, times)
        };
        [part(0..gap.start), part(gap.end..len)]
    }

    /// Every record held outside the run, in no order.
    fn records_outside_run(&self) -> impl Iterator<Item = (Entry, u32)> + '_ {
        let recent = self.recent.iter().flatten();
        let recent = recent.map(|(&id, &seen)| run_record(id, seen));
        recent.chain(self.merge.iter().flat_map(Merge::records))
    }

    /// Sizes the filter afresh for the ids held now (dropping those that left).
    fn rebuild_filter(&mut self) {
        let [(low, _), (high, _)] = self.run_parts();
        let ids = low
            .iter()
            .chain(high)
            .map(|e| e.id)
            .chain(self.records_outside_run().map(|(e, _)| e.id));
        self.filter = IdFilter::build(self.run_len() + self.recent_len(), ids);
    }

    /// Drops ids expired at `now_ms`; returns how many.
    pub(crate) fn purge(&mut self, now_ms: u64) -> u64 {
        let before = self.len();
        self.start_merge(now_ms);
        self.finish_merge();
        before - self.len()
    }

    pub(crate) fn len(&self) -> u64 {
        (self.run_len() + self.recent_len()) as u64
    }

    /// Every record in id order, handed to `f` as stretches of the sorted
    /// run with each record held outside it between them, a stretch of its
    /// own (for state files, which load fastest sorted and are written a
    /// stretch at a time: a snapshot of a million ids and 200,000 keys
    /// took 15.1 ms of CPU, syncing included, where merging record by
    /// record took 17.4).
    pub(crate) fn try_for_each_sorted<E>(
        &self,
        mut f: impl FnMut(SeenSlice<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut singles: Vec<(Entry, u32)> = self.records_outside_run().collect();
        singles.sort_unstable_by_key(|(e, _)| e.id);
        // The run's stretches, the gap left out.
        let len = self.run.len();
        let gap = self.merge.as_ref().map_or(len..len, |m| m.gap(len));
        let (read, high) = (gap.start, gap.end);
        let stretch = |from: usize, to: usize| {
            let (Some(run), Some(times)) = (self.run.get(from..to), self.times.get(from..to))
            else {
                unreachable!("run and times have one slot per id");
            };
            SeenSlice { run, times }
        };
        let mut send = |part: SeenSlice<'_>| {
            if part.run.is_empty() { Ok(()) } else { f(part) }
        };
        let mut from = 0;
        for (entry, at_secs) in &singles {
            let to = self.run_below(entry.id).max(from);
            if from <= read && read < to {
                send(stretch(from, read))?;
                from = high;
            }
            send(stretch(from, to))?;
            send(SeenSlice {
                run: std::slice::from_ref(entry),
                times: std::slice::from_ref(at_secs),
            })?;
            from = to;
        }
        if from <= read {
            send(stretch(from, read))?;
            from = high;
        }
        send(stretch(from, self.run.len()))
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

    /// Where `id` would go in the run: the position of the first entry
    /// above it (found in its bucket), past the gap if it is above the gap.
    fn run_below(&self, id: [u64; 2]) -> usize {
        let range = self
            .bucket_range(self.bucket_of(id))
            .unwrap_or(0..self.run.len());
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
        debug_assert!(
            self.merge.is_none(),
            "a bulk load fills an index of its own"
        );
        if self
            .recent
            .iter()
            .flat_map(|shard| shard.keys())
            .any(|id| self.run.binary_search_by(|e| e.id.cmp(id)).is_ok())
        {
            return Err("seen id loaded twice");
        }
        self.run.shrink_to_fit();
        self.times.shrink_to_fit();
        self.rebuild_directory();
        match filter {
            Some(BulkFilter(filter)) if self.recent_len() == 0 && filter.suits(self.run.len()) => {
                self.filter = filter;
            }
            _ => self.rebuild_filter(),
        }
        Ok(())
    }

    /// Heap bytes held: the arrays and directory exactly, the maps by capacity.
    pub(crate) fn memory_bytes(&self) -> u64 {
        let run = self.run.capacity() * std::mem::size_of::<Entry>();
        let times = self.times.capacity() * std::mem::size_of::<u32>();
        let dir = self.dir.capacity() * std::mem::size_of::<u32>();
        let recent: usize = self.recent.iter().map(map_bytes).sum();
        let merge = self.merge.as_ref().map_or(0, Merge::memory_bytes);
        (run + times + dir + recent + merge) as u64 + self.filter.memory_bytes()
    }

    fn bucket_of(&self, id: [u64; 2]) -> usize {
        bucket_of(self.dir_bits, id)
    }

    fn rebuild_directory(&mut self) {
        debug_assert!(self.merge.is_none(), "the directory of a run in place");
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
        let [(low, low_times), (high, high_times)] = self.run_parts();
        assert_eq!(self.run.len(), self.times.len(), "one time per slot");
        assert_eq!(low.len(), low_times.len());
        assert_eq!(high.len(), high_times.len());
        let run: Vec<[u64; 2]> = low.iter().chain(high).map(|e| e.id).collect();
        assert!(run.windows(2).all(|w| w[0] < w[1]), "run sorted and unique");
        let mut unplaced: Vec<[u64; 2]> = self
            .merge
            .iter()
            .flat_map(Merge::records)
            .map(|(e, _)| e.id)
            .collect();
        if let Some(m) = &self.merge {
            assert!(
                m.sorted.windows(2).all(|w| w[0].0.id < w[1].0.id),
                "the shard being placed is sorted"
            );
            assert_eq!(unplaced.len(), m.unplaced, "the gap fits the ids to place");
            assert!(
                unplaced.iter().all(|&id| self.bucket_of(id) < m.bucket),
                "ids to place below the buckets in place"
            );
        }
        unplaced.sort_unstable();
        assert!(
            unplaced.windows(2).all(|w| w[0] < w[1]),
            "ids to place unique"
        );
        assert!(
            unplaced.iter().all(|id| run.binary_search(id).is_err()),
            "ids to place are not in the run"
        );
        let held =
            |id: &[u64; 2]| run.binary_search(id).is_ok() || unplaced.binary_search(id).is_ok();
        for (at, shard) in self.recent.iter().enumerate() {
            assert!(
                shard.keys().all(|&id| shard_of(id) == at),
                "ids in their shard"
            );
            assert!(!shard.keys().any(held), "recent ids held nowhere else");
        }
        assert!(
            run.iter()
                .chain(&unplaced)
                .chain(self.recent.iter().flat_map(|s| s.keys()))
                .all(|&id| self.filter.may_contain(id)),
            "the filter holds every id"
        );
        if self.dir.is_empty() {
            assert!(self.run.is_empty(), "a run without a directory is empty");
            return;
        }
        assert_eq!(
            self.dir.len(),
            (1usize << self.dir_bits) + 1,
            "directory size"
        );
        for b in 0..self.dir.len() - 1 {
            let range = self.bucket_range(b).expect("every bucket has a range");
            let bucket = self.run.get(range).expect("bucket ranges inside the run");
            assert!(
                bucket.iter().all(|e| self.bucket_of(e.id) == b),
                "entries in their bucket"
            );
        }
        let in_buckets: usize = (0..self.dir.len() - 1)
            .filter_map(|b| self.bucket_range(b))
            .map(|r| r.len())
            .sum();
        assert_eq!(
            in_buckets,
            run.len(),
            "the buckets cover the run, gap aside"
        );
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
        // Once with every id in the run or the recent maps, once in the
        // middle of a merge, its ids partly placed.
        for is_merging in [false, true] {
            let mut index = SeenIndex::new(None);
            let mut n = 0u64;
            while n < 10_000 || index.merge.is_some() != is_merging {
                let batch: Vec<(u128, u64)> = (n..n + 100).map(|i| (id(i), i)).collect();
                index.insert_batch(&batch, secs_to_ms(1));
                n += 100;
            }
            assert!(!index.run.is_empty() && index.recent_len() > 0);
            let unplaced = index.merge.as_ref().map_or(0, |m| m.unplaced);
            assert_eq!(unplaced > 0, is_merging);
            let (mut records, mut stretches) = (Vec::new(), 0);
            index
                .try_for_each_sorted(|part| {
                    stretches += 1;
                    records.extend(part.iter());
                    Ok::<(), ()>(())
                })
                .unwrap();
            assert!(
                stretches <= 2 * (index.recent_len() + unplaced) + 2,
                "run, single id, run, ... ({stretches} stretches)"
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
        assert!(index.recent_len() < RECENT_MIN, "a merge ran");
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
    fn a_record_with_no_seen_ids_moves_no_merge_into_a_run_not_grown_yet() {
        // A batch whose deliveries were all duplicates records no seen id,
        // so it gives a merge under way no budget. While the run was still
        // growing to its new length, that placed an id anyway, past the
        // end of the run (a panic, in `apply_batch` and in every replay).
        let mut index = SeenIndex::new(None);
        let mut grew_after = 0;
        for i in 0..3_000u64 {
            index.insert_batch(&[(id(i), i)], secs_to_ms(1));
            let is_growing = index
                .merge
                .as_ref()
                .is_some_and(|m| index.run.len() < m.end);
            index.insert_batch(&[], secs_to_ms(1));
            grew_after += usize::from(is_growing);
            if i % 97 == 0 {
                index.check_invariants();
            }
        }
        assert!(
            grew_after > 100,
            "empty records came while runs grew: {grew_after}"
        );
        index.finish_merge();
        index.check_invariants();
        for i in 0..3_000u64 {
            assert_eq!(index.get(id(i)).map(|s| s.payload), Some(i), "id {i}");
        }
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
    // that the recent maps are merged into the run many times, each merge
    // moving stretches of old ids past the fresh ones, some of them whole,
    // some a few entries per insert with lookups, inserts and purges
    // in the middle.
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
            let mut merging_checked = 0;
            for (step, (n, dt, action)) in ops.into_iter().enumerate() {
                now_ms += u64::from(dt) * 100 + u64::from(n % 97);
                let id = id_of(n);
                if step % 32 == 0 && index.merge.is_some() {
                    // The directory and the gap, in the middle of a merge.
                    index.check_invariants();
                    merging_checked += 1;
                }
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
                        if action == 1 {
                            // A record of duplicates only: no id, no budget.
                            index.insert_batch(&[], now_ms);
                        }
                        let live = |s: &Seen| !is_expired(secs_to_ms(s.at_secs), ttl_ms, now_ms);
                        let want = model.get(&id).filter(|s| live(s)).map(|s| s.payload);
                        proptest::prop_assert_eq!(index.get_live(id, now_ms), want);
                    }
                    _ => {
                        let seen = Seen { payload: u64::from(n) ^ now_ms, at_secs: to_secs_ceil(now_ms) };
                        // Half go in as batches of their own, which move a
                        // merge on a few entries at a time; the rest alone,
                        // each merge whole.
                        if n.is_multiple_of(2) {
                            index.insert_batch(&[(id, seen.payload)], now_ms);
                        } else {
                            index.insert(id, seen, now_ms);
                        }
                        model.insert(id, seen);
                    }
                }
            }
            if ttl_ms.is_none() {
                proptest::prop_assert!(merging_checked > 0, "no merge was under way");
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
