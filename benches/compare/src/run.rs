//! One engine on one workload, in a process of its own (the child side).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use idemkv::{BatchReport, ManualClock};
use serde::{Deserialize, Serialize};

use crate::engines::{self, Engine, IdemkvConfig, Kind, Mode};
use crate::workload::{self, Generator, Handed, Spec};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
    W5,
}

impl Workload {
    pub const ALL: [Workload; 5] = [Workload::W1, Workload::W2, Workload::W3, Workload::W4, Workload::W5];

    pub fn name(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
            Workload::W5 => "W5",
        }
    }

    pub fn parse(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name().eq_ignore_ascii_case(s))
    }
}

/// Events of W1 and W2 at scale 1.
pub const W1_EVENTS: f64 = 1_000_000.0;
/// Events of W3 at scale 1: every batch of 10 is a sync, so W3 is kept short.
pub const W3_EVENTS: f64 = 60_000.0;
/// Deliveries of W4 at scale 1.
pub const W4_DELIVERIES: f64 = 10_000_000.0;
/// W4: ids and batch ids expire after this much of the workload's clock,
/// which moves one second per batch.
pub const W4_TTL: Duration = Duration::from_secs(30);
/// W5 at scale 1.
pub const W5_KEYS: f64 = 1_000_000.0;
pub const W5_DELIVERIES: f64 = 5_000_000.0;

/// W4's figures are taken (and compaction runs) every million deliveries at scale 1.
pub fn w4_chunk(scale: f64) -> u64 {
    (1_000_000.0 * scale).round().max(1_000.0) as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Apply the workload, then die without closing (as a crash would).
    Run,
    /// Reopen what `Run` left, read one key, digest, close, reopen again.
    Reopen,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub workload: Workload,
    pub kind: Kind,
    pub mode: Mode,
    pub threads: usize,
    pub scale: f64,
    pub dir: PathBuf,
    pub phase: Phase,
}

/// One row of W4: figures of one million deliveries.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Chunk {
    pub deliveries: u64,
    pub deliveries_per_s: f64,
    pub compact_s: f64,
    pub rss_kb: u64,
    pub disk_bytes: u64,
    pub seen_ids: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub deliveries: u64,
    pub batches: u64,
    pub seconds: f64,
    pub disk_bytes: u64,
    pub peak_rss_kb: u64,
    pub digest: Option<String>,
    /// Counts of all first hand-overs, in `BatchReport::counts` order.
    pub totals: [u64; 8],
    pub replays: u64,
    pub syncs: Option<u64>,
    /// Reopen after the crash (W1-W4) or the clean close (W5), ms.
    pub reopen_ms: Option<f64>,
    /// Reopen after a clean close (W1-W4), or by full replay (W5, idemkv), ms.
    pub reopen2_ms: Option<f64>,
    pub reopen_digest: Option<String>,
    /// idemkv: bytes after `compact` in the reopen phase.
    pub compacted_bytes: Option<u64>,
    /// Free-form figures (idemkv's stats).
    pub notes: Vec<(String, String)>,
    pub chunks: Vec<Chunk>,
}

impl Outcome {
    pub fn deliveries_per_s(&self) -> f64 {
        self.deliveries as f64 / self.seconds.max(1e-9)
    }
}

pub fn proc_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes allocated to the files under `dir` (what `du` counts: sparse or
/// preallocated-but-unwritten parts count only if blocks back them).
pub fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

fn hex(d: Option<u128>) -> Option<String> {
    d.map(|d| format!("{d:032x}"))
}

fn spec_of(job: &Job) -> Spec {
    let scaled = |n: f64| (n * job.scale).round().max(1.0) as u64;
    match job.workload {
        Workload::W1 => Spec::w1(scaled(W1_EVENTS)),
        Workload::W2 => Spec {
            redeliver: 0.9,
            ..Spec::w1(scaled(W1_EVENTS))
        },
        Workload::W3 => Spec {
            batch_size: 10,
            sources: job.threads as u64,
            ..Spec::w1(scaled(W3_EVENTS))
        },
        // About 1.2 deliveries per event (20% redelivered, 2% replays).
        Workload::W4 => Spec::w1(scaled(W4_DELIVERIES / 1.22)),
        Workload::W5 => unreachable!("W5 has its own generator"),
    }
}

fn config_of(job: &Job, clock: Option<&ManualClock>) -> IdemkvConfig {
    IdemkvConfig {
        seen_ttl: (job.workload == Workload::W4).then_some(W4_TTL),
        clock: clock.cloned(),
        count_syncs: job.workload == Workload::W3,
    }
}

/// Checks one hand-over's report and adds it to the totals.
fn account(kind: Kind, h: &Handed, report: &BatchReport, out: &mut Outcome) {
    out.batches += 1;
    out.deliveries += h.batch.len() as u64;
    if kind.has_state() {
        assert_eq!(
            report.replayed, h.replay,
            "{}: batch {:?} replayed = {}",
            kind.name(),
            String::from_utf8_lossy(h.batch.id()),
            report.replayed
        );
        assert_eq!(report.deliveries(), h.batch.len() as u64, "{}: counts do not add up", kind.name());
    }
    if h.replay {
        out.replays += 1;
    } else {
        for (t, c) in out.totals.iter_mut().zip(report.counts()) {
            *t += c;
        }
    }
}

fn apply(engine: &dyn Engine, kind: Kind, h: &Handed) -> BatchReport {
    engine
        .apply(&h.batch)
        .unwrap_or_else(|e| panic!("{}: batch {:?} refused: {e}", kind.name(), String::from_utf8_lossy(h.batch.id())))
}

pub fn run(job: &Job) -> Outcome {
    match job.phase {
        Phase::Run => match job.workload {
            Workload::W3 => run_threads(job),
            Workload::W5 => run_w5(job),
            _ => run_stream(job),
        },
        Phase::Reopen => reopen(job),
    }
}

/// W1, W2, W4: one writer; only the time inside `apply` counts, and in W4
/// also the compactions the workload calls for.
fn run_stream(job: &Job) -> Outcome {
    let w4 = job.workload == Workload::W4;
    let clock = w4.then(|| ManualClock::new(1_700_000_000_000));
    let engine = engines::open(job.kind, &job.dir, job.mode, &config_of(job, clock.as_ref()));
    let mut out = Outcome::default();
    let mut busy = Duration::ZERO;
    let mut chunk_busy = Duration::ZERO;
    let mut chunk_start = 0;
    for h in Generator::new(spec_of(job)) {
        if let (Some(clock), false) = (&clock, h.replay) {
            clock.advance(Duration::from_secs(1));
        }
        let started = Instant::now();
        let report = apply(engine.as_ref(), job.kind, &h);
        let took = started.elapsed();
        busy += took;
        chunk_busy += took;
        account(job.kind, &h, &report, &mut out);
        if w4 && out.deliveries - chunk_start >= w4_chunk(job.scale) {
            let started = Instant::now();
            engine.compact().expect("compact");
            let compacting = started.elapsed();
            busy += compacting;
            chunk_busy += compacting;
            out.chunks.push(Chunk {
                deliveries: out.deliveries,
                deliveries_per_s: (out.deliveries - chunk_start) as f64 / chunk_busy.as_secs_f64(),
                compact_s: compacting.as_secs_f64(),
                rss_kb: proc_status_kb("VmRSS:"),
                disk_bytes: dir_bytes(&job.dir),
                seen_ids: idemkv_stat(engine.as_ref(), job.kind, |s| s.seen_ids),
            });
            chunk_start = out.deliveries;
            chunk_busy = Duration::ZERO;
        }
    }
    out.seconds = busy.as_secs_f64();
    let out = finish_run(job, engine.as_ref(), out);
    std::mem::forget(engine);
    out
}

fn idemkv_stat(engine: &dyn Engine, kind: Kind, f: impl Fn(&idemkv::Stats) -> u64) -> Option<u64> {
    if kind != Kind::Idemkv {
        return None;
    }
    engine.idemkv_stats().map(|s| f(&s))
}

/// W3: batches spread over `threads` writers, wall time.
fn run_threads(job: &Job) -> Outcome {
    let engine: Arc<dyn Engine> = engines::open(job.kind, &job.dir, job.mode, &config_of(job, None)).into();
    let threads = job.threads.max(1);
    let mut lanes: Vec<Vec<Handed>> = (0..threads).map(|_| Vec::new()).collect();
    let mut originals = 0usize;
    for h in Generator::new(spec_of(job)) {
        // A replay goes to the writer that handed the original.
        let lane = if h.replay { (originals - 1) % threads } else { originals % threads };
        if !h.replay {
            originals += 1;
        }
        lanes[lane].push(h);
    }
    let barrier = Arc::new(Barrier::new(threads + 1));
    let kind = job.kind;
    let handles: Vec<_> = lanes
        .into_iter()
        .map(|lane| {
            let engine = Arc::clone(&engine);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut out = Outcome::default();
                barrier.wait();
                for h in &lane {
                    let report = apply(engine.as_ref(), kind, h);
                    account(kind, h, &report, &mut out);
                }
                out
            })
        })
        .collect();
    let syncs_before = engine.syncs();
    barrier.wait();
    let started = Instant::now();
    let mut out = Outcome::default();
    for handle in handles {
        let part = handle.join().expect("writer thread");
        out.deliveries += part.deliveries;
        out.batches += part.batches;
        out.replays += part.replays;
        for (t, c) in out.totals.iter_mut().zip(part.totals) {
            *t += c;
        }
    }
    out.seconds = started.elapsed().as_secs_f64();
    out.syncs = match (engine.syncs(), syncs_before) {
        (Some(after), Some(before)) => Some(after - before),
        _ => None,
    };
    let out = finish_run(job, engine.as_ref(), out);
    std::mem::forget(engine);
    out
}

/// W5: load a store of `W5_KEYS` keys and `W5_DELIVERIES` seen ids, buffered, then close cleanly.
fn run_w5(job: &Job) -> Outcome {
    let engine = engines::open(job.kind, &job.dir, job.mode, &config_of(job, None));
    let keys = (W5_KEYS * job.scale).round().max(1.0) as u64;
    let deliveries = (W5_DELIVERIES * job.scale).round().max(1.0) as u64;
    let mut out = Outcome::default();
    let mut busy = Duration::ZERO;
    for batch in workload::w5_batches(keys, deliveries, 5_000) {
        let h = Handed { batch, replay: false };
        let started = Instant::now();
        let report = apply(engine.as_ref(), job.kind, &h);
        busy += started.elapsed();
        account(job.kind, &h, &report, &mut out);
    }
    out.seconds = busy.as_secs_f64();
    engine.settle();
    out.peak_rss_kb = proc_status_kb("VmHWM:");
    out.disk_bytes = dir_bytes(&job.dir);
    out.notes = notes(engine.as_ref(), job.kind);
    out.digest = hex(engine.digest());
    engine.close().expect("close");
    out
}

/// Settles, measures, digests; the caller then dies without closing, so
/// that the reopen phase starts from what a crash would leave.
fn finish_run(job: &Job, engine: &dyn Engine, mut out: Outcome) -> Outcome {
    engine.settle();
    out.peak_rss_kb = proc_status_kb("VmHWM:");
    out.disk_bytes = dir_bytes(&job.dir);
    if out.syncs.is_none() {
        out.syncs = engine.syncs();
    }
    out.notes = notes(engine, job.kind);
    out.digest = hex(engine.digest());
    out
}

fn notes(engine: &dyn Engine, kind: Kind) -> Vec<(String, String)> {
    let Some(s) = (kind == Kind::Idemkv).then(|| engine.idemkv_stats()).flatten() else {
        return Vec::new();
    };
    vec![
        ("live_keys".into(), s.live_keys.to_string()),
        ("seen_ids".into(), s.seen_ids.to_string()),
        ("segments".into(), s.segments.to_string()),
        ("index_bytes_keys".into(), s.index_bytes.keys.to_string()),
        ("index_bytes_seen".into(), s.index_bytes.seen.to_string()),
        ("index_bytes_batches".into(), s.index_bytes.batches.to_string()),
    ]
}

fn open_timed(job: &Job) -> (Box<dyn Engine>, f64) {
    let started = Instant::now();
    let engine = engines::open(job.kind, &job.dir, job.mode, &IdemkvConfig::default());
    let _ = engine.get(workload::key_name(0).as_bytes());
    (engine, started.elapsed().as_secs_f64() * 1e3)
}

/// Reopens after the crash, closes cleanly and reopens again, timing both
/// opens the same way for every engine; idemkv's compaction (for its
/// compacted size) comes after the second, so that it times neither.
fn reopen(job: &Job) -> Outcome {
    let mut out = Outcome::default();
    let (engine, first_ms) = open_timed(job);
    out.reopen_ms = Some(first_ms);
    out.reopen_digest = hex(engine.digest());
    if job.kind == Kind::Idemkv {
        out.notes = engine
            .idemkv_stats()
            .map(|s| {
                vec![
                    ("opened_from_snapshot".into(), s.opened_from_snapshot.to_string()),
                    ("records_replayed_at_open".into(), s.records_replayed_at_open.to_string()),
                ]
            })
            .unwrap_or_default();
    }
    engine.close().expect("close");
    if job.workload == Workload::W5 {
        if job.kind == Kind::Idemkv {
            // Full replay: without the snapshot.
            std::fs::remove_file(job.dir.join("SNAPSHOT")).expect("remove snapshot");
            let (engine, ms) = open_timed(job);
            out.reopen2_ms = Some(ms);
            engine.close().expect("close");
        }
    } else {
        let (engine, ms) = open_timed(job);
        out.reopen2_ms = Some(ms);
        if job.kind == Kind::Idemkv {
            engine.compact().expect("compact");
            out.compacted_bytes = Some(dir_bytes(&job.dir));
        }
        engine.close().expect("close");
    }
    out.peak_rss_kb = proc_status_kb("VmHWM:");
    out
}
