//! Model test: random histories of batches against a small reference model.
//!
//! The model below is written for clarity, not speed: maps of rows, key
//! versions, seen event ids, committed batches and checkpoints, and the rules
//! of SPEC section 3 spelled out one delivery at a time. After every step the
//! store and the model must agree on the outcome (report or error), every row,
//! every checkpoint, every batch report and the quarantine; the digest must
//! change exactly when the model's logical state changes, and equal states
//! must have equal digests.
//!
//! A second property checks order independence: any arrangement of the
//! deliveries of a set of put/delete events ends in the same rows and digest.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use bytes::Bytes;
use idemkv::{
    Batch, BatchReport, Delivery, Digest, Durability, Error, OnConflict, Op, Options, Record, Store,
};
use proptest::prelude::*;
use proptest::sample::Index;

const KEYS: [&str; 5] = ["k0", "k1", "k2", "k3", "k4"];
const SOURCES: [&str; 2] = ["s0", "s1"];
const VALUES: [&str; 7] = ["a", "b", "7", "-2", "12", "007", ""];
/// One more value, `OpSpec::Put(VALUES.len())`: large enough that a batch
/// putting it is published by the store's thread (DESIGN.md, "Publishing").
const LARGE_VALUE_BYTES: usize = 40 << 10;
const VALUE_BYTES_MAX: usize = LARGE_VALUE_BYTES;
const ID_BYTES_MAX: usize = 4096;
const KEY_BYTES_MAX: usize = 4096;

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

/// How a quarantined delivery was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    Conflict,
    Invalid,
}

/// An error, reduced to what the contract fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Failure {
    Conflicting {
        batch_id: String,
        index: usize,
        event_id: String,
    },
    Invalid {
        batch_id: String,
        index: usize,
        event_id: String,
    },
    BatchConflict {
        batch_id: String,
    },
    InvalidBatch,
}

fn failure_of(e: Error) -> Failure {
    match e {
        Error::ConflictingEvent {
            batch_id,
            index,
            event_id,
        } => Failure::Conflicting {
            batch_id,
            index,
            event_id,
        },
        Error::InvalidEvent {
            batch_id,
            index,
            event_id,
            ..
        } => Failure::Invalid {
            batch_id,
            index,
            event_id,
        },
        Error::BatchConflict { batch_id } => Failure::BatchConflict { batch_id },
        Error::InvalidBatch { .. } => Failure::InvalidBatch,
        other => panic!("unexpected error from apply_batch: {other}"),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("ids in this test are UTF-8")
}

/// The logical state: what the digest covers.
type LogicalState = (BTreeMap<Bytes, (u64, Bytes)>, BTreeMap<Bytes, Bytes>);

#[derive(Debug, Clone, Default)]
struct Model {
    /// Live rows: key -> (seq, value).
    rows: BTreeMap<Bytes, (u64, Bytes)>,
    /// Each key's current version, live row or tombstone.
    versions: HashMap<Bytes, u64>,
    seen: HashMap<Bytes, Payload>,
    batches: HashMap<Bytes, (Content, BatchReport)>,
    checkpoints: BTreeMap<Bytes, Bytes>,
    /// (batch id, index, event id, refusal)
    quarantine: Vec<(Bytes, u64, Bytes, Refusal)>,
}

/// A canonical decimal i64: `0`, `-5`, `42`; no sign `+`, no leading zeros, no `-0`.
fn parse_counter(value: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(value).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    if s == "-0" {
        return None;
    }
    s.parse::<i64>().ok()
}

fn static_problem(d: &Delivery) -> bool {
    d.event_id.is_empty()
        || d.event_id.len() > ID_BYTES_MAX
        || d.key.is_empty()
        || d.key.len() > KEY_BYTES_MAX
        || matches!(d.op, Op::Malformed { .. })
}

/// A value over the limit: asked only of an event not seen before (an event
/// applied under a higher limit is still a duplicate).
fn value_too_long(d: &Delivery) -> bool {
    matches!(&d.op, Op::Put(v) if v.len() > VALUE_BYTES_MAX)
}

impl Model {
    fn logical_state(&self) -> LogicalState {
        (self.rows.clone(), self.checkpoints.clone())
    }

    fn apply(&mut self, batch: &Batch, policy: OnConflict) -> Result<BatchReport, Failure> {
        let batch_id = batch.id();
        if batch_id.is_empty() {
            return Err(Failure::InvalidBatch);
        }
        let content: Content = (batch.deliveries().to_vec(), batch.checkpoints().to_vec());
        if let Some((stored, report)) = self.batches.get(batch_id) {
            if *stored == content {
                return Ok(BatchReport {
                    replayed: true,
                    ..*report
                });
            }
            return Err(Failure::BatchConflict {
                batch_id: text(batch_id),
            });
        }

        let mut next = self.clone();
        let mut report = BatchReport::default();
        for (index, d) in batch.deliveries().iter().enumerate() {
            let refusal = next.apply_delivery(d, &mut report);
            let Some(refusal) = refusal else { continue };
            match policy {
                OnConflict::Fail => {
                    let (batch_id, event_id) = (text(batch_id), text(&d.event_id));
                    return Err(match refusal {
                        Refusal::Conflict => Failure::Conflicting {
                            batch_id,
                            index,
                            event_id,
                        },
                        Refusal::Invalid => Failure::Invalid {
                            batch_id,
                            index,
                            event_id,
                        },
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
        next.batches
            .insert(Bytes::copy_from_slice(batch_id), (content, report));
        *self = next;
        Ok(report)
    }

    /// Applies one delivery, counting it in `report`; returns why it is refused, if it is.
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

// ---------------------------------------------------------------- generated steps

#[derive(Debug, Clone)]
enum OpSpec {
    Put(usize),
    Delete,
    Add(i64),
}

#[derive(Debug, Clone)]
enum Mutation {
    Key,
    Seq,
    Op,
}

#[derive(Debug, Clone)]
enum InvalidKind {
    EmptyKey,
    EmptyId,
    LongKey,
    LongId,
    LongValue,
    Malformed,
}

#[derive(Debug, Clone)]
enum DeliverySpec {
    /// A new event id.
    New { key: usize, seq: u64, op: OpSpec },
    /// An earlier delivery again, exactly.
    Redeliver(Index),
    /// An earlier event id with another payload.
    Conflict(Index, Mutation),
    /// A statically invalid delivery.
    Invalid(InvalidKind),
}

#[derive(Debug, Clone)]
enum BatchIdSpec {
    Fresh,
    /// Resubmit an earlier batch exactly (committed or not).
    Replay(Index),
    /// A committed batch id with newly generated content.
    Reuse(Index),
    Empty,
}

#[derive(Debug, Clone)]
enum Step {
    Apply {
        id: BatchIdSpec,
        deliveries: Vec<DeliverySpec>,
        checkpoints: Vec<(usize, u8)>,
    },
    Reopen,
    /// A snapshot, then a reopen that loads it.
    Snapshot,
    /// A compaction, then a reopen that loads its base.
    Compact,
}

fn op_spec() -> impl Strategy<Value = OpSpec> {
    prop_oneof![
        5 => (0..=VALUES.len()).prop_map(OpSpec::Put),
        2 => Just(OpSpec::Delete),
        3 => (-3i64..=3).prop_map(OpSpec::Add),
        1 => prop_oneof![Just(i64::MAX), Just(i64::MIN), Just(i64::MAX - 1)].prop_map(OpSpec::Add),
    ]
}

fn delivery_spec() -> impl Strategy<Value = DeliverySpec> {
    prop_oneof![
        10 => (0..KEYS.len(), 1u64..=12, op_spec())
            .prop_map(|(key, seq, op)| DeliverySpec::New { key, seq, op }),
        6 => any::<Index>().prop_map(DeliverySpec::Redeliver),
        1 => (any::<Index>(), prop_oneof![Just(Mutation::Key), Just(Mutation::Seq), Just(Mutation::Op)])
            .prop_map(|(i, m)| DeliverySpec::Conflict(i, m)),
        1 => prop_oneof![
            Just(InvalidKind::EmptyKey),
            Just(InvalidKind::EmptyId),
            Just(InvalidKind::LongKey),
            Just(InvalidKind::LongId),
            Just(InvalidKind::LongValue),
            Just(InvalidKind::Malformed),
        ]
        .prop_map(DeliverySpec::Invalid),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    let id = prop_oneof![
        14 => Just(BatchIdSpec::Fresh),
        4 => any::<Index>().prop_map(BatchIdSpec::Replay),
        2 => any::<Index>().prop_map(BatchIdSpec::Reuse),
        1 => Just(BatchIdSpec::Empty),
    ];
    prop_oneof![
        10 => (
            id,
            prop::collection::vec(delivery_spec(), 0..8),
            prop::collection::vec((0..SOURCES.len(), any::<u8>()), 0..3),
        )
            .prop_map(|(id, deliveries, checkpoints)| Step::Apply {
                id,
                deliveries,
                checkpoints,
            }),
        1 => Just(Step::Reopen),
        1 => Just(Step::Snapshot),
        1 => Just(Step::Compact),
    ]
}

// ---------------------------------------------------------------- the runner

/// The value `OpSpec::Put(v)` puts.
fn put_value(v: usize) -> Bytes {
    match VALUES.get(v) {
        Some(value) => Bytes::from_static(value.as_bytes()),
        None => Bytes::from(vec![b'L'; LARGE_VALUE_BYTES]),
    }
}

fn options(policy: OnConflict, durability: Durability) -> Options {
    Options::default()
        .durability(durability)
        .on_conflict(policy)
        .value_bytes_max(VALUE_BYTES_MAX)
}

fn open(dir: &Path, options: Options) -> Store {
    Store::open(dir, options).expect("open")
}

fn store_rows(store: &Store) -> Vec<(Bytes, Record)> {
    store
        .scan_prefix(b"")
        .collect::<Result<Vec<_>, _>>()
        .expect("scan")
}

fn model_rows(model: &Model) -> Vec<(Bytes, Record)> {
    model
        .rows
        .iter()
        .map(|(k, (seq, value))| {
            (
                k.clone(),
                Record {
                    seq: *seq,
                    value: value.clone(),
                },
            )
        })
        .collect()
}

struct Runner {
    policy: OnConflict,
    model: Model,
    /// Every delivery generated so far, for redeliveries and conflicts.
    history: Vec<Delivery>,
    /// Every batch attempted so far, for replays.
    attempted: Vec<Batch>,
    /// Ids of committed batches, in commit order.
    committed: Vec<Bytes>,
    next_event: u64,
    next_batch: u64,
    /// Digest seen for each logical state, and the reverse.
    digest_of: HashMap<LogicalState, Digest>,
    state_of: HashMap<Digest, LogicalState>,
    last: (LogicalState, Digest),
}

impl Runner {
    fn fresh_event(&mut self) -> Bytes {
        self.next_event += 1;
        Bytes::from(format!("e{}", self.next_event))
    }

    fn delivery(&mut self, spec: &DeliverySpec) -> Delivery {
        let d = match spec {
            DeliverySpec::New { key, seq, op } => Delivery {
                event_id: self.fresh_event(),
                key: Bytes::from_static(KEYS[*key].as_bytes()),
                seq: *seq,
                op: match op {
                    OpSpec::Put(v) => Op::Put(put_value(*v)),
                    OpSpec::Delete => Op::Delete,
                    OpSpec::Add(delta) => Op::Add(*delta),
                },
            },
            DeliverySpec::Redeliver(i) if !self.history.is_empty() => {
                self.history[i.index(self.history.len())].clone()
            }
            DeliverySpec::Conflict(i, m) if !self.history.is_empty() => {
                let mut d = self.history[i.index(self.history.len())].clone();
                match m {
                    Mutation::Key => {
                        d.key = Bytes::from(format!("{}x", text(&d.key)));
                    }
                    Mutation::Seq => d.seq += 1,
                    Mutation::Op => {
                        d.op = match d.op {
                            Op::Put(v) if v.as_ref() == b"a" => Op::Put(Bytes::from_static(b"b")),
                            Op::Put(_) => Op::Put(Bytes::from_static(b"a")),
                            Op::Delete => Op::Add(1),
                            Op::Add(n) => Op::Add(n.wrapping_add(1)),
                            Op::Malformed { .. } => Op::Delete,
                        }
                    }
                }
                d
            }
            DeliverySpec::Redeliver(_) | DeliverySpec::Conflict(..) => {
                return self.delivery(&DeliverySpec::New {
                    key: 0,
                    seq: 1,
                    op: OpSpec::Put(0),
                });
            }
            DeliverySpec::Invalid(kind) => {
                let event_id = self.fresh_event();
                let key = Bytes::from_static(b"k0");
                let put = |v: &[u8]| Op::Put(Bytes::copy_from_slice(v));
                match kind {
                    InvalidKind::EmptyKey => Delivery {
                        event_id,
                        key: Bytes::new(),
                        seq: 1,
                        op: put(b"a"),
                    },
                    InvalidKind::EmptyId => Delivery {
                        event_id: Bytes::new(),
                        key,
                        seq: 1,
                        op: put(b"a"),
                    },
                    InvalidKind::LongKey => Delivery {
                        event_id,
                        key: Bytes::from(vec![b'k'; KEY_BYTES_MAX + 1]),
                        seq: 1,
                        op: put(b"a"),
                    },
                    InvalidKind::LongId => Delivery {
                        event_id: Bytes::from(vec![b'i'; ID_BYTES_MAX + 1]),
                        key,
                        seq: 1,
                        op: put(b"a"),
                    },
                    InvalidKind::LongValue => Delivery {
                        event_id,
                        key,
                        seq: 1,
                        op: put(&[b'v'; VALUE_BYTES_MAX + 1]),
                    },
                    InvalidKind::Malformed => Delivery {
                        event_id,
                        key: Bytes::new(),
                        seq: 0,
                        op: Op::Malformed {
                            reason: "unparsable line".into(),
                        },
                    },
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
        checkpoints: &[(usize, u8)],
    ) -> Batch {
        let fresh_content = |runner: &mut Runner, id: Bytes| {
            let mut batch = Batch::new(id);
            for spec in specs {
                let d = runner.delivery(spec);
                batch.push_delivery(d);
            }
            for &(source, position) in checkpoints {
                batch.set_checkpoint(SOURCES[source], [position]);
            }
            batch
        };
        match id {
            BatchIdSpec::Replay(i) if !self.attempted.is_empty() => {
                self.attempted[i.index(self.attempted.len())].clone()
            }
            BatchIdSpec::Reuse(i) if !self.committed.is_empty() => {
                let id = self.committed[i.index(self.committed.len())].clone();
                fresh_content(self, id)
            }
            BatchIdSpec::Empty => fresh_content(self, Bytes::new()),
            BatchIdSpec::Fresh | BatchIdSpec::Replay(_) | BatchIdSpec::Reuse(_) => {
                self.next_batch += 1;
                let id = Bytes::from(format!("b{}", self.next_batch));
                fresh_content(self, id)
            }
        }
    }

    /// Store and model agree on everything observable.
    fn check(&mut self, store: &Store, context: &str) {
        assert_eq!(
            store_rows(store),
            model_rows(&self.model),
            "rows after {context}"
        );
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
                "store.batch({:?}) after {context}",
                text(batch.id())
            );
        }
        let mut quarantine: Vec<(Bytes, u64, Bytes, Refusal)> = store
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
        quarantine.sort();
        let mut expected = self.model.quarantine.clone();
        expected.sort();
        assert_eq!(quarantine, expected, "quarantine after {context}");

        let digest = store.digest().expect("digest");
        let state = self.model.logical_state();
        assert_eq!(
            digest != self.last.1,
            state != self.last.0,
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
        self.last = (state, digest);
    }
}

fn run(policy: OnConflict, durability: Durability, steps: Vec<Step>) {
    let dir = tempfile::tempdir().unwrap();
    let options_of_run = || options(policy, durability);
    let mut store = open(dir.path(), options_of_run());
    let empty = store.digest().expect("digest");
    let mut runner = Runner {
        policy,
        model: Model::default(),
        history: Vec::new(),
        attempted: Vec::new(),
        committed: Vec::new(),
        next_event: 0,
        next_batch: 0,
        digest_of: HashMap::from([(Default::default(), empty)]),
        state_of: HashMap::from([(empty, Default::default())]),
        last: (Default::default(), empty),
    };
    for (n, step) in steps.iter().enumerate() {
        match step {
            Step::Reopen => {
                drop(store);
                store = open(dir.path(), options_of_run());
                runner.check(&store, &format!("step {n}: reopen"));
            }
            Step::Snapshot | Step::Compact => {
                let what = format!("step {n}: {step:?}");
                match step {
                    Step::Snapshot => store.snapshot().expect("snapshot"),
                    _ => store.compact().map(drop).expect("compact"),
                }
                runner.check(&store, &what);
                drop(store);
                store = open(dir.path(), options_of_run());
                if matches!(step, Step::Snapshot) {
                    assert!(store.stats().opened_from_snapshot, "{what}: loaded");
                }
                runner.check(&store, &format!("{what}, then a reopen"));
            }
            Step::Apply {
                id,
                deliveries,
                checkpoints,
            } => {
                let batch = runner.batch(id, deliveries, checkpoints);
                let expected = runner.model.apply(&batch, runner.policy);
                let actual = store.apply_batch(&batch).map_err(failure_of);
                let context = format!("step {n}: batch {batch:?}");
                assert_eq!(actual, expected, "outcome of {context}");
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
                runner.check(&store, &context);
            }
        }
    }
    drop(store);

    // A store built directly from the model's final state has the same digest.
    let state = runner.model.logical_state();
    let other_dir = tempfile::tempdir().unwrap();
    let other = open(
        other_dir.path(),
        options(OnConflict::Fail, Durability::Buffered),
    );
    let mut batch = Batch::new("direct");
    for (i, (key, (seq, value))) in state.0.iter().enumerate() {
        batch = batch.put(format!("direct{i}"), key, *seq, value);
    }
    for (source, position) in &state.1 {
        batch = batch.checkpoint(source, position);
    }
    other.apply_batch(&batch).expect("direct batch");
    assert_eq!(
        other.digest().expect("digest"),
        runner.last.1,
        "digest of the same state built directly"
    );
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 2000,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn store_agrees_with_model_under_fail(steps in prop::collection::vec(step(), 1..32)) {
        run(OnConflict::Fail, Durability::Buffered, steps);
    }

    #[test]
    fn store_agrees_with_model_under_quarantine(steps in prop::collection::vec(step(), 1..32)) {
        run(OnConflict::Quarantine, Durability::Buffered, steps);
    }
}

proptest! {
    // Fewer: each batch waits for an fsync. Under `Sync` a batch goes
    // through the pending overlay and is published by the syncer, and
    // snapshots and compactions sync and publish first.
    #![proptest_config(config(48))]

    #[test]
    fn store_agrees_with_model_under_sync(
        is_fail in any::<bool>(),
        steps in prop::collection::vec(step(), 1..32),
    ) {
        let policy = if is_fail { OnConflict::Fail } else { OnConflict::Quarantine };
        run(policy, Durability::Sync, steps);
    }
}

// ---------------------------------------------------------------- order independence

/// Put/delete events with distinct (key, seq), as one source would emit them.
#[derive(Debug, Clone)]
struct Event {
    id: String,
    key: &'static str,
    seq: u64,
    value: Option<&'static str>,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec((0..3usize, prop::option::weighted(0.7, 0..3usize)), 1..14).prop_flat_map(
        |specs| {
            let n = specs.len();
            (
                Just(specs),
                Just((1..=n as u64).collect::<Vec<_>>()).prop_shuffle(),
            )
                .prop_map(|(specs, seqs)| {
                    specs
                        .into_iter()
                        .zip(seqs)
                        .enumerate()
                        .map(|(i, ((key, value), seq))| Event {
                            id: format!("e{i}"),
                            key: KEYS[key],
                            seq,
                            value: value.map(|v| VALUES[v]),
                        })
                        .collect()
                })
        },
    )
}

/// One arrangement: delivery order (each event at least once), batch sizes, and
/// the batch after which to reopen.
fn arrangement(n: usize) -> impl Strategy<Value = (Vec<usize>, Vec<usize>, usize)> {
    (
        prop::collection::vec(0..n, 0..2 * n)
            .prop_map(move |extra| (0..n).chain(extra).collect::<Vec<_>>())
            .prop_shuffle(),
        prop::collection::vec(1..6usize, 1..40),
        any::<usize>(),
    )
}

fn deliver(
    events: &[Event],
    (order, sizes, reopen_at): &(Vec<usize>, Vec<usize>, usize),
    tag: &str,
) -> (Digest, Vec<(Bytes, Record)>) {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().durability(Durability::Buffered);
    let mut store = open(dir.path(), options.clone());
    let mut batches = Vec::new();
    let mut rest = &order[..];
    let mut sizes = sizes.iter().cycle();
    while !rest.is_empty() {
        let size = (*sizes.next().expect("cycle")).min(rest.len());
        let (now, later) = rest.split_at(size);
        let mut batch = Batch::new(format!("{tag}{}", batches.len()));
        for &i in now {
            let e = &events[i];
            batch = match e.value {
                Some(v) => batch.put(&e.id, e.key, e.seq, v),
                None => batch.delete(&e.id, e.key, e.seq),
            };
        }
        batches.push(batch);
        rest = later;
    }
    let reopen_at = reopen_at % batches.len();
    let mut total = BatchReport::default();
    for (i, batch) in batches.iter().enumerate() {
        let report = store.apply_batch(batch).expect("put/delete batches commit");
        assert_eq!(report.deliveries(), batch.len() as u64);
        total.accumulate(&report);
        if i == reopen_at {
            drop(store);
            store = open(dir.path(), options.clone());
        }
    }
    let n = events.len() as u64;
    assert_eq!(
        total.duplicates,
        order.len() as u64 - n,
        "every delivery after an event's first is a duplicate"
    );
    assert_eq!(
        total.inserted + total.updated + total.unchanged + total.stale + total.deleted,
        n
    );
    assert_eq!((total.added, total.rejected), (0, 0));
    (store.digest().expect("digest"), store_rows(&store))
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn put_delete_order_and_repetition_do_not_matter(
        (events, first, second) in events().prop_flat_map(|events| {
            let n = events.len();
            (Just(events), arrangement(n), arrangement(n))
        })
    ) {
        let (digest_a, rows_a) = deliver(&events, &first, "a");
        let (digest_b, rows_b) = deliver(&events, &second, "b");
        // The expected rows: per key, the event with the largest seq, if it is a put.
        let mut newest: BTreeMap<&str, &Event> = BTreeMap::new();
        for e in &events {
            if newest.get(e.key).is_none_or(|n| n.seq < e.seq) {
                newest.insert(e.key, e);
            }
        }
        let expected: Vec<(Bytes, Record)> = newest
            .values()
            .filter_map(|e| {
                e.value.map(|v| {
                    (Bytes::from_static(e.key.as_bytes()), Record { seq: e.seq, value: Bytes::from_static(v.as_bytes()) })
                })
            })
            .collect();
        prop_assert_eq!(&rows_a, &expected);
        prop_assert_eq!(&rows_b, &expected);
        prop_assert_eq!(digest_a, digest_b);
    }
}
