//! Record bodies (DESIGN.md, FORMAT, "Batch record").
//!
//! A batch record holds everything one committed batch changed. Replay applies
//! it as written, without re-running any dedup logic, so what the live store
//! did and what recovery rebuilds are the same by construction.

use super::codec::{self, DecodeError, Decoder};
use super::{ID_BYTES_MAX, POSITION_BYTES_MAX, RECORD_BODY_BYTES_MAX};

/// Record kind tags. Never reuse a retired value.
pub(crate) const KIND_BATCH: u8 = 1;

/// Write tags inside a batch record. Never reuse a retired value.
const WRITE_PUT: u8 = 0;
const WRITE_DELETE: u8 = 1;
const WRITE_BUMP: u8 = 2;

/// The smallest encoded seen entry: id hash (16) + payload hash (8).
const SEEN_ENTRY_LEN: usize = 24;

/// A key's new state as a record carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteView<'a> {
    /// A new value. `value_at` is the value's offset inside the body (its
    /// 4-byte CRC, `crc`, sits just before it).
    Put {
        value: &'a [u8],
        value_at: usize,
        crc: u32,
    },
    /// The live row is removed; a tombstone keeps the seq.
    Delete,
    /// The seq advances; the value stays where it is.
    Bump,
}

/// One key change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyWrite<'a> {
    pub key: &'a [u8],
    pub seq: u64,
    pub op: WriteView<'a>,
}

/// One quarantined delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuarantineView<'a> {
    pub index: u64,
    pub event_id: &'a [u8],
    pub reason: &'a [u8],
}

/// A decoded batch record, borrowing from the body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BatchRecord<'a> {
    pub batch_id: &'a [u8],
    pub content_hash: u128,
    pub committed_ms: u64,
    pub counts: [u64; 8],
    /// New seen ids: (xxh3-128 of the event id, payload hash).
    pub seen: Vec<(u128, u64)>,
    pub writes: Vec<KeyWrite<'a>>,
    pub checkpoints: Vec<(&'a [u8], &'a [u8])>,
    pub quarantine: Vec<QuarantineView<'a>>,
    /// Counter keys that applied `Add`s, with the largest `Add` seq per key.
    pub adds: Vec<(&'a [u8], u64)>,
}

/// Value of a put as the planner hands it to the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueSource<'a> {
    Bytes(&'a [u8]),
    /// Bytes whose CRC-32 the planner computed already (comparing them
    /// with a stored value of the same length).
    BytesWithCrc(&'a [u8], u32),
    /// A counter's new value, encoded as canonical decimal text.
    Counter(i64),
}

/// A key change as the planner hands it to the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteSource<'a> {
    Put(ValueSource<'a>),
    Delete,
    Bump,
}

/// Encodes the header fields of a batch record body into `buf`.
pub(crate) fn encode_batch_head(
    buf: &mut Vec<u8>,
    batch_id: &[u8],
    content_hash: u128,
    committed_ms: u64,
    counts: [u64; 8],
) {
    codec::put_bytes(buf, batch_id);
    codec::put_u128(buf, content_hash);
    codec::put_u64(buf, committed_ms);
    for c in counts {
        codec::put_varint(buf, c);
    }
}

pub(crate) fn encode_seen(buf: &mut Vec<u8>, seen: &[(u128, u64)]) {
    codec::put_varint(buf, seen.len() as u64);
    for &(id, payload) in seen {
        codec::put_u128(buf, id);
        codec::put_u64(buf, payload);
    }
}

pub(crate) fn encode_writes_count(buf: &mut Vec<u8>, n: usize) {
    codec::put_varint(buf, n as u64);
}

/// Encodes one key change.
pub(crate) fn encode_write(buf: &mut Vec<u8>, key: &[u8], seq: u64, op: WriteSource<'_>) {
    codec::put_bytes(buf, key);
    codec::put_varint(buf, seq);
    match op {
        WriteSource::Put(value) => {
            codec::put_u8(buf, WRITE_PUT);
            match value {
                ValueSource::Bytes(v) => codec::put_value(buf, v),
                ValueSource::BytesWithCrc(v, crc) => codec::put_value_with_crc(buf, v, crc),
                ValueSource::Counter(n) => codec::put_value(buf, CounterText::new(n).as_bytes()),
            }
        }
        WriteSource::Delete => codec::put_u8(buf, WRITE_DELETE),
        WriteSource::Bump => codec::put_u8(buf, WRITE_BUMP),
    }
}

pub(crate) fn encode_checkpoints<'a>(
    buf: &mut Vec<u8>,
    checkpoints: impl ExactSizeIterator<Item = (&'a [u8], &'a [u8])>,
) {
    codec::put_varint(buf, checkpoints.len() as u64);
    for (source, position) in checkpoints {
        codec::put_bytes(buf, source);
        codec::put_bytes(buf, position);
    }
}

pub(crate) fn encode_quarantine(buf: &mut Vec<u8>, entries: &[QuarantineView<'_>]) {
    codec::put_varint(buf, entries.len() as u64);
    for q in entries {
        codec::put_varint(buf, q.index);
        codec::put_bytes(buf, q.event_id);
        codec::put_bytes(buf, q.reason);
    }
}

pub(crate) fn encode_adds(buf: &mut Vec<u8>, adds: &[(&[u8], u64)]) {
    codec::put_varint(buf, adds.len() as u64);
    for &(key, seq) in adds {
        codec::put_bytes(buf, key);
        codec::put_varint(buf, seq);
    }
}

/// Decodes a batch record body, validating every length and tag and each
/// value's CRC.
pub(crate) fn decode_batch(body: &[u8]) -> Result<BatchRecord<'_>, DecodeError> {
    decode_batch_with(Decoder::new(body))
}

/// As `decode_batch`, for a body this process encoded with `encode_*`:
/// every length and tag checked, the value CRCs (computed from the same
/// bytes) not computed again.
pub(crate) fn decode_own_batch(body: &[u8]) -> Result<BatchRecord<'_>, DecodeError> {
    decode_batch_with(Decoder::of_own_encoding(body))
}

fn decode_batch_with(mut d: Decoder<'_>) -> Result<BatchRecord<'_>, DecodeError> {
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

    let n = d.count(SEEN_ENTRY_LEN, "seen id count")?;
    let mut seen = Vec::with_capacity(n);
    for _ in 0..n {
        seen.push((d.u128("seen id hash")?, d.u64("seen payload hash")?));
    }

    // A write is at least: key length, one key byte, seq, tag.
    let n = d.count(4, "write count")?;
    let mut writes = Vec::with_capacity(n);
    for _ in 0..n {
        let key_at = d.position();
        let key = d.bytes(ID_BYTES_MAX, "key")?;
        if key.is_empty() {
            return Err(d.err_at(key_at, "empty key"));
        }
        let seq = d.varint("seq")?;
        let tag_at = d.position();
        let op = match d.u8("write tag")? {
            WRITE_PUT => {
                let (value, value_at, crc) = d.value(RECORD_BODY_BYTES_MAX)?;
                WriteView::Put {
                    value,
                    value_at,
                    crc,
                }
            }
            WRITE_DELETE => WriteView::Delete,
            WRITE_BUMP => WriteView::Bump,
            _ => return Err(d.err_at(tag_at, "unknown write tag")),
        };
        writes.push(KeyWrite { key, seq, op });
    }

    let n = d.count(3, "checkpoint count")?;
    let mut checkpoints = Vec::with_capacity(n);
    for _ in 0..n {
        let source = d.bytes(ID_BYTES_MAX, "checkpoint source")?;
        let position = d.bytes(POSITION_BYTES_MAX, "checkpoint position")?;
        checkpoints.push((source, position));
    }

    let n = d.count(3, "quarantine count")?;
    let mut quarantine = Vec::with_capacity(n);
    for _ in 0..n {
        let index = d.varint("quarantine index")?;
        // A quarantined delivery may be refused for its oversized id, and a
        // malformed one's reason is the caller's text: no limit but the body's.
        let event_id = d.bytes(RECORD_BODY_BYTES_MAX, "quarantined event id")?;
        let reason = d.bytes(RECORD_BODY_BYTES_MAX, "quarantine reason")?;
        quarantine.push(QuarantineView {
            index,
            event_id,
            reason,
        });
    }
    let n = d.count(3, "add count")?;
    let mut adds = Vec::with_capacity(n);
    for _ in 0..n {
        let key = d.bytes(ID_BYTES_MAX, "add key")?;
        adds.push((key, d.varint("add seq")?));
    }
    d.finish()?;
    Ok(BatchRecord {
        batch_id,
        content_hash,
        committed_ms,
        counts,
        seen,
        writes,
        checkpoints,
        quarantine,
        adds,
    })
}

/// Canonical decimal text of an i64, without allocating.
pub(crate) struct CounterText {
    buf: [u8; 20],
    start: usize,
}

impl CounterText {
    /// The longest text of an i64: `-9223372036854775808`.
    pub(crate) const BYTES_MAX: usize = 20;

    #[expect(
        clippy::indexing_slicing,
        reason = "20 bytes hold any i64 with its sign"
    )]
    pub(crate) fn new(n: i64) -> Self {
        let mut buf = [0u8; 20];
        let mut at = buf.len();
        let mut m = n.unsigned_abs();
        loop {
            at -= 1;
            buf[at] = b'0' + (m % 10) as u8;
            m /= 10;
            if m == 0 {
                break;
            }
        }
        if n < 0 {
            at -= 1;
            buf[at] = b'-';
        }
        Self { buf, start: at }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.buf.get(self.start..).unwrap_or_default()
    }
}

/// Parses canonical decimal i64 text (`0`, `-5`, `42`; no `+`, no leading
/// zeros, no `-0`). Anything else is not a counter.
pub(crate) fn parse_counter(bytes: &[u8]) -> Option<i64> {
    // No i64 takes more than 20 bytes (`-9223372036854775808`): a longer
    // value is not scanned, however many `Add`s ask (a batch that puts
    // 64 MiB of digits and then adds to that key 200 times spent 4.7 s
    // scanning them, under the writer lock).
    if bytes.len() > CounterText::BYTES_MAX {
        return None;
    }
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let canonical = match digits {
        [] => false,
        [b'0'] => digits.len() == bytes.len(),
        [first, rest @ ..] => (b'1'..=b'9').contains(first) && rest.iter().all(u8::is_ascii_digit),
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoding bounds each count by the smallest entry it can have, so
    /// that a forged count allocates nothing: a bound above the true
    /// minimum would refuse real records. Records holding nothing but seen
    /// entries (24 bytes each), or nothing but writes as small as they come
    /// (a one-byte key, a one-byte seq, a delete: 4 bytes), decode.
    #[test]
    fn records_of_entries_of_the_smallest_size_decode() {
        let body = |seen: &[(u128, u64)], keys: &[&[u8]]| {
            let mut buf = Vec::new();
            encode_batch_head(&mut buf, b"B", 0, 0, [0; 8]);
            encode_seen(&mut buf, seen);
            encode_writes_count(&mut buf, keys.len());
            for key in keys {
                encode_write(&mut buf, key, 1, WriteSource::Delete);
            }
            encode_checkpoints(&mut buf, std::iter::empty());
            encode_quarantine(&mut buf, &[]);
            encode_adds(&mut buf, &[]);
            buf
        };
        let seen: Vec<(u128, u64)> = (0..8).map(|i| (i, 0)).collect();
        let keys: [&[u8]; 8] = [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"];
        for (buf, want) in [(body(&seen, &[]), (8, 0)), (body(&[], &keys), (0, 8))] {
            let r = decode_batch(&buf).expect("decodes");
            assert_eq!((r.seen.len(), r.writes.len()), want);
            assert_eq!(decode_own_batch(&buf).expect("decodes"), r);
        }
    }

    /// A body is exactly one record: bytes after its last field are
    /// corruption (a length or count that reads short), never ignored.
    #[test]
    fn bytes_after_a_batch_record_do_not_decode() {
        let mut buf = Vec::new();
        encode_batch_head(&mut buf, b"B", 0, 0, [0; 8]);
        encode_seen(&mut buf, &[]);
        encode_writes_count(&mut buf, 0);
        encode_checkpoints(&mut buf, std::iter::empty());
        encode_quarantine(&mut buf, &[]);
        encode_adds(&mut buf, &[]);
        assert!(decode_batch(&buf).is_ok());
        buf.push(0);
        let err = decode_batch(&buf).unwrap_err();
        assert_eq!(
            (err.what, err.offset),
            ("trailing bytes after record body", buf.len() - 1)
        );
        assert!(decode_own_batch(&buf).is_err());
    }

    /// A refused tag or empty field is reported at its own byte (DESIGN.md,
    /// "Reader rules": `Corruption` at the offending byte), not at the
    /// byte after it.
    #[test]
    fn a_bad_tag_or_an_empty_field_is_reported_at_its_own_byte() {
        let record = |batch_id: &[u8], key: &[u8]| {
            let mut buf = Vec::new();
            encode_batch_head(&mut buf, batch_id, 0, 0, [0; 8]);
            encode_seen(&mut buf, &[]);
            encode_writes_count(&mut buf, 1);
            let key_at = buf.len();
            encode_write(&mut buf, key, 1, WriteSource::Delete);
            encode_checkpoints(&mut buf, std::iter::empty());
            encode_quarantine(&mut buf, &[]);
            encode_adds(&mut buf, &[]);
            (buf, key_at)
        };
        let (buf, _) = record(b"", b"k");
        let err = decode_batch(&buf).unwrap_err();
        assert_eq!((err.what, err.offset), ("empty batch id", 0));
        let (buf, key_at) = record(b"B", b"");
        let err = decode_batch(&buf).unwrap_err();
        assert_eq!((err.what, err.offset), ("empty key", key_at));
        // Key length, key, one-byte seq, then the tag.
        let (mut buf, key_at) = record(b"B", b"k");
        let tag_at = key_at + 3;
        assert_eq!(buf[tag_at], WRITE_DELETE);
        buf[tag_at] = 0xee;
        let err = decode_batch(&buf).unwrap_err();
        assert_eq!((err.what, err.offset), ("unknown write tag", tag_at));
        assert_eq!(decode_own_batch(&buf).unwrap_err(), err);
    }

    #[test]
    fn counter_text_round_trips() {
        for n in [0, 1, -1, 42, -300, i64::MAX, i64::MIN] {
            let t = CounterText::new(n);
            assert_eq!(t.as_bytes(), n.to_string().as_bytes());
            assert_eq!(parse_counter(t.as_bytes()), Some(n));
        }
    }

    #[test]
    fn non_canonical_numbers_are_not_counters() {
        for s in [
            "",
            "-",
            "-0",
            "01",
            "+1",
            " 1",
            "1.0",
            "1e3",
            "9223372036854775808",
            "-92233720368547758080",
            "100000000000000000000",
            "abc",
        ] {
            assert_eq!(parse_counter(s.as_bytes()), None, "{s:?}");
        }
    }

    #[test]
    fn batch_record_round_trips() {
        let mut buf = Vec::new();
        encode_batch_head(&mut buf, b"B1", 0xabc, 1234, [1, 2, 3, 4, 5, 6, 7, 8]);
        encode_seen(&mut buf, &[(7, 9), (u128::MAX, u64::MAX)]);
        encode_writes_count(&mut buf, 4);
        encode_write(
            &mut buf,
            b"k1",
            5,
            WriteSource::Put(ValueSource::Bytes(b"v1")),
        );
        encode_write(
            &mut buf,
            b"k2",
            6,
            WriteSource::Put(ValueSource::Counter(-12)),
        );
        encode_write(&mut buf, b"k3", 7, WriteSource::Delete);
        encode_write(&mut buf, b"k4", u64::MAX, WriteSource::Bump);
        encode_checkpoints(&mut buf, [(&b"cdc"[..], &b"\x00\x01"[..])].into_iter());
        encode_quarantine(
            &mut buf,
            &[QuarantineView {
                index: 3,
                event_id: b"e3",
                reason: b"conflicting_event",
            }],
        );
        encode_adds(&mut buf, &[(&b"k2"[..], 6)]);

        let r = decode_batch(&buf).unwrap();
        assert_eq!(r.batch_id, b"B1");
        assert_eq!(
            (r.content_hash, r.committed_ms, r.counts),
            (0xabc, 1234, [1, 2, 3, 4, 5, 6, 7, 8])
        );
        assert_eq!(r.seen, vec![(7, 9), (u128::MAX, u64::MAX)]);
        assert_eq!(r.writes.len(), 4);
        let WriteView::Put {
            value,
            value_at,
            crc,
        } = r.writes[0].op
        else {
            panic!("put")
        };
        assert_eq!(
            (value, &buf[value_at..value_at + 2], crc),
            (&b"v1"[..], &b"v1"[..], crc32fast::hash(b"v1"))
        );
        let WriteView::Put { value, .. } = r.writes[1].op else {
            panic!("put")
        };
        assert_eq!(value, b"-12");
        assert_eq!(r.writes[2].op, WriteView::Delete);
        assert_eq!(
            (r.writes[3].seq, r.writes[3].op),
            (u64::MAX, WriteView::Bump)
        );
        assert_eq!(r.checkpoints, vec![(&b"cdc"[..], &b"\x00\x01"[..])]);
        assert_eq!(r.quarantine[0].reason, b"conflicting_event");
        assert_eq!(r.adds, vec![(&b"k2"[..], 6)]);

        for cut in 0..buf.len() {
            assert!(
                decode_batch(&buf[..cut]).is_err(),
                "prefix of {cut} bytes must not decode"
            );
            assert!(
                decode_own_batch(&buf[..cut]).is_err(),
                "nor as our own encoding"
            );
        }
        assert_eq!(decode_own_batch(&buf).unwrap(), r);

        // A value that no longer matches its CRC: only the full check sees it.
        buf[value_at] ^= 1;
        let err = decode_batch(&buf).unwrap_err();
        assert_eq!(
            (err.what, err.offset),
            ("value checksum mismatch", value_at)
        );
        assert!(decode_own_batch(&buf).is_ok());
    }
}
