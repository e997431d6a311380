//! Expiry meets maintenance, crashes and seen-index merges (SPEC section 3,
//! "Expiry never re-applies"): a store that compacts, snapshots, closes,
//! loses power and reopens under the same TTLs decides every batch exactly
//! as a twin that never does; under TTLs that change at each reopen, no
//! `Add` applies twice and no live row's seq goes back. Batches of 4,200
//! ids make the seen index merge (and drop expired ids) between them.
#![cfg(feature = "testing")]

use std::sync::Arc;
use std::time::Duration;

use idemkv::storage::{CrashPolicy, FaultyStorage};
use idemkv::{Batch, Durability, ManualClock, OnConflict, Options, Store};

const T0_MS: u64 = 1_700_000_000_000;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn event(b: Batch, n: u64) -> Batch {
    match n % 6 {
        5 => b.add(
            format!("e{n}"),
            format!("c{}", (n / 6) % 3),
            n,
            1i64 << (2 * (n / 18)),
        ),
        4 => b.delete(format!("e{n}"), format!("k{}", n % 3), n),
        _ => b.put(
            format!("e{n}"),
            format!("k{}", n % 3),
            n,
            format!("v{}", n / 6),
        ),
    }
}

#[derive(Clone, Copy, Debug)]
struct Ttls {
    seen_ms: u64,
    batch_ms: u64,
    tomb_ms: u64,
}

fn ttls(seen_ms: u64, batch_ms: u64, tomb_ms: u64) -> Ttls {
    Ttls {
        seen_ms,
        batch_ms,
        tomb_ms,
    }
}

fn options(
    storage: &FaultyStorage,
    clock: &ManualClock,
    t: Ttls,
    durability: Durability,
) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .clock(Arc::new(clock.clone()))
        .durability(durability)
        .on_conflict(OnConflict::Quarantine)
        .seen_ttl(Some(Duration::from_millis(t.seen_ms)))
        .batch_ttl(Some(Duration::from_millis(t.batch_ms)))
        .tombstone_ttl(Some(Duration::from_millis(t.tomb_ms)))
        .snapshot_log_bytes(Some(4096))
        .segment_bytes_max(16 << 10)
        .zero_fill(false)
}

fn run(seed: u64, t: Ttls, durability: Durability, steps: usize) {
    let clock = ManualClock::new(T0_MS);
    let mut sa = FaultyStorage::new();
    let sb = FaultyStorage::new();
    let mut a = Store::open("/db", options(&sa, &clock, t, durability)).unwrap();
    let b = Store::open("/db", options(&sb, &clock, t, durability)).unwrap();
    let mut rng = Lcg(seed);
    let mut batches: Vec<Batch> = Vec::new();
    let mut cursor = 6u64;
    let mut trace = Vec::new();
    for i in 0..steps {
        let r = rng.below(100);
        if r < 55 {
            let batch = if !batches.is_empty() && rng.below(6) == 0 {
                let j = rng.below(batches.len() as u64) as usize;
                batches[j].clone()
            } else {
                let mut batch = Batch::new(format!("B{i}")).checkpoint("src", format!("{i}"));
                for _ in 0..(1 + rng.below(4)) {
                    let n = if rng.below(5) == 0 {
                        rng.below(cursor + 1)
                    } else {
                        cursor.saturating_sub(8) + rng.below(11)
                    };
                    batch = event(batch, n);
                }
                cursor += rng.below(4);
                batches.push(batch.clone());
                batch
            };
            let ra = format!("{:?}", a.apply_batch(&batch));
            let rb = format!("{:?}", b.apply_batch(&batch));
            trace.push(format!("apply {:?}", String::from_utf8_lossy(batch.id())));
            assert_eq!(
                ra, rb,
                "seed {seed} step {i}: batch {:?}\n{trace:#?}",
                batch
            );
        } else if r < 57 {
            let mut big = Batch::new(format!("big{i}"));
            for j in 0..4200u64 {
                big = big.put(
                    format!("m{i}-{j}"),
                    format!("m{}", j % 7),
                    (i as u64) << 20 | j,
                    "x",
                );
            }
            let ra = format!("{:?}", a.apply_batch(&big));
            let rb = format!("{:?}", b.apply_batch(&big));
            trace.push("big".into());
            assert!(ra.starts_with("Ok"), "{ra}");
            assert_eq!(ra, rb, "seed {seed} step {i}: big");
        } else if r < 80 {
            let ms = rng.below(1300);
            clock.advance(Duration::from_millis(ms));
            trace.push(format!("advance {ms}"));
        } else if r < 85 {
            a.compact().unwrap();
            trace.push("compact".into());
        } else if r < 89 {
            a.snapshot().unwrap();
            trace.push("snapshot".into());
        } else if r < 94 {
            a.close().unwrap();
            a = Store::open("/db", options(&sa, &clock, t, durability)).unwrap();
            trace.push("reopen".into());
        } else {
            let policy = if durability == Durability::Sync {
                CrashPolicy::PowerLoss
            } else {
                CrashPolicy::ProcessCrash
            };
            if durability == Durability::Sync && rng.below(2) == 0 {
                // Power fails part way through a compaction (or a snapshot).
                let at = sa.op_count() + rng.below(40);
                sa.crash_at(at);
                let _ = if rng.below(3) == 0 {
                    a.snapshot()
                } else {
                    a.compact().map(drop)
                };
                trace.push(format!("crash during maintenance at op {at}"));
            }
            let image = sa.crash_image(policy);
            drop(a);
            sa = image;
            a = Store::open("/db", options(&sa, &clock, t, durability)).unwrap();
            trace.push("crash".into());
        }
        assert_eq!(
            a.digest().unwrap(),
            b.digest().unwrap(),
            "seed {seed} step {i}\n{trace:#?}"
        );
    }
    for c in 0..3 {
        if let Some(rec) = b.get(format!("c{c}")).unwrap() {
            let v: i64 = std::str::from_utf8(&rec.value).unwrap().parse().unwrap();
            assert_eq!(
                v & 0x5555_5555_5555_5555_i64,
                v,
                "seed {seed}: an add applied twice on c{c}: {v:b}"
            );
        }
    }
    assert_eq!(a.quarantine(), b.quarantine(), "seed {seed}");
    assert_eq!(a.checkpoints(), b.checkpoints(), "seed {seed}");
}

#[test]
fn a_store_that_crashes_and_compacts_decides_as_its_twin_when_ids_outlive_batches() {
    for seed in 1..=16 {
        let t = ttls(3000, 2000, 1500);
        run(seed, t, Durability::Sync, 300);
    }
}

#[test]
fn a_store_that_crashes_and_compacts_decides_as_its_twin_when_batches_outlive_ids() {
    for seed in 1011..=1026 {
        let t = ttls(2000, 5000, 2500);
        run(seed, t, Durability::Sync, 300);
    }
}

#[test]
fn a_buffered_store_that_crashes_and_compacts_decides_as_its_twin_under_subsecond_ttls() {
    for seed in 2021..=2032 {
        let t = ttls(700, 400, 300);
        run(seed, t, Durability::Buffered, 300);
    }
}

/// TTLs that change at each reopen (seen/batch among short, long, none;
/// tombstones never expire): no add applies twice and no live row's seq
/// ever goes back.
fn run_changing(seed: u64, durability: Durability, steps: usize) {
    let clock = ManualClock::new(T0_MS);
    let mut sa = FaultyStorage::new();
    let choices = [Some(700u64), Some(3000), Some(20_000), None];
    let opts = |s: &FaultyStorage, seen: Option<u64>, batch: Option<u64>| {
        Options::default()
            .storage(Arc::new(s.clone()))
            .clock(Arc::new(clock.clone()))
            .durability(durability)
            .on_conflict(OnConflict::Quarantine)
            .seen_ttl(seen.map(Duration::from_millis))
            .batch_ttl(batch.map(Duration::from_millis))
            .tombstone_ttl(None)
            .snapshot_log_bytes(Some(4096))
            .zero_fill(false)
    };
    let mut a = Store::open("/db", opts(&sa, Some(700), Some(700))).unwrap();
    let mut rng = Lcg(seed);
    let mut batches: Vec<Batch> = Vec::new();
    let mut cursor = 6u64;
    let mut last_seq = [0u64; 3];
    let mut trace = Vec::new();
    for i in 0..steps {
        let r = rng.below(100);
        if r < 55 {
            let batch = if !batches.is_empty() && rng.below(6) == 0 {
                let j = rng.below(batches.len() as u64) as usize;
                batches[j].clone()
            } else {
                let mut batch = Batch::new(format!("B{i}"));
                for _ in 0..(1 + rng.below(4)) {
                    let n = if rng.below(5) == 0 {
                        rng.below(cursor + 1)
                    } else {
                        cursor.saturating_sub(8) + rng.below(11)
                    };
                    batch = event(batch, n);
                }
                cursor += rng.below(4);
                batches.push(batch.clone());
                batch
            };
            let _ = a.apply_batch(&batch);
            trace.push(format!("apply {:?}", String::from_utf8_lossy(batch.id())));
        } else if r < 57 {
            let mut big = Batch::new(format!("big{i}"));
            for j in 0..4200u64 {
                big = big.put(
                    format!("m{i}-{j}"),
                    format!("m{}", j % 7),
                    (i as u64) << 20 | j,
                    "x",
                );
            }
            a.apply_batch(&big).unwrap();
            trace.push("big".into());
        } else if r < 80 {
            let ms = rng.below(4000);
            clock.advance(Duration::from_millis(ms));
            trace.push(format!("advance {ms}"));
        } else if r < 85 {
            a.compact().unwrap();
            trace.push("compact".into());
        } else if r < 89 {
            a.snapshot().unwrap();
            trace.push("snapshot".into());
        } else {
            let seen = choices[rng.below(4) as usize];
            let batch = choices[rng.below(4) as usize];
            if r < 94 {
                a.close().unwrap();
            } else {
                let policy = if durability == Durability::Sync {
                    CrashPolicy::PowerLoss
                } else {
                    CrashPolicy::ProcessCrash
                };
                let image = sa.crash_image(policy);
                drop(a);
                sa = image;
            }
            a = Store::open("/db", opts(&sa, seen, batch)).unwrap();
            trace.push(format!("reopen seen {seen:?} batch {batch:?}"));
        }
        for c in 0..3 {
            if let Some(rec) = a.get(format!("c{c}")).unwrap() {
                let v: i64 = std::str::from_utf8(&rec.value).unwrap().parse().unwrap();
                assert_eq!(
                    v & 0x5555_5555_5555_5555_i64,
                    v,
                    "seed {seed} step {i}: an add applied twice on c{c}: {v:b}\n{trace:#?}"
                );
            }
        }
        for (k, last) in last_seq.iter_mut().enumerate() {
            if let Some(rec) = a.get(format!("k{k}")).unwrap() {
                assert!(
                    rec.seq >= *last,
                    "seed {seed} step {i}: k{k} went back from {last} to {}\n{trace:#?}",
                    rec.seq
                );
                *last = rec.seq;
            }
        }
    }
}

#[test]
fn ttls_that_change_at_every_reopen_apply_no_add_twice_under_sync() {
    for seed in 3001..=3020 {
        run_changing(seed, Durability::Sync, 300);
    }
}

#[test]
fn ttls_that_change_at_every_reopen_apply_no_add_twice_when_buffered() {
    for seed in 4001..=4020 {
        run_changing(seed, Durability::Buffered, 300);
    }
}

#[test]
fn a_store_that_crashes_and_compacts_decides_as_its_twin_at_zero_and_whole_second_ttls() {
    for (k, t) in [ttls(0, 0, 0), ttls(1000, 1000, 1000), ttls(1, 1999, 1001)]
        .into_iter()
        .enumerate()
    {
        for seed in 0..8u64 {
            run(5000 + 100 * k as u64 + seed, t, Durability::Sync, 250);
        }
    }
}
