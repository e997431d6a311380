//! What opening and compacting a store leave in the process's memory.
//!
//! Both read whole files through memory maps (the snapshot or a base
//! segment, and the log replayed after it), and a compaction builds and
//! frees indexes as large as the live one. The pages read go back as the
//! walk passes them, and a compaction hands the heap it freed back
//! (DESIGN.md, "Memory beyond the index"), so that the process's peak
//! during an open stays near what the open store holds, and a compaction
//! leaves no file's pages behind; nor does a digest, which reads every
//! live value through the maps.
//!
//! The measurements come from a process of their own, one that only opens
//! and compacts: `memory_child_process` does the work when
//! `IDEMKV_MEMORY_CHILD_DIR` names a store, and nothing otherwise; another
//! such process fills the store first and dies without closing it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use idemkv::{Batch, Durability, Options, Store};

const CHILD_DIR_VAR: &str = "IDEMKV_MEMORY_CHILD_DIR";
/// `fill` or `measure`.
const CHILD_STEP_VAR: &str = "IDEMKV_MEMORY_CHILD_STEP";
const BATCHES: u64 = 600;
const DELIVERIES: u64 = 1_000;
const KEYS: u64 = 200_000;

/// This process's peak resident memory, its resident memory, and the part
/// of it that maps files (`VmHWM`, `VmRSS`, `RssFile`), in KiB.
fn memory_kib() -> [u64; 3] {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .expect("the field is there")
    };
    [field("VmHWM:"), field("VmRSS:"), field("RssFile:")]
}

/// A store of 600,000 events over 200,000 keys, with a snapshot halfway
/// and as much log after it, left without a snapshot of its end, so that
/// an open loads the snapshot and replays the log after it.
fn fill(dir: &Path) {
    let options = Options::default()
        .durability(Durability::Buffered)
        .snapshot_log_bytes(None);
    let store = Store::open(dir, options).expect("open");
    let mut seq: u64 = 0;
    for b in 0..BATCHES {
        let mut batch = Batch::new(format!("B{b:06}"));
        for _ in 0..DELIVERIES {
            seq += 1;
            let k = seq.wrapping_mul(2_654_435_761) % KEYS;
            let value = format!(
                "{{\"order\":{k},\"qty\":{},\"note\":\"{:>60}\"}}",
                seq % 7,
                seq
            );
            batch = batch.put(format!("e{seq:09}"), format!("O{k:07}"), seq, value);
        }
        store.apply_batch(&batch).expect("apply");
        if b == BATCHES / 2 {
            store.snapshot().expect("snapshot");
        }
    }
    // As a crash would leave it: the log after the snapshot stays.
    std::mem::forget(store);
    std::process::exit(0);
}

/// In the child: opens and compacts the store, and prints what memory did.
#[test]
fn memory_child_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR_VAR) else {
        return;
    };
    if std::env::var(CHILD_STEP_VAR).as_deref() == Ok("fill") {
        fill(Path::new(&dir));
    }
    let [_, before, _] = memory_kib();
    let store = Store::open(PathBuf::from(dir), Options::default()).expect("open");
    let [open_peak, open, open_files] = memory_kib();
    store.digest().expect("digest");
    let [_, _, digested_files] = memory_kib();
    store.compact().expect("compact");
    let [_, _, compacted_files] = memory_kib();
    println!(
        "memory: before {before} open-peak {open_peak} open {open} \
         open-files {open_files} digested-files {digested_files} \
         compacted-files {compacted_files}"
    );
    store.close().expect("close");
}

#[test]
#[cfg(target_os = "linux")]
fn opening_and_compacting_give_back_what_they_read_and_freed() {
    // Under the target directory, not the system's temp dir: on a tmpfs
    // `/tmp` mapped pages count in `RssShmem`, and the `RssFile` checks
    // below would hold whatever the store left resident.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let child = |step: &str| {
        Command::new(std::env::current_exe().expect("current exe"))
            .args([
                "memory_child_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_VAR, dir.path())
            .env(CHILD_STEP_VAR, step)
            .stdin(Stdio::null())
            .output()
            .expect("run the child")
    };
    let filled = child("fill");
    assert!(filled.status.success(), "{filled:?}");
    let child = child("measure");
    let out = String::from_utf8_lossy(&child.stdout);
    let err = String::from_utf8_lossy(&child.stderr);
    assert!(child.status.success(), "child failed: {out} {err}");
    let figures: Vec<u64> = out
        .lines()
        .find_map(|l| Some(l.split_once("memory: ")?.1))
        .expect("the child reports")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let [
        before,
        open_peak,
        open,
        open_files,
        digested_files,
        compacted_files,
    ] = figures[..]
    else {
        panic!("six figures: {out}");
    };
    let held = open - before;
    assert!(
        held > 20 << 10,
        "the open store holds its index: {held} KiB"
    );
    // Without the releases, the open peaked 25 MiB above what it holds
    // (the snapshot file's pages), 7 MiB with them; the compaction left
    // every page of the base file mapped (38 MiB more, 0 with them), and a
    // digest the pages of every live value it read. Free
    // heap is not checked: glibc keeps what a thread frees at the top of
    // its arena, which `malloc_trim` does not hand back.
    assert!(
        open_peak - open < 14 << 10,
        "open peaked {} KiB above what it holds ({open} KiB)",
        open_peak - open
    );
    assert!(
        digested_files < open_files + (4 << 10),
        "the digest left {digested_files} KiB of file pages, the open store {open_files} KiB"
    );
    assert!(
        compacted_files < open_files + (4 << 10),
        "compaction left {compacted_files} KiB of file pages, the open store {open_files} KiB"
    );
}
