//! idemkv itself: `apply_batch` does all of SPEC section 3.

use std::any::Any;
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use idemkv::storage::{OpenMode, OsStorage, Storage, StorageFile};
use idemkv::{Batch, BatchReport, Durability, Error, ManualClock, Options, Store};

use super::{Engine, Mode};
use crate::semantics::Refused;

/// How the harness opens idemkv (expiry and clock for W4, sync counting for W3).
#[derive(Debug, Clone, Default)]
pub struct IdemkvConfig {
    /// `None`: ids never expire (as in the peers).
    pub seen_ttl: Option<Duration>,
    /// A manual clock the workload advances; `None`: the system clock.
    pub clock: Option<ManualClock>,
    /// Wrap the OS storage to count data syncs.
    pub count_syncs: bool,
}

pub struct IdemkvEngine {
    store: Store,
    syncs: Option<Arc<AtomicU64>>,
}

impl IdemkvEngine {
    pub fn open(dir: &Path, mode: Mode, config: &IdemkvConfig) -> Self {
        let mut options = Options::default()
            .durability(match mode {
                Mode::Durable => Durability::Sync,
                Mode::Buffered => Durability::Buffered,
            })
            .seen_ttl(config.seen_ttl)
            .batch_ttl(config.seen_ttl);
        if let Some(clock) = &config.clock {
            options = options.clock(Arc::new(clock.clone()));
        }
        let syncs = config.count_syncs.then(|| Arc::new(AtomicU64::new(0)));
        if let Some(syncs) = &syncs {
            options = options.storage(Arc::new(CountingStorage {
                inner: OsStorage,
                syncs: Arc::clone(syncs),
            }));
        }
        let store = Store::open(dir, options).expect("open idemkv");
        Self { store, syncs }
    }
}

impl Engine for IdemkvEngine {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        self.store.apply_batch(batch).map_err(|e| match e {
            Error::ConflictingEvent { index, .. } => Refused::ConflictingEvent { index },
            Error::InvalidEvent { index, reason, .. } => Refused::InvalidEvent { index, reason },
            Error::BatchConflict { .. } => Refused::BatchConflict,
            other => Refused::Other(other.to_string()),
        })
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        let r = self.store.get(key).expect("get")?;
        Some((r.seq, r.value.to_vec()))
    }

    fn digest(&self) -> Option<u128> {
        Some(self.store.digest().expect("digest").0)
    }

    fn compact(&self) -> Result<(), String> {
        self.store.compact().map(|_| ()).map_err(|e| e.to_string())
    }

    fn syncs(&self) -> Option<u64> {
        self.syncs.as_ref().map(|s| s.load(Ordering::Relaxed))
    }

    fn idemkv_stats(&self) -> Option<idemkv::Stats> {
        Some(self.store.stats())
    }

    fn close(self: Box<Self>) -> Result<(), String> {
        self.store.close().map_err(|e| e.to_string())
    }
}


/// The OS storage, counting `sync_data` calls on its files.
#[derive(Debug)]
struct CountingStorage {
    inner: OsStorage,
    syncs: Arc<AtomicU64>,
}

struct CountingFile {
    inner: Arc<dyn StorageFile>,
    syncs: Arc<AtomicU64>,
}

impl fmt::Debug for CountingFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl Storage for CountingStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.inner.list_dir(dir)
    }
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(CountingFile {
            inner: self.inner.open(path, mode)?,
            syncs: Arc::clone(&self.syncs),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.inner.sync_dir(dir)
    }
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        self.inner.lock(path)
    }
}

impl StorageFile for CountingFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn append(&self, buf: &[u8]) -> io::Result<()> {
        self.inner.append(buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.inner.write_at(offset, buf)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.inner.sync_data()
    }
    fn start_write_back(&self, offset: u64, len: u64) {
        self.inner.start_write_back(offset, len);
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
    fn map(&self, reserve: u64) -> io::Result<Bytes> {
        self.inner.map(reserve)
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
}
