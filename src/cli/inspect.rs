//! Read-only commands: `get`, `scan`, `digest`, `checkpoint`, `log`, `stats`,
//! `quarantine`. Each writes to `out` and never changes the store.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use crate::Store;
use crate::cli::canonical::string_literal;
use crate::cli::render::{
    COUNT_NAMES, bytes_text, counts_object, insert_bytes, json_line, row_json, row_text,
    utc_timestamp,
};

/// `get`: the row as JSON, or an error naming the absent key.
///
/// # Errors
/// Store errors, output errors, and an absent key.
pub fn get(store: &Store, key: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    match store.get(key)? {
        Some(record) => writeln!(out, "{}", row_json(key.as_bytes(), &record))?,
        None => bail!("key {} not found", string_literal(key)),
    }
    Ok(())
}

/// `scan`: live rows in key order.
///
/// # Errors
/// Store and output errors.
pub fn scan(store: &Store, prefix: &str, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    for row in store.scan_prefix(prefix) {
        let (key, record) = row?;
        let line = if json {
            row_json(&key, &record)
        } else {
            row_text(&key, &record)
        };
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// `digest`: the 32-hex-char state digest.
///
/// # Errors
/// Store and output errors.
pub fn digest(store: &Store, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "{}", store.digest()?)?;
    Ok(())
}

/// `checkpoint`: the source's position as text. A source given as the path of
/// an existing file also finds the checkpoint `ingest` keeps under its
/// absolute path.
///
/// # Errors
/// Store and output errors, and a source without a checkpoint.
pub fn checkpoint(store: &Store, source: &str, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut position = store.checkpoint(source)?;
    if position.is_none()
        && let Ok(full) = std::fs::canonicalize(Path::new(source))
    {
        position = store.checkpoint(full.to_string_lossy().as_bytes())?;
    }
    match position {
        Some(position) => writeln!(out, "{}", bytes_text(&position))?,
        None => bail!("source {} has no checkpoint", string_literal(source)),
    }
    Ok(())
}

/// `log`: committed batches with their counts, in commit order.
///
/// # Errors
/// Output errors.
pub fn log(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let entries = store.log();
    if json {
        for entry in &entries {
            let mut object = counts_object(&entry.report);
            insert_bytes(&mut object, "batch_id", &entry.batch_id);
            object.insert("committed_ms".to_owned(), entry.committed_ms.into());
            writeln!(out, "{}", json_line(&Value::Object(object)))?;
        }
        return Ok(());
    }
    write!(out, "{:<24}", "committed (UTC)")?;
    for name in COUNT_NAMES {
        write!(out, " {name}")?;
    }
    writeln!(out, "  batch")?;
    for entry in &entries {
        write!(out, "{:<24}", utc_timestamp(entry.committed_ms))?;
        for (name, count) in COUNT_NAMES.iter().zip(entry.report.counts()) {
            write!(out, " {count:>width$}", width = name.len())?;
        }
        writeln!(out, "  {}", bytes_text(&entry.batch_id))?;
    }
    writeln!(out, "{} committed batches", entries.len())?;
    Ok(())
}

/// `stats`: counts, bytes on disk, index bytes per entry kind.
///
/// # Errors
/// Output errors.
pub fn stats(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let stats = store.stats();
    if json {
        let object = json!({
            "live_keys": stats.live_keys,
            "tombstones": stats.tombstones,
            "seen_ids": stats.seen_ids,
            "batches": stats.batches,
            "checkpoints": stats.checkpoints,
            "quarantined": stats.quarantined,
            "segments": stats.segments,
            "disk_bytes": stats.disk_bytes,
            "index_bytes": {
                "keys": stats.index_bytes.keys,
                "seen": stats.index_bytes.seen,
                "batches": stats.index_bytes.batches,
            },
        });
        writeln!(out, "{}", json_line(&object))?;
        return Ok(());
    }
    let rows = [
        ("live keys", stats.live_keys),
        ("tombstones", stats.tombstones),
        ("seen ids", stats.seen_ids),
        ("batches", stats.batches),
        ("checkpoints", stats.checkpoints),
        ("quarantined", stats.quarantined),
        ("segments", stats.segments),
        ("disk bytes", stats.disk_bytes),
    ];
    for (name, value) in rows {
        writeln!(out, "{name:<14}{value}")?;
    }
    writeln!(
        out,
        "{:<14}keys {}  seen {}  batches {}",
        "index bytes", stats.index_bytes.keys, stats.index_bytes.seen, stats.index_bytes.batches
    )?;
    Ok(())
}

/// `quarantine`: rejected deliveries with batch id, index, event id and reason.
///
/// # Errors
/// Output errors.
pub fn quarantine(store: &Store, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let entries = store.quarantine();
    for entry in &entries {
        if json {
            let mut object = Map::new();
            insert_bytes(&mut object, "batch_id", &entry.batch_id);
            object.insert("index".to_owned(), entry.index.into());
            insert_bytes(&mut object, "event_id", &entry.event_id);
            object.insert("reason".to_owned(), entry.reason.clone().into());
            writeln!(out, "{}", json_line(&Value::Object(object)))?;
        } else {
            writeln!(
                out,
                "{}\t{}\t{}\t{}",
                bytes_text(&entry.batch_id),
                entry.index,
                bytes_text(&entry.event_id),
                bytes_text(entry.reason.as_bytes())
            )?;
        }
    }
    if !json {
        writeln!(out, "{} quarantined", entries.len())
            .context("cannot write the quarantine count")?;
    }
    Ok(())
}
