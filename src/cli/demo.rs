//! `idemkv demo`: the engine's guarantees, told on built-in data in a
//! temporary store (removed at the end), in one screen.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use indicatif::ProgressBar;

use crate::cli::ingest::{BATCH_BYTES_MAX, IngestOptions, IngestSummary, Input, ingest};
use crate::cli::ndjson::{FieldMapping, parse_line};
use crate::cli::render::{bytes_text, value_text};
use crate::{Batch, BatchReport, Error, Options, Store};

/// The sample file shipped in `examples/`, also used by the crash part.
pub const ORDERS_NDJSON: &str = include_str!("../../examples/orders.ndjson");

/// One step of the story: a batch id, what it shows, its NDJSON lines and the
/// position of the `story` source it commits (a batch's checkpoint is part of
/// its content, so a redelivered batch carries its first checkpoint again).
struct Step {
    batch_id: &'static str,
    title: &'static str,
    lines: &'static [&'static str],
    checkpoint: u64,
}

const FIRST: &[&str] = &[
    r#"{"event_id":"e101","key":"O1001/1","seq":201,"op":"put","value":{"qty":2,"amount_cents":1998}}"#,
    r#"{"event_id":"e101","key":"O1001/1","seq":201,"op":"put","value":{"qty":2,"amount_cents":1998}}"#,
    r#"{"event_id":"e102","key":"O1002/1","seq":202,"op":"put","value":{"qty":1,"amount_cents":500}}"#,
    r#"{"event_id":"e103","key":"O1003/1","seq":203,"op":"put","value":{"qty":5,"amount_cents":2500}}"#,
    r#"{"event_id":"e300","key":"visits/2026-09-21","seq":300,"op":"add","delta":5}"#,
];

const STEPS: &[Step] = &[
    Step {
        batch_id: "story-1",
        title: "first delivery (e101 twice in the batch)",
        lines: FIRST,
        checkpoint: 1,
    },
    Step {
        batch_id: "story-1",
        title: "batch story-1 delivered again",
        lines: FIRST,
        checkpoint: 1,
    },
    Step {
        batch_id: "story-1-retry",
        title: "all of it again under a new batch id",
        lines: FIRST,
        checkpoint: 1,
    },
    Step {
        batch_id: "story-2",
        title: "newer O1001/1, respelled O1003/1, old e099",
        lines: &[
            r#"{"event_id":"e104","key":"O1001/1","seq":204,"op":"put","value":{"qty":3,"amount_cents":2997}}"#,
            r#"{"event_id":"e105","key":"O1003/1","seq":205,"op":"put","value":{ "amount_cents": 2500, "qty": 5 }}"#,
            r#"{"event_id":"e099","key":"O1001/1","seq":199,"op":"put","value":{"qty":1,"amount_cents":999}}"#,
        ],
        checkpoint: 2,
    },
    Step {
        batch_id: "story-3",
        title: "delete O1002/1 twice, then an older put",
        lines: &[
            r#"{"event_id":"e106","key":"O1002/1","seq":206,"op":"delete"}"#,
            r#"{"event_id":"e106","key":"O1002/1","seq":206,"op":"delete"}"#,
            r#"{"event_id":"e100","key":"O1002/1","seq":200,"op":"put","value":{"qty":9,"amount_cents":4500}}"#,
        ],
        checkpoint: 3,
    },
    Step {
        batch_id: "story-4",
        title: "counter: +5 (e300) again, +2 (e301) new",
        lines: &[
            r#"{"event_id":"e300","key":"visits/2026-09-21","seq":300,"op":"add","delta":5}"#,
            r#"{"event_id":"e301","key":"visits/2026-09-21","seq":301,"op":"add","delta":2}"#,
        ],
        checkpoint: 4,
    },
    Step {
        batch_id: "story-5",
        title: "delete O1003/1, and e102 with another value",
        lines: &[
            r#"{"event_id":"e107","key":"O1003/1","seq":207,"op":"delete"}"#,
            r#"{"event_id":"e102","key":"O1002/1","seq":202,"op":"put","value":{"qty":8}}"#,
        ],
        checkpoint: 5,
    },
];

const TITLE_WIDTH: usize = 44;
const SHORT_NAMES: [&str; 8] = ["ins", "upd", "same", "stale", "dup", "del", "add", "rej"];

/// Runs the demo, writing its story to `out`.
///
/// # Errors
/// I/O errors on the temporary directory, and any unexpected store error.
pub fn run(keep: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut dir = TempDir::create()?;
    writeln!(
        out,
        "idemkv demo: deliveries arrive at least once, state changes exactly once"
    )?;
    writeln!(out, "(temporary store in {})", dir.path.display())?;
    writeln!(out)?;
    story(&dir.path.join("story"), out)?;
    writeln!(out)?;
    crash_and_resume(&dir.path, out)?;
    if keep {
        dir.keep = true;
        writeln!(out, "(kept {})", dir.path.display())?;
    }
    Ok(())
}

fn story(dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let store = Store::open(dir, Options::default())?;
    write!(out, "{:<TITLE_WIDTH$}", "batch")?;
    for name in SHORT_NAMES {
        write!(out, " {name}")?;
    }
    writeln!(out)?;
    for (number, step) in (1u64..).zip(STEPS) {
        let mut batch = Batch::new(step.batch_id);
        for line in step.lines {
            let delivery = parse_line(line.as_bytes(), &FieldMapping::default())
                .map_err(|err| anyhow!("built-in line {line}: {err}"))?;
            batch.push_delivery(delivery);
        }
        batch.set_checkpoint("story", step.checkpoint.to_string());
        let title = format!("{number} {}", step.title);
        match store.apply_batch(&batch) {
            Ok(report) if report.replayed => writeln!(
                out,
                "{title:<TITLE_WIDTH$} replayed: no-op, returns its first report"
            )?,
            Ok(report) => write_counts(out, &title, &report)?,
            Err(err) => {
                let checkpoint = store
                    .checkpoint("story")?
                    .map_or_else(|| "none".to_owned(), |c| bytes_text(&c));
                let why = match &err {
                    Error::ConflictingEvent { event_id, .. } => {
                        format!(
                            "{event_id:?} was seen with another payload (e107 not applied either)"
                        )
                    }
                    other => other.to_string(),
                };
                writeln!(out, "{title:<TITLE_WIDTH$} refused, nothing applied:")?;
                writeln!(out, "  {why}; checkpoint stays {checkpoint}")?;
            }
        }
    }
    writeln!(out, "state after the story (key, seq, value):")?;
    for row in store.scan_prefix("") {
        let (key, record) = row?;
        writeln!(
            out,
            "  {:<20} {:>4}  {}",
            bytes_text(&key),
            record.seq,
            value_text(&record.value)
        )?;
    }
    Ok(())
}

fn write_counts(out: &mut dyn Write, title: &str, report: &BatchReport) -> anyhow::Result<()> {
    write!(out, "{title:<TITLE_WIDTH$}")?;
    for (name, count) in SHORT_NAMES.iter().zip(report.counts()) {
        write!(out, " {count:>width$}", width = name.len())?;
    }
    writeln!(out)?;
    Ok(())
}

fn crash_and_resume(dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let file = dir.join("orders.ndjson");
    std::fs::write(&file, ORDERS_NDJSON)
        .with_context(|| format!("cannot write {}", file.display()))?;
    let lines = ORDERS_NDJSON.lines().count();
    writeln!(
        out,
        "crash test: examples/orders.ndjson ({lines} lines) in batches of 4 lines, twice"
    )?;
    let input = Input::File(file);
    let ingest_up_to = |store: &Store, max_batches: Option<u64>| -> anyhow::Result<IngestSummary> {
        let options = IngestOptions {
            source: "orders".to_owned(),
            batch_size: 4,
            batch_bytes_max: BATCH_BYTES_MAX,
            mapping: FieldMapping::default(),
            from_start: false,
            follow: None,
            max_batches,
        };
        ingest(store, &input, &options, &ProgressBar::hidden())
    };

    let clean_dir = dir.join("uninterrupted");
    let clean = Store::open(&clean_dir, Options::default())?;
    let summary = ingest_up_to(&clean, None)?;
    let clean_digest = clean.digest()?;
    writeln!(
        out,
        "  run A, uninterrupted: {} batches ({})",
        summary.batches,
        short_counts(&summary.totals)
    )?;
    drop(clean);

    let crash_dir = dir.join("interrupted");
    // Each close cuts the newest segment's preallocated extension, so its
    // length is where its records end: the third batch's record is what
    // the second length adds.
    let store = Store::open(&crash_dir, Options::default())?;
    ingest_up_to(&store, Some(2))?;
    drop(store);
    let before = newest_segment(&crash_dir)?;
    let store = Store::open(&crash_dir, Options::default())?;
    let third = ingest_up_to(&store, Some(1))?;
    drop(store);
    let after = newest_segment(&crash_dir)?;
    let is_torn = match (before, after) {
        (Some((name_before, len_before)), Some((name_after, len_after)))
            if name_before == name_after && len_after > len_before =>
        {
            let torn_len = len_before + (len_after - len_before) / 2;
            OpenOptions::new()
                .write(true)
                .open(&name_after)
                .and_then(|f| f.set_len(torn_len))
                .with_context(|| format!("cannot truncate {}", name_after.display()))?;
            writeln!(
                out,
                "  run B: 2 batches, then a crash midway through writing batch 3 (bytes {}..{})",
                third.start, third.read_to
            )?;
            true
        }
        _ => {
            writeln!(
                out,
                "  run B: 3 batches, then a stop (batch 3 could not be torn)"
            )?;
            false
        }
    };
    let store = Store::open(&crash_dir, Options::default())?;
    let reopened_at = store
        .checkpoint("orders")?
        .map_or_else(|| "0".to_owned(), |c| bytes_text(&c));
    let resumed = ingest_up_to(&store, None)?;
    let resumed_digest = store.digest()?;
    writeln!(
        out,
        "  run B reopened: {}checkpoint {reopened_at}; resumed {} more batches",
        if is_torn {
            "the torn batch is gone, "
        } else {
            ""
        },
        resumed.batches
    )?;
    let verdict = if clean_digest == resumed_digest {
        "equal: the interrupted run converged"
    } else {
        "DIFFERENT: convergence failed"
    };
    writeln!(out, "  digest A {clean_digest}")?;
    writeln!(out, "  digest B {resumed_digest}  {verdict}")?;
    if clean_digest != resumed_digest {
        return Err(anyhow!(
            "digests differ after crash and resume: {clean_digest} vs {resumed_digest}"
        ));
    }
    Ok(())
}

fn short_counts(report: &BatchReport) -> String {
    SHORT_NAMES
        .iter()
        .zip(report.counts())
        .filter(|(_, count)| *count > 0)
        .map(|(name, count)| format!("{count} {name}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The newest log segment (`*.seg`, by name) and its length.
fn newest_segment(dir: &Path) -> anyhow::Result<Option<(PathBuf, u64)>> {
    let mut newest: Option<PathBuf> = None;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "seg")
            && newest.as_ref().is_none_or(|best| path > *best)
        {
            newest = Some(path);
        }
    }
    newest
        .map(|path| {
            let len = std::fs::metadata(&path)
                .with_context(|| format!("cannot stat {}", path.display()))?
                .len();
            Ok((path, len))
        })
        .transpose()
}

/// A directory under the system's temporary directory, removed on drop unless kept.
struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    fn create() -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("idemkv-demo-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        Ok(Self { path, keep: false })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.keep {
            // Best effort: a leftover directory under the temp dir is harmless.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}
