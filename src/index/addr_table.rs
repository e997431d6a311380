//! The key index's hash table: arena addresses with one-byte tags, linear
//! probing, and a prefetch.
//!
//! A bucket is a tag byte (the hash's top 7 bits with the high bit set; 0
//! is empty) and a `u32` arena address, kept in two arrays, so 5 bytes per
//! bucket. A lookup scans tags from the hash's home bucket until an empty
//! one, and compares keys (in the arena) only where the tag matches, which a
//! wrong key does one time in 128. The bucket count is a power of two and
//! the table holds at most 7/8 of it; it never removes an entry (the key
//! index rebuilds it instead). Unlike a general-purpose table, it can be
//! asked to prefetch the lines a later lookup reads, so that a batch's
//! lookups overlap their cache misses.

/// Buckets per 8 entries at full load.
const LOAD_NUM: usize = 7;
const LOAD_DEN: usize = 8;

#[derive(Debug, Default)]
pub(crate) struct AddrTable {
    tags: Vec<u8>,
    addrs: Vec<u32>,
    len: usize,
}

fn tag_of(hash: u64) -> u8 {
    ((hash >> 57) as u8) | 0x80
}

impl AddrTable {
    /// A table with room for `capacity` entries.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let buckets = if capacity == 0 {
            0
        } else {
            (capacity * LOAD_DEN)
                .div_ceil(LOAD_NUM)
                .next_power_of_two()
                .max(8)
        };
        Self {
            tags: vec![0; buckets],
            addrs: vec![0; buckets],
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Entries the table holds before it must be rebuilt larger.
    pub(crate) fn capacity(&self) -> usize {
        self.tags.len() / LOAD_DEN * LOAD_NUM
    }

    fn home(&self, hash: u64) -> usize {
        hash as usize & self.tags.len().wrapping_sub(1)
    }

    /// The address under `hash` for which `is_key` holds.
    pub(crate) fn find(&self, hash: u64, is_key: impl Fn(u32) -> bool) -> Option<u32> {
        let mask = self.tags.len().checked_sub(1)?;
        let tag = tag_of(hash);
        let mut i = hash as usize & mask;
        loop {
            match self.tags.get(i).copied()? {
                0 => return None,
                t if t == tag => {
                    let addr = self.addrs.get(i).copied()?;
                    if is_key(addr) {
                        return Some(addr);
                    }
                }
                _ => {}
            }
            i = (i + 1) & mask;
        }
    }

    /// Adds an address whose key is not in the table yet.
    ///
    /// # Panics
    /// If the table is full (the caller rebuilds it first).
    pub(crate) fn insert_unique(&mut self, hash: u64, addr: u32) {
        assert!(
            self.len < self.capacity(),
            "the table is rebuilt before it fills"
        );
        let mask = self.tags.len() - 1;
        let mut i = hash as usize & mask;
        while self.tags.get(i).is_some_and(|&t| t != 0) {
            i = (i + 1) & mask;
        }
        if let (Some(t), Some(a)) = (self.tags.get_mut(i), self.addrs.get_mut(i)) {
            *t = tag_of(hash);
            *a = addr;
            self.len += 1;
        }
    }

    /// Asks the CPU to fetch the lines a lookup of `hash` reads first.
    pub(crate) fn prefetch(&self, hash: u64) {
        let at = self.home(hash);
        if let (Some(tag), Some(addr)) = (self.tags.get(at), self.addrs.get(at)) {
            crate::hashing::prefetch(tag);
            crate::hashing::prefetch(addr);
        }
    }

    /// Heap bytes held.
    pub(crate) fn allocation_size(&self) -> usize {
        self.tags.capacity() + self.addrs.capacity() * std::mem::size_of::<u32>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xxhash_rust::xxh3::xxh3_64;

    #[test]
    fn finds_every_address_inserted_and_nothing_else() {
        let n = 50_000u32;
        let hash = |k: u32| xxh3_64(&k.to_le_bytes());
        let mut table = AddrTable::with_capacity(n as usize);
        assert!(table.capacity() >= n as usize);
        for k in 0..n {
            // The address is the key itself here.
            table.insert_unique(hash(k), k);
        }
        assert_eq!(table.len(), n as usize);
        for k in 0..n {
            assert_eq!(table.find(hash(k), |a| a == k), Some(k), "key {k}");
        }
        for k in n..2 * n {
            assert_eq!(table.find(hash(k), |a| a == k), None, "key {k}");
        }
    }

    #[test]
    fn colliding_hashes_are_told_apart_by_the_key() {
        let mut table = AddrTable::with_capacity(4);
        for addr in [7, 8, 9] {
            table.insert_unique(42, addr);
        }
        for addr in [7, 8, 9] {
            assert_eq!(table.find(42, |a| a == addr), Some(addr));
        }
        assert_eq!(table.find(42, |a| a == 10), None);
    }

    #[test]
    fn a_table_filled_to_capacity_still_ends_the_search_for_an_absent_key() {
        use std::cell::Cell;
        let mut table = AddrTable::with_capacity(20);
        let capacity = table.capacity() as u32;
        // Every entry under one hash: a search compares each key once, then
        // stops at an empty bucket, which a full table would not have.
        for addr in 0..capacity {
            table.insert_unique(42, addr);
        }
        let compared = Cell::new(0);
        let absent = table.find(42, |_| {
            compared.set(compared.get() + 1);
            assert!(compared.get() <= capacity, "the search went round");
            false
        });
        assert_eq!(absent, None);
        assert_eq!(compared.get(), capacity);
    }

    #[test]
    fn an_empty_table_finds_nothing() {
        let table = AddrTable::default();
        assert_eq!(table.capacity(), 0);
        assert_eq!(table.find(1, |_| true), None);
        table.prefetch(1);
    }
}
