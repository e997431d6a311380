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
}

fn corruption(segment: u32, offset: u64, reason: &str) -> Error {
    Error::Corruption {
        segment: u64::from(segment),
        file: segment_file_name(segment),
        offset,
        reason: reason.to_owned(),
    }
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

    /// Total bytes of the mapped segments' files, and how many there are.
    pub(crate) fn disk_bytes(&self) -> (u64, u64) {
        let maps = self.maps.read();
        let bytes = maps.values().filter_map(|m| m.file.len().ok()).sum();
        (bytes, maps.len() as u64)
    }

    /// A map of `segment` covering at least `end` bytes.
    fn map_covering(&self, segment: u32, end: usize) -> Result<Bytes> {
        if let Some(m) = self.maps.read().get(&segment)
            && m.map.len() >= end
        {
            return Ok(m.map.clone());
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
        Ok(m.map.clone())
    }

    /// Reads a value and checks its CRC. Corrupt bytes are never returned.
    pub(crate) fn read(&self, value: ValueRef) -> Result<Bytes> {
        let at = value.offset as usize;
        let start = at.checked_sub(4).ok_or_else(|| {
            corruption(
                value.segment,
                u64::from(value.offset),
                "value offset before its checksum",
            )
        })?;
        let end = at + value.len as usize;
        let map = self.map_covering(value.segment, end)?;
        let (Some(crc), Some(bytes)) = (map.get(start..at), map.get(at..end)) else {
            return Err(corruption(
                value.segment,
                u64::from(value.offset),
                "value beyond the end of its segment",
            ));
        };
        let crc = u32::from_le_bytes(crc.try_into().expect("four bytes"));
        if crc32fast::hash(bytes) != crc {
            return Err(corruption(
                value.segment,
                start as u64,
                "value checksum mismatch",
            ));
        }
        Ok(map.slice(at..end))
    }
}
