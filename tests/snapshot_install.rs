//! Automatic snapshots are installed off the writers' path (DESIGN.md,
//! "Snapshots"): the batch that makes one due writes `SNAPSHOT.tmp` and
//! returns; a thread of the store's own syncs it and renames it into place.
//! Writers go on meanwhile, maintenance waits for the install, a failed
//! install fails no batch and is tried again after as much log again, and
//! under `Buffered` the install syncs the log first, poisoning the store if
//! that sync fails. The last two run with installs on the caller's thread
//! (as `FaultyStorage` has them by default) and on the store's own.

#![cfg(feature = "testing")]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use idemkv::storage::{Fault, FaultError, FaultyStorage, OpKind};
use idemkv::{Batch, Digest, Durability, Error, ManualClock, Options, Store};

const BATCHES: usize = 60;
const TIMEOUT: Duration = Duration::from_secs(10);

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn snapshot_path() -> PathBuf {
    dir().join("SNAPSHOT")
}

/// Buffered, one large segment (no rotation syncs the log), and a snapshot
/// due every 8 KiB of log: about every eight batches.
fn options(storage: &FaultyStorage) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .durability(Durability::Buffered)
        .segment_bytes_max(1 << 20)
        .snapshot_log_bytes(Some(8 * 1024))
        .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
}

/// Batch `i`: a 1 KiB value over a small key space, and a checkpoint.
fn batch(i: usize) -> Batch {
    Batch::new(format!("B{i:04}"))
        .put(
            format!("e{i}"),
            format!("k{}", i % 7),
            i as u64 + 1,
            format!("<{i}>").repeat(256),
        )
        .checkpoint("src", (i as u64).to_be_bytes())
}

/// The digest after the first `n` batches, from a store with no faults.
fn clean_digest(n: usize) -> Digest {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage)).expect("open");
    for i in 0..n {
        store.apply_batch(&batch(i)).expect("apply");
    }
    store.digest().expect("digest")
}

fn has_file(storage: &FaultyStorage, path: &PathBuf) -> bool {
    storage.files().contains(path)
}

fn is_segment(path: &std::path::Path) -> bool {
    path.extension() == Some("seg".as_ref())
}

/// Operations that wrote to `SNAPSHOT.tmp` so far.
fn snapshot_writes(storage: &FaultyStorage) -> usize {
    let tmp = dir().join("SNAPSHOT.tmp");
    storage
        .ops()
        .iter()
        .filter(|o| o.kind == OpKind::Write && o.path == tmp)
        .count()
}

/// Renames tried so far (each install tries one).
fn renames(storage: &FaultyStorage) -> usize {
    storage
        .ops()
        .iter()
        .filter(|o| o.kind == OpKind::Rename)
        .count()
}

fn storage(is_background: bool) -> FaultyStorage {
    let storage = FaultyStorage::new();
    if is_background {
        storage.allow_background_io();
    }
    storage
}

#[test]
fn writers_go_on_while_a_snapshot_is_installed_and_maintenance_waits_for_it() {
    // The first install held at its first step (under `Buffered` with one
    // segment, the first data sync after open is the install's sync of the
    // log), then at its last (the rename, outside the sync gate, which a
    // compaction's rotation would wait for anyway).
    for step in [OpKind::SyncData, OpKind::Rename] {
        install_held_at(step);
    }
}

fn install_held_at(step: OpKind) {
    const AFTER_HELD: usize = 20;
    let storage = storage(true);
    let store = Store::open(dir(), options(&storage)).expect("open");
    storage.pause_next(step);
    let is_held = AtomicBool::new(false);
    let compacted = AtomicBool::new(false);
    let (held, writer_done_while_held, compaction_waited, writes, compaction) =
        std::thread::scope(|scope| {
            // Writes until a batch writes a snapshot, waits for its install
            // to be held, then writes `AFTER_HELD` more (all in one segment:
            // a rotation would wait for the held sync).
            let writer = scope.spawn(|| {
                let mut i = 0;
                while snapshot_writes(&storage) == 0 && i < BATCHES {
                    store.apply_batch(&batch(i))?;
                    i += 1;
                }
                let deadline = Instant::now() + TIMEOUT;
                while !is_held.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                for _ in 0..AFTER_HELD {
                    store.apply_batch(&batch(i))?;
                    i += 1;
                }
                Ok::<_, Error>(i)
            });
            let held = storage.wait_until_paused(TIMEOUT);
            is_held.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + TIMEOUT;
            while !writer.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let writer_done_while_held = writer.is_finished();
            let compactor = scope.spawn(|| {
                let report = store.compact();
                compacted.store(true, Ordering::SeqCst);
                report
            });
            std::thread::sleep(Duration::from_millis(100));
            let compaction_waited = !compacted.load(Ordering::SeqCst);
            // Every check is taken before the resume, so that a failing one
            // cannot leave a thread held.
            storage.resume();
            let writes = writer.join().expect("writer thread");
            let compaction = compactor.join().expect("compaction thread");
            (
                held,
                writer_done_while_held,
                compaction_waited,
                writes,
                compaction,
            )
        });
    let held = held.expect("an automatic snapshot's install reaches the step");
    let ops = storage.ops();
    let held_op = ops.iter().find(|o| o.index == held).expect("held op");
    let held_file = held_op.path.file_name().and_then(|n| n.to_str());
    match step {
        OpKind::SyncData => assert!(is_segment(&held_op.path), "held {held_op:?}"),
        _ => assert_eq!(held_file, Some("SNAPSHOT.tmp"), "held {held_op:?}"),
    }
    assert!(
        writer_done_while_held,
        "{step:?}: the writer applied {AFTER_HELD} batches while the install was held"
    );
    let batches = writes.expect("every batch applies");
    let appends_after = ops
        .iter()
        .filter(|o| o.index > held && o.kind == OpKind::Write && is_segment(&o.path))
        .count();
    assert!(
        appends_after >= AFTER_HELD,
        "{step:?}: {appends_after} records appended while the install was held"
    );
    assert!(
        compaction_waited,
        "compaction waits for the running install"
    );
    compaction.expect("compaction after the install");

    let digest = store.digest().expect("digest");
    assert_eq!(digest, clean_digest(batches));
    store.close().expect("close");
    let reopened = Store::open(dir(), options(&storage)).expect("reopen");
    assert_eq!(reopened.digest().expect("digest"), digest);
}

#[test]
fn a_failed_install_fails_no_batch_and_is_tried_again_after_as_much_log_again() {
    for is_background in [false, true] {
        let storage = storage(is_background);
        let store = Store::open(dir(), options(&storage)).expect("open");
        storage.inject(Fault::new(OpKind::Rename, FaultError::Io));
        // The index of the failed rename's operation, once it ran.
        let failed_rename = || {
            storage
                .ops()
                .iter()
                .find(|o| o.kind == OpKind::Rename && o.failed)
                .map(|o| o.index)
        };
        let log_bytes_after = |op: u64| -> u64 {
            storage
                .ops()
                .iter()
                .filter(|o| o.index > op && o.kind == OpKind::Write && is_segment(&o.path))
                .map(|o| o.bytes)
                .sum()
        };
        let mut failed_after = None;
        for i in 0..BATCHES {
            let (writes_before, renames_before) = (snapshot_writes(&storage), renames(&storage));
            store
                .apply_batch(&batch(i))
                .expect("a failed install is not the batch's");
            if snapshot_writes(&storage) > writes_before {
                // This batch wrote a snapshot: let its install end (on the
                // installer's thread it may not have yet), so that both
                // modes run the same way from here.
                let deadline = Instant::now() + TIMEOUT;
                while renames(&storage) == renames_before && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            if failed_after.is_none()
                && let Some(op) = failed_rename()
            {
                failed_after = Some((i, snapshot_writes(&storage), op));
            }
            if let Some((_, writes, op)) = failed_after
                && log_bytes_after(op) + 2 * 1024 <= 8 * 1024
            {
                // The next try waits for 8 KiB of log after the failure (a
                // batch adds about 1 KiB, and on the installer's thread the
                // failure may come a batch late): none is written before.
                assert_eq!(
                    snapshot_writes(&storage),
                    writes,
                    "background {is_background}: batch {i} wrote a snapshot again"
                );
            }
        }
        let (at, _, _) = failed_after.expect("an install was tried");
        assert!(
            has_file(&storage, &snapshot_path()),
            "background {is_background}: installed in a later try (the first failed after batch {at})"
        );
        store.close().expect("close");
    }
}

#[test]
fn under_buffered_the_install_syncs_the_log_first_and_its_failure_poisons() {
    for is_background in [false, true] {
        let what = format!("background {is_background}");
        let storage = storage(is_background);
        let store = Store::open(dir(), options(&storage)).expect("open");
        // Under `Buffered` with one segment, the first data sync after open
        // is the install's sync of the log.
        storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
        // Batches until one writes a snapshot: it returns `Ok`, its install
        // syncing the log after it.
        let mut committed = 0;
        while snapshot_writes(&storage) == 0 {
            assert!(committed < BATCHES, "{what}: no snapshot was written");
            store
                .apply_batch(&batch(committed))
                .expect("writing a snapshot syncs nothing");
            committed += 1;
        }
        // `snapshot` waits for the running install first, which fails.
        let refused = store
            .snapshot()
            .expect_err("the install's failed sync poisoned the store");
        assert!(
            matches!(&refused, Error::Poisoned { reason } if reason.contains("snapshot sync failed")),
            "{what}: {refused:?}"
        );
        assert!(matches!(
            store.apply_batch(&batch(committed)),
            Err(Error::Poisoned { .. })
        ));
        let ops = storage.ops();
        let failed = ops
            .iter()
            .find(|o| o.failed)
            .expect("the injected fault fired");
        assert!(
            failed.kind == OpKind::SyncData && is_segment(&failed.path),
            "{what}: {failed:?}"
        );
        assert!(
            ops.iter().all(|o| o.kind != OpKind::Rename),
            "{what}: no snapshot goes in place over a log that failed to sync"
        );
        assert!(
            has_file(&storage, &dir().join("SYNC_FAILED")),
            "{what}: open is told"
        );

        // The batches acknowledged before are all there after a reopen,
        // which rewrites the segment whose sync failed; the rest then applies.
        storage.heal();
        drop(store);
        let reopened = Store::open(dir(), options(&storage)).expect("reopen");
        assert_eq!(
            reopened.digest().expect("digest"),
            clean_digest(committed),
            "{what}"
        );
        for i in committed..BATCHES {
            reopened.apply_batch(&batch(i)).expect("apply after reopen");
        }
        assert_eq!(reopened.digest().expect("digest"), clean_digest(BATCHES));
    }
}

/// The length of the file at `path` on `storage`.
fn file_len(storage: &FaultyStorage, path: &std::path::Path) -> u64 {
    use idemkv::storage::{OpenMode, Storage};
    storage
        .open(path, OpenMode::Read)
        .expect("open file")
        .len()
        .expect("file length")
}

/// An automatic snapshot waits for as much new log as the size of the last
/// snapshot written *or loaded* (DESIGN.md, "Snapshots"), so that a store
/// reopened from a large snapshot does not rewrite it after every
/// `snapshot_log_bytes` of log.
#[test]
fn after_a_reopen_an_automatic_snapshot_waits_for_as_much_log_as_the_loaded_one() {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage).snapshot_log_bytes(None)).expect("open");
    // Many small keys: a snapshot several times `snapshot_log_bytes`.
    for i in 0..40 {
        let mut b = Batch::new(format!("L{i:04}"));
        for j in 0..100 {
            b = b.put(format!("l{i}-{j}"), format!("l{i:04}-{j:03}"), 1, "v");
        }
        store.apply_batch(&b).expect("apply");
    }
    store.snapshot().expect("snapshot");
    store.close().expect("close");
    let loaded = file_len(&storage, &snapshot_path());
    assert!(loaded > 4 * 8 * 1024, "a snapshot of {loaded} bytes");

    let store = Store::open(dir(), options(&storage)).expect("reopen");
    assert!(store.stats().opened_from_snapshot);
    let writes = snapshot_writes(&storage);
    let log_bytes = || -> u64 {
        storage
            .ops()
            .iter()
            .filter(|o| o.kind == OpKind::Write && is_segment(&o.path))
            .map(|o| o.bytes)
            .sum()
    };
    let at_open = log_bytes();
    let mut i = 0;
    while snapshot_writes(&storage) == writes {
        store.apply_batch(&batch(i)).expect("apply");
        i += 1;
        assert!(i < 1_000, "no snapshot was ever written");
    }
    let written = log_bytes() - at_open;
    assert!(
        written >= loaded,
        "a snapshot after {written} bytes of log, the loaded one has {loaded}"
    );
    store.close().expect("close");
}

/// `close` writes a snapshot when the next open would replay at least
/// 64 KiB of log, counting the log this open replayed (DESIGN.md,
/// "Snapshots"): a store reopened after its process died, and closed
/// without a write, spares the open after it that replay.
#[test]
fn close_after_an_open_that_replayed_much_log_writes_a_snapshot() {
    let storage = FaultyStorage::new();
    let options = |storage: &FaultyStorage| options(storage).snapshot_log_bytes(None);
    let store = Store::open(dir(), options(&storage)).expect("open");
    for i in 0..BATCHES + 20 {
        store.apply_batch(&batch(i)).expect("apply");
    }
    // The process dies: no close, no snapshot.
    let image = storage.crash_image(idemkv::storage::CrashPolicy::ProcessCrash);
    drop(store);
    assert!(!has_file(&image, &snapshot_path()));

    let store = Store::open(dir(), options(&image)).expect("reopen");
    assert!(store.stats().records_replayed_at_open > 0);
    store.close().expect("close");
    assert!(
        has_file(&image, &snapshot_path()),
        "close wrote no snapshot"
    );
    let store = Store::open(dir(), options(&image)).expect("open again");
    assert!(store.stats().opened_from_snapshot);
    assert_eq!(store.stats().records_replayed_at_open, 0);
}
