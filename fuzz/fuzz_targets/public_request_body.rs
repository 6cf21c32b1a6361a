//! The public-ID service's request bodies (`POST /v1/public-ids {"internal_id", "format"?}` and
//! `:batch {"internal_ids", "format"?}`): a body is a JSON object or refused; an internal ID is
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
        Err(body::BodyError(message)) => {
            assert!(!message.is_empty());
            if value.as_u64().is_some_and(|n| n > body::MAX_SAFE_JSON_INTEGER) {
                assert!(message.contains("decimal strings"), "{value}: {message}");
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(object) = body::parse_object(data) else {
        assert!(!matches!(serde_json::from_slice::<Value>(data), Ok(Value::Object(_))));
        return;
    };
    let single = body::only_fields(&object, &["internal_id", "format"]);
    let batch = body::only_fields(&object, &["internal_ids", "format"]);
    assert_eq!(single.is_ok(), object.keys().all(|k| k == "internal_id" || k == "format"));
    assert_eq!(batch.is_ok(), object.keys().all(|k| k == "internal_ids" || k == "format"));
    if let Ok(format) = body::parse_format(object.get("format")) {
        assert_eq!(body::parse_format(Some(&Value::String(format.as_str().into()))), Ok(format));
    }
    for value in object.values() {
        check_id(value);
        if let Value::Array(values) = value {
            values.iter().for_each(check_id);
        }
    }
});
