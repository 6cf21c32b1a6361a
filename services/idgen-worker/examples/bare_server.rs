//! The floor for the single-ID benchmark: an axum server with the worker's runtime settings that
//! answers `POST /v1/ids` with a constant body of the same shape, and does nothing else. Built
//! and run by `scripts/bench` beside the worker; never deployed.
//!
//! ```sh
//! cargo run --release -p idgen-worker --example bare_server -- 127.0.0.1:0
//! ```

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;

const BODY: &str = r#"{"id":"120542881919451136","id_num":120542881919451136}"#;

async fn constant() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], BODY)
}

fn main() -> anyhow::Result<()> {
    let listen = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:0".into());
    // The same runtime `idgen worker` builds: multi-threaded, one worker per available core.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&listen).await?;
        println!("bare-server listening on http://{}", listener.local_addr()?);
        axum::serve(listener, Router::new().route("/v1/ids", post(constant))).await?;
        Ok(())
    })
}
