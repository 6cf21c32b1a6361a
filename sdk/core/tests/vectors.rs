//! Every shared test vector in `sdk/vectors` through this crate, the face the bindings wrap: the
//! Python and Node runners check the same files through their languages. A case added to a file
//! runs here with no code.

use std::collections::HashMap;
use std::path::PathBuf;

use idgen_sdk::typeid::{parse_typeid, typeid_text};
use idgen_sdk::{Decoded, Error, IdInput, decode, default_schedule};
use serde_json::{Value, json};

fn vectors(file: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../vectors").join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn regions(file: &Value) -> HashMap<u32, String> {
    file["regions"].as_object().unwrap().iter().map(|(k, v)| (k.parse().unwrap(), v.as_str().unwrap().into())).collect()
}

/// A decode answer as the vectors write it: only the fields it has.
fn as_json(decoded: &Decoded) -> Value {
    let mut out = json!({
        "id": decoded.id,
        "layout": decoded.layout,
        "created_at": decoded.created_at,
        "created_at_unix_ms": decoded.created_at_unix_ms,
    });
    for (key, value) in
        [("region_number", decoded.region_number), ("machine", decoded.machine), ("sequence", decoded.sequence)]
    {
        if let Some(value) = value {
            out[key] = json!(value);
        }
    }
    if let Some(region) = &decoded.region {
        out["region"] = json!(region);
    }
    out
}

fn expected(case: &Value) -> Value {
    let mut fields = case.as_object().unwrap().clone();
    for key in ["name", "input", "integer"] {
        fields.remove(key);
    }
    Value::Object(fields)
}

fn check(name: &str, case: &Value, answer: Result<Decoded, Error>) {
    match (case.get("error").and_then(Value::as_str), answer) {
        (Some(code), Err(Error::Invalid { code: got, message })) => {
            assert_eq!(got, code, "{name}: {message}");
            assert!(!message.is_empty(), "{name}");
        }
        (Some(code), Ok(decoded)) => panic!("{name}: decoded as {decoded:?}, expected the error {code}"),
        (None, Ok(decoded)) => assert_eq!(as_json(&decoded), expected(case), "{name}"),
        (_, Err(error)) => panic!("{name}: {error:?}"),
    }
}

#[test]
fn the_schedule_is_the_one_the_vectors_are_written_against() {
    let file = vectors("decode.json");
    let ours: Vec<Value> = default_schedule()
        .iter()
        .map(|entry| {
            json!({
                "layout": entry.layout,
                "region_bits": entry.region_bits,
                "machine_bits": entry.machine_bits,
                "sequence_bits": entry.sequence_bits,
                "from": idgen::core::format_unix_ms(entry.from_unix_ms),
                "from_unix_ms": entry.from_unix_ms,
            })
        })
        .collect();
    assert_eq!(Value::Array(ours), file["schedule"]);
}

#[test]
fn ids_as_text_decode_or_are_refused_as_the_vectors_say() {
    let file = vectors("decode.json");
    let names = regions(&file);
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        check(name, case, decode(IdInput::Text(case["input"].as_str().unwrap()), &names));
    }
}

#[test]
fn ids_as_integers_decode_or_are_refused_as_the_vectors_say() {
    let names = regions(&vectors("decode.json"));
    let file = vectors("integers.json");
    for case in file["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let value: i128 = case["integer"].as_str().unwrap().parse().unwrap();
        check(name, case, decode(IdInput::Integer(value), &names));
    }
}

#[test]
fn the_typeid_specifications_vectors_hold() {
    let valid = vectors("typeid/valid.json");
    for case in valid.as_array().unwrap() {
        let (text, prefix) = (case["typeid"].as_str().unwrap(), case["prefix"].as_str().unwrap());
        let uuid = uuid::Uuid::parse_str(case["uuid"].as_str().unwrap()).unwrap();
        assert_eq!(parse_typeid(text), Some((prefix, *uuid.as_bytes())), "{}", case["name"]);
        assert_eq!(typeid_text(prefix, uuid.as_bytes()).as_deref(), Some(text), "{}", case["name"]);
    }
    for case in vectors("typeid/invalid.json").as_array().unwrap() {
        assert_eq!(parse_typeid(case["typeid"].as_str().unwrap()), None, "{}", case["name"]);
    }
}
