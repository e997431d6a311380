//! Seed corpora, made from stores the real engine writes. `cargo test
//! --manifest-path fuzz/Cargo.toml -- --ignored write_seed_corpora` writes
//! them to `fuzz/corpus/<target>/`; the committed files came from there.

use arbitrary::{Arbitrary, Unstructured};

use crate::apply_model;
use crate::decode_record::{
    CONTAINER_BASE, CONTAINER_LOG, CONTAINER_RAW_SEGMENT, CONTAINER_RAW_SNAPSHOT,
    CONTAINER_SNAPSHOT, FLAG_OPEN, FLAG_SYNCED, join_records,
};
use crate::image::SeedStore;
use crate::layout::{self, FileKind};
use crate::open_store::{self, Edit};

/// Names of the targets, as in `fuzz_targets/`.
pub const TARGETS: [&str; 4] = ["decode_record", "open_store", "apply_model", "ndjson_line"];

fn file(files: &[(String, Vec<u8>)], name: &str) -> Vec<u8> {
    files
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
        .clone()
}

fn is_kind(bytes: &[u8], kind: FileKind) -> bool {
    bytes.get(16..20) == Some(&(kind as u32).to_le_bytes()[..])
}

fn open_store_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for store in SeedStore::ALL {
        let files = store.files();
        let input = open_store::Input {
            flags: 0,
            files: files
                .iter()
                .map(|(n, b)| (open_store::name_byte(n), b.clone()))
                .collect(),
            edits: Vec::new(),
        };
        out.push((format!("{store:?}").to_lowercase(), input.to_bytes()));
        // The same store under other options, with one damaged value byte
        // whose checksums are mended, so that the damage reaches the decoder.
        let mut mended = input.clone();
        mended.flags = open_store::FLAG_MEND
            | open_store::FLAG_QUARANTINE
            | open_store::FLAG_SMALL_SEGMENTS
            | open_store::FLAG_BUFFERED;
        mended.edits.push(Edit {
            op: open_store::EDIT_XOR,
            file: 0,
            offset: 100,
            value: 0x01,
        });
        out.push((
            format!("{store:?}-mended").to_lowercase(),
            mended.to_bytes(),
        ));
    }
    out
}

fn decode_record_seeds() -> Vec<(String, Vec<u8>)> {
    let rotated = SeedStore::Rotated.files();
    let closed = SeedStore::Closed.files();
    let compacted = SeedStore::Compacted.files();
    let segment_1 = file(&rotated, &crate::image::segment_name(1));
    let snapshot = file(&closed, "SNAPSHOT");
    let base = compacted
        .iter()
        .find(|(_, b)| is_kind(b, FileKind::Base))
        .expect("a base segment")
        .1
        .clone();
    let seed = |container: u8, flags: u8, payload: &[u8]| {
        let mut s = vec![container, flags];
        s.extend_from_slice(payload);
        s
    };
    vec![
        (
            "raw-segment".to_owned(),
            seed(CONTAINER_RAW_SEGMENT, FLAG_OPEN, &segment_1),
        ),
        (
            "raw-snapshot".to_owned(),
            seed(CONTAINER_RAW_SNAPSHOT, FLAG_OPEN, &snapshot),
        ),
        (
            "batch-records".to_owned(),
            seed(
                CONTAINER_LOG,
                FLAG_SYNCED | FLAG_OPEN,
                &join_records(&layout::records(&segment_1)),
            ),
        ),
        (
            "base-records".to_owned(),
            seed(
                CONTAINER_BASE,
                FLAG_OPEN,
                &join_records(&layout::records(&base)),
            ),
        ),
        (
            "snapshot-records".to_owned(),
            seed(
                CONTAINER_SNAPSHOT,
                FLAG_OPEN,
                &join_records(&layout::records(&snapshot)),
            ),
        ),
    ]
}

/// Which step kinds an `apply_model` input holds.
fn step_kinds(data: &[u8]) -> Option<(usize, u16)> {
    let input = apply_model::Input::arbitrary_take_rest(Unstructured::new(data)).ok()?;
    let mut kinds = 0u16;
    for step in &input.steps {
        kinds |= 1
            << match step {
                apply_model::Step::Apply { .. } => 0,
                apply_model::Step::Reopen => 1,
                apply_model::Step::Crash => 2,
                apply_model::Step::Compact => 3,
                apply_model::Step::Snapshot => 4,
                apply_model::Step::Verify => 5,
                apply_model::Step::Advance(_) => 6,
                apply_model::Step::Back(_) => 7,
            };
    }
    Some((input.steps.len(), kinds))
}

fn apply_model_seeds() -> Vec<(String, Vec<u8>)> {
    // Bytes from a fixed xorshift, kept when they add a step kind.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::new();
    let mut covered = 0u16;
    for _ in 0..2_000 {
        let len = 256 + (next() % 1024) as usize;
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let Some((steps, kinds)) = step_kinds(&data) else {
            continue;
        };
        if steps >= 8 && kinds & !covered != 0 && kinds.count_ones() >= 4 {
            covered |= kinds;
            out.push((format!("steps-{}", out.len()), data));
        }
        if covered == 0xff && out.len() >= 4 {
            break;
        }
    }
    out
}

fn ndjson_line_seeds() -> Vec<(String, Vec<u8>)> {
    let lines: [(u8, &str); 8] = [
        (
            0,
            r#"{"event_id":"e201","key":"O1001/1","seq":201,"op":"put","value":{"qty":2,"amount_cents":1998}}"#,
        ),
        (
            0,
            "{\"event_id\":\"e204\",\"key\":\"O1005/2\",\"seq\":204,\"op\":\"delete\"}\r\n",
        ),
        (
            0,
            r#"{"event_id":"e300","key":"visits/2026-09-21","seq":"300","op":"add","delta":-5}"#,
        ),
        (
            1,
            r#"{"event_id":7,"order_id":"O1001","line_no":1,"lsn":"42","op":"put","value":[1.5,"\u00e9",null,true,1e2]}"#,
        ),
        (
            2,
            r#"{"key":"k","seq":1,"op":"put","value":{"b":1,"a":2},"received_at":"10:00","partition":3}"#,
        ),
        (
            3,
            r#"{"id":"x","a":"1","b":2,"c":-3.5,"seq":4,"event_id":"add"}"#,
        ),
        (0, r#"{"event_id":"", "key": }"#),
        (
            0,
            "\u{feff}{\"event_id\":\"e1\",\"key\":\"k\",\"seq\":18446744073709551615,\"op\":\"delete\"}",
        ),
    ];
    lines
        .iter()
        .enumerate()
        .map(|(i, (pick, line))| {
            let mut data = vec![*pick];
            data.extend_from_slice(line.as_bytes());
            (format!("line-{i}"), data)
        })
        .collect()
}

/// The seed corpus of `target`: (file name, bytes).
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    match target {
        "open_store" => open_store_seeds(),
        "decode_record" => decode_record_seeds(),
        "apply_model" => apply_model_seeds(),
        "ndjson_line" => ndjson_line_seeds(),
        other => panic!("no target {other}"),
    }
}

/// Runs one input of `target`.
pub fn run(target: &str, data: &[u8]) {
    match target {
        "open_store" => crate::open_store::run(data),
        "decode_record" => crate::decode_record::run(data),
        "apply_model" => {
            if let Ok(input) = apply_model::Input::arbitrary_take_rest(Unstructured::new(data)) {
                apply_model::run(&input);
            }
        }
        "ndjson_line" => crate::ndjson_line::run(data),
        other => panic!("no target {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn corpus_dir(target: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(target)
    }

    #[test]
    fn every_seed_runs_clean() {
        for target in TARGETS {
            let seeds = corpus(target);
            assert!(seeds.len() >= 3, "{target} has {} seeds", seeds.len());
            for (name, data) in seeds {
                eprintln!("{target}/{name}: {} bytes", data.len());
                if target == "apply_model" {
                    // `run` skips an input that does not decode; a seed must.
                    apply_model::Input::arbitrary_take_rest(Unstructured::new(&data))
                        .unwrap_or_else(|e| panic!("{name} does not decode: {e}"));
                }
                run(target, &data);
            }
        }
    }

    #[test]
    fn seed_stores_open_and_verify() {
        for store in SeedStore::ALL {
            let files = store.files();
            let segments = files.iter().filter(|(n, _)| n.ends_with(".seg")).count();
            assert!(
                (1..=3).contains(&segments),
                "{store:?}: {segments} segments"
            );
            let storage = crate::image::disk_with(&files);
            let clock = idemkv::ManualClock::new(crate::image::START_MS);
            let opts = crate::image::options(&storage, &clock);
            let verified = idemkv::Store::verify_dir(crate::image::dir(), &opts);
            assert_eq!(
                verified.is_ok(),
                store != SeedStore::TornTail,
                "{store:?}: {verified:?}"
            );
            idemkv::Store::open(crate::image::dir(), opts).expect("open");
        }
    }

    /// The committed stores are in the format the engine writes now: a whole
    /// store verifies. (After a format change, rewrite them with
    /// `write_seed_corpora`.)
    #[test]
    fn committed_store_seeds_are_current() {
        let entries = std::fs::read_dir(corpus_dir("open_store")).expect("the open_store corpus");
        for entry in entries {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            if !name.starts_with("seed-") || name.contains("torn") || name.contains("mended") {
                continue;
            }
            let input = open_store::Input::parse(&std::fs::read(&path).expect("read"));
            let storage = crate::image::disk_with(&input.files_after_edits());
            let clock = idemkv::ManualClock::new(crate::image::START_MS);
            let opts = crate::image::options(&storage, &clock);
            if let Err(e) = idemkv::Store::verify_dir(crate::image::dir(), &opts) {
                panic!("{name} no longer verifies ({e}): rewrite the seed corpora");
            }
        }
    }

    /// Every committed corpus file still runs clean.
    #[test]
    fn committed_corpora_run_clean() {
        for target in TARGETS {
            let entries = std::fs::read_dir(corpus_dir(target))
                .unwrap_or_else(|e| panic!("the {target} corpus: {e}"));
            for entry in entries {
                let path = entry.expect("entry").path();
                run(target, &std::fs::read(&path).expect("read"));
            }
        }
    }

    #[test]
    #[ignore = "writes fuzz/corpus/; run by hand after a format change"]
    fn write_seed_corpora() {
        for target in TARGETS {
            let dir = corpus_dir(target);
            std::fs::create_dir_all(&dir).expect("corpus dir");
            for (name, data) in corpus(target) {
                std::fs::write(dir.join(format!("seed-{name}")), data).expect("write seed");
            }
        }
    }
}
