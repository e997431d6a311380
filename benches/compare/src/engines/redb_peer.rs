//! redb: one write transaction per batch over four tables (rows, seen,
//! batches, checkpoints; see `semantics.rs`). Reads inside the transaction
//! see its own writes; a refused batch aborts it. `Durability::Immediate`
//! when durable, `Durability::None` when buffered (a final empty
//! `Immediate` commit settles a buffered run). redb serialises write
//! transactions itself.

use std::path::Path;

use idemkv::{Batch, BatchReport};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, Table, TableDefinition};

use super::{Engine, Mode};
use crate::semantics::{
    self, BatchLookup, DigestBuilder, KvTxn, Refused, Table as T, decode_row, lookup_batch,
};

const ROWS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("rows");
const SEEN: TableDefinition<&[u8], &[u8]> = TableDefinition::new("seen");
const BATCHES: TableDefinition<&[u8], &[u8]> = TableDefinition::new("batches");
const CHECKPOINTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("checkpoints");

pub struct RedbPeer {
    db: Database,
    mode: Mode,
}

struct Tables<'t> {
    rows: Table<'t, &'static [u8], &'static [u8]>,
    seen: Table<'t, &'static [u8], &'static [u8]>,
    batches: Table<'t, &'static [u8], &'static [u8]>,
    checkpoints: Table<'t, &'static [u8], &'static [u8]>,
}

impl<'t> Tables<'t> {
    fn table(&mut self, t: T) -> &mut Table<'t, &'static [u8], &'static [u8]> {
        match t {
            T::Rows => &mut self.rows,
            T::Seen => &mut self.seen,
            T::Batches => &mut self.batches,
            T::Checkpoints => &mut self.checkpoints,
        }
    }
}

impl KvTxn for Tables<'_> {
    fn get(&mut self, table: T, key: &[u8]) -> Option<Vec<u8>> {
        self.table(table)
            .get(key)
            .expect("redb get")
            .map(|v| v.value().to_vec())
    }

    fn put(&mut self, table: T, key: &[u8], value: &[u8]) {
        self.table(table).insert(key, value).expect("redb insert");
    }
}

impl RedbPeer {
    pub fn open(dir: &Path, mode: Mode) -> Self {
        std::fs::create_dir_all(dir).expect("create dir");
        let db = Database::create(dir.join("idem.redb")).expect("open redb");
        let txn = db.begin_write().expect("begin");
        for def in [ROWS, SEEN, BATCHES, CHECKPOINTS] {
            txn.open_table(def).expect("create table");
        }
        txn.commit().expect("commit");
        Self { db, mode }
    }
}

impl Engine for RedbPeer {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        let other = |e: &dyn std::fmt::Display| Refused::Other(format!("redb: {e}"));
        let mut txn = self.db.begin_write().map_err(|e| other(&e))?;
        txn.set_durability(match self.mode {
            Mode::Durable => Durability::Immediate,
            Mode::Buffered => Durability::None,
        })
        .map_err(|e| other(&e))?;
        let outcome = {
            let mut tables = Tables {
                rows: txn.open_table(ROWS).map_err(|e| other(&e))?,
                seen: txn.open_table(SEEN).map_err(|e| other(&e))?,
                batches: txn.open_table(BATCHES).map_err(|e| other(&e))?,
                checkpoints: txn.open_table(CHECKPOINTS).map_err(|e| other(&e))?,
            };
            match lookup_batch(&mut tables, batch) {
                Err(e) => Err(e),
                Ok(BatchLookup::Replayed(report)) => Ok((report, false)),
                Ok(BatchLookup::New(content)) => {
                    semantics::apply_kv(&mut tables, batch, content).map(|r| (r, true))
                }
            }
        };
        match outcome {
            Ok((report, true)) => {
                txn.commit().map_err(|e| other(&e))?;
                Ok(report)
            }
            Ok((report, false)) => {
                txn.abort().map_err(|e| other(&e))?;
                Ok(report)
            }
            Err(e) => {
                txn.abort().map_err(|e| other(&e))?;
                Err(e)
            }
        }
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        let txn = self.db.begin_read().expect("begin read");
        let rows = txn.open_table(ROWS).expect("open");
        let row = decode_row(rows.get(key).expect("get")?.value());
        Some((row.seq, row.value?))
    }

    fn digest(&self) -> Option<u128> {
        let txn = self.db.begin_read().expect("begin read");
        let mut d = DigestBuilder::new();
        let rows = txn.open_table(ROWS).expect("open");
        for entry in rows.iter().expect("iter") {
            let (k, v) = entry.expect("row");
            let row = decode_row(v.value());
            if let Some(value) = &row.value {
                d.row(k.value(), row.seq, value);
            }
        }
        let ck = txn.open_table(CHECKPOINTS).expect("open");
        for entry in ck.iter().expect("iter") {
            let (s, p) = entry.expect("checkpoint");
            d.checkpoint(s.value(), p.value());
        }
        Some(d.finish())
    }

    fn settle(&self) {
        let mut txn = self.db.begin_write().expect("begin");
        txn.set_durability(Durability::Immediate).expect("durability");
        txn.commit().expect("commit");
    }
}
