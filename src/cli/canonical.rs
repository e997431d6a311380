//! Canonical JSON: the one spelling of a JSON value that idemkv stores.
//!
//! - object keys sorted by their UTF-8 bytes, each key once (a key repeated
//!   in the input keeps its last value, as serde_json parses it);
//! - no whitespace outside strings;
//! - strings escaped minimally: `"`, `\` and control characters only (as
//!   `\n`, `\t`, `\r`, `\b`, `\f` or `\u00XX`), everything else as UTF-8, so
//!   `"\u00e9"` and `"é"` are the same value;
//! - numbers: integers that fit `i64`/`u64` print as integers; every other
//!   number as the shortest `f64` that round-trips, when that `f64` is the
//!   number exactly; and a number no `f64` holds exactly as written (more
//!   digits than an `f64` keeps, or beyond its range) as its exact decimal
//!   value, normalized, never rounded. So `1.50` and `1.5` are one value,
//!   `1e2` becomes `100.0` and `-0` becomes `-0.0`, `1` and `1.0` stay
//!   different values, and `123456789012345678901234` and
//!   `123456789012345678901235` stay two values (rounded to the same `f64`,
//!   they were stored alike, and a changed value counted as unchanged).
//!
//! Pure: no I/O. Keys are sorted here rather than relying on the order of
//! serde_json's map, which another crate could change by switching on
//! serde_json's `preserve_order` feature.

use serde_json::{Number, Value};

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
        Value::Number(number) => out.extend_from_slice(number_text(number).as_bytes()),
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

/// A number's canonical text (see the module's doc). serde_json keeps the
/// number as it was written (its `arbitrary_precision` feature).
pub fn number_text(number: &Number) -> String {
    let text = number.as_str();
    if !text.contains(['.', 'e', 'E']) {
        // "-0" is no negative integer: serde_json reads it as the float -0.0.
        if let Ok(n) = text.parse::<u64>() {
            return n.to_string();
        }
        if let Some(n) = text.parse::<i64>().ok().filter(|&n| n < 0) {
            return n.to_string();
        }
    }
    let Some(exact) = Decimal::parse(text) else {
        // An exponent, or a printed one, beyond i64: no normalization,
        // serde_json's text of the number.
        return text.to_owned();
    };
    let shortest = text
        .parse::<f64>()
        .ok()
        .and_then(Number::from_f64)
        .map(|f| f.as_str().to_owned());
    match shortest {
        Some(shortest) if Decimal::parse(&shortest).as_ref() == Some(&exact) => shortest,
        _ => exact.to_string(),
    }
}

/// A number's exact value: `digits` × 10^`exponent`, `digits` without
/// leading or trailing zeros (empty for zero, whose exponent is 0).
#[derive(Debug, PartialEq, Eq)]
struct Decimal {
    negative: bool,
    digits: String,
    exponent: i64,
}

impl Decimal {
    /// The value of JSON number text; `None` if its exponent is out of range.
    fn parse(text: &str) -> Option<Self> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.split_once(['e', 'E']) {
            Some((mantissa, exponent)) => (mantissa, exponent.parse::<i64>().ok()?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let mut digits = format!("{whole}{fraction}");
        let mut exponent = exponent.checked_sub(i64::try_from(fraction.len()).ok()?)?;
        while digits.ends_with('0') {
            digits.pop();
            exponent = exponent.checked_add(1)?;
        }
        let digits = digits.trim_start_matches('0').to_owned();
        if digits.is_empty() {
            exponent = 0;
        }
        // The form `d.ddde±x` prints `digits + exponent - 1`: a number whose
        // printed exponent would not fit an i64 is not normalized (it keeps
        // serde_json's text), where saturating made `1e9223372036854775807`
        // and `…806` one.
        i64::try_from(digits.len().max(1))
            .ok()?
            .checked_add(exponent)?
            .checked_sub(1)?;
        Some(Self {
            negative,
            digits,
            exponent,
        })
    }
}

/// One spelling per value: an integer up to 40 digits, a plain decimal
/// down to 6 zeros after the point, otherwise `d.ddde±x`.
impl std::fmt::Display for Decimal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let digits = if self.digits.is_empty() {
            "0"
        } else {
            &self.digits
        };
        if self.negative {
            f.write_str("-")?;
        }
        let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
        // Where the decimal point goes, counted from the first digit.
        let point = len.saturating_add(self.exponent);
        let zeros = |n: i64| "0".repeat(usize::try_from(n).unwrap_or(0));
        match usize::try_from(point) {
            _ if self.exponent >= 0 && point <= 40 => write!(f, "{digits}{}", zeros(self.exponent)),
            Ok(at) if self.exponent < 0 && at > 0 => {
                let (whole, fraction) = digits.split_at(at);
                write!(f, "{whole}.{fraction}")
            }
            _ if self.exponent < 0 && point > -6 => write!(f, "0.{}{digits}", zeros(-point)),
            _ => {
                let (first, rest) = digits.split_at(1);
                let dot = if rest.is_empty() { "" } else { "." };
                write!(f, "{first}{dot}{rest}e{}", point.saturating_sub(1))
            }
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

    /// Exponents at the end of the i64 range stay apart: saturating once
    /// printed `1e9223372036854775807` as `…806`, so a put of the other
    /// counted as unchanged.
    #[test]
    fn numbers_whose_exponents_reach_the_end_of_the_range_stay_apart() {
        let pairs = [
            ("1e9223372036854775807", "1e9223372036854775806"),
            ("12e9223372036854775807", "12e9223372036854775806"),
        ];
        for (a, b) in pairs {
            assert_ne!(canon(a), canon(b), "{a} and {b}");
            assert_eq!(canon(&canon(a)), canon(a), "{a} reads back as itself");
            assert_eq!(canon(&canon(b)), canon(b), "{b} reads back as itself");
        }
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
            "-0",
            "1E+2",
            "1e400",
            "-1e-400",
            "123456789012345678901234",
            "12345678901234567890123.0",
            "0.000000123456789012345678901",
            "0.12345678901234567890123",
            "9007199254740993",
            "1234567890123456789012345678901234567890123",
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
    fn numbers_no_f64_holds_are_kept_exactly() {
        assert_eq!(
            canon("123456789012345678901234"),
            "123456789012345678901234"
        );
        assert_ne!(
            canon("123456789012345678901234"),
            canon("123456789012345678901235")
        );
        assert_eq!(canon("18446744073709551616"), "18446744073709551616");
        assert_eq!(canon("1.23456789012345678901"), "1.23456789012345678901");
        assert_eq!(
            canon("0.000000123456789012345678901"),
            "1.23456789012345678901e-7"
        );
        assert_eq!(
            canon("-1234567890123456789012345e-30"),
            "-0.000001234567890123456789012345"
        );
        assert_eq!(
            canon("0.12345678901234567890123"),
            "0.12345678901234567890123"
        );
        assert_eq!(canon("1e400"), "1e400");
        assert_eq!(canon("1.0E400"), "1e400");
        assert_eq!(canon("-25e-400"), "-2.5e-399");
        // Where an f64 holds the number exactly, its shortest spelling.
        assert_eq!(canon("1e23"), canon("100000000000000000000000.0"));
        assert_eq!(canon("0.10"), "0.1");
    }

    /// The module's rule: an integer no f64 holds prints plainly up to 40
    /// digits, and only from 41 digits on as `d.ddde±x`.
    #[test]
    fn integers_of_up_to_forty_digits_print_plainly() {
        let forty = "1234567890123456789012345678901234567891";
        assert_eq!(forty.len(), 40);
        assert_eq!(canon(forty), forty);
        assert_eq!(canon(&format!("{forty}.0")), forty);
        assert_eq!(
            canon(&format!("{forty}3")),
            "1.2345678901234567890123456789012345678913e40"
        );
    }

    /// Minimal escaping uses the two-character escapes JSON has for
    /// backspace and form feed, as for `\n`, `\r` and `\t`.
    #[test]
    fn backspace_and_form_feed_use_their_short_escapes() {
        assert_eq!(canon(r#""a\u0008b\u000cc""#), r#""a\bb\fc""#);
        assert_eq!(string_literal("\u{8}\u{c}\u{7}"), r#""\b\f\u0007""#);
    }

    #[test]
    fn canonical_text_is_a_fixed_point() {
        let once = canon(r#"{"b":"\t\"x\"","a":[1.25,-3,{"k":"v"}]}"#);
        assert_eq!(canon(&once), once);
    }
}
