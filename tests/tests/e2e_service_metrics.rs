//! The registry and the public-ID service serve `/metrics` like the worker: requests by method,
//! route and status (the route axum matched, never the caller's raw path), latency by route, and
//! their database pool; the public-ID service also its per-caller quota counters.

use idgen_e2e::{RegistryProcess, start_idgen};

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
    let config = dir.path().join("public-ids.toml");
    let db = dir.path().join("p.db");
    std::fs::write(
        &config,
        format!("development = true\nlisten = \"127.0.0.1:0\"\ndatabase_url = \"sqlite://{}\"\n", db.display()),
    )
    .unwrap();
    let (mut child, url) =
        start_idgen(&["public", "serve", "--config", config.to_str().unwrap()], &[], "idgen-public-ids listening on ")
            .await
            .unwrap();
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
