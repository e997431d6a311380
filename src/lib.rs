//! idemkv: an embedded key-value storage engine that applies at-least-once
//! data effectively once.
//!
//! One call, [`Store::apply_batch`], commits a batch's state changes, the event
//! ids it saw, each key's new version, the batch's identity and the caller's
//! source checkpoints in one checksummed log record: all or nothing.
//!
//! ```
//! # fn main() -> Result<(), idemkv::Error> {
//! let dir = tempfile::tempdir().unwrap();
//! let store = idemkv::Store::open(dir.path(), idemkv::Options::default())?;
//! let report = store.apply_batch(
//!     &idemkv::Batch::new("B1")
//!         .put("e1", "O1001/1", 201, br#"{"qty":2}"#)
//!         .put("e1", "O1001/1", 201, br#"{"qty":2}"#)
//!         .checkpoint("cdc", 201u64.to_be_bytes()),
//! )?;
//! assert_eq!((report.inserted, report.duplicates), (1, 1));
//! assert_eq!(store.get(b"O1001/1")?.unwrap().seq, 201);
//! # Ok(()) }
//! ```

#![deny(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

mod apply;
mod batch;
mod clock;
mod compaction;
mod digest;
mod error;
mod format;
mod hashing;
mod index;
mod log;
mod options;
mod recovery;
mod state_file;
pub mod storage;
mod store;

#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod internals;

pub use batch::{Batch, BatchReport, Delivery, Op, QuarantineEntry};
pub use clock::{Clock, ManualClock, SystemClock};
pub use compaction::CompactionReport;
pub use digest::Digest;
pub use error::{Error, Result};
pub use options::{Durability, OnConflict, Options};
pub use store::{IndexBytes, LogEntry, Record, RepairReport, Scan, Stats, Store, VerifyReport};
