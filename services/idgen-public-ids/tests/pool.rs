//! The service on a PostgreSQL database that is slow or whose pool is exhausted: 503
//! `storage_unavailable` with `Retry-After`, within the configured timeouts, never a hang or a
//! 500; and it answers again as soon as the database does. A fresh database on
//! `IDGEN_POSTGRES_URL` (./scripts/test starts it).

mod common;

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use idgen_public_ids::AppState;
use idgen_public_ids::store::{PoolSettings, PublicIdStore};
use idgen_test_support::TestDatabase as Db;
use serde_json::Value;
use sqlx::{Connection, PgConnection};

/// A request's status, its `Retry-After` and its body.
async fn call(state: &AppState, method: Method, uri: &str, body: &str) -> (StatusCode, Option<String>, Value) {
    let (status, headers, body) = common::send(state, method, uri, body).await;
    (status, headers.get("retry-after").map(|v| v.to_str().unwrap().to_owned()), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_database_or_an_exhausted_pool_answers_503_with_retry_after() {
    let db = Db::postgres("public_ids_pool").await;
    PublicIdStore::initialize(db.url(), Duration::from_secs(5), None).await.unwrap();
    let settings = PoolSettings {
        connections: 1,
        acquire_timeout: Duration::from_millis(100),
        statement_timeout: Duration::from_millis(300),
    };
    let store = PublicIdStore::open_with(db.url(), Duration::from_secs(5), settings).await.unwrap();
    // No cache: every resolve asks the database.
    let state = common::instance(store, 0).await;
    let (status, _, made) = call(&state, Method::POST, "/v1/public-ids", r#"{"internal_id": "7"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let resolve = format!("/v1/public-ids/{}", made["public_id"].as_str().unwrap());

    // Another session holds the table: every statement on it waits, until statement_timeout.
    let mut holder = PgConnection::connect(db.url()).await.unwrap();
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("LOCK TABLE public_ids_opaque IN ACCESS EXCLUSIVE MODE").execute(&mut holder).await.unwrap();

    let began = Instant::now();
    let (status, retry_after, body) = call(&state, Method::GET, &resolve, "").await;
    assert_eq!((status, retry_after.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")), "{body}");
    assert_eq!(body["error"]["code"], "storage_unavailable");
    assert!(body["error"]["message"].as_str().unwrap().contains("slow"), "{body}");
    assert!(began.elapsed() < Duration::from_secs(3), "answered after {:?}", began.elapsed());

    // The one connection busy with a slow statement: the next request gets none in time.
    let (slow, busy) = tokio::join!(call(&state, Method::GET, &resolve, ""), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        call(&state, Method::POST, "/v1/public-ids", r#"{"internal_id": "8"}"#).await
    });
    assert_eq!((slow.0, slow.1.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")), "{}", slow.2);
    assert_eq!((busy.0, busy.1.as_deref()), (StatusCode::SERVICE_UNAVAILABLE, Some("1")), "{}", busy.2);
    assert!(busy.2["error"]["message"].as_str().unwrap().contains("busy"), "{}", busy.2);

    // The database answers again: so does the service, with nothing half-made.
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    let (status, _, found) = call(&state, Method::GET, &resolve, "").await;
    assert_eq!((status, found["internal_id"].as_str()), (StatusCode::OK, Some("7")), "{found}");
    let (status, _, made) = call(&state, Method::POST, "/v1/public-ids", r#"{"internal_id": "8"}"#).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
}
