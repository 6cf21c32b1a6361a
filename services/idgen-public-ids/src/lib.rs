//! The public-ID service (SPEC §7): customers never see an internal ID. Three formats: `opaque`
//! (128 random bits from the OS CSPRNG, stored), `uuidv7` (stored) and `encrypted` (stateless:
//! AES-256 under a data key that AWS KMS generated and unwraps at start-up). Resolving an
//! unknown, malformed or forged public ID gives one and the same 404. Who may create, resolve and
//! look up is configured per caller identity, operation and format (`[access]`): anyone else is
//! refused 403 before any database or KMS work. Stored mappings never change once made, so the
//! ones an instance has seen are kept in a bounded read cache ([`cache`]); a miss never is.

pub mod access;
pub mod api;
pub mod body;
pub mod cache;
pub mod check;
pub mod config;
pub mod format;
pub mod kms;
pub mod store;
pub mod types;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::routing::{get, post};

pub use api::AppState;
pub use config::PublicIdsConfig;

/// The service's routes, as `/metrics` labels them (anything else is `other`).
pub const ROUTES: [&str; 7] = [
    "/v1/public-ids",
    "/v1/public-ids:batch",
    "/v1/public-ids/{public_id}",
    "/v1/internal-ids/{internal_id}/public-id",
    "/healthz",
    "/metrics",
    "/openapi.json",
];

pub fn router(state: AppState) -> Router {
    routes(Arc::new(state))
}

/// [`router`], on a state already shared.
fn routes(state: Arc<AppState>) -> Router {
    use idgen_server::not_allowed;
    let [create, batch, resolve, lookup, healthz, _, openapi] = ROUTES;
    Router::new()
        .route(create, post(api::create).fallback(not_allowed("POST")))
        .route(batch, post(api::create_batch).fallback(not_allowed("POST")))
        .route(resolve, get(api::resolve).fallback(not_allowed("GET, HEAD")))
        .route(lookup, get(api::lookup).fallback(not_allowed("GET, HEAD")))
        .route(healthz, get(api::healthz).fallback(not_allowed("GET, HEAD")))
        .route(openapi, idgen_server::openapi_route(api::served_openapi(&state.types)))
        .fallback(api::not_found)
        // One Arc for the whole state: a request's extractor clones it once, not every field.
        .with_state(state)
}

/// The service's HTTP service ([`idgen_server::App`]): every route of [`router`] with
/// `/metrics`, each request counted and timed, and `GET /v1/public-ids/{public_id}`, the busiest
/// call any customer makes, answered before the router ([`Resolve`]).
pub type App = idgen_server::App<Resolve>;

/// [`App`] of `state`, counted in `metrics`.
pub fn app(state: AppState, metrics: idgen_server::ServiceMetrics) -> App {
    let state = Arc::new(state);
    idgen_server::App::new(routes(state.clone()), metrics).answering(Resolve(state))
}

/// `GET /v1/public-ids/{public_id}` answered without axum's router, its extractors and the
/// caller's request extension (which cost a cache hit about as much as its own work): exactly
/// what the router's route answers, which a test holds. `HEAD` of a public ID goes through the
/// router.
#[derive(Clone)]
pub struct Resolve(Arc<AppState>);

impl idgen_server::FastRoute for Resolve {
    fn route(&self, request: &axum::extract::Request) -> Option<&'static str> {
        let resolve =
            request.method() == axum::http::Method::GET && api::resolve_segment(request.uri().path()).is_some();
        resolve.then_some(ROUTES[2])
    }

    fn answer(
        &self,
        caller: &idgen_server::Caller,
        request: axum::extract::Request,
        recording: idgen_server::app::Recording,
    ) -> idgen_server::app::Answer {
        let (state, caller) = (self.0.clone(), caller.clone());
        let uri = request.into_parts().0.uri;
        Box::pin(async move {
            let response = axum::response::IntoResponse::into_response(api::resolve_uri(&state, &caller, &uri).await);
            recording.record(&response);
            Ok(response)
        })
    }
}

/// `idgen public init`: makes the configured database the service's (its migrations) and, with
/// a `[kms]` key and the encrypted format offered, makes data key version 1 if there is none.
/// Idempotent; refuses another service's database. Returns the key version it made, if any.
///
/// With `owner_url` (PostgreSQL), the migrations and the data key are written as that role (the
/// schema's owner), and the role `database_url` names, the one the service runs as, is granted
/// exactly what the service uses: mappings read and added, data keys read; with
/// `runtime_password`, that role is made if missing and given that password.
pub async fn init(
    config: &PublicIdsConfig,
    owner_url: Option<&str>,
    runtime_password: Option<&str>,
) -> anyhow::Result<Initialized> {
    init_counting(config, owner_url, runtime_password, &kms::KmsMetrics::default()).await
}

/// What [`init`] did beyond the migrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initialized {
    /// The data key version it made, if it made one.
    pub key_version_made: Option<u8>,
    /// The mappings made before 16-byte storage that it copied, if there were any to copy
    /// ([`store::legacy`]).
    pub copied: Option<store::legacy::Copied>,
}

/// [`init`], counting its KMS calls in `metrics`.
async fn init_counting(
    config: &PublicIdsConfig,
    owner_url: Option<&str>,
    runtime_password: Option<&str>,
    metrics: &kms::KmsMetrics,
) -> anyhow::Result<Initialized> {
    let within = std::time::Duration::from_millis(config.sqlite_open_timeout_ms);
    let url = owner_url.unwrap_or(config.database_url());
    let runtime_role = idgen_server::database::runtime_role(owner_url, config.database_url())?;
    let runtime = runtime_role.as_deref().map(|role| (role, runtime_password));
    let copied = store::PublicIdStore::initialize(url, within, runtime)
        .await
        .with_context(|| format!("initializing the public-ID database {}", idgen::config::redacted_url(url)))?;
    let (Some(kms), true) = (&config.kms, config.offered().contains(&format::Format::Encrypted)) else {
        return Ok(Initialized { key_version_made: None, copied });
    };
    let store = store::PublicIdStore::open(url, within).await?;
    let client = kms::client(&kms.settings()).await;
    Ok(Initialized { key_version_made: kms::init_keys(&store, &client, &kms.key_id, metrics).await?, copied })
}

/// `idgen public drop-legacy-table`: drops PostgreSQL's table of mappings from before 16-byte
/// storage once every row of it is copied ([`store::legacy::drop_legacy_table`]), as the
/// schema's owner (`owner_url`) or the configured database's user.
pub async fn drop_legacy_table(
    config: &PublicIdsConfig,
    owner_url: Option<&str>,
) -> anyhow::Result<store::legacy::Dropped> {
    let url = owner_url.unwrap_or(config.database_url());
    let connection = idgen_server::database::Pool::connect_one(url).await?;
    let dropped = match &connection {
        idgen_server::database::Pool::Postgres(pool) => store::legacy::drop_legacy_table(pool).await,
        idgen_server::database::Pool::Sqlite(_) => Ok(store::legacy::Dropped::NothingToDrop),
    };
    connection.close().await;
    dropped
}

/// `idgen public seal-legacy`: the filter of every untagged opaque public ID, sealed
/// ([`check`]).
pub async fn seal_legacy(config: &PublicIdsConfig, owner_url: Option<&str>) -> anyhow::Result<store::check::Sealed> {
    let url = owner_url.unwrap_or(config.database_url());
    let connection = idgen_server::database::Pool::connect_one(url).await?;
    let sealed = store::check::seal_legacy(&connection, idgen::system_unix_ms()).await;
    connection.close().await;
    sealed
}

/// `idgen public rotate-check-key`: the next check key version, used for new opaque IDs
/// [`check::ROTATION_DELAY`] from now; `None` when all 255 are used.
pub async fn rotate_check_key(config: &PublicIdsConfig, owner_url: Option<&str>) -> anyhow::Result<Option<u8>> {
    let url = owner_url.unwrap_or(config.database_url());
    let connection = idgen_server::database::Pool::connect_one(url).await?;
    let added = store::check::add_check_key(&connection, idgen::system_unix_ms()).await;
    connection.close().await;
    added
}

/// `idgen public retire-check-key`: retires check key `version` ([`store::check::retire_check_key`]).
pub async fn retire_check_key(
    config: &PublicIdsConfig,
    owner_url: Option<&str>,
    version: u8,
    force: bool,
) -> anyhow::Result<store::check::RetiredKey> {
    let url = owner_url.unwrap_or(config.database_url());
    let connection = idgen_server::database::Pool::connect_one(url).await?;
    let retired = store::check::retire_check_key(&connection, version, force, idgen::system_unix_ms()).await;
    connection.close().await;
    retired
}

/// Says at start-up (and on reload) who may do what; a warning when an operation is open to
/// nobody, or to everybody, or a caller's creates are refused.
fn log_access(config: &PublicIdsConfig) {
    let line = access::describe(config.access.as_ref(), config.development);
    if line.contains("NOBODY") || line.contains("REFUSED") || config.access.is_none() {
        tracing::warn!("[access]: {line}");
    } else {
        tracing::info!("[access]: {line}");
    }
}

/// The database and KMS probes, ended when the service ends (dropped with `serve`'s frame).
struct Probes(Vec<tokio::task::JoinHandle<()>>);

impl Probes {
    /// Probes the database once (so the first scrape shows it), then every `database_probe_ms`;
    /// KMS, when a key is configured, every `kms_probe_ms` (the start just asked it).
    async fn start(
        config: &PublicIdsConfig,
        store: Arc<store::PublicIdStore>,
        gate: Arc<check::Gate>,
        kms: Option<(kms::KmsProbe, kms::KmsMetrics)>,
    ) -> Probes {
        let every = std::time::Duration::from_millis(config.database_probe_ms);
        // A probe that takes longer than 5 s is a database that is not serving.
        let within = every.min(std::time::Duration::from_secs(5));
        store.probe(within).await;
        store.probe_replica_lag(within).await;
        let probed = store.clone();
        let mut tasks = vec![tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                probed.probe(within).await;
                probed.probe_replica_lag(within).await;
            }
        })];
        // The check keys and the legacy filter: a version `rotate-check-key` added, a filter
        // `seal-legacy` sealed, taken up without a restart. Each reload within a deadline (a
        // silent database fails it, and the next is tried); a resolve that met stale keys asks
        // for one at once (at most one a second).
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(check::REFRESH) => {}
                    _ = gate.reload_asked() => {}
                }
                let state = gate.state();
                let reload = store::check::refreshed(store.db(), &state);
                match tokio::time::timeout(check::REFRESH_DEADLINE, reload).await {
                    Ok(Ok(fresh)) => gate.replace(fresh),
                    Ok(Err(error)) => tracing::warn!(%error, age = ?gate.age(), "public IDs: reloading the check keys"),
                    Err(_) => tracing::warn!(
                        within = ?check::REFRESH_DEADLINE,
                        age = ?gate.age(),
                        "public IDs: reloading the check keys: the database did not answer"
                    ),
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        }));
        if let Some((probe, metrics)) = kms {
            let every = std::time::Duration::from_millis(config.kms_probe_ms);
            tasks.push(tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    probe.check(&metrics).await;
                }
            }));
        }
        Probes(tasks)
    }
}

impl Drop for Probes {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// Opens the store, unwraps the data keys (when KMS is configured), binds and serves. In
/// development mode the database (and a first data key) is made first; in production it must
/// have been (`idgen public init`): an empty or foreign database, or one without a data key while
/// the encrypted format is offered, is refused ([`idgen::config::Refused`]: exit status 2). On
/// SIGHUP the `[tls]` files, `[quotas]` and `[access]` of `config_file` are read again.
pub async fn serve(
    config: PublicIdsConfig,
    config_file: Option<std::path::PathBuf>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    config.validate()?;
    let config_development = config.development;
    let url = config.database_url();
    let within = std::time::Duration::from_millis(config.sqlite_open_timeout_ms);
    let mut registry = prometheus_client::registry::Registry::default();
    let kms_metrics = kms::KmsMetrics::default();
    kms_metrics.register(&mut registry);
    if config.development {
        tracing::warn!(database = %idgen::config::redacted_url(url), "DEVELOPMENT mode: the public-ID database (and a first data key) is made at start-up");
        init_counting(&config, None, None, &kms_metrics).await?;
    }
    let mut store = store::PublicIdStore::open_with(url, within, config.pool_settings())
        .await
        .with_context(|| format!("opening the public-ID database {}", idgen::config::redacted_url(url)))?
        .with_primary_budget(config.primary_reads(), config.pool_settings().acquire_timeout);
    store.metrics().register(&mut registry);
    if let Some(read) = &config.read_database_url {
        store = store.with_replica(read, config.pool_settings(), config.fallback_settings())?;
        store.metrics().register_replica(&mut registry);
    }
    let offered = config.offered();
    let types = Arc::new(config.types()?);
    if !types.is_empty() && store.legacy_table_remains().await? {
        return Err(idgen::config::Refused(
            "[types]: typed public IDs need the table of mappings from before 16-byte storage dropped first: once no \
             instance of the previous version runs (it knows no types, and would resolve a typed public ID without its \
             prefix), run `idgen public drop-legacy-table`"
                .into(),
        )
        .into());
    }
    tracing::info!("{}", types.describe());
    let mut kms_probe = None;
    let keyring = match (&config.kms, &config.development_key_file) {
        _ if !offered.contains(&format::Format::Encrypted) => None,
        (Some(kms), _) => {
            let client = kms::client(&kms.settings()).await;
            let keyring = kms::load_keyring(&store, &client, &kms.key_id, &kms.previous_key_ids, &kms_metrics)
                .await
                .context("unwrapping the data keys with KMS")?;
            tracing::info!(versions = ?keyring.versions(), "encrypted format ready");
            kms_metrics.register_probe(&mut registry);
            kms_metrics.up.set(1);
            kms_probe = Some(kms::KmsProbe::new(client, store.wrapped_keys().await?));
            Some(Arc::new(keyring))
        }
        (None, Some(file)) => {
            let keyring = kms::development_keyring(file)?;
            tracing::warn!(file = %file.display(), "DEVELOPMENT data key for the encrypted format, from a local file (production keeps it wrapped by KMS)");
            Some(Arc::new(keyring))
        }
        (None, None) => {
            tracing::warn!("no KMS key configured: the encrypted format is unavailable");
            None
        }
    };
    let quota_metrics = Arc::new(idgen_server::QuotaMetrics::default());
    quota_metrics.register(&mut registry);
    let server_metrics = Arc::new(idgen_server::ServerMetrics::default());
    server_metrics.register(&mut registry);
    let quotas = Arc::new(idgen_server::Quotas::new(&config.quotas, quota_metrics)?);
    let access_metrics = Arc::new(access::AccessMetrics::default());
    access_metrics.register(&mut registry);
    let access = Arc::new(access::Access::new(
        access::Rules::from_config(config.access.as_ref(), config.development),
        access_metrics,
    ));
    log_access(&config);
    let random_failures = Arc::new(format::RandomSourceMetrics::default());
    random_failures.register(&mut registry);
    let tls = match config.tls.enabled() {
        true => Some(Arc::new(idgen_server::Tls::load(&config.tls).context("loading the listener's TLS files")?)),
        false => None,
    };
    let (reload_tls, reload_quotas, reload_access) = (tls.clone(), quotas.clone(), access.clone());
    idgen_server::reload_on_sighup(move || {
        let fresh = PublicIdsConfig::load(config_file.as_deref())?;
        idgen_server::refuse_mode_change(config_development, fresh.development)?;
        if let Some(tls) = &reload_tls {
            tls.reload(&fresh.tls).context("the [tls] files")?;
        }
        reload_quotas.reload(&fresh.quotas).context("[quotas]")?;
        // The mode is the running service's: a reload never turns a production service's
        // missing section into "everybody".
        reload_access.reload(access::Rules::from_config(fresh.access.as_ref(), config_development));
        log_access(&fresh);
        Ok(())
    });
    let cache = Arc::new(cache::MappingCache::new(config.cache.max_entries));
    cache.register(&mut registry);
    let gate = Arc::new(check::Gate::new(store::check::gate_state(store.db()).await?));
    gate.register(&mut registry);
    if let check::Legacy::Open = gate.state().legacy {
        tracing::warn!(
            "public IDs made before check keys are not sealed yet: every untagged opaque public ID is read; once no \
             instance of the previous version runs: idgen public seal-legacy"
        );
    }
    let state = AppState {
        store: Arc::new(store),
        cache,
        keyring,
        quotas,
        formats: offered.into(),
        access,
        random: Arc::new(format::OsRandom),
        random_failures,
        types,
        gate,
    };
    let _probes =
        Probes::start(&config, state.store.clone(), state.gate.clone(), kms_probe.map(|probe| (probe, kms_metrics)))
            .await;
    let listeners = idgen_server::Listeners::bind(config.listen, tls, config.health_listen).await?;
    println!("idgen-public-ids listening on {}", listeners.describe()?);
    let store = state.store.clone();
    let pool = idgen_server::http_metrics::pool_gauges(&mut registry, move || store.pool_connections());
    let cache = state.cache.clone();
    let refresh = move || {
        pool();
        cache.refresh_gauge();
    };
    let metrics = idgen_server::ServiceMetrics::new(registry, &ROUTES, refresh);
    metrics.http.create_documented(api::OPENAPI, str::to_owned);
    let health = health_app(state.clone(), metrics.clone());
    let app = app(state, metrics);
    let grace = std::time::Duration::from_secs(10);
    listeners.serve(app, health, shutdown, grace, server_metrics, config.limits).await
}

/// The health listener's routes: `GET /healthz` (the service's own answer, counted in the same
/// request metrics) and nothing else.
pub fn health_app(state: AppState, metrics: idgen_server::ServiceMetrics) -> App {
    let healthz = ROUTES[4];
    let router = Router::new()
        .route(healthz, get(api::healthz).fallback(idgen_server::not_allowed("GET, HEAD")))
        .fallback(api::not_found)
        .with_state(Arc::new(state));
    idgen_server::App::health(router, metrics)
}
