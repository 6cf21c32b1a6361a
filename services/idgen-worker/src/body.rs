//! The request bodies the worker reads, without axum: `POST /v1/ids` takes nothing or `{}`;
//! `POST /v1/ids:batch` and `/v1/uuids` take `{"count": n}`. A refusal is a [`BodyError`], whose
//! code and message are the 400 a caller sees (`ApiError` takes it as it is). It depends on
//! serde and `idgen-json` alone, so the `request_body` fuzz target compiles this file as it is.

use serde::Deserialize;
use serde_json::{Map, Value};

pub const MAX_BATCH: u64 = 1_000;

/// JSON's whitespace (RFC 8259 §2): not ASCII's, which also has form feed and vertical tab.
fn is_json_whitespace(byte: &u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Why a body is refused: a 400 with this code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub code: &'static str,
    pub message: String,
}

impl BodyError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        BodyError { code, message: message.into() }
    }
}

/// A `POST /v1/ids` body: nothing, or an object without fields.
pub fn check_single_body(bytes: &[u8]) -> Result<(), BodyError> {
    if !accepts_no_fields(bytes) {
        let field = parse_object(bytes)?.and_then(|body| body.keys().next().cloned());
        if let Some(field) = field {
            return Err(BodyError::new("invalid_body", format!("unknown field {field:?}; send {{}} or an empty body")));
        }
    }
    Ok(())
}

/// The count of a `{"count": n}` body: typed when the body is exactly that, else through the
/// general reading (for its error messages); `default` when there is no body.
pub fn count_of(bytes: &[u8], default: Option<u64>) -> Result<u32, BodyError> {
    match is_object(bytes).then(|| serde_json::from_slice::<CountOnly>(bytes)) {
        Some(Ok(CountOnly { count })) if (1..=MAX_BATCH).contains(&count) => Ok(count as u32),
        _ => parse_count(parse_object(bytes)?, default),
    }
}

/// The body as a JSON object; an empty body (no bytes at all) is `None`. One of only whitespace
/// is not JSON, and refused like any other text that is not an object. This general reading
/// is the one that words the errors; the typed fast paths below fall back to it on anything they
/// do not accept, so every error code and message comes from here.
pub fn parse_object(bytes: &[u8]) -> Result<Option<Map<String, Value>>, BodyError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(Some(map)),
        Ok(_) | Err(_) => Err(BodyError::new("invalid_body", "request body must be a JSON object")),
    }
}

/// Whether the body is a JSON object at the top (a derived struct would also take an array).
fn is_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !is_json_whitespace(b)) == Some(&b'{')
}

/// Whether a `POST /v1/ids` body is one of those it takes: nothing, or an object without fields.
pub fn accepts_no_fields(bytes: &[u8]) -> bool {
    let start = bytes.iter().position(|b| !is_json_whitespace(b)).unwrap_or(bytes.len());
    let end = bytes.iter().rposition(|b| !is_json_whitespace(b)).map_or(start, |last| last + 1);
    let trimmed = &bytes[start..end];
    bytes.is_empty() || trimmed == b"{}" || (is_object(bytes) && serde_json::from_slice::<NoFields>(bytes).is_ok())
}

/// `POST /v1/ids`: `{}` (any whitespace) or nothing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoFields {}

/// `POST /v1/ids:batch` and `/v1/uuids`: `{"count": n}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CountOnly {
    count: u64,
}

/// `{"count": n}` with 1 ≤ n ≤ 1000 (a whole number: `2.0` is 2); nothing else allowed in the object.
pub fn parse_count(body: Option<Map<String, Value>>, default: Option<u64>) -> Result<u32, BodyError> {
    let mut body = body.unwrap_or_default();
    let count = body.remove("count");
    if let Some(field) = body.keys().next() {
        return Err(BodyError::new("invalid_body", format!("unknown field {field:?}; only \"count\" is accepted")));
    }
    let count = match (count, default) {
        (Some(value), _) => {
            idgen_json::whole_number(&value).ok().filter(|n| (1..=MAX_BATCH).contains(n)).ok_or_else(|| {
                BodyError::new("invalid_count", format!("count must be an integer from 1 to {MAX_BATCH}, not {value}"))
            })?
        }
        (None, Some(default)) => default,
        (None, None) => return Err(BodyError::new("invalid_count", "count is required: {\"count\": 1..1000}")),
    };
    Ok(count as u32)
}
