//! State records: the index written out whole (DESIGN.md, FORMAT, "State
//! records"). A base segment (written by compaction) holds them with values
//! inline; a snapshot holds them with references to values in segments.
//!
//! Each record holds one section's entries; a section may span several
//! records. The last record of a file is `END`, whose totals prove that no
//! record is missing.

use super::codec::{self, DecodeError, Decoder};
use super::{ID_BYTES_MAX, POSITION_BYTES_MAX, RECORD_BODY_BYTES_MAX};

/// Record kind tags (batch records are kind 1). Never reuse a retired value.
pub(crate) const KIND_KEYS: u8 = 2;
pub(crate) const KIND_SEEN: u8 = 3;
pub(crate) const KIND_BATCHES: u8 = 4;
pub(crate) const KIND_CHECKPOINTS: u8 = 5;
pub(crate) const KIND_QUARANTINE: u8 = 6;
pub(crate) const KIND_ADD_MARKS: u8 = 7;
pub(crate) const KIND_END: u8 = 8;

/// Key entry tags. Never reuse a retired value.
const KEY_INLINE: u8 = 0;
const KEY_REF: u8 = 1;
const KEY_REF_CRC: u8 = 3;
const KEY_TOMBSTONE: u8 = 2;

pub(crate) const SEEN_ENTRY_LEN: usize = 16 + 8 + 4;

/// A record body is flushed once its entries pass this size.
pub(crate) const STATE_RECORD_BYTES_TARGET: usize = 1 << 20;

/// What a key entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyValue<'a> {
    /// The value itself; `value_at` is its offset inside the record body.
    Inline {
        value: &'a [u8],
        value_at: usize,
    },
    /// Where the value lives in a segment (its CRC32 sits just before it),
    /// with that CRC when the index knew it.
    Ref {
        segment: u32,
        offset: u32,
        len: u32,
        crc: Option<u32>,
    },
    Tombstone {
        at_secs: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyEntryView<'a> {
    pub key: &'a [u8],
    pub seq: u64,
    pub value: KeyValue<'a>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SeenView {
    pub id: u128,
    pub payload: u64,
    pub at_secs: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchView<'a> {
    pub batch_id: &'a [u8],
    pub content_hash: u128,
    pub committed_ms: u64,
    pub counts: [u64; 8],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuarantinedView<'a> {
    pub batch_id: &'a [u8],
    pub index: u64,
    pub event_id: &'a [u8],
    pub reason: &'a [u8],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AddMarkView<'a> {
    pub key: &'a [u8],
    pub floor: Option<u64>,
    pub window_start_ms: u64,
    pub window_seq: u64,
}

/// Totals and position that close a state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct StateEnd {
    /// The log's clock when the state was taken.
    pub log_time_ms: u64,
    /// The state covers the log up to here: segment id and offset.
    pub covered_segment: u32,
    pub covered_offset: u64,
    /// The first segment of the log the state belongs to.
    pub first_segment: u32,
    /// Entries per section: keys, seen, batches, checkpoints, quarantine, add marks.
    pub totals: [u64; 6],
}

/// One decoded state record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StateRecord<'a> {
    Keys(Vec<KeyEntryView<'a>>),
    Seen(Vec<SeenView>),
    Batches(Vec<BatchView<'a>>),
    Checkpoints(Vec<(&'a [u8], &'a [u8])>),
    Quarantine(Vec<QuarantinedView<'a>>),
    AddMarks(Vec<AddMarkView<'a>>),
    End(StateEnd),
}

pub(crate) fn encode_key(buf: &mut Vec<u8>, key: &[u8], seq: u64, value: KeyValue<'_>) {
    codec::put_bytes(buf, key);
    codec::put_varint(buf, seq);
    match value {
        KeyValue::Inline { value, .. } => {
            codec::put_u8(buf, KEY_INLINE);
            codec::put_value(buf, value);
        }
        KeyValue::Ref {
            segment,
            offset,
            len,
            crc,
        } => {
            codec::put_u8(buf, if crc.is_some() { KEY_REF_CRC } else { KEY_REF });
            codec::put_u32(buf, segment);
            codec::put_u32(buf, offset);
            codec::put_u32(buf, len);
            if let Some(crc) = crc {
                codec::put_u32(buf, crc);
            }
        }
        KeyValue::Tombstone { at_secs } => {
            codec::put_u8(buf, KEY_TOMBSTONE);
            codec::put_u32(buf, at_secs);
        }
    }
}

pub(crate) fn encode_seen(buf: &mut Vec<u8>, seen: SeenView) {
    codec::put_u128(buf, seen.id);
    codec::put_u64(buf, seen.payload);
    codec::put_u32(buf, seen.at_secs);
}

pub(crate) fn encode_batch(buf: &mut Vec<u8>, b: &BatchView<'_>) {
    codec::put_bytes(buf, b.batch_id);
    codec::put_u128(buf, b.content_hash);
    codec::put_u64(buf, b.committed_ms);
    for c in b.counts {
        codec::put_varint(buf, c);
    }
}

pub(crate) fn encode_checkpoint(buf: &mut Vec<u8>, source: &[u8], position: &[u8]) {
    codec::put_bytes(buf, source);
    codec::put_bytes(buf, position);
}

pub(crate) fn encode_quarantined(buf: &mut Vec<u8>, q: &QuarantinedView<'_>) {
    codec::put_bytes(buf, q.batch_id);
    codec::put_varint(buf, q.index);
    codec::put_bytes(buf, q.event_id);
    codec::put_bytes(buf, q.reason);
}

pub(crate) fn encode_add_mark(buf: &mut Vec<u8>, m: &AddMarkView<'_>) {
    codec::put_bytes(buf, m.key);
    codec::put_u8(buf, u8::from(m.floor.is_some()));
    codec::put_varint(buf, m.floor.unwrap_or(0));
    codec::put_u64(buf, m.window_start_ms);
    codec::put_varint(buf, m.window_seq);
}

/// Encodes an `END` record body.
pub(crate) fn encode_end(buf: &mut Vec<u8>, end: &StateEnd) {
    codec::put_u64(buf, end.log_time_ms);
    codec::put_u32(buf, end.covered_segment);
    codec::put_u64(buf, end.covered_offset);
    codec::put_u32(buf, end.first_segment);
    for t in end.totals {
        codec::put_varint(buf, t);
    }
}

/// Starts a section record body: the entry count comes first.
pub(crate) fn encode_count(buf: &mut Vec<u8>, count: usize) {
    codec::put_varint(buf, count as u64);
}

fn decode_entries<'a, T>(
    d: &mut Decoder<'a>,
    entry_bytes_min: usize,
    what: &'static str,
    mut entry: impl FnMut(&mut Decoder<'a>) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    let n = d.count(entry_bytes_min, what)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(entry(d)?);
    }
    Ok(out)
}

/// The fewest bytes a key entry takes: key length, one key byte, seq, tag.
const KEY_ENTRY_BYTES_MIN: usize = 4;

fn decode_key<'a>(d: &mut Decoder<'a>) -> Result<KeyEntryView<'a>, DecodeError> {
    let key_at = d.position();
    let key = d.bytes(ID_BYTES_MAX, "key")?;
    if key.is_empty() {
        return Err(d.err_at(key_at, "empty key"));
    }
    let seq = d.varint("seq")?;
    let tag_at = d.position();
    let value = match d.u8("key entry tag")? {
        KEY_INLINE => {
            let (value, value_at, _) = d.value(RECORD_BODY_BYTES_MAX)?;
            KeyValue::Inline { value, value_at }
        }
        tag @ (KEY_REF | KEY_REF_CRC) => KeyValue::Ref {
            segment: d.u32("value segment")?,
            offset: d.u32("value offset")?,
            len: d.u32("value length")?,
            crc: if tag == KEY_REF_CRC {
                Some(d.u32("value checksum")?)
            } else {
                None
            },
        },
        KEY_TOMBSTONE => KeyValue::Tombstone {
            at_secs: d.u32("tombstone time")?,
        },
        _ => return Err(d.err_at(tag_at, "unknown key entry tag")),
    };
    Ok(KeyEntryView { key, seq, value })
}

/// As `decode_state` of a `KEYS` record, but each entry handed to `each`
/// as it is decoded, with no vector of them: loading a large snapshot
/// allocates nothing per record, where a megabyte vector per record can
/// fault in fresh pages for each (DESIGN.md, "Snapshots"). Entries before
/// a bad one are handed over before the error is returned, so a record's
/// first problem in byte order is the one reported.
pub(crate) fn for_each_key<'a>(
    body: &'a [u8],
    each: impl FnMut(KeyEntryView<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    for_each_entry(body, KEY_ENTRY_BYTES_MIN, "key count", decode_key, each)
}

/// As `for_each_key`, for a `SEEN` record.
pub(crate) fn for_each_seen(
    body: &[u8],
    each: impl FnMut(SeenView) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    for_each_entry(body, SEEN_ENTRY_LEN, "seen count", decode_seen, each)
}

fn for_each_entry<'a, T>(
    body: &'a [u8],
    entry_bytes_min: usize,
    what: &'static str,
    decode: impl Fn(&mut Decoder<'a>) -> Result<T, DecodeError>,
    mut each: impl FnMut(T) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    let mut d = Decoder::new(body);
    let n = d.count(entry_bytes_min, what)?;
    for _ in 0..n {
        each(decode(&mut d)?)?;
    }
    d.finish()
}

fn decode_seen(d: &mut Decoder<'_>) -> Result<SeenView, DecodeError> {
    Ok(SeenView {
        id: d.u128("seen id")?,
        payload: d.u64("seen payload")?,
        at_secs: d.u32("seen time")?,
    })
}

/// Decodes a state record body of kind `kind`.
pub(crate) fn decode_state(kind: u8, body: &[u8]) -> Result<StateRecord<'_>, DecodeError> {
    let mut d = Decoder::new(body);
    let record = match kind {
        KIND_KEYS => StateRecord::Keys(decode_entries(
            &mut d,
            KEY_ENTRY_BYTES_MIN,
            "key count",
            decode_key,
        )?),
        KIND_SEEN => StateRecord::Seen(decode_entries(
            &mut d,
            SEEN_ENTRY_LEN,
            "seen count",
            decode_seen,
        )?),
        KIND_BATCHES => StateRecord::Batches(decode_entries(&mut d, 34, "batch count", |d| {
            let id_at = d.position();
            let batch_id = d.bytes(ID_BYTES_MAX, "batch id")?;
            if batch_id.is_empty() {
                return Err(d.err_at(id_at, "empty batch id"));
            }
            let content_hash = d.u128("content hash")?;
            let committed_ms = d.u64("commit time")?;
            let mut counts = [0u64; 8];
            for c in &mut counts {
                *c = d.varint("report count")?;
            }
            Ok(BatchView {
                batch_id,
                content_hash,
                committed_ms,
                counts,
            })
        })?),
        KIND_CHECKPOINTS => {
            StateRecord::Checkpoints(decode_entries(&mut d, 2, "checkpoint count", |d| {
                Ok((
                    d.bytes(ID_BYTES_MAX, "checkpoint source")?,
                    d.bytes(POSITION_BYTES_MAX, "checkpoint position")?,
                ))
            })?)
        }
        KIND_QUARANTINE => {
            StateRecord::Quarantine(decode_entries(&mut d, 5, "quarantine count", |d| {
                Ok(QuarantinedView {
                    batch_id: d.bytes(ID_BYTES_MAX, "quarantined batch id")?,
                    index: d.varint("quarantined index")?,
                    event_id: d.bytes(RECORD_BODY_BYTES_MAX, "quarantined event id")?,
                    reason: d.bytes(RECORD_BODY_BYTES_MAX, "quarantine reason")?,
                })
            })?)
        }
        KIND_ADD_MARKS => {
            StateRecord::AddMarks(decode_entries(&mut d, 12, "add mark count", |d| {
                let key = d.bytes(ID_BYTES_MAX, "add mark key")?;
                let flag_at = d.position();
                let has_floor = match d.u8("add mark floor flag")? {
                    0 => false,
                    1 => true,
                    _ => return Err(d.err_at(flag_at, "bad add mark floor flag")),
                };
                let floor = d.varint("add mark floor")?;
                Ok(AddMarkView {
                    key,
                    floor: has_floor.then_some(floor),
                    window_start_ms: d.u64("add mark window start")?,
                    window_seq: d.varint("add mark window seq")?,
                })
            })?)
        }
        KIND_END => {
            let mut end = StateEnd {
                log_time_ms: d.u64("log time")?,
                covered_segment: d.u32("covered segment")?,
                covered_offset: d.u64("covered offset")?,
                first_segment: d.u32("first segment")?,
                totals: [0; 6],
            };
            for t in &mut end.totals {
                *t = d.varint("section total")?;
            }
            StateRecord::End(end)
        }
        _ => return Err(d.err("not a state record kind")),
    };
    d.finish()?;
    Ok(record)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(kind: u8, entries: impl FnOnce(&mut Vec<u8>) -> usize) -> (u8, Vec<u8>) {
        let mut body = Vec::new();
        let n = entries(&mut body);
        let mut out = Vec::new();
        encode_count(&mut out, n);
        out.extend_from_slice(&body);
        (kind, out)
    }

    #[test]
    fn every_section_round_trips_and_rejects_truncation() {
        let sections = [
            section(KIND_KEYS, |b| {
                encode_key(
                    b,
                    b"k1",
                    3,
                    KeyValue::Inline {
                        value: b"v",
                        value_at: 0,
                    },
                );
                encode_key(
                    b,
                    b"k2",
                    4,
                    KeyValue::Ref {
                        segment: 2,
                        offset: 100,
                        len: 5,
                        crc: None,
                    },
                );
                encode_key(b, b"k3", 5, KeyValue::Tombstone { at_secs: 9 });
                encode_key(
                    b,
                    b"k4",
                    6,
                    KeyValue::Ref {
                        segment: 3,
                        offset: 200,
                        len: 6,
                        crc: Some(0xdead_beef),
                    },
                );
                4
            }),
            section(KIND_SEEN, |b| {
                encode_seen(
                    b,
                    SeenView {
                        id: u128::MAX,
                        payload: 7,
                        at_secs: 8,
                    },
                );
                1
            }),
            section(KIND_BATCHES, |b| {
                encode_batch(
                    b,
                    &BatchView {
                        batch_id: b"B1",
                        content_hash: 5,
                        committed_ms: 6,
                        counts: [1; 8],
                    },
                );
                1
            }),
            section(KIND_CHECKPOINTS, |b| {
                encode_checkpoint(b, b"src", b"\x01");
                1
            }),
            section(KIND_QUARANTINE, |b| {
                encode_quarantined(
                    b,
                    &QuarantinedView {
                        batch_id: b"B",
                        index: 2,
                        event_id: b"e",
                        reason: b"r",
                    },
                );
                1
            }),
            section(KIND_ADD_MARKS, |b| {
                encode_add_mark(
                    b,
                    &AddMarkView {
                        key: b"c",
                        floor: Some(0),
                        window_start_ms: 1,
                        window_seq: 2,
                    },
                );
                1
            }),
        ];
        for (kind, body) in &sections {
            let decoded = decode_state(*kind, body).expect("round trip");
            if let StateRecord::Keys(keys) = &decoded {
                let KeyValue::Inline { value, value_at } = keys[0].value else {
                    panic!("inline")
                };
                assert_eq!(
                    (value, &body[value_at..value_at + 1]),
                    (&b"v"[..], &b"v"[..])
                );
                assert_eq!(
                    keys[1].value,
                    KeyValue::Ref {
                        segment: 2,
                        offset: 100,
                        len: 5,
                        crc: None,
                    }
                );
                assert_eq!(keys[2].value, KeyValue::Tombstone { at_secs: 9 });
                assert_eq!(
                    keys[3].value,
                    KeyValue::Ref {
                        segment: 3,
                        offset: 200,
                        len: 6,
                        crc: Some(0xdead_beef),
                    }
                );
            }
            if let StateRecord::AddMarks(marks) = &decoded {
                assert_eq!(marks[0].floor, Some(0));
            }
            for cut in 0..body.len() {
                assert!(
                    decode_state(*kind, &body[..cut]).is_err(),
                    "kind {kind} cut at {cut}"
                );
            }
        }
        let mut end = Vec::new();
        let want = StateEnd {
            log_time_ms: 1,
            covered_segment: 2,
            covered_offset: 3,
            first_segment: 1,
            totals: [1, 2, 3, 4, 5, 6],
        };
        encode_end(&mut end, &want);
        assert_eq!(decode_state(KIND_END, &end), Ok(StateRecord::End(want)));
        assert!(decode_state(1, &end).is_err());
    }

    /// The decoder refuses what no writer makes (DESIGN.md, "State
    /// records"): an empty key, an empty batch id, a floor flag other than 0
    /// or 1. Each case is otherwise a well-formed one-entry section.
    #[test]
    fn an_empty_key_an_empty_batch_id_or_a_floor_flag_past_1_is_refused() {
        let key = |key: &[u8]| {
            section(KIND_KEYS, |b| {
                encode_key(b, key, 1, KeyValue::Tombstone { at_secs: 2 });
                1
            })
        };
        let batch = |batch_id: &[u8]| {
            section(KIND_BATCHES, |b| {
                let view = BatchView {
                    batch_id,
                    content_hash: 1,
                    committed_ms: 2,
                    counts: [0; 8],
                };
                encode_batch(b, &view);
                1
            })
        };
        let mark = |flag: u8| {
            let (kind, mut body) = section(KIND_ADD_MARKS, |b| {
                let view = AddMarkView {
                    key: b"c",
                    floor: Some(3),
                    window_start_ms: 4,
                    window_seq: 5,
                };
                encode_add_mark(b, &view);
                1
            });
            // The count, the key's length and its one byte, then the flag.
            assert_eq!(body[3], 1, "the flag of a mark with a floor");
            body[3] = flag;
            (kind, body)
        };
        // `batch(b"B")` is the smallest batch entry there is: a one-byte id
        // and eight one-byte counts.
        for (kind, body) in [key(b"k"), batch(b"B"), mark(0), mark(1)] {
            assert!(decode_state(kind, &body).is_ok(), "kind {kind}");
        }
        // Each is reported at its own byte: after the one-byte count, the
        // empty field's length; the flag at 3.
        let refused = |(kind, body): (u8, Vec<u8>)| {
            let err = decode_state(kind, &body).unwrap_err();
            (err.what, err.offset)
        };
        let (kind, body) = key(b"");
        assert_eq!(refused((kind, body.clone())), ("empty key", 1));
        let err = for_each_key(&body, |_| Ok(())).unwrap_err();
        assert_eq!((err.what, err.offset), ("empty key", 1));
        assert_eq!(refused(batch(b"")), ("empty batch id", 1));
        for flag in [2, 0xff] {
            assert_eq!(
                refused(mark(flag)),
                ("bad add mark floor flag", 3),
                "flag {flag}"
            );
        }
        // The key, its one-byte seq, then the tag.
        let (kind, mut body) = key(b"k");
        assert_eq!(body[4], KEY_TOMBSTONE);
        body[4] = 0xee;
        assert_eq!(refused((kind, body)), ("unknown key entry tag", 4));
    }

    /// A record body holds its entries and nothing after them: a byte past
    /// the last entry is refused, by `decode_state` for every kind and by the
    /// entry-by-entry decoders of keys and seen ids.
    #[test]
    fn a_byte_after_the_last_entry_of_any_state_record_is_refused() {
        let mut records = vec![
            section(KIND_KEYS, |b| {
                encode_key(b, b"k", 1, KeyValue::Tombstone { at_secs: 2 });
                1
            }),
            section(KIND_SEEN, |b| {
                let view = SeenView {
                    id: 1,
                    payload: 2,
                    at_secs: 3,
                };
                encode_seen(b, view);
                1
            }),
            section(KIND_CHECKPOINTS, |b| {
                encode_checkpoint(b, b"src", b"1");
                1
            }),
        ];
        let mut end = Vec::new();
        encode_end(&mut end, &StateEnd::default());
        records.push((KIND_END, end));
        for (kind, mut body) in records {
            assert!(decode_state(kind, &body).is_ok(), "kind {kind}");
            body.push(0);
            let err = decode_state(kind, &body).unwrap_err();
            assert_eq!(err.offset, body.len() - 1, "kind {kind}: {err:?}");
            let each = match kind {
                KIND_KEYS => for_each_key(&body, |_| Ok(())),
                KIND_SEEN => for_each_seen(&body, |_| Ok(())),
                _ => continue,
            };
            assert_eq!(each.unwrap_err().offset, body.len() - 1, "kind {kind}");
        }
    }
}
