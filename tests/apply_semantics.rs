//! Contract area: what `apply_batch` does with each delivery (SPEC sections 2 and 3).
//!
//! The first test is the story: redeliveries inside and across batches, batch
//! replays and batch id reuse, conflicting and invalid events under both
//! policies, deletes and tombstones, unchanged puts, deltas, and a reopen that
//! must keep every one of those facts. The smaller tests pin single rules.

mod common;

use std::path::Path;

use bytes::Bytes;
use idemkv::{
    Batch, BatchReport, Digest, Error, OnConflict, Options, QuarantineEntry, Record, Store,
};

const VALUE_BYTES_MAX: usize = 1024;

fn options() -> Options {
    Options::default().value_bytes_max(VALUE_BYTES_MAX)
}

fn open(dir: &Path, options: Options) -> Store {
    Store::open(dir, options).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

/// Applies `batch`; a committed batch's eight counts must add up to its deliveries.
fn apply(store: &Store, batch: &Batch) -> Result<BatchReport, Error> {
    let result = store.apply_batch(batch);
    if let Ok(report) = &result {
        assert_eq!(
            report.deliveries(),
            batch.len() as u64,
            "counts of batch {:?} do not add up to its deliveries: {report:?}",
            String::from_utf8_lossy(batch.id())
        );
    }
    result
}

fn commit(store: &Store, batch: &Batch) -> BatchReport {
    let report = apply(store, batch).unwrap_or_else(|e| {
        panic!(
            "batch {:?} failed: {e}",
            String::from_utf8_lossy(batch.id())
        )
    });
    assert!(
        !report.replayed,
        "a first commit is not a replay: {report:?}"
    );
    report
}

fn rows(store: &Store) -> Vec<(Bytes, Record)> {
    store
        .scan_prefix(b"")
        .collect::<Result<Vec<_>, _>>()
        .expect("scan")
}

fn digest(store: &Store) -> Digest {
    store.digest().expect("digest")
}

fn row(store: &Store, key: &str) -> Option<(u64, Vec<u8>)> {
    store
        .get(key.as_bytes())
        .expect("get")
        .map(|r| (r.seq, r.value.to_vec()))
}

fn live(seq: u64, value: &str) -> Option<(u64, Vec<u8>)> {
    Some((seq, value.as_bytes().to_vec()))
}

fn position(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

fn checkpoint(store: &Store, source: &str) -> Option<u64> {
    store.checkpoint(source).expect("checkpoint").map(|p| {
        u64::from_be_bytes(
            p.as_ref()
                .try_into()
                .expect("positions in these tests are 8 bytes"),
        )
    })
}

fn sorted_quarantine(store: &Store) -> Vec<QuarantineEntry> {
    let mut q = store.quarantine();
    q.sort_by(|a, b| (&a.batch_id, a.index).cmp(&(&b.batch_id, b.index)));
    q
}

/// Everything a reopen must keep.
#[derive(Debug, PartialEq)]
struct Facts {
    rows: Vec<(Bytes, Record)>,
    checkpoints: Vec<Option<Bytes>>,
    batches: Vec<Option<BatchReport>>,
    quarantine: Vec<QuarantineEntry>,
    digest: Digest,
}

fn facts(store: &Store, sources: &[&str], batch_ids: &[&str]) -> Facts {
    Facts {
        rows: rows(store),
        checkpoints: sources
            .iter()
            .map(|s| store.checkpoint(s).expect("checkpoint"))
            .collect(),
        batches: batch_ids
            .iter()
            .map(|id| store.batch(id).expect("batch"))
            .collect(),
        quarantine: sorted_quarantine(store),
        digest: digest(store),
    }
}

/// Drops `store`, opens the directory again and checks that nothing changed.
fn reopen(
    store: Store,
    dir: &Path,
    options: Options,
    sources: &[&str],
    batch_ids: &[&str],
) -> Store {
    let before = facts(&store, sources, batch_ids);
    drop(store);
    let store = open(dir, options);
    let after = facts(&store, sources, batch_ids);
    assert_eq!(before, after, "reopen changed the store's state");
    store
}

fn report(f: impl FnOnce(&mut BatchReport)) -> BatchReport {
    let mut r = BatchReport::default();
    f(&mut r);
    r
}

fn assert_conflicting(result: Result<BatchReport, Error>, batch: &str, at: usize, event: &str) {
    match result {
        Err(Error::ConflictingEvent {
            batch_id,
            index,
            event_id,
        }) => {
            assert_eq!(
                (batch_id.as_str(), index, event_id.as_str()),
                (batch, at, event)
            );
        }
        other => panic!("expected ConflictingEvent at {batch}[{at}] ({event}), got {other:?}"),
    }
}

fn assert_invalid(result: Result<BatchReport, Error>, batch: &str, at: usize, event: &str) {
    match result {
        Err(Error::InvalidEvent {
            batch_id,
            index,
            event_id,
            reason,
        }) => {
            assert_eq!(
                (batch_id.as_str(), index, event_id.as_str()),
                (batch, at, event),
                "reason: {reason}"
            );
            assert!(!reason.is_empty(), "an invalid event names its reason");
        }
        other => panic!("expected InvalidEvent at {batch}[{at}] ({event}), got {other:?}"),
    }
}

fn assert_batch_conflict(result: Result<BatchReport, Error>, batch: &str) {
    match result {
        Err(Error::BatchConflict { batch_id }) => assert_eq!(batch_id, batch),
        other => panic!("expected BatchConflict for {batch}, got {other:?}"),
    }
}

/// The first batch of the story: eight deliveries of six events.
fn first_delivery(id: &str) -> Batch {
    Batch::new(id)
        .put("e1", "O1/1", 10, "v1")
        .put("e2", "O1/2", 10, "v2")
        .put("e3", "O1/3", 10, "v3")
        .put("e1", "O1/1", 10, "v1")
        .put("e4", "O1/4", 10, "v4")
        .add("e5", "visits", 10, 5)
        .put("e2", "O1/2", 10, "v2")
        .put("e6", "O1/6", 10, "v6")
        .checkpoint("cdc", position(8))
}

#[test]
fn story_of_redeliveries_conflicts_deletes_deltas_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let store = open(dir, options());
    let sources = ["cdc", "other"];
    let mut committed: Vec<(&str, BatchReport)> = Vec::new();
    let empty_digest = digest(&store);
    assert_eq!(rows(&store), vec![]);
    assert_eq!(checkpoint(&store, "cdc"), None);

    // --- Eight deliveries, six events: two redelivered inside the batch.
    let b1 = first_delivery("B1");
    let r1 = commit(&store, &b1);
    assert_eq!(
        r1,
        report(|r| {
            r.inserted = 5;
            r.added = 1;
            r.duplicates = 2;
        })
    );
    committed.push(("B1", r1));
    assert_eq!(store.batch("B1").unwrap(), Some(r1));
    assert_eq!(row(&store, "O1/1"), live(10, "v1"));
    assert_eq!(row(&store, "O1/2"), live(10, "v2"));
    assert_eq!(row(&store, "O1/6"), live(10, "v6"));
    assert_eq!(row(&store, "visits"), live(10, "5"));
    assert_eq!(row(&store, "O1/5"), None);
    assert_eq!(checkpoint(&store, "cdc"), Some(8));
    let keys: Vec<Bytes> = rows(&store).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["O1/1", "O1/2", "O1/3", "O1/4", "O1/6", "visits"]
            .map(|k| Bytes::from_static(k.as_bytes()))
    );
    let digest_b1 = digest(&store);
    assert_ne!(digest_b1, empty_digest);
    let rows_b1 = rows(&store);

    // --- The whole delivery again under a new batch id: all duplicates.
    let r2 = commit(&store, &first_delivery("B2"));
    assert_eq!(r2, report(|r| r.duplicates = 8));
    committed.push(("B2", r2));
    assert_eq!(digest(&store), digest_b1);
    assert_eq!(rows(&store), rows_b1);

    // --- Move the checkpoint on, then replay B1: stored report, nothing moves.
    let r3 = commit(
        &store,
        &Batch::new("B3")
            .put("e7", "O1/7", 10, "v7")
            .checkpoint("cdc", position(20)),
    );
    assert_eq!(r3, report(|r| r.inserted = 1));
    committed.push(("B3", r3));
    let digest_b3 = digest(&store);
    let rows_b3 = rows(&store);

    let replay = apply(&store, &first_delivery("B1")).expect("replay of B1");
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.counts(), r1.counts());
    assert_eq!(
        checkpoint(&store, "cdc"),
        Some(20),
        "a replay must not move the checkpoint"
    );
    assert_eq!(digest(&store), digest_b3);
    assert_eq!(rows(&store), rows_b3);
    assert_eq!(
        store.batch("B1").unwrap(),
        Some(r1),
        "store.batch reports replayed = false"
    );
    let replay2 = apply(&store, &first_delivery("B2")).expect("replay of B2");
    assert_eq!(
        replay2,
        BatchReport {
            replayed: true,
            ..r2
        }
    );

    // --- Same batch id, other content: other deliveries, or other checkpoints.
    let mut fewer = Batch::new("B1");
    for d in first_delivery("B1").deliveries().iter().take(7) {
        fewer.push_delivery(d.clone());
    }
    fewer.set_checkpoint("cdc", position(8));
    assert_batch_conflict(apply(&store, &fewer), "B1");
    let mut moved = Batch::new("B1");
    for d in first_delivery("B1").deliveries() {
        moved.push_delivery(d.clone());
    }
    moved.set_checkpoint("cdc", position(9));
    assert_batch_conflict(apply(&store, &moved), "B1");
    let mut reordered = Batch::new("B1");
    let mut ds = first_delivery("B1").deliveries().to_vec();
    ds.swap(0, 1);
    for d in ds {
        reordered.push_delivery(d);
    }
    reordered.set_checkpoint("cdc", position(8));
    assert_batch_conflict(apply(&store, &reordered), "B1");
    assert_eq!(digest(&store), digest_b3);
    assert_eq!(checkpoint(&store, "cdc"), Some(20));
    assert_eq!(store.batch("B1").unwrap(), Some(r1));

    // --- A reused event id with another payload fails the whole batch.
    let b4_bad = Batch::new("B4")
        .put("e8", "O1/8", 10, "v8")
        .put("e1", "O1/1", 10, "not v1")
        .checkpoint("cdc", position(30));
    assert_conflicting(apply(&store, &b4_bad), "B4", 1, "e1");
    assert_eq!(
        row(&store, "O1/8"),
        None,
        "nothing of a failed batch is applied"
    );
    assert_eq!(row(&store, "O1/1"), live(10, "v1"));
    assert_eq!(
        checkpoint(&store, "cdc"),
        Some(20),
        "a failed batch does not move the checkpoint"
    );
    assert_eq!(store.batch("B4").unwrap(), None);
    assert_eq!(digest(&store), digest_b3);
    // The failed batch recorded nothing as seen and did not claim its id.
    let r4 = commit(
        &store,
        &Batch::new("B4")
            .put("e8", "O1/8", 10, "v8")
            .checkpoint("cdc", position(30)),
    );
    assert_eq!(
        r4,
        report(|r| r.inserted = 1),
        "e8 must be new: the failed batch recorded nothing"
    );
    committed.push(("B4", r4));
    assert_eq!(checkpoint(&store, "cdc"), Some(30));

    // --- Invalid events block their batch (default policy Fail).
    let digest_b4 = digest(&store);
    let long_key = "k".repeat(4097);
    let long_id = "i".repeat(4097);
    let long_value = vec![b'x'; VALUE_BYTES_MAX + 1];
    let invalid: Vec<(Batch, &str)> = vec![
        (Batch::new("B5").put("e10", "", 10, "x"), "e10"),
        (Batch::new("B5").put("", "O1/10", 10, "x"), ""),
        (
            Batch::new("B5").put("e11", long_key.as_str(), 10, "x"),
            "e11",
        ),
        (
            Batch::new("B5").put(long_id.as_str(), "O1/10", 10, "x"),
            long_id.as_str(),
        ),
        (Batch::new("B5").put("e12", "O1/10", 10, &long_value), "e12"),
        (Batch::new("B5").add("e13", "O1/1", 11, 1), "e13"),
        (
            Batch::new("B5").malformed("e14", "line 7 is not JSON"),
            "e14",
        ),
        // Static checks come before the seen check: a seen id with an empty
        // key is invalid, not a conflict.
        (Batch::new("B5").put("e1", "", 10, "v1"), "e1"),
    ];
    for (bad, event) in invalid {
        let mut batch = Batch::new("B5").put("e9", "O1/9", 10, "v9");
        for d in bad.deliveries() {
            batch.push_delivery(d.clone());
        }
        batch.set_checkpoint("cdc", position(40));
        assert_invalid(apply(&store, &batch), "B5", 1, event);
        assert_eq!(row(&store, "O1/9"), None);
        assert_eq!(checkpoint(&store, "cdc"), Some(30));
        assert_eq!(digest(&store), digest_b4);
        assert_eq!(store.batch("B5").unwrap(), None);
    }
    // An invalid event first in line, before a conflicting one: the first offender is named.
    assert_invalid(
        apply(
            &store,
            &Batch::new("B5")
                .put("e15", "", 1, "x")
                .put("e1", "O1/1", 10, "not v1"),
        ),
        "B5",
        0,
        "e15",
    );
    assert_conflicting(
        apply(
            &store,
            &Batch::new("B5")
                .put("e1", "O1/1", 10, "not v1")
                .put("e15", "", 1, "x"),
        ),
        "B5",
        0,
        "e1",
    );

    // --- Deletes: applied, redelivered, older put after, delete of an absent key.
    let r6 = commit(&store, &Batch::new("B6").delete("e20", "O1/2", 20));
    assert_eq!(r6, report(|r| r.deleted = 1));
    committed.push(("B6", r6));
    assert_eq!(row(&store, "O1/2"), None);
    let r7 = commit(
        &store,
        &Batch::new("B7")
            .delete("e20", "O1/2", 20)
            .put("e21", "O1/2", 15, "older than the delete")
            .put("e22", "O1/2", 20, "same seq as the delete")
            .delete("e23", "O1/99", 5),
    );
    assert_eq!(
        r7,
        report(|r| {
            r.duplicates = 1;
            r.stale = 2;
            r.deleted = 1;
        })
    );
    committed.push(("B7", r7));
    assert_eq!(row(&store, "O1/2"), None);
    assert_eq!(row(&store, "O1/99"), None);
    let r8 = commit(
        &store,
        &Batch::new("B8")
            .put("e24", "O1/99", 4, "older than the tombstone")
            .put("e21", "O1/2", 15, "older than the delete")
            .delete("e25", "O1/3", 5),
    );
    assert_eq!(
        r8,
        report(|r| {
            r.stale = 2;
            r.duplicates = 1;
        }),
        "a stale event's id is seen, so its redelivery is a duplicate"
    );
    committed.push(("B8", r8));
    assert_eq!(
        row(&store, "O1/99"),
        None,
        "a tombstone of an absent key holds older puts back"
    );
    assert_eq!(
        row(&store, "O1/3"),
        live(10, "v3"),
        "an older delete is stale"
    );
    let r9 = commit(&store, &Batch::new("B9").put("e26", "O1/99", 6, "newer"));
    assert_eq!(r9, report(|r| r.inserted = 1));
    committed.push(("B9", r9));
    assert_eq!(row(&store, "O1/99"), live(6, "newer"));

    // --- An unchanged put advances the version, nothing else.
    let before_unchanged = digest(&store);
    let r10 = commit(&store, &Batch::new("B10").put("e27", "O1/4", 11, "v4"));
    assert_eq!(r10, report(|r| r.unchanged = 1));
    committed.push(("B10", r10));
    assert_eq!(row(&store, "O1/4"), live(11, "v4"));
    assert_ne!(
        digest(&store),
        before_unchanged,
        "the digest covers the seq"
    );
    let r11 = commit(
        &store,
        &Batch::new("B11")
            .put("e28", "O1/4", 11, "v4 again at the same seq")
            .put("e29", "O1/4", 12, "v4b"),
    );
    assert_eq!(
        r11,
        report(|r| {
            r.stale = 1;
            r.updated = 1;
        })
    );
    committed.push(("B11", r11));
    assert_eq!(row(&store, "O1/4"), live(12, "v4b"));

    // --- Deltas apply once per event id, whatever their seq.
    let r12 = commit(
        &store,
        &Batch::new("B12")
            .add("e30", "visits", 11, 7)
            .add("e30", "visits", 11, 7),
    );
    assert_eq!(
        r12,
        report(|r| {
            r.added = 1;
            r.duplicates = 1;
        })
    );
    committed.push(("B12", r12));
    assert_eq!(row(&store, "visits"), live(11, "12"));
    let r13 = commit(
        &store,
        &Batch::new("B13")
            .add("e30", "visits", 11, 7)
            .add("e31", "visits", 3, -20),
    );
    assert_eq!(
        r13,
        report(|r| {
            r.duplicates = 1;
            r.added = 1;
        })
    );
    committed.push(("B13", r13));
    assert_eq!(
        row(&store, "visits"),
        live(11, "-8"),
        "seq becomes the max of both"
    );
    // A delta on a deleted key starts from zero and keeps the tombstone's seq if newer.
    let r14 = commit(
        &store,
        &Batch::new("B14")
            .add("e33", "O1/2", 7, 3)
            .delete("e35", "O1/77", 9)
            .checkpoint("other", position(1)),
    );
    assert_eq!(
        r14,
        report(|r| {
            r.added = 1;
            r.deleted = 1;
        })
    );
    committed.push(("B14", r14));
    assert_eq!(row(&store, "O1/2"), live(20, "3"));
    let r15 = commit(&store, &Batch::new("B15").put("e34", "O1/2", 20, "x"));
    assert_eq!(r15, report(|r| r.stale = 1));
    committed.push(("B15", r15));

    // --- Reopen under the Quarantine policy; everything so far must survive.
    let mut ids: Vec<&str> = committed.iter().map(|(id, _)| *id).collect();
    ids.extend(["B5", "Q1", "Q2", "B100"]);
    let quarantine_options = options().on_conflict(OnConflict::Quarantine);
    let store = reopen(store, dir, quarantine_options.clone(), &sources, &ids);
    assert_eq!(store.quarantine(), vec![]);
    for (id, r) in &committed {
        assert_eq!(store.batch(id).unwrap(), Some(*r), "batch {id}");
    }

    let q1 = Batch::new("Q1")
        .put("e40", "O1/40", 1, "q")
        .put("e1", "O1/1", 10, "not v1")
        .put("", "O1/41", 1, "no id")
        .add("e41", "O1/1", 12, 1)
        .put("e42", "O1/42", 1, "q2")
        .checkpoint("cdc", position(50));
    let rq1 = commit(&store, &q1);
    assert_eq!(
        rq1,
        report(|r| {
            r.inserted = 2;
            r.rejected = 3;
        })
    );
    committed.push(("Q1", rq1));
    assert_eq!(
        checkpoint(&store, "cdc"),
        Some(50),
        "the rest of the batch commits"
    );
    assert_eq!(row(&store, "O1/1"), live(10, "v1"));
    assert_eq!(row(&store, "O1/40"), live(1, "q"));
    assert_eq!(row(&store, "O1/41"), None);
    let q = sorted_quarantine(&store);
    assert_eq!(q.len(), 3, "{q:?}");
    assert_eq!(
        (
            &q[0].batch_id[..],
            q[0].index,
            &q[0].event_id[..],
            q[0].reason.as_str()
        ),
        (&b"Q1"[..], 1, &b"e1"[..], "conflicting_event")
    );
    assert_eq!(
        (&q[1].batch_id[..], q[1].index, &q[1].event_id[..]),
        (&b"Q1"[..], 2, &b""[..])
    );
    assert!(q[1].reason.starts_with("invalid: "), "{:?}", q[1].reason);
    assert_eq!(
        (&q[2].batch_id[..], q[2].index, &q[2].event_id[..]),
        (&b"Q1"[..], 3, &b"e41"[..])
    );
    assert!(q[2].reason.starts_with("invalid: "), "{:?}", q[2].reason);

    // Rejected deliveries are not recorded as seen: they are rejected again, not duplicates.
    let rq2 = commit(
        &store,
        &Batch::new("Q2")
            .add("e41", "O1/1", 12, 1)
            .put("e1", "O1/1", 10, "not v1")
            .put("e40", "O1/40", 1, "q"),
    );
    assert_eq!(
        rq2,
        report(|r| {
            r.rejected = 2;
            r.duplicates = 1;
        })
    );
    committed.push(("Q2", rq2));
    assert_eq!(store.quarantine().len(), 5);
    let replay_q1 = apply(&store, &q1).expect("replay of Q1");
    assert_eq!(
        replay_q1,
        BatchReport {
            replayed: true,
            ..rq1
        }
    );
    assert_eq!(
        store.quarantine().len(),
        5,
        "a replay quarantines nothing new"
    );

    // --- Reopen again: rows, seqs, checkpoints, batches, quarantine, digest.
    let final_digest = digest(&store);
    let store = reopen(store, dir, options(), &sources, &ids);
    for (id, r) in &committed {
        assert_eq!(store.batch(id).unwrap(), Some(*r), "batch {id}");
    }
    assert_eq!(store.batch("B5").unwrap(), None);
    assert_eq!(row(&store, "O1/2"), live(20, "3"));
    assert_eq!(row(&store, "O1/4"), live(12, "v4b"));
    assert_eq!(row(&store, "visits"), live(11, "-8"));
    assert_eq!(row(&store, "O1/99"), live(6, "newer"));
    assert_eq!(checkpoint(&store, "cdc"), Some(50));
    assert_eq!(checkpoint(&store, "other"), Some(1));

    // Seen ids, tombstones and batch ids still act after the reopen.
    let r100 = commit(
        &store,
        &Batch::new("B100")
            .put("e36", "O1/77", 8, "older than the tombstone")
            .add("e30", "visits", 11, 7)
            .delete("e20", "O1/2", 20)
            .put("e1", "O1/1", 10, "v1"),
    );
    assert_eq!(
        r100,
        report(|r| {
            r.stale = 1;
            r.duplicates = 3;
        })
    );
    assert_eq!(digest(&store), final_digest);
    let replay = apply(&store, &first_delivery("B1")).expect("replay of B1 after reopen");
    assert_eq!(
        replay,
        BatchReport {
            replayed: true,
            ..r1
        }
    );
    assert_batch_conflict(apply(&store, &moved), "B1");
    assert_conflicting(
        apply(&store, &Batch::new("B101").put("e20", "O1/2", 21, "x")),
        "B101",
        0,
        "e20",
    );
    assert_eq!(digest(&store), final_digest);
}

#[test]
fn every_payload_difference_is_a_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    commit(
        &store,
        &Batch::new("B1")
            .put("p", "k", 5, "v")
            .delete("d", "gone", 5)
            .add("a", "n", 5, 2),
    );
    let before = digest(&store);
    let variants = [
        Batch::new("X").put("p", "k2", 5, "v"),
        Batch::new("X").put("p", "k", 6, "v"),
        Batch::new("X").put("p", "k", 4, "v"),
        Batch::new("X").put("p", "k", 5, "w"),
        Batch::new("X").delete("p", "k", 5),
        Batch::new("X").add("p", "k", 5, 1),
        Batch::new("X").put("d", "gone", 5, "v"),
        Batch::new("X").delete("d", "gone", 6),
        Batch::new("X").delete("d", "other", 5),
        Batch::new("X").add("a", "n", 5, 3),
        Batch::new("X").add("a", "n", 6, 2),
        Batch::new("X").add("a", "m", 5, 2),
        Batch::new("X").put("a", "n", 5, "2"),
    ];
    for v in &variants {
        assert_conflicting(
            apply(&store, v),
            "X",
            0,
            std::str::from_utf8(&v.deliveries()[0].event_id).unwrap(),
        );
    }
    // Inside one batch: the second delivery of an id with another payload.
    assert_conflicting(
        apply(
            &store,
            &Batch::new("X").put("q", "k", 9, "v").put("q", "k", 9, "w"),
        ),
        "X",
        1,
        "q",
    );
    assert_eq!(digest(&store), before);
    assert_eq!(store.batch("X").unwrap(), None);
    let r = commit(
        &store,
        &Batch::new("X")
            .put("p", "k", 5, "v")
            .delete("d", "gone", 5)
            .add("a", "n", 5, 2),
    );
    assert_eq!(r, report(|r| r.duplicates = 3));
    assert_eq!(row(&store, "n"), live(5, "2"));
}

/// A Put whose value is an Add's delta in 8 little-endian bytes, at a seq
/// that differs from the Add's only in the top byte: another payload, so
/// a conflict, and a batch id reused with it a batch conflict. (The op's
/// tag once went into the seq's top byte, and these two hashed alike.)
#[test]
fn a_put_and_an_add_that_differ_in_the_seqs_top_byte_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let delta: i64 = 3;
    // Nanosecond timestamps: 2026 and, with bit 57 flipped, 2030.
    let add_seq: u64 = 1_789_948_800_000_000_000;
    let put_seq = add_seq ^ (2 << 56);
    commit(
        &store,
        &Batch::new("B1").add("e1", "visits", add_seq, delta),
    );
    let before = digest(&store);
    let put = Batch::new("B2").put("e1", "visits", put_seq, delta.to_le_bytes());
    assert_conflicting(apply(&store, &put), "B2", 0, "e1");
    let reused = Batch::new("B1").put("e1", "visits", put_seq, delta.to_le_bytes());
    assert_batch_conflict(apply(&store, &reused), "B1");
    assert_eq!(digest(&store), before);

    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options().on_conflict(OnConflict::Quarantine));
    commit(
        &store,
        &Batch::new("B1").add("e1", "visits", add_seq, delta),
    );
    let r = commit(&store, &put);
    assert_eq!(r, report(|r| r.rejected = 1));
    assert_eq!(store.quarantine().len(), 1);
    assert_eq!(row(&store, "visits"), live(add_seq, "3"));
}

#[test]
fn size_limits_are_inclusive() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let key = "k".repeat(4096);
    let id = "i".repeat(4096);
    let value = vec![b'v'; VALUE_BYTES_MAX];
    let r = commit(
        &store,
        &Batch::new("B1")
            .put(id.as_str(), key.as_str(), 1, &value)
            .put("e2", "k2", 1, ""),
    );
    assert_eq!(r, report(|r| r.inserted = 2));
    assert_eq!(row(&store, &key), Some((1, value.clone())));
    assert_eq!(
        row(&store, "k2"),
        Some((1, vec![])),
        "an empty value is a value"
    );
    let store = reopen(store, dir.path(), options(), &[], &["B1"]);
    assert_eq!(row(&store, &key), Some((1, value)));
    assert_eq!(row(&store, "k2"), Some((1, vec![])));
}

/// The batch's own limits (DESIGN.md, "Write path", step 1) are inclusive
/// too: a batch id and a checkpoint source of 4096 bytes and a position of
/// 64 KiB commit and reopen; one byte more, or an empty source, is an
/// invalid batch that leaves nothing behind.
#[test]
fn batch_id_and_checkpoint_limits_are_inclusive() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let id = "b".repeat(4096);
    let source = "s".repeat(4096);
    let position = vec![7u8; 64 * 1024];
    let at_limits = Batch::new(id.as_str())
        .put("e1", "k1", 1, "v")
        .checkpoint(source.as_str(), position.clone());
    assert_eq!(commit(&store, &at_limits), report(|r| r.inserted = 1));
    assert!(apply(&store, &at_limits).unwrap().replayed);
    let store = reopen(
        store,
        dir.path(),
        options(),
        &[source.as_str()],
        &[id.as_str()],
    );
    assert_eq!(
        store.checkpoint(source.as_str()).unwrap().as_deref(),
        Some(&position[..])
    );

    let before = digest(&store);
    let over = [
        Batch::new("b".repeat(4097)).put("e2", "k2", 1, "v"),
        Batch::new("B2")
            .put("e2", "k2", 1, "v")
            .checkpoint("s".repeat(4097), [1]),
        Batch::new("B2")
            .put("e2", "k2", 1, "v")
            .checkpoint("cdc", vec![0u8; 64 * 1024 + 1]),
        Batch::new("B2").put("e2", "k2", 1, "v").checkpoint("", [1]),
    ];
    for batch in &over {
        match apply(&store, batch) {
            Err(Error::InvalidBatch { .. }) => {}
            other => panic!("expected InvalidBatch, got {other:?}"),
        }
    }
    assert_eq!(digest(&store), before);
    // e2 was not recorded as seen, nor B2 as committed.
    assert_eq!(
        commit(&store, &Batch::new("B2").put("e2", "k2", 1, "v")),
        report(|r| r.inserted = 1)
    );
}

#[test]
fn value_limit_follows_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Options::default().value_bytes_max(8));
    assert_invalid(
        apply(&store, &Batch::new("B1").put("e1", "k", 1, "123456789")),
        "B1",
        0,
        "e1",
    );
    let r = commit(&store, &Batch::new("B1").put("e1", "k", 1, "12345678"));
    assert_eq!(r, report(|r| r.inserted = 1));
}

/// The limit is an option of each open: an event applied under a higher one
/// and redelivered under a lower one is a duplicate, not an invalid event
/// (which would fail every batch that carries it under `Fail`, and list an
/// applied event in the quarantine under `Quarantine`). A new event over
/// the limit is still invalid.
#[test]
fn a_value_limit_lowered_between_opens_still_counts_redeliveries_as_duplicates() {
    let long = "x".repeat(2000);
    for policy in [OnConflict::Fail, OnConflict::Quarantine] {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), Options::default());
        commit(&store, &Batch::new("B1").put("e1", "k", 1, &long));
        store.close().unwrap();
        let lowered = Options::default().value_bytes_max(1000).on_conflict(policy);
        let store = open(dir.path(), lowered);
        let again = Batch::new("B2")
            .put("e1", "k", 1, &long)
            .put("e2", "k2", 1, "small")
            .checkpoint("src", position(2));
        let r = commit(&store, &again);
        assert_eq!(
            r,
            report(|r| {
                r.duplicates = 1;
                r.inserted = 1;
            }),
            "{policy:?}"
        );
        assert!(store.quarantine().is_empty(), "{policy:?}");
        let new_long = apply(&store, &Batch::new("B3").put("e3", "k3", 1, &long));
        match policy {
            OnConflict::Fail => assert_invalid(new_long, "B3", 0, "e3"),
            OnConflict::Quarantine => assert_eq!(new_long.unwrap().rejected, 1),
        }
    }
}

#[test]
fn counter_values_must_be_canonical_decimal() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let values = [
        ("c0", "0", Some("1")),
        ("c1", "-5", Some("-4")),
        ("c2", "42", Some("43")),
        ("c3", "9223372036854775806", Some("9223372036854775807")),
        ("c4", "-9223372036854775808", Some("-9223372036854775807")),
        ("n0", "+5", None),
        ("n1", "05", None),
        ("n2", "-0", None),
        ("n3", " 5", None),
        ("n4", "5 ", None),
        ("n5", "", None),
        ("n6", "abc", None),
        ("n7", "9223372036854775808", None),
        ("n8", "1.0", None),
        ("n9", "00", None),
        ("na", "-", None),
    ];
    let mut setup = Batch::new("setup");
    for (i, (key, value, _)) in values.iter().enumerate() {
        setup = setup.put(format!("p{i}"), key, 1, value);
    }
    commit(&store, &setup);
    for (i, (key, value, expected)) in values.iter().enumerate() {
        let id = format!("B{i}");
        let event = format!("a{i}");
        let result = apply(&store, &Batch::new(&id).add(&event, key, 2, 1));
        match expected {
            Some(next) => {
                assert_eq!(result.unwrap(), report(|r| r.added = 1), "{key}={value:?}");
                assert_eq!(row(&store, key), live(2, next), "{key}={value:?}");
            }
            None => {
                assert_invalid(result, &id, 0, &event);
                assert_eq!(row(&store, key), live(1, value), "{key}={value:?}");
            }
        }
    }
}

#[test]
fn counter_overflow_is_invalid() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    commit(
        &store,
        &Batch::new("B1")
            .add("a", "up", 1, i64::MAX)
            .add("b", "down", 1, i64::MIN),
    );
    assert_eq!(row(&store, "up"), live(1, &i64::MAX.to_string()));
    assert_eq!(row(&store, "down"), live(1, &i64::MIN.to_string()));
    assert_invalid(
        apply(&store, &Batch::new("B2").add("c", "up", 2, 1)),
        "B2",
        0,
        "c",
    );
    assert_invalid(
        apply(&store, &Batch::new("B2").add("d", "down", 2, -1)),
        "B2",
        0,
        "d",
    );
    // Within one batch: the second add overflows what the first produced.
    assert_invalid(
        apply(
            &store,
            &Batch::new("B2")
                .add("e", "mid", 1, i64::MAX - 1)
                .add("f", "mid", 1, 2),
        ),
        "B2",
        1,
        "f",
    );
    assert_eq!(row(&store, "mid"), None);
    assert_eq!(row(&store, "up"), live(1, &i64::MAX.to_string()));
    let r = commit(
        &store,
        &Batch::new("B2")
            .add("c", "up", 2, -1)
            .add("d", "down", 2, 1),
    );
    assert_eq!(r, report(|r| r.added = 2));
}

#[test]
fn quarantine_holds_every_kind_of_invalid_event() {
    let dir = tempfile::tempdir().unwrap();
    let options = options().on_conflict(OnConflict::Quarantine);
    let store = open(dir.path(), options.clone());
    commit(
        &store,
        &Batch::new("B0").put("e0", "text", 1, "not a number"),
    );
    let long_key = "k".repeat(4097);
    let long_id = "i".repeat(4097);
    let long_value = vec![b'x'; VALUE_BYTES_MAX + 1];
    let batch = Batch::new("B1")
        .put("e1", "", 1, "x")
        .put("", "k", 1, "x")
        .put("e2", long_key.as_str(), 1, "x")
        .put("e3", "k", 1, &long_value)
        .add("e4", "text", 2, 1)
        .malformed("e5", "line 3: unexpected end of input")
        .put("e0", "text", 1, "other")
        .put("e6", "ok", 1, "fine")
        .put(long_id.as_str(), "k", 1, "x")
        .checkpoint("src", position(6));
    let r = commit(&store, &batch);
    assert_eq!(
        r,
        report(|r| {
            r.rejected = 8;
            r.inserted = 1;
        })
    );
    assert_eq!(checkpoint(&store, "src"), Some(6));
    let q = sorted_quarantine(&store);
    let summary: Vec<(u64, &[u8])> = q.iter().map(|e| (e.index, &e.event_id[..])).collect();
    assert_eq!(
        summary,
        vec![
            (0, &b"e1"[..]),
            (1, &b""[..]),
            (2, &b"e2"[..]),
            (3, &b"e3"[..]),
            (4, &b"e4"[..]),
            (5, &b"e5"[..]),
            (6, &b"e0"[..]),
            (8, long_id.as_bytes()),
        ]
    );
    for e in &q {
        assert_eq!(&e.batch_id[..], b"B1");
        if e.index == 6 {
            assert_eq!(e.reason, "conflicting_event");
        } else {
            assert!(e.reason.starts_with("invalid: "), "{e:?}");
        }
    }
    assert_eq!(row(&store, "text"), live(1, "not a number"));
    assert_eq!(row(&store, "k"), None);
    let store = reopen(store, dir.path(), options, &["src"], &["B0", "B1"]);
    assert_eq!(store.quarantine().len(), 8);
}

#[test]
fn empty_batch_id_is_an_invalid_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let before = digest(&store);
    match apply(
        &store,
        &Batch::new("")
            .put("e1", "k", 1, "v")
            .checkpoint("s", position(1)),
    ) {
        Err(Error::InvalidBatch { .. }) => {}
        other => panic!("expected InvalidBatch, got {other:?}"),
    }
    assert_eq!(digest(&store), before);
    assert_eq!(row(&store, "k"), None);
    // e1 was not recorded as seen.
    let r = commit(&store, &Batch::new("B1").put("e1", "k", 1, "v"));
    assert_eq!(r, report(|r| r.inserted = 1));
}

/// A checkpoint out of bounds is an invalid batch whose message names the
/// source (cut, when it is long) and the length found.
#[test]
fn a_checkpoint_out_of_bounds_is_named_with_its_length() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let reason = |batch: &Batch| match apply(&store, batch) {
        Err(Error::InvalidBatch { reason, .. }) => reason,
        other => panic!("expected InvalidBatch, got {other:?}"),
    };
    let long = reason(&Batch::new("B").checkpoint("cdc", vec![0u8; 65_537]));
    assert!(
        long.contains("\"cdc\"") && long.contains("65537 bytes"),
        "{long}"
    );
    let huge_source = "s".repeat(100_000);
    let source = reason(&Batch::new("B").checkpoint(huge_source.as_str(), [1]));
    assert!(source.contains("100000 bytes"), "{source}");
    assert!(
        source.len() < 1_000,
        "the source is cut: {} bytes",
        source.len()
    );
    assert_eq!(store.batch("B").unwrap(), None);
}

#[test]
fn empty_batch_commits_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let r = commit(&store, &Batch::new("B1").checkpoint("s", position(7)));
    assert_eq!(r, BatchReport::default());
    assert_eq!(checkpoint(&store, "s"), Some(7));
    assert_eq!(store.batch("B1").unwrap(), Some(BatchReport::default()));
    let replay = apply(&store, &Batch::new("B1").checkpoint("s", position(7))).unwrap();
    assert!(replay.replayed);
    assert_batch_conflict(
        apply(&store, &Batch::new("B1").checkpoint("s", position(8))),
        "B1",
    );
    assert_batch_conflict(apply(&store, &Batch::new("B1")), "B1");
    // Checkpoints only: the last setting of a source in a batch wins; other sources stay.
    commit(
        &store,
        &Batch::new("B2")
            .checkpoint("t", position(1))
            .checkpoint("t", position(3)),
    );
    assert_eq!(checkpoint(&store, "t"), Some(3));
    assert_eq!(checkpoint(&store, "s"), Some(7));
    let store = reopen(store, dir.path(), options(), &["s", "t"], &["B1", "B2"]);
    assert_eq!(checkpoint(&store, "s"), Some(7));
}

#[test]
fn digest_depends_only_on_rows_and_checkpoints() {
    // Two stores reach the same rows and checkpoints by different histories.
    let a_dir = tempfile::tempdir().unwrap();
    let b_dir = tempfile::tempdir().unwrap();
    let a = open(a_dir.path(), options());
    let b = open(b_dir.path(), options());
    commit(
        &a,
        &Batch::new("A1")
            .put("e1", "k1", 3, "x")
            .put("e2", "k2", 1, "gone"),
    );
    commit(
        &a,
        &Batch::new("A2")
            .delete("e3", "k2", 2)
            .add("e4", "n", 5, 2)
            .add("e5", "n", 1, 5),
    );
    commit(&a, &Batch::new("A3").checkpoint("s", position(1)));
    commit(&a, &Batch::new("A4").checkpoint("s", position(2)));
    commit(
        &b,
        &Batch::new("only")
            .put("x1", "n", 5, "7")
            .put("x2", "k1", 3, "x")
            .delete("x3", "never-there", 9)
            .checkpoint("s", position(2)),
    );
    assert_eq!(rows(&a), rows(&b));
    assert_eq!(digest(&a), digest(&b));
    assert_eq!(digest(&a).to_string().len(), 32);
    assert!(
        digest(&a)
            .to_string()
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    // A checkpoint is part of the state.
    commit(&b, &Batch::new("more").checkpoint("s", position(3)));
    assert_ne!(digest(&a), digest(&b));
}

/// The index stamps seen ids and tombstones with their second in a `u32`:
/// a clock past early 2106 (or one counting microseconds) made everything
/// it stamped expire at once, so a redelivered delta applied again and a
/// conflicting one went through. Such a clock is refused, and nothing of
/// the batch is applied.
#[test]
fn a_clock_past_what_the_log_records_is_refused_not_taken_for_expiry() {
    let dir = tempfile::tempdir().unwrap();
    // The latest time the log records: 2^32 - 1 seconds, in milliseconds.
    let last_ms = u64::from(u32::MAX) * 1000;
    let clock = idemkv::ManualClock::new(last_ms);
    let store = open(
        dir.path(),
        options().clock(std::sync::Arc::new(clock.clone())),
    );
    let delta = Batch::new("B1").add("e1", "c", 1, 5);
    assert_eq!(commit(&store, &delta).added, 1);
    let again = Batch::new("B2").add("e1", "c", 1, 5);
    assert_eq!(
        commit(&store, &again).duplicates,
        1,
        "the last time still works"
    );

    clock.advance(std::time::Duration::from_millis(1));
    let later = Batch::new("B3").add("e1", "c", 1, 7).add("e2", "c", 2, 1);
    match apply(&store, &later) {
        Err(Error::ClockOutOfRange { now_ms, max_ms }) => {
            assert_eq!((now_ms, max_ms), (last_ms + 1, last_ms));
        }
        other => panic!("expected ClockOutOfRange, got {other:?}"),
    }
    assert_eq!(store.get("c").unwrap().unwrap().value, Bytes::from("5"));
    assert_eq!(store.batch("B3").unwrap(), None);

    // A microsecond clock, from the first batch on.
    let dir = tempfile::tempdir().unwrap();
    let micros = idemkv::ManualClock::new(1_726_000_000_000_000);
    let store = open(dir.path(), options().clock(std::sync::Arc::new(micros)));
    let message = apply(&store, &delta).unwrap_err().to_string();
    assert!(message.contains("milliseconds"), "{message}");
}

/// Sizes past what the format holds act as the largest it holds: a segment
/// size of `u64::MAX` made `open` fail to map the segment, with an error
/// that did not name the option.
#[test]
fn sizes_past_the_format_s_limits_act_as_those_limits() {
    let dir = tempfile::tempdir().unwrap();
    let huge = Options::default()
        .segment_bytes_max(u64::MAX)
        .value_bytes_max(usize::MAX);
    let store = open(dir.path(), huge.clone());
    let batch = Batch::new("B1").put("e1", "k", 1, "v");
    assert_eq!(commit(&store, &batch).inserted, 1);
    store.close().unwrap();
    let store = open(dir.path(), huge);
    assert_eq!(store.get("k").unwrap().unwrap().value, Bytes::from("v"));
}

/// A value limit past what the format holds acts as the format's own
/// (half a record body, 512 MiB): a put one byte over it is invalid, not
/// written, whatever the option says.
#[test]
fn a_value_limit_past_the_format_s_acts_as_the_format_s() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), Options::default().value_bytes_max(usize::MAX));
    let value = vec![0u8; (1 << 29) + 1];
    let result = apply(&store, &Batch::new("B1").put("e1", "k", 1, &value));
    assert_invalid(result, "B1", 0, "e1");
    assert_eq!(store.get("k").unwrap(), None);
}

/// An id longer than any valid one is named in the error by its start and
/// length, not copied whole (a 10 MiB batch id made a 50 MB message).
#[test]
fn an_oversized_id_is_named_not_copied_into_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let id = "b".repeat(1 << 20);
    let message = apply(&store, &Batch::new(id.as_str()).put("e", "k", 1, "v"))
        .unwrap_err()
        .to_string();
    assert!(message.len() < 10_000, "{} bytes", message.len());
    assert!(message.contains("(1048576 bytes)"), "{}", &message[..200]);
}

/// A `Put` whose value has the stored value's length and CRC32 but other
/// bytes is `updated`, and its value stored: the bytes decide, never a
/// checksum an input can match at will (SPEC: unchanged means
/// byte-identical).
#[test]
fn a_value_with_the_stored_ones_length_and_crc_but_other_bytes_is_an_update() {
    let stored = b"the value stored first, 32 bytes".to_vec();
    let other = common::same_crc_other_bytes(&stored);
    assert_ne!(other, stored);
    assert_eq!(crc32fast::hash(&other), crc32fast::hash(&stored));
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    commit(&store, &Batch::new("B1").put("e1", "k", 1, &stored));
    let report = commit(&store, &Batch::new("B2").put("e2", "k", 2, &other));
    assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
    let row = store.get("k").unwrap().expect("live");
    assert_eq!((row.seq, &row.value[..]), (2, &other[..]));
    // And the same bytes again are unchanged.
    let report = commit(&store, &Batch::new("B3").put("e3", "k", 3, &other));
    assert_eq!((report.updated, report.unchanged), (0, 1), "{report:?}");
}

/// As above, for stored values an open loaded, whose fingerprints the
/// index does not know (it takes them only from the batches it applies):
/// there the stored bytes are read and decide.
#[test]
fn after_a_reopen_a_value_with_the_stored_ones_length_and_crc_but_other_bytes_is_an_update() {
    let stored = b"the value stored first, 32 bytes".to_vec();
    let other = common::same_crc_other_bytes(&stored);
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    commit(&store, &Batch::new("B1").put("e1", "k", 1, &stored));
    let store = reopen(store, dir.path(), options(), &[], &["B1"]);
    let report = commit(&store, &Batch::new("B2").put("e2", "k", 2, &other));
    assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
    let row = store.get("k").unwrap().expect("live");
    assert_eq!((row.seq, &row.value[..]), (2, &other[..]));
    let store = reopen(store, dir.path(), options(), &[], &["B1", "B2"]);
    let report = commit(&store, &Batch::new("B3").put("e3", "k", 3, &other));
    assert_eq!((report.updated, report.unchanged), (0, 1), "{report:?}");
    let report = commit(&store, &Batch::new("B4").put("e4", "k", 4, &stored));
    assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
}

/// Unchanged means byte-identical for large values too, which the engine
/// compares by another path than small ones.
#[test]
fn a_large_value_put_again_is_unchanged_and_one_byte_off_is_an_update() {
    let stored: Vec<u8> = (0..VALUE_BYTES_MAX).map(|i| (i % 251) as u8).collect();
    let mut other = stored.clone();
    other[VALUE_BYTES_MAX - 1] ^= 1;
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    commit(&store, &Batch::new("B1").put("e1", "k", 1, &stored));
    let report = commit(&store, &Batch::new("B2").put("e2", "k", 2, &stored));
    assert_eq!((report.updated, report.unchanged), (0, 1), "{report:?}");
    let report = commit(&store, &Batch::new("B3").put("e3", "k", 3, &other));
    assert_eq!((report.updated, report.unchanged), (1, 0), "{report:?}");
    let row = store.get("k").unwrap().expect("live");
    assert_eq!((row.seq, &row.value[..]), (3, &other[..]));
}

/// `Batch::content_hash` is what a batch id is committed with, and
/// `Store::log` lists it: a caller can tell whether a batch is the one its
/// id committed without applying it. Same content, same hash (a replay);
/// other deliveries or checkpoints, another hash (a `BatchConflict`); the
/// id is not part of it.
#[test]
fn the_log_lists_the_content_hash_each_batch_id_committed_with() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let batch = first_delivery("B1");
    commit(&store, &batch);
    let logged = store.log();
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].content_hash, batch.content_hash());
    assert_eq!(first_delivery("B2").content_hash(), batch.content_hash());

    let other_value = Batch::new("B1")
        .put("e1", "O1/1", 10, "v1")
        .checkpoint("cdc", position(8));
    let other_checkpoint = first_delivery("B1").checkpoint("cdc", position(9));
    for other in [other_value, other_checkpoint] {
        assert_ne!(other.content_hash(), logged[0].content_hash);
        assert_batch_conflict(apply(&store, &other), "B1");
    }
    assert!(apply(&store, &batch).unwrap().replayed);
}

/// A replay reports the first outcome whole: a batch with one delivery of
/// each of the eight kinds, handed over again, comes back with all eight
/// counts as they were, and `replayed`.
#[test]
fn a_replay_reports_every_count_of_the_first_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options().on_conflict(OnConflict::Quarantine));
    apply(
        &store,
        &Batch::new("B0")
            .put("e1", "k1", 1, "a")
            .put("e2", "k2", 1, "b")
            .put("e3", "k3", 2, "c")
            .add("e4", "n", 1, 1),
    )
    .unwrap();
    let b1 = Batch::new("B1")
        .put("e5", "k4", 1, "x")
        .put("e6", "k1", 2, "a2")
        .put("e7", "k2", 2, "b")
        .put("e8", "k3", 1, "older")
        .put("e1", "k1", 1, "a")
        .delete("e9", "k3", 3)
        .add("e10", "n", 2, 1)
        .put("e2", "k2", 1, "other content");
    let first = BatchReport {
        inserted: 1,
        updated: 1,
        unchanged: 1,
        stale: 1,
        duplicates: 1,
        deleted: 1,
        added: 1,
        rejected: 1,
        replayed: false,
    };
    assert_eq!(apply(&store, &b1).unwrap(), first);
    assert_eq!(
        apply(&store, &b1).unwrap(),
        BatchReport {
            replayed: true,
            ..first
        }
    );
}

/// Inside one batch, a put of the value the batch itself just inserted is
/// unchanged, and it still advances the version.
#[test]
fn an_unchanged_put_inside_the_batch_that_inserted_the_value_advances_the_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let r = apply(
        &store,
        &Batch::new("B1")
            .put("e1", "k", 1, "v")
            .put("e2", "k", 2, "v"),
    )
    .unwrap();
    assert_eq!(
        r,
        BatchReport {
            inserted: 1,
            unchanged: 1,
            ..BatchReport::default()
        }
    );
    assert_eq!(store.get("k").unwrap().unwrap().seq, 2);
    let r = apply(&store, &Batch::new("B2").put("e3", "k", 2, "w")).unwrap();
    assert_eq!(r.stale, 1, "{r:?}");
}

/// After an unchanged put advanced a stored key's version inside a batch,
/// the batch's later deliveries of that key still see its stored value.
#[test]
fn deliveries_after_an_unchanged_put_in_the_same_batch_see_the_stored_value() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    apply(
        &store,
        &Batch::new("B1")
            .put("e1", "c", 1, "5")
            .put("e2", "k", 1, "v"),
    )
    .unwrap();
    let r = apply(
        &store,
        &Batch::new("B2")
            .put("e3", "c", 2, "5")
            .add("e4", "c", 3, 1)
            .put("e5", "k", 2, "v")
            .put("e6", "k", 3, "w"),
    )
    .unwrap();
    assert_eq!(
        r,
        BatchReport {
            unchanged: 2,
            added: 1,
            updated: 1,
            ..BatchReport::default()
        }
    );
    assert_eq!(&store.get("c").unwrap().unwrap().value[..], b"6");
    assert_eq!(&store.get("k").unwrap().unwrap().value[..], b"w");
}

/// The digest frames every field with its length: states whose bytes run
/// together the same way but split differently between a checkpoint's
/// source and position, or between a key and the seq after it, are
/// different states and get different digests.
#[test]
fn digest_tells_apart_states_whose_fields_split_the_same_bytes_differently() {
    let state = |batch: Batch| {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), options());
        commit(&store, &batch);
        digest(&store)
    };
    assert_ne!(
        state(Batch::new("B").checkpoint("ab", "c")),
        state(Batch::new("B").checkpoint("a", "bc")),
    );
    // "ab", then seq 1 (little-endian), then "", against "a", then seq
    // 0x162 ("b" and 1, little-endian), then "\0": the same bytes once
    // the lengths are left out.
    assert_ne!(
        state(Batch::new("B").put("e", "ab", 1, "")),
        state(Batch::new("B").put("e", "a", 0x162, "\0")),
    );
}

/// A malformed delivery whose caller gave no reason is still named as
/// what it is: `InvalidEvent` with an empty reason read "invalid event "e"
/// at delivery 0 of batch "B": " and its quarantine entry "invalid: ",
/// which tell nothing of the problem.
#[test]
fn a_malformed_delivery_without_a_reason_is_still_named_malformed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), options());
    let batch = Batch::new("B1").malformed("e1", "");
    let result = apply(&store, &batch);
    assert_invalid(result, "B1", 0, "e1");
    let message = apply(&store, &batch).unwrap_err().to_string();
    assert!(message.contains("malformed"), "{message}");
    drop(store);

    let options = options().on_conflict(OnConflict::Quarantine);
    let store = open(dir.path(), options);
    assert_eq!(commit(&store, &batch), report(|r| r.rejected = 1));
    let q = store.quarantine();
    assert_eq!(q.len(), 1);
    assert!(q[0].reason.contains("malformed"), "{:?}", q[0].reason);
    // The caller's own reason is kept as it is.
    let r = commit(&store, &Batch::new("B2").malformed("e2", "line 3: bad"));
    assert_eq!(r, report(|r| r.rejected = 1));
    assert_eq!(store.quarantine()[1].reason, "invalid: line 3: bad");
}

/// The record body limit (DESIGN.md, "Limits": 2^30 bytes) is inclusive:
/// a batch whose body is exactly 1 GiB (two values, one of them the
/// largest a value may be, 512 MiB) commits and reads back after a
/// reopen; one byte more is an `InvalidBatch` naming the size, and leaves
/// nothing behind. (About 8 s and 3 GB of memory.)
#[test]
fn a_record_body_of_exactly_one_gib_commits_and_one_byte_more_is_an_invalid_batch() {
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .value_bytes_max(usize::MAX)
        .durability(idemkv::Durability::Buffered)
        .snapshot_log_bytes(None);
    let store = open(dir.path(), options.clone());
    let half = 1usize << 29;
    // Besides the values: head 34 bytes (a 1-byte id), two seen ids 49,
    // writes 1 + 2 * 13 (1-byte keys, seq 1, 5-byte lengths), and the
    // empty checkpoint, quarantine and add lists 3: 113 bytes.
    let rest = (1usize << 30) - 113 - half;
    let batch = |id: &str, rest: usize| {
        Batch::new(id)
            .put("e1", "a", 1, vec![b'a'; half])
            .put("e2", "b", 1, vec![b'b'; rest])
    };
    match apply(&store, &batch("C", rest + 1)) {
        Err(Error::InvalidBatch { batch_id, reason }) => {
            assert_eq!(batch_id, "C");
            assert!(
                reason.contains(&((1usize << 30) + 1).to_string()),
                "{reason}"
            );
        }
        other => panic!("expected InvalidBatch, got {other:?}"),
    }
    assert_eq!(store.get("a").unwrap(), None);
    assert_eq!(store.batch("C").unwrap(), None);
    assert_eq!(
        commit(&store, &batch("B", rest)),
        report(|r| r.inserted = 2)
    );
    drop(store);
    let store = open(dir.path(), options);
    let a = store.get("a").unwrap().expect("a");
    assert_eq!((a.seq, a.value.len()), (1, half));
    assert!(a.value.iter().all(|&b| b == b'a'));
    let b = store.get("b").unwrap().expect("b");
    assert_eq!(b.value.len(), rest);
    assert!(b.value.iter().all(|&x| x == b'b'));
}
