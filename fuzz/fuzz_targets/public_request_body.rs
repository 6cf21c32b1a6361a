//! The public-ID service's request bodies (`POST /v1/public-ids {"internal_id", "format"?, "type"?}`
//! and `:batch {"internal_ids", "format"?, "type"?}`): a body is a JSON object of those fields or
//! refused with one of `idgen_json::body`'s codes; an internal ID is
//! accepted only as digits below 2^63 or a whole JSON number up to 2^53 − 1, and reads back from
//! its decimal text; a larger JSON number is refused with the advice to send a string.
//!
//! `body.rs` and the `format.rs` it names use nothing else of the service: compiled in as they are.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[allow(dead_code)]
#[path = "../../services/idgen-public-ids/src/format.rs"]
mod format;

#[allow(dead_code)]
#[path = "../../services/idgen-public-ids/src/body.rs"]
mod body;

fn check_id(value: &Value) {
    match body::parse_internal_id(value) {
        Ok(id) => {
            assert!(id >> 63 == 0, "{value}");
            assert_eq!(body::parse_internal_id(&Value::String(id.to_string())), Ok(id));
            match value {
                Value::String(text) => assert_eq!(text.trim_start_matches('0').parse::<u64>().unwrap_or(0), id),
                // A whole number, however written (5, 5.0, 5e0), within the exact range.
                Value::Number(n) => assert!(n.as_f64() == Some(id as f64) && id <= body::MAX_SAFE_JSON_INTEGER, "{value}"),
                other => panic!("accepted {other} as an internal ID"),
            }
        }
        Err(refused) => {
            assert!(!refused.message.is_empty());
            assert!([body::INVALID_INTERNAL_ID, body::UNSAFE_INTEGER].contains(&refused.code), "{refused:?}");
            if value.as_u64().is_some_and(|n| n > body::MAX_SAFE_JSON_INTEGER) {
                assert!(refused.code == body::UNSAFE_INTEGER && refused.message.contains("decimal strings"), "{value}");
            }
        }
    }
}

/// The codes of a body refused for its shape (`idgen_json::body`).
const SHAPE: [&str; 5] = ["invalid_json", "invalid_body", "unknown_field", "missing_field", "invalid_field"];

fn check_format(format: Option<&str>) {
    if let Ok(format) = body::parse_format(format) {
        assert_eq!(body::parse_format(Some(format.as_str())), Ok(format));
    }
}

fuzz_target!(|data: &[u8]| {
    let object = matches!(serde_json::from_slice::<Value>(data), Ok(Value::Object(_)));
    match idgen_json::body::read_object::<body::CreateBody>(data) {
        Ok(create) => {
            assert!(object);
            check_id(&create.internal_id);
            check_format(create.format.as_deref());
        }
        Err(refused) => assert!(SHAPE.contains(&refused.code) && !refused.message.is_empty(), "{refused:?}"),
    }
    match idgen_json::body::read_object::<body::BatchBody>(data) {
        Ok(batch) => {
            assert!(object);
            batch.internal_ids.iter().for_each(check_id);
            check_format(batch.format.as_deref());
        }
        Err(refused) => assert!(SHAPE.contains(&refused.code) && !refused.message.is_empty(), "{refused:?}"),
    }
    if let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(data) {
        for value in object.values() {
            check_id(value);
            if let Value::Array(values) = value {
                values.iter().for_each(check_id);
            }
        }
    }
});
