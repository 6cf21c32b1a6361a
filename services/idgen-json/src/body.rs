//! The one reader of a JSON request body, the same in every service: a JSON object read into a
//! typed struct (`#[serde(deny_unknown_fields)]`), each refusal with a code of its own. A service
//! checks what its fields mean (a region name's form, a count's range) and words those refusals
//! itself; what is refused here is refused for its shape alone.
//!
//! | code | the body |
//! |---|---|
//! | `invalid_json` | is empty, or is not JSON |
//! | `invalid_body` | is JSON, not an object |
//! | `unknown_field` | has a field the endpoint does not take |
//! | `missing_field` | lacks a field the endpoint needs |
//! | `invalid_field` | has a field of the wrong kind (a number for a string, …), or one twice |
//!
//! (`body_too_large`, a body past the endpoint's limit, is refused before it is read, by the
//! service.) An optional field is left out, never sent as `null`: [`not_null`] refuses one, and
//! [`present`] hands it on as sent, for a field the service reads itself (a whole number).

use serde::de::{Deserialize, DeserializeOwned, Deserializer, IgnoredAny};
use serde_json::Value;

/// A body past the service's limit for it (refused unread).
pub const BODY_TOO_LARGE: &str = "body_too_large";
pub const INVALID_JSON: &str = "invalid_json";
pub const INVALID_BODY: &str = "invalid_body";
pub const UNKNOWN_FIELD: &str = "unknown_field";
pub const MISSING_FIELD: &str = "missing_field";
pub const INVALID_FIELD: &str = "invalid_field";

/// Why a body is refused: a 400 with this code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub code: &'static str,
    pub message: String,
}

impl BodyError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        BodyError { code, message: message.into() }
    }
}

/// JSON's whitespace (RFC 8259 §2): not ASCII's, which also has form feed and vertical tab.
pub fn is_json_whitespace(byte: &u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether the body opens an object (a derived struct would also read an array, by position).
pub fn is_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !is_json_whitespace(b)) == Some(&b'{')
}

/// The body, a JSON object, as `T`.
pub fn read_object<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    if bytes.iter().all(is_json_whitespace) {
        return Err(BodyError::new(INVALID_JSON, "the request body is empty: send a JSON object"));
    }
    if !is_object(bytes) {
        return Err(match serde_json::from_slice::<IgnoredAny>(bytes) {
            Ok(_) => BodyError::new(INVALID_BODY, "the request body must be a JSON object"),
            Err(error) => not_json(&error),
        });
    }
    let mut reader = serde_json::Deserializer::from_slice(bytes);
    let read = serde_path_to_error::deserialize::<_, T>(&mut reader).map_err(|error| {
        let (path, error) = (error.path().to_string(), error.into_inner());
        if !error.is_data() {
            return not_json(&error);
        }
        let message = error.to_string();
        if message.starts_with("unknown field") {
            BodyError::new(UNKNOWN_FIELD, message)
        } else if message.starts_with("missing field") {
            BodyError::new(MISSING_FIELD, message)
        } else {
            BodyError::new(INVALID_FIELD, format!("{path:?}: {message}"))
        }
    })?;
    reader.end().map_err(|error| not_json(&error))?;
    Ok(read)
}

fn not_json(error: &serde_json::Error) -> BodyError {
    BodyError::new(INVALID_JSON, format!("the request body is not JSON: {error}"))
}

/// An optional field that may be left out but not sent as `null` (`#[serde(default,
/// deserialize_with = "idgen_json::body::not_null")]` on an `Option<T>`): a `null` is refused as
/// a value of the wrong kind, as a document that types the field says.
pub fn not_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(reader: D) -> Result<Option<T>, D::Error> {
    T::deserialize(reader).map(Some)
}

/// A field read as it was sent, `null` included (`Some(Value::Null)`), where a missing field
/// (`#[serde(default)]`) is `None`: for fields whose `null` is refused, not taken as absent.
pub fn present<'de, D: Deserializer<'de>>(reader: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(reader).map(Some)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Region {
        name: String,
        #[serde(default, deserialize_with = "present")]
        at: Option<Value>,
        #[serde(default, deserialize_with = "not_null")]
        now: Option<bool>,
    }

    fn code(body: &str) -> &'static str {
        read_object::<Region>(body.as_bytes()).unwrap_err().code
    }

    #[test]
    fn a_typed_object() {
        let read: Region = read_object(br#" {"name": "eu-west-1"} "#).unwrap();
        assert_eq!(read, Region { name: "eu-west-1".into(), at: None, now: None });
        let read: Region = read_object(br#"{"name": "a", "at": null, "now": true}"#).unwrap();
        assert_eq!((read.at, read.now), (Some(Value::Null), Some(true)), "a null is sent, not absent");
    }

    #[test]
    fn each_refusal_has_its_code() {
        for body in ["", "  \n", "{", "nope", r#"{"name": "a"} x"#, r#"{"name": "a",}"#] {
            assert_eq!(code(body), INVALID_JSON, "{body:?}");
        }
        for body in ["[]", r#"["a"]"#, "7", r#""name""#, "null"] {
            assert_eq!(code(body), INVALID_BODY, "{body:?}");
        }
        assert_eq!(code(r#"{"name": "a", "colour": 1}"#), UNKNOWN_FIELD);
        assert_eq!(code(r#"{"at": 1}"#), MISSING_FIELD);
        assert_eq!(code(r#"{"name": 5}"#), INVALID_FIELD);
        assert_eq!(code(r#"{"name": "a", "now": null}"#), INVALID_FIELD, "an optional field sent as null");
        assert_eq!(code(r#"{"name": "a", "name": "b"}"#), INVALID_FIELD, "a field twice");
    }

    #[test]
    fn the_messages_name_the_field() {
        let refused = read_object::<Region>(br#"{"name": "a", "colour": 1}"#).unwrap_err();
        assert!(refused.message.contains("colour") && refused.message.contains("name"), "{}", refused.message);
        let refused = read_object::<Region>(br#"{"name": 5}"#).unwrap_err();
        assert!(refused.message.starts_with("\"name\": invalid type"), "{}", refused.message);
        let refused = read_object::<Region>(b"{}").unwrap_err();
        assert!(refused.message.contains("`name`"), "{}", refused.message);
    }
}
