//! A blocked Bloom filter over seen ids, so that most lookups of an id never
//! seen cost one cache line instead of the seen index's two or three (and
//! inserting one skips the search for an old record of it). The pending
//! batches keep one too, of the hashes of what they touched
//! (`store/pending.rs`).
//!
//! Ids are already uniform 128-bit hashes: the first word picks a 64-byte
//! block (by multiply-shift, so that any block count works and the filter is
//! sized exactly), the second word gives the bit positions inside it. The
//! filter only ever answers "certainly not seen" or "maybe": an id is never
//! removed from it, so ids that expired or a stale filter cost a full
//! lookup, never a wrong answer. It is rebuilt from the index, sized for
//! half again the index's ids, once as many ids were added as it was sized
//! for; that bounds its false positives, its staleness when ids expire, and
//! its memory (1 to 1.5 bytes per id).

/// Bits set per id, each in the id's block.
const PROBES: u32 = 6;
/// Bits of filter per id it is sized for.
const BITS_PER_ID: usize = 8;
/// Ids the smallest filter is sized for.
const CAPACITY_MIN: usize = 4096;

/// One cache line of bits.
#[derive(Debug, Clone, Copy, Default)]
#[repr(align(64))]
struct Block([u64; 8]);

const BLOCK_BITS: usize = 512;

#[derive(Debug, Default)]
pub(crate) struct IdFilter {
    blocks: Vec<Block>,
    /// Ids the filter was sized for, and how many were added since.
    capacity: usize,
    added: usize,
}

/// The (word, bit) pairs of an id inside its block.
fn probes(id: [u64; 2]) -> impl Iterator<Item = (usize, u64)> {
    (0..PROBES).map(move |i| {
        let bit = (id[1] >> (i * 9)) as usize % BLOCK_BITS;
        (bit / 64, 1u64 << (bit % 64))
    })
}

impl IdFilter {
    /// An empty filter sized for `ids` ids (at least `CAPACITY_MIN`).
    pub(crate) fn with_capacity(ids: usize) -> Self {
        let capacity = ids.max(CAPACITY_MIN);
        let blocks = (capacity * BITS_PER_ID).div_ceil(BLOCK_BITS);
        Self {
            blocks: vec![Block::default(); blocks],
            capacity,
            added: 0,
        }
    }

    /// A filter holding `ids`, sized for half as many again.
    pub(crate) fn build(len: usize, ids: impl Iterator<Item = [u64; 2]>) -> Self {
        let mut filter = Self::with_capacity(len.saturating_add(len / 2));
        for id in ids {
            filter.add(id);
        }
        filter
    }

    fn block_index(&self, id: [u64; 2]) -> Option<usize> {
        let blocks = self.blocks.len() as u128;
        (blocks > 0).then(|| ((u128::from(id[0]) * blocks) >> 64) as usize)
    }

    /// False if `id` was certainly never added.
    pub(crate) fn may_contain(&self, id: [u64; 2]) -> bool {
        let Some(block) = self.block_index(id).and_then(|b| self.blocks.get(b)) else {
            return true;
        };
        probes(id).all(|(word, bit)| block.0.get(word).is_some_and(|w| w & bit != 0))
    }

    /// Adds `id`; the caller rebuilds the filter once `is_full`.
    pub(crate) fn add(&mut self, id: [u64; 2]) {
        let Some(b) = self.block_index(id) else {
            return;
        };
        if let Some(block) = self.blocks.get_mut(b) {
            for (word, bit) in probes(id) {
                if let Some(w) = block.0.get_mut(word) {
                    *w |= bit;
                }
            }
        }
        self.added += 1;
    }

    /// Whether the filter holds `len` ids and is sized for one to two times
    /// what `build` would size it for them.
    pub(crate) fn suits(&self, len: usize) -> bool {
        let built = len.saturating_add(len / 2).max(CAPACITY_MIN);
        self.added == len && (built..=built.saturating_mul(2)).contains(&self.capacity)
    }

    /// Whether as many ids were added as the filter was sized for.
    pub(crate) fn is_full(&self) -> bool {
        self.added >= self.capacity
    }

    /// Whether no id was added since it was made or cleared.
    pub(crate) fn is_empty(&self) -> bool {
        self.added == 0
    }

    /// Forgets every id, keeping the size.
    pub(crate) fn clear(&mut self) {
        if !self.is_empty() {
            self.blocks.fill(Block::default());
            self.added = 0;
        }
    }

    /// Asks the CPU to fetch `id`'s block, so that a lookup a little later
    /// finds it in cache.
    pub(crate) fn prefetch(&self, id: [u64; 2]) {
        if let Some(block) = self.block_index(id).and_then(|b| self.blocks.get(b)) {
            crate::hashing::prefetch(block);
        }
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.blocks.capacity() * std::mem::size_of::<Block>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_128;

    fn id(i: u64) -> [u64; 2] {
        let h = xxh3_128(&i.to_le_bytes());
        [(h >> 64) as u64, h as u64]
    }

    #[test]
    fn clear_forgets_every_id_and_keeps_the_size() {
        let mut filter = IdFilter::with_capacity(1_000);
        assert!(filter.is_empty());
        for i in 0..1_000 {
            filter.add(id(i));
        }
        assert!(!filter.is_empty() && (0..1_000).all(|i| filter.may_contain(id(i))));
        let bytes = filter.memory_bytes();
        filter.clear();
        assert!(filter.is_empty() && !filter.is_full());
        assert!((0..1_000).all(|i| !filter.may_contain(id(i))));
        assert_eq!(filter.memory_bytes(), bytes);
    }

    #[test]
    fn added_ids_are_always_found_and_few_others_are() {
        let n = 100_000u64;
        let mut filter = IdFilter::with_capacity(n as usize);
        for i in 0..n {
            filter.add(id(i));
        }
        assert!(filter.is_full());
        assert!((0..n).all(|i| filter.may_contain(id(i))));
        let false_positives = (n..2 * n).filter(|&i| filter.may_contain(id(i))).count();
        // Full, at 8 bits per id or more: a few percent at most.
        assert!(
            false_positives < (n / 20) as usize,
            "{false_positives} false positives in {n}"
        );
    }

    #[test]
    fn a_built_filter_holds_its_ids_and_has_room_for_half_as_many_again() {
        let ids: Vec<[u64; 2]> = (0..10_000).map(id).collect();
        let mut filter = IdFilter::build(ids.len(), ids.iter().copied());
        assert!(ids.iter().all(|&i| filter.may_contain(i)));
        assert!(!filter.is_full());
        for i in 10_000..15_000 {
            filter.add(id(i));
        }
        assert!(filter.is_full());
    }

    #[test]
    fn a_filter_suits_only_the_ids_it_holds_at_about_the_size_a_build_gives() {
        let filled = |sized_for: usize, ids: u64| {
            let mut filter = IdFilter::with_capacity(sized_for);
            (0..ids).for_each(|i| filter.add(id(i)));
            filter
        };
        assert!(filled(15_000, 10_000).suits(10_000), "as built");
        assert!(filled(30_000, 10_000).suits(10_000), "twice as large");
        assert!(!filled(31_000, 10_000).suits(10_000), "too large");
        assert!(!filled(14_000, 10_000).suits(10_000), "too small");
        assert!(!filled(15_000, 9_999).suits(10_000), "an id missing");
    }

    #[test]
    fn an_empty_filter_answers_maybe_only_for_what_it_holds() {
        let filter = IdFilter::default();
        assert!(
            filter.may_contain(id(1)),
            "no blocks: every id may be there"
        );
        let filter = IdFilter::with_capacity(0);
        assert!(!filter.may_contain(id(1)));
    }
}
