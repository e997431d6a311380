//! Segment header and record frame layouts (DESIGN.md, FORMAT, "Segment
//! header" and "Record frame").

use super::FORMAT_VERSION;

/// First bytes of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"IDEMKVSG";

// Segment header: magic | version u32 | segment id u32 | file kind u32 |
// reserved u32 (zero) | crc u32 | pad u32 (zero).
const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const SEGMENT_ID_AT: usize = VERSION_AT + 4;
const FILE_KIND_AT: usize = SEGMENT_ID_AT + 4;
const RESERVED_AT: usize = FILE_KIND_AT + 4;
const HEADER_CRC_AT: usize = RESERVED_AT + 4;
const PAD_AT: usize = HEADER_CRC_AT + 4;
/// Bytes of the segment header; the first record starts here.
pub(crate) const SEGMENT_HEADER_LEN: usize = PAD_AT + 4;
const _: () = assert!(SEGMENT_HEADER_LEN == 32);

// Record frame header: header crc u32 | kind u8 | reserved [u8; 3] (zero) |
// body length u32 | body crc u32 | segment id u32 | offset u32 | synced to u32.
const FRAME_CRC_AT: usize = 0;
const KIND_AT: usize = FRAME_CRC_AT + 4;
const FRAME_RESERVED_AT: usize = KIND_AT + 1;
const BODY_LEN_AT: usize = FRAME_RESERVED_AT + 3;
const BODY_CRC_AT: usize = BODY_LEN_AT + 4;
const FRAME_SEGMENT_AT: usize = BODY_CRC_AT + 4;
const FRAME_OFFSET_AT: usize = FRAME_SEGMENT_AT + 4;
const SYNCED_TO_AT: usize = FRAME_OFFSET_AT + 4;
/// Bytes of a record frame header; the body follows.
pub(crate) const FRAME_HEADER_LEN: usize = SYNCED_TO_AT + 4;
const _: () = assert!(FRAME_HEADER_LEN == 28);

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let bytes: [u8; 4] = buf
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .expect("caller passes a full header");
    u32::from_le_bytes(bytes)
}

fn put_u32_at(buf: &mut [u8], at: usize, v: u32) {
    buf.get_mut(at..at + 4)
        .expect("caller passes a full header")
        .copy_from_slice(&v.to_le_bytes());
}

/// What a file holds. Every file the engine writes starts with the same header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A log segment: batch records, appended.
    Log = 0,
    /// A base segment written by compaction: state records with values inline.
    Base = 1,
    /// A snapshot of the index: state records that refer to values in segments.
    Snapshot = 2,
}

/// Encodes the header of segment `segment_id` (0 for a snapshot).
pub(crate) fn encode_segment_header(segment_id: u32, kind: FileKind) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[MAGIC_AT..MAGIC_AT + 8].copy_from_slice(&SEGMENT_MAGIC);
    put_u32_at(&mut h, VERSION_AT, FORMAT_VERSION);
    put_u32_at(&mut h, SEGMENT_ID_AT, segment_id);
    put_u32_at(&mut h, FILE_KIND_AT, kind as u32);
    let crc = crc32fast::hash(&h[..HEADER_CRC_AT]);
    put_u32_at(&mut h, HEADER_CRC_AT, crc);
    h
}

/// The format version of a whole, intact header (magic and checksum hold)
/// when it is newer than this build's: the file was written by a later
/// idemkv, and is not damage to repair.
pub(crate) fn newer_format_version(buf: &[u8]) -> Option<u32> {
    let h = buf.get(..SEGMENT_HEADER_LEN)?;
    let is_intact = h.get(MAGIC_AT..MAGIC_AT + 8) == Some(&SEGMENT_MAGIC[..])
        && Some(u32_at(h, HEADER_CRC_AT)) == h.get(..HEADER_CRC_AT).map(crc32fast::hash);
    let version = u32_at(h, VERSION_AT);
    (is_intact && version > FORMAT_VERSION).then_some(version)
}

/// Checks a segment header; returns the file's kind, or why it is not a
/// valid header of `segment_id`.
pub(crate) fn decode_segment_header(buf: &[u8], segment_id: u32) -> Result<FileKind, &'static str> {
    let h = buf
        .get(..SEGMENT_HEADER_LEN)
        .ok_or("segment header is incomplete")?;
    if h.get(MAGIC_AT..MAGIC_AT + 8) != Some(&SEGMENT_MAGIC[..]) {
        return Err("segment header has a bad magic number");
    }
    let crc = crc32fast::hash(
        h.get(..HEADER_CRC_AT)
            .ok_or("segment header is incomplete")?,
    );
    if u32_at(h, HEADER_CRC_AT) != crc {
        return Err("segment header checksum mismatch");
    }
    if u32_at(h, PAD_AT) != 0 {
        return Err("segment header padding is not zero");
    }
    if u32_at(h, VERSION_AT) != FORMAT_VERSION {
        return Err("segment has an unsupported format version");
    }
    if u32_at(h, SEGMENT_ID_AT) != segment_id {
        return Err("segment header names another segment id");
    }
    if u32_at(h, RESERVED_AT) != 0 {
        return Err("segment header reserved field is not zero");
    }
    match u32_at(h, FILE_KIND_AT) {
        0 => Ok(FileKind::Log),
        1 => Ok(FileKind::Base),
        2 => Ok(FileKind::Snapshot),
        _ => Err("segment header has an unknown file kind"),
    }
}

/// The fields of a record frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub kind: u8,
    pub body_len: u32,
    pub body_crc: u32,
    pub segment_id: u32,
    pub offset: u32,
    /// When this record was written, its segment was known to be synced up
    /// to this offset. Recovery uses it to tell unsynced, possibly reordered
    /// writes from damage to synced data.
    pub synced_to: u32,
}

/// Writes a frame header for `body` into `out` (exactly `FRAME_HEADER_LEN` bytes).
/// `synced_to` never exceeds `offset`: only what precedes a record can have
/// been synced when it is written.
#[expect(clippy::indexing_slicing, reason = "the length is asserted on entry")]
pub(crate) fn encode_frame(
    out: &mut [u8],
    kind: u8,
    body: &[u8],
    segment_id: u32,
    offset: u32,
    synced_to: u32,
) {
    assert_eq!(out.len(), FRAME_HEADER_LEN, "frame header buffer size");
    assert!(
        synced_to <= offset,
        "synced to {synced_to}, past the record at {offset}"
    );
    let body_len = u32::try_from(body.len()).expect("record body fits in u32 (checked by caller)");
    out.fill(0);
    out[KIND_AT] = kind;
    put_u32_at(out, BODY_LEN_AT, body_len);
    put_u32_at(out, BODY_CRC_AT, crc32fast::hash(body));
    put_u32_at(out, FRAME_SEGMENT_AT, segment_id);
    put_u32_at(out, FRAME_OFFSET_AT, offset);
    put_u32_at(out, SYNCED_TO_AT, synced_to);
    let crc = crc32fast::hash(&out[KIND_AT..]);
    put_u32_at(out, FRAME_CRC_AT, crc);
}

/// Reads the frame header at the start of `buf` if it is whole and its
/// checksum holds and it names the position it was read from.
pub(crate) fn decode_frame(buf: &[u8], segment_id: u32, offset: u32) -> Option<Frame> {
    let h = buf.get(..FRAME_HEADER_LEN)?;
    // Cheap position check first: it rejects almost every misaligned candidate
    // when recovery scans for a later frame.
    if u32_at(h, FRAME_OFFSET_AT) != offset || u32_at(h, FRAME_SEGMENT_AT) != segment_id {
        return None;
    }
    if crc32fast::hash(h.get(KIND_AT..)?) != u32_at(h, FRAME_CRC_AT) {
        return None;
    }
    if h.get(FRAME_RESERVED_AT..BODY_LEN_AT)? != [0, 0, 0] || u32_at(h, SYNCED_TO_AT) > offset {
        return None;
    }
    Some(Frame {
        kind: *h.get(KIND_AT)?,
        body_len: u32_at(h, BODY_LEN_AT),
        body_crc: u32_at(h, BODY_CRC_AT),
        segment_id,
        offset,
        synced_to: u32_at(h, SYNCED_TO_AT),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_header_round_trips_and_names_its_id() {
        let h = encode_segment_header(7, FileKind::Base);
        assert_eq!(decode_segment_header(&h, 7), Ok(FileKind::Base));
        assert!(decode_segment_header(&h, 8).is_err());
        for i in 0..SEGMENT_HEADER_LEN {
            let mut bad = h;
            bad[i] ^= 0x10;
            assert!(decode_segment_header(&bad, 7).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn frame_round_trips_and_rejects_any_flipped_byte() {
        let mut h = [0u8; FRAME_HEADER_LEN];
        encode_frame(&mut h, 1, b"body", 3, 96, 64);
        let f = decode_frame(&h, 3, 96).unwrap();
        assert_eq!(
            (f.kind, f.body_len, f.body_crc, f.synced_to),
            (1, 4, crc32fast::hash(b"body"), 64)
        );
        assert!(decode_frame(&h, 3, 97).is_none());
        for i in 0..FRAME_HEADER_LEN {
            let mut bad = h;
            bad[i] ^= 0x01;
            assert!(decode_frame(&bad, 3, 96).is_none(), "flip at {i}");
        }
    }

    /// Sets `field` in a frame header and mends its checksum, as a writer
    /// that broke the rules, or a record of another file, would.
    fn mended_frame(mut h: [u8; FRAME_HEADER_LEN], field: usize, v: u32) -> [u8; FRAME_HEADER_LEN] {
        put_u32_at(&mut h, field, v);
        let crc = crc32fast::hash(&h[KIND_AT..]);
        put_u32_at(&mut h, FRAME_CRC_AT, crc);
        h
    }

    #[test]
    fn a_frame_with_a_matching_checksum_is_refused_where_it_breaks_the_rules() {
        let mut h = [0u8; FRAME_HEADER_LEN];
        encode_frame(&mut h, 1, b"body", 3, 96, 64);
        // Another segment's record at the same offset.
        assert!(decode_frame(&h, 4, 96).is_none());
        let synced_past_itself = mended_frame(h, SYNCED_TO_AT, 97);
        assert!(decode_frame(&synced_past_itself, 3, 96).is_none());
        // Reserved bytes 5..8 sit in the word that starts at the kind byte.
        let reserved = mended_frame(h, KIND_AT, 1 | 1 << 8);
        assert!(decode_frame(&reserved, 3, 96).is_none());
        // Synced up to the record itself is what `Durability::Buffered` writes.
        let synced_to_itself = mended_frame(h, SYNCED_TO_AT, 96);
        assert_eq!(
            decode_frame(&synced_to_itself, 3, 96).unwrap().synced_to,
            96
        );
    }

    #[test]
    fn a_segment_header_with_a_matching_checksum_is_refused_where_it_breaks_the_rules() {
        for kind in [FileKind::Log, FileKind::Base, FileKind::Snapshot] {
            let h = encode_segment_header(5, kind);
            assert_eq!(decode_segment_header(&h, 5), Ok(kind));
            assert_eq!(newer_format_version(&h), None, "this build's version");
        }
        let mended = |field: usize, v: u32| {
            let mut h = encode_segment_header(5, FileKind::Log);
            put_u32_at(&mut h, field, v);
            let crc = crc32fast::hash(&h[..HEADER_CRC_AT]);
            put_u32_at(&mut h, HEADER_CRC_AT, crc);
            h
        };
        for (field, v) in [
            (VERSION_AT, FORMAT_VERSION - 1),
            (VERSION_AT, FORMAT_VERSION + 1),
            (SEGMENT_ID_AT, 6),
            (FILE_KIND_AT, 3),
            (RESERVED_AT, 1),
        ] {
            assert!(
                decode_segment_header(&mended(field, v), 5).is_err(),
                "{v} at {field}"
            );
        }
        // A later version is told apart from damage only when the header is intact.
        let later = mended(VERSION_AT, FORMAT_VERSION + 1);
        assert_eq!(newer_format_version(&later), Some(FORMAT_VERSION + 1));
        let mut damaged = later;
        damaged[HEADER_CRC_AT] ^= 1;
        assert_eq!(newer_format_version(&damaged), None);
        let mut foreign = later;
        foreign[MAGIC_AT] ^= 1;
        assert_eq!(newer_format_version(&foreign), None);
        assert_eq!(newer_format_version(&later[..SEGMENT_HEADER_LEN - 1]), None);
    }
}
