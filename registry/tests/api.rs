//! The registry's endpoints in-process: every write path with good and bad input (400, 401, 404,
//! 409), and proof that a refused request changed nothing.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use idgen_registry::operators::{OperatorTokens, TokenHash};
use idgen_registry::store::{InitialSchedule, RegistryStore};
use idgen_registry::{AppState, router};
use serde_json::{Value, json};
use tower::ServiceExt;

const TOKEN: &str = "test-operator-token-0123456789";

fn fixed_now() -> i64 {
    1_795_000_000_000
}

const DAY: i64 = 86_400_000;

async fn state() -> (AppState, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("registry.db").display());
    let store = RegistryStore::connect(&url, &InitialSchedule::spec_default("us-east-1")).await.unwrap();
    let state = AppState {
        store: Arc::new(store),
        operators: Arc::new(OperatorTokens::new([("alice".to_owned(), TokenHash::of(TOKEN))]).unwrap()),
        certificate_operators: Arc::new(idgen_registry::operators::CertifiedNames::new(
            std::collections::BTreeSet::from(["ops-bot".to_owned()]),
        )),
        refusals: Arc::default(),
        health: Arc::default(),
        horizon_lead_ms: 30 * DAY,
        retire_grace_ms: DAY,
        new_registry_quiet_ms: 0,
        lease_table_recorders: Arc::default(),
        now: fixed_now,
    };
    (state, dir)
}

async fn call(state: &AppState, method: Method, uri: &str, token: Option<&str>, body: &str) -> (StatusCode, Value) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = router(state.clone()).oneshot(request.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn assert_error(got: (StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"]["code"], code, "{}", got.1);
}

#[tokio::test]
async fn regions_are_added_listed_and_retired() {
    let (s, _dir) = state().await;
    let (status, body) = call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (body["name"].clone(), body["number"].clone(), body["status"].clone()),
        (json!("us-east-1"), json!(0), json!("active"))
    );
    assert_eq!(body["created_at"], "2026-11-18T11:06:40.000Z");
    call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "eu-west-1"}"#).await;
    let retire_now = r#"{"confirm": "eu-west-1", "now": true}"#;
    let (status, body) = call(&s, Method::POST, "/v1/regions/eu-west-1:retire", Some(TOKEN), retire_now).await;
    assert_eq!((status, body["status"].clone()), (StatusCode::OK, json!("retired")));
    assert_eq!(body["retired_at"], "2026-11-18T11:06:40.000Z");
    let (status, body) = call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "eu-west-1"}"#).await;
    assert_eq!((status, body["number"].clone()), (StatusCode::CREATED, json!(2)), "a retired number is never reused");
    let (status, body) = call(&s, Method::GET, "/v1/regions", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["regions"].as_array().unwrap().len(), 3);
    assert_eq!((body["numbers_left"].clone(), body["numbers_total"].clone()), (json!(5), json!(8)));
    let (_, audit) = call(&s, Method::GET, "/v1/audit", Some(TOKEN), "").await;
    assert_eq!(audit["writes"].as_array().unwrap().len(), 4);
    assert!(audit["writes"].as_array().unwrap().iter().all(|w| w["actor"] == "alice"));
}

#[tokio::test]
async fn bad_region_requests_change_nothing() {
    let (s, _dir) = state().await;
    call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    let before = call(&s, Method::GET, "/v1/regions", None, "").await.1;
    assert_error(
        call(&s, Method::POST, "/v1/regions", None, r#"{"name": "x-1"}"#).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions", Some("wrong-token-wrong-token"), r#"{"name": "x-1"}"#).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    for (bad, code) in [
        ("", "invalid_json"),
        ("garbage", "invalid_json"),
        ("[]", "invalid_body"),
        (r#"{"name": 5}"#, "invalid_field"),
        (r#"{"name": ""}"#, "invalid_region_name"),
        (r#"{"name": "Bad Name"}"#, "invalid_region_name"),
        (r#"{"name": "x", "extra": 1}"#, "unknown_field"),
        (r#"{}"#, "missing_field"),
        (r#"{"name": "x", "lease_tables": null}"#, "invalid_field"),
        (r#"{"name": "x", "lease_tables": {"v2": 5}}"#, "invalid_field"),
        (r#"{"name": "x", "lease_tables": {"v2": "leases-audit"}}"#, "invalid_table_name"),
    ] {
        assert_error(call(&s, Method::POST, "/v1/regions", Some(TOKEN), bad).await, StatusCode::BAD_REQUEST, code);
    }
    let huge = format!(r#"{{"name": "{}"}}"#, "a".repeat(10_000));
    assert_error(
        call(&s, Method::POST, "/v1/regions", Some(TOKEN), &huge).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await,
        StatusCode::CONFLICT,
        "name_exists",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions/nowhere-1:retire", Some(TOKEN), r#"{"confirm": "nowhere-1"}"#).await,
        StatusCode::NOT_FOUND,
        "unknown_region",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions/us-east-1:retire", None, r#"{"confirm": "us-east-1"}"#).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions/us-east-1:delete", Some(TOKEN), "").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        call(&s, Method::DELETE, "/v1/regions", Some(TOKEN), "").await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
    assert_eq!(call(&s, Method::GET, "/v1/regions", None, "").await.1, before, "nothing changed");
    // All eight numbers used: the ninth region is refused.
    for n in 1..8 {
        call(&s, Method::POST, "/v1/regions", Some(TOKEN), &format!(r#"{{"name": "r{n}"}}"#)).await;
    }
    assert_error(
        call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "r8"}"#).await,
        StatusCode::CONFLICT,
        "no_number_left",
    );
}

#[tokio::test]
async fn the_schedule_is_published_and_validated() {
    let (s, _dir) = state().await;
    let (status, body) = call(&s, Method::GET, "/v1/layouts", None, "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body["layouts"][0],
        json!({"name": "v1", "region_bits": 0, "machine_bits": 10, "sequence_bits": 12, "from": "2026-01-01T00:00:00.000Z", "from_ms": 0})
    );
    assert_eq!(body["layouts"][1]["from"], "2028-01-01T00:00:00.000Z");
    assert_eq!(body["layouts"][1]["from_ms"], 63_072_000_000u64);
    assert_eq!(body["horizon"], "2026-12-18T11:06:40.000Z", "now + 30 days");
    assert_eq!(body["home_region"], "us-east-1");
    // SPEC §1's test vectors decode exactly through the published schedule.
    let entries = body["layouts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| idgen_core::ScheduleEntry {
            layout: idgen_core::Layout::new(
                l["name"].as_str().unwrap(),
                l["region_bits"].as_u64().unwrap() as u8,
                l["machine_bits"].as_u64().unwrap() as u8,
                l["sequence_bits"].as_u64().unwrap() as u8,
            )
            .unwrap(),
            from: idgen_core::Timestamp::from_millis(l["from_ms"].as_u64().unwrap()).unwrap(),
        })
        .collect();
    let schedule = idgen_core::Schedule::new(entries, body["horizon_ms"].as_u64().unwrap()).unwrap();
    let v1 = schedule.decode(97_301_141_913_751_557).unwrap();
    assert_eq!((v1.layout.name(), v1.machine, v1.sequence), ("v1", 37, 5));
    assert_eq!(idgen_core::format_unix_ms(v1.timestamp.unix_ms()), "2026-09-26T12:00:00.000Z");
    let v2 = schedule.decode(683_244_571_854_022_659).unwrap();
    assert_eq!((v2.layout.name(), v2.region_number, v2.machine, v2.sequence), ("v2", Some(2), 170, 3));
    assert_eq!(idgen_core::format_unix_ms(v2.timestamp.unix_ms()), "2031-03-01T09:30:00.000Z");
    let before = body;

    let v3 = |from: &str| {
        format!(r#"{{"name": "v3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 10, "from": "{from}"}}"#)
    };
    assert_error(
        call(&s, Method::POST, "/v1/layouts", None, &v3("2030-01-01T00:00:00Z")).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    for (bad, code) in [
        ("garbage".to_owned(), "invalid_json"),
        (r#"{"name": "v3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 11, "from": "2030-01-01T00:00:00Z"}"#.to_owned(), "invalid_layout"),
        (r#"{"name": "v3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 10}"#.to_owned(), "missing_field"),
        (r#"{"name": "v3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 10, "from": "2030-01-01T00:00:00Z", "from_ms": 5}"#.to_owned(), "conflicting_fields"),
        (r#"{"name": "v3", "region_bits": -1, "machine_bits": 8, "sequence_bits": 10, "from": "2030-01-01T00:00:00Z"}"#.to_owned(), "invalid_layout"),
        (r#"{"name": "v3", "region_bits": 4.5, "machine_bits": 7.5, "sequence_bits": 10, "from": "2030-01-01T00:00:00Z"}"#.to_owned(), "invalid_layout"),
        (r#"{"name": "V 3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 10, "from": "2030-01-01T00:00:00Z"}"#.to_owned(), "invalid_layout"),
        (r#"{"name": "v3", "machine_bits": 8, "sequence_bits": 10, "from": "2030-01-01T00:00:00Z"}"#.to_owned(), "missing_field"),
        (r#"{"name": "v3", "region_bits": 4, "machine_bits": 8, "sequence_bits": 10, "from_ms": "5"}"#.to_owned(), "invalid_time"),
        (v3("2030-01-01"), "invalid_time"),
        (v3("2025-06-01T00:00:00Z"), "invalid_time"),
    ] {
        assert_error(call(&s, Method::POST, "/v1/layouts", Some(TOKEN), &bad).await, StatusCode::BAD_REQUEST, code);
    }
    assert_error(
        call(&s, Method::POST, "/v1/layouts", Some(TOKEN), &v3("2026-12-01T00:00:00Z")).await,
        StatusCode::CONFLICT,
        "schedule_conflict",
    );
    assert_error(
        call(&s, Method::POST, "/v1/layouts", Some(TOKEN), &v3("2027-06-01T00:00:00Z")).await,
        StatusCode::CONFLICT,
        "schedule_conflict",
    );
    assert_error(
        call(&s, Method::POST, "/v1/layouts", Some(TOKEN), &v3("2096-01-01T00:00:00Z")).await,
        StatusCode::CONFLICT,
        "schedule_conflict",
    );
    assert_eq!(call(&s, Method::GET, "/v1/layouts", None, "").await.1, before, "nothing changed");

    // Whole numbers however written (4.0, 8e0): JSON Schema's integers, and the document's.
    let whole = r#"{"name": "v3", "region_bits": 4.0, "machine_bits": 8e0, "sequence_bits": 10, "from": "2040-01-01T00:00:00Z"}"#;
    let (status, body) = call(&s, Method::POST, "/v1/layouts", Some(TOKEN), whole).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["layouts"][2]["name"], "v3");
    assert_error(
        call(&s, Method::POST, "/v1/layouts", Some(TOKEN), &v3("2050-01-01T00:00:00Z")).await,
        StatusCode::CONFLICT,
        "layout_exists",
    );
}

/// The clock of the retirement test: it moves past the grace.
static CLOCK: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(1_795_000_000_000);

fn moving_now() -> i64 {
    CLOCK.load(std::sync::atomic::Ordering::SeqCst)
}

/// A retirement names its region twice, takes effect a grace after it is asked for (or later, or
/// at once for a region already dead), keeps the region active until then, and can be cancelled
/// until then. Every refused request changes nothing.
#[tokio::test]
async fn a_retirement_waits_out_the_grace_and_can_be_cancelled_until_then() {
    let (mut s, _dir) = state().await;
    s.now = moving_now;
    let now = moving_now();
    for name in ["us-east-1", "eu-west-1", "ap-south-1", "sa-east-1"] {
        call(&s, Method::POST, "/v1/regions", Some(TOKEN), &format!(r#"{{"name": "{name}"}}"#)).await;
    }
    let before = call(&s, Method::GET, "/v1/regions", None, "").await.1;
    let retire = "/v1/regions/eu-west-1:retire";
    let in_grace = idgen_core::format_unix_ms(now + DAY - 1);
    for (bad, says, code) in [
        ("", "confirm", "invalid_json"),
        ("{}", "confirm", "unconfirmed"),
        (r#"{"confirm": "eu-west-2"}"#, "must be the same", "confirm_mismatch"),
        (r#"{"confirm": 7}"#, "confirm", "invalid_field"),
        (r#"{"confirm": "eu-west-1", "now": "yes"}"#, "a boolean", "invalid_field"),
        (r#"{"confirm": "eu-west-1", "now": null}"#, "a boolean", "invalid_field"),
        (r#"{"confirm": "eu-west-1", "now": true, "at": "2030-01-01T00:00:00Z"}"#, "not both", "conflicting_fields"),
        (r#"{"confirm": "eu-west-1", "at": "tomorrow"}"#, "UTC time", "invalid_time"),
        (
            &format!(r#"{{"confirm": "eu-west-1", "at": "{in_grace}"}}"#),
            "the earliest is 2026-11-19T11:06:40.000Z",
            "retire_too_soon",
        ),
        (r#"{"confirm": "eu-west-1", "reason": "typo"}"#, "unknown field", "unknown_field"),
    ] {
        let got = call(&s, Method::POST, retire, Some(TOKEN), bad).await;
        assert!(got.1["error"]["message"].as_str().unwrap().contains(says), "{bad}: {}", got.1);
        assert_error(got, StatusCode::BAD_REQUEST, code);
    }
    assert_eq!(call(&s, Method::GET, "/v1/regions", None, "").await.1, before, "nothing changed");

    // Asked for: 202, still active, retiring a grace from now.
    let (status, body) = call(&s, Method::POST, retire, Some(TOKEN), r#"{"confirm": "eu-west-1"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        (body["status"].clone(), body["retires_at"].clone()),
        (json!("active"), json!("2026-11-19T11:06:40.000Z"))
    );
    // Later than the grace, as asked.
    let at = r#"{"confirm": "ap-south-1", "at": "2027-01-01T00:00:00Z"}"#;
    let (status, body) = call(&s, Method::POST, "/v1/regions/ap-south-1:retire", Some(TOKEN), at).await;
    assert_eq!((status, body["retires_at"].clone()), (StatusCode::ACCEPTED, json!("2027-01-01T00:00:00.000Z")));
    let listed = call(&s, Method::GET, "/v1/regions", None, "").await.1;
    assert_eq!(listed["regions"][1]["status"], "active", "{listed}");
    assert_eq!(listed["regions"][1]["retires_at"], "2026-11-19T11:06:40.000Z", "{listed}");
    assert!(listed["regions"][1].get("retired_at").is_none(), "{listed}");
    assert_error(
        call(&s, Method::POST, retire, Some(TOKEN), r#"{"confirm": "eu-west-1"}"#).await,
        StatusCode::CONFLICT,
        "retire_pending",
    );

    // Cancelled while ahead: the region without "retires_at"; then nothing is pending.
    let cancel = "/v1/regions/ap-south-1:cancel-retire";
    for (bad, status, code) in [
        ("", StatusCode::BAD_REQUEST, "invalid_json"),
        (r#"{"confirm": "eu-west-1"}"#, StatusCode::BAD_REQUEST, "confirm_mismatch"),
        (r#"{"confirm": "ap-south-1", "now": true}"#, StatusCode::BAD_REQUEST, "unknown_field"),
    ] {
        assert_error(call(&s, Method::POST, cancel, Some(TOKEN), bad).await, status, code);
    }
    assert_error(
        call(&s, Method::POST, cancel, None, r#"{"confirm": "ap-south-1"}"#).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    let (status, body) = call(&s, Method::POST, cancel, Some(TOKEN), r#"{"confirm": "ap-south-1"}"#).await;
    assert_eq!((status, body["status"].clone()), (StatusCode::OK, json!("active")), "{body}");
    assert!(body.get("retires_at").is_none(), "{body}");
    assert_error(
        call(&s, Method::POST, cancel, Some(TOKEN), r#"{"confirm": "ap-south-1"}"#).await,
        StatusCode::CONFLICT,
        "no_retirement_pending",
    );
    assert_error(
        call(&s, Method::POST, "/v1/regions/nowhere-1:cancel-retire", Some(TOKEN), r#"{"confirm": "nowhere-1"}"#).await,
        StatusCode::NOT_FOUND,
        "unknown_region",
    );

    // At once, for a region already dead: 200, retired.
    let (status, body) =
        call(&s, Method::POST, "/v1/regions/sa-east-1:retire", Some(TOKEN), r#"{"confirm": "sa-east-1", "now": true}"#)
            .await;
    assert_eq!((status, body["status"].clone()), (StatusCode::OK, json!("retired")), "{body}");

    // The grace over: eu-west-1 reads as retired from its time, without a write, and can no
    // longer be cancelled.
    CLOCK.store(now + DAY, std::sync::atomic::Ordering::SeqCst);
    let listed = call(&s, Method::GET, "/v1/regions", None, "").await.1;
    assert_eq!(listed["regions"][1]["status"], "retired", "{listed}");
    assert_eq!(listed["regions"][1]["retired_at"], "2026-11-19T11:06:40.000Z", "{listed}");
    assert!(listed["regions"][1].get("retires_at").is_none(), "{listed}");
    assert_eq!(listed["numbers_left"], 4, "the retired numbers stay taken");
    assert_error(
        call(&s, Method::POST, "/v1/regions/eu-west-1:cancel-retire", Some(TOKEN), r#"{"confirm": "eu-west-1"}"#).await,
        StatusCode::CONFLICT,
        "already_retired",
    );
    let (_, audit) = call(&s, Method::GET, "/v1/audit", Some(TOKEN), "").await;
    let actions: Vec<&str> =
        audit["writes"].as_array().unwrap().iter().map(|w| w["action"].as_str().unwrap()).collect();
    assert_eq!(actions[..4], ["retire_region", "cancel_retire", "schedule_retire", "schedule_retire"], "{audit}");
    assert!(audit["writes"].as_array().unwrap().iter().all(|w| w["actor"] == "alice"));
}

/// v1 has no region bits: only the home region issues under it, so the home region is not
/// retired while v1 is in force (until 2028-01-01), whether at once or after the grace.
#[tokio::test]
async fn the_home_region_is_not_retired_while_only_it_issues() {
    let (s, _dir) = state().await;
    call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    let before = call(&s, Method::GET, "/v1/regions", None, "").await.1;
    for body in [r#"{"confirm": "us-east-1"}"#, r#"{"confirm": "us-east-1", "now": true}"#] {
        let got = call(&s, Method::POST, "/v1/regions/us-east-1:retire", Some(TOKEN), body).await;
        let message = got.1["error"]["message"].as_str().unwrap().to_owned();
        assert_error(got, StatusCode::CONFLICT, "home_region_in_use");
        assert!(message.contains("home region") && message.contains("v1"), "{message}");
        assert!(message.contains("until 2028-01-01T00:00:00.000Z"), "{message}");
    }
    assert_eq!(call(&s, Method::GET, "/v1/regions", None, "").await.1, before, "nothing changed");
}

/// An operator named by its client certificate writes without a token, when the operator CA issued
/// it; the same name on a certificate of the callers' CA is refused (403) and counted, with or
/// without a token, and any other caller without a token gets 401.
#[tokio::test]
async fn a_certificate_operator_writes_without_a_token_only_from_the_operator_ca() {
    let (s, _dir) = state().await;
    let as_caller = |caller: idgen_server::Caller, token: Option<&str>, body: &'static str| {
        let mut request = Request::builder().method(Method::POST).uri("/v1/regions");
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut request = request.body(Body::from(body)).unwrap();
        request.extensions_mut().insert(caller);
        router(s.clone()).oneshot(request)
    };
    let from_callers_ca = idgen_server::Caller::named("ops-bot");
    for token in [None, Some(TOKEN)] {
        let response = as_caller(from_callers_ca.clone(), token, r#"{"name": "us-east-1"}"#).await.unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "token {token:?}");
        let body: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert_eq!(body["error"]["code"], "not_an_operator_certificate", "{body}");
    }
    assert_eq!(s.refusals.count("not_an_operator_certificate"), 2);
    assert_eq!(call(&s, Method::GET, "/v1/regions", None, "").await.1["regions"], json!([]), "nothing written");

    let operator = idgen_server::Caller::with_operator_certificate("ops-bot");
    let response = as_caller(operator, None, r#"{"name": "us-east-1"}"#).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = as_caller(idgen_server::Caller::named("orders"), None, r#"{"name": "eu-west-1"}"#).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(s.refusals.count("no_credentials"), 1);
    // An operator CA's certificate not listed is no operator either.
    let unlisted = idgen_server::Caller::with_operator_certificate("someone");
    assert_eq!(as_caller(unlisted, None, r#"{"name": "eu-west-1"}"#).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let (_, audit) = call(&s, Method::GET, "/v1/audit", Some(TOKEN), "").await;
    assert!(audit.to_string().contains("ops-bot"), "the write is recorded with the operator: {audit}");
}

/// `GET /openapi.json` serves the checked-in `docs/openapi/registry.json`, which names exactly the
/// router's routes (`/v1/regions/{action}` is documented as what it is, `{name}:retire` and
/// `{name}:cancel-retire`); every
/// method a path does not take gets the documented 405 with an `Allow` of the ones it does; and
/// what each operation answers a plain request with is documented.
#[tokio::test]
async fn the_openapi_document_is_the_checked_in_one_and_names_every_route() {
    use idgen_test_support::openapi;
    let (s, _dir) = state().await;
    let metrics = idgen_server::ServiceMetrics::new(Default::default(), &idgen_registry::ROUTES, || {});
    let app = idgen_server::http_metrics::with_metrics(router(s.clone()), metrics);
    let send = |method: Method, uri: String, token: Option<&str>| {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request.body(Body::from(r#"{"name": "eu-west-1"}"#)).unwrap();
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap() }
    };
    let response = send(Method::GET, "/openapi.json".into(), None).await;
    assert_eq!(response.headers()["content-type"], "application/json");
    let served: Value = serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi/registry.json");
    let operations = openapi::operations(&served, file, &idgen_registry::ROUTES, |path| {
        path.replace("{name}:cancel-retire", "{action}")
            .replace("{name}:retire", "{action}")
            .replace("{name}:move-lease-table", "{action}")
            .replace("{name}:record-lease-table", "{action}")
    });
    for (path, item) in served["paths"].as_object().unwrap() {
        let methods: Vec<String> = item.as_object().unwrap().keys().map(|m| m.to_uppercase()).collect();
        let methods: Vec<&str> = methods.iter().map(String::as_str).collect();
        let uri = path.replace("{name}", "eu-west-1");
        for other in openapi::undocumented(&methods) {
            let response = send(Method::from_bytes(other.as_bytes()).unwrap(), uri.clone(), Some(TOKEN)).await;
            assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{other} {path}");
            assert_eq!(response.headers()["allow"], openapi::allow(&methods).as_str(), "{other} {path}");
        }
    }
    for operation in &operations {
        let uri = operation.path.replace("{name}", "eu-west-1");
        for token in [Some(TOKEN), None] {
            let method = Method::from_bytes(operation.method.as_bytes()).unwrap();
            let status = send(method, uri.clone(), token).await.status();
            assert!(
                operation.responses[status.as_str()].is_object(),
                "{} {} (token {token:?}): {status} is not documented",
                operation.method,
                operation.path
            );
        }
    }
}

/// `GET /console` and its two assets: the right types, a policy that allows only the registry's
/// own files and API, and a script that names no other origin.
#[tokio::test]
async fn the_console_is_served_with_its_assets_under_a_strict_policy() {
    let (s, _dir) = state().await;
    let get = |uri: &'static str| {
        let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let app = router(s.clone());
        async move {
            let response = app.oneshot(request).await.unwrap();
            let headers = response.headers().clone();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (headers, String::from_utf8(body.to_vec()).unwrap())
        }
    };
    let (headers, page) = get("/console").await;
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let policy = headers["content-security-policy"].to_str().unwrap();
    for directive in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert!(page.contains(r#"src="/console/console.js""#) && page.contains(r#"href="/console/console.css""#));
    let (headers, script) = get("/console/console.js").await;
    assert_eq!(headers["content-type"], "text/javascript; charset=utf-8");
    let origins: Vec<&str> =
        script.match_indices("http").map(|(i, _)| &script[i..(i + 40).min(script.len())]).collect();
    assert!(
        origins.iter().all(|o| o.starts_with("http://www.w3.org/2000/svg")),
        "the script names another origin: {origins:?}"
    );
    let (headers, _) = get("/console/console.css").await;
    assert_eq!(headers["content-type"], "text/css; charset=utf-8");
}

/// A browser holding an operator's client certificate would send it with another site's form
/// post too: operator requests that a browser says come from another site are refused (403
/// `cross_site`) whatever they carry, and change nothing. Same-origin requests (the console) and
/// requests without those headers (the CLI, curl) are not affected.
#[tokio::test]
async fn operator_requests_from_another_sites_page_are_refused() {
    let (s, _dir) = state().await;
    let post = |headers: &'static [(&'static str, &'static str)]| {
        let mut request = Request::builder().method(Method::POST).uri("/v1/regions");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(Body::from(r#"{"name": "eu-west-1"}"#))
            .unwrap();
        let app = router(s.clone());
        async move {
            let response = app.oneshot(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null))
        }
    };
    for headers in [
        &[("sec-fetch-site", "cross-site")][..],
        &[("sec-fetch-site", "same-site")],
        &[("origin", "https://evil.example"), ("host", "registry.internal:8700")],
        &[("origin", "null"), ("host", "registry.internal:8700")],
    ] {
        assert_error(post(headers).await, StatusCode::FORBIDDEN, "cross_site");
    }
    assert_eq!(call(&s, Method::GET, "/v1/regions", None, "").await.1["regions"], json!([]), "nothing changed");
    let same_origin = &[("sec-fetch-site", "same-origin"), ("origin", "http://registry.internal:8700")][..];
    assert_eq!(post(same_origin).await.0, StatusCode::CREATED);
    let old_browser = &[("origin", "http://registry.internal:8700"), ("host", "registry.internal:8700")][..];
    assert_error(post(old_browser).await, StatusCode::CONFLICT, "name_exists");
}

#[tokio::test]
async fn a_regions_lease_table_identity_is_recorded_once_and_another_refused() {
    let (s, _dir) = state().await;
    call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    let body = |id: &str| {
        format!(r#"{{"confirm": "us-east-1", "layout": "v1", "table": "idgen-leases", "table_id": "{id}"}}"#)
    };
    let path = "/v1/regions/us-east-1:record-lease-table";
    // An operator's write.
    assert_error(
        call(&s, Method::POST, path, None, &body("0123456789abcdef0123")).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    let (status, first) = call(&s, Method::POST, path, Some(TOKEN), &body("0123456789abcdef0123")).await;
    assert_eq!((status, first["recorded"].clone()), (StatusCode::OK, json!(true)), "{first}");
    assert_eq!(first["lease_tables"]["v1"]["table_id"], "0123456789abcdef0123");
    let (status, again) = call(&s, Method::POST, path, Some(TOKEN), &body("0123456789abcdef0123")).await;
    assert_eq!((status, again["recorded"].clone()), (StatusCode::OK, json!(false)));
    let second = call(&s, Method::POST, path, Some(TOKEN), &body("fedcba98765432100000")).await;
    assert_error(second.clone(), StatusCode::CONFLICT, "lease_table_identity");
    assert!(second.1["error"]["message"].as_str().unwrap().contains("move-lease-table"), "{}", second.1);
    assert_error(
        call(&s, Method::POST, path, Some(TOKEN), &body("NOT-HEX")).await,
        StatusCode::BAD_REQUEST,
        "invalid_table_id",
    );
    let unconfirmed = r#"{"layout": "v1", "table": "idgen-leases", "table_id": "0123456789abcdef0123"}"#;
    assert_error(call(&s, Method::POST, path, Some(TOKEN), unconfirmed).await, StatusCode::BAD_REQUEST, "unconfirmed");
    // The list shows it; a move may name the adopted table's.
    let (_, list) = call(&s, Method::GET, "/v1/regions", None, "").await;
    assert_eq!(list["regions"][0]["lease_tables"]["v1"]["table_id"], "0123456789abcdef0123");
    let moved = r#"{"confirm": "us-east-1", "layout": "v1", "from": "idgen-leases", "to": "idgen-leases-2", "table_id": "aaaaaaaaaaaaaaaaaaaa"}"#;
    let (status, body) = call(&s, Method::POST, "/v1/regions/us-east-1:move-lease-table", Some(TOKEN), moved).await;
    assert_eq!(
        (status, body["lease_tables"]["v1"]["table_id"].clone()),
        (StatusCode::OK, json!("aaaaaaaaaaaaaaaaaaaa"))
    );
}

#[tokio::test]
async fn a_number_reported_in_use_elsewhere_is_withheld_from_regions_add() {
    let (s, _dir) = state().await;
    call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    let until = fixed_now() + DAY;
    let report = |number: u32| {
        format!(
            r#"{{"registry_id": "0ldregistry", "region": "eu-west-1", "region_number": {number}, "issues_until_ms": {until}}}"#
        )
    };
    // Open, as reads are: the generators that report hold no operator credential.
    let (status, body) = call(&s, Method::POST, "/v1/numbers-in-use", None, &report(1)).await;
    assert_eq!((status, body["withheld"].clone()), (StatusCode::ACCEPTED, json!(true)), "{body}");
    let (_, list) = call(&s, Method::GET, "/v1/regions", None, "").await;
    assert_eq!(list["numbers_in_use_elsewhere"][0]["number"], 1, "{list}");
    let (status, added) = call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "ap-south-1"}"#).await;
    assert_eq!((status, added["number"].clone()), (StatusCode::CREATED, json!(2)), "{added}");
    // A number no scheduled layout has yet (v2's region field is 3 bits) is withheld all the
    // same, against a layout added later with a wider field.
    let (status, body) = call(&s, Method::POST, "/v1/numbers-in-use", None, &report(99)).await;
    assert_eq!((status, body["withheld"].clone()), (StatusCode::ACCEPTED, json!(true)), "{body}");
    // Bad reports change nothing: a number wider than any layout's region field among them.
    for bad in [
        report(8).replace("\"region_number\": 8", "\"region_number\": 1048576"),
        report(1).replace("0ldregistry", "no/thing"),
        report(1).replace("eu-west-1", "EU"),
        report(1).replace(&until.to_string(), "\"soon\""),
    ] {
        let (status, body) = call(&s, Method::POST, "/v1/numbers-in-use", None, &bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
}

#[tokio::test]
async fn a_new_registry_refuses_regions_add_while_generators_may_still_report() {
    let (mut s, _dir) = state().await;
    // `state` opened a registry made now (by this machine's clock): quiet for a minute.
    s.new_registry_quiet_ms = 3_600_000;
    s.now = idgen::system_unix_ms;
    let quiet = call(&s, Method::POST, "/v1/regions", Some(TOKEN), r#"{"name": "us-east-1"}"#).await;
    assert_error(quiet, StatusCode::SERVICE_UNAVAILABLE, "registry_quiet");
}
