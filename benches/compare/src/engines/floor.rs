//! The two floors.
//!
//! - CPU floor: SPEC section 3 in std `HashMap`s with owned keys, no log, no
//!   durability. A batch writes straight into the maps and keeps an undo log,
//!   so that a refused batch changes nothing, as everywhere else.
//! - Disk floor: each batch's deliveries serialized and appended to one file,
//!   synced in durable mode; no logic at all, so no state and no digest.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;

use idemkv::{Batch, BatchReport, Op};
use std::sync::Mutex;

use super::{Engine, Mode};
use crate::semantics::{DigestBuilder, Refused, content_hash, parse_counter, payload_hash, static_problem};

#[derive(Debug, Clone)]
struct Row {
    seq: u64,
    /// `None`: tombstone.
    value: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    rows: HashMap<Vec<u8>, Row>,
    seen: HashMap<Vec<u8>, u64>,
    batches: HashMap<Vec<u8>, (u128, BatchReport)>,
    checkpoints: HashMap<Vec<u8>, Vec<u8>>,
}

pub struct CpuFloor {
    state: Mutex<State>,
}

impl CpuFloor {
    pub fn open() -> Self {
        Self {
            state: Mutex::new(State::default()),
        }
    }
}

impl State {
    fn apply(&mut self, batch: &Batch) -> Result<BatchReport, Refused> {
        let content = content_hash(batch);
        if let Some((stored, report)) = self.batches.get(batch.id()) {
            if *stored != content {
                return Err(Refused::BatchConflict);
            }
            return Ok(BatchReport {
                replayed: true,
                ..*report
            });
        }
        // Writes go straight into the maps; the undo log puts back what a
        // refused batch changed.
        let mut undo_rows: Vec<(&[u8], Option<Row>)> = Vec::new();
        let mut undo_seen: Vec<&[u8]> = Vec::new();
        let result = self.apply_in_place(batch, &mut undo_rows, &mut undo_seen);
        if result.is_err() {
            for id in undo_seen {
                self.seen.remove(id);
            }
            for (key, old) in undo_rows.into_iter().rev() {
                match old {
                    Some(row) => {
                        self.rows.insert(key.to_vec(), row);
                    }
                    None => {
                        self.rows.remove(key);
                    }
                }
            }
            return result;
        }
        let report = result?;
        self.batches.insert(batch.id().to_vec(), (content, report));
        for (source, position) in batch.checkpoints() {
            self.checkpoints.insert(source.to_vec(), position.to_vec());
        }
        Ok(report)
    }

    fn apply_in_place<'b>(
        &mut self,
        batch: &'b Batch,
        undo_rows: &mut Vec<(&'b [u8], Option<Row>)>,
        undo_seen: &mut Vec<&'b [u8]>,
    ) -> Result<BatchReport, Refused> {
        let mut report = BatchReport::default();
        for (index, d) in batch.deliveries().iter().enumerate() {
            if let Some(reason) = static_problem(d) {
                return Err(Refused::InvalidEvent { index, reason });
            }
            let payload = payload_hash(d);
            if let Some(&seen) = self.seen.get(&d.event_id[..]) {
                if seen == payload {
                    report.duplicates += 1;
                    continue;
                }
                return Err(Refused::ConflictingEvent { index });
            }
            let current = self.rows.get_mut(&d.key[..]);
            let version = current.as_ref().map(|r| r.seq);
            let new_row = match &d.op {
                Op::Add(delta) => {
                    let live = current.as_ref().and_then(|r| r.value.as_deref());
                    let base = match live {
                        None => 0,
                        Some(v) => parse_counter(v).ok_or_else(|| Refused::InvalidEvent {
                            index,
                            reason: "delta on a non-counter value".into(),
                        })?,
                    };
                    let sum = base.checked_add(*delta).ok_or_else(|| Refused::InvalidEvent {
                        index,
                        reason: "counter overflow".into(),
                    })?;
                    report.added += 1;
                    Some(Row {
                        seq: version.map_or(d.seq, |v| v.max(d.seq)),
                        value: Some(sum.to_string().into_bytes()),
                    })
                }
                _ if version.is_some_and(|v| d.seq <= v) => {
                    report.stale += 1;
                    None
                }
                Op::Delete => {
                    report.deleted += 1;
                    Some(Row {
                        seq: d.seq,
                        value: None,
                    })
                }
                Op::Put(value) => match current {
                    // Unchanged: the version advances, the value stays.
                    Some(row) if row.value.as_deref() == Some(&value[..]) => {
                        report.unchanged += 1;
                        let old = Row {
                            seq: row.seq,
                            value: row.value.clone(),
                        };
                        row.seq = d.seq;
                        undo_rows.push((&d.key[..], Some(old)));
                        None
                    }
                    Some(row) => {
                        if row.value.is_some() {
                            report.updated += 1;
                        } else {
                            report.inserted += 1;
                        }
                        Some(Row {
                            seq: d.seq,
                            value: Some(value.to_vec()),
                        })
                    }
                    None => {
                        report.inserted += 1;
                        Some(Row {
                            seq: d.seq,
                            value: Some(value.to_vec()),
                        })
                    }
                },
                Op::Malformed { .. } => unreachable!("refused by the static checks"),
            };
            if let Some(row) = new_row {
                let old = match self.rows.get_mut(&d.key[..]) {
                    Some(slot) => Some(std::mem::replace(slot, row)),
                    None => self.rows.insert(d.key.to_vec(), row),
                };
                undo_rows.push((&d.key[..], old));
            }
            self.seen.insert(d.event_id.to_vec(), payload);
            undo_seen.push(&d.event_id[..]);
        }
        Ok(report)
    }
}

impl Engine for CpuFloor {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        self.state.lock().expect("lock").apply(batch)
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        let state = self.state.lock().expect("lock");
        let row = state.rows.get(key)?;
        Some((row.seq, row.value.clone()?))
    }

    fn digest(&self) -> Option<u128> {
        let state = self.state.lock().expect("lock");
        let mut live: Vec<(&Vec<u8>, &Row)> = state.rows.iter().filter(|(_, r)| r.value.is_some()).collect();
        live.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut d = DigestBuilder::new();
        for (k, r) in live {
            d.row(k, r.seq, r.value.as_deref().unwrap_or_default());
        }
        let mut ck: Vec<_> = state.checkpoints.iter().collect();
        ck.sort();
        for (s, p) in ck {
            d.checkpoint(s, p);
        }
        Some(d.finish())
    }
}

pub struct DiskFloor {
    file: Mutex<(File, Vec<u8>)>,
    mode: Mode,
}

impl DiskFloor {
    pub fn open(dir: &Path, mode: Mode) -> Self {
        std::fs::create_dir_all(dir).expect("create dir");
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("deliveries.log"))
            .expect("open log");
        Self {
            file: Mutex::new((file, Vec::with_capacity(1 << 20))),
            mode,
        }
    }
}

impl Engine for DiskFloor {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        let io = |e: std::io::Error| Refused::Other(e.to_string());
        let mut guard = self.file.lock().expect("lock");
        let (file, buf) = &mut *guard;
        crate::semantics::serialize_batch(batch, buf);
        file.write_all(buf).map_err(io)?;
        if self.mode == Mode::Durable {
            file.sync_data().map_err(io)?;
        }
        // No logic: every delivery is counted as if new.
        Ok(BatchReport {
            inserted: batch.len() as u64,
            ..BatchReport::default()
        })
    }

    fn get(&self, _key: &[u8]) -> Option<(u64, Vec<u8>)> {
        None
    }

    fn digest(&self) -> Option<u128> {
        None
    }
}
