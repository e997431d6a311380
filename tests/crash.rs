//! Contract area: crash consistency (SPEC section 4; issue 5).
//!
//! A scripted workload (puts, deletes, adds, redelivered events, a redelivered
//! batch, a checkpoint per batch; small segments so that the log rotates
//! several times; snapshots, compactions and a close and reopen between
//! batches) runs once on a [`FaultyStorage`] to count its storage
//! operations. Then, for every operation index (every one, not a sample),
//! the workload runs again with the process dying at that operation, and the
//! disk a crash would leave is opened on a fresh storage. Each recovery must
//! yield exactly the state after some prefix of the batches, holding every
//! batch that was acknowledged, with that prefix's checkpoint; resuming from
//! the recovered checkpoint must reach the uninterrupted final state.
//!
//! The crash images: power loss (only synced bytes and directory entries),
//! power loss with directory entries but no unsynced data, appends torn at
//! several bytes (by a process crash inside the append, or by a power loss
//! after it), crashes at every operation of a recovery that truncates a torn
//! tail, process crashes under `Durability::Buffered`, and out-of-order
//! write-back of two records in one group sync (a later record survives, an
//! earlier one is a hole).

#![cfg(feature = "testing")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use idemkv::storage::{CrashPolicy, FaultyStorage, OpKind, OpRecord, OpenMode, Storage};
use idemkv::{
    Batch, BatchReport, Digest, Durability, LogEntry, ManualClock, OnConflict, Options,
    QuarantineEntry, Record, Store,
};

const SOURCE: &str = "src";
const SEGMENT_BYTES_MAX: u64 = 2048;
const SNAPSHOT_LOG_BYTES: u64 = 1024;

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn options(storage: &FaultyStorage, durability: Durability) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .durability(durability)
        .segment_bytes_max(SEGMENT_BYTES_MAX)
        // Automatic snapshots during the workload, so that crashes also
        // land in the ones `apply_batch` writes.
        .snapshot_log_bytes(Some(SNAPSHOT_LOG_BYTES))
        .on_conflict(OnConflict::Quarantine)
        .clock(Arc::new(ManualClock::new(1_700_000_000_000)))
}

fn value(i: usize, j: usize) -> Vec<u8> {
    format!("<value {i}.{j}>").repeat(8).into_bytes()
}

/// The script: each batch puts three keys over a rotating set (inserts, then
/// updates), some delete, all add to a counter, redeliver an event of the
/// batch before (every fifth also another with other content, which is
/// quarantined), and set the checkpoint to their own index + 1. One batch is
/// delivered twice (the second time it is `replayed`).
fn workload() -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    for i in 0..16usize {
        let seq = (i as u64 + 1) * 10;
        let mut b = Batch::new(format!("B{i:02}"));
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
            b = b.add(format!("a{p}"), "visits", p as u64 * 10 + 10, p as i64 + 1);
        }
        if i % 5 == 4 {
            // An event of the batch before with other content: quarantined.
            let p = i - 1;
            b = b.put(
                format!("e{p}.1"),
                format!("k{}", (p + 1) % 7),
                (p as u64 + 1) * 10 + 1,
                "other content",
            );
        }
        b = b.checkpoint(SOURCE, (i as u64 + 1).to_be_bytes());
        batches.push(b);
        if i == 5 {
            let again = batches.get(3).expect("batch 3 exists").clone();
            batches.push(again);
        }
        if i == 8 {
            batches.push(large_batch(seq));
            // Two of its events again: duplicates, found through the seen
            // ids the writer applied before the large record's sync.
            let again = Batch::new("LARGE-AGAIN")
                .put("l0", "large0", seq, value(99, 0))
                .put("l319", "large319", seq + 319, value(99, 319));
            batches.push(again);
        }
    }
    batches
}

/// A batch whose record is over 32 KiB: the writer applies its seen ids
/// while the disk writes it back, before the sync (`apply_batch`'s path
/// for large records). Alone in a segment, since segments are smaller.
fn large_batch(seq: u64) -> Batch {
    let mut b = Batch::new("LARGE");
    for j in 0..320usize {
        b = b.put(
            format!("l{j}"),
            format!("large{j}"),
            seq + j as u64,
            value(99, j),
        );
    }
    b
}

/// The observable state.
#[derive(Debug, Clone, PartialEq)]
struct Snap {
    digest: Digest,
    rows: Vec<(Bytes, Record)>,
    checkpoint: Option<Bytes>,
    checkpoints: Vec<(Bytes, Bytes)>,
    log: Vec<LogEntry>,
    quarantine: Vec<QuarantineEntry>,
}

fn snap(store: &Store) -> Snap {
    Snap {
        digest: store.digest().expect("digest"),
        rows: store
            .scan_prefix(b"")
            .collect::<Result<Vec<_>, _>>()
            .expect("scan"),
        checkpoint: store.checkpoint(SOURCE).expect("checkpoint"),
        checkpoints: store.checkpoints(),
        log: store.log(),
        quarantine: store.quarantine(),
    }
}

/// The uninterrupted run: the state after each prefix (`states[i]` after
/// `i` batches), each batch's report, and the operations it made.
struct Clean {
    states: Vec<Snap>,
    reports: Vec<BatchReport>,
    ops: Vec<OpRecord>,
}

fn clean_run(batches: &[Batch], durability: Durability) -> Clean {
    let storage = FaultyStorage::new();
    let mut store = Store::open(dir(), options(&storage, durability)).expect("open");
    let mut states = vec![snap(&store)];
    let mut reports = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        reports.push(store.apply_batch(b).expect("clean apply"));
        let state = snap(&store);
        store = maintain(store, i, &storage, durability).expect("clean maintenance");
        assert_eq!(
            snap(&store),
            state,
            "maintenance after batch {i} keeps the state"
        );
        states.push(state);
    }
    drop(store);
    // The operations of the workload alone (reading the states above made more).
    let storage = FaultyStorage::new();
    let progress = run_until_failure(&storage, batches, durability);
    assert_eq!(progress.acked, batches.len(), "the workload runs cleanly");
    Clean {
        states,
        reports,
        ops: storage.ops(),
    }
}

/// Work the script does between batches, besides writing them.
#[derive(Debug, Clone, Copy)]
enum Maintenance {
    Snapshot,
    Compact,
    /// Close (which writes a snapshot) and open again.
    Reopen,
}

/// The maintenance the script runs after batch `i`.
fn maintenance_after(i: usize) -> &'static [Maintenance] {
    match i {
        3 => &[Maintenance::Snapshot],
        7 => &[Maintenance::Compact],
        10 => &[Maintenance::Reopen],
        13 => &[Maintenance::Compact, Maintenance::Snapshot],
        _ => &[],
    }
}

/// Runs the maintenance after batch `i`; an error ends the run.
fn maintain(
    mut store: Store,
    i: usize,
    storage: &FaultyStorage,
    durability: Durability,
) -> Result<Store, idemkv::Error> {
    for m in maintenance_after(i) {
        match m {
            Maintenance::Snapshot => store.snapshot()?,
            Maintenance::Compact => {
                store.compact()?;
            }
            Maintenance::Reopen => {
                store.close()?;
                store = Store::open(dir(), options(storage, durability))?;
            }
        }
    }
    Ok(store)
}

/// How far a run that may die got: batches acknowledged, batches attempted.
#[derive(Debug, Clone, Copy)]
struct Progress {
    acked: usize,
    attempted: usize,
}

/// Runs the workload until the first error (the process died there).
fn run_until_failure(
    storage: &FaultyStorage,
    batches: &[Batch],
    durability: Durability,
) -> Progress {
    let mut progress = Progress {
        acked: 0,
        attempted: 0,
    };
    let Ok(mut store) = Store::open(dir(), options(storage, durability)) else {
        return progress;
    };
    for (i, b) in batches.iter().enumerate() {
        progress.attempted += 1;
        if store.apply_batch(b).is_err() {
            break;
        }
        progress.acked += 1;
        match maintain(store, i, storage, durability) {
            Ok(s) => store = s,
            Err(_) => break,
        }
    }
    progress
}

/// Opens `image`, checks that it holds exactly a prefix of the batches that
/// contains every acknowledged one (`at_least`) and none beyond those
/// attempted (`at_most`), then resumes the workload from the recovered
/// checkpoint and checks the final state. Returns the prefix length.
fn recover_and_resume(
    image: &FaultyStorage,
    batches: &[Batch],
    clean: &Clean,
    durability: Durability,
    at_least: usize,
    at_most: usize,
    what: &str,
) -> usize {
    let store = match Store::open(dir(), options(image, durability)) {
        Ok(store) => store,
        Err(e) => panic!("{what}: reopen failed: {e}\nfiles: {:?}", image.files()),
    };
    let got = snap(&store);
    let prefix = (at_least..=at_most.min(batches.len()))
        .rev()
        .find(|&p| clean.states.get(p) == Some(&got));
    let Some(prefix) = prefix else {
        let matching: Vec<usize> = (0..clean.states.len())
            .filter(|&p| clean.states.get(p) == Some(&got))
            .collect();
        panic!(
            "{what}: recovered state is not a prefix of {at_least}..={at_most} batches \
             (it matches prefixes {matching:?}); recovered log {:?}",
            got.log
        );
    };
    if let Err(e) = store.verify() {
        panic!("{what}: verify after recovery: {e}");
    }

    // Resume like a consumer: from the checkpoint, redelivering one batch.
    let next = got.checkpoint.as_ref().map_or(0, |c| {
        let position: [u8; 8] = c[..].try_into().expect("8-byte checkpoint");
        u64::from_be_bytes(position) as usize
    });
    let start = next.saturating_sub(1).min(prefix);
    for (i, b) in batches.iter().enumerate().skip(start) {
        let report = match store.apply_batch(b) {
            Ok(r) => r,
            Err(e) => panic!("{what}: resumed batch {i}: {e}"),
        };
        if i < prefix {
            assert!(
                report.replayed,
                "{what}: batch {i} was committed before the crash, must be replayed"
            );
        } else {
            assert_eq!(
                Some(&report),
                clean.reports.get(i),
                "{what}: resumed batch {i} reports differently from the clean run"
            );
        }
    }
    assert_eq!(
        Some(&snap(&store)),
        clean.states.last(),
        "{what}: resumed workload does not reach the uninterrupted state"
    );
    prefix
}

/// Byte offsets at which to tear an append of `len` bytes: inside the frame
/// header, right after it, inside the body, and one byte short.
fn torn_offsets(len: u64) -> Vec<usize> {
    let len = len as usize;
    let mut offsets = vec![1, 23, 24, 25, len / 2, len.saturating_sub(1)];
    offsets.retain(|&k| k > 0 && k < len);
    offsets.sort_unstable();
    offsets.dedup();
    offsets
}

fn is_segment(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "seg")
}

#[test]
fn power_loss_at_every_operation_recovers_a_committed_prefix() {
    let batches = workload();
    let clean = clean_run(&batches, Durability::Sync);
    let op_count = clean.ops.len() as u64;
    let rotations = clean
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::SyncDir)
        .count();
    assert!(
        rotations >= 4,
        "the workload rotates segments ({rotations} dir syncs)"
    );
    // Snapshots and compactions switch files by rename and remove the old ones.
    for kind in [OpKind::Rename, OpKind::Remove] {
        let n = clean.ops.iter().filter(|o| o.kind == kind).count();
        assert!(n >= 2, "the workload makes {n} {kind:?} operations");
    }
    let snapshots = clean
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Rename && o.path.ends_with("SNAPSHOT.tmp"))
        .count();
    assert!(
        snapshots >= 4,
        "the workload writes automatic snapshots besides its two explicit ones ({snapshots} in all)"
    );

    assert!(
        clean
            .ops
            .iter()
            .any(|o| o.kind == OpKind::Write && is_segment(&o.path) && o.bytes >= 32 << 10),
        "the workload writes a record large enough to have its seen ids applied before its sync"
    );

    let again = batches
        .iter()
        .position(|b| b.id() == b"LARGE-AGAIN")
        .expect("the redelivery batch");
    assert_eq!(
        clean.reports[again].duplicates, 2,
        "{:?}",
        clean.reports[again]
    );

    let mut prefixes_seen = vec![0usize; batches.len() + 1];
    for n in 0..op_count {
        let storage = FaultyStorage::new();
        storage.crash_at(n);
        let progress = run_until_failure(&storage, &batches, Durability::Sync);
        assert!(storage.has_crashed(), "crash at op {n} happened");
        for policy in [CrashPolicy::PowerLoss, CrashPolicy::Torn { bytes: 0 }] {
            let what = format!(
                "crash at op {n} ({:?}), {policy:?}",
                clean.ops.get(n as usize)
            );
            let image = storage.crash_image(policy);
            let p = recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Sync,
                progress.acked,
                progress.attempted,
                &what,
            );
            if let Some(c) = prefixes_seen.get_mut(p) {
                *c += 1;
            }
        }
    }
    // Every distinct committed prefix but the whole workload (the last
    // batch's sync is the last operation) was the outcome of some cut.
    for (p, seen) in prefixes_seen.iter().enumerate().take(batches.len()) {
        if clean.states.get(p) != clean.states.get(p + 1) {
            assert!(
                *seen > 0,
                "no cut recovered to prefix {p}: {prefixes_seen:?}"
            );
        }
    }
}

#[test]
fn torn_appends_recover_a_committed_prefix() {
    let batches = workload();
    let clean = clean_run(&batches, Durability::Sync);
    let mut cuts = 0;
    for op in clean.ops.iter().filter(|o| o.kind == OpKind::Write) {
        let n = op.index;
        for k in torn_offsets(op.bytes) {
            // The process dies inside the append; the OS keeps what it wrote.
            let storage = FaultyStorage::new();
            storage.crash_at_torn(n, k);
            let progress = run_until_failure(&storage, &batches, Durability::Sync);
            let what = format!("append op {n} of {} torn at byte {k}", op.bytes);
            let image = storage.crash_image(CrashPolicy::ProcessCrash);
            recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Sync,
                progress.acked,
                progress.attempted,
                &what,
            );

            // Power fails right after the append: the disk wrote back `k` bytes of it.
            let storage = FaultyStorage::new();
            storage.crash_at(n + 1);
            let progress = run_until_failure(&storage, &batches, Durability::Sync);
            let what = format!("power loss after append op {n}, {k} bytes written back");
            let image = storage.crash_image(CrashPolicy::Torn { bytes: k as u64 });
            recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Sync,
                progress.acked,
                progress.attempted,
                &what,
            );
            cuts += 2;
        }
    }
    assert!(cuts > 50, "{cuts} torn cuts");
}

/// Crash images with a torn tail: each append of the workload torn at a few
/// bytes, as a process crash leaves it.
fn torn_images(batches: &[Batch], clean: &Clean) -> Vec<(FaultyStorage, Progress, String)> {
    let mut images = Vec::new();
    for op in clean.ops.iter().filter(|o| o.kind == OpKind::Write) {
        for k in [1, op.bytes as usize / 2] {
            let storage = FaultyStorage::new();
            storage.crash_at_torn(op.index, k);
            let progress = run_until_failure(&storage, batches, Durability::Sync);
            let what = format!("append op {} torn at byte {k}", op.index);
            images.push((
                storage.crash_image(CrashPolicy::ProcessCrash),
                progress,
                what,
            ));
        }
    }
    images
}

#[test]
fn crash_during_recovery_then_recover_again() {
    let batches = workload();
    let clean = clean_run(&batches, Durability::Sync);
    let mut cuts = 0;
    let mut truncations = 0;
    for (image, progress, what) in torn_images(&batches, &clean) {
        // Count the operations of a clean recovery of this image.
        let probe = image.crash_image(CrashPolicy::ProcessCrash);
        let store = Store::open(dir(), options(&probe, Durability::Sync))
            .unwrap_or_else(|e| panic!("{what}: open: {e}"));
        // Only open's own operations: dropping the store writes a snapshot.
        let open_ops = probe.ops();
        drop(store);
        if open_ops.iter().any(|o| o.kind == OpKind::SetLen) {
            truncations += 1;
        }
        for n in 0..open_ops.len() as u64 {
            let first = image.crash_image(CrashPolicy::ProcessCrash);
            first.crash_at(n);
            let opened = Store::open(dir(), options(&first, Durability::Sync));
            assert!(
                opened.is_err(),
                "{what}: open must fail when it crashes at its op {n}"
            );
            drop(opened);
            for policy in [CrashPolicy::PowerLoss, CrashPolicy::ProcessCrash] {
                let second = first.crash_image(policy);
                let what = format!("{what}, recovery crashed at op {n} ({policy:?})");
                recover_and_resume(
                    &second,
                    &batches,
                    &clean,
                    Durability::Sync,
                    progress.acked,
                    progress.attempted,
                    &what,
                );
                cuts += 1;
            }
        }
    }
    assert!(
        truncations > 10,
        "{truncations} recoveries truncated a torn tail"
    );
    assert!(cuts > 100, "{cuts} cuts");
}

#[test]
fn process_crash_keeps_every_buffered_acknowledged_batch() {
    let batches = workload();
    let clean = clean_run(&batches, Durability::Buffered);
    for n in 0..clean.ops.len() as u64 {
        let storage = FaultyStorage::new();
        storage.crash_at(n);
        let progress = run_until_failure(&storage, &batches, Durability::Buffered);
        let image = storage.crash_image(CrashPolicy::ProcessCrash);
        recover_and_resume(
            &image,
            &batches,
            &clean,
            Durability::Buffered,
            progress.acked,
            progress.attempted,
            &format!("buffered, process crash at op {n}"),
        );
    }
}

#[test]
fn buffered_power_loss_recovers_a_prefix() {
    // Buffered batches may be lost at a power loss, but what survives is
    // still a prefix of them, never a gap or half a batch.
    let batches = workload();
    let clean = clean_run(&batches, Durability::Buffered);
    for n in 0..clean.ops.len() as u64 {
        let storage = FaultyStorage::new();
        storage.crash_at(n);
        let progress = run_until_failure(&storage, &batches, Durability::Buffered);
        let mut policies = vec![CrashPolicy::PowerLoss];
        let unsynced_bytes: u64 = storage
            .files()
            .iter()
            .filter(|p| is_segment(p))
            .map(|p| {
                let current = storage.file_len(p).unwrap_or(0);
                let durable = storage.read_durable_file(p).map_or(0, |b| b.len() as u64);
                current.saturating_sub(durable)
            })
            .sum();
        for k in [1, 24, unsynced_bytes / 2, unsynced_bytes.saturating_sub(1)] {
            if k > 0 && k < unsynced_bytes {
                policies.push(CrashPolicy::Torn { bytes: k });
            }
        }
        for policy in policies {
            let image = storage.crash_image(policy);
            recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Buffered,
                0,
                progress.attempted,
                &format!("buffered, power loss at op {n}, {policy:?}"),
            );
        }
    }
}

/// Whether applying batch `k` (after the ones before it, with no
/// maintenance) starts a new segment.
fn rotates_at(batches: &[Batch], k: usize) -> bool {
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage, Durability::Sync)).expect("open");
    for b in batches.iter().take(k) {
        store.apply_batch(b).expect("apply");
    }
    let before = storage.op_count() as usize;
    store.apply_batch(&batches[k]).expect("apply");
    storage
        .ops()
        .iter()
        .skip(before)
        .any(|o| o.mode == Some(OpenMode::CreateNew))
}

#[test]
fn group_commit_power_loss_with_reordered_writeback_recovers_a_prefix() {
    // Writer A appends and starts the group sync; while it is in flight,
    // writer B appends too. Power fails before the sync completes, and the
    // disk may have written back B's record and not A's (a hole of zeros),
    // or any prefix of the two. Neither was acknowledged; the store must
    // open to a prefix.
    let batches = workload();
    let clean = clean_run(&batches, Durability::Sync);
    let timeout = std::time::Duration::from_secs(20);
    let mut cuts = 0;
    for k in 0..batches.len() - 1 {
        let writes_record = |i: usize| clean.reports.get(i).is_some_and(|r| !r.replayed);
        if !writes_record(k) || !writes_record(k + 1) || rotates_at(&batches, k) {
            continue;
        }
        // A rotation's sync waits at the sync gate for A's sync: a B that
        // must rotate first appends nothing before the power fails (its
        // images are checked all the same).
        let b_rotates = rotates_at(&batches, k + 1);
        let storage = FaultyStorage::new();
        // The held sync is A's commit sync: no zero fill's sync before it
        // (fills are cut short by the other crash tests).
        let options = options(&storage, Durability::Sync).zero_fill(false);
        let store = Store::open(dir(), options).expect("open");
        for b in batches.iter().take(k) {
            store.apply_batch(b).expect("apply");
        }
        let (a, b) = (&batches[k], &batches[k + 1]);
        storage.pause_next(OpKind::SyncData);
        let b_appended = std::thread::scope(|scope| {
            let writer_a = scope.spawn(|| store.apply_batch(a));
            let held = storage
                .wait_until_paused(timeout)
                .expect("writer A's sync starts");
            let writer_b = scope.spawn(|| store.apply_batch(b));
            let deadline = std::time::Instant::now()
                + if b_rotates {
                    std::time::Duration::from_millis(200)
                } else {
                    timeout
                };
            let b_appended = loop {
                let ops = storage.ops();
                if ops
                    .iter()
                    .skip(held as usize + 1)
                    .any(|o| o.kind == OpKind::Write && is_segment(&o.path) && o.offset >= 32)
                {
                    break true;
                }
                if std::time::Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            };
            // Power fails while A's sync is in flight.
            storage.crash_at(held);
            storage.resume();
            assert!(
                writer_a.join().expect("writer A").is_err(),
                "A's sync failed"
            );
            assert!(
                writer_b.join().expect("writer B").is_err(),
                "B was never synced"
            );
            b_appended
        });
        assert!(
            b_appended || b_rotates,
            "batch {}: writer B appends while writer A's sync is in flight (group commit)",
            k + 1
        );
        drop(store);

        // Segments are extended ahead of their records, so their lengths do
        // not say how far the records reach: the last byte that is not zero does.
        let data_end = |bytes: Option<Vec<u8>>| {
            bytes.map_or(0, |b| {
                b.iter().rposition(|&x| x != 0).map_or(0, |i| i as u64 + 1)
            })
        };
        let unsynced: u64 = storage
            .files()
            .iter()
            .filter(|p| is_segment(p))
            .map(|p| {
                let current = data_end(storage.read_file(p));
                let durable = data_end(storage.read_durable_file(p));
                current.saturating_sub(durable)
            })
            .sum();
        let mut policies = vec![
            CrashPolicy::PowerLoss,
            CrashPolicy::ProcessCrash,
            CrashPolicy::Reordered { writes: 1 },
            CrashPolicy::Reordered { writes: 2 },
        ];
        for bytes in [1, 24, unsynced / 2, unsynced.saturating_sub(1)] {
            policies.push(CrashPolicy::Torn { bytes });
        }
        let seg_bytes = |image: &FaultyStorage| -> u64 {
            image
                .files()
                .iter()
                .filter(|p| is_segment(p))
                .map(|p| data_end(image.read_file(p)))
                .sum()
        };
        let lost_both = seg_bytes(&storage.crash_image(CrashPolicy::PowerLoss));
        let kept_b = seg_bytes(&storage.crash_image(CrashPolicy::Reordered { writes: 1 }));
        assert!(
            kept_b > lost_both,
            "batch {k}: the reordered image keeps B's record past A's hole"
        );
        for policy in policies {
            let image = storage.crash_image(policy);
            recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Sync,
                k,
                k + 2,
                &format!("batches {k} and {} in one group sync, {policy:?}", k + 1),
            );
            cuts += 1;
        }
    }
    assert!(cuts >= 50, "{cuts} cuts");
}

#[test]
fn buffered_power_loss_with_reordered_writeback_is_a_prefix_or_repairable_corruption() {
    // The disk may write back a file's unsynced appends in any order: a
    // power loss can keep a later record and lose an earlier one (a hole of
    // zeros). Buffered frames claim that everything before them was written,
    // so the store cannot tell such a hole from damage: it opens to a prefix,
    // or reports Corruption and `repair` salvages a prefix.
    let batches = workload();
    let clean = clean_run(&batches, Durability::Buffered);
    let mut cuts = 0;
    let mut repaired = 0;
    for n in 0..clean.ops.len() as u64 {
        let storage = FaultyStorage::new();
        storage.crash_at(n);
        let progress = run_until_failure(&storage, &batches, Durability::Buffered);
        for writes in 1..=2 {
            let what =
                format!("buffered, power loss at op {n}, last {writes} unsynced writes kept");
            let image = storage.crash_image(CrashPolicy::Reordered { writes });
            match Store::open(dir(), options(&image, Durability::Buffered)) {
                Ok(store) => drop(store),
                Err(idemkv::Error::Corruption { .. }) => {
                    Store::repair(dir(), options(&image, Durability::Buffered))
                        .unwrap_or_else(|e| panic!("{what}: repair: {e}"));
                    repaired += 1;
                }
                Err(e) => panic!("{what}: open: {e}"),
            }
            recover_and_resume(
                &image,
                &batches,
                &clean,
                Durability::Buffered,
                0,
                progress.attempted,
                &what,
            );
            cuts += 1;
        }
    }
    assert!(cuts > 0, "{cuts} cuts, {repaired} repaired");
}

/// Automatic snapshots: after a crash, open replays only the log written
/// since the last one, however long the store ran; without them, all of it.
#[test]
fn automatic_snapshots_bound_the_log_replayed_after_a_crash() {
    const BATCHES: usize = 300;
    let batch = |i: usize| {
        Batch::new(format!("B{i:04}"))
            .put(
                format!("e{i}"),
                format!("k{}", i % 50),
                i as u64 + 1,
                value(i, 0).repeat(8),
            )
            .checkpoint(SOURCE, (i as u64).to_be_bytes())
    };
    let mut digests = Vec::new();
    for every in [Some(16 * 1024), None] {
        let storage = FaultyStorage::new();
        let options = options(&storage, Durability::Sync)
            .segment_bytes_max(1 << 20)
            .snapshot_log_bytes(every);
        let store = Store::open(dir(), options.clone()).expect("open");
        for i in 0..BATCHES {
            store.apply_batch(&batch(i)).expect("apply");
        }
        let digest = store.digest().expect("digest");
        let image = storage.crash_image(CrashPolicy::ProcessCrash);
        drop(store);

        let options = options.storage(Arc::new(image.clone()));
        let reopened = Store::open(dir(), options).expect("reopen after the crash");
        let stats = reopened.stats();
        assert_eq!(reopened.digest().expect("digest"), digest, "{every:?}");
        match every {
            Some(bytes) => {
                assert!(stats.opened_from_snapshot, "{stats:?}");
                // A snapshot is due once the log since the last one reaches
                // `every` and that snapshot's size; each record holds a
                // value of about 1.4 KiB.
                let snapshot_bytes = image
                    .open(&dir().join("SNAPSHOT"), OpenMode::Read)
                    .and_then(|f| f.len())
                    .expect("snapshot");
                let most = bytes.max(snapshot_bytes) / 1024 + 1;
                assert!(
                    stats.records_replayed_at_open <= most,
                    "replayed {} records, at most {most} expected",
                    stats.records_replayed_at_open
                );
            }
            None => {
                assert!(!stats.opened_from_snapshot);
                assert_eq!(stats.records_replayed_at_open, BATCHES as u64);
            }
        }
        digests.push(digest);
    }
    assert_eq!(digests[0], digests[1]);
}

/// A store under `Sync` without zero filling (the syncs the tests below hold
/// are commit syncs), its options, and one batch in it.
fn a_sync_store_with_one_batch() -> (FaultyStorage, Options, Store) {
    let storage = FaultyStorage::new();
    let options = options(&storage, Durability::Sync).zero_fill(false);
    let store = Store::open(dir(), options.clone()).expect("open");
    store
        .apply_batch(&Batch::new("B0").put("e0", "k0", 1, "v"))
        .expect("apply");
    (storage, options, store)
}

/// A commit sync covers the records written before it starts, not those
/// written while it runs: writer B appends while A's sync (which succeeds)
/// is held, both are acknowledged, and a power loss right after keeps both.
/// (A syncer that took, as what it synced, the position written by the
/// time its sync returned passed every other crash test.)
#[test]
fn a_batch_written_while_a_commit_sync_runs_is_synced_before_it_is_acknowledged() {
    let timeout = std::time::Duration::from_secs(20);
    let (storage, options, store) = a_sync_store_with_one_batch();
    let a = Batch::new("A").put("ea", "ka", 1, "va");
    let b = Batch::new("B").put("eb", "kb", 1, "vb");
    storage.pause_after_next_sync();
    let (ra, rb) = std::thread::scope(|scope| {
        let writer_a = scope.spawn(|| store.apply_batch(&a));
        let held = storage
            .wait_until_paused(timeout)
            .expect("A's sync returns and is held");
        let writer_b = scope.spawn(|| store.apply_batch(&b));
        let deadline = std::time::Instant::now() + timeout;
        let b_appended = loop {
            let appended = storage
                .ops()
                .iter()
                .skip(held as usize + 1)
                .any(|o| o.kind == OpKind::Write && is_segment(&o.path) && o.offset >= 32);
            if appended || std::time::Instant::now() > deadline {
                break appended;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        // Resumed before asserting: a failure must not leave the sync held.
        storage.resume();
        assert!(b_appended, "B appends while A's sync is held");
        (writer_a.join().expect("A"), writer_b.join().expect("B"))
    });
    ra.expect("A acknowledged");
    rb.expect("B acknowledged");
    // The power fails right after both returned.
    let image = storage.crash_image(CrashPolicy::PowerLoss);
    drop(store);
    let reopened = Store::open(dir(), options.storage(Arc::new(image))).expect("reopen");
    for key in ["k0", "ka", "kb"] {
        assert!(
            reopened.get(key).unwrap().is_some(),
            "acknowledged {key} lost"
        );
    }
}

/// A redelivered batch that finds its original written but not yet synced
/// waits for that sync before it reports `replayed`: its `Ok` promises the
/// batch survives a power loss. (Returning at once passed every other test.)
#[test]
fn a_replay_waits_for_the_original_s_sync_before_it_is_acknowledged() {
    let timeout = std::time::Duration::from_secs(20);
    let (storage, options, store) = a_sync_store_with_one_batch();
    let batch = Batch::new("B1").put("e1", "k1", 1, "v1");
    storage.pause_next(OpKind::SyncData);
    let (original, replay) = std::thread::scope(|scope| {
        let original = scope.spawn(|| store.apply_batch(&batch));
        storage
            .wait_until_paused(timeout)
            .expect("the original's sync starts");
        let replay = scope.spawn(|| store.apply_batch(&batch));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let returned_early = replay.is_finished();
        // Resumed before asserting: a failure must not leave the sync held.
        storage.resume();
        assert!(
            !returned_early,
            "the replay returned while the original's sync was held"
        );
        (
            original.join().expect("original"),
            replay.join().expect("replay"),
        )
    });
    assert!(!original.expect("original").replayed);
    assert!(replay.expect("replay").replayed);
    let image = storage.crash_image(CrashPolicy::PowerLoss);
    drop(store);
    let reopened = Store::open(dir(), options.storage(Arc::new(image))).expect("reopen");
    assert!(
        reopened.get("k1").unwrap().is_some(),
        "acknowledged B1 lost"
    );
}
