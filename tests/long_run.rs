//! A long run with a short seen TTL and frequent compaction: index memory
//! and disk stay flat while the state stays equal to a plain reference.
//!
//! The default run is short (CI); `IDEMKV_LONG_RUN_BATCHES=20000 cargo test
//! --release --test long_run -- --nocapture` runs it long.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idemkv::{Batch, Durability, ManualClock, Options, Store};

const KEYS: u64 = 2_000;
const BATCH_DELIVERIES: u64 = 200;

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The reference: live rows by key, each with its seq and value.
type Reference = BTreeMap<Vec<u8>, (u64, Vec<u8>)>;

/// Batch `b`: puts and deletes over a fixed key space with increasing seqs,
/// a quarter of them redelivered within the batch or from the previous one.
fn batch(
    b: u64,
    rng: &mut Rng,
    reference: &mut Reference,
    previous: &mut Vec<(String, String, u64, Option<String>)>,
) -> Batch {
    let mut batch = Batch::new(format!("B{b:08}"));
    let mut events = Vec::new();
    for i in 0..BATCH_DELIVERIES {
        let seq = b * BATCH_DELIVERIES + i + 1;
        let key = format!("key/{:05}", rng.next() % KEYS);
        let value = (!rng.next().is_multiple_of(10))
            .then(|| format!("{{\"v\":{seq},\"pad\":\"{}\"}}", "x".repeat(40)));
        events.push((format!("e{seq}"), key, seq, value));
    }
    let redelivered: Vec<_> = previous
        .iter()
        .filter(|_| rng.next().is_multiple_of(4))
        .cloned()
        .collect();
    for (id, key, seq, value) in redelivered.iter().chain(events.iter()) {
        batch = match value {
            Some(v) => batch.put(id, key, *seq, v),
            None => batch.delete(id, key, *seq),
        };
    }
    for (_, key, seq, value) in &events {
        match value {
            Some(v) => reference.insert(key.as_bytes().to_vec(), (*seq, v.as_bytes().to_vec())),
            None => reference.remove(key.as_bytes()),
        };
    }
    *previous = events;
    batch.checkpoint("src", b.to_be_bytes())
}

#[test]
fn memory_and_disk_stay_flat_under_expiry_and_compaction() {
    let batches: u64 = std::env::var("IDEMKV_LONG_RUN_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500);
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let options = Options::default()
        .durability(Durability::Buffered)
        .clock(Arc::new(clock.clone()))
        .seen_ttl(Some(Duration::from_secs(60)))
        .batch_ttl(Some(Duration::from_secs(60)))
        .segment_bytes_max(256 * 1024);
    let mut store = Store::open(dir.path(), options.clone()).unwrap();
    let mut rng = Rng(42);
    let mut reference = Reference::new();
    let mut previous = Vec::new();
    let mut samples = Vec::new();
    for b in 0..batches {
        let report = store
            .apply_batch(&batch(b, &mut rng, &mut reference, &mut previous))
            .unwrap();
        assert_eq!(report.deliveries(), report.counts().iter().sum::<u64>());
        clock.advance(Duration::from_secs(1));
        if b % 50 == 49 {
            store.compact().unwrap();
            let stats = store.stats();
            let index = stats.index_bytes.keys + stats.index_bytes.seen + stats.index_bytes.batches;
            samples.push((b, index, stats.disk_bytes, stats.seen_ids));
        }
        if b % 200 == 199 {
            store.close().unwrap();
            store = Store::open(dir.path(), options.clone()).unwrap();
        }
    }

    let rows: Reference = store
        .scan_prefix(b"")
        .map(|r| {
            let (k, rec) = r.unwrap();
            (k.to_vec(), (rec.seq, rec.value.to_vec()))
        })
        .collect();
    assert!(
        rows == reference,
        "state differs from the reference ({} rows vs {})",
        rows.len(),
        reference.len()
    );

    // Once the TTL has passed (60 batches) and the key space is full, every
    // later sample must stay within 1.5x of the first steady one.
    let steady: Vec<_> = samples.iter().filter(|s| s.0 >= 200).collect();
    let first = steady.first().expect("run long enough for a steady state");
    for (b, index, disk, seen) in &steady {
        println!("after batch {b}: index {index} B, disk {disk} B, {seen} seen ids");
        assert!(
            *index * 2 <= first.1 * 3,
            "index memory grew: {index} after batch {b}, {} at first",
            first.1
        );
        assert!(
            *disk * 2 <= first.2 * 3,
            "disk grew: {disk} after batch {b}, {} at first",
            first.2
        );
        assert!(
            *seen <= 62 * (BATCH_DELIVERIES + BATCH_DELIVERIES / 2),
            "{seen} seen ids held past their TTL"
        );
    }
}
