//! What more than one test file needs to know about the files on disk.

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
