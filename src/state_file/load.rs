//! Loading a state file back into an index, record by record; a snapshot's
//! keys and seen-id filter on a thread of their own.

use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};

use bytes::Bytes;

use crate::batch::{BatchReport, QuarantineEntry};
use crate::format::codec;
use crate::format::segment::FileKind;
use crate::format::state::{self, KeyValue, StateEnd, StateRecord};
use crate::index::Index;
use crate::index::add_marks::AddMark;
use crate::index::expiry::COMMIT_MS_MAX;
use crate::index::keys::{KeyEntry, KeyIndex, KeyState};
use crate::index::seen::{BulkFilter, Seen};
use crate::log::reader::RecordRef;
use crate::log::segments::ValueRef;

/// Why a state record could not be loaded, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadError {
    /// Offset of the record's frame header in its file.
    pub record_offset: u32,
    /// Offset of the problem in the file.
    pub offset: u64,
    pub what: &'static str,
}

impl LoadError {
    fn new(record: &RecordRef<'_>, e: codec::DecodeError) -> Self {
        Self {
            record_offset: record.offset,
            offset: u64::from(record.body_at) + e.offset as u64,
            what: e.what,
        }
    }
}

/// Rebuilds an index from the state records of one file, in order.
///
/// Keys are the one part of a state file whose loading needs no other:
/// `with_key_thread` hands their records to a thread of their own, which
/// owns `index.keys` until the end record, so a snapshot's keys and its
/// seen ids load on two cores at once. Once the keys are in, that thread
/// also fills the seen ids' filter from the seen records, while this one
/// pushes the ids into the seen index.
#[derive(Debug)]
pub(crate) struct StateLoader<'s> {
    keys: KeyStage<'s>,
    /// Entries read, by section (the keys' count is taken from the key
    /// loader at the end record).
    totals: [u64; 6],
    /// The kind of the latest record: sections come in kind order.
    last_kind: u8,
    /// The file's length (0 when unknown), which bounds its seen ids.
    file_len: usize,
    /// The seen ids' filter the key thread built.
    seen_filter: Option<BulkFilter>,
    end: Option<StateEnd>,
}

#[derive(Debug)]
enum KeyStage<'s> {
    /// Key records are applied as they come, on the caller's thread.
    Here(KeyLoader),
    /// Key and seen records are sent to a thread which owns the keys; the
    /// sender is dropped after the seen section.
    Thread {
        records: Option<mpsc::Sender<Handed<'s>>>,
        loaded: ScopedJoinHandle<'s, LoadedKeys>,
    },
}

/// What the loading thread hands the key thread.
#[derive(Debug)]
enum Handed<'s> {
    /// A key record of segment `.1`.
    Keys(RecordRef<'s>, u32),
    /// A seen record, for the filter; `.1` bounds the number of seen ids
    /// in the file, which sizes the filter.
    SeenIds(RecordRef<'s>, usize),
}

/// What a key thread hands back.
#[derive(Debug)]
struct LoadedKeys {
    keys: KeyIndex,
    key_loader: KeyLoader,
    /// The seen ids' filter, if seen records were handed over.
    filter: Option<BulkFilter>,
    /// The first failure of a key record.
    result: Result<(), LoadError>,
}

/// Loads key records: refuses the wrong kind of value for the file and notes
/// how far value references reach.
#[derive(Debug)]
struct KeyLoader {
    values_inline: bool,
    count: u64,
    /// For each segment that value references point into, the furthest
    /// byte they reach: a snapshot is checked against the log with these.
    ref_extents: std::collections::BTreeMap<u32, u64>,
}

/// A problem with a record's entries as a whole, reported at the record's start.
fn record_problem(what: &'static str) -> codec::DecodeError {
    codec::DecodeError { offset: 0, what }
}

impl KeyLoader {
    fn new(kind: FileKind) -> Self {
        Self {
            values_inline: kind == FileKind::Base,
            count: 0,
            ref_extents: std::collections::BTreeMap::new(),
        }
    }

    fn apply(
        &mut self,
        keys: &mut KeyIndex,
        record: &RecordRef<'_>,
        segment: u32,
    ) -> Result<(), codec::DecodeError> {
        let fail = record_problem;
        debug_assert_eq!(record.kind, state::KIND_KEYS, "key records only");
        state::for_each_key(record.body, |k| {
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
                        .and_then(|at| record.body_at.checked_add(at))
                        .ok_or(fail("value offset out of range"))?;
                    let len = u32::try_from(value.len()).map_err(|_| fail("value too long"))?;
                    KeyState::Live(ValueRef {
                        segment,
                        offset,
                        len,
                        // The decoder checked it; bases load rarely enough
                        // that computing it again costs nothing worth a field.
                        crc: Some(crc32fast::hash(value)),
                        fingerprint: None,
                    })
                }
                KeyValue::Ref {
                    segment,
                    offset,
                    len,
                    crc,
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
                        crc,
                        fingerprint: None,
                    })
                }
                KeyValue::Tombstone { at_secs } => KeyState::Deleted { at_secs },
            };
            keys.bulk_push(k.key, KeyEntry { seq: k.seq, state })
                .map_err(fail)?;
            self.count += 1;
            Ok(())
        })
    }
}

/// The key thread's work: the key records handed to it into `keys`, then,
/// once the key table is built, the ids of the seen records into a filter.
fn load_on_key_thread(
    mut keys: KeyIndex,
    mut key_loader: KeyLoader,
    received: &mpsc::Receiver<Handed<'_>>,
) -> LoadedKeys {
    let mut filter = None;
    for handed in received {
        match handed {
            Handed::Keys(record, segment) => {
                if let Err(e) = key_loader.apply(&mut keys, &record, segment) {
                    let result = Err(LoadError::new(&record, e));
                    return LoadedKeys {
                        keys,
                        key_loader,
                        filter: None,
                        result,
                    };
                }
            }
            Handed::SeenIds(record, ids_at_most) => {
                let filter = filter.get_or_insert_with(|| {
                    // The key section is over.
                    keys.finish_bulk();
                    BulkFilter::new(ids_at_most)
                });
                // The loading thread checks these records and reports their
                // failures. Decoding them again here is cheaper than handing
                // over decoded entries: megabyte vectors of them freed on
                // this thread made the loading thread fault fresh pages for
                // every record (measured: 115 -> 161 ms for the reopen
                // bench's snapshot).
                let _ = state::for_each_seen(record.body, |s| {
                    filter.add(s.id);
                    Ok(())
                });
            }
        }
    }
    keys.finish_bulk();
    LoadedKeys {
        keys,
        key_loader,
        filter,
        result: Ok(()),
    }
}

impl<'s> StateLoader<'s> {
    /// A loader for a base segment or a snapshot, which loads keys on the
    /// caller's thread.
    pub(crate) fn new(kind: FileKind) -> Self {
        assert!(kind != FileKind::Log, "log segments hold no state records");
        Self {
            keys: KeyStage::Here(KeyLoader::new(kind)),
            totals: [0; 6],
            last_kind: 0,
            file_len: 0,
            seen_filter: None,
            end: None,
        }
    }

    /// A loader that loads keys on a thread of `scope`, taking `index.keys`
    /// until the end record gives them back, from a file of `file_len`
    /// bytes. If no thread can be started the keys load on the caller's
    /// thread.
    pub(crate) fn with_key_thread<'env>(
        kind: FileKind,
        scope: &'s Scope<'s, 'env>,
        index: &mut Index,
        file_len: usize,
    ) -> Self {
        let mut loader = Self::new(kind);
        loader.file_len = file_len;
        let key_loader = KeyLoader::new(kind);
        let (records, received) = mpsc::channel::<Handed<'s>>();
        let (give_keys, take_keys) = mpsc::channel::<KeyIndex>();
        let spawned = std::thread::Builder::new()
            .name("idemkv-load-keys".into())
            .spawn_scoped(scope, move || {
                let keys = take_keys.recv().unwrap_or_default();
                load_on_key_thread(keys, key_loader, &received)
            });
        // Without a thread the keys stay where they are and load here.
        if let Ok(loaded) = spawned {
            // The thread waits for the keys before anything else, so this
            // send cannot fail.
            let _ = give_keys.send(std::mem::take(&mut index.keys));
            loader.keys = KeyStage::Thread {
                records: Some(records),
                loaded,
            };
        }
        loader
    }

    /// Applies one state record of segment `segment`. A failure of the key
    /// thread is reported at the end record, or in place of a later
    /// record's failure: the key records it failed on came first.
    pub(crate) fn apply(
        &mut self,
        index: &mut Index,
        record: &RecordRef<'s>,
        segment: u32,
    ) -> Result<(), LoadError> {
        let result = self.apply_here(index, record, segment);
        if result.is_err() {
            self.join_keys(index)?;
        }
        result
    }

    fn apply_here(
        &mut self,
        index: &mut Index,
        record: &RecordRef<'s>,
        segment: u32,
    ) -> Result<(), LoadError> {
        let fail = |what| LoadError {
            record_offset: record.offset,
            offset: u64::from(record.body_at),
            what,
        };
        if self.end.is_some() {
            return Err(fail("state record after the end record"));
        }
        if record.kind < self.last_kind {
            return Err(fail("state record out of section order"));
        }
        self.last_kind = record.kind;
        match &mut self.keys {
            KeyStage::Here(key_loader) if record.kind == state::KIND_KEYS => {
                return key_loader
                    .apply(&mut index.keys, record, segment)
                    .map_err(|e| LoadError::new(record, e));
            }
            // A send fails only once the thread has stopped on a failure,
            // which the end record reports.
            KeyStage::Thread {
                records: Some(records),
                ..
            } if record.kind == state::KIND_KEYS => {
                let _ = records.send(Handed::Keys(*record, segment));
                return Ok(());
            }
            KeyStage::Thread {
                records: Some(records),
                ..
            } if record.kind == state::KIND_SEEN => {
                // Entries take `SEEN_ENTRY_LEN` bytes, so the rest of the
                // file holds at most this many.
                let rest = self.file_len.saturating_sub(record.offset as usize);
                let ids_at_most = rest / state::SEEN_ENTRY_LEN;
                let _ = records.send(Handed::SeenIds(*record, ids_at_most));
            }
            KeyStage::Thread { records, .. } => *records = None,
            KeyStage::Here(_) => {}
        }
        if record.kind == state::KIND_SEEN {
            let seen_ids = &mut self.totals[1];
            return state::for_each_seen(record.body, |s| {
                let seen = Seen {
                    payload: s.payload,
                    at_secs: s.at_secs,
                };
                index.seen.bulk_push(s.id, seen).map_err(record_problem)?;
                *seen_ids += 1;
                Ok(())
            })
            .map_err(|e| LoadError::new(record, e));
        }
        let decoded = state::decode_state(record.kind, record.body);
        match decoded.map_err(|e| LoadError::new(record, e))? {
            StateRecord::Keys(_) | StateRecord::Seen(_) => {
                unreachable!("key and seen records are handled above")
            }
            StateRecord::Batches(batches) => {
                for b in batches {
                    // A writer holds each only once: a file with one twice
                    // is damaged or crafted, not a state to guess from.
                    if index.batches.get(b.batch_id).is_some() {
                        return Err(fail("batch id loaded twice"));
                    }
                    index.batches.insert(
                        b.batch_id,
                        b.content_hash,
                        &BatchReport::from_counts(b.counts),
                        b.committed_ms,
                    );
                    self.totals[2] += 1;
                }
            }
            StateRecord::Checkpoints(checkpoints) => {
                for (source, position) in checkpoints {
                    let earlier = index.checkpoints.insert(
                        Bytes::copy_from_slice(source),
                        Bytes::copy_from_slice(position),
                    );
                    if earlier.is_some() {
                        return Err(fail("checkpoint source loaded twice"));
                    }
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
                    if index.add_marks.contains(m.key) {
                        return Err(fail("add mark loaded twice"));
                    }
                    index.add_marks.restore(m.key, mark);
                    self.totals[5] += 1;
                }
            }
            StateRecord::End(end) => {
                self.join_keys(index)?;
                index.keys.finish_bulk();
                index
                    .seen
                    .finish_bulk(self.seen_filter.take())
                    .map_err(fail)?;
                if let KeyStage::Here(key_loader) = &self.keys {
                    self.totals[0] = key_loader.count;
                }
                if end.totals != self.totals {
                    return Err(fail("state totals do not match the records read"));
                }
                if end.log_time_ms > COMMIT_MS_MAX {
                    return Err(fail("log time past the latest the log records"));
                }
                index.log_time_ms = end.log_time_ms;
                self.end = Some(end);
            }
        }
        Ok(())
    }

    /// Takes the keys back from the key thread, if there is one, with the
    /// first failure it met (which came before any record applied since).
    pub(crate) fn join_keys(&mut self, index: &mut Index) -> Result<(), LoadError> {
        let KeyStage::Thread { .. } = self.keys else {
            return Ok(());
        };
        let placeholder = KeyStage::Here(KeyLoader::new(FileKind::Snapshot));
        let KeyStage::Thread { records, loaded } = std::mem::replace(&mut self.keys, placeholder)
        else {
            unreachable!("matched above");
        };
        // The thread ends once every record sent has been applied.
        drop(records);
        let loaded = match loaded.join() {
            Ok(loaded) => loaded,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        index.keys = loaded.keys;
        self.keys = KeyStage::Here(loaded.key_loader);
        self.seen_filter = loaded.filter;
        loaded.result
    }

    /// The end record, once read: the state is complete.
    pub(crate) fn end(&self) -> Option<StateEnd> {
        self.end
    }

    /// Segments that value references point into, each with the furthest
    /// byte they reach; known once the end record is read.
    pub(crate) fn ref_extents(&self) -> Option<&std::collections::BTreeMap<u32, u64>> {
        match &self.keys {
            KeyStage::Here(key_loader) if self.end.is_some() => Some(&key_loader.ref_extents),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::segment::{
        FRAME_HEADER_LEN, SEGMENT_HEADER_LEN, encode_frame, encode_segment_header,
    };
    use crate::format::state::SeenView;

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
            crc: None,
        });
        let load = |kind, body: &[u8]| {
            let record = RecordRef {
                kind: state::KIND_KEYS,
                offset: 80,
                synced_to: 0,
                body_at: 100,
                body,
            };
            StateLoader::new(kind).apply(&mut Index::default(), &record, 1)
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

    /// A snapshot file of `records` (kind, body), framed in order.
    fn snapshot_of(records: &[(u8, Vec<u8>)]) -> Vec<u8> {
        let mut file = encode_segment_header(0, FileKind::Snapshot).to_vec();
        for (kind, body) in records {
            let mut frame = [0u8; FRAME_HEADER_LEN];
            let offset = u32::try_from(file.len()).expect("small file");
            encode_frame(&mut frame, *kind, body, 0, offset, 0);
            file.extend_from_slice(&frame);
            file.extend_from_slice(body);
        }
        file
    }

    fn key_record(keys: impl Iterator<Item = u32>) -> (u8, Vec<u8>) {
        let keys: Vec<u32> = keys.collect();
        let mut body = Vec::new();
        state::encode_count(&mut body, keys.len());
        for k in keys {
            let value = KeyValue::Ref {
                segment: 1 + k % 3,
                offset: 40 + k,
                len: 10,
                crc: (k % 2 == 0).then_some(k),
            };
            state::encode_key(
                &mut body,
                format!("k{k:08}").as_bytes(),
                u64::from(k),
                value,
            );
        }
        (state::KIND_KEYS, body)
    }

    fn seen_record(ids: impl Iterator<Item = u128>) -> (u8, Vec<u8>) {
        let ids: Vec<u128> = ids.collect();
        let mut body = Vec::new();
        state::encode_count(&mut body, ids.len());
        for id in ids {
            let view = SeenView {
                id,
                payload: id as u64 ^ 7,
                at_secs: 9,
            };
            state::encode_seen(&mut body, view);
        }
        (state::KIND_SEEN, body)
    }

    fn end_record(keys: u64, seen: u64) -> (u8, Vec<u8>) {
        let mut body = Vec::new();
        let end = StateEnd {
            log_time_ms: 5,
            covered_segment: 3,
            covered_offset: 64,
            first_segment: 1,
            totals: [keys, seen, 0, 0, 0, 0],
        };
        state::encode_end(&mut body, &end);
        (state::KIND_END, body)
    }

    /// Loads a snapshot file, keys on a thread of their own or not; returns
    /// the index and the value references' extents.
    fn load(file: &[u8], key_thread: bool) -> Result<(Index, Vec<(u32, u64)>), LoadError> {
        let mut index = Index::default();
        let extents = std::thread::scope(|scope| {
            let mut loader = if key_thread {
                StateLoader::with_key_thread(FileKind::Snapshot, scope, &mut index, file.len())
            } else {
                StateLoader::new(FileKind::Snapshot)
            };
            for record in crate::log::reader::SegmentReader::new(file, 0) {
                loader.apply(&mut index, &record.expect("frames are whole"), 0)?;
            }
            assert!(loader.end().is_some(), "the file ends with an end record");
            let extents = loader.ref_extents().expect("known at the end");
            Ok(extents.iter().map(|(&s, &e)| (s, e)).collect())
        })?;
        Ok((index, extents))
    }

    #[test]
    fn keys_load_the_same_on_a_thread_of_their_own() {
        let ids = |range: std::ops::Range<u128>| range.map(|i| i * 0x9e37_79b9_7f4a_7c15_0001);
        let file = snapshot_of(&[
            key_record(0..500),
            key_record(500..1200),
            seen_record(ids(1..800)),
            seen_record(ids(800..2000)),
            end_record(1200, 1999),
        ]);
        let (here, here_extents) = load(&file, false).expect("loads");
        let (threaded, threaded_extents) = load(&file, true).expect("loads");
        let keys = |index: &Index| {
            index
                .keys
                .range_prefix(b"")
                .map(|(k, e)| (k.to_vec(), e))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&here).len(), 1200);
        assert_eq!(keys(&here), keys(&threaded));
        assert_eq!(
            here_extents,
            vec![
                (1, 40 + 1197 + 10),
                (2, 40 + 1198 + 10),
                (3, 40 + 1199 + 10)
            ]
        );
        assert_eq!(here_extents, threaded_extents);
        assert_eq!(threaded.keys.get(b"k00000700"), here.keys.get(b"k00000700"));
        let crc_of = |key: &[u8]| {
            threaded
                .keys
                .get(key)
                .and_then(|e| e.value())
                .map(|v| v.crc)
        };
        assert_eq!(
            crc_of(b"k00000700"),
            Some(Some(700)),
            "the key table is built, CRCs kept"
        );
        assert_eq!(crc_of(b"k00000701"), Some(None));
        assert_eq!(
            here.seen.iter().collect::<Vec<_>>(),
            threaded.seen.iter().collect::<Vec<_>>()
        );
        assert_eq!(threaded.seen.len(), 1999);
        // Lookups ask the filter the key thread built first.
        assert!(ids(1..2000).all(|id| threaded.seen.get(id).is_some()));
        assert!(ids(2000..2100).all(|id| threaded.seen.get(id).is_none()));
        assert_eq!(threaded.log_time_ms, 5);
    }

    #[test]
    fn a_failed_key_record_is_reported_before_any_later_failure_on_either_path() {
        let unsorted_keys = key_record([1, 3, 2].into_iter());
        let second_record_at =
            u32::try_from(SEGMENT_HEADER_LEN + FRAME_HEADER_LEN + key_record(0..1).1.len())
                .expect("small");
        // Then good seen ids, or seen ids that fail too: that later failure
        // does not hide the first.
        for seen in [seen_record(1..3), seen_record([5, 4].into_iter())] {
            let file = snapshot_of(&[
                key_record(0..1),
                unsorted_keys.clone(),
                seen,
                end_record(4, 2),
            ]);
            for key_thread in [false, true] {
                let e = load(&file, key_thread).expect_err("unsorted keys");
                assert_eq!(
                    (e.what, e.record_offset),
                    ("keys are not sorted and unique", second_record_at),
                    "key thread: {key_thread}"
                );
            }
        }
        // Nor is a failure of the key thread lost when the rest loads.
        let file = snapshot_of(&[
            key_record([2, 1].into_iter()),
            seen_record(1..3),
            end_record(2, 2),
        ]);
        let e = load(&file, true).expect_err("unsorted keys");
        assert_eq!(e.what, "keys are not sorted and unique");
    }

    /// A state file holds each batch id, checkpoint source and counter key
    /// once; one held twice (its checksums intact) is refused rather than
    /// loaded with the later entry winning.
    #[test]
    fn a_batch_id_checkpoint_or_add_mark_held_twice_is_refused() {
        let twice = |kind: u8, encode: &dyn Fn(&mut Vec<u8>)| {
            let mut body = Vec::new();
            state::encode_count(&mut body, 2);
            encode(&mut body);
            encode(&mut body);
            (kind, body)
        };
        let batch = |b: &mut Vec<u8>| {
            let view = state::BatchView {
                batch_id: b"B1",
                content_hash: 7,
                committed_ms: 5,
                counts: [1, 0, 0, 0, 0, 0, 0, 0],
            };
            state::encode_batch(b, &view);
        };
        let checkpoint = |b: &mut Vec<u8>| state::encode_checkpoint(b, b"src", b"10");
        let mark = |b: &mut Vec<u8>| {
            let view = state::AddMarkView {
                key: b"c",
                floor: None,
                window_start_ms: 5,
                window_seq: 3,
            };
            state::encode_add_mark(b, &view);
        };
        type Encode<'f> = &'f dyn Fn(&mut Vec<u8>);
        let cases: [(u8, Encode<'_>, usize, &str); 3] = [
            (state::KIND_BATCHES, &batch, 2, "batch id loaded twice"),
            (
                state::KIND_CHECKPOINTS,
                &checkpoint,
                3,
                "checkpoint source loaded twice",
            ),
            (state::KIND_ADD_MARKS, &mark, 5, "add mark loaded twice"),
        ];
        for (kind, encode, total, what) in cases {
            // The totals count both entries: only the repeat is wrong.
            let mut totals = [0u64; 6];
            totals[total] = 2;
            let mut end = Vec::new();
            let state_end = StateEnd {
                log_time_ms: 5,
                covered_segment: 3,
                covered_offset: 64,
                first_segment: 1,
                totals,
            };
            state::encode_end(&mut end, &state_end);
            let file = snapshot_of(&[twice(kind, encode), (state::KIND_END, end)]);
            for key_thread in [false, true] {
                let e = load(&file, key_thread).expect_err(what);
                assert_eq!(e.what, what, "key thread: {key_thread}");
            }
        }
    }

    #[test]
    fn records_out_of_section_order_are_refused_on_either_path() {
        let file = snapshot_of(&[
            key_record(0..2),
            seen_record(1..3),
            key_record(2..4),
            end_record(4, 2),
        ]);
        for key_thread in [false, true] {
            let e = load(&file, key_thread).expect_err("keys after seen ids");
            assert_eq!(
                e.what, "state record out of section order",
                "key thread: {key_thread}"
            );
        }
        let file = snapshot_of(&[
            key_record(0..2),
            key_record(2..4),
            seen_record(1..3),
            end_record(4, 2),
        ]);
        for key_thread in [false, true] {
            assert!(
                load(&file, key_thread).is_ok(),
                "a section may span records"
            );
        }
    }

    /// Seen ids are looked up by binary search in the run they load into,
    /// so ids out of order or repeated, within a record or across two, are
    /// refused rather than loaded where no lookup finds them.
    #[test]
    fn seen_ids_out_of_order_or_repeated_are_refused_on_either_path() {
        let cases = [
            vec![seen_record([1, 3, 2].into_iter())],
            vec![seen_record([1, 2, 2].into_iter())],
            vec![seen_record(1..3), seen_record(2..4)],
        ];
        for seen in cases {
            let mut records = vec![key_record(0..1)];
            records.extend(seen);
            records.push(end_record(1, 3));
            let file = snapshot_of(&records);
            for key_thread in [false, true] {
                let e = load(&file, key_thread).expect_err("unsorted seen ids");
                assert_eq!(
                    e.what, "seen ids are not sorted and unique",
                    "key thread: {key_thread}"
                );
            }
        }
    }

    /// A `KEYS` record of `body` whose frame lies at offset 80 of its file.
    fn keys_record_at_80(body: &[u8]) -> RecordRef<'_> {
        RecordRef {
            kind: state::KIND_KEYS,
            offset: 80,
            synced_to: 0,
            body_at: 108,
            body,
        }
    }

    /// A base's value is found where it lies inside the record, and the
    /// index knows its CRC, as after a write (DESIGN.md, "Values").
    #[test]
    fn a_base_value_loads_as_its_place_in_the_record_and_its_checksum() {
        let body = keys_record(KeyValue::Inline {
            value: b"value",
            value_at: 0,
        });
        let record = keys_record_at_80(&body);
        let mut index = Index::default();
        StateLoader::new(FileKind::Base)
            .apply(&mut index, &record, 7)
            .expect("loads");
        index.keys.finish_bulk();
        let v = index.keys.get(b"k").and_then(|e| e.value()).expect("live");
        assert_eq!((v.segment, v.len), (7, 5));
        let at = (v.offset - record.body_at) as usize;
        assert_eq!(&body[at..at + 5], b"value");
        assert_eq!(v.crc, Some(crc32fast::hash(b"value")));
    }

    /// A reference's value is read with the CRC in the 4 bytes before it,
    /// so one that leaves no room for them is refused, never read.
    #[test]
    fn a_value_reference_with_no_room_for_its_checksum_before_it_is_refused() {
        let load = |offset| {
            let body = keys_record(KeyValue::Ref {
                segment: 1,
                offset,
                len: 1,
                crc: None,
            });
            let record = keys_record_at_80(&body);
            StateLoader::new(FileKind::Snapshot).apply(&mut Index::default(), &record, 0)
        };
        assert!(load(4).is_ok());
        for offset in [0, 3] {
            assert_eq!(
                load(offset).map_err(|e| e.what),
                Err("value reference before its checksum"),
                "offset {offset}"
            );
        }
    }

    /// The extent of a segment is the furthest byte any reference into it
    /// reaches, not the last one loaded: keys come in key order, their
    /// values in whatever order they were written.
    #[test]
    fn a_segments_extent_is_its_furthest_reference_in_any_key_order() {
        let mut body = Vec::new();
        state::encode_count(&mut body, 3);
        for (key, offset) in [(b"a", 500), (b"b", 900), (b"c", 100)] {
            let value = KeyValue::Ref {
                segment: 2,
                offset,
                len: 10,
                crc: None,
            };
            state::encode_key(&mut body, key, 1, value);
        }
        let file = snapshot_of(&[(state::KIND_KEYS, body), end_record(3, 0)]);
        for key_thread in [false, true] {
            let (_, extents) = load(&file, key_thread).expect("loads");
            assert_eq!(extents, vec![(2, 910)], "key thread: {key_thread}");
        }
    }

    /// `END`'s totals prove that no record is missing: a file whose records
    /// hold more or fewer entries than they say is refused.
    #[test]
    fn totals_that_differ_from_the_entries_read_are_refused_on_either_path() {
        for (keys, seen) in [(3, 2), (2, 2), (4, 2), (3, 1), (3, 3)] {
            let file = snapshot_of(&[key_record(0..3), seen_record(1..3), end_record(keys, seen)]);
            for key_thread in [false, true] {
                let loaded = load(&file, key_thread).map(|_| ()).map_err(|e| e.what);
                if (keys, seen) == (3, 2) {
                    assert_eq!(loaded, Ok(()));
                } else {
                    assert_eq!(
                        loaded,
                        Err("state totals do not match the records read"),
                        "totals ({keys}, {seen}), key thread: {key_thread}"
                    );
                }
            }
        }
    }

    /// `END` is the last record: anything after it (here a second `END`,
    /// which section order alone would let through) is refused.
    #[test]
    fn a_record_after_the_end_record_is_refused() {
        let file = snapshot_of(&[key_record(0..2), end_record(2, 0), end_record(2, 0)]);
        for key_thread in [false, true] {
            let e = load(&file, key_thread).expect_err("two end records");
            assert_eq!(e.what, "state record after the end record");
        }
    }

    /// The log's clock, like every commit time, stays below 2^32 seconds
    /// (DESIGN.md, "Limits"): a state file past it is refused.
    #[test]
    fn a_log_time_past_the_latest_commit_time_is_refused() {
        let file_at = |log_time_ms| {
            let mut end = Vec::new();
            let state_end = StateEnd {
                log_time_ms,
                covered_segment: 3,
                covered_offset: 64,
                first_segment: 1,
                totals: [0; 6],
            };
            state::encode_end(&mut end, &state_end);
            snapshot_of(&[(state::KIND_END, end)])
        };
        let (index, _) = load(&file_at(COMMIT_MS_MAX), false).expect("the latest time");
        assert_eq!(index.log_time_ms, COMMIT_MS_MAX);
        for log_time_ms in [COMMIT_MS_MAX + 1, u64::MAX] {
            let e = load(&file_at(log_time_ms), false).expect_err("past the limit");
            assert_eq!(e.what, "log time past the latest the log records");
        }
    }

    /// A record that fails to decode is reported at its offending byte in
    /// the file (here the first byte after its last entry), with the offset
    /// of the record that holds it.
    #[test]
    fn a_record_that_fails_to_decode_is_reported_at_its_byte_in_the_file() {
        let (kind, mut body) = key_record(0..2);
        body.push(0);
        let stray_at = SEGMENT_HEADER_LEN + FRAME_HEADER_LEN + body.len() - 1;
        let file = snapshot_of(&[(kind, body), end_record(2, 0)]);
        for key_thread in [false, true] {
            let e = load(&file, key_thread).expect_err("a stray byte");
            assert_eq!(
                (e.record_offset, e.offset),
                (SEGMENT_HEADER_LEN as u32, stray_at as u64),
                "key thread: {key_thread}"
            );
        }
    }
}
