//! The whole index written out as state records, and read back
//! (DESIGN.md, "Base segments and snapshots").
//!
//! Compaction writes a *base segment*: state records with every live value
//! inline, which replaces all older segments. A *snapshot* holds the same
//! records with references to values in the segments, and lets `open` skip
//! replaying the log it covers. Both are written to a temporary file and
//! synced before the caller renames them into place.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use crate::batch::{BatchReport, QuarantineEntry};
use crate::error::{Error, Result};
use crate::format::codec;
use crate::format::segment::{
    FRAME_HEADER_LEN, FileKind, SEGMENT_HEADER_LEN, encode_frame, encode_segment_header,
};
use crate::format::state::{
    self, AddMarkView, BatchView, KeyValue, QuarantinedView, STATE_RECORD_BYTES_TARGET, SeenView,
    StateEnd, StateRecord,
};
use crate::index::Index;
use crate::index::add_marks::AddMark;
use crate::index::batches::BatchEntry;
use crate::index::keys::{KeyEntry, KeyState};
use crate::index::seen::Seen;
use crate::log::segments::ValueRef;
use crate::storage::{OpenMode, Storage, StorageFile};

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

/// Rebuilds an index from the state records of one file, in order.
#[derive(Debug)]
pub(crate) struct StateLoader {
    /// Whose records these are: a base segment holds values inline, a
    /// snapshot refers to them; anything else is refused.
    values_inline: bool,
    totals: [u64; 6],
    end: Option<StateEnd>,
    /// For each segment that value references point into, the furthest
    /// byte they reach: a snapshot is checked against the log with these.
    ref_extents: std::collections::BTreeMap<u32, u64>,
}

impl StateLoader {
    /// A loader for a base segment or a snapshot.
    pub(crate) fn new(kind: FileKind) -> Self {
        assert!(kind != FileKind::Log, "log segments hold no state records");
        Self {
            values_inline: kind == FileKind::Base,
            totals: [0; 6],
            end: None,
            ref_extents: std::collections::BTreeMap::new(),
        }
    }

    /// Applies one state record found at `body_at` in segment `segment`.
    pub(crate) fn apply(
        &mut self,
        index: &mut Index,
        kind: u8,
        body: &[u8],
        segment: u32,
        body_at: u32,
    ) -> Result<(), codec::DecodeError> {
        let fail = |what| codec::DecodeError { offset: 0, what };
        if self.end.is_some() {
            return Err(fail("state record after the end record"));
        }
        match state::decode_state(kind, body)? {
            StateRecord::Keys(keys) => {
                for k in keys {
                    let state = match k.value {
                        KeyValue::Inline { .. } if !self.values_inline => {
                            return Err(fail("a value inline in a snapshot"));
                        }
                        KeyValue::Ref { .. } if self.values_inline => {
                            return Err(fail("a value reference in a base segment"));
                        }
                        KeyValue::Inline { value, value_at } => {
                            let offset = u32::try_from(value_at)
                                .ok()
                                .and_then(|at| body_at.checked_add(at))
                                .ok_or(fail("value offset out of range"))?;
                            let len =
                                u32::try_from(value.len()).map_err(|_| fail("value too long"))?;
                            KeyState::Live(ValueRef {
                                segment,
                                offset,
                                len,
                            })
                        }
                        KeyValue::Ref {
                            segment,
                            offset,
                            len,
                        } => {
                            if offset < 4 {
                                return Err(fail("value reference before its checksum"));
                            }
                            let end = u64::from(offset) + u64::from(len);
                            let extent = self.ref_extents.entry(segment).or_default();
                            *extent = (*extent).max(end);
                            KeyState::Live(ValueRef {
                                segment,
                                offset,
                                len,
                            })
                        }
                        KeyValue::Tombstone { at_secs } => KeyState::Deleted { at_secs },
                    };
                    index
                        .keys
                        .bulk_push(k.key, KeyEntry { seq: k.seq, state })
                        .map_err(fail)?;
                    self.totals[0] += 1;
                }
            }
            StateRecord::Seen(seen) => {
                for s in seen {
                    index.seen.bulk_push(
                        s.id,
                        Seen {
                            payload: s.payload,
                            at_secs: s.at_secs,
                        },
                    );
                    self.totals[1] += 1;
                }
            }
            StateRecord::Batches(batches) => {
                for b in batches {
                    index.batches.insert(BatchEntry {
                        batch_id: Bytes::copy_from_slice(b.batch_id),
                        content_hash: b.content_hash,
                        report: BatchReport::from_counts(b.counts),
                        committed_ms: b.committed_ms,
                    });
                    self.totals[2] += 1;
                }
            }
            StateRecord::Checkpoints(checkpoints) => {
                for (source, position) in checkpoints {
                    index.checkpoints.insert(
                        Bytes::copy_from_slice(source),
                        Bytes::copy_from_slice(position),
                    );
                    self.totals[3] += 1;
                }
            }
            StateRecord::Quarantine(entries) => {
                for q in entries {
                    index.quarantine.push(QuarantineEntry {
                        batch_id: Bytes::copy_from_slice(q.batch_id),
                        index: q.index,
                        event_id: Bytes::copy_from_slice(q.event_id),
                        reason: String::from_utf8_lossy(q.reason).into_owned(),
                    });
                    self.totals[4] += 1;
                }
            }
            StateRecord::AddMarks(marks) => {
                for m in marks {
                    let mark = AddMark {
                        floor: m.floor,
                        window_start_ms: m.window_start_ms,
                        window_seq: m.window_seq,
                    };
                    index.add_marks.restore(m.key, mark);
                    self.totals[5] += 1;
                }
            }
            StateRecord::End(end) => {
                if end.totals != self.totals {
                    return Err(fail("state totals do not match the records read"));
                }
                index.keys.finish_bulk();
                index.seen.finish_bulk().map_err(fail)?;
                index.log_time_ms = end.log_time_ms;
                self.end = Some(end);
            }
        }
        Ok(())
    }

    /// The end record, once read: the state is complete.
    pub(crate) fn end(&self) -> Option<StateEnd> {
        self.end
    }

    /// Segments that value references point into, each with the furthest
    /// byte they reach.
    pub(crate) fn ref_extents(&self) -> &std::collections::BTreeMap<u32, u64> {
        &self.ref_extents
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_record(value: KeyValue<'_>) -> Vec<u8> {
        let mut body = Vec::new();
        state::encode_count(&mut body, 1);
        state::encode_key(&mut body, b"k", 1, value);
        body
    }

    #[test]
    fn each_file_kind_takes_only_its_own_kind_of_value() {
        let inline = keys_record(KeyValue::Inline {
            value: b"v",
            value_at: 0,
        });
        let reference = keys_record(KeyValue::Ref {
            segment: 1,
            offset: 40,
            len: 1,
        });
        let load = |kind, body: &[u8]| {
            StateLoader::new(kind).apply(&mut Index::default(), state::KIND_KEYS, body, 1, 100)
        };
        assert!(load(FileKind::Base, &inline).is_ok());
        assert!(load(FileKind::Snapshot, &reference).is_ok());
        assert!(
            load(FileKind::Snapshot, &inline).is_err(),
            "a snapshot refers to values"
        );
        assert!(
            load(FileKind::Base, &reference).is_err(),
            "a base holds its values"
        );
    }
}
