//! Memory maps of the segments, through which values are read.
//!
//! Values are never copied into the heap by the index: a `get` returns a
//! `Bytes` that points into the map. The active segment is mapped with room
//! to grow, so appends rarely need a new map; a read past the mapped length
//! remaps once.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::RwLock;

use super::names::segment_file_name;
use crate::error::{Error, Result};
use crate::hashing::Fingerprint;
use crate::storage::StorageFile;

#[derive(Debug)]
struct Mapped {
    file: Arc<dyn StorageFile>,
    map: Bytes,
}

/// The mapped segments, by id.
#[derive(Debug)]
pub(crate) struct SegmentMaps {
    /// How far to map ahead of a segment's current length.
    reserve: u64,
    maps: RwLock<HashMap<u32, Mapped>>,
}

/// Where a value lives: its bytes start at `offset` in segment `segment`,
/// preceded by their CRC32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ValueRef {
    pub segment: u32,
    pub offset: u32,
    pub len: u32,
    /// The value's CRC, when the index knows it without reading the
    /// segment: writes, replay and base segments give it, snapshots keep
    /// it; only a snapshot written before they did (key tag `REF`) loads
    /// keys without it.
    pub crc: Option<u32>,
    /// The value's keyed fingerprint, known for values written since the
    /// store was opened (the key index takes it as it applies their
    /// records, and keeps it when compaction moves them); `None` for those
    /// an open loaded.
    pub fingerprint: Option<Fingerprint>,
}

fn corruption(segment: u32, offset: u64, reason: &str) -> Error {
    Error::Corruption {
        segment: u64::from(segment),
        file: segment_file_name(segment),
        offset,
        reason: reason.to_owned(),
    }
}

/// Where a value's CRC starts: the 4 bytes before the value.
fn checksum_at(value: ValueRef) -> Result<u32> {
    value.offset.checked_sub(4).ok_or_else(|| {
        corruption(
            value.segment,
            u64::from(value.offset),
            "value offset before its checksum",
        )
    })
}

impl SegmentMaps {
    pub(crate) fn new(reserve: u64) -> Self {
        Self {
            reserve,
            maps: RwLock::new(HashMap::new()),
        }
    }

    /// Registers a segment with a map of it.
    pub(crate) fn insert(&self, segment: u32, file: Arc<dyn StorageFile>, map: Bytes) {
        self.maps.write().insert(segment, Mapped { file, map });
    }

    /// Forgets the segments below `id` (replaced by a base segment).
    pub(crate) fn remove_below(&self, id: u32) {
        self.maps.write().retain(|&segment, _| segment >= id);
    }

    /// The lowest segment id mapped.
    pub(crate) fn first_id(&self) -> Option<u32> {
        self.maps.read().keys().min().copied()
    }

    /// Lets every page of the maps leave the process's resident memory
    /// (`StorageFile::release_pages`): for a caller that has just read
    /// values all over the log, such as a digest.
    pub(crate) fn release_pages(&self) {
        for m in self.maps.read().values() {
            m.file.release_pages(&m.map, m.map.len());
        }
    }

    /// Total bytes of the mapped segments' files, and how many there are.
    pub(crate) fn disk_bytes(&self) -> (u64, u64) {
        let maps = self.maps.read();
        let bytes = maps.values().filter_map(|m| m.file.len().ok()).sum();
        (bytes, maps.len() as u64)
    }

    /// Calls `f` with a map of `segment` covering at least `end` bytes,
    /// under the maps' read lock (the hot path takes no reference count).
    fn with_map<R>(&self, segment: u32, end: usize, f: impl FnOnce(&Bytes) -> R) -> Result<R> {
        {
            let maps = self.maps.read();
            if let Some(m) = maps.get(&segment)
                && m.map.len() >= end
            {
                return Ok(f(&m.map));
            }
        }
        let mut maps = self.maps.write();
        let m = maps
            .get_mut(&segment)
            .ok_or_else(|| corruption(segment, end as u64, "value refers to a missing segment"))?;
        if m.map.len() < end {
            let file_name = segment_file_name(segment);
            m.map = m
                .file
                .map(self.reserve)
                .map_err(|e| Error::io("map", file_name, e))?;
        }
        Ok(f(&m.map))
    }

    /// Calls `f` with a value's stored CRC, unchecked, and the map and range
    /// that hold its bytes.
    fn with_raw<R>(
        &self,
        value: ValueRef,
        f: impl FnOnce(u32, &Bytes, std::ops::Range<usize>) -> R,
    ) -> Result<R> {
        let at = value.offset as usize;
        let beyond = || {
            corruption(
                value.segment,
                u64::from(value.offset),
                "value beyond the end of its segment",
            )
        };
        let start = checksum_at(value)? as usize;
        let end = at + value.len as usize;
        self.with_map(value.segment, end, |map| {
            let crc = map
                .get(start..at)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_le_bytes);
            match crc {
                Some(crc) if end <= map.len() => Ok(f(crc, map, at..end)),
                _ => Err(beyond()),
            }
        })?
    }

    /// Reads a value and checks its CRC, and the stored CRC against the one
    /// the index knows, if it does. Corrupt bytes are never returned, nor
    /// another value's intact bytes where the index points wrong.
    pub(crate) fn read(&self, value: ValueRef) -> Result<Bytes> {
        self.with_raw(value, |crc, map, range| {
            let bytes = map.get(range.clone()).unwrap_or_default();
            check_stored(value, crc, bytes)?;
            Ok(map.slice(range))
        })?
    }

    /// As `read`, but copied out with `read_at` rather than through the map:
    /// for a sweep over many values of the log (compaction), whose pages a
    /// map would leave in the process's resident memory.
    pub(crate) fn read_copy(&self, value: ValueRef) -> Result<Bytes> {
        let mut stored = vec![0; 4 + value.len as usize];
        self.read_raw(value, &mut stored)?;
        let (crc, bytes) = stored.split_at(4);
        let crc = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
        check_stored(value, crc, bytes)?;
        Ok(Bytes::from(stored).slice(4..))
    }

    /// Whether the stored value equals `candidate`. Cheaper than `read`:
    /// lengths, then the CRC the index knows (which spares reading the
    /// segment for most values that differ), then the value's fingerprint,
    /// if the index knows it, against the candidate's, which decides
    /// without a read; else the stored CRC against the candidate's, then
    /// the bytes. Equal bytes under a matching CRC are themselves verified,
    /// and a damaged value read here only ever compares unequal.
    pub(crate) fn equals(
        &self,
        value: ValueRef,
        candidate: &[u8],
        candidate_crc: u32,
    ) -> Result<bool> {
        if value.len as usize != candidate.len() {
            return Ok(false);
        }
        if value.crc.is_some_and(|crc| crc != candidate_crc) {
            return Ok(false);
        }
        if let Some(fingerprint) = value.fingerprint {
            return Ok(Fingerprint::of(candidate) == fingerprint);
        }
        // Most likely equal, or a key loaded without its CRC: the stored CRC
        // and bytes decide, read with `read_at`, which maps no page (these
        // reads land anywhere in the log, and a fault through the map would
        // bring in the pages around).
        let (mut small, mut large) = ([0; 256], Vec::new());
        let stored = match small.get_mut(..4 + candidate.len()) {
            Some(stored) => stored,
            None => {
                large.resize(4 + candidate.len(), 0);
                &mut large[..]
            }
        };
        self.read_raw(value, stored)?;
        let (crc, bytes) = stored.split_at(4);
        Ok(crc == candidate_crc.to_le_bytes() && bytes == candidate)
    }

    /// Reads a value's stored CRC and bytes, unchecked, into `out`.
    fn read_raw(&self, value: ValueRef, out: &mut [u8]) -> Result<()> {
        let start = checksum_at(value)?;
        let file = self
            .maps
            .read()
            .get(&value.segment)
            .map(|m| Arc::clone(&m.file))
            .ok_or_else(|| {
                let at = u64::from(value.offset);
                corruption(value.segment, at, "value refers to a missing segment")
            })?;
        file.read_at(u64::from(start), out).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                corruption(
                    value.segment,
                    u64::from(value.offset),
                    "value beyond the end of its segment",
                )
            } else {
                Error::io("read", segment_file_name(value.segment), e)
            }
        })
    }
}

/// Checks a value's bytes against their stored CRC, and that CRC against
/// the one the index knows for the value, if it knows one.
fn check_stored(value: ValueRef, stored_crc: u32, bytes: &[u8]) -> Result<()> {
    let at = u64::from(value.offset.saturating_sub(4));
    if crc32fast::hash(bytes) != stored_crc {
        return Err(corruption(value.segment, at, "value checksum mismatch"));
    }
    if value.crc.is_some_and(|known| known != stored_crc) {
        return Err(corruption(
            value.segment,
            at,
            "value does not match the checksum its index entry holds",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{OpenMode, Storage};

    /// `SegmentMaps::equals` with the candidate's CRC computed here.
    fn equals(maps: &SegmentMaps, value: ValueRef, candidate: &[u8]) -> Result<bool> {
        maps.equals(value, candidate, crc32fast::hash(candidate))
    }

    /// A value whose fingerprint the index knows is compared without a
    /// read: here its segment is not even mapped.
    #[test]
    fn a_known_fingerprint_decides_without_reading() {
        let maps = SegmentMaps::new(0);
        let crc = crc32fast::hash(b"hello");
        let v = ValueRef {
            segment: 9,
            offset: 12,
            len: 5,
            crc: Some(crc),
            fingerprint: Some(Fingerprint::of(b"hello")),
        };
        assert!(maps.equals(v, b"hello", crc).unwrap());
        // Other bytes handed in with the stored CRC, as bytes made to match
        // it would be: the CRC check passes, the fingerprint decides.
        assert!(!maps.equals(v, b"hellO", crc).unwrap());
        assert!(!equals(&maps, v, b"hell").unwrap());
        let unknown = ValueRef {
            fingerprint: None,
            ..v
        };
        assert!(
            maps.equals(unknown, b"hello", crc).is_err(),
            "without a fingerprint, the read decides"
        );
    }

    #[test]
    fn equals_compares_without_trusting_damaged_bytes() {
        let storage = crate::storage::OsStorage;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v");
        let file = storage.open(&path, OpenMode::CreateNew).unwrap();
        let mut bytes = vec![0u8; 8];
        bytes.extend_from_slice(&crc32fast::hash(b"hello").to_le_bytes());
        bytes.extend_from_slice(b"hello");
        file.append(&bytes).unwrap();
        let maps = SegmentMaps::new(0);
        maps.insert(1, Arc::clone(&file), file.map(0).unwrap());
        let v = ValueRef {
            segment: 1,
            offset: 12,
            len: 5,
            crc: None,
            fingerprint: None,
        };
        assert!(equals(&maps, v, b"hello").unwrap());
        assert!(!equals(&maps, v, b"hellO").unwrap());
        let hello = crc32fast::hash(b"hello");
        let known = ValueRef {
            crc: Some(hello),
            ..v
        };
        assert!(
            equals(&maps, known, b"hello").unwrap(),
            "confirmed by a read"
        );
        assert!(!equals(&maps, v, b"hell").unwrap());
        assert_eq!(&maps.read(v).unwrap()[..], b"hello");
        assert_eq!(&maps.read_copy(v).unwrap()[..], b"hello");

        // Damage the stored bytes: equals says no, read refuses.
        let damaged = dir.path().join("w");
        let file = storage.open(&damaged, OpenMode::CreateNew).unwrap();
        bytes[13] ^= 1;
        file.append(&bytes).unwrap();
        maps.insert(2, Arc::clone(&file), file.map(0).unwrap());
        let w = ValueRef { segment: 2, ..v };
        assert!(!equals(&maps, w, b"hello").unwrap());
        assert!(matches!(maps.read(w), Err(Error::Corruption { .. })));
        assert!(matches!(maps.read_copy(w), Err(Error::Corruption { .. })));
        // A known CRC is still checked against the stored bytes.
        let known = |crc| ValueRef {
            crc: Some(crc),
            ..w
        };
        assert!(!equals(&maps, known(crc32fast::hash(b"hello")), b"hello").unwrap());

        // Intact bytes that are not the value the index knows (a reference
        // gone wrong) are refused too, not returned as its value.
        let other = ValueRef {
            crc: Some(crc32fast::hash(b"world")),
            ..v
        };
        assert!(matches!(maps.read(other), Err(Error::Corruption { .. })));
        assert!(matches!(
            maps.read_copy(other),
            Err(Error::Corruption { .. })
        ));
        assert_eq!(
            &maps
                .read(ValueRef {
                    crc: Some(hello),
                    ..v
                })
                .unwrap()[..],
            b"hello"
        );
    }

    /// A file holding `bytes`, mapped as segment `segment` of `maps`.
    fn mapped(
        maps: &SegmentMaps,
        dir: &std::path::Path,
        segment: u32,
        bytes: &[u8],
    ) -> Arc<dyn StorageFile> {
        let storage = crate::storage::OsStorage;
        let file = storage
            .open(&dir.join(segment.to_string()), OpenMode::CreateNew)
            .unwrap();
        file.append(bytes).unwrap();
        maps.insert(segment, Arc::clone(&file), file.map(0).unwrap());
        file
    }

    /// The stored form of a value: its CRC, then its bytes.
    fn stored(value: &[u8]) -> Vec<u8> {
        let mut bytes = crc32fast::hash(value).to_le_bytes().to_vec();
        bytes.extend_from_slice(value);
        bytes
    }

    #[test]
    fn a_damaged_stored_checksum_makes_intact_bytes_compare_unequal() {
        let dir = tempfile::tempdir().unwrap();
        let maps = SegmentMaps::new(0);
        let mut bytes = vec![0u8; 8];
        bytes.extend_from_slice(&stored(b"hello"));
        bytes[8] ^= 1;
        mapped(&maps, dir.path(), 1, &bytes);
        let v = ValueRef {
            segment: 1,
            offset: 12,
            len: 5,
            crc: None,
            fingerprint: None,
        };
        assert!(!equals(&maps, v, b"hello").unwrap());
        assert!(matches!(maps.read(v), Err(Error::Corruption { .. })));
        assert!(matches!(maps.read_copy(v), Err(Error::Corruption { .. })));
    }

    #[test]
    fn a_value_too_large_for_the_stack_buffer_compares_equal_to_itself_only() {
        let dir = tempfile::tempdir().unwrap();
        let maps = SegmentMaps::new(0);
        let value: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        mapped(&maps, dir.path(), 1, &stored(&value));
        for crc in [None, Some(crc32fast::hash(&value))] {
            let v = ValueRef {
                segment: 1,
                offset: 4,
                len: 1000,
                crc,
                fingerprint: None,
            };
            assert!(equals(&maps, v, &value).unwrap(), "{crc:?}");
            let mut other = value.clone();
            other[999] ^= 1;
            assert!(!equals(&maps, v, &other).unwrap(), "{crc:?}");
        }
    }

    #[test]
    fn a_candidate_of_another_length_answers_without_reading_the_segment() {
        let maps = SegmentMaps::new(0);
        let unmapped = ValueRef {
            segment: 9,
            offset: 12,
            len: 5,
            crc: None,
            fingerprint: None,
        };
        assert!(!equals(&maps, unmapped, b"hell").unwrap());
        assert!(!equals(&maps, unmapped, b"hello!").unwrap());
    }

    #[test]
    fn a_value_appended_after_its_segment_was_mapped_is_read_through_a_new_map() {
        let dir = tempfile::tempdir().unwrap();
        // No room reserved: the first map ends where the file did.
        let maps = SegmentMaps::new(0);
        let file = mapped(&maps, dir.path(), 1, &stored(b"first"));
        file.append(&stored(b"second")).unwrap();
        let second = ValueRef {
            segment: 1,
            offset: 13,
            len: 6,
            crc: Some(crc32fast::hash(b"second")),
            fingerprint: None,
        };
        assert_eq!(&maps.read(second).unwrap()[..], b"second");
        let first = ValueRef {
            offset: 4,
            len: 5,
            crc: None,
            ..second
        };
        assert_eq!(&maps.read(first).unwrap()[..], b"first");
    }

    #[test]
    fn a_value_past_the_end_of_its_segment_is_corruption_on_every_path() {
        let dir = tempfile::tempdir().unwrap();
        let maps = SegmentMaps::new(0);
        mapped(&maps, dir.path(), 1, &stored(b"hello"));
        let corrupt = |r: Result<_>| matches!(r, Err(Error::Corruption { .. }));
        for (offset, len) in [(4, 6), (8, 5), (2, 5), (0, 1)] {
            let v = ValueRef {
                segment: 1,
                offset,
                len,
                crc: None,
                fingerprint: None,
            };
            assert!(corrupt(maps.read(v).map(drop)), "read {offset}+{len}");
            assert!(corrupt(maps.read_copy(v).map(drop)), "copy {offset}+{len}");
            let candidate = vec![b'h'; len as usize];
            assert!(
                corrupt(equals(&maps, v, &candidate).map(drop)),
                "equals {offset}+{len}"
            );
        }
        // Zeros hold the checksum of no bytes at all: a value running past
        // the end of a zeroed file must not pass for an empty one.
        mapped(&maps, dir.path(), 2, &[0; 8]);
        let v = ValueRef {
            segment: 2,
            offset: 4,
            len: 8,
            crc: None,
            fingerprint: None,
        };
        assert!(corrupt(maps.read(v).map(drop)));
        assert!(corrupt(maps.read_copy(v).map(drop)));
    }

    #[test]
    fn a_known_crc_that_differs_answers_without_reading_the_segment() {
        let maps = SegmentMaps::new(0);
        let unmapped = ValueRef {
            segment: 9,
            offset: 12,
            len: 5,
            crc: None,
            fingerprint: None,
        };
        assert!(
            equals(&maps, unmapped, b"hello").is_err(),
            "segment 9 is not mapped"
        );
        let known = ValueRef {
            crc: Some(crc32fast::hash(b"world")),
            ..unmapped
        };
        assert!(!equals(&maps, known, b"hello").unwrap());
        let same = ValueRef {
            crc: Some(crc32fast::hash(b"hello")),
            ..unmapped
        };
        assert!(
            equals(&maps, same, b"hello").is_err(),
            "a matching CRC reads the bytes"
        );
    }
}
