//! Automatic snapshots are installed off the writers' path (DESIGN.md,
//! "Snapshots"): the batch that makes one due writes `SNAPSHOT.tmp` and
//! returns; a thread of the store's own syncs it and renames it into place.
//! Writers go on meanwhile, maintenance waits for the install, a failed
//! install leaves the snapshot due without failing any batch, and under
//! `Buffered` the install syncs the log first, poisoning the store if that
//! sync fails.

#![cfg(feature = "testing")]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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

#[test]
fn writers_go_on_while_a_snapshot_is_installed_and_maintenance_waits_for_it() {
    let storage = FaultyStorage::new();
    storage.allow_background_io();
    let store = Store::open(dir(), options(&storage)).expect("open");
    // Holds the first install at its rename: the snapshot is written and
    // synced, not yet in place.
    storage.pause_next(OpKind::Rename);
    let applied = AtomicUsize::new(0);
    let compacted = AtomicBool::new(false);
    let (held, applied_while_held, compaction_waited, writes, compaction) =
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                for i in 0..BATCHES {
                    store.apply_batch(&batch(i))?;
                    applied.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, Error>(())
            });
            let held = storage.wait_until_paused(TIMEOUT);
            let deadline = Instant::now() + TIMEOUT;
            while applied.load(Ordering::SeqCst) < BATCHES && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let applied_while_held = applied.load(Ordering::SeqCst);
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
                applied_while_held,
                compaction_waited,
                writes,
                compaction,
            )
        });
    let held = held.expect("an automatic snapshot's install reaches its rename");
    writes.expect("every batch applies");
    assert_eq!(
        applied_while_held, BATCHES,
        "the writer finished while the install was held"
    );
    let appends_after = storage
        .ops()
        .iter()
        .filter(|o| {
            o.index > held && o.kind == OpKind::Write && o.path.extension() == Some("seg".as_ref())
        })
        .count();
    assert!(
        appends_after >= 20,
        "{appends_after} records appended while the install was held"
    );
    assert!(
        compaction_waited,
        "compaction waits for the running install"
    );
    compaction.expect("compaction after the install");

    let digest = store.digest().expect("digest");
    assert_eq!(digest, clean_digest(BATCHES));
    store.close().expect("close");
    let reopened = Store::open(dir(), options(&storage)).expect("reopen");
    assert_eq!(reopened.digest().expect("digest"), digest);
}

#[test]
fn a_failed_install_fails_no_batch_and_leaves_the_snapshot_due() {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage)).expect("open");
    storage.inject(Fault::new(OpKind::Rename, FaultError::Io));
    let mut failed_at = None;
    for i in 0..BATCHES {
        store
            .apply_batch(&batch(i))
            .expect("a failed install is not the batch's");
        if failed_at.is_none()
            && storage
                .ops()
                .iter()
                .any(|o| o.kind == OpKind::Rename && o.failed)
        {
            failed_at = Some(i);
            assert!(!has_file(&storage, &snapshot_path()), "nothing installed");
        } else if failed_at.is_some() {
            // Still due: the next batch writes and installs it.
            assert!(
                has_file(&storage, &snapshot_path()),
                "installed after batch {i}"
            );
            break;
        }
    }
    assert!(failed_at.is_some(), "an install was tried");
}

#[test]
fn under_buffered_the_install_syncs_the_log_first_and_its_failure_poisons() {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage)).expect("open");
    // Under `Buffered` with one segment, the first data sync after open is
    // the install's sync of the log.
    let syncs_at_open = storage
        .ops()
        .iter()
        .filter(|o| o.kind == OpKind::SyncData)
        .count();
    storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
    let mut committed = 0;
    let refused = loop {
        assert!(committed < BATCHES, "no snapshot was due");
        match store.apply_batch(&batch(committed)) {
            Ok(_) => committed += 1,
            Err(e) => break e,
        }
    };
    let ops = storage.ops();
    let failed_sync = ops
        .iter()
        .filter(|o| o.kind == OpKind::SyncData)
        .nth(syncs_at_open)
        .expect("the install synced");
    assert!(failed_sync.failed && failed_sync.path.extension() == Some("seg".as_ref()));
    assert!(
        ops.iter().all(|o| o.kind != OpKind::Rename),
        "no snapshot goes in place over a log that failed to sync"
    );
    assert!(
        matches!(&refused, Error::Poisoned { reason } if reason.contains("snapshot sync failed")),
        "{refused:?}"
    );
    assert!(
        has_file(&storage, &dir().join("SYNC_FAILED")),
        "open is told"
    );

    // The batches acknowledged before are all there after a reopen, which
    // rewrites the segment whose sync failed; the rest then applies.
    storage.heal();
    drop(store);
    let reopened = Store::open(dir(), options(&storage)).expect("reopen");
    assert_eq!(reopened.digest().expect("digest"), clean_digest(committed));
    for i in committed..BATCHES {
        reopened.apply_batch(&batch(i)).expect("apply after reopen");
    }
    assert_eq!(reopened.digest().expect("digest"), clean_digest(BATCHES));
}
