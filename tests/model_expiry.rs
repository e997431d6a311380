//! Model test with time: random histories of batches, clock advances,
//! compactions and reopens, with short TTLs that a reopen may lengthen,
//! shorten or turn off. Expiry may change how a late redelivery is counted,
//! never the state it leads to, and no `Add` ever applies twice (SPEC
//! section 3, "Expiry never re-applies").
//!
//! The reference is deliberately simple: puts and deletes are gated by
//! version alone (the tombstone TTL is off), so the live rows are the newest
//! version of each key; a counter is the sum of the deltas whose delivery
//! the store reported `added`, and no event id may be reported `added` twice.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, Durability, ManualClock, Options, Store};
use proptest::prelude::*;

const TTL_SECS: u64 = 10;
const KEYS: u64 = 4;
const EVENTS: u64 = 24;

#[derive(Debug, Clone)]
enum Step {
    /// Deliveries of event numbers (repeats are redeliveries), and at most one delta event.
    Apply {
        events: Vec<u64>,
        delta: Option<u64>,
    },
    /// The same batch id as an earlier step, with the same content.
    Replay {
        step: usize,
    },
    Advance {
        secs: u64,
    },
    Compact,
    /// Reopens with this seen and batch TTL, in seconds (`None`: never).
    Reopen {
        ttl_secs: Option<u64>,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (prop::collection::vec(0..EVENTS, 0..6), prop::option::of(0..EVENTS))
            .prop_map(|(events, delta)| Step::Apply { events, delta }),
        1 => (0usize..40).prop_map(|step| Step::Replay { step }),
        3 => (1..2 * TTL_SECS).prop_map(|secs| Step::Advance { secs }),
        1 => Just(Step::Compact),
        1 => prop::option::weighted(0.8, prop::sample::select(vec![TTL_SECS / 2, TTL_SECS, 10 * TTL_SECS]))
            .prop_map(|ttl_secs| Step::Reopen { ttl_secs }),
    ]
}

/// Event `n`: a put (or, for every fifth, a delete) of key `n % KEYS` at seq `n`.
fn event(batch: Batch, n: u64) -> Batch {
    let key = format!("k{}", n % KEYS);
    if n % 5 == 4 {
        batch.delete(format!("e{n}"), key, n)
    } else {
        batch.put(format!("e{n}"), key, n, format!("v{n}"))
    }
}

/// Delta event `n`: adds `n + 1` to the counter, at seq `n`.
fn delta_event(batch: Batch, n: u64) -> Batch {
    batch.add(format!("a{n}"), "counter", n, (n + 1) as i64)
}

fn build(id: usize, events: &[u64], delta: Option<u64>) -> Batch {
    let mut batch = Batch::new(format!("B{id}"));
    for &n in events {
        batch = event(batch, n);
    }
    if let Some(n) = delta {
        batch = delta_event(batch, n);
    }
    batch
}

#[derive(Default)]
struct Reference {
    /// Newest version of each key: seq and value (`None`: deleted).
    keys: BTreeMap<String, (u64, Option<String>)>,
    added: HashSet<u64>,
    counter: i64,
}

impl Reference {
    fn apply(&mut self, events: &[u64]) {
        for &n in events {
            let key = format!("k{}", n % KEYS);
            let value = (n % 5 != 4).then(|| format!("v{n}"));
            match self.keys.get(&key) {
                Some((seq, _)) if *seq >= n => {}
                _ => {
                    self.keys.insert(key, (n, value));
                }
            }
        }
    }

    fn rows(&self) -> Vec<(String, u64, String)> {
        let mut rows: Vec<_> = self
            .keys
            .iter()
            .filter_map(|(k, (seq, v))| v.as_ref().map(|v| (k.clone(), *seq, v.clone())))
            .collect();
        if !self.added.is_empty() {
            let seq = self.added.iter().max().copied().unwrap_or(0);
            rows.insert(0, ("counter".to_owned(), seq, self.counter.to_string()));
        }
        rows
    }
}

fn rows(store: &Store) -> Vec<(String, u64, String)> {
    store
        .scan_prefix(b"")
        .map(|r| {
            let (k, rec) = r.expect("row");
            (
                String::from_utf8(k.to_vec()).unwrap(),
                rec.seq,
                String::from_utf8(rec.value.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let options = |ttl_secs: Option<u64>| {
        let ttl = ttl_secs.map(Duration::from_secs);
        Options::default()
            .durability(Durability::Buffered)
            .clock(Arc::new(clock.clone()))
            .seen_ttl(ttl)
            .batch_ttl(ttl)
            .segment_bytes_max(2048)
    };
    let mut store = Some(Store::open(dir.path(), options(Some(TTL_SECS))).unwrap());
    let mut reference = Reference::default();
    let mut applied: Vec<(Vec<u64>, Option<u64>)> = Vec::new();

    for (i, step) in steps.into_iter().enumerate() {
        let s = store.as_ref().expect("open");
        let (id, events, delta) = match step {
            Step::Apply { events, delta } => {
                applied.push((events.clone(), delta));
                (applied.len() - 1, events, delta)
            }
            Step::Replay { step } if !applied.is_empty() => {
                let id = step % applied.len();
                let (events, delta) = applied[id].clone();
                (id, events, delta)
            }
            Step::Replay { .. } => continue,
            Step::Advance { secs } => {
                clock.advance(Duration::from_secs(secs));
                continue;
            }
            Step::Compact => {
                let before = s.digest().unwrap();
                s.compact().unwrap();
                prop_assert_eq!(
                    s.digest().unwrap(),
                    before,
                    "compaction changed the state at step {}",
                    i
                );
                continue;
            }
            Step::Reopen { ttl_secs } => {
                let before = s.digest().unwrap();
                store.take().unwrap().close().unwrap();
                let reopened = Store::open(dir.path(), options(ttl_secs)).unwrap();
                prop_assert_eq!(
                    reopened.digest().unwrap(),
                    before,
                    "reopen changed the state at step {}",
                    i
                );
                store = Some(reopened);
                continue;
            }
        };
        let report = s.apply_batch(&build(id, &events, delta)).unwrap();
        prop_assert_eq!(
            report.deliveries(),
            (events.len() + usize::from(delta.is_some())) as u64
        );
        if !report.replayed {
            reference.apply(&events);
            if report.added == 1 {
                let n = delta.expect("a delta was delivered");
                prop_assert!(
                    reference.added.insert(n),
                    "delta a{} applied twice (step {})",
                    n,
                    i
                );
                reference.counter += (n + 1) as i64;
            }
        }
        prop_assert_eq!(rows(s), reference.rows(), "rows after step {}", i);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn expiry_changes_counts_never_state_and_deltas_apply_at_most_once(steps in prop::collection::vec(step(), 1..40)) {
        run(steps)?;
    }
}
