//! SQLite through rusqlite, the textbook pattern: `processed_event` is the
//! gate (insert the id, or find it with its payload hash), facts are upserted
//! with `ON CONFLICT DO UPDATE ... WHERE excluded.seq > fact.seq`, deletes
//! leave a row in `tombstone`, `processed_batch` keeps each batch's report and
//! `checkpoint` the source positions; one `BEGIN IMMEDIATE` transaction per
//! batch, prepared (cached) statements, WAL mode, `synchronous=FULL` when
//! durable and `OFF` when buffered.
//!
//! Each writer thread uses its own connection, and writers queue on a mutex
//! for their turn: SQLite runs one write transaction at a time anyway, and a
//! writer that found the database locked would otherwise wait in SQLite's
//! busy handler, which sleeps 1 to 100 ms between retries while the write
//! lock sits idle.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use idemkv::{Batch, BatchReport, Op};
use rusqlite::{Connection, OptionalExtension, params};

use super::{Engine, Mode};
use crate::semantics::{DigestBuilder, Refused, content_hash, parse_counter, payload_hash, static_problem};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fact (key BLOB PRIMARY KEY, seq INTEGER NOT NULL, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tombstone (key BLOB PRIMARY KEY, seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS processed_event (event_id BLOB PRIMARY KEY, payload_hash INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS processed_batch (
    batch_id BLOB PRIMARY KEY, content_hash BLOB NOT NULL,
    inserted INTEGER NOT NULL, updated INTEGER NOT NULL, unchanged INTEGER NOT NULL,
    stale INTEGER NOT NULL, duplicates INTEGER NOT NULL, deleted INTEGER NOT NULL,
    added INTEGER NOT NULL, rejected INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoint (source BLOB PRIMARY KEY, position BLOB NOT NULL);
";

const SEEN_INSERT: &str =
    "INSERT INTO processed_event (event_id, payload_hash) VALUES (?1, ?2) ON CONFLICT (event_id) DO NOTHING";
const SEEN_GET: &str = "SELECT payload_hash FROM processed_event WHERE event_id = ?1";
const FACT_GET: &str = "SELECT seq, value FROM fact WHERE key = ?1";
const TOMB_GET: &str = "SELECT seq FROM tombstone WHERE key = ?1";
const FACT_UPSERT: &str = "INSERT INTO fact (key, seq, value) VALUES (?1, ?2, ?3)
     ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, value = excluded.value
     WHERE excluded.seq > fact.seq";
const FACT_BUMP: &str = "UPDATE fact SET seq = ?2 WHERE key = ?1 AND seq < ?2";
const FACT_DELETE: &str = "DELETE FROM fact WHERE key = ?1";
const TOMB_UPSERT: &str = "INSERT INTO tombstone (key, seq) VALUES (?1, ?2)
     ON CONFLICT (key) DO UPDATE SET seq = excluded.seq WHERE excluded.seq > tombstone.seq";
const TOMB_DELETE: &str = "DELETE FROM tombstone WHERE key = ?1";
const BATCH_GET: &str = "SELECT content_hash, inserted, updated, unchanged, stale, duplicates, deleted, added, rejected
     FROM processed_batch WHERE batch_id = ?1";
const BATCH_INSERT: &str = "INSERT INTO processed_batch VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)";
const CKPT_UPSERT: &str = "INSERT INTO checkpoint (source, position) VALUES (?1, ?2)
     ON CONFLICT (source) DO UPDATE SET position = excluded.position";

pub struct SqlitePeer {
    path: PathBuf,
    mode: Mode,
    /// Idle connections; a writer takes one (or opens one) per batch.
    pool: Mutex<Vec<Connection>>,
    /// Held by the writer whose transaction runs (see the module comment).
    writer: Mutex<()>,
}

fn connect(path: &Path, mode: Mode) -> Connection {
    let conn = Connection::open(path).expect("open sqlite");
    conn.pragma_update(None, "journal_mode", "WAL").expect("wal");
    let sync = match mode {
        Mode::Durable => "FULL",
        Mode::Buffered => "OFF",
    };
    conn.pragma_update(None, "synchronous", sync).expect("synchronous");
    conn.busy_timeout(Duration::from_secs(600)).expect("busy timeout");
    conn.set_prepared_statement_cache_capacity(32);
    conn
}

fn sql(e: rusqlite::Error) -> Refused {
    Refused::Other(format!("sqlite: {e}"))
}

impl SqlitePeer {
    pub fn open(dir: &Path, mode: Mode) -> Self {
        std::fs::create_dir_all(dir).expect("create dir");
        let path = dir.join("idem.sqlite");
        let conn = connect(&path, mode);
        conn.execute_batch(SCHEMA).expect("schema");
        Self {
            path,
            mode,
            pool: Mutex::new(vec![conn]),
            writer: Mutex::new(()),
        }
    }

    fn with_conn<T>(&self, f: impl FnOnce(&mut Connection) -> T) -> T {
        let taken = self.pool.lock().expect("lock").pop();
        let mut conn = taken.unwrap_or_else(|| connect(&self.path, self.mode));
        let out = f(&mut conn);
        self.pool.lock().expect("lock").push(conn);
        out
    }
}

fn apply_in(conn: &mut Connection, batch: &Batch) -> Result<BatchReport, Refused> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sql)?;
    let content = content_hash(batch).to_le_bytes();
    {
        let mut get_batch = tx.prepare_cached(BATCH_GET).map_err(sql)?;
        let stored = get_batch
            .query_row(params![batch.id()], |r| {
                let hash: Vec<u8> = r.get(0)?;
                let mut counts = [0u64; 8];
                for (i, c) in counts.iter_mut().enumerate() {
                    *c = r.get::<_, i64>(i + 1)? as u64;
                }
                Ok((hash, counts))
            })
            .optional()
            .map_err(sql)?;
        if let Some((hash, counts)) = stored {
            if hash != content {
                return Err(Refused::BatchConflict);
            }
            // Dropping `tx` rolls back the (read-only) transaction.
            return Ok(BatchReport {
                replayed: true,
                ..BatchReport::from_counts(counts)
            });
        }
    }
    let mut report = BatchReport::default();
    {
        let mut seen_insert = tx.prepare_cached(SEEN_INSERT).map_err(sql)?;
        let mut seen_get = tx.prepare_cached(SEEN_GET).map_err(sql)?;
        let mut fact_get = tx.prepare_cached(FACT_GET).map_err(sql)?;
        let mut tomb_get = tx.prepare_cached(TOMB_GET).map_err(sql)?;
        let mut fact_upsert = tx.prepare_cached(FACT_UPSERT).map_err(sql)?;
        let mut fact_bump = tx.prepare_cached(FACT_BUMP).map_err(sql)?;
        let mut fact_delete = tx.prepare_cached(FACT_DELETE).map_err(sql)?;
        let mut tomb_upsert = tx.prepare_cached(TOMB_UPSERT).map_err(sql)?;
        let mut tomb_delete = tx.prepare_cached(TOMB_DELETE).map_err(sql)?;
        for (index, d) in batch.deliveries().iter().enumerate() {
            if let Some(reason) = static_problem(d) {
                return Err(Refused::InvalidEvent { index, reason });
            }
            let payload = payload_hash(d) as i64;
            // The gate: a new id is recorded, a known one is looked up.
            if seen_insert.execute(params![&d.event_id[..], payload]).map_err(sql)? == 0 {
                let stored: i64 = seen_get
                    .query_row(params![&d.event_id[..]], |r| r.get(0))
                    .map_err(sql)?;
                if stored != payload {
                    return Err(Refused::ConflictingEvent { index });
                }
                report.duplicates += 1;
                continue;
            }
            let key = &d.key[..];
            let seq = d.seq as i64;
            let fact: Option<(i64, Vec<u8>)> = fact_get
                .query_row(params![key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
                .map_err(sql)?;
            let tomb: Option<i64> = match fact {
                Some(_) => None,
                None => tomb_get.query_row(params![key], |r| r.get(0)).optional().map_err(sql)?,
            };
            let version = fact.as_ref().map(|f| f.0).or(tomb);
            match &d.op {
                Op::Add(delta) => {
                    let base = match &fact {
                        None => 0,
                        Some((_, v)) => parse_counter(v).ok_or_else(|| Refused::InvalidEvent {
                            index,
                            reason: "delta on a non-counter value".into(),
                        })?,
                    };
                    let sum = base.checked_add(*delta).ok_or_else(|| Refused::InvalidEvent {
                        index,
                        reason: "counter overflow".into(),
                    })?;
                    report.added += 1;
                    let new_seq = version.map_or(seq, |v| v.max(seq));
                    // Same seq as the row's when the delta is older: set it outright.
                    tx.prepare_cached("INSERT INTO fact (key, seq, value) VALUES (?1, ?2, ?3)
                         ON CONFLICT (key) DO UPDATE SET seq = excluded.seq, value = excluded.value")
                        .map_err(sql)?
                        .execute(params![key, new_seq, sum.to_string().as_bytes()])
                        .map_err(sql)?;
                    if tomb.is_some() {
                        tomb_delete.execute(params![key]).map_err(sql)?;
                    }
                }
                _ if version.is_some_and(|v| seq <= v) => report.stale += 1,
                Op::Delete => {
                    report.deleted += 1;
                    if fact.is_some() {
                        fact_delete.execute(params![key]).map_err(sql)?;
                    }
                    tomb_upsert.execute(params![key, seq]).map_err(sql)?;
                }
                Op::Put(value) => {
                    match &fact {
                        Some((_, old)) if old[..] == value[..] => {
                            report.unchanged += 1;
                            fact_bump.execute(params![key, seq]).map_err(sql)?;
                        }
                        Some(_) => {
                            report.updated += 1;
                            fact_upsert.execute(params![key, seq, &value[..]]).map_err(sql)?;
                        }
                        None => {
                            report.inserted += 1;
                            fact_upsert.execute(params![key, seq, &value[..]]).map_err(sql)?;
                            if tomb.is_some() {
                                tomb_delete.execute(params![key]).map_err(sql)?;
                            }
                        }
                    }
                }
                Op::Malformed { .. } => unreachable!("refused by the static checks"),
            }
        }
        let c = report.counts().map(|c| c as i64);
        tx.prepare_cached(BATCH_INSERT)
            .map_err(sql)?
            .execute(params![batch.id(), &content[..], c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])
            .map_err(sql)?;
        let mut ckpt = tx.prepare_cached(CKPT_UPSERT).map_err(sql)?;
        for (source, position) in batch.checkpoints() {
            ckpt.execute(params![&source[..], &position[..]]).map_err(sql)?;
        }
    }
    tx.commit().map_err(sql)?;
    Ok(report)
}

impl Engine for SqlitePeer {
    fn apply(&self, batch: &Batch) -> Result<BatchReport, Refused> {
        let _turn = self.writer.lock().expect("writer lock");
        // On `Err` the transaction is dropped, which rolls it back.
        self.with_conn(|conn| apply_in(conn, batch))
    }

    fn get(&self, key: &[u8]) -> Option<(u64, Vec<u8>)> {
        self.with_conn(|conn| {
            conn.prepare_cached(FACT_GET)
                .expect("prepare")
                .query_row(params![key], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
                .optional()
                .expect("get")
        })
    }

    fn digest(&self) -> Option<u128> {
        self.with_conn(|conn| {
            let mut d = DigestBuilder::new();
            let mut rows = conn.prepare("SELECT key, seq, value FROM fact ORDER BY key").expect("prepare");
            let mut it = rows.query([]).expect("query");
            while let Some(r) = it.next().expect("row") {
                let key: Vec<u8> = r.get(0).expect("key");
                let seq: i64 = r.get(1).expect("seq");
                let value: Vec<u8> = r.get(2).expect("value");
                d.row(&key, seq as u64, &value);
            }
            let mut ck = conn.prepare("SELECT source, position FROM checkpoint ORDER BY source").expect("prepare");
            let mut it = ck.query([]).expect("query");
            while let Some(r) = it.next().expect("row") {
                let s: Vec<u8> = r.get(0).expect("source");
                let p: Vec<u8> = r.get(1).expect("position");
                d.checkpoint(&s, &p);
            }
            Some(d.finish())
        })
    }

    fn compact(&self) -> Result<(), String> {
        self.with_conn(|conn| {
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); VACUUM;").map_err(|e| e.to_string())
        })
    }
}
