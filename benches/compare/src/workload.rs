//! The deterministic delivery generator of BENCHMARKS.md (seed 42).
//!
//! - `keys` business keys like `O0001234/2` (order number / line).
//! - Logical events numbered 1, 2, ... in delivery order; event `n` has id
//!   `e000000n` and, for a put or delete, seq `n` (a global increasing seq).
//!   Ops: 85% put of a ~100-byte JSON-like value, 5% delete, 10% stale put (a
//!   seq below the key's newest one; a key never written gets a plain put).
//!   A put's value is one of 16 variants per key, so some puts are unchanged.
//! - Deliveries: every event once, in event order, plus a redelivery of each
//!   event with probability `redeliver` (half of them later in the same
//!   batch, the other half 1, 2 or 3 batches later, at a random place).
//! - Batches of `batch_size` deliveries, ids `B0000001`...; every
//!   `replay_every`-th batch is handed over twice in a row (a replay).
//! - Each batch sets one checkpoint: source `cdc` (or `cdc/<b mod sources>`
//!   when batches are spread over several writers), position the highest
//!   event number in the batch (8 bytes, big-endian), or none if the batch
//!   holds only redeliveries.

use std::collections::VecDeque;

use bytes::Bytes;
use idemkv::{Batch, Delivery, Op};

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub events: u64,
    pub keys: u64,
    pub batch_size: usize,
    /// Probability that an event is delivered a second time.
    pub redeliver: f64,
    pub replay_every: u64,
    /// Checkpoint sources the batches are spread over (writer threads).
    pub sources: u64,
    pub seed: u64,
}

impl Spec {
    pub fn w1(events: u64) -> Self {
        Self {
            events,
            keys: 200_000,
            batch_size: 1_000,
            redeliver: 0.2,
            replay_every: 50,
            sources: 1,
            seed: 42,
        }
    }
}

pub fn key_name(k: u64) -> String {
    format!("O{:07}/{}", k / 4 + 1, k % 4 + 1)
}

const STATUS: [&str; 4] = ["pending", "paid", "shipped", "delivered"];

/// One of 16 values of key `k` (about 100 bytes).
pub fn value_of(k: u64, variant: u64) -> Vec<u8> {
    let qty = variant % 4 + 1;
    let status = STATUS[(variant / 4 % 4) as usize];
    let unit = 199 + (k * 7919) % 9800;
    format!(
        "{{\"order\":\"O{:07}\",\"line\":{},\"sku\":\"SKU-{:05}\",\"qty\":{},\"status\":\"{}\",\"amount_cents\":{}}}",
        k / 4 + 1,
        k % 4 + 1,
        (k * 31) % 100_000,
        qty,
        status,
        qty * unit
    )
    .into_bytes()
}

/// One batch as handed to an engine.
pub struct Handed {
    pub batch: Batch,
    /// Second hand-over of the same batch: the engine must say `replayed`.
    pub replay: bool,
}

/// The delivery stream, batch by batch.
pub struct Generator {
    spec: Spec,
    rng: Rng,
    next_event: u64,
    /// Newest seq per key (0: never written).
    latest: Vec<u64>,
    /// Keys written so far, in the order of their first write: a stale put
    /// draws its key among them, so that 10% of events are stale however
    /// few of the keys a short run reaches.
    written: Vec<u64>,
    /// Redeliveries due in the next batches (front: the next batch).
    due: VecDeque<Vec<Delivery>>,
    batch_no: u64,
    replay: Option<Batch>,
}

impl Generator {
    pub fn new(spec: Spec) -> Self {
        Self {
            spec,
            rng: Rng::new(spec.seed),
            next_event: 1,
            latest: vec![0; spec.keys as usize],
            written: Vec::new(),
            due: VecDeque::new(),
            batch_no: 0,
            replay: None,
        }
    }

    fn event(&mut self) -> Delivery {
        let n = self.next_event;
        self.next_event += 1;
        let mut k = self.rng.below(self.spec.keys);
        let roll = self.rng.below(100);
        if roll >= 90 && self.latest[k as usize] < 2 && !self.written.is_empty() {
            k = self.written[self.rng.below(self.written.len() as u64) as usize];
        }
        let latest = self.latest[k as usize];
        let (seq, op) = if roll < 85 || (roll >= 90 && latest < 2) {
            let variant = self.rng.below(16);
            (n, Op::Put(Bytes::from(value_of(k, variant))))
        } else if roll < 90 {
            (n, Op::Delete)
        } else {
            // Stale: below the key's newest seq.
            let span = (latest - 1).min(1_000);
            let seq = latest - 1 - self.rng.below(span);
            let variant = self.rng.below(16);
            (seq, Op::Put(Bytes::from(value_of(k, variant))))
        };
        if seq == n {
            if latest == 0 {
                self.written.push(k);
            }
            self.latest[k as usize] = n;
        }
        Delivery {
            event_id: Bytes::from(format!("e{n:09}")),
            key: Bytes::from(key_name(k)),
            seq,
            op,
        }
    }

    fn due_at(&mut self, ahead: usize) -> &mut Vec<Delivery> {
        while self.due.len() <= ahead {
            self.due.push_back(Vec::new());
        }
        &mut self.due[ahead]
    }

    fn next_batch(&mut self) -> Option<Batch> {
        let size = self.spec.batch_size;
        let mut carried = self.due.pop_front().unwrap_or_default();
        if carried.len() > size {
            let rest = carried.split_off(size);
            self.due_at(0).extend(rest);
        }
        if carried.is_empty() && self.next_event > self.spec.events && self.due.iter().all(Vec::is_empty) {
            return None;
        }
        // (position, delivery); originals at i * 1024 + 512.
        let mut placed: Vec<(u64, Delivery)> = Vec::with_capacity(size);
        let mut originals = 0u64;
        let mut same_batch: Vec<(u64, Delivery)> = Vec::new();
        let mut highest = None;
        let mut count = carried.len();
        while count < size && self.next_event <= self.spec.events {
            highest = Some(self.next_event);
            let d = self.event();
            count += 1;
            if self.rng.chance(self.spec.redeliver) {
                if self.rng.below(2) == 0 && count < size {
                    same_batch.push((originals, d.clone()));
                    count += 1;
                } else {
                    let ahead = self.rng.below(3) as usize;
                    self.due_at(ahead).push(d.clone());
                }
            }
            placed.push((originals * 1024 + 512, d));
            originals += 1;
        }
        let end = originals.max(1) * 1024;
        for (i, d) in same_batch {
            let from = i * 1024 + 513;
            placed.push((from + self.rng.below(end - from + 1), d));
        }
        for d in carried {
            placed.push((self.rng.below(end + 1), d));
        }
        placed.sort_by_key(|(pos, _)| *pos);
        self.batch_no += 1;
        let b = self.batch_no;
        let mut batch = Batch::new(format!("B{b:07}"));
        for (_, d) in placed {
            batch.push_delivery(d);
        }
        if let Some(h) = highest {
            let source = if self.spec.sources == 1 {
                "cdc".to_owned()
            } else {
                format!("cdc/{}", (b - 1) % self.spec.sources)
            };
            batch.set_checkpoint(source, h.to_be_bytes());
        }
        Some(batch)
    }
}

impl Iterator for Generator {
    type Item = Handed;

    fn next(&mut self) -> Option<Handed> {
        if let Some(batch) = self.replay.take() {
            return Some(Handed { batch, replay: true });
        }
        let batch = self.next_batch()?;
        if self.spec.replay_every > 0 && self.batch_no.is_multiple_of(self.spec.replay_every) {
            self.replay = Some(batch.clone());
        }
        Some(Handed { batch, replay: false })
    }
}

/// W5's store: `keys` keys written once each, then overwritten in turn,
/// `deliveries` events with distinct ids in batches of `batch_size`.
pub fn w5_batches(keys: u64, deliveries: u64, batch_size: u64) -> impl Iterator<Item = Batch> {
    let mut seq = 0u64;
    std::iter::from_fn(move || {
        if seq >= deliveries {
            return None;
        }
        let mut batch = Batch::new(format!("B{:08}", seq / batch_size + 1));
        while seq < deliveries && (batch.len() as u64) < batch_size {
            seq += 1;
            let k = (seq - 1) % keys;
            batch.push(format!("e{seq:09}"), key_name(k), seq, Op::Put(Bytes::from(value_of(k, seq / keys))));
        }
        batch.set_checkpoint("cdc", seq.to_be_bytes());
        Some(batch)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_deterministic_and_complete() {
        let spec = Spec::w1(20_000);
        let a: Vec<Batch> = Generator::new(spec).map(|h| h.batch).collect();
        let b: Vec<Batch> = Generator::new(spec).map(|h| h.batch).collect();
        assert_eq!(a, b);
        let mut ids = std::collections::HashSet::new();
        let mut deliveries = 0;
        for batch in Generator::new(spec).filter(|h| !h.replay) {
            assert!(batch.batch.len() <= 1_000);
            deliveries += batch.batch.len();
            for d in batch.batch.deliveries() {
                ids.insert(d.event_id.clone());
            }
        }
        assert_eq!(ids.len(), 20_000);
        let ratio = deliveries as f64 / 20_000.0;
        assert!((1.18..1.22).contains(&ratio), "{ratio}");
    }

    /// BENCHMARKS.md's mix: 85% puts, 5% deletes, 10% stale puts, also in a
    /// run too short to reach most keys (W3, `--quick`).
    #[test]
    fn events_mix_puts_deletes_and_stale_puts_as_specified() {
        for events in [20_000, 300_000] {
            let mut latest = std::collections::HashMap::new();
            let (mut puts, mut deletes, mut stale) = (0u64, 0u64, 0u64);
            let mut seen = std::collections::HashSet::new();
            for h in Generator::new(Spec::w1(events)).filter(|h| !h.replay) {
                for d in h.batch.deliveries() {
                    if !seen.insert(d.event_id.clone()) {
                        continue;
                    }
                    let newest = latest.entry(d.key.clone()).or_insert(0u64);
                    if d.seq < *newest {
                        stale += 1;
                        continue;
                    }
                    *newest = d.seq;
                    match d.op {
                        Op::Delete => deletes += 1,
                        _ => puts += 1,
                    }
                }
            }
            assert_eq!(puts + deletes + stale, events);
            let share = |n: u64| n as f64 / events as f64;
            assert!((0.84..0.86).contains(&share(puts)), "{events}: puts {}", share(puts));
            assert!((0.04..0.06).contains(&share(deletes)), "{events}: deletes {}", share(deletes));
            assert!((0.09..0.11).contains(&share(stale)), "{events}: stale {}", share(stale));
        }
    }

    #[test]
    fn values_are_about_100_bytes() {
        for k in [0, 7, 199_999] {
            for v in 0..16 {
                let n = value_of(k, v).len();
                assert!((90..=110).contains(&n), "{n}");
            }
        }
    }
}
