//! The request bodies the public-ID service reads, without axum: a JSON object, its internal IDs
//! (decimal strings, or whole JSON numbers up to 2^53 − 1, read by `idgen-json`) and its format. A refusal is a
//! [`BodyError`]: a 400 `invalid_request` with its message. The `public_request_body` fuzz target
//! compiles this file as it is.

use idgen_json::NotWhole;
use serde_json::{Map, Value};

use crate::format::Format;

/// Why a body is refused: the message of a 400 `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError(pub String);

/// The body as a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, BodyError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(BodyError("request body must be a JSON object".into())),
    }
}

/// The largest integer every JSON reader holds exactly (JavaScript's `Number.MAX_SAFE_INTEGER`).
pub const MAX_SAFE_JSON_INTEGER: u64 = idgen_json::MAX_SAFE_INTEGER;

/// An internal ID: a non-negative 63-bit integer, as a decimal string, or as a JSON integer up to
/// 2^53 − 1 (a whole number however it is written: `5`, `5.0`, `5e0`). A larger JSON number was most likely rounded by a JavaScript caller before it was
/// sent (it would then name another ID), so it is refused with the advice to send a string.
pub fn parse_internal_id(value: &Value) -> Result<u64, BodyError> {
    let bad = || BodyError(format!("internal_id must be a non-negative 63-bit integer, not {value}"));
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
    BodyError(format!(
        "internal_id {value} is a JSON number above 2^53 - 1, which JavaScript and many JSON readers round \
         (it may already name another ID); send IDs as decimal strings (\"internal_id\": \"<digits>\")"
    ))
}

pub fn parse_format(value: Option<&Value>) -> Result<Format, BodyError> {
    match value {
        None => Ok(Format::Opaque),
        Some(Value::String(text)) => Format::parse(text)
            .ok_or_else(|| BodyError(format!("format must be opaque, uuidv7 or encrypted, not {text:?}"))),
        Some(other) => Err(BodyError(format!("format must be a string, not {other}"))),
    }
}

pub fn only_fields(body: &Map<String, Value>, allowed: &[&str]) -> Result<(), BodyError> {
    match body.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(field) => Err(BodyError(format!("unknown field {field:?}; accepted: {allowed:?}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(value: Value) -> String {
        parse_internal_id(&value).unwrap_err().0
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
            let message = message(value.clone());
            assert!(message.contains("above 2^53 - 1") && message.contains("decimal strings"), "{value}: {message}");
        }
        for value in [json!(-1), json!(1.5), json!("1e3"), json!(""), json!("9223372036854775808"), json!(null)] {
            let message = message(value.clone());
            assert!(message.contains("non-negative 63-bit integer"), "{value}: {message}");
        }
    }
}
