//! The floors for the public-ID benchmark (`scripts/bench`, stage 7), never deployed. Two bare
//! axum servers on the runtime `idgen-public-ids` builds (multi-threaded, a worker per core):
//!
//! - `constant ADDR`: `GET /v1/public-ids/{public_id}` answers a constant body of the service's
//!   shape, and does nothing else: what HTTP alone costs;
//! - `database ADDR DATABASE_URL`: the same routes as the service, each doing only its one
//!   statement on the service's PostgreSQL table through a native pool of the service's size:
//!   a resolve is the indexed `SELECT internal_id, id_type FROM public_ids_opaque WHERE
//!   public_id_key(public_id) = $1 AND public_id = $2` (404 if none), a create (`POST
//!   /v1/public-ids`, `POST /v1/public-ids:batch`) draws opaque public IDs and runs the service's
//!   `INSERT … SELECT FROM UNNEST(…) WHERE NOT EXISTS (…) ON CONFLICT DO NOTHING` of them (prepared
//!   once, as the service's is),
//!   without reading back what another create made (the service's idempotency) and without
//!   access, quota or cache: the database's floor for the same work.
//!
//! The statements follow the table as `migrations/public_ids/postgres` makes it: a change to the
//! table's columns is a change here.
//!
//! ```sh
//! cargo run --release -p idgen-public-ids --example bare_public_ids -- constant 127.0.0.1:0
//! cargo run --release -p idgen-public-ids --example bare_public_ids -- database 127.0.0.1:0 postgres://…/db
//! ```

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idgen_public_ids::format::Format;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

const BODY: &str = r#"{"public_id":"01h455vb4pex5vsknk084sn02q","internal_id":"120542881919451136"}"#;

/// The service's pool size on PostgreSQL.
const CONNECTIONS: u32 = 16;

async fn constant() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], BODY)
}

fn failed(error: impl std::fmt::Display) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, error.to_string()).into_response()
}

async fn resolve(State(pool): State<PgPool>, Path(public_id): Path<String>) -> Response {
    let Some(bytes) = idgen_public_ids::format::stored_bytes(Format::Opaque, &public_id) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let public = uuid::Uuid::from_bytes(bytes);
    let row: Result<Option<(i64, Option<i16>)>, _> = sqlx::query_as(
        "SELECT internal_id, id_type FROM public_ids_opaque WHERE public_id_key(public_id) = $1 AND public_id = $2",
    )
    .bind(idgen_public_ids::store::public_id_key(&public))
    .bind(public)
    .fetch_optional(&pool)
    .await;
    match row {
        Ok(Some((internal_id, _))) => {
            axum::Json(json!({"public_id": public_id, "internal_id": internal_id.to_string()})).into_response()
        }
        Ok(None) => StatusCode::NOT_FOUND.into_response(),
        Err(error) => failed(error),
    }
}

/// Internal IDs as the service takes them: a decimal string or a number.
fn internal_id(value: &Value) -> Option<i64> {
    match value {
        Value::String(text) => text.parse().ok(),
        other => other.as_i64(),
    }
}

/// One `INSERT` of `ids` with fresh opaque public IDs; answers them.
async fn insert(pool: &PgPool, ids: &[i64]) -> Response {
    let mut public_ids = Vec::with_capacity(ids.len());
    for _ in ids {
        let mut bytes = [0u8; 16];
        if let Err(error) = getrandom::fill(&mut bytes) {
            return failed(error);
        }
        public_ids.push(uuid::Uuid::from_bytes(bytes));
    }
    let query = sqlx::query(
        "INSERT INTO public_ids_opaque (internal_id, public_id, id_type) SELECT o.internal_id, o.public_id, NULL \
         FROM UNNEST($1::BIGINT[], $2::UUID[]) AS o (internal_id, public_id) \
         WHERE NOT EXISTS (SELECT 1 FROM public_ids_opaque x \
                           WHERE public_id_key(x.public_id) = public_id_key(o.public_id) AND x.public_id = o.public_id) \
         ON CONFLICT DO NOTHING",
    )
    .bind(ids)
    .bind(&public_ids);
    match query.execute(pool).await {
        Ok(_) => {
            let mappings: Vec<Value> = ids
                .iter()
                .zip(&public_ids)
                .map(|(id, public_id)| {
                    let text = idgen_public_ids::format::crockford_encode(public_id.as_bytes());
                    json!({"public_id": text, "internal_id": id.to_string(), "format": "opaque"})
                })
                .collect();
            axum::Json(json!({"public_ids": mappings})).into_response()
        }
        Err(error) => failed(error),
    }
}

async fn create(State(pool): State<PgPool>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    match internal_id(&body["internal_id"]) {
        Some(id) => insert(&pool, &[id]).await,
        None => StatusCode::BAD_REQUEST.into_response(),
    }
}

async fn create_batch(State(pool): State<PgPool>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or_default();
    let ids: Option<Vec<i64>> = body["internal_ids"].as_array().map(|ids| ids.iter().filter_map(internal_id).collect());
    match ids {
        Some(ids) if !ids.is_empty() && ids.len() <= 1_000 => insert(&pool, &ids).await,
        _ => StatusCode::BAD_REQUEST.into_response(),
    }
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mode, listen) = (args.next().unwrap_or_default(), args.next().unwrap_or_else(|| "127.0.0.1:0".into()));
    let database_url = args.next();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let router = match (mode.as_str(), database_url) {
            ("constant", _) => Router::new().route("/v1/public-ids/{public_id}", get(constant)),
            ("database", Some(url)) => {
                let pool = PgPoolOptions::new().max_connections(CONNECTIONS).connect(&url).await?;
                Router::new()
                    .route("/v1/public-ids/{public_id}", get(resolve))
                    .route("/v1/public-ids", post(create))
                    .route("/v1/public-ids:batch", post(create_batch))
                    .with_state(pool)
            }
            _ => anyhow::bail!("usage: bare_public_ids constant ADDR | database ADDR DATABASE_URL"),
        };
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("bare-public-ids listening on http://{}", listener.local_addr()?);
        axum::serve(listener, router).await?;
        Ok(())
    })
}
