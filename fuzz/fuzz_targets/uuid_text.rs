//! UUID text through the `uuid` crate, held to the hand-written parser it replaced (the oracle in
//! idgen-core's tests) on every input: the same bytes or the same error; and format/parse round
//! trips for any 16 bytes with a v7's version and variant.
#![no_main]

use idgen_core::uuid;
use libfuzzer_sys::fuzz_target;

#[path = "../../services/idgen-core/tests/support/legacy_uuid.rs"]
mod legacy;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let parsed = uuid::parse_v7(text);
        assert_eq!(parsed, legacy::parse_v7(text), "{text:?}");
        if let Ok(bytes) = parsed {
            assert_eq!(uuid::format(&bytes), text.to_ascii_lowercase());
        }
    }
    if let Some(bytes) = data.get(..16) {
        let bytes: [u8; 16] = bytes.try_into().expect("16 bytes");
        let text = uuid::format(&bytes);
        assert_eq!(text, legacy::format(&bytes));
        let v7 = bytes[6] >> 4 == 7 && bytes[8] >> 6 == 0b10;
        assert_eq!(uuid::parse_v7(&text).ok(), v7.then_some(bytes), "{text}");
    }
});
