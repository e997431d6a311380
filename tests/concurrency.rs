//! Contract area: concurrency (SPEC section 4).
//!
//! Several writers commit small `Sync` batches to one store at once (group
//! commit) while readers check that no batch is ever half visible. Each
//! writer owns two keys, `t{n}/a` and `t{n}/b`; its batch `i` puts the same
//! value at the same seq into both, adds 1 to a shared counter and sets
//! checkpoint `t{n}` to `i`. A reader that sees the two keys disagree, a row
//! without its checkpoint (or the reverse), or the counter out of step with
//! the rows has seen half a batch.

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use idemkv::{Batch, BatchReport, Durability, Error, OnConflict, Options, Record, Store};

const WRITERS: usize = 6;
const READERS: usize = 2;
const BATCHES: u64 = 40;
const COUNTER: &str = "shared/counter";

fn batch_id(t: usize, i: u64) -> String {
    format!("t{t}-b{i}")
}

fn value(t: usize, i: u64) -> String {
    format!("t{t} batch {i}")
}

fn batch(t: usize, i: u64) -> Batch {
    let mut batch = Batch::new(batch_id(t, i))
        .put(format!("t{t}-{i}-a"), format!("t{t}/a"), i + 1, value(t, i))
        .put(format!("t{t}-{i}-b"), format!("t{t}/b"), i + 1, value(t, i))
        .add(format!("t{t}-{i}-c"), COUNTER, 1, 1);
    if i > 0 {
        // A redelivery of the previous batch's first event: a duplicate.
        batch = batch.put(
            format!("t{t}-{}-a", i - 1),
            format!("t{t}/a"),
            i,
            value(t, i - 1),
        );
    }
    batch.checkpoint(format!("t{t}"), i.to_be_bytes())
}

fn expected_report(i: u64) -> BatchReport {
    let mut r = BatchReport {
        added: 1,
        ..BatchReport::default()
    };
    if i == 0 {
        r.inserted = 2;
    } else {
        r.updated = 2;
        r.duplicates = 1;
    }
    r
}

/// The checkpoint of writer `t`: the index of its last committed batch.
fn checkpoint(store: &Store, t: usize) -> Option<u64> {
    store
        .checkpoint(format!("t{t}"))
        .expect("checkpoint")
        .map(|p| u64::from_be_bytes(p.as_ref().try_into().expect("8-byte position")))
}

/// Writer `t`'s rows, read in one scan; returns how many of its batches they show.
fn batches_shown(store: &Store, t: usize) -> u64 {
    let rows: Vec<(Bytes, Record)> = store
        .scan_prefix(format!("t{t}/"))
        .collect::<Result<_, _>>()
        .expect("scan");
    match rows.as_slice() {
        [] => 0,
        [(ka, a), (kb, b)] => {
            assert_eq!(
                (ka.as_ref(), kb.as_ref()),
                (format!("t{t}/a").as_bytes(), format!("t{t}/b").as_bytes())
            );
            assert_eq!(
                a, b,
                "one scan saw writer {t}'s two keys from different batches"
            );
            assert_eq!(
                a.value,
                value(t, a.seq - 1).as_bytes(),
                "value and seq of one batch"
            );
            a.seq
        }
        other => panic!("one scan saw half of writer {t}'s batch: {other:?}"),
    }
}

fn counter(store: &Store) -> u64 {
    store.get(COUNTER).expect("get").map_or(0, |r| {
        std::str::from_utf8(&r.value)
            .expect("counter text")
            .parse()
            .expect("counter is decimal")
    })
}

fn check_final_state(store: &Store) {
    let mut total = BatchReport::default();
    for t in 0..WRITERS {
        for i in 0..BATCHES {
            let report = store.batch(batch_id(t, i)).expect("batch");
            assert_eq!(report, Some(expected_report(i)), "batch {}", batch_id(t, i));
            total.accumulate(&report.unwrap());
        }
        assert_eq!(batches_shown(store, t), BATCHES);
        assert_eq!(checkpoint(store, t), Some(BATCHES - 1));
    }
    let batches = (WRITERS as u64) * BATCHES;
    assert_eq!(total.added, batches);
    assert_eq!(total.inserted, 2 * WRITERS as u64);
    assert_eq!(total.updated, 2 * WRITERS as u64 * (BATCHES - 1));
    assert_eq!(total.duplicates, WRITERS as u64 * (BATCHES - 1));
    assert_eq!(counter(store), batches, "every add applied exactly once");
    let log = store.log();
    assert_eq!(log.len() as u64, batches, "each batch is in the log once");
    let mut ids: Vec<&[u8]> = log.iter().map(|e| e.batch_id.as_ref()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len() as u64, batches, "each batch is in the log once");
}

#[test]
fn concurrent_writers_commit_every_batch_once_and_readers_never_see_half_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().durability(Durability::Sync);
    let store = Store::open(dir.path(), options.clone()).expect("open");
    let writers_done = AtomicUsize::new(0);
    let reads = AtomicUsize::new(0);

    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let store = &store;
            let writers_done = &writers_done;
            s.spawn(move || {
                for i in 0..BATCHES {
                    let report = store.apply_batch(&batch(t, i)).expect("apply");
                    assert_eq!(report, expected_report(i), "report of {}", batch_id(t, i));
                }
                writers_done.fetch_add(1, Ordering::SeqCst);
            });
        }
        for _ in 0..READERS {
            let store = &store;
            let writers_done = &writers_done;
            let reads = &reads;
            s.spawn(move || {
                let mut shown_before = [0u64; WRITERS];
                let mut counter_before = 0;
                loop {
                    let finished = writers_done.load(Ordering::SeqCst) == WRITERS;
                    let counter_first = counter(store);
                    let mut shown_sum = 0;
                    for (t, shown_before) in shown_before.iter_mut().enumerate() {
                        // Checkpoint, then rows, then checkpoint: each read is
                        // later than the one before, so a batch whose
                        // checkpoint is visible must show its rows, and rows
                        // that are visible must have their checkpoint.
                        let committed = checkpoint(store, t).map_or(0, |i| i + 1);
                        let shown = batches_shown(store, t);
                        let committed_after = checkpoint(store, t).map_or(0, |i| i + 1);
                        assert!(shown >= committed, "writer {t}: checkpoint says {committed} batches, rows show {shown}");
                        assert!(committed_after >= shown, "writer {t}: rows show {shown} batches, checkpoint then said {committed_after}");
                        assert!(shown >= *shown_before, "writer {t}: rows went back from {shown_before} to {shown}");
                        *shown_before = shown;
                        shown_sum += shown;
                    }
                    let counter_last = counter(store);
                    // Every add read before the rows belongs to a batch whose
                    // rows were visible by then; every batch whose rows were
                    // read was counted by the later counter read.
                    assert!(shown_sum >= counter_first, "rows show {shown_sum} batches, counter read before said {counter_first}");
                    assert!(counter_last >= shown_sum, "rows show {shown_sum} batches, counter read after said {counter_last}");
                    assert!(counter_first >= counter_before, "counter went back");
                    counter_before = counter_last;
                    reads.fetch_add(1, Ordering::Relaxed);
                    if finished {
                        break;
                    }
                }
            });
        }
    });
    assert!(reads.load(Ordering::Relaxed) >= READERS * 2, "readers ran");

    check_final_state(&store);
    drop(store);
    let store = Store::open(dir.path(), options).expect("reopen");
    check_final_state(&store);
    let replay = store.apply_batch(&batch(0, 3)).expect("replay");
    assert_eq!(
        replay,
        BatchReport {
            replayed: true,
            ..expected_report(3)
        }
    );
    assert_eq!(counter(&store), WRITERS as u64 * BATCHES);
}

#[test]
fn concurrent_redeliveries_of_the_same_events_apply_once() {
    // Every writer delivers the same adds under its own batch ids: whichever
    // commits first applies each event, all others see duplicates.
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default().durability(Durability::Sync);
    let store = Store::open(dir.path(), options.clone()).expect("open");
    const EVENTS: u64 = 30;
    let totals: Vec<BatchReport> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let mut total = BatchReport::default();
                    for i in 0..EVENTS {
                        let batch = Batch::new(format!("w{t}-{i}"))
                            .add(format!("shared-{i}"), COUNTER, 1, 1)
                            .put(format!("row-{i}"), format!("rows/{i}"), 1, "x");
                        let report = store.apply_batch(&batch).expect("apply");
                        assert_eq!(report.deliveries(), 2);
                        total.accumulate(&report);
                    }
                    total
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("writer"))
            .collect()
    });
    let mut total = BatchReport::default();
    for t in &totals {
        total.accumulate(t);
    }
    assert_eq!(total.added, EVENTS);
    assert_eq!(total.inserted, EVENTS);
    assert_eq!(total.duplicates, 2 * EVENTS * (WRITERS as u64 - 1));
    assert_eq!(counter(&store), EVENTS);
    drop(store);
    let store = Store::open(dir.path(), options).expect("reopen");
    assert_eq!(counter(&store), EVENTS);
    assert_eq!(store.scan_prefix("rows/").count() as u64, EVENTS);
}

#[test]
fn every_writer_reads_its_own_batch_on_return_and_writers_share_syncs() {
    // A sync's publishing runs while the next sync starts, and a syncer may
    // wait for other writers' records: neither may let `apply_batch` return
    // before its batch is visible.
    let dir = tempfile::tempdir().unwrap();
    let store =
        Store::open(dir.path(), Options::default().durability(Durability::Sync)).expect("open");
    let syncs_before = store.stats().syncs;
    std::thread::scope(|s| {
        for t in 0..WRITERS {
            let store = &store;
            s.spawn(move || {
                for i in 0..BATCHES {
                    store.apply_batch(&batch(t, i)).expect("apply");
                    let row = store.get(format!("t{t}/a")).expect("get").expect("row");
                    assert_eq!(row.seq, i + 1, "writer {t} reads its batch {i} on return");
                    assert_eq!(checkpoint(store, t), Some(i));
                }
            });
        }
    });
    let batches = WRITERS as u64 * BATCHES;
    let syncs = store.stats().syncs - syncs_before;
    // Shared: 42-49 syncs for 240 batches here; a syncer that claimed only
    // its own record took 184-197.
    assert!(
        syncs <= batches / 2,
        "{WRITERS} writers share syncs: {syncs} syncs for {batches} batches"
    );
    check_final_state(&store);
}

/// Rows each of the large batches below puts: with values of 100 bytes,
/// their records (about 50 KiB) are past the size whose application to the
/// index the store hands to a thread of its own.
const LARGE_ROWS: u64 = 400;

fn large_value(i: u64) -> String {
    format!("{i:0100}")
}

/// Puts every row at seq `i + 1`, and redelivers the previous batch's first
/// event (a duplicate only if that batch is in the index when this one is
/// planned).
fn large_batch(i: u64) -> Batch {
    let mut batch = Batch::new(format!("L{i}"));
    if i > 0 {
        batch = batch.put(format!("L{}-0", i - 1), "rows/000", i, large_value(i - 1));
    }
    for r in 0..LARGE_ROWS {
        batch = batch.put(
            format!("L{i}-{r}"),
            format!("rows/{r:03}"),
            i + 1,
            large_value(i),
        );
    }
    batch.checkpoint("large", i.to_be_bytes())
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn large_batches_are_whole_to_readers_and_read_back_on_return_and_by_the_next_batch() {
    // A large record is applied to the index by a thread of the store's
    // own after `apply_batch` returns (DESIGN.md, "Publishing"); the writer
    // hands it the index's write lock first. Neither the writer's own
    // reads, nor its next batch's planning, nor another thread's reads may
    // see the store without the batch or with part of it.
    for durability in [Durability::Buffered, Durability::Sync] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Options::default().durability(durability)).unwrap();
        let writer_done = std::sync::atomic::AtomicBool::new(false);
        let scans = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut seq_before = 0;
                while !writer_done.load(Ordering::SeqCst) {
                    let committed = store
                        .checkpoint("large")
                        .expect("checkpoint")
                        .map_or(0, |p| {
                            u64::from_be_bytes(p.as_ref().try_into().expect("8 bytes")) + 1
                        });
                    let rows: Vec<Record> = store
                        .scan_prefix("rows/")
                        .map(|row| row.expect("scan").1)
                        .collect();
                    let seq = rows.first().map_or(0, |r| r.seq);
                    assert!(
                        rows.len() as u64 == LARGE_ROWS || rows.is_empty(),
                        "{durability:?}: one scan saw {} rows",
                        rows.len()
                    );
                    assert!(
                        rows.iter()
                            .all(|r| r.seq == seq && r.value == large_value(seq - 1).as_bytes()),
                        "{durability:?}: one scan saw rows of two batches"
                    );
                    assert!(
                        seq >= committed,
                        "{durability:?}: batch {committed} checkpointed, rows show {seq}"
                    );
                    assert!(
                        seq >= seq_before,
                        "{durability:?}: rows went back to batch {seq}"
                    );
                    seq_before = seq;
                    scans.fetch_add(1, Ordering::Relaxed);
                }
            });
            // Ends the reader however the writer ends, a failed assertion included.
            let _writer_done = SetOnDrop(&writer_done);
            for i in 0..BATCHES {
                let report = store.apply_batch(&large_batch(i)).expect("apply");
                let expected = match i {
                    0 => BatchReport {
                        inserted: LARGE_ROWS,
                        ..BatchReport::default()
                    },
                    _ => BatchReport {
                        updated: LARGE_ROWS,
                        duplicates: 1,
                        ..BatchReport::default()
                    },
                };
                assert_eq!(
                    report, expected,
                    "{durability:?}: batch {i} planned against the one before"
                );
                // Every other batch is read back at once; the rest are
                // followed straight by the next batch.
                if i % 2 == 0 {
                    let row = store
                        .get(format!("rows/{:03}", LARGE_ROWS - 1))
                        .expect("get")
                        .expect("row");
                    assert_eq!(
                        row.seq,
                        i + 1,
                        "{durability:?}: batch {i} read back on return"
                    );
                }
            }
        });
        assert!(scans.load(Ordering::Relaxed) > 0, "the reader ran");
        let row = store.get("rows/000").expect("get").expect("row");
        assert_eq!(row.seq, BATCHES);
    }
}

/// Options for a store on `storage` whose next data sync, once a test holds
/// it, is a batch's commit sync: under `Sync`, with no zero fill (whose
/// syncs come first) and no automatic snapshot.
#[cfg(feature = "testing")]
fn held_sync_options(storage: &idemkv::storage::FaultyStorage) -> Options {
    Options::default()
        .storage(std::sync::Arc::new(storage.clone()))
        .durability(Durability::Sync)
        .snapshot_log_bytes(None)
        .zero_fill(false)
}

/// Batches planned while an earlier one waits for its sync see its effects
/// whenever they touch it (its batch id, an event id it recorded, a key it
/// wrote) and plan against the committed state alone when they do not: a
/// redelivery of its event is a duplicate, the same id with other content
/// a conflict, an older seq of its key stale, its key no longer new, its
/// batch id a replay (or, with other content, a batch conflict), and a key
/// it did not write keeps its committed row.
#[cfg(feature = "testing")]
#[test]
fn batches_planned_while_another_waits_for_its_sync_see_exactly_what_it_touched() {
    use std::time::{Duration, Instant};

    use idemkv::storage::{FaultyStorage, OpKind};

    let storage = FaultyStorage::new();
    let options = held_sync_options(&storage).on_conflict(OnConflict::Quarantine);
    let store = Store::open("/db", options).unwrap();
    store
        .apply_batch(
            &Batch::new("B0")
                .put("e0", "k1", 5, "v0")
                .put("e00", "k2", 5, "w0"),
        )
        .unwrap();
    let pending = Batch::new("A")
        .put("ea1", "k1", 10, "va")
        .put("ea2", "k3", 1, "new")
        .add("ea3", "hits", 1, 2);
    let with = |set: fn(&mut BatchReport)| {
        let mut report = BatchReport::default();
        set(&mut report);
        report
    };
    // Each batch planned while A waits, and the report it must get.
    let later = [
        (
            Batch::new("B1").put("ea1", "k1", 10, "va"),
            with(|r| r.duplicates = 1),
        ),
        (
            Batch::new("B2").put("ea1", "kz", 10, "va"),
            with(|r| r.rejected = 1),
        ),
        (
            Batch::new("B3").put("eb3", "k1", 7, "older"),
            with(|r| r.stale = 1),
        ),
        (
            Batch::new("B4").put("eb4", "k3", 2, "newer"),
            with(|r| r.updated = 1),
        ),
        (
            Batch::new("B5").add("eb5", "hits", 2, 3),
            with(|r| r.added = 1),
        ),
        (
            Batch::new("B6").put("eb6", "k2", 6, "w1"),
            with(|r| r.updated = 1),
        ),
    ];
    let timeout = Duration::from_secs(20);
    let writes = || storage.op_count_of(OpKind::Write);
    // False if the writes do not happen in time (the sync is then let go
    // before the test fails, so that no thread is left waiting for it).
    let wait_for_writes = |at_least: usize| {
        let deadline = Instant::now() + timeout;
        while writes() < at_least {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    };
    let (first, replay, reports, all_written) = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let first = scope.spawn(|| store.apply_batch(&pending));
        let paused = storage.wait_until_paused(timeout).is_some();
        let mut handles = Vec::new();
        let mut all_written = paused;
        for (batch, _) in &later {
            // Each is planned and written while A's record still waits.
            let written = writes();
            handles.push(scope.spawn(|| store.apply_batch(batch)));
            all_written &= wait_for_writes(written + 1);
        }
        // A's batch id with other content: refused at once, while A waits.
        let reused = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ez", "kz", 1, "z")));
        let deadline = Instant::now() + timeout;
        while !reused.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        all_written &= reused.is_finished();
        let replay = scope.spawn(|| store.apply_batch(&pending));
        storage.resume();
        let reused = reused.join().unwrap();
        assert!(
            matches!(reused, Err(Error::BatchConflict { .. })),
            "{reused:?}"
        );
        (
            first.join().unwrap().unwrap(),
            replay.join().unwrap().unwrap(),
            handles
                .into_iter()
                .map(|h| h.join().unwrap().unwrap())
                .collect::<Vec<_>>(),
            all_written,
        )
    });
    assert!(
        all_written,
        "every later batch was written, and the reused id refused, while A waited"
    );
    assert_eq!((first.inserted, first.updated, first.added), (1, 1, 1));
    assert!(replay.replayed, "A's batch id is a replay: {replay:?}");
    for ((batch, want), got) in later.iter().zip(&reports) {
        assert_eq!(got, want, "batch {:?}", batch.id());
    }
    let row = |key: &str| {
        let r = store.get(key).unwrap().expect("row");
        (r.seq, String::from_utf8(r.value.to_vec()).unwrap())
    };
    assert_eq!(row("k1"), (10, "va".to_string()));
    assert_eq!(row("k2"), (6, "w1".to_string()));
    assert_eq!(row("k3"), (2, "newer".to_string()));
    assert_eq!(row("hits"), (2, "5".to_string()));
}

/// Writers (one of them with records large enough to go in early, and
/// version bumps that keep pointing at older segments), readers, a
/// compaction every 20 ms and a snapshot every 15 ms run together for a few
/// seconds over small segments, under both durabilities: no reader sees
/// half a batch, every writer reads its own batch on return, a batch sent
/// again is a replay, and a reopen finds the state the run left.
#[test]
fn writers_readers_compactions_and_snapshots_run_together() {
    const RUN: std::time::Duration = std::time::Duration::from_secs(3);
    for durability in [Durability::Sync, Durability::Buffered] {
        let dir = tempfile::tempdir().unwrap();
        let options = || {
            Options::default()
                .durability(durability)
                .segment_bytes_max(256 << 10)
                .snapshot_log_bytes(Some(128 << 10))
        };
        let store = Store::open(dir.path(), options()).unwrap();
        let deadline = std::time::Instant::now() + RUN;
        let is_running = || std::time::Instant::now() < deadline;
        let readers_done = std::sync::atomic::AtomicBool::new(false);
        // Batch `i` of writer `t`: both its keys at seq `i + 1`, with the
        // value of batch `i` rounded down to an even number, so that odd
        // batches put an unchanged value (a version bump).
        let value = |t: usize, i: u64| {
            let even = i - i % 2;
            let mut v = format!("t{t}-i{even}-").into_bytes();
            if t == 0 && even.is_multiple_of(3) {
                v.resize(40_000, b'x');
            }
            v
        };
        std::thread::scope(|s| {
            for t in 0..4usize {
                let store = &store;
                s.spawn(move || {
                    let mut i = 0u64;
                    while is_running() {
                        let batch = Batch::new(format!("t{t}-b{i}"))
                            .put(
                                format!("t{t}-{i}-a"),
                                format!("p/t{t}/a"),
                                i + 1,
                                value(t, i),
                            )
                            .put(
                                format!("t{t}-{i}-b"),
                                format!("p/t{t}/b"),
                                i + 1,
                                value(t, i),
                            )
                            .checkpoint(format!("t{t}"), i.to_be_bytes());
                        assert!(!store.apply_batch(&batch).unwrap().replayed);
                        let own = store.get(format!("p/t{t}/a")).unwrap().expect("own row");
                        assert_eq!(own.seq, i + 1, "writer {t} reads its batch {i}");
                        if i.is_multiple_of(5) {
                            assert!(store.apply_batch(&batch).unwrap().replayed);
                        }
                        i += 1;
                    }
                });
            }
            for _ in 0..2 {
                let (store, readers_done) = (&store, &readers_done);
                s.spawn(move || {
                    while !readers_done.load(Ordering::Relaxed) {
                        let rows: Vec<(Bytes, Record)> =
                            store.scan_prefix("p/").map(|r| r.unwrap()).collect();
                        for t in 0..4usize {
                            let row = |k: &str| {
                                let key = format!("p/t{t}/{k}");
                                rows.iter()
                                    .find(|(r, _)| r[..] == *key.as_bytes())
                                    .map(|r| &r.1)
                            };
                            match (row("a"), row("b")) {
                                (Some(a), Some(b)) => {
                                    assert_eq!((a.seq, &a.value), (b.seq, &b.value), "writer {t}");
                                    assert_eq!(a.value, value(t, a.seq - 1), "writer {t}");
                                }
                                (None, None) => {}
                                _ => panic!("half of writer {t}'s batch"),
                            }
                        }
                        store.digest().unwrap();
                    }
                });
            }
            let store = &store;
            s.spawn(move || {
                while is_running() {
                    store.compact().unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            });
            s.spawn(move || {
                while is_running() {
                    store.snapshot().unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(15));
                }
            });
            while is_running() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            readers_done.store(true, Ordering::Relaxed);
        });
        let digest = store.digest().unwrap();
        drop(store);
        let store = Store::open(dir.path(), options()).unwrap();
        assert_eq!(store.digest().unwrap(), digest, "{durability:?}");
    }
}

/// `Store::snapshot` under `Sync` syncs the log, then, under the writer
/// lock, syncs it again before it publishes what was written: a batch
/// written between the two, whose caller waits on another writer's
/// gathering syncer, must not be acknowledged before a sync covers it.
/// The test holds the snapshot right after its first sync while B and then
/// C are written (C's caller waiting on B's syncer, which gathers), takes a
/// power-loss image the moment C is acknowledged, and requires the log of
/// that image (its snapshot removed, since a snapshot over a log that lacks
/// C may still load it) to hold C.
#[cfg(feature = "testing")]
#[test]
fn a_batch_written_while_a_snapshot_runs_is_acknowledged_only_once_synced() {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use idemkv::ManualClock;
    use idemkv::storage::{CrashPolicy, FaultyStorage, OpKind, Storage};

    const TIMEOUT: Duration = Duration::from_secs(20);
    let options = |storage: &FaultyStorage| {
        Options::default()
            .storage(Arc::new(storage.clone()))
            .durability(Durability::Sync)
            .zero_fill(false)
            .snapshot_log_bytes(None)
            .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
    };
    let batch = |name: &str| Batch::new(name).put(format!("e-{name}"), format!("k-{name}"), 1, "v");
    let is_segment = |path: &Path| path.extension().is_some_and(|e| e == "seg");
    // Until `n` segment writes came after operation `after`, then 200 ms more.
    let wait_for_writes = |storage: &FaultyStorage, after: u64, n: usize| {
        let deadline = Instant::now() + TIMEOUT;
        while storage
            .ops()
            .iter()
            .filter(|o| o.index > after && o.kind == OpKind::Write && is_segment(&o.path))
            .count()
            < n
        {
            assert!(Instant::now() < deadline, "no record write");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(200));
    };

    let storage = FaultyStorage::new();
    let store = Store::open("/db", options(&storage)).expect("open");
    let (s, storage_ref) = (&store, &storage);
    std::thread::scope(|scope| {
        // Group commit learns that four writers are active (R1 to R3
        // written while R0's sync runs), then that a sync takes two seconds
        // (theirs, held): B's syncer will gather for C.
        storage.pause_after_next_sync();
        let r0 = scope.spawn(|| s.apply_batch(&batch("R0")));
        let held = storage.wait_until_paused(TIMEOUT).expect("R0's sync held");
        let others: Vec<_> = ["R1", "R2", "R3"]
            .into_iter()
            .map(|name| scope.spawn(move || s.apply_batch(&batch(name))))
            .collect();
        wait_for_writes(&storage, held, 3);
        storage.resume();
        storage.pause_after_next_sync();
        r0.join().unwrap().expect("R0");
        storage
            .wait_until_paused(TIMEOUT)
            .expect("the sync of R1 to R3 held");
        std::thread::sleep(Duration::from_secs(2));
        storage.resume();
        for r in others {
            r.join().unwrap().expect("R batch");
        }

        // The snapshot's first sync done and held; B written, its syncer
        // gathering; C written, its caller waiting on that syncer.
        storage.pause_after_next_sync();
        let snapshot = scope.spawn(|| s.snapshot());
        let held = storage
            .wait_until_paused(TIMEOUT)
            .expect("snapshot's sync held");
        let b = scope.spawn(|| s.apply_batch(&batch("B")));
        wait_for_writes(&storage, held, 1);
        let c = scope.spawn(move || {
            let acknowledged = s.apply_batch(&batch("C")).is_ok();
            (
                acknowledged,
                storage_ref.crash_image(CrashPolicy::PowerLoss),
            )
        });
        wait_for_writes(&storage, held, 2);
        storage.resume();
        let (acknowledged, image) = c.join().unwrap();
        assert!(acknowledged, "C commits");
        let _ = image.remove_file(Path::new("/db/SNAPSHOT"));
        let reopened = Store::open("/db", options(&image)).expect("open the image");
        assert!(
            reopened.batch("C").expect("batch").is_some(),
            "batch C was acknowledged before any sync covered it"
        );
        b.join().unwrap().expect("B");
        snapshot.join().unwrap().expect("snapshot");
    });
}

/// A batch waiting for its sync that rewrites a key with its committed
/// value records a version bump, whose value is the published row's: a
/// batch planned meanwhile that touches the key builds the pending effects,
/// and the bump must find that row under them. It sees the new version (an
/// older seq is stale), and the row keeps its value at the new seq.
#[cfg(feature = "testing")]
#[test]
fn a_batch_planned_while_an_unchanged_put_waits_sees_the_bumped_version() {
    use std::time::{Duration, Instant};

    use idemkv::storage::{FaultyStorage, OpKind};

    const TIMEOUT: Duration = Duration::from_secs(20);
    let storage = FaultyStorage::new();
    let options = held_sync_options(&storage);
    let store = Store::open("/db", options).unwrap();
    store
        .apply_batch(&Batch::new("B0").put("e0", "k1", 5, "v0"))
        .unwrap();
    let writes = || storage.op_count_of(OpKind::Write);
    let (first, later, written) = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let first = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ea", "k1", 10, "v0")));
        let mut written = storage.wait_until_paused(TIMEOUT).is_some();
        let before = writes();
        let later =
            scope.spawn(|| store.apply_batch(&Batch::new("B1").put("eb", "k1", 7, "older")));
        let deadline = Instant::now() + TIMEOUT;
        while writes() <= before && !later.is_finished() {
            if Instant::now() > deadline {
                written = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        storage.resume();
        (first.join(), later.join(), written)
    });
    assert!(written, "B1 was planned and written while A waited");
    let first = first.expect("A's writer").expect("A");
    assert_eq!(first.unchanged, 1, "{first:?}");
    let later = later
        .expect("B1's writer must not panic applying the pending bump")
        .expect("B1");
    assert_eq!(later.stale, 1, "k1 is at seq 10 once A commits: {later:?}");
    let row = store.get("k1").unwrap().expect("row");
    assert_eq!((row.seq, &row.value[..]), (10, &b"v0"[..]));
}

/// The log's clock never goes back (DESIGN.md, "Write path", step 4), also
/// for a batch planned while an earlier one waits for its sync: the clock
/// is set back meanwhile, and the later batch still commits no earlier
/// than the pending one, which the index does not know of yet.
#[cfg(feature = "testing")]
#[test]
fn a_batch_planned_while_another_waits_for_its_sync_commits_no_earlier_than_it() {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use idemkv::ManualClock;
    use idemkv::storage::{FaultyStorage, OpKind};

    const TIMEOUT: Duration = Duration::from_secs(20);
    const T0_MS: u64 = 1_700_000_000_000;
    let storage = FaultyStorage::new();
    let clock = ManualClock::new(T0_MS);
    let options = held_sync_options(&storage).clock(Arc::new(clock.clone()));
    let store = Store::open("/db", options.clone()).unwrap();
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v0"))
        .unwrap();
    clock.set_ms(T0_MS + 60_000);
    let writes = || storage.op_count_of(OpKind::Write);
    let (first, later, written) = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let first = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ea", "ka", 1, "va")));
        let mut written = storage.wait_until_paused(TIMEOUT).is_some();
        clock.set_ms(T0_MS + 1_000);
        let before = writes();
        let later = scope.spawn(|| store.apply_batch(&Batch::new("B1").put("eb", "kb", 1, "vb")));
        let deadline = Instant::now() + TIMEOUT;
        while writes() <= before && !later.is_finished() {
            if Instant::now() > deadline {
                written = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        storage.resume();
        (first.join(), later.join(), written)
    });
    assert!(written, "B1 was planned and written while A waited");
    first.expect("A's writer").expect("A");
    later.expect("B1's writer").expect("B1");
    let committed_ms = |store: &Store, id: &str| {
        store
            .log()
            .into_iter()
            .find(|e| e.batch_id == id.as_bytes())
            .map(|e| e.committed_ms)
    };
    assert_eq!(committed_ms(&store, "A"), Some(T0_MS + 60_000));
    assert_eq!(
        committed_ms(&store, "B1"),
        Some(T0_MS + 60_000),
        "B1 commits at A's time, not the clock's earlier one"
    );
    drop(store);
    let store = Store::open("/db", options).unwrap();
    assert_eq!(committed_ms(&store, "B1"), Some(T0_MS + 60_000));
}

/// The syncer after a sync during which another record was written waits
/// for as many records as that sync saw (its cohort), and its sync covers
/// every record written meanwhile: W1, written while A's sync is held,
/// gathers X, and one sync serves both. A sync that covered only W1, or a
/// syncer that did not wait, would leave X a sync of its own.
#[cfg(feature = "testing")]
#[test]
fn the_next_syncer_gathers_the_records_written_while_it_waits_into_one_sync() {
    use std::time::{Duration, Instant};

    use idemkv::storage::{FaultyStorage, OpKind};

    const TIMEOUT: Duration = Duration::from_secs(20);
    let storage = FaultyStorage::new();
    let options = held_sync_options(&storage);
    let store = Store::open("/db", options).unwrap();
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
        .unwrap();
    let syncs = store.stats().syncs;
    let writes = || storage.op_count_of(OpKind::Write);
    std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let a = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ea", "ka", 1, "v")));
        let held = storage.wait_until_paused(TIMEOUT);
        let before = writes();
        let w1 = scope.spawn(|| store.apply_batch(&Batch::new("W1").put("ew1", "kw1", 1, "v")));
        let deadline = Instant::now() + TIMEOUT;
        while writes() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // A's sync lasts a second: W1, its next syncer, gathers that long.
        std::thread::sleep(Duration::from_secs(1));
        storage.resume();
        assert!(held.is_some(), "A's commit sync was held");
        a.join().unwrap().expect("A");
        store
            .apply_batch(&Batch::new("X").put("ex", "kx", 1, "v"))
            .expect("X");
        w1.join().unwrap().expect("W1");
    });
    assert_eq!(
        store.stats().syncs - syncs,
        2,
        "A's sync, then one for both W1 and X"
    );
}

/// While a batch's commit sync is held, no reader sees any part of it:
/// `get`, `scan_prefix`, `batch`, `checkpoints`, `log`, `quarantine`,
/// `digest` and `stats` (but for `seen_ids`) all answer as before it was
/// written; once the sync returns, all of it at once. Run with a small
/// record and with one of 32 KiB or more, whose seen ids go into the index
/// before its sync.
#[cfg(feature = "testing")]
#[test]
fn readers_see_no_part_of_a_batch_until_its_commit_sync_returns() {
    use std::time::Duration;

    use idemkv::storage::{FaultyStorage, OpKind};

    const TIMEOUT: Duration = Duration::from_secs(20);
    type Seen = (
        Option<Record>,
        Option<Record>,
        Option<Record>,
        Vec<(Bytes, Record)>,
        Option<BatchReport>,
        Vec<(Bytes, Bytes)>,
        usize,
        usize,
        idemkv::Digest,
        [u64; 5],
    );
    let observe = |store: &Store| -> Seen {
        (
            store.get("k1").unwrap(),
            store.get("k9").unwrap(),
            store.get("hits").unwrap(),
            store.scan_prefix("").map(|r| r.unwrap()).collect(),
            store.batch("A").unwrap(),
            store.checkpoints(),
            store.log().len(),
            store.quarantine().len(),
            store.digest().unwrap(),
            {
                // Not `seen_ids`: a large record's ids may count before its sync.
                let stats = store.stats();
                [
                    stats.live_keys,
                    stats.tombstones,
                    stats.batches,
                    stats.checkpoints,
                    stats.quarantined,
                ]
            },
        )
    };
    for is_large in [false, true] {
        let storage = FaultyStorage::new();
        let options = held_sync_options(&storage).on_conflict(OnConflict::Quarantine);
        let store = Store::open("/db", options).unwrap();
        store
            .apply_batch(
                &Batch::new("B0")
                    .put("e0", "k1", 1, "v0")
                    .add("e00", "hits", 1, 1)
                    .checkpoint("src", "1"),
            )
            .unwrap();
        let mut a = Batch::new("A")
            .put("ea1", "k1", 2, "va")
            .put("ea2", "k9", 1, "new")
            .add("ea3", "hits", 2, 5)
            .malformed("ea4", "bad")
            .checkpoint("src", "2");
        if is_large {
            for j in 0..300 {
                a = a.put(format!("el{j}"), format!("large{j}"), 1, "y".repeat(120));
            }
        }
        let before = observe(&store);
        storage.pause_next(OpKind::SyncData);
        let (during, report) = std::thread::scope(|scope| {
            let writer = scope.spawn(|| store.apply_batch(&a));
            let held = storage.wait_until_paused(TIMEOUT);
            let during = observe(&store);
            storage.resume();
            assert!(held.is_some(), "A's commit sync was held");
            (during, writer.join().unwrap())
        });
        assert_eq!(
            during, before,
            "large {is_large}: a reader saw A before its sync"
        );
        let report = report.expect("A");
        assert!(!report.replayed);
        let after = observe(&store);
        assert_eq!(after.0.map(|r| r.value), Some(Bytes::from_static(b"va")));
        assert_eq!(after.1.map(|r| r.value), Some(Bytes::from_static(b"new")));
        assert_eq!(after.2.map(|r| r.value), Some(Bytes::from_static(b"6")));
        assert_eq!(after.4, Some(report));
        assert_eq!(after.6, 2);
        assert_eq!(after.7, 1);
    }
}

/// Values handed out by `get` and a `Scan` not yet iterated outlive
/// compactions that move every value, rename a base over the segment they
/// point into and delete the others, later writes of the same keys and a
/// digest that drops the maps' pages: they return the bytes they were
/// taken with, over real memory maps.
#[test]
fn values_and_scans_taken_before_compactions_keep_their_rows_after_the_segments_are_gone() {
    for durability in [Durability::Sync, Durability::Buffered] {
        let dir = tempfile::tempdir().unwrap();
        let options = Options::default()
            .durability(durability)
            .segment_bytes_max(8 << 10)
            .snapshot_log_bytes(None);
        let store = Store::open(dir.path(), options).unwrap();
        let value = |round: u64, j: u64| format!("round {round} key {j} ").repeat(40);
        let write_round = |round: u64| {
            for j in 0..40u64 {
                store
                    .apply_batch(&Batch::new(format!("b{round}-{j}")).put(
                        format!("e{round}-{j}"),
                        format!("k{j:02}"),
                        round + 1,
                        value(round, j),
                    ))
                    .unwrap();
            }
        };
        write_round(0);
        let segments = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.ends_with(".seg"))
                .collect();
            names.sort();
            names
        };
        let before = segments();
        assert!(before.len() >= 3, "{before:?}");
        let held = store.get("k07").unwrap().expect("k07");
        let mut scan = store.scan_prefix("k");
        let first = scan.next().expect("a row").unwrap();
        for round in 1..3 {
            write_round(round);
            store.compact().unwrap();
        }
        store.digest().unwrap();
        let after = segments();
        assert!(
            before.iter().filter(|s| after.contains(s)).count() <= 1,
            "the old segments are gone: {before:?} -> {after:?}"
        );
        assert_eq!((held.seq, &held.value[..]), (1, value(0, 7).as_bytes()));
        assert_eq!(&first.0[..], b"k00");
        assert_eq!(
            (first.1.seq, &first.1.value[..]),
            (1, value(0, 0).as_bytes())
        );
        let rest: Vec<(Bytes, Record)> = scan.map(|r| r.unwrap()).collect();
        assert_eq!(rest.len(), 39);
        for (j, (key, record)) in (1u64..).zip(&rest) {
            assert_eq!(&key[..], format!("k{j:02}").as_bytes());
            assert_eq!((record.seq, &record.value[..]), (1, value(0, j).as_bytes()));
        }
        let now = store.get("k07").unwrap().expect("k07");
        assert_eq!((now.seq, &now.value[..]), (3, value(2, 7).as_bytes()));
    }
}

/// A compaction whose cut waits, under the writer lock, for the sync gate
/// that a held commit sync holds blocks no reader, and publishes nothing
/// early: while it waits, readers answer at once and see none of the held
/// batch; once the sync returns, the batch and the compaction both complete
/// and the batch survives a reopen.
#[cfg(feature = "testing")]
#[test]
fn a_compaction_cut_waiting_for_a_held_commit_sync_blocks_no_reader_and_publishes_nothing_early() {
    use std::time::{Duration, Instant};

    use idemkv::storage::{FaultyStorage, OpKind};

    const TIMEOUT: Duration = Duration::from_secs(20);
    let storage = FaultyStorage::new();
    let options = held_sync_options(&storage);
    let store = Store::open("/db", options.clone()).unwrap();
    for i in 0..20 {
        store
            .apply_batch(&Batch::new(format!("B{i}")).put(format!("e{i}"), format!("k{i}"), 1, "v"))
            .unwrap();
    }
    let before = (store.digest().unwrap(), store.log().len());
    let (during, a, compaction) = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let a = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ea", "ka", 1, "va")));
        let held = storage.wait_until_paused(TIMEOUT).expect("A's sync held");
        let compaction = scope.spawn(|| store.compact());
        // The cut trims the active segment, then waits at the sync gate.
        let deadline = Instant::now() + TIMEOUT;
        while !storage
            .ops()
            .iter()
            .any(|o| o.index > held && o.kind == OpKind::SetLen)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        let during = (
            store.get("ka").unwrap(),
            store.batch("A").unwrap(),
            store.scan_prefix("ka").count(),
            store.digest().unwrap(),
            store.log().len(),
        );
        storage.resume();
        (during, a.join().unwrap(), compaction.join().unwrap())
    });
    assert_eq!(
        during,
        (None, None, 0, before.0, before.1),
        "A seen before its sync"
    );
    a.expect("A");
    compaction.expect("compaction");
    assert_eq!(&store.get("ka").unwrap().expect("A's row").value[..], b"va");
    let digest = store.digest().unwrap();
    drop(store);
    let store = Store::open("/db", options).unwrap();
    assert_eq!(store.digest().unwrap(), digest);
    assert!(store.batch("A").unwrap().is_some());
}
