//! What more than one test file needs: the files on disk, values made to
//! match a CRC.

use std::path::Path;

/// Segment file header, and record frame header, in bytes (DESIGN.md,
/// "On-disk format").
const SEGMENT_HEADER_LEN: usize = 32;
const FRAME_HEADER_LEN: usize = 28;
/// Where a frame header keeps its body's length (u32, little-endian).
const BODY_LEN_AT: usize = 8;

/// Where each record of segment file `path` starts, and where the last one
/// ends: the file's length, unless the store extended it ahead of its
/// records, which leaves zeros from there to the end of the file. Walks the
/// frames by their lengths without checking them: for a file the store
/// wrote, not for a damaged one.
pub fn records(path: &Path) -> (Vec<u64>, u64) {
    let bytes = std::fs::read(path).expect("read segment file");
    let mut starts = Vec::new();
    let mut at = SEGMENT_HEADER_LEN;
    while let Some(header) = bytes.get(at..at + FRAME_HEADER_LEN)
        && header.iter().any(|&b| b != 0)
    {
        starts.push(at as u64);
        let body_len: [u8; 4] = header[BODY_LEN_AT..BODY_LEN_AT + 4].try_into().unwrap();
        at += FRAME_HEADER_LEN + u32::from_le_bytes(body_len) as usize;
    }
    (starts, at.min(bytes.len()) as u64)
}

/// Where the records of segment file `path` end (see `records`).
#[allow(
    dead_code,
    reason = "not every test file that includes this module uses it"
)]
pub fn records_end(path: &Path) -> u64 {
    records(path).1
}

/// `value` with its first byte changed and its last four bytes set so that
/// its CRC32 stays the same. CRC32 is affine over GF(2): for a fixed
/// length, the last four bytes move the checksum by a linear, invertible
/// map, which is solved here one bit at a time.
#[allow(
    dead_code,
    reason = "not every test file that includes this module uses it"
)]
pub fn same_crc_other_bytes(value: &[u8]) -> Vec<u8> {
    assert!(
        value.len() >= 5,
        "room for a change and the four bytes that undo it"
    );
    let tail = value.len() - 4;
    let mut other = value.to_vec();
    other[0] ^= 1;
    other[tail..].fill(0);
    let base = crc32fast::hash(&other);
    // For each bit of the tail, the checksum bits it flips; reduced to a
    // basis whose rows each lead with their own checksum bit.
    let mut rows: Vec<(u32, u32)> = (0..32)
        .map(|bit| {
            let mut flipped = other.clone();
            flipped[tail + bit / 8] ^= 1 << (bit % 8);
            (crc32fast::hash(&flipped) ^ base, 1u32 << bit)
        })
        .collect();
    let mut basis: Vec<(u32, u32)> = Vec::new();
    for bit in (0..32).rev() {
        let at = rows
            .iter()
            .position(|r| r.0 >> bit & 1 == 1)
            .expect("the tail reaches every checksum bit");
        let pivot = rows.remove(at);
        for r in rows.iter_mut().chain(basis.iter_mut()) {
            if r.0 >> bit & 1 == 1 {
                *r = (r.0 ^ pivot.0, r.1 ^ pivot.1);
            }
        }
        basis.push(pivot);
    }
    let change = crc32fast::hash(value) ^ base;
    let tail_bits = basis
        .iter()
        .filter(|(flips, _)| change & flips != 0)
        .fold(0, |bits, &(_, tail_bit)| bits ^ tail_bit);
    other[tail..].copy_from_slice(&tail_bits.to_le_bytes());
    other
}
