//! The engines compared: idemkv, its peers and the two floors, behind one trait.

mod fjall_peer;
mod floor;
mod idemkv_engine;
mod redb_peer;
mod sqlite;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use idemkv::{Batch, BatchReport};
use serde::{Deserialize, Serialize};

use crate::semantics::Refused;

pub use idemkv_engine::IdemkvConfig;

/// Durable: every batch commit is synced before it returns. Buffered: handed
/// to the OS (or, where the engine has no such mode, not synced).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    Durable,
    Buffered,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Durable => "durable",
            Mode::Buffered => "buffered",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Idemkv,
    Sqlite,
    Redb,
    Fjall,
    Rocksdb,
    DiskFloor,
    CpuFloor,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Idemkv,
        Kind::Sqlite,
        Kind::Redb,
        Kind::Fjall,
        Kind::Rocksdb,
        Kind::DiskFloor,
        Kind::CpuFloor,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Idemkv => "idemkv",
            Kind::Sqlite => "sqlite",
            Kind::Redb => "redb",
            Kind::Fjall => "fjall",
            Kind::Rocksdb => "rocksdb",
            Kind::DiskFloor => "disk-floor",
            Kind::CpuFloor => "cpu-floor",
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether this build can run it: RocksDB only through the binary that
    /// links it (this one, or `idemkv-compare-rocksdb` beside it).
    pub fn available(self) -> bool {
        self != Kind::Rocksdb || ROCKSDB.get().is_some() || rocksdb_exe().is_some()
    }

    /// Whether it keeps state on disk that a new process can reopen.
    pub fn persistent(self) -> bool {
        !matches!(self, Kind::CpuFloor | Kind::DiskFloor)
    }

    /// Whether it keeps a live state with a digest.
    pub fn has_state(self) -> bool {
        self != Kind::DiskFloor
    }
}

/// One engine, open. `apply` may be called from several threads at once.
pub trait Engine: Send + Sync {
    /// Applies a batch with SPEC section 3 semantics; `Err` if it was refused
    /// (nothing of it applied).
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused>;
    /// A key's live row: (seq, value).
    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)>;
    /// idemkv's digest of the live state, `None` for an engine without state.
    fn digest(&self) -> Option<u128>;
    /// Makes everything committed so far durable (the end of a buffered run).
    fn settle(&self) {}
    /// Compacts, if the engine has a way to ask for it.
    fn compact(&self) -> Result<(), String> {
        Ok(())
    }
    /// Syncs issued so far, where the engine can tell.
    fn syncs(&self) -> Option<u64> {
        None
    }
    /// idemkv's own figures.
    fn idemkv_stats(&self) -> Option<idemkv::Stats> {
        None
    }
    /// Closes cleanly.
    fn close(self: Box<Self>) -> Result<(), String> {
        Ok(())
    }
}

/// Opens RocksDB, in the one binary that links it.
pub type OpenRocksdb = fn(&Path, Mode) -> Box<dyn Engine>;

static ROCKSDB: OnceLock<OpenRocksdb> = OnceLock::new();

/// Called first by `idemkv-compare-rocksdb`: this process can open RocksDB.
pub fn provide_rocksdb(open: OpenRocksdb) {
    let _ = ROCKSDB.set(open);
}

/// Whether this process links RocksDB itself.
pub fn links_rocksdb() -> bool {
    ROCKSDB.get().is_some()
}

/// The binary that runs RocksDB's jobs: this one if it links RocksDB,
/// otherwise `idemkv-compare-rocksdb` beside it, if it was built.
pub fn rocksdb_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    if links_rocksdb() {
        return Some(exe);
    }
    let sibling = exe.with_file_name(format!("idemkv-compare-rocksdb{}", std::env::consts::EXE_SUFFIX));
    sibling.is_file().then_some(sibling)
}

pub fn open(kind: Kind, dir: &Path, mode: Mode, config: &IdemkvConfig) -> Box<dyn Engine> {
    match kind {
        Kind::Idemkv => Box::new(idemkv_engine::IdemkvEngine::open(dir, mode, config)),
        Kind::Sqlite => Box::new(sqlite::SqlitePeer::open(dir, mode)),
        Kind::Redb => Box::new(redb_peer::RedbPeer::open(dir, mode)),
        Kind::Fjall => Box::new(fjall_peer::FjallPeer::open(dir, mode)),
        Kind::Rocksdb => match ROCKSDB.get() {
            Some(open) => open(dir, mode),
            None => panic!("RocksDB runs only in idemkv-compare-rocksdb"),
        },
        Kind::DiskFloor => Box::new(floor::DiskFloor::open(dir, mode)),
        Kind::CpuFloor => Box::new(floor::CpuFloor::open()),
    }
}
