//! `idemkv ingest`: NDJSON from a file or stdin, applied in batches whose ids
//! and checkpoints derive from the source name and the batch's byte range.
//!
//! | input                  | starts at                 | batch id                            |
//! |------------------------|---------------------------|-------------------------------------|
//! | regular file           | the source's checkpoint   | `<source>:<start>-<end>`            |
//! | stdin, pipe, FIFO      | byte 0 of the stream      | `<source>:<start>-<end>:<xxh3-64>`  |
//!
//! Invariants:
//! - a batch covers complete lines `[start, end)` and sets the source's
//!   checkpoint to `end` (decimal ASCII) in the same commit, so the checkpoint
//!   is always 0 or the offset just after a `\n`;
//! - from a regular file, without `--follow`, batch boundaries depend only on
//!   the file's bytes, the starting checkpoint and the batch limits, so a
//!   resume after a crash cuts the same batches an uninterrupted run cuts and
//!   a rerun from the start replays committed batches by id;
//! - a regular file's final line without its `\n` is never consumed (a
//!   writer may be in the middle of it); a stream's is, once the stream ends;
//! - a non-seekable stream cannot be resumed from an offset: its batch ids
//!   carry a hash of their bytes, so the same stream again is a replay and
//!   another stream never collides with it; redeliveries dedup by event id.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use indicatif::ProgressBar;
use xxhash_rust::xxh3::Xxh3;

use crate::cli::UsageError;
use crate::cli::canonical::string_literal;
use crate::cli::ndjson::{FieldMapping, LineError, clip, is_blank, parse_line};
use crate::{Batch, BatchReport, Delivery, Error, LogEntry, Op, Store};

/// A batch is cut once its lines reach this many bytes, whatever `--batch-size` says,
/// so that one commit record stays a few MiB at most.
pub const BATCH_BYTES_MAX: usize = 4 << 20;

/// The most bytes a line may hold before its newline, as many as a whole
/// batch. A longer one is invalid input; its bytes past the limit are
/// counted as they are read, not kept, so that a file without newlines
/// takes no more memory than this (and the one byte a newline takes).
pub const LINE_BYTES_MAX: usize = BATCH_BYTES_MAX;

/// Longest parse-error reason stored for a quarantined line, in characters.
const REASON_CHARS_MAX: usize = 500;

/// Where the lines come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A file path (a regular file is resumable; a FIFO is read like stdin).
    File(PathBuf),
    /// Standard input.
    Stdin,
}

impl Input {
    /// The source name used when `--source` is not given: the file's
    /// canonical absolute path, or `stdin`.
    ///
    /// # Errors
    /// When the file's path cannot be resolved (for example it does not exist).
    pub fn default_source(&self) -> anyhow::Result<String> {
        match self {
            Input::Stdin => Ok("stdin".to_owned()),
            Input::File(path) => {
                // A path that does not resolve to a file name but opens
                // (`/dev/stdin` on a pipe) names itself.
                let full = std::fs::canonicalize(path)
                    .or_else(|e| std::fs::metadata(path).map(|_| path.clone()).map_err(|_| e))
                    .with_context(|| format!("cannot open {}", path.display()))?;
                // Not lossily: two paths that differ only in bytes that are
                // not UTF-8 would share a source, and the second file would
                // be refused as the first one replaced, or, once the
                // first's batches expired, resumed at its offset.
                let name = full.to_str().ok_or_else(|| {
                    UsageError(format!(
                        "the path {} is not UTF-8, so it cannot be its own source name: give one with --source",
                        full.display()
                    ))
                })?;
                Ok(name.to_owned())
            }
        }
    }
}

/// The longest batch id a store takes (SPEC: ids of 1 to 4096 bytes).
const BATCH_ID_BYTES_MAX: usize = 4096;
/// What `BatchLines::take_batch` adds to the source to make a batch id, at
/// most: `:`, two byte offsets of up to 20 digits around `-`, and for a
/// stream `:` and 16 hex digits.
const BATCH_ID_SUFFIX_BYTES_MAX: usize = 1 + 20 + 1 + 20 + 1 + 16;

/// Checks a source name before anything is opened: every batch id is made
/// from it, so one too long for them would fail the run partway, once the
/// offsets grew long enough, rather than at its start.
///
/// # Errors
/// A name longer than 4037 bytes (the command line refuses an empty one).
pub(crate) fn check_source(source: &str) -> Result<(), UsageError> {
    let longest = BATCH_ID_BYTES_MAX - BATCH_ID_SUFFIX_BYTES_MAX;
    if source.len() > longest {
        return Err(UsageError(format!(
            "the source name is {} bytes, longer than the {longest} that leave room for a batch id's \
             offsets within its {BATCH_ID_BYTES_MAX} bytes: give a shorter one with --source",
            source.len()
        )));
    }
    Ok(())
}

/// Keep reading a growing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    /// How long to sleep at the end of the file before looking again.
    pub poll: Duration,
    /// Stop after this long without new bytes (`None`: run until killed).
    pub idle_exit: Option<Duration>,
}

/// How to ingest.
#[derive(Debug, Clone)]
pub struct IngestOptions {
    /// Source name: prefix of batch ids and name of the checkpoint.
    pub source: String,
    /// Deliveries (non-blank lines) per batch, at least 1.
    pub batch_size: usize,
    /// Bytes of lines per batch before it is cut regardless of `batch_size`.
    pub batch_bytes_max: usize,
    /// How fields map onto deliveries.
    pub mapping: FieldMapping,
    /// Read a file from byte 0, ignoring its checkpoint.
    pub from_start: bool,
    /// Keep reading a growing file.
    pub follow: Option<Follow>,
    /// Stop after committing this many batches.
    pub max_batches: Option<u64>,
}

/// What one ingest run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestSummary {
    /// The source name.
    pub source: String,
    /// Counts of the batches this run committed (replayed batches excluded:
    /// they changed nothing).
    pub totals: BatchReport,
    /// Batches committed or replayed by this run.
    pub batches: u64,
    /// How many of those were replays of already committed batches.
    pub replayed: u64,
    /// Complete lines read (blank lines included).
    pub lines: u64,
    /// Byte offset the run started at.
    pub start: u64,
    /// Byte offset after the last complete line this run committed or
    /// replayed.
    pub read_to: u64,
    /// The source's checkpoint in the store when the run ended: after the
    /// last complete line committed, or, when this run's batches were
    /// replays (`--from-start`), where an earlier run left it.
    pub checkpoint: u64,
    /// Bytes after the last complete line, waiting for their newline (0
    /// when the run stopped at `max_batches`, before reading further).
    pub pending_bytes: u64,
    /// The run stopped at `max_batches`, whether or not lines were left.
    pub stopped_at_max_batches: bool,
    /// Whether the input can be resumed from its checkpoint (a regular file).
    pub is_resumable: bool,
}

/// Decodes a checkpoint written by `ingest`: the byte offset as decimal ASCII.
pub fn decode_position(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Encodes a checkpoint position as decimal ASCII.
pub fn encode_position(offset: u64) -> String {
    offset.to_string()
}

/// The committed byte offset of `source`, 0 if it has none.
///
/// # Errors
/// A store error, or a checkpoint that is not a decimal byte offset.
pub fn committed_offset(store: &Store, source: &str) -> anyhow::Result<u64> {
    match store.checkpoint(source)? {
        None => Ok(0),
        Some(bytes) => decode_position(&bytes).ok_or_else(|| {
            anyhow!(
                "checkpoint of source {} is {:?}, not a byte offset written by ingest",
                string_literal(source),
                bytes.escape_ascii().to_string()
            )
        }),
    }
}

/// Reads `input` into `store` as `options` says, updating `progress`.
///
/// # Errors
/// I/O errors, a file that no longer matches its checkpoint, and any batch
/// the store refuses (a conflicting or invalid line under `OnConflict::Fail`):
/// the message names the line number and event id, and says that nothing of
/// that batch was committed (after its write or sync failed, that it may
/// have: the disk may hold its record).
pub fn ingest(
    store: &Store,
    input: &Input,
    options: &IngestOptions,
    progress: &ProgressBar,
) -> anyhow::Result<IngestSummary> {
    assert!(options.batch_size >= 1, "batch size must be at least 1");
    let refuse_follow = || {
        UsageError(format!(
            "--follow reads a growing regular file; {} is a stream, which ingest reads until it ends anyway",
            input_name(input)
        ))
    };
    // Before the open, which for a FIFO waits for a writer to appear.
    if options.follow.is_some()
        && let Input::File(path) = input
        && std::fs::metadata(path).is_ok_and(|m| !m.is_file())
    {
        return Err(refuse_follow().into());
    }
    let opened = open_input(store, input, options)?;
    if options.follow.is_some() && !opened.is_seekable {
        return Err(refuse_follow().into());
    }
    progress.set_position(opened.start);
    let mut run = Run {
        store,
        options,
        summary: IngestSummary {
            source: options.source.clone(),
            start: opened.start,
            read_to: opened.start,
            checkpoint: committed_offset(store, &options.source).unwrap_or(opened.start),
            is_resumable: opened.is_seekable,
            ..IngestSummary::default()
        },
        batch: BatchLines::new(opened.start, opened.is_seekable),
    };
    let mut reader = opened.reader;
    let mut line = Line::default();
    let mut position = opened.start;
    let mut line_no = opened.lines_before;
    let mut last_data = Instant::now();
    let mut is_replaced = false;
    loop {
        if options
            .max_batches
            .is_some_and(|max| run.summary.batches >= max)
        {
            run.summary.stopped_at_max_batches = true;
            break;
        }
        let read = line
            .read_from(&mut reader)
            .with_context(|| format!("cannot read {}", input_name(input)))?;
        if line.is_complete {
            line_no += 1;
            position += line.len;
            run.add_line(&line, line_no);
            line = Line::default();
            last_data = Instant::now();
            if run.is_full() {
                run.commit(position)?;
                progress.set_position(position);
                progress.set_message(format!("{} lines", run.summary.lines));
            }
            continue;
        }
        // End of the input for now; `line` holds an unfinished final line, if any.
        if read > 0 {
            last_data = Instant::now();
        }
        if !opened.is_seekable && line.len > 0 {
            // A stream returns a line without its newline only where it
            // ended, and cannot be read again from an offset: its last
            // line is complete without the newline (JSON Lines allows it).
            line_no += 1;
            position += line.len;
            run.add_line(&line, line_no);
            line = Line::default();
        }
        if position > run.batch.start {
            run.commit(position)?;
            progress.set_position(position);
            progress.set_message(format!("{} lines", run.summary.lines));
        }
        let Some(follow) = options.follow else { break };
        if is_replaced {
            bail!(
                "{} was replaced or moved while being followed; the file followed until then is ingested to its end, and source {} has checkpoint {}: ingest the new file under another --source",
                input_name(input),
                string_literal(&options.source),
                run.summary.checkpoint
            );
        }
        if follow
            .idle_exit
            .is_some_and(|idle| last_data.elapsed() >= idle)
        {
            break;
        }
        if let Some(file) = &opened.probe {
            let len = file
                .metadata()
                .with_context(|| format!("cannot stat {}", input_name(input)))?
                .len();
            let read_to = position + line.len;
            if len < read_to {
                bail!(
                    "{} shrank to {len} bytes while being followed (read up to byte {read_to}); it was truncated or replaced",
                    input_name(input)
                );
            }
            if let Input::File(path) = input
                && !is_same_file(file, path)
            {
                // What was written to the old file before it moved is read
                // to its end first.
                is_replaced = true;
                continue;
            }
        }
        thread::sleep(follow.poll);
    }
    run.summary.pending_bytes = line.len;
    Ok(run.summary)
}

/// Whether `path` still names the file `open` is (a log rotation renames
/// the file and creates a new one under its name). Where files have no
/// identity to compare, it says yes.
fn is_same_file(open: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (open.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (open, path);
        true
    }
}

struct Opened {
    reader: Box<dyn BufRead>,
    /// The file again, to watch its length while following.
    probe: Option<File>,
    start: u64,
    lines_before: u64,
    is_seekable: bool,
}

fn open_input(store: &Store, input: &Input, options: &IngestOptions) -> anyhow::Result<Opened> {
    let path = match input {
        Input::Stdin => {
            return Ok(Opened {
                reader: Box::new(std::io::stdin().lock()),
                probe: None,
                start: 0,
                lines_before: 0,
                is_seekable: false,
            });
        }
        Input::File(path) => path,
    };
    let mut file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !metadata.is_file() {
        return Ok(Opened {
            reader: Box::new(BufReader::new(file)),
            probe: None,
            start: 0,
            lines_before: 0,
            is_seekable: false,
        });
    }
    let start = if options.from_start {
        0
    } else {
        committed_offset(store, &options.source)?
    };
    check_resume_point(&mut file, path, metadata.len(), start, &options.source)?;
    let lines_before = count_newlines(&mut file, start)
        .with_context(|| format!("cannot read {}", path.display()))?;
    check_last_batch(store, &mut file, path, start, lines_before, options)?;
    file.seek(SeekFrom::Start(start))
        .with_context(|| format!("cannot seek {}", path.display()))?;
    let probe = file
        .try_clone()
        .with_context(|| format!("cannot reopen {}", path.display()))?;
    Ok(Opened {
        reader: Box::new(BufReader::with_capacity(256 << 10, file)),
        probe: Some(probe),
        start,
        lines_before,
        is_seekable: true,
    })
}

/// A checkpoint is 0 or just after a `\n` of the same file; anything else means
/// the file changed under its source name.
fn check_resume_point(
    file: &mut File,
    path: &Path,
    len: u64,
    start: u64,
    source: &str,
) -> anyhow::Result<()> {
    if start == 0 {
        return Ok(());
    }
    let replaced =
        "it was truncated or replaced since it was ingested; ingest it under another --source";
    if len < start {
        bail!(
            "{} has {len} bytes but source {} has checkpoint {start}: {replaced}",
            path.display(),
            string_literal(source)
        );
    }
    let mut byte = [0u8; 1];
    file.seek(SeekFrom::Start(start - 1))
        .and_then(|_| file.read_exact(&mut byte))
        .with_context(|| format!("cannot read {}", path.display()))?;
    if byte != [b'\n'] {
        bail!(
            "byte {} of {} is not the end of a line, yet source {} has checkpoint {start}: {replaced}",
            start - 1,
            path.display(),
            string_literal(source)
        );
    }
    Ok(())
}

/// The batch that moved `source`'s checkpoint to `start` must be the one
/// the file's bytes before `start` make: a file replaced by another (log
/// rotation, a new export under the same name) can pass the length and
/// newline checks of `check_resume_point`, and resuming it at an offset of
/// the old file would skip its first lines without a word. The batch is
/// rebuilt from those bytes and compared by content hash with the one the
/// log holds under its id; one the registry no longer holds (expired and
/// compacted away) is not checked. A checkpoint a stream set under the
/// source is no position in the file, and is refused.
fn check_last_batch(
    store: &Store,
    file: &mut File,
    path: &Path,
    start: u64,
    lines_before: u64,
    options: &IngestOptions,
) -> anyhow::Result<()> {
    if start == 0 {
        return Ok(());
    }
    let prefix = format!("{}:", options.source);
    let suffix = format!("-{start}");
    // The newest batch of this source that ended at `start`: a file's
    // (`<source>:<a>-<start>`) or a stream's (`<source>:<a>-<start>:<hash>`).
    enum SetBy {
        File { batch_start: u64, entry: LogEntry },
        Stream,
    }
    let last = store.log().into_iter().rev().find_map(|entry| {
        let id = std::str::from_utf8(&entry.batch_id).ok()?;
        let range = id.strip_prefix(&prefix)?;
        if let Some(batch_start) = range.strip_suffix(&suffix) {
            let batch_start = decode_position(batch_start.as_bytes()).filter(|&at| at < start)?;
            return Some(SetBy::File { batch_start, entry });
        }
        // A stream's id is `<a>-<start>:<hash>` after the prefix, with `a` an
        // offset: a source named `feed:x` is not a stream of `feed`.
        let (range, hash) = range.rsplit_once(':')?;
        let is_hash = hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit());
        let stream_start = decode_position(range.strip_suffix(&suffix)?.as_bytes())?;
        (is_hash && stream_start < start).then_some(SetBy::Stream)
    });
    let (batch_start, entry) = match last {
        Some(SetBy::File { batch_start, entry }) => (batch_start, entry),
        Some(SetBy::Stream) => bail!(
            "the checkpoint of source {} (byte {start}) was set by a stream (stdin or a pipe), not read from {}: resuming there would skip its first lines; ingest it under another --source",
            string_literal(&options.source),
            path.display()
        ),
        None => return Ok(()),
    };
    let cannot_read = || format!("cannot read {}", path.display());
    file.seek(SeekFrom::Start(batch_start))
        .with_context(cannot_read)?;
    let mut range = BufReader::new(file.take(start - batch_start));
    let mut ranged = Vec::new();
    loop {
        let mut line = Line::default();
        line.read_from(&mut range).with_context(cannot_read)?;
        if line.len == 0 {
            break;
        }
        ranged.push(line);
    }
    let mut lines = BatchLines::new(batch_start, true);
    let first_line_no = lines_before.saturating_sub(ranged.len() as u64) + 1;
    for (line, line_no) in ranged.iter().zip(first_line_no..) {
        lines.add(line, line_no, &options.mapping);
    }
    let (batch_id, batch) = lines.take_batch(&options.source, start);
    if batch.content_hash() != entry.content_hash {
        bail!(
            "bytes {batch_start}..{start} of {} are not the lines batch {} committed from them: the file was replaced since it was ingested (or the field mapping changed, or this version of idemkv reads those lines differently); ingest it under another --source",
            path.display(),
            string_literal(&batch_id)
        );
    }
    Ok(())
}

/// Counts the `\n` bytes in the first `len` bytes of `file` (for line numbers after a resume).
fn count_newlines(file: &mut File, len: u64) -> std::io::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = file.take(len);
    let mut buf = vec![0u8; 256 << 10];
    let mut count = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            return Ok(count);
        }
        count += buf
            .get(..n)
            .expect("read returns at most the buffer's length")
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
    }
}

fn input_name(input: &Input) -> String {
    match input {
        Input::Stdin => "stdin".to_owned(),
        Input::File(path) => path.display().to_string(),
    }
}

/// A line as it is read: its bytes, up to `LINE_BYTES_MAX` and its newline, and its length.
#[derive(Debug, Default)]
struct Line {
    bytes: Vec<u8>,
    len: u64,
    /// Whether its newline was read.
    is_complete: bool,
}

impl Line {
    /// Reads on until the line's newline or the end of the input for now;
    /// returns how many bytes were read. Bytes past `LINE_BYTES_MAX` are
    /// counted, not kept.
    fn read_from(&mut self, reader: &mut dyn BufRead) -> std::io::Result<usize> {
        let mut read = 0;
        while !self.is_complete {
            let available = match reader.fill_buf() {
                Ok(available) => available,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if available.is_empty() {
                break;
            }
            let (take, is_complete) = match available.iter().position(|&b| b == b'\n') {
                Some(newline) => (newline + 1, true),
                None => (available.len(), false),
            };
            // Room for the newline after `LINE_BYTES_MAX` bytes: a line of
            // exactly the limit is kept whole.
            let room = (LINE_BYTES_MAX + 1).saturating_sub(self.bytes.len());
            self.bytes
                .extend_from_slice(available.get(..take.min(room)).unwrap_or_default());
            self.len += take as u64;
            self.is_complete = is_complete;
            reader.consume(take);
            read += take;
        }
        Ok(read)
    }

    /// Whether its bytes before the newline are more than `LINE_BYTES_MAX`
    /// (only as many are kept, and the newline).
    fn is_too_long(&self) -> bool {
        self.len - u64::from(self.is_complete) > LINE_BYTES_MAX as u64
    }
}

/// One delivery's origin, to name it in errors.
struct LineInfo {
    line_no: u64,
    event_id: Option<String>,
    /// The parse error, for a line that is not a valid delivery.
    malformed: Option<String>,
}

/// The lines of the batch being filled: its deliveries, and where each came from.
struct BatchLines {
    /// Whether the input is a regular file (batch ids are byte ranges) or
    /// a stream (byte ranges and a hash of the bytes).
    is_seekable: bool,
    deliveries: Vec<Delivery>,
    lines: Vec<LineInfo>,
    /// Where the batch's first line starts.
    start: u64,
    bytes: usize,
    hasher: Xxh3,
}

impl BatchLines {
    fn new(start: u64, is_seekable: bool) -> Self {
        Self {
            is_seekable,
            deliveries: Vec::new(),
            lines: Vec::new(),
            start,
            bytes: 0,
            hasher: Xxh3::new(),
        }
    }

    /// Adds a complete line (a blank one adds no delivery).
    fn add(&mut self, line: &Line, line_no: u64, mapping: &FieldMapping) {
        self.bytes += line.bytes.len();
        if !self.is_seekable {
            self.hasher.update(&line.bytes);
        }
        // Too long before blank: only the kept bytes could be looked at,
        // and a line that starts with 4 MiB of spaces is not blank.
        let parsed = if line.is_too_long() {
            let newline = u64::from(line.is_complete);
            Err(LineError {
                event_id: None,
                reason: format!(
                    "line of {} bytes, longer than {LINE_BYTES_MAX}",
                    line.len - newline
                ),
            })
        } else if is_blank(&line.bytes) {
            return;
        } else {
            parse_line(&line.bytes, mapping)
        };
        match parsed {
            Ok(delivery) => {
                self.lines.push(LineInfo {
                    line_no,
                    event_id: Some(String::from_utf8_lossy(&delivery.event_id).into_owned()),
                    malformed: None,
                });
                self.deliveries.push(delivery);
            }
            Err(err) => {
                // The reason is stored with the quarantined line; keep it bounded.
                let reason = clip(&err.to_string(), REASON_CHARS_MAX).into_owned();
                self.deliveries.push(Delivery {
                    event_id: format!("line:{line_no}").into(),
                    key: bytes::Bytes::new(),
                    seq: 0,
                    op: Op::Malformed {
                        reason: reason.clone(),
                    },
                });
                self.lines.push(LineInfo {
                    line_no,
                    event_id: err.event_id,
                    malformed: Some(reason),
                });
            }
        }
    }

    /// The batch of the lines added, which ends at `end` and moves
    /// `source`'s checkpoint there, with its id. Its deliveries move into
    /// it; where they came from stays, to name them in errors.
    fn take_batch(&mut self, source: &str, end: u64) -> (String, Batch) {
        let start = self.start;
        let batch_id = if self.is_seekable {
            format!("{source}:{start}-{end}")
        } else {
            format!("{source}:{start}-{end}:{:016x}", self.hasher.digest())
        };
        let mut batch = Batch::new(&batch_id);
        for delivery in self.deliveries.drain(..) {
            batch.push_delivery(delivery);
        }
        batch.set_checkpoint(source, encode_position(end));
        (batch_id, batch)
    }
}

/// The batch being filled and the running summary.
struct Run<'a> {
    store: &'a Store,
    options: &'a IngestOptions,
    summary: IngestSummary,
    batch: BatchLines,
}

impl Run<'_> {
    fn add_line(&mut self, line: &Line, line_no: u64) {
        self.summary.lines += 1;
        self.batch.add(line, line_no, &self.options.mapping);
    }

    fn is_full(&self) -> bool {
        self.batch.deliveries.len() >= self.options.batch_size
            || self.batch.bytes >= self.options.batch_bytes_max
    }

    /// Commits the lines `[batch.start, end)` as one batch that moves the checkpoint to `end`.
    fn commit(&mut self, end: u64) -> anyhow::Result<()> {
        let (batch_id, batch) = self.batch.take_batch(&self.options.source, end);
        let report = self
            .store
            .apply_batch(&batch)
            .map_err(|err| self.explain(err, &batch_id))?;
        self.summary.batches += 1;
        if report.replayed {
            self.summary.replayed += 1;
        } else {
            self.summary.totals.accumulate(&report);
        }
        self.summary.read_to = end;
        // A replay moves no checkpoint: report the one the store holds.
        // Otherwise the batch moved it to `end`; reading it back at once
        // would wait for the batch's publishing (DESIGN.md, "Publishing")
        // rather than read the next lines meanwhile.
        self.summary.checkpoint = if report.replayed {
            committed_offset(self.store, &self.options.source).unwrap_or(end)
        } else {
            end
        };
        self.batch = BatchLines::new(end, self.batch.is_seekable);
        Ok(())
    }

    /// Turns a refused batch into a message naming the line and event id.
    fn explain(&self, err: Error, batch_id: &str) -> anyhow::Error {
        // The stored checkpoint, not the batch's start: under --from-start
        // the two differ.
        let stays = match committed_offset(self.store, &self.options.source) {
            Ok(at) => format!("stays at {at}"),
            Err(_) => "did not move".to_owned(),
        };
        let not_committed = format!(
            "nothing of batch {} was committed; checkpoint of source {} {stays} ({} batches committed before it in this run)",
            string_literal(batch_id),
            string_literal(&self.options.source),
            self.summary.batches
        );
        let line = |index: usize| self.batch.lines.get(index);
        match &err {
            Error::ConflictingEvent {
                index, event_id, ..
            } => {
                let line_no =
                    line(*index).map_or_else(|| "?".to_owned(), |l| l.line_no.to_string());
                anyhow!(
                    "line {line_no}: event_id {} was already seen with another payload (conflicting event); {not_committed}",
                    string_literal(&clip(event_id, 100))
                )
            }
            Error::InvalidEvent {
                index,
                event_id,
                reason,
                ..
            } => match line(*index) {
                Some(LineInfo {
                    line_no,
                    malformed: Some(parse_error),
                    ..
                }) => anyhow!("line {line_no}: {parse_error}; {not_committed}"),
                Some(LineInfo {
                    line_no,
                    event_id: known,
                    ..
                }) => anyhow!(
                    "line {line_no}: invalid event (event_id {}): {reason}; {not_committed}",
                    string_literal(&clip(known.as_deref().unwrap_or(event_id), 100))
                ),
                None => anyhow!(
                    "delivery {index}: invalid event (event_id {}): {reason}; {not_committed}",
                    string_literal(&clip(event_id, 100))
                ),
            },
            Error::BatchConflict { .. } => anyhow!(
                "{err}: the input under source {} differs from what was ingested before (the file changed, or the field mapping did); {not_committed}",
                string_literal(&self.options.source)
            ),
            // After this batch's write or sync failed the disk may still
            // hold its record, and the next open then finds it committed.
            // (`Poisoned`: an earlier failure, and nothing of this batch
            // was written.)
            Error::Io { .. } => {
                let unknown = format!(
                    "batch {} may or may not have committed (the store keeps what reached the disk); run ingest again once the disk is fixed: it resumes from the checkpoint the store then holds, either way ({} batches committed before it in this run)",
                    string_literal(batch_id),
                    self.summary.batches
                );
                anyhow::Error::new(err).context(unknown)
            }
            _ => anyhow::Error::new(err).context(not_committed),
        }
    }
}
