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
pub mod operators;
pub mod store;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};

pub use api::AppState;
pub use config::RegistryConfig;

/// The registry's routes, as `/metrics` labels them (anything else is `other`).
/// `/v1/regions/{action}` is `POST /v1/regions/{name}:retire` and `…:cancel-retire` (a capture
/// cannot share its path segment with a literal suffix here: the handler takes the suffix off).
pub const ROUTES: [&str; 11] = [
    "/v1/regions",
    "/v1/regions/{action}",
    "/v1/numbers-in-use",
    "/v1/layouts",
    "/v1/audit",
    "/healthz",
    "/metrics",
    "/openapi.json",
    "/console",
    "/console/console.js",
    "/console/console.css",
];

/// The route a path of the OpenAPI document is served under.
pub fn documented_route(path: &str) -> String {
    path.replace("{name}:retire", "{action}")
}

pub fn router(state: AppState) -> Router {
    use idgen_server::not_allowed;
    let [regions, region_action, numbers_in_use, layouts, audit, healthz, _, openapi, page, script, style] = ROUTES;
    Router::new()
        .route(regions, get(api::list_regions).post(api::add_region).fallback(not_allowed("GET, HEAD, POST")))
        .route(region_action, post(api::region_action).fallback(not_allowed("POST")))
        .route(numbers_in_use, post(api::report_number_in_use).fallback(not_allowed("POST")))
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

/// Holds every request but `/healthz` and `/metrics` to the caller's quota (`[quotas]`, each
/// request counting one): over it, 429 `over_quota` with `Retry-After`, as the other services
/// answer. A flood of reads from one caller then waits at its own limiter, not in the database.
pub fn with_quotas(router: Router, quotas: Arc<idgen_server::Quotas>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(quotas, admit))
}

async fn admit(
    axum::extract::State(quotas): axum::extract::State<Arc<idgen_server::Quotas>>,
    caller: idgen_server::Caller,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if matches!(request.uri().path(), "/healthz" | "/metrics") {
        return next.run(request).await;
    }
    match quotas.admit(&caller, 1) {
        Ok(()) => {
            quotas.served(&caller, 1);
            next.run(request).await
        }
        Err(over) => idgen_server::ApiError::over_quota(over).into_response(),
    }
}

/// The horizon writer: [`store::RegistryStore::advance_horizon`] every minute (or
/// every quarter of a lead shorter than four minutes), so no read has to write. A failed write is
/// logged and tried again at the next turn; reads move the horizon themselves only once it has
/// fallen half a lead behind.
fn keep_the_horizon_ahead(store: Arc<store::RegistryStore>, lead_ms: i64) {
    let every = std::time::Duration::from_millis((lead_ms / 4).clamp(250, 60_000) as u64);
    tokio::spawn(async move {
        // The first turn one interval on: `serve` has just moved it, before its first request.
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = store.advance_horizon(idgen::system_unix_ms(), lead_ms).await {
                tracing::warn!(%error, "could not advance the horizon; trying again in {every:?}");
            }
        }
    });
}

/// `idgen registry init`: makes the configured database a registry's (migrations, the home
/// region and the first layouts), or applies the migrations still pending on one that is.
/// Idempotent; refuses another service's database or one naming another home region.
///
/// With `owner_url` (PostgreSQL), the migrations run as that role (the schema's owner), and the
/// role `database_url` names, the one the registry runs as, is granted exactly what the registry
/// uses and nothing more (no DDL, no DELETE); with `runtime_password`, that role is made if
/// missing and given that password.
pub async fn init(
    config: &RegistryConfig,
    owner_url: Option<&str>,
    runtime_password: Option<&str>,
) -> anyhow::Result<store::Initialized> {
    let runtime_url = config.database_url();
    let url = owner_url.unwrap_or(runtime_url);
    let runtime_role = idgen_server::database::runtime_role(owner_url, runtime_url)?;
    let done = store::RegistryStore::initialize(
        url,
        &config.initial_schedule()?,
        std::time::Duration::from_millis(config.sqlite_open_timeout_ms),
    )
    .await
    .with_context(|| format!("initializing the registry database {}", idgen::config::redacted_url(url)))?;
    if let Some(role) = runtime_role {
        store::RegistryStore::grant_runtime(url, &role, runtime_password).await?;
    }
    Ok(done)
}

/// Opens the store, binds, prints the address, serves until `shutdown`. In development mode the
/// database is initialized first; in production it must have been (`idgen registry init`), and a
/// database that is not a registry's is refused ([`idgen::config::Refused`]: exit status 2). On
/// SIGHUP `config_file` is read again: the `[tls]` files, `[quotas]`, the operators (tokens and
/// `certificate_operators`) and `lease_table_recorders`.
pub async fn serve(
    config: RegistryConfig,
    config_file: Option<std::path::PathBuf>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let operators = config.operator_tokens()?;
    let within = std::time::Duration::from_millis(config.sqlite_open_timeout_ms);
    let url = config.database_url();
    let opened = match config.development {
        true => {
            tracing::warn!(database = %idgen::config::redacted_url(url), "DEVELOPMENT mode: the registry's database is initialized at start-up");
            store::RegistryStore::connect_waiting_with(
                url,
                &config.initial_schedule()?,
                within,
                config.database_timeouts()?,
            )
            .await
        }
        false => store::RegistryStore::open_with(url, config.home_region(), within, config.database_timeouts()?).await,
    };
    let store = match opened {
        Ok(store) => store,
        Err(store::RegistryError::NotARegistry(why)) => {
            return Err(idgen::config::Refused(format!(
                "registry database {}: {why}",
                idgen::config::redacted_url(url)
            ))
            .into());
        }
        Err(error) => {
            return Err(anyhow::Error::new(error)
                .context(format!("opening the registry database {}", idgen::config::redacted_url(url))));
        }
    };
    // Before the first request: a read finds the horizon a whole lead ahead.
    if let Err(error) = store.advance_horizon(idgen::system_unix_ms(), config.horizon_lead_ms).await {
        tracing::warn!(%error, "could not advance the horizon at start-up");
    }
    let store = Arc::new(store);
    keep_the_horizon_ahead(store.clone(), config.horizon_lead_ms);
    let state = AppState {
        store,
        operators: Arc::new(operators),
        certificate_operators: Arc::new(operators::CertifiedNames::new(config.certificate_operators.clone())),
        refusals: Arc::default(),
        health: Arc::default(),
        horizon_lead_ms: config.horizon_lead_ms,
        retire_grace_ms: config.retire_grace_ms,
        new_registry_quiet_ms: config.new_registry_quiet_ms(),
        lease_table_recorders: Arc::new(operators::CertifiedNames::new(config.lease_table_recorders.clone())),
        now: idgen::system_unix_ms,
    };
    let tls = match config.tls.enabled() {
        true => Some(Arc::new(idgen_server::Tls::load(&config.tls).context("loading the listener's TLS files")?)),
        false => None,
    };
    let mut registry = prometheus_client::registry::Registry::default();
    let quota_metrics = Arc::new(idgen_server::QuotaMetrics::default());
    quota_metrics.register(&mut registry);
    let server_metrics = Arc::new(idgen_server::ServerMetrics::default());
    server_metrics.register(&mut registry);
    state.refusals.register(&mut registry);
    state.health.register(&mut registry);
    let quotas = Arc::new(idgen_server::Quotas::new(&config.quotas, quota_metrics)?);
    let (reload_tls, reload_quotas, reloaded) = (tls.clone(), quotas.clone(), state.clone());
    let development = config.development;
    idgen_server::reload_on_sighup(move || {
        let fresh = RegistryConfig::load(config_file.as_deref())?;
        idgen_server::refuse_mode_change(development, fresh.development)?;
        let operators = fresh.operator_tokens().context("[operators]")?;
        if let Some(tls) = &reload_tls {
            tls.reload(&fresh.tls).context("the [tls] files")?;
        }
        reload_quotas.reload(&fresh.quotas).context("[quotas]")?;
        reloaded.operators.replace(operators);
        // A name taken off either list loses its role with the next request; its open connections
        // are closed as a revoked certificate's are, and it comes back through a new handshake.
        let mut removed = reloaded.certificate_operators.replace(fresh.certificate_operators);
        removed.extend(reloaded.lease_table_recorders.replace(fresh.lease_table_recorders));
        if let (Some(tls), false) = (&reload_tls, removed.is_empty()) {
            let closed = tls.close_callers(|caller| removed.contains(caller.name()));
            tracing::warn!(?removed, closed, "callers taken off certificate_operators or lease_table_recorders");
        }
        Ok(())
    });
    let listeners = idgen_server::Listeners::bind(config.listen, tls, config.health_listen).await?;
    println!("idgen-registry listening on {}", listeners.describe()?);
    let store = state.store.clone();
    let refresh = idgen_server::http_metrics::pool_gauges(&mut registry, move || store.pool_connections());
    let metrics = idgen_server::ServiceMetrics::new(registry, &ROUTES, refresh);
    metrics.http.create_documented(api::OPENAPI, documented_route);
    let health = health_app(state.clone(), metrics.clone());
    let app = idgen_server::App::new(with_quotas(router(state), quotas), metrics);
    let grace = std::time::Duration::from_secs(10);
    listeners.serve(app, health, shutdown, grace, server_metrics, config.limits).await
}

/// The health listener's routes: `GET /healthz` (the registry's own answer, counted in the same
/// request metrics) and nothing else.
pub fn health_app(state: AppState, metrics: idgen_server::ServiceMetrics) -> idgen_server::App {
    let healthz = ROUTES[5];
    let router = Router::new()
        .route(healthz, get(api::healthz).fallback(idgen_server::not_allowed("GET, HEAD")))
        .fallback(api::not_found)
        .with_state(state);
    idgen_server::App::health(router, metrics)
}
