//! Commands that check or rewrite the log: `verify`, `compact`, `repair`.

use std::io::Write;
use std::path::Path;

use crate::{Options, Store};

/// `verify`: reads and checks every record without opening the store, so a
/// torn final record is reported rather than discarded.
///
/// # Errors
/// Any checksum or structure failure, naming segment file and offset.
pub fn verify(dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = Store::verify_dir(dir, &Options::default())?;
    writeln!(
        out,
        "ok: {} segments, {} records, {} bytes checked",
        report.segments, report.records, report.bytes
    )?;
    Ok(())
}

/// `compact`: expires what is past its TTL and rewrites what is live.
///
/// # Errors
/// Store errors (for example the store is locked, or a segment is corrupt).
pub fn compact(store: &Store, out: &mut dyn Write) -> anyhow::Result<()> {
    let r = store.compact()?;
    writeln!(
        out,
        "compacted {} segments: {} -> {} bytes ({} dead); dropped {} seen ids, {} batch ids, {} tombstones; pause {:?}, took {:?}",
        r.segments_replaced,
        r.bytes_before,
        r.bytes_after,
        r.dead_bytes,
        r.seen_ids_dropped,
        r.batch_ids_dropped,
        r.tombstones_dropped,
        r.pause,
        r.duration
    )?;
    Ok(())
}

/// `repair`: salvages the longest valid prefix and reports what was dropped.
///
/// # Errors
/// Store errors (for example the store is locked).
pub fn repair(dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = Store::repair(dir, Options::default())?;
    match report.first_bad {
        None => match &report.lost_found {
            None => writeln!(
                out,
                "nothing to repair: {} records kept",
                report.records_kept
            )?,
            // A whole log whose snapshot could not be used: only that moved.
            Some(lost_found) => writeln!(
                out,
                "the log is whole ({} records kept); its snapshot could not be used and was moved to {} ({} bytes)",
                report.records_kept,
                lost_found.display(),
                report.bytes_dropped
            )?,
        },
        Some((segment, offset)) => {
            writeln!(
                out,
                "first bad record in segment {segment} at offset {offset}; kept {} records, dropped {} bytes and {} whole segments",
                report.records_kept, report.bytes_dropped, report.segments_dropped
            )?;
            if let Some(lost_found) = &report.lost_found {
                writeln!(out, "dropped bytes moved to {}", lost_found.display())?;
            }
        }
    }
    Ok(())
}
