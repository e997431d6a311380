//! Merging the recent ids into the sorted run, a stretch at a time.
//!
//! A merge takes the recent maps as they are when it starts and makes room
//! for their ids at the end of the run. Then, over the batches of inserts
//! that follow, the run grows to its new length and the entries move up
//! from the top bucket down, each shard's ids sorted out of its map as the
//! merge reaches them, so that no batch moves the whole run or sorts every
//! id; a run that outgrows its directory gets the new one filled as its
//! buckets reach their final place (DESIGN.md, "Seen index").

use super::{
    Entry, RecentMap, SHARD_BITS, Seen, SeenIndex, as_u128, bucket_of, dir_bits_for, map_bytes,
    run_record, shard_of, top_bits,
};
use crate::index::expiry::{is_expired, secs_to_ms};

/// Drains the ids of `shard`, all with the same top `SHARD_BITS` bits,
/// into an array sorted by id. The ids are hashes, spread evenly:
/// counting them by their next bits gives each bucket its range, each
/// entry then goes straight from the map into its bucket's range, and
/// each bucket, of about one entry, is sorted on its own (insertion sort
/// while small, so that ids crafted to share their top bits cost a sort,
/// not a quadratic one). 1.2 million inserts into the index: 151 ms ->
/// 131 ms against a comparison sort. Counting first lets the entries go
/// straight into the one array a merge reads, where sorting a copy held
/// them twice (W1's peak RSS 50.3 -> 49.2 MiB).
#[expect(
    clippy::indexing_slicing,
    reason = "buckets come from `bits` bits (< starts.len() - 1), and the prefix sums end at the count"
)]
fn drain_sorted(shard: &mut RecentMap) -> Vec<(Entry, u32)> {
    const SMALL: usize = 16;
    let entries = |(id, s): ([u64; 2], Seen)| run_record(id, s);
    if shard.len() < 256 {
        let mut sorted: Vec<(Entry, u32)> = shard.drain().map(entries).collect();
        sorted.sort_unstable_by_key(|(e, _)| e.id);
        return sorted;
    }
    let bits = shard.len().ilog2();
    let bucket = |id: [u64; 2]| top_bits(bits, id[0] << SHARD_BITS);
    let mut starts = vec![0usize; (1 << bits) + 1];
    for &id in shard.keys() {
        starts[bucket(id) + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    let mut sorted = vec![(Entry::default(), 0); starts[starts.len() - 1]];
    let mut next = starts.clone();
    for item in shard.drain().map(entries) {
        let at = &mut next[bucket(item.0.id)];
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

/// A merge under way (`SeenIndex::advance_merge`). Once the run has grown
/// to its final length, `end`, entries move. Buckets from `bucket` up hold
/// their final entries, and the directory their final starts; below, the
/// old entries are where they were, in `run[..read]`, with their old
/// starts. The gap above them, `run[read..read + unplaced]`, holds
/// nothing: it is what the ids not placed yet will fill. Those are the recent ids of the merge's start,
/// still in their shards' maps (`frozen`), but for the shard being placed,
/// sorted out of its map (`sorted`): a shard at a time, the merge never
/// sorts them all in one step.
#[derive(Debug)]
pub(super) struct Merge {
    /// The shards not taken out yet: those below `frozen.len()`.
    pub(super) frozen: Vec<RecentMap>,
    /// The ids of the shard being placed not placed yet, sorted; all in
    /// buckets below `bucket`, and above every id still in `frozen`.
    pub(super) sorted: Vec<(Entry, u32)>,
    /// How many ids are not placed yet (`frozen` and `sorted`).
    pub(super) unplaced: usize,
    /// The run's length once the merge is done. The run grows to it a
    /// stretch at a time before anything moves, so that no one record's
    /// application faults in all the memory the merge grows into (about a
    /// millisecond at a million ids).
    pub(super) end: usize,
    /// Where the gap starts.
    pub(super) read: usize,
    /// The lowest bucket in its final place.
    pub(super) bucket: usize,
    /// The directory the run gets once the merge is done, if it outgrows
    /// its bucket count: the bits it uses, and its bucket starts, filled as
    /// the buckets of the one in use reach their final place (lookups use
    /// that one until the end, with larger buckets).
    pub(super) next_dir: Option<(u32, Vec<u32>)>,
}

impl Merge {
    /// The slots of the run that hold nothing, given its length now (it
    /// may not have grown to `end` yet).
    pub(super) fn gap(&self, run_len: usize) -> std::ops::Range<usize> {
        self.read..(self.read + self.unplaced).min(run_len)
    }

    /// The largest id not placed yet: of the shard being placed, or of the
    /// next one down, sorted out of its map now.
    fn next_to_place(&mut self) -> Option<&(Entry, u32)> {
        while self.sorted.is_empty()
            && let Some(mut shard) = self.frozen.pop()
        {
            self.sorted = drain_sorted(&mut shard);
        }
        self.sorted.last()
    }

    /// Where `id` is in the sorted shard being placed, if it is there.
    fn sorted_at(&self, id: [u64; 2]) -> Option<usize> {
        self.sorted.binary_search_by(|(e, _)| e.id.cmp(&id)).ok()
    }

    /// What was recorded for `id` if it is among the ids not placed yet.
    pub(super) fn find(&self, id: [u64; 2]) -> Option<Seen> {
        if let Some(map) = self.frozen.get(shard_of(id)) {
            return map.get(&id).copied();
        }
        let &(entry, at_secs) = self.sorted.get(self.sorted_at(id)?)?;
        Some(Seen {
            payload: entry.payload,
            at_secs,
        })
    }

    /// Replaces the record of `id` if it is among the ids not placed yet.
    pub(super) fn replace(&mut self, id: [u64; 2], seen: Seen) -> bool {
        if let Some(map) = self.frozen.get_mut(shard_of(id)) {
            return map.get_mut(&id).map(|held| *held = seen).is_some();
        }
        let at = self.sorted_at(id);
        match at.and_then(|i| self.sorted.get_mut(i)) {
            Some(held) => {
                *held = run_record(id, seen);
                true
            }
            None => false,
        }
    }

    /// The ids not placed yet, in no order.
    pub(super) fn records(&self) -> impl Iterator<Item = (Entry, u32)> + '_ {
        let frozen = self.frozen.iter().flatten();
        frozen
            .map(|(&id, &seen)| run_record(id, seen))
            .chain(self.sorted.iter().copied())
    }

    pub(super) fn memory_bytes(&self) -> usize {
        let frozen: usize = self.frozen.iter().map(map_bytes).sum();
        frozen + self.sorted.capacity() * std::mem::size_of::<(Entry, u32)>()
    }
}

/// Fills the starts of `next_dir`'s buckets inside `buckets` of `dir`
/// (which uses `bits`), now in their final place in `run`.
#[expect(
    clippy::indexing_slicing,
    reason = "the buckets are below dir.len() - 1, their ranges inside the run, and the next directory's buckets inside them below its length"
)]
fn fill_next_dir(
    run: &[Entry],
    dir: &[u32],
    bits: u32,
    next_dir: &mut Option<(u32, Vec<u32>)>,
    buckets: std::ops::Range<usize>,
) {
    let Some((next_bits, next)) = next_dir else {
        return;
    };
    let split = *next_bits - bits;
    for b in buckets {
        let (lo, hi) = (dir[b] as usize, dir[b + 1] as usize);
        let entries = &run[lo..hi];
        let inside = b << split..(b + 1) << split;
        for (j, start) in inside.clone().zip(&mut next[inside]) {
            let below = entries.partition_point(|e| bucket_of(*next_bits, e.id) < j);
            *start = u32::try_from(lo + below).expect("seen ids fit in u32 indices");
        }
    }
}

impl SeenIndex {
    /// Starts a merge of the recent ids, after ending the one under way:
    /// drops ids expired at `now_ms`, takes the recent maps as they are
    /// and makes room for their ids at the end of the run, where the gap
    /// starts.
    pub(super) fn start_merge(&mut self, now_ms: u64) {
        self.finish_merge();
        let ttl_ms = self.ttl_ms;
        let is_live = |at_secs: u32| !is_expired(secs_to_ms(at_secs), ttl_ms, now_ms);
        if ttl_ms.is_some() {
            self.drop_expired_from_run(is_live);
            for shard in &mut self.recent {
                shard.retain(|_, seen| is_live(seen.at_secs));
            }
        }
        let frozen: Vec<_> = self.recent.iter_mut().map(std::mem::take).collect();
        let unplaced = frozen.iter().map(|shard| shard.len()).sum();
        if unplaced == 0 {
            return;
        }
        if self.dir.is_empty() {
            self.rebuild_directory();
        }
        let old_len = self.run.len();
        let new_len = old_len + unplaced;
        if self.run.capacity() < new_len || self.run.capacity() > new_len + new_len / 4 {
            self.run.shrink_to(new_len);
            self.run.reserve_exact(new_len - self.run.len());
            self.times.shrink_to(new_len);
            self.times.reserve_exact(new_len - self.times.len());
        }
        let buckets = self.dir.len() - 1;
        if let Some(end) = self.dir.last_mut() {
            *end = u32::try_from(new_len).expect("seen ids fit in u32 indices");
        }
        self.merge = Some(Merge {
            frozen,
            sorted: Vec::new(),
            unplaced,
            end: new_len,
            read: old_len,
            bucket: buckets,
            next_dir: (dir_bits_for(new_len) != self.dir_bits).then(|| {
                let bits = dir_bits_for(new_len);
                let mut dir = vec![0; (1 << bits) + 1];
                if let Some(end) = dir.last_mut() {
                    *end = u32::try_from(new_len).expect("seen ids fit in u32 indices");
                }
                (bits, dir)
            }),
        });
    }

    /// Drops the run's ids that fail `is_live`, moving only those above the
    /// first one dropped.
    #[expect(
        clippy::indexing_slicing,
        reason = "kept <= i < run.len() == times.len()"
    )]
    fn drop_expired_from_run(&mut self, is_live: impl Fn(u32) -> bool) {
        let Some(first) = self.times.iter().position(|&t| !is_live(t)) else {
            return;
        };
        let mut kept = first;
        for i in first + 1..self.run.len() {
            if is_live(self.times[i]) {
                self.run[kept] = self.run[i];
                self.times[kept] = self.times[i];
                kept += 1;
            }
        }
        self.run.truncate(kept);
        self.times.truncate(kept);
        self.rebuild_directory();
    }

    pub(super) fn finish_merge(&mut self) {
        self.advance_merge(usize::MAX);
    }

    /// Moves the merge under way on, from its top bucket down, until about
    /// `budget` entries moved (stopping between two buckets) or it ends.
    ///
    /// Merging from the back, no entry of the old run is overwritten
    /// before it is moved: the gap lies between the entries still to move
    /// and those in place. The old entries above each id placed (about
    /// RECENT_FRACTION of them) move up in one copy, found by a scan that
    /// only compares, and the buckets they fill get their final starts,
    /// moved up by the ids still to place, which reads the directory and
    /// not the run (1.2 million inserts: 163 ms -> 151 ms).
    #[expect(
        clippy::indexing_slicing,
        reason = "indices are bounded by the merge's invariants (`Merge`)"
    )]
    pub(super) fn advance_merge(&mut self, budget: usize) {
        let Some(m) = self.merge.as_mut() else {
            return;
        };
        if budget == 0 {
            return;
        }
        let bits = self.dir_bits;
        let grow = m.end.saturating_sub(self.run.len()).min(budget);
        if grow > 0 {
            let len = self.run.len() + grow;
            self.run.resize(len, Entry::default());
            self.times.resize(len, 0);
        }
        // Ids are placed only once the run reaches its new length: the
        // gap ends at the run's end.
        if self.run.len() < m.end {
            return;
        }
        let mut moved = grow;
        while let Some(&(entry, at_secs)) = m.next_to_place() {
            // The old entries above the next id to place move up by the
            // gap, and it goes below them: the buckets above its own are
            // then in their final place, and its own from the id up.
            let bucket = bucket_of(bits, entry.id);
            let id = as_u128(entry.id);
            let above = self.run[..m.read]
                .iter()
                .rev()
                .take_while(|e| as_u128(e.id) > id)
                .count();
            let from = m.read - above;
            let gap = m.unplaced;
            self.run.copy_within(from..m.read, from + gap);
            self.times.copy_within(from..m.read, from + gap);
            (self.run[from + gap - 1], self.times[from + gap - 1]) = (entry, at_secs);
            let shift = u32::try_from(gap).expect("seen ids fit in u32 indices");
            self.dir[bucket + 1..m.bucket]
                .iter_mut()
                .for_each(|d| *d += shift);
            fill_next_dir(
                &self.run,
                &self.dir,
                bits,
                &mut m.next_dir,
                bucket + 1..m.bucket,
            );
            m.sorted.pop();
            m.unplaced -= 1;
            m.read = from;
            m.bucket = bucket + 1;
            moved += above + 1;
            // Once the budget is spent, stop between two buckets: the rest
            // of this one moves up now, so that each bucket is in one place.
            let is_bucket_done = m
                .next_to_place()
                .is_none_or(|(e, _)| bucket_of(bits, e.id) < bucket);
            if moved >= budget && is_bucket_done && m.unplaced > 0 {
                let lo = self.dir[bucket] as usize;
                let gap = m.unplaced;
                self.run.copy_within(lo..m.read, lo + gap);
                self.times.copy_within(lo..m.read, lo + gap);
                self.dir[bucket] += u32::try_from(gap).expect("seen ids fit in u32 indices");
                fill_next_dir(
                    &self.run,
                    &self.dir,
                    bits,
                    &mut m.next_dir,
                    bucket..bucket + 1,
                );
                m.read = lo;
                m.bucket = bucket;
                break;
            }
        }
        if m.unplaced == 0 {
            // The buckets below the last id placed did not move.
            fill_next_dir(&self.run, &self.dir, bits, &mut m.next_dir, 0..m.bucket);
            if let Some((bits, dir)) = m.next_dir.take() {
                (self.dir_bits, self.dir) = (bits, dir);
            }
            self.merge = None;
            #[cfg(debug_assertions)]
            self.check_invariants();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::split;
    use super::*;
    use xxhash_rust::xxh3::xxh3_128;

    fn id(i: u64) -> u128 {
        xxh3_128(&i.to_le_bytes())
    }

    #[test]
    fn draining_sorted_sorts_spread_and_crafted_ids() {
        let seen_at = |i: u32| Seen {
            payload: u64::from(i),
            at_secs: i,
        };
        // A shard's ids: the same top bits, the rest spread.
        let in_shard = |i: u32| {
            let [high, low] = split(id(u64::from(i)));
            [high >> SHARD_BITS | 5 << (64 - SHARD_BITS), low]
        };
        let spread = (0..5_000u32).map(|i| (in_shard(i), seen_at(i)));
        // Ids that share their top bits fill one bucket.
        let crafted =
            (0..3_000u32).map(|i| ([7, u64::from(i.wrapping_mul(2_654_435_761))], seen_at(i)));
        let few = (0..100u32).map(|i| (in_shard(i), seen_at(i)));
        for items in [
            spread.collect::<Vec<_>>(),
            crafted.collect(),
            few.collect(),
            Vec::new(),
        ] {
            let mut want: Vec<(Entry, u32)> =
                items.iter().map(|&(id, s)| run_record(id, s)).collect();
            want.sort_unstable_by_key(|(e, _)| e.id);
            let mut shard: RecentMap = items.into_iter().collect();
            assert_eq!(drain_sorted(&mut shard), want);
            assert!(shard.is_empty());
        }
    }
}
