//! The public-ID endpoints in-process, on SQLite, with a keyring built in the test (the KMS
//! path has its own test): round trips in every format, idempotency, one 404 for unknown,
//! malformed and forged IDs, and bad input.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use common::call;
use http_body_util::BodyExt;
use idgen_public_ids::access::Access;
use idgen_public_ids::format::{Format, Keyring};
use idgen_public_ids::store::PublicIdStore;
use idgen_public_ids::{AppState, router};
use serde_json::{Value, json};
use tower::ServiceExt;
use zeroize::Zeroizing;

async fn state(with_keys: bool) -> (AppState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = PublicIdStore::connect(&format!("sqlite://{}", dir.path().join("p.db").display())).await.unwrap();
    let keyring = with_keys.then(|| Arc::new(Keyring::new(vec![(1, Zeroizing::new(vec![3u8; 32]))]).unwrap()));
    let formats = [Format::Opaque, Format::Uuidv7, Format::Encrypted].into();
    let state = AppState { keyring, formats, ..common::instance(store, 100_000).await };
    (state, dir)
}

#[tokio::test]
async fn every_format_round_trips_and_creates_are_idempotent() {
    let (s, _dir) = state(true).await;
    for format in ["opaque", "uuidv7", "encrypted"] {
        let body = json!({"internal_id": "97301141913751557", "format": format}).to_string();
        let (status, created) = call(&s, Method::POST, "/v1/public-ids", &body).await;
        assert!(
            status == StatusCode::CREATED || (format == "encrypted" && status == StatusCode::OK),
            "{format}: {status} {created}"
        );
        let public_id = created["public_id"].as_str().unwrap().to_owned();
        let (status, again) = call(&s, Method::POST, "/v1/public-ids", &body).await;
        assert_eq!((status, again["public_id"].as_str()), (StatusCode::OK, Some(public_id.as_str())), "{format}");
        let (status, resolved) = call(&s, Method::GET, &format!("/v1/public-ids/{public_id}"), "").await;
        assert_eq!(status, StatusCode::OK, "{format}: {resolved}");
        assert_eq!(resolved, json!({"public_id": public_id, "internal_id": "97301141913751557"}));
        let (status, looked_up) =
            call(&s, Method::GET, &format!("/v1/internal-ids/97301141913751557/public-id?format={format}"), "").await;
        assert_eq!((status, looked_up["public_id"].as_str()), (StatusCode::OK, Some(public_id.as_str())), "{format}");
        assert!(!public_id.contains("97301141913751557"));
    }
    // The default format is opaque.
    let (status, body) = call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": 5}"#).await;
    assert_eq!((status, body["format"].as_str()), (StatusCode::CREATED, Some("opaque")));
}

#[tokio::test]
async fn unknown_malformed_and_forged_ids_get_the_same_404() {
    let (s, _dir) = state(true).await;
    let (_, created) =
        call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": "12345", "format": "encrypted"}"#).await;
    let encrypted = created["public_id"].as_str().unwrap().to_owned();
    let mut flipped: Vec<char> = encrypted.chars().collect();
    let last = flipped.len() - 1;
    flipped[last] = if flipped[last] == 'a' { 'b' } else { 'a' };
    let flipped: String = flipped.into_iter().collect();
    let (_, opaque) = call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": "12345"}"#).await;
    let mut unknown_opaque = opaque["public_id"].as_str().unwrap().to_owned();
    unknown_opaque.replace_range(25..26, if unknown_opaque.ends_with('0') { "1" } else { "0" });
    let mut answers = Vec::new();
    for id in [
        flipped.as_str(),
        unknown_opaque.as_str(),
        "nonsense",
        "0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f0a0b",
        "%FF",
        &"z".repeat(28),
    ] {
        answers.push(call(&s, Method::GET, &format!("/v1/public-ids/{id}"), "").await);
    }
    for answer in &answers {
        assert_eq!(answer, &answers[0], "one answer for every kind of miss");
    }
    assert_eq!(answers[0].0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn batches_and_bad_input() {
    let (s, _dir) = state(false).await;
    let ids: Vec<String> = (1..=1000).map(|i| i.to_string()).collect();
    let (status, body) =
        call(&s, Method::POST, "/v1/public-ids:batch", &json!({"internal_ids": ids}).to_string()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["public_ids"].as_array().unwrap().len(), 1000);
    assert_eq!(body["public_ids"][0]["internal_id"], "1");
    let too_many: Vec<u64> = (0..1001).collect();
    for (bad, code) in [
        (json!({"internal_ids": too_many}).to_string(), "invalid_count"),
        (json!({"internal_ids": []}).to_string(), "invalid_count"),
        (json!({"internal_ids": ["-1"]}).to_string(), "invalid_internal_id"),
        (json!({"internal_ids": "1"}).to_string(), "invalid_field"),
        (json!({"internal_ids": ["1"], "type": null}).to_string(), "invalid_field"),
        (json!({"internal_ids": ["1"], "type": "invoice"}).to_string(), "unknown_type"),
    ] {
        let (status, body) = call(&s, Method::POST, "/v1/public-ids:batch", &bad).await;
        assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some(code)), "{bad}");
    }
    for (bad, code) in [
        ("", "invalid_json"),
        ("garbage", "invalid_json"),
        ("[1]", "invalid_body"),
        (r#"{"internal_id": "9223372036854775808"}"#, "invalid_internal_id"),
        (r#"{"internal_id": "-5"}"#, "invalid_internal_id"),
        (r#"{"internal_id": 1.5}"#, "invalid_internal_id"),
        (r#"{"internal_id": "abc"}"#, "invalid_internal_id"),
        (r#"{"internal_id": null}"#, "invalid_internal_id"),
        (r#"{"internal_id": "1", "format": "rot13"}"#, "unknown_format"),
        (r#"{"internal_id": "1", "format": 5}"#, "invalid_field"),
        (r#"{"internal_id": "1", "extra": true}"#, "unknown_field"),
        (r#"{}"#, "missing_field"),
    ] {
        let (status, body) = call(&s, Method::POST, "/v1/public-ids", bad).await;
        assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some(code)), "{bad}");
    }
    // No data key: the encrypted format is not on offer, and the caller is told (never a 5xx).
    let (status, body) =
        call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": "1", "format": "encrypted"}"#).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("format_unavailable")));
    let (status, body) = call(&s, Method::GET, "/v1/internal-ids/abc/public-id", "").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_internal_id")));

    // An ID sent as a JSON number above 2^53 - 1 was probably rounded by a JavaScript caller
    // (9007199254740993 arrives as ...992): refused with advice, and nothing is created.
    for (path, bad) in [
        ("/v1/public-ids", r#"{"internal_id": 9007199254740992}"#),
        ("/v1/public-ids", r#"{"internal_id": 97301141913751557}"#),
        ("/v1/public-ids:batch", r#"{"internal_ids": ["4000000", 9007199254740992]}"#),
    ] {
        let (status, body) = call(&s, Method::POST, path, bad).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("unsafe_integer")),
            "{bad}"
        );
        assert!(message.contains("decimal strings"), "{bad}: {message}");
    }
    for id in ["9007199254740992", "97301141913751557", "4000000"] {
        let (status, _) = call(&s, Method::GET, &format!("/v1/internal-ids/{id}/public-id?format=opaque"), "").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{id} was created by a refused request");
    }
    // Exact small integers are still accepted.
    let (status, body) = call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": 9007199254740991}"#).await;
    assert_eq!((status, body["internal_id"].as_str()), (StatusCode::CREATED, Some("9007199254740991")));
    let (status, _) = call(&s, Method::GET, "/v1/internal-ids/999999/public-id?format=opaque", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Resolving counts against the caller's quota like creating does (customer-facing apps hammer
/// it); over it: 429 with Retry-After, and another caller is not affected.
#[tokio::test]
async fn resolve_and_create_are_held_to_the_callers_quota() {
    let (mut s, _dir) = state(false).await;
    let section = idgen_server::QuotaSection {
        default: None,
        callers: [("storefront".to_owned(), idgen_server::Rate { ids_per_second: 1, burst: 3 })].into(),
    };
    s.quotas = Arc::new(idgen_server::Quotas::new(&section, Arc::default()).unwrap());
    let as_caller = |caller: &str, method: Method, uri: &str, body: &'static str| {
        let request = Request::builder().method(method).uri(uri).body(Body::from(body)).unwrap();
        common::app(&s, caller).oneshot(request)
    };
    let created = as_caller("storefront", Method::POST, "/v1/public-ids", r#"{"internal_id": "7"}"#).await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    for _ in 0..2 {
        let resolved = as_caller("storefront", Method::GET, "/v1/public-ids/0000000000000000000000000a", "").await;
        assert_eq!(resolved.unwrap().status(), StatusCode::NOT_FOUND, "within the burst of 3");
    }
    let refused = as_caller("storefront", Method::GET, "/v1/public-ids/0000000000000000000000000a", "").await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let other = as_caller("backoffice", Method::GET, "/v1/public-ids/0000000000000000000000000a", "").await.unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND, "a caller without a quota is not limited");
}

/// `GET /openapi.json` serves the checked-in `docs/openapi/public-ids.json`, which names exactly
/// the router's routes; every method a path does not take gets the documented 405 with an
/// `Allow` of the ones it does; and what each operation answers a plain request with, and a bad
/// one, is documented.
#[tokio::test]
async fn the_openapi_document_is_the_checked_in_one_and_names_every_route() {
    use idgen_test_support::openapi;
    let (s, _dir) = state(true).await;
    let metrics = idgen_server::ServiceMetrics::new(Default::default(), &idgen_public_ids::ROUTES, || {});
    let app = idgen_public_ids::app(s.clone(), metrics);
    let send = |method: Method, uri: String, body: &'static str| {
        let request = Request::builder().method(method).uri(uri).body(Body::from(body)).unwrap();
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap() }
    };
    let response = send(Method::GET, "/openapi.json".into(), "").await;
    assert_eq!(response.headers()["content-type"], "application/json");
    let mut served: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi/public-ids.json");
    // The one part that is the deployment's own: its types (here none, so no `type` is valid).
    let checked_in: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let types = std::mem::replace(
        &mut served["components"]["schemas"]["TypeName"],
        checked_in["components"]["schemas"]["TypeName"].clone(),
    );
    assert_eq!(types["not"], json!({}), "{types}");
    let operations = openapi::operations(&served, file, &idgen_public_ids::ROUTES, str::to_owned);
    for (path, item) in served["paths"].as_object().unwrap() {
        let methods: Vec<String> = item.as_object().unwrap().keys().map(|m| m.to_uppercase()).collect();
        let methods: Vec<&str> = methods.iter().map(String::as_str).collect();
        let uri = path.replace("{public_id}", "x").replace("{internal_id}", "5");
        for other in openapi::undocumented(&methods) {
            let response = send(Method::from_bytes(other.as_bytes()).unwrap(), uri.clone(), "").await;
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{other} {path}");
            assert_eq!(response.headers()["allow"], openapi::allow(&methods).as_str(), "{other} {path}");
        }
    }
    for operation in &operations {
        let method = Method::from_bytes(operation.method.as_bytes()).unwrap();
        let good = match operation.path.as_str() {
            "/v1/public-ids" => r#"{"internal_id": "5"}"#,
            "/v1/public-ids:batch" => r#"{"internal_ids": ["5", "6"], "format": "encrypted"}"#,
            _ => "",
        };
        for (uri, body) in [
            (operation.path.replace("{public_id}", "x").replace("{internal_id}", "5"), good),
            (operation.path.replace("{public_id}", "%FF").replace("{internal_id}", "-1"), "["),
        ] {
            let status = send(method.clone(), uri.clone(), body).await.status();
            assert!(
                operation.responses[status.as_str()].is_object(),
                "{} {uri} {body:?}: {status} is not documented",
                operation.method
            );
        }
    }
}

/// The document a deployment serves names its types as an `enum` (before, any TypeID prefix
/// was schema-valid, and schemathesis found requests the document allowed refused
/// `unknown_type`); each of them is accepted, and a name outside it refused.
#[tokio::test]
async fn the_served_document_names_the_deployments_types() {
    use idgen_public_ids::types::{TypeSection, Types};
    let (mut s, _dir) = state(true).await;
    let section = std::collections::BTreeMap::from([
        ("user".to_owned(), TypeSection { number: 2, format: "uuidv7".into() }),
        ("order".to_owned(), TypeSection { number: 1, format: "opaque".into() }),
    ]);
    s.types = Arc::new(Types::from_config(&section, &s.formats).unwrap());
    let document: Value = serde_json::from_str(&idgen_public_ids::api::served_openapi(&s.types)).unwrap();
    let schema = &document["components"]["schemas"]["TypeName"];
    assert_eq!(schema["enum"], json!(["order", "user"]), "{schema}");
    assert_eq!(schema["example"], "order");
    for name in ["order", "user"] {
        let (status, made) =
            common::call(&s, Method::POST, "/v1/public-ids", &json!({"internal_id": "77", "type": name}).to_string())
                .await;
        assert!(status.is_success() || status == StatusCode::CONFLICT, "{name}: {status} {made}");
    }
    let (status, refused) =
        common::call(&s, Method::POST, "/v1/public-ids", &json!({"internal_id": "78", "type": "invoice"}).to_string())
            .await;
    assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("unknown_type")));
}

/// A format the deployment does not offer (`formats` in its configuration) is a 400 that names
/// what it offers, on create, batch and lookup alike; nothing is stored.
#[tokio::test]
async fn a_format_not_offered_is_a_400_that_says_so() {
    let (mut s, _dir) = state(true).await;
    s.formats = [Format::Opaque].into();
    for (method, uri, body) in [
        (Method::POST, "/v1/public-ids", r#"{"internal_id": "7", "format": "uuidv7"}"#),
        (Method::POST, "/v1/public-ids", r#"{"internal_id": "7", "format": "encrypted"}"#),
        (Method::POST, "/v1/public-ids:batch", r#"{"internal_ids": ["7"], "format": "uuidv7"}"#),
        (Method::GET, "/v1/internal-ids/7/public-id?format=encrypted", ""),
    ] {
        let (status, answer) = call(&s, method, uri, body).await;
        assert_eq!((status, answer["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("format_unavailable")));
        assert!(answer["error"]["message"].as_str().unwrap().contains("it offers opaque"), "{answer}");
    }
    let (status, _) = call(&s, Method::GET, "/v1/internal-ids/7/public-id?format=uuidv7", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was stored");
    let (status, _) = call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": "7"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
}

/// `[access]`, per operation and format: a caller not listed gets 403 `forbidden` naming the
/// operation, before its body is read, before its quota is spent and before the database is
/// asked (the same answer for an ID that exists and one that does not); counted by operation.
#[tokio::test]
async fn access_is_checked_per_operation_and_format_before_anything_else() {
    use idgen_public_ids::access::{AccessMetrics, AccessSection, OperationLists, Rules};
    let (mut s, dir) = state(true).await;
    let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<Vec<_>>();
    let section = AccessSection {
        create: names(&["storefront"]),
        resolve: names(&["support"]),
        lookup: names(&["storefront"]),
        encrypted: OperationLists {
            create: names(&["billing"]),
            resolve: names(&["billing"]),
            lookup: names(&["billing"]),
        },
        ..Default::default()
    };
    let metrics = Arc::new(AccessMetrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    s.access = Arc::new(Access::new(Rules::of(&section), metrics));
    let forbidden = |answer: &(StatusCode, Value), what: &str| {
        assert_eq!(
            (answer.0, answer.1["error"]["code"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden")),
            "{what}"
        );
        let message = answer.1["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{message:?} does not name {what:?}");
    };

    // Listed callers get what they are listed for, in the formats they are listed for.
    let (status, opaque) =
        common::call_as(&s, "storefront", Method::POST, "/v1/public-ids", r#"{"internal_id": "41"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{opaque}");
    let opaque = opaque["public_id"].as_str().unwrap().to_owned();
    let (status, _) = common::call_as(&s, "storefront", Method::GET, "/v1/internal-ids/41/public-id", "").await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = common::call_as(&s, "support", Method::GET, &format!("/v1/public-ids/{opaque}"), "").await;
    assert_eq!(status, StatusCode::OK);
    let encrypted_body = r#"{"internal_id": "41", "format": "encrypted"}"#;
    let (status, encrypted) = common::call_as(&s, "billing", Method::POST, "/v1/public-ids", encrypted_body).await;
    assert_eq!(status, StatusCode::OK, "{encrypted}");
    let encrypted = encrypted["public_id"].as_str().unwrap().to_owned();
    let (status, _) = common::call_as(&s, "billing", Method::GET, &format!("/v1/public-ids/{encrypted}"), "").await;
    assert_eq!(status, StatusCode::OK);

    // Everybody else, per operation, and per format for a caller listed for another one.
    let batch = r#"{"internal_ids": ["41"], "format": "uuidv7"}"#;
    for (caller, method, uri, body, what) in [
        (
            "intruder",
            Method::POST,
            "/v1/public-ids".to_owned(),
            r#"{"internal_id": "42"}"#,
            "may not create public IDs",
        ),
        ("intruder", Method::POST, "/v1/public-ids".to_owned(), "not even JSON", "may not create public IDs"),
        ("intruder", Method::POST, "/v1/public-ids:batch".to_owned(), batch, "may not create public IDs"),
        ("intruder", Method::GET, format!("/v1/public-ids/{opaque}"), "", "may not resolve public IDs"),
        ("intruder", Method::GET, "/v1/internal-ids/41/public-id".to_owned(), "", "may not look up public IDs"),
        ("storefront", Method::GET, format!("/v1/public-ids/{opaque}"), "", "may not resolve public IDs"),
        ("support", Method::POST, "/v1/public-ids".to_owned(), r#"{"internal_id": "42"}"#, "may not create"),
        ("billing", Method::POST, "/v1/public-ids".to_owned(), r#"{"internal_id": "42"}"#, "create opaque public IDs"),
        ("billing", Method::POST, "/v1/public-ids:batch".to_owned(), batch, "may not create uuidv7 public IDs"),
        ("billing", Method::GET, format!("/v1/public-ids/{opaque}"), "", "may not resolve opaque public IDs"),
        ("billing", Method::GET, "/v1/internal-ids/41/public-id".to_owned(), "", "may not look up opaque public IDs"),
        ("support", Method::GET, "/v1/internal-ids/41/public-id?format=encrypted".to_owned(), "", "look up public IDs"),
    ] {
        forbidden(&common::call_as(&s, caller, method, &uri, body).await, what);
    }
    // A listed caller's bad body is still its 400.
    let (status, _) = common::call_as(&s, "storefront", Method::POST, "/v1/public-ids", "[").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A refusal says nothing about whether the ID exists: one answer for a known and an unknown.
    let mut unknown = opaque.clone();
    unknown.replace_range(25..26, if opaque.ends_with('0') { "1" } else { "0" });
    assert_eq!(
        common::call_as(&s, "intruder", Method::GET, &format!("/v1/public-ids/{opaque}"), "").await,
        common::call_as(&s, "intruder", Method::GET, &format!("/v1/public-ids/{unknown}"), "").await
    );
    // Nothing a refused create asked for was made.
    let (status, _) = common::call_as(&s, "storefront", Method::GET, "/v1/internal-ids/42/public-id", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Before the database: with the mappings table gone, a listed caller gets 503 and a refused
    // one still its 403.
    let mut raw = <sqlx::SqliteConnection as sqlx::Connection>::connect(&format!(
        "sqlite://{}",
        dir.path().join("p.db").display()
    ))
    .await
    .unwrap();
    sqlx::query("ALTER TABLE public_ids RENAME TO public_ids_gone").execute(&mut raw).await.unwrap();
    // (An ID the cache does not hold, a created one would be answered from memory, that carries
    // the keyed check's tag: one without it is answered 404 before the database.)
    let (status, _) = common::call_as(&s, "support", Method::GET, &format!("/v1/public-ids/{unknown}"), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "an ID without the tag is not read");
    let unread = s.gate.new_opaque(&idgen_public_ids::format::OsRandom, None, 0).unwrap();
    let (status, _) = common::call_as(&s, "support", Method::GET, &format!("/v1/public-ids/{unread}"), "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "the table is really gone");
    forbidden(&common::call_as(&s, "intruder", Method::GET, &format!("/v1/public-ids/{opaque}"), "").await, "resolve");
    forbidden(
        &common::call_as(&s, "intruder", Method::POST, "/v1/public-ids", r#"{"internal_id": "42"}"#).await,
        "create",
    );

    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for (operation, count) in [("create", 7), ("resolve", 6), ("lookup", 3)] {
        let series = format!("idgen_public_requests_forbidden_total{{operation=\"{operation}\"}} {count}\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
}

/// A random source that always fails, as the OS generator may (early boot, a seccomp filter, a
/// broken /dev/urandom).
struct FailingRandom;

impl idgen_public_ids::format::RandomSource for FailingRandom {
    fn fill(&self, _bytes: &mut [u8]) -> Result<(), idgen_public_ids::format::RandomUnavailable> {
        Err(idgen_public_ids::format::RandomUnavailable("unavailable in this test".into()))
    }
}

/// When the random source fails, no opaque or UUIDv7 public ID is made (one made of zero bits
/// would be predictable): 503 `random_source_unavailable` with `Retry-After`, nothing stored,
/// counted by format. The encrypted format draws no random bits and still answers.
#[tokio::test]
async fn a_failing_random_source_refuses_and_creates_nothing() {
    use idgen_public_ids::format::RandomSourceMetrics;
    let (mut s, _dir) = state(true).await;
    let metrics = Arc::new(RandomSourceMetrics::default());
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    s.random = Arc::new(FailingRandom);
    s.random_failures = metrics;
    for (uri, body) in [
        ("/v1/public-ids", r#"{"internal_id": "77", "format": "uuidv7"}"#),
        ("/v1/public-ids", r#"{"internal_id": "77", "format": "opaque"}"#),
        ("/v1/public-ids:batch", r#"{"internal_ids": ["77", "78"], "format": "uuidv7"}"#),
    ] {
        let request = Request::builder().method(Method::POST).uri(uri).body(Body::from(body)).unwrap();
        let response = router(s.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
        let answer: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("random_source_unavailable")),
            "{body}: {answer}"
        );
        assert_eq!(retry_after.as_deref(), Some("1"), "{body}");
    }
    for format in ["uuidv7", "opaque"] {
        for id in ["77", "78"] {
            let (status, _) =
                call(&s, Method::GET, &format!("/v1/internal-ids/{id}/public-id?format={format}"), "").await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{format} {id} was stored");
        }
    }
    let (status, _) = call(&s, Method::POST, "/v1/public-ids", r#"{"internal_id": "77", "format": "encrypted"}"#).await;
    assert_eq!(status, StatusCode::OK, "the encrypted format needs no random bits");
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for (format, count) in [("opaque", 1), ("uuidv7", 2)] {
        let series = format!("idgen_public_random_source_failures_total{{format=\"{format}\"}} {count}\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
}

/// A resolve's future, cache hit or not, stays within what the allocator serves from its
/// per-thread cache (glibc's tcache: chunks up to 1,032 bytes), with room for axum's own frame
/// around it: the database's future, a kilobyte and more, is boxed on a miss only.
#[tokio::test]
async fn a_resolve_future_is_small() {
    let (s, _dir) = state(false).await;
    let uri = "/v1/public-ids/01h455vb4pex5vsknk084sn02q".parse().unwrap();
    let future =
        idgen_public_ids::api::resolve(axum::extract::State(Arc::new(s)), idgen_server::Caller::anonymous(), uri);
    let size = std::mem::size_of_val(&future);
    assert!(size <= 640, "a resolve's future is {size} bytes");
}

/// The service answers `GET /v1/public-ids/{public_id}` itself, without the router: for any
/// path, method and caller, its answer is the router's route's, status, headers and body, and a
/// resolve is counted under the route's label. Every kind of text: each format, typed, a wrong
/// type, unknown, malformed, percent-encoded, not UTF-8, a trailing or an extra segment, a query.
#[tokio::test]
async fn the_services_own_resolve_answers_what_the_router_answers() {
    use std::collections::BTreeMap;

    use idgen_public_ids::types::{TypeSection, Types};
    let (mut s, _dir) = state(true).await;
    let section = BTreeMap::from([("order".to_owned(), TypeSection { number: 1, format: "opaque".into() })]);
    s.types = Arc::new(Types::from_config(&section, &[Format::Opaque, Format::Uuidv7]).unwrap());
    let mut texts = Vec::new();
    for body in [
        json!({"internal_id": "11", "format": "opaque"}),
        json!({"internal_id": "12", "format": "uuidv7"}),
        json!({"internal_id": "13", "format": "encrypted"}),
        json!({"internal_id": "14", "type": "order"}),
    ] {
        let (_, created) = call(&s, Method::POST, "/v1/public-ids", &body.to_string()).await;
        texts.push(created["public_id"].as_str().unwrap().to_owned());
    }
    let typed = texts[3].clone();
    let suffix = typed.trim_start_matches("order_").to_owned();
    let percent = format!("%{:02X}{}", texts[0].as_bytes()[0], &texts[0][1..]);
    let uppercase = texts[1].to_uppercase();
    let mut paths: Vec<String> = texts.iter().map(|text| format!("/v1/public-ids/{text}")).collect();
    for text in [suffix.as_str(), &format!("user_{suffix}"), &percent, &uppercase, "%FF", "nonsense", "a%2Fb"] {
        paths.push(format!("/v1/public-ids/{text}"));
    }
    for path in [format!("/v1/public-ids/{typed}?x=1"), format!("/v1/public-ids/{typed}/"), "/v1/public-ids/".into()] {
        paths.push(path);
    }
    paths.push(format!("/v1/public-ids/{}/x", texts[0]));
    let answer = |response: axum::response::Response| async move {
        let (status, headers) = (response.status(), response.headers().clone());
        let kept: Vec<_> = ["content-type", "retry-after", "allow"].iter().map(|h| headers.get(*h).cloned()).collect();
        (status, kept, response.into_body().collect().await.unwrap().to_bytes())
    };
    let mut answered = 0;
    for caller in [idgen_server::ANONYMOUS, "storefront"] {
        for method in [Method::GET, Method::HEAD, Method::POST] {
            for path in &paths {
                let request = || Request::builder().method(method.clone()).uri(path).body(Body::empty()).unwrap();
                let routed = answer(router(s.clone()).oneshot(request()).await.unwrap()).await;
                let served = answer(common::app(&s, caller).oneshot(request()).await.unwrap()).await;
                assert_eq!(served, routed, "{method} {path} as {caller}");
                answered += usize::from(routed.0 == StatusCode::OK);
            }
        }
    }
    // Found, for each caller's GET and HEAD: the 4 IDs, the percent-encoded and the uppercase text,
    // and the typed ID with a query.
    assert_eq!(answered, 2 * 2 * 7);
    // Counted under the route, as the router's requests are.
    let metrics = idgen_server::ServiceMetrics::new(Default::default(), &idgen_public_ids::ROUTES, || {});
    let app = idgen_public_ids::app(s.clone(), metrics.clone());
    for path in [&paths[0], &paths[0], &paths[5]] {
        app.clone().oneshot(Request::builder().uri(path).body(Body::empty()).unwrap()).await.unwrap();
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &metrics.registry).unwrap();
    for (status, count) in [(200, 2), (404, 1)] {
        let series = format!(
            r#"idgen_http_requests_total{{method="GET",route="/v1/public-ids/{{public_id}}",status="{status}"}} {count}"#
        );
        assert!(text.lines().any(|line| line == series), "no {series:?} in\n{text}");
    }
}

/// The service's own resolve keeps its future within the allocator's per-thread cache too.
#[tokio::test]
async fn the_services_own_resolve_future_is_small() {
    let (s, _dir) = state(false).await;
    let request = Request::builder().uri("/v1/public-ids/01h455vb4pex5vsknk084sn02q").body(Body::empty()).unwrap();
    let future = tower::Service::call(&mut common::app(&s, idgen_server::ANONYMOUS), request);
    let size = std::mem::size_of_val(&*future);
    assert!(size <= 768, "the service's resolve future is {size} bytes");
}

/// A create answers with the public ID an internal ID already has (and its type), which
/// is a lookup; so a caller listed to create in a stored format but not to look up in it is
/// refused 403 before anything is read or made (on the code before, it learnt any internal ID's
/// mapping: 200 and the public ID), counted under create, and named at start-up. A caller listed
/// for both creates as before. The encrypted format is held to it too: computed and
/// stored nowhere, but deterministically, so its create is a lookup as well.
#[tokio::test]
async fn a_caller_that_may_not_look_up_may_not_create_in_that_format() {
    use idgen_public_ids::access::{AccessMetrics, AccessSection, OperationLists, Rules, describe};
    let (mut s, _dir) = state(true).await;
    let names = |list: &[&str]| list.iter().map(|name| name.to_string()).collect::<Vec<_>>();
    let section = AccessSection {
        create: names(&["storefront", "ingest"]),
        lookup: names(&["storefront"]),
        uuidv7: OperationLists { lookup: names(&["ingest"]), ..Default::default() },
        ..Default::default()
    };
    let described = describe(Some(&section), false);
    assert!(
        described.contains("REFUSED to create, listed without lookup: ingest (opaque), ingest (encrypted)"),
        "{described}"
    );
    let metrics = Arc::new(AccessMetrics::default());
    s.access = Arc::new(Access::new(Rules::of(&section), metrics));
    let (status, made) =
        common::call_as(&s, "storefront", Method::POST, "/v1/public-ids", &json!({"internal_id": "61"}).to_string())
            .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    for (uri, body) in [
        ("/v1/public-ids", json!({"internal_id": "61"})),
        ("/v1/public-ids:batch", json!({"internal_ids": ["61", "62"]})),
    ] {
        let (status, refused) = common::call_as(&s, "ingest", Method::POST, uri, &body.to_string()).await;
        assert_eq!((status, refused["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("forbidden")));
        assert!(refused["error"]["message"].as_str().unwrap().contains("not look them up"), "{refused}");
        assert!(!refused.to_string().contains(made["public_id"].as_str().unwrap()), "the mapping was shown");
    }
    // Nothing the refused batch asked for was made.
    let (status, _) = common::call_as(&s, "storefront", Method::GET, "/v1/internal-ids/62/public-id", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // Where it may look up (UUIDv7) it creates; in the encrypted format, where it may not, its
    // create would answer the encrypted public ID a lookup would: refused.
    let (status, _) = common::call_as(
        &s,
        "ingest",
        Method::POST,
        "/v1/public-ids",
        &json!({"internal_id": "61", "format": "uuidv7"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = common::call_as(
        &s,
        "ingest",
        Method::POST,
        "/v1/public-ids",
        &json!({"internal_id": "61", "format": "encrypted"}).to_string(),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}
