//! Contract area: the store's directory (SPEC section 4: one writer per
//! directory). One test only: it changes the process's current directory,
//! which every thread of the test binary shares.

use idemkv::{Batch, Error, Options, Store};

/// A store opened by a relative path stays in the directory that path named
/// at the open: a later change of the current directory (a daemon does one)
/// must not send its files into another directory, or into another store
/// whose lock it does not hold. An empty path is refused and leaves nothing.
#[test]
fn a_store_opened_by_a_relative_path_stays_where_it_was_opened() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Every batch rotates, so each one creates a file by the store's path.
    let options = || Options::default().segment_bytes_max(1);
    drop(Store::open(b.path().join("data"), options()).unwrap());
    let home = std::env::current_dir().unwrap();

    std::env::set_current_dir(a.path()).unwrap();
    let store = Store::open("data", options()).unwrap();
    store
        .apply_batch(&Batch::new("B1").put("e1", "k1", 1, "v1"))
        .unwrap();
    std::env::set_current_dir(b.path()).unwrap();
    store
        .apply_batch(&Batch::new("B2").put("e2", "k2", 1, "v2"))
        .unwrap();
    store.compact().unwrap();
    store.snapshot().unwrap();
    drop(store);

    let empty = Store::open("", options());
    let left: Vec<_> = std::fs::read_dir(b.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    std::env::set_current_dir(home).unwrap();
    assert!(
        matches!(empty, Err(Error::Io { .. })),
        "{:?}",
        empty.map(drop)
    );
    assert_eq!(left, ["data"], "nothing created in the current directory");

    let mine = Store::open(a.path().join("data"), options()).unwrap();
    let other = Store::open(b.path().join("data"), options()).unwrap();
    assert!(mine.get("k1").unwrap().is_some() && mine.get("k2").unwrap().is_some());
    assert!(other.get("k1").unwrap().is_none() && other.get("k2").unwrap().is_none());
    assert_eq!(other.stats().live_keys, 0);
}
