//! Compaction and snapshots: the logical state never changes, the disk and
//! memory shrink, and `open` loads a trustworthy snapshot and rejects any
//! other.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, Durability, ManualClock, OnConflict, Options, Store};

const HOUR: Duration = Duration::from_secs(3600);
const T0_MS: u64 = 1_700_000_000_000;

fn options(clock: &ManualClock) -> Options {
    Options::default()
        .durability(Durability::Buffered)
        .clock(Arc::new(clock.clone()))
        .seen_ttl(Some(HOUR))
        .batch_ttl(Some(HOUR))
        .tombstone_ttl(Some(2 * HOUR))
        .segment_bytes_max(16 * 1024)
}

/// Everything a caller can observe, so two stores can be compared whole.
#[derive(Debug, PartialEq)]
struct Observed {
    digest: String,
    rows: Vec<(Vec<u8>, u64, Vec<u8>)>,
    checkpoints: Vec<(Vec<u8>, Vec<u8>)>,
    quarantine: usize,
}

fn observe(store: &Store) -> Observed {
    Observed {
        digest: store.digest().unwrap().to_string(),
        rows: store
            .scan_prefix(b"")
            .map(|r| {
                let (k, rec) = r.unwrap();
                (k.to_vec(), rec.seq, rec.value.to_vec())
            })
            .collect(),
        checkpoints: store
            .checkpoints()
            .into_iter()
            .map(|(s, p)| (s.to_vec(), p.to_vec()))
            .collect(),
        quarantine: store.quarantine().len(),
    }
}

/// Batch `i` of a workload that overwrites a small key space, so most of
/// the log becomes garbage.
fn batch(i: u64) -> Batch {
    let mut b = Batch::new(format!("B{i:05}"));
    for j in 0..20u64 {
        let n = i * 20 + j;
        b = b.put(
            format!("e{n}"),
            format!("k{:03}", n % 150),
            n,
            format!("value {n} {}", "x".repeat(40)),
        );
    }
    b.delete(
        format!("d{i}"),
        format!("k{:03}", (i * 7) % 150),
        i * 20 + 19,
    )
    .delete(format!("t{i}"), format!("t{:03}", i % 40), i)
    .add(format!("a{i}"), "counter", i, 1)
    .checkpoint("src", (i + 1).to_be_bytes())
}

fn segment_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    names
}

#[test]
fn compaction_keeps_the_state_and_shrinks_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..300 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let before = observe(&store);
    let segments_before = segment_files(dir.path()).len();
    assert!(segments_before > 10, "{segments_before} segments");

    let report = store.compact().unwrap();
    assert_eq!(observe(&store), before);
    assert!(report.bytes_after * 2 < report.bytes_before, "{report:?}");
    assert_eq!(report.segments_replaced as usize, segments_before);
    assert_eq!(
        segment_files(dir.path()).len(),
        2,
        "the base and the new active segment"
    );
    // Without a snapshot, what the compaction found on disk was the
    // replaced segments: all of it but the base is dead.
    let base = std::fs::metadata(dir.path().join(&segment_files(dir.path())[0]))
        .unwrap()
        .len();
    assert_eq!(report.dead_bytes, report.bytes_before - base, "{report:?}");
    assert!(store.verify().is_ok());
    // Replays and duplicates are still recognised.
    assert!(store.apply_batch(&batch(299)).unwrap().replayed);
    let mut redelivery = Batch::new("redelivery of B00299");
    for d in batch(299).deliveries() {
        redelivery.push_delivery(d.clone());
    }
    assert_eq!(store.apply_batch(&redelivery).unwrap().duplicates, 23);

    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert_eq!(observe(&store).rows, before.rows);
}

/// The bytes a compaction reports are the store's files as a close leaves
/// them: not the space the newest segment holds ahead of its records.
#[test]
fn a_compaction_reports_the_bytes_a_close_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..3 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let report = store.compact().unwrap();
    store.close().unwrap();
    let on_disk: u64 = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.ends_with(".seg") || name == "SNAPSHOT"
        })
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert_eq!(report.bytes_after, on_disk, "{report:?}");
}

/// Expired seen ids that the seen index's merges let go of before the
/// compaction are not counted again as dropped (`stats` stopped counting
/// them already); their bytes still leave the disk.
#[test]
fn seen_ids_merged_away_before_a_compaction_count_in_its_bytes_not_its_ids() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock).batch_ttl(None)).unwrap();
    let ids = |prefix: &str, i: u64| {
        (0..100u64).fold(Batch::new(format!("{prefix}{i}")), |b, j| {
            let n = i * 100 + j;
            b.put(format!("{prefix}e{n}"), format!("k{}", n % 10), n, "v")
        })
    };
    for i in 0..50 {
        store.apply_batch(&ids("old", i)).unwrap();
    }
    clock.advance(2 * HOUR);
    // Enough new ids for merges, which let the expired ones go.
    for i in 0..50 {
        store.apply_batch(&ids("new", i)).unwrap();
    }
    let before = store.stats().seen_ids;
    assert!(before < 10_000, "merges let expired ids go: {before}");
    let report = store.compact().unwrap();
    assert_eq!(
        report.seen_ids_dropped,
        before - store.stats().seen_ids,
        "{report:?}"
    );
    // At least the 16-byte hashes of the 5,000 expired ids.
    assert!(report.dead_bytes > 50 * 100 * 16, "{report:?}");
}

#[test]
fn compaction_drops_what_expired_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..50 {
        store.apply_batch(&batch(i)).unwrap();
    }
    clock.advance(3 * HOUR);
    for i in 50..60 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let before = observe(&store);
    let stats_before = store.stats();
    let report = store.compact().unwrap();
    assert_eq!(report.batch_ids_dropped, 50, "{report:?}");
    assert_eq!(report.seen_ids_dropped, 50 * 23, "{report:?}");
    assert_eq!(
        report.tombstones_dropped, 30,
        "all tombstones but t010..t019 were last written before the clock moved"
    );
    let stats = store.stats();
    assert_eq!(stats.seen_ids, stats_before.seen_ids - 50 * 23);
    assert_eq!(stats.tombstones, stats_before.tombstones - 30);
    assert_eq!(stats.batches, 10);
    assert_eq!(observe(&store), before);

    // Expired deltas stay protected: a late redelivery is too_late.
    let late = store
        .apply_batch(&Batch::new("late").add("a3", "counter", 3, 1))
        .unwrap();
    assert_eq!(late.rejected, 1);
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert_eq!(store.stats().batches, 11);
    assert_eq!(observe(&store).digest, before.digest);
}

#[test]
fn writers_and_readers_go_on_while_compaction_runs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = Store::open(reference_dir.path(), options(&clock)).unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    let is_done = || done.load(std::sync::atomic::Ordering::SeqCst);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..400 {
                store.apply_batch(&batch(i)).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        s.spawn(|| {
            while !is_done() {
                let rows: BTreeMap<_, _> = store.scan_prefix(b"k").map(|r| r.unwrap()).collect();
                for (k, rec) in rows {
                    // Versions never go back; the key may have been deleted since.
                    if let Some(now) = store.get(&k).unwrap() {
                        assert!(now.seq >= rec.seq, "{k:?}: {} after {}", now.seq, rec.seq);
                    }
                }
            }
        });
        let mut pauses = Vec::new();
        while !is_done() {
            pauses.push(store.compact().unwrap().pause);
        }
        assert!(!pauses.is_empty());
    });
    for i in 0..400 {
        reference.apply_batch(&batch(i)).unwrap();
    }
    assert_eq!(observe(&store), observe(&reference));
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert_eq!(observe(&store), observe(&reference));
}

#[test]
fn a_clean_close_lets_open_load_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..100 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let before = observe(&store);
    store.close().unwrap();

    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let stats = store.stats();
    assert!(stats.opened_from_snapshot, "{stats:?}");
    assert_eq!(stats.records_replayed_at_open, 0);
    assert_eq!(observe(&store), before);
    // The snapshot carries seen ids, batch ids and add marks, not just rows.
    assert_eq!(
        store.apply_batch(&batch(50)).map(|r| r.replayed).ok(),
        Some(true)
    );
    let r = store
        .apply_batch(&Batch::new("again").put(
            "e5",
            "k005",
            5,
            format!("value 5 {}", "x".repeat(40)),
        ))
        .unwrap();
    assert_eq!(r.duplicates, 1);

    // Batches after the snapshot are replayed on top of it.
    for i in 100..110 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let after = observe(&store);
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    drop(store);
    let crashed = Store::open(copy.path(), options(&clock)).unwrap();
    let stats = crashed.stats();
    assert!(stats.opened_from_snapshot, "{stats:?}");
    assert!(stats.records_replayed_at_open >= 10, "{stats:?}");
    assert_eq!(observe(&crashed), after);
}

/// Copies a store directory as a crash would leave it (without the lock holder's snapshot).
fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[test]
fn a_damaged_or_stale_snapshot_is_never_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..60 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let expected = observe(&store);
    store.close().unwrap();
    let snapshot = dir.path().join("SNAPSHOT");
    let good = std::fs::read(&snapshot).unwrap();

    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("flipped byte", {
            let mut b = good.clone();
            let at = b.len() / 2;
            b[at] ^= 0x40;
            b
        }),
        ("torn", good[..good.len() - 7].to_vec()),
        ("empty", Vec::new()),
        ("header only", good[..32].to_vec()),
    ];
    for (what, bytes) in damages {
        std::fs::write(&snapshot, &bytes).unwrap();
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        let stats = store.stats();
        assert!(!stats.opened_from_snapshot, "{what}");
        assert!(stats.snapshot_rejected.is_some(), "{what}");
        assert_eq!(observe(&store), expected, "{what}");
        assert!(
            matches!(store.verify(), Err(idemkv::Error::Corruption { .. })),
            "verify names a {what} snapshot"
        );
        drop(store);
        std::fs::write(&snapshot, &good).unwrap();
    }

    // A snapshot that covers more log than there is (the log lost its tail).
    let newest = dir.path().join(segment_files(dir.path()).last().unwrap());
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let stats = store.stats();
    assert!(!stats.opened_from_snapshot, "{stats:?}");
    assert!(stats.torn_bytes_discarded > 0, "{stats:?}");
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = Store::open(reference_dir.path(), options(&clock)).unwrap();
    for i in 0..59 {
        reference.apply_batch(&batch(i)).unwrap();
    }
    assert_eq!(
        observe(&store),
        observe(&reference),
        "the torn final batch is gone"
    );
}

/// One put of a fresh key per batch: records of one size, and a log small
/// enough that `close` writes no snapshot (it does from 64 KiB of log).
fn put(prefix: &str, i: u64) -> Batch {
    Batch::new(format!("{prefix}{i:04}")).put(
        format!("{prefix}e{i:04}"),
        format!("{prefix}{i:04}"),
        1,
        format!("{prefix}-value-{i:06}"),
    )
}

/// A store whose newest segment lost its last record after a snapshot
/// covered it (a disk that lost synced bytes, or a power loss in the window
/// after a failed sync), reopened: the snapshot is rejected.
fn reopened_after_the_log_lost_what_its_snapshot_covers(dir: &Path, options: Options) -> Store {
    let store = Store::open(dir, options.clone()).unwrap();
    for i in 0..40 {
        store.apply_batch(&put("B", i)).unwrap();
    }
    store.snapshot().unwrap();
    store.close().unwrap();
    let newest = dir.join(segment_files(dir).last().unwrap());
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 1)
        .unwrap();
    let store = Store::open(dir, options).unwrap();
    let stats = store.stats();
    assert!(stats.snapshot_rejected.is_some(), "{stats:?}");
    assert!(stats.torn_bytes_discarded > 0, "{stats:?}");
    store
}

/// A snapshot rejected because the log no longer holds what it covers is
/// removed before anything is appended: left in place, it fitted again
/// once the log grew past the position it names, and the open after that
/// skipped every record written before that position (an acknowledged
/// batch was lost, and an old key's value pointed at another key's value).
#[test]
fn a_snapshot_the_log_no_longer_bears_out_is_removed_before_anything_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let options = options(&clock).segment_bytes_max(4096);
    let store = reopened_after_the_log_lost_what_its_snapshot_covers(dir.path(), options.clone());
    // Past the position the snapshot names, at a record boundary.
    for i in 0..15 {
        store.apply_batch(&put("N", i)).unwrap();
    }
    let expected = observe(&store);
    store.close().unwrap();

    let store = Store::open(dir.path(), options.clone()).unwrap();
    assert_eq!(observe(&store), expected);
    assert!(!store.stats().opened_from_snapshot, "no snapshot left");
    drop(store);
    Store::verify_dir(dir.path(), &options).unwrap();
}

/// Compaction in the session that rejected the snapshot rebuilds the state
/// from the log, not from that snapshot (which made it fail, after
/// renaming a base that lost acknowledged batches into place).
#[test]
fn compaction_after_open_rejected_the_snapshot_keeps_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let options = options(&clock).segment_bytes_max(4096);
    let store = reopened_after_the_log_lost_what_its_snapshot_covers(dir.path(), options.clone());
    for i in 0..40 {
        store.apply_batch(&put("N", i)).unwrap();
    }
    let expected = observe(&store);
    store.compact().unwrap();
    assert_eq!(observe(&store), expected);
    store.close().unwrap();

    let store = Store::open(dir.path(), options.clone()).unwrap();
    assert_eq!(observe(&store), expected);
    drop(store);
    Store::verify_dir(dir.path(), &options).unwrap();
}

/// Open from a snapshot counts as unsaved only the log it replays, so a
/// store opened and closed without a write keeps its snapshot: `close`
/// rewrote the whole snapshot every time once more than 64 KiB of log lay
/// before the position it covers, counting the segments the open skipped,
/// and so did every read-only command of the command line.
#[cfg(unix)]
#[test]
fn opening_and_closing_without_a_write_keeps_the_snapshot() {
    use std::os::unix::fs::MetadataExt;

    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..100 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.snapshot().unwrap();
    store.close().unwrap();
    let segments = segment_files(dir.path());
    let before_newest: u64 = segments[..segments.len() - 1]
        .iter()
        .map(|name| std::fs::metadata(dir.path().join(name)).unwrap().len())
        .sum();
    assert!(before_newest > 64 * 1024, "{before_newest} bytes");
    let inode = || {
        std::fs::metadata(dir.path().join("SNAPSHOT"))
            .unwrap()
            .ino()
    };
    let written = inode();
    for round in 0..3 {
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        let stats = store.stats();
        assert!(stats.opened_from_snapshot, "round {round}");
        assert_eq!(stats.records_replayed_at_open, 0, "round {round}");
        store.close().unwrap();
        assert_eq!(
            inode(),
            written,
            "round {round}: the snapshot was rewritten"
        );
    }
}

/// `Stats::disk_bytes` counts the snapshot's bytes with the segments':
/// a snapshot takes disk too, and disk is what compaction is weighed by.
#[test]
fn disk_bytes_count_the_snapshot_with_the_segments() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..20 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.snapshot().unwrap();
    let len = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().len();
    let segments: u64 = segment_files(dir.path()).iter().map(|n| len(n)).sum();
    let snapshot = len("SNAPSHOT");
    assert!(snapshot > 0);
    assert_eq!(store.stats().disk_bytes, segments + snapshot);
}

#[test]
fn a_snapshot_from_before_a_compaction_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..60 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.close().unwrap();
    let old_snapshot = std::fs::read(dir.path().join("SNAPSHOT")).unwrap();

    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 60..80 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.compact().unwrap();
    let expected = observe(&store);
    store.close().unwrap();
    std::fs::write(dir.path().join("SNAPSHOT"), &old_snapshot).unwrap();
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert!(!store.stats().opened_from_snapshot);
    assert_eq!(observe(&store), expected);
}

/// A snapshot that refers to no value (its keys are deleted) has no
/// reference that a later compaction could leave outside the log: only the
/// first segment it names tells it apart from one of the current log. Taken
/// right after a compaction, at the header's end of the segment that the
/// next compaction turned into a base, it skipped that base whole and lost
/// every batch written after it.
#[test]
fn a_snapshot_of_no_values_from_before_a_compaction_is_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store
        .apply_batch(&Batch::new("A").put("ea", "k", 1, "v"))
        .unwrap();
    store
        .apply_batch(&Batch::new("B").delete("eb", "k", 2))
        .unwrap();
    store.compact().unwrap();
    store.snapshot().unwrap();
    let old_snapshot = std::fs::read(dir.path().join("SNAPSHOT")).unwrap();
    store
        .apply_batch(&Batch::new("C").put("ec", "k2", 1, "v2"))
        .unwrap();
    store.compact().unwrap();
    let expected = observe(&store);
    store.close().unwrap();
    std::fs::write(dir.path().join("SNAPSHOT"), &old_snapshot).unwrap();

    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert!(!store.stats().opened_from_snapshot);
    assert_eq!(observe(&store), expected);
    assert!(store.get(b"k2").unwrap().is_some());
}

#[test]
fn a_torn_tail_after_the_snapshot_is_cut_and_the_snapshot_still_used() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..50 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.snapshot().unwrap();
    for i in 50..53 {
        store.apply_batch(&batch(i)).unwrap();
    }
    // A crash that tears the last batch's record.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    drop(store);
    let newest = copy.path().join(segment_files(copy.path()).last().unwrap());
    let len = common::records_end(&newest);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 5)
        .unwrap();

    let store = Store::open(copy.path(), options(&clock)).unwrap();
    let stats = store.stats();
    assert!(stats.opened_from_snapshot, "{stats:?}");
    assert!(stats.torn_bytes_discarded > 0, "{stats:?}");
    let reference_dir = tempfile::tempdir().unwrap();
    let reference = Store::open(reference_dir.path(), options(&clock)).unwrap();
    for i in 0..52 {
        reference.apply_batch(&batch(i)).unwrap();
    }
    assert_eq!(observe(&store), observe(&reference));
}

#[test]
fn a_missing_segment_is_corruption_naming_it_never_a_shorter_log() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..40 {
        store.apply_batch(&batch(i)).unwrap();
    }
    drop(store);
    let _ = std::fs::remove_file(dir.path().join("SNAPSHOT"));
    let segments = segment_files(dir.path());
    assert!(segments.len() >= 4, "{segments:?}");
    for missing in [&segments[0], &segments[2]] {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        std::fs::remove_file(copy.path().join(missing)).unwrap();
        match Store::open(copy.path(), options(&clock)) {
            Err(idemkv::Error::Corruption {
                file, offset: 0, ..
            }) => assert_eq!(&file, missing),
            other => panic!("without {missing}: {other:?}"),
        }
    }
}

#[test]
fn zeros_where_a_sealed_segment_lost_its_last_record_fail_compaction_and_replace_nothing() {
    // Compaction seals the active segment and reads it last, but it is not
    // the log's newest then: zeros at its end are lost records, never its
    // end (sealing cut its preallocated space off).
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    for i in 0..40 {
        store.apply_batch(&batch(i)).unwrap();
    }
    let files_before = segment_files(dir.path());
    let active = dir.path().join(files_before.last().unwrap());
    let (starts, end) = common::records(&active);
    let last = *starts.last().expect("the active segment holds records");
    // The disk lost the last record: zeros from its start to the end of
    // what was written.
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&active)
        .unwrap();
    file.write_all_at(&vec![0; (end - last) as usize], last)
        .unwrap();
    drop(file);

    let e = store
        .compact()
        .expect_err("compaction reads the damaged segment");
    assert!(
        matches!(e, idemkv::Error::Corruption { offset, .. } if offset == last),
        "compaction over zeros at the end of a sealed segment: {e:?}"
    );
    let files_after = segment_files(dir.path());
    assert!(
        files_before.iter().all(|f| files_after.contains(f)),
        "no segment replaced: {files_before:?} then {files_after:?}"
    );
}

/// Compaction drops what has expired at the log's time and nothing short of
/// it: a tombstone 1.5 h into its 2 h TTL still makes an older put stale,
/// and a seen id half a second short of its TTL still makes a redelivered
/// delta a duplicate. (Purging a second early, or tombstones at half their
/// TTL, passed every other test.)
#[test]
fn compaction_keeps_what_is_short_of_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store
        .apply_batch(&Batch::new("T1").put("p1", "k", 5, "v"))
        .unwrap();
    store
        .apply_batch(&Batch::new("T2").delete("d1", "k", 10))
        .unwrap();
    clock.advance(HOUR / 2);
    store
        .apply_batch(&Batch::new("T3").add("a1", "c", 1, 5))
        .unwrap();
    // The tombstone is 1.5 h old (TTL 2 h), the delta's id 1 h less 0.5 s.
    clock.advance(HOUR - Duration::from_millis(500));
    store
        .apply_batch(&Batch::new("T4").put("x", "other", 1, "v"))
        .unwrap();
    let report = store.compact().unwrap();
    // The ids of T1 and T2, 1.5 h old, have expired; nothing else has.
    assert_eq!(
        (report.tombstones_dropped, report.seen_ids_dropped),
        (0, 2),
        "{report:?}"
    );
    let late = store
        .apply_batch(
            &Batch::new("T5")
                .put("p0", "k", 7, "old")
                .add("a1", "c", 1, 5),
        )
        .unwrap();
    assert_eq!((late.stale, late.duplicates), (1, 1), "{late:?}");
    assert_eq!(store.get("k").unwrap(), None);
    assert_eq!(&store.get("c").unwrap().unwrap().value[..], b"5");
}

/// What a snapshot or a base segment keeps of expiry comes back exactly on
/// open: a tombstone keeps its time (written as 0, it expired at once and
/// an older put brought the row back), and a counter's add floor keeps its
/// seq (written as none, a late redelivered delta applied again).
#[test]
fn expiry_state_comes_back_from_a_snapshot_or_a_base_exactly() {
    for compacted in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0_MS);
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        store
            .apply_batch(&Batch::new("S1").add("a10", "c", 10, 5))
            .unwrap();
        clock.advance(2 * HOUR);
        // A new window: the first one's seq (10) becomes the floor.
        store
            .apply_batch(
                &Batch::new("S2")
                    .add("a20", "c", 20, 1)
                    .put("p1", "k", 5, "v"),
            )
            .unwrap();
        store
            .apply_batch(&Batch::new("S3").delete("d1", "k", 10))
            .unwrap();
        if compacted {
            store.compact().unwrap();
        } else {
            store.snapshot().unwrap();
        }
        store.close().unwrap();
        clock.advance(Duration::from_secs(60));
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        let late = store
            .apply_batch(
                &Batch::new("S4")
                    .put("p0", "k", 7, "old")
                    .add("a10", "c", 10, 5),
            )
            .unwrap();
        let what = if compacted { "base" } else { "snapshot" };
        assert_eq!((late.stale, late.rejected), (1, 1), "{what}: {late:?}");
        assert_eq!(store.get("k").unwrap(), None, "{what}");
        assert_eq!(&store.get("c").unwrap().unwrap().value[..], b"6", "{what}");
    }
}

/// A state file holds what the log may: a checkpoint position up to 64 KiB
/// and a quarantined event id past the 4 KiB an event id may have (it was
/// refused for that length). Both come back from a base and from a snapshot.
#[test]
fn the_longest_checkpoint_position_and_an_over_long_quarantined_id_outlive_a_state_file() {
    for compacted in [false, true] {
        let what = if compacted { "base" } else { "snapshot" };
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0_MS);
        let options = || options(&clock).on_conflict(OnConflict::Quarantine);
        let store = Store::open(dir.path(), options()).unwrap();
        let long_id = "i".repeat(5_000);
        let report = store
            .apply_batch(
                &Batch::new("B1")
                    .put("e1", "k", 1, "v")
                    .put(long_id.as_str(), "k2", 1, "v")
                    .checkpoint("src", vec![7u8; 65_536]),
            )
            .unwrap();
        assert_eq!((report.inserted, report.rejected), (1, 1), "{what}");
        let quarantine = store.quarantine();
        assert_eq!(&quarantine[0].event_id[..], long_id.as_bytes(), "{what}");
        let before = observe(&store);
        if compacted {
            store.compact().unwrap();
        } else {
            store.snapshot().unwrap();
        }
        store.close().unwrap();

        let store = Store::open(dir.path(), options()).unwrap();
        // A base is the log, which open must load; a snapshot it could
        // replay around, so it must have been used.
        let stats = store.stats();
        assert!(compacted || stats.opened_from_snapshot, "{stats:?}");
        assert_eq!(observe(&store), before, "{what}");
        assert_eq!(store.quarantine(), quarantine, "{what}");
    }
}

/// Values may be larger than the 1 MiB at which a state record is closed
/// (up to `value_bytes_max`): a base holds each inline, one record apiece
/// here, and gives them back whole.
#[test]
fn values_larger_than_a_state_record_come_back_from_a_base() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let options = || options(&clock).value_bytes_max(4 << 20);
    let store = Store::open(dir.path(), options()).unwrap();
    let value = |i: u8| vec![i; 3 << 19];
    store
        .apply_batch(
            &Batch::new("B1")
                .put("e1", "k1", 1, value(1))
                .put("e2", "k2", 1, value(2)),
        )
        .unwrap();
    store.compact().unwrap();
    store.close().unwrap();

    let store = Store::open(dir.path(), options()).unwrap();
    for (key, i) in [("k1", 1), ("k2", 2)] {
        let got = store.get(key).unwrap().expect("live");
        assert!(got.value[..] == value(i)[..], "{key}");
    }
}

/// Batch ids expire oldest first (`batch_ttl`), and a state file keeps
/// them in commit order so that they still do once it is loaded: after a
/// reopen from a snapshot or a base, a compaction drops the batch ids past
/// their ttl, though newer ones are not.
#[test]
fn batch_ids_loaded_from_a_state_file_still_expire_oldest_first() {
    for compacted in [false, true] {
        let what = if compacted { "base" } else { "snapshot" };
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0_MS);
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        for i in 0..20 {
            store.apply_batch(&batch(i)).unwrap();
        }
        clock.advance(HOUR / 2);
        for i in 20..40 {
            store.apply_batch(&batch(i)).unwrap();
        }
        // Nothing has expired yet: the state file holds all 40.
        if compacted {
            assert_eq!(store.compact().unwrap().batch_ids_dropped, 0);
        } else {
            store.snapshot().unwrap();
        }
        store.close().unwrap();

        // The first 20 are past the batch ttl (an hour) on the log's clock,
        // which a new batch moves on; the rest are not.
        clock.advance(HOUR * 3 / 4);
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        store.apply_batch(&batch(40)).unwrap();
        let report = store.compact().unwrap();
        assert_eq!(report.batch_ids_dropped, 20, "{what}: {report:?}");
        assert_eq!(store.stats().batches, 21, "{what}");
    }
}

/// Compaction moves every live value into its base, and the index keeps
/// what it knew of each (its fingerprint, which decides whether a `Put` of
/// the same length and CRC is `unchanged`) with the right key: after the
/// move, each key's own bytes again are `unchanged`, and other bytes of the
/// same length and CRC `updated`.
#[test]
fn after_a_compaction_each_key_s_own_bytes_again_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let value = |k: u64| format!("value of key {k:04}, padded to 40 bytes").into_bytes();
    let mut first = Batch::new("first");
    for k in 0..200 {
        first = first.put(format!("f{k}"), format!("k{k:04}"), 1, value(k));
    }
    store.apply_batch(&first).unwrap();
    for i in 0..100 {
        store.apply_batch(&batch(i)).unwrap();
    }
    store.compact().unwrap();
    let mut again = Batch::new("again");
    for k in 0..200 {
        again = again.put(format!("g{k}"), format!("k{k:04}"), 2, value(k));
    }
    let report = store.apply_batch(&again).unwrap();
    assert_eq!((report.unchanged, report.updated), (200, 0), "{report:?}");
    let other = |k: u64| common::same_crc_other_bytes(&value(k));
    let mut others = Batch::new("others");
    for k in 0..200 {
        others = others.put(format!("w{k}"), format!("k{k:04}"), 3, other(k));
    }
    let report = store.apply_batch(&others).unwrap();
    assert_eq!((report.unchanged, report.updated), (0, 200), "{report:?}");
    for k in 0..200 {
        let row = store.get(format!("k{k:04}")).unwrap().expect("live");
        assert_eq!(row.value[..], other(k)[..]);
    }
}
