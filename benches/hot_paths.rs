//! Microbenchmarks of each hot path: record encoding, append + sync (and
//! the file system's fdatasync alone, appending or inside a preallocated
//! length), `apply_batch` by batch size and duplicate ratio, seen-index
//! lookup, `get`, replay on open, and compaction.
//!
//! `cargo bench --features testing --bench hot_paths` (add `-- <filter>` for one group).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idemkv::internals::{SeenIndex, encode_batch_record};
use idemkv::{Batch, Durability, Options, Store};
use xxhash_rust::xxh3::xxh3_128;

const VALUE: &str = r#"{"qty":2,"amount_cents":1998,"sku":"SKU-001234","note":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;

/// How many of a batch of `n` deliveries repeat events delivered before
/// event `first`: a `duplicate_pct` share, as far as there are any.
fn repeats(first: u64, n: u64, duplicate_pct: u64) -> u64 {
    (n * duplicate_pct / 100).min(first)
}

/// A batch of `n` puts over `keys` keys, when events `0..first` have been
/// delivered: its first `repeats(first, n, duplicate_pct)` deliveries repeat
/// the newest of those (duplicates), the rest are events `first..`.
fn batch(id: u64, first: u64, n: u64, keys: u64, duplicate_pct: u64) -> Batch {
    let repeated = repeats(first, n, duplicate_pct);
    let mut b = Batch::new(format!("B{id:08}"));
    for i in 0..n {
        let e = if i < repeated {
            first - repeated + i
        } else {
            first + i - repeated
        };
        b = b.put(format!("e{e:010}"), format!("O{:07}/1", e % keys), e, VALUE);
    }
    b
}

fn buffered() -> Options {
    Options::default().durability(Durability::Buffered)
}

fn encode(c: &mut Criterion) {
    let b = batch(1, 0, 1000, 200_000, 0);
    let mut buf = Vec::new();
    let mut g = c.benchmark_group("encode");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("record_1000_puts", |bench| {
        bench.iter(|| encode_batch_record(&mut buf, black_box(&b)))
    });
    g.finish();
}

fn append_sync(c: &mut Criterion) {
    let dir = tempfile::tempdir_in(".").unwrap();
    let store = Store::open(dir.path(), Options::default()).unwrap();
    let mut n = 0u64;
    let mut g = c.benchmark_group("append_sync");
    g.throughput(Throughput::Elements(10));
    g.bench_function("batch_of_10", |bench| {
        bench.iter(|| {
            n += 1;
            store
                .apply_batch(&batch(n, n * 10, 10, 1_000_000, 0))
                .unwrap()
        })
    });
    g.finish();
}

/// What a commit's fdatasync costs on this file system when the write
/// appends (the sync also writes the file's new size) and when it lands
/// inside a length set beforehand, 4 MiB at a time as the log writer does
/// (DESIGN.md, "Preallocated segments").
fn file_sync(c: &mut Criterion) {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let mut g = c.benchmark_group("file_sync");
    g.sample_size(30);
    for size in [1_300usize, 130_000] {
        let buf = vec![7u8; size];
        let dir = tempfile::tempdir_in(".").unwrap();
        let open = |name: &str| {
            std::fs::OpenOptions::new()
                .create_new(true)
                .write(true)
                .open(dir.path().join(name))
                .unwrap()
        };
        g.throughput(Throughput::Bytes(size as u64));
        let appended = open("appended");
        g.bench_function(BenchmarkId::new("append", size), |bench| {
            bench.iter(|| {
                (&appended).write_all(&buf).unwrap();
                appended.sync_data().unwrap();
            })
        });
        let extended = open("extended");
        let (mut at, mut len) = (0u64, 0u64);
        g.bench_function(BenchmarkId::new("inside_length", size), |bench| {
            bench.iter(|| {
                if at + size as u64 > len {
                    len += 4 << 20;
                    extended.set_len(len).unwrap();
                }
                extended.write_all_at(&buf, at).unwrap();
                at += size as u64;
                extended.sync_data().unwrap();
            })
        });
    }
    g.finish();
}

fn apply(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply_batch");
    for size in [10u64, 100, 1000] {
        for duplicate_pct in [0u64, 50, 90] {
            let dir = tempfile::tempdir_in(".").unwrap();
            let store = Store::open(dir.path(), buffered()).unwrap();
            let (mut id, mut first) = (0u64, 0u64);
            g.throughput(Throughput::Elements(size));
            g.bench_with_input(
                BenchmarkId::new(format!("size_{size}"), format!("dup_{duplicate_pct}")),
                &size,
                |bench, &size| {
                    bench.iter_batched(
                        || {
                            id += 1;
                            let repeated = repeats(first, size, duplicate_pct);
                            let b = batch(id, first, size, 200_000, duplicate_pct);
                            first += size - repeated;
                            (b, repeated)
                        },
                        |(b, repeated)| {
                            let report = store.apply_batch(&b).unwrap();
                            assert_eq!(report.duplicates, repeated, "the repeats are duplicates");
                        },
                        BatchSize::SmallInput,
                    )
                },
            );
        }
    }
    g.finish();
}

fn seen_lookup(c: &mut Criterion) {
    let mut seen = SeenIndex::new();
    for i in 0..1_000_000u64 {
        seen.insert(xxh3_128(&i.to_le_bytes()), i);
    }
    let mut g = c.benchmark_group("seen_lookup");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("hit_1000_of_1m", |bench| {
        bench.iter(|| {
            (0..1000u64)
                .filter(|i| seen.get(xxh3_128(&(i * 997).to_le_bytes())).is_some())
                .count()
        })
    });
    g.bench_function("miss_1000_of_1m", |bench| {
        bench.iter(|| {
            (0..1000u64)
                .filter(|i| seen.get(xxh3_128(&(i + 2_000_000).to_le_bytes())).is_some())
                .count()
        })
    });
    g.finish();
}

/// A store holding `batches` batches of 1000 puts over 100,000 keys.
fn filled(batches: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(".").unwrap();
    let store = Store::open(dir.path(), buffered()).unwrap();
    for id in 0..batches {
        store
            .apply_batch(&batch(id, id * 1000, 1000, 100_000, 0))
            .unwrap();
    }
    store.close().unwrap();
    dir
}

fn get(c: &mut Criterion) {
    let dir = filled(200);
    let store = Store::open(dir.path(), buffered()).unwrap();
    let mut g = c.benchmark_group("get");
    g.throughput(Throughput::Elements(1000));
    g.bench_function("1000_random_of_100k", |bench| {
        bench.iter(|| {
            (0..1000u64)
                .filter(|i| {
                    store
                        .get(format!("O{:07}/1", i * 97 % 100_000))
                        .unwrap()
                        .is_some()
                })
                .count()
        })
    });
    g.finish();
}

fn replay(c: &mut Criterion) {
    let dir = filled(200);
    let mut g = c.benchmark_group("open");
    g.sample_size(10);
    g.throughput(Throughput::Elements(200_000));
    // Only the open is timed: closing after a full replay writes a snapshot
    // again (the next iteration removes it).
    let timed_opens = |iters: u64, from_snapshot: bool| {
        let mut took = Duration::ZERO;
        for _ in 0..iters {
            if !from_snapshot {
                let _ = std::fs::remove_file(dir.path().join("SNAPSHOT"));
            }
            let started = Instant::now();
            let store = Store::open(dir.path(), buffered()).unwrap();
            took += started.elapsed();
            assert_eq!(store.stats().opened_from_snapshot, from_snapshot);
            store.close().unwrap();
        }
        took
    };
    g.bench_function("full_replay_200k_deliveries", |bench| {
        bench.iter_custom(|iters| timed_opens(iters, false))
    });
    g.bench_function("from_snapshot_200k_deliveries", |bench| {
        // A clean close of a replayed store leaves the snapshot.
        Store::open(dir.path(), buffered())
            .unwrap()
            .close()
            .unwrap();
        bench.iter_custom(|iters| timed_opens(iters, true))
    });
    g.finish();
}

/// An explicit snapshot of an open store: the index written out under the
/// writer lock, then synced and renamed (what an automatic snapshot leaves
/// to the installer's thread).
fn snapshot(c: &mut Criterion) {
    let dir = filled(200);
    let store = Store::open(dir.path(), buffered()).unwrap();
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.throughput(Throughput::Elements(200_000));
    g.bench_function("index_of_200k_deliveries", |bench| {
        bench.iter(|| store.snapshot().unwrap())
    });
    g.finish();
}

fn compaction(c: &mut Criterion) {
    let mut g = c.benchmark_group("compact");
    g.sample_size(10);
    g.bench_function("200_batches_of_1000_over_100k_keys", |bench| {
        // Only `compact` is timed: the open before it, and the close and the
        // directory's removal after it (the routine's output is dropped
        // outside the measurement), are not.
        bench.iter_batched(
            || {
                let dir = filled(200);
                let store = Store::open(dir.path(), buffered()).unwrap();
                (store, dir)
            },
            |(store, dir)| {
                store.compact().unwrap();
                (store, dir)
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(
    benches,
    encode,
    append_sync,
    file_sync,
    apply,
    seen_lookup,
    get,
    replay,
    snapshot,
    compaction
);
criterion_main!(benches);
