//! Contract area: one writer per directory (SPEC section 4).
//!
//! A second `open` of a directory, from this process or another, fails with
//! `Error::Locked`; the lock goes away when the store is dropped or its
//! process dies. Other processes are this test binary run again with
//! `child_process_helper` selected and `IDEMKV_LOCKING_DIR` naming the store.

use std::any::Any;
use std::io;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use idemkv::storage::{OpenMode, OsStorage, Storage, StorageFile};
use idemkv::{Batch, Error, Options, Store};

const DIR_VAR: &str = "IDEMKV_LOCKING_DIR";
const MODE_VAR: &str = "IDEMKV_LOCKING_MODE";
const READY_FILE: &str = "child-ready";

/// The tests below run one at a time. A child spawned by one test is forked
/// with copies of every open file of this process, the lock files of stores
/// other tests hold included, and keeps them until it execs; a lock that a
/// test has just released could then still be held for a moment.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const EXIT_OPENED: i32 = 10;
const EXIT_LOCKED: i32 = 11;
const EXIT_OTHER_ERROR: i32 = 12;

/// Not a test of its own: when run as a child with `IDEMKV_LOCKING_DIR` set,
/// opens the store and reports the outcome through its exit code (mode
/// `try`), or opens it, announces that through a file and sleeps until killed
/// (mode `hold`). Without the variable it does nothing.
#[test]
fn child_process_helper() {
    let Some(dir) = std::env::var_os(DIR_VAR) else {
        return;
    };
    let dir = Path::new(&dir);
    let mode = std::env::var(MODE_VAR).unwrap_or_default();
    match Store::open(dir, Options::default()) {
        Ok(store) => {
            if mode == "hold" {
                let ready = dir
                    .parent()
                    .expect("store dir has a parent")
                    .join(READY_FILE);
                std::fs::write(ready, b"ready").expect("write ready file");
                std::thread::sleep(Duration::from_secs(120));
                drop(store);
            }
            std::process::exit(EXIT_OPENED);
        }
        Err(Error::Locked { .. }) => std::process::exit(EXIT_LOCKED),
        Err(e) => {
            eprintln!("child open failed: {e}");
            std::process::exit(EXIT_OTHER_ERROR);
        }
    }
}

fn child(dir: &Path, mode: &str) -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("current exe"));
    cmd.args([
        "child_process_helper",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(DIR_VAR, dir)
    .env(MODE_VAR, mode)
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    cmd
}

fn child_open(dir: &Path) -> ExitStatus {
    child(dir, "try").status().expect("run child")
}

/// Kills the child if the test fails before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn assert_locked(result: Result<Store, Error>, dir: &Path) {
    match result {
        Err(Error::Locked { dir: named }) => {
            assert!(
                named.ends_with(dir.file_name().expect("dir name")),
                "Locked names {named:?}, expected {dir:?}"
            );
        }
        Err(other) => panic!("expected Locked, got {other}"),
        Ok(_) => panic!("a second open of {dir:?} succeeded"),
    }
}

#[test]
fn second_open_in_the_same_process_is_locked_until_the_first_is_dropped() {
    let _serial = serial();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    let store = Store::open(&dir, Options::default()).expect("first open");
    store
        .apply_batch(&Batch::new("B1").put("e1", "k", 1, "v"))
        .expect("apply");
    assert_locked(Store::open(&dir, Options::default()), &dir);
    // A refused open must not disturb the holder.
    store
        .apply_batch(&Batch::new("B2").put("e2", "k", 2, "w"))
        .expect("apply after a refused open");
    assert_locked(Store::open(&dir, Options::default()), &dir);
    drop(store);

    let store = Store::open(&dir, Options::default()).expect("open after drop");
    assert_eq!(store.get("k").unwrap().unwrap().seq, 2);
    assert_locked(Store::open(&dir, Options::default()), &dir);
}

#[test]
fn open_from_another_process_is_locked() {
    let _serial = serial();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    let store = Store::open(&dir, Options::default()).expect("first open");
    let status = child_open(&dir);
    assert_eq!(
        status.code(),
        Some(EXIT_LOCKED),
        "child open while we hold the store: {status}"
    );
    drop(store);
    let status = child_open(&dir);
    assert_eq!(
        status.code(),
        Some(EXIT_OPENED),
        "child open after we dropped the store: {status}"
    );
    // The child has exited, so its lock is gone too.
    let store = Store::open(&dir, Options::default()).expect("open after the child exited");
    drop(store);
}

#[test]
fn lock_of_a_killed_process_does_not_block_the_next_open() {
    let _serial = serial();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    {
        let store = Store::open(&dir, Options::default()).expect("create");
        store
            .apply_batch(&Batch::new("B1").put("e1", "k", 7, "v"))
            .expect("apply");
    }
    let mut holder = KillOnDrop(child(&dir, "hold").spawn().expect("spawn child"));
    let ready = parent.path().join(READY_FILE);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready.exists() {
        if let Some(status) = holder.0.try_wait().expect("try_wait") {
            panic!("child exited before holding the store: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "child did not open the store in time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_locked(Store::open(&dir, Options::default()), &dir);

    holder.0.kill().expect("SIGKILL the child");
    let status = holder.0.wait().expect("wait for the child");
    assert_eq!(
        status.code(),
        None,
        "the child was killed, it did not exit: {status}"
    );

    let store = Store::open(&dir, Options::default()).expect("open after the holder was killed");
    assert_eq!(store.get("k").unwrap().unwrap().seq, 7);
    assert_locked(Store::open(&dir, Options::default()), &dir);
}

/// The file system, except that the lock is found held by someone else for
/// the next `busy` tries, as when a forked child that has not exec'd yet
/// still shares a closed store's lock.
#[derive(Debug, Default)]
struct BusyLock {
    busy: AtomicU32,
}

impl Storage for BusyLock {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        OsStorage.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        OsStorage.list_dir(dir)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        OsStorage.open(path, mode)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsStorage.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        OsStorage.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        OsStorage.sync_dir(dir)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let busy = self
            .busy
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if busy.is_ok() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        OsStorage.lock(path)
    }
}

/// A lock found held is tried again for a moment before the answer is
/// `Locked` (DESIGN, "File lifecycle"): a store just closed by a process
/// that forked at that instant must still open, here and for `verify_dir`.
#[test]
fn open_tries_a_lock_held_for_an_instant_again() {
    let _serial = serial();
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("store");
    let storage = Arc::new(BusyLock::default());
    let options = Options::default().storage(Arc::clone(&storage) as Arc<dyn Storage>);
    storage.busy.store(1, Ordering::SeqCst);
    let store = Store::open(&dir, options.clone()).expect("open once the lock is let go");
    store
        .apply_batch(&Batch::new("B1").put("e1", "k", 1, "v"))
        .expect("apply");
    drop(store);
    assert_eq!(
        storage.busy.load(Ordering::SeqCst),
        0,
        "the busy try was made"
    );

    storage.busy.store(1, Ordering::SeqCst);
    let report = Store::verify_dir(&dir, &options).expect("verify once the lock is let go");
    assert_eq!(report.records, 1);
}
