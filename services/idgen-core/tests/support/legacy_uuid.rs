//! The UUID text code as it was before it went through the `uuid` crate: the oracle that holds
//! the new code to the same answer on every input (the property test and the `uuid_text` fuzz
//! target).

use idgen_core::uuid::UuidError;

pub fn format(bytes: &[u8; 16]) -> String {
    let mut out = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push(char::from_digit(u32::from(byte >> 4), 16).expect("nibble"));
        out.push(char::from_digit(u32::from(byte & 0xf), 16).expect("nibble"));
    }
    out
}

pub fn parse_v7(text: &str) -> Result<[u8; 16], UuidError> {
    let raw = text.as_bytes();
    if raw.len() != 36 {
        return Err(UuidError::Malformed);
    }
    let mut bytes = [0u8; 16];
    let mut nibbles = 0;
    for (i, &c) in raw.iter().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return Err(UuidError::Malformed);
            }
            continue;
        }
        let value = (c as char).to_digit(16).ok_or(UuidError::Malformed)? as u8;
        bytes[nibbles / 2] |= if nibbles % 2 == 0 { value << 4 } else { value };
        nibbles += 1;
    }
    let version = bytes[6] >> 4;
    if version != 7 {
        return Err(UuidError::NotVersion7(version));
    }
    if bytes[8] >> 6 != 0b10 {
        return Err(UuidError::WrongVariant);
    }
    Ok(bytes)
}
