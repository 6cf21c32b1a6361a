//! The worker's request bodies (`POST /v1/ids`: nothing or `{}`; `POST /v1/ids:batch` and
//! `/v1/uuids`: `{"count": n}`). Every body is accepted or refused with one of the documented
//! codes (`idgen_json::body`'s for its shape, and `invalid_count`); an accepted count is 1 to
//! 1000 and reads back from `{"count": n}`; the typed fast path answers exactly as the general
//! reading, error message included.
//!
//! `body.rs` depends on serde and `idgen-json` alone, so it is compiled in as it is (not the whole worker).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[allow(dead_code)]
#[path = "../../services/idgen-worker/src/body.rs"]
mod body;

/// The codes of a body refused for its shape (`idgen_json::body`).
const SHAPE: [&str; 4] = ["invalid_json", "invalid_body", "unknown_field", "invalid_field"];

fuzz_target!(|data: &[u8]| {
    match body::check_single_body(data) {
        Ok(()) => {
            let empty_object = matches!(serde_json::from_slice::<Value>(data), Ok(Value::Object(m)) if m.is_empty());
            assert!(data.iter().all(u8::is_ascii_whitespace) || empty_object, "{:?}", String::from_utf8_lossy(data));
        }
        Err(error) => assert!(SHAPE.contains(&error.code) && !error.message.is_empty(), "{error:?}"),
    }
    assert_eq!(body::check_single_body(data), body::read_no_fields(data), "{:?}", String::from_utf8_lossy(data));
    for default in [None, Some(1)] {
        let answer = body::count_of(data, default);
        let general = body::read_count(data, default);
        assert_eq!(answer, general, "{:?}", String::from_utf8_lossy(data));
        match answer {
            Ok(count) => {
                assert!((1..=body::MAX_BATCH).contains(&u64::from(count)));
                assert_eq!(body::count_of(format!("{{\"count\": {count}}}").as_bytes(), None), Ok(count));
            }
            Err(error) => {
                assert!(
                    (SHAPE.contains(&error.code) || error.code == body::INVALID_COUNT) && !error.message.is_empty(),
                    "{error:?}"
                )
            }
        }
    }
});
