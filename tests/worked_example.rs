//! DESIGN.md's worked example, byte for byte: the store it describes is
//! built here and its files compared with the hex dumps in DESIGN.md, so
//! the format section cannot drift from the code (the batch content hash,
//! the record layout and the snapshot sections are all in those bytes).
//! `DUMP=1 cargo test --test worked_example -- --nocapture` prints the
//! files in the same form.

use std::path::Path;
use std::sync::Arc;

use idemkv::{Batch, Durability, ManualClock, Options, Store};

/// The bytes of the hex dump that follows `heading` in DESIGN.md: the first
/// fenced block after it, each line an offset and then bytes in hex.
fn dump_after(design: &str, heading: &str) -> Vec<u8> {
    let after = design
        .split_once(heading)
        .unwrap_or_else(|| panic!("DESIGN.md has {heading:?}"))
        .1;
    let block = after
        .split_once("```\n")
        .and_then(|(_, rest)| rest.split_once("\n```"))
        .unwrap_or_else(|| panic!("a fenced block after {heading:?}"))
        .0;
    let mut bytes = Vec::new();
    for line in block.lines() {
        let mut fields = line.split_whitespace();
        let offset = fields.next().expect("an offset");
        assert_eq!(
            usize::from_str_radix(offset, 16).expect("a hex offset"),
            bytes.len(),
            "line {line:?} starts where the previous one ended"
        );
        bytes.extend(fields.map(|b| u8::from_str_radix(b, 16).expect("a hex byte")));
    }
    bytes
}

/// `bytes` as DESIGN.md shows them, to paste there after a format change.
fn hex_dump(bytes: &[u8]) -> String {
    let lines = bytes.chunks(16).enumerate().map(|(i, line)| {
        let hex: Vec<String> = line.iter().map(|b| format!("{b:02x}")).collect();
        format!("{:04x}  {}", i * 16, hex.join(" "))
    });
    lines.collect::<Vec<_>>().join("\n")
}

#[test]
fn the_files_of_the_worked_example_are_the_bytes_design_md_shows() {
    let design = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("DESIGN.md"))
        .expect("read DESIGN.md");
    let dir = tempfile::tempdir().unwrap();
    let options = Options::default()
        .durability(Durability::Buffered)
        .clock(Arc::new(ManualClock::new(1_789_948_800_000)));
    let store = Store::open(dir.path(), options).unwrap();
    let report = store
        .apply_batch(
            &Batch::new("B1")
                .put("e1", "k1", 7, "v")
                .add("e2", "c", 3, 5)
                .checkpoint("src", [0x2a]),
        )
        .unwrap();
    assert_eq!((report.inserted, report.added), (1, 1));
    store.snapshot().unwrap();
    store.close().unwrap();

    let segment = std::fs::read(dir.path().join("0000000001.seg")).unwrap();
    let snapshot = std::fs::read(dir.path().join("SNAPSHOT")).unwrap();
    if std::env::var_os("DUMP").is_some() {
        eprintln!(
            "The segment:\n{}\nThe snapshot:\n{}",
            hex_dump(&segment),
            hex_dump(&snapshot)
        );
    }
    assert_eq!(segment.len(), 178);
    assert_eq!(segment, dump_after(&design, "The segment:"), "the segment");
    assert_eq!(snapshot.len(), 386);
    assert_eq!(
        snapshot,
        dump_after(&design, "The snapshot:"),
        "the snapshot"
    );
}
