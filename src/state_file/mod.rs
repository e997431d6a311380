//! The whole index written out as state records, and read back
//! (DESIGN.md, "Base segments and snapshots").
//!
//! Compaction writes a *base segment*: state records with every live value
//! inline, which replaces all older segments. A *snapshot* holds the same
//! records with references to values in the segments, and lets `open` skip
//! replaying the log it covers. Both are written to a temporary file and
//! synced before the caller renames them into place.

mod load;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::segment::{
    FRAME_HEADER_LEN, FileKind, SEGMENT_HEADER_LEN, encode_frame, encode_segment_header,
};
use crate::format::state::{
    self, AddMarkView, BatchView, KeyValue, QuarantinedView, STATE_RECORD_BYTES_TARGET, SeenView,
    StateEnd,
};
use crate::index::Index;
use crate::index::keys::KeyState;
use crate::log::segments::ValueRef;
use crate::storage::{OpenMode, Storage, StorageFile};

pub(crate) use load::{LoadError, StateLoader};

/// How the keys' values are written.
pub(crate) enum Values<'a> {
    /// Copied into the file (a base segment); read through this function.
    Inline(&'a dyn Fn(ValueRef) -> Result<Bytes>),
    /// Referred to where they are (a snapshot).
    Refs,
}

/// Appends framed state records to a new file.
struct StateWriter<'a> {
    file: Arc<dyn StorageFile>,
    path: &'a Path,
    segment_id: u32,
    offset: u64,
    kind: u8,
    count: usize,
    entries: Vec<u8>,
    record: Vec<u8>,
}

impl StateWriter<'_> {
    fn section(&mut self, kind: u8) -> Result<()> {
        self.flush()?;
        self.kind = kind;
        Ok(())
    }

    fn entry(&mut self, encode: impl FnOnce(&mut Vec<u8>)) -> Result<()> {
        encode(&mut self.entries);
        self.count += 1;
        if self.entries.len() >= STATE_RECORD_BYTES_TARGET {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        if self.count == 0 {
            return Ok(());
        }
        self.record.clear();
        self.record.resize(FRAME_HEADER_LEN, 0);
        state::encode_count(&mut self.record, self.count);
        self.record.extend_from_slice(&self.entries);
        self.append()?;
        self.entries.clear();
        self.count = 0;
        Ok(())
    }

    fn append(&mut self) -> Result<()> {
        let offset = u32::try_from(self.offset).map_err(|_| {
            Error::io(
                "write",
                self.path,
                std::io::Error::other("state file over 4 GiB"),
            )
        })?;
        let (header, body) = self.record.split_at_mut(FRAME_HEADER_LEN);
        // A state file is synced whole before it is used: no record relies on `synced_to`.
        encode_frame(header, self.kind, body, self.segment_id, offset, 0);
        self.file
            .append(&self.record)
            .map_err(|e| Error::io("append", self.path, e))?;
        self.offset += self.record.len() as u64;
        Ok(())
    }

    fn end(&mut self, end: &StateEnd) -> Result<()> {
        self.flush()?;
        self.kind = state::KIND_END;
        self.record.clear();
        self.record.resize(FRAME_HEADER_LEN, 0);
        state::encode_end(&mut self.record, end);
        self.append()
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
        entries: Vec::new(),
        record: Vec::new(),
    };

    w.section(state::KIND_KEYS)?;
    for (key, entry) in index.keys.range_prefix(b"") {
        let value = match (entry.state, values) {
            (KeyState::Live(v), Values::Inline(read)) => Some((v, read(v)?)),
            (KeyState::Live(v), Values::Refs) => {
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
    for (id, seen) in index.seen.iter() {
        w.entry(|b| {
            state::encode_seen(
                b,
                SeenView {
                    id,
                    payload: seen.payload,
                    at_secs: seen.at_secs,
                },
            )
        })?;
    }
    end.totals[1] = index.seen.len();

    w.section(state::KIND_BATCHES)?;
    for e in index.batches.in_order() {
        let view = BatchView {
            batch_id: &e.batch_id,
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
    for (key, m) in index.add_marks.iter() {
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
