//! The peer comparison of BENCHMARKS.md: W1 to W5 against idemkv, SQLite,
//! redb, fjall, RocksDB (feature `rocksdb`), the disk floor and the CPU floor.
//!
//! The program re-executes itself for every engine, workload and mode
//! (`--child`), reads back a JSON result, checks that every engine ends in
//! the same digest, and prints one table per workload. RocksDB's runs, and
//! the semantics check when RocksDB is among the engines, go to the
//! `idemkv-compare-rocksdb` binary beside it instead, the only one that
//! links RocksDB: its library adds 8-9 MiB to the resident memory of any
//! process that loads it, which would count against every engine. See
//! README.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::engines::{self, Kind, Mode};
use crate::run::{self, Job, Outcome, Phase, Workload};
use crate::selftest;

const RESULT_PREFIX: &str = "RESULT ";

struct Args {
    workloads: Vec<Workload>,
    engines: Vec<Kind>,
    modes: Vec<Mode>,
    threads: Vec<usize>,
    scale: f64,
    runs: usize,
    dir: PathBuf,
    out: Option<PathBuf>,
    skip_check: bool,
    check_only: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: idemkv-compare [--all | --workloads W1,W2,...] [--engines idemkv,sqlite,...]
       [--modes durable,buffered] [--threads 1,2,8] [--scale F | --quick] [--runs N]
       [--dir DIR] [--out FILE] [--skip-check] [--check]

  --all         W1 to W5 (the default)
  --quick       scale 0.05 (about a minute per workload); --scale 1 is the reference
  --scale F     also from COMPARE_SCALE
  --runs N      runs per engine and mode, round-robin; the median by deliveries/s is shown
  --dir DIR     where stores are made (default: a directory under the system temp dir)
  --out FILE    also write the tables (markdown) to FILE
  --check       only the semantics check
  --skip-check  no semantics check before the workloads
engines: idemkv, sqlite, redb, fjall, rocksdb (feature `rocksdb`), disk-floor, cpu-floor"
    );
    std::process::exit(2)
}

fn list<T>(value: Option<String>, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    let value = value.unwrap_or_else(|| usage());
    value
        .split(',')
        .map(|s| parse(s.trim()).unwrap_or_else(|| {
            eprintln!("unknown: {s}");
            usage()
        }))
        .collect()
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Args {
    let mut args = Args {
        workloads: Workload::ALL.to_vec(),
        engines: Kind::ALL.into_iter().filter(|k| k.available()).collect(),
        modes: vec![Mode::Durable, Mode::Buffered],
        threads: vec![1, 2, 8],
        scale: std::env::var("COMPARE_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1.0),
        runs: 1,
        dir: std::env::temp_dir().join("idemkv-compare"),
        out: None,
        skip_check: false,
        check_only: false,
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--all" => args.workloads = Workload::ALL.to_vec(),
            "--workloads" | "-w" => args.workloads = list(it.next(), Workload::parse),
            "--engines" | "-e" => args.engines = list(it.next(), Kind::parse),
            "--modes" => {
                args.modes = list(it.next(), |s| match s {
                    "durable" => Some(Mode::Durable),
                    "buffered" => Some(Mode::Buffered),
                    _ => None,
                })
            }
            "--threads" => args.threads = list(it.next(), |s| s.parse().ok()),
            "--scale" => args.scale = it.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            "--quick" => args.scale = 0.05,
            "--runs" => args.runs = it.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            "--dir" => args.dir = it.next().map(PathBuf::from).unwrap_or_else(|| usage()),
            "--out" => args.out = it.next().map(PathBuf::from),
            "--skip-check" => args.skip_check = true,
            "--check" => args.check_only = true,
            _ => usage(),
        }
    }
    for k in &args.engines {
        if !k.available() {
            eprintln!(
                "{} needs idemkv-compare-rocksdb beside this binary: cargo build --release --features rocksdb (see README.md)",
                k.name()
            );
            std::process::exit(2);
        }
    }
    args
}

/// The program: a parent run from the command line, or a `--child` run of one job.
pub fn main() {
    let mut argv = std::env::args().skip(1).peekable();
    if argv.peek().map(String::as_str) == Some("--child") {
        let job: Job = serde_json::from_str(&argv.nth(1).expect("job")).expect("job json");
        let out = run::run(&job);
        println!("{RESULT_PREFIX}{}", serde_json::to_string(&out).expect("json"));
        // No destructors: a `Run` ends as a crash would.
        std::process::exit(0);
    }
    let args = parse_args(argv);
    std::fs::create_dir_all(&args.dir).expect("create --dir");
    if !args.skip_check {
        let dir = args.dir.join("check");
        let checked = if args.engines.contains(&Kind::Rocksdb) && !engines::links_rocksdb() {
            check_in_rocksdb_binary(&args)
        } else {
            selftest::run(&dir, &args.engines)
        };
        if let Err(e) = checked {
            eprintln!("SEMANTICS CHECK FAILED: {e}");
            std::process::exit(1);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if args.check_only {
        return;
    }
    let mut report = String::new();
    header(&mut report, &args);
    print!("{report}");
    let mut failures = Vec::new();
    for &w in &args.workloads {
        let mut by_threads = Vec::new();
        for threads in threads_of(w, &args) {
            let results = run_workload(&args, w, threads, &mut failures);
            let mut section = String::new();
            failures.extend(check(w, threads, &results));
            table(&mut section, w, threads, &results, &args);
            by_threads.push((threads, results));
            if w == Workload::W3 && by_threads.len() == threads_of(w, &args).len() {
                group_commit_table(&mut section, &by_threads);
            }
            print!("{section}");
            report.push_str(&section);
            if let Some(out) = &args.out {
                std::fs::write(out, &report).expect("write --out");
            }
        }
    }
    // The verdict goes into `--out` too: a file from a failed run must say so.
    let mut verdict = String::new();
    if failures.is_empty() {
        verdict.push_str("\nAll digests agree.\n");
    } else {
        verdict.push_str("\nDIGESTS DISAGREE:\n");
        for f in &failures {
            let _ = writeln!(verdict, "- {f}");
        }
    }
    print!("{verdict}");
    if let Some(out) = &args.out {
        report.push_str(&verdict);
        std::fs::write(out, &report).expect("write --out");
    }
    if !failures.is_empty() {
        std::process::exit(1);
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1).map(|s| s.trim().to_owned()))
        .unwrap_or_else(|| "unknown".into())
}

fn header(out: &mut String, args: &Args) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next()?.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cmd: Vec<String> = std::env::args().skip(1).collect();
    let _ = writeln!(out, "# idemkv peer comparison\n");
    let _ = writeln!(
        out,
        "Machine: {cores} cores ({}), {mem_gib:.0} GiB, Linux {}; shared with other work while it ran, so figures are noisy.",
        cpu_model(),
        kernel.trim()
    );
    let _ = writeln!(out, "Scale {} (1 = BENCHMARKS.md), {} run(s) per figure (median). Arguments: {}", args.scale, args.runs, cmd.join(" "));
    let _ = writeln!(out, "idemkv: {}. Stores in {}.", idemkv_version(), args.dir.display());
}

/// The idemkv source this binary was built from: commit, and whether the
/// library had uncommitted changes.
fn idemkv_version() -> String {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let git = |args: &[&str]| {
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "version unknown".into(),
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--", "src", "Cargo.toml"]).is_some_and(|s| !s.is_empty());
            format!("commit {commit}{}", if dirty { " with uncommitted changes to src/ or Cargo.toml" } else { "" })
        }
    }
}

fn threads_of(w: Workload, args: &Args) -> Vec<usize> {
    if w == Workload::W3 { args.threads.clone() } else { vec![1] }
}

/// (engine, mode) pairs a workload runs.
fn cases(w: Workload, args: &Args) -> Vec<(Kind, Mode)> {
    let mut out = Vec::new();
    for &kind in &args.engines {
        let modes: Vec<Mode> = match (w, kind) {
            // Nothing to be durable about.
            (_, Kind::CpuFloor) if w == Workload::W3 || w == Workload::W5 => vec![],
            (_, Kind::CpuFloor) => vec![Mode::Buffered],
            // W4 needs expiry: idemkv only (the CPU floor, without expiry, gives the digest).
            (Workload::W4, Kind::Idemkv) => vec![Mode::Durable],
            (Workload::W4, _) => vec![],
            (Workload::W3, _) => vec![Mode::Durable],
            (Workload::W5, k) if k.persistent() => vec![Mode::Buffered],
            (Workload::W5, _) => vec![],
            _ => args.modes.clone(),
        };
        out.extend(modes.into_iter().map(|m| (kind, m)));
    }
    out
}

/// The semantics check of every engine asked for, RocksDB included, run by
/// the binary that links RocksDB.
fn check_in_rocksdb_binary(args: &Args) -> Result<(), String> {
    let exe = engines::rocksdb_exe().ok_or("idemkv-compare-rocksdb not found")?;
    let names: Vec<&str> = args.engines.iter().map(|k| k.name()).collect();
    let status = Command::new(exe)
        .args(["--check", "--engines", &names.join(","), "--dir"])
        .arg(&args.dir)
        .stdin(Stdio::null())
        .status()
        .map_err(|e| format!("spawn idemkv-compare-rocksdb: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("idemkv-compare-rocksdb --check: {status}"))
    }
}

/// The binary that runs `kind`'s jobs: RocksDB's in the one that links it,
/// every other engine's in one that does not load RocksDB's library.
fn exe_for(kind: Kind) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    if kind == Kind::Rocksdb {
        return engines::rocksdb_exe().expect("checked by parse_args");
    }
    let plain = exe.with_file_name(format!("idemkv-compare{}", std::env::consts::EXE_SUFFIX));
    if engines::links_rocksdb() && plain.is_file() {
        plain
    } else {
        exe
    }
}

fn child(job: &Job) -> Outcome {
    let output = Command::new(exe_for(job.kind))
        .arg("--child")
        .arg(serde_json::to_string(job).expect("json"))
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("spawn child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix(RESULT_PREFIX));
    match (output.status.success(), line) {
        (true, Some(json)) => serde_json::from_str(json).expect("result json"),
        _ => {
            eprintln!(
                "{} {} {} {:?} failed: {}",
                job.workload.name(),
                job.kind.name(),
                job.mode.name(),
                job.phase,
                output.status
            );
            std::process::exit(1);
        }
    }
}

struct Row {
    kind: Kind,
    mode: Mode,
    outcome: Outcome,
}

/// Runs every case `--runs` times, round-robin (so that a slow spell of a
/// shared machine hits several engines rather than all runs of one), and
/// keeps each case's median run by deliveries/s. Every run's digests must
/// agree with the case's first run.
fn run_workload(args: &Args, w: Workload, threads: usize, failures: &mut Vec<String>) -> Vec<Row> {
    let cases = cases(w, args);
    let mut runs: Vec<Vec<Outcome>> = cases.iter().map(|_| Vec::new()).collect();
    for round in 0..args.runs.max(1) {
        for (i, &(kind, mode)) in cases.iter().enumerate() {
            let dir = args.dir.join(format!("{}-{}-{}-t{threads}", w.name(), kind.name(), mode.name()));
            let _ = std::fs::remove_dir_all(&dir);
            let mut job = Job {
                workload: w,
                kind,
                mode,
                threads,
                scale: args.scale,
                dir: dir.clone(),
                phase: Phase::Run,
            };
            eprintln!("{} t{threads} run {}: {} {} ...", w.name(), round + 1, kind.name(), mode.name());
            let mut outcome = child(&job);
            if kind.persistent() {
                job.phase = Phase::Reopen;
                let reopened = child(&job);
                outcome.reopen_ms = reopened.reopen_ms;
                outcome.reopen2_ms = reopened.reopen2_ms;
                outcome.reopen_digest = reopened.reopen_digest;
                outcome.compacted_bytes = reopened.compacted_bytes;
                outcome.notes.extend(reopened.notes);
            }
            eprintln!(
                "    {:.0} deliveries/s, digest {}",
                outcome.deliveries_per_s(),
                outcome.digest.as_deref().unwrap_or("-")
            );
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(first) = runs[i].first()
                && (first.digest != outcome.digest || first.reopen_digest != outcome.reopen_digest)
            {
                failures.push(format!(
                    "{} t{threads} {} {}: run {} ended in another digest than run 1",
                    w.name(),
                    kind.name(),
                    mode.name(),
                    round + 1
                ));
            }
            runs[i].push(outcome);
        }
    }
    cases
        .into_iter()
        .zip(runs)
        .map(|((kind, mode), mut runs)| {
            runs.sort_by(|a, b| a.deliveries_per_s().total_cmp(&b.deliveries_per_s()));
            // The median; of an even count, the slower of the middle two.
            let outcome = runs.swap_remove((runs.len() - 1) / 2);
            Row { kind, mode, outcome }
        })
        .collect()
}

/// Digests (and, with one writer, report totals) must agree; a reopened
/// store must have the digest it was left with.
fn check(w: Workload, threads: usize, rows: &[Row]) -> Vec<String> {
    let mut failures = Vec::new();
    let label = |r: &Row| format!("{} {} {}", w.name(), r.kind.name(), r.mode.name());
    let stateful: Vec<&Row> = rows.iter().filter(|r| r.kind.has_state()).collect();
    let mut by_digest: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for r in &stateful {
        by_digest
            .entry(r.outcome.digest.as_deref().unwrap_or("none"))
            .or_default()
            .push(format!("{} {}", r.kind.name(), r.mode.name()));
        if r.kind.persistent() && r.outcome.reopen_digest != r.outcome.digest {
            failures.push(format!(
                "{}: reopened with digest {:?}, left with {:?}",
                label(r),
                r.outcome.reopen_digest,
                r.outcome.digest
            ));
        }
    }
    if by_digest.len() > 1 {
        let groups: Vec<String> = by_digest.iter().map(|(d, who)| format!("{} = {}", &d[..d.len().min(12)], who.join(", "))).collect();
        failures.push(format!("{} t{threads}: {}", w.name(), groups.join(" | ")));
    }
    // With one writer the order is fixed, so every report must agree too;
    // W4's idemkv expires ids, which can only turn late duplicates into stale.
    if threads == 1 && w != Workload::W4 {
        let mut by_totals: BTreeMap<[u64; 8], Vec<String>> = BTreeMap::new();
        for r in &stateful {
            by_totals.entry(r.outcome.totals).or_default().push(label(r));
        }
        if by_totals.len() > 1 {
            failures.push(format!("{} report totals differ: {by_totals:?}", w.name()));
        }
    }
    failures
}

fn rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn ms(x: Option<f64>) -> String {
    match x {
        None => "-".into(),
        Some(x) if x >= 1000.0 => format!("{:.2} s", x / 1000.0),
        Some(x) => format!("{x:.1} ms"),
    }
}

fn ratio(x: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 => format!("{:.2}×", x / b),
        _ => "-".into(),
    }
}

fn note<'a>(o: &'a Outcome, key: &str) -> Option<&'a str> {
    o.notes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn base_rate(rows: &[Row], kind: Kind, mode: Mode) -> Option<f64> {
    rows.iter().find(|r| r.kind == kind && r.mode == mode).map(|r| r.outcome.deliveries_per_s())
}

fn table(out: &mut String, w: Workload, threads: usize, rows: &[Row], args: &Args) {
    let first = rows.first().map(|r| &r.outcome);
    let deliveries = first.map_or(0, |o| o.deliveries);
    let batches = first.map_or(0, |o| o.batches);
    let _ = writeln!(out);
    match w {
        Workload::W1 => {
            let _ = writeln!(out, "## W1: at-least-once CDC ingest ({deliveries} deliveries in {batches} batches, 20% redelivered)\n");
        }
        Workload::W2 => {
            let _ = writeln!(out, "## W2: duplicate storm ({deliveries} deliveries in {batches} batches, 90% of events redelivered)\n");
        }
        Workload::W3 => {
            let _ = writeln!(out, "## W3: batches of 10 from {threads} writer thread(s), durable ({deliveries} deliveries in {batches} batches)\n");
        }
        Workload::W4 => {
            let _ = writeln!(
                out,
                "## W4: long run with expiry ({deliveries} deliveries; seen_ttl {} s of a clock moving 1 s per batch; compaction every {} deliveries)\n",
                run::W4_TTL.as_secs(),
                run::w4_chunk(args.scale)
            );
            let _ = writeln!(out, "Only idemkv runs W4: none of the peers has TTL bookkeeping for seen ids. The CPU floor keeps every id (no expiry) and gives the reference digest. idemkv's deliveries/s count its compactions' time.\n");
        }
        Workload::W5 => return w5_table(out, rows, args),
    }
    if w == Workload::W3 {
        let _ = writeln!(out, "| engine | mode | deliveries/s | batches/s | × SQLite | × idemkv | syncs/batch | disk | peak RSS | reopen after crash / clean | digest |");
        let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    } else {
        let _ = writeln!(out, "| engine | mode | deliveries/s | × SQLite | × idemkv | disk | peak RSS | reopen after crash / clean | digest |");
        let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---|");
    }
    for r in rows {
        let o = &r.outcome;
        let d = o.deliveries_per_s();
        let digest = o.digest.as_deref().map_or("-".to_owned(), |d| d[..12].to_owned());
        let reopen = if r.kind.persistent() {
            format!("{} / {}", ms(o.reopen_ms), ms(o.reopen2_ms))
        } else {
            "-".into()
        };
        let vs_sqlite = ratio(d, base_rate(rows, Kind::Sqlite, r.mode));
        let vs_idemkv = ratio(d, base_rate(rows, Kind::Idemkv, r.mode));
        if w == Workload::W3 {
            let syncs = o.syncs.map_or("-".into(), |s| format!("{:.2}", s as f64 / o.batches.max(1) as f64));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {vs_sqlite} | {vs_idemkv} | {syncs} | {} | {} | {reopen} | {digest} |",
                r.kind.name(),
                r.mode.name(),
                rate(d),
                rate(o.batches as f64 / o.seconds.max(1e-9)),
                mib(o.disk_bytes),
                mib(o.peak_rss_kb * 1024),
            );
        } else {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {vs_sqlite} | {vs_idemkv} | {} | {} | {reopen} | {digest} |",
                r.kind.name(),
                r.mode.name(),
                rate(d),
                mib(o.disk_bytes),
                mib(o.peak_rss_kb * 1024),
            );
        }
    }
    let _ = writeln!(out);
    if matches!(w, Workload::W1 | Workload::W2) {
        targets(out, rows);
    }
    for r in rows.iter().filter(|r| r.kind == Kind::Idemkv) {
        let o = &r.outcome;
        let _ = writeln!(
            out,
            "idemkv {}: {} segment(s); reopen after the crash replayed {} record(s) (snapshot: {}); after `compact` {}.",
            r.mode.name(),
            note(o, "segments").unwrap_or("?"),
            note(o, "records_replayed_at_open").unwrap_or("?"),
            note(o, "opened_from_snapshot").unwrap_or("?"),
            o.compacted_bytes.map_or("-".into(), mib),
        );
    }
    if w == Workload::W4 {
        for r in rows {
            let _ = writeln!(out, "\n{} every {} deliveries:\n", r.kind.name(), run::w4_chunk(args.scale));
            let _ = writeln!(out, "| deliveries | deliveries/s (with compaction) | compaction | RSS | disk | seen ids held |");
            let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|");
            for c in &r.outcome.chunks {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} |",
                    c.deliveries,
                    rate(c.deliveries_per_s),
                    ms(Some(c.compact_s * 1e3)),
                    mib(c.rss_kb * 1024),
                    mib(c.disk_bytes),
                    c.seen_ids.map_or("-".into(), |s| s.to_string())
                );
            }
        }
    }
    if w == Workload::W3 {
        let _ = writeln!(out, "syncs/batch: data syncs counted through idemkv's `Storage` (the peers cannot tell).");
    }
}

/// W3 across thread counts: how batches per second grow with writers.
fn group_commit_table(out: &mut String, by_threads: &[(usize, Vec<Row>)]) {
    let Some((_, first)) = by_threads.first() else { return };
    let _ = writeln!(out, "\n## W3: batches per second by writer threads (group commit)\n");
    let heads: Vec<String> = by_threads.iter().map(|(t, _)| format!("{t} thread(s)")).collect();
    let last = by_threads.last().map_or(1, |(t, _)| *t);
    let base = by_threads[0].0;
    let _ = writeln!(out, "| engine | {} | {last} / {base} |", heads.join(" | "));
    let _ = writeln!(out, "|---|{}---:|", "---:|".repeat(heads.len()));
    for r in first {
        let per: Vec<Option<f64>> = by_threads
            .iter()
            .map(|(_, rows)| {
                rows.iter()
                    .find(|x| x.kind == r.kind && x.mode == r.mode)
                    .map(|x| x.outcome.batches as f64 / x.outcome.seconds.max(1e-9))
            })
            .collect();
        let cells: Vec<String> = per.iter().map(|p| p.map_or("-".into(), rate)).collect();
        let gain = match (per.first().copied().flatten(), per.last().copied().flatten()) {
            (Some(a), Some(b)) if a > 0.0 => format!("{:.2}×", b / a),
            _ => "-".into(),
        };
        let _ = writeln!(out, "| {} | {} | {gain} |", r.kind.name(), cells.join(" | "));
    }
}

/// The W1/W2 ratios, in one line per mode.
fn targets(out: &mut String, rows: &[Row]) {
    for mode in [Mode::Durable, Mode::Buffered] {
        let Some(idem) = base_rate(rows, Kind::Idemkv, mode) else { continue };
        let mut parts = Vec::new();
        if let Some(s) = base_rate(rows, Kind::Sqlite, mode) {
            parts.push(format!("{:.1}× SQLite", idem / s));
        }
        let best = rows
            .iter()
            .filter(|r| r.mode == mode && matches!(r.kind, Kind::Redb | Kind::Fjall | Kind::Rocksdb))
            .max_by(|a, b| a.outcome.deliveries_per_s().total_cmp(&b.outcome.deliveries_per_s()));
        if let Some(b) = best {
            parts.push(format!("{:.1}× the best of redb/fjall/RocksDB ({})", idem / b.outcome.deliveries_per_s(), b.kind.name()));
        }
        let floor = if mode == Mode::Durable { Kind::DiskFloor } else { Kind::CpuFloor };
        if let Some(f) = base_rate(rows, floor, mode) {
            parts.push(format!("{:.0}% of the {}", 100.0 * idem / f, floor.name()));
        }
        if !parts.is_empty() {
            let _ = writeln!(out, "idemkv {}: {}.", mode.name(), parts.join(", "));
        }
    }
}

fn w5_table(out: &mut String, rows: &[Row], args: &Args) {
    let keys = (run::W5_KEYS * args.scale).round();
    let ids = (run::W5_DELIVERIES * args.scale).round();
    let _ = writeln!(out, "## W5: reopen of a store of {keys} live keys and {ids} seen ids (loaded buffered in batches of 5,000, closed cleanly)\n");
    let _ = writeln!(out, "| engine | load deliveries/s | disk | disk bytes per seen id | reopen | reopen by full replay | index bytes per seen id | index bytes per key | digest |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let o = &r.outcome;
        let num = |k: &str| note(o, k).and_then(|v| v.parse::<f64>().ok());
        let per = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.1}", a / b),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} | {} |",
            r.kind.name(),
            rate(o.deliveries_per_s()),
            mib(o.disk_bytes),
            o.disk_bytes as f64 / ids.max(1.0),
            ms(o.reopen_ms),
            ms(o.reopen2_ms),
            per(num("index_bytes_seen"), num("seen_ids")),
            per(num("index_bytes_keys"), num("live_keys")),
            o.digest.as_deref().map_or("-".to_owned(), |d| d[..12].to_owned()),
        );
    }
    let _ = writeln!(out, "\nidemkv's plain reopen loads its snapshot; \"full replay\" deletes the snapshot first. The peers have one way to open. Index bytes per key include the key's own bytes (10).");
}
