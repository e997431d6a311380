//! The command line's grammar (clap derive). No behaviour here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Embedded key-value store that applies at-least-once data effectively once.
#[derive(Debug, Parser)]
#[command(name = "idemkv", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply NDJSON events from FILE (or `-` for stdin) in resumable batches.
    Ingest(Box<IngestArgs>),
    /// Print a key's row as JSON {"key","seq","value"}; exit 1 if absent.
    Get(GetArgs),
    /// Print live rows in key order.
    Scan(ScanArgs),
    /// Print the 32-hex-char digest of the store's logical state.
    Digest(StoreArgs),
    /// Print a source's checkpoint (for ingest: the byte offset, in decimal).
    Checkpoint(CheckpointArgs),
    /// List committed batches with their counts, in commit order.
    Log(JsonStoreArgs),
    /// Print counts, bytes on disk and index bytes per entry kind.
    Stats(JsonStoreArgs),
    /// List quarantined deliveries with their batch, index and reason.
    Quarantine(JsonStoreArgs),
    /// Read and check every record; exit 1 naming file and offset on a failure.
    Verify(StoreArgs),
    /// Expire old entries and reclaim space.
    Compact(StoreArgs),
    /// Salvage the longest valid prefix of the log and report what was dropped.
    Repair(StoreArgs),
    /// Tell the whole story on built-in data in a temporary store.
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Store directory.
    #[arg(long, short = 's', value_name = "DIR")]
    pub store: PathBuf,
}

#[derive(Debug, Args)]
pub struct JsonStoreArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Print JSON (one object, or one object a line for lists).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The key.
    pub key: String,
}

#[derive(Debug, Args)]
pub struct ScanArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only keys starting with this prefix.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// One JSON object {"key","seq","value"} a line (default: key, seq, value separated by tabs).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Source name (for a file ingested without --source: its path).
    pub source: String,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Keep the temporary store instead of removing it at the end.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnInvalid {
    /// Exit 1 naming the line; nothing of its batch is committed.
    Fail,
    /// Store the line in the quarantine with its reason and carry on.
    Quarantine,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DurabilityArg {
    /// Each batch is synced to disk before the next one is read.
    Sync,
    /// Each batch is handed to the OS: survives a crash of idemkv, not a power loss.
    Buffered,
}

#[derive(Debug, Args)]
pub struct IngestArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// NDJSON file, or `-` for stdin.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Source name for batch ids and the checkpoint [default: the file's absolute path, or `stdin`].
    #[arg(long, value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub source: Option<String>,
    /// Events per batch (one commit each).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub batch_size: u64,
    /// Print one JSON object with the counts, `batches`, `replayed` and `checkpoint`.
    #[arg(long)]
    pub json: bool,
    /// What to do with a malformed line, a missing or mistyped field, or a conflicting event id.
    #[arg(long, value_enum, default_value_t = OnInvalid::Fail)]
    pub on_invalid: OnInvalid,
    /// When a batch counts as committed.
    #[arg(long, value_enum, default_value_t = DurabilityArg::Sync)]
    pub durability: DurabilityArg,
    /// Read the file from its first byte, ignoring the checkpoint (a redelivery: committed
    /// batches replay, the rest dedups by event id).
    #[arg(long)]
    pub from_start: bool,
    /// Keep reading the file as it grows (stop with Ctrl-C: every committed batch stays).
    #[arg(long)]
    pub follow: bool,
    /// With --follow: milliseconds between looks at the end of the file.
    #[arg(long, default_value_t = 200, requires = "follow", value_name = "MS")]
    pub poll_ms: u64,
    /// With --follow: exit after this many milliseconds without new bytes.
    #[arg(long, requires = "follow", value_name = "MS")]
    pub idle_exit_ms: Option<u64>,
    /// Stop after committing this many batches.
    #[arg(long, value_name = "N")]
    pub max_batches: Option<u64>,
    #[command(flatten)]
    pub mapping: MappingArgs,
}

#[derive(Debug, Args)]
pub struct MappingArgs {
    /// Field holding the event id.
    #[arg(long, default_value = "event_id", value_name = "FIELD")]
    pub id_field: String,
    /// Field(s) forming the key; several (comma-separated or repeated) are joined.
    #[arg(
        long,
        default_value = "key",
        value_delimiter = ',',
        value_name = "FIELD"
    )]
    pub key_field: Vec<String>,
    /// Joins the fields of a composite key.
    #[arg(long, default_value = "/", value_name = "TEXT")]
    pub key_separator: String,
    /// Field holding the key's version (u64).
    #[arg(long, default_value = "seq", value_name = "FIELD")]
    pub seq_field: String,
    /// Field holding the operation: put, delete or add.
    #[arg(long, default_value = "op", value_name = "FIELD")]
    pub op_field: String,
    /// Field holding a put's value.
    #[arg(long, default_value = "value", value_name = "FIELD")]
    pub value_field: String,
    /// Field holding an add's delta.
    #[arg(long, default_value = "delta", value_name = "FIELD")]
    pub delta_field: String,
    /// Derive event ids from an xxh3-128 hash of the line's canonical JSON.
    #[arg(long, conflicts_with = "id_field")]
    pub id_from_content: bool,
    /// With --id-from-content: top-level fields left out of the hash (comma-separated or repeated).
    #[arg(
        long,
        requires = "id_from_content",
        value_delimiter = ',',
        value_name = "FIELD"
    )]
    pub ignore_field: Vec<String>,
}
