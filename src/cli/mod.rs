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
pub use ndjson::{FieldMapping, LineError, parse_line};
