//! Plans a batch: classifies each delivery in order against the committed
//! state plus the batch's own earlier deliveries, and collects the one
//! record's worth of changes (SPEC section 3).
//!
//! Order of decisions for one delivery:
//!
//! | step | check                                            | outcome               |
//! |------|--------------------------------------------------|-----------------------|
//! | 1    | static problem (malformed, empty/oversized id or key) | invalid          |
//! | 2    | event id seen, same payload                      | duplicate             |
//! | 3    | event id seen, other payload                     | conflict              |
//! | 3b   | `Put` value over `value_bytes_max`               | invalid               |
//! | 4    | `Add` with seq <= the key's add floor            | rejected `too_late`   |
//! | 5    | `Add` on a live non-counter value, or overflow   | invalid               |
//! | 6    | `Add`                                            | added                 |
//! | 7    | `Put`/`Delete` with seq <= key's version         | stale                 |
//! | 8    | `Delete`                                         | deleted               |
//! | 9    | `Put`: no live row / same bytes / other bytes    | inserted / unchanged / updated |
//!
//! Invalid and conflicting deliveries fail the batch under `OnConflict::Fail`
//! and are quarantined (`rejected`) under `OnConflict::Quarantine`. A
//! `too_late` delta is always quarantined: it is not an error of the batch,
//! and failing would stop the pipeline on every later retry.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};

use bytes::Bytes;

use super::StateView;
use super::classify::{DeliveryHash, static_problem, value_problem};
use crate::batch::{Batch, BatchReport, Op};
use crate::error::{Error, Result, display_id};
use crate::format::record::{CounterText, ValueSource, WriteSource, parse_counter};
use crate::hashing::{BytesMap, IdMap};
use crate::index::PREFETCH_AHEAD;
use crate::index::keys::{KeyHash, KeyIndex};
use crate::log::segments::ValueRef;
use crate::options::OnConflict;

/// One key's new state after the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlannedWrite<'b> {
    pub key: &'b [u8],
    pub seq: u64,
    pub op: WriteSource<'b>,
}

/// One quarantined delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedReject<'b> {
    pub index: u64,
    pub event_id: &'b [u8],
    pub reason: String,
}

/// Everything one batch commits.
#[derive(Debug, Default)]
pub(crate) struct Plan<'b> {
    pub report: BatchReport,
    /// Event ids first seen in this batch, with their payload hashes.
    pub seen: Vec<(u128, u64)>,
    /// One entry per changed key, in the order keys were first changed.
    pub writes: Vec<PlannedWrite<'b>>,
    pub rejects: Vec<PlannedReject<'b>>,
    /// Counter keys that applied `Add`s, with the largest `Add` seq per key.
    pub adds: Vec<(&'b [u8], u64)>,
    /// Key index bytes the keys this batch writes first take
    /// (`KeyIndex::record_bytes`): keys the view does not know, which
    /// includes those whose tombstone expired but is still held.
    pub new_key_bytes: u64,
}

/// Limits and policy the planner needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanOptions {
    pub on_conflict: OnConflict,
    pub value_bytes_max: usize,
}

/// A key's value as the planner sees it: committed, or written earlier in this batch.
#[derive(Debug, Clone, Copy)]
enum Value<'b> {
    Stored(ValueRef),
    Planned(ValueSource<'b>),
}

/// A key's state as the planner sees it.
#[derive(Debug, Clone, Copy)]
struct Current<'b> {
    /// The key's version: its live row's or tombstone's seq; `None` if the key is unknown.
    version: Option<u64>,
    live: Option<Value<'b>>,
}

/// A delivery's key with its hash (`StateView::key_hash`), computed once
/// for the key's lookup, its prefetches and the map of touched keys.
#[derive(Debug, Clone, Copy)]
struct HashedKey<'b> {
    key: &'b [u8],
    hash: KeyHash,
}

impl PartialEq for HashedKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for HashedKey<'_> {}

/// Equal keys have equal hashes; the map's hasher (`IdMap`) takes the
/// hash as it is.
impl Hash for HashedKey<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.hash.hash(state);
    }
}

enum Refusal {
    Invalid(Cow<'static, str>),
    Conflict,
    TooLate,
}

struct Planner<'b, 'v, V: StateView> {
    view: &'v V,
    plan: Plan<'b>,
    /// Key -> index in `plan.writes`.
    touched: IdMap<HashedKey<'b>, usize>,
    /// Event ids first seen in this batch -> payload hash.
    seen_here: IdMap<u128, u64>,
    /// Counter key -> index in `plan.adds`.
    added: BytesMap<&'b [u8], usize>,
}

impl<'b, V: StateView> Planner<'b, '_, V> {
    fn current(&self, key: HashedKey<'b>) -> Current<'b> {
        if let Some(w) = self
            .touched
            .get(&key)
            .and_then(|&i| self.plan.writes.get(i))
        {
            let live = match w.op {
                WriteSource::Put(v) => Some(Value::Planned(v)),
                WriteSource::Delete => None,
                // A bump is only planned for a key whose committed row is live.
                WriteSource::Bump => self
                    .view
                    .key(key.key, key.hash)
                    .and_then(|e| e.value())
                    .map(Value::Stored),
            };
            return Current {
                version: Some(w.seq),
                live,
            };
        }
        match self.view.key(key.key, key.hash) {
            Some(e) => Current {
                version: Some(e.seq),
                live: e.value().map(Value::Stored),
            },
            None => Current {
                version: None,
                live: None,
            },
        }
    }

    fn value_bytes(&self, value: Value<'b>) -> Result<ValueBytes<'b>> {
        Ok(match value {
            Value::Stored(r) => ValueBytes::Owned(self.view.read_value(r)?),
            Value::Planned(ValueSource::Bytes(b) | ValueSource::BytesWithCrc(b, _)) => {
                ValueBytes::Borrowed(b)
            }
            Value::Planned(ValueSource::Counter(n)) => ValueBytes::Counter(CounterText::new(n)),
        })
    }

    /// The counter a current value holds, if it holds one. A stored value
    /// longer than any counter's text is not read: each `Add` to a key
    /// holding 64 MiB read and checked them all, under the writer lock.
    fn counter_value(&self, value: Value<'b>) -> Result<Option<i64>> {
        if let Value::Stored(r) = value
            && r.len as usize > CounterText::BYTES_MAX
        {
            return Ok(None);
        }
        Ok(parse_counter(self.value_bytes(value)?.as_bytes()))
    }

    fn write(&mut self, key: HashedKey<'b>, seq: u64, op: WriteSource<'b>) {
        let write = PlannedWrite {
            key: key.key,
            seq,
            op,
        };
        match self.touched.entry(key) {
            Entry::Occupied(at) => {
                let w = self
                    .plan
                    .writes
                    .get_mut(*at.get())
                    .expect("touched indexes point into writes");
                *w = write;
            }
            Entry::Vacant(at) => {
                at.insert(self.plan.writes.len());
                self.plan.writes.push(write);
            }
        }
    }

    /// Keeps a key's planned op but advances its seq (an unchanged put).
    fn bump(&mut self, key: HashedKey<'b>, seq: u64) {
        match self
            .touched
            .get(&key)
            .and_then(|&i| self.plan.writes.get_mut(i))
        {
            Some(w) => w.seq = seq,
            None => self.write(key, seq, WriteSource::Bump),
        }
    }

    /// Classifies one delivery that passed the static checks and is not a
    /// repeat of a seen id; records its effect.
    fn apply(&mut self, key: HashedKey<'b>, seq: u64, op: &'b Op) -> Result<Result<(), Refusal>> {
        let current = self.current(key);
        let report = &mut self.plan.report;
        let is_stale = current.version.is_some_and(|v| seq <= v);
        match op {
            Op::Add(delta) => {
                if self
                    .view
                    .add_floor(key.key)
                    .is_some_and(|floor| seq <= floor)
                {
                    return Ok(Err(Refusal::TooLate));
                }
                let base = match current.live {
                    None => 0,
                    Some(v) => match self.counter_value(v)? {
                        Some(n) => n,
                        None => {
                            return Ok(Err(Refusal::Invalid(
                                "delta on a non-counter value".into(),
                            )));
                        }
                    },
                };
                let Some(sum) = base.checked_add(*delta) else {
                    return Ok(Err(Refusal::Invalid("counter overflow".into())));
                };
                self.plan.report.added += 1;
                match self
                    .added
                    .get(key.key)
                    .and_then(|&i| self.plan.adds.get_mut(i))
                {
                    Some(mark) => mark.1 = mark.1.max(seq),
                    None => {
                        self.added.insert(key.key, self.plan.adds.len());
                        self.plan.adds.push((key.key, seq));
                    }
                }
                let version = current.version.map_or(seq, |v| v.max(seq));
                self.write(key, version, WriteSource::Put(ValueSource::Counter(sum)));
            }
            _ if is_stale => report.stale += 1,
            Op::Delete => {
                report.deleted += 1;
                self.write(key, seq, WriteSource::Delete);
            }
            Op::Put(value) => match current.live {
                None => {
                    report.inserted += 1;
                    self.write(key, seq, WriteSource::Put(ValueSource::Bytes(value)));
                }
                Some(v) => {
                    // A stored value of the same length is compared by CRC
                    // first; the encoder reuses that CRC if the bytes differ.
                    let (is_same, source) = match v {
                        Value::Stored(stored) if stored.len as usize == value.len() => {
                            let crc = crc32fast::hash(value);
                            let is_same = self.view.value_equals(stored, value, crc)?;
                            (is_same, ValueSource::BytesWithCrc(value, crc))
                        }
                        Value::Stored(_) => (false, ValueSource::Bytes(value)),
                        Value::Planned(_) => (
                            self.value_bytes(v)?.as_bytes() == &value[..],
                            ValueSource::Bytes(value),
                        ),
                    };
                    if is_same {
                        self.plan.report.unchanged += 1;
                        self.bump(key, seq);
                    } else {
                        self.plan.report.updated += 1;
                        self.write(key, seq, WriteSource::Put(source));
                    }
                }
            },
            Op::Malformed { .. } => unreachable!("malformed deliveries fail the static checks"),
        }
        // Every outcome that gets here wrote the key; one the view and the
        // batch did not know is new to the key index.
        if current.version.is_none() {
            self.plan.new_key_bytes += KeyIndex::record_bytes(key.key.len());
        }
        Ok(Ok(()))
    }
}

/// Bytes of a current value, however it is held.
enum ValueBytes<'b> {
    Owned(Bytes),
    Borrowed(&'b [u8]),
    Counter(CounterText),
}

impl ValueBytes<'_> {
    fn as_bytes(&self) -> &[u8] {
        match self {
            ValueBytes::Owned(b) => b,
            ValueBytes::Borrowed(b) => b,
            ValueBytes::Counter(c) => c.as_bytes(),
        }
    }
}

/// Plans `batch` against `view`. `hashes` are the deliveries' hashes, in order.
///
/// # Errors
/// `ConflictingEvent` or `InvalidEvent` for the first refused delivery under
/// `OnConflict::Fail`; `Corruption` or `Io` if a stored value cannot be read.
pub(crate) fn plan<'b, V: StateView>(
    batch: &'b Batch,
    hashes: &[DeliveryHash],
    view: &V,
    options: PlanOptions,
) -> Result<Plan<'b>> {
    assert_eq!(hashes.len(), batch.len(), "one hash per delivery");
    let mut p = Planner {
        view,
        // Sized for the batch up front: grown by doubling, these two were
        // reallocated and copied about nine times a batch (2% of W1's
        // instructions inside `apply_batch`).
        plan: Plan {
            seen: Vec::with_capacity(batch.len()),
            writes: Vec::with_capacity(batch.len()),
            ..Plan::default()
        },
        touched: IdMap::with_capacity_and_hasher(batch.len(), Default::default()),
        seen_here: IdMap::with_capacity_and_hasher(batch.len(), Default::default()),
        added: BytesMap::default(),
    };
    let key_hashes: Vec<KeyHash> = batch
        .deliveries()
        .iter()
        .map(|d| view.key_hash(&d.key))
        .collect();
    let deliveries = batch.deliveries().iter().zip(hashes).zip(&key_hashes);
    for (index, ((d, h), &key_hash)) in deliveries.enumerate() {
        // Index lookups miss the cache: ask for a later delivery's lines now.
        if let Some(ahead) = hashes.get(index + PREFETCH_AHEAD) {
            view.prefetch_seen(ahead.id);
        }
        // A key lookup reads the table, then the record it points to.
        if let Some(&ahead) = key_hashes.get(index + PREFETCH_AHEAD) {
            view.prefetch_key(ahead);
        }
        if let Some(&ahead) = key_hashes.get(index + PREFETCH_AHEAD / 2) {
            view.prefetch_key_entry(ahead);
        }
        let outcome = if let Some(problem) = static_problem(d) {
            Err(Refusal::Invalid(problem))
        } else {
            match p.seen_here.get(&h.id).copied().or_else(|| view.seen(h.id)) {
                Some(payload) if payload == h.payload => {
                    p.plan.report.duplicates += 1;
                    continue;
                }
                Some(_) => Err(Refusal::Conflict),
                None => match value_problem(d, options.value_bytes_max) {
                    Some(problem) => Err(Refusal::Invalid(problem.into())),
                    None => {
                        let key = HashedKey {
                            key: &d.key,
                            hash: key_hash,
                        };
                        p.apply(key, d.seq, &d.op)?
                    }
                },
            }
        };
        match outcome {
            Ok(()) => {
                p.seen_here.insert(h.id, h.payload);
                p.plan.seen.push((h.id, h.payload));
            }
            Err(refusal) => {
                let reason = match (&refusal, options.on_conflict) {
                    (Refusal::Conflict, OnConflict::Fail) => {
                        return Err(Error::ConflictingEvent {
                            batch_id: display_id(batch.id()),
                            index,
                            event_id: display_id(&d.event_id),
                        });
                    }
                    (Refusal::Invalid(reason), OnConflict::Fail) => {
                        return Err(Error::InvalidEvent {
                            batch_id: display_id(batch.id()),
                            index,
                            event_id: display_id(&d.event_id),
                            reason: reason.to_string(),
                        });
                    }
                    (Refusal::TooLate, _) => "too_late".to_owned(),
                    (Refusal::Conflict, OnConflict::Quarantine) => "conflicting_event".to_owned(),
                    (Refusal::Invalid(reason), OnConflict::Quarantine) => {
                        format!("invalid: {reason}")
                    }
                };
                p.plan.report.rejected += 1;
                p.plan.rejects.push(PlannedReject {
                    index: index as u64,
                    event_id: &d.event_id,
                    reason,
                });
            }
        }
    }
    debug_assert_eq!(
        p.plan.report.deliveries(),
        batch.len() as u64,
        "every delivery counted once"
    );
    Ok(p.plan)
}
