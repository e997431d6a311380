//! One gate for every sync of the active log segment.
//!
//! Linux reports a write-back error to one fsync of a file description
//! only: after a failed fsync the kernel may have dropped the dirty pages
//! and marked them clean, and the next fsync reports success. Group commit,
//! rotation and snapshots all sync the active segment, from different
//! threads; without a gate, one of them could sync in the instant after
//! another's failed sync, be told success for the dropped pages, and
//! publish batches that are not on the disk before the store is poisoned.
//!
//! So the syncs pass here one at a time, and once one has failed every
//! later one fails without syncing. The store poisons itself on any of
//! those errors, as on the first.

use std::io;

use parking_lot::Mutex;

use crate::storage::StorageFile;

/// Called after each sync through the gate, outside it.
pub(crate) type AfterSync = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
pub(crate) struct SyncGate {
    /// The first failure, once there was one.
    failed: Mutex<Option<String>>,
    /// Told when a sync has returned: the disk is idle for a moment (the
    /// zero filler's cue, `zero_fill.rs`).
    after_sync: Option<AfterSync>,
}

impl std::fmt::Debug for SyncGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncGate")
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl SyncGate {
    /// A gate that calls `after_sync` after each sync through it.
    pub(crate) fn new(after_sync: Option<AfterSync>) -> Self {
        Self {
            failed: Mutex::default(),
            after_sync,
        }
    }

    /// `file.sync_data()`, unless a sync through this gate failed before;
    /// holds the gate for the sync's whole duration.
    pub(crate) fn sync(&self, file: &dyn StorageFile) -> io::Result<()> {
        let synced = {
            let mut failed = self.failed.lock();
            if let Some(first) = failed.as_ref() {
                return Err(io::Error::other(format!(
                    "not synced: an earlier sync of the log failed ({first})"
                )));
            }
            file.sync_data()
                .inspect_err(|e| *failed = Some(e.to_string()))
        };
        if let Some(after_sync) = &self.after_sync {
            after_sync();
        }
        synced
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::storage::{Fault, FaultError, FaultyStorage, OpKind, OpenMode, Storage};

    #[test]
    fn after_a_failed_sync_no_sync_succeeds() {
        let storage = FaultyStorage::new();
        storage.create_dir_all(Path::new("/s")).unwrap();
        let file = storage
            .open(Path::new("/s/1.seg"), OpenMode::CreateNew)
            .unwrap();
        let gate = SyncGate::default();
        file.append(b"one").unwrap();
        gate.sync(file.as_ref()).unwrap();
        file.append(b"two").unwrap();
        storage.inject(Fault::new(OpKind::SyncData, FaultError::Io));
        assert!(gate.sync(file.as_ref()).is_err());
        // The disk would report success now (the failed sync dropped the
        // dirty pages); the gate does not ask it.
        file.sync_data().unwrap();
        let err = gate.sync(file.as_ref()).unwrap_err();
        assert!(err.to_string().contains("earlier sync"), "{err}");
    }
}
