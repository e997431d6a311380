//! Entry point: parse arguments, open the store, run one command, map the
//! outcome to an exit code (0 success, 1 a failure the message names, 2 usage).

use std::ffi::OsString;
use std::io::{self, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::cli::args::{Cli, Command, DurabilityArg, IngestArgs, MappingArgs, OnInvalid};
use crate::cli::canonical::string_literal;
use crate::cli::ingest::{
    BATCH_BYTES_MAX, Follow, IngestOptions, IngestSummary, Input, check_source, ingest,
};
use crate::cli::ndjson::FieldMapping;
use crate::cli::render::{counts_object, counts_text, json_line};
use crate::cli::{UsageError, demo, inspect, maintain};
use crate::log::names::{LOCK_FILE, parse_segment_file_name};
use crate::{Durability, OnConflict, Options, Store};

/// Runs `idemkv` with the process's arguments; returns the exit code.
pub fn run() -> ExitCode {
    run_from(std::env::args_os())
}

/// Runs `idemkv` with the given arguments (the first is the program name).
pub fn run_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // Printing can only fail when stderr/stdout is gone; the exit code still tells.
            let _ = err.print();
            return ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2));
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let result = execute(cli.command, &mut out);
    let flushed = out.flush();
    match result.and_then(|()| flushed.context("cannot write to stdout")) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("idemkv: {}", message(&err));
            if err.is::<UsageError>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// The error and its causes on one line, skipping a cause its parent already quotes.
fn message(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// `idemkv scan | head` closes the pipe early; that is not a failure.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn execute(command: Command, out: &mut dyn Write) -> anyhow::Result<()> {
    match command {
        Command::Ingest(args) => ingest_command(*args, out),
        Command::Get(args) => inspect::get(&open_existing(&args.store.store)?, &args.key, out),
        Command::Scan(args) => inspect::scan(
            &open_existing(&args.store.store)?,
            &args.prefix,
            args.json,
            out,
        ),
        Command::Digest(args) => inspect::digest(&open_existing(&args.store)?, out),
        Command::Checkpoint(args) => {
            inspect::checkpoint(&open_existing(&args.store.store)?, &args.source, out)
        }
        Command::Log(args) => inspect::log(&open_existing(&args.store.store)?, args.json, out),
        Command::Stats(args) => inspect::stats(&open_existing(&args.store.store)?, args.json, out),
        Command::Quarantine(args) => {
            inspect::quarantine(&open_existing(&args.store.store)?, args.json, out)
        }
        Command::Verify(args) => {
            require_store_dir(&args.store)?;
            maintain::verify(&args.store, out)
        }
        Command::Compact(args) => maintain::compact(&open_existing(&args.store)?, out),
        Command::Repair(args) => {
            require_store_dir(&args.store)?;
            maintain::repair(&args.store, out)
        }
        Command::Demo(args) => demo::run(args.keep, out),
    }
}

/// Refuses a path that is not a store's directory. Opening a directory
/// makes it a store (segment 1, `LOCK`, its own temporaries removed), which
/// only `ingest` may do: a mistyped `--store` must not turn a directory of
/// other files into an empty store that answers "not found".
fn require_store_dir(dir: &Path) -> anyhow::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("store {} does not exist", dir.display())
        }
        Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
            bail!("store {} is not a directory", dir.display())
        }
        Err(e) => bail!("cannot read store {}: {e}", dir.display()),
    };
    let is_store = entries.filter_map(Result::ok).any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name == LOCK_FILE || parse_segment_file_name(&name).is_some()
    });
    if !is_store {
        bail!(
            "{} is not an idemkv store: it holds no segment file and no {LOCK_FILE}",
            dir.display()
        );
    }
    Ok(())
}

/// Opens a store that must already exist (inspection never creates one),
/// saying on stderr what the open recovered from, since it changes the
/// files: a torn final record cut, a snapshot it could not use.
fn open_existing(dir: &Path) -> anyhow::Result<Store> {
    require_store_dir(dir)?;
    let store = Store::open(dir, Options::default())?;
    let stats = store.stats();
    if stats.torn_bytes_discarded > 0 {
        eprintln!(
            "idemkv: {}: discarded a torn final record ({} bytes), as after a crash",
            dir.display(),
            stats.torn_bytes_discarded
        );
    }
    if let Some(reason) = &stats.snapshot_rejected {
        eprintln!(
            "idemkv: {}: did not use the snapshot ({reason}); replayed the log",
            dir.display()
        );
    }
    Ok(store)
}

fn mapping_of(args: MappingArgs) -> FieldMapping {
    FieldMapping {
        id_field: args.id_field,
        key_fields: args.key_field,
        key_separator: args.key_separator,
        seq_field: args.seq_field,
        op_field: args.op_field,
        value_field: args.value_field,
        delta_field: args.delta_field,
        id_from_content: args.id_from_content,
        ignore_fields: args.ignore_field,
    }
}

fn ingest_command(args: IngestArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let input = if args.file.as_os_str() == "-" {
        Input::Stdin
    } else {
        Input::File(args.file.clone())
    };
    if args.mapping.key_field.len() > 1 && args.mapping.key_separator.is_empty() {
        return Err(UsageError(
            "--key-separator must not be empty when several --key-field are joined".to_owned(),
        )
        .into());
    }
    if args.follow && input == Input::Stdin {
        return Err(UsageError(
            "--follow reads a growing regular file; stdin is read until it ends anyway".to_owned(),
        )
        .into());
    }
    let source = match args.source {
        Some(source) => source,
        None => input.default_source()?,
    };
    check_source(&source)?;
    let options = Options::default()
        .durability(match args.durability {
            DurabilityArg::Sync => Durability::Sync,
            DurabilityArg::Buffered => Durability::Buffered,
        })
        .on_conflict(match args.on_invalid {
            OnInvalid::Fail => OnConflict::Fail,
            OnInvalid::Quarantine => OnConflict::Quarantine,
        });
    let store = Store::open(&args.store.store, options)?;
    let ingest_options = IngestOptions {
        source,
        batch_size: usize::try_from(args.batch_size).context("--batch-size is too large")?,
        batch_bytes_max: BATCH_BYTES_MAX,
        mapping: mapping_of(args.mapping),
        from_start: args.from_start,
        follow: args.follow.then(|| Follow {
            poll: Duration::from_millis(args.poll_ms.max(1)),
            idle_exit: args.idle_exit_ms.map(Duration::from_millis),
        }),
        max_batches: args.max_batches,
    };
    let progress = progress_bar(&input);
    let result = ingest(&store, &input, &ingest_options, &progress);
    progress.finish_and_clear();
    let summary = result?;
    if args.json {
        writeln!(out, "{}", summary_json(&summary))?;
    } else {
        write_summary(&summary, &args.store.store, out)?;
    }
    Ok(())
}

/// A bar (bytes, lines, rate) when stderr is a terminal; nothing otherwise.
fn progress_bar(input: &Input) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let len = match input {
        Input::File(path) => std::fs::metadata(path)
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len()),
        Input::Stdin => None,
    };
    match len {
        Some(len) => ProgressBar::new(len).with_style(
            ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {msg} {bytes_per_sec} eta {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        ),
        None => ProgressBar::new_spinner().with_style(
            ProgressStyle::with_template("{spinner} {bytes} {msg} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        ),
    }
}

/// The `--json` report: the eight counts, `batches`, `replayed`, `checkpoint`,
/// plus `lines`, `source`, `pending_bytes` and `stopped_at_max_batches`.
pub fn summary_json(summary: &IngestSummary) -> String {
    let mut object = counts_object(&summary.totals);
    object.insert("batches".to_owned(), summary.batches.into());
    object.insert("replayed".to_owned(), summary.replayed.into());
    object.insert("checkpoint".to_owned(), summary.checkpoint.into());
    object.insert("lines".to_owned(), summary.lines.into());
    object.insert("source".to_owned(), summary.source.clone().into());
    object.insert("pending_bytes".to_owned(), summary.pending_bytes.into());
    object.insert(
        "stopped_at_max_batches".to_owned(),
        summary.stopped_at_max_batches.into(),
    );
    json_line(&Value::Object(object))
}

fn write_summary(summary: &IngestSummary, store: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "source {}: {} lines, bytes {}..{}, batches {} (replayed {})",
        string_literal(&summary.source),
        summary.lines,
        summary.start,
        summary.read_to,
        summary.batches,
        summary.replayed
    )?;
    writeln!(out, "{}", counts_text(&summary.totals))?;
    writeln!(out, "checkpoint {}", summary.checkpoint)?;
    if summary.stopped_at_max_batches {
        writeln!(
            out,
            "note: stopped after {} batches (--max-batches); the next run continues from the checkpoint",
            summary.batches
        )?;
    } else if summary.batches == 0 && summary.is_resumable {
        writeln!(out, "note: nothing new after the checkpoint")?;
    }
    if summary.replayed > 0 {
        writeln!(
            out,
            "note: {} batches had already committed; they replayed and changed nothing",
            summary.replayed
        )?;
    }
    if summary.totals.rejected > 0 {
        writeln!(
            out,
            "note: {} deliveries quarantined; list them with `idemkv quarantine --store {}`",
            summary.totals.rejected,
            store.display()
        )?;
    }
    if summary.pending_bytes > 0 {
        writeln!(
            out,
            "note: the last {} bytes have no newline yet; the next run reads them",
            summary.pending_bytes
        )?;
    }
    if !summary.is_resumable {
        writeln!(
            out,
            "note: this input has no offset to resume from; a rerun reads it from the start and redelivered events count as duplicates"
        )?;
    }
    Ok(())
}
