//! The on-disk layouts the targets build and mend (DESIGN.md, FORMAT): the
//! segment header and the record frame, written out here from the spec so
//! that the fuzz crate needs nothing private of the engine.

/// Bytes of a segment header.
pub const SEGMENT_HEADER_LEN: usize = 32;
/// Bytes of a record frame header.
pub const FRAME_HEADER_LEN: usize = 28;

/// What a file holds, as its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    Log = 0,
    Base = 1,
    Snapshot = 2,
}

/// Record kind of a batch record; state records are 2 (keys) to 8 (end).
pub const KIND_BATCH: u8 = 1;

/// The format version the engine writes, read from a segment header it
/// wrote, so that frames built here never lag behind the engine.
pub fn format_version() -> u32 {
    static VERSION: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let files = crate::image::SeedStore::Closed.files();
        let (_, segment) = files
            .iter()
            .find(|(n, _)| n.ends_with(".seg"))
            .expect("a new store has a segment");
        u32_at(segment, 8)
    })
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

fn put_u32_at(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The header of segment `id` (0 for a snapshot).
pub fn segment_header(id: u32, kind: FileKind) -> [u8; SEGMENT_HEADER_LEN] {
    let mut h = [0u8; SEGMENT_HEADER_LEN];
    h[..8].copy_from_slice(b"IDEMKVSG");
    put_u32_at(&mut h, 8, format_version());
    put_u32_at(&mut h, 12, id);
    put_u32_at(&mut h, 16, kind as u32);
    let crc = crc32fast::hash(&h[..24]);
    put_u32_at(&mut h, 24, crc);
    h
}

/// Appends a frame holding `body` to `file` (which belongs to segment
/// `segment_id`), claiming the segment synced up to `synced_to` (capped at
/// the frame's own offset, as the writer does).
pub fn push_frame(file: &mut Vec<u8>, segment_id: u32, kind: u8, body: &[u8], synced_to: u32) {
    let offset = u32::try_from(file.len()).unwrap_or(u32::MAX);
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[4] = kind;
    put_u32_at(&mut h, 8, u32::try_from(body.len()).unwrap_or(u32::MAX));
    put_u32_at(&mut h, 12, crc32fast::hash(body));
    put_u32_at(&mut h, 16, segment_id);
    put_u32_at(&mut h, 20, offset);
    put_u32_at(&mut h, 24, synced_to.min(offset));
    let crc = crc32fast::hash(&h[4..]);
    put_u32_at(&mut h, 0, crc);
    file.extend_from_slice(&h);
    file.extend_from_slice(body);
}

/// The records of a file whose frames are whole, as (kind, body), up to the
/// first frame that does not fit.
pub fn records(file: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = SEGMENT_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= file.len() {
        let len = u32_at(file, pos + 8) as usize;
        let Some(body) = file.get(pos + FRAME_HEADER_LEN..pos + FRAME_HEADER_LEN + len) else {
            break;
        };
        out.push((file[pos + 4], body.to_vec()));
        pos += FRAME_HEADER_LEN + len;
    }
    out
}

/// Makes every checksum of `file` hold again after an edit: the segment
/// header's, and for each frame that fits, its body CRC, its position
/// (segment id and offset) and its header CRC. Lengths, kinds, reserved
/// bytes and `synced_to` are left as the edit made them, so the damage the
/// fuzzer made reaches the decoders instead of stopping at a checksum.
pub fn mend_checksums(file: &mut [u8], segment_id: u32) {
    if file.len() < SEGMENT_HEADER_LEN {
        return;
    }
    let crc = crc32fast::hash(&file[..24]);
    put_u32_at(file, 24, crc);
    let mut pos = SEGMENT_HEADER_LEN;
    while pos + FRAME_HEADER_LEN <= file.len() {
        let len = u32_at(file, pos + 8) as usize;
        let body_at = pos + FRAME_HEADER_LEN;
        let Some(end) = body_at.checked_add(len).filter(|&e| e <= file.len()) else {
            // The body runs past the end: a torn record, left torn.
            break;
        };
        let body_crc = crc32fast::hash(&file[body_at..end]);
        put_u32_at(file, pos + 12, body_crc);
        put_u32_at(file, pos + 16, segment_id);
        put_u32_at(file, pos + 20, u32::try_from(pos).unwrap_or(u32::MAX));
        let crc = crc32fast::hash(&file[pos + 4..body_at]);
        put_u32_at(file, pos, crc);
        pos = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_accepts_a_header_built_here() {
        let header = segment_header(1, FileKind::Log).to_vec();
        let storage = crate::image::disk_with(&[(crate::image::segment_name(1), header)]);
        let clock = idemkv::ManualClock::new(crate::image::START_MS);
        let opts = crate::image::options(&storage, &clock);
        idemkv::Store::verify_dir(crate::image::dir(), &opts).expect("a valid empty segment");
    }

    #[test]
    fn frames_round_trip_and_mending_restores_them() {
        let mut file = segment_header(3, FileKind::Log).to_vec();
        push_frame(&mut file, 3, KIND_BATCH, b"first", 0);
        push_frame(&mut file, 3, KIND_BATCH, b"second", 64);
        let good = file.clone();
        assert_eq!(
            records(&file),
            vec![(1, b"first".to_vec()), (1, b"second".to_vec())]
        );
        file[SEGMENT_HEADER_LEN + FRAME_HEADER_LEN] ^= 0x20;
        mend_checksums(&mut file, 3);
        assert_ne!(file, good);
        file[SEGMENT_HEADER_LEN + FRAME_HEADER_LEN] ^= 0x20;
        mend_checksums(&mut file, 3);
        assert_eq!(file, good);
    }
}
