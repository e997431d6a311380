//! RocksDB (rust-rocksdb): one database, the four tables as key prefixes
//! (`r` rows, `s` seen, `b` batches, `c` checkpoints; see `semantics.rs`),
//! one `WriteBatch` per batch written with `sync = true` when durable and
//! `sync = false` (WAL handed to the OS) when buffered. A write batch is not
//! readable before it is written, so the batch's own writes are kept in a map
//! that reads look at first; batches take a mutex, since the read-check-write
//! is not atomic in RocksDB. LZ4 compression.

use std::path::Path;
use std::sync::Mutex;

use idemkv::{Batch, BatchReport};
use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use idemkv_compare::engines::{Engine, Mode};
use idemkv_compare::semantics::{self, BatchLookup, DigestBuilder, KvTxn, Overlay, Refused, Table, decode_row, lookup_batch};

pub struct RocksdbPeer {
    db: DB,
    mode: Mode,
    writer: Mutex<()>,
}

fn prefix(t: Table) -> u8 {
    match t {
        Table::Rows => b'r',
        Table::Seen => b's',
        Table::Batches => b'b',
        Table::Checkpoints => b'c',
    }
}

fn full_key(t: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(prefix(t));
    k.extend_from_slice(key);
    k
}

struct Txn<'a> {
    db: &'a DB,
    batch: WriteBatch,
    written: Overlay,
}

impl KvTxn for Txn<'_> {
    fn get(&mut self, table: Table, key: &[u8]) -> Option<Vec<u8>> {
        if let Some(v) = self.written.get(table, key) {
            return Some(v.clone());
        }
        self.db
            .get_pinned(full_key(table, key))
            .expect("rocksdb get")
            .map(|v| v.to_vec())
    }

    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) {
        self.batch.put(full_key(table, key), value);
        self.written.put(table, key, value);
    }
}

impl RocksdbPeer {
    pub fn open(dir: &Path, mode: Mode) -> Self {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let db = DB::open(&options, dir).expect("open rocksdb");
        Self {
            db,
            mode,
            writer: Mutex::new(()),
        }
    }

    fn scan(&self, t: Table, mut f: impl FnMut(&[u8], &[u8])) {
        let p = [prefix(t)];
        for item in self.db.iterator(IteratorMode::From(&p, Direction::Forward)) {
            let (k, v) = item.expect("iterate");
            if k.first() != Some(&p[0]) {
                break;
            }
            f(&k[1..], &v);
        }
    }
}

impl Engine for RocksdbPeer {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        let _writer = self.writer.lock().expect("lock");
        let mut txn = Txn {
            db: &self.db,
            batch: WriteBatch::default(),
            written: Overlay::with_capacity(batch.len()),
        };
        let content = match lookup_batch(&mut txn, batch)? {
            BatchLookup::Replayed(report) => return Ok(report),
            BatchLookup::New(content) => content,
        };
        // On `Err` the write batch is dropped unwritten.
        let report = semantics::apply_kv(&mut txn, batch, content)?;
        let mut options = WriteOptions::default();
        options.set_sync(self.mode == Mode::Durable);
        self.db
            .write_opt(txn.batch, &options)
            .map_err(|e| Refused::Other(format!("rocksdb: {e}")))?;
        Ok(report)
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        let row = decode_row(&self.db.get_pinned(full_key(Table::Rows, key)).expect("get")?);
        Some((row.seq, row.value?))
    }

    fn digest(&self) -> Option<u128> {
        let mut d = DigestBuilder::new();
        self.scan(Table::Rows, |k, v| {
            let row = decode_row(v);
            if let Some(value) = &row.value {
                d.row(k, row.seq, value);
            }
        });
        self.scan(Table::Checkpoints, |s, p| d.checkpoint(s, p));
        Some(d.finish())
    }

    fn settle(&self) {
        self.db.flush_wal(true).expect("flush wal");
    }

    fn compact(&self) -> Result<(), String> {
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }
}

/// Debian's RocksDB 7.8 has no write buffer manager in its C API, which
/// rust-rocksdb links against in the destructor of one; the harness never
/// creates one, so this destructor is never called.
#[cfg(feature = "rocksdb-debian")]
#[unsafe(no_mangle)]
pub extern "C" fn rocksdb_write_buffer_manager_destroy(_manager: *mut std::ffi::c_void) {
    unreachable!("the harness creates no write buffer manager")
}
