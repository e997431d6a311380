//! The whole index written out as state records, and read back
//! (DESIGN.md, "Compaction, snapshots and repair").
//!
//! Compaction writes a *base segment*: state records with every live value
//! inline, which replaces all older segments. A *snapshot* holds the same
//! records with references to values in the segments, and lets `open` skip
//! replaying the log it covers. Both are written to a temporary file and
//! synced before the caller renames them into place.

mod load;
mod read_ahead;

use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::segment::{
    FRAME_HEADER_LEN, FileKind, SEGMENT_HEADER_LEN, encode_frame, encode_segment_header,
};
use crate::format::state::{
    self, AddMarkView, BatchView, KeyValue, QuarantinedView, SEEN_ENTRY_LEN,
    STATE_RECORD_BYTES_TARGET, SeenView, StateEnd,
};
use crate::index::Index;
use crate::index::keys::KeyState;
use crate::storage::{OpenMode, Storage, StorageFile};

pub(crate) use load::{LoadError, StateLoader};
use read_ahead::ReadAhead;
pub(crate) use read_ahead::ReadValue;

/// How the keys' values are written.
pub(crate) enum Values<'a> {
    /// Copied into the file (a base segment); read through this function,
    /// from two threads if the storage allows (`read_ahead.rs`).
    Inline(ReadValue<'a>),
    /// Referred to where they are (a snapshot).
    Refs,
}

/// Room at the front of a record being built: the frame header, then the
/// longest entry count (a varint).
const COUNT_BYTES_MAX: usize = 10;
const ENTRIES_AT: usize = FRAME_HEADER_LEN + COUNT_BYTES_MAX;

/// Appends framed state records to a new file.
struct StateWriter<'a> {
    file: Arc<dyn StorageFile>,
    path: &'a Path,
    segment_id: u32,
    offset: u64,
    kind: u8,
    count: usize,
    /// The record being built: its entries from `ENTRIES_AT`, after room
    /// for its count and frame header, which are written once the count is
    /// known, right before the entries, so the entries are never copied.
    record: Vec<u8>,
}

impl StateWriter<'_> {
    fn section(&mut self, kind: u8) -> Result<()> {
        self.flush()?;
        self.kind = kind;
        Ok(())
    }

    fn entries_len(&self) -> usize {
        self.record.len() - ENTRIES_AT
    }

    fn entry(&mut self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        encode(&mut self.record);
        self.count += 1;
        if self.entries_len() >= STATE_RECORD_BYTES_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    /// As many calls of `entry` as `items` yields, for entries of exactly
    /// `entry_bytes` each: the records end where `entry` would end them,
    /// but each is filled by one loop.
    fn fixed_entries<T>(
        &mut self,
        entry_bytes: usize,
        mut items: impl ExactSizeIterator<Item = T>,
        mut encode: impl FnMut(&mut Vec<u8>, T),
    ) -> Result<()> {
        while items.len() > 0 {
            let room = STATE_RECORD_BYTES_TARGET
                .saturating_sub(self.entries_len())
                .div_ceil(entry_bytes)
                .max(1);
            let take = room.min(items.len());
            self.record.reserve(take * entry_bytes);
            for item in items.by_ref().take(take) {
                let before = self.record.len();
                encode(&mut self.record, item);
                debug_assert_eq!(
                    self.record.len() - before,
                    entry_bytes,
                    "a fixed-size entry"
                );
            }
            self.count += take;
            if self.entries_len() >= STATE_RECORD_BYTES_TARGET {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        let mut count = Vec::with_capacity(COUNT_BYTES_MAX);
        state::encode_count(&mut count, self.count);
        let count_at = ENTRIES_AT - count.len();
        self.record
            .get_mut(count_at..ENTRIES_AT)
            .expect("the room at the front holds any count")
            .copy_from_slice(&count);
        self.append(count_at - FRAME_HEADER_LEN)?;
        self.record.truncate(ENTRIES_AT);
        self.count = 0;
        Ok(())
    }

    /// Frames and appends the record that starts at `start` in `record`.
    ///
    /// The whole record must lie below 4 GiB, not only its start: the
    /// values inline in it are found by 32-bit offsets, so a record that
    /// crossed the limit would be written and then fail to load.
    fn append(&mut self, start: usize) -> Result<()> {
        let record = self
            .record
            .get_mut(start..)
            .expect("a record starts inside the buffer");
        let end = self.offset + record.len() as u64;
        let offset = u32::try_from(self.offset)
            .ok()
            .filter(|_| end <= u64::from(u32::MAX))
            .ok_or_else(|| {
                Error::io(
                    "write",
                    self.path,
                    std::io::Error::other("state file over 4 GiB"),
                )
            })?;
        let (header, body) = record.split_at_mut(FRAME_HEADER_LEN);
        // A state file is synced whole before it is used: no record relies on `synced_to`.
        encode_frame(header, self.kind, body, self.segment_id, offset, 0);
        self.file
            .append(record)
            .map_err(|e| Error::io("append", self.path, e))?;
        self.offset += record.len() as u64;
        Ok(())
    }

    fn end(&mut self, end: &StateEnd) -> Result<()> {
        self.flush()?;
        self.kind = state::KIND_END;
        self.record.clear();
        self.record.resize(FRAME_HEADER_LEN, 0);
        state::encode_end(&mut self.record, end);
        self.append(0)
    }
}

/// Writes `index` to a new file at `path` (removing a leftover first),
/// without syncing it: the caller syncs the file before it trusts it, and
/// need not hold the index meanwhile. `end` gives the position the state
/// covers; its totals are filled in.
pub(crate) fn write(
    storage: &dyn Storage,
    path: &Path,
    file_kind: FileKind,
    segment_id: u32,
    index: &Index,
    values: &Values<'_>,
    mut end: StateEnd,
) -> Result<Arc<dyn StorageFile>> {
    match storage.remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove", path, e)),
    }
    let file = storage
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", path, e))?;
    file.append(&encode_segment_header(segment_id, file_kind))
        .map_err(|e| Error::io("write", path, e))?;
    let mut w = StateWriter {
        file,
        path,
        segment_id,
        offset: SEGMENT_HEADER_LEN as u64,
        kind: state::KIND_KEYS,
        count: 0,
        record: vec![0; ENTRIES_AT],
    };

    w.section(state::KIND_KEYS)?;
    let mut read_ahead = match values {
        Values::Inline(read) => {
            let live = index.keys.range_prefix(b"").filter_map(|(_, e)| e.value());
            Some(ReadAhead::new(live, *read, storage.allows_background_io()))
        }
        Values::Refs => None,
    };
    for (key, entry) in index.keys.range_prefix(b"") {
        let value = match (entry.state, &mut read_ahead) {
            (KeyState::Live(v), Some(values)) => Some((v, values.next(v)?)),
            (KeyState::Live(v), None) => {
                w.entry(|b| {
                    state::encode_key(
                        b,
                        key,
                        entry.seq,
                        KeyValue::Ref {
                            segment: v.segment,
                            offset: v.offset,
                            len: v.len,
                            crc: v.crc,
                        },
                    )
                })?;
                continue;
            }
            (KeyState::Deleted { at_secs }, _) => {
                w.entry(|b| state::encode_key(b, key, entry.seq, KeyValue::Tombstone { at_secs }))?;
                continue;
            }
        };
        if let Some((_, bytes)) = value {
            w.entry(|b| {
                state::encode_key(
                    b,
                    key,
                    entry.seq,
                    KeyValue::Inline {
                        value: &bytes,
                        value_at: 0,
                    },
                )
            })?;
        }
    }
    end.totals[0] = index.keys.live_count() + index.keys.tombstone_count();

    w.section(state::KIND_SEEN)?;
    index.seen.try_for_each_sorted(|part| {
        w.fixed_entries(SEEN_ENTRY_LEN, part.iter(), |b, (id, seen)| {
            let view = SeenView {
                id,
                payload: seen.payload,
                at_secs: seen.at_secs,
            };
            state::encode_seen(b, view);
        })
    })?;
    end.totals[1] = index.seen.len();

    w.section(state::KIND_BATCHES)?;
    for e in index.batches.in_order() {
        let view = BatchView {
            batch_id: e.batch_id,
            content_hash: e.content_hash,
            committed_ms: e.committed_ms,
            counts: e.report.counts(),
        };
        w.entry(|b| state::encode_batch(b, &view))?;
    }
    end.totals[2] = index.batches.len();

    w.section(state::KIND_CHECKPOINTS)?;
    for (source, position) in &index.checkpoints {
        w.entry(|b| state::encode_checkpoint(b, source, position))?;
    }
    end.totals[3] = index.checkpoints.len() as u64;

    w.section(state::KIND_QUARANTINE)?;
    for q in &index.quarantine {
        let view = QuarantinedView {
            batch_id: &q.batch_id,
            index: q.index,
            event_id: &q.event_id,
            reason: q.reason.as_bytes(),
        };
        w.entry(|b| state::encode_quarantined(b, &view))?;
    }
    end.totals[4] = index.quarantine.len() as u64;

    w.section(state::KIND_ADD_MARKS)?;
    // Settled at the state's time: every seen id this state leaves out had
    // expired by then (`AddMark::settled`).
    for (key, m) in index.add_marks.settled_at(index.log_time_ms) {
        let view = AddMarkView {
            key,
            floor: m.floor,
            window_start_ms: m.window_start_ms,
            window_seq: m.window_seq,
        };
        w.entry(|b| state::encode_add_mark(b, &view))?;
    }
    end.totals[5] = index.add_marks.len();

    end.log_time_ms = index.log_time_ms;
    w.end(&end)?;
    Ok(w.file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::OsStorage;

    /// A writer of a new file at `path`, in the seen ids' section.
    fn writer(path: &Path) -> StateWriter<'_> {
        let file = OsStorage.open(path, OpenMode::CreateNew).unwrap();
        let mut w = StateWriter {
            file,
            path,
            segment_id: 0,
            offset: SEGMENT_HEADER_LEN as u64,
            kind: state::KIND_KEYS,
            count: 0,
            record: vec![0; ENTRIES_AT],
        };
        w.section(state::KIND_SEEN).unwrap();
        w
    }

    #[test]
    fn fixed_entries_end_records_where_entry_by_entry_would() {
        let dir = tempfile::tempdir().unwrap();
        let views = |n: u64| {
            (0..n).map(|i| SeenView {
                id: u128::from(i) << 64 | u128::from(i),
                payload: i,
                at_secs: i as u32,
            })
        };
        // Past two records' worth, in stretches of several lengths.
        let n = 2 * STATE_RECORD_BYTES_TARGET as u64 / SEEN_ENTRY_LEN as u64 + 1_234;
        let (one_path, bulk_path) = (dir.path().join("one"), dir.path().join("bulk"));
        let mut one = writer(&one_path);
        for view in views(n) {
            one.entry(|b| state::encode_seen(b, view)).unwrap();
        }
        one.end(&StateEnd::default()).unwrap();
        let mut bulk = writer(&bulk_path);
        let all: Vec<SeenView> = views(n).collect();
        for chunk in all.chunks(7_777) {
            let (first, rest) = chunk.split_at(1);
            for part in [first, rest] {
                bulk.fixed_entries(SEEN_ENTRY_LEN, part.iter(), |b, &view| {
                    state::encode_seen(b, view);
                })
                .unwrap();
            }
        }
        bulk.end(&StateEnd::default()).unwrap();
        let (one, bulk) = (
            std::fs::read(one_path).unwrap(),
            std::fs::read(bulk_path).unwrap(),
        );
        assert!(one.len() > 2 * STATE_RECORD_BYTES_TARGET);
        assert!(one == bulk, "the same records, byte for byte");
    }

    /// A record that would start below 4 GiB but end past it is refused
    /// before it is written, by the writer's own error.
    #[test]
    fn a_record_that_would_cross_4_gib_is_refused_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let mut w = writer(&path);
        w.entry(|b| {
            state::encode_seen(
                b,
                SeenView {
                    id: 1,
                    payload: 2,
                    at_secs: 3,
                },
            );
        })
        .unwrap();
        let written = std::fs::metadata(&path).unwrap().len();
        // The frame header, a one-byte count, the entry.
        let record_len = (w.record.len() - (COUNT_BYTES_MAX - 1)) as u64;
        w.offset = u64::from(u32::MAX) + 1 - record_len;
        let err = w.flush().unwrap_err();
        assert!(err.to_string().contains("state file over 4 GiB"), "{err}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), written);
        // One byte less and it fits.
        w.offset -= 1;
        w.flush().unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > written);
    }
}
