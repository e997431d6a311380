//! Compaction, snapshots and closing: the store's work that is not a batch.
//!
//! All of it runs under the `maintenance` lock, one at a time, and never
//! holds the writer or index lock longer than a cut, a switch or the
//! writing of a snapshot. An automatic snapshot is installed (synced and
//! renamed into place) by the installer's thread after its caller returns;
//! whoever takes the maintenance lock next waits for that install first.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::installer::{Finished, Install, LogToSync};
use super::{Store, Writer};
use crate::compaction::{self, CompactionReport};
use crate::error::{Error, Result};
use crate::format::segment::FileKind;
use crate::format::state::StateEnd;
use crate::index::Index;
use crate::index::expiry::Ttls;
use crate::log::names::{SNAPSHOT_FILE, TMP_SUFFIX, segment_file_name};
use crate::log::segments::ValueRef;
use crate::options::Durability;
use crate::state_file::{self, Values};

/// Log bytes below which a clean close writes no snapshot: replaying them
/// costs less than writing it.
const SNAPSHOT_MIN_LOG_BYTES: u64 = 64 * 1024;

impl Store {
    /// Expires what is past its TTL and rewrites what is still live (rows,
    /// unexpired tombstones and seen ids, the batch registry, checkpoints,
    /// quarantine, add marks) from all sealed segments into one base
    /// segment, then deletes the segments it replaces. Readers and
    /// `apply_batch` go on while it runs; `pause` in the report is the
    /// longest they were held back.
    ///
    /// A crash at any point leaves a store that opens to the same state.
    ///
    /// # Errors
    /// `Io` or `Poisoned` when the disk fails; `Corruption` if a sealed
    /// segment fails its checksum.
    pub fn compact(&self) -> Result<CompactionReport> {
        let _maintenance = self.lock_maintenance();
        let started = Instant::now();
        let storage = self.options.storage.as_ref();
        let bytes_before = self.data_bytes();

        // Cut: seal the active segment; everything before it is compacted.
        let cut_started = Instant::now();
        let (cut, cut_lsn, now_ms) = {
            let mut guard = self.writer.lock();
            let writer = &mut *guard;
            self.commit.check()?;
            let file = writer
                .log
                .rotate()
                .inspect_err(|e| self.poison("segment rotation failed", e))?;
            let (cut, _, lsn) = writer.log.position();
            // Sealing synced everything before the cut: no batch below it stays pending.
            self.publish_locked(writer, lsn);
            self.commit.moved_to(lsn, &file);
            let path = self.dir.join(segment_file_name(cut));
            let map = file
                .map(self.maps_reserve())
                .map_err(|e| Error::io("map", path, e))
                .inspect_err(|e| self.poison("map failed", e))?;
            self.maps.insert(cut, Arc::clone(&file), map);
            (cut, lsn, self.read_index().log_time_ms)
        };
        let mut pause = cut_started.elapsed();

        let read_value = |v| self.maps.read_copy(v);
        let mut rewritten =
            compaction::rewrite(storage, &self.dir, self.ttls(), cut, now_ms, &read_value)?;
        let base_id = rewritten.base_id;
        let base_path = self.dir.join(segment_file_name(base_id));

        // The switch. A snapshot refers to the old segments: it goes first,
        // durably, so that no crash can pair it with the base.
        self.remove_snapshot()?;
        storage
            .rename(&rewritten.tmp_path, &base_path)
            .map_err(|e| Error::io("rename", &rewritten.tmp_path, e))?;

        // From here the file named `B.seg` is the base: memory switches to
        // it at once, and any later failure poisons the store, so that
        // nothing (no close-time snapshot above all) pairs the old layout
        // with the new files.
        let switch_started = Instant::now();
        let purged;
        {
            let mut writer = self.writer.lock();
            writer.pending.forget_delta();
            // The base covers everything before the cut: a snapshot now
            // would spare the next open only what came after it.
            writer.saved_at(cut_lsn);
            let mut index = self.index.write();
            let mut moved = rewritten
                .state
                .keys
                .range_prefix(b"")
                .filter_map(|(k, e)| Some((k, e.value()?)))
                .peekable();
            index.keys.relocate(|key, value| {
                if value.segment >= cut {
                    return None;
                }
                while moved.next_if(|(k, _)| *k < key).is_some() {}
                let (k, to) = moved
                    .next()
                    .expect("every live value below the cut is in the base");
                assert_eq!(k, key, "the base holds the live key being moved");
                // The same bytes, copied: their fingerprint holds.
                Some(ValueRef {
                    fingerprint: value.fingerprint,
                    ..to
                })
            });
            // At the cut's time, as the base was: a batch committed since
            // has moved the live clock on, and purging at that later time
            // dropped entries the base keeps, so that `log` and `stats`
            // changed across the next reopen.
            purged = index.purge_expired(now_ms);
            self.maps
                .insert(base_id, Arc::clone(&rewritten.file), rewritten.map.clone());
            self.maps.remove_below(base_id);
        }
        pause = pause.max(switch_started.elapsed());
        // The base's own index served the switch; the heap it frees goes
        // back to the system.
        drop(std::mem::take(&mut rewritten.state));
        return_free_memory();

        let finish = || -> Result<()> {
            self.sync_dir()?;
            for &id in rewritten
                .replaced_segments
                .iter()
                .filter(|&&id| id < base_id)
            {
                let path = self.dir.join(segment_file_name(id));
                storage
                    .remove_file(&path)
                    .map_err(|e| Error::io("remove", &path, e))?;
            }
            self.sync_dir()
        };
        finish().inspect_err(|e| self.poison("compaction failed after its switch", e))?;

        // Mapped whole (`compaction::rewrite`): no stat that could fail
        // a compaction already done.
        let base_bytes = rewritten.map.len() as u64;
        Ok(CompactionReport {
            seen_ids_dropped: purged.seen_ids,
            batch_ids_dropped: purged.batch_ids,
            tombstones_dropped: purged.tombstones,
            segments_replaced: rewritten.replaced_segments.len() as u64,
            dead_bytes: rewritten.replaced_bytes.saturating_sub(base_bytes),
            bytes_before,
            bytes_after: self.data_bytes(),
            pause,
            duration: started.elapsed(),
        })
    }

    /// Writes a snapshot of the index, so that the next `open` replays only
    /// the log written after it, and returns once it is durable. Writers
    /// wait while the index is written out (to the page cache); the file's
    /// sync and rename happen after they resume, on this thread.
    ///
    /// # Errors
    /// `Io` or `Poisoned` when the disk fails.
    pub fn snapshot(&self) -> Result<()> {
        let _maintenance = self.lock_maintenance();
        let install = self.snapshot_locked()?;
        let installed = install.run();
        note_installed(&mut self.writer.lock(), (install.lsn, installed))
    }

    /// Writes a snapshot if enough log was written since the last one (see
    /// [`Options::snapshot_log_bytes`](crate::Options::snapshot_log_bytes)),
    /// unless compaction or another snapshot is running, and leaves its
    /// install to the installer. Called after a batch committed; a failure
    /// here is not the batch's (a failed sync of the log still poisons the
    /// store).
    pub(super) fn snapshot_if_due(&self) {
        let Some(_maintenance) = self.maintenance.try_lock() else {
            return;
        };
        // Never waits for an install: one still running means none is due.
        if self.is_snapshot_due(&mut self.writer.lock()) {
            match self.snapshot_locked() {
                Ok(install) => self.installer.start(install),
                Err(_) => self.writer.lock().snapshot_failed(),
            }
        }
    }

    /// Whether `apply_batch` should write a snapshot now: no install is
    /// running, and the log since the last snapshot (and since the last
    /// that failed) reached `snapshot_log_bytes` and that snapshot's size,
    /// so that snapshots never write more bytes than the log they spare,
    /// nor are rewritten after every batch while the disk refuses them.
    /// Notes an install that has ended.
    pub(super) fn is_snapshot_due(&self, writer: &mut Writer) -> bool {
        if self.installer.is_outstanding() {
            match self.installer.take_finished() {
                Some(finished) => {
                    let _ = note_installed(writer, finished);
                }
                None => return false,
            }
        }
        self.options.snapshot_log_bytes.is_some_and(|every| {
            let needed = every.max(writer.last_snapshot_bytes);
            writer.unsaved_log_bytes() >= needed
                && writer.log_bytes_since_failed_snapshot() >= needed
        })
    }

    /// Takes the maintenance lock, once the running install has ended.
    pub(super) fn lock_maintenance(&self) -> parking_lot::MutexGuard<'_, ()> {
        let maintenance = self.maintenance.lock();
        self.settle_install();
        maintenance
    }

    /// Waits for the running install and notes how it ended. Its failure
    /// is no caller's: the snapshot is simply due again later.
    fn settle_install(&self) {
        if let Some(finished) = self.installer.settle() {
            let _ = note_installed(&mut self.writer.lock(), finished);
        }
    }

    /// Writes `SNAPSHOT.tmp`; returns what installs it.
    fn snapshot_locked(&self) -> Result<Install> {
        self.commit.check()?;
        // Under `Sync` the snapshot may only cover what is durable and
        // published, so the log is synced before the index is written out.
        // Under `Buffered` every batch written is in the index already: the
        // install syncs the log, before the snapshot goes in place.
        let is_log_synced_first = self.options.durability == Durability::Sync;
        if is_log_synced_first {
            // The bulk first, before writers are held back; the sync under
            // the writer lock then only flushes what came since.
            let (active, active_id, sync_gate) = {
                let writer = self.writer.lock();
                (
                    Arc::clone(writer.log.active_file()),
                    writer.log.position().0,
                    Arc::clone(writer.log.sync_gate()),
                )
            };
            sync_gate
                .sync(active.as_ref())
                .map_err(|e| Error::io("sync", self.dir.join(segment_file_name(active_id)), e))
                .inspect_err(|e| self.poison("snapshot sync failed", e))?;
        }
        let (file, lsn, log) = {
            let mut guard = self.writer.lock();
            let writer = &mut *guard;
            self.commit.check()?;
            let (segment, offset, lsn) = writer.log.position();
            let path = self.dir.join(segment_file_name(segment));
            let log = if is_log_synced_first {
                writer
                    .log
                    .sync_gate()
                    .sync(writer.log.active_file().as_ref())
                    .map_err(|e| Error::io("sync", &path, e))
                    .inspect_err(|e| self.poison("snapshot sync failed", e))?;
                self.publish_locked(writer, lsn);
                None
            } else {
                Some(LogToSync {
                    file: Arc::clone(writer.log.active_file()),
                    path,
                    sync_gate: Arc::clone(writer.log.sync_gate()),
                    commit: Arc::clone(&self.commit),
                })
            };
            let first_segment = self.maps.first_id().unwrap_or(segment);
            let index = self.read_index();
            let end = StateEnd {
                covered_segment: segment,
                covered_offset: offset,
                first_segment,
                ..StateEnd::default()
            };
            (self.write_snapshot_tmp(&index, end)?, lsn, log)
        };
        Ok(Install {
            storage: Arc::clone(&self.options.storage),
            file,
            tmp: self.snapshot_tmp_path(),
            path: self.dir.join(SNAPSHOT_FILE),
            dir: self.dir.clone(),
            lsn,
            log,
        })
    }

    /// Closes the store, writing a snapshot first if it would spare the next
    /// open at least 64 KiB of log replay, and cutting the newest segment's
    /// unused preallocated space off. Under `Durability::Buffered` it then
    /// syncs the log, so that every batch survives a power loss after a
    /// clean close (dropping the store does the same, ignoring errors).
    ///
    /// # Errors
    /// As [`Store::snapshot`], or `Io` if the cut or the sync fails; the
    /// store is closed either way.
    pub fn close(self) -> Result<()> {
        self.settle_install();
        let snapshot = if self.is_snapshot_worth_writing() {
            self.snapshot()
        } else {
            Ok(())
        };
        let log_closed = self.close_log();
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        snapshot.and(log_closed)
    }

    /// Cuts the newest segment's unused preallocated space off, so that a
    /// closed store's files end at their last record, and under `Buffered`
    /// syncs it: a clean close makes every batch durable. A poisoned
    /// store's files are left as they are.
    fn close_log(&self) -> Result<()> {
        if self.commit.check().is_err() {
            return Ok(());
        }
        let mut writer = self.writer.lock();
        writer.log.trim()?;
        if self.options.durability == Durability::Buffered {
            let (segment, _, _) = writer.log.position();
            writer
                .log
                .sync_gate()
                .sync(writer.log.active_file().as_ref())
                .map_err(|e| Error::io("sync", self.dir.join(segment_file_name(segment)), e))
                .inspect_err(|e| self.poison("close sync failed", e))?;
        }
        Ok(())
    }

    /// Whether enough log would be replayed at the next open to pay for a
    /// snapshot (which also costs disk: it repeats the seen ids a base
    /// segment holds).
    pub(super) fn is_snapshot_worth_writing(&self) -> bool {
        self.commit.check().is_ok()
            && self.writer.lock().unsaved_log_bytes() >= SNAPSHOT_MIN_LOG_BYTES
    }

    fn snapshot_tmp_path(&self) -> std::path::PathBuf {
        self.dir.join(format!("{SNAPSHOT_FILE}{TMP_SUFFIX}"))
    }

    /// Writes the index to `SNAPSHOT.tmp`, unsynced.
    fn write_snapshot_tmp(
        &self,
        index: &Index,
        end: StateEnd,
    ) -> Result<Arc<dyn crate::storage::StorageFile>> {
        state_file::write(
            self.options.storage.as_ref(),
            &self.snapshot_tmp_path(),
            FileKind::Snapshot,
            0,
            index,
            &Values::Refs,
            end,
        )
    }

    /// Bytes of the log's files and the snapshot, the active segment's
    /// only up to its records: the space reserved ahead of them (zeros
    /// under `zero_fill`) is cut off at close, so that a compaction's
    /// report would otherwise show a store it shrank as grown.
    fn data_bytes(&self) -> u64 {
        let writer = self.writer.lock();
        let (files, _) = self.maps.disk_bytes();
        let (_, records_end, _) = writer.log.position();
        let reserved = writer
            .log
            .active_file()
            .len()
            .map_or(0, |len| len.saturating_sub(records_end));
        files.saturating_sub(reserved) + self.snapshot_bytes()
    }

    /// Bytes of the snapshot file, if there is one.
    pub(super) fn snapshot_bytes(&self) -> u64 {
        let path = self.dir.join(SNAPSHOT_FILE);
        self.options
            .storage
            .open(&path, crate::storage::OpenMode::Read)
            .and_then(|f| f.len())
            .unwrap_or(0)
    }

    fn remove_snapshot(&self) -> Result<()> {
        let path = self.dir.join(SNAPSHOT_FILE);
        match self.options.storage.remove_file(&path) {
            // Also when there is none: an earlier compaction that removed
            // it may have failed at the directory sync that made the
            // removal durable, and the rename that follows must not reach
            // the disk before it.
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.sync_dir(),
            Err(e) => Err(Error::io("remove", path, e)),
        }
    }

    fn sync_dir(&self) -> Result<()> {
        self.options
            .storage
            .sync_dir(&self.dir)
            .map_err(|e| Error::io("sync directory", &self.dir, e))
    }

    pub(super) fn ttls(&self) -> Ttls {
        Ttls::new(
            self.options.seen_ttl,
            self.options.batch_ttl,
            self.options.tombstone_ttl,
        )
    }
}

impl Drop for Store {
    /// Does what [`Store::close`] does; errors are ignored here, because
    /// the snapshot only saves time at the next open, the next open
    /// takes a segment's unused preallocated space for its end, and a
    /// failed sync leaves its note for the next open (see `poison`).
    fn drop(&mut self) {
        if !self.closed.load(std::sync::atomic::Ordering::SeqCst) {
            self.settle_install();
            if self.is_snapshot_worth_writing() {
                let _ = self.snapshot();
            }
            let _ = self.close_log();
        }
    }
}

/// Hands the heap's free memory back to the system. A compaction frees
/// an index as large as the live one, twice (the state it rebuilt and the
/// base's, read back), while the live one stays; glibc keeps most of that
/// for later allocations (freeing a large block raises the size above which
/// it maps blocks of their own), and the process went on holding 40 MiB of
/// free heap after a W1 store's compaction.
fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only hands free memory back, under the
    // allocator's own locks; its result says whether there was any.
    #[expect(unsafe_code, reason = "malloc_trim has no safe wrapper")]
    let _ = unsafe { libc::malloc_trim(0) };
}

/// Notes an install's end in the writer's counts of log bytes since the
/// last snapshot and since the last that failed; its error, if it failed.
fn note_installed(writer: &mut Writer, (lsn, installed): Finished) -> Result<()> {
    let bytes = installed.inspect_err(|_| writer.snapshot_failed())?;
    writer.saved_at(lsn);
    writer.last_snapshot_bytes = bytes;
    writer.failed_snapshot_at = None;
    Ok(())
}
