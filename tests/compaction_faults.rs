//! Compaction meeting a failing disk: whatever step fails, the store either
//! goes on with the state it had or refuses writes, and a reopen finds the
//! same state, with every value readable.

#![cfg(feature = "testing")]

use std::path::PathBuf;
use std::sync::Arc;

use idemkv::storage::{Fault, FaultError, FaultyStorage, OpKind};
use idemkv::{Batch, Durability, ManualClock, Options, Store};

fn options(storage: &FaultyStorage) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .durability(Durability::Buffered)
        .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
}

/// Enough log (over 64 KiB) that a clean close would write a snapshot.
fn fill(store: &Store) {
    for i in 0..120u64 {
        let mut b = Batch::new(format!("B{i}"));
        for j in 0..20u64 {
            let n = i * 20 + j;
            b = b.put(
                format!("e{n}"),
                format!("k{:03}", n % 300),
                n,
                format!("value {n} {}", "x".repeat(60)),
            );
        }
        store.apply_batch(&b).unwrap();
    }
}

fn rows(store: &Store) -> Vec<(Vec<u8>, u64, Vec<u8>)> {
    store
        .scan_prefix(b"")
        .map(|r| {
            let (k, rec) = r.expect("every value reads back");
            (k.to_vec(), rec.seq, rec.value.to_vec())
        })
        .collect()
}

#[test]
fn a_failure_at_any_step_of_compaction_loses_nothing_and_misleads_no_reopen() {
    let dir = PathBuf::from("/db");
    let kinds = [
        OpKind::SyncDir,
        OpKind::SyncData,
        OpKind::Rename,
        OpKind::Remove,
        OpKind::Write,
        OpKind::Open,
    ];
    let mut failures = 0;
    for kind in kinds {
        let failures_before = failures;
        for skip in 0..6 {
            let storage = FaultyStorage::new();
            let store = Store::open(&dir, options(&storage)).unwrap();
            fill(&store);
            let expected = rows(&store);
            storage.inject(Fault::new(kind, FaultError::Io).skip(skip));
            let compacted = store.compact();
            if compacted.is_err() {
                failures += 1;
                // Refused or not, what readers see has not changed.
                assert_eq!(
                    rows(&store),
                    expected,
                    "{kind:?} #{skip}: state after a failed compaction"
                );
            }
            drop(store);
            storage.heal();
            let store = Store::open(&dir, options(&storage)).unwrap();
            assert_eq!(
                rows(&store),
                expected,
                "{kind:?} #{skip}: state after reopen"
            );
            assert!(store.verify().is_ok(), "{kind:?} #{skip}");
            // And once more, through whatever snapshot that close wrote.
            drop(store);
            let store = Store::open(&dir, options(&storage)).unwrap();
            assert_eq!(
                rows(&store),
                expected,
                "{kind:?} #{skip}: state after a second reopen"
            );
        }
        // Every kind of operation is one compaction performs: a fault of
        // each fails it at least once.
        assert!(
            failures > failures_before,
            "no {kind:?} fault hit compaction"
        );
    }
    assert!(
        failures > 10,
        "only {failures} injected faults hit compaction"
    );
}

/// A compaction removes the snapshot durably before it renames its base
/// into place, so that no crash pairs the two. When an earlier compaction
/// removed the snapshot but failed at the directory sync, the removal may
/// not be durable yet: the retry, finding no snapshot, syncs the directory
/// all the same before its rename.
#[test]
fn a_compaction_retried_after_a_failed_snapshot_removal_syncs_it_before_the_rename() {
    let dir = PathBuf::from("/db");
    let snapshot = dir.join("SNAPSHOT");
    // The directory syncs before the removal's (the cut's rotation) pass.
    let (storage, store) = (0..8)
        .find_map(|skip| {
            let storage = FaultyStorage::new();
            let store = Store::open(&dir, options(&storage)).unwrap();
            fill(&store);
            store.snapshot().unwrap();
            let first_op = storage.ops().len();
            storage.inject(Fault::new(OpKind::SyncDir, FaultError::Io).skip(skip));
            store.compact().expect_err("a directory sync failed");
            let ops = storage.ops()[first_op..].to_vec();
            let failed = ops.iter().position(|o| o.failed)?;
            let removal = &ops[failed.checked_sub(1)?];
            (removal.kind == OpKind::Remove && removal.path == snapshot).then_some((storage, store))
        })
        .expect("a directory sync right after the snapshot's removal");
    assert!(!storage.files().contains(&snapshot));
    let rows_before = rows(&store);

    storage.heal();
    let retry_from = storage.ops().len();
    store.compact().expect("the retry compacts");
    let ops = &storage.ops()[retry_from..];
    let rename = ops
        .iter()
        .position(|o| o.kind == OpKind::Rename && o.path.to_string_lossy().ends_with(".tmp"))
        .expect("the base is renamed into place");
    let base_synced = ops[..rename]
        .iter()
        .rposition(|o| o.kind == OpKind::SyncData)
        .expect("the base is synced");
    assert!(
        ops[base_synced..rename]
            .iter()
            .any(|o| o.kind == OpKind::SyncDir && o.path == dir),
        "a directory sync after the base's and before its rename: {:?}",
        ops[base_synced..=rename]
            .iter()
            .map(|o| o.kind)
            .collect::<Vec<_>>()
    );
    assert_eq!(rows(&store), rows_before);
}

/// A batch that commits while a compaction writes its base moves the live
/// clock on; the switch still purges the live index at the cut's time, as
/// the base was, so what the store lists and counts is what a reopen of it
/// lists and counts.
#[test]
fn a_batch_during_a_compaction_leaves_the_live_store_as_a_reopen_finds_it() {
    use std::time::Duration;
    let dir = PathBuf::from("/db");
    let storage = FaultyStorage::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let ttl = Some(Duration::from_secs(60));
    let options = || {
        options(&storage)
            .clock(Arc::new(clock.clone()))
            .seen_ttl(ttl)
            .batch_ttl(ttl)
            .tombstone_ttl(ttl)
            .snapshot_log_bytes(None)
    };
    let store = Store::open(&dir, options()).unwrap();
    store
        .apply_batch(
            &Batch::new("A")
                .put("a1", "k1", 1, "v")
                .delete("a2", "gone", 1),
        )
        .unwrap();
    clock.advance(Duration::from_secs(30));
    store
        .apply_batch(&Batch::new("B").put("b1", "k2", 1, "v"))
        .unwrap();
    // The compaction is held between writing its base and renaming it in.
    storage.pause_next(OpKind::Rename);
    std::thread::scope(|scope| {
        let compaction = scope.spawn(|| store.compact().unwrap());
        storage
            .wait_until_paused(Duration::from_secs(20))
            .expect("the compaction is held");
        clock.advance(Duration::from_secs(100));
        store
            .apply_batch(&Batch::new("C").put("c1", "k3", 1, "v"))
            .unwrap();
        storage.resume();
        let report = compaction.join().unwrap();
        assert_eq!(report.batch_ids_dropped, 0, "{report:?}");
    });
    let listed = |store: &Store| {
        let stats = store.stats();
        let log: Vec<_> = store.log().into_iter().map(|e| e.batch_id).collect();
        (log, stats.seen_ids, stats.tombstones, stats.batches)
    };
    let live = listed(&store);
    drop(store);
    let reopened = Store::open(&dir, options()).unwrap();
    assert_eq!(listed(&reopened), live);
}

/// The base is durable under its name before any segment it replaces is
/// removed (DESIGN.md, "Compaction": rename, sync directory, then delete):
/// a disk that kept the removals of a later directory sync but not the
/// rename would hold neither the old segments nor the base. The in-memory
/// disk makes a directory's entries durable all at once, so no crash image
/// shows that; the operations' order does.
#[test]
fn a_compaction_syncs_the_directory_between_its_rename_and_the_first_removal() {
    let dir = PathBuf::from("/db");
    let storage = FaultyStorage::new();
    let store = Store::open(&dir, options(&storage).segment_bytes_max(16 * 1024)).unwrap();
    fill(&store);
    let first_op = storage.ops().len();
    let report = store.compact().unwrap();
    assert!(report.segments_replaced > 1, "{report:?}");
    let ops = &storage.ops()[first_op..];
    let rename = ops
        .iter()
        .position(|o| o.kind == OpKind::Rename && o.path.to_string_lossy().ends_with(".tmp"))
        .expect("the base is renamed into place");
    let removal = ops
        .iter()
        .position(|o| o.kind == OpKind::Remove && o.path.to_string_lossy().ends_with(".seg"))
        .expect("a replaced segment is removed");
    assert!(
        ops[rename..removal]
            .iter()
            .any(|o| o.kind == OpKind::SyncDir && o.path == dir),
        "a directory sync after the base's rename and before the first removal: {:?}",
        ops[rename..=removal]
            .iter()
            .map(|o| o.kind)
            .collect::<Vec<_>>()
    );
}

/// A batch waiting for its sync across a compaction's switch: the pending
/// batches' shadow was built, before the switch, on the values as they lay
/// before it (an unchanged put keeps its key's stored value), and the
/// switch moved those values into the base and removed their segments. A
/// batch planned after the switch against that shadow read a value that
/// was no longer there; the switch must drop the shadow, to be built again
/// on the moved values.
#[test]
fn a_batch_planned_after_a_compaction_s_switch_reads_values_the_switch_moved_not_a_stale_shadow() {
    use std::time::{Duration, Instant};

    const TIMEOUT: Duration = Duration::from_secs(20);
    let storage = FaultyStorage::new();
    let store = Store::open(
        "/db",
        options(&storage)
            .durability(Durability::Sync)
            .segment_bytes_max(16 * 1024)
            .snapshot_log_bytes(None)
            .zero_fill(false),
    )
    .unwrap();
    let value = format!("value 0 {}", "x".repeat(60));
    store
        .apply_batch(&Batch::new("K").put("e-k", "k", 1, value.clone()))
        .unwrap();
    fill(&store);
    let writes = || storage.op_count_of(OpKind::Write);
    let wait_for_write_after = |before: usize| {
        let deadline = Instant::now() + TIMEOUT;
        while writes() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(writes() > before, "the batch was written");
    };
    // P, an unchanged put of `k`; R, a redelivery of P's event; Q, another
    // unchanged put of `k`.
    let p = Batch::new("P").put("e-p", "k", 2, value.clone());
    let r = Batch::new("R").put("e-p", "k", 2, value.clone());
    let q = Batch::new("Q").put("e-q", "k", 3, value.clone());
    std::thread::scope(|scope| {
        // The compaction, past its cut, waits before its base's rename.
        storage.pause_next(OpKind::Rename);
        let compaction = scope.spawn(|| store.compact());
        let rename = storage.wait_until_paused(TIMEOUT).expect("rename held");
        // P waits for its sync.
        storage.pause_next(OpKind::SyncData);
        let p_thread = scope.spawn(|| store.apply_batch(&p));
        let sync = storage.wait_until_paused(TIMEOUT).expect("P's sync held");
        // R redelivers P's event: planning it builds the shadow.
        let before = writes();
        let r_thread = scope.spawn(|| store.apply_batch(&r));
        wait_for_write_after(before);
        storage.resume_op(rename);
        let report = compaction.join().unwrap().expect("compaction");
        assert!(report.segments_replaced > 1, "{report:?}");
        // Q, another unchanged put of `k`, is planned against the shadow.
        let before = writes();
        let q_thread = scope.spawn(|| store.apply_batch(&q));
        let deadline = Instant::now() + TIMEOUT;
        while writes() == before && !q_thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        storage.resume_op(sync);
        let q_report = q_thread
            .join()
            .unwrap()
            .expect("Q planned on the moved value");
        assert_eq!(q_report.unchanged, 1, "{q_report:?}");
        p_thread.join().unwrap().expect("P");
        assert_eq!(r_thread.join().unwrap().expect("R").duplicates, 1);
    });
    assert_eq!(store.get("k").unwrap().unwrap().seq, 3);
}
