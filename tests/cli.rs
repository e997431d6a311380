//! End-to-end tests of the `idemkv` binary: ingest against an independent
//! model of the contract, kill -9 and torn-log resumes, order independence,
//! fail-closed bad input, quarantine, locking, and the small commands.
//!
//! Streams come from a seeded PRNG, so every run sees the same data; only the
//! moments of the kills vary.

#![cfg(feature = "cli")]

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_idemkv");

// ---------------------------------------------------------------------------
// Running the binary

fn idemkv(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("the idemkv binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs and expects exit 0; returns stdout.
fn ok(args: &[&str]) -> String {
    let out = idemkv(args);
    assert!(
        out.status.success(),
        "idemkv {args:?} failed ({:?}):\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Runs and expects exit 1; returns stderr.
fn fails(args: &[&str]) -> String {
    let out = idemkv(args);
    assert_eq!(
        out.status.code(),
        Some(1),
        "idemkv {args:?}: expected exit 1, got {:?}; stdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stderr)
}

fn s(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// `ingest --json` with the given extra arguments; returns the report object.
fn ingest_json(store: &Path, file: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["ingest", "--store", s(store), "--json"];
    args.extend_from_slice(extra);
    args.push(s(file));
    let stdout = ok(&args);
    serde_json::from_str(stdout.trim()).expect("ingest --json prints one JSON object")
}

/// `ingest --json -` with `body` on stdin and the given extra arguments;
/// returns the report object.
fn ingest_stdin(store: &Path, body: &[u8], extra: &[&str]) -> Value {
    ingest_piped(store, "-", body, extra)
}

/// `ingest --json INPUT`, with `body` piped to its stdin.
fn ingest_piped(store: &Path, input: &str, body: &[u8], extra: &[&str]) -> Value {
    let mut args = vec!["ingest", "--store", s(store), "--json"];
    args.extend_from_slice(extra);
    args.push(input);
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body)
        .expect("feed");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_str(text(&out.stdout).trim()).expect("ingest --json prints one JSON object")
}

fn digest(store: &Path) -> String {
    let digest = ok(&["digest", "--store", s(store)]).trim().to_owned();
    assert_eq!(digest.len(), 32, "digest {digest:?}");
    assert!(digest.bytes().all(|b| b.is_ascii_hexdigit()));
    digest
}

fn scan(store: &Path) -> Vec<String> {
    ok(&["scan", "--store", s(store), "--json"])
        .lines()
        .map(str::to_owned)
        .collect()
}

fn checkpoint(store: &Path, source: &str) -> Option<u64> {
    let out = idemkv(&["checkpoint", "--store", s(store), source]);
    if !out.status.success() {
        return None;
    }
    Some(
        text(&out.stdout)
            .trim()
            .parse()
            .expect("checkpoint is a decimal offset"),
    )
}

/// `log --json` as (batch id, eight counts).
fn log(store: &Path) -> Vec<(String, [u64; 8])> {
    ok(&["log", "--store", s(store), "--json"])
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("log line is JSON");
            let id = v["batch_id"].as_str().expect("batch_id").to_owned();
            (id, counts_of(&v))
        })
        .collect()
}

const COUNT_NAMES: [&str; 8] = [
    "inserted",
    "updated",
    "unchanged",
    "stale",
    "duplicates",
    "deleted",
    "added",
    "rejected",
];

fn counts_of(v: &Value) -> [u64; 8] {
    COUNT_NAMES.map(|name| {
        v[name]
            .as_u64()
            .unwrap_or_else(|| panic!("count {name} in {v}"))
    })
}

fn newest_segment(store: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = fs::read_dir(store)
        .expect("store dir lists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|ext| ext == "seg"))
        .collect();
    segments.sort();
    segments.pop().expect("the store has a segment")
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut body = lines.join("\n");
    body.push('\n');
    fs::write(path, body).expect("write input file");
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

// ---------------------------------------------------------------------------
// A tiny deterministic PRNG (splitmix64)

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(len as u64)).expect("fits")
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.index(i + 1);
            items.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------
// Generated events, and their NDJSON spellings

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    /// A put: (qty, amount_cents, has_note); its canonical JSON is built by `canonical_value`.
    Put(u64, u64, bool),
    Delete,
    Add(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    id: String,
    key: String,
    seq: u64,
    kind: Kind,
}

fn canonical_value(qty: u64, amount: u64, has_note: bool) -> String {
    if has_note {
        format!(r#"{{"amount_cents":{amount},"note":"café","qty":{qty}}}"#)
    } else {
        format!(r#"{{"amount_cents":{amount},"qty":{qty}}}"#)
    }
}

/// One delivery's line, spelled one of several equivalent ways.
fn spell(event: &Event, rng: &mut Rng) -> String {
    let id = &event.id;
    let key = &event.key;
    let seq = event.seq;
    match &event.kind {
        Kind::Put(qty, amount, has_note) => {
            let value = match (rng.below(3), has_note) {
                (0, _) => canonical_value(*qty, *amount, *has_note),
                (1, false) => format!(r#"{{ "qty": {qty}, "amount_cents": {amount} }}"#),
                (1, true) => {
                    format!(r#"{{"qty":{qty},"note":"caf\u00e9","amount_cents":{amount}}}"#)
                }
                (_, false) => format!(r#"{{"qty":{qty},"amount_cents":{amount}}}"#),
                (_, true) => format!(
                    r#"{{ "note" : "caf\u00E9" , "qty" : {qty} , "amount_cents" : {amount} }}"#
                ),
            };
            if rng.chance(50) {
                format!(
                    r#"{{"event_id":"{id}","key":"{key}","seq":{seq},"op":"put","value":{value}}}"#
                )
            } else {
                format!(
                    r#"{{"value":{value}, "op":"put", "seq":"{seq}", "key":"{key}", "event_id":"{id}"}}"#
                )
            }
        }
        Kind::Delete => {
            if rng.chance(50) {
                format!(r#"{{"event_id":"{id}","key":"{key}","seq":{seq},"op":"delete"}}"#)
            } else {
                format!(
                    r#"{{"op":"delete","seq":{seq},"key":"{key}","event_id":"{id}","value":null}}"#
                )
            }
        }
        Kind::Add(delta) => {
            format!(r#"{{"event_id":"{id}","key":"{key}","seq":{seq},"op":"add","delta":{delta}}}"#)
        }
    }
}

/// `n_events` events over 40 order keys and (with `adds`) 5 counter keys;
/// seqs rise per key in creation order.
fn generate_events(rng: &mut Rng, n_events: usize, adds: bool) -> Vec<Event> {
    let mut seq = 100;
    (0..n_events)
        .map(|n| {
            seq += 1 + rng.below(3);
            let roll = rng.below(100);
            let (key, kind) = if adds && roll < 15 {
                let delta = i64::try_from(rng.below(26)).expect("small") - 5;
                (format!("visits/{}", rng.below(5)), Kind::Add(delta))
            } else if roll < 32 {
                (format!("O{}/1", 1000 + rng.below(40)), Kind::Delete)
            } else {
                let value = Kind::Put(1 + rng.below(3), 500 * (1 + rng.below(3)), rng.chance(20));
                (format!("O{}/1", 1000 + rng.below(40)), value)
            };
            Event {
                id: format!("g{n}"),
                key,
                seq,
                kind,
            }
        })
        .collect()
}

/// Deliveries of `events` with redeliveries of earlier events and late
/// (out-of-order) first deliveries.
fn deliveries(rng: &mut Rng, events: &[Event]) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    let mut late: Vec<Event> = Vec::new();
    for event in events {
        if rng.chance(10) {
            late.push(event.clone());
            continue;
        }
        out.push(event.clone());
        if rng.chance(20) {
            let again = out[rng.index(out.len())].clone();
            out.push(again);
        }
        if !late.is_empty() && rng.chance(12) {
            let i = rng.index(late.len());
            out.push(late.swap_remove(i));
        }
    }
    out.extend(late);
    out
}

// ---------------------------------------------------------------------------
// The model: a straightforward implementation of SPEC section 3

#[derive(Default)]
struct Model {
    /// key -> (version, live value as it prints in `scan --json`)
    rows: BTreeMap<String, (u64, Option<String>)>,
    /// event id -> the event it was first seen as
    seen: HashMap<String, Event>,
    counts: [u64; 8],
}

impl Model {
    fn apply(&mut self, d: &Event) {
        const INSERTED: usize = 0;
        const UPDATED: usize = 1;
        const UNCHANGED: usize = 2;
        const STALE: usize = 3;
        const DUPLICATES: usize = 4;
        const DELETED: usize = 5;
        const ADDED: usize = 6;
        if let Some(first) = self.seen.get(&d.id) {
            assert_eq!(
                first, d,
                "the generator never reuses an id with another payload"
            );
            self.counts[DUPLICATES] += 1;
            return;
        }
        self.seen.insert(d.id.clone(), d.clone());
        let row = self.rows.get(&d.key).cloned();
        let version = row.as_ref().map(|r| r.0);
        let live = row.and_then(|r| r.1);
        match &d.kind {
            Kind::Add(delta) => {
                let base: i64 = live.map_or(0, |v| v.parse().expect("counter"));
                let version = version.map_or(d.seq, |v| v.max(d.seq));
                self.rows
                    .insert(d.key.clone(), (version, Some((base + delta).to_string())));
                self.counts[ADDED] += 1;
            }
            _ if version.is_some_and(|v| d.seq <= v) => self.counts[STALE] += 1,
            Kind::Delete => {
                self.rows.insert(d.key.clone(), (d.seq, None));
                self.counts[DELETED] += 1;
            }
            Kind::Put(qty, amount, note) => {
                let value = canonical_value(*qty, *amount, *note);
                let count = match &live {
                    None => INSERTED,
                    Some(old) if *old == value => UNCHANGED,
                    Some(_) => UPDATED,
                };
                self.counts[count] += 1;
                self.rows.insert(d.key.clone(), (d.seq, Some(value)));
            }
        }
    }

    /// The rows `scan --json` must print, in order.
    fn scan_lines(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter_map(|(key, (seq, value))| {
                value
                    .as_ref()
                    .map(|v| format!(r#"{{"key":"{key}","seq":{seq},"value":{v}}}"#))
            })
            .collect()
    }
}

/// A generated stream: deliveries, their lines, and the model after all of them.
fn stream(seed: u64, n_events: usize, adds: bool) -> (Vec<String>, Model) {
    let mut rng = Rng(seed);
    let events = generate_events(&mut rng, n_events, adds);
    let deliveries = deliveries(&mut rng, &events);
    let mut model = Model::default();
    let lines = deliveries
        .iter()
        .map(|d| {
            model.apply(d);
            spell(d, &mut rng)
        })
        .collect();
    (lines, model)
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn ingest_matches_the_model_row_by_row_and_count_by_count() {
    let dir = tempdir();
    let (lines, model) = stream(1, 1500, true);
    let file = dir.path().join("gen.ndjson");
    write_lines(&file, &lines);
    let store = dir.path().join("store");

    let report = ingest_json(&store, &file, &["--source", "gen", "--batch-size", "97"]);
    assert_eq!(counts_of(&report), model.counts, "report {report}");
    let len = fs::metadata(&file).expect("stat").len();
    assert_eq!(report["checkpoint"].as_u64(), Some(len));
    assert_eq!(
        report["batches"].as_u64(),
        Some(lines.len().div_ceil(97) as u64)
    );
    assert_eq!(report["replayed"].as_u64(), Some(0));
    for (i, name) in COUNT_NAMES.iter().enumerate() {
        // The stream exercises every kind of outcome except rejection.
        assert_eq!(
            model.counts[i] > 0,
            *name != "rejected",
            "{name}: {:?}",
            model.counts
        );
    }
    assert_eq!(scan(&store), model.scan_lines());
    assert_eq!(checkpoint(&store, "gen"), Some(len));

    // The run log holds one entry per batch, whose counts add up to the report.
    let entries = log(&store);
    assert_eq!(
        entries.len() as u64,
        report["batches"].as_u64().expect("batches")
    );
    let mut sum = [0u64; 8];
    for (_, counts) in &entries {
        for (total, part) in sum.iter_mut().zip(counts) {
            *total += part;
        }
    }
    assert_eq!(sum, model.counts);
    assert_eq!(
        entries[0].0,
        format!("gen:0-{}", {
            let first: usize = lines[..97].iter().map(|l| l.len() + 1).sum();
            first
        })
    );

    // `get` prints one row, counters as JSON integers.
    for line in model.scan_lines().iter().take(60) {
        let row: Value = serde_json::from_str(line).expect("model line");
        let key = row["key"].as_str().expect("key");
        assert_eq!(ok(&["get", "--store", s(&store), key]).trim(), line);
    }
    let counter = model
        .scan_lines()
        .into_iter()
        .find(|l| l.contains("visits/"))
        .expect("some counter is live");
    let row: Value = serde_json::from_str(&counter).expect("row");
    assert!(row["value"].is_i64(), "{counter}");

    // A rerun finds nothing new; a rerun from the start replays every batch.
    let again = ingest_json(&store, &file, &["--source", "gen", "--batch-size", "97"]);
    assert_eq!(again["batches"].as_u64(), Some(0));
    let replay = ingest_json(
        &store,
        &file,
        &["--source", "gen", "--batch-size", "97", "--from-start"],
    );
    assert_eq!(replay["replayed"], report["batches"]);
    assert_eq!(counts_of(&replay), [0; 8]);
    assert_eq!(scan(&store), model.scan_lines());
}

#[test]
fn kill_9_at_random_moments_then_resume_converges() {
    let dir = tempdir();
    let (lines, model) = stream(2, 4000, true);
    let file = dir.path().join("gen.ndjson");
    write_lines(&file, &lines);
    let len = fs::metadata(&file).expect("stat").len();
    let args = |store: &Path| -> Vec<String> {
        [
            "ingest",
            "--store",
            s(store),
            "--source",
            "gen",
            "--batch-size",
            "16",
            s(&file),
        ]
        .map(str::to_owned)
        .to_vec()
    };

    let clean = dir.path().join("clean");
    let started = Instant::now();
    ok(&args(&clean).iter().map(String::as_str).collect::<Vec<_>>());
    let mut run_us = u64::try_from(started.elapsed().as_micros()).expect("fits");
    assert_eq!(scan(&clean), model.scan_lines());

    let crashed = dir.path().join("crashed");
    let mut rng = Rng(0x4b11);
    let (mut kills, mut mid_run_kills, mut position) = (0, 0, 0);
    let mut runs = 0;
    while mid_run_kills < 8 && kills < 40 && runs < 80 {
        runs += 1;
        let mut child = Command::new(BIN)
            .args(args(&crashed))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ingest");
        // Aim at the first half of what is left of the run, so that kills keep landing.
        let left_us = run_us * (len - position) / len / 2;
        let slept_us = rng.below(left_us + 1);
        thread::sleep(Duration::from_micros(slept_us));
        if let Some(status) = child.try_wait().expect("try_wait") {
            assert!(status.success(), "ingest exited with {status:?}");
            if mid_run_kills > 0 {
                break;
            }
            // The run outpaced the clean one it is timed by, which shared
            // the machine with other tests: start again, at its pace.
            fs::remove_dir_all(&crashed).expect("remove the finished store");
            (run_us, position) = (slept_us.max(1), 0);
            continue;
        }
        child.kill().expect("kill -9");
        child.wait().expect("reap");
        kills += 1;
        position = checkpoint(&crashed, "gen").unwrap_or(0);
        if position > 0 && position < len {
            mid_run_kills += 1;
        }
    }
    ok(&args(&crashed)
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>());
    eprintln!("kill -9: {kills} kills, {mid_run_kills} mid-run; clean run {run_us} us");
    assert!(mid_run_kills > 0, "kills {kills}, mid-run {mid_run_kills}");

    assert_eq!(digest(&crashed), digest(&clean));
    assert_eq!(scan(&crashed), model.scan_lines());
    assert_eq!(checkpoint(&crashed, "gen"), Some(len));
    // Same batches, each committed once, with the same counts.
    assert_eq!(log(&crashed), log(&clean));
}

#[test]
fn truncating_the_newest_segment_at_random_offsets_then_resuming_converges() {
    let dir = tempdir();
    let (lines, model) = stream(3, 1200, true);
    let file = dir.path().join("gen.ndjson");
    write_lines(&file, &lines);
    let base = [
        "--source",
        "gen",
        "--batch-size",
        "20",
        "--durability",
        "buffered",
    ];

    let clean = dir.path().join("clean");
    ingest_json(&clean, &file, &base);

    let torn = dir.path().join("torn");
    let mut rng = Rng(0x7e57);
    for round in 0..8 {
        let max_batches = (1 + rng.below(12)).to_string();
        let mut args = base.to_vec();
        args.extend(["--max-batches", &max_batches]);
        ingest_json(&torn, &file, &args);
        let segment = newest_segment(&torn);
        let seg_len = fs::metadata(&segment).expect("stat").len();
        let cut = rng.below(seg_len + 1);
        OpenOptions::new()
            .write(true)
            .open(&segment)
            .and_then(|f| f.set_len(cut))
            .expect("truncate segment");
        let position = checkpoint(&torn, "gen").unwrap_or(0);
        eprintln!("round {round}: segment {seg_len} bytes cut at {cut}, checkpoint now {position}");
        assert!(
            position <= fs::metadata(&file).expect("stat").len(),
            "round {round}: checkpoint {position}"
        );
    }
    ingest_json(&torn, &file, &base);
    assert_eq!(digest(&torn), digest(&clean));
    assert_eq!(scan(&torn), model.scan_lines());
    assert!(ok(&["verify", "--store", s(&torn)]).starts_with("ok"));
}

#[test]
fn shuffled_deliveries_of_puts_and_deletes_give_one_digest() {
    let dir = tempdir();
    let mut rng = Rng(4);
    let events = generate_events(&mut rng, 600, false);
    let mut lines: Vec<String> = Vec::new();
    let mut model = Model::default();
    for event in &events {
        for _ in 0..1 + rng.below(3) {
            lines.push(spell(event, &mut rng));
        }
        model.apply(event);
    }
    let mut digests = Vec::new();
    for (n, batch_size) in ["1000", "7", "64"].into_iter().enumerate() {
        let mut shuffled = lines.clone();
        Rng(100 + n as u64).shuffle(&mut shuffled);
        let file = dir.path().join(format!("shuffle{n}.ndjson"));
        write_lines(&file, &shuffled);
        let store = dir.path().join(format!("store{n}"));
        let report = ingest_json(
            &store,
            &file,
            &[
                "--source",
                "orders",
                "--batch-size",
                batch_size,
                "--durability",
                "buffered",
            ],
        );
        assert_eq!(counts_of(&report).iter().sum::<u64>(), lines.len() as u64);
        assert_eq!(scan(&store), model.scan_lines(), "shuffle {n}");
        digests.push(digest(&store));
    }
    assert!(digests.windows(2).all(|w| w[0] == w[1]), "{digests:?}");
}

/// 30 valid lines (ids v1..v30, keys k1..k30), with `replace` overriding some.
fn lines_with(replace: &[(usize, &str)]) -> Vec<String> {
    (1..=30)
        .map(|n| {
            replace
                .iter()
                .find(|(line_no, _)| *line_no == n)
                .map_or_else(
                    || {
                        format!(
                            r#"{{"event_id":"v{n}","key":"k{n}","seq":{n},"op":"put","value":{{"n":{n}}}}}"#
                        )
                    },
                    |(_, line)| (*line).to_owned(),
                )
        })
        .collect()
}

fn offset_after_line(lines: &[String], line_no: usize) -> u64 {
    lines[..line_no].iter().map(|l| l.len() as u64 + 1).sum()
}

#[test]
fn a_conflicting_event_id_fails_closed_naming_line_and_id() {
    let dir = tempdir();
    let lines = lines_with(&[(
        25,
        r#"{"event_id":"v3","key":"k3","seq":3,"op":"put","value":{"n":333}}"#,
    )]);
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines);
    let store = dir.path().join("store");

    let stderr = fails(&[
        "ingest",
        "--store",
        s(&store),
        "--source",
        "in",
        "--batch-size",
        "10",
        s(&file),
    ]);
    assert!(stderr.contains("line 25"), "{stderr}");
    assert!(stderr.contains("\"v3\""), "{stderr}");
    assert!(stderr.contains("conflicting"), "{stderr}");
    assert_eq!(
        checkpoint(&store, "in"),
        Some(offset_after_line(&lines, 20))
    );
    // Nothing of the failed batch (lines 21..30) is visible.
    fails(&["get", "--store", s(&store), "k21"]);
    ok(&["get", "--store", s(&store), "k20"]);
    assert_eq!(log(&store).len(), 2);
    // A rerun fails the same way and still commits nothing.
    let again = fails(&[
        "ingest",
        "--store",
        s(&store),
        "--source",
        "in",
        "--batch-size",
        "10",
        s(&file),
    ]);
    assert!(again.contains("line 25"), "{again}");
    assert_eq!(log(&store).len(), 2);
}

#[test]
fn a_malformed_line_fails_closed_naming_line_and_id() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let cases: [(&str, &str, Option<&str>); 3] = [
        (
            r#"{"event_id":"v17","key":"k17","op":"put","value":1}"#,
            "missing field \"seq\"",
            Some("\"v17\""),
        ),
        (
            r#"{"event_id":"v17","key":"k17","seq":17,"#,
            "not valid JSON",
            None,
        ),
        (
            r#"{"event_id":"v17","key":"k17","seq":17,"op":"add","delta":"x"}"#,
            "\"delta\"",
            Some("\"v17\""),
        ),
    ];
    for (n, (bad, what, id)) in cases.into_iter().enumerate() {
        let lines = lines_with(&[(17, bad)]);
        let file = dir.path().join(format!("in{n}.ndjson"));
        write_lines(&file, &lines);
        let source = format!("in{n}");
        let stderr = fails(&[
            "ingest",
            "--store",
            s(&store),
            "--source",
            &source,
            "--batch-size",
            "10",
            s(&file),
        ]);
        assert!(stderr.contains("line 17"), "{stderr}");
        assert!(stderr.contains(what), "{stderr}");
        if let Some(id) = id {
            assert!(stderr.contains(id), "{stderr}");
        }
        assert!(stderr.contains("nothing of batch"), "{stderr}");
        assert_eq!(
            checkpoint(&store, &source),
            Some(offset_after_line(&lines, 10))
        );
    }
    // Lines 11..20 never committed, in any of the three runs.
    fails(&["get", "--store", s(&store), "k11"]);
    ok(&["get", "--store", s(&store), "k10"]);
}

#[test]
fn quarantine_mode_sets_bad_lines_aside_and_carries_on() {
    let dir = tempdir();
    let long_id = format!(
        r#"{{"event_id":"{}","key":"k9","seq":9,"op":"delete"}}"#,
        "x".repeat(5000)
    );
    let lines = lines_with(&[
        (5, "this is not json"),
        (9, &long_id),
        (17, r#"{"event_id":"v17","key":"k17","op":"put","value":1}"#),
        (
            25,
            r#"{"event_id":"v3","key":"k3","seq":3,"op":"put","value":{"n":333}}"#,
        ),
    ]);
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines);
    let store = dir.path().join("store");
    let report = ingest_json(
        &store,
        &file,
        &[
            "--source",
            "in",
            "--batch-size",
            "10",
            "--on-invalid",
            "quarantine",
        ],
    );
    assert_eq!(report["rejected"].as_u64(), Some(4), "{report}");
    assert_eq!(report["inserted"].as_u64(), Some(26), "{report}");
    assert_eq!(
        checkpoint(&store, "in"),
        Some(fs::metadata(&file).expect("stat").len())
    );
    assert_eq!(scan(&store).len(), 26);
    let rows: Vec<Value> = ok(&["quarantine", "--store", s(&store), "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("quarantine line is JSON"))
        .collect();
    let ids: Vec<&str> = rows
        .iter()
        .map(|r| r["event_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["line:5", "line:9", "line:17", "v3"]);
    assert!(
        rows[2]["reason"]
            .as_str()
            .expect("reason")
            .contains("\"seq\"")
    );
    assert!(
        rows[0]["batch_id"]
            .as_str()
            .expect("batch")
            .starts_with("in:0-")
    );
}

#[test]
fn a_second_writer_is_refused_because_the_store_is_locked() {
    let dir = tempdir();
    let store_dir = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[]));
    let store = idemkv::Store::open(&store_dir, idemkv::Options::default()).expect("open");
    let stderr = fails(&["ingest", "--store", s(&store_dir), s(&file)]);
    assert!(stderr.contains("locked"), "{stderr}");
    let stderr = fails(&["digest", "--store", s(&store_dir)]);
    assert!(stderr.contains("locked"), "{stderr}");
    drop(store);
    ok(&["ingest", "--store", s(&store_dir), s(&file)]);
}

#[test]
fn a_final_line_without_newline_waits_and_a_grown_file_continues() {
    let dir = tempdir();
    let lines = lines_with(&[]);
    let file = dir.path().join("in.ndjson");
    let store = dir.path().join("store");
    let full = lines.join("\n") + "\n";
    let cut = offset_after_line(&lines, 12) as usize + 9;
    fs::write(&file, &full[..cut]).expect("write");
    let first = ingest_json(&store, &file, &["--batch-size", "5"]);
    assert_eq!(
        first["checkpoint"].as_u64(),
        Some(offset_after_line(&lines, 12))
    );
    assert_eq!(first["pending_bytes"].as_u64(), Some(9), "{first}");
    fails(&["get", "--store", s(&store), "k13"]);
    // The default source is the file's absolute path, which `checkpoint` also accepts.
    let source = fs::canonicalize(&file).expect("canonical path");
    assert_eq!(first["source"].as_str(), source.to_str());
    assert_eq!(
        checkpoint(&store, s(&file)),
        Some(offset_after_line(&lines, 12))
    );

    fs::write(&file, &full).expect("grow");
    let second = ingest_json(&store, &file, &["--batch-size", "5"]);
    assert_eq!(second["inserted"].as_u64(), Some(18));
    assert_eq!(second["pending_bytes"].as_u64(), Some(0));
    assert_eq!(scan(&store).len(), 30);

    // A file replaced by a shorter one is refused, not silently skipped.
    fs::write(&file, &full[..100]).expect("shrink");
    let stderr = fails(&["ingest", "--store", s(&store), s(&file)]);
    assert!(stderr.contains("truncated or replaced"), "{stderr}");
}

/// Lines of the same shape as `lines_with(&[])` (each the same length),
/// with other event ids and keys: what a rotated log might hold.
fn other_lines() -> Vec<String> {
    lines_with(&[])
        .iter()
        .map(|l| {
            l.replace(r#""event_id":"v"#, r#""event_id":"w"#)
                .replace(r#""key":"k"#, r#""key":"j"#)
        })
        .collect()
}

#[test]
fn a_file_replaced_by_one_of_the_same_shape_is_refused_not_skipped() {
    let dir = tempdir();
    let file = dir.path().join("in.ndjson");
    let store = dir.path().join("store");
    let args = ["--source", "feed", "--batch-size", "4"];
    write_lines(&file, &lines_with(&[])[..10]);
    let first = ingest_json(&store, &file, &args);
    assert_eq!(first["inserted"].as_u64(), Some(10));

    // Its newlines fall where the old file's did, and it is longer than the
    // checkpoint: only its bytes tell it apart.
    let other = other_lines();
    write_lines(&file, &other);
    let mut resume = vec!["ingest", "--store", s(&store)];
    resume.extend_from_slice(&args);
    resume.push(s(&file));
    let stderr = fails(&resume);
    assert!(stderr.contains("was replaced"), "{stderr}");
    // It points to the way that works: `--from-start` would only meet the
    // old file's batch ids with other content.
    assert!(!stderr.contains("--from-start"), "{stderr}");
    assert_eq!(
        checkpoint(&store, "feed"),
        Some(offset_after_line(&other, 10))
    );
    assert_eq!(scan(&store).len(), 10, "nothing of the new file went in");

    // Under a source of its own, every line of it goes in.
    let second = ingest_json(&store, &file, &["--source", "feed-2"]);
    assert_eq!(second["inserted"].as_u64(), Some(30));
    assert_eq!(scan(&store).len(), 40);

    // The file it really was resumes as before.
    write_lines(&file, &lines_with(&[]));
    let third = ingest_json(&store, &file, &args);
    assert_eq!(third["inserted"].as_u64(), Some(20));
}

/// A checkpoint that a stream (stdin) ingest set under a source is not a
/// position in a file given later under that source: resuming there would
/// skip the file's first lines, so the run is refused.
#[test]
fn a_streams_checkpoint_is_not_a_position_in_a_file_of_the_same_source() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    let mut body = lines_with(&[])[..10].join("\n");
    body.push('\n');
    let streamed = ingest_stdin(&store, body.as_bytes(), &["--source", "feed"]);
    assert_eq!(streamed["inserted"].as_u64(), Some(10));
    write_lines(&file, &other_lines());
    let stderr = fails(&["ingest", "--store", s(&store), "--source", "feed", s(&file)]);
    assert!(stderr.contains("was set by a stream"), "{stderr}");
    assert_eq!(scan(&store).len(), 10, "nothing of the file went in");
    let filed = ingest_json(&store, &file, &["--source", "feed-file"]);
    assert_eq!(filed["inserted"].as_u64(), Some(30));

    // A stream of another source whose name starts with this one's and a
    // colon is no stream of this source: the file resumes.
    let lines = lines_with(&[]);
    write_lines(&file, &lines[..10]);
    ingest_json(&store, &file, &["--source", "orders"]);
    ingest_stdin(&store, body.as_bytes(), &["--source", "orders:x"]);
    write_lines(&file, &lines);
    let resumed = ingest_json(&store, &file, &["--source", "orders"]);
    assert_eq!(resumed["inserted"].as_u64(), Some(20), "{resumed}");
}

/// A run whose batches are all replays (`--from-start` over a file cut
/// back) moves no checkpoint, and its report gives the one the store holds.
#[test]
fn a_run_of_replays_reports_the_checkpoint_the_store_holds() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    let lines = lines_with(&[]);
    let args = ["--source", "feed", "--batch-size", "4"];
    write_lines(&file, &lines);
    ingest_json(&store, &file, &args);
    write_lines(&file, &lines[..8]);
    let mut replay = args.to_vec();
    replay.push("--from-start");
    let report = ingest_json(&store, &file, &replay);
    assert_eq!(report["replayed"].as_u64(), Some(2));
    assert_eq!(report["checkpoint"].as_u64(), checkpoint(&store, "feed"));
    assert_eq!(
        checkpoint(&store, "feed"),
        Some(offset_after_line(&lines, 30))
    );

    // A run that commits nothing reports it too.
    fs::write(&file, &lines[0][..10]).unwrap();
    let report = ingest_json(&store, &file, &replay);
    assert_eq!(report["batches"].as_u64(), Some(0));
    assert_eq!(report["checkpoint"].as_u64(), checkpoint(&store, "feed"));
}

/// A line longer than a batch may be is invalid input, read without being
/// held whole: `--on-invalid` decides, and the lines around it go in. A
/// resume rebuilds the batch that held it as it was committed.
#[test]
fn a_line_longer_than_a_batch_is_invalid_input() {
    let dir = tempdir();
    let file = dir.path().join("in.ndjson");
    let store = dir.path().join("store");
    let mut lines = lines_with(&[]);
    lines[1] = format!(
        r#"{{"event_id":"v2","key":"k2","seq":2,"op":"put","value":"{}"}}"#,
        "x".repeat(5 << 20)
    );
    write_lines(&file, &lines[..2]);
    let stderr = fails(&["ingest", "--store", s(&store), s(&file)]);
    assert!(stderr.contains("line 2: line of 5242"), "{stderr}");
    assert!(stderr.contains("longer than 4194304"), "{stderr}");

    // Nor is one that starts with more blanks than that: it is not blank.
    let blank_start = dir.path().join("blank-start.ndjson");
    write_lines(&blank_start, &[" ".repeat(5 << 20) + &lines[0]]);
    let stderr = fails(&["ingest", "--store", s(&store), s(&blank_start)]);
    assert!(stderr.contains("longer than 4194304"), "{stderr}");

    let args = ["--on-invalid", "quarantine", "--batch-size", "1"];
    let first = ingest_json(&store, &file, &args);
    assert_eq!(
        (first["inserted"].as_u64(), first["rejected"].as_u64()),
        (Some(1), Some(1))
    );
    write_lines(&file, &lines);
    let rest = ingest_json(&store, &file, &args);
    assert_eq!(rest["inserted"].as_u64(), Some(28), "{rest}");
    assert_eq!(scan(&store).len(), 29);
}

/// `--follow` reads a growing regular file: a FIFO is refused as a stream
/// before it is opened, since opening one waits for a writer (without
/// `--follow` a FIFO is read as a stream, until its writer closes it).
#[cfg(unix)]
#[test]
fn follow_refuses_a_fifo_without_waiting_for_a_writer() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let fifo = dir.path().join("feed");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    let mut child = follow(&store, &fifo, "100");
    // A hang guard, not a timing assertion: the refusal takes no time, and
    // an open that waits for a writer would wait forever.
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            child.kill().expect("kill");
            panic!("ingest --follow waited for the FIFO's writer");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().expect("output");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is a stream"),
        "{}",
        text(&out.stderr)
    );
}

/// `ingest --json --follow` of `file` as source `tail`, polling every 20 ms
/// and stopping after `idle_exit_ms` without new bytes.
fn follow(store: &Path, file: &Path, idle_exit_ms: &str) -> std::process::Child {
    Command::new(BIN)
        .args([
            "ingest",
            "--store",
            s(store),
            "--source",
            "tail",
            "--json",
            "--follow",
            "--poll-ms",
            "20",
            "--idle-exit-ms",
            idle_exit_ms,
            s(file),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

#[test]
fn a_followed_file_replaced_under_its_name_stops_the_run() {
    let dir = tempdir();
    let lines = lines_with(&[]);
    let file = dir.path().join("in.ndjson");
    let store = dir.path().join("store");
    write_lines(&file, &lines[..5]);
    let child = follow(&store, &file, "10000");
    // The store is the follower's until it exits; its log shows when the
    // last line went in (the record holds the key).
    let segment = store.join("0000000001.seg");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fs::read(&segment)
        .unwrap_or_default()
        .windows(2)
        .any(|w| w == b"k5")
    {
        assert!(Instant::now() < deadline, "the follower never wrote line 5");
        thread::sleep(Duration::from_millis(20));
    }
    // A last line, then a log rotation right away: the file moves away
    // and a new one takes its name. The old file is read to its end.
    let mut writer = OpenOptions::new().append(true).open(&file).expect("open");
    writeln!(writer, "{}", lines[5]).expect("write");
    drop(writer);
    fs::rename(&file, dir.path().join("in.ndjson.1")).expect("rotate");
    write_lines(&file, &other_lines());
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("replaced or moved while being followed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(scan(&store).len(), 6, "the followed file's lines went in");
    assert_eq!(
        checkpoint(&store, "tail"),
        Some(offset_after_line(&lines, 6))
    );
}

#[test]
fn follow_reads_a_growing_file_until_idle() {
    let dir = tempdir();
    let lines = lines_with(&[]);
    let file = dir.path().join("in.ndjson");
    let store = dir.path().join("store");
    fs::write(&file, "").expect("create");
    let child = follow(&store, &file, "1500");
    let mut writer = OpenOptions::new().append(true).open(&file).expect("open");
    for chunk in lines.chunks(7) {
        for line in chunk {
            // Write each line in two pieces: a half line is not consumed.
            let (head, tail) = line.split_at(line.len() / 2);
            writer.write_all(head.as_bytes()).expect("write");
            writer.flush().expect("flush");
            thread::sleep(Duration::from_millis(5));
            writer.write_all(tail.as_bytes()).expect("write");
            writer.write_all(b"\n").expect("write");
        }
        thread::sleep(Duration::from_millis(60));
    }
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("json");
    assert_eq!(report["inserted"].as_u64(), Some(30), "{report}");
    assert_eq!(scan(&store).len(), 30);
    assert_eq!(
        checkpoint(&store, "tail"),
        Some(fs::metadata(&file).expect("stat").len())
    );
}

#[test]
fn stdin_ingest_dedups_by_event_id_and_replays_the_same_stream() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let body = lines_with(&[]).join("\n") + "\n";
    let run = || ingest_stdin(&store, body.as_bytes(), &["--batch-size", "8"]);
    let first = run();
    assert_eq!(first["inserted"].as_u64(), Some(30));
    assert_eq!(first["source"].as_str(), Some("stdin"));
    let second = run();
    assert_eq!(second["replayed"].as_u64(), Some(4), "{second}");
    assert_eq!(scan(&store).len(), 30);
    // The pipe by its path: a source of its own, read as a stream.
    if Path::new("/dev/stdin").exists() {
        let third = ingest_piped(&store, "/dev/stdin", body.as_bytes(), &[]);
        assert_eq!(third["duplicates"].as_u64(), Some(30), "{third}");
        assert_eq!(third["source"].as_str(), Some("/dev/stdin"));
    }
}

/// A stream cannot be read again, so its last line counts once the stream
/// ends, newline or not (JSON Lines allows none): it was left out, with
/// exit 0 and nothing in `--json` to tell.
#[test]
fn a_stream_s_final_line_without_newline_is_ingested_when_the_stream_ends() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let body = lines_with(&[]).join("\n");
    let report = ingest_stdin(&store, body.as_bytes(), &[]);
    assert_eq!(report["inserted"].as_u64(), Some(30), "{report}");
    assert_eq!(report["pending_bytes"].as_u64(), Some(0), "{report}");
    assert_eq!(report["checkpoint"].as_u64(), Some(body.len() as u64));
    ok(&["get", "--store", s(&store), "k30"]);
}

/// Numbers an f64 cannot hold are stored as written, not rounded: two
/// values that rounded to one f64 were stored alike, so the second put
/// counted as unchanged and the first value was lost.
#[test]
fn numbers_beyond_an_f64_are_stored_exactly() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(
        &file,
        &[
            r#"{"event_id":"e1","key":"k","seq":1,"op":"put","value":{"n":123456789012345678901234}}"#.to_owned(),
            r#"{"event_id":"e2","key":"k","seq":2,"op":"put","value":{"n":123456789012345678901235}}"#.to_owned(),
            r#"{"event_id":"e3","key":"k","seq":3,"op":"put","value":{"n":123456789012345678901235.00}}"#.to_owned(),
        ],
    );
    let report = ingest_json(&store, &file, &[]);
    assert_eq!(
        (
            report["inserted"].as_u64(),
            report["updated"].as_u64(),
            report["unchanged"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{report}"
    );
    let row = ok(&["get", "--store", s(&store), "k"]);
    assert!(
        row.contains(r#""value":{"n":123456789012345678901235}"#),
        "{row}"
    );
}

#[test]
fn field_mapping_and_content_ids_let_a_foreign_feed_in() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("feed.ndjson");
    let lines: Vec<String> = [
        r#"{"order_id":"O1","line_no":1,"lsn":10,"kind":"put","value":{"b":2,"a":1},"recv":"t1"}"#,
        r#"{"order_id":"O1","line_no":1,"lsn":10,"kind":"put","value":{"a":1, "b":2},"recv":"t2"}"#,
        r#"{"order_id":"O1","line_no":2,"lsn":11,"kind":"put","value":[1,2],"recv":"t3"}"#,
        r#"{"order_id":"O1","line_no":2,"lsn":12,"kind":"delete","recv":"t4"}"#,
    ]
    .map(str::to_owned)
    .to_vec();
    write_lines(&file, &lines);
    let report = ingest_json(
        &store,
        &file,
        &[
            "--key-field",
            "order_id,line_no",
            "--seq-field",
            "lsn",
            "--op-field",
            "kind",
            "--id-from-content",
            "--ignore-field",
            "recv",
        ],
    );
    assert_eq!(counts_of(&report), [2, 0, 0, 0, 1, 1, 0, 0], "{report}");
    assert_eq!(
        scan(&store),
        [r#"{"key":"O1/1","seq":10,"value":{"a":1,"b":2}}"#]
    );
}

#[test]
fn exit_codes_name_failures_and_usage_errors() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let usage = idemkv(&["ingest", "--batch-size", "0"]);
    assert_eq!(usage.status.code(), Some(2));
    assert_eq!(idemkv(&["frobnicate"]).status.code(), Some(2));
    // Usage errors only a look past the parser finds are usage errors too.
    for args in [
        vec!["ingest", "--store", s(&store), "--source", "", "-"],
        vec!["ingest", "--store", s(&store), "--follow", "-"],
        vec![
            "ingest",
            "--store",
            s(&store),
            "--key-field",
            "a,b",
            "--key-separator",
            "",
            "-",
        ],
    ] {
        let out = idemkv(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }

    let stderr = fails(&["digest", "--store", s(&store)]);
    assert!(stderr.contains("does not exist"), "{stderr}");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[]));
    ok(&["ingest", "--store", s(&store), s(&file)]);
    let stderr = fails(&["get", "--store", s(&store), "nope"]);
    assert!(stderr.contains("\"nope\" not found"), "{stderr}");
    let stderr = fails(&["checkpoint", "--store", s(&store), "nope"]);
    assert!(stderr.contains("no checkpoint"), "{stderr}");
    let digest = ok(&["digest", "--store", s(&store)]);
    assert!(ok(&["compact", "--store", s(&store)]).starts_with("compacted 1 segments"));
    assert_eq!(
        ok(&["digest", "--store", s(&store)]),
        digest,
        "compaction keeps the state"
    );
    assert!(ok(&["verify", "--store", s(&store)]).starts_with("ok"));
    let stats: Value =
        serde_json::from_str(ok(&["stats", "--store", s(&store), "--json"]).trim()).expect("json");
    assert_eq!(stats["live_keys"].as_u64(), Some(30));
    assert!(stats["index_bytes"]["keys"].as_u64().is_some());
    assert!(ok(&["repair", "--store", s(&store)]).contains("nothing to repair"));
}

#[test]
fn the_sample_file_and_the_demo_tell_the_story() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders.ndjson");
    let report = ingest_json(&store, &sample, &[]);
    assert_eq!(counts_of(&report), [5, 2, 1, 2, 5, 2, 3, 0], "{report}");
    assert_eq!(
        ok(&["get", "--store", s(&store), "visits/2026-09-21"]).trim(),
        r#"{"key":"visits/2026-09-21","seq":301,"value":7}"#
    );

    let demo = ok(&["demo"]);
    assert!(
        demo.contains("equal: the interrupted run converged"),
        "{demo}"
    );
    assert!(demo.contains("replayed"), "{demo}");
    // The crash is simulated, not just told: batch 3 is torn and dropped.
    assert!(
        demo.contains("crash midway through writing batch 3"),
        "{demo}"
    );
    assert!(demo.contains("the torn batch is gone"), "{demo}");
    assert!(demo.lines().count() <= 30, "{demo}");
}

#[test]
fn verify_names_file_and_offset_of_a_flipped_byte_and_repair_salvages() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders.ndjson");
    ingest_json(&store, &sample, &["--batch-size", "4"]);
    assert!(ok(&["verify", "--store", s(&store)]).starts_with("ok: 1 segments, 5 records"));
    let segment = newest_segment(&store);
    let mut bytes = fs::read(&segment).expect("read segment");
    let middle = bytes.len() / 3;
    bytes[middle] ^= 0x5a;
    fs::write(&segment, &bytes).expect("write segment");

    let stderr = fails(&["verify", "--store", s(&store)]);
    let file_name = segment.file_name().and_then(|n| n.to_str()).expect("name");
    assert!(stderr.contains(file_name), "{stderr}");
    assert!(stderr.contains("offset"), "{stderr}");
    let repaired = ok(&["repair", "--store", s(&store)]);
    assert!(repaired.contains("first bad record"), "{repaired}");
    assert!(ok(&["verify", "--store", s(&store)]).starts_with("ok"));
    // What survived is a prefix of the batches; ingest resumes after it and converges.
    ingest_json(&store, &sample, &["--batch-size", "4"]);
    let clean = dir.path().join("clean");
    ingest_json(&clean, &sample, &["--batch-size", "4"]);
    assert_eq!(scan(&store), scan(&clean));
    assert_eq!(digest(&store), digest(&clean));
}

/// Every command but `ingest` needs an existing store: a directory that is
/// not one (a mistyped `--store`) is refused and left exactly as it was,
/// since opening it would make it a store and delete its `.tmp` files.
#[test]
fn commands_other_than_ingest_refuse_a_directory_that_is_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let other = dir.path().join("reports");
    fs::create_dir(&other).unwrap();
    fs::write(other.join("report.tmp"), "precious").unwrap();
    fs::write(other.join("0000000001.seg.tmp"), "also not ours to delete").unwrap();
    let listing = |path: &Path| {
        let mut names: Vec<(String, Vec<u8>)> = fs::read_dir(path)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        names.sort();
        names
    };
    let before = listing(&other);
    let file = dir.path().join("a-file");
    fs::write(&file, "x").unwrap();
    let commands: [&[&str]; 10] = [
        &["get", "k"],
        &["scan"],
        &["digest"],
        &["checkpoint", "src"],
        &["log"],
        &["stats"],
        &["quarantine"],
        &["verify"],
        &["compact"],
        &["repair"],
    ];
    for command in commands {
        let with_store = |store: &Path| {
            let mut args = vec![command[0], "--store", s(store)];
            args.extend_from_slice(&command[1..]);
            fails(&args)
        };
        let stderr = with_store(&other);
        assert!(
            stderr.contains("is not an idemkv store"),
            "{command:?}: {stderr}"
        );
        assert_eq!(
            listing(&other),
            before,
            "{command:?} left the directory as it was"
        );
        let stderr = with_store(&file);
        assert!(
            stderr.contains("is not a directory"),
            "{command:?}: {stderr}"
        );
    }
}

/// An inspection that opens a crashed store cuts its torn final record, and
/// one that finds a damaged snapshot replays the log instead: both change
/// the files, so both say so on stderr, and the command still succeeds.
#[test]
fn an_inspection_says_what_its_open_recovered_from() {
    let dir = tempdir();
    let store = dir.path().join("s");
    let input = dir.path().join("in.ndjson");
    write_lines(&input, &lines_with(&[]));
    ok(&["ingest", "--store", s(&store), s(&input)]);
    let digest = ok(&["digest", "--store", s(&store)]);

    let segment = fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .max()
        .expect("a segment");
    let len = fs::metadata(&segment).unwrap().len();
    let file = OpenOptions::new().write(true).open(&segment).unwrap();
    // The last record loses its last byte: the crash tore it.
    file.set_len(len - 1).unwrap();
    drop(file);
    let out = idemkv(&["digest", "--store", s(&store)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("torn final record"),
        "{}",
        text(&out.stderr)
    );
    assert_ne!(text(&out.stdout), digest, "the torn batch is gone");
    let out = idemkv(&["digest", "--store", s(&store)]);
    assert_eq!(text(&out.stderr), "", "nothing left to recover from");

    fs::write(store.join("SNAPSHOT"), b"not a snapshot").unwrap();
    let out = idemkv(&["digest", "--store", s(&store)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("did not use the snapshot"),
        "{}",
        text(&out.stderr)
    );

    // Repair of a whole log says that it moved the snapshot, and where.
    fs::write(store.join("SNAPSHOT"), b"not a snapshot").unwrap();
    let repaired = ok(&["repair", "--store", s(&store)]);
    assert!(
        repaired.contains("its snapshot could not be used and was moved to"),
        "{repaired}"
    );
    assert!(repaired.contains("(14 bytes)"), "{repaired}");
    assert!(!store.join("SNAPSHOT").exists());
    assert!(ok(&["repair", "--store", s(&store)]).contains("nothing to repair"));
}

/// Twelve puts `k1`..`k12` (value n), then deletes of `k2` and of the
/// absent key `gone`, ingested into `store` from a file in `dir`.
fn ingest_puts_and_deletes(store: &Path, dir: &Path) {
    let mut lines: Vec<String> = (1..=12)
        .map(|n| format!(r#"{{"event_id":"v{n}","key":"k{n}","seq":{n},"op":"put","value":{n}}}"#))
        .collect();
    lines.push(r#"{"event_id":"d1","key":"k2","seq":50,"op":"delete"}"#.into());
    lines.push(r#"{"event_id":"d2","key":"gone","seq":50,"op":"delete"}"#.into());
    let file = dir.join("in.ndjson");
    fs::write(&file, lines.join("\n") + "\n").unwrap();
    ok(&["ingest", "--store", s(store), s(&file)]);
}

#[test]
fn scan_with_a_prefix_prints_only_the_live_rows_under_it_in_key_order() {
    let dir = tempdir();
    let store = dir.path().join("store");
    ingest_puts_and_deletes(&store, dir.path());
    let keys = |prefix: &str| -> Vec<String> {
        ok(&["scan", "--store", s(&store), "--prefix", prefix, "--json"])
            .lines()
            .map(|l| {
                let row: Value = serde_json::from_str(l).unwrap();
                row["key"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    assert_eq!(keys("k1"), ["k1", "k10", "k11", "k12"]);
    assert!(keys("k2").is_empty(), "k2 was deleted");
    assert!(keys("gone").is_empty(), "a tombstone is no row");
}

#[test]
fn stats_json_counts_each_kind_of_entry() {
    let dir = tempdir();
    let store = dir.path().join("store");
    ingest_puts_and_deletes(&store, dir.path());
    let stats: Value =
        serde_json::from_str(ok(&["stats", "--store", s(&store), "--json"]).trim()).unwrap();
    let count = |field: &str| stats[field].as_u64();
    assert_eq!(count("live_keys"), Some(11));
    assert_eq!(count("tombstones"), Some(2));
    assert_eq!(count("seen_ids"), Some(14));
    assert_eq!(count("batches"), Some(1));
    assert_eq!(count("checkpoints"), Some(1));
    assert_eq!(count("quarantined"), Some(0));
}

/// `stats` prints the same numbers as text and as `--json`, and its segments
/// and disk bytes are those of the store's files: a row printed under the
/// wrong name, or a field filled from the wrong counter, shows.
#[test]
fn stats_text_and_json_agree_and_match_the_files_on_disk() {
    let dir = tempdir();
    let store = dir.path().join("store");
    ingest_puts_and_deletes(&store, dir.path());
    let stats: Value =
        serde_json::from_str(ok(&["stats", "--store", s(&store), "--json"]).trim()).unwrap();
    let (mut segments, mut disk_bytes) = (0, 0);
    for entry in fs::read_dir(&store).unwrap() {
        let path = entry.unwrap().path();
        let is_segment = path.extension().is_some_and(|e| e == "seg");
        if is_segment || path.ends_with("SNAPSHOT") {
            disk_bytes += fs::metadata(&path).unwrap().len();
        }
        segments += u64::from(is_segment);
    }
    assert_eq!(stats["segments"].as_u64(), Some(segments), "{stats}");
    assert_eq!(stats["disk_bytes"].as_u64(), Some(disk_bytes), "{stats}");

    let mut expected = String::new();
    for (name, field) in [
        ("live keys", "live_keys"),
        ("tombstones", "tombstones"),
        ("seen ids", "seen_ids"),
        ("batches", "batches"),
        ("checkpoints", "checkpoints"),
        ("quarantined", "quarantined"),
        ("segments", "segments"),
        ("disk bytes", "disk_bytes"),
    ] {
        expected += &format!("{name:<14}{}\n", stats[field]);
    }
    let index = &stats["index_bytes"];
    expected += &format!(
        "index bytes   keys {}  seen {}  batches {}\n",
        index["keys"], index["seen"], index["batches"]
    );
    assert_eq!(ok(&["stats", "--store", s(&store)]), expected);
}

/// The text run log has a header naming the eight counts, one row per batch
/// (its counts in the header's order, then its batch id) and a last line
/// with the number of batches; checked against `log --json`.
#[test]
fn log_text_shows_each_batch_s_counts_under_the_header_and_the_batch_count() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(
        &file,
        &lines_with(&[
            (5, r#"{"event_id":"d1","key":"k2","seq":50,"op":"delete"}"#),
            (
                12,
                r#"{"event_id":"v1","key":"k1","seq":1,"op":"put","value":{"n":1}}"#,
            ),
        ]),
    );
    ingest_json(&store, &file, &["--source", "in", "--batch-size", "10"]);
    let entries = log(&store);
    assert_eq!(entries.len(), 3);
    let text = ok(&["log", "--store", s(&store)]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), entries.len() + 2, "{text}");
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header[2..10], COUNT_NAMES, "{text}");
    assert_eq!(header[10], "batch", "{text}");
    for (line, (batch_id, counts)) in lines[1..].iter().zip(&entries) {
        let row: Vec<&str> = line.split_whitespace().collect();
        let row_counts: Vec<u64> = row[1..9].iter().map(|c| c.parse().unwrap()).collect();
        assert_eq!(row_counts, counts, "{line}");
        assert_eq!(row[9], batch_id, "{line}");
    }
    assert_eq!(lines[entries.len() + 1], "3 committed batches", "{text}");
}

/// `quarantine` without `--json` prints one tab-separated row per rejected
/// delivery (batch id, index in the batch, event id, reason) and then the
/// count; checked against `quarantine --json`.
#[test]
fn quarantine_text_prints_batch_index_event_id_and_reason_columns() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    let lines = lines_with(&[
        (3, "this is not json"),
        (7, r#"{"event_id":"v7","key":"k7","op":"put","value":1}"#),
    ]);
    write_lines(&file, &lines);
    let args = [
        "--source",
        "in",
        "--batch-size",
        "5",
        "--on-invalid",
        "quarantine",
    ];
    assert_eq!(
        ingest_json(&store, &file, &args)["rejected"].as_u64(),
        Some(2)
    );
    let rows: Vec<Value> = ok(&["quarantine", "--store", s(&store), "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut expected = String::new();
    for row in &rows {
        expected += &format!(
            "{}\t{}\t{}\t{}\n",
            row["batch_id"].as_str().unwrap(),
            row["index"],
            row["event_id"].as_str().unwrap(),
            row["reason"].as_str().unwrap()
        );
    }
    expected += "2 quarantined\n";
    assert_eq!(ok(&["quarantine", "--store", s(&store)]), expected);
    assert!(expected.starts_with("in:0-"), "{expected}");
    assert!(expected.contains("\t2\tline:3\t"), "{expected}");
    assert!(expected.contains("\t1\tline:7\t"), "{expected}");
}

/// `verify` says how many bytes it checked: all of an intact store's one
/// segment. `repair` says how many it dropped: that segment's bytes from
/// the first bad record on, and no whole segment.
#[test]
fn verify_and_repair_report_the_bytes_checked_and_dropped() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/orders.ndjson");
    ingest_json(&store, &sample, &["--batch-size", "4"]);
    let segment = newest_segment(&store);
    let mut bytes = fs::read(&segment).expect("read segment");
    let len = bytes.len();
    assert_eq!(
        ok(&["verify", "--store", s(&store)]).trim(),
        format!("ok: 1 segments, 5 records, {len} bytes checked")
    );
    bytes[len / 3] ^= 0x5a;
    fs::write(&segment, &bytes).expect("write segment");
    let repaired = ok(&["repair", "--store", s(&store)]);
    let number_after = |word: &str| -> u64 {
        let at = repaired
            .find(word)
            .unwrap_or_else(|| panic!("{word}: {repaired}"))
            + word.len();
        repaired[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{word}: {repaired}"))
    };
    let offset = number_after(" at offset ");
    assert!(offset <= (len / 3) as u64, "{repaired}");
    assert_eq!(number_after("dropped "), len as u64 - offset, "{repaired}");
    assert!(
        repaired.contains("bytes and 0 whole segments"),
        "{repaired}"
    );
}

/// `ingest` keeps a file's checkpoint under the file's canonical path;
/// `checkpoint` finds it by another spelling of that path, as typed.
#[test]
fn checkpoint_finds_a_file_source_by_another_spelling_of_its_path() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[]));
    ok(&["ingest", "--store", s(&store), s(&file)]);
    fs::create_dir(dir.path().join("sub")).unwrap();
    let roundabout = dir.path().join("sub/../in.ndjson");
    assert_eq!(
        checkpoint(&store, s(&roundabout)),
        Some(fs::metadata(&file).unwrap().len())
    );
}

/// The `--json` report counts the lines read in this run, blank and bad
/// ones included, and none of a rerun that finds nothing new.
#[test]
fn the_ingest_report_counts_the_lines_it_read() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[(4, ""), (9, "this is not json")]));
    let args = ["--batch-size", "7", "--on-invalid", "quarantine"];
    let report = ingest_json(&store, &file, &args);
    assert_eq!(report["lines"].as_u64(), Some(30), "{report}");
    assert_eq!(report["batches"].as_u64(), Some(5), "{report}");
    let again = ingest_json(&store, &file, &args);
    assert_eq!(again["lines"].as_u64(), Some(0), "{again}");
}

/// `scan` without `--json` prints text columns, `key<TAB>seq<TAB>value`
/// with the value as canonical JSON, in key order.
#[test]
fn scan_without_json_prints_tab_separated_columns() {
    let dir = tempdir();
    let store = dir.path().join("store");
    ingest_puts_and_deletes(&store, dir.path());
    assert_eq!(
        ok(&["scan", "--store", s(&store), "--prefix", "k1"]),
        "k1\t1\t1\nk10\t10\t10\nk11\t11\t11\nk12\t12\t12\n"
    );
}

/// `log --json` gives each batch the wall-clock time it committed at, in
/// milliseconds since the epoch, in commit order.
#[test]
fn log_json_stamps_each_batch_with_its_commit_time() {
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[]));
    let before = now_ms();
    ingest_json(&store, &file, &["--batch-size", "10"]);
    let after = now_ms();
    let stamps: Vec<u64> = ok(&["log", "--store", s(&store), "--json"])
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["committed_ms"].as_u64().expect("committed_ms")
        })
        .collect();
    assert_eq!(stamps.len(), 3);
    assert!(stamps.windows(2).all(|w| w[0] <= w[1]), "{stamps:?}");
    assert!(
        stamps.iter().all(|&ms| (before..=after).contains(&ms)),
        "{before}..={after}: {stamps:?}"
    );
}

/// A file of CRLF and LF lines, blank lines of several kinds, a line that
/// is not UTF-8, two events on one key in one batch and a final line
/// without its newline, ingested one batch per run (as a run killed after
/// each commit would), ends as one uninterrupted run: the same rows,
/// checkpoint, batches and quarantine. In fail mode the bad line is named
/// by its number in the file, also when the run resumes just before it.
#[test]
fn crlf_blank_and_non_utf8_lines_resume_batch_by_batch_as_one_run() {
    let dir = tempdir();
    let file = dir.path().join("in.ndjson");
    let mut body: Vec<u8> = Vec::new();
    let lines: [&[u8]; 10] = [
        b"{\"event_id\":\"a1\",\"key\":\"k1\",\"seq\":1,\"op\":\"put\",\"value\":1}\r\n",
        b"\r\n",
        b"{\"event_id\":\"a2\",\"key\":\"k1\",\"seq\":2,\"op\":\"put\",\"value\":2}\n",
        b"  \t\n",
        b"{\"event_id\":\"a3\",\"key\":\"k\xff\",\"seq\":1,\"op\":\"delete\"}\r\n",
        b"\n",
        b"{\"event_id\":\"a4\",\"key\":\"k2\",\"seq\":5,\"op\":\"add\",\"delta\":3}\r\n",
        b"{\"event_id\":\"a5\",\"key\":\"k2\",\"seq\":6,\"op\":\"add\",\"delta\":4}\n",
        b"{\"event_id\":\"a1\",\"key\":\"k1\",\"seq\":1,\"op\":\"put\",\"value\":1}\r\n",
        b"{\"event_id\":\"a6\",\"key\":\"k3\",\"seq\":1,\"op\":\"delete\"}",
    ];
    for line in lines {
        body.extend_from_slice(line);
    }
    fs::write(&file, &body).expect("write");
    let complete = (body.len() - lines[9].len()) as u64;
    let args = [
        "--source",
        "f",
        "--batch-size",
        "2",
        "--on-invalid",
        "quarantine",
    ];

    let clean = dir.path().join("clean");
    let report = ingest_json(&clean, &file, &args);
    assert_eq!(report["checkpoint"].as_u64(), Some(complete), "{report}");
    assert_eq!(
        report["pending_bytes"].as_u64(),
        Some(lines[9].len() as u64)
    );
    assert_eq!(report["rejected"].as_u64(), Some(1), "{report}");

    let stepped = dir.path().join("stepped");
    let mut one = args.to_vec();
    one.extend(["--max-batches", "1"]);
    for _ in 0..10 {
        ingest_json(&stepped, &file, &one);
    }
    assert_eq!(digest(&stepped), digest(&clean));
    assert_eq!(scan(&stepped), scan(&clean));
    assert_eq!(log(&stepped), log(&clean));
    assert_eq!(checkpoint(&stepped, "f"), Some(complete));
    let quarantine = |store: &Path| ok(&["quarantine", "--store", s(store), "--json"]);
    assert_eq!(quarantine(&stepped), quarantine(&clean));
    assert!(
        quarantine(&clean).contains("\"line:5\""),
        "{}",
        quarantine(&clean)
    );

    // Fail mode: the run resumed after line 3 names line 5.
    let failing = dir.path().join("failing");
    let fail_args = ["--source", "f", "--batch-size", "2"];
    let mut first = fail_args.to_vec();
    first.extend(["--max-batches", "1"]);
    ingest_json(&failing, &file, &first);
    let after_line_3: usize = lines[..3].iter().map(|l| l.len()).sum();
    assert_eq!(checkpoint(&failing, "f"), Some(after_line_3 as u64));
    let mut rerun = vec!["ingest", "--store", s(&failing)];
    rerun.extend_from_slice(&fail_args);
    rerun.push(s(&file));
    let stderr = fails(&rerun);
    assert!(stderr.contains("line 5: not valid JSON"), "{stderr}");
    assert!(stderr.contains("nothing of batch"), "{stderr}");
}

#[test]
fn a_run_stopped_by_max_batches_says_so_rather_than_nothing_new() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let file = dir.path().join("in.ndjson");
    write_lines(&file, &lines_with(&[])[..10]);
    let stopped = |report: &Value| report["stopped_at_max_batches"].as_bool();

    let none = ingest_json(&store, &file, &["--max-batches", "0"]);
    assert_eq!(
        (none["batches"].as_u64(), stopped(&none)),
        (Some(0), Some(true))
    );
    let text_run = |extra: &[&str]| {
        let mut args = vec!["ingest", "--store", s(&store)];
        args.extend_from_slice(extra);
        args.push(s(&file));
        ok(&args)
    };
    for max in ["0", "1"] {
        let out = text_run(&["--batch-size", "3", "--max-batches", max]);
        assert!(
            out.contains(&format!(
                "note: stopped after {max} batches (--max-batches)"
            )),
            "{out}"
        );
        assert!(!out.contains("nothing new"), "{out}");
    }
    let rest = ingest_json(&store, &file, &["--batch-size", "3"]);
    assert_eq!(
        (rest["batches"].as_u64(), stopped(&rest)),
        (Some(3), Some(false))
    );
    let out = text_run(&[]);
    assert!(
        out.contains("note: nothing new after the checkpoint"),
        "{out}"
    );
    assert!(!out.contains("stopped after"), "{out}");
}

/// A line is refused as too long only when its bytes before the newline
/// exceed `LINE_BYTES_MAX`; the message never states a length within the
/// limit ("line of 4194304 bytes, longer than 4194304").
#[test]
fn a_line_of_exactly_the_limit_is_not_called_longer_than_the_limit() {
    const LIMIT: usize = 4 << 20;
    let dir = tempdir();
    let store = dir.path().join("store");
    let event = r#"{"event_id":"e1","key":"k","seq":1,"op":"delete"}"#;
    for (name, ending) in [("lf", "\n"), ("crlf", "\r\n")] {
        // The bytes before the `\n` number exactly LIMIT.
        let pad = LIMIT - event.len() - (ending.len() - 1);
        let file = dir.path().join(format!("{name}.ndjson"));
        fs::write(&file, format!("{event}{}{ending}", " ".repeat(pad))).expect("write");
        let out = idemkv(&["ingest", "--store", s(&store), "--json", s(&file)]);
        let stderr = text(&out.stderr);
        assert!(
            !stderr.contains(&format!("line of {LIMIT} bytes, longer than {LIMIT}")),
            "{name}: {stderr}"
        );
        assert!(out.status.success(), "{name}: {stderr}");
    }
    // So is a stream's final line without a newline.
    let stream = format!("{event}{}", " ".repeat(LIMIT - event.len()));
    let report = ingest_stdin(&store, stream.as_bytes(), &[]);
    assert_eq!(report["duplicates"].as_u64(), Some(1), "{report}");
    // One byte more is too long, and says so.
    let file = dir.path().join("over.ndjson");
    fs::write(
        &file,
        format!("{event}{}\n", " ".repeat(LIMIT + 1 - event.len())),
    )
    .expect("write");
    let stderr = fails(&["ingest", "--store", s(&store), s(&file)]);
    assert!(
        stderr.contains(&format!(
            "line 1: line of {} bytes, longer than {LIMIT}",
            LIMIT + 1
        )),
        "{stderr}"
    );
}

/// Two files whose paths differ only in bytes that are not UTF-8 must not
/// share a default source (the path), or the second would resume at the
/// first's checkpoint (refused as "replaced" while the first's batch is
/// held; lines skipped once it expired). Such a path names no source: the
/// run asks for `--source`, and with one each file is a source of its own.
#[cfg(unix)]
#[test]
fn a_path_that_is_not_utf8_needs_a_source_name_of_its_own() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempdir();
    let store = dir.path().join("store");
    let lines = lines_with(&[]);
    let first = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"in\xff.ndjson"));
    let second = dir
        .path()
        .join(std::ffi::OsStr::from_bytes(b"in\xfe.ndjson"));
    write_lines(&first, &lines[..10]);
    write_lines(&second, &other_lines());
    for (file, source, inserted) in [(&first, "first", 10), (&second, "second", 30)] {
        // Such a path cannot name its own source: the run is refused, with
        // the way out, before anything is committed.
        let out = Command::new(BIN)
            .args(["ingest", "--store", s(&store), "--json"])
            .arg(file)
            .output()
            .expect("run ingest");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("not UTF-8") && stderr.contains("--source"),
            "{stderr}"
        );
        let out = Command::new(BIN)
            .args(["ingest", "--store", s(&store), "--json", "--source", source])
            .arg(file)
            .output()
            .expect("run ingest");
        assert!(out.status.success(), "{}", text(&out.stderr));
        let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("json");
        assert_eq!(report["inserted"].as_u64(), Some(inserted), "{report}");
    }
    assert_eq!(scan(&store).len(), 40);
}

#[test]
fn a_source_name_too_long_for_its_batch_ids_is_refused_before_anything_is_committed() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let lines = lines_with(&[]);
    // A default source is the file's path: nested so that it comes to 4,038
    // bytes, one more than a batch id leaves room for beside its offsets.
    let mut deep = std::fs::canonicalize(dir.path()).unwrap();
    let file_name = |deep: &Path| {
        let left = 4038 - deep.as_os_str().len() - 1;
        "f".repeat(left)
    };
    while file_name(&deep).len() > 200 {
        deep.push("d".repeat(200));
    }
    std::fs::create_dir_all(&deep).unwrap();
    let file = deep.join(file_name(&deep));
    assert_eq!(file.as_os_str().len(), 4038);
    write_lines(&file, &lines[..10]);
    for (source, refused) in [(None, "4038 bytes"), (Some("s".repeat(4038)), "4038 bytes")] {
        let mut cmd = Command::new(BIN);
        cmd.args(["ingest", "--store", s(&store), "--json"]);
        if let Some(source) = &source {
            cmd.args(["--source", source]);
        }
        let out = cmd.arg(&file).output().expect("run ingest");
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(refused) && stderr.contains("--source"),
            "{stderr}"
        );
        assert!(!store.exists(), "nothing created for a refused run");
    }
    // One byte shorter fits every batch id the run could make.
    let out = Command::new(BIN)
        .args([
            "ingest",
            "--store",
            s(&store),
            "--json",
            "--batch-size",
            "3",
        ])
        .args(["--source", &"s".repeat(4037)])
        .arg(&file)
        .output()
        .expect("run ingest");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(text(&out.stdout).trim()).expect("json");
    assert_eq!(report["inserted"].as_u64(), Some(10), "{report}");
}
