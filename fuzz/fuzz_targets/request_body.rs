//! The worker's request bodies (`POST /v1/ids`: nothing or `{}`; `POST /v1/ids:batch` and
//! `/v1/uuids`: `{"count": n}`). Every body is accepted or refused with one of the documented
//! codes; an accepted count is 1 to 1000 and reads back from `{"count": n}`; the typed fast path
//! answers exactly as the general reading, error message included.
//!
//! `body.rs` depends on serde alone, so it is compiled in as it is (not the whole worker).
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;

#[allow(dead_code)]
#[path = "../../services/idgen-worker/src/body.rs"]
mod body;

fuzz_target!(|data: &[u8]| {
    match body::check_single_body(data) {
        Ok(()) => {
            let empty_object = matches!(serde_json::from_slice::<Value>(data), Ok(Value::Object(m)) if m.is_empty());
            assert!(data.iter().all(u8::is_ascii_whitespace) || empty_object, "{:?}", String::from_utf8_lossy(data));
        }
        Err(error) => assert!(error.code == "invalid_body" && !error.message.is_empty(), "{error:?}"),
    }
    for default in [None, Some(1)] {
        let answer = body::count_of(data, default);
        let general = body::parse_object(data).and_then(|object| body::parse_count(object, default));
        assert_eq!(answer, general, "{:?}", String::from_utf8_lossy(data));
        match answer {
            Ok(count) => {
                assert!((1..=body::MAX_BATCH).contains(&u64::from(count)));
                assert_eq!(body::count_of(format!("{{\"count\": {count}}}").as_bytes(), None), Ok(count));
            }
            Err(error) => {
                assert!(
                    ["invalid_body", "invalid_count"].contains(&error.code) && !error.message.is_empty(),
                    "{error:?}"
                )
            }
        }
    }
});
