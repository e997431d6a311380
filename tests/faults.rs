//! Contract area: I/O faults and bit rot (SPEC section 4; issue 5).
//!
//! EIO and ENOSPC at every storage operation of a scripted workload (the
//! store's creation, appends, commit syncs, segment rotation, snapshots,
//! compactions, close and reopen), of a recovery that truncates a torn tail,
//! and of a repair: the failing call returns the error, no partial batch is
//! visible, later writes are refused with `Error::Poisoned` (a failed write
//! or sync is never retried), nothing committed before is lost, and after
//! reopening on the healed storage the workload resumes to the uninterrupted
//! final state. Batches acknowledged after a failed sync and a reopen
//! survive a power loss, although the failed sync's pages never reach the
//! disk (Linux marks them clean).
//!
//! Bit rot in synced data is reported as `Error::Corruption` naming segment
//! and offset: by `verify_dir` always, by `open` when it reads the record,
//! and by the reads that touch it when a snapshot spares `open` the record.
//! `repair` salvages the valid prefix, also when it is itself interrupted.

#![cfg(feature = "testing")]

use std::ops::{Range, RangeInclusive};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use idemkv::storage::{
    CrashPolicy, Fault, FaultError, FaultyStorage, OpKind, OpRecord, OpenMode, Storage,
};
use idemkv::{
    Batch, BatchReport, Clock, Digest, Durability, Error, ManualClock, Options, Record, Store,
};

const SOURCE: &str = "src";
const SEGMENT_BYTES_MAX: u64 = 2048;
const SNAPSHOT_LOG_BYTES: u64 = 3000;
const SEGMENT_HEADER_BYTES: u64 = 32;

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn segment_path(id: u64) -> PathBuf {
    dir().join(format!("{id:010}.seg"))
}

static NOW_MS: AtomicU64 = AtomicU64::new(1_750_000_000_000);

/// A clock shared by every store of the test process that moves one
/// millisecond per reading, so that no two repairs share a `lost+found`
/// directory (see `repair_after_an_interrupted_repair_at_the_same_clock_reading`).
#[derive(Debug)]
struct TickingClock;

impl Clock for TickingClock {
    fn now_ms(&self) -> u64 {
        NOW_MS.fetch_add(1, Ordering::SeqCst) + 1
    }
}

fn options(storage: &FaultyStorage) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .durability(Durability::Sync)
        .segment_bytes_max(SEGMENT_BYTES_MAX)
        // Automatic snapshots during the workload, so that crashes and
        // faults also land in the ones `apply_batch` writes.
        .snapshot_log_bytes(Some(SNAPSHOT_LOG_BYTES))
        .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
}

/// Options for `Store::repair`, whose clock names its `lost+found` directory.
fn repair_options(storage: &FaultyStorage) -> Options {
    options(storage).clock(Arc::new(TickingClock))
}

fn value(i: usize, j: usize) -> Vec<u8> {
    format!("<value {i}.{j}>").repeat(8).into_bytes()
}

/// Puts over a rotating set of keys, in the last batch one of them unchanged
/// (its value read back to compare), a delete every third batch, a counter, a redelivered
/// event of the batch before, a checkpoint per batch.
fn workload() -> Vec<Batch> {
    (0..10usize)
        .map(|i| {
            let seq = (i as u64 + 1) * 10;
            let mut b = Batch::new(format!("B{i:02}"));
            if i == 9 {
                // The value the batch before put last, again, at a newer seq.
                let key = format!("k{}", (i + 1) % 7);
                b = b.put(format!("u{i}"), key, seq - 1, value(i - 1, 2));
            }
            for j in 0..3 {
                b = b.put(
                    format!("e{i}.{j}"),
                    format!("k{}", (i + j) % 7),
                    seq + j as u64,
                    value(i, j),
                );
            }
            if i % 3 == 1 {
                b = b.delete(format!("d{i}"), format!("k{}", (i + 5) % 7), seq + 5);
            }
            b = b.add(format!("a{i}"), "visits", seq, i as i64 + 1);
            if i > 0 {
                let p = i - 1;
                b = b.put(
                    format!("e{p}.0"),
                    format!("k{}", p % 7),
                    (p as u64 + 1) * 10,
                    value(p, 0),
                );
            }
            b.checkpoint(SOURCE, (i as u64 + 1).to_be_bytes())
        })
        .collect()
}

/// The observable state.
#[derive(Debug, Clone, PartialEq)]
struct Snap {
    digest: Digest,
    rows: Vec<(Bytes, Record)>,
    checkpoint: Option<Bytes>,
    log: Vec<Bytes>,
}

fn snap(store: &Store) -> Snap {
    Snap {
        digest: store.digest().expect("digest"),
        rows: store
            .scan_prefix(b"")
            .collect::<Result<Vec<_>, _>>()
            .expect("scan"),
        checkpoint: store.checkpoint(SOURCE).expect("checkpoint"),
        log: store.log().into_iter().map(|e| e.batch_id).collect(),
    }
}

/// The uninterrupted run.
struct Clean {
    /// `states[i]`: after `i` batches.
    states: Vec<Snap>,
    reports: Vec<BatchReport>,
    /// The storage operations of the workload alone.
    ops: Vec<OpRecord>,
    /// Its disk at the end.
    storage: FaultyStorage,
}

/// Work the script does between batches, besides writing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Maintenance {
    Snapshot,
    Compact,
    /// Close (which writes a snapshot) and open again.
    Reopen,
}

/// The maintenance the script runs after batch `i`.
fn maintenance_after(i: usize) -> &'static [Maintenance] {
    match i {
        2 => &[Maintenance::Snapshot],
        4 => &[Maintenance::Compact],
        6 => &[Maintenance::Reopen],
        8 => &[Maintenance::Compact],
        _ => &[],
    }
}

/// Runs the script (batches, and maintenance if `maintained`) on `storage`
/// and closes the store; `after_batch` sees the store after each batch.
fn run_script(
    storage: &FaultyStorage,
    batches: &[Batch],
    maintained: bool,
    mut after_batch: impl FnMut(&Store, BatchReport),
) {
    let mut store = Store::open(dir(), options(storage)).expect("open");
    for (i, b) in batches.iter().enumerate() {
        let report = store.apply_batch(b).expect("clean apply");
        after_batch(&store, report);
        for &m in maintenance_after(i).iter().filter(|_| maintained) {
            match m {
                Maintenance::Snapshot => store.snapshot().expect("snapshot"),
                Maintenance::Compact => {
                    store.compact().expect("compact");
                }
                Maintenance::Reopen => {
                    store.close().expect("close");
                    store = Store::open(dir(), options(storage)).expect("reopen");
                }
            }
        }
    }
    // The workload is too small for close to judge a snapshot worth its
    // cost: take one, so that the closed store has one to test.
    store.snapshot().expect("snapshot");
    store.close().expect("close");
}

fn clean_run(batches: &[Batch], maintained: bool) -> Clean {
    let storage = FaultyStorage::new();
    let mut states = Vec::new();
    let mut reports = Vec::new();
    {
        let store = Store::open(dir(), options(&storage)).expect("open");
        states.push(snap(&store));
    }
    let storage = FaultyStorage::new();
    run_script(&storage, batches, maintained, |store, report| {
        states.push(snap(store));
        reports.push(report);
    });
    // The operations of the script alone (reading the states made more).
    let counted = FaultyStorage::new();
    run_script(&counted, batches, maintained, |_, _| {});
    Clean {
        states,
        reports,
        ops: counted.ops(),
        storage,
    }
}

/// The position of `op` among the operations of its kind in `ops`.
fn ordinal(ops: &[OpRecord], op: &OpRecord) -> u64 {
    ops.iter()
        .take_while(|o| o.index < op.index)
        .filter(|o| o.kind == op.kind)
        .count() as u64
}

/// The fault that makes `op` fail: EIO once, or ENOSPC from then on (a
/// full disk stays full until healed). Appends write half their bytes first.
fn fault_at(ops: &[OpRecord], op: &OpRecord, error: FaultError) -> Fault {
    let mut fault = Fault::new(op.kind, error).skip(ordinal(ops, op));
    let is_read = matches!(
        op.kind,
        OpKind::Map | OpKind::Read | OpKind::Len | OpKind::List
    );
    if error == FaultError::NoSpace && !is_read {
        fault = fault.always();
    }
    if op.kind == OpKind::Write {
        fault = fault.written_bytes(op.bytes as usize / 2);
    }
    fault
}

fn errno(error: FaultError) -> &'static str {
    match error {
        FaultError::Io => "os error 5",
        FaultError::NoSpace => "os error 28",
        FaultError::PermissionDenied => "os error 13",
    }
}

/// Whether a failure of this operation must be reported and must poison
/// the store: it writes (opening a file for reading only does not).
fn is_write(op: &OpRecord) -> bool {
    match op.kind {
        OpKind::Write
        | OpKind::SyncData
        | OpKind::SetLen
        | OpKind::SyncDir
        | OpKind::Rename
        | OpKind::Remove => true,
        OpKind::Open => op.mode == Some(OpenMode::CreateNew),
        _ => false,
    }
}

/// Reopens `storage`, checks it holds a prefix of `at_least` to `at_most`
/// batches, and resumes from its checkpoint to the end.
fn reopen_and_resume(
    storage: &FaultyStorage,
    batches: &[Batch],
    clean: &Clean,
    prefixes: RangeInclusive<usize>,
    what: &str,
) {
    let store = Store::open(dir(), options(storage))
        .unwrap_or_else(|e| panic!("{what}: reopen on the healed storage: {e}"));
    let got = snap(&store);
    let Some(prefix) = prefixes
        .clone()
        .find(|&p| clean.states.get(p) == Some(&got))
    else {
        panic!(
            "{what}: after reopen the state is not a prefix of {prefixes:?} batches; log {:?}",
            got.log
        );
    };
    let next = got.checkpoint.as_ref().map_or(0, |c| {
        let position: [u8; 8] = c[..].try_into().expect("8-byte checkpoint");
        u64::from_be_bytes(position) as usize
    });
    assert_eq!(next, prefix, "{what}: the checkpoint is the prefix's");
    for (i, b) in batches.iter().enumerate().skip(next) {
        let report = store
            .apply_batch(b)
            .unwrap_or_else(|e| panic!("{what}: resumed batch {i}: {e}"));
        assert_eq!(Some(&report), clean.reports.get(i), "{what}: batch {i}");
    }
    assert_eq!(
        Some(&snap(&store)),
        clean.states.last(),
        "{what}: resumed workload does not reach the uninterrupted state"
    );
}

/// Runs the script with a fault armed that makes operation `op` fail; checks
/// the failing call's answer and the state, then heals, reopens and resumes.
fn run_with_fault(batches: &[Batch], clean: &Clean, op: &OpRecord, error: FaultError) {
    let what = format!(
        "{error:?} at op {} ({:?} {})",
        op.index,
        op.kind,
        op.path.display()
    );
    let storage = FaultyStorage::new();
    storage.inject(fault_at(&clean.ops, op, error));
    let fails_with_the_fault = |call: &str, e: &Error| {
        assert!(
            e.to_string().contains(errno(error)),
            "{what}: {call} returns the error: {e}"
        );
    };

    // A failed batch: the error, no trace of the batch, and refusal of every
    // later write until reopened.
    let check_failed_batch = |store: &Store, i: usize, e: &Error| {
        assert!(
            matches!(e, Error::Io { .. } | Error::Poisoned { .. }),
            "{what}: batch {i} fails with Io or Poisoned: {e:?}"
        );
        fails_with_the_fault(&format!("batch {i}"), e);
        assert_eq!(
            Some(&snap(store)),
            clean.states.get(i),
            "{what}: batch {i} failed, yet the state changed"
        );
        if is_write(op) {
            storage.heal();
            for retry in [i, (i + 1).min(batches.len() - 1)] {
                let b = batches.get(retry).expect("batch index in range");
                let e = store
                    .apply_batch(b)
                    .expect_err("a poisoned store refuses writes");
                assert!(
                    matches!(e, Error::Poisoned { .. }),
                    "{what}: batch {retry} after the failure: {e:?}"
                );
            }
            assert_eq!(
                Some(&snap(store)),
                clean.states.get(i),
                "{what}: the refused batches changed the state"
            );
        }
    };

    let mut store = match Store::open(dir(), options(&storage)) {
        Ok(store) => store,
        Err(e) => {
            fails_with_the_fault("open", &e);
            storage.heal();
            reopen_and_resume(&storage, batches, clean, 0..=0, &what);
            return;
        }
    };
    for (i, b) in batches.iter().enumerate() {
        if let Err(e) = store.apply_batch(b) {
            check_failed_batch(&store, i, &e);
            drop(store);
            storage.heal();
            reopen_and_resume(&storage, batches, clean, i..=i + 1, &what);
            return;
        }
        // Maintenance fails as a whole: the state stays that of batch `i`.
        for &m in maintenance_after(i) {
            let done = i + 1..=i + 1;
            if m == Maintenance::Reopen {
                if let Err(e) = store.close() {
                    fails_with_the_fault("close", &e);
                    storage.heal();
                    reopen_and_resume(&storage, batches, clean, done, &what);
                    return;
                }
                match Store::open(dir(), options(&storage)) {
                    Ok(s) => store = s,
                    Err(e) => {
                        fails_with_the_fault("reopen", &e);
                        storage.heal();
                        reopen_and_resume(&storage, batches, clean, done, &what);
                        return;
                    }
                }
                continue;
            }
            let result = if m == Maintenance::Snapshot {
                store.snapshot()
            } else {
                store.compact().map(|_| ())
            };
            if let Err(e) = result {
                fails_with_the_fault(&format!("{m:?} after batch {i}"), &e);
                assert_eq!(
                    Some(&snap(&store)),
                    clean.states.get(i + 1),
                    "{what}: {m:?} failed and changed the state"
                );
                drop(store);
                storage.heal();
                reopen_and_resume(&storage, batches, clean, done, &what);
                return;
            }
        }
    }
    // The fault is in the final snapshot or close, or in a read whose
    // failure costs nothing (a file length for the stats).
    let all = batches.len();
    if let Err(e) = store.snapshot() {
        fails_with_the_fault("final snapshot", &e);
        drop(store);
        storage.heal();
        reopen_and_resume(&storage, batches, clean, all..=all, &what);
        return;
    }
    match store.close() {
        Err(e) => fails_with_the_fault("close", &e),
        Ok(()) => {
            assert!(!is_write(op), "{what}: the failed write went unreported");
            // A read whose failure costs nothing, not a fault that never
            // met its operation.
            assert!(
                storage.ops().iter().any(|o| o.failed),
                "{what}: the fault never fired"
            );
        }
    }
    storage.heal();
    reopen_and_resume(&storage, batches, clean, all..=all, &what);
}

#[test]
fn faults_at_every_operation_of_the_workload_poison_and_lose_nothing() {
    let batches = workload();
    let clean = clean_run(&batches, true);
    let rotations = clean
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::SyncDir)
        .count();
    assert!(rotations >= 3, "the workload rotates segments");
    assert!(
        clean.ops.iter().any(|o| o.kind == OpKind::Read),
        "the workload reads a stored value back to compare it"
    );
    for op in &clean.ops {
        if op.kind == OpKind::SyncData && is_commit_sync(&clean.ops, op) {
            continue; // faults_at_commit_syncs_leave_no_batch_visible
        }
        for error in [FaultError::Io, FaultError::NoSpace] {
            run_with_fault(&batches, &clean, op, error);
        }
    }
}

#[test]
fn faults_at_every_operation_around_a_large_batch_poison_and_lose_nothing() {
    // A record over 32 KiB: the writer applies its seen ids while the disk
    // writes it back, before the sync, so a failure after that must still
    // leave nothing of the batch behind.
    let mut large = Batch::new("LARGE");
    for j in 0..320usize {
        let seq = 1_000 + j as u64;
        large = large.put(format!("l{j}"), format!("large{j}"), seq, value(99, j));
    }
    // Then two of its events again: duplicates, found through the seen ids
    // the writer applied before the large record's sync.
    let again = Batch::new("LARGE-AGAIN")
        .put("l0", "large0", 1_000, value(99, 0))
        .put("l319", "large319", 1_319, value(99, 319));
    let mut batches = workload();
    batches.truncate(7);
    batches.insert(5, large);
    batches.insert(6, again);
    // Each batch's checkpoint is its position + 1, as `reopen_and_resume` reads it.
    let batches: Vec<Batch> = batches
        .into_iter()
        .enumerate()
        .map(|(p, b)| b.checkpoint(SOURCE, (p as u64 + 1).to_be_bytes()))
        .collect();
    let clean = clean_run(&batches, true);
    assert_eq!(clean.reports[6].duplicates, 2, "{:?}", clean.reports[6]);
    let large_write = clean
        .ops
        .iter()
        .find(|o| is_record_append(o) && o.bytes >= 32 << 10)
        .expect("the workload writes a record over 32 KiB");
    let commit = clean
        .ops
        .iter()
        .find(|o| o.index > large_write.index && is_commit_sync(&clean.ops, o))
        .expect("the large record's commit sync");
    // Up to the large batch's commit: after it, `apply_batch` writes a
    // snapshot (the log grew past the last one) whose failures it ignores,
    // since a snapshot only saves time at the next open; the workload test
    // above covers the rest.
    for op in clean.ops.iter().take_while(|o| o.index <= commit.index) {
        for error in [FaultError::Io, FaultError::NoSpace] {
            run_with_fault(&batches, &clean, op, error);
        }
    }
}

/// Whether `op` appends a record to a log segment (not a segment header,
/// and not a snapshot or a compaction's base file).
fn is_record_append(op: &OpRecord) -> bool {
    op.kind == OpKind::Write
        && op.offset >= SEGMENT_HEADER_BYTES
        && op.path.extension().is_some_and(|e| e == "seg")
}

/// Whether `op` is the sync that commits a batch record (not the sync of a
/// segment being sealed or created).
fn is_commit_sync(ops: &[OpRecord], op: &OpRecord) -> bool {
    op.kind == OpKind::SyncData
        && op
            .index
            .checked_sub(1)
            .and_then(|i| ops.get(i as usize))
            .is_some_and(is_record_append)
}

#[test]
fn faults_at_commit_syncs_leave_no_batch_visible() {
    let batches = workload();
    let clean = clean_run(&batches, true);
    for op in clean.ops.iter().filter(|o| is_commit_sync(&clean.ops, o)) {
        for error in [FaultError::Io, FaultError::NoSpace] {
            run_with_fault(&batches, &clean, op, error);
        }
    }
}

/// A failed commit sync may have written some of its pages before the
/// error (Linux reports it for the file, not for the pages), and a power
/// loss may follow at once: the disk then holds a prefix of the failed
/// sync's bytes, from a frame cut in its header to the whole record. Open
/// holds the acknowledged batches, and the failed one only if its whole
/// record made it; the workload resumes to the uninterrupted state.
#[test]
fn a_power_loss_after_a_failed_commit_sync_that_wrote_part_of_it_keeps_every_acknowledged_batch() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    for op in clean.ops.iter().filter(|o| is_commit_sync(&clean.ops, o)) {
        for written in [10, 100, 1_000, usize::MAX] {
            let what = format!("Io at commit sync op {}, {written} bytes written", op.index);
            let storage = FaultyStorage::new();
            storage.inject(
                Fault::new(OpKind::SyncData, FaultError::Io)
                    .skip(ordinal(&clean.ops, op))
                    .written_bytes(written),
            );
            let store = Store::open(dir(), options(&storage)).expect("open");
            let failed_at = batches
                .iter()
                .position(|b| store.apply_batch(b).is_err())
                .unwrap_or_else(|| panic!("{what}: the sync fault fails a batch"));
            drop(store);
            let image = storage.crash_image(CrashPolicy::PowerLoss);
            reopen_and_resume(&image, &batches, &clean, failed_at..=failed_at + 1, &what);
        }
    }
}

/// The workload's disk as a process crash inside the append of batch
/// `batch` leaves it: the record is torn in half.
fn torn_tail_image(clean: &Clean, batch: usize) -> (FaultyStorage, OpRecord) {
    let op = clean
        .ops
        .iter()
        .filter(|o| is_record_append(o))
        .nth(batch)
        .expect("the batch has an append")
        .clone();
    let storage = FaultyStorage::new();
    storage.crash_at_torn(op.index, op.bytes as usize / 2);
    if let Ok(store) = Store::open(dir(), options(&storage)) {
        for b in workload() {
            if store.apply_batch(&b).is_err() {
                break;
            }
        }
    }
    (storage.crash_image(CrashPolicy::ProcessCrash), op)
}

#[test]
fn faults_during_tail_truncation_fail_open_then_reopen_recovers() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let mut cuts = 0;
    for batch in [2, 7] {
        let (image, _) = torn_tail_image(&clean, batch);
        let probe = image.crash_image(CrashPolicy::ProcessCrash);
        let store = Store::open(dir(), options(&probe)).expect("open truncates the torn tail");
        // Only open's own operations: closing the store writes a snapshot.
        let open_ops = probe.ops();
        drop(store);
        assert!(
            open_ops.iter().any(|o| o.kind == OpKind::Rename),
            "recovery replaces the torn segment by a copy of its records"
        );
        for op in &open_ops {
            for error in [FaultError::Io, FaultError::NoSpace] {
                let what = format!(
                    "torn batch {batch}, {error:?} at open op {} ({:?})",
                    op.index, op.kind
                );
                let storage = image.crash_image(CrashPolicy::ProcessCrash);
                storage.inject(fault_at(&open_ops, op, error));
                // A snapshot that cannot be read is not used: open replays
                // the log (and fails only if that fails too).
                let reads_snapshot = op.path.ends_with("SNAPSHOT");
                match Store::open(dir(), options(&storage)) {
                    Ok(store) if reads_snapshot => assert!(
                        !store.stats().opened_from_snapshot,
                        "{what}: open replays the log instead"
                    ),
                    Ok(_) => panic!("{what}: open succeeded despite the fault"),
                    Err(e) => assert!(
                        e.to_string().contains(errno(error)),
                        "{what}: open returns the error: {e}"
                    ),
                }
                storage.heal();
                // After a power loss right after the failed open, and without.
                let after = storage.crash_image(CrashPolicy::PowerLoss);
                reopen_and_resume(&after, &batches, &clean, batch..=batch + 1, &what);
                reopen_and_resume(&storage, &batches, &clean, batch..=batch + 1, &what);
                cuts += 1;
            }
        }
    }
    assert!(cuts >= 20, "{cuts} cuts");
}

/// Records of the clean run: (segment id, byte range, batch index).
fn records(clean: &Clean) -> Vec<(u64, Range<u64>, usize)> {
    clean
        .ops
        .iter()
        .filter(|o| is_record_append(o))
        .enumerate()
        .map(|(batch, o)| {
            let name = o
                .path
                .file_stem()
                .expect("segment file name")
                .to_string_lossy();
            let segment: u64 = name.parse().expect("segment id");
            (segment, o.offset..o.offset + o.bytes, batch)
        })
        .collect()
}

fn expect_corruption(
    result: Result<impl std::fmt::Debug, Error>,
    segment: u64,
    at: &Range<u64>,
    what: &str,
) -> u64 {
    match result {
        Err(Error::Corruption {
            segment: s, offset, ..
        }) => {
            assert_eq!(s, segment, "{what}: corruption names the segment");
            assert!(
                at.contains(&offset),
                "{what}: corruption at offset {offset}, outside the damaged record {at:?}"
            );
            offset
        }
        other => panic!("{what}: expected Corruption in segment {segment}, got {other:?}"),
    }
}

/// Whether the store keeps its snapshot when bit rot strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SnapshotKept {
    /// Open loads the snapshot and does not read the records it covers.
    Kept,
    /// Open replays every record.
    Removed,
}

/// The clean run's disk, without its snapshot if so asked.
fn clean_disk(clean: &Clean, snapshot: SnapshotKept) -> FaultyStorage {
    let storage = clean.storage.crash_image(CrashPolicy::PowerLoss);
    let snapshot_path = dir().join("SNAPSHOT");
    assert!(
        storage.file_len(&snapshot_path).is_some(),
        "closing the store wrote a snapshot"
    );
    if snapshot == SnapshotKept::Removed {
        storage
            .remove_file(&snapshot_path)
            .expect("remove snapshot");
        storage.sync_dir(&dir()).expect("sync dir");
    }
    storage
}

/// Flips `mask` at `offset` of record `r`, then checks detection (by
/// `verify_dir` always, by `open` when it reads the record, by reads of the
/// rows otherwise), repair, and the state after repair.
fn rot_and_repair(clean: &Clean, r: usize, offset: u64, mask: u8, snapshot: SnapshotKept) {
    let all = records(clean);
    let (segment, range, batch) = all.get(r).expect("record index").clone();
    let what = format!(
        "record {r} (segment {segment}, {range:?}), byte {offset} ^ {mask:#x}, snapshot {snapshot:?}"
    );
    let storage = clean_disk(clean, snapshot);
    storage
        .corrupt(segment_path(segment), offset, mask)
        .expect("corrupt");

    let verified = Store::verify_dir(dir(), &options(&storage));
    let first_bad = expect_corruption(verified, segment, &range, &format!("{what}: verify_dir"));
    match Store::open(dir(), options(&storage)) {
        Err(e) => {
            let at = expect_corruption(Err::<(), _>(e), segment, &range, &format!("{what}: open"));
            assert_eq!(at, first_bad, "{what}: open and verify agree");
        }
        Ok(store) => {
            assert_eq!(
                snapshot,
                SnapshotKept::Kept,
                "{what}: open without a snapshot replays the damaged record"
            );
            // Every row reads back as it was committed, or as Corruption.
            let last = clean.states.last().expect("states");
            for (key, record) in &last.rows {
                match store.get(key) {
                    Ok(got) => assert_eq!(got.as_ref(), Some(record), "{what}: row {key:?}"),
                    Err(e) => {
                        expect_corruption(
                            Err::<(), _>(e),
                            segment,
                            &range,
                            &format!("{what}: get"),
                        );
                    }
                }
            }
            assert!(
                store.verify().is_err(),
                "{what}: verify of the open store finds the damage"
            );
        }
    }

    let report = Store::repair(dir(), repair_options(&storage))
        .unwrap_or_else(|e| panic!("{what}: repair: {e}"));
    assert_eq!(
        report.first_bad,
        Some((segment, first_bad)),
        "{what}: repair report"
    );
    assert_eq!(report.records_kept, batch as u64, "{what}: records kept");
    assert!(report.bytes_dropped > 0, "{what}: repair dropped the rest");
    let store = Store::open(dir(), options(&storage))
        .unwrap_or_else(|e| panic!("{what}: open after repair: {e}"));
    assert_eq!(
        Some(&snap(&store)),
        clean.states.get(batch),
        "{what}: after repair the store holds the prefix before the damaged record"
    );
    drop(store);
    Store::verify_dir(dir(), &options(&storage))
        .unwrap_or_else(|e| panic!("{what}: verify after repair: {e}"));
}

#[test]
fn bit_rot_in_every_byte_of_an_earlier_record_is_corruption_and_repair_salvages_the_prefix() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let all = records(&clean);
    // The last record of a sealed segment, and one inside the newest segment
    // (not its final record, which a crash may legitimately tear).
    let newest = all.last().expect("records").0;
    let sealed_last = all
        .iter()
        .rposition(|(s, _, _)| *s == 1)
        .expect("segment 1 has records");
    let newest_middle = all
        .iter()
        .position(|(s, _, _)| *s == newest)
        .expect("newest segment has records");
    assert!(
        newest_middle + 1 < all.len(),
        "the newest segment has two records"
    );
    for snapshot in [SnapshotKept::Removed, SnapshotKept::Kept] {
        for r in [sealed_last, newest_middle] {
            let (_, range, _) = all.get(r).expect("record").clone();
            for offset in range {
                rot_and_repair(&clean, r, offset, 0x01, snapshot);
            }
        }
    }
}

/// Where k1's live value lies: batch 8 puts value(8, 0) on k1, which no
/// later batch overwrites. Returns its segment, its record's range and the
/// value's offset.
fn live_value_of_k1(clean: &Clean) -> (u64, Range<u64>, u64) {
    let (segment, range, _) = records(clean).get(8).expect("record 8").clone();
    let bytes = clean
        .storage
        .read_file(segment_path(segment))
        .expect("segment file");
    let needle = value(8, 0);
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("the value is stored verbatim") as u64;
    assert!(range.contains(&at), "the value is inside record 8");
    assert_eq!(
        clean
            .states
            .last()
            .and_then(|s| s.rows.iter().find(|(k, _)| k == "k1"))
            .map(|(_, v)| v.value.to_vec()),
        Some(needle),
        "k1 holds the value at the end"
    );
    (segment, range, at)
}

/// The clean run's disk, with its snapshot, a bit of k1's live value
/// flipped, opened (from the snapshot, which does not read the value).
fn open_with_k1_damaged(clean: &Clean) -> (FaultyStorage, Store) {
    let (segment, _, at) = live_value_of_k1(clean);
    let storage = clean_disk(clean, SnapshotKept::Kept);
    storage
        .corrupt(segment_path(segment), at + 5, 0x01)
        .expect("corrupt");
    let store = Store::open(dir(), options(&storage)).expect("open from the snapshot");
    (storage, store)
}

#[test]
fn bit_rot_inside_a_value_is_corruption_from_open_or_get() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let r = 8;
    let (segment, range, at) = live_value_of_k1(&clean);

    // With the snapshot, open does not read the record: `get` must report it.
    let (_storage, store) = open_with_k1_damaged(&clean);
    expect_corruption(store.get("k1"), segment, &range, "get of the damaged value");
    expect_corruption(
        store.digest(),
        segment,
        &range,
        "digest over the damaged value",
    );
    drop(store);

    for snapshot in [SnapshotKept::Removed, SnapshotKept::Kept] {
        for mask in [0x01, 0x80, 0xff] {
            rot_and_repair(&clean, r, at + 5, mask, snapshot);
        }
    }
}

#[test]
fn compaction_over_a_damaged_live_value_is_corruption_and_changes_nothing() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let (segment, range, _) = live_value_of_k1(&clean);
    // With the snapshot, neither open nor compaction's rebuild reads the
    // record: the value's own CRC, checked as compaction copies it, must
    // catch the damage.
    let (storage, store) = open_with_k1_damaged(&clean);
    let segments_before = storage.list_dir(&dir()).expect("list");
    expect_corruption(store.compact(), segment, &range, "compact");
    let segments_after = storage.list_dir(&dir()).expect("list");
    assert!(
        segments_before.iter().all(|f| segments_after.contains(f)),
        "a failed compaction removes nothing: {segments_after:?}"
    );
    expect_corruption(store.get("k1"), segment, &range, "get of the damaged value");
    let last = clean.states.last().expect("states");
    for (key, record) in last.rows.iter().filter(|(k, _)| k != "k1") {
        assert_eq!(
            store.get(key).expect("get").as_ref(),
            Some(record),
            "row {key:?}"
        );
    }
    let more = Batch::new("B-after").put("e-after", "k-after", 1, "v");
    store
        .apply_batch(&more)
        .expect("a batch after the failed compaction");
    drop(store);
    let reopened = Store::open(dir(), options(&storage)).expect("reopen");
    assert!(reopened.get("k-after").expect("get").is_some());
    assert!(
        !storage
            .list_dir(&dir())
            .expect("list")
            .iter()
            .any(|f| f.ends_with(".tmp")),
        "open deletes the partial base"
    );
}

#[test]
fn faults_during_repair_fail_it_then_repair_again_salvages_the_prefix() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let all = records(&clean);
    // Damage the middle of segment 1: repair cuts it and moves later segments away.
    let r = all
        .iter()
        .rposition(|(s, _, _)| *s == 1)
        .expect("segment 1 has records")
        - 1;
    let (segment, range, batch) = all.get(r).expect("record").clone();
    let damaged = clean.storage.crash_image(CrashPolicy::PowerLoss);
    damaged
        .corrupt(segment_path(segment), range.start + 30, 0x10)
        .expect("corrupt");

    let probe = damaged.crash_image(CrashPolicy::ProcessCrash);
    Store::repair(dir(), repair_options(&probe)).expect("repair");
    let repair_ops = probe.ops();
    assert!(
        repair_ops.iter().any(|o| o.kind == OpKind::Rename),
        "repair moves segments"
    );
    let check = |storage: &FaultyStorage, what: &str| -> Result<(), String> {
        let report = Store::repair(dir(), repair_options(storage))
            .map_err(|e| format!("{what}: second repair: {e}"))?;
        let store = Store::open(dir(), options(storage))
            .map_err(|e| format!("{what}: open after repair: {e} ({report:?})"))?;
        let got = snap(&store);
        if Some(&got) == clean.states.get(batch) {
            Ok(())
        } else {
            Err(format!(
                "{what}: after a second repair ({report:?}) the store holds batches {:?}, \
                 not the {batch} before the damaged record",
                got.log
            ))
        }
    };
    let mut failures = Vec::new();
    let mut cuts = 0;
    for op in &repair_ops {
        for error in [FaultError::Io, FaultError::NoSpace] {
            let what = format!(
                "{error:?} at repair op {} ({:?} {})",
                op.index,
                op.kind,
                op.path.display()
            );
            let storage = damaged.crash_image(CrashPolicy::ProcessCrash);
            storage.inject(fault_at(&repair_ops, op, error));
            match Store::repair(dir(), repair_options(&storage)) {
                Ok(report) => panic!("{what}: repair succeeded despite the fault: {report:?}"),
                Err(e) => assert!(
                    e.to_string().contains(errno(error)),
                    "{what}: repair returns the error: {e}"
                ),
            }
            storage.heal();
            failures.extend(
                check(
                    &storage.crash_image(CrashPolicy::PowerLoss),
                    &format!("{what}, then power loss"),
                )
                .err(),
            );
            failures.extend(check(&storage, &what).err());
            cuts += 2;
        }
        // The process dies at this operation of the repair.
        let storage = damaged.crash_image(CrashPolicy::ProcessCrash);
        storage.crash_at(op.index);
        assert!(Store::repair(dir(), repair_options(&storage)).is_err());
        for policy in [CrashPolicy::PowerLoss, CrashPolicy::ProcessCrash] {
            let what = format!(
                "crash at repair op {} ({:?} {}), {policy:?}",
                op.index,
                op.kind,
                op.path.display()
            );
            // Repair moves segments newest first (DESIGN, "Repair"), so that
            // what an interrupted one leaves is a prefix of the log, with no gap.
            let image = storage.crash_image(policy);
            let mut ids: Vec<u64> = image
                .list_dir(&dir())
                .expect("list")
                .iter()
                .filter_map(|n| n.strip_suffix(".seg")?.parse().ok())
                .collect();
            ids.sort_unstable();
            if ids.first().is_some_and(|&first| first != 1)
                || ids.windows(2).any(|w| w[1] != w[0] + 1)
            {
                failures.push(format!(
                    "{what}: segments {ids:?} are not a prefix of the log"
                ));
            }
            failures.extend(check(&storage.crash_image(policy), &what).err());
            cuts += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cuts} interrupted repairs went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Repair's cut replaces the damaged segment by a copy of its valid records
/// and fsyncs the directory after the rename (DESIGN, "Repair", step 3): a
/// power loss right after a repair that succeeded must not bring the damaged
/// segment back under its name, for open to refuse again.
#[test]
fn a_repair_that_succeeded_outlives_a_power_loss() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let all = records(&clean);
    let r = all
        .iter()
        .rposition(|(s, _, _)| *s == 1)
        .expect("segment 1 has records")
        - 1;
    let (segment, range, batch) = all.get(r).expect("record").clone();
    let storage = clean.storage.crash_image(CrashPolicy::PowerLoss);
    storage
        .corrupt(segment_path(segment), range.start + 30, 0x10)
        .expect("corrupt");
    Store::repair(dir(), repair_options(&storage)).expect("repair");

    let after = storage.crash_image(CrashPolicy::PowerLoss);
    Store::verify_dir(dir(), &options(&after)).expect("verify after the repair and a power loss");
    let store = Store::open(dir(), options(&after)).expect("open");
    assert_eq!(Some(&snap(&store)), clean.states.get(batch));
}

#[test]
fn repair_after_an_interrupted_repair_at_the_same_clock_reading() {
    // Edge devices without a real-time clock boot at the same time after a
    // power cut, so a repair redone after a crash may see the same reading.
    let batches = workload();
    let clean = clean_run(&batches, false);
    let all = records(&clean);
    let (segment, range, batch) = all.get(2).expect("record 2").clone();
    let storage = clean.storage.crash_image(CrashPolicy::PowerLoss);
    storage
        .corrupt(segment_path(segment), range.start + 30, 0x10)
        .expect("corrupt");
    let fixed = |storage: &FaultyStorage| {
        options(storage).clock(Arc::new(ManualClock::new(1_800_000_000_000)))
    };
    // The first repair fails at the sync of the tail file it saved.
    storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
    Store::repair(dir(), fixed(&storage)).expect_err("the injected fault fails the repair");
    storage.heal();
    Store::repair(dir(), fixed(&storage)).expect("the repair can be redone");
    let store = Store::open(dir(), options(&storage)).expect("open after repair");
    assert_eq!(Some(&snap(&store)), clean.states.get(batch));
}

#[test]
fn acknowledged_batches_after_a_failed_sync_and_reopen_survive_power_loss() {
    // Linux marks the pages of a failed fsync clean: they stay readable in
    // the page cache, so a reopened store sees the record, but it never
    // reaches the disk, and a later successful fsync does not cover it.
    let batches = workload();
    let clean = clean_run(&batches, false);
    let mut failures = Vec::new();
    for op in clean.ops.iter().filter(|o| is_commit_sync(&clean.ops, o)) {
        let what = format!("Io at commit sync op {}", op.index);
        let storage = FaultyStorage::new();
        storage.inject(fault_at(&clean.ops, op, FaultError::Io));
        let store = Store::open(dir(), options(&storage)).expect("open");
        let failed_at = batches
            .iter()
            .position(|b| store.apply_batch(b).is_err())
            .expect("the sync fault fails a batch");
        drop(store);
        // Reopen on the same storage and finish the workload: every batch
        // from here on is acknowledged under Durability::Sync.
        if let Err(e) = resume_then_power_loss(&storage, &batches, &clean, options) {
            failures.push(format!("{what} (batch {failed_at} failed): {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// As above, for every other sync of a log segment that fails: the sync
/// of a new segment's header (at open or at a rotation), the sync that
/// seals a segment at a rotation (which is what makes the batches written
/// to it since its last commit sync durable), a snapshot's sync of the
/// log, or a zero fill's. The pages that sync dropped read back until
/// a power loss, so the reopened store must not take them as durable.
#[test]
fn acknowledged_batches_after_any_failed_log_sync_and_reopen_survive_power_loss() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let mut failures = Vec::new();
    let log_syncs = clean.ops.iter().filter(|o| {
        o.kind == OpKind::SyncData
            && o.path.extension().is_some_and(|e| e == "seg")
            && !is_commit_sync(&clean.ops, o)
    });
    for op in log_syncs {
        let what = format!("Io at log sync op {} of {}", op.index, op.path.display());
        let storage = FaultyStorage::new();
        storage.inject(fault_at(&clean.ops, op, FaultError::Io));
        // A sync of open's own (the first segment's creation) that fails
        // fails the open, before any batch.
        let failed_at = match Store::open(dir(), options(&storage)) {
            Ok(store) => batches
                .iter()
                .position(|b| store.apply_batch(b).is_err())
                .unwrap_or(batches.len()),
            Err(_) => 0,
        };
        // A fault that a different run of operations never reached must
        // not fire in the reopened store instead.
        storage.heal();
        if let Err(e) = resume_then_power_loss(&storage, &batches, &clean, options) {
            failures.push(format!("{what} (batch {failed_at} failed): {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Options under which a store syncs no directory of its own while the
/// workload runs: no rotation (segments far larger than the workload) and
/// no automatic snapshot. A directory sync at a rotation or an install
/// would make durable what an earlier failed one left undone, and hide it.
fn quiet_options(storage: &FaultyStorage) -> Options {
    options(storage)
        .segment_bytes_max(1 << 20)
        .snapshot_log_bytes(None)
}

/// Runs the script, maintenance included, as `run_script` does, until the
/// first call that fails; the store is then dropped.
fn run_script_until_it_fails(storage: &FaultyStorage, batches: &[Batch]) {
    let Ok(mut store) = Store::open(dir(), options(storage)) else {
        return;
    };
    for (i, b) in batches.iter().enumerate() {
        if store.apply_batch(b).is_err() {
            return;
        }
        for &m in maintenance_after(i) {
            let done = match m {
                Maintenance::Snapshot => store.snapshot(),
                Maintenance::Compact => store.compact().map(|_| ()),
                Maintenance::Reopen => {
                    if store.close().is_err() {
                        return;
                    }
                    match Store::open(dir(), options(storage)) {
                        Ok(s) => {
                            store = s;
                            Ok(())
                        }
                        Err(_) => return,
                    }
                }
            };
            if done.is_err() {
                return;
            }
        }
    }
    if store.snapshot().is_ok() {
        let _ = store.close();
    }
}

/// Reopens `storage` (healed) under `options` without a power loss,
/// resumes the workload from its checkpoint with every batch acknowledged,
/// then opens the image a power loss leaves: it must hold the
/// uninterrupted final state.
fn resume_then_power_loss(
    storage: &FaultyStorage,
    batches: &[Batch],
    clean: &Clean,
    options: fn(&FaultyStorage) -> Options,
) -> Result<(), String> {
    let store = Store::open(dir(), options(storage)).map_err(|e| format!("reopen: {e}"))?;
    let next = store
        .checkpoint(SOURCE)
        .expect("checkpoint")
        .map_or(0, |c| {
            let position: [u8; 8] = c[..].try_into().expect("8-byte checkpoint");
            u64::from_be_bytes(position) as usize
        });
    for (i, b) in batches.iter().enumerate().skip(next) {
        store
            .apply_batch(b)
            .map_err(|e| format!("resumed batch {i}: {e}"))?;
    }
    drop(store);
    let image = storage.crash_image(CrashPolicy::PowerLoss);
    match Store::open(dir(), options(&image)) {
        Ok(store) if Some(&snap(&store)) == clean.states.last() => Ok(()),
        Ok(store) => Err(format!(
            "batches resumed from {next}, after power loss the log is {:?}",
            snap(&store).log
        )),
        Err(e) => Err(format!(
            "batches resumed from {next}, after power loss, open: {e}"
        )),
    }
}

/// Whatever write of the store's files fails (a directory sync above all:
/// of a new segment at open, at a rotation or at compaction's cut, or after
/// a rename), a store reopened on the same disk, without a power loss in
/// between, must make durable what it builds on before it acknowledges a
/// batch: the entries of the segment it appends to and of whatever open
/// renamed or removed. Acknowledged batches then survive a power loss.
#[test]
fn acknowledged_batches_after_a_fault_at_any_write_and_a_reopen_survive_power_loss() {
    let batches = workload();
    let clean = clean_run(&batches, true);
    let mut failures = Vec::new();
    for op in clean.ops.iter().filter(|o| is_write(o)) {
        let what = format!(
            "Io at op {} ({:?} {})",
            op.index,
            op.kind,
            op.path.display()
        );
        let storage = FaultyStorage::new();
        storage.inject(fault_at(&clean.ops, op, FaultError::Io));
        run_script_until_it_fails(&storage, &batches);
        storage.heal();
        if let Err(e) = resume_then_power_loss(&storage, &batches, &clean, quiet_options) {
            failures.push(format!("{what}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// As above, for the writes of an open that recovers: one that replaces a
/// torn segment by a copy of its records (create, write, sync, rename,
/// directory sync) and one that removes a snapshot the log no longer bears
/// out (removal, directory sync). An open that fails at any of them, and a
/// reopen without a power loss, must leave no rename or removal that a
/// power loss after acknowledged batches takes back.
#[test]
fn acknowledged_batches_after_a_fault_in_recovery_and_a_reopen_survive_power_loss() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let mut images = Vec::new();
    for batch in [2, 7] {
        images.push((
            format!("torn batch {batch}"),
            torn_tail_image(&clean, batch).0,
        ));
    }
    images.push(("stale snapshot".to_owned(), stale_snapshot_image(&batches)));
    let mut failures = Vec::new();
    for (name, image) in &images {
        let probe = image.crash_image(CrashPolicy::ProcessCrash);
        let store = Store::open(dir(), options(&probe)).expect("open recovers");
        // Only open's own operations: closing the store writes a snapshot.
        let open_ops = probe.ops();
        drop(store);
        for op in open_ops.iter().filter(|o| is_write(o)) {
            let what = format!(
                "{name}: Io at open op {} ({:?} {})",
                op.index,
                op.kind,
                op.path.display()
            );
            let storage = image.crash_image(CrashPolicy::ProcessCrash);
            storage.inject(fault_at(&open_ops, op, FaultError::Io));
            if Store::open(dir(), options(&storage)).is_ok() {
                failures.push(format!("{what}: open succeeded despite the fault"));
                continue;
            }
            storage.heal();
            if let Err(e) = resume_then_power_loss(&storage, &batches, &clean, quiet_options) {
                failures.push(format!("{what}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A failed map of the segment a rotation created poisons the store
/// (DESIGN.md, "Write path", step 8): the batch that rotated is not
/// written, and no later batch goes into a segment the store cannot read.
#[test]
fn a_failed_map_of_a_new_segment_poisons_the_store() {
    let storage = FaultyStorage::new();
    let options = options(&storage).snapshot_log_bytes(None);
    let store = Store::open(dir(), options.clone()).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v0"))
        .expect("a first batch");
    // Over the segment's free room, so that it rotates first.
    let rotates = Batch::new("B1").put("e1", "k1", 1, "x".repeat(SEGMENT_BYTES_MAX as usize));
    let maps_before = storage.op_count_of(OpKind::Map);
    storage.inject(Fault::new(OpKind::Map, FaultError::Io));
    assert!(store.apply_batch(&rotates).is_err());
    assert_eq!(
        storage.op_count_of(OpKind::Map),
        maps_before + 1,
        "the fault hit the new segment's map"
    );
    storage.heal();
    let later = store.apply_batch(&Batch::new("B2").put("e2", "k2", 1, "v2"));
    assert!(
        matches!(later, Err(Error::Poisoned { .. })),
        "a later batch is refused: {later:?}"
    );
    assert_eq!(store.get("k0").unwrap().map(|r| r.seq), Some(1));
    drop(store);
    let store = Store::open(dir(), options).expect("reopen");
    assert_eq!(store.get("k0").unwrap().map(|r| r.seq), Some(1));
    assert_eq!(store.batch("B1").unwrap(), None, "B1 was never written");
}

/// A commit sync fails, and in the instant before its syncer learns it (the
/// kernel has dropped the pages already), another writer's rotation syncs
/// the same segment. The kernel would tell that sync success: nothing of
/// the failed batch is dirty any more. The rotation must not take that for
/// durability and publish the failed batch (the sync gate refuses every
/// sync after a failed one).
#[test]
fn a_rotation_in_the_instant_after_a_failed_commit_sync_publishes_nothing() {
    let storage = FaultyStorage::new();
    // The fault is for B1's commit sync: no zero fill's sync before it.
    let options = options(&storage).snapshot_log_bytes(None).zero_fill(false);
    let store = Store::open(dir(), options).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v0"))
        .expect("a first batch");
    let timeout = std::time::Duration::from_secs(20);
    let syncs = || {
        let ops = storage.ops();
        ops.iter().filter(|o| o.kind == OpKind::SyncData).count()
    };
    let failed = Batch::new("B1").put("e1", "k1", 1, "v1");
    // Over the segment's free room, so that it rotates first.
    let rotates = Batch::new("B2").put("e2", "k2", 1, "x".repeat(SEGMENT_BYTES_MAX as usize));
    let (first, second) = std::thread::scope(|scope| {
        storage.pause_after_next_sync();
        storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
        let first = scope.spawn(|| store.apply_batch(&failed));
        storage
            .wait_until_paused(timeout)
            .expect("B1's commit sync failed and is held before it returns");
        let (ops_before, syncs_before) = (storage.op_count(), syncs());
        let second = scope.spawn(|| store.apply_batch(&rotates));
        // The rotation starts by cutting the segment's preallocated tail off.
        let deadline = std::time::Instant::now() + timeout;
        while !storage
            .ops()
            .iter()
            .skip(ops_before as usize)
            .any(|o| o.kind == OpKind::SetLen)
        {
            assert!(std::time::Instant::now() < deadline, "B2 rotates");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Its sync comes next: without the gate it runs now; with it, it
        // waits for the held one. Give it time to, then let the failure return.
        let grace = std::time::Instant::now() + std::time::Duration::from_millis(100);
        while syncs() == syncs_before && std::time::Instant::now() < grace {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        storage.resume();
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(first.is_err(), "B1's sync failed: {first:?}");
    assert!(second.is_err(), "the store is poisoned: {second:?}");
    assert_eq!(
        store.get("k1").unwrap(),
        None,
        "a batch whose sync failed is never published"
    );
    assert_eq!(store.get("k0").unwrap().map(|r| r.seq), Some(1));
}

/// Open removes a snapshot that the log no longer bears out before it
/// appends anything (`tests/compaction.rs` shows why). A fault or a crash at
/// that removal, or at the directory sync after it, fails the open or ends
/// the process; the next open rejects the snapshot again and removes it,
/// and the log that then grows past the position the snapshot names is
/// never read through it.
/// Six batches, a snapshot of them, and then the newest segment loses its
/// last record, the sixth batch: the snapshot covers more log than there is.
fn stale_snapshot_image(batches: &[Batch]) -> FaultyStorage {
    let image = FaultyStorage::new();
    {
        let store = Store::open(dir(), options(&image)).expect("open");
        for b in &batches[..6] {
            store.apply_batch(b).expect("apply");
        }
        store.snapshot().expect("snapshot");
        store.close().expect("close");
    }
    let newest = image
        .files()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .max()
        .expect("a segment");
    let file = image.open(&newest, OpenMode::Append).expect("open");
    let len = file.len().expect("len");
    file.set_len(len - 1).expect("cut");
    file.sync_data().expect("sync");
    image
}

#[test]
fn faults_and_crashes_while_open_removes_a_stale_snapshot() {
    let batches = workload();
    let clean = clean_run(&batches, false);
    let image = stale_snapshot_image(&batches);

    let probe = image.crash_image(CrashPolicy::ProcessCrash);
    let store = Store::open(dir(), options(&probe)).expect("open rejects the snapshot");
    assert!(store.stats().snapshot_rejected.is_some());
    let open_ops = probe.ops();
    drop(store);
    let removal: Vec<&OpRecord> = open_ops
        .iter()
        .skip_while(|o| !(o.kind == OpKind::Remove && o.path.ends_with("SNAPSHOT")))
        .take(2)
        .collect();
    assert_eq!(
        removal.iter().map(|o| o.kind).collect::<Vec<_>>(),
        [OpKind::Remove, OpKind::SyncDir],
        "open removes the snapshot, then syncs the directory"
    );
    // Reopens, resumes the workload from the fifth batch, and opens once
    // more: the state is the uninterrupted run's.
    let recovers = |storage: &FaultyStorage, what: &str| {
        reopen_and_resume(storage, &batches, &clean, 5..=5, what);
        let store = Store::open(dir(), options(storage)).expect("open again");
        assert_eq!(
            Some(&snap(&store)),
            clean.states.last(),
            "{what}: the open after the log grew"
        );
    };
    for op in removal {
        for error in [FaultError::Io, FaultError::NoSpace] {
            let what = format!("{error:?} at open op {} ({:?})", op.index, op.kind);
            let storage = image.crash_image(CrashPolicy::ProcessCrash);
            storage.inject(fault_at(&open_ops, op, error));
            match Store::open(dir(), options(&storage)) {
                Ok(_) => panic!("{what}: open succeeded despite the fault"),
                Err(e) => assert!(
                    e.to_string().contains(errno(error)),
                    "{what}: open returns the error: {e}"
                ),
            }
            storage.heal();
            recovers(&storage.crash_image(CrashPolicy::PowerLoss), &what);
            recovers(&storage, &what);
        }
        let what = format!("crash at open op {} ({:?})", op.index, op.kind);
        let storage = image.crash_image(CrashPolicy::ProcessCrash);
        storage.crash_at(op.index);
        assert!(Store::open(dir(), options(&storage)).is_err(), "{what}");
        for policy in [CrashPolicy::ProcessCrash, CrashPolicy::PowerLoss] {
            recovers(&storage.crash_image(policy), &format!("{what}, {policy:?}"));
        }
    }
}

/// An open that removed a stale snapshot and failed at the directory sync
/// that makes the removal durable leaves it on the disk, out of sight: the
/// next open finds no snapshot and has nothing to remove again. Once new
/// batches regrow the log to the position the snapshot names, a power
/// loss brings it back, it fits, and the open after it serves the
/// snapshot's values instead of the acknowledged batch's.
#[test]
fn a_stale_snapshot_whose_removal_failed_to_sync_is_not_trusted_after_later_batches_and_a_power_loss()
 {
    let batches = workload();
    let image = stale_snapshot_image(&batches);
    let probe = image.crash_image(CrashPolicy::ProcessCrash);
    let store = Store::open(dir(), options(&probe)).expect("open rejects the snapshot");
    let open_ops = probe.ops();
    drop(store);
    let removal_sync = open_ops
        .iter()
        .skip_while(|o| !(o.kind == OpKind::Remove && o.path.ends_with("SNAPSHOT")))
        .find(|o| o.kind == OpKind::SyncDir)
        .expect("open syncs the directory after removing the snapshot");
    let storage = image.crash_image(CrashPolicy::ProcessCrash);
    storage.inject(fault_at(&open_ops, removal_sync, FaultError::Io));
    Store::open(dir(), options(&storage)).expect_err("the directory sync fails");
    storage.heal();

    // The sixth batch again, with other values of the same lengths: its
    // record ends where the snapshot says the log it covers ends.
    let other = |j: usize| format!("<VALUE 5.{j}>").repeat(8).into_bytes();
    let mut b = Batch::new("B05");
    for j in 0..3u64 {
        let k = 5 + j as usize;
        b = b.put(
            format!("e5.{j}"),
            format!("k{}", k % 7),
            60 + j,
            other(j as usize),
        );
    }
    let b = b
        .add("a5", "visits", 60, 6)
        .put("e4.0", "k4", 50, value(4, 0))
        .checkpoint(SOURCE, 6u64.to_be_bytes());
    let store = Store::open(dir(), quiet_options(&storage)).expect("reopen");
    assert!(!store.stats().opened_from_snapshot);
    store.apply_batch(&b).expect("acknowledged");
    let acknowledged = snap(&store);
    assert_eq!(
        store.get("k5").expect("get").map(|r| r.value),
        Some(Bytes::from(other(0)))
    );
    drop(store);

    let after = storage.crash_image(CrashPolicy::PowerLoss);
    let store = Store::open(dir(), quiet_options(&after)).expect("open after power loss");
    assert!(
        !store.stats().opened_from_snapshot,
        "the stale snapshot came back with the power loss and was trusted"
    );
    assert_eq!(
        snap(&store),
        acknowledged,
        "after the power loss (opened from a snapshot: {})",
        store.stats().opened_from_snapshot
    );
}

/// A snapshot that open could not read, or rejected while the same open
/// cut the log's torn tail, is removed before anything is appended. Left
/// in place, a read failure that passes (EIO, ENOMEM, EMFILE) lets a later
/// open load it: once new batches regrow the cut log to the position it
/// covers, it fits, and that open skips acknowledged batches (and serves
/// the cut record's values from another record's bytes).
#[test]
fn a_snapshot_unread_or_rejected_when_open_cuts_the_log_is_removed() {
    let options = |storage: &FaultyStorage| {
        options(storage)
            .segment_bytes_max(1 << 20)
            .snapshot_log_bytes(None)
    };
    // Records of equal length, so that a new one ends where a cut one did.
    let batch = |prefix: char, i: u32| {
        Batch::new(format!("{prefix}{i:03}")).put(
            format!("{prefix}e{i:03}"),
            format!("{prefix}k{i:03}"),
            1,
            format!("{prefix}-value-{i:03}"),
        )
    };
    let snapshot_path = dir().join("SNAPSHOT");
    // Ten batches and a snapshot covering them all.
    let ten_batches_and_a_snapshot = || {
        let storage = FaultyStorage::new();
        let store = Store::open(dir(), options(&storage)).expect("open");
        for i in 0..10 {
            store.apply_batch(&batch('B', i)).expect("apply");
        }
        store.snapshot().expect("snapshot");
        store.close().expect("close");
        storage
    };
    // Then bit rot in the last record, which open cuts as a torn write.
    let image = ten_batches_and_a_snapshot();
    let segment = segment_path(1);
    let len = image.file_len(&segment).expect("segment");
    image.corrupt(&segment, len - 1, 0x40).expect("corrupt");
    let snapshot_len = image.file_len(&snapshot_path).expect("snapshot");

    let unreadable = |storage: &FaultyStorage| {
        storage.inject(Fault::new(OpKind::Map, FaultError::Io).skip(1));
    };
    let rotten = |storage: &FaultyStorage| {
        storage
            .corrupt(&snapshot_path, snapshot_len - 1, 0x40)
            .expect("corrupt the snapshot");
    };
    for (what, spoil) in [
        ("unreadable", &unreadable as &dyn Fn(&FaultyStorage)),
        ("rotten", &rotten),
    ] {
        let storage = image.crash_image(CrashPolicy::ProcessCrash);
        spoil(&storage);
        let store = Store::open(dir(), options(&storage)).expect("open");
        let stats = store.stats();
        assert!(stats.snapshot_rejected.is_some(), "{what}: {stats:?}");
        assert!(stats.torn_bytes_discarded > 0, "{what}: {stats:?}");
        assert!(
            !storage.files().contains(&snapshot_path),
            "{what}: the snapshot is gone before anything is appended"
        );
        assert_eq!(
            store.get("Bk009").expect("get"),
            None,
            "{what}: B009 was cut"
        );
        // Acknowledged batches; the first ends where the snapshot's log ended.
        store.apply_batch(&batch('N', 9)).expect("apply");
        store.apply_batch(&batch('N', 10)).expect("apply");
        let digest = store.digest().expect("digest");
        drop(store);

        let store = Store::open(dir(), options(&storage)).expect("reopen");
        assert!(!store.stats().opened_from_snapshot, "{what}");
        assert!(
            store.get("Nk009").expect("get").is_some(),
            "{what}: N009 kept"
        );
        assert_eq!(store.digest().expect("digest"), digest, "{what}");
    }

    // Unreadable once, with nothing cut: removed too, since it might read
    // at the next open; that open replays the log and finds every batch.
    let intact = ten_batches_and_a_snapshot();
    unreadable(&intact);
    let store = Store::open(dir(), options(&intact)).expect("open");
    assert!(store.stats().snapshot_rejected.is_some());
    assert_eq!(store.stats().torn_bytes_discarded, 0);
    assert!(!intact.files().contains(&snapshot_path));
    assert!(store.get("Bk009").expect("get").is_some());
}

/// The log up to a snapshot's position was synced before the snapshot was
/// installed, so an open from a snapshot that covers the whole log writes
/// nothing back: before, no frame after the snapshot claimed those bytes
/// synced, and every open rewrote the newest segment whole and synced it
/// (a store that a close left with a snapshot paid that on every open).
#[test]
fn an_open_from_a_snapshot_of_the_whole_log_rewrites_nothing() {
    for durability in [Durability::Sync, Durability::Buffered] {
        let storage = FaultyStorage::new();
        let options = || {
            options(&storage)
                .durability(durability)
                .segment_bytes_max(1 << 20)
                .snapshot_log_bytes(None)
        };
        let store = Store::open(dir(), options()).expect("open");
        for b in &workload() {
            store.apply_batch(b).expect("apply");
        }
        store.snapshot().expect("snapshot");
        let state = snap(&store);
        store.close().expect("close");

        for round in 0..2 {
            let what = format!("{durability:?}, open {round}");
            let from = storage.ops().len();
            let store = Store::open(dir(), options()).expect("reopen");
            assert!(store.stats().opened_from_snapshot, "{what}");
            let writes: Vec<_> = storage.ops()[from..]
                .iter()
                .filter(|o| o.kind == OpKind::Write)
                .map(|o| (o.path.clone(), o.offset, o.bytes))
                .collect();
            assert_eq!(writes, [], "{what}: open writes nothing back");
            assert_eq!(snap(&store), state, "{what}");
            drop(store);
            assert_power_loss_keeps(&storage, options(), &state, &what);
        }
    }
}

/// A power loss of `storage` now loses nothing of `state`.
fn assert_power_loss_keeps(storage: &FaultyStorage, options: Options, state: &Snap, what: &str) {
    let image = storage.crash_image(CrashPolicy::PowerLoss);
    let store = Store::open(dir(), options.storage(Arc::new(image))).expect("open image");
    assert_eq!(&snap(&store), state, "{what}: after a power loss");
}

/// Under `Buffered` a clean close, or a drop, syncs the log: the batches
/// written before it survive a power loss after it.
#[test]
fn a_buffered_close_or_drop_makes_every_batch_durable() {
    for close in [true, false] {
        let storage = FaultyStorage::new();
        let options = || {
            options(&storage)
                .durability(Durability::Buffered)
                .snapshot_log_bytes(None)
        };
        let store = Store::open(dir(), options()).expect("open");
        let batches = workload();
        for b in &batches {
            store.apply_batch(b).expect("apply");
        }
        let state = snap(&store);
        if close {
            store.close().expect("close");
        } else {
            drop(store);
        }
        assert_power_loss_keeps(&storage, options(), &state, &format!("close {close}"));
    }
}

/// A caller whose batch a sync covered and published gets `Ok`, also when
/// another writer's failed append poisoned the store while that sync ran:
/// an error would say nothing of the batch was applied, and readers see it.
#[test]
fn a_batch_its_sync_covered_succeeds_though_another_writer_poisoned_the_store() {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage).zero_fill(false)).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
        .expect("apply");
    storage.pause_next(OpKind::SyncData);
    std::thread::scope(|scope| {
        let a = scope.spawn(|| store.apply_batch(&Batch::new("A").put("ea", "ka", 1, "va")));
        storage
            .wait_until_paused(std::time::Duration::from_secs(20))
            .expect("A's commit sync is held");
        storage.inject(Fault::new(OpKind::Write, FaultError::Io));
        let b = store.apply_batch(&Batch::new("B").put("eb", "kb", 1, "vb"));
        assert!(b.is_err(), "B's append failed: {b:?}");
        storage.resume();
        let a = a.join().expect("A's thread");
        assert!(a.is_ok(), "A's sync succeeded: {a:?}");
    });
    assert!(store.get("ka").expect("get").is_some());
    assert!(matches!(
        store.apply_batch(&Batch::new("C").put("ec", "kc", 1, "vc")),
        Err(Error::Poisoned { .. })
    ));
}

/// The same for a caller whose record another caller's sync covers: the
/// poisoning wakes it while that sync runs, and it waits for the sync's
/// outcome instead of taking the poisoning for its own.
#[test]
fn a_waiter_that_another_callers_sync_covers_succeeds_though_the_store_was_poisoned() {
    use std::time::Duration;
    let storage = FaultyStorage::new();
    let options = options(&storage)
        .zero_fill(false)
        .segment_bytes_max(1 << 20)
        .snapshot_log_bytes(None);
    let store = Store::open(dir(), options).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
        .expect("apply");
    std::thread::scope(|scope| {
        // A1's sync is held while W1 writes: the next sync then gathers
        // two records, for up to as long as A1's took.
        storage.pause_next(OpKind::SyncData);
        let a1 = scope.spawn(|| store.apply_batch(&Batch::new("A1").put("ea1", "ka1", 1, "v")));
        storage
            .wait_until_paused(Duration::from_secs(20))
            .expect("A1's sync held");
        let w1 = scope.spawn(|| store.apply_batch(&Batch::new("W1").put("ew1", "kw1", 1, "v")));
        std::thread::sleep(Duration::from_millis(1500));
        storage.resume();
        storage.pause_next(OpKind::SyncData);
        assert!(a1.join().expect("A1's thread").is_ok());
        // X joins the sync W1 gathers for (or W1 joins X's).
        let x = scope.spawn(|| store.apply_batch(&Batch::new("X").put("ex", "kx", 1, "v")));
        storage
            .wait_until_paused(Duration::from_secs(20))
            .expect("the sync covering W1 and X held");
        std::thread::sleep(Duration::from_millis(200));
        storage.inject(Fault::new(OpKind::Write, FaultError::Io));
        let y = store.apply_batch(&Batch::new("Y").put("ey", "ky", 1, "v"));
        assert!(y.is_err(), "Y's append failed");
        std::thread::sleep(Duration::from_millis(200));
        storage.resume();
        for (name, key, thread) in [("W1", "kw1", w1), ("X", "kx", x)] {
            let result = thread.join().expect("writer thread");
            let visible = store.get(key).expect("get").is_some();
            assert!(
                visible && result.is_ok(),
                "{name}: visible {visible}, result {result:?}"
            );
        }
    });
}

/// The same for a waiter whose record a sync covered, while that sync's
/// syncer publishes: A's sync returned and its syncer waits for the writer
/// lock, which B holds while its append fails. A replay of A, which waits
/// for A's record, is woken by the poisoning before A is published; it
/// waits for the publishing rather than report an error for a batch that
/// readers then see.
#[test]
fn a_waiter_whose_record_a_sync_covered_succeeds_though_the_store_was_poisoned_while_it_publishes()
{
    use std::time::{Duration, Instant};
    const TIMEOUT: Duration = Duration::from_secs(20);
    let storage = FaultyStorage::new();
    let options = options(&storage)
        .zero_fill(false)
        .segment_bytes_max(1 << 20)
        .snapshot_log_bytes(None);
    let store = Store::open(dir(), options).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
        .expect("apply");
    let a = Batch::new("A").put("ea", "ka", 1, "va");
    std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let first = scope.spawn(|| store.apply_batch(&a));
        let a_sync = storage.wait_until_paused(TIMEOUT).expect("A's sync held");
        // The replay waits for A's record, which ends the log.
        let replay = scope.spawn(|| store.apply_batch(&a));
        std::thread::sleep(Duration::from_millis(200));
        // B's append is held with the writer lock; then A's sync goes on,
        // and its syncer waits for the writer lock to publish.
        let syncs = store.stats().syncs;
        storage.pause_next(OpKind::Write);
        let b = scope.spawn(|| store.apply_batch(&Batch::new("B").put("eb", "kb", 1, "vb")));
        storage.wait_until_paused(TIMEOUT).expect("B's append held");
        storage.resume_op(a_sync);
        let deadline = Instant::now() + TIMEOUT;
        while store.stats().syncs == syncs && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let is_synced = store.stats().syncs > syncs;
        storage.inject(Fault::new(OpKind::Write, FaultError::Io));
        storage.resume();
        assert!(is_synced, "A's sync returned while B's append was held");
        assert!(b.join().expect("B's thread").is_err(), "B's append failed");
        first
            .join()
            .expect("A's thread")
            .expect("A's sync succeeded");
        let replay = replay.join().expect("the replay's thread");
        assert!(
            replay.as_ref().is_ok_and(|r| r.replayed),
            "A is published: {replay:?}"
        );
    });
    assert!(store.get("ka").expect("get").is_some());
}

/// `Stats::syncs` counts the commit syncs that succeeded since open: a
/// lone writer's batch takes one of its own, a replay of a durable batch
/// none, a failed sync does not count, and under `Buffered` there are none.
#[test]
fn stats_count_the_commit_syncs_that_succeeded() {
    let storage = FaultyStorage::new();
    let options = options(&storage)
        .segment_bytes_max(1 << 20)
        .snapshot_log_bytes(None);
    let store = Store::open(dir(), options.clone()).expect("open");
    assert_eq!(store.stats().syncs, 0, "open takes no commit sync");
    for i in 0..3 {
        let batch = Batch::new(format!("B{i}")).put(format!("e{i}"), "k", i + 1, "v");
        store.apply_batch(&batch).expect("apply");
        assert_eq!(store.stats().syncs, i + 1, "one sync per lone batch");
    }
    let replay = store
        .apply_batch(&Batch::new("B0").put("e0", "k", 1, "v"))
        .expect("replay");
    assert!(replay.replayed);
    assert_eq!(
        store.stats().syncs,
        3,
        "a durable batch's replay syncs nothing"
    );
    storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
    let failed = store.apply_batch(&Batch::new("F").put("ef", "kf", 1, "v"));
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(store.stats().syncs, 3, "the failed sync is not counted");
    drop(store);

    let buffered = FaultyStorage::new();
    let store = Store::open(
        dir(),
        options
            .storage(Arc::new(buffered.clone()))
            .durability(Durability::Buffered),
    )
    .expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k", 1, "v"))
        .expect("apply");
    assert_eq!(store.stats().syncs, 0, "no commit syncs under Buffered");
}

/// A store directory that open creates is durable only once its parent is
/// synced: open syncs the parent of each directory it made (POSIX promises
/// no more; without it, a power loss could take the directory and every
/// acknowledged batch in it). A fault at that sync fails the open, and
/// opening a directory that exists syncs no parent.
#[test]
fn open_syncs_the_parent_of_a_store_directory_it_creates() {
    let nested = PathBuf::from("/parent/db");
    let storage = FaultyStorage::new();
    drop(Store::open(&nested, options(&storage)).expect("open"));
    let ops = storage.ops();
    let created = ops
        .iter()
        .position(|o| o.kind == OpKind::CreateDir)
        .expect("open creates the directory");
    let synced: Vec<&PathBuf> = ops[created..]
        .iter()
        .filter(|o| o.kind == OpKind::SyncDir)
        .map(|o| &o.path)
        .collect();
    assert!(
        synced.contains(&&PathBuf::from("/parent")) && synced.contains(&&PathBuf::from("/")),
        "{synced:?}"
    );

    let reopened = storage.crash_image(CrashPolicy::ProcessCrash);
    drop(Store::open(&nested, options(&reopened)).expect("reopen"));
    assert!(
        !reopened
            .ops()
            .iter()
            .any(|o| o.kind == OpKind::SyncDir && o.path == Path::new("/parent")),
        "an existing directory's parent is not synced"
    );

    let failing = FaultyStorage::new();
    failing.inject(Fault::new(OpKind::SyncDir, FaultError::Io));
    let e = Store::open(&nested, options(&failing)).expect_err("the parent's sync fails");
    assert!(e.to_string().contains(errno(FaultError::Io)), "{e}");
}

/// The sync of a new store directory's parent that fails fails the open,
/// and leaves the directory in place: the next open finds it and creates
/// nothing, so it must sync the parent then, or the store directory, and
/// every batch acknowledged in it, may vanish in a power loss.
/// (`FaultyStorage` keeps directories once made, so this checks the
/// operations, as the test above does.)
#[test]
fn a_store_directory_whose_parents_sync_failed_is_made_durable_by_the_next_open() {
    let nested = PathBuf::from("/parent/db");
    let storage = FaultyStorage::new();
    storage.inject(Fault::new(OpKind::SyncDir, FaultError::Io));
    Store::open(&nested, options(&storage)).expect_err("the parent's sync fails");
    storage.heal();
    let before = storage.op_count();
    let store = Store::open(&nested, options(&storage)).expect("reopen");
    store
        .apply_batch(&workload()[0])
        .expect("an acknowledged batch");
    let synced = storage.ops()[before as usize..]
        .iter()
        .any(|o| o.kind == OpKind::SyncDir && o.path == Path::new("/parent"));
    assert!(
        synced,
        "the batch was acknowledged, and the store directory's entry in /parent was never synced"
    );
}

/// A process that dies at any step of creating a store directory, before
/// the note that asks for its parents' syncs exists, leaves a directory
/// the next open finds: that open must still sync the parents the first
/// did not, or a power loss could take the directory, and the batches
/// acknowledged in it, away. (The fault model keeps directories durable
/// from their creation, so the syncs themselves are what is checked.)
#[test]
fn a_crash_at_any_step_of_creating_a_store_directory_leaves_one_the_next_open_makes_durable() {
    let nested = PathBuf::from("/parent/db");
    let synced = |ops: &[idemkv::storage::OpRecord], parent: &str| {
        ops.iter()
            .any(|o| o.kind == OpKind::SyncDir && !o.failed && o.path == Path::new(parent))
    };
    let probe = FaultyStorage::new();
    drop(Store::open(&nested, options(&probe)).expect("open"));
    for at in 0..probe.op_count() {
        let disk = FaultyStorage::new();
        disk.crash_at(at);
        let _ = Store::open(&nested, options(&disk));
        let first = disk.ops();
        let image = disk.crash_image(CrashPolicy::ProcessCrash);
        let store = Store::open(&nested, options(&image))
            .unwrap_or_else(|e| panic!("crash at op {at}, then an open: {e}"));
        store
            .apply_batch(&workload()[0])
            .expect("an acknowledged batch");
        let second = image.ops();
        for parent in ["/parent", "/"] {
            assert!(
                synced(&first, parent) || synced(&second, parent),
                "crash at op {at}: a batch was acknowledged, and the entry in {parent} never synced"
            );
        }
    }
}

/// A new store in a directory that exists already (made by its caller, or
/// by an open that died before its note) has its ancestors synced up to
/// one the process may not open, which it cannot have created: the store
/// still opens. Any other failure of those syncs fails the open.
#[test]
fn a_new_store_under_a_directory_the_process_may_not_read_still_opens() {
    let nested = PathBuf::from("/parent/db");
    for (error, opens) in [
        (FaultError::PermissionDenied, true),
        (FaultError::Io, false),
    ] {
        let storage = FaultyStorage::new();
        storage.create_dir_all(&nested).unwrap();
        // The first sync is of /parent, the second of /.
        storage.inject(Fault::new(OpKind::SyncDir, error).skip(1));
        let opened = Store::open(&nested, options(&storage));
        assert_eq!(opened.is_ok(), opens, "{error:?}: {:?}", opened.err());
        let synced_parent = storage
            .ops()
            .iter()
            .any(|o| o.kind == OpKind::SyncDir && !o.failed && o.path == Path::new("/parent"));
        assert!(synced_parent, "{error:?}");
    }
}

/// The open after a failed commit sync rewrites the newest segment into a
/// file of its own (DESIGN, "Poisoning and failed syncs"); a crash at any
/// step of that open, then a power loss, keeps every batch acknowledged
/// before the failed sync. (A rewrite whose copy was never synced passed
/// every other test.)
#[test]
fn a_crash_at_every_step_of_the_rewrite_after_a_failed_sync_keeps_acknowledged_batches() {
    let options =
        |storage: &FaultyStorage| options(storage).zero_fill(false).snapshot_log_bytes(None);
    let disk = FaultyStorage::new();
    let store = Store::open(dir(), options(&disk)).expect("open");
    for i in 0..3 {
        let batch = Batch::new(format!("B{i}")).put(format!("e{i}"), format!("k{i}"), 1, "v");
        store.apply_batch(&batch).expect("apply");
    }
    disk.inject(Fault::new(OpKind::SyncData, FaultError::Io));
    let failed = Batch::new("B3").put("e3", "k3", 1, "v");
    assert!(store.apply_batch(&failed).is_err(), "its sync fails");
    drop(store);
    disk.heal();

    let probe = disk.crash_image(CrashPolicy::ProcessCrash);
    drop(Store::open(dir(), options(&probe)).expect("open rewrites"));
    let open_ops = probe.op_count();
    assert!(
        probe.ops().iter().any(|o| o.kind == OpKind::Rename),
        "open rewrote the segment"
    );
    for at in 0..open_ops {
        let image = disk.crash_image(CrashPolicy::ProcessCrash);
        image.crash_at(at);
        assert!(
            Store::open(dir(), options(&image)).is_err(),
            "crash at op {at}"
        );
        let after = image.crash_image(CrashPolicy::PowerLoss);
        let store = Store::open(dir(), options(&after))
            .unwrap_or_else(|e| panic!("crash at op {at}, then power loss: {e}"));
        for i in 0..3 {
            assert!(
                store.get(format!("k{i}")).unwrap().is_some(),
                "crash at op {at}, then power loss: acknowledged B{i} lost"
            );
        }
    }
}

/// As above under `Buffered`, where the marker's rewrite is what makes the
/// pages of a failed `close` durable: its frames claim every byte before
/// them, so open's own rewrite of the records after the last claim covers
/// only the last record. The marker goes only once the copy is durable
/// (DESIGN, "File lifecycle"), so a crash at any step of that open leaves it
/// for the next, and a clean close after that makes every batch durable.
#[test]
fn a_crash_in_the_rewrite_after_a_failed_buffered_close_leaves_the_marker_for_the_next_open() {
    let options =
        |storage: &FaultyStorage| unsnapshotted_unfilled(storage).durability(Durability::Buffered);
    let disk = FaultyStorage::new();
    let store = Store::open(dir(), options(&disk)).expect("open");
    for i in 0..3 {
        let batch = Batch::new(format!("B{i}")).put(format!("e{i}"), format!("k{i}"), 1, "v");
        store.apply_batch(&batch).expect("apply");
    }
    disk.inject(Fault::new(OpKind::SyncData, FaultError::Io));
    assert!(store.close().is_err(), "its sync fails");
    disk.heal();
    assert!(disk.files().iter().any(|p| p.ends_with("SYNC_FAILED")));

    let probe = disk.crash_image(CrashPolicy::ProcessCrash);
    let store = Store::open(dir(), options(&probe)).expect("open rewrites");
    // The open's operations only, not those of the close that dropping it makes.
    let open_ops = probe.op_count();
    drop(store);
    for at in 0..open_ops {
        let image = disk.crash_image(CrashPolicy::ProcessCrash);
        image.crash_at(at);
        assert!(
            Store::open(dir(), options(&image)).is_err(),
            "crash at op {at}"
        );
        let image = image.crash_image(CrashPolicy::ProcessCrash);
        let store = Store::open(dir(), options(&image))
            .unwrap_or_else(|e| panic!("crash at op {at}, then open: {e}"));
        store
            .apply_batch(&Batch::new("B3").put("e3", "k3", 1, "v"))
            .expect("B3");
        store.close().expect("close");
        let after = image.crash_image(CrashPolicy::PowerLoss);
        let store = Store::open(dir(), options(&after))
            .unwrap_or_else(|e| panic!("crash at op {at}, a clean close, then power loss: {e}"));
        for i in 0..4 {
            assert!(
                store.get(format!("k{i}")).unwrap().is_some(),
                "crash at op {at}, a clean close, then power loss: B{i} lost"
            );
        }
    }
}

/// A process that dies after a failed commit sync, before its `SYNC_FAILED`
/// marker is durable, leaves records that read back from the page cache
/// but never reached the disk, and that no later sync writes. The next open
/// writes the newest segment's records after the last frame's `synced_to`
/// again, so its sync makes them durable: a batch acknowledged after it
/// survives a power loss. (Without that, the power loss left a hole before
/// it, and open refused the log as corrupt.)
#[test]
fn a_crash_between_a_failed_sync_and_its_marker_loses_no_later_batch() {
    let image = crash_before_the_marker_of_a_failed_sync();
    assert!(!image.files().iter().any(|p| p.ends_with("SYNC_FAILED")));
    let store = Store::open(dir(), unsnapshotted_unfilled(&image)).expect("reopen");
    store
        .apply_batch(&Batch::new("B2").put("e2", "k2", 1, "v"))
        .expect("B2 acknowledged");
    let after = image.crash_image(CrashPolicy::PowerLoss);
    drop(store);
    let store =
        Store::open(dir(), unsnapshotted_unfilled(&after)).expect("open after the power loss");
    for key in ["k0", "k2"] {
        assert!(store.get(key).unwrap().is_some(), "acknowledged {key} lost");
    }
}

/// The test options without zero fill or automatic snapshots.
fn unsnapshotted_unfilled(storage: &FaultyStorage) -> Options {
    options(storage).zero_fill(false).snapshot_log_bytes(None)
}

/// The disk a process leaves that acknowledged B0 (putting `k0`), saw
/// B1's commit sync fail, and died as it made the `SYNC_FAILED` marker.
fn crash_before_the_marker_of_a_failed_sync() -> FaultyStorage {
    let failing_b1 = |storage: &FaultyStorage| {
        let store = Store::open(dir(), unsnapshotted_unfilled(storage)).expect("open");
        store
            .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
            .expect("B0");
        storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
        let b1 = Batch::new("B1").put("e1", "k1", 1, "v");
        assert!(store.apply_batch(&b1).is_err(), "B1's sync fails");
    };
    // Where the marker is made, in a run that lets it be made.
    let probe = FaultyStorage::new();
    failing_b1(&probe);
    let marker = probe
        .ops()
        .iter()
        .find(|o| o.kind == OpKind::Open && o.path.ends_with("SYNC_FAILED"))
        .expect("the marker is made")
        .index;
    let storage = FaultyStorage::new();
    storage.crash_at(marker);
    failing_b1(&storage);
    storage.crash_image(CrashPolicy::ProcessCrash)
}

/// Open syncs the newest segment before its first frame claims the records
/// before it written for good (DESIGN, "File lifecycle": "Open fdatasyncs
/// the active segment before the first record"). After a process died
/// between a failed sync and its marker, a `Buffered` batch written after
/// the reopen claims the rewritten records; a power loss that keeps that
/// batch's write, and nothing else unsynced, must leave a log that opens.
#[test]
fn a_buffered_batch_after_the_reopen_of_a_failed_sync_claims_only_durable_records() {
    let image = crash_before_the_marker_of_a_failed_sync();
    let buffered = unsnapshotted_unfilled(&image).durability(Durability::Buffered);
    let store = Store::open(dir(), buffered).expect("reopen");
    store
        .apply_batch(&Batch::new("B2").put("e2", "k2", 1, "v"))
        .expect("B2");
    let after = image.crash_image(CrashPolicy::Reordered { writes: 1 });
    drop(store);
    let store =
        Store::open(dir(), unsnapshotted_unfilled(&after)).expect("open after the power loss");
    assert!(store.get("k0").unwrap().is_some(), "acknowledged k0 lost");
}
