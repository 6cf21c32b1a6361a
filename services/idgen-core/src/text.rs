//! An ID as a caller writes it in a URL or a body: the decimal text of a 63-bit ID, or a UUIDv7.
//! The one parser every service uses for it (and a fuzz target holds to its properties).

use thiserror::Error;

use crate::uuid::{self, UuidError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdText {
    Snowflake(u64),
    Uuid([u8; 16]),
}

/// Why a text is not an ID; the message is the one callers see.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdTextError {
    #[error("{text} is out of range: an ID is a non-negative 63-bit integer (< 2^63)")]
    OutOfRange { text: String },
    #[error("{text:?}: {error}")]
    Uuid { text: String, error: UuidError },
    #[error("{text:?} is neither a non-negative 63-bit integer nor a UUIDv7")]
    Neither { text: String },
}

impl IdTextError {
    /// A short, stable word for the error, the same in every language (the shared test vectors,
    /// `sdk/vectors`, name it).
    pub fn code(&self) -> &'static str {
        match self {
            IdTextError::OutOfRange { .. } => "out_of_range",
            IdTextError::Uuid { error: UuidError::Malformed, .. } => "malformed_uuid",
            IdTextError::Uuid { error: UuidError::NotVersion7(_), .. } => "not_uuidv7",
            IdTextError::Uuid { error: UuidError::WrongVariant, .. } => "wrong_uuid_variant",
            IdTextError::Neither { .. } => "not_an_id",
        }
    }
}

/// Decimal digits (leading zeros allowed) below 2^63, or a hyphenated UUIDv7 in either case.
pub fn parse_id(text: &str) -> Result<IdText, IdTextError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let too_big = || IdTextError::OutOfRange { text: text.to_owned() };
        let value: u64 = text.parse().map_err(|_| too_big())?;
        if value >> 63 != 0 {
            return Err(too_big());
        }
        return Ok(IdText::Snowflake(value));
    }
    if text.contains('-') {
        return uuid::parse_v7(text)
            .map(IdText::Uuid)
            .map_err(|error| IdTextError::Uuid { text: text.to_owned(), error });
    }
    Err(IdTextError::Neither { text: text.to_owned() })
}
