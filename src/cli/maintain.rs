//! Commands that check or rewrite the log: `verify`, `compact`, `repair`.

use std::io::Write;
use std::path::Path;

use anyhow::bail;

use crate::{Options, Store};

/// `verify`: reads and checks every record.
///
/// # Errors
/// Any checksum or structure failure, naming segment file and offset.
pub fn verify(store: &Store, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = store.verify()?;
    writeln!(
        out,
        "ok: {} segments, {} records, {} bytes checked",
        report.segments, report.records, report.bytes
    )?;
    Ok(())
}

/// `compact`: expiry and space reclaim.
///
/// # Errors
/// Always, for now: the engine has no compaction yet.
pub fn compact(store: &Store, out: &mut dyn Write) -> anyhow::Result<()> {
    // TODO(#4): call `store.compact()` and print what it dropped.
    let _ = (store, out);
    bail!("compaction is not available yet")
}

/// `repair`: salvages the longest valid prefix and reports what was dropped.
///
/// # Errors
/// Store errors (for example the store is locked).
pub fn repair(dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = Store::repair(dir, Options::default())?;
    match report.first_bad {
        None => writeln!(
            out,
            "nothing to repair: {} records kept",
            report.records_kept
        )?,
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
