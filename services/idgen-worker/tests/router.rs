//! Every endpoint through the router, in-process (`oneshot`), including every kind of bad input.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use idgen::core::{Generator, GeneratorConfig, Lease, OPEN_HORIZON, Schedule};
use idgen::{Clock, GeneratorMetrics, IdGenerator, ManualClock, SyncStatus};
use idgen_worker::{AppState, app};
use prometheus_client::registry::Registry;
use serde_json::Value;
use tower::ServiceExt;

const NOW: i64 = 1_790_424_000_000; // 2026-09-26T12:00:00Z

struct Fixture {
    state: AppState,
    clock: Arc<ManualClock>,
}

fn fixture() -> Fixture {
    fixture_in(true)
}

/// A worker of region 2, `home` or not, at `NOW` with a v1 lease (which only the home region
/// can use).
fn fixture_in(home: bool) -> Fixture {
    let clock = Arc::new(ManualClock::new(NOW));
    let mut core =
        Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 2, home)
            .unwrap();
    core.install_lease(Lease {
        layout: "v1".into(),
        machine: 37,
        epoch: 1,
        expiry_unix_ms: NOW + 300_000,
        floor_unix_ms: NOW,
    })
    .unwrap();
    let mut registry = Registry::default();
    let metrics = Arc::new(GeneratorMetrics::default());
    metrics.register(&mut registry);
    let generator = Arc::new(IdGenerator::new(core, clock.clone(), metrics));
    let state = AppState::new(idgen_worker::api::Shared {
        generator: generator.clone(),
        region_names: Arc::new(std::sync::RwLock::new(HashMap::from([(2, "eu-west-1".to_owned())]))),
        region: "eu-west-1".into(),
        region_number: 2,
        holder: "test/pid-1/1".into(),
        development: false,
        quotas: Arc::new(idgen_server::Quotas::new(&Default::default(), Arc::default()).unwrap()),
        metrics: idgen_worker::service_metrics(registry, generator.clone()),
    });
    Fixture { state, clock }
}

async fn call(
    f: &Fixture,
    method: Method,
    uri: &str,
    body: impl Into<Body>,
) -> (StatusCode, axum::http::HeaderMap, Value, String) {
    let request = Request::builder().method(method).uri(uri).body(body.into()).unwrap();
    let response = app(f.state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null), text)
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
}

fn ids_of(body: &Value) -> Vec<u64> {
    body["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().parse().unwrap()).collect()
}

#[tokio::test]
async fn one_id_matches_the_spec_example() {
    let f = fixture();
    for _ in 0..5 {
        call(&f, Method::POST, "/v1/ids", "").await;
    }
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids", "{}").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["id"], "97301141913751557");
    assert_eq!(body["id_num"].as_u64(), Some(97_301_141_913_751_557));
}

#[tokio::test]
async fn create_id_rejects_bad_bodies() {
    let f = fixture();
    let refused = [
        ("garbage", "invalid_json"),
        ("{", "invalid_json"),
        (" ", "invalid_json"),
        ("[]", "invalid_body"),
        ("null", "invalid_body"),
        ("\"{}\"", "invalid_body"),
        ("{\"count\": 5}", "unknown_field"),
    ];
    for (bad, code) in refused {
        let (status, _, body, _) = call(&f, Method::POST, "/v1/ids", bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids", vec![b' '; 5000]).await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    // Nothing was issued by any of those: the next ID is the millisecond's first.
    let (_, _, body, _) = call(&f, Method::POST, "/v1/ids", "").await;
    assert_eq!(body["id_num"].as_u64().unwrap() & 0xfff, 0);
}

#[tokio::test]
async fn batch_is_strictly_increasing_and_count_is_checked() {
    let f = fixture();
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 1000}"#).await;
    assert_eq!(status, StatusCode::OK);
    let ids = ids_of(&body);
    assert_eq!(ids.len(), 1000);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));

    for bad in [
        r#"{"count": 0}"#,
        r#"{"count": 1001}"#,
        r#"{"count": 1e4}"#,
        r#"{"count": 2.5}"#,
        r#"{"count": -1}"#,
        r#"{"count": "10"}"#,
        r#"{"count": 1.5}"#,
        r#"{"count": null}"#,
        "{}",
        "",
    ] {
        let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_count");
    }
    for (bad, code) in
        [("garbage", "invalid_json"), (r#"{"count": 5, "extra": 1}"#, "unknown_field"), ("[5]", "invalid_body")]
    {
        let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, code);
    }
    let huge = format!(r#"{{"count": 5, "pad": "{}"}}"#, "x".repeat(10_000));
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", huge).await;
    assert_error(status, &body, StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
    // None of the bad requests used a sequence number.
    let (_, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 1}"#).await;
    assert_eq!(ids_of(&body)[0] & 0xfff, 1000);
    // A whole number is an integer however it is written (JSON Schema's reading, and the
    // document's): 3.0 and 3e0 are 3.
    for three in [r#"{"count": 3.0}"#, r#"{"count": 3e0}"#] {
        let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", three).await;
        assert_eq!((status, ids_of(&body).len()), (StatusCode::OK, 3), "{three}");
    }
}

#[tokio::test]
async fn a_batch_past_the_millisecond_spills_into_the_next() {
    let f = fixture();
    for _ in 0..4 {
        let (status, _, _, _) = call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 1000}"#).await;
        assert_eq!(status, StatusCode::OK);
    }
    // 4,000 of 4,096 used in this millisecond: the next batch needs the next millisecond.
    let clock = f.clock.clone();
    let advance = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        clock.advance(1);
    });
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 1000}"#).await;
    advance.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let ids = ids_of(&body);
    assert_eq!(ids[95] & 0xfff, 4095, "the first 96 finish the old millisecond");
    assert_eq!((ids[96] >> 22) - (ids[95] >> 22), 1, "the rest go into the next");
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test]
async fn decode_returns_the_spec_fields() {
    let f = fixture();
    let (status, _, body, _) = call(&f, Method::GET, "/v1/ids/97301141913751557/decode", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        serde_json::json!({"id": "97301141913751557", "layout": "v1", "created_at": "2026-09-26T12:00:00.000Z", "machine": 37, "sequence": 5})
    );
    let (status, _, body, _) = call(&f, Method::GET, "/v1/ids/683244571854022659/decode", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        serde_json::json!({"id": "683244571854022659", "layout": "v2", "created_at": "2031-03-01T09:30:00.000Z",
                           "region": "eu-west-1", "region_number": 2, "machine": 170, "sequence": 3})
    );
}

#[tokio::test]
async fn decode_rejects_bad_ids() {
    let f = fixture();
    for bad in [
        "9223372036854775808",
        "18446744073709551616",
        "123456789012345678901234567890",
        "-1",
        "abc",
        "12a",
        "0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f0g0h",
        "0190a0b0-c0d0-4e0f-8a0b-0c0d0e0f0a0b",
        "not-a-uuid",
        "%FF%FE",
    ] {
        let (status, _, body, _) = call(&f, Method::GET, &format!("/v1/ids/{bad}/decode"), "").await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_id");
    }
}

#[tokio::test]
async fn uuids_are_v7_increasing_and_decode() {
    let f = fixture();
    let (status, _, body, _) = call(&f, Method::POST, "/v1/uuids", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["ids"].as_array().unwrap().len(), 1);
    let (status, _, body, _) = call(&f, Method::POST, "/v1/uuids", r#"{"count": 1000}"#).await;
    assert_eq!(status, StatusCode::OK);
    let uuids: Vec<String> = body["ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
    assert_eq!(uuids.len(), 1000);
    assert!(uuids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(&uuids[0][14..15], "7");
    let (status, _, body, _) = call(&f, Method::GET, &format!("/v1/ids/{}/decode", uuids[0]), "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, serde_json::json!({"id": uuids[0], "layout": "uuidv7", "created_at": "2026-09-26T12:00:00.000Z"}));
    for bad in [r#"{"count": 0}"#, r#"{"count": 1001}"#, r#"{"count": "1"}"#] {
        let (status, _, body, _) = call(&f, Method::POST, "/v1/uuids", bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_count");
    }
    let (status, _, body, _) = call(&f, Method::POST, "/v1/uuids", "nonsense").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "invalid_json");
}

#[tokio::test]
async fn refusals_are_503_with_reason_and_retry_after() {
    let f = fixture();
    let (status, _, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok");
    assert_eq!(body["leases"][0]["machine"], 37);
    assert_eq!(body["clock"]["sync_check"], "disabled (development only)");

    // Inside the fence.
    f.clock.set(NOW + 295_000);
    let (status, headers, body, _) = call(&f, Method::POST, "/v1/ids", "").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "lease");
    assert_eq!(headers["retry-after"], "1");
    let (status, headers, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reason"], "lease");
    assert!(body["message"].as_str().unwrap().contains("fence"));
    assert!(headers.contains_key("retry-after"));

    // Clock stepped back 2 s.
    f.clock.set(NOW + 10_000);
    call(&f, Method::POST, "/v1/ids", "").await;
    f.clock.set(NOW + 8_000);
    let (status, headers, body, _) = call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 3}"#).await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "clock_behind");
    assert_eq!(headers["retry-after"], "2");

    // Unsynchronized clock.
    f.clock.set(NOW + 10_001);
    f.clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    f.state.generator.with_core(|core| core.set_clock_unsynchronized(f.clock.sync_status().refusal()));
    let (status, _, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["reason"], "clock_unsynchronized");
    let (status, _, body, _) = call(&f, Method::POST, "/v1/uuids", "").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "clock_unsynchronized");

    // No lease at all.
    f.state.generator.with_core(|core| {
        core.set_clock_unsynchronized(None);
        core.drop_lease("v1")
    });
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids", "").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "lease");
}

/// Outside the home region before v2 (2028-01-01), every ID is refused by design: `/healthz`
/// answers 200 `standby` with when the region issues, ID requests get the 503 `schedule` they
/// always got, and `/metrics` says so. After the cutover, the same refusal is a fault again.
#[tokio::test]
async fn a_region_on_standby_answers_its_health_check_and_says_until_when() {
    let f = fixture_in(false);
    let (status, headers, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "standby", "{body}");
    assert_eq!(body["reason"], "schedule", "{body}");
    assert!(body["message"].as_str().unwrap().contains("not the home region"), "{body}");
    assert_eq!(body["issues_from"], "2028-01-01T00:00:00.000Z", "{body}");
    let v2_from = body["issues_from_ms"].as_i64().unwrap();
    assert_eq!(v2_from, 1_830_297_600_000);
    assert!(!headers.contains_key("retry-after"), "a healthy answer asks nobody to come back");
    let (status, _, body, _) = call(&f, Method::POST, "/v1/ids", "").await;
    assert_error(status, &body, StatusCode::SERVICE_UNAVAILABLE, "schedule");
    let (_, _, _, text) = call(&f, Method::GET, "/metrics", "").await;
    assert!(text.contains("idgen_region_standby 1\n"), "{text}");
    assert!(text.contains(r#"idgen_refusals_total{reason="schedule"} 1"#), "{text}");

    // A clock problem is a fault on standby too: 503 refusing.
    f.clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    f.state.generator.with_core(|core| core.set_clock_unsynchronized(f.clock.sync_status().refusal()));
    let (status, _, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("refusing")), "{body}");
    assert_eq!(body["reason"], "clock_unsynchronized", "{body}");
    let (_, _, _, text) = call(&f, Method::GET, "/metrics", "").await;
    assert!(text.contains("idgen_region_standby 0\n"), "{text}");
    f.clock.set_sync_status(SyncStatus::NotChecked);
    f.state.generator.with_core(|core| core.set_clock_unsynchronized(None));

    // Past the cutover with no v2 lease: refusing, the load balancer takes it out, alerts fire.
    f.clock.set(v2_from + 10);
    let (status, headers, body, _) = call(&f, Method::GET, "/healthz", "").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("refusing")), "{body}");
    assert_eq!(body["reason"], "lease", "{body}");
    assert!(body.get("issues_from").is_none(), "{body}");
    assert!(headers.contains_key("retry-after"));
    let (_, _, _, text) = call(&f, Method::GET, "/metrics", "").await;
    assert!(text.contains("idgen_region_standby 0\n"), "{text}");

    // The home region is never on standby.
    let (_, _, _, text) = call(&fixture(), Method::GET, "/metrics", "").await;
    assert!(text.contains("idgen_region_standby 0\n"), "{text}");
}

/// Every labelled counter an alert or the dashboard reads is on the first scrape, at 0: refusals
/// by reason, each layout's lease events, and requests by route and status for every status the
/// OpenAPI document gives the route's method.
#[tokio::test]
async fn labelled_counters_are_at_zero_from_the_first_scrape() {
    let f = fixture();
    let (_, _, _, text) = call(&f, Method::GET, "/metrics", "").await;
    for reason in ["lease", "clock_behind", "clock_unsynchronized", "schedule"] {
        let series = format!("idgen_refusals_total{{reason=\"{reason}\"}} 0\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
    for layout in ["v1", "v2"] {
        for event in idgen::metrics::LEASE_EVENTS {
            let series = format!("idgen_lease_events_total{{layout=\"{layout}\",event=\"{event}\"}} 0\n");
            assert!(text.contains(&series), "{series} missing from\n{text}");
        }
    }
    for (method, route, status) in [
        ("POST", "/v1/ids", 200),
        ("POST", "/v1/ids", 503),
        ("POST", "/v1/ids:batch", 429),
        ("GET", "/v1/ids/{id}/decode", 400),
        ("POST", "/v1/uuids", 503),
        ("GET", "/healthz", 200),
        ("GET", "/healthz", 503),
    ] {
        let series =
            format!("idgen_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} 0\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
    assert!(text.contains("idgen_http_request_duration_seconds_count{route=\"/healthz\"} 0\n"), "{text}");
    // 405 is what the other methods get: no series for the route's own method.
    assert!(!text.contains(r#"method="POST",route="/v1/ids",status="405""#), "{text}");
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let f = fixture();
    call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 10}"#).await;
    call(&f, Method::POST, "/v1/ids:batch", r#"{"count": 0}"#).await;
    f.clock.set(NOW + 299_999);
    call(&f, Method::POST, "/v1/ids", "").await;
    let (status, headers, _, text) = call(&f, Method::GET, "/metrics", "").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers["content-type"].to_str().unwrap().starts_with("application/openmetrics-text"));
    for needle in [
        "idgen_ids_issued_total 10",
        r#"idgen_refusals_total{reason="lease"} 1"#,
        r#"idgen_http_requests_total{method="POST",route="/v1/ids:batch",status="400"} 1"#,
        r#"idgen_http_requests_total{method="POST",route="/v1/ids:batch",status="200"} 1"#,
        "idgen_http_request_duration_seconds_bucket",
        r#"idgen_lease_machine_number{layout="v1"} 37"#,
        "idgen_lease_remaining_seconds",
        "idgen_clock_behind_events_total",
        "idgen_sequence_spills_total",
        "idgen_clock_synchronized -1",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

#[tokio::test]
async fn made_up_methods_do_not_grow_the_metric_labels() {
    let f = fixture();
    for i in 0..50 {
        let method = Method::from_bytes(format!("FOO{i}").as_bytes()).unwrap();
        let (status, _, body, _) = call(&f, method, "/v1/ids", "").await;
        assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    }
    let (_, _, _, text) = call(&f, Method::GET, "/metrics", "").await;
    assert!(!text.contains("FOO"), "{text}");
    assert!(text.contains(r#"idgen_http_requests_total{method="other",route="/v1/ids",status="405"} 50"#), "{text}");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let f = fixture();
    let (status, _, body, _) = call(&f, Method::GET, "/v1/nope", "").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, _, body, _) = call(&f, Method::GET, "/v1/ids", "").await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
    let (status, _, body, _) = call(&f, Method::DELETE, "/healthz", "").await;
    assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
}

/// The HTTP metrics name a request's route themselves (no layer on every route): for any path,
/// that must be the route axum matched, or `other` where axum falls back (as in every service).
#[tokio::test]
async fn the_metrics_route_label_is_the_route_axum_matches() {
    let paths = [
        "/v1/ids",
        "/v1/ids/",
        "/v1/ids:batch",
        "/v1/ids:batch/",
        "/v1/ids/1/decode",
        "/v1/ids//decode",
        "/v1/ids/a/b/decode",
        "/v1/ids/x/decode/",
        "/v1/ids/%2F/decode",
        "/V1/ids",
        "/healthz",
        "/healthz/",
        "/metrics",
        "/",
        "//v1/ids",
        "/v1/uuids",
        "/v1/idsx",
        "/v1/ids/decode",
        "/v1/ids/1/decodex",
        "/v1/ids/{id}/decode",
        "/v1/ids%3Abatch",
        "/v1/ids/:id/decode",
        "/v1/ids/*/decode",
    ];
    let segments = ["v1", "ids", "ids:batch", "uuids", "healthz", "metrics", "decode", "1", "", "x%20"];
    let f = fixture();
    idgen_test_support::routes::assert_labels_are_axums(
        &idgen_worker::ROUTES,
        idgen_worker::http_metrics::UNMATCHED,
        &paths,
        &segments,
        |path| f.state.metrics.route_of(path).to_owned(),
    )
    .await;
}

/// `GET /openapi.json` serves the checked-in `docs/openapi/worker.json`, which names exactly the
/// router's routes, each with the one method the router answers: another method is the
/// documented 405, and the status each route answers here is documented.
#[tokio::test]
async fn the_openapi_document_is_the_checked_in_one_and_names_every_route() {
    let f = fixture();
    let (status, headers, served, _) = call(&f, Method::GET, "/openapi.json", "").await;
    assert_eq!((status, headers["content-type"].to_str().unwrap()), (StatusCode::OK, "application/json"));
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi/worker.json");
    let operations = idgen_test_support::openapi::operations(&served, file, &idgen_worker::ROUTES, str::to_owned);
    assert_eq!(operations.len(), idgen_worker::ROUTES.len(), "one method per route");
    for operation in &operations {
        let path = &operation.path;
        let method = Method::from_bytes(operation.method.as_bytes()).unwrap();
        // `decode` and `/metrics` close the millisecond's run (its unused IDs are a gap): the
        // next ID comes from the next millisecond, which this manual clock must be moved to.
        f.clock.advance(1);
        let uri = path.replace("{id}", "97301141913751557");
        let other = if method == Method::GET { Method::POST } else { Method::GET };
        let (status, headers, body, _) = call(&f, other, &uri, "").await;
        assert_error(status, &body, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");
        assert_eq!(headers["allow"], idgen_test_support::openapi::allow(&[method.as_str()]).as_str(), "{path}");
        let body = if path.as_str() == "/v1/ids:batch" { r#"{"count": 2}"# } else { "" };
        let (status, ..) = call(&f, method.clone(), &uri, body).await;
        assert!(operation.responses[status.as_str()].is_object(), "{method} {path}: {status} is not documented");
        let (status, ..) = call(&f, method, &uri.replace("97301141913751557", "x"), "[").await;
        assert!(operation.responses[status.as_str()].is_object(), "{path} with bad input: {status} is not documented");
    }
}
