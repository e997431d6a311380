//! The key index's records: one per key, back to back in chunks, each
//! the key's entry (seq and value location or tombstone) and its bytes,
//! addressed by a `u32` (see the parent module).

use super::{KeyEntry, KeyState};
use crate::format::ID_BYTES_MAX;
use crate::hashing::Fingerprint;
use crate::log::segments::ValueRef;

// A record, all little-endian:
//
// | offset | size | field                                                         |
// |--------|------|---------------------------------------------------------------|
// | 0      | 8    | seq                                                           |
// | 8      | 16   | live: segment, offset, len, CRC; tombstone: second, 0, 0, 0   |
// | 24     | 8    | live: the value's fingerprint, 0 if not known; tombstone: 0    |
// | 32     | 2    | key length << 2, plus 2 if the CRC is known, 1 for a tombstone |
// | 34     | len  | key                                                           |
//
// then zero to three bytes of padding to a multiple of `UNIT_BYTES`.
const SEQ_AT: usize = 0;
const STATE_AT: usize = SEQ_AT + 8;
const FINGERPRINT_AT: usize = STATE_AT + 16;
const KEY_WORD_AT: usize = FINGERPRINT_AT + 8;
const KEY_AT: usize = KEY_WORD_AT + 2;
const TOMBSTONE_FLAG: u16 = 1;
const CRC_FLAG: u16 = 2;
/// Records start at multiples of this; addresses count these units.
const UNIT_BYTES: usize = 4;
const _: () = assert!(ID_BYTES_MAX < 1 << 14, "key length fits beside the flags");

/// The key length a record's key word holds.
fn key_len(key_word: u16) -> usize {
    usize::from(key_word >> 2)
}

pub(super) fn record_bytes(key_len: usize) -> usize {
    (KEY_AT + key_len).next_multiple_of(UNIT_BYTES)
}

fn le<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes
        .get(at..at + N)
        .and_then(|b| b.try_into().ok())
        .expect("a record field lies inside its chunk")
}

/// The records, back to back in chunks of at most `1 << bits` bytes. An
/// address is the chunk's number << (`bits` - 2) | the offset in the chunk
/// in 4-byte units.
#[derive(Debug)]
pub(super) struct Arena {
    chunks: Vec<Vec<u8>>,
    bits: u32,
    /// Chunks the addresses reach: 2^32 units in all, 16 GiB (tests lower it).
    chunks_max: usize,
}

impl Arena {
    pub(super) fn new(bits: u32) -> Self {
        assert!(
            1usize << bits >= record_bytes(ID_BYTES_MAX),
            "arena chunks of 2^{bits} bytes cannot hold a key of {ID_BYTES_MAX}"
        );
        assert!(bits < 32, "arena chunks of 2^{bits} bytes");
        let unit_bits = bits - UNIT_BYTES.trailing_zeros();
        Self {
            chunks: Vec::new(),
            bits,
            chunks_max: 1 << (u32::BITS - unit_bits),
        }
    }

    /// An empty arena with chunks of the same size and the same limit.
    pub(super) fn empty_like(&self) -> Self {
        Self {
            chunks: Vec::new(),
            ..*self
        }
    }

    /// Lowers the number of chunks the arena may hold (tests: the real
    /// limit is 16 GiB).
    #[cfg(test)]
    pub(super) fn limit_chunks(&mut self, chunks_max: usize) {
        self.chunks_max = chunks_max;
    }

    /// Chunks holding records (tests).
    #[cfg(test)]
    pub(super) fn chunks_used(&self) -> usize {
        self.chunks.len()
    }

    /// Whether records of `bytes` more (`record_bytes` of each key) surely
    /// fit, and would fit again in any other order, as a replay after a
    /// snapshot or a purge's rebuild packs the same records.
    ///
    /// A chunk is left for a new one only when the next record does not
    /// fit, so each chunk but the last holds more than a chunk less the
    /// longest record (`filled_at_least`): `n` bytes of records take at
    /// most `n.div_ceil(filled_at_least)` chunks, in whatever order. The
    /// chunks held after these records (the last one now counted as full)
    /// then bound the bytes of every record; those must fit that way
    /// within the limit. With 256 KiB chunks this keeps 1.6% of the 16 GiB
    /// unused.
    pub(super) fn has_room_for(&self, bytes: u64) -> bool {
        let chunk_bytes = 1u64 << self.bits;
        let filled_at_least = chunk_bytes - record_bytes(ID_BYTES_MAX) as u64;
        let chunks_after = self.chunks.len() as u64 + bytes.div_ceil(filled_at_least);
        (chunks_after * chunk_bytes).div_ceil(filled_at_least) <= self.chunks_max as u64
    }

    fn unit_bits(&self) -> u32 {
        self.bits - UNIT_BYTES.trailing_zeros()
    }

    /// The chunk and byte offset of an address.
    fn locate(&self, address: u32) -> (usize, usize) {
        let chunk = (address >> self.unit_bits()) as usize;
        let unit = (address & ((1 << self.unit_bits()) - 1)) as usize;
        (chunk, unit * UNIT_BYTES)
    }

    /// The address of a byte offset in a chunk, `None` past the last
    /// address a `u32` can hold.
    fn address(&self, chunk: usize, at: usize) -> Option<u32> {
        let units = u64::try_from(chunk).ok()? << self.unit_bits();
        u32::try_from(units | (at / UNIT_BYTES) as u64).ok()
    }

    /// A record's bytes, padding excluded.
    pub(super) fn record(&self, address: u32) -> &[u8] {
        let (chunk, at) = self.locate(address);
        let chunk = self.chunks.get(chunk).expect("a record's chunk exists");
        let len = key_len(u16::from_le_bytes(le(chunk, at + KEY_WORD_AT)));
        chunk
            .get(at..at + KEY_AT + len)
            .expect("a record lies inside its chunk")
    }

    pub(super) fn key(&self, address: u32) -> &[u8] {
        record_key(self.record(address))
    }

    /// Asks the CPU to fetch a record's first line.
    pub(super) fn prefetch(&self, address: u32) {
        let (chunk, at) = self.locate(address);
        if let Some(byte) = self.chunks.get(chunk).and_then(|c| c.get(at)) {
            crate::hashing::prefetch(byte);
        }
    }

    pub(super) fn entry(&self, address: u32) -> KeyEntry {
        decode_entry(self.record(address))
    }

    /// Overwrites a record's entry; returns whether it was live.
    pub(super) fn set_entry(&mut self, address: u32, entry: KeyEntry) -> bool {
        let (chunk, at) = self.locate(address);
        let header = self
            .chunks
            .get_mut(chunk)
            .and_then(|c| c.get_mut(at..at + KEY_AT))
            .expect("a record lies inside its chunk");
        let key_word = u16::from_le_bytes(le(header, KEY_WORD_AT));
        let was_live = key_word & TOMBSTONE_FLAG == 0;
        header.copy_from_slice(&encode_header(entry, key_len(key_word)));
        was_live
    }

    /// Appends a record; returns its address, or `None` if no address is
    /// left for it. A record that does not fit in the last chunk starts a
    /// new one; the last chunk doubles up to its full size, so that small
    /// indexes stay small.
    pub(super) fn push(&mut self, header: &[u8; KEY_AT], key: &[u8]) -> Option<u32> {
        let chunk_bytes = 1usize << self.bits;
        let len = record_bytes(key.len());
        if self
            .chunks
            .last()
            .is_none_or(|c| c.len() + len > chunk_bytes)
        {
            if self.chunks.len() >= self.chunks_max {
                return None;
            }
            self.chunks.push(Vec::new());
        }
        let number = self.chunks.len() - 1;
        let chunk_at = self.chunks.last().map_or(0, Vec::len);
        let address = self
            .address(number, chunk_at)
            .expect("the chunks held stay within the addresses");
        let chunk = self.chunks.last_mut().expect("a chunk with room exists");
        let at = chunk.len();
        if at + len > chunk.capacity() {
            let target = (chunk.capacity() * 2)
                .max(at + len)
                .max(64)
                .min(chunk_bytes);
            chunk.reserve_exact(target - at);
        }
        chunk.extend_from_slice(header);
        chunk.extend_from_slice(key);
        chunk.resize(at + len, 0);
        Some(address)
    }

    /// Appends a copy of a record of another arena (as `record` returns
    /// it); returns its address, or `None` if no address is left.
    pub(super) fn push_copy(&mut self, record: &[u8]) -> Option<u32> {
        let (header, key) = record.split_at(KEY_AT);
        self.push(&le(header, 0), key)
    }

    /// Every record's address, in address order (which is insertion order).
    pub(super) fn records(&self) -> impl Iterator<Item = u32> + '_ {
        let (mut chunk, mut at) = (0, 0);
        std::iter::from_fn(move || {
            loop {
                let c = self.chunks.get(chunk)?;
                if at < c.len() {
                    let address = self.address(chunk, at)?;
                    let len = key_len(u16::from_le_bytes(le(c, at + KEY_WORD_AT)));
                    at += record_bytes(len);
                    return Some(address);
                }
                (chunk, at) = (chunk + 1, 0);
            }
        })
    }

    /// Checks that each chunk stays within its size and ends on a record
    /// boundary, and that a tombstone's unused state words are zero (tests).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        let chunk_bytes = 1usize << self.bits;
        for c in &self.chunks {
            assert!(c.capacity() <= chunk_bytes, "chunk capacity");
            assert_eq!(c.len() % UNIT_BYTES, 0, "chunks end on a record boundary");
        }
        for a in self.records() {
            if let KeyState::Deleted { .. } = self.entry(a).state {
                let unused = self.record(a).get(STATE_AT + 4..KEY_WORD_AT);
                assert_eq!(unused, Some(&[0; 20][..]), "tombstone {a}'s unused words");
            }
        }
    }

    pub(super) fn memory_bytes(&self) -> usize {
        let bytes: usize = self.chunks.iter().map(Vec::capacity).sum();
        bytes + self.chunks.capacity() * std::mem::size_of::<Vec<u8>>()
    }
}

pub(super) fn encode_header(entry: KeyEntry, key_len: usize) -> [u8; KEY_AT] {
    let (state, fingerprint, flags) = match entry.state {
        KeyState::Live(v) => {
            let crc_flag = if v.crc.is_some() { CRC_FLAG } else { 0 };
            let crc = v.crc.unwrap_or(0);
            let fingerprint = v.fingerprint.map_or(0, Fingerprint::get);
            ([v.segment, v.offset, v.len, crc], fingerprint, crc_flag)
        }
        KeyState::Deleted { at_secs } => ([at_secs, 0, 0, 0], 0, TOMBSTONE_FLAG),
    };
    let key_word = u16::try_from(key_len << 2).expect("key length fits in 14 bits") | flags;
    let mut header = [0; KEY_AT];
    let (seq, rest) = header.split_at_mut(STATE_AT);
    seq.copy_from_slice(&entry.seq.to_le_bytes());
    let (words, rest) = rest.split_at_mut(FINGERPRINT_AT - STATE_AT);
    for (slot, w) in words.chunks_exact_mut(4).zip(state) {
        slot.copy_from_slice(&w.to_le_bytes());
    }
    let (fingerprint_bytes, key_word_bytes) = rest.split_at_mut(KEY_WORD_AT - FINGERPRINT_AT);
    fingerprint_bytes.copy_from_slice(&fingerprint.to_le_bytes());
    key_word_bytes.copy_from_slice(&key_word.to_le_bytes());
    header
}

pub(super) fn decode_entry(record: &[u8]) -> KeyEntry {
    let seq = u64::from_le_bytes(le(record, SEQ_AT));
    let word = |i: usize| u32::from_le_bytes(le(record, STATE_AT + 4 * i));
    let flags = u16::from_le_bytes(le(record, KEY_WORD_AT));
    let state = if flags & TOMBSTONE_FLAG != 0 {
        KeyState::Deleted { at_secs: word(0) }
    } else {
        KeyState::Live(ValueRef {
            segment: word(0),
            offset: word(1),
            len: word(2),
            crc: (flags & CRC_FLAG != 0).then(|| word(3)),
            fingerprint: Fingerprint::from_stored(u64::from_le_bytes(le(record, FINGERPRINT_AT))),
        })
    };
    KeyEntry { seq, state }
}

pub(super) fn record_key(record: &[u8]) -> &[u8] {
    record.get(KEY_AT..).unwrap_or_default()
}
