//! SPEC section 3 in application code, shared by the key-value peers (redb,
//! fjall, RocksDB): what a peer has to do by hand that idemkv does inside
//! `apply_batch`. SQLite does the same in SQL (`engines/sqlite.rs`), the CPU
//! floor in plain hash maps (`engines/floor.rs`).
//!
//! Tables a key-value peer keeps:
//!
//! | table  | key          | value                                              |
//! |--------|--------------|----------------------------------------------------|
//! | rows   | business key | seq (u64 BE), kind (1 live, 0 tombstone), value    |
//! | seen   | event id     | payload hash (u64 LE)                              |
//! | batch  | batch id     | content hash (u128 LE), then the 8 counts (u64 LE) |
//! | ckpt   | source       | position                                           |
//!
//! A key holds either its live row or its tombstone, so one read gives its
//! version. Expiry is not implemented: no peer has the TTL bookkeeping.

use idemkv::{Batch, BatchReport, Delivery, Op};
use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};

/// Largest key or event id (as idemkv's `ID_BYTES_MAX`).
pub const ID_BYTES_MAX: usize = 4096;
/// Largest value (idemkv's default `value_bytes_max`).
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// Why a batch was refused; nothing of it was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Same event id, other payload (`Error::ConflictingEvent`).
    ConflictingEvent { index: usize },
    /// Invalid delivery (`Error::InvalidEvent`).
    InvalidEvent { index: usize, reason: String },
    /// Same batch id, other content (`Error::BatchConflict`).
    BatchConflict,
    /// Anything else (I/O, a bug): fails the run.
    Other(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::ConflictingEvent { index } => write!(f, "conflicting event at {index}"),
            Refused::InvalidEvent { index, reason } => write!(f, "invalid event at {index}: {reason}"),
            Refused::BatchConflict => write!(f, "batch conflict"),
            Refused::Other(e) => write!(f, "{e}"),
        }
    }
}

/// Hash of a delivery's payload (key, seq, op, value or delta): tells a
/// redelivery from a conflicting reuse of its event id.
pub fn payload_hash(d: &Delivery) -> u64 {
    let (tag, body): (u64, &[u8]) = match &d.op {
        Op::Put(v) => (1, v),
        Op::Delete => (2, b""),
        Op::Add(_) => (3, b""),
        Op::Malformed { reason } => (4, reason.as_bytes()),
    };
    let head = xxh3_64_with_seed(&d.key, d.seq) ^ tag.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    match &d.op {
        Op::Add(delta) => xxh3_64_with_seed(&delta.to_le_bytes(), head),
        _ => xxh3_64_with_seed(body, head),
    }
}

/// Hash of a batch's content: its deliveries in order, then its checkpoints.
pub fn content_hash(batch: &Batch) -> u128 {
    let mut h = Xxh3::new();
    h.update(&(batch.len() as u64).to_le_bytes());
    for d in batch.deliveries() {
        h.update(&(d.event_id.len() as u64).to_le_bytes());
        h.update(&d.event_id);
        h.update(&payload_hash(d).to_le_bytes());
    }
    for (source, position) in batch.checkpoints() {
        h.update(&(source.len() as u64).to_le_bytes());
        h.update(source);
        h.update(&(position.len() as u64).to_le_bytes());
        h.update(position);
    }
    h.digest128()
}

/// Why a delivery can never be applied, whatever the state.
pub fn static_problem(d: &Delivery) -> Option<String> {
    Some(match &d.op {
        Op::Malformed { reason } => reason.clone(),
        _ if d.event_id.is_empty() => "empty event id".into(),
        _ if d.event_id.len() > ID_BYTES_MAX => "event id too long".into(),
        _ if d.key.is_empty() => "empty key".into(),
        _ if d.key.len() > ID_BYTES_MAX => "key too long".into(),
        Op::Put(v) if v.len() > VALUE_BYTES_MAX => "value too long".into(),
        _ => return None,
    })
}

/// A counter's canonical text, parsed; `None` if the bytes are not one.
pub fn parse_counter(bytes: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

/// The stored report of a committed batch.
pub fn encode_batch_entry(content: u128, report: &BatchReport) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 64);
    out.extend_from_slice(&content.to_le_bytes());
    for c in report.counts() {
        out.extend_from_slice(&c.to_le_bytes());
    }
    out
}

pub fn decode_batch_entry(bytes: &[u8]) -> (u128, BatchReport) {
    let content = u128::from_le_bytes(bytes[..16].try_into().expect("16 bytes"));
    let mut counts = [0u64; 8];
    for (i, c) in counts.iter_mut().enumerate() {
        let at = 16 + i * 8;
        *c = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    }
    (content, BatchReport::from_counts(counts))
}

/// A key's row: its version, and its value if live (`None`: tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub seq: u64,
    pub value: Option<Vec<u8>>,
}

pub fn encode_row(seq: u64, value: Option<&[u8]>) -> Vec<u8> {
    let v = value.unwrap_or(b"");
    let mut out = Vec::with_capacity(9 + v.len());
    out.extend_from_slice(&seq.to_be_bytes());
    out.push(u8::from(value.is_some()));
    out.extend_from_slice(v);
    out
}

pub fn decode_row(bytes: &[u8]) -> Row {
    let seq = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    let value = (bytes[8] == 1).then(|| bytes[9..].to_vec());
    Row { seq, value }
}

/// The tables of a key-value peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    Rows,
    Seen,
    Batches,
    Checkpoints,
}

/// One write transaction of a key-value peer. Reads must see the
/// transaction's own earlier writes.
pub trait KvTxn {
    fn get(&mut self, table: Table, key: &[u8]) -> Option<Vec<u8>>;
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]);
}

/// What the batch registry says about a batch before it is applied.
pub enum BatchLookup {
    New(u128),
    Replayed(BatchReport),
}

/// Checks the batch registry: a committed batch id with the same content is
/// a replay (stored report, `replayed = true`), with other content a conflict.
pub fn lookup_batch(txn: &mut impl KvTxn, batch: &Batch) -> Result<BatchLookup, Refused> {
    let content = content_hash(batch);
    match txn.get(Table::Batches, batch.id()) {
        None => Ok(BatchLookup::New(content)),
        Some(stored) => {
            let (stored_content, mut report) = decode_batch_entry(&stored);
            if stored_content != content {
                return Err(Refused::BatchConflict);
            }
            report.replayed = true;
            Ok(BatchLookup::Replayed(report))
        }
    }
}

/// Applies a new batch's deliveries, its registry entry and its checkpoints
/// inside `txn`. On `Err` the caller must discard the transaction.
pub fn apply_kv(txn: &mut impl KvTxn, batch: &Batch, content: u128) -> Result<BatchReport, Refused> {
    let mut report = BatchReport::default();
    for (index, d) in batch.deliveries().iter().enumerate() {
        if let Some(reason) = static_problem(d) {
            return Err(Refused::InvalidEvent { index, reason });
        }
        let payload = payload_hash(d);
        if let Some(seen) = txn.get(Table::Seen, &d.event_id) {
            if seen == payload.to_le_bytes() {
                report.duplicates += 1;
                continue;
            }
            return Err(Refused::ConflictingEvent { index });
        }
        let row = txn.get(Table::Rows, &d.key).map(|b| decode_row(&b));
        let version = row.as_ref().map(|r| r.seq);
        let live = row.and_then(|r| r.value);
        match &d.op {
            Op::Add(delta) => {
                let base = match &live {
                    None => 0,
                    Some(v) => parse_counter(v).ok_or_else(|| Refused::InvalidEvent {
                        index,
                        reason: "delta on a non-counter value".into(),
                    })?,
                };
                let sum = base.checked_add(*delta).ok_or_else(|| Refused::InvalidEvent {
                    index,
                    reason: "counter overflow".into(),
                })?;
                report.added += 1;
                let seq = version.map_or(d.seq, |v| v.max(d.seq));
                txn.put(Table::Rows, &d.key, &encode_row(seq, Some(sum.to_string().as_bytes())));
            }
            _ if version.is_some_and(|v| d.seq <= v) => report.stale += 1,
            Op::Delete => {
                report.deleted += 1;
                txn.put(Table::Rows, &d.key, &encode_row(d.seq, None));
            }
            Op::Put(value) => {
                match &live {
                    None => report.inserted += 1,
                    Some(old) if old[..] == value[..] => report.unchanged += 1,
                    Some(_) => report.updated += 1,
                }
                txn.put(Table::Rows, &d.key, &encode_row(d.seq, Some(value)));
            }
            Op::Malformed { .. } => unreachable!("malformed deliveries fail the static checks"),
        }
        txn.put(Table::Seen, &d.event_id, &payload.to_le_bytes());
    }
    txn.put(Table::Batches, batch.id(), &encode_batch_entry(content, &report));
    for (source, position) in batch.checkpoints() {
        txn.put(Table::Checkpoints, source, position);
    }
    Ok(report)
}

/// idemkv's digest (src/digest.rs), computed from a peer's live rows.
pub struct DigestBuilder {
    hasher: Xxh3,
}

impl Default for DigestBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl DigestBuilder {
    pub fn new() -> Self {
        let mut hasher = Xxh3::new();
        hasher.update(b"idemkv-digest-v1");
        Self { hasher }
    }

    fn field(&mut self, bytes: &[u8]) {
        self.hasher.update(&(bytes.len() as u64).to_le_bytes());
        self.hasher.update(bytes);
    }

    /// One live row; rows in ascending key order.
    pub fn row(&mut self, key: &[u8], seq: u64, value: &[u8]) {
        self.hasher.update(b"R");
        self.field(key);
        self.hasher.update(&seq.to_le_bytes());
        self.field(value);
    }

    /// One checkpoint, after all rows, in ascending source order.
    pub fn checkpoint(&mut self, source: &[u8], position: &[u8]) {
        self.hasher.update(b"C");
        self.field(source);
        self.field(position);
    }

    pub fn finish(self) -> u128 {
        self.hasher.digest128()
    }
}

/// Bytes of a delivery, for the disk floor: event id, key, seq, op, value.
pub fn serialize_batch(batch: &Batch, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(batch.id().len() as u32).to_le_bytes());
    out.extend_from_slice(batch.id());
    for d in batch.deliveries() {
        out.extend_from_slice(&(d.event_id.len() as u32).to_le_bytes());
        out.extend_from_slice(&d.event_id);
        out.extend_from_slice(&(d.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&d.key);
        out.extend_from_slice(&d.seq.to_le_bytes());
        match &d.op {
            Op::Put(v) => {
                out.push(1);
                out.extend_from_slice(&(v.len() as u32).to_le_bytes());
                out.extend_from_slice(v);
            }
            Op::Delete => out.push(2),
            Op::Add(delta) => {
                out.push(3);
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Op::Malformed { .. } => out.push(4),
        }
    }
    for (s, p) in batch.checkpoints() {
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s);
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
}

/// A transaction's own writes, for engines whose write batches cannot be
/// read before they commit (fjall, RocksDB).
#[derive(Default)]
pub struct Overlay {
    tables: [std::collections::HashMap<Vec<u8>, Vec<u8>>; 4],
}

impl Overlay {
    pub fn with_capacity(n: usize) -> Self {
        let map = || std::collections::HashMap::with_capacity(n);
        Self {
            tables: [map(), map(), Default::default(), Default::default()],
        }
    }

    pub fn get(&self, table: Table, key: &[u8]) -> Option<&Vec<u8>> {
        self.tables[table as usize].get(key)
    }

    pub fn put(&mut self, table: Table, key: &[u8], value: &[u8]) {
        self.tables[table as usize].insert(key.to_vec(), value.to_vec());
    }
}
