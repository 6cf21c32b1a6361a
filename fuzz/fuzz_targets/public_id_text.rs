//! Public-ID text as customers send it back (SPEC §7): Crockford base32 of opaque IDs (16 bytes)
//! and encrypted ones (17: a key version and one AES-256 block), forged ones included, and typed
//! ones (TypeIDs: a prefix, `_`, 26 characters). Whatever decodes encodes back to the same text;
//! an encrypted ID resolves to what it was made from, in either case; one character changed
//! resolves to nothing. The resolve's one-pass reader of an untyped TypeID agrees with the
//! general decoder.
//!
//! `format.rs` uses nothing else of the service, so it is compiled in as it is: the fuzz build
//! does not build the database and KMS stacks the service links.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use zeroize::Zeroizing;

#[allow(dead_code)]
#[path = "../../services/idgen-public-ids/src/format.rs"]
mod format;

use format::{
    Keyring, crockford_decode, crockford_encode, is_opaque_text, is_type_prefix, parse_typeid, typeid_suffix, typeid_text,
};

fn keyring() -> &'static Keyring {
    static KEYRING: OnceLock<Keyring> = OnceLock::new();
    KEYRING.get_or_init(|| {
        Keyring::new(vec![(1, Zeroizing::new(vec![7; 32])), (2, Zeroizing::new(vec![9; 32]))]).expect("two keys")
    })
}

fuzz_target!(|data: &[u8]| {
    let keyring = keyring();
    if let Ok(text) = std::str::from_utf8(data) {
        for len in [16, 17] {
            if let Some(bytes) = crockford_decode(text, len) {
                assert_eq!(crockford_encode(&bytes), text.to_ascii_lowercase(), "{text:?}");
            }
        }
        if is_opaque_text(text) {
            assert!(text.len() == 26 && text.bytes().all(|b| !b.is_ascii_uppercase()), "{text:?}");
        }
        // The resolve's one-pass reader of an untyped TypeID is the lowercase text, decoded.
        let lowercase = !text.bytes().any(|b| b.is_ascii_uppercase());
        let expected = if lowercase { crockford_decode(text, 16) } else { None };
        assert_eq!(typeid_suffix(text).map(|bytes| bytes.to_vec()), expected, "{text:?}");
        if let Some((prefix, bytes)) = parse_typeid(text) {
            assert!(prefix.is_empty() || is_type_prefix(prefix), "{text:?}");
            assert_eq!(typeid_text(prefix, &bytes).as_deref(), Some(text), "{text:?}");
        }
        if let Some(id) = keyring.decrypt(text) {
            let version = crockford_decode(text, 17).expect("it decrypted")[0];
            assert!(version == 1 || version == 2, "{text:?}");
            if version == keyring.current_version().expect("two keys") {
                assert_eq!(keyring.encrypt(id).expect("a key"), text.to_ascii_lowercase());
            }
        }
    }
    if let (Some(id), Some(&at), with) = (data.get(..8), data.get(8), data.get(9).copied().unwrap_or(b'z')) {
        let id = u64::from_be_bytes(id.try_into().expect("8 bytes"));
        let text = keyring.encrypt(id).expect("a key");
        assert_eq!(keyring.decrypt(&text), Some(id));
        assert_eq!(keyring.decrypt(&text.to_ascii_uppercase()), Some(id));
        let mut forged = text.clone().into_bytes();
        let position = usize::from(at) % forged.len();
        forged[position] = with;
        if let Ok(forged) = String::from_utf8(forged)
            && crockford_decode(&forged, 17) != crockford_decode(&text, 17)
        {
            assert_eq!(keyring.decrypt(&forged), None, "{forged:?}, forged from {text:?}");
        }
    }
});
