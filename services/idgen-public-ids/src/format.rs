//! Public-ID formats and their text: lowercase Crockford base32, opaque random IDs, UUIDv7, and
//! the stateless encrypted form (a key-version byte + one AES-256 block of the internal ID and
//! eight zero bytes).

use std::collections::BTreeMap;

use aes::Aes256;
use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use zeroize::Zeroizing;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Opaque,
    Uuidv7,
    Encrypted,
}

impl Format {
    pub fn parse(text: &str) -> Option<Format> {
        match text {
            "opaque" => Some(Format::Opaque),
            "uuidv7" => Some(Format::Uuidv7),
            "encrypted" => Some(Format::Encrypted),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Opaque => "opaque",
            Format::Uuidv7 => "uuidv7",
            Format::Encrypted => "encrypted",
        }
    }
}

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

/// Big-endian bytes as lowercase Crockford base32, most significant bits first (zero-padded at
/// the top), so every value of one length has one text length: 16 bytes → 26 characters.
pub fn crockford_encode(bytes: &[u8]) -> String {
    let bits = bytes.len() * 8;
    let chars = bits.div_ceil(5);
    let mut out = String::with_capacity(chars);
    for c in 0..chars {
        // Bit offset of this character's lowest bit, counted from the least significant end.
        let low = (chars - 1 - c) * 5;
        let mut value = 0u8;
        for b in (0..5).rev() {
            let bit = low + b;
            let set = bit < bits && (bytes[bytes.len() - 1 - bit / 8] >> (bit % 8)) & 1 == 1;
            value = (value << 1) | u8::from(set);
        }
        out.push(ALPHABET[value as usize] as char);
    }
    out
}

/// Each byte's value in [`ALPHABET`], either case; `INVALID` for a byte not in it.
const DECODE: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < ALPHABET.len() {
        table[ALPHABET[i] as usize] = i as u8;
        table[ALPHABET[i].to_ascii_uppercase() as usize] = i as u8;
        i += 1;
    }
    table
};
const INVALID: u8 = 0xff;

/// [`crockford_decode`] of 16 bytes (26 characters) without an allocation: what every resolve of
/// a stored public ID does first.
pub fn crockford_decode_16(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 26 {
        return None;
    }
    // 26 characters are 130 bits: the first character carries the top 3 of the 128, so its two
    // padding bits above them must be clear (a value below 8).
    let mut value: u128 = 0;
    for (i, &ch) in text.iter().enumerate() {
        let digit = DECODE[ch as usize];
        if digit == INVALID || (i == 0 && digit >= 8) {
            return None;
        }
        value = (value << 5) | u128::from(digit);
    }
    Some(value.to_be_bytes())
}

/// The inverse of [`crockford_encode`] for exactly `len` bytes; case-insensitive. `None` for any
/// other length, character, or a padding bit that is set.
pub fn crockford_decode(text: &str, len: usize) -> Option<Vec<u8>> {
    if len == 16 {
        return crockford_decode_16(text).map(|bytes| bytes.to_vec());
    }
    let bits = len * 8;
    if text.len() != bits.div_ceil(5) {
        return None;
    }
    let mut out = vec![0u8; len];
    let chars = text.len();
    for (c, ch) in text.bytes().enumerate() {
        let value = match DECODE[ch as usize] {
            INVALID => return None,
            value => value,
        };
        let low = (chars - 1 - c) * 5;
        for b in 0..5 {
            if (value >> b) & 1 == 1 {
                let bit = low + b;
                if bit >= bits {
                    return None;
                }
                out[len - 1 - bit / 8] |= 1 << (bit % 8);
            }
        }
    }
    Some(out)
}

/// Where the random bits of stored public IDs come from: the operating system's CSPRNG
/// ([`OsRandom`]) in the service. A trait so a test can hand the service a source that fails and
/// see it refuse: a public ID drawn from a source that failed would be predictable.
pub trait RandomSource: Send + Sync {
    fn fill(&self, bytes: &mut [u8]) -> Result<(), RandomUnavailable>;
}

/// The random source failed: no public ID is made from it (503 `random_source_unavailable`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the random source failed: {0}")]
pub struct RandomUnavailable(pub String);

/// The operating system's CSPRNG (`getrandom`).
#[derive(Debug, Clone, Copy, Default)]
pub struct OsRandom;

impl RandomSource for OsRandom {
    fn fill(&self, bytes: &mut [u8]) -> Result<(), RandomUnavailable> {
        getrandom::fill(bytes).map_err(|error| RandomUnavailable(error.to_string()))
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct FormatLabel {
    format: &'static str,
}

/// Creates refused because the random source failed, by format (opaque, uuidv7: the formats
/// that draw random bits); each series exists, at 0, from the start.
#[derive(Debug, Default)]
pub struct RandomSourceMetrics {
    failures: prometheus_client::metrics::family::Family<FormatLabel, prometheus_client::metrics::counter::Counter>,
}

impl RandomSourceMetrics {
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        for format in [Format::Opaque, Format::Uuidv7] {
            let _ = self.failures.get_or_create(&FormatLabel { format: format.as_str() });
        }
        registry.register(
            "idgen_public_random_source_failures",
            "Creates refused (503 random_source_unavailable) because the random source failed, by format",
            self.failures.clone(),
        );
    }

    pub fn failed(&self, format: Format) {
        self.failures.get_or_create(&FormatLabel { format: format.as_str() }).inc();
    }
}

/// 128 bits from `random`, as 26 characters.
pub fn new_opaque(random: &dyn RandomSource) -> Result<String, RandomUnavailable> {
    let mut bytes = [0u8; 16];
    random.fill(&mut bytes)?;
    Ok(crockford_encode(&bytes))
}

/// A UUIDv7 for `unix_ms`, its 74 other bits from `random` (none of them from a source that
/// failed).
pub fn new_uuidv7(random: &dyn RandomSource, unix_ms: i64) -> Result<String, RandomUnavailable> {
    let mut seed = [0u8; 12];
    random.fill(&mut seed)?;
    let counter = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes"));
    let tail = u32::from_le_bytes(seed[8..].try_into().expect("4 bytes"));
    Ok(idgen::core::uuid::format(&idgen::core::uuid::new_v7(unix_ms, counter, tail)))
}

/// The 16 bytes of a stored public ID's text in `format` (opaque: 26 Crockford characters;
/// UUIDv7: its hyphenated text, either case); `None` for text of another shape, and for the
/// encrypted format, which is never stored.
pub fn stored_bytes(format: Format, text: &str) -> Option<[u8; 16]> {
    match format {
        Format::Opaque => crockford_decode_16(text),
        Format::Uuidv7 => idgen::core::uuid::parse_v7(text).ok(),
        Format::Encrypted => None,
    }
}

/// The text of a stored public ID from its 16 bytes, as it was handed out: opaque as 26
/// lowercase Crockford characters, UUIDv7 hyphenated in lowercase.
pub fn stored_text(format: Format, bytes: &[u8; 16]) -> String {
    match format {
        Format::Uuidv7 => idgen::core::uuid::format(bytes),
        _ => crockford_encode(bytes),
    }
}

/// The longest TypeID prefix (the specification's 63 characters).
pub const MAX_TYPE_PREFIX: usize = 63;

/// Whether `prefix` is a TypeID prefix: 1 to 63 of `a`–`z` and `_`, neither first nor last an
/// underscore (the specification, v0.3). The empty prefix (no type) is not one.
pub fn is_type_prefix(prefix: &str) -> bool {
    (1..=MAX_TYPE_PREFIX).contains(&prefix.len())
        && prefix.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
        && !prefix.starts_with('_')
        && !prefix.ends_with('_')
}

/// A TypeID's text: `prefix_` and the 26 lowercase Crockford characters of the 16 bytes (the text
/// an opaque public ID already has), or the 26 characters alone for the empty prefix. `None` for
/// a prefix the specification does not allow.
pub fn typeid_text(prefix: &str, bytes: &[u8; 16]) -> Option<String> {
    match prefix {
        "" => Some(crockford_encode(bytes)),
        prefix if is_type_prefix(prefix) => Some(format!("{prefix}_{}", crockford_encode(bytes))),
        _ => None,
    }
}

/// A TypeID's prefix (empty for none) and 16 bytes; `None` for anything the specification
/// refuses: a bad prefix, a separator without one, a suffix that is not 26 lowercase characters
/// of the alphabet, or one above 128 bits (first character past `7`).
pub fn parse_typeid(text: &str) -> Option<(&str, [u8; 16])> {
    let (prefix, suffix) = match text.rsplit_once('_') {
        Some((prefix, suffix)) if is_type_prefix(prefix) => (prefix, suffix),
        Some(_) => return None,
        None => ("", text),
    };
    Some((prefix, typeid_suffix(suffix)?))
}

/// The 16 bytes of a TypeID's suffix: 26 lowercase Crockford characters (an untyped TypeID, the
/// text of an opaque public ID). One pass, branching only once at the end: every resolve of a
/// stored public ID starts here.
pub fn typeid_suffix(text: &str) -> Option<[u8; 16]> {
    let text: &[u8; 26] = text.as_bytes().try_into().ok()?;
    let (mut value, mut digits) = (0u128, 0u8);
    for &ch in text {
        let digit = DECODE_LOWERCASE[ch as usize];
        digits |= digit;
        value = (value << 5) | u128::from(digit & 0x1f);
    }
    // The first character's two padding bits above the 128 must be clear (see
    // `crockford_decode_16`).
    let padded = DECODE_LOWERCASE[text[0] as usize] >= 8;
    (digits & 0x80 == 0 && !padded).then(|| value.to_be_bytes())
}

/// [`DECODE`] for the lowercase alphabet alone, the TypeID suffix's: an uppercase letter is
/// invalid.
const DECODE_LOWERCASE: [u8; 256] = {
    let mut table = [INVALID; 256];
    let mut i = 0;
    while i < ALPHABET.len() {
        table[ALPHABET[i] as usize] = i as u8;
        i += 1;
    }
    table
};

/// Whether `text` is an opaque public ID's own text: an untyped TypeID (26 lowercase characters).
pub fn is_opaque_text(text: &str) -> bool {
    matches!(parse_typeid(text), Some(("", _)))
}

/// Data keys by version, plaintext only in memory (zeroized on drop), never logged.
pub struct Keyring {
    ciphers: BTreeMap<u8, Aes256>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring {{ versions: {:?} }}", self.ciphers.keys().collect::<Vec<_>>())
    }
}

impl Keyring {
    /// From plaintext 32-byte data keys by version. The key bytes are wiped by the caller's
    /// `Zeroizing` wrapper; the ciphers zeroize their schedules on drop.
    pub fn new(keys: Vec<(u8, Zeroizing<Vec<u8>>)>) -> Result<Keyring, String> {
        let mut ciphers = BTreeMap::new();
        for (version, key) in keys {
            if key.len() != 32 {
                return Err(format!("data key version {version} is {} bytes, not 32", key.len()));
            }
            if version == 0 {
                return Err("key version 0 is not used".into());
            }
            ciphers.insert(version, Aes256::new(GenericArray::from_slice(&key)));
        }
        Ok(Keyring { ciphers })
    }

    pub fn current_version(&self) -> Option<u8> {
        self.ciphers.keys().next_back().copied()
    }

    pub fn versions(&self) -> Vec<u8> {
        self.ciphers.keys().copied().collect()
    }

    /// Version byte + AES-256(internal ID ‖ 8 zero bytes), 17 bytes as 28 characters.
    pub fn encrypt(&self, internal_id: u64) -> Option<String> {
        let version = self.current_version()?;
        let mut block = [0u8; 16];
        block[..8].copy_from_slice(&internal_id.to_be_bytes());
        let mut block = GenericArray::from(block);
        self.ciphers[&version].encrypt_block(&mut block);
        let mut bytes = [0u8; 17];
        bytes[0] = version;
        bytes[1..].copy_from_slice(&block);
        Some(crockford_encode(&bytes))
    }

    /// The internal ID, if the text is a well-formed encrypted ID under a known key version whose
    /// eight check bytes decrypt to zero. Every failure is the same `None`.
    pub fn decrypt(&self, text: &str) -> Option<u64> {
        let bytes = crockford_decode(text, 17)?;
        let cipher = self.ciphers.get(&bytes[0])?;
        let mut block = GenericArray::clone_from_slice(&bytes[1..]);
        cipher.decrypt_block(&mut block);
        let check = block[8..].iter().fold(0u8, |acc, b| acc | b);
        (check == 0).then(|| u64::from_be_bytes(block[..8].try_into().expect("8 bytes")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass suffix reader is exactly "no uppercase letter, then the case-insensitive
    /// decoder", on texts near the valid ones: every character, any case, the padding bits, the
    /// lengths around 26.
    #[test]
    fn the_typeid_suffix_is_the_lowercase_crockford_text() {
        let reference =
            |text: &str| (!text.bytes().any(|b| b.is_ascii_uppercase())).then(|| crockford_decode_16(text)).flatten();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut texts = vec![crockford_encode(&[0; 16]), crockford_encode(&[0xff; 16]), "8".repeat(26), "7".repeat(26)];
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let mut text =
                crockford_encode(&u128::from(seed).wrapping_mul(0x2545_f491_4f6c_dd1d).to_be_bytes()).into_bytes();
            let at = (seed >> 40) as usize % 26;
            match (seed >> 48) % 6 {
                0 => text[at] = text[at].to_ascii_uppercase(),
                1 => text[at] = (seed >> 56) as u8,
                2 => text[0] = b"0123456789abcdefghjkmnpqrstvwxyz"[(seed >> 56) as usize % 32],
                3 => text.push(b'0'),
                4 => {
                    text.pop();
                }
                _ => {}
            }
            if let Ok(text) = String::from_utf8(text) {
                texts.push(text);
            }
        }
        let mut valid = 0;
        for text in &texts {
            assert_eq!(typeid_suffix(text), reference(text), "{text:?}");
            valid += usize::from(typeid_suffix(text).is_some());
        }
        assert!(valid > 5_000 && valid < texts.len() - 5_000, "{valid} of {} valid", texts.len());
    }

    #[test]
    fn crockford_round_trips_at_every_length() {
        for len in [1usize, 5, 16, 17] {
            let bytes: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(73).wrapping_add(11)).collect();
            let text = crockford_encode(&bytes);
            assert_eq!(text.len(), (len * 8).div_ceil(5));
            assert_eq!(crockford_decode(&text, len).unwrap(), bytes);
            assert_eq!(crockford_decode(&text.to_uppercase(), len).unwrap(), bytes);
        }
        assert_eq!(crockford_encode(&[0xff; 16]), format!("7{}", "z".repeat(25)));
        assert!(crockford_decode(&format!("8{}", "z".repeat(25)), 16).is_none(), "padding bit set");
        assert!(crockford_decode("u000000000000000000000000", 16).is_none(), "wrong length");
        assert!(crockford_decode(&format!("u{}", "0".repeat(25)), 16).is_none(), "u is not in the alphabet");
        // The 16-byte path (a u128) against the encoder (bit by bit), at every first character.
        for (value, first) in ALPHABET.iter().enumerate() {
            let text = format!("{}{}", *first as char, "3kq".repeat(8) + "m");
            let decoded = crockford_decode_16(&text);
            assert_eq!(decoded.is_some(), value < 8, "{text}: the top two bits are padding");
            if let Some(bytes) = decoded {
                assert_eq!(crockford_encode(&bytes), text);
                assert_eq!(crockford_decode_16(&text.to_uppercase()), Some(bytes));
            }
        }
        assert!(crockford_decode_16(&format!("{}i{}", "0".repeat(12), "0".repeat(13))).is_none(), "i is not in it");
    }

    #[test]
    fn opaque_ids_are_26_lowercase_characters() {
        let a = new_opaque(&OsRandom).unwrap();
        assert_eq!(a.len(), 26);
        assert!(is_opaque_text(&a));
        assert_ne!(a, new_opaque(&OsRandom).unwrap());
    }

    #[test]
    fn encrypted_ids_round_trip_rotate_and_refuse_forgeries() {
        let one = Keyring::new(vec![(1, Zeroizing::new(vec![7u8; 32]))]).unwrap();
        let text = one.encrypt(97_301_141_913_751_557).unwrap();
        assert_eq!(text.len(), 28);
        assert_eq!(one.decrypt(&text), Some(97_301_141_913_751_557));
        // Rotation: version 2 encrypts; version 1 IDs still resolve.
        let both = Keyring::new(vec![(1, Zeroizing::new(vec![7u8; 32])), (2, Zeroizing::new(vec![9u8; 32]))]).unwrap();
        let newer = both.encrypt(97_301_141_913_751_557).unwrap();
        assert_ne!(newer, text);
        assert_eq!(both.decrypt(&text), Some(97_301_141_913_751_557));
        assert_eq!(both.decrypt(&newer), Some(97_301_141_913_751_557));
        // Every single-character change is refused.
        for i in 2..text.len() {
            for replacement in ['0', 'z', 'm'] {
                let mut forged: Vec<char> = text.chars().collect();
                if forged[i] == replacement {
                    continue;
                }
                forged[i] = replacement;
                let forged: String = forged.into_iter().collect();
                assert_eq!(one.decrypt(&forged), None, "{forged}");
            }
        }
        assert_eq!(one.decrypt("not-an-id"), None);
        assert!(format!("{both:?}").contains("[1, 2]") && !format!("{both:?}").contains('7'));
    }
}
