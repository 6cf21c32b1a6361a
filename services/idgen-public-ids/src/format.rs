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

pub use idgen::core::typeid::{
    MAX_TYPE_PREFIX, crockford_decode, crockford_decode_16, crockford_encode, is_opaque_text, is_type_prefix,
    parse_typeid, typeid_suffix, typeid_text,
};

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
