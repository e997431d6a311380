//! The crate's one public error type.
//!
//! Every variant names what it is about: the batch, the delivery index, the
//! event id, the segment and offset, or the path. Lower layers return narrow
//! errors and the layer that knows the position lifts them into these.

use std::path::PathBuf;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in idemkv.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event id was seen before with another payload (key, seq, op or value).
    #[error(
        "conflicting event {} at delivery {index} of batch {}: the id was already seen with another payload",
        Shown(.event_id),
        Shown(.batch_id)
    )]
    ConflictingEvent {
        batch_id: String,
        index: usize,
        event_id: String,
    },

    /// A batch id already committed with other content.
    #[error("batch {} already committed with other content", Shown(.batch_id))]
    BatchConflict { batch_id: String },

    /// A delivery that can never be applied (empty id or key, size limits,
    /// delta on a non-counter value, counter overflow, malformed input).
    #[error(
        "invalid event {} at delivery {index} of batch {}: {reason}",
        Shown(.event_id),
        Shown(.batch_id)
    )]
    InvalidEvent {
        batch_id: String,
        index: usize,
        event_id: String,
        reason: String,
    },

    /// A batch that is invalid as a whole (bad batch id, bad checkpoint, too large).
    #[error("invalid batch {}: {reason}", Shown(.batch_id))]
    InvalidBatch { batch_id: String, reason: String },

    /// A checksum or structure failure in committed data.
    #[error("corruption in segment {segment} ({file}) at offset {offset}: {reason}")]
    Corruption {
        segment: u64,
        file: String,
        offset: u64,
        reason: String,
    },

    /// A file of the store was written in a newer format than this build
    /// reads. Its files are left as they are: open it with the idemkv that
    /// wrote it.
    #[error(
        "{} has format version {version}; this idemkv reads version {supported}: use the idemkv that wrote it",
        .path.display()
    )]
    UnsupportedFormat {
        path: PathBuf,
        version: u32,
        supported: u32,
    },

    /// Another writer holds the directory's lock.
    #[error("store {dir} is locked by another writer")]
    Locked { dir: PathBuf },

    /// An operating-system error, with the operation and path it came from.
    #[error("i/o error: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The clock read a time past the latest one the log can record (early
    /// in the year 2106, in milliseconds since the Unix epoch): a clock in
    /// other units, most likely. Nothing of the batch is applied.
    #[error(
        "the clock reads {now_ms} ms since the epoch, past the latest commit time the store can record ({max_ms} ms): is it counting milliseconds?"
    )]
    ClockOutOfRange { now_ms: u64, max_ms: u64 },

    /// A write or sync failed earlier; the store refuses writes until reopened.
    #[error("store refuses writes after an earlier failure ({reason}); reopen it")]
    Poisoned { reason: String },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Renders caller-supplied id bytes for messages: UTF-8 when it is, escaped otherwise.
pub(crate) fn display_id(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => bytes.escape_ascii().to_string(),
    }
}

/// An id as a message shows it: quoted and escaped, and past 256
/// characters cut, with its length. The error's field keeps it whole; an
/// id far over the limits would otherwise make a message of megabytes.
pub(crate) struct Shown<'a>(pub &'a str);

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const CHARS_SHOWN: usize = 256;
        match self.0.char_indices().nth(CHARS_SHOWN) {
            None => write!(f, "{:?}", self.0),
            Some((cut, _)) => write!(
                f,
                "{:?}... ({} bytes)",
                self.0.get(..cut).unwrap_or_default(),
                self.0.len()
            ),
        }
    }
}
