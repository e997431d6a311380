//! Contract area: regressions. Each test here is a crash a fuzz target found
//! (`fuzz/fuzz_targets/`), reduced to the calls that show it, with a note
//! on how it was found. The fuzz input is in the note; replay it with
//! `cargo +nightly fuzz run <target> <file>` after writing its bytes to a file.

#![cfg(feature = "testing")]

use std::path::PathBuf;
use std::sync::Arc;

use idemkv::storage::{FaultyStorage, OpenMode, Storage};
use idemkv::{Batch, Error, ManualClock, Options, Store};

fn dir() -> PathBuf {
    PathBuf::from("/db")
}

fn options(storage: &FaultyStorage) -> Options {
    Options::default()
        .storage(Arc::new(storage.clone()))
        .clock(Arc::new(ManualClock::new(1_750_000_000_000)))
}

/// Writes a durable file into the store directory.
fn put_file(storage: &FaultyStorage, name: &str, bytes: &[u8]) {
    storage.create_dir_all(&dir()).expect("create dir");
    let file = storage
        .open(&dir().join(name), OpenMode::CreateNew)
        .expect("create file");
    file.append(bytes).expect("write");
    file.sync_data().expect("sync");
    storage.sync_dir(&dir()).expect("sync dir");
}

/// Found by `open_store` on its first input, the empty one: a directory
/// holding only an empty `0000000000.seg`. The walk expects the log to start
/// at segment 1, so `open` reports segment 1 missing; `repair` then moved
/// every segment from id 1 on, which left segment 0 in place, and the store
/// still did not open. With a healthy store beside the stray file, repair
/// moved the healthy segments away and kept the stray one.
///
/// Repair must leave a directory that opens: it moves every segment of the
/// log that the walk did not keep, wherever its id sorts.
#[test]
fn repair_of_a_stray_segment_zero_leaves_a_store_that_opens() {
    // Alone.
    let storage = FaultyStorage::new();
    put_file(&storage, "0000000000.seg", b"");
    let err = Store::open(dir(), options(&storage)).expect_err("segment 1 is missing");
    assert!(matches!(err, Error::Corruption { .. }), "{err}");
    let report = Store::repair(dir(), options(&storage)).expect("repair");
    assert_eq!(report.segments_dropped, 1, "{report:?}");
    Store::open(dir(), options(&storage)).expect("open after repair");
    Store::verify_dir(dir(), &options(&storage)).expect("verify after repair");

    // Beside a healthy store.
    let storage = FaultyStorage::new();
    let store = Store::open(dir(), options(&storage)).expect("open");
    store
        .apply_batch(&Batch::new("B1").put("e1", "k", 1, "v"))
        .expect("batch");
    store.close().expect("close");
    put_file(&storage, "0000000000.seg", b"");
    assert!(Store::open(dir(), options(&storage)).is_err());
    Store::repair(dir(), options(&storage)).expect("repair");
    Store::open(dir(), options(&storage)).expect("open after repair");
    Store::verify_dir(dir(), &options(&storage)).expect("verify after repair");
}
