//! The TypeID specification's own test vectors (`sdk/vectors/typeid/`, from jetify-com/typeid, see its
//! README) through the service's parser and encoder: every valid one parses to its prefix and
//! UUID and is written back as the same text, every invalid one is refused.

use idgen_public_ids::format::{parse_typeid, typeid_text};
use serde_json::Value;

fn vectors(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/vectors/typeid").join(file);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_specifications_valid_typeids_parse_and_encode_back() {
    let valid = vectors("valid.json");
    assert!(valid.len() >= 9, "{} vectors", valid.len());
    for vector in valid {
        let (text, prefix) = (vector["typeid"].as_str().unwrap(), vector["prefix"].as_str().unwrap());
        let uuid = uuid::Uuid::parse_str(vector["uuid"].as_str().unwrap()).unwrap();
        assert_eq!(parse_typeid(text), Some((prefix, *uuid.as_bytes())), "{}", vector["name"]);
        assert_eq!(typeid_text(prefix, uuid.as_bytes()).as_deref(), Some(text), "{}", vector["name"]);
    }
}

#[test]
fn the_specifications_invalid_typeids_are_refused() {
    let invalid = vectors("invalid.json");
    assert!(invalid.len() >= 21, "{} vectors", invalid.len());
    for vector in invalid {
        let text = vector["typeid"].as_str().unwrap();
        assert_eq!(parse_typeid(text), None, "{}: {}", vector["name"], vector["description"]);
    }
    // And a prefix the encoder is given is held to the same rules.
    for prefix in ["Order", "order_", "_order", "ord3r", &"a".repeat(64)] {
        assert_eq!(typeid_text(prefix, &[0; 16]), None, "{prefix}");
    }
}
