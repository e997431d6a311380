//! Reading the whole log back: open (replay), verify (check only) and repair
//! (salvage the longest valid prefix). All three walk the log the same way.
//!
//! | case                                              | open              | verify     | repair          |
//! |---------------------------------------------------|-------------------|------------|-----------------|
//! | torn or checksum-failing final record, newest seg | truncated, dropped| Corruption | cut there       |
//! | newest segment with a torn header and no records  | header rewritten  | Corruption | segment dropped |
//! | bad record or header anywhere else                | Corruption        | Corruption | cut there       |
//! | record that decodes badly or contradicts the index| Corruption        | Corruption | cut there       |
//! | a segment id missing from the sequence            | Corruption        | Corruption | cut there       |
//!
//! "Cut" moves the dropped bytes into `lost+found/<repair time in ms>/`
//! rather than deleting them, so that no repair overwrites an earlier one's.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::format::record::decode_batch;
use crate::format::segment::{SEGMENT_HEADER_LEN, decode_segment_header, encode_segment_header};
use crate::index::Index;
use crate::log::names::{parse_segment_file_name, segment_file_name};
use crate::log::reader::SegmentReader;
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::store::RepairReport;

/// One segment as the walk left it.
#[derive(Debug)]
pub(crate) struct WalkedSegment {
    pub id: u32,
    pub file: Arc<dyn StorageFile>,
    /// Bytes up to the end of the last valid record.
    pub valid_len: u64,
}

/// Where and why a walk stopped early.
#[derive(Debug)]
pub(crate) struct Problem {
    pub segment: u32,
    pub offset: u64,
    pub reason: Cow<'static, str>,
    /// The problem is in the newest segment and nothing valid follows it:
    /// a write cut short by a crash.
    pub is_tail: bool,
}

impl Problem {
    fn into_error(self) -> Error {
        Error::Corruption {
            segment: u64::from(self.segment),
            file: segment_file_name(self.segment),
            offset: self.offset,
            reason: self.reason.into_owned(),
        }
    }
}

/// The result of walking the log.
#[derive(Debug)]
pub(crate) struct Walk {
    /// Segments walked, in order; the last may be where the problem is.
    pub segments: Vec<WalkedSegment>,
    pub records: u64,
    pub problem: Option<Problem>,
}

/// Segment ids in the directory, ascending.
pub(crate) fn list_segments(storage: &dyn Storage, dir: &Path) -> Result<Vec<u32>> {
    let names = storage
        .list_dir(dir)
        .map_err(|e| Error::io("list", dir, e))?;
    let mut ids: Vec<u32> = names
        .iter()
        .filter_map(|n| parse_segment_file_name(n))
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Walks every record of every segment in order, replaying each into `index`.
/// Opens the newest segment for appending when `writable`.
pub(crate) fn walk(
    storage: &dyn Storage,
    dir: &Path,
    index: &mut Index,
    writable: bool,
) -> Result<Walk> {
    let ids = list_segments(storage, dir)?;
    let mut walk = Walk {
        segments: Vec::new(),
        records: 0,
        problem: None,
    };
    let mut expected = ids.first().copied();
    for (i, &id) in ids.iter().enumerate() {
        let is_last = i + 1 == ids.len();
        if Some(id) != expected {
            let missing = expected.unwrap_or(id);
            walk.problem = Some(Problem {
                segment: missing,
                offset: 0,
                reason: "segment file missing".into(),
                is_tail: false,
            });
            break;
        }
        expected = id.checked_add(1);
        let path = dir.join(segment_file_name(id));
        let mode = if is_last && writable {
            OpenMode::Append
        } else {
            OpenMode::Read
        };
        let file = storage
            .open(&path, mode)
            .map_err(|e| Error::io("open", &path, e))?;
        let map = file.map(0).map_err(|e| Error::io("map", &path, e))?;
        let mut segment = WalkedSegment {
            id,
            file,
            valid_len: 0,
        };

        if let Err(reason) = decode_segment_header(&map, id) {
            let is_tail = is_last && map.len() <= SEGMENT_HEADER_LEN;
            walk.problem = Some(Problem {
                segment: id,
                offset: 0,
                reason: reason.into(),
                is_tail,
            });
            walk.segments.push(segment);
            break;
        }
        let mut reader = SegmentReader::new(&map, id);
        for item in reader.by_ref() {
            let replayed = item
                .map_err(|bad| Problem {
                    segment: id,
                    offset: bad.offset,
                    reason: bad.reason.into(),
                    is_tail: is_last && bad.is_tail,
                })
                .and_then(|record| {
                    let problem = |offset: u64, reason: &'static str| Problem {
                        segment: id,
                        offset,
                        reason: reason.into(),
                        is_tail: false,
                    };
                    let batch = decode_batch(record.body).map_err(|e| {
                        problem(u64::from(record.body_at) + e.offset as u64, e.what)
                    })?;
                    index
                        .apply_record(&batch, id, record.body_at)
                        .map_err(|reason| problem(u64::from(record.offset), reason))
                });
            if let Err(problem) = replayed {
                walk.problem = Some(problem);
                break;
            }
            walk.records += 1;
        }
        segment.valid_len = match &walk.problem {
            Some(p) => p.offset,
            None => reader.position(),
        };
        walk.segments.push(segment);
        if walk.problem.is_some() {
            break;
        }
    }
    Ok(walk)
}

/// Replays the log for `open`. A torn tail of the newest segment is cut off
/// (and the cut synced); anything else wrong is `Corruption`.
///
/// Returns the walk and the number of torn bytes discarded.
pub(crate) fn recover(storage: &dyn Storage, dir: &Path, index: &mut Index) -> Result<(Walk, u64)> {
    let mut walk = walk(storage, dir, index, true)?;
    let mut torn_bytes = 0;
    if let Some(problem) = walk.problem.take() {
        if !problem.is_tail {
            return Err(problem.into_error());
        }
        let segment = walk
            .segments
            .last()
            .expect("a tail problem is in a walked segment");
        let path = dir.join(segment_file_name(segment.id));
        let len = segment
            .file
            .len()
            .map_err(|e| Error::io("stat", &path, e))?;
        torn_bytes = len - problem.offset;
        if problem.offset < SEGMENT_HEADER_LEN as u64 {
            // The segment's creation was cut short: write its header again.
            segment
                .file
                .set_len(0)
                .map_err(|e| Error::io("truncate", &path, e))?;
            segment
                .file
                .append(&encode_segment_header(segment.id))
                .map_err(|e| Error::io("write", &path, e))?;
        } else {
            segment
                .file
                .set_len(problem.offset)
                .map_err(|e| Error::io("truncate", &path, e))?;
        }
        segment
            .file
            .sync_data()
            .map_err(|e| Error::io("sync", &path, e))?;
        if let Some(s) = walk.segments.last_mut() {
            s.valid_len = s.valid_len.max(SEGMENT_HEADER_LEN as u64);
        }
    }
    Ok((walk, torn_bytes))
}

/// Directory that repair moves dropped bytes into.
pub(crate) const LOST_FOUND_DIR: &str = "lost+found";

/// Cuts the log at its first problem, keeping the longest valid prefix. The
/// dropped bytes are moved into `lost+found/`, not deleted.
pub(crate) fn repair(storage: &dyn Storage, dir: &Path, now_ms: u64) -> Result<RepairReport> {
    let all_ids = list_segments(storage, dir)?;
    let mut scratch = Index::default();
    let walk = walk(storage, dir, &mut scratch, true)?;
    let mut report = RepairReport {
        records_kept: walk.records,
        ..RepairReport::default()
    };
    let Some(problem) = walk.problem else {
        return Ok(report);
    };
    report.first_bad = Some((u64::from(problem.segment), problem.offset));
    let lost = dir.join(LOST_FOUND_DIR).join(now_ms.to_string());
    storage
        .create_dir_all(&lost)
        .map_err(|e| Error::io("create directory", &lost, e))?;
    report.lost_found = Some(lost.clone());

    // The segment holding the problem keeps its valid prefix, if it has one.
    let cut_segment = walk.segments.iter().find(|s| s.id == problem.segment);
    let mut first_dropped = problem.segment;
    if let Some(s) = cut_segment {
        let path = dir.join(segment_file_name(s.id));
        let map = s.file.map(0).map_err(|e| Error::io("map", &path, e))?;
        if problem.offset >= SEGMENT_HEADER_LEN as u64 {
            let tail = map.get(problem.offset as usize..).unwrap_or_default();
            let tail_path = lost.join(format!(
                "{}.{}.tail",
                segment_file_name(s.id),
                problem.offset
            ));
            write_new_file(storage, &tail_path, tail)?;
            report.bytes_dropped += tail.len() as u64;
            // The walk opened segments before the newest read-only.
            let file = storage
                .open(&path, OpenMode::Append)
                .map_err(|e| Error::io("open", &path, e))?;
            file.set_len(problem.offset)
                .map_err(|e| Error::io("truncate", &path, e))?;
            file.sync_data()
                .map_err(|e| Error::io("sync", &path, e))?;
            first_dropped = s.id.saturating_add(1);
        }
    }
    for &id in all_ids.iter().filter(|&&id| id >= first_dropped) {
        let from = dir.join(segment_file_name(id));
        let to = lost.join(segment_file_name(id));
        let file = storage
            .open(&from, OpenMode::Read)
            .map_err(|e| Error::io("open", &from, e))?;
        report.bytes_dropped += file.len().map_err(|e| Error::io("stat", &from, e))?;
        storage
            .rename(&from, &to)
            .map_err(|e| Error::io("rename", &from, e))?;
        report.segments_dropped += 1;
    }
    storage
        .sync_dir(&lost)
        .map_err(|e| Error::io("sync directory", &lost, e))?;
    storage
        .sync_dir(dir)
        .map_err(|e| Error::io("sync directory", dir, e))?;
    Ok(report)
}

fn write_new_file(storage: &dyn Storage, path: &PathBuf, bytes: &[u8]) -> Result<()> {
    let file = storage
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io("create", path, e))?;
    file.append(bytes)
        .map_err(|e| Error::io("write", path, e))?;
    file.sync_data().map_err(|e| Error::io("sync", path, e))
}

/// Checks every record without changing anything: any problem, a torn tail
/// included, is `Corruption`.
pub(crate) fn verify(storage: &dyn Storage, dir: &Path) -> Result<Walk> {
    let mut scratch = Index::default();
    let mut walk = walk(storage, dir, &mut scratch, false)?;
    match walk.problem.take() {
        Some(problem) => Err(problem.into_error()),
        None => Ok(walk),
    }
}
