//! How rows, reports and times are printed: JSON through `canonical` (so
//! object keys come out sorted), text as aligned columns. Pure: no I/O.

use serde_json::{Map, Value};

use crate::cli::canonical::to_canonical;
use crate::{BatchReport, Record};

/// Names of the eight report counts, in `BatchReport::counts` order.
pub const COUNT_NAMES: [&str; 8] = [
    "inserted",
    "updated",
    "unchanged",
    "stale",
    "duplicates",
    "deleted",
    "added",
    "rejected",
];

/// Caller bytes for a column of text output: UTF-8 characters as they
/// are, except that a backslash, a control character (a tab or a newline
/// would forge a column or a row) and each byte that is not UTF-8 are
/// escaped, so that every backslash printed starts an escape.
pub fn bytes_text(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' || c.is_control() {
                text.extend(c.escape_default());
            } else {
                text.push(c);
            }
        }
        for byte in chunk.invalid() {
            text.push_str(&format!("\\x{byte:02x}"));
        }
    }
    text
}

/// Puts caller bytes into a JSON object as `name`, a string, when they are
/// UTF-8, and otherwise as `<name>_hex`, so that no string stands for two
/// byte strings.
pub fn insert_bytes(object: &mut Map<String, Value>, name: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object.insert(name.to_owned(), text.into()),
        Err(_) => object.insert(format!("{name}_hex"), hex(bytes).into()),
    };
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Puts a stored value into a JSON object: as `value` when it is JSON text
/// (puts from NDJSON, counters), otherwise as `value_text` (UTF-8) or
/// `value_hex`, so that a value that is not JSON never reads as one.
pub fn insert_value(object: &mut Map<String, Value>, bytes: &[u8]) {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => object.insert("value".to_owned(), value),
        Err(_) => match std::str::from_utf8(bytes) {
            Ok(text) => object.insert("value_text".to_owned(), text.into()),
            Err(_) => object.insert("value_hex".to_owned(), hex(bytes).into()),
        },
    };
}

/// `{"key":..,"seq":..,"value":..}` on one line (see `insert_bytes` and
/// `insert_value` for keys and values that are not UTF-8 or not JSON).
pub fn row_json(key: &[u8], record: &Record) -> String {
    let mut row = Map::new();
    insert_bytes(&mut row, "key", key);
    row.insert("seq".to_owned(), record.seq.into());
    insert_value(&mut row, &record.value);
    json_line(&Value::Object(row))
}

/// A stored value as text: its canonical JSON when it is JSON, otherwise
/// its bytes as `bytes_text` prints them.
pub fn value_text(bytes: &[u8]) -> String {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => json_line(&value),
        Err(_) => bytes_text(bytes),
    }
}

/// `key<TAB>seq<TAB>value`.
pub fn row_text(key: &[u8], record: &Record) -> String {
    format!(
        "{}\t{}\t{}",
        bytes_text(key),
        record.seq,
        value_text(&record.value)
    )
}

/// The eight counts as a JSON object (to be extended by the caller).
pub fn counts_object(report: &BatchReport) -> Map<String, Value> {
    COUNT_NAMES
        .iter()
        .zip(report.counts())
        .map(|(name, count)| ((*name).to_owned(), Value::from(count)))
        .collect()
}

/// `inserted 3  updated 0  ...`
pub fn counts_text(report: &BatchReport) -> String {
    COUNT_NAMES
        .iter()
        .zip(report.counts())
        .map(|(name, count)| format!("{name} {count}"))
        .collect::<Vec<_>>()
        .join("  ")
}

/// Canonical JSON text of `value`.
pub fn json_line(value: &Value) -> String {
    String::from_utf8(to_canonical(value)).expect("canonical JSON is UTF-8")
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn utc_timestamp(ms: u64) -> String {
    let days = ms / 86_400_000;
    let in_day = ms % 86_400_000;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1000 % 60,
        in_day % 1000
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_print_counters_as_integers_and_values_as_json() {
        let counter = Record {
            seq: 7,
            value: bytes::Bytes::from_static(b"-12"),
        };
        assert_eq!(
            row_json(b"visits", &counter),
            r#"{"key":"visits","seq":7,"value":-12}"#
        );
        let put = Record {
            seq: 201,
            value: bytes::Bytes::from_static(br#"{"qty":2,"amount_cents":1998}"#),
        };
        assert_eq!(
            row_json(b"O1001/1", &put),
            r#"{"key":"O1001/1","seq":201,"value":{"amount_cents":1998,"qty":2}}"#
        );
        let text = Record {
            seq: 1,
            value: bytes::Bytes::from_static(b"hello"),
        };
        assert_eq!(
            row_json(b"k", &text),
            r#"{"key":"k","seq":1,"value_text":"hello"}"#
        );
        let raw = Record {
            seq: 1,
            value: bytes::Bytes::from_static(b"not json\xff"),
        };
        assert_eq!(
            row_json(b"k\xff", &raw),
            r#"{"key_hex":"6bff","seq":1,"value_hex":"6e6f74206a736f6eff"}"#
        );
        // A JSON string value and a key that spells an escape stay apart.
        let string = Record {
            seq: 1,
            value: bytes::Bytes::from_static(br#""hello""#),
        };
        assert_eq!(
            row_json(br"\xff", &string),
            r#"{"key":"\\xff","seq":1,"value":"hello"}"#
        );
    }

    #[test]
    fn text_columns_escape_what_could_forge_a_column_or_a_row() {
        assert_eq!(bytes_text("O1001/1 é".as_bytes()), "O1001/1 é");
        assert_eq!(bytes_text(b"a\tb\nc\\d\xff"), r"a\tb\nc\\d\xff");
        assert_ne!(bytes_text(b"\xff"), bytes_text(br"\xff"));
        let row = Record {
            seq: 2,
            value: bytes::Bytes::from_static(b"line\nbreak"),
        };
        assert_eq!(row_text(b"k\t1", &row), "k\\t1\t2\tline\\nbreak");
    }

    /// C1 control characters are controls too: U+009B is a terminal's CSI
    /// and U+0085 a line break to some readers, so a key holding them could
    /// restyle the output or forge a row.
    #[test]
    fn text_columns_escape_c1_control_characters() {
        assert_eq!(
            bytes_text("a\u{9b}31mb\u{85}c".as_bytes()),
            r"a\u{9b}31mb\u{85}c"
        );
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp(1_790_000_000_123), "2026-09-21T14:13:20.123Z");
        assert_eq!(utc_timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
