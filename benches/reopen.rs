//! Reopen and footprint figures (workload W5 of the benchmark suite): a
//! store with 1 million live keys and 5 million seen ids, opened from its
//! snapshot and by full replay, in one run; index bytes per seen id and per
//! key; disk bytes after compaction against the live data.
//!
//! `cargo bench --bench reopen` (set `IDEMKV_BENCH_SCALE=0.1` for a tenth of it).

use std::path::Path;
use std::time::{Duration, Instant};

use idemkv::{Batch, Durability, Options, Store};

fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs[runs.len() / 2]
}

fn open_timed(dir: &Path, options: &Options, keep_snapshot: bool) -> Duration {
    if !keep_snapshot {
        let _ = std::fs::remove_file(dir.join("SNAPSHOT"));
    }
    let started = Instant::now();
    let store = Store::open(dir, options.clone()).expect("open");
    let _ = store.get(b"O0000001/1").expect("read one key");
    let took = started.elapsed();
    assert_eq!(store.stats().opened_from_snapshot, keep_snapshot);
    // Closing rewrites the snapshot only when the open replayed in full.
    store.close().expect("close");
    took
}

fn main() {
    let scale: f64 = std::env::var("IDEMKV_BENCH_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let keys = (1_000_000.0 * scale) as u64;
    let deliveries = (5_000_000.0 * scale) as u64;
    let dir =
        tempfile::tempdir_in(std::env::var("IDEMKV_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .expect("tempdir");
    let options = Options::default()
        .durability(Durability::Buffered)
        .seen_ttl(None)
        .batch_ttl(None);

    let store = Store::open(dir.path(), options.clone()).expect("open");
    let value = format!(
        "{{\"qty\":2,\"amount_cents\":1998,\"note\":\"{}\"}}",
        "x".repeat(60)
    );
    let started = Instant::now();
    let mut batch = Batch::new("B0000000");
    // The logical data the store must keep: live keys with their values and
    // seqs, and every event id it saw (none expires here).
    let (mut live_bytes, mut id_bytes) = (0u64, 0u64);
    for seq in 1..=deliveries {
        // Every key is written once in the first pass, then overwritten.
        let key = format!("O{:07}/1", (seq - 1) % keys);
        let id = format!("e{seq}");
        id_bytes += id.len() as u64;
        batch = batch.put(id, &key, seq, &value);
        if seq > deliveries - keys {
            live_bytes += (key.len() + value.len() + 8) as u64;
        }
        if batch.len() == 5_000 {
            store.apply_batch(&batch).expect("apply");
            batch = Batch::new(format!("B{seq:07}"));
        }
    }
    store.apply_batch(&batch).expect("apply");
    let load = started.elapsed();
    let stats = store.stats();
    let key_len = 10.0;
    println!("loaded {deliveries} deliveries over {keys} keys in {load:.2?}");
    println!(
        "index: {:.1} bytes per seen id (target <= 32), {:.1} bytes + key length per live key (target <= 48)",
        stats.index_bytes.seen as f64 / stats.seen_ids as f64,
        stats.index_bytes.keys as f64 / stats.live_keys as f64 - key_len
    );
    store.close().expect("close");

    let replay = median(
        (0..3)
            .map(|_| open_timed(dir.path(), &options, false))
            .collect(),
    );
    let snapshot = median(
        (0..3)
            .map(|_| open_timed(dir.path(), &options, true))
            .collect(),
    );
    println!(
        "open: {snapshot:.2?} from the snapshot, {replay:.2?} by full replay: ratio {:.3} (target < 0.1)",
        snapshot.as_secs_f64() / replay.as_secs_f64()
    );

    let store = Store::open(dir.path(), options.clone()).expect("open");
    let report = store.compact().expect("compact");
    let stats = store.stats();
    assert_eq!(stats.seen_ids, deliveries, "no id expires");
    println!(
        "compaction: {} -> {} bytes in {:.2?} (pause {:.2?}); disk / (live data + event id bytes) = {:.2} (target <= 1.5)",
        report.bytes_before,
        report.bytes_after,
        report.duration,
        report.pause,
        stats.disk_bytes as f64 / (live_bytes + id_bytes) as f64
    );
}
