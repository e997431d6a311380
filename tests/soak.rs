//! Soak test (SPEC section 4; issue 5): writers and readers in a child
//! process that is killed with SIGKILL at random moments and restarted, for as
//! long as asked.
//!
//! The parent (`soak_short`, about 25 seconds, runs with the other tests;
//! `soak_long`, ignored, runs for `IDEMKV_SOAK_SECS` seconds) runs this test
//! binary again and again with `soak_child_process` selected and
//! `IDEMKV_SOAK_CHILD_DIR` naming its work directory. Without that variable
//! `soak_child_process` does nothing.
//!
//! The child opens the store (`Durability::Sync`, small segments) and runs:
//! - `WRITERS` writers. Writer `w` applies batches `w{w}-{i}` for `i` = 0, 1,
//!   ..., each a pure function of `(w, i)`: a put of the same value at seq
//!   `i + 1` (of 20 KiB in every 64th batch) to both keys of one of its
//!   pairs (`w{w}/p{k}/a` and `.../b`),
//!   now and then deletes of both keys of another pair, an add of `w + 1` to
//!   a shared counter, redeliveries of events of its earlier batches, and
//!   checkpoint `w{w}` = `i`. It checks each report against the one the
//!   model predicts; after each `Ok` it appends `acked w{w}-{i}` to its
//!   acknowledgement file and fsyncs it. On start it resumes after its
//!   checkpoint, re-applying the last committed batch (and an older one),
//!   which must be `replayed`.
//! - `READERS` readers, each repeatedly scanning the whole store: the rows
//!   must be exactly the state after some prefix of each writer's batches
//!   (both keys of a pair equal, the counters equal to the adds of exactly
//!   those batches), bracketed by the checkpoints read before and after, and
//!   never going back.
//! - A maintenance thread that compacts or snapshots every few hundred ms;
//!   the writers' batches also trigger automatic snapshots (1 MiB of log),
//!   installed on the store's own thread.
//!
//! Any violation in the child prints `FAILURE`, records it in a file and
//! aborts. After each child ends (killed, or now and then stopped and closed
//! cleanly) the parent opens the store itself and checks that every
//! acknowledged batch is there, that the log holds exactly each writer's
//! batches up to its checkpoint in order with the predicted reports, that the
//! rows and counters are exactly the state after those batches, and that
//! `verify` passes; then it starts the next child. Every
//! `GENERATION_BATCHES` committed batches it starts over with an empty store,
//! so that a run of hours keeps the index (a week of batch and event ids)
//! to a few hundred MB.
//!
//! A SIGKILL leaves the page cache intact, so this test exercises process
//! crashes, not power loss (`tests/crash.rs` covers that).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idemkv::{Batch, BatchReport, Delivery, Durability, Op, Options, Record, Store};

const CHILD_DIR_VAR: &str = "IDEMKV_SOAK_CHILD_DIR";
const CHILD_SEED_VAR: &str = "IDEMKV_SOAK_CHILD_SEED";
/// How long the child runs before it stops and closes the store; 0: until killed.
const CHILD_LIFE_VAR: &str = "IDEMKV_SOAK_CHILD_LIFE_MS";
const SECS_VAR: &str = "IDEMKV_SOAK_SECS";
const SEED_VAR: &str = "IDEMKV_SOAK_SEED";

const STORE_DIR: &str = "store";
const FAILURE_FILE: &str = "child-failure.txt";
const PROGRESS_FILE: &str = "child-progress.txt";

const WRITERS: u64 = 4;
const READERS: usize = 2;
/// Key pairs per writer.
const PAIRS: u64 = 8;
/// Counters shared by all writers.
const COUNTERS: u64 = 3;
/// Small, so that the log rotates every few hundred batches.
const SEGMENT_BYTES_MAX: u64 = 256 << 10;

/// The parent starts over with an empty store once this many batches have
/// committed: the index keeps every batch and event id for a week (the
/// default TTLs), so memory and open time would otherwise grow for hours.
const GENERATION_BATCHES: u64 = 500_000;

/// Log bytes after which a batch makes an automatic snapshot due (and at
/// least the last snapshot's size).
const SNAPSHOT_LOG_BYTES: u64 = 1 << 20;

const SHORT_SECS: u64 = 25;
/// How often a long soak prints where it is.
const REPORT_EVERY: Duration = Duration::from_secs(300);
const LONG_DEFAULT_SECS: u64 = 600;

fn options() -> Options {
    Options::default()
        .durability(Durability::Sync)
        .segment_bytes_max(SEGMENT_BYTES_MAX)
        // Automatic snapshots every few seconds as well, so that kills also
        // land while one is installed on the store's own thread.
        .snapshot_log_bytes(Some(SNAPSHOT_LOG_BYTES))
}

// ---------------------------------------------------------------------------
// The workload: every batch is a pure function of (writer, index).

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn mix(w: u64, i: u64, salt: u64) -> u64 {
    splitmix(splitmix(splitmix(salt) ^ w) ^ i)
}

/// A small seeded generator for the parent's and child's random choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix(self.0)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn source(w: u64) -> String {
    format!("w{w}")
}

fn batch_id(w: u64, i: u64) -> String {
    format!("w{w}-{i}")
}

fn parse_batch_id(id: &[u8]) -> Option<(u64, u64)> {
    let (w, i) = std::str::from_utf8(id)
        .ok()?
        .strip_prefix('w')?
        .split_once('-')?;
    let (w, i) = (w.parse().ok()?, i.parse().ok()?);
    (w < WRITERS).then_some((w, i))
}

fn pair_key(w: u64, k: u64, side: &str) -> String {
    format!("w{w}/p{k}/{side}")
}

fn counter_key(c: u64) -> String {
    format!("counter/{c}")
}

fn delta(w: u64) -> i64 {
    w as i64 + 1
}

/// The value batch `i` of writer `w` puts into both keys of its pair.
/// Every `LARGE_EVERY`th batch of a writer puts values of 20 KiB: its
/// record, with both keys of a pair, is past the size whose application to
/// the index the store hands to a thread of its own (DESIGN.md,
/// "Publishing"), so that kills also land while that thread holds a batch.
const LARGE_EVERY: u64 = 64;

fn value(w: u64, i: u64) -> Vec<u8> {
    let mut v = format!("w{w} b{i} ").into_bytes();
    let filler = if i % LARGE_EVERY == LARGE_EVERY - 1 {
        20 << 10
    } else {
        (mix(w, i, 1) % 300) as usize
    };
    v.extend(std::iter::repeat_n(b'a' + (i % 26) as u8, filler));
    v
}

/// The pair batch `i` of writer `w` deletes, if any: never the one it puts.
fn deleted_pair(w: u64, i: u64) -> Option<u64> {
    let r = mix(w, i, 2);
    r.is_multiple_of(4)
        .then(|| (i % PAIRS + 1 + (r >> 8) % (PAIRS - 1)) % PAIRS)
}

fn delivery(event_id: String, key: String, seq: u64, op: Op) -> Delivery {
    Delivery {
        event_id: event_id.into(),
        key: key.into(),
        seq,
        op,
    }
}

/// The events batch `i` of writer `w` introduces (its first deliveries).
fn events(w: u64, i: u64) -> Vec<Delivery> {
    let seq = i + 1;
    let k = i % PAIRS;
    let mut out = vec![
        delivery(
            format!("w{w}-{i}-a"),
            pair_key(w, k, "a"),
            seq,
            Op::Put(value(w, i).into()),
        ),
        delivery(
            format!("w{w}-{i}-b"),
            pair_key(w, k, "b"),
            seq,
            Op::Put(value(w, i).into()),
        ),
    ];
    if let Some(d) = deleted_pair(w, i) {
        out.push(delivery(
            format!("w{w}-{i}-da"),
            pair_key(w, d, "a"),
            seq,
            Op::Delete,
        ));
        out.push(delivery(
            format!("w{w}-{i}-db"),
            pair_key(w, d, "b"),
            seq,
            Op::Delete,
        ));
    }
    out.push(delivery(
        format!("w{w}-{i}-c"),
        counter_key(i % COUNTERS),
        seq,
        Op::Add(delta(w)),
    ));
    out
}

/// Batch `i` of writer `w`: its events, up to three redeliveries of events of
/// its 64 previous batches, now and then a second delivery of its own first
/// event, and its checkpoint.
fn batch(w: u64, i: u64) -> Batch {
    let mut b = Batch::new(batch_id(w, i));
    let own = events(w, i);
    for d in &own {
        b.push_delivery(d.clone());
    }
    let r = mix(w, i, 3);
    if i > 0 {
        for n in 0..r % 4 {
            let x = mix(w, i, 10 + n);
            let j = i - 1 - x % i.min(64);
            let old = events(w, j);
            let pick = (x >> 32) as usize % old.len();
            b.push_delivery(old[pick].clone());
        }
    }
    if (r >> 8).is_multiple_of(8) {
        b.push_delivery(own[0].clone());
    }
    b.set_checkpoint(source(w), i.to_be_bytes());
    b
}

/// The batch whose put is live on pair `k` of writer `w` once its batches up
/// to `last` have committed (`None`: the pair is absent).
fn pair_state(w: u64, last: Option<u64>, k: u64) -> Option<u64> {
    let mut j = last?;
    loop {
        if j % PAIRS == k {
            return Some(j);
        }
        if deleted_pair(w, j) == Some(k) {
            return None;
        }
        j = j.checked_sub(1)?;
    }
}

/// The report batch `i` of writer `w` returns when it commits.
fn expected_report(w: u64, i: u64) -> BatchReport {
    let own = events(w, i).len() as u64;
    let mut r = BatchReport {
        added: 1,
        duplicates: batch(w, i).len() as u64 - own,
        ..BatchReport::default()
    };
    if pair_state(w, i.checked_sub(1), i % PAIRS).is_some() {
        r.updated = 2;
    } else {
        r.inserted = 2;
    }
    if deleted_pair(w, i).is_some() {
        r.deleted = 2;
    }
    r
}

/// How many of batches `0..=last` add to counter `c`, and the last of them.
fn counter_adds(last: Option<u64>, c: u64) -> (u64, Option<u64>) {
    match last {
        Some(l) if l >= c => ((l - c) / COUNTERS + 1, Some(l - (l - c) % COUNTERS)),
        _ => (0, None),
    }
}

type Rows = BTreeMap<Bytes, Record>;

/// Every live row once each writer `w` has committed its batches up to `last[w]`.
fn expected_rows(last: &[Option<u64>]) -> Rows {
    let mut rows = Rows::new();
    for (w, &l) in (0..WRITERS).zip(last) {
        for k in 0..PAIRS {
            if let Some(j) = pair_state(w, l, k) {
                for side in ["a", "b"] {
                    let record = Record {
                        seq: j + 1,
                        value: value(w, j).into(),
                    };
                    rows.insert(pair_key(w, k, side).into(), record);
                }
            }
        }
    }
    for c in 0..COUNTERS {
        let mut sum = 0;
        let mut seq = None;
        for (w, &l) in (0..WRITERS).zip(last) {
            let (adds, latest) = counter_adds(l, c);
            sum += delta(w) * adds as i64;
            seq = seq.max(latest.map(|j| j + 1));
        }
        if let Some(seq) = seq {
            let record = Record {
                seq,
                value: sum.to_string().into(),
            };
            rows.insert(counter_key(c).into(), record);
        }
    }
    rows
}

/// The last batch of each writer that the rows show: its rows' highest seq,
/// minus one (a writer's newest batch always leaves its pair live).
fn shown_batches(rows: &Rows) -> Vec<Option<u64>> {
    (0..WRITERS)
        .map(|w| {
            let prefix = format!("w{w}/");
            rows.iter()
                .filter(|(k, _)| k.starts_with(prefix.as_bytes()))
                .map(|(_, r)| r.seq.saturating_sub(1))
                .max()
        })
        .collect()
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn show_record(record: Option<&Record>) -> String {
    match record {
        None => "absent".to_owned(),
        Some(r) => {
            let v = show(&r.value);
            let v = v.get(..24).unwrap_or(&v);
            format!("seq {} value {v:?}", r.seq)
        }
    }
}

/// Checks that `rows` are exactly the state after each writer's batches up
/// to `last`; first, that no pair's two keys disagree (half a batch).
fn check_rows(rows: &Rows, last: &[Option<u64>]) -> Result<(), String> {
    for w in 0..WRITERS {
        for k in 0..PAIRS {
            let a = rows.get(pair_key(w, k, "a").as_bytes());
            let b = rows.get(pair_key(w, k, "b").as_bytes());
            if a != b {
                return Err(format!(
                    "half-visible batch: {} is {}, {} is {}",
                    pair_key(w, k, "a"),
                    show_record(a),
                    pair_key(w, k, "b"),
                    show_record(b)
                ));
            }
        }
    }
    let expected = expected_rows(last);
    if *rows == expected {
        return Ok(());
    }
    let mut diffs = Vec::new();
    let keys: std::collections::BTreeSet<&Bytes> = rows.keys().chain(expected.keys()).collect();
    for key in keys {
        let (got, want) = (rows.get(key), expected.get(key));
        if got != want {
            diffs.push(format!(
                "{}: {} where {} was expected",
                show(key),
                show_record(got),
                show_record(want)
            ));
        }
    }
    Err(format!(
        "rows differ from the state after batches {last:?}: {}",
        diffs.join("; ")
    ))
}

fn scan_all(store: &Store) -> Result<Rows, String> {
    store
        .scan_prefix(b"")
        .map(|row| row.map_err(|e| format!("scan: {e}")))
        .collect()
}

/// Each writer's checkpoint: the index of its last committed batch.
fn checkpoints(store: &Store) -> Result<Vec<Option<u64>>, String> {
    (0..WRITERS)
        .map(|w| {
            let position = store
                .checkpoint(source(w))
                .map_err(|e| format!("checkpoint {w}: {e}"))?;
            position
                .map(|p| {
                    <[u8; 8]>::try_from(p.as_ref())
                        .map(u64::from_be_bytes)
                        .map_err(|_| format!("checkpoint of writer {w} is {p:?}"))
                })
                .transpose()
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The child.

static CHILD_DIR: OnceLock<PathBuf> = OnceLock::new();

/// Reports a violation loudly and aborts the child.
fn fail(message: impl Display) -> ! {
    let message = format!("soak child {}: FAILURE: {message}\n", std::process::id());
    eprint!("{message}");
    if let Some(dir) = CHILD_DIR.get() {
        let _ = OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(FAILURE_FILE))
            .and_then(|mut f| f.write_all(message.as_bytes()));
    }
    std::process::abort();
}

/// Appends a line to the progress file (counts the parent sums up at the end).
fn progress(line: &str) {
    let dir = CHILD_DIR.get().expect("child dir is set");
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(PROGRESS_FILE))
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        fail(format!("progress file: {e}"));
    }
}

fn ack_path(dir: &Path, w: u64) -> PathBuf {
    dir.join(format!("acks-w{w}.txt"))
}

fn apply_and_ack(store: &Store, acks: &mut File, w: u64, i: u64, replay: bool) {
    let id = batch_id(w, i);
    let report = store
        .apply_batch(&batch(w, i))
        .unwrap_or_else(|e| fail(format!("apply {id}: {e}")));
    let expected = BatchReport {
        replayed: replay,
        ..expected_report(w, i)
    };
    if report != expected {
        fail(format!("{id} returned {report:?}, expected {expected:?}"));
    }
    let acked = acks
        .write_all(format!("acked {id}\n").as_bytes())
        .and_then(|()| acks.sync_data());
    if let Err(e) = acked {
        fail(format!("ack file of writer {w}: {e}"));
    }
}

fn writer(store: &Store, dir: &Path, w: u64, seed: u64, stop: &AtomicBool) {
    let mut rng = Rng(seed);
    let mut acks = OpenOptions::new()
        .create(true)
        .append(true)
        .open(ack_path(dir, w))
        .unwrap_or_else(|e| fail(format!("open ack file of writer {w}: {e}")));
    let checkpoint = checkpoints(store).unwrap_or_else(|e| fail(e))[w as usize];
    // The source redelivers from its checkpoint: the last committed batch
    // (and, now and then, an older one) comes again and must be a replay.
    if let Some(c) = checkpoint {
        apply_and_ack(store, &mut acks, w, c, true);
        if c > 0 && rng.below(2) == 0 {
            apply_and_ack(store, &mut acks, w, rng.below(c), true);
        }
    }
    let mut i = checkpoint.map_or(0, |c| c + 1);
    while !stop.load(Ordering::SeqCst) {
        apply_and_ack(store, &mut acks, w, i, false);
        i += 1;
    }
}

fn reader(store: &Store, stop: &AtomicBool) {
    let mut last: Vec<Option<u64>> = vec![None; WRITERS as usize];
    let mut checks = 0u64;
    while !stop.load(Ordering::SeqCst) {
        // A batch registered before the scan must show in it.
        let probes: Vec<(u64, bool)> = (0..WRITERS)
            .zip(&last)
            .map(|(w, l)| {
                let next = l.map_or(0, |l| l + 1);
                let registered = store
                    .batch(batch_id(w, next))
                    .unwrap_or_else(|e| fail(format!("batch lookup: {e}")))
                    .is_some();
                (next, registered)
            })
            .collect();
        let before = checkpoints(store).unwrap_or_else(|e| fail(e));
        let rows = scan_all(store).unwrap_or_else(|e| fail(e));
        let after = checkpoints(store).unwrap_or_else(|e| fail(e));
        let shown = shown_batches(&rows);
        if let Err(e) = check_rows(&rows, &shown) {
            fail(format!("reader: {e}"));
        }
        for w in 0..WRITERS {
            let ix = w as usize;
            let s = shown[ix];
            if s < before[ix] || s > after[ix] {
                fail(format!(
                    "writer {w}: rows show batch {s:?}, checkpoints before and after the scan were {:?} and {:?}",
                    before[ix], after[ix]
                ));
            }
            let (probe, registered) = probes[ix];
            if registered && s < Some(probe) {
                fail(format!(
                    "batch {} was registered before the scan, which shows only up to {s:?}",
                    batch_id(w, probe)
                ));
            }
            if s < last[ix] {
                fail(format!(
                    "writer {w}: rows went back from batch {:?} to {s:?}",
                    last[ix]
                ));
            }
            if let Some(s) = s {
                let report = store
                    .batch(batch_id(w, s))
                    .unwrap_or_else(|e| fail(format!("batch lookup: {e}")));
                if report != Some(expected_report(w, s)) {
                    fail(format!(
                        "rows show batch {}, whose registered report is {report:?}",
                        batch_id(w, s)
                    ));
                }
            }
        }
        last = shown;
        checks += 1;
        if checks.is_multiple_of(100) {
            progress("scans 100");
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// Sleeps up to `ms`, in short steps; false if `stop` was set meanwhile.
fn nap(ms: u64, stop: &AtomicBool) -> bool {
    let until = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < until {
        if stop.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

fn maintenance(store: &Store, seed: u64, stop: &AtomicBool) {
    let mut rng = Rng(seed);
    while nap(50 + rng.below(550), stop) {
        if rng.below(3) == 0 {
            store
                .compact()
                .unwrap_or_else(|e| fail(format!("compact: {e}")));
            progress("compact");
        } else {
            store
                .snapshot()
                .unwrap_or_else(|e| fail(format!("snapshot: {e}")));
            progress("snapshot");
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {text:?}")),
    )
}

/// Not a test of its own: the child the soak tests run and kill (see the
/// module comment). Without `IDEMKV_SOAK_CHILD_DIR` it does nothing.
#[test]
fn soak_child_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    CHILD_DIR.set(dir.clone()).expect("set once");
    let seed = env_u64(CHILD_SEED_VAR).unwrap_or(0);
    let life_ms = env_u64(CHILD_LIFE_VAR).unwrap_or(0);
    let store =
        Store::open(dir.join(STORE_DIR), options()).unwrap_or_else(|e| fail(format!("open: {e}")));
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for w in 0..WRITERS {
            let (store, dir, stop) = (&store, &dir, &stop);
            s.spawn(move || writer(store, dir, w, mix(seed, w, 100), stop));
        }
        for _ in 0..READERS {
            s.spawn(|| reader(&store, &stop));
        }
        s.spawn(|| maintenance(&store, mix(seed, 0, 200), &stop));
        if life_ms == 0 {
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        std::thread::sleep(Duration::from_millis(life_ms));
        stop.store(true, Ordering::SeqCst);
    });
    store
        .close()
        .unwrap_or_else(|e| fail(format!("close: {e}")));
    progress("closed");
}

// ---------------------------------------------------------------------------
// The parent.

/// The soak tests run one at a time (a child forked by one could hold the
/// other's lock file for a moment; see `tests/locking.rs`).
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Kills the child if the parent fails while it runs.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(work: &Path, seed: u64, life_ms: u64) -> KillOnDrop {
    let child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "soak_child_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR_VAR, work)
        .env(CHILD_SEED_VAR, seed.to_string())
        .env(CHILD_LIFE_VAR, life_ms.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the soak child");
    KillOnDrop(child)
}

#[derive(Debug, Default)]
struct Tally {
    child_runs: u64,
    kills: u64,
    early_kills: u64,
    clean_stops: u64,
    restarts: u64,
    /// Fresh stores started after `GENERATION_BATCHES`.
    generations: u64,
    /// Batches committed in the earlier generations.
    batches_before: u64,
    /// Batches committed in the current generation.
    batches_committed: u64,
    acks_checked: u64,
    /// Byte offset up to which each writer's ack file has been checked.
    ack_offsets: Vec<u64>,
    /// The highest acknowledged batch of each writer.
    acked: Vec<Option<u64>>,
    torn_tails_cut: u64,
    /// Why `verify_dir` refused a directory a child left, and how many torn
    /// bytes the open after it cut.
    verify_dir_refusals: Vec<String>,
    snapshots_rejected: Vec<String>,
    longest_check: Duration,
    last_stats: Option<idemkv::Stats>,
}

/// Reads the complete lines appended to `path` since `offset`.
fn new_lines(path: &Path, offset: &mut u64) -> Result<Vec<String>, String> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("open {}: {e}", path.display())),
    };
    let mut text = String::new();
    file.seek(SeekFrom::Start(*offset))
        .and_then(|_| file.read_to_string(&mut text))
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    // A line the kill cut short is not an acknowledgement yet.
    let complete = text.rfind('\n').map_or(0, |n| n + 1);
    *offset += complete as u64;
    Ok(text[..complete].lines().map(str::to_owned).collect())
}

/// The checks after a child ended, with the parent holding the store.
fn check_after_child(work: &Path, tally: &mut Tally) -> Result<(), String> {
    if let Ok(text) = fs::read_to_string(work.join(FAILURE_FILE)) {
        return Err(format!("the child reported: {text}"));
    }
    let dir = work.join(STORE_DIR);
    // Before open repairs anything: a kill may leave a torn tail (which
    // verify_dir calls corruption and open cuts off) or, in a rotation, a
    // new segment whose header is torn (which open writes again, cutting
    // no torn bytes), nothing worse: the store must then verify.
    let refused = Store::verify_dir(&dir, &options()).err();
    let store = Store::open(&dir, options()).map_err(|e| format!("open after the child: {e}"))?;
    let stats = store.stats();
    if stats.torn_bytes_discarded > 0 {
        tally.torn_tails_cut += 1;
    }
    if let Some(e) = refused {
        let torn = stats.torn_bytes_discarded;
        tally
            .verify_dir_refusals
            .push(format!("{e} (open then cut {torn} torn bytes)"));
    }
    if let Some(reason) = &stats.snapshot_rejected {
        tally.snapshots_rejected.push(reason.clone());
    }
    store
        .verify()
        .map_err(|e| format!("verify after reopen: {e}"))?;

    let last = checkpoints(&store)?;

    // The log: each writer's batches 0..=checkpoint, in order, each with its
    // predicted report; nothing after the checkpoint.
    let mut next = vec![0u64; WRITERS as usize];
    let mut added_total = 0i64;
    let mut adds = 0u64;
    for entry in store.log() {
        let (w, i) = parse_batch_id(&entry.batch_id)
            .ok_or_else(|| format!("unknown batch {:?} in the log", entry.batch_id))?;
        let n = &mut next[w as usize];
        if i != *n {
            return Err(format!(
                "the log lists {} where {} was expected",
                batch_id(w, i),
                batch_id(w, *n)
            ));
        }
        if entry.report != expected_report(w, i) {
            return Err(format!(
                "the log reports {:?} for {}, expected {:?}",
                entry.report,
                batch_id(w, i),
                expected_report(w, i)
            ));
        }
        *n += 1;
        adds += entry.report.added;
        added_total += delta(w) * entry.report.added as i64;
    }
    for (w, (&n, &l)) in (0..WRITERS).zip(next.iter().zip(&last)) {
        if n != l.map_or(0, |l| l + 1) {
            return Err(format!(
                "writer {w}: checkpoint {l:?}, but the log holds its batches 0..{n}"
            ));
        }
        let beyond = batch_id(w, n);
        if store
            .batch(&beyond)
            .map_err(|e| format!("batch {beyond}: {e}"))?
            .is_some()
        {
            return Err(format!(
                "{beyond} is registered but not in the log or the checkpoint"
            ));
        }
    }

    // Every acknowledged batch is there.
    for w in 0..WRITERS {
        let ix = w as usize;
        for line in new_lines(&ack_path(work, w), &mut tally.ack_offsets[ix])? {
            let id = line
                .strip_prefix("acked ")
                .ok_or_else(|| format!("bad ack line {line:?}"))?;
            let (aw, i) =
                parse_batch_id(id.as_bytes()).ok_or_else(|| format!("bad ack line {line:?}"))?;
            if aw != w {
                return Err(format!("ack file of writer {w} holds {line:?}"));
            }
            if store
                .batch(id)
                .map_err(|e| format!("batch {id}: {e}"))?
                .is_none()
            {
                return Err(format!("acknowledged batch {id} is missing"));
            }
            if Some(i) > last[ix] {
                return Err(format!(
                    "acknowledged batch {id} is past writer {w}'s checkpoint {:?}",
                    last[ix]
                ));
            }
            tally.acked[ix] = tally.acked[ix].max(Some(i));
            tally.acks_checked += 1;
        }
        // A writer has one batch in flight: it cannot have committed more
        // than one batch past its last acknowledgement.
        let limit = tally.acked[ix].map_or(0, |a| a + 1);
        if last[ix].is_some_and(|l| l > limit) {
            return Err(format!(
                "writer {w}: checkpoint {:?}, but acknowledged only up to {:?}",
                last[ix], tally.acked[ix]
            ));
        }
    }

    // The rows and counters: exactly the state after those batches.
    let rows = scan_all(&store)?;
    check_rows(&rows, &last)?;
    for (key, row) in &rows {
        let got = store
            .get(key)
            .map_err(|e| format!("get {}: {e}", show(key)))?;
        if got.as_ref() != Some(row) {
            return Err(format!(
                "get {} gives {}, the scan {}",
                show(key),
                show_record(got.as_ref()),
                show_record(Some(row))
            ));
        }
    }
    let batches: u64 = next.iter().sum();
    if adds != batches {
        return Err(format!("{batches} batches in the log added {adds} times"));
    }
    let counted: i64 = (0..COUNTERS)
        .filter_map(|c| rows.get(counter_key(c).as_bytes()))
        .map(|r| show(&r.value).parse::<i64>().unwrap_or(i64::MIN))
        .sum();
    if counted != added_total {
        return Err(format!(
            "the counters hold {counted}, the committed adds sum to {added_total}"
        ));
    }

    tally.batches_committed = batches;
    tally.last_stats = Some(store.stats());
    store.close().map_err(|e| format!("close: {e}"))
}

/// Removes the store and the ack files: the next child starts from scratch.
fn start_generation(work: &Path, tally: &mut Tally) {
    fs::remove_dir_all(work.join(STORE_DIR)).expect("remove the store");
    for w in 0..WRITERS {
        fs::remove_file(ack_path(work, w)).expect("remove an ack file");
    }
    tally.generations += 1;
    tally.batches_before += tally.batches_committed;
    tally.batches_committed = 0;
    tally.ack_offsets.fill(0);
    tally.acked.fill(None);
}

/// Runs children and kills them for `secs` seconds; kills come after up to
/// `max_delay_ms`.
fn soak(label: &str, secs: u64, max_delay_ms: u64) {
    let _serial = serial();
    let seed = env_u64(SEED_VAR).unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64
    });
    let tmp = tempfile::Builder::new()
        .prefix("idemkv-soak-")
        .tempdir()
        .expect("temp dir");
    let work = tmp.path().to_owned();
    println!(
        "{label}: {secs} s, seed {seed} ({SEED_VAR}), work dir {}",
        work.display()
    );
    let mut rng = Rng(seed);
    let mut tally = Tally {
        ack_offsets: vec![0; WRITERS as usize],
        acked: vec![None; WRITERS as usize],
        ..Tally::default()
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut failure = check_after_child(&work, &mut tally).err();
    let mut next_report = started + REPORT_EVERY;
    while failure.is_none() && Instant::now() < deadline {
        if Instant::now() >= next_report {
            next_report += REPORT_EVERY;
            println!(
                "{label}: {:.0} s, kills {}, restarts {}, batches committed {}, \
                 acknowledged batches checked {}, failures 0",
                started.elapsed().as_secs_f64(),
                tally.kills,
                tally.restarts,
                tally.batches_before + tally.batches_committed,
                tally.acks_checked
            );
        }
        let child_seed = rng.next();
        // One child in ten stops and closes the store by itself.
        let clean = rng.below(10) == 0;
        let life_ms = if clean {
            100 + rng.below(max_delay_ms)
        } else {
            0
        };
        let mut child = spawn_child(&work, child_seed, life_ms);
        tally.child_runs += 1;
        let ended = if clean {
            let limit = Instant::now() + Duration::from_millis(life_ms) + Duration::from_secs(120);
            loop {
                match child.0.try_wait().expect("try_wait") {
                    Some(status) if status.success() => {
                        tally.clean_stops += 1;
                        break Ok(());
                    }
                    Some(status) => break Err(format!("the child failed: {status}")),
                    None if Instant::now() > limit => {
                        break Err("the child did not stop in time".to_owned());
                    }
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        } else {
            // One kill in five comes within 150 ms of the start, mostly
            // while the child opens the store.
            let early = rng.below(5) == 0;
            let delay = if early {
                rng.below(150)
            } else {
                150 + rng.below(max_delay_ms.saturating_sub(150).max(1))
            };
            std::thread::sleep(Duration::from_millis(delay));
            match child.0.try_wait().expect("try_wait") {
                Some(status) => Err(format!("the child ended before the kill: {status}")),
                None => {
                    child.0.kill().expect("SIGKILL the child");
                    let status = child.0.wait().expect("wait for the child");
                    tally.kills += 1;
                    tally.early_kills += u64::from(early);
                    match status.signal() {
                        Some(9) => Ok(()),
                        _ => Err(format!("the child ended by itself: {status}")),
                    }
                }
            }
        };
        drop(child);
        let check_started = Instant::now();
        failure = match ended {
            Ok(()) => check_after_child(&work, &mut tally).err(),
            Err(e) => {
                let reported = fs::read_to_string(work.join(FAILURE_FILE)).unwrap_or_default();
                Some(format!("{e}; the child reported: {reported}"))
            }
        };
        tally.longest_check = tally.longest_check.max(check_started.elapsed());
        if failure.is_none() {
            tally.restarts += 1;
            if tally.batches_committed >= GENERATION_BATCHES {
                start_generation(&work, &mut tally);
            }
        }
    }

    let mut progress = BTreeMap::<String, u64>::new();
    for line in fs::read_to_string(work.join(PROGRESS_FILE))
        .unwrap_or_default()
        .lines()
    {
        let mut words = line.split(' ');
        let what = words.next().unwrap_or_default().to_owned();
        let n = words.next().and_then(|n| n.parse().ok()).unwrap_or(1);
        *progress.entry(what).or_default() += n;
    }
    let count = |what: &str| progress.get(what).copied().unwrap_or(0);
    let failures = u64::from(failure.is_some());
    println!(
        "{label} summary after {:.0} s (seed {seed}): child runs {}, kills {} ({} within 150 ms of the start), \
         clean stops {}, restarts {}, fresh stores {}, batches committed {}, acknowledged batches checked {}, \
         reader scans {}+, compactions {}, snapshots {}, torn tails cut at open {}, \
         verify_dir refusals before open {}, snapshots rejected at open {}, \
         longest parent check {:.2} s, failures {failures}",
        started.elapsed().as_secs_f64(),
        tally.child_runs,
        tally.kills,
        tally.early_kills,
        tally.clean_stops,
        tally.restarts,
        tally.generations,
        tally.batches_before + tally.batches_committed,
        tally.acks_checked,
        count("scans"),
        count("compact"),
        count("snapshot"),
        tally.torn_tails_cut,
        tally.verify_dir_refusals.len(),
        tally.snapshots_rejected.len(),
        tally.longest_check.as_secs_f64(),
    );
    if let Some(stats) = &tally.last_stats {
        println!(
            "{label} final store: {} live keys, {} tombstones, {} seen ids, {} batches, \
             {} segments, {} bytes on disk, index bytes {:?}",
            stats.live_keys,
            stats.tombstones,
            stats.seen_ids,
            stats.batches,
            stats.segments,
            stats.disk_bytes,
            stats.index_bytes
        );
    }
    for reason in &tally.snapshots_rejected {
        println!("{label}: a snapshot was rejected at open: {reason}");
    }
    for reason in &tally.verify_dir_refusals {
        println!("{label}: verify_dir refused a directory a child left: {reason}");
    }
    if let Some(failure) = failure {
        let kept = tmp.keep();
        panic!(
            "{label} FAILED (seed {seed}; work dir kept at {}): {failure}",
            kept.display()
        );
    }
    assert!(
        tally.kills > 0 && tally.batches_before + tally.batches_committed > 0,
        "{label} did too little: {tally:?}"
    );
}

/// The short form, run with the other tests: about 25 seconds, a dozen or
/// more kills.
#[test]
fn soak_short() {
    soak("soak (short)", SHORT_SECS, 2000);
}

/// The long form: `IDEMKV_SOAK_SECS=7200 cargo test --release --test soak --
/// --ignored --nocapture`.
#[test]
#[ignore = "long soak; run with --ignored, for IDEMKV_SOAK_SECS seconds"]
fn soak_long() {
    let secs = env_u64(SECS_VAR).unwrap_or(LONG_DEFAULT_SECS);
    soak("soak", secs, 6000);
}
