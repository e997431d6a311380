//! Maintenance never changes a decision: a store that is compacted,
//! snapshotted, closed or dropped and reopened between its batches answers
//! every batch exactly as a twin store given the same batches at the same
//! clock times and nothing else: the same reports and errors, rows,
//! checkpoints, quarantine and digest after every step. Short TTLs of all
//! three kinds, both durabilities and both conflict policies, so that
//! expiry, replays, conflicts and purges all meet the maintenance.

use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, Durability, ManualClock, OnConflict, Options, Store};
use proptest::prelude::*;

/// One delivery of a batch, drawn small so that ids, keys and seqs repeat.
#[derive(Debug, Clone)]
struct Delivery {
    event: u64,
    key: u64,
    seq: u64,
    /// Most deliveries derive key and seq from the event (so redeliveries
    /// carry the same payload); some do not, and conflict.
    is_consistent: bool,
    op: u8,
}

#[derive(Debug, Clone)]
enum Step {
    Apply {
        deliveries: Vec<Delivery>,
        checkpoint: Option<u8>,
        /// Adds 40 puts of 1,000 bytes: records that rotate segments and
        /// take a lone writer's early path under `Sync`.
        is_large: bool,
    },
    /// An earlier batch again, same id and content.
    Redeliver(usize),
    Advance(u64),
    Compact,
    Snapshot,
    Reopen {
        close_first: bool,
    },
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        0..60u64,
        0..6u64,
        0..12u64,
        prop::bool::weighted(0.85),
        0..20u8,
    )
        .prop_map(|(event, key, seq, is_consistent, op)| Delivery {
            event,
            key,
            seq,
            is_consistent,
            op,
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (prop::collection::vec(delivery(), 0..6), prop::option::of(0..2u8), prop::bool::weighted(0.1))
            .prop_map(|(deliveries, checkpoint, is_large)| Step::Apply { deliveries, checkpoint, is_large }),
        2 => (0..200usize).prop_map(Step::Redeliver),
        2 => (0..1500u64).prop_map(Step::Advance),
        1 => Just(Step::Compact),
        1 => Just(Step::Snapshot),
        1 => any::<bool>().prop_map(|close_first| Step::Reopen { close_first }),
    ]
}

fn batch(id: usize, deliveries: &[Delivery], checkpoint: Option<u8>, is_large: bool) -> Batch {
    let mut b = Batch::new(format!("B{id}"));
    for d in deliveries {
        let event = format!("e{}", d.event);
        let (key, seq) = if d.is_consistent {
            (format!("k{}", d.event % 6), d.event / 5)
        } else {
            (format!("k{}", d.key), d.seq)
        };
        let counter = if d.event % 2 == 0 { "c0" } else { "c1" };
        b = match (d.event % 7, d.op) {
            // A put on a counter key: later deltas on it are invalid.
            (_, 0) => b.put(event, "c0", seq, format!("{}", d.seq % 5)),
            (0 | 1, _) => b.add(event, counter, d.event / 3, d.event as i64),
            (2, _) => b.delete(event, key, seq),
            (3, _) => b.put(event, key, seq, ""),
            _ => b.put(event, key, seq, format!("v{}", d.event % 3)),
        };
    }
    if let Some(source) = checkpoint {
        b = b.checkpoint(format!("s{source}"), (id as u64).to_be_bytes());
    }
    if is_large {
        for j in 0..40 {
            b = b.put(
                format!("L{id}-{j}"),
                format!("big{j}"),
                id as u64,
                "z".repeat(1000),
            );
        }
    }
    b
}

/// Options drawn once per case, the same for both stores and every open.
fn options(clock: &ManualClock, choice: u8) -> Options {
    let ms = |ms: u64| Some(Duration::from_millis(ms));
    let c = u64::from(choice);
    let mut options = Options::default()
        .durability(if c % 2 == 0 {
            Durability::Buffered
        } else {
            Durability::Sync
        })
        .clock(Arc::new(clock.clone()))
        .seen_ttl(ms(1500 + 500 * (c % 3)))
        .batch_ttl(ms(1000 + 700 * (c % 4)))
        .segment_bytes_max(4096 + 4096 * (c % 3))
        .snapshot_log_bytes(Some(8192));
    if c % 5 != 0 {
        options = options.tombstone_ttl(ms(800 + 900 * (c % 2)));
    }
    if c % 3 == 0 {
        options = options.on_conflict(OnConflict::Quarantine);
    }
    options
}

/// Everything a reader can see, as text.
fn observe(store: &Store) -> String {
    let mut out = String::new();
    for row in store.scan_prefix(b"") {
        let (key, record) = row.unwrap();
        out += &format!(
            "{:?}={:?}@{};",
            key,
            String::from_utf8_lossy(&record.value),
            record.seq
        );
    }
    out += &format!("{:?} {:?}", store.checkpoints(), store.quarantine());
    out
}

fn run(choice: u8, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let (dir, twin_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(1_700_000_000_000);
    let mut store = Some(Store::open(dir.path(), options(&clock, choice)).unwrap());
    let twin = Store::open(twin_dir.path(), options(&clock, choice)).unwrap();
    let mut batches: Vec<Batch> = Vec::new();
    for (i, step) in steps.into_iter().enumerate() {
        let s = store.as_ref().expect("open");
        let delivered = match step {
            Step::Apply {
                deliveries,
                checkpoint,
                is_large,
            } => {
                batches.push(batch(batches.len(), &deliveries, checkpoint, is_large));
                batches.last()
            }
            Step::Redeliver(n) => batches.get(n % batches.len().max(1)),
            Step::Advance(ms) => {
                clock.advance(Duration::from_millis(ms));
                None
            }
            Step::Compact => {
                s.compact().unwrap();
                None
            }
            Step::Snapshot => {
                s.snapshot().unwrap();
                None
            }
            Step::Reopen { close_first } => {
                let s = store.take().expect("open");
                if close_first {
                    s.close().unwrap();
                } else {
                    drop(s);
                }
                store = Some(Store::open(dir.path(), options(&clock, choice)).unwrap());
                None
            }
        };
        let s = store.as_ref().expect("open");
        if let Some(b) = delivered {
            let (report, twin_report) = (s.apply_batch(b), twin.apply_batch(b));
            prop_assert_eq!(
                format!("{report:?}"),
                format!("{twin_report:?}"),
                "batch at step {}",
                i
            );
        }
        prop_assert_eq!(observe(s), observe(&twin), "after step {}", i);
        prop_assert_eq!(
            s.digest().unwrap(),
            twin.digest().unwrap(),
            "after step {}",
            i
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn maintenance_never_changes_a_decision(choice in any::<u8>(), steps in prop::collection::vec(step(), 1..150)) {
        run(choice, steps)?;
    }
}
