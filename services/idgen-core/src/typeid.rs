//! Public-ID text that any holder of one can check without a key or a call: lowercase Crockford
//! base32 (an opaque public ID is 26 characters of it) and TypeID (`prefix_` and those 26
//! characters, the specification's v0.3). Here, not in the public-ID service, so the service,
//! the SDKs' bindings and the shared test vectors (`sdk/vectors/typeid`) read one parser.

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
}
