//! The public-ID service (SPEC §7): customers never see an internal ID. Three formats: `opaque`
//! (128 random bits from the OS CSPRNG, stored), `uuidv7` (stored) and `encrypted` (stateless:
//! AES-256 under a data key that AWS KMS generated and unwraps at start-up). Resolving an
//! unknown, malformed or forged public ID gives one and the same 404.

pub mod api;
pub mod config;
pub mod format;
pub mod kms;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;

pub use api::AppState;
pub use config::PublicIdsConfig;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/public-ids", post(api::create).fallback(api::method_not_allowed))
        .route("/v1/public-ids:batch", post(api::create_batch).fallback(api::method_not_allowed))
        .route("/v1/public-ids/{public_id}", get(api::resolve).fallback(api::method_not_allowed))
        .route("/v1/internal-ids/{internal_id}/public-id", get(api::lookup).fallback(api::method_not_allowed))
        .route("/healthz", get(api::healthz).fallback(api::method_not_allowed))
        .fallback(api::not_found)
        .with_state(state)
}

/// Opens the store, unwraps the data keys (when KMS is configured), binds and serves.
pub async fn serve(config: PublicIdsConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let store = store::PublicIdStore::connect(&config.database_url)
        .await
        .with_context(|| format!("opening the public-ID database {}", config.database_url))?;
    let keyring = match &config.kms {
        Some(kms) => {
            let client = kms::client(&kms.settings()).await;
            let keyring =
                kms::load_keyring(&store, &client, &kms.key_id).await.context("unwrapping the data keys with KMS")?;
            tracing::info!(versions = ?keyring.versions(), "encrypted format ready");
            Some(Arc::new(keyring))
        }
        None => {
            tracing::warn!("no KMS key configured: the encrypted format is unavailable");
            None
        }
    };
    let state = AppState { store: Arc::new(store), keyring };
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    println!("idgen-public-ids listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await.context("serving HTTP")
}
