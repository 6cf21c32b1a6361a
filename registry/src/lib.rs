//! The region registry: the control plane of SPEC §5. It hands out region numbers that are never
//! reused and publishes the layout schedule (layouts, their `from`, the horizon, the home region).
//! It changes only when a region or a layout is added, and nothing calls it per ID: generators
//! fetch it at start-up, keep the last good copy on disk and refresh it periodically.
//!
//! `router(state)` for in-process tests; [`serve`] for the binaries (`idgen-registry`,
//! `idgen registry`).

pub mod api;
pub mod config;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;

pub use api::AppState;
pub use config::RegistryConfig;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/regions", get(api::list_regions).post(api::add_region).fallback(api::method_not_allowed))
        .route("/v1/regions/{action}", post(api::region_action).fallback(api::method_not_allowed))
        .route("/v1/layouts", get(api::get_layouts).post(api::add_layout).fallback(api::method_not_allowed))
        .route("/v1/audit", get(api::audit).fallback(api::method_not_allowed))
        .route("/healthz", get(api::healthz).fallback(api::method_not_allowed))
        .fallback(api::not_found)
        .with_state(state)
}

/// Connects the store (migrating and seeding it), binds, prints the address, serves until `shutdown`.
pub async fn serve(config: RegistryConfig, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let operators = config.operator_tokens()?;
    let store = store::RegistryStore::connect(&config.database_url, &config.initial_schedule()?)
        .await
        .with_context(|| format!("opening the registry database {}", config.database_url))?;
    let state = AppState {
        store: Arc::new(store),
        operators: Arc::new(operators),
        horizon_lead_ms: config.horizon_lead_ms,
        now: idgen::system_unix_ms,
    };
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    println!("idgen-registry listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await.context("serving HTTP")
}
