//! The registry and the public-ID service serve `/metrics` like the worker: requests by method,
//! route and status (the route axum matched, never the caller's raw path), latency by route, and
//! their database pool; the public-ID service also its per-caller quota counters. And on every
//! service's first scrape, right after start-up, each labelled counter whose label values are
//! known up front is there at 0 (refusals, lease events, TLS handshake failures, quotas, requests
//! by route and documented status, KMS calls), so an alert's `increase()` sees a first event.

use idgen_e2e::{RegistryProcess, WorkerProcess, WorkerSpec, start_public_ids};

async fn scrape(client: &reqwest::Client, url: &str) -> String {
    let response = client.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let kind = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(kind.starts_with("application/openmetrics-text"), "{kind}");
    response.text().await.unwrap()
}

fn assert_has(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(line), "{line} missing from /metrics:\n{text}");
    }
}

/// Each series is on the scrape with the value 0.
fn assert_at_zero(text: &str, series: &[&str]) {
    for one in series {
        assert!(text.contains(&format!("{one} 0\n")), "{one} is not at 0 on /metrics:\n{text}");
    }
}

/// What every listener exports from its start: each TLS handshake failure reason and the
/// quota counters of callers not listed.
const LISTENER_SERIES: [&str; 5] = [
    r#"idgen_tls_handshake_failures_total{reason="no_client_certificate"}"#,
    r#"idgen_tls_handshake_failures_total{reason="unknown_issuer"}"#,
    r#"idgen_tls_handshake_failures_total{reason="certificate_expired"}"#,
    r#"idgen_tls_handshake_failures_total{reason="timeout"}"#,
    r#"idgen_caller_requests_throttled_total{caller="other"}"#,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_every_services_labelled_counters_are_at_zero_on_the_first_scrape() {
    let client = reqwest::Client::new();
    let dir = tempfile::tempdir().unwrap();

    let worker = WorkerProcess::start(&WorkerSpec::short_lease("zeros", &dir.path().join("leases.db"))).await.unwrap();
    let text = scrape(&client, &worker.url).await;
    assert_at_zero(&text, &LISTENER_SERIES);
    assert_at_zero(
        &text,
        &[
            r#"idgen_refusals_total{reason="lease"}"#,
            r#"idgen_refusals_total{reason="clock_behind"}"#,
            r#"idgen_refusals_total{reason="clock_unsynchronized"}"#,
            r#"idgen_refusals_total{reason="schedule"}"#,
            r#"idgen_lease_events_total{layout="v1",event="claim_all_taken"}"#,
            r#"idgen_lease_events_total{layout="v1",event="store_unavailable"}"#,
            r#"idgen_lease_events_total{layout="v1",event="table_refused"}"#,
            r#"idgen_lease_events_total{layout="v2",event="claim"}"#,
            r#"idgen_http_requests_total{method="POST",route="/v1/ids",status="503"}"#,
            r#"idgen_http_requests_total{method="POST",route="/v1/ids:batch",status="429"}"#,
            r#"idgen_http_requests_total{method="GET",route="/healthz",status="503"}"#,
            r#"idgen_caller_ids_served_total{caller="other"}"#,
            "idgen_region_standby",
        ],
    );
    for event in idgen::metrics::LEASE_EVENTS {
        assert_has(&text, &[&format!(r#"idgen_lease_events_total{{layout="v1",event="{event}"}} "#)]);
    }
    worker.stop().await.unwrap();

    let registry = RegistryProcess::start("").await.unwrap();
    let text = scrape(&client, &registry.url).await;
    assert_at_zero(&text, &LISTENER_SERIES);
    assert_at_zero(
        &text,
        &[
            r#"idgen_http_requests_total{method="GET",route="/healthz",status="503"}"#,
            r#"idgen_http_requests_total{method="POST",route="/v1/regions",status="409"}"#,
            r#"idgen_http_requests_total{method="POST",route="/v1/regions/{action}",status="404"}"#,
            r#"idgen_http_requests_total{method="GET",route="/v1/layouts",status="200"}"#,
            r#"idgen_http_request_duration_seconds_count{route="/v1/layouts"}"#,
        ],
    );

    let config = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\n",
        dir.path().join("p.db").display()
    );
    let (mut child, url) = start_public_ids(dir.path(), &config).await.unwrap();
    let text = scrape(&client, &url).await;
    assert_at_zero(&text, &LISTENER_SERIES);
    assert_at_zero(
        &text,
        &[
            r#"idgen_http_requests_total{method="POST",route="/v1/public-ids",status="503"}"#,
            r#"idgen_http_requests_total{method="GET",route="/v1/public-ids/{public_id}",status="404"}"#,
            r#"idgen_public_kms_calls_total{operation="decrypt",outcome="error"}"#,
            r#"idgen_public_storage_errors_total{operation="create"}"#,
            r#"idgen_public_storage_errors_total{operation="resolve"}"#,
            r#"idgen_caller_ids_served_total{caller="other"}"#,
        ],
    );
    assert_has(&text, &["idgen_public_database_up 1\n"]);
    child.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_the_registry_counts_its_requests_and_its_pool() {
    let registry = RegistryProcess::start("").await.unwrap();
    let client = reqwest::Client::new();
    for _ in 0..3 {
        assert_eq!(client.get(format!("{}/healthz", registry.url)).send().await.unwrap().status(), 200);
    }
    let refused = client.post(format!("{}/v1/regions", registry.url)).json(&serde_json::json!({"name": "x"})).send();
    assert_eq!(refused.await.unwrap().status(), 401, "a write without a token");
    let missing = client.get(format!("{}/v1/no-such-thing/123", registry.url)).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let text = scrape(&client, &registry.url).await;
    assert_has(
        &text,
        &[
            r#"idgen_http_requests_total{method="GET",route="/healthz",status="200"} 3"#,
            r#"idgen_http_requests_total{method="POST",route="/v1/regions",status="401"} 1"#,
            r#"idgen_http_requests_total{method="GET",route="other",status="404"} 1"#,
            r#"idgen_http_request_duration_seconds_count{route="/healthz"} 3"#,
            "idgen_db_pool_connections ",
            "idgen_db_pool_idle_connections ",
        ],
    );
    assert!(!text.contains("no-such-thing"), "a caller's path became a label:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_the_public_id_service_counts_its_requests_pool_and_callers() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\n",
        dir.path().join("p.db").display()
    );
    let (mut child, url) = start_public_ids(dir.path(), &config).await.unwrap();
    let client = reqwest::Client::new();
    let created = client
        .post(format!("{url}/v1/public-ids"))
        .json(&serde_json::json!({"internal_id": "683244571854022659", "format": "opaque"}))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{}", created.status());
    let body: serde_json::Value = created.json().await.unwrap();
    let public = body["public_id"].as_str().unwrap();
    assert_eq!(client.get(format!("{url}/v1/public-ids/{public}")).send().await.unwrap().status(), 200);
    let text = scrape(&client, &url).await;
    assert_has(
        &text,
        &[
            r#"route="/v1/public-ids","#,
            r#"idgen_http_requests_total{method="GET",route="/v1/public-ids/{public_id}",status="200"} 1"#,
            "idgen_db_pool_connections ",
            r#"idgen_caller_ids_served_total{caller="other"} 2"#,
        ],
    );
    assert!(!text.contains(public), "a public ID became a label:\n{text}");
    child.kill().await.unwrap();
}
