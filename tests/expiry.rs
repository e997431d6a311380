//! Expiry (SPEC section 3, "Expiry never re-applies"): seen ids, batch ids
//! and tombstones stop counting after their TTL on an injectable clock, and
//! no expiry ever makes an effect apply twice.

use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, BatchReport, ManualClock, OnConflict, Options, Store};

const HOUR: Duration = Duration::from_secs(3600);
const T0_MS: u64 = 1_700_000_000_000;

fn options(clock: &ManualClock) -> Options {
    Options::default()
        .durability(idemkv::Durability::Buffered)
        .clock(Arc::new(clock.clone()))
        .seen_ttl(Some(HOUR))
        .batch_ttl(Some(HOUR))
}

fn counter(store: &Store, key: &str) -> i64 {
    let record = store.get(key).unwrap().expect("counter exists");
    std::str::from_utf8(&record.value).unwrap().parse().unwrap()
}

#[test]
fn an_expired_seen_id_makes_a_late_redelivery_stale_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store
        .apply_batch(&Batch::new("B1").put("e1", "k", 5, "v1"))
        .unwrap();
    store
        .apply_batch(&Batch::new("B2").put("e1", "k", 5, "v1"))
        .map(|r| assert_eq!(r.duplicates, 1))
        .unwrap();

    clock.advance(HOUR);
    let late = store
        .apply_batch(&Batch::new("B3").put("e1", "k", 5, "v1"))
        .unwrap();
    assert_eq!(
        (late.duplicates, late.stale),
        (0, 1),
        "counted stale once its id expired"
    );
    assert_eq!(store.get("k").unwrap().unwrap().seq, 5);
    // The late delivery was recorded as seen again: its next redelivery is a duplicate.
    let again = store
        .apply_batch(&Batch::new("B4").put("e1", "k", 5, "v1"))
        .unwrap();
    assert_eq!(again.duplicates, 1);
}

#[test]
fn a_late_delta_whose_id_expired_is_too_late_never_applied_twice() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store
        .apply_batch(&Batch::new("B1").add("a10", "visits", 10, 5))
        .unwrap();
    clock.advance(HOUR / 2);
    store
        .apply_batch(&Batch::new("B2").add("a12", "visits", 12, 1))
        .unwrap();
    assert_eq!(counter(&store, "visits"), 6);

    // Within the TTL a redelivery is a plain duplicate.
    let dup = store
        .apply_batch(&Batch::new("B3").add("a10", "visits", 10, 5))
        .unwrap();
    assert_eq!(dup.duplicates, 1);

    clock.advance(HOUR);
    let late = store
        .apply_batch(
            &Batch::new("B4")
                .add("a10", "visits", 10, 5)
                .add("a11", "visits", 11, 7)
                .add("a20", "visits", 20, 2),
        )
        .unwrap();
    assert_eq!(
        late,
        BatchReport {
            rejected: 2,
            added: 1,
            ..BatchReport::default()
        }
    );
    assert_eq!(
        counter(&store, "visits"),
        8,
        "only the provably new delta applied"
    );
    let reasons: Vec<_> = store
        .quarantine()
        .into_iter()
        .map(|q| (q.event_id, q.reason))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("a10".into(), "too_late".to_owned()),
            ("a11".into(), "too_late".to_owned())
        ]
    );

    // Still true after reopen and after compaction, whose base the next
    // open loads the marks from: the decision is replayed, not recomputed.
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store.compact().unwrap();
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let again = store
        .apply_batch(&Batch::new("B5").add("a10", "visits", 10, 5))
        .unwrap();
    assert_eq!(again.rejected, 1);
    assert_eq!(counter(&store, "visits"), 8);
}

#[test]
fn too_late_is_quarantined_even_when_the_policy_is_fail() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock).on_conflict(OnConflict::Fail)).unwrap();
    store
        .apply_batch(&Batch::new("B1").add("a1", "c", 1, 1))
        .unwrap();
    clock.advance(2 * HOUR);
    let late = store
        .apply_batch(&Batch::new("B2").add("a1", "c", 1, 1).checkpoint("src", "2"))
        .unwrap();
    assert_eq!(late.rejected, 1);
    assert_eq!(
        store.checkpoint("src").unwrap().as_deref(),
        Some(&b"2"[..]),
        "the batch committed"
    );
}

#[test]
fn an_expired_batch_id_is_planned_afresh_and_conflicts_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock).seen_ttl(None)).unwrap();
    let b1 = Batch::new("B1")
        .put("e1", "k", 1, "v")
        .checkpoint("src", "1");
    store.apply_batch(&b1).unwrap();
    assert!(store.apply_batch(&b1).unwrap().replayed);

    clock.advance(HOUR);
    let again = store.apply_batch(&b1).unwrap();
    assert!(!again.replayed, "its batch id expired");
    assert_eq!(again.duplicates, 1, "its events are still seen");
    let other = Batch::new("B1").put("e2", "k", 2, "w");
    assert!(
        matches!(
            store.apply_batch(&other),
            Err(idemkv::Error::BatchConflict { .. })
        ),
        "the re-committed id counts again for an hour"
    );
    clock.advance(HOUR);
    assert_eq!(
        store.apply_batch(&other).unwrap().updated,
        1,
        "other content, once the id expired"
    );
    assert_eq!(store.get("k").unwrap().unwrap().seq, 2);
}

#[test]
fn tombstones_never_expire_by_default_and_resurrect_when_they_do() {
    for (ttl, resurrected) in [(None, false), (Some(HOUR), true)] {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(T0_MS);
        let store = Store::open(dir.path(), options(&clock).tombstone_ttl(ttl)).unwrap();
        store
            .apply_batch(
                &Batch::new("B1")
                    .put("p5", "k", 5, "old")
                    .delete("d9", "k", 9),
            )
            .unwrap();
        clock.advance(2 * HOUR);
        let r = store
            .apply_batch(&Batch::new("B2").put("p7", "k", 7, "older than the delete"))
            .unwrap();
        assert_eq!(r.inserted == 1, resurrected, "tombstone ttl {ttl:?}: {r:?}");
        assert_eq!(store.get("k").unwrap().is_some(), resurrected);
    }
}

/// A tombstone holds older puts back for its whole TTL, to the millisecond
/// (its second is rounded up, never down), and then no longer.
#[test]
fn a_tombstone_holds_older_puts_back_until_its_ttl_and_no_longer() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS + 500);
    let store = Store::open(dir.path(), options(&clock).tombstone_ttl(Some(HOUR))).unwrap();
    store
        .apply_batch(
            &Batch::new("B1")
                .put("p5", "k", 5, "old")
                .delete("d9", "k", 9),
        )
        .unwrap();
    clock.advance(HOUR - Duration::from_millis(1));
    let r = store
        .apply_batch(&Batch::new("B2").put("p7", "k", 7, "older"))
        .unwrap();
    assert_eq!((r.stale, r.inserted), (1, 0), "{r:?}");
    assert!(store.get("k").unwrap().is_none());
    clock.advance(Duration::from_secs(1));
    let r = store
        .apply_batch(&Batch::new("B3").put("p8", "k", 8, "older"))
        .unwrap();
    assert_eq!(r.inserted, 1, "{r:?}");
}

/// A seen id counts for its whole TTL, to the millisecond: a delta
/// redelivered 1 ms before it ends is a duplicate, not applied again.
#[test]
fn a_delta_redelivered_a_millisecond_before_its_ids_ttl_is_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS + 999);
    let ttl = Duration::from_secs(10);
    let store = Store::open(dir.path(), options(&clock).seen_ttl(Some(ttl))).unwrap();
    let b = |id: &str| Batch::new(id).add("a1", "c", 10, 5).put("p1", "k", 1, "v");
    store.apply_batch(&b("B1")).unwrap();
    clock.advance(ttl - Duration::from_millis(1));
    let r = store.apply_batch(&b("B2")).unwrap();
    assert_eq!(
        r,
        BatchReport {
            duplicates: 2,
            ..BatchReport::default()
        }
    );
    assert_eq!(counter(&store, "c"), 5);
}

/// Two deltas of one key in one batch, the higher seq first: the key's
/// floor is the higher seq, so once both ids expired the first delta is too
/// late, not applied again.
#[test]
fn a_batchs_largest_add_seq_bounds_the_floor_whatever_the_order_of_its_adds() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    let r = store
        .apply_batch(
            &Batch::new("B1")
                .add("a20", "c", 20, 5)
                .add("a10", "c", 10, 1),
        )
        .unwrap();
    assert_eq!(r.added, 2);
    clock.advance(HOUR);
    let late = store
        .apply_batch(&Batch::new("B2").add("a20", "c", 20, 5))
        .unwrap();
    assert_eq!((late.added, late.rejected), (0, 1), "{late:?}");
    let record = store.get("c").unwrap().unwrap();
    assert_eq!((record.seq, counter(&store, "c")), (20, 6));
}

#[test]
fn a_clock_that_goes_back_does_not_unexpire_anything() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store
        .apply_batch(&Batch::new("B1").put("e1", "k", 1, "v"))
        .unwrap();
    clock.advance(2 * HOUR);
    store
        .apply_batch(&Batch::new("B2").put("e2", "x", 1, "v"))
        .unwrap();
    clock.set_ms(T0_MS);
    // The log's clock stays at T0 + 2h: e1 is still expired.
    let r = store
        .apply_batch(&Batch::new("B3").put("e1", "k", 1, "v"))
        .unwrap();
    assert_eq!((r.stale, r.duplicates), (1, 0));
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    assert_eq!(
        store.log().last().unwrap().committed_ms,
        T0_MS + 2 * 3_600_000
    );
}

/// The counts and the digest after a reopen are copied from the log, so
/// they alone would pass a reopen that lost every seen id or stamped its
/// tombstones wrong: the reopened store must also go on to decide the next
/// batches as a twin that was never closed decides them.
#[test]
fn replay_after_reopen_decides_exactly_what_the_live_store_decided() {
    let (dir, twin_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clock = ManualClock::new(T0_MS);
    let opts = || {
        options(&clock)
            .tombstone_ttl(Some(2 * HOUR))
            .on_conflict(OnConflict::Quarantine)
    };
    let batch = |id: String, i: u64| {
        Batch::new(id)
            .put(
                format!("e{}", i % 7),
                format!("k{}", i % 5),
                i % 9,
                format!("v{i}"),
            )
            .add(format!("a{}", i % 6), "c", i % 11, 1)
            .delete(format!("d{}", i % 4), format!("k{}", (i + 2) % 5), i % 8)
    };
    let store = Store::open(dir.path(), opts()).unwrap();
    let twin = Store::open(twin_dir.path(), opts()).unwrap();
    let mut reports = Vec::new();
    for i in 0..40u64 {
        let b = batch(format!("B{i}"), i);
        let report = store.apply_batch(&b).unwrap();
        assert_eq!(twin.apply_batch(&b).unwrap(), report);
        reports.push(report);
        clock.advance(HOUR / 4);
    }
    let live = store.digest().unwrap();
    drop(store);
    let store = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(store.digest().unwrap(), live);
    let logged: Vec<BatchReport> = store.log().iter().map(|e| e.report).collect();
    assert_eq!(logged, reports);
    for i in 0..40u64 {
        // Redeliveries of the first stretch's events, some expired by now,
        // under new batch ids.
        let b = batch(format!("R{i}"), i + 17);
        assert_eq!(
            store.apply_batch(&b).unwrap(),
            twin.apply_batch(&b).unwrap(),
            "batch R{i}"
        );
        clock.advance(HOUR / 8);
    }
    assert_eq!(store.digest().unwrap(), twin.digest().unwrap());
    assert_eq!(store.quarantine(), twin.quarantine());
}

/// A store under `Sync` on a fault-injection disk, ids seen for 1 s, on a
/// manual clock; no zero filling, so that the sync a test holds is a
/// commit sync.
#[cfg(feature = "testing")]
fn sync_store_with_a_one_second_seen_ttl() -> (idemkv::storage::FaultyStorage, ManualClock, Store) {
    let storage = idemkv::storage::FaultyStorage::new();
    let clock = ManualClock::new(T0_MS);
    let options = Options::default()
        .storage(Arc::new(storage.clone()))
        .clock(Arc::new(clock.clone()))
        .durability(idemkv::Durability::Sync)
        .seen_ttl(Some(Duration::from_secs(1)))
        .zero_fill(false);
    let store = Store::open("/db", options).unwrap();
    (storage, clock, store)
}

/// Under `Sync`, an id that a batch still waiting for its sync recorded,
/// that expired, and that a large batch (whose seen ids may go into the
/// index before its sync) recorded again, is a duplicate when it comes a
/// third time: the planner finds its newest record, not the expired one.
#[cfg(feature = "testing")]
#[test]
fn an_id_recorded_again_while_an_older_record_of_it_waits_for_its_sync_is_a_duplicate() {
    use idemkv::storage::OpKind;

    let (storage, clock, store) = sync_store_with_a_one_second_seen_ttl();
    let first = Batch::new("B1").put("x", "kx", 1, "v");
    let mut large = Batch::new("B2").put("x", "kx", 1, "v");
    for j in 0..300 {
        large = large.put(format!("l{j}"), format!("large{j}"), 1, "y".repeat(120));
    }
    let third = Batch::new("B3").put("x", "kx", 1, "v");
    let timeout = Duration::from_secs(20);
    let writes = |at_least: u64| {
        let deadline = std::time::Instant::now() + timeout;
        while storage.op_count_of(OpKind::Write) < at_least as usize {
            assert!(std::time::Instant::now() < deadline, "the writes happen");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let reports = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let a = scope.spawn(|| store.apply_batch(&first));
        storage
            .wait_until_paused(timeout)
            .expect("B1's sync starts");
        let written = storage.op_count_of(OpKind::Write) as u64;
        // B1 waits for its sync; its record of "x" expires.
        clock.advance(Duration::from_secs(2));
        let b = scope.spawn(|| store.apply_batch(&large));
        writes(written + 1);
        let c = scope.spawn(|| store.apply_batch(&third));
        writes(written + 2);
        storage.resume();
        [a, b, c].map(|h| h.join().unwrap().unwrap())
    });
    assert_eq!(reports[0].inserted, 1, "{:?}", reports[0]);
    assert_eq!(
        reports[1].duplicates, 0,
        "expired, so not a duplicate: {:?}",
        reports[1]
    );
    assert_eq!(
        reports[2].duplicates, 1,
        "B2 recorded it again: {:?}",
        reports[2]
    );
}

/// Ids stamped with their second rounded up must not leave memory before
/// they expire: a batch large enough to merge the recent seen ids, committed
/// a millisecond after a delta, dropped the delta's id as if the clock stood
/// at the next whole second, and a redelivery a millisecond later applied
/// the delta again (and counted a put's redelivery stale, not a duplicate).
#[test]
fn ids_outlive_a_merge_started_in_the_second_they_expire_in() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let options = options(&clock).seen_ttl(Some(Duration::from_secs(1)));
    let store = Store::open(dir.path(), options).unwrap();
    let first = Batch::new("B1")
        .add("a1", "c", 10, 5)
        .put("p1", "k", 1, "v");
    store.apply_batch(&first).unwrap();
    clock.advance(Duration::from_millis(1));
    let mut many = Batch::new("B2");
    for i in 0..5000 {
        many = many.put(format!("m{i}"), format!("m{i}"), 1, "v");
    }
    assert_eq!(store.apply_batch(&many).unwrap().inserted, 5000);
    clock.advance(Duration::from_millis(1));
    let again = Batch::new("B3")
        .add("a1", "c", 10, 5)
        .put("p1", "k", 1, "v");
    let report = store.apply_batch(&again).unwrap();
    assert_eq!((report.duplicates, report.added), (2, 0), "{report:?}");
    assert_eq!(counter(&store, "c"), 5);
}

/// How a store leaves expired seen ids out of the state its next open loads.
#[derive(Debug, Clone, Copy)]
enum DropIds {
    /// `compact()` purges them from the base segment.
    Compaction,
    /// A merge of the seen index drops them from memory, and a snapshot
    /// written afterwards leaves them out.
    MergeThenSnapshot,
}

/// A delta applied under a short `seen_ttl` whose id was then dropped,
/// redelivered after an open with a longer `seen_ttl`, or none: the id is
/// gone, and the new TTL alone would still count it, so the add floor must
/// cover it whatever the TTL is now.
#[test]
fn a_longer_seen_ttl_after_expired_ids_were_dropped_applies_no_delta_twice() {
    let short = Some(Duration::from_secs(10));
    for drop_ids in [DropIds::Compaction, DropIds::MergeThenSnapshot] {
        for next_ttl in [Some(Duration::from_secs(100)), None] {
            let dir = tempfile::tempdir().unwrap();
            let clock = ManualClock::new(T0_MS);
            let store = Store::open(dir.path(), options(&clock).seen_ttl(short)).unwrap();
            store
                .apply_batch(&Batch::new("B1").add("a1", "ctr", 1, 5))
                .unwrap();
            clock.advance(Duration::from_secs(20));
            match drop_ids {
                DropIds::Compaction => {
                    store
                        .apply_batch(&Batch::new("B2").put("p", "k", 1, "v"))
                        .unwrap();
                    let report = store.compact().unwrap();
                    assert_eq!(report.seen_ids_dropped, 1, "{report:?}");
                }
                DropIds::MergeThenSnapshot => {
                    // Enough new ids to start a merge, which drops a1.
                    let mut many = Batch::new("B2");
                    for i in 0..5000 {
                        many = many.put(format!("m{i}"), format!("m{i}"), 1, "v");
                    }
                    store.apply_batch(&many).unwrap();
                    store.snapshot().unwrap();
                }
            }
            store.close().unwrap();

            let store = Store::open(dir.path(), options(&clock).seen_ttl(next_ttl)).unwrap();
            clock.advance(Duration::from_secs(1));
            let again = store
                .apply_batch(&Batch::new("B3").add("a1", "ctr", 1, 5))
                .unwrap();
            let case = format!("{drop_ids:?}, then seen_ttl {next_ttl:?}: {again:?}");
            assert_eq!(again.added, 0, "{case}");
            assert_eq!(counter(&store, "ctr"), 5, "{case}");
            // A delta with a seq above every one applied is still new.
            let next = store
                .apply_batch(&Batch::new("B4").add("a2", "ctr", 2, 1))
                .unwrap();
            assert_eq!(next.added, 1, "{case}");
            assert_eq!(counter(&store, "ctr"), 6, "{case}");
        }
    }
}

/// Applies `B0` (an `Add` of 1 to `ctr`, seq 1), waits `before`, then
/// `first` and, `while_pending` later, `second`, while `first` still waits
/// for its commit sync; returns both reports and the counter.
#[cfg(feature = "testing")]
fn add_while_pending(
    before: Duration,
    first: &Batch,
    while_pending: Duration,
    second: &Batch,
) -> ([BatchReport; 2], i64) {
    use idemkv::storage::OpKind;

    let (storage, clock, store) = sync_store_with_a_one_second_seen_ttl();
    store
        .apply_batch(&Batch::new("B0").add("e0", "ctr", 1, 1))
        .unwrap();
    clock.advance(before);
    let timeout = Duration::from_secs(20);
    let writes = || storage.op_count_of(OpKind::Write);
    let reports = std::thread::scope(|scope| {
        storage.pause_next(OpKind::SyncData);
        let a = scope.spawn(|| store.apply_batch(first));
        storage
            .wait_until_paused(timeout)
            .expect("the first batch's sync starts");
        let written = writes();
        clock.advance(while_pending);
        let b = scope.spawn(|| store.apply_batch(second));
        let deadline = std::time::Instant::now() + timeout;
        while writes() == written {
            assert!(
                std::time::Instant::now() < deadline,
                "the second is written"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        storage.resume();
        [a, b].map(|h| h.join().unwrap().unwrap())
    });
    (reports, counter(&store, "ctr"))
}

/// A delta redelivered while its first delivery still waits for its commit
/// sync, after its id expired (the sync outlasted `seen_ttl`), is
/// `too_late`: the planner's floor counts the pending batch's `Add`.
#[cfg(feature = "testing")]
#[test]
fn a_delta_whose_id_expires_while_its_batch_waits_for_its_sync_is_not_applied_again() {
    let delta = Batch::new("B1").add("ea", "ctr", 2, 10);
    let again = Batch::new("B2").add("ea", "ctr", 2, 10);
    let (reports, value) =
        add_while_pending(Duration::ZERO, &delta, Duration::from_secs(3), &again);
    assert_eq!(reports[0].added, 1, "{:?}", reports[0]);
    assert_eq!(
        (reports[1].added, reports[1].rejected),
        (0, 1),
        "too late, never applied twice: {:?}",
        reports[1]
    );
    assert_eq!(value, 11);
}

/// While an `Add` waits for its sync, the floor a later batch is planned
/// against is the one it would meet once that `Add` is published: here the
/// published window (opened by B0 at 0 s) takes B1's `Add` at 0.6 s and has
/// expired at 1.2 s, so a new delta at or below B1's seq is `too_late`.
#[cfg(feature = "testing")]
#[test]
fn a_pending_delta_counts_in_the_published_window_it_joins() {
    let delta = Batch::new("B1").add("ea", "ctr", 2, 10);
    let low = Batch::new("B2").add("eb", "ctr", 2, 100);
    let (reports, value) = add_while_pending(
        Duration::from_millis(600),
        &delta,
        Duration::from_millis(600),
        &low,
    );
    assert_eq!(reports[0].added, 1, "{:?}", reports[0]);
    assert_eq!(
        (reports[1].added, reports[1].rejected),
        (0, 1),
        "at or below the floor of a window that opened 1.2 s ago: {:?}",
        reports[1]
    );
    assert_eq!(value, 11);
}

/// Two `Add`s on one key waiting for their syncs: the second one's window
/// carries on from the mark the first left in the pending effects, not from
/// the published one. B0 opens the published window at 0 s; B1's `Add` (seq
/// 10, at 1.2 s) finds it expired and opens a window; B2's (seq 20, at
/// 2.5 s) finds that one expired too, so seq 10 is in the floor. At 3.2 s
/// B1's id (stamped 2 s) has expired, and its redelivery must be `too_late`:
/// had B2 started from the published mark, its window would have opened at
/// 2.5 s over a floor of 1, and the delta would apply twice.
#[cfg(feature = "testing")]
#[test]
fn a_delta_redelivered_while_two_adds_on_its_key_wait_for_their_syncs_is_not_applied_again() {
    use idemkv::storage::OpKind;

    let (storage, clock, store) = sync_store_with_a_one_second_seen_ttl();
    store
        .apply_batch(&Batch::new("B0").add("e0", "ctr", 1, 1))
        .unwrap();
    let first = Batch::new("B1").add("ea", "ctr", 10, 10);
    let second = Batch::new("B2").add("eb", "ctr", 20, 100);
    let again = Batch::new("B3").add("ea", "ctr", 10, 10);
    let timeout = Duration::from_secs(20);
    let writes = |at_least: usize| {
        let deadline = std::time::Instant::now() + timeout;
        while storage.op_count_of(OpKind::Write) < at_least {
            assert!(std::time::Instant::now() < deadline, "the writes happen");
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let reports = std::thread::scope(|scope| {
        clock.advance(Duration::from_millis(1_200));
        storage.pause_next(OpKind::SyncData);
        let a = scope.spawn(|| store.apply_batch(&first));
        storage
            .wait_until_paused(timeout)
            .expect("B1's sync starts");
        let written = storage.op_count_of(OpKind::Write);
        clock.advance(Duration::from_millis(1_300));
        let b = scope.spawn(|| store.apply_batch(&second));
        writes(written + 1);
        clock.advance(Duration::from_millis(700));
        let c = scope.spawn(|| store.apply_batch(&again));
        writes(written + 2);
        storage.resume();
        [a, b, c].map(|h| h.join().unwrap().unwrap())
    });
    assert_eq!((reports[0].added, reports[1].added), (1, 1), "{reports:?}");
    assert_eq!(
        (reports[2].added, reports[2].rejected),
        (0, 1),
        "its id expired and its seq is below the floor: {:?}",
        reports[2]
    );
    assert_eq!(counter(&store, "ctr"), 111);
}

/// Compaction lets go of batch ids expired at the log's time: the same id
/// sent again is planned afresh and registered anew, as if never seen, and
/// is a replay from then on. (The dropped id is longer than the one left,
/// so that any of its bytes counted twice would show.)
#[test]
fn a_batch_id_dropped_by_compaction_commits_afresh_and_replays_after() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let store = Store::open(dir.path(), options(&clock).seen_ttl(None)).unwrap();
    let old = Batch::new("B-expires-first").put("e1", "k", 1, "v");
    store.apply_batch(&old).unwrap();
    clock.advance(HOUR);
    store
        .apply_batch(&Batch::new("B2").put("e2", "k2", 1, "v"))
        .unwrap();

    assert_eq!(store.compact().unwrap().batch_ids_dropped, 1);
    assert_eq!(store.stats().batches, 1);
    let again = store.apply_batch(&old).unwrap();
    assert!(!again.replayed, "its batch id was dropped");
    assert_eq!(again.duplicates, 1, "its events are still seen");
    assert!(store.apply_batch(&old).unwrap().replayed);
    assert_eq!(store.stats().batches, 2);
}
