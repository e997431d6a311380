//! Canonical JSON: the one spelling of a JSON value that idemkv stores.
//!
//! - object keys sorted by their UTF-8 bytes, each key once (a key repeated
//!   in the input keeps its last value, as serde_json parses it);
//! - no whitespace outside strings;
//! - strings escaped minimally: `"`, `\` and control characters only (as
//!   `\n`, `\t`, `\r`, `\b`, `\f` or `\u00XX`), everything else as UTF-8, so
//!   `"\u00e9"` and `"é"` are the same value;
//! - numbers as serde_json represents them: integers that fit `i64`/`u64`
//!   print as integers, every other number as the shortest `f64` that
//!   round-trips. So `1.50` and `1.5` are one value, `1e2` becomes `100.0`
//!   and `-0` becomes `-0.0`, while `1` and `1.0` stay different values.
//!
//! Pure: no I/O. Keys are sorted here rather than relying on the order of
//! serde_json's map, which another crate could change by switching on
//! serde_json's `preserve_order` feature.

use serde_json::Value;

/// Parses JSON text and returns its canonical spelling.
///
/// # Errors
/// When `text` is not one valid JSON value.
pub fn canonicalize(text: &[u8]) -> Result<Vec<u8>, serde_json::Error> {
    let value: Value = serde_json::from_slice(text)?;
    Ok(to_canonical(&value))
}

/// The canonical spelling of `value`.
pub fn to_canonical(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    out
}

/// Appends the canonical spelling of `value` to `out`.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(number) => out.extend_from_slice(number.to_string().as_bytes()),
        Value::String(text) => write_string(text, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
    }
}

/// Appends `text` as a JSON string literal with minimal escaping.
pub fn write_string(text: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for ch in text.chars() {
        match ch {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            c if u32::from(c) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes());
            }
            c => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// `text` as a JSON string literal.
pub fn string_literal(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len() + 2);
    write_string(text, &mut out);
    String::from_utf8(out).expect("escaping valid UTF-8 yields valid UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        String::from_utf8(canonicalize(text.as_bytes()).expect("valid json")).expect("utf-8")
    }

    /// Found by the `ndjson_line` fuzz target: without exact float parsing,
    /// `1.3333333333333335e+33` read back as `1.3333333333333337e+33`, so a
    /// canonical value was not canonical a second time.
    #[test]
    fn canonical_numbers_read_back_as_themselves() {
        for text in [
            "1333333333333333333333333333333333",
            "0.1",
            "2.5e-300",
            "-1.7976931348623157e308",
            "123456789.123456789",
        ] {
            let once = canon(text);
            assert_eq!(canon(&once), once, "{text}");
        }
    }

    #[test]
    fn object_keys_are_sorted_and_whitespace_dropped() {
        assert_eq!(
            canon(
                r#" { "qty" : 2, "amount_cents":1998, "a": {"z":1,"b":[1, 2 ,{"y":null,"x":true}]} } "#
            ),
            r#"{"a":{"b":[1,2,{"x":true,"y":null}],"z":1},"amount_cents":1998,"qty":2}"#
        );
    }

    #[test]
    fn equal_strings_spelled_differently_are_one_value() {
        assert_eq!(canon(r#""\u00e9\/\u0001\n""#), "\"é/\\u0001\\n\"");
        assert_eq!(canon(r#""é/\u0001\n""#), canon(r#""\u00e9\/\u0001\n""#));
    }

    #[test]
    fn numbers_keep_serde_json_representation() {
        assert_eq!(canon("1.50"), "1.5");
        assert_eq!(canon("1e2"), "100.0");
        assert_eq!(canon("-0"), "-0.0");
        assert_eq!(canon("18446744073709551615"), "18446744073709551615");
        assert_eq!(canon("-9223372036854775808"), "-9223372036854775808");
        assert_ne!(canon("1"), canon("1.0"));
    }

    #[test]
    fn canonical_text_is_a_fixed_point() {
        let once = canon(r#"{"b":"\t\"x\"","a":[1.25,-3,{"k":"v"}]}"#);
        assert_eq!(canon(&once), once);
    }
}
