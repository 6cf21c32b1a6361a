//! Typed public IDs through the router (`[types]`), on SQLite and PostgreSQL: a typed create
//! hands out `order_…` (a TypeID, for an opaque as for a UUIDv7 public ID), which resolves only
//! with its own prefix: a wrong, unknown or missing one is the same 404 as an unknown ID, from
//! the cache as from the database. Untyped IDs keep their texts. A mapping never changes type
//! (409). And the TypeID specification's own vectors go through the service: each valid one is
//! the text the service hands out for its bytes and resolves; each invalid one is a 404.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{Method, StatusCode};
use common::call;
use idgen_public_ids::AppState;
use idgen_public_ids::check::{Gate, GateState, Legacy};
use idgen_public_ids::format::{self, Format};
use idgen_public_ids::store::PublicIdStore;
use idgen_public_ids::types::{TypeSection, Types};
use idgen_test_support::{TestDatabase as Db, store_suite};
use serde_json::{Value, json};

async fn sqlite() -> Db {
    Db::sqlite("public-ids.db")
}

async fn postgres() -> Db {
    Db::postgres("public_ids_types").await
}

/// `order` and `invoice` (opaque) and `user` (UUIDv7).
fn types() -> Types {
    let section = BTreeMap::from([
        ("order".to_owned(), TypeSection { number: 1, format: "opaque".into() }),
        ("user".to_owned(), TypeSection { number: 2, format: "uuidv7".into() }),
        ("invoice".to_owned(), TypeSection { number: 3, format: "opaque".into() }),
    ]);
    Types::from_config(&section, &[Format::Opaque, Format::Uuidv7]).unwrap()
}

/// An instance on the database with the types above and a cache of `max_entries` (0: none).
async fn instance(db: &Db, max_entries: u64) -> AppState {
    let mut state = common::instance(PublicIdStore::connect(db.url()).await.unwrap(), max_entries).await;
    state.types = Arc::new(types());
    state
}

async fn post(state: &AppState, path: &str, body: Value) -> (StatusCode, Value) {
    call(state, Method::POST, path, &body.to_string()).await
}

async fn get(state: &AppState, path: &str) -> (StatusCode, Value) {
    call(state, Method::GET, path, "").await
}

/// What a resolve answers for an unknown ID: everything that is not a mapping gets exactly this.
async fn unknown(state: &AppState) -> (StatusCode, Value) {
    get(state, "/v1/public-ids/00000000000000000000000000").await
}

async fn typed_ids_resolve_only_with_their_own_type(db: Db) {
    let s = instance(&db, 1_000).await;
    let (status, order) = post(&s, "/v1/public-ids", json!({"internal_id": "5", "type": "order"})).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let text = order["public_id"].as_str().unwrap().to_owned();
    let (prefix, _) = format::parse_typeid(&text).unwrap_or_else(|| panic!("{text} is not a TypeID"));
    assert_eq!((prefix, order["type"].as_str(), order["format"].as_str()), ("order", Some("order"), Some("opaque")));
    let suffix = &text["order_".len()..];
    assert!(format::is_opaque_text(suffix), "the suffix is the opaque format's own text: {text}");

    // UUIDv7 public IDs get the TypeID text too: its suffix is the UUIDv7's 16 bytes.
    let (status, user) = post(&s, "/v1/public-ids", json!({"internal_id": 5, "type": "user"})).await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    let user_text = user["public_id"].as_str().unwrap().to_owned();
    let (prefix, user_bytes) = format::parse_typeid(&user_text).unwrap();
    assert_eq!((prefix, user["format"].as_str()), ("user", Some("uuidv7")));
    let hyphenated = idgen::core::uuid::format(&user_bytes);
    assert!(idgen::core::uuid::parse_v7(&hyphenated).is_ok(), "{user_text} is not a UUIDv7's TypeID");

    // Answered from the cache (the create filled it), and by a second instance from the database.
    let fresh = instance(&db, 0).await;
    let not_found = unknown(&s).await;
    assert_eq!(not_found.0, StatusCode::NOT_FOUND);
    for instance in [&s, &fresh] {
        let (status, resolved) = get(instance, &format!("/v1/public-ids/{text}")).await;
        assert_eq!(status, StatusCode::OK, "{resolved}");
        assert_eq!(resolved, json!({"public_id": text, "internal_id": "5", "type": "order"}));
        let (status, resolved) = get(instance, &format!("/v1/public-ids/{user_text}")).await;
        assert_eq!(
            (status, &resolved["internal_id"], &resolved["type"]),
            (StatusCode::OK, &json!("5"), &json!("user"))
        );
        for other in [
            suffix.to_owned(),                          // the type missing
            format!("invoice_{suffix}"),                // another type of the same format
            format!("user_{suffix}"),                   // another type of another format
            format!("ghost_{suffix}"),                  // a type nobody configured
            format!("order_{}", suffix.to_uppercase()), // not a TypeID
            text.to_uppercase(),                        // nor this
            hyphenated.clone(),                         // a typed UUIDv7 without its type
            user_text["user_".len()..].to_owned(),      // the same, in its TypeID text
            format!("order_{}", &user_text["user_".len()..]),
        ] {
            assert_eq!(get(instance, &format!("/v1/public-ids/{other}")).await, not_found, "{other}");
        }
    }

    // The same create again is the same mapping; another type, or none, is refused.
    let (status, again) = post(&s, "/v1/public-ids", json!({"internal_id": "5", "type": "order"})).await;
    assert_eq!((status, &again), (StatusCode::OK, &order));
    for (body, said) in [
        (json!({"internal_id": "5"}), "5 (type order)"),
        (json!({"internal_id": "5", "type": "invoice"}), "another type than type invoice"),
        (json!({"internal_id": "5", "format": "uuidv7"}), "5 (type user)"),
    ] {
        let (status, refused) = post(&fresh, "/v1/public-ids", body.clone()).await;
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("type_mismatch")),
            "{body}"
        );
        assert!(refused["error"]["message"].as_str().unwrap().contains(said), "{body}: {refused}");
    }
    assert_eq!(get(&fresh, &format!("/v1/public-ids/{text}")).await.0, StatusCode::OK, "unchanged");
}

async fn untyped_ids_keep_their_texts_and_a_type_never_changes(db: Db) {
    let s = instance(&db, 1_000).await;
    let (status, opaque) = post(&s, "/v1/public-ids", json!({"internal_id": "6"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, uuid) = post(&s, "/v1/public-ids", json!({"internal_id": "6", "format": "uuidv7"})).await;
    assert_eq!(status, StatusCode::CREATED);
    assert!(opaque.get("type").is_none() && uuid.get("type").is_none(), "{opaque} {uuid}");
    let (opaque, uuid) = (opaque["public_id"].as_str().unwrap(), uuid["public_id"].as_str().unwrap());
    assert!(format::is_opaque_text(opaque) && idgen::core::uuid::parse_v7(uuid).is_ok(), "{opaque} {uuid}");
    let not_found = unknown(&s).await;
    for instance in [&s, &instance(&db, 0).await] {
        for text in [opaque.to_owned(), uuid.to_owned(), uuid.to_uppercase()] {
            let (status, resolved) = get(instance, &format!("/v1/public-ids/{text}")).await;
            assert_eq!((status, resolved), (StatusCode::OK, json!({"public_id": text, "internal_id": "6"})));
        }
        // An untyped ID does not resolve with a type.
        assert_eq!(get(instance, &format!("/v1/public-ids/order_{opaque}")).await, not_found);
    }

    // A batch: typed in the order asked; one internal ID of another type refuses it, naming it.
    let (status, batch) =
        post(&s, "/v1/public-ids:batch", json!({"internal_ids": ["7", 8, "7"], "type": "invoice"})).await;
    assert_eq!(status, StatusCode::OK, "{batch}");
    let batch = batch["public_ids"].as_array().unwrap();
    assert_eq!(batch[0]["public_id"], batch[2]["public_id"]);
    for m in batch {
        assert!(m["public_id"].as_str().unwrap().starts_with("invoice_") && m["type"] == "invoice", "{m}");
        let (status, resolved) = get(&s, &format!("/v1/public-ids/{}", m["public_id"].as_str().unwrap())).await;
        assert_eq!((status, &resolved["internal_id"]), (StatusCode::OK, &m["internal_id"]));
    }
    let (status, refused) =
        post(&s, "/v1/public-ids:batch", json!({"internal_ids": ["9", "6"], "type": "invoice"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().ends_with(": 6 (no type)"), "{refused}");

    // A lookup answers the text as handed out; asked for a type, only a mapping of it.
    let (status, found) = get(&s, "/v1/internal-ids/8/public-id?type=invoice").await;
    assert_eq!((status, &found["type"], &found["format"]), (StatusCode::OK, &json!("invoice"), &json!("opaque")));
    assert_eq!(found["public_id"], batch[1]["public_id"]);
    let fresh = instance(&db, 0).await;
    assert_eq!(get(&fresh, "/v1/internal-ids/8/public-id?format=opaque").await, (StatusCode::OK, found));
    let (status, untyped) = get(&fresh, "/v1/internal-ids/6/public-id").await;
    assert_eq!(
        (status, untyped),
        (StatusCode::OK, json!({"public_id": opaque, "internal_id": "6", "format": "opaque"}))
    );
    for (path, expected) in [
        ("/v1/internal-ids/6/public-id?type=order", StatusCode::NOT_FOUND),
        ("/v1/internal-ids/8/public-id?type=order", StatusCode::NOT_FOUND),
        ("/v1/internal-ids/8/public-id?type=ghost", StatusCode::BAD_REQUEST),
        ("/v1/internal-ids/8/public-id?type=user&format=opaque", StatusCode::BAD_REQUEST),
    ] {
        let (status, body) = get(&fresh, path).await;
        assert_eq!(status, expected, "{path}: {body}");
        if status == StatusCode::BAD_REQUEST {
            let code = body["error"]["code"].as_str();
            assert!(matches!(code, Some("unknown_type" | "type_format_mismatch")), "{path}: {body}");
        }
    }
}

async fn a_bad_type_is_refused_and_changes_nothing(db: Db) {
    let s = instance(&db, 0).await;
    for (body, code, said) in [
        (
            json!({"internal_id": "9", "type": "ghost"}),
            "unknown_type",
            "unknown type \"ghost\"; this service's types: invoice, order, user",
        ),
        (
            json!({"internal_id": "9", "type": 1}),
            "invalid_field",
            "\"type\": invalid type: integer `1`, expected a string",
        ),
        (json!({"internal_id": "9", "type": null}), "invalid_field", "\"type\": invalid type: null, expected a string"),
        (
            json!({"internal_id": "9", "type": "order", "format": "uuidv7"}),
            "type_format_mismatch",
            "are opaque, not uuidv7",
        ),
        (
            json!({"internal_id": "9", "type": "order", "format": "encrypted"}),
            "type_format_mismatch",
            "are opaque, not encrypted",
        ),
        (json!({"internal_id": "9", "type": "Order"}), "unknown_type", "unknown type"),
    ] {
        let (status, refused) = post(&s, "/v1/public-ids", body.clone()).await;
        assert_eq!(
            (status, refused["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{body}: {refused}"
        );
        assert!(refused["error"]["message"].as_str().unwrap().contains(said), "{body}: {refused}");
    }
    let (status, _) = get(&s, "/v1/internal-ids/9/public-id").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    // A service without types says so.
    let mut untyped = instance(&db, 0).await;
    untyped.types = Arc::default();
    let (status, refused) = post(&untyped, "/v1/public-ids", json!({"internal_id": "9", "type": "order"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(refused["error"]["message"].as_str().unwrap().contains("has no types"), "{refused}");
}

store_suite!(
    typed_ids_resolve_only_with_their_own_type,
    untyped_ids_keep_their_texts_and_a_type_never_changes,
    a_bad_type_is_refused_and_changes_nothing
);

/// An instance on `db` of `types` holding the mapping of internal ID `internal_id` to `bytes` of
/// `type_number`, whose keyed check reads every untagged ID (as on a database from before check
/// keys, until it is sealed): the specification's vectors are fixed bytes, which carry no tag.
async fn with_mapping(db: &Db, types: Types, internal_id: u64, bytes: [u8; 16], type_number: Option<u16>) -> AppState {
    let mut s = common::instance(PublicIdStore::connect(db.url()).await.unwrap(), 0).await;
    s.types = Arc::new(types);
    let text = format::crockford_encode(&bytes);
    s.store.create_batch(&[internal_id], Format::Opaque, type_number, &|| Ok(text.clone()), 0).await.unwrap();
    let state = s.gate.state();
    s.gate = Arc::new(Gate::new(GateState { legacy: Legacy::Open, ..(*state).clone() }));
    s
}

fn vectors(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/vectors/typeid").join(file);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A path segment as a client sends it: everything but the unreserved characters escaped.
fn escaped(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Each of the specification's valid TypeIDs is what the service hands out for its bytes (as an
/// opaque public ID, of the vector's type, or untyped for an empty prefix), and resolves; a
/// database each, since two vectors share their bytes.
#[tokio::test]
async fn the_specifications_valid_typeids_are_made_and_resolved_by_the_service() {
    for vector in vectors("valid.json") {
        let (typeid, prefix) = (vector["typeid"].as_str().unwrap(), vector["prefix"].as_str().unwrap());
        let bytes = *uuid::Uuid::parse_str(vector["uuid"].as_str().unwrap()).unwrap().as_bytes();
        let db = sqlite().await;
        let mut section = BTreeMap::new();
        if !prefix.is_empty() {
            section.insert(prefix.to_owned(), TypeSection { number: 1, format: "opaque".into() });
        }
        let types = Types::from_config(&section, &[Format::Opaque]).unwrap();
        let s = with_mapping(&db, types, 11, bytes, (!prefix.is_empty()).then_some(1)).await;
        let query = match prefix {
            "" => String::new(),
            prefix => format!("&type={prefix}"),
        };
        let (status, made) = get(&s, &format!("/v1/internal-ids/11/public-id?format=opaque{query}")).await;
        assert_eq!((status, made["public_id"].as_str()), (StatusCode::OK, Some(typeid)), "{}", vector["name"]);
        let (status, resolved) = get(&s, &format!("/v1/public-ids/{}", escaped(typeid))).await;
        assert_eq!((status, &resolved["internal_id"]), (StatusCode::OK, &json!("11")), "{}", vector["name"]);
    }
}

/// Each of the specification's invalid TypeIDs resolves to the one 404, even where its prefix is
/// a configured type and a mapping of that type holds the bytes its suffix would have.
#[tokio::test]
async fn the_specifications_invalid_typeids_are_the_one_404() {
    let db = sqlite().await;
    let section = BTreeMap::from([("prefix".to_owned(), TypeSection { number: 1, format: "opaque".into() })]);
    let types = Types::from_config(&section, &[Format::Opaque]).unwrap();
    let s = with_mapping(&db, types, 12, [0u8; 16], Some(1)).await;
    assert_eq!(get(&s, "/v1/public-ids/prefix_00000000000000000000000000").await.0, StatusCode::OK);
    let not_found = unknown(&s).await;
    for vector in vectors("invalid.json") {
        let typeid = vector["typeid"].as_str().unwrap();
        if typeid.is_empty() {
            continue; // no path segment at all: not this route
        }
        let answer = get(&s, &format!("/v1/public-ids/{}", escaped(typeid))).await;
        assert_eq!(answer, not_found, "{}: {}", vector["name"], vector["description"]);
    }
}

/// `[access]` is decided on the format a text names, before anything is looked up: for a typed
/// ID, its configured type's. A caller that may resolve only opaque IDs is refused a UUIDv7 type's
/// prefix (403, for an ID that exists as for one that does not), and a prefix nobody configured
/// is the one 404; its own format's typed IDs resolve.
#[tokio::test]
async fn access_is_decided_on_the_format_a_typed_id_names() {
    use idgen_public_ids::access::{Access, AccessSection, OperationLists, Rules};
    let db = sqlite().await;
    let mut s = instance(&db, 0).await;
    let (_, user) = post(&s, "/v1/public-ids", json!({"internal_id": "3", "type": "user"})).await;
    let (_, order) = post(&s, "/v1/public-ids", json!({"internal_id": "3", "type": "order"})).await;
    let (user, order) = (user["public_id"].as_str().unwrap(), order["public_id"].as_str().unwrap());
    let made_up = format!("user_{}", format::crockford_encode(&[1; 16]));
    let section = AccessSection {
        opaque: OperationLists { resolve: vec!["anonymous".into()], ..Default::default() },
        ..Default::default()
    };
    s.access = Arc::new(Access::new(Rules::of(&section), Arc::default()));
    for text in [user, made_up.as_str()] {
        let (status, refused) = get(&s, &format!("/v1/public-ids/{text}")).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden")), "{text}");
    }
    let ghost = format!("ghost_{}", &order["order_".len()..]);
    assert_eq!(get(&s, &format!("/v1/public-ids/{ghost}")).await, unknown(&s).await);
    let (status, resolved) = get(&s, &format!("/v1/public-ids/{order}")).await;
    assert_eq!((status, &resolved["internal_id"]), (StatusCode::OK, &json!("3")));
}
