//! Typed public IDs (`[types]`): a deployment names the kinds of things its public IDs stand for
//! (`order`, `user`, … in the TypeID specification's `[a-z_]` form), each with a number and a
//! stored format, and a mapping made with a type shows it as a prefix of its text:
//! `order_01h455vb4pex5vsknk084sn02q` (a TypeID: the prefix, `_`, and the 26 lowercase Crockford
//! characters of the 16 bytes, for a UUIDv7 as for an opaque ID).
//!
//! The row keeps the number, never the name, so a type's number is for ever: renaming a type
//! changes the text of every ID of it (the old text no longer resolves), and a number dropped
//! from the configuration leaves its IDs resolving to nothing. A typed ID resolves only with its
//! own prefix: a wrong, unknown or missing prefix is the same 404 as an unknown ID, so a customer
//! cannot take an `order_` for a `user_`. Untyped mappings keep the texts they were handed out
//! with (26 characters, or a hyphenated UUID). The encrypted format is computed, never stored,
//! and takes no type.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

use crate::format::{self, Format};

/// `[types]`: a type's name is the table's key, `order = { number = 1, format = "opaque" }`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeSection {
    /// Stored on every mapping of the type, in place of its name: 1 to 32767, never reused.
    pub number: u16,
    /// The stored format its public IDs are drawn in: `opaque` (the default) or `uuidv7`.
    #[serde(default = "default_format")]
    pub format: String,
}

fn default_format() -> String {
    Format::Opaque.as_str().into()
}

/// The largest type number (a PostgreSQL `smallint`).
pub const MAX_TYPE_NUMBER: u16 = i16::MAX as u16;

/// One configured type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicType {
    pub number: u16,
    pub format: Format,
}

/// The configured types, by name and by number (validated: names and numbers unique, each
/// format a stored one this service offers).
#[derive(Debug, Clone, Default)]
pub struct Types {
    by_name: HashMap<String, PublicType>,
    names: HashMap<u16, String>,
}

impl Types {
    /// The types of `[types]`, held to the rules above; `offered` is the service's `formats`.
    pub fn from_config(section: &BTreeMap<String, TypeSection>, offered: &[Format]) -> anyhow::Result<Types> {
        let mut types = Types::default();
        for (name, entry) in section {
            anyhow::ensure!(
                format::is_type_prefix(name),
                "[types] {name:?}: a type's name is 1 to {} of a-z and _, neither first nor last an underscore (the \
                 TypeID specification's prefix)",
                format::MAX_TYPE_PREFIX
            );
            anyhow::ensure!(
                (1..=MAX_TYPE_NUMBER).contains(&entry.number),
                "[types] {name}: number must be 1 to {MAX_TYPE_NUMBER}, not {}",
                entry.number
            );
            let format = match Format::parse(&entry.format) {
                Some(format @ (Format::Opaque | Format::Uuidv7)) => format,
                _ => anyhow::bail!(
                    "[types] {name}: format must be opaque or uuidv7 (the stored formats), not {:?}",
                    entry.format
                ),
            };
            anyhow::ensure!(
                offered.contains(&format),
                "[types] {name}: its format {} is not among this service's formats",
                format.as_str()
            );
            if let Some(other) = types.names.insert(entry.number, name.clone()) {
                anyhow::bail!("[types] {other} and {name} both have number {}: a number is one type's", entry.number);
            }
            types.by_name.insert(name.clone(), PublicType { number: entry.number, format });
        }
        Ok(types)
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The type called `name`, if configured.
    pub fn named(&self, name: &str) -> Option<PublicType> {
        self.by_name.get(name).copied()
    }

    /// The name of type `number`, if it is still configured.
    pub fn name_of(&self, number: u16) -> Option<&str> {
        self.names.get(&number).map(String::as_str)
    }

    /// The configured names, sorted (for messages).
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.by_name.keys().map(String::as_str).collect();
        names.sort_unstable();
        names
    }

    /// The text a stored mapping is handed out with: untyped, its stored text as it always was
    /// (26 Crockford characters, or a hyphenated UUID); typed, the TypeID `name_` and the 26
    /// characters. `None` for a type number no longer configured.
    pub fn text(&self, format: Format, type_number: Option<u16>, stored_text: &str) -> Option<String> {
        let Some(number) = type_number else { return Some(stored_text.to_owned()) };
        let bytes = format::stored_bytes(format, stored_text)?;
        format::typeid_text(self.name_of(number)?, &bytes)
    }

    /// One line for `--check-config` and the start-up log.
    pub fn describe(&self) -> String {
        if self.is_empty() {
            return "types: none (public IDs are untyped)".into();
        }
        let mut listed: Vec<(u16, &str, Format)> =
            self.by_name.iter().map(|(name, t)| (t.number, name.as_str(), t.format)).collect();
        listed.sort_unstable_by_key(|&(number, _, _)| number);
        let listed: Vec<String> =
            listed.iter().map(|(number, name, format)| format!("{name}_ ({number}, {})", format.as_str())).collect();
        format!("types: {}", listed.join(", "))
    }
}

/// What a resolve makes of a public ID's text before anything is looked up: its format and its
/// bytes, and for a typed text the type its prefix names. The format is read from the text's
/// shape (and a type's configuration) alone, never from whether it exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// 28 characters: an encrypted ID (decrypted with the text as it is).
    Encrypted,
    /// A stored format's 16 bytes, untyped (26 lowercase characters, or a UUIDv7's text), or
    /// with the type its prefix names.
    Stored { format: Format, bytes: [u8; 16], type_number: Option<u16> },
}

impl Types {
    /// `None` for text of no format's shape, and for a prefix that names no configured type:
    /// both resolve to the one 404.
    pub fn parse(&self, text: &str) -> Option<Parsed> {
        if text.contains('_') {
            let (prefix, bytes) = format::parse_typeid(text)?;
            let public_type = self.named(prefix)?;
            return Some(Parsed::Stored { format: public_type.format, bytes, type_number: Some(public_type.number) });
        }
        match text.len() {
            28 => Some(Parsed::Encrypted),
            // No `_` in it: an untyped TypeID is the suffix alone.
            26 => format::typeid_suffix(text).map(|bytes| Parsed::Stored {
                format: Format::Opaque,
                bytes,
                type_number: None,
            }),
            36 => idgen::core::uuid::parse_v7(text).ok().map(|bytes| Parsed::Stored {
                format: Format::Uuidv7,
                bytes,
                type_number: None,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[types]` as JSON (what the TOML table deserializes from, too).
    fn section(json: &str) -> BTreeMap<String, TypeSection> {
        serde_json::from_str(json).unwrap()
    }

    fn types(json: &str) -> anyhow::Result<Types> {
        Types::from_config(&section(json), &[Format::Opaque, Format::Uuidv7])
    }

    #[test]
    fn names_numbers_and_formats_are_checked() {
        let ok = types(r#"{"order": {"number": 1}, "user": {"number": 2, "format": "uuidv7"}}"#).unwrap();
        assert_eq!(ok.named("order"), Some(PublicType { number: 1, format: Format::Opaque }));
        assert_eq!(ok.name_of(2), Some("user"));
        assert_eq!(ok.describe(), "types: order_ (1, opaque), user_ (2, uuidv7)");
        for (bad, said) in [
            (r#"{"Order": {"number": 1}}"#, "a-z and _"),
            (r#"{"order_": {"number": 1}}"#, "neither first nor last"),
            (r#"{"order": {"number": 0}}"#, "1 to 32767"),
            (r#"{"order": {"number": 40000}}"#, "1 to 32767"),
            (r#"{"order": {"number": 1, "format": "encrypted"}}"#, "opaque or uuidv7"),
            (r#"{"order": {"number": 1}, "user": {"number": 1}}"#, "both have number 1"),
        ] {
            let error = format!("{:#}", types(bad).unwrap_err());
            assert!(error.contains(said), "{bad}: {error}");
        }
        let error = Types::from_config(&section(r#"{"user": {"number": 2, "format": "uuidv7"}}"#), &[Format::Opaque])
            .unwrap_err();
        assert!(format!("{error:#}").contains("not among this service's formats"), "{error:#}");
    }

    #[test]
    fn a_text_is_parsed_once_into_its_format_bytes_and_type() {
        let types = types(r#"{"order": {"number": 1}, "user": {"number": 2, "format": "uuidv7"}}"#).unwrap();
        let bytes = [0x01, 0x89, 0x3d, 0x5a, 0x2c, 0x3a, 0x7b, 0x4e, 0x8a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f, 0x60, 0x71];
        let opaque = format::crockford_encode(&bytes);
        let stored = |format, type_number| Some(Parsed::Stored { format, bytes, type_number });
        assert_eq!(types.parse(&opaque), stored(Format::Opaque, None));
        assert_eq!(types.parse(&format!("order_{opaque}")), stored(Format::Opaque, Some(1)));
        assert_eq!(types.parse(&format!("user_{opaque}")), stored(Format::Uuidv7, Some(2)));
        assert_eq!(types.parse(&idgen::core::uuid::format(&bytes)), stored(Format::Uuidv7, None));
        assert_eq!(types.parse(&"a".repeat(28)), Some(Parsed::Encrypted));
        for nothing in [
            format!("invoice_{opaque}"),
            format!("Order_{opaque}"),
            format!("order_{}", opaque.to_uppercase()),
            format!("_{opaque}"),
            opaque.to_uppercase(),
            format!("order_{}", idgen::core::uuid::format(&bytes)),
            String::new(),
        ] {
            assert_eq!(types.parse(&nothing), None, "{nothing}");
        }
        assert_eq!(
            types.text(Format::Uuidv7, Some(2), &idgen::core::uuid::format(&bytes)),
            Some(format!("user_{opaque}"))
        );
        assert_eq!(types.text(Format::Opaque, None, &opaque), Some(opaque.clone()));
        assert_eq!(types.text(Format::Opaque, Some(9), &opaque), None, "a number no longer configured");
    }
}
