//! One NDJSON line -> one [`Delivery`]: the field mapping, and nothing else.
//!
//! Pure: no I/O, no store. Every input, however broken, gives `Ok` or a
//! [`LineError`], never a panic (the `ndjson_line` fuzz target checks this).
//!
//! | field (default name) | accepted                                                   |
//! |----------------------|------------------------------------------------------------|
//! | `event_id`           | a non-empty string, or an integer (its decimal text)       |
//! | `key` (one or more)  | strings or numbers, joined by the key separator (`/`), which no part of a composite key may hold |
//! | `seq`                | a non-negative integer (u64), or a string of decimal digits |
//! | `op`                 | `"put"`, `"delete"` or `"add"`                              |
//! | `value` (put)        | any JSON, stored as canonical JSON (see `canonical`)        |
//! | `delta` (add)        | an integer in i64 range                                     |
//!
//! With `id_from_content` the event id is the xxh3-128 (32 lowercase hex
//! chars) of the canonical JSON of the whole line object minus the top-level
//! `ignore_fields`, so redeliveries that differ only in transport fields
//! (receive time, partition, ...) get the same id.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::Delivery;
use crate::Op;
use crate::cli::canonical;

/// Longest event id accepted, in bytes (the engine's limit for ids and keys).
pub const EVENT_ID_BYTES_MAX: usize = 4096;

/// How the fields of a line map onto a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldMapping {
    /// Field holding the event id (unused with `id_from_content`).
    pub id_field: String,
    /// Fields whose values, joined by `key_separator`, form the key.
    pub key_fields: Vec<String>,
    /// Joins the parts of a composite key.
    pub key_separator: String,
    /// Field holding the key's version.
    pub seq_field: String,
    /// Field holding the operation.
    pub op_field: String,
    /// Field holding a put's value.
    pub value_field: String,
    /// Field holding an add's delta.
    pub delta_field: String,
    /// Derive the event id from a hash of the line's canonical content.
    pub id_from_content: bool,
    /// Top-level fields left out of that hash.
    pub ignore_fields: Vec<String>,
}

impl Default for FieldMapping {
    fn default() -> Self {
        Self {
            id_field: "event_id".to_owned(),
            key_fields: vec!["key".to_owned()],
            key_separator: "/".to_owned(),
            seq_field: "seq".to_owned(),
            op_field: "op".to_owned(),
            value_field: "value".to_owned(),
            delta_field: "delta".to_owned(),
            id_from_content: false,
            ignore_fields: Vec::new(),
        }
    }
}

/// Why a line is not a valid delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// The event id, when the line got far enough to have one.
    pub event_id: Option<String>,
    /// What is wrong, naming the field.
    pub reason: String,
}

impl LineError {
    fn new(event_id: Option<&str>, reason: impl Into<String>) -> Self {
        Self {
            event_id: event_id.map(str::to_owned),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)?;
        if let Some(id) = &self.event_id {
            write!(
                f,
                " (event_id {})",
                canonical::string_literal(&clip(id, 100))
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for LineError {}

/// Whether a line holds nothing but whitespace (such lines are skipped, not deliveries).
pub fn is_blank(line: &[u8]) -> bool {
    line.iter().all(u8::is_ascii_whitespace)
}

/// Maps one NDJSON line (a trailing `\n` or `\r\n` and a leading UTF-8 byte
/// order mark are ignored) to a delivery.
///
/// # Errors
/// A [`LineError`] naming the problem (and the event id, once known) when the
/// line is not JSON, not an object, or a field is missing or mistyped.
pub fn parse_line(line: &[u8], mapping: &FieldMapping) -> Result<Delivery, LineError> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // A UTF-8 byte order mark can only start a file, but is harmless to allow anywhere.
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let value: Value = serde_json::from_slice(line).map_err(|e| {
        let message = e.to_string();
        let position = format!(" at line {} column {}", e.line(), e.column());
        let message = message.strip_suffix(&position).unwrap_or(&message);
        LineError::new(
            None,
            format!("not valid JSON at column {}: {message}", e.column()),
        )
    })?;
    // serde_json keeps the last of a repeated name; another reader may keep
    // the first, and see another event in the same line. The parsed value
    // holds fewer names than the line spells out exactly when one repeats:
    // counting them is cheap, and only then is the name looked for.
    if names_held(&value) != names_written(line) {
        let name = repeated_name(line).unwrap_or_default();
        return Err(LineError::new(
            None,
            format!(
                "the name {} appears twice in one object",
                canonical::string_literal(&clip(&name, 100))
            ),
        ));
    }
    let Value::Object(object) = value else {
        return Err(LineError::new(None, "not a JSON object"));
    };

    let event_id = if mapping.id_from_content {
        content_id(&object, &mapping.ignore_fields)
    } else {
        let raw = object
            .get(&mapping.id_field)
            .ok_or_else(|| LineError::new(None, missing(&mapping.id_field)))?;
        let id = id_text(raw).ok_or_else(|| {
            LineError::new(
                None,
                format!(
                    "field {} must be a string or an integer",
                    quoted(&mapping.id_field)
                ),
            )
        })?;
        if id.is_empty() {
            return Err(LineError::new(
                None,
                format!("field {} is empty", quoted(&mapping.id_field)),
            ));
        }
        if id.len() > EVENT_ID_BYTES_MAX {
            return Err(LineError::new(
                Some(&id),
                format!(
                    "field {} has {} bytes, more than {EVENT_ID_BYTES_MAX}",
                    quoted(&mapping.id_field),
                    id.len()
                ),
            ));
        }
        id
    };
    let id = Some(event_id.as_str());

    let key = key_of(&object, mapping, id)?;
    let seq = seq_of(&object, &mapping.seq_field, id)?;
    let op_name = match object.get(&mapping.op_field) {
        None => return Err(LineError::new(id, missing(&mapping.op_field))),
        Some(Value::String(name)) => name.as_str(),
        Some(_) => {
            return Err(LineError::new(
                id,
                format!("field {} must be a string", quoted(&mapping.op_field)),
            ));
        }
    };
    let op = match op_name {
        "put" => {
            let value = object
                .get(&mapping.value_field)
                .ok_or_else(|| LineError::new(id, missing(&mapping.value_field)))?;
            Op::Put(Bytes::from(canonical::to_canonical(value)))
        }
        "delete" => Op::Delete,
        "add" => {
            let delta = object
                .get(&mapping.delta_field)
                .ok_or_else(|| LineError::new(id, missing(&mapping.delta_field)))?;
            let delta = delta.as_i64().ok_or_else(|| {
                LineError::new(
                    id,
                    format!(
                        "field {} must be an integer in i64 range",
                        quoted(&mapping.delta_field)
                    ),
                )
            })?;
            Op::Add(delta)
        }
        other => {
            return Err(LineError::new(
                id,
                format!(
                    "field {} is {}; expected \"put\", \"delete\" or \"add\"",
                    quoted(&mapping.op_field),
                    canonical::string_literal(&clip(other, 40))
                ),
            ));
        }
    };
    Ok(Delivery {
        event_id: Bytes::from(event_id),
        key: Bytes::from(key),
        seq,
        op,
    })
}

/// How many members the objects in `value` hold, nested ones included.
fn names_held(value: &Value) -> usize {
    match value {
        Value::Object(object) => object.len() + object.values().map(names_held).sum::<usize>(),
        Value::Array(items) => items.iter().map(names_held).sum(),
        _ => 0,
    }
}

/// How many member names `json`, which is valid JSON, spells out: the
/// strings followed by a colon.
fn names_written(json: &[u8]) -> usize {
    let mut names = 0;
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        if byte == b'"' {
            let Some((end, is_name)) = string_at(json, at) else {
                break;
            };
            names += usize::from(is_name);
            at = end;
        }
        at += 1;
    }
    names
}

/// The first name that appears twice in one object of `json`, which is
/// valid JSON; names are compared unescaped (`"a"` and `"\u0061"` are one).
fn repeated_name(json: &[u8]) -> Option<String> {
    // The names seen in each object open around the current byte; `None`
    // for an array. A name without escapes is compared as it is written.
    let mut open: Vec<Option<std::collections::HashSet<Cow<'_, [u8]>>>> = Vec::new();
    let mut at = 0;
    while let Some(&byte) = json.get(at) {
        match byte {
            b'{' => open.push(Some(std::collections::HashSet::new())),
            b'[' => open.push(None),
            b'}' | b']' => {
                open.pop();
            }
            b'"' => {
                let (end, is_name) = string_at(json, at)?;
                if is_name && let Some(Some(names)) = open.last_mut() {
                    let raw = json.get(at + 1..end)?;
                    let name = if raw.contains(&b'\\') {
                        let text: String = serde_json::from_slice(json.get(at..=end)?).ok()?;
                        Cow::Owned(text.into_bytes())
                    } else {
                        Cow::Borrowed(raw)
                    };
                    if let Some(name) = names.replace(name) {
                        return Some(String::from_utf8_lossy(&name).into_owned());
                    }
                }
                at = end;
            }
            _ => {}
        }
        at += 1;
    }
    None
}

/// Where the string whose opening quote is at `start` closes, and whether
/// it is a member name (a colon follows it).
fn string_at(json: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut end = start + 1;
    loop {
        match json.get(end)? {
            b'\\' => end += 2,
            b'"' => break,
            _ => end += 1,
        }
    }
    let next = json
        .get(end + 1..)
        .and_then(|rest| rest.iter().find(|b| !b.is_ascii_whitespace()));
    Some((end, next == Some(&b':')))
}

/// The content-derived event id: xxh3-128 of the canonical object minus `ignore`.
fn content_id(object: &Map<String, Value>, ignore: &[String]) -> String {
    let kept: Map<String, Value> = object
        .iter()
        .filter(|(name, _)| !ignore.iter().any(|ignored| ignored == *name))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let bytes = canonical::to_canonical(&Value::Object(kept));
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&bytes))
}

fn key_of(
    object: &Map<String, Value>,
    mapping: &FieldMapping,
    id: Option<&str>,
) -> Result<String, LineError> {
    let mut key = String::new();
    for (i, field) in mapping.key_fields.iter().enumerate() {
        let raw = object
            .get(field)
            .ok_or_else(|| LineError::new(id, missing(field)))?;
        let part = scalar_text(raw).ok_or_else(|| {
            LineError::new(
                id,
                format!("field {} must be a string or a number", quoted(field)),
            )
        })?;
        if i > 0 {
            key.push_str(&mapping.key_separator);
        }
        // Joined, a part holding the separator could not be told apart:
        // ("a/b", "c") and ("a", "b/c") would be one key. Nor may it hold
        // any character of a longer one: with `::`, ("p:", "q") and ("p",
        // ":q") both join into `p:::q`.
        if mapping.key_fields.len() > 1 && part.contains(|c| mapping.key_separator.contains(c)) {
            return Err(LineError::new(
                id,
                format!(
                    "field {} holds a character of the key separator {}, which would make the joined key ambiguous",
                    quoted(field),
                    canonical::string_literal(&mapping.key_separator)
                ),
            ));
        }
        key.push_str(&part);
    }
    if key.is_empty() {
        return Err(LineError::new(id, "the key is empty"));
    }
    Ok(key)
}

fn seq_of(object: &Map<String, Value>, field: &str, id: Option<&str>) -> Result<u64, LineError> {
    let mistyped = || {
        LineError::new(
            id,
            format!(
                "field {} must be a non-negative integer (u64) or a string of decimal digits",
                quoted(field)
            ),
        )
    };
    match object.get(field) {
        None => Err(LineError::new(id, missing(field))),
        Some(Value::Number(n)) => n.as_u64().ok_or_else(mistyped),
        Some(Value::String(s)) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().map_err(|_| mistyped())
        }
        Some(_) => Err(mistyped()),
    }
}

/// `text` cut to at most `max_chars` characters, marked with `...` when cut,
/// so that messages and quarantine reasons stay short whatever the input.
pub fn clip(text: &str, max_chars: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max_chars) {
        None => Cow::Borrowed(text),
        Some((end, _)) => Cow::Owned(format!("{}...", text.get(..end).unwrap_or(text))),
    }
}

/// An event id's text: a string's, or an integer's digits as written.
/// Other numbers are refused: `1.5` and `15e-1` are one number, and would
/// be one id only by the accident of how they print.
fn id_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => {
            let text = n.as_str();
            let digits = text.strip_prefix('-').unwrap_or(text);
            (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
                .then(|| text.to_owned())
        }
        _ => None,
    }
}

/// A string's text or a number's JSON text; `None` for other JSON types.
fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(canonical::number_text(n)),
        _ => None,
    }
}

fn quoted(field: &str) -> String {
    canonical::string_literal(field)
}

fn missing(field: &str) -> String {
    format!("missing field {}", quoted(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Delivery, LineError> {
        parse_line(line.as_bytes(), &FieldMapping::default())
    }

    #[test]
    fn spec_lines_map_to_deliveries() {
        let put = parse(r#"{"event_id":"e201","key":"O1001/1","seq":201,"op":"put","value":{"qty":2,"amount_cents":1998}}"#)
            .expect("valid put");
        assert_eq!(&put.event_id[..], b"e201");
        assert_eq!(&put.key[..], b"O1001/1");
        assert_eq!(put.seq, 201);
        assert_eq!(
            put.op,
            Op::Put(Bytes::from_static(br#"{"amount_cents":1998,"qty":2}"#))
        );
        let delete =
            parse("{\"event_id\":\"e204\",\"key\":\"O1005/2\",\"seq\":204,\"op\":\"delete\"}\r\n")
                .expect("valid delete");
        assert_eq!(delete.op, Op::Delete);
        let bom = parse("\u{feff}{\"event_id\":\"e1\",\"key\":\"k\",\"seq\":1,\"op\":\"delete\"}")
            .expect("a byte order mark is ignored");
        assert_eq!(bom.op, Op::Delete);
        let add = parse(
            r#"{"event_id":"e300","key":"visits/2026-09-21","seq":300,"op":"add","delta":-5}"#,
        )
        .expect("valid add");
        assert_eq!(add.op, Op::Add(-5));
    }

    #[test]
    fn a_name_repeated_in_one_object_is_refused_anywhere_in_the_line() {
        for (line, name) in [
            (
                r#"{"event_id":"a","key":"k","seq":1,"seq":9,"op":"delete"}"#,
                "seq",
            ),
            (
                r#"{"event_id":"a","key":"k","seq":1,"op":"put","value":{"x":1,"x":2}}"#,
                "x",
            ),
            (
                r#"{"event_id":"a","key":"k","seq":1,"op":"put","value":[{"y":1},{"y":1,"\u0079":2}]}"#,
                "y",
            ),
        ] {
            let err = parse(line).expect_err("a repeated name");
            assert!(
                err.to_string().contains(&format!("{name:?} appears twice")),
                "{err}"
            );
        }
        // One name in several objects, and names inside strings, are fine.
        let d = parse(
            r#"{"event_id":"a","key":"k","seq":1,"op":"put","value":{"seq":{"seq":[{"seq":"\"seq\":{"}]},"s":"}{:"}}"#,
        )
        .expect("valid");
        assert_eq!(d.seq, 1);
    }

    #[test]
    fn composite_keys_are_joined() {
        let mapping = FieldMapping {
            key_fields: vec!["order_id".to_owned(), "line_no".to_owned()],
            seq_field: "lsn".to_owned(),
            ..FieldMapping::default()
        };
        let d = parse_line(
            br#"{"event_id":7,"order_id":"O1001","line_no":1,"lsn":"42","op":"delete"}"#,
            &mapping,
        )
        .expect("valid");
        assert_eq!(&d.key[..], b"O1001/1");
        assert_eq!(&d.event_id[..], b"7");
        assert_eq!(d.seq, 42);
        // Parts that hold the separator would make ("a/b", "c") and
        // ("a", "b/c") one key: such a line is not valid input.
        for line in [
            br#"{"event_id":1,"order_id":"a/b","line_no":"c","lsn":1,"op":"delete"}"#.as_slice(),
            br#"{"event_id":2,"order_id":"a","line_no":"b/c","lsn":1,"op":"delete"}"#,
        ] {
            let err = parse_line(line, &mapping).expect_err("ambiguous");
            assert!(err.to_string().contains("key separator"), "{err}");
        }
        // Nor any character of a longer separator.
        let colons = FieldMapping {
            key_separator: "::".to_owned(),
            ..mapping.clone()
        };
        for line in [
            br#"{"event_id":3,"order_id":"p:","line_no":"q","lsn":1,"op":"delete"}"#.as_slice(),
            br#"{"event_id":4,"order_id":"p","line_no":":q","lsn":1,"op":"delete"}"#,
        ] {
            let err = parse_line(line, &colons).expect_err("ambiguous");
            assert!(err.to_string().contains("key separator"), "{err}");
        }
        // A single key field may hold it: nothing is joined.
        let d = parse(r#"{"event_id":"e","key":"a/b","seq":1,"op":"delete"}"#).expect("valid");
        assert_eq!(&d.key[..], b"a/b");
    }

    #[test]
    fn content_ids_ignore_transport_fields() {
        let mapping = FieldMapping {
            id_from_content: true,
            ignore_fields: vec!["received_at".to_owned()],
            ..FieldMapping::default()
        };
        let a = parse_line(
            br#"{"key":"k","seq":1,"op":"put","value":{"b":1,"a":2},"received_at":"10:00"}"#,
            &mapping,
        )
        .expect("valid");
        let b = parse_line(
            br#"{"received_at":"10:05", "op":"put","seq":1,"key":"k","value":{"a":2,"b":1}}"#,
            &mapping,
        )
        .expect("valid");
        let c = parse_line(
            br#"{"key":"k","seq":2,"op":"put","value":{"a":2,"b":1}}"#,
            &mapping,
        )
        .expect("valid");
        assert_eq!(a.event_id, b.event_id);
        assert_ne!(a.event_id, c.event_id);
        assert_eq!(a.event_id.len(), 32);
    }

    #[test]
    fn bad_lines_name_the_field_and_event_id() {
        let err = parse(r#"{"event_id":"e9","key":"k","op":"put","value":1}"#).expect_err("no seq");
        assert_eq!(err.event_id.as_deref(), Some("e9"));
        assert_eq!(err.to_string(), r#"missing field "seq" (event_id "e9")"#);
        let err = parse(r#"{"event_id":"e9","key":"k","seq":-1,"op":"put","value":1}"#)
            .expect_err("negative seq");
        assert!(err.reason.contains("\"seq\""), "{err}");
        let err =
            parse(r#"{"event_id":"e9","key":"k","seq":1,"op":"upsert"}"#).expect_err("bad op");
        assert!(err.reason.contains("upsert"), "{err}");
        let err = parse(r#"{"event_id":"e9","key":"k","seq":1,"op":"add","delta":1.5}"#)
            .expect_err("bad delta");
        assert!(err.reason.contains("\"delta\""), "{err}");
        let err =
            parse(r#"{"event_id":"","key":"k","seq":1,"op":"delete"}"#).expect_err("empty id");
        assert_eq!(err.event_id, None);
        let err =
            parse(r#"{"event_id":"e1","key":"","seq":1,"op":"delete"}"#).expect_err("empty key");
        assert!(err.reason.contains("empty"), "{err}");
        for id in ["1.5", "15e-1", "1e2", "true"] {
            let line = format!(r#"{{"event_id":{id},"key":"k","seq":1,"op":"delete"}}"#);
            let err = parse(&line).expect_err("not an integer id");
            assert!(err.reason.contains("a string or an integer"), "{id}: {err}");
        }
        for (id, text) in [
            ("-7", "-7"),
            ("100000000000000000000", "100000000000000000000"),
            ("123456789012345678901234", "123456789012345678901234"),
        ] {
            let line = format!(r#"{{"event_id":{id},"key":"k","seq":1,"op":"delete"}}"#);
            assert_eq!(
                &parse(&line).expect("an integer id").event_id[..],
                text.as_bytes()
            );
        }
    }

    /// The limit is inclusive: an id of exactly `EVENT_ID_BYTES_MAX` bytes is
    /// an event (the engine takes it), one byte more is not.
    #[test]
    fn an_event_id_of_exactly_the_limit_is_accepted() {
        let line = |id: &str| format!(r#"{{"event_id":"{id}","key":"k","seq":1,"op":"delete"}}"#);
        let at_limit = "x".repeat(EVENT_ID_BYTES_MAX);
        let d = parse(&line(&at_limit)).expect("an id at the limit");
        assert_eq!(d.event_id.len(), EVENT_ID_BYTES_MAX);
        let err = parse(&line(&format!("{at_limit}x"))).expect_err("one byte over");
        assert!(err.reason.contains("more than 4096"), "{err}");
    }

    /// A seq given as a string is decimal digits only: `u64::from_str` also
    /// takes a leading `+`, which would make `"+5"` and `"5"` one version.
    #[test]
    fn a_seq_string_with_a_sign_is_refused() {
        for seq in [r#""+5""#, r#""-5""#, r#"" 5""#, r#""""#] {
            let line = format!(r#"{{"event_id":"e","key":"k","seq":{seq},"op":"delete"}}"#);
            let err = parse(&line).expect_err(seq);
            assert!(err.reason.contains("\"seq\""), "{seq}: {err}");
        }
        let d = parse(r#"{"event_id":"e","key":"k","seq":"05","op":"delete"}"#).expect("digits");
        assert_eq!(d.seq, 5);
    }

    #[test]
    fn messages_stay_short_whatever_the_input() {
        let long = "x".repeat(10_000);
        let line = format!(r#"{{"event_id":"{long}","key":"k","seq":1,"op":"delete"}}"#);
        let err = parse(&line).expect_err("id too long");
        assert!(err.to_string().len() < 300, "{err}");
        let line = format!(r#"{{"event_id":"e{}","key":"k","seq":1}}"#, &long[..4000]);
        let err = parse(&line).expect_err("no op");
        assert!(err.to_string().len() < 300, "{err}");
        let line = format!(r#"{{"event_id":"e","key":"k","seq":1,"op":"{long}"}}"#);
        let err = parse(&line).expect_err("bad op");
        assert!(err.to_string().len() < 300, "{err}");
        assert_eq!(clip("héllo", 2), "hé...");
        assert_eq!(clip("hé", 2), "hé");
    }

    #[test]
    fn junk_is_an_error_not_a_panic() {
        for line in [
            &b""[..],
            b"{",
            b"[1,2]",
            b"\xff\xfe",
            b"null",
            b"{\"event_id\":{}}",
            b"12",
        ] {
            assert!(parse_line(line, &FieldMapping::default()).is_err());
        }
        let err = parse(r#"{"event_id": "e1", "key": }"#).expect_err("bad json");
        assert!(err.reason.starts_with("not valid JSON at column"), "{err}");
        assert!(!err.reason.contains("line 1"), "{err}");
    }
}
