//! How rows, reports and times are printed: JSON through `canonical` (so
//! object keys come out sorted), text as aligned columns. Pure: no I/O.

use serde_json::{Map, Value, json};

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

/// Caller bytes as text: UTF-8 when it is, `\xNN`-escaped otherwise.
pub fn bytes_text(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => bytes.escape_ascii().to_string(),
    }
}

/// A stored value as JSON: itself when it is JSON text (puts from NDJSON,
/// counters), otherwise a JSON string of its text.
pub fn value_json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(bytes_text(bytes)))
}

/// `{"key":..,"seq":..,"value":..}` on one line.
pub fn row_json(key: &[u8], record: &Record) -> String {
    let row = json!({
        "key": bytes_text(key),
        "seq": record.seq,
        "value": value_json(&record.value),
    });
    json_line(&row)
}

/// `key<TAB>seq<TAB>value`, the value as canonical JSON.
pub fn row_text(key: &[u8], record: &Record) -> String {
    format!(
        "{}\t{}\t{}",
        bytes_text(key),
        record.seq,
        json_line(&value_json(&record.value))
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
        let raw = Record {
            seq: 1,
            value: bytes::Bytes::from_static(b"not json\xff"),
        };
        assert_eq!(
            row_json(b"k", &raw),
            r#"{"key":"k","seq":1,"value":"not json\\xff"}"#
        );
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_timestamp(1_790_000_000_123), "2026-09-21T14:13:20.123Z");
        assert_eq!(utc_timestamp(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
