//! The floor for the request-path benchmarks: an axum server with the worker's runtime settings
//! that answers `POST /v1/ids` and `POST /v1/ids:batch` with constant bodies of the worker's
//! shapes (a batch: 1,000 consecutive IDs, the same bytes a worker writes), and does nothing
//! else. Built and run by `scripts/bench` beside the worker; never deployed.
//!
//! ```sh
//! cargo run --release -p idgen-worker --example bare_server -- 127.0.0.1:0
//! ```

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;

const BODY: &str = r#"{"id":"120542881919451136","id_num":120542881919451136}"#;

/// `body` answered as JSON, with the one header the worker's answers carry.
fn json(body: impl IntoResponse) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], body)
}

async fn constant() -> impl IntoResponse {
    json(BODY)
}

/// `{"ids":["…",…]}` with 1,000 consecutive IDs, as the worker answers `{"count": 1000}`.
fn batch_body() -> axum::body::Bytes {
    const FIRST: u64 = 120_542_881_919_451_136;
    let ids: Vec<String> = (FIRST..FIRST + 1000).map(|id| format!("\"{id}\"")).collect();
    format!(r#"{{"ids":[{}]}}"#, ids.join(",")).into()
}

fn main() -> anyhow::Result<()> {
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    // The same runtime `idgen worker` builds: multi-threaded, one worker per available core.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("bare-server listening on http://{}", listener.local_addr()?);
        let batch = batch_body();
        let router = Router::new().route("/v1/ids", post(constant)).route(
            "/v1/ids:batch",
            post(move || {
                let body = batch.clone();
                async move { json(body) }
            }),
        );
        axum::serve(listener, router).await?;
        Ok(())
    })
}
