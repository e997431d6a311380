//! Semantics check before any figure counts: every stateful engine is fed the
//! same random batches (puts, deletes, stale and tied seqs, adds on counters,
//! adds on non-counters, redeliveries, conflicting ids, invalid events, batch
//! replays and batch conflicts) and must return the same outcome as idemkv
//! for every batch, and the same digest along the way.

use std::path::Path;

use bytes::Bytes;
use idemkv::{Batch, BatchReport, Delivery, Op};

use crate::engines::{self, Engine, IdemkvConfig, Kind, Mode};
use crate::workload::Rng;
use crate::semantics::Refused;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Applied(BatchReport),
    Refused(String),
}

fn outcome(r: Result<BatchReport, Refused>) -> Outcome {
    match r {
        Ok(report) => Outcome::Applied(report),
        // Reasons are worded differently; kind and index must agree.
        Err(Refused::ConflictingEvent { index }) => Outcome::Refused(format!("conflicting event at {index}")),
        Err(Refused::InvalidEvent { index, .. }) => Outcome::Refused(format!("invalid event at {index}")),
        Err(Refused::BatchConflict) => Outcome::Refused("batch conflict".into()),
        Err(Refused::Other(e)) => panic!("engine failed: {e}"),
    }
}

fn batches(seed: u64, count: usize) -> Vec<Batch> {
    let mut rng = Rng::new(seed);
    let mut history: Vec<Delivery> = Vec::new();
    let mut sent: Vec<Batch> = Vec::new();
    let mut next_id = 0u64;
    let mut out = Vec::new();
    for b in 0..count {
        let roll = rng.below(100);
        if roll < 6 && !sent.is_empty() {
            // The same batch again: a replay.
            let i = rng.below(sent.len() as u64) as usize;
            out.push(sent[i].clone());
            continue;
        }
        let id = if roll < 8 && !sent.is_empty() {
            // A used batch id with new content: a batch conflict.
            let i = rng.below(sent.len() as u64) as usize;
            sent[i].id().to_vec()
        } else {
            format!("T{seed}-{b:05}").into_bytes()
        };
        let mut batch = Batch::new(id);
        for _ in 0..1 + rng.below(15) {
            let roll = rng.below(100);
            let d = if roll < 25 && !history.is_empty() {
                history[rng.below(history.len() as u64) as usize].clone()
            } else if roll < 27 && !history.is_empty() {
                let mut d = history[rng.below(history.len() as u64) as usize].clone();
                d.seq += 1;
                d
            } else if roll < 28 && rng.below(4) == 0 {
                next_id += 1;
                Delivery {
                    event_id: Bytes::from(format!("x{seed}-{next_id}")),
                    key: Bytes::new(),
                    seq: 1,
                    op: Op::Delete,
                }
            } else {
                next_id += 1;
                let counter = rng.below(4) == 0;
                let key = if counter {
                    format!("c{}", rng.below(3))
                } else {
                    format!("k{}", rng.below(10))
                };
                let seq = 1 + rng.below(200);
                let op = match rng.below(50) {
                    _ if counter => Op::Add(rng.below(11) as i64 - 5),
                    // A delta on a plain key: invalid while it holds a value.
                    0 => Op::Add(1),
                    1..=34 => Op::Put(Bytes::from(format!("v{}", rng.below(3)))),
                    _ => Op::Delete,
                };
                Delivery {
                    event_id: Bytes::from(format!("x{seed}-{next_id}")),
                    key: Bytes::from(key),
                    seq,
                    op,
                }
            };
            history.push(d.clone());
            batch.push_delivery(d);
        }
        batch.set_checkpoint(format!("s{}", rng.below(2)), rng.next_u64().to_be_bytes());
        sent.push(batch.clone());
        out.push(batch);
    }
    out
}

/// Runs the check in `dir`; `Err` names the first disagreement.
pub fn run(dir: &Path, kinds: &[Kind]) -> Result<(), String> {
    let stateful: Vec<Kind> = kinds.iter().copied().filter(|k| k.has_state() && k.available()).collect();
    let mut engines: Vec<(Kind, Box<dyn Engine>)> = Vec::new();
    for &kind in std::iter::once(&Kind::Idemkv).chain(stateful.iter().filter(|k| **k != Kind::Idemkv)) {
        let d = dir.join(kind.name());
        let _ = std::fs::remove_dir_all(&d);
        engines.push((kind, engines::open(kind, &d, Mode::Buffered, &IdemkvConfig::default())));
    }
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for seed in [1u64, 2, 3] {
        for (i, batch) in batches(seed, 400).iter().enumerate() {
            let mut first: Option<Outcome> = None;
            for (kind, engine) in &engines {
                let got = outcome(engine.apply(batch));
                match &first {
                    None => first = Some(got),
                    Some(want) if *want != got => {
                        return Err(format!(
                            "seed {seed} batch {i} ({}): idemkv {want:?}, {} {got:?}",
                            String::from_utf8_lossy(batch.id()),
                            kind.name()
                        ));
                    }
                    Some(_) => {}
                }
            }
            let label = match first.expect("at least idemkv") {
                Outcome::Applied(r) if r.replayed => "replayed".to_owned(),
                Outcome::Applied(_) => "applied".to_owned(),
                Outcome::Refused(e) => e.split(" at ").next().unwrap_or_default().to_owned(),
            };
            *counts.entry(label).or_default() += 1;
            if i % 50 == 49 {
                let want = engines[0].1.digest();
                for (kind, engine) in &engines[1..] {
                    if engine.digest() != want {
                        return Err(format!("seed {seed} after batch {i}: {} digest differs from idemkv", kind.name()));
                    }
                }
            }
        }
    }
    let names: Vec<&str> = engines.iter().map(|(k, _)| k.name()).collect();
    eprintln!("semantics check: {} agree on 1200 batches ({counts:?})", names.join(", "));
    for (_, engine) in engines {
        engine.close().map_err(|e| e.to_string())?;
    }
    Ok(())
}
