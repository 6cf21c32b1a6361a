//! The regional fleet worker: the endpoints of SPEC §4.1 over the library's
//! [`EmbeddedGenerator`], exactly as any embedder runs it (registry, schedule copy, lease
//! keepers, pre-claim all live there). The request path touches memory only.
//!
//! `app(state)` is what tests use in-process;
//! [`Worker`] is what `idgen worker` and `idgen-worker` run: built from a validated
//! [`WorkerConfig`], it serves until shutdown, lets in-flight requests finish, then shuts the
//! generator down, which releases the leases.

pub mod api;
pub mod body;
pub mod config;
pub use idgen_server::http_metrics;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};
use idgen::control::supervisor::StoreOpener;
use idgen::embedded::{EmbeddedGenerator, StartOptions};
use idgen_server::{Caller, Listeners, QuotaMetrics, Quotas, ServerMetrics, ServiceMetrics, Tls};
use prometheus_client::registry::Registry;

pub use api::AppState;
pub use config::WorkerConfig;

/// The worker's routes, by name.
pub mod route {
    pub const IDS: &str = "/v1/ids";
    pub const BATCH: &str = "/v1/ids:batch";
    pub const DECODE: &str = "/v1/ids/{id}/decode";
    pub const UUIDS: &str = "/v1/uuids";
    pub const HEALTHZ: &str = "/healthz";
    pub const METRICS: &str = "/metrics";
    pub const OPENAPI: &str = "/openapi.json";
}

/// Every route the worker serves (the HTTP metrics keep handles for each).
pub const ROUTES: [&str; 7] =
    [route::IDS, route::BATCH, route::DECODE, route::UUIDS, route::HEALTHZ, route::METRICS, route::OPENAPI];

/// The worker's HTTP service ([`idgen_server::App`]): the routes of SPEC §4.1, each request
/// counted and timed in the HTTP metrics, and `POST /v1/ids`, the route nearly every request is
/// for, answered before the router ([`SingleId`]).
pub type App = idgen_server::App<SingleId>;

/// `POST /v1/ids` answered without axum's router and extractors, which cost a single ID more
/// than all of its own work. Any method of that path is answered here (`api::single_id` answers
/// another method 405, as the router would).
#[derive(Clone)]
pub struct SingleId(AppState);

impl idgen_server::FastRoute for SingleId {
    fn route(&self, request: &axum::extract::Request) -> Option<&'static str> {
        (request.uri().path() == route::IDS).then_some(route::IDS)
    }

    fn answer(
        &self,
        caller: &Caller,
        request: axum::extract::Request,
        recording: idgen_server::app::Recording,
    ) -> idgen_server::app::Answer {
        let (state, caller) = (self.0.clone(), caller.clone());
        Box::pin(async move {
            let response = api::single_id(&state, &caller, request).await;
            recording.record(&response);
            Ok(response)
        })
    }
}

/// The worker's service port: every route, `POST /v1/ids` answered by [`SingleId`].
pub fn app(state: AppState) -> App {
    use idgen_server::not_allowed;
    // `route::IDS` is answered by `SingleId`, before the router; `/metrics` is `App`'s.
    let router = Router::new()
        .route(route::BATCH, post(api::create_batch).fallback(not_allowed("POST")))
        .route(route::DECODE, get(api::decode).fallback(not_allowed("GET, HEAD")))
        .route(route::UUIDS, post(api::create_uuids).fallback(not_allowed("POST")))
        .route(route::HEALTHZ, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .route(route::OPENAPI, idgen_server::openapi_route(api::OPENAPI))
        .fallback(api::not_found)
        .with_state(state.clone());
    idgen_server::App::new(router, state.metrics.clone()).answering(SingleId(state))
}

/// The worker's health listener: `GET /healthz` (the worker's own answer, counted in the same
/// request metrics) and nothing else.
pub fn health_app(state: AppState) -> App {
    use idgen_server::not_allowed;
    let router = Router::new()
        .route(route::HEALTHZ, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .fallback(api::not_found)
        .with_state(state.clone());
    idgen_server::App::health(router, state.metrics.clone())
}

pub use idgen::open_lease_store;

/// `/metrics` of `registry`: the request counters and latency of [`ROUTES`] (the series of every
/// operation the OpenAPI document names at 0), and the generator's gauges, refreshed at every
/// scrape.
pub fn service_metrics(registry: Registry, generator: Arc<idgen::issuing::IdGenerator>) -> ServiceMetrics {
    let metrics = ServiceMetrics::new(registry, &ROUTES, move || generator.refresh_gauges());
    metrics.http.create_documented(api::OPENAPI, str::to_owned);
    metrics
}

/// Everything a running worker is made of, built from its configuration.
pub struct Worker {
    pub state: AppState,
    /// The generator the worker serves: the library's, exactly as an embedder runs it.
    pub embedded: EmbeddedGenerator,
    /// The service port with its TLS (re-read on SIGHUP) and the plain health port
    /// (`health_listen`), bound.
    pub listeners: Listeners,
    server_metrics: Arc<ServerMetrics>,
    limits: idgen_server::LimitsSection,
    grace: Duration,
}

impl Worker {
    pub async fn build(config: &WorkerConfig, process_start_unix_ms: i64) -> anyhow::Result<Worker> {
        Worker::build_with(config, process_start_unix_ms, None).await
    }

    /// [`Self::build`] with lease tables of the caller's instead of the configured ones (tests).
    pub async fn build_with(
        config: &WorkerConfig,
        process_start_unix_ms: i64,
        stores: Option<StoreOpener>,
    ) -> anyhow::Result<Worker> {
        config.validate()?;
        let mut registry = Registry::default();
        let quota_metrics = Arc::new(QuotaMetrics::default());
        quota_metrics.register(&mut registry);
        let quotas = Arc::new(Quotas::new(&config.quotas, quota_metrics)?);
        let server_metrics = Arc::new(ServerMetrics::default());
        server_metrics.register(&mut registry);
        let tls = match config.tls.enabled() {
            true => Some(Arc::new(Tls::load(&config.tls).context("loading the listener's TLS files")?)),
            false => None,
        };
        // The port first: a worker that cannot serve must not take a machine number with it.
        let listeners = Listeners::bind(config.listen, tls, config.health_listen).await?;
        let options = StartOptions {
            process_start_unix_ms: Some(process_start_unix_ms),
            stores,
            clock: None,
            waits_on_this_runtime: true,
        };
        let embedded = EmbeddedGenerator::start_with(&config.generator, &mut registry, options).await?;
        let state = AppState::new(api::Shared {
            generator: embedded.generator().clone(),
            region_names: embedded.region_names().clone(),
            region: embedded.region().into(),
            region_number: embedded.region_number(),
            holder: embedded.holder().into(),
            development: embedded.development(),
            quotas,
            metrics: service_metrics(registry, embedded.generator().clone()),
        });
        Ok(Worker {
            state,
            embedded,
            listeners,
            server_metrics,
            limits: config.limits,
            grace: Duration::from_millis(config.shutdown_grace_ms),
        })
    }

    /// Serves until `shutdown` resolves (with the health listener, if there is one); then stops
    /// accepting, lets in-flight requests finish within the grace period, and releases the leases.
    /// With `[tls]`, every connection handshakes first and its caller is the one its client
    /// certificate names.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Worker { state, embedded, listeners, server_metrics, limits, grace } = self;
        let (app, health) = (app(state.clone()), health_app(state));
        let served = listeners.serve(app, health, shutdown, grace, server_metrics, limits).await;
        if let Err(error) = embedded.shutdown().await {
            tracing::error!(error = format!("{error:#}"), "releasing the leases");
        }
        served
    }
}

/// The worker's `main`: logs, builds, prints the address, serves until a signal. On SIGHUP the
/// configuration file (and the environment) is read again and its `[tls]` files and `[quotas]`
/// are applied; nothing else changes without a restart, and leases are never touched.
pub async fn main_with(config: WorkerConfig, config_file: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let process_start_unix_ms = idgen::system_unix_ms();
    let worker = Worker::build(&config, process_start_unix_ms).await?;
    let (tls, quotas, development) = (worker.listeners.tls.clone(), worker.state.quotas.clone(), config.development);
    idgen_server::reload_on_sighup(move || {
        let fresh = WorkerConfig::load(config_file.as_deref())?;
        idgen_server::refuse_mode_change(development, fresh.development)?;
        if let Some(tls) = &tls {
            tls.reload(&fresh.tls).context("the [tls] files")?;
        } else if fresh.tls.enabled() {
            tracing::warn!("[tls] was added: a plain-HTTP listener turns into TLS only on restart");
        }
        quotas.reload(&fresh.quotas).context("[quotas]")
    });
    // One line on stdout that scripts and tests read to find the port.
    let mode = if config.development { " mode=development" } else { "" };
    let listening = worker.listeners.describe()?;
    println!("idgen-worker listening on {listening} region={} holder={}{mode}", config.region(), worker.state.holder);
    worker.serve(idgen_server::cli::shutdown_signal()).await?;
    tracing::info!("worker stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_layout_added_later_gets_its_own_lease_table() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = WorkerConfig::development();
        config.lease.sqlite_path = Some(dir.path().join("leases.db"));
        // v3 came from the registry; the configuration names tables for v1 and v2 only.
        let store = open_lease_store(&config, "v3").await.unwrap();
        assert_eq!(store.describe(), "sqlite table idgen-leases-v3");
        let store = open_lease_store(&config, "v2").await.unwrap();
        assert_eq!(store.describe(), "sqlite table idgen-leases-v2");
    }
}
