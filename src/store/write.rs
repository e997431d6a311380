//! `apply_batch`: plan against the index, encode one record, append it,
//! apply it to the index, then wait for the group sync.

use std::sync::Arc;

use super::{PlanView, Store};
use crate::apply::classify::hash_batch;
use crate::apply::plan::{PlanOptions, plan};
use crate::batch::{Batch, BatchReport};
use crate::error::{Error, Result, display_id};
use crate::format::record::{self, KIND_BATCH, QuarantineView};
use crate::format::{ID_BYTES_MAX, POSITION_BYTES_MAX, RECORD_BODY_BYTES_MAX};
use crate::log::names::segment_file_name;
use crate::options::Durability;

fn invalid_batch(batch: &Batch, reason: impl Into<String>) -> Error {
    Error::InvalidBatch {
        batch_id: display_id(batch.id()),
        reason: reason.into(),
    }
}

/// Checks what belongs to the batch as a whole.
fn validate(batch: &Batch) -> Result<()> {
    if batch.id().is_empty() {
        return Err(invalid_batch(batch, "empty batch id"));
    }
    if batch.id().len() > ID_BYTES_MAX {
        return Err(invalid_batch(
            batch,
            format!("batch id longer than {ID_BYTES_MAX} bytes"),
        ));
    }
    for (source, position) in batch.checkpoints() {
        if source.is_empty() || source.len() > ID_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!("checkpoint source must be 1 to {ID_BYTES_MAX} bytes"),
            ));
        }
        if position.len() > POSITION_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!("checkpoint position longer than {POSITION_BYTES_MAX} bytes"),
            ));
        }
    }
    Ok(())
}

impl Store {
    /// Applies a batch: all of it in one log record, or nothing.
    ///
    /// Each delivery is counted once in the report (SPEC section 3). A batch
    /// id that already committed with the same content returns the stored
    /// report with `replayed = true` and changes nothing. Under
    /// `Durability::Sync` the batch is on stable storage when this returns.
    ///
    /// ```
    /// # fn main() -> Result<(), idemkv::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = idemkv::Store::open(dir.path(), idemkv::Options::default())?;
    /// let batch = idemkv::Batch::new("B1").put("e1", "k", 1, "v").add("e2", "visits", 1, 5);
    /// let first = store.apply_batch(&batch)?;
    /// assert_eq!((first.inserted, first.added, first.replayed), (1, 1, false));
    /// let again = store.apply_batch(&batch)?;
    /// assert!(again.replayed);
    /// assert_eq!(&store.get("visits")?.unwrap().value[..], b"5");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `ConflictingEvent` / `InvalidEvent` under `OnConflict::Fail`,
    /// `BatchConflict` for a reused batch id, `InvalidBatch` for a bad batch
    /// id or checkpoint, `Io` or `Poisoned` when the disk fails. On any error
    /// nothing of the batch is applied.
    pub fn apply_batch(&self, batch: &Batch) -> Result<BatchReport> {
        validate(batch)?;
        let (content_hash, hashes) = hash_batch(batch);
        let mut writer = self.writer.lock();
        self.commit.check()?;

        let planned = {
            let index = self.index.read();
            if let Some(committed) = index.batches.get(batch.id()) {
                if committed.content_hash != content_hash {
                    return Err(Error::BatchConflict {
                        batch_id: display_id(batch.id()),
                    });
                }
                let report = BatchReport {
                    replayed: true,
                    ..committed.report
                };
                drop(index);
                // The original may still be waiting for its sync.
                let lsn = self.commit.written_lsn();
                drop(writer);
                self.wait_durable(lsn)?;
                return Ok(report);
            }
            let options = PlanOptions {
                on_conflict: self.options.on_conflict,
                value_bytes_max: self.options.value_bytes_max,
            };
            plan(
                batch,
                &hashes,
                &PlanView {
                    index: &index,
                    maps: &self.maps,
                },
                options,
            )?
        };

        let committed_ms = self.options.clock.now_ms();
        let buf = writer.begin();
        record::encode_batch_head(
            buf,
            batch.id(),
            content_hash,
            committed_ms,
            planned.report.counts(),
        );
        record::encode_seen(buf, &planned.seen);
        record::encode_writes_count(buf, planned.writes.len());
        for w in &planned.writes {
            record::encode_write(buf, w.key, w.seq, w.op);
        }
        record::encode_checkpoints(
            buf,
            batch.checkpoints().iter().map(|(s, p)| (&s[..], &p[..])),
        );
        let rejects: Vec<QuarantineView<'_>> = planned
            .rejects
            .iter()
            .map(|r| QuarantineView {
                index: r.index,
                event_id: r.event_id,
                reason: r.reason.as_bytes(),
            })
            .collect();
        record::encode_quarantine(buf, &rejects);
        if writer.body().len() > RECORD_BODY_BYTES_MAX {
            return Err(invalid_batch(
                batch,
                format!(
                    "record of {} bytes exceeds {RECORD_BODY_BYTES_MAX}",
                    writer.body().len()
                ),
            ));
        }

        let appended = writer
            .append(KIND_BATCH)
            .inspect_err(|e| self.commit.poison(format!("append failed: {e}")))?;
        if let Some(file) = &appended.new_segment {
            // Rotation synced the sealed segment: all before this record is durable.
            self.commit.durable(
                appended.lsn_end
                    - (writer.body().len() + crate::format::segment::FRAME_HEADER_LEN) as u64,
            );
            let map = file
                .map(self.maps_reserve())
                .map_err(|e| {
                    Error::io("map", self.dir.join(segment_file_name(appended.segment)), e)
                })
                .inspect_err(|e| self.commit.poison(format!("map failed: {e}")))?;
            self.maps.insert(appended.segment, Arc::clone(file), map);
        }
        let written = record::decode_batch(writer.body()).expect("a record we encoded decodes");
        self.index
            .write()
            .apply_record(&written, appended.segment, appended.body_at)
            .expect("a planned record applies to the index it was planned against");
        self.commit.written(appended.lsn_end, writer.active().1);
        drop(writer);

        self.wait_durable(appended.lsn_end)?;
        Ok(planned.report)
    }

    fn wait_durable(&self, lsn: u64) -> Result<()> {
        match self.options.durability {
            Durability::Sync => self.commit.wait_durable(lsn),
            Durability::Buffered => Ok(()),
        }
    }

    fn maps_reserve(&self) -> u64 {
        self.options
            .segment_bytes_max
            .saturating_add(super::MAP_SLACK_BYTES)
    }
}
