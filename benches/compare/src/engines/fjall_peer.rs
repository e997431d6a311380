//! fjall: four keyspaces (rows, seen, batches, checkpoints; see
//! `semantics.rs`), one atomic `WriteBatch` per batch committed with
//! `PersistMode::SyncAll` when durable and `PersistMode::Buffer` (to the OS)
//! when buffered. A write batch is not readable before it commits, so the
//! batch's own writes are kept in a map that reads look at first. The
//! read-check-write of a batch is not atomic in fjall, so batches take a mutex.

use std::path::Path;
use std::sync::Mutex;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch as WriteBatch, PersistMode};
use idemkv::{Batch, BatchReport};

use super::{Engine, Mode};
use crate::semantics::{self, BatchLookup, DigestBuilder, KvTxn, Overlay, Refused, Table, decode_row, lookup_batch};

pub struct FjallPeer {
    db: Database,
    rows: Keyspace,
    seen: Keyspace,
    batches: Keyspace,
    checkpoints: Keyspace,
    mode: Mode,
    writer: Mutex<()>,
}

struct Txn<'a> {
    peer: &'a FjallPeer,
    batch: WriteBatch,
    written: Overlay,
}

impl FjallPeer {
    pub fn open(dir: &Path, mode: Mode) -> Self {
        let db = Database::builder(dir).open().expect("open fjall");
        let ks = |name: &str| db.keyspace(name, KeyspaceCreateOptions::default).expect("keyspace");
        Self {
            rows: ks("rows"),
            seen: ks("seen"),
            batches: ks("batches"),
            checkpoints: ks("checkpoints"),
            db,
            mode,
            writer: Mutex::new(()),
        }
    }

    fn keyspace(&self, t: Table) -> &Keyspace {
        match t {
            Table::Rows => &self.rows,
            Table::Seen => &self.seen,
            Table::Batches => &self.batches,
            Table::Checkpoints => &self.checkpoints,
        }
    }
}

impl KvTxn for Txn<'_> {
    fn get(&mut self, table: Table, key: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.written.get(table, key) {
            return Some(v.clone());
        }
        self.peer
            .keyspace(table)
            .get(key)
            .expect("fjall get")
            .map(|v| v.to_vec())
    }

    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) {
        self.batch.insert(self.peer.keyspace(table), key, value);
        self.written.put(table, key, value);
    }
}

impl Engine for FjallPeer {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        let _writer = self.writer.lock().expect("lock");
        let durability = match self.mode {
            Mode::Durable => PersistMode::SyncAll,
            Mode::Buffered => PersistMode::Buffer,
        };
        let mut txn = Txn {
            peer: self,
            batch: WriteBatch::with_capacity(self.db.clone(), batch.len() * 2).durability(Some(durability)),
            written: Overlay::with_capacity(batch.len()),
        };
        let content = match lookup_batch(&mut txn, batch)? {
            BatchLookup::Replayed(report) => return Ok(report),
            BatchLookup::New(content) => content,
        };
        // On `Err` the write batch is dropped uncommitted.
        let report = semantics::apply_kv(&mut txn, batch, content)?;
        txn.batch
            .commit()
            .map_err(|e| Refused::Other(format!("fjall: {e}")))?;
        Ok(report)
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        let row = decode_row(&self.rows.get(key).expect("get")?);
        Some((row.seq, row.value?))
    }

    fn digest(&self) -> Option<u128> {
        let mut d = DigestBuilder::new();
        for guard in self.rows.iter() {
            let (k, v) = guard.into_inner().expect("row");
            let row = decode_row(&v);
            if let Some(value) = &row.value {
                d.row(&k, row.seq, value);
            }
        }
        for guard in self.checkpoints.iter() {
            let (s, p) = guard.into_inner().expect("checkpoint");
            d.checkpoint(&s, &p);
        }
        Some(d.finish())
    }

    fn settle(&self) {
        self.db.persist(PersistMode::SyncAll).expect("persist");
    }

    fn compact(&self) -> Result<(), String> {
        for ks in [&self.rows, &self.seen, &self.batches, &self.checkpoints] {
            ks.major_compact().map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}
