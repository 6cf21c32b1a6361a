//! An ID taken apart by a schedule, from the forms a caller holds: text (decimal or a UUIDv7) or
//! an integer of any size its language has. The parsing and the layouts are `idgen-core`'s.

use std::collections::HashMap;

use idgen::core::text::IdText;
use idgen::core::{DecodedId, OPEN_HORIZON, Schedule, format_unix_ms, uuid};

use crate::Error;

/// An ID as a binding receives it.
#[derive(Debug, Clone, Copy)]
pub enum IdInput<'a> {
    /// The decimal text of a 63-bit ID, or a hyphenated UUIDv7 (either case).
    Text(&'a str),
    /// A Python `int` or a JavaScript `bigint`; one that does not fit an `i128` is passed as
    /// `i128::MAX` (out of range either way).
    Integer(i128),
}

/// What an ID holds. For a UUIDv7 only `id`, `uuid`, `layout` and the time are set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The decimal text of a 63-bit ID, or the UUID's lowercase hyphenated text.
    pub id: String,
    /// The 63-bit ID itself (`None` for a UUID).
    pub value: Option<u64>,
    pub uuid: Option<[u8; 16]>,
    /// `v1`, `v2`, … or `uuidv7`.
    pub layout: String,
    pub created_at_unix_ms: i64,
    /// `created_at_unix_ms` as RFC 3339 with milliseconds (`2026-09-26T12:00:00.000Z`).
    pub created_at: String,
    /// Layouts with a region field only.
    pub region_number: Option<u32>,
    /// The region's name, where the schedule's registry names it.
    pub region: Option<String>,
    pub machine: Option<u32>,
    pub sequence: Option<u32>,
}

/// One layout of a schedule and the time it takes over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutFrom {
    pub layout: String,
    pub region_bits: u8,
    pub machine_bits: u8,
    pub sequence_bits: u8,
    pub from_unix_ms: i64,
}

/// The built-in schedule (v1 from the epoch, v2 from 2028-01-01): a development decoder's, and
/// what the shared test vectors are written against. A production decoder uses the registry's
/// (the schedule of [`crate::Embedded`] or [`crate::Client`]).
pub fn default_schedule() -> Vec<LayoutFrom> {
    built_in()
        .entries()
        .iter()
        .map(|entry| LayoutFrom {
            layout: entry.layout.name().to_owned(),
            region_bits: entry.layout.region_bits(),
            machine_bits: entry.layout.machine_bits(),
            sequence_bits: entry.layout.sequence_bits(),
            from_unix_ms: entry.from.unix_ms(),
        })
        .collect()
}

fn built_in() -> Schedule {
    Schedule::default_with_horizon(OPEN_HORIZON).expect("the built-in schedule is valid")
}

/// Decodes `input` under the built-in schedule, naming regions from `regions`.
pub fn decode(input: IdInput<'_>, regions: &HashMap<u32, String>) -> Result<Decoded, Error> {
    match parse(input)? {
        IdText::Uuid(bytes) => Ok(uuid_decoded(bytes)),
        IdText::Snowflake(id) => {
            let fields = built_in().decode(id).map_err(|e| Error::invalid("out_of_range", e.to_string()))?;
            Ok(snowflake_decoded(&fields, regions))
        }
    }
}

pub(crate) fn parse(input: IdInput<'_>) -> Result<IdText, Error> {
    match input {
        IdInput::Text(text) => idgen::core::parse_id(text).map_err(|e| Error::invalid(e.code(), e.to_string())),
        IdInput::Integer(value) => match u64::try_from(value) {
            Ok(id) if id >> 63 == 0 => Ok(IdText::Snowflake(id)),
            _ => Err(Error::invalid(
                "out_of_range",
                format!("{value} is out of range: an ID is a non-negative 63-bit integer (< 2^63)"),
            )),
        },
    }
}

pub(crate) fn uuid_decoded(bytes: [u8; 16]) -> Decoded {
    let unix_ms = uuid::unix_ms(&bytes);
    Decoded {
        id: uuid::format(&bytes),
        value: None,
        uuid: Some(bytes),
        layout: "uuidv7".into(),
        created_at_unix_ms: unix_ms,
        created_at: format_unix_ms(unix_ms),
        region_number: None,
        region: None,
        machine: None,
        sequence: None,
    }
}

pub(crate) fn snowflake_decoded(fields: &DecodedId, regions: &HashMap<u32, String>) -> Decoded {
    let unix_ms = fields.timestamp.unix_ms();
    Decoded {
        id: fields.id.to_string(),
        value: Some(fields.id),
        uuid: None,
        layout: fields.layout.name().to_owned(),
        created_at_unix_ms: unix_ms,
        created_at: format_unix_ms(unix_ms),
        region_number: fields.region_number,
        region: fields.region_number.and_then(|number| regions.get(&number).cloned()),
        machine: Some(fields.machine),
        sequence: Some(fields.sequence),
    }
}
