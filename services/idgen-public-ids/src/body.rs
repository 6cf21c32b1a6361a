//! The request bodies the public-ID service reads, without axum: typed, read by
//! `idgen_json::body` (whose refusals for a body's shape are every service's), and what their
//! fields mean: an internal ID (a decimal string, or a whole JSON number up to 2^53 − 1, read by
//! `idgen-json`) and a format. A refusal is a [`BodyError`], a 400 with its code. The
//! `public_request_body` fuzz target compiles this file as it is.

use idgen_json::NotWhole;
use idgen_json::body::{BodyError, not_null};
use serde::Deserialize;
use serde_json::Value;

use crate::format::Format;

/// An internal ID that is not a non-negative 63-bit integer.
pub const INVALID_INTERNAL_ID: &str = "invalid_internal_id";
/// An internal ID sent as a JSON number above 2^53 − 1, which a JavaScript caller has already
/// rounded: send a string.
pub const UNSAFE_INTEGER: &str = "unsafe_integer";
/// A format that is none of opaque, uuidv7 and encrypted.
pub const UNKNOWN_FORMAT: &str = "unknown_format";

/// `POST /v1/public-ids`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateBody {
    /// Read by [`parse_internal_id`].
    pub internal_id: Value,
    #[serde(default, deserialize_with = "not_null")]
    pub format: Option<String>,
    #[serde(default, rename = "type", deserialize_with = "not_null")]
    pub public_type: Option<String>,
}

/// `POST /v1/public-ids:batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// Each read by [`parse_internal_id`].
    pub internal_ids: Vec<Value>,
    #[serde(default, deserialize_with = "not_null")]
    pub format: Option<String>,
    #[serde(default, rename = "type", deserialize_with = "not_null")]
    pub public_type: Option<String>,
}

/// The largest integer every JSON reader holds exactly (JavaScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_JSON_INTEGER: u64 = idgen_json::MAX_SAFE_INTEGER;

/// An internal ID: a non-negative 63-bit integer, as a decimal string, or as a JSON integer up to
/// 2^53 − 1 (a whole number however it is written: `5`, `5.0`, `5e0`). A larger JSON number was
/// most likely rounded by a JavaScript caller before it was sent (it would then name another
/// ID), so it is refused with the advice to send a string.
pub fn parse_internal_id(value: &Value) -> Result<u64, BodyError> {
    let bad = || {
        BodyError::new(INVALID_INTERNAL_ID, format!("internal_id must be a non-negative 63-bit integer, not {value}"))
    };
    let id = match value {
        Value::String(text) if !text.is_empty() && text.len() <= 19 && text.bytes().all(|b| b.is_ascii_digit()) => {
            text.parse::<u64>().map_err(|_| bad())?
        }
        // A whole number however written (5, 5.0, 5e0), as JSON Schema reads it; above 2^53 - 1,
        // an integer or not (1e19, 9007199254740993.0), it may already have been rounded.
        Value::Number(_) => match idgen_json::whole_number(value) {
            Ok(id) if id <= MAX_SAFE_JSON_INTEGER => id,
            Ok(_) | Err(NotWhole::Inexact) => return Err(unsafe_number(value)),
            Err(NotWhole::NotANumber | NotWhole::Negative | NotWhole::Fraction) => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    if id >> 63 != 0 {
        return Err(bad());
    }
    Ok(id)
}

fn unsafe_number(value: &Value) -> BodyError {
    BodyError::new(
        UNSAFE_INTEGER,
        format!(
            "internal_id {value} is a JSON number above 2^53 - 1, which JavaScript and many JSON readers round \
             (it may already name another ID); send IDs as decimal strings (\"internal_id\": \"<digits>\")"
        ),
    )
}

/// A format by name; opaque when none is given.
pub fn parse_format(text: Option<&str>) -> Result<Format, BodyError> {
    match text {
        None => Ok(Format::Opaque),
        Some(text) => Format::parse(text).ok_or_else(|| {
            BodyError::new(UNKNOWN_FORMAT, format!("format must be opaque, uuidv7 or encrypted, not {text:?}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(value: Value) -> BodyError {
        parse_internal_id(&value).unwrap_err()
    }

    #[test]
    fn internal_ids_as_strings_or_exact_small_integers() {
        assert_eq!(parse_internal_id(&json!("9223372036854775807")).unwrap(), i64::MAX as u64);
        assert_eq!(parse_internal_id(&json!(555)).unwrap(), 555);
        assert_eq!(parse_internal_id(&json!(MAX_SAFE_JSON_INTEGER)).unwrap(), MAX_SAFE_JSON_INTEGER);
        assert_eq!(parse_internal_id(&serde_json::from_str("5.0").unwrap()).unwrap(), 5);
        assert_eq!(parse_internal_id(&serde_json::from_str("5e3").unwrap()).unwrap(), 5000);
        // Read exactly (serde_json's `float_roundtrip`): the default reading puts this one ULP off,
        // at 1840754094809076.75, and would refuse a whole number as a fraction.
        let exact: Value = serde_json::from_str("1840754094809077.0").unwrap();
        assert_eq!(parse_internal_id(&exact).unwrap(), 1_840_754_094_809_077);
    }

    #[test]
    fn json_numbers_above_2_to_the_53_are_refused_with_advice() {
        // What a JavaScript caller sends for 2^53 + 1 after rounding, and larger exact integers.
        for value in [json!(MAX_SAFE_JSON_INTEGER + 1), json!(i64::MAX as u64), json!(u64::MAX), json!(1e19)] {
            let refused = refused(value.clone());
            assert_eq!(refused.code, UNSAFE_INTEGER, "{value}");
            assert!(
                refused.message.contains("above 2^53 - 1") && refused.message.contains("decimal strings"),
                "{value}: {}",
                refused.message
            );
        }
        for value in [json!(-1), json!(1.5), json!("1e3"), json!(""), json!("9223372036854775808"), json!(null)] {
            let refused = refused(value.clone());
            assert_eq!(refused.code, INVALID_INTERNAL_ID, "{value}");
            assert!(refused.message.contains("non-negative 63-bit integer"), "{value}: {}", refused.message);
        }
    }

    #[test]
    fn bodies_are_typed_and_refused_by_shape() {
        let read: CreateBody = idgen_json::body::read_object(br#"{"internal_id": "5", "type": "order"}"#).unwrap();
        assert_eq!((read.internal_id, read.format, read.public_type.as_deref()), (json!("5"), None, Some("order")));
        let code = |body: &str| idgen_json::body::read_object::<BatchBody>(body.as_bytes()).unwrap_err().code;
        assert_eq!(code(r#"{"format": "opaque"}"#), "missing_field");
        assert_eq!(code(r#"{"internal_ids": ["1"], "colour": "red"}"#), "unknown_field");
        assert_eq!(code(r#"{"internal_ids": "1"}"#), "invalid_field");
        assert_eq!(code(r#"{"internal_ids": ["1"], "format": null}"#), "invalid_field");
        assert_eq!(parse_format(Some("hex")).unwrap_err().code, UNKNOWN_FORMAT);
        assert_eq!(parse_format(None), Ok(Format::Opaque));
    }
}
