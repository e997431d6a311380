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
//! The next sync does not wait for the previous one's publishing: a syncer
//! first notes `synced` and hands the turn on, then publishes. Publishing is
//! idempotent and in log order (whoever publishes first applies every
//! pending record the sync covered), so two syncers may publish in either
//! order; `durable` moves only after its own syncer's publish returned.
//!
//! Gathering: a sync covers every record written before it starts, so with
//! several writers the syncs would split them into two alternating halves
//! (those that wrote during the last sync, and those it released). The
//! records the last sync covered plus those written while it ran are how
//! many writers are active; until that many records wait, the next syncer
//! waits for them, for at most as long as the last sync took, so that one
//! sync serves them all. A lone writer's records never arrive during its
//! own sync, so it never waits.
//!
//! After a failed write or sync the store is poisoned: a failed fsync may have
//! dropped dirty pages, so it is never retried and nothing is assumed durable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::log::sync_gate::SyncGate;
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
    /// Everything before this position is on stable storage.
    synced: u64,
    /// Everything before this position is on stable storage and published.
    durable: u64,
    /// A syncer is gathering records or syncing: no one else starts a sync.
    is_syncing: bool,
    /// What the running sync covers, once it has stopped gathering.
    sync_target: Option<u64>,
    /// Waiters whose records the running sync does not cover.
    awaiting_turn: u32,
    /// The syncer is waiting for more records (see the module comment).
    is_gathering: bool,
    poisoned: Option<String>,
    /// Commit syncs run since open (each may cover many callers' batches).
    syncs: u64,
    /// Records written since open, and how many of them a sync has claimed.
    records_written: u64,
    records_claimed: u64,
    /// Records the last sync covered plus those written while it ran.
    cohort: u64,
    /// How long the last sync took.
    last_sync: Duration,
}

impl State {
    fn move_to(&mut self, lsn: u64, file: &Arc<dyn StorageFile>) {
        debug_assert!(lsn >= self.written, "written positions only grow");
        self.written = lsn;
        self.file = Some(Arc::clone(file));
    }
}

#[derive(Debug)]
pub(crate) struct GroupCommit {
    state: Mutex<State>,
    synced: Condvar,
    /// Signals a gathering syncer that a record was written.
    joined: Condvar,
    /// The log writer's: commit syncs take turns with rotations' and snapshots'.
    sync_gate: Arc<SyncGate>,
}

impl GroupCommit {
    pub(crate) fn new(sync_gate: Arc<SyncGate>) -> Self {
        Self {
            state: Mutex::default(),
            synced: Condvar::new(),
            joined: Condvar::new(),
            sync_gate,
        }
    }

    /// Notes a batch record written up to `lsn` into `file`. Caller holds the writer lock.
    pub(crate) fn written(&self, lsn: u64, file: &Arc<dyn StorageFile>) {
        let mut s = self.state.lock();
        s.move_to(lsn, file);
        s.records_written += 1;
        if s.is_gathering && s.records_written - s.records_claimed >= s.cohort {
            self.joined.notify_one();
        }
    }

    /// Notes that the log now ends at `lsn`, in `file` (after a rotation).
    /// Caller holds the writer lock.
    pub(crate) fn moved_to(&self, lsn: u64, file: &Arc<dyn StorageFile>) {
        self.state.lock().move_to(lsn, file);
    }

    /// Notes that everything before `lsn` is durable and published.
    pub(crate) fn durable(&self, lsn: u64) {
        let mut s = self.state.lock();
        s.synced = s.synced.max(lsn);
        s.durable = s.durable.max(lsn);
        self.synced.notify_all();
    }

    /// Everything before this position is on stable storage.
    pub(crate) fn synced_lsn(&self) -> u64 {
        self.state.lock().synced
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
        // A gathering syncer stops waiting for records that will not come,
        // rather than at its deadline.
        self.joined.notify_all();
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
            // Durable first: a sync that covered `lsn` succeeded and its
            // batch was published, even if another writer's failure
            // poisoned the store meanwhile. A sync that covers `lsn` and
            // is still running or publishing decides it too: the caller
            // waits for its outcome rather than take the poisoning for it.
            if s.durable >= lsn {
                return Ok(());
            }
            let is_covered = s.synced >= lsn || s.sync_target.is_some_and(|t| t >= lsn);
            if let Some(reason) = s.poisoned.as_ref().filter(|_| !is_covered) {
                return Err(Error::Poisoned {
                    reason: reason.clone(),
                });
            }
            if s.is_syncing || s.synced >= lsn {
                // A sync is running, or one covered `lsn` and its syncer is
                // publishing. A running sync that does not cover `lsn` must
                // hand the turn on when it ends.
                let awaits_turn = s.synced < lsn && s.sync_target.is_some_and(|t| t < lsn);
                s.awaiting_turn += u32::from(awaits_turn);
                self.synced.wait(&mut s);
                s.awaiting_turn -= u32::from(awaits_turn);
                continue;
            }
            s.is_syncing = true;
            self.gather(&mut s);
            if s.poisoned.is_some() {
                s.is_syncing = false;
                self.synced.notify_all();
                continue;
            }
            let target = s.written;
            s.sync_target = Some(target);
            let claimed_before = s.records_claimed;
            s.records_claimed = s.records_written;
            let file = Arc::clone(
                s.file
                    .as_ref()
                    .expect("a position was written before anyone waits for it"),
            );
            let started = Instant::now();
            let synced =
                parking_lot::MutexGuard::unlocked(&mut s, || self.sync_gate.sync(file.as_ref()));
            s.is_syncing = false;
            s.sync_target = None;
            s.last_sync = started.elapsed();
            s.cohort = s.records_written - claimed_before;
            if let Err(e) = synced {
                // Poisoned before the marker, which takes syncs of its own.
                // A rotation or snapshot that syncs the segment meanwhile
                // is refused by the sync gate.
                s.poisoned.get_or_insert(format!("sync failed: {e}"));
                self.synced.notify_all();
                parking_lot::MutexGuard::unlocked(&mut s, || hooks.sync_failed());
                continue;
            }
            s.synced = s.synced.max(target);
            s.syncs += 1;
            if s.awaiting_turn > 0 {
                // Hand the next sync to a waiter while this one publishes.
                self.synced.notify_all();
            }
            parking_lot::MutexGuard::unlocked(&mut s, || hooks.published(target));
            s.durable = s.durable.max(target);
            self.synced.notify_all();
        }
    }

    /// Waits, as the next syncer, for as many records as the last sync saw
    /// (see the module comment).
    fn gather(&self, s: &mut parking_lot::MutexGuard<'_, State>) {
        let deadline = Instant::now() + s.last_sync;
        s.is_gathering = true;
        while s.records_written - s.records_claimed < s.cohort
            && s.poisoned.is_none()
            && !self.joined.wait_until(s, deadline).timed_out()
        {}
        s.is_gathering = false;
    }
}
