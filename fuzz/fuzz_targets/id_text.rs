//! An ID in a URL (`GET /v1/ids/{id}/decode`, the CLI's `decode`): decimal digits below 2^63 or a
//! hyphenated UUIDv7. Whatever it accepts reads back from its canonical form; whatever it refuses
//! is refused for the reason the error names.
#![no_main]

use idgen_core::{IdText, IdTextError, parse_id, uuid};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    match parse_id(text) {
        Ok(IdText::Snowflake(id)) => {
            assert!(digits && id >> 63 == 0, "{text:?} -> {id}");
            assert_eq!(text.trim_start_matches('0').parse::<u64>().unwrap_or(0), id, "{text:?}");
            assert_eq!(parse_id(&id.to_string()), Ok(IdText::Snowflake(id)));
        }
        Ok(IdText::Uuid(bytes)) => {
            let canonical = uuid::format(&bytes);
            assert_eq!(canonical, text.to_ascii_lowercase(), "{text:?}");
            assert_eq!(parse_id(&canonical), Ok(IdText::Uuid(bytes)));
        }
        Err(error) => {
            assert!(!error.to_string().is_empty());
            match error {
                IdTextError::OutOfRange { .. } => assert!(digits, "{text:?}"),
                IdTextError::Uuid { .. } => assert!(!digits && text.contains('-'), "{text:?}"),
                IdTextError::Neither { .. } => assert!(!digits && !text.contains('-'), "{text:?}"),
            }
        }
    }
});
