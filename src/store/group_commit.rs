//! Group commit: callers that wrote records wait until a sync covers them;
//! one of them runs the sync for all, with no other lock held meanwhile,
//! then publishes what it covered and wakes the others.
//!
//! Positions are log sequence numbers (bytes appended since open). A sync of
//! the newest segment makes everything written before it durable, because
//! older segments were synced when they were sealed. `durable` only moves
//! once what it covers is published, so a caller that returns can read its
//! own batch.
//!
//! After a failed write or sync the store is poisoned: a failed fsync may have
//! dropped dirty pages, so it is never retried and nothing is assumed durable.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::storage::StorageFile;

/// What the syncer does around a sync, on behalf of the store.
pub(crate) trait SyncHooks {
    /// Everything before `lsn` is durable: make it visible.
    fn published(&self, lsn: u64);
    /// The sync failed; the store is poisoned.
    fn sync_failed(&self);
}

#[derive(Debug, Default)]
struct State {
    /// Newest position written, and the file it is in.
    written: u64,
    file: Option<Arc<dyn StorageFile>>,
    /// Everything before this position is durable.
    durable: u64,
    is_syncing: bool,
    poisoned: Option<String>,
    /// Commit syncs run since open (each may cover many callers' batches).
    syncs: u64,
}

#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    state: Mutex<State>,
    synced: Condvar,
}

impl GroupCommit {
    /// Notes a record written up to `lsn` into `file`. Caller holds the writer lock.
    pub(crate) fn written(&self, lsn: u64, file: &Arc<dyn StorageFile>) {
        let mut s = self.state.lock();
        debug_assert!(lsn >= s.written, "written positions only grow");
        s.written = lsn;
        s.file = Some(Arc::clone(file));
    }

    /// Notes that everything before `lsn` is durable and published.
    pub(crate) fn durable(&self, lsn: u64) {
        let mut s = self.state.lock();
        s.durable = s.durable.max(lsn);
        self.synced.notify_all();
    }

    /// Everything before this position is durable.
    pub(crate) fn durable_lsn(&self) -> u64 {
        self.state.lock().durable
    }

    /// Commit syncs run since open.
    pub(crate) fn syncs(&self) -> u64 {
        self.state.lock().syncs
    }

    /// The newest position written.
    pub(crate) fn written_lsn(&self) -> u64 {
        self.state.lock().written
    }

    /// Refuses all further writes.
    pub(crate) fn poison(&self, reason: String) {
        let mut s = self.state.lock();
        s.poisoned.get_or_insert(reason);
        self.synced.notify_all();
    }

    /// `Err(Poisoned)` once a write or sync has failed.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.state.lock().poisoned {
            Some(reason) => Err(Error::Poisoned {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Returns once everything before `lsn` is durable and published,
    /// syncing if no one else is; after a sync, `hooks` publish what it
    /// covered, or hear that it failed.
    pub(crate) fn wait_durable(&self, lsn: u64, hooks: &dyn SyncHooks) -> Result<()> {
        let mut s = self.state.lock();
        loop {
            if let Some(reason) = &s.poisoned {
                return Err(Error::Poisoned {
                    reason: reason.clone(),
                });
            }
            if s.durable >= lsn {
                return Ok(());
            }
            if s.is_syncing {
                self.synced.wait(&mut s);
                continue;
            }
            let target = s.written;
            let file = Arc::clone(
                s.file
                    .as_ref()
                    .expect("a position was written before anyone waits for it"),
            );
            s.is_syncing = true;
            let synced = parking_lot::MutexGuard::unlocked(&mut s, || {
                let synced = file.sync_data();
                match &synced {
                    Ok(()) => hooks.published(target),
                    Err(_) => hooks.sync_failed(),
                }
                synced
            });
            s.is_syncing = false;
            match synced {
                Ok(()) => {
                    s.durable = s.durable.max(target);
                    s.syncs += 1;
                }
                Err(e) => {
                    s.poisoned.get_or_insert(format!("sync failed: {e}"));
                }
            }
            self.synced.notify_all();
        }
    }
}
