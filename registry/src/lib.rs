//! The region registry: the control plane of SPEC §5. It hands out region numbers that are never
//! reused and publishes the layout schedule (layouts, their `from`, the horizon, the home region).
//! It changes only when a region or a layout is added, and nothing calls it per ID: generators
//! fetch it at start-up, keep the last good copy on disk and refresh it periodically.
//!
//! `router(state)` for in-process tests; [`serve`] for the binaries (`idgen-registry`,
//! `idgen registry`).

pub mod api;
pub mod config;
pub mod console;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use tokio::net::TcpListener;

pub use api::AppState;
pub use config::RegistryConfig;

/// The registry's routes, as `/metrics` labels them (anything else is `other`).
/// `/v1/regions/{action}` is `POST /v1/regions/{name}:retire` and `…:cancel-retire` (a capture
/// cannot share its path segment with a literal suffix here: the handler takes the suffix off).
pub const ROUTES: [&str; 10] = [
    "/v1/regions",
    "/v1/regions/{action}",
    "/v1/layouts",
    "/v1/audit",
    "/healthz",
    "/metrics",
    "/openapi.json",
    "/console",
    "/console/console.js",
    "/console/console.css",
];

pub fn router(state: AppState) -> Router {
    use idgen_server::not_allowed;
    let [regions, region_action, layouts, audit, healthz, _, openapi, page, script, style] = ROUTES;
    Router::new()
        .route(regions, get(api::list_regions).post(api::add_region).fallback(not_allowed("GET, HEAD, POST")))
        .route(region_action, post(api::region_action).fallback(not_allowed("POST")))
        .route(layouts, get(api::get_layouts).post(api::add_layout).fallback(not_allowed("GET, HEAD, POST")))
        .route(audit, get(api::audit).fallback(not_allowed("GET, HEAD")))
        .route(healthz, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .route(openapi, idgen_server::openapi_route(api::OPENAPI))
        .route(page, get(console::page).fallback(not_allowed("GET, HEAD")))
        .route(script, get(console::script).fallback(not_allowed("GET, HEAD")))
        .route(style, get(console::style).fallback(not_allowed("GET, HEAD")))
        .fallback(api::not_found)
        .with_state(state)
}

/// Connects the store (migrating and seeding it), binds, prints the address, serves until
/// `shutdown`. On SIGHUP the `[tls]` files in `config_file` are read again.
pub async fn serve(
    config: RegistryConfig,
    config_file: Option<std::path::PathBuf>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let operators = config.operator_tokens()?;
    let store = store::RegistryStore::connect_waiting(
        &config.database_url,
        &config.initial_schedule()?,
        std::time::Duration::from_millis(config.sqlite_open_timeout_ms),
    )
    .await
    .with_context(|| format!("opening the registry database {}", idgen::config::redacted_url(&config.database_url)))?;
    let state = AppState {
        store: Arc::new(store),
        operators: Arc::new(operators),
        certificate_operators: Arc::new(config.certificate_operators.clone()),
        horizon_lead_ms: config.horizon_lead_ms,
        retire_grace_ms: config.retire_grace_ms,
        now: idgen::system_unix_ms,
    };
    let tls = match config.tls.enabled() {
        true => Some(Arc::new(idgen_server::Tls::load(&config.tls).context("loading the listener's TLS files")?)),
        false => None,
    };
    if let Some(tls) = tls.clone() {
        idgen_server::reload_on_sighup(move || tls.reload(&RegistryConfig::load(config_file.as_deref())?.tls));
    }
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("idgen-registry listening on {scheme}://{}", listener.local_addr()?);
    let mut registry = prometheus_client::registry::Registry::default();
    let store = state.store.clone();
    let refresh = idgen_server::http_metrics::pool_gauges(&mut registry, move || store.pool_connections());
    let metrics = idgen_server::ServiceMetrics::new(registry, &ROUTES, refresh);
    let router = idgen_server::http_metrics::with_metrics(router(state), metrics);
    let make = move |caller| idgen_server::AddCaller { inner: router.clone(), caller };
    let grace = std::time::Duration::from_secs(10);
    idgen_server::serve(listener, tls, make, shutdown, grace, Arc::default()).await
}
