//! Installing an automatic snapshot off the caller's path.
//!
//! A snapshot is written to `SNAPSHOT.tmp` under the writer lock; what
//! follows is only waiting for the disk: syncing the file (tens of MiB),
//! renaming it to `SNAPSHOT` and syncing the directory, 8-19 ms for W1's
//! snapshots (and under `Buffered`, first syncing the log it covers). The
//! batch that made a snapshot due used to wait for all of it; here a
//! thread of the store's own does it while that caller returns.
//! `Store::snapshot` runs its own install on its caller's thread instead,
//! since that caller waits for it and must hear of its failure.
//!
//! One install at a time, and never alongside other maintenance: only a
//! holder of the maintenance lock starts one, and every holder settles the
//! running install first (`Store::lock_maintenance`), so compaction never
//! removes a snapshot that is about to be renamed into place, and no new
//! `SNAPSHOT.tmp` is written over one being synced. The install's outcome
//! reaches the writer, which counts log bytes since the last snapshot,
//! when someone takes it (`take_finished` or `settle`).
//!
//! A storage that allows no background I/O (`FaultyStorage`) gets the
//! install on the caller's thread, so that its operations come in the same
//! order in every run; so does a store whose thread could not be spawned.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use super::group_commit::GroupCommit;
use crate::error::{Error, Result};
use crate::log::sync_gate::SyncGate;
use crate::recovery::note_sync_failure;
use crate::storage::{Storage, StorageFile};

/// A written `SNAPSHOT.tmp` and where it goes.
pub(super) struct Install {
    pub storage: Arc<dyn Storage>,
    pub file: Arc<dyn StorageFile>,
    pub tmp: PathBuf,
    pub path: PathBuf,
    pub dir: PathBuf,
    /// The log position (lsn) the snapshot covers.
    pub lsn: u64,
    /// The segment the snapshot covers part of, if it is not synced yet.
    pub log: Option<LogToSync>,
}

/// A log segment to sync before a snapshot that covers it is installed
/// (under `Durability::Buffered`, whose batches no sync covered).
pub(super) struct LogToSync {
    pub file: Arc<dyn StorageFile>,
    pub path: PathBuf,
    pub sync_gate: Arc<SyncGate>,
    /// Poisoned if the sync fails: the kernel may have dropped the pages.
    pub commit: Arc<GroupCommit>,
}

impl Install {
    /// Syncs the log the snapshot covers (if asked to) and the snapshot
    /// file, renames it into place and syncs the directory; returns the
    /// snapshot's size. No snapshot is ever in place before the log it
    /// refers to is durable.
    pub(super) fn run(&self) -> Result<u64> {
        if let Some(log) = &self.log {
            log.sync_gate
                .sync(log.file.as_ref())
                .map_err(|e| Error::io("sync", &log.path, e))
                .inspect_err(|e| {
                    log.commit.poison(format!("snapshot sync failed: {e}"));
                    note_sync_failure(self.storage.as_ref(), &self.dir);
                })?;
        }
        self.file
            .sync_data()
            .map_err(|e| Error::io("sync", &self.tmp, e))?;
        let bytes = self
            .file
            .len()
            .map_err(|e| Error::io("stat", &self.tmp, e))?;
        self.storage
            .rename(&self.tmp, &self.path)
            .map_err(|e| Error::io("rename", &self.tmp, e))?;
        self.storage
            .sync_dir(&self.dir)
            .map_err(|e| Error::io("sync directory", &self.dir, e))?;
        Ok(bytes)
    }
}

/// How an install ended: the lsn its snapshot covers, and its size.
pub(super) type Finished = (u64, Result<u64>);

#[derive(Default)]
struct State {
    /// Handed to the thread, not yet taken by it.
    queued: Option<Install>,
    is_running: bool,
    finished: Option<Finished>,
    is_stopped: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Signals the thread (a job or stop) and waiters (a job finished).
    changed: Condvar,
    /// An install was started and its outcome not yet taken: read by every
    /// batch, so it is kept outside the mutex.
    is_outstanding: AtomicBool,
}

/// Runs the installs of one store.
pub(super) struct Installer {
    shared: Arc<Shared>,
    is_background: bool,
    /// Started with the first install (a store that never writes a
    /// snapshot, such as one opened for a read, never starts one); `None`
    /// inline: no background I/O allowed, or no thread to be had.
    thread: OnceLock<Option<JoinHandle<()>>>,
}

impl Installer {
    /// An installer with a thread of its own if `is_background`.
    pub(super) fn new(is_background: bool) -> Self {
        Self {
            shared: Arc::new(Shared::default()),
            is_background,
            thread: OnceLock::new(),
        }
    }

    /// Starts `install`: on the thread, or here and now if inline. The
    /// previous install's outcome must have been taken.
    pub(super) fn start(&self, install: Install) {
        let thread = self.thread.get_or_init(|| {
            let worker = Arc::clone(&self.shared);
            self.is_background
                .then(|| {
                    std::thread::Builder::new()
                        .name("idemkv-snapshot".into())
                        .spawn(move || run(&worker))
                        .ok()
                })
                .flatten()
        });
        let mut state = self.shared.state.lock();
        debug_assert!(
            state.queued.is_none() && !state.is_running && state.finished.is_none(),
            "one install at a time, its outcome taken before the next"
        );
        self.shared.is_outstanding.store(true, Ordering::Release);
        if thread.is_some() {
            state.queued = Some(install);
            self.shared.changed.notify_all();
        } else {
            drop(state);
            let finished = (install.lsn, install.run());
            self.shared.state.lock().finished = Some(finished);
        }
    }

    /// Whether an install was started and its outcome not yet taken.
    pub(super) fn is_outstanding(&self) -> bool {
        self.shared.is_outstanding.load(Ordering::Acquire)
    }

    /// The outcome of the last install if it has ended and no one took it
    /// yet; `None` also while it runs.
    pub(super) fn take_finished(&self) -> Option<Finished> {
        if !self.is_outstanding() {
            return None;
        }
        let mut state = self.shared.state.lock();
        let finished = state.finished.take();
        if finished.is_some() {
            self.shared.is_outstanding.store(false, Ordering::Release);
        }
        finished
    }

    /// Waits for the running install, if any, and takes its outcome.
    pub(super) fn settle(&self) -> Option<Finished> {
        if !self.is_outstanding() {
            return None;
        }
        let mut state = self.shared.state.lock();
        while state.queued.is_some() || state.is_running {
            self.shared.changed.wait(&mut state);
        }
        let finished = state.finished.take();
        self.shared.is_outstanding.store(false, Ordering::Release);
        finished
    }
}

impl Drop for Installer {
    /// Lets a running install end (the store settles it before it goes;
    /// this only ends the thread).
    fn drop(&mut self) {
        self.shared.state.lock().is_stopped = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take().flatten() {
            let _ = thread.join();
        }
    }
}

/// The thread: runs each install handed to it until told to stop.
fn run(shared: &Shared) {
    let mut state = shared.state.lock();
    loop {
        if let Some(install) = state.queued.take() {
            state.is_running = true;
            let finished = parking_lot::MutexGuard::unlocked(&mut state, || {
                // A panic must not leave the install running for good:
                // whoever settles it would wait forever.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| install.run()));
                let ran = ran.unwrap_or_else(|_| {
                    Err(Error::io(
                        "install snapshot",
                        &install.tmp,
                        std::io::Error::other("the install panicked"),
                    ))
                });
                (install.lsn, ran)
            });
            state.is_running = false;
            state.finished = Some(finished);
            shared.changed.notify_all();
        } else if state.is_stopped {
            return;
        } else {
            shared.changed.wait(&mut state);
        }
    }
}
