//! The request bodies the worker reads, without axum: `POST /v1/ids` takes nothing or `{}`;
//! `POST /v1/ids:batch` and `/v1/uuids` take `{"count": n}`. A typed fast path takes the bodies
//! callers send; anything else goes through the general reading, `idgen_json::body`'s, which
//! words every refusal as every service does (`invalid_json`, `invalid_body`, `unknown_field`,
//! `invalid_field`), and the count's own (`invalid_count`). A refusal is a [`BodyError`], the
//! 400 a caller sees. It depends on serde and `idgen-json` alone, so the `request_body` fuzz
//! target compiles this file as it is.

use idgen_json::body::{BodyError, is_json_whitespace, is_object, present, read_object};
use serde::Deserialize;
use serde_json::Value;

pub const MAX_BATCH: u64 = 1_000;

/// A count outside 1 to [`MAX_BATCH`], or none where one is needed.
pub const INVALID_COUNT: &str = "invalid_count";

/// A `POST /v1/ids` body: nothing, or an object without fields.
pub fn check_single_body(bytes: &[u8]) -> Result<(), BodyError> {
    if accepts_no_fields(bytes) {
        return Ok(());
    }
    read_no_fields(bytes)
}

/// The general reading of a `POST /v1/ids` body, which words its refusals.
pub fn read_no_fields(bytes: &[u8]) -> Result<(), BodyError> {
    if bytes.is_empty() {
        return Ok(());
    }
    read_object::<NoFields>(bytes).map(|NoFields {}| ())
}

/// The count of a `{"count": n}` body: typed when the body is exactly that, else through the
/// general reading (for its refusals); `default` when there is no body.
pub fn count_of(bytes: &[u8], default: Option<u64>) -> Result<u32, BodyError> {
    match is_object(bytes).then(|| serde_json::from_slice::<CountOnly>(bytes)) {
        Some(Ok(CountOnly { count })) if (1..=MAX_BATCH).contains(&count) => Ok(count as u32),
        _ => read_count(bytes, default),
    }
}

/// The general reading of a `{"count": n}` body: no body at all is no count. One of only
/// whitespace is not JSON, and refused like any other text that is not an object.
pub fn read_count(bytes: &[u8], default: Option<u64>) -> Result<u32, BodyError> {
    let count = if bytes.is_empty() { None } else { read_object::<CountBody>(bytes)?.count };
    parse_count(count, default)
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

/// `POST /v1/ids:batch` and `/v1/uuids` as callers send them: `{"count": n}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CountOnly {
    count: u64,
}

/// The same, read for its refusals: `count` as sent (a `null` is a count that is not one).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CountBody {
    #[serde(default, deserialize_with = "present")]
    count: Option<Value>,
}

/// 1 ≤ `count` ≤ 1000 (a whole number: `2.0` is 2); `default` when there is none.
pub fn parse_count(count: Option<Value>, default: Option<u64>) -> Result<u32, BodyError> {
    let count = match (count, default) {
        (Some(value), _) => {
            idgen_json::whole_number(&value).ok().filter(|n| (1..=MAX_BATCH).contains(n)).ok_or_else(|| {
                BodyError::new(INVALID_COUNT, format!("count must be an integer from 1 to {MAX_BATCH}, not {value}"))
            })?
        }
        (None, Some(default)) => default,
        (None, None) => return Err(BodyError::new(INVALID_COUNT, "count is required: {\"count\": 1..1000}")),
    };
    Ok(count as u32)
}
