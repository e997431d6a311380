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

    // Still true after reopen and after compaction: the decision is replayed, not recomputed.
    drop(store);
    let store = Store::open(dir.path(), options(&clock)).unwrap();
    store.compact().unwrap();
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

#[test]
fn replay_after_reopen_decides_exactly_what_the_live_store_decided() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0_MS);
    let mut reports = Vec::new();
    {
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        for i in 0..40u64 {
            let b = Batch::new(format!("B{i}"))
                .put(
                    format!("e{}", i % 7),
                    format!("k{}", i % 5),
                    i % 9,
                    format!("v{i}"),
                )
                .add(format!("a{}", i % 6), "c", i % 11, 1)
                .delete(format!("d{}", i % 4), format!("k{}", (i + 2) % 5), i % 8);
            reports.push(store.apply_batch(&b).unwrap());
            clock.advance(HOUR / 4);
        }
        let live = store.digest().unwrap();
        drop(store);
        let store = Store::open(dir.path(), options(&clock)).unwrap();
        assert_eq!(store.digest().unwrap(), live);
        let logged: Vec<BatchReport> = store.log().iter().map(|e| e.report).collect();
        assert_eq!(logged, reports);
    }
}
