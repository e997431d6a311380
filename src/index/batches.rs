//! The batch registry: committed batch ids with their content hash and
//! report, in commit order. Entries older than the batch TTL stop counting
//! (a redelivered batch is then planned afresh) and are purged oldest first.
//!
//! A store that takes small batches holds one entry per few events, so an
//! entry is kept small (DESIGN.md, "Batch registry"): a 32-byte slot in a
//! deque in commit order (content hash, commit time, where its bytes are),
//! the batch id and its eight counts as varints in one byte buffer in the
//! same order, and a table of 5-byte buckets from the id's hash to the
//! slot. A `BTreeMap` of entries beside a `HashMap` of owned ids took 408
//! bytes of resident memory a batch; this takes about 61.
//!
//! Commit order is time order, so what expires is a prefix of the deque,
//! and a purge pops it and hands back the front of the buffer. An id
//! committed again once its entry expired marks the old slot replaced;
//! replaced slots go when a purge reaches them, or when they outnumber the
//! live ones as the table is rebuilt. The table never removes:
//! its buckets for purged or replaced slots fail the lookup's check, and
//! it is rebuilt, from the live slots only, once it fills.

use std::collections::VecDeque;
use std::fmt;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::addr_table::AddrTable;
use super::expiry::is_expired;
use crate::batch::BatchReport;
use crate::format::codec::{Decoder, put_bytes, put_varint};

/// One committed batch, as the registry gives it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchEntry<'a> {
    pub batch_id: &'a [u8],
    pub content_hash: u128,
    pub report: BatchReport,
    pub committed_ms: u64,
}

/// Why decoding the registry's bytes cannot fail: it wrote them.
const OWN_BYTES: &str = "the registry decodes the bytes it encoded";

/// Set in a slot's `at` once a later commit of its id took over.
const REPLACED: u64 = 1 << 63;

#[derive(Debug, Clone, Copy)]
struct Slot {
    content_hash: u128,
    committed_ms: u64,
    /// Where the batch's id and counts start in the registry's byte
    /// stream (counted from its first byte ever), and `REPLACED`.
    at: u64,
}

impl Slot {
    fn is_replaced(&self) -> bool {
        self.at & REPLACED != 0
    }

    fn offset(&self) -> u64 {
        self.at & !REPLACED
    }
}

pub(crate) struct BatchRegistry {
    /// Every slot not purged yet, in commit order.
    slots: VecDeque<Slot>,
    /// The commit number of `slots[0]`.
    first_commit: u64,
    /// The slots' ids and counts, in commit order.
    bytes: Vec<u8>,
    /// The stream offset of `bytes[0]`: bytes before it were purged.
    bytes_base: u64,
    /// Id hash -> commit number minus `table_base`.
    table: AddrTable,
    table_base: u64,
    /// Seeds the ids' hashes, so that ids crafted to collide in one store
    /// do not in another.
    seed: u64,
    /// Slots neither purged nor replaced.
    live: u64,
}

impl Default for BatchRegistry {
    fn default() -> Self {
        use std::hash::BuildHasher;
        Self {
            slots: VecDeque::new(),
            first_commit: 0,
            bytes: Vec::new(),
            bytes_base: 0,
            table: AddrTable::default(),
            table_base: 0,
            seed: std::collections::hash_map::RandomState::new().hash_one(0u64),
            live: 0,
        }
    }
}

impl fmt::Debug for BatchRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchRegistry")
            .field("live", &self.live)
            .field("slots", &self.slots.len())
            .field("memory_bytes", &self.memory_bytes())
            .finish_non_exhaustive()
    }
}

impl BatchRegistry {
    /// The entry for `batch_id`, even if expired.
    pub(crate) fn get(&self, batch_id: &[u8]) -> Option<BatchEntry<'_>> {
        let commit = self.find(batch_id)?;
        self.entry(self.slot(commit)?)
    }

    /// Registers a batch, replacing an entry with the same id (which the
    /// writer only commits again once that entry expired).
    pub(crate) fn insert(
        &mut self,
        batch_id: &[u8],
        content_hash: u128,
        report: &BatchReport,
        committed_ms: u64,
    ) {
        if let Some(commit) = self.find(batch_id)
            && let Some(old) = self.slot_mut(commit)
        {
            old.at |= REPLACED;
            self.live -= 1;
        }
        if self.table.len() == self.table.capacity() {
            if self.slots.len() as u64 > 2 * self.live + 64 {
                self.drop_replaced();
            }
            self.rebuild_table();
        }
        let at = self.bytes_base + self.bytes.len() as u64;
        encode_entry(&mut self.bytes, batch_id, report);
        let commit = self.first_commit + self.slots.len() as u64;
        self.slots.push_back(Slot {
            content_hash,
            committed_ms,
            at,
        });
        self.table
            .insert_unique(self.hash(batch_id), self.address(commit));
        self.live += 1;
    }

    /// Drops entries expired at `now_ms`; returns how many.
    pub(crate) fn purge(&mut self, ttl_ms: Option<u64>, now_ms: u64) -> u64 {
        let mut dropped = 0;
        while let Some(front) = self.slots.front() {
            if !front.is_replaced() {
                if !is_expired(front.committed_ms, ttl_ms, now_ms) {
                    break;
                }
                dropped += 1;
                self.live -= 1;
            }
            self.slots.pop_front();
            self.first_commit += 1;
        }
        if dropped > 0 {
            self.release_purged();
        }
        dropped
    }

    /// Live entries in commit order.
    pub(crate) fn in_order(&self) -> impl Iterator<Item = BatchEntry<'_>> {
        self.slots.iter().filter_map(|s| self.entry(s))
    }

    pub(crate) fn len(&self) -> u64 {
        self.live
    }

    /// Heap bytes held.
    pub(crate) fn memory_bytes(&self) -> u64 {
        (self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.bytes.capacity()
            + self.table.allocation_size()) as u64
    }

    fn hash(&self, batch_id: &[u8]) -> u64 {
        xxh3_64_with_seed(batch_id, self.seed)
    }

    /// A commit number as the table holds it.
    fn address(&self, commit: u64) -> u32 {
        u32::try_from(commit - self.table_base)
            .expect("the table is rebuilt, from the oldest slot, before 2^32 commits fill it")
    }

    fn slot(&self, commit: u64) -> Option<&Slot> {
        let i = usize::try_from(commit.checked_sub(self.first_commit)?).ok()?;
        self.slots.get(i)
    }

    fn slot_mut(&mut self, commit: u64) -> Option<&mut Slot> {
        let i = usize::try_from(commit.checked_sub(self.first_commit)?).ok()?;
        self.slots.get_mut(i)
    }

    /// The commit number of the live slot for `batch_id`.
    fn find(&self, batch_id: &[u8]) -> Option<u64> {
        let address = self.table.find(self.hash(batch_id), |address| {
            let commit = self.table_base + u64::from(address);
            self.slot(commit)
                .and_then(|s| self.id(s))
                .is_some_and(|id| id == batch_id)
        })?;
        Some(self.table_base + u64::from(address))
    }

    /// A slot's id, and a decoder at its counts, unless it was replaced.
    fn decode_id(&self, slot: &Slot) -> Option<(&[u8], Decoder<'_>)> {
        if slot.is_replaced() {
            return None;
        }
        let start = usize::try_from(slot.offset() - self.bytes_base).ok()?;
        let mut d = Decoder::new(self.bytes.get(start..)?);
        let len = d.len(usize::MAX, OWN_BYTES).expect(OWN_BYTES);
        let batch_id = d.take(len, OWN_BYTES).expect(OWN_BYTES);
        Some((batch_id, d))
    }

    fn id(&self, slot: &Slot) -> Option<&[u8]> {
        self.decode_id(slot).map(|(id, _)| id)
    }

    /// A slot's entry, unless it was replaced.
    fn entry(&self, slot: &Slot) -> Option<BatchEntry<'_>> {
        let (batch_id, mut d) = self.decode_id(slot)?;
        let mut counts = [0u64; 8];
        for count in &mut counts {
            *count = d.varint(OWN_BYTES).expect(OWN_BYTES);
        }
        Some(BatchEntry {
            batch_id,
            content_hash: slot.content_hash,
            report: BatchReport::from_counts(counts),
            committed_ms: slot.committed_ms,
        })
    }

    /// A table of the live slots, with room for half as many more (so
    /// that rebuilds, each a walk of the slots, come at least `live / 2`
    /// inserts apart).
    fn rebuild_table(&mut self) {
        let room = self.live + self.live / 2 + 64;
        let mut table = AddrTable::with_capacity(usize::try_from(room).unwrap_or(usize::MAX));
        self.table_base = self.first_commit;
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(id) = self.id(slot) {
                let address = u32::try_from(i).expect("fewer than 2^32 slots in memory");
                table.insert_unique(self.hash(id), address);
            }
        }
        self.table = table;
    }

    /// Drops the replaced slots and their bytes, which an id registered
    /// again and again would otherwise pile up until a purge reached them
    /// (each table rebuild walking them all). The live slots keep their
    /// order and are numbered afresh from `first_commit`; the caller
    /// rebuilds the table.
    fn drop_replaced(&mut self) {
        let mut slots = VecDeque::with_capacity(usize::try_from(self.live).unwrap_or(0));
        let mut bytes = Vec::with_capacity(self.bytes.len());
        for slot in &self.slots {
            if let Some(e) = self.entry(slot) {
                let at = self.bytes_base + bytes.len() as u64;
                encode_entry(&mut bytes, e.batch_id, &e.report);
                slots.push_back(Slot { at, ..*slot });
            }
        }
        self.slots = slots;
        self.bytes = bytes;
    }

    /// Hands back the memory of purged slots: the front of the byte
    /// buffer once it is half of it, and spare capacity once most of it
    /// is spare.
    fn release_purged(&mut self) {
        let next = self.bytes_base + self.bytes.len() as u64;
        let first = self.slots.front().map_or(next, Slot::offset);
        let purged = usize::try_from(first - self.bytes_base).expect("within the buffer");
        if purged * 2 >= self.bytes.len() {
            self.bytes.drain(..purged);
            self.bytes_base = first;
        }
        if self.bytes.capacity() > 4 * self.bytes.len() + 4096 {
            self.bytes.shrink_to(2 * self.bytes.len());
        }
        if self.slots.capacity() > 4 * self.slots.len() + 64 {
            self.slots.shrink_to(2 * self.slots.len());
        }
        if self.table.len() as u64 > 2 * self.live + 64 {
            self.rebuild_table();
        }
    }
}

/// An entry's bytes: its id, then its report's eight counts.
fn encode_entry(bytes: &mut Vec<u8>, batch_id: &[u8], report: &BatchReport) {
    put_bytes(bytes, batch_id);
    for count in report.counts() {
        put_varint(bytes, count);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    fn report(n: u64) -> BatchReport {
        BatchReport::from_counts([n, 0, 1, 0, n * 300, 0, 0, u64::MAX - n])
    }

    #[test]
    fn finds_each_registered_batch_with_what_it_reported() {
        let mut r = BatchRegistry::default();
        for i in 0..10_000u64 {
            r.insert(
                format!("B{i}").as_bytes(),
                u128::from(i) << 70,
                &report(i),
                i,
            );
        }
        assert_eq!(r.len(), 10_000);
        for i in 0..10_000u64 {
            let e = r.get(format!("B{i}").as_bytes()).unwrap();
            assert_eq!(e.batch_id, format!("B{i}").as_bytes());
            assert_eq!(e.content_hash, u128::from(i) << 70);
            assert_eq!(e.report, report(i));
            assert_eq!(e.committed_ms, i);
        }
        assert!(r.get(b"B10000").is_none());
        assert!(r.get(b"").is_none());
    }

    #[test]
    fn a_purge_hands_back_the_memory_of_what_it_dropped() {
        let mut r = BatchRegistry::default();
        for i in 0..100_000u64 {
            r.insert(format!("B{i:07}").as_bytes(), 0, &report(1), i);
        }
        let full = r.memory_bytes();
        // Expired: committed at least the TTL before now.
        assert_eq!(r.purge(Some(10), 99_999), 99_990);
        assert!(
            r.memory_bytes() < full / 100,
            "{} of {full}",
            r.memory_bytes()
        );
        let left: Vec<_> = r.in_order().map(|e| e.committed_ms).collect();
        assert_eq!(left, (99_990..100_000).collect::<Vec<_>>());
        assert!(r.get(b"B0099989").is_none());
        assert!(r.get(b"B0099990").is_some());
    }

    #[test]
    fn a_registry_of_small_batches_takes_well_under_100_bytes_a_batch() {
        let mut r = BatchRegistry::default();
        let n = 1_000_000u64;
        for i in 0..n {
            r.insert(format!("B{i:07}").as_bytes(), 0, &report(10), i);
        }
        // 32-byte slots and 5-byte buckets with their spare room, 19 bytes
        // of id and counts: far below the 408 bytes a map of owned ids took.
        assert!(r.memory_bytes() / n < 100, "{}", r.memory_bytes() / n);
    }

    #[test]
    fn an_id_registered_again_and_again_holds_one_entry_not_a_pile() {
        let mut r = BatchRegistry::default();
        r.insert(b"other", 1, &report(1), 0);
        for i in 1..200_000u64 {
            r.insert(b"again", u128::from(i), &report(i), i);
        }
        assert_eq!(r.len(), 2);
        assert!(r.slots.len() < 1_000, "{} slots", r.slots.len());
        assert!(r.memory_bytes() < 64 << 10, "{} bytes", r.memory_bytes());
        assert_eq!(r.get(b"other").unwrap().committed_ms, 0);
        let again = r.get(b"again").unwrap();
        assert_eq!(
            (again.content_hash, again.report),
            (199_999, report(199_999))
        );
        let order: Vec<_> = r.in_order().map(|e| e.batch_id).collect();
        assert_eq!(order, [&b"other"[..], &b"again"[..]]);
    }

    /// What the registry promises, kept the plain way.
    #[derive(Default)]
    struct Model {
        by_id: BTreeMap<Vec<u8>, u64>,
        in_order: BTreeMap<u64, (Vec<u8>, u128, u64)>,
        next: u64,
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert { id: u8, hash: u128 },
        Purge { ttl: u64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0u8..40, any::<u128>()).prop_map(|(id, hash)| Op::Insert { id, hash }),
            1 => (0u64..30).prop_map(|ttl| Op::Purge { ttl }),
        ]
    }

    proptest! {
        /// Inserts (ids reused, as after an expiry) and purges, checked
        /// against a model after every step: lookups, order, length.
        #[test]
        fn behaves_as_a_map_in_commit_order(ops in prop::collection::vec(op(), 1..400)) {
            let mut r = BatchRegistry::default();
            let mut m = Model::default();
            for (now, op) in ops.into_iter().enumerate() {
                let now = now as u64;
                match op {
                    Op::Insert { id, hash } => {
                        let id = vec![b'b'; usize::from(id % 7)].into_iter().chain([id]).collect::<Vec<_>>();
                        r.insert(&id, hash, &report(now), now);
                        if let Some(n) = m.by_id.insert(id.clone(), m.next) {
                            m.in_order.remove(&n);
                        }
                        m.in_order.insert(m.next, (id, hash, now));
                        m.next += 1;
                    }
                    Op::Purge { ttl } => {
                        let mut dropped = 0;
                        while let Some(e) = m.in_order.first_entry() {
                            if !is_expired(e.get().2, Some(ttl), now) {
                                break;
                            }
                            let (id, _, _) = e.remove();
                            m.by_id.remove(&id);
                            dropped += 1;
                        }
                        prop_assert_eq!(r.purge(Some(ttl), now), dropped);
                    }
                }
                prop_assert_eq!(r.len(), m.in_order.len() as u64);
                let got: Vec<_> = r.in_order().map(|e| (e.batch_id.to_vec(), e.content_hash, e.committed_ms)).collect();
                let want: Vec<_> = m.in_order.values().cloned().collect();
                prop_assert_eq!(got, want);
                for id in 0..40u8 {
                    let id = vec![b'b'; usize::from(id % 7)].into_iter().chain([id]).collect::<Vec<_>>();
                    let got = r.get(&id).map(|e| (e.content_hash, e.committed_ms, e.report));
                    let want = m.by_id.get(&id).map(|n| {
                        let (_, hash, at) = m.in_order[n];
                        (hash, at, report(at))
                    });
                    prop_assert_eq!(got, want);
                }
            }
        }
    }
}
