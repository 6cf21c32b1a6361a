//! The regional fleet worker: the endpoints of SPEC §4.1 over the library's
//! [`EmbeddedGenerator`], exactly as any embedder runs it (registry, schedule copy, lease
//! keepers, pre-claim all live there). The request path touches memory only.
//!
//! `router(state)` is what tests use in-process;
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
use idgen_server::{Caller, QuotaMetrics, Quotas, ServerMetrics, Tls};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

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

/// The route axum serves `path` with, `other` for the fallback (`http_metrics::UNMATCHED`, as
/// every service labels it): the HTTP metrics' label, worked out outside the router so that no
/// layer has to sit on every route (axum boxes each layered route again per request). A test
/// holds it to axum's own `MatchedPath`.
pub fn route_of(path: &str) -> &'static str {
    match path {
        route::IDS => route::IDS,
        route::BATCH => route::BATCH,
        route::UUIDS => route::UUIDS,
        route::HEALTHZ => route::HEALTHZ,
        route::METRICS => route::METRICS,
        route::OPENAPI => route::OPENAPI,
        _ => match path.strip_prefix("/v1/ids/").and_then(|rest| rest.strip_suffix("/decode")) {
            Some(id) if !id.contains('/') => route::DECODE,
            _ => http_metrics::UNMATCHED,
        },
    }
}

/// The worker's HTTP service: the routes of SPEC §4.1, each request counted and timed in the
/// HTTP metrics. `POST /v1/ids`, the route nearly every request is for, is answered without
/// axum's router and extractors, which cost a single ID more than all of its own work; every
/// other route goes through the router.
#[derive(Clone)]
pub struct App {
    state: AppState,
    router: Router,
    /// The caller of the connection this service answers (`anonymous` over plain HTTP).
    caller: Caller,
    /// Whether `POST /v1/ids` is answered here (not on the health port, which routes
    /// `GET /healthz` alone).
    issues: bool,
}

impl App {
    /// The service for one connection of `caller`.
    pub fn for_caller(&self, caller: Caller) -> App {
        App { caller, ..self.clone() }
    }
}

impl tower::Service<axum::extract::Request> for App {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: axum::extract::Request) -> Self::Future {
        let route = route_of(request.uri().path());
        let method = request.method().clone();
        let start = std::time::Instant::now();
        // One clone of the state a request: the recording and the handler share it.
        let state = self.state.clone();
        let record = move |state: &AppState, response: &axum::response::Response| {
            let elapsed = start.elapsed().as_secs_f64();
            state.http_metrics.record(route, &method, response.status().as_u16(), elapsed);
        };
        if self.issues && route == route::IDS {
            let caller = self.caller.clone();
            Box::pin(async move {
                let response = api::single_id(&state, &caller, request).await;
                record(&state, &response);
                Ok(response)
            })
        } else {
            let mut request = request;
            request.extensions_mut().insert(self.caller.clone());
            let routed = tower::Service::call(&mut self.router, request);
            Box::pin(async move {
                let Ok(response) = routed.await;
                record(&state, &response);
                Ok(response)
            })
        }
    }
}

pub fn router(state: AppState) -> App {
    use idgen_server::not_allowed;
    // `route::IDS` is answered by `App` itself, before the router.
    let router = Router::new()
        .route(route::BATCH, post(api::create_batch).fallback(not_allowed("POST")))
        .route(route::DECODE, get(api::decode).fallback(not_allowed("GET, HEAD")))
        .route(route::UUIDS, post(api::create_uuids).fallback(not_allowed("POST")))
        .route(route::HEALTHZ, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .route(route::METRICS, get(api::metrics).fallback(not_allowed("GET, HEAD")))
        .route(route::OPENAPI, idgen_server::openapi_route(api::OPENAPI))
        .fallback(api::not_found)
        .with_state(state.clone());
    App { state, router, caller: Caller::anonymous(), issues: true }
}

/// The worker's health listener: `GET /healthz` (the worker's own answer, counted in the same
/// request metrics) and nothing else.
pub fn health_router(state: AppState) -> App {
    use idgen_server::not_allowed;
    let router = Router::new()
        .route(route::HEALTHZ, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .fallback(api::not_found)
        .with_state(state.clone());
    App { state, router, caller: Caller::anonymous(), issues: false }
}

pub use idgen::open_lease_store;

/// The request counters and latency of [`ROUTES`], registered in `registry`, with the series of
/// every operation the OpenAPI document names at 0.
pub fn request_metrics(registry: &mut Registry) -> Arc<http_metrics::HttpMetrics> {
    let metrics = http_metrics::HttpMetrics::register(registry, &ROUTES);
    metrics.create_documented(api::OPENAPI, str::to_owned);
    metrics
}

/// Everything a running worker is made of, built from its configuration.
pub struct Worker {
    pub state: AppState,
    /// The generator the worker serves: the library's, exactly as an embedder runs it.
    pub embedded: EmbeddedGenerator,
    pub listener: TcpListener,
    /// The TLS configuration in force (re-read on SIGHUP), if the listener uses TLS.
    pub tls: Option<Arc<Tls>>,
    /// The plain health listener (`health_listen`), bound.
    pub health: Option<TcpListener>,
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
        let http_metrics = request_metrics(&mut registry);
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
        let listener = TcpListener::bind(config.listen).await.with_context(|| format!("binding {}", config.listen))?;
        let health = idgen_server::serve::bind_health(config.health_listen).await?;
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
            registry: Arc::new(registry),
            http_metrics,
        });
        Ok(Worker {
            state,
            embedded,
            listener,
            tls,
            health,
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
        let Worker { state, embedded, listener, tls, health, server_metrics, limits, grace } = self;
        let app = router(state.clone());
        let (shutdown, health_shutdown) = idgen_server::serve::shared_shutdown(shutdown);
        let make = move |caller| app.for_caller(caller);
        let serving = idgen_server::serve(listener, tls, make, shutdown, grace, server_metrics.clone(), limits);
        let served = match health {
            None => serving.await,
            Some(health) => {
                let checking = idgen_server::serve_health(
                    health,
                    health_router(state),
                    health_shutdown,
                    grace,
                    server_metrics,
                    limits,
                );
                let (served, checked) = tokio::join!(serving, checking);
                served.and(checked)
            }
        };
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
    let address = worker.listener.local_addr()?;
    let (tls, quotas, development) = (worker.tls.clone(), worker.state.quotas.clone(), config.development);
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
    let scheme = if worker.tls.is_some() { "https" } else { "http" };
    let mode = if config.development { " mode=development" } else { "" };
    let health = idgen_server::serve::health_suffix(worker.health.as_ref())?;
    println!(
        "idgen-worker listening on {scheme}://{address} region={} holder={}{mode}{health}",
        config.region(),
        worker.state.holder
    );
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
