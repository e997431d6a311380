//! `ndjson_line`: arbitrary bytes into `idemkv::cli::parse_line` under a few
//! field mappings.
//!
//! Input: the first byte picks the mapping, the rest is the line. Checks:
//! no panic; a delivery has a non-empty event id (at most 4096 bytes; 32
//! lowercase hex characters when derived from the content) and a non-empty
//! key; a put's value is canonical JSON (canonicalizing it again changes
//! nothing); a trailing newline or a leading byte order mark changes
//! nothing; an error's message stays short.

use idemkv::Op;
use idemkv::cli::ndjson::EVENT_ID_BYTES_MAX;
use idemkv::cli::{FieldMapping, canonical, parse_line};

/// The mappings the first input byte picks from.
pub fn mappings() -> Vec<FieldMapping> {
    vec![
        FieldMapping::default(),
        FieldMapping {
            key_fields: vec!["order_id".to_owned(), "line_no".to_owned()],
            seq_field: "lsn".to_owned(),
            ..FieldMapping::default()
        },
        FieldMapping {
            id_from_content: true,
            ignore_fields: vec!["received_at".to_owned(), "partition".to_owned()],
            ..FieldMapping::default()
        },
        FieldMapping {
            id_field: "id".to_owned(),
            key_fields: vec!["a".to_owned(), "b".to_owned(), "c".to_owned()],
            key_separator: String::new(),
            op_field: "event_id".to_owned(),
            value_field: "id".to_owned(),
            delta_field: "seq".to_owned(),
            ..FieldMapping::default()
        },
    ]
}

/// Longest error message accepted, in bytes.
const MESSAGE_BYTES_MAX: usize = 512;

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((&pick, line)) = data.split_first() else {
        return;
    };
    let mappings = mappings();
    let mapping = &mappings[usize::from(pick) % mappings.len()];
    let parsed = parse_line(line, mapping);
    match &parsed {
        Ok(d) => {
            assert!(
                !d.event_id.is_empty(),
                "a delivery with an empty event id: {d:?}"
            );
            assert!(
                d.event_id.len() <= EVENT_ID_BYTES_MAX,
                "an event id too long: {d:?}"
            );
            assert!(!d.key.is_empty(), "a delivery with an empty key: {d:?}");
            if mapping.id_from_content {
                assert!(
                    d.event_id.len() == 32
                        && d.event_id
                            .iter()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)),
                    "a content id that is not 32 lowercase hex characters: {d:?}"
                );
            }
            match &d.op {
                Op::Put(value) => {
                    let again = canonical::canonicalize(value)
                        .unwrap_or_else(|e| panic!("a put value that is not JSON ({e}): {d:?}"));
                    assert_eq!(
                        String::from_utf8_lossy(&again),
                        String::from_utf8_lossy(value),
                        "a put value that is not canonical: {d:?}"
                    );
                }
                Op::Delete | Op::Add(_) => {}
                Op::Malformed { .. } => panic!("parse_line returned a malformed delivery: {d:?}"),
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.len() <= MESSAGE_BYTES_MAX,
                "an error message of {} bytes: {}...",
                message.len(),
                &message[..message
                    .char_indices()
                    .nth(200)
                    .map_or(message.len(), |(i, _)| i)]
            );
        }
    }
    // What the line says does not depend on its line ending or a byte order mark.
    if !line.ends_with(b"\n") {
        let mut with_newline = line.to_vec();
        with_newline.push(b'\n');
        assert_eq!(
            parse_line(&with_newline, mapping),
            parsed,
            "a line ending changes the line"
        );
    }
    if !line.starts_with(b"\xEF\xBB\xBF") {
        let mut with_bom = b"\xEF\xBB\xBF".to_vec();
        with_bom.extend_from_slice(line);
        assert_eq!(
            parse_line(&with_bom, mapping),
            parsed,
            "a byte order mark changes the line"
        );
    }
}
