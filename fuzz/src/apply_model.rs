//! `apply_model`: sequences of batches, reopens, crashes, compactions,
//! snapshots and clock moves against a small reference model (the one of
//! `tests/model.rs`, with TTLs off so that time only shows in commit times).
//!
//! After every step the store and the model must agree on: the outcome of
//! the step (report or error), every row (`scan_prefix` and `get`), every
//! checkpoint, every batch report (`batch` and `log`, commit times
//! included), the quarantine in commit order, the counts of `stats`; the
//! digest changes exactly when rows or checkpoints change, and equal states
//! have equal digests.
//!
//! A crash takes the disk image that a power loss (under `Durability::Sync`)
//! or a process crash (under `Buffered`) leaves, and opens it: every
//! acknowledged batch must be there.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use idemkv::storage::{CrashPolicy, FaultyStorage};
use idemkv::{
    Batch, BatchReport, Clock as _, Delivery, Digest, Durability, Error, ManualClock, OnConflict,
    Op, Options, Record, Store,
};

use crate::image::{START_MS, dir};

const KEYS: [&str; 5] = ["k0", "k1", "k2", "k3", "k4"];
const SOURCES: [&str; 2] = ["s0", "s1"];
const VALUES: [&str; 8] = ["a", "b", "7", "-2", "12", "007", "", "9223372036854775807"];
/// One more value after `VALUES`: large enough that a batch putting it is
/// published by the store's thread (DESIGN.md, "Publishing").
const LARGE_VALUE_BYTES: usize = 40 << 10;
const VALUE_BYTES_MAX: usize = LARGE_VALUE_BYTES;
const ID_BYTES_MAX: usize = 4096;
const STEPS_MAX: usize = 48;
const DELIVERIES_MAX: usize = 12;

// ---------------------------------------------------------------- input

#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    pub quarantine: bool,
    pub buffered: bool,
    /// Segment size limit in units of 256 bytes (small ones rotate often).
    pub segment_units: u8,
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    Apply {
        id: BatchIdSpec,
        deliveries: Vec<DeliverySpec>,
        checkpoints: Vec<(u8, u8)>,
    },
    Reopen,
    Crash,
    Compact,
    Snapshot,
    Verify,
    /// Moves the clock forward by this many seconds.
    Advance(u16),
    /// Moves the clock back by this many seconds (the log's clock must not follow).
    Back(u8),
}

#[derive(Debug, Clone, Arbitrary)]
pub enum OpSpec {
    Put(u8),
    Delete,
    Add(i8),
    AddExtreme(u8),
}

#[derive(Debug, Clone, Arbitrary)]
pub enum Mutation {
    Key,
    Seq,
    Op,
}

#[derive(Debug, Clone, Arbitrary)]
pub enum InvalidKind {
    EmptyKey,
    EmptyId,
    LongKey,
    LongId,
    LongValue,
    Malformed,
}

#[derive(Debug, Clone, Arbitrary)]
pub enum DeliverySpec {
    /// A new event id.
    New { key: u8, seq: u8, op: OpSpec },
    /// An earlier delivery again, exactly.
    Redeliver(u16),
    /// An earlier event id with another payload.
    Conflict(u16, Mutation),
    /// A statically invalid delivery.
    Invalid(InvalidKind),
}

#[derive(Debug, Clone, Arbitrary)]
pub enum BatchIdSpec {
    Fresh,
    /// Resubmits an earlier batch exactly (committed or not).
    Replay(u16),
    /// A committed batch id with newly generated content.
    Reuse(u16),
    Empty,
    TooLong,
}

// ---------------------------------------------------------------- the model

/// What an event id was first seen with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Payload {
    key: Bytes,
    seq: u64,
    op: Op,
}

fn payload(d: &Delivery) -> Payload {
    Payload {
        key: d.key.clone(),
        seq: d.seq,
        op: d.op.clone(),
    }
}

type Content = (Vec<Delivery>, Vec<(Bytes, Bytes)>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    Conflict,
    Invalid,
}

/// An outcome of `apply_batch`, reduced to what the contract fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Conflicting { index: usize, event_id: String },
    Invalid { index: usize, event_id: String },
    BatchConflict,
    InvalidBatch,
}

fn failure_of(e: Error) -> Failure {
    match e {
        Error::ConflictingEvent {
            index, event_id, ..
        } => Failure::Conflicting { index, event_id },
        Error::InvalidEvent {
            index, event_id, ..
        } => Failure::Invalid { index, event_id },
        Error::BatchConflict { .. } => Failure::BatchConflict,
        Error::InvalidBatch { .. } => Failure::InvalidBatch,
        other => panic!("unexpected error from apply_batch: {other}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The logical state: what the digest covers.
type LogicalState = (BTreeMap<Bytes, (u64, Bytes)>, BTreeMap<Bytes, Bytes>);

#[derive(Debug, Clone, Default)]
struct Model {
    rows: BTreeMap<Bytes, (u64, Bytes)>,
    /// Each key's version, live row or tombstone.
    versions: HashMap<Bytes, u64>,
    seen: HashMap<Bytes, Payload>,
    batches: HashMap<Bytes, (Content, BatchReport)>,
    /// Committed batch ids with report and commit time, in commit order.
    log: Vec<(Bytes, BatchReport, u64)>,
    /// The log's clock: the latest commit time.
    log_time_ms: u64,
    checkpoints: BTreeMap<Bytes, Bytes>,
    /// (batch id, index, event id, refusal), in commit order.
    quarantine: Vec<(Bytes, u64, Bytes, Refusal)>,
}

fn parse_counter(value: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(value).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if (digits.len() > 1 && digits.starts_with('0')) || s == "-0" {
        return None;
    }
    s.parse::<i64>().ok()
}

fn static_problem(d: &Delivery) -> bool {
    d.event_id.is_empty()
        || d.event_id.len() > ID_BYTES_MAX
        || d.key.is_empty()
        || d.key.len() > ID_BYTES_MAX
        || matches!(d.op, Op::Malformed { .. })
}

/// A value over the limit: asked only of an event not seen before (an event
/// applied under a higher limit is still a duplicate).
fn value_too_long(d: &Delivery) -> bool {
    matches!(&d.op, Op::Put(v) if v.len() > VALUE_BYTES_MAX)
}

fn batch_is_invalid(batch: &Batch) -> bool {
    batch.id().is_empty()
        || batch.id().len() > ID_BYTES_MAX
        || batch
            .checkpoints()
            .iter()
            .any(|(s, p)| s.is_empty() || s.len() > ID_BYTES_MAX || p.len() > 64 * 1024)
}

impl Model {
    fn logical_state(&self) -> LogicalState {
        (self.rows.clone(), self.checkpoints.clone())
    }

    fn apply(
        &mut self,
        batch: &Batch,
        policy: OnConflict,
        now_ms: u64,
    ) -> Result<BatchReport, Failure> {
        if batch_is_invalid(batch) {
            return Err(Failure::InvalidBatch);
        }
        let batch_id = batch.id();
        let content: Content = (batch.deliveries().to_vec(), batch.checkpoints().to_vec());
        if let Some((stored, report)) = self.batches.get(batch_id) {
            if *stored == content {
                return Ok(BatchReport {
                    replayed: true,
                    ..*report
                });
            }
            return Err(Failure::BatchConflict);
        }

        let mut next = self.clone();
        let mut report = BatchReport::default();
        for (index, d) in batch.deliveries().iter().enumerate() {
            let Some(refusal) = next.apply_delivery(d, &mut report) else {
                continue;
            };
            match policy {
                OnConflict::Fail => {
                    let event_id = text(&d.event_id);
                    return Err(match refusal {
                        Refusal::Conflict => Failure::Conflicting { index, event_id },
                        Refusal::Invalid => Failure::Invalid { index, event_id },
                    });
                }
                OnConflict::Quarantine => {
                    report.rejected += 1;
                    next.quarantine.push((
                        Bytes::copy_from_slice(batch_id),
                        index as u64,
                        d.event_id.clone(),
                        refusal,
                    ));
                }
            }
        }
        for (source, position) in batch.checkpoints() {
            next.checkpoints.insert(source.clone(), position.clone());
        }
        let id = Bytes::copy_from_slice(batch_id);
        next.batches.insert(id.clone(), (content, report));
        next.log_time_ms = next.log_time_ms.max(now_ms);
        next.log.push((id, report, next.log_time_ms));
        *self = next;
        Ok(report)
    }

    /// Applies one delivery, counting it; returns why it is refused, if it is.
    fn apply_delivery(&mut self, d: &Delivery, report: &mut BatchReport) -> Option<Refusal> {
        if static_problem(d) {
            return Some(Refusal::Invalid);
        }
        if let Some(first) = self.seen.get(&d.event_id) {
            if *first == payload(d) {
                report.duplicates += 1;
                return None;
            }
            return Some(Refusal::Conflict);
        }
        if value_too_long(d) {
            return Some(Refusal::Invalid);
        }
        let version = self.versions.get(&d.key).copied();
        match &d.op {
            Op::Add(delta) => {
                let current = match self.rows.get(&d.key) {
                    None => 0,
                    Some((_, value)) => match parse_counter(value) {
                        Some(n) => n,
                        None => return Some(Refusal::Invalid),
                    },
                };
                let Some(sum) = current.checked_add(*delta) else {
                    return Some(Refusal::Invalid);
                };
                let seq = version.unwrap_or(0).max(d.seq);
                self.rows
                    .insert(d.key.clone(), (seq, Bytes::from(sum.to_string())));
                self.versions.insert(d.key.clone(), seq);
                report.added += 1;
            }
            Op::Put(value) => {
                if version.is_some_and(|v| d.seq <= v) {
                    report.stale += 1;
                } else {
                    match self.rows.get(&d.key) {
                        None => report.inserted += 1,
                        Some((_, old)) if old == value => report.unchanged += 1,
                        Some(_) => report.updated += 1,
                    }
                    self.rows.insert(d.key.clone(), (d.seq, value.clone()));
                    self.versions.insert(d.key.clone(), d.seq);
                }
            }
            Op::Delete => {
                if version.is_some_and(|v| d.seq <= v) {
                    report.stale += 1;
                } else {
                    self.rows.remove(&d.key);
                    self.versions.insert(d.key.clone(), d.seq);
                    report.deleted += 1;
                }
            }
            Op::Malformed { .. } => unreachable!("malformed deliveries are statically invalid"),
        }
        self.seen.insert(d.event_id.clone(), payload(d));
        None
    }
}

// ---------------------------------------------------------------- the runner

struct Runner {
    policy: OnConflict,
    durability: Durability,
    segment_bytes_max: u64,
    storage: FaultyStorage,
    clock: ManualClock,
    model: Model,
    history: Vec<Delivery>,
    attempted: Vec<Batch>,
    committed: Vec<Bytes>,
    next_event: u64,
    next_batch: u64,
    digest_of: HashMap<LogicalState, Digest>,
    state_of: HashMap<Digest, LogicalState>,
    /// The state and digest after the last step.
    last: Option<(LogicalState, Digest)>,
}

fn pick<T: Clone>(items: &[T], i: u16) -> Option<T> {
    (!items.is_empty()).then(|| items[usize::from(i) % items.len()].clone())
}

impl Runner {
    fn options(&self) -> Options {
        Options::default()
            .storage(Arc::new(self.storage.clone()))
            .clock(Arc::new(self.clock.clone()))
            .durability(self.durability)
            .on_conflict(self.policy)
            .segment_bytes_max(self.segment_bytes_max)
            .value_bytes_max(VALUE_BYTES_MAX)
            .seen_ttl(None)
            .batch_ttl(None)
            .tombstone_ttl(None)
    }

    fn open(&self) -> Store {
        Store::open(dir(), self.options()).unwrap_or_else(|e| panic!("open: {e}"))
    }

    fn fresh_event(&mut self) -> Bytes {
        self.next_event += 1;
        Bytes::from(format!("e{}", self.next_event))
    }

    fn new_delivery(&mut self, key: u8, seq: u8, op: &OpSpec) -> Delivery {
        Delivery {
            event_id: self.fresh_event(),
            key: Bytes::from_static(KEYS[usize::from(key) % KEYS.len()].as_bytes()),
            seq: if seq == u8::MAX {
                u64::MAX
            } else {
                u64::from(seq % 16)
            },
            op: match op {
                OpSpec::Put(v) => match VALUES.get(usize::from(*v) % (VALUES.len() + 1)) {
                    Some(value) => Op::Put(Bytes::from_static(value.as_bytes())),
                    None => Op::Put(Bytes::from(vec![b'L'; LARGE_VALUE_BYTES])),
                },
                OpSpec::Delete => Op::Delete,
                OpSpec::Add(delta) => Op::Add(i64::from(*delta)),
                OpSpec::AddExtreme(x) => {
                    Op::Add([i64::MAX, i64::MIN, i64::MAX - 1][usize::from(*x) % 3])
                }
            },
        }
    }

    fn delivery(&mut self, spec: &DeliverySpec) -> Delivery {
        let d = match spec {
            DeliverySpec::New { key, seq, op } => self.new_delivery(*key, *seq, op),
            DeliverySpec::Redeliver(i) => match pick(&self.history, *i) {
                Some(d) => d,
                None => self.new_delivery(0, 1, &OpSpec::Put(0)),
            },
            DeliverySpec::Conflict(i, m) => match pick(&self.history, *i) {
                Some(mut d) => {
                    match m {
                        Mutation::Key => d.key = Bytes::from(format!("{}x", text(&d.key))),
                        Mutation::Seq => d.seq = d.seq.wrapping_add(1),
                        Mutation::Op => {
                            d.op = match d.op {
                                Op::Put(v) if v.as_ref() == b"a" => {
                                    Op::Put(Bytes::from_static(b"b"))
                                }
                                Op::Put(_) => Op::Put(Bytes::from_static(b"a")),
                                Op::Delete => Op::Add(1),
                                Op::Add(n) => Op::Add(n.wrapping_add(1)),
                                Op::Malformed { .. } => Op::Delete,
                            }
                        }
                    }
                    d
                }
                None => self.new_delivery(0, 1, &OpSpec::Put(0)),
            },
            DeliverySpec::Invalid(kind) => {
                let event_id = self.fresh_event();
                let key = Bytes::from_static(b"k0");
                let put = |v: &[u8]| Op::Put(Bytes::copy_from_slice(v));
                let (event_id, key, op) = match kind {
                    InvalidKind::EmptyKey => (event_id, Bytes::new(), put(b"a")),
                    InvalidKind::EmptyId => (Bytes::new(), key, put(b"a")),
                    InvalidKind::LongKey => (
                        event_id,
                        Bytes::from(vec![b'k'; ID_BYTES_MAX + 1]),
                        put(b"a"),
                    ),
                    InvalidKind::LongId => {
                        (Bytes::from(vec![b'i'; ID_BYTES_MAX + 1]), key, put(b"a"))
                    }
                    InvalidKind::LongValue => (event_id, key, put(&[b'v'; VALUE_BYTES_MAX + 1])),
                    InvalidKind::Malformed => (
                        event_id,
                        Bytes::new(),
                        Op::Malformed {
                            reason: "unparsable line".into(),
                        },
                    ),
                };
                Delivery {
                    event_id,
                    key,
                    seq: 1,
                    op,
                }
            }
        };
        self.history.push(d.clone());
        d
    }

    fn batch(
        &mut self,
        id: &BatchIdSpec,
        specs: &[DeliverySpec],
        checkpoints: &[(u8, u8)],
    ) -> Batch {
        let fresh_content = |runner: &mut Runner, id: Bytes| {
            let mut batch = Batch::new(id);
            for spec in specs.iter().take(DELIVERIES_MAX) {
                let d = runner.delivery(spec);
                batch.push_delivery(d);
            }
            for &(source, position) in checkpoints.iter().take(3) {
                // One source in eleven is empty: the batch is invalid.
                let source = match source % 11 {
                    10 => "",
                    s => SOURCES[usize::from(s) % SOURCES.len()],
                };
                batch.set_checkpoint(source, [position]);
            }
            batch
        };
        let fresh_id = |runner: &mut Runner| {
            runner.next_batch += 1;
            Bytes::from(format!("b{}", runner.next_batch))
        };
        match id {
            BatchIdSpec::Replay(i) if !self.attempted.is_empty() => {
                pick(&self.attempted, *i).expect("not empty")
            }
            BatchIdSpec::Reuse(i) if !self.committed.is_empty() => {
                let id = pick(&self.committed, *i).expect("not empty");
                fresh_content(self, id)
            }
            BatchIdSpec::Empty => fresh_content(self, Bytes::new()),
            BatchIdSpec::TooLong => fresh_content(self, Bytes::from(vec![b'b'; ID_BYTES_MAX + 1])),
            BatchIdSpec::Fresh | BatchIdSpec::Replay(_) | BatchIdSpec::Reuse(_) => {
                let id = fresh_id(self);
                fresh_content(self, id)
            }
        }
    }

    /// Store and model agree on everything observable.
    fn check(&mut self, store: &Store, context: &str) {
        let rows: Vec<(Bytes, Record)> = store
            .scan_prefix(b"")
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("scan after {context}: {e}"));
        let expected: Vec<(Bytes, Record)> = self
            .model
            .rows
            .iter()
            .map(|(k, (seq, value))| {
                let record = Record {
                    seq: *seq,
                    value: value.clone(),
                };
                (k.clone(), record)
            })
            .collect();
        assert_eq!(rows, expected, "rows after {context}");
        for key in KEYS.iter().chain(["k0x", "absent"].iter()) {
            let expected = self
                .model
                .rows
                .get(key.as_bytes())
                .map(|(seq, value)| Record {
                    seq: *seq,
                    value: value.clone(),
                });
            assert_eq!(
                store.get(key).expect("get"),
                expected,
                "get({key}) after {context}"
            );
        }
        let checkpoints: BTreeMap<Bytes, Bytes> = store.checkpoints().into_iter().collect();
        assert_eq!(
            checkpoints, self.model.checkpoints,
            "checkpoints after {context}"
        );
        for source in SOURCES {
            assert_eq!(
                store.checkpoint(source).expect("checkpoint"),
                self.model.checkpoints.get(source.as_bytes()).cloned(),
                "checkpoint {source} after {context}"
            );
        }
        for batch in &self.attempted {
            let expected = self.model.batches.get(batch.id()).map(|(_, r)| *r);
            assert_eq!(
                store.batch(batch.id()).expect("batch"),
                expected,
                "batch {:?} after {context}",
                text(batch.id())
            );
        }
        let log: Vec<(Bytes, BatchReport, u64)> = store
            .log()
            .into_iter()
            .map(|e| (e.batch_id, e.report, e.committed_ms))
            .collect();
        assert_eq!(log, self.model.log, "log after {context}");

        let quarantine: Vec<(Bytes, u64, Bytes, Refusal)> = store
            .quarantine()
            .into_iter()
            .map(|q| {
                let refusal = if q.reason == "conflicting_event" {
                    Refusal::Conflict
                } else {
                    assert!(
                        q.reason.starts_with("invalid: "),
                        "quarantine reason {:?}",
                        q.reason
                    );
                    Refusal::Invalid
                };
                (q.batch_id, q.index, q.event_id, refusal)
            })
            .collect();
        assert_eq!(
            quarantine, self.model.quarantine,
            "quarantine after {context}"
        );

        let stats = store.stats();
        let tombstones = self
            .model
            .versions
            .keys()
            .filter(|k| !self.model.rows.contains_key(*k))
            .count() as u64;
        assert_eq!(
            (
                stats.live_keys,
                stats.tombstones,
                stats.seen_ids,
                stats.batches,
                stats.checkpoints,
                stats.quarantined
            ),
            (
                self.model.rows.len() as u64,
                tombstones,
                self.model.seen.len() as u64,
                self.model.batches.len() as u64,
                self.model.checkpoints.len() as u64,
                self.model.quarantine.len() as u64
            ),
            "stats (live keys, tombstones, seen ids, batches, checkpoints, quarantined) after {context}"
        );

        let digest = store.digest().expect("digest");
        let state = self.model.logical_state();
        let (last_state, last_digest) = self.last.take().expect("set at the start");
        assert_eq!(
            digest != last_digest,
            state != last_state,
            "the digest must change exactly when rows or checkpoints change ({context})"
        );
        if let Some(known) = self.digest_of.get(&state) {
            assert_eq!(
                *known, digest,
                "equal states, different digests ({context})"
            );
        }
        if let Some(known) = self.state_of.get(&digest) {
            assert_eq!(*known, state, "one digest for two states ({context})");
        }
        self.digest_of.insert(state.clone(), digest);
        self.state_of.insert(digest, state.clone());
        self.last = Some((state, digest));
    }
}

/// Runs one input.
pub fn run(input: &Input) {
    let clock = ManualClock::new(START_MS);
    let mut runner = Runner {
        policy: if input.quarantine {
            OnConflict::Quarantine
        } else {
            OnConflict::Fail
        },
        durability: if input.buffered {
            Durability::Buffered
        } else {
            Durability::Sync
        },
        segment_bytes_max: 256 * u64::from(input.segment_units.max(1)),
        storage: FaultyStorage::new(),
        clock,
        model: Model::default(),
        history: Vec::new(),
        attempted: Vec::new(),
        committed: Vec::new(),
        next_event: 0,
        next_batch: 0,
        digest_of: HashMap::new(),
        state_of: HashMap::new(),
        last: None,
    };
    let mut store = runner.open();
    let empty = store.digest().expect("digest");
    runner.digest_of.insert(Default::default(), empty);
    runner.state_of.insert(empty, Default::default());
    runner.last = Some((Default::default(), empty));

    for (n, step) in input.steps.iter().take(STEPS_MAX).enumerate() {
        let context = format!("step {n}: {step:?}");
        match step {
            Step::Apply {
                id,
                deliveries,
                checkpoints,
            } => {
                let batch = runner.batch(id, deliveries, checkpoints);
                let now_ms = runner.clock.now_ms();
                let expected = runner.model.apply(&batch, runner.policy, now_ms);
                let actual = store.apply_batch(&batch).map_err(failure_of);
                assert_eq!(actual, expected, "outcome of {context}, batch {batch:?}");
                if let Ok(report) = &actual {
                    assert_eq!(
                        report.deliveries(),
                        batch.len() as u64,
                        "counts add up ({context})"
                    );
                    if !report.replayed {
                        runner.committed.push(Bytes::copy_from_slice(batch.id()));
                    }
                }
                runner.attempted.push(batch);
            }
            Step::Reopen => {
                drop(store);
                store = runner.open();
            }
            Step::Crash => {
                let policy = match runner.durability {
                    Durability::Sync => CrashPolicy::PowerLoss,
                    Durability::Buffered => CrashPolicy::ProcessCrash,
                };
                let image = runner.storage.crash_image(policy);
                drop(store);
                runner.storage = image;
                store = runner.open();
            }
            Step::Compact => {
                let report = store.compact().unwrap_or_else(|e| panic!("compact: {e}"));
                assert_eq!(
                    (
                        report.seen_ids_dropped,
                        report.batch_ids_dropped,
                        report.tombstones_dropped
                    ),
                    (0, 0, 0),
                    "nothing expires without TTLs ({context})"
                );
            }
            Step::Snapshot => store.snapshot().unwrap_or_else(|e| panic!("snapshot: {e}")),
            Step::Verify => {
                store.verify().unwrap_or_else(|e| panic!("verify: {e}"));
            }
            Step::Advance(secs) => runner.clock.advance(Duration::from_secs(u64::from(*secs))),
            Step::Back(secs) => {
                let now = runner.clock.now_ms();
                runner
                    .clock
                    .set_ms(now.saturating_sub(u64::from(*secs) * 1000));
            }
        }
        runner.check(&store, &context);
    }
    drop(store);
    // The final state survives a last reopen.
    let store = runner.open();
    runner.check(&store, "the final reopen");
}
