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
        "conflicting event {event_id:?} at delivery {index} of batch {batch_id:?}: the id was already seen with another payload"
    )]
    ConflictingEvent {
        batch_id: String,
        index: usize,
        event_id: String,
    },

    /// A batch id already committed with other content.
    #[error("batch {batch_id:?} already committed with other content")]
    BatchConflict { batch_id: String },

    /// A delivery that can never be applied (empty id or key, size limits,
    /// delta on a non-counter value, counter overflow, malformed input).
    #[error("invalid event {event_id:?} at delivery {index} of batch {batch_id:?}: {reason}")]
    InvalidEvent {
        batch_id: String,
        index: usize,
        event_id: String,
        reason: String,
    },

    /// A batch that is invalid as a whole (bad batch id, bad checkpoint, too large).
    #[error("invalid batch {batch_id:?}: {reason}")]
    InvalidBatch { batch_id: String, reason: String },

    /// A checksum or structure failure in committed data.
    #[error("corruption in segment {segment} ({file}) at offset {offset}: {reason}")]
    Corruption {
        segment: u64,
        file: String,
        offset: u64,
        reason: String,
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
