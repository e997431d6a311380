//! The `idemkv` command line (behind the `cli` feature).
//!
//! It owns NDJSON mapping, canonical JSON and the subcommands, and talks to
//! the engine only through the public API. The parser and canonical JSON are
//! pure and public so that tests and fuzz targets can reach them.

mod app;
mod args;
pub mod canonical;
mod demo;
pub mod ingest;
mod inspect;
mod maintain;
pub mod ndjson;
mod render;

pub use app::{run, run_from};

/// A command line that parses but asks for something that cannot be done
/// (exit 2, as clap's own usage errors).
#[derive(Debug)]
pub(crate) struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}
pub use ndjson::{FieldMapping, LineError, parse_line};
