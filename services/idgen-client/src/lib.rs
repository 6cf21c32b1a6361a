//! The client of the idgen fleet, for services that take IDs over the network.
//!
//! - **Endpoints**: the local region's fleet and an ordered list of backups, over one pooled
//!   keep-alive HTTP client (mutual TLS when configured), each request with a timeout.
//! - **Prefetch**: [`Client::next_id`] is served from a buffer of IDs fetched with
//!   `POST /v1/ids:batch` and refilled in the background at a low-water mark. A buffered ID is
//!   handed out only within the validity window of the request that brought it (default 2 s), so
//!   an ID from the client is never older than that.
//! - **Decode**: [`Client::decode`] takes an ID apart locally, with the registry's schedule and
//!   region names (fetched at start, refreshed in the background); no call per decode.
//! - **Failover**: a connection error, a timeout or a 5xx from the endpoint in use moves the
//!   request, and the ones after it, to the next endpoint that answers, at once: the caller sees
//!   no error while any endpoint answers. A background probe of the more preferred endpoints'
//!   `/healthz` moves requests back once one answers 200 `"status": "ok"` (not a region on
//!   standby, which answers 200 `"standby"` and refuses every ID). Moves are logged and counted. A 429 is
//!   not a reason to move: it is returned, with its `Retry-After`.
//!
//! Ordering: IDs from one endpoint are increasing; after a move they come from another region's
//! fleet and are k-sorted against the earlier ones (by time, up to clock error and the validity
//! window).

mod buffer;
pub mod failover;
mod metrics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use idgen::control::registry::RegistrySnapshot;
pub use idgen::control::tls::ClientTlsSection;
use idgen::core::{OPEN_HORIZON, Schedule};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::buffer::Buffer;
use crate::failover::{Failover, Move, Why};
pub use crate::metrics::ClientMetrics;

/// The largest batch the fleet answers (`POST /v1/ids:batch`, `POST /v1/uuids`).
pub const MAX_BATCH: u32 = 1_000;

/// The client's settings. Every field but `url` has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// The local region's fleet, e.g. `https://idgen.eu-west-1.internal`.
    pub url: String,
    /// Other regions' fleets, most preferred first.
    pub backups: Vec<String>,
    /// One request's limit, connecting included; past it the next endpoint is tried.
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// How often the more preferred endpoints' `/healthz` is probed while a backup is in use.
    pub probe_interval_ms: u64,
    /// The CA to trust and the client certificate to present (mutual TLS).
    pub tls: ClientTlsSection,
    pub prefetch: PrefetchSection,
    /// The region registry, for local decoding. Without it, decoding uses the built-in schedule
    /// (development only: a layout the registry added would decode wrongly).
    pub registry_url: Option<String>,
    pub registry_refresh_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefetchSection {
    /// IDs per refill (1–1000); 0 turns prefetching off (one `POST /v1/ids` per ID).
    pub batch: u32,
    /// Refill in the background once the buffer holds this many or fewer.
    pub low_water: u32,
    /// A buffered ID is handed out only this long after the request that brought it was sent.
    pub validity_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            url: String::new(),
            backups: Vec::new(),
            request_timeout_ms: 1_000,
            connect_timeout_ms: 300,
            probe_interval_ms: 1_000,
            tls: ClientTlsSection::default(),
            prefetch: PrefetchSection::default(),
            registry_url: None,
            registry_refresh_ms: 60_000,
        }
    }
}

impl Default for PrefetchSection {
    fn default() -> Self {
        PrefetchSection { batch: 100, low_water: 25, validity_ms: 2_000 }
    }
}

impl ClientConfig {
    /// The defaults, with `url` as the local fleet.
    pub fn new(url: impl Into<String>) -> Self {
        ClientConfig { url: url.into(), ..ClientConfig::default() }
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |what: String| Err(Error::Config(what));
        for url in std::iter::once(&self.url).chain(&self.backups) {
            check_endpoint(url)?;
        }
        if self.request_timeout_ms == 0 || self.connect_timeout_ms == 0 || self.probe_interval_ms < 10 {
            return bad("request_timeout_ms and connect_timeout_ms above 0, probe_interval_ms at least 10".into());
        }
        let p = &self.prefetch;
        let low_water_fits = p.batch == 0 || p.low_water < p.batch;
        if p.batch > MAX_BATCH || !low_water_fits || p.validity_ms == 0 {
            return bad(format!(
                "prefetch: batch 0–{MAX_BATCH}, low_water below batch, validity_ms above 0 (got {}, {}, {})",
                p.batch, p.low_water, p.validity_ms
            ));
        }
        if self.registry_refresh_ms < 100 {
            return bad("registry_refresh_ms must be at least 100".into());
        }
        if let Some(url) = &self.registry_url {
            // The schedule decides how an ID decodes: https, or a development registry on loopback.
            idgen::control::registry::check_registry_url(url, true).map_err(Error::Config)?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Over the caller's quota (429): not a reason to move; wait `retry_after`.
    #[error("over quota at {endpoint}: {message}")]
    OverQuota { endpoint: String, retry_after: Option<Duration>, message: String },
    /// The fleet refused what was asked (another 4xx): the same anywhere, so not retried.
    #[error("{status} {code} from {endpoint}: {message}")]
    Rejected { endpoint: String, status: u16, code: String, message: String },
    /// No endpoint answered; what each one said.
    #[error("no endpoint answered: {}", describe(attempts))]
    Unavailable { attempts: Vec<(String, String)> },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("decoding {id}: {reason}")]
    Decode { id: u64, reason: String },
    #[error("client configuration: {0}")]
    Config(String),
}

fn describe(attempts: &[(String, String)]) -> String {
    attempts.iter().map(|(endpoint, what)| format!("{endpoint}: {what}")).collect::<Vec<_>>().join("; ")
}

/// An ID taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    pub id: u64,
    pub layout: String,
    pub created_at_unix_ms: i64,
    /// Layouts with a region field (v2 and later).
    pub region_number: Option<u32>,
    /// The region's name, as the registry last said.
    pub region: Option<String>,
    pub machine: u32,
    pub sequence: u32,
}

type Now = Arc<dyn Fn() -> Instant + Send + Sync>;

/// How the client is built: a clock for the validity window (tests use a manual one) and a
/// registry for its metrics.
pub struct ClientBuilder<'a> {
    config: ClientConfig,
    now: Now,
    metrics: Option<&'a mut Registry>,
}

impl<'a> ClientBuilder<'a> {
    /// The monotonic clock the validity window is measured with.
    pub fn clock(mut self, now: impl Fn() -> Instant + Send + Sync + 'static) -> Self {
        self.now = Arc::new(now);
        self
    }

    /// Registers the client's metrics (`idgen_client_…`) in `registry`.
    pub fn metrics(mut self, registry: &'a mut Registry) -> Self {
        self.metrics = Some(registry);
        self
    }

    /// Builds the client and starts its background work (probe, registry refresh), which ends
    /// when the last clone of the client is dropped. Fetches the schedule once; a registry that
    /// does not answer is logged and retried in the background, never a reason to fail here.
    pub async fn build(self) -> Result<Client, Error> {
        let config = self.config;
        config.validate()?;
        let http = http_builder(config.request_timeout_ms, config.connect_timeout_ms, &config.tls)?
            .pool_idle_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| Error::Config(format!("the HTTP client: {e}")))?;
        let endpoints: Vec<String> = std::iter::once(&config.url)
            .chain(&config.backups)
            .map(|url| url.trim_end_matches('/').to_owned())
            .collect();
        let metrics = ClientMetrics::new(&endpoints);
        if let Some(registry) = self.metrics {
            metrics.register(registry);
        }
        let decoder = match config.registry_url {
            Some(_) => None,
            None => Some(Decoder::built_in()),
        };
        let inner = Arc::new(Inner {
            route: Mutex::new(Failover::new(endpoints.len())),
            endpoints,
            http,
            buffer: Mutex::new(Buffer::default()),
            fetching: tokio::sync::Mutex::new(()),
            refilling: AtomicBool::new(false),
            now: self.now,
            metrics,
            decoder: RwLock::new(decoder),
            config,
        });
        if inner.config.registry_url.is_some() {
            inner.refresh_schedule().await;
        }
        tokio::spawn(probe(Arc::downgrade(&inner)));
        if inner.config.registry_url.is_some() {
            tokio::spawn(refresh_schedule(Arc::downgrade(&inner)));
        }
        Ok(Client { inner })
    }
}

/// A handle on the fleet; clones share one connection pool, buffer and route.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClientConfig,
    endpoints: Vec<String>,
    http: reqwest::Client,
    route: Mutex<Failover>,
    buffer: Mutex<Buffer>,
    /// Held while a batch is being fetched into the buffer: concurrent callers that find it
    /// empty wait for one fetch instead of each making their own.
    fetching: tokio::sync::Mutex<()>,
    /// A background refill is under way.
    refilling: AtomicBool,
    now: Now,
    metrics: ClientMetrics,
    decoder: RwLock<Option<Decoder>>,
}

struct Decoder {
    schedule: Schedule,
    regions: HashMap<u32, String>,
}

impl Decoder {
    fn built_in() -> Self {
        let schedule = Schedule::default_with_horizon(OPEN_HORIZON).expect("the built-in schedule is valid");
        Decoder { schedule, regions: HashMap::new() }
    }
}

#[derive(Deserialize)]
struct OneId {
    id: String,
}

#[derive(Deserialize)]
struct ManyIds {
    ids: Vec<String>,
}

/// The error body every idgen service answers with (`{"error": {"code", "message"}}`); empty
/// fields for a body that is not one.
#[derive(Debug, Deserialize, Default)]
pub struct ErrorBody {
    pub error: ErrorFields,
}

#[derive(Debug, Deserialize, Default)]
pub struct ErrorFields {
    pub code: String,
    pub message: String,
}

/// An idgen endpoint's URL: `http://` or `https://` with a host.
pub fn check_endpoint(url: &str) -> Result<(), Error> {
    let parsed = reqwest::Url::parse(url).map_err(|e| Error::Config(format!("endpoint {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(Error::Config(format!("endpoint {url:?}: an http:// or https:// URL with a host")));
    }
    Ok(())
}

/// The HTTP client settings every idgen client shares (the fleet's, the public-ID service's):
/// the request and connect timeouts, no Nagle delay, and mutual TLS when `tls` says so.
pub fn http_builder(
    request_timeout_ms: u64,
    connect_timeout_ms: u64,
    tls: &ClientTlsSection,
) -> Result<reqwest::ClientBuilder, Error> {
    let tls = tls.client_config().map_err(|e| Error::Config(format!("tls: {e:#}")))?;
    let mut http = reqwest::Client::builder()
        .timeout(Duration::from_millis(request_timeout_ms))
        .connect_timeout(Duration::from_millis(connect_timeout_ms))
        .tcp_nodelay(true);
    if let Some(tls) = tls {
        http = http.use_preconfigured_tls(tls);
    }
    Ok(http)
}

/// A `Retry-After` in seconds, as every idgen service sends it.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

impl Client {
    /// A client with the default clock and no metrics registry.
    pub async fn new(config: ClientConfig) -> Result<Client, Error> {
        Client::builder(config).build().await
    }

    pub fn builder<'a>(config: ClientConfig) -> ClientBuilder<'a> {
        ClientBuilder { config, now: Arc::new(Instant::now), metrics: None }
    }

    /// One ID from the buffer if it holds a valid one, without waiting (`None` otherwise, and
    /// always with prefetch off); at the low-water mark it starts a refill, so it must be called
    /// within the client's tokio runtime. A binding's synchronous fast path.
    pub fn try_next_id(&self) -> Option<u64> {
        self.take_buffered()
    }

    /// One ID: from the buffer while it holds a valid one, else from a fresh batch.
    pub async fn next_id(&self) -> Result<u64, Error> {
        let inner = &self.inner;
        if inner.config.prefetch.batch == 0 {
            let (answer, _) = inner.call::<OneId>("/v1/ids", serde_json::json!({})).await?;
            return parse_id(&answer.id);
        }
        // A batch can arrive already older than the window (a slow answer, a failover's
        // timeouts): then it is dropped, and a fresh one asked for, a few times at most.
        for _ in 0..3 {
            if let Some(id) = self.take_buffered() {
                return Ok(id);
            }
            let _fetching = inner.fetching.lock().await;
            if let Some(id) = self.take_buffered() {
                return Ok(id);
            }
            inner.fill().await?;
        }
        self.take_buffered().ok_or_else(|| Error::Unavailable {
            attempts: vec![("every endpoint".into(), "batches arrived older than the validity window".into())],
        })
    }

    /// `count` IDs straight from the fleet (not the buffer), in requests of at most 1,000;
    /// increasing while they come from one endpoint.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<u64>, Error> {
        let mut ids = Vec::with_capacity(count as usize);
        for chunk in chunks(count)? {
            let (answer, _) =
                self.inner.call::<ManyIds>("/v1/ids:batch", serde_json::json!({ "count": chunk })).await?;
            for id in &answer.ids {
                ids.push(parse_id(id)?);
            }
        }
        Ok(ids)
    }

    /// `count` UUIDv7s from the fleet, in requests of at most 1,000.
    pub async fn next_uuids(&self, count: u32) -> Result<Vec<uuid::Uuid>, Error> {
        let mut uuids = Vec::with_capacity(count as usize);
        for chunk in chunks(count)? {
            let (answer, _) = self.inner.call::<ManyIds>("/v1/uuids", serde_json::json!({ "count": chunk })).await?;
            for text in &answer.ids {
                uuids.push(uuid::Uuid::parse_str(text).map_err(|e| Error::Unavailable {
                    attempts: vec![("the fleet".into(), format!("answered an invalid UUID {text:?}: {e}"))],
                })?);
            }
        }
        Ok(uuids)
    }

    /// Takes `id` apart with the registry's schedule, locally.
    pub fn decode(&self, id: u64) -> Result<Decoded, Error> {
        let decoder = self.inner.decoder.read().unwrap_or_else(|p| p.into_inner());
        let Some(decoder) = decoder.as_ref() else {
            return Err(Error::Decode { id, reason: "the registry has not answered yet: no schedule".into() });
        };
        let fields = decoder.schedule.decode(id).map_err(|e| Error::Decode { id, reason: e.to_string() })?;
        Ok(Decoded {
            id,
            layout: fields.layout.name().to_owned(),
            created_at_unix_ms: fields.timestamp.unix_ms(),
            region_number: fields.region_number,
            region: fields.region_number.and_then(|n| decoder.regions.get(&n).cloned()),
            machine: fields.machine,
            sequence: fields.sequence,
        })
    }

    /// The endpoint requests go to now.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoints[self.inner.route()]
    }

    /// IDs in the buffer (stale ones included until the next take drops them).
    pub fn buffered(&self) -> usize {
        self.inner.buffer.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn metrics(&self) -> &ClientMetrics {
        &self.inner.metrics
    }

    /// Fetches the registry's schedule now (it is also refreshed in the background).
    pub async fn refresh_schedule(&self) {
        self.inner.refresh_schedule().await;
    }

    fn take_buffered(&self) -> Option<u64> {
        let inner = &self.inner;
        let validity = Duration::from_millis(inner.config.prefetch.validity_ms);
        let (id, dropped, left) = {
            let mut buffer = inner.buffer.lock().unwrap_or_else(|p| p.into_inner());
            let (id, dropped) = buffer.take((inner.now)(), validity);
            (id, dropped, buffer.len())
        };
        if dropped > 0 {
            inner.metrics.stale_ids.inc_by(dropped as u64);
        }
        inner.metrics.buffered.set(left as i64);
        // Refill ahead of need; an empty buffer is filled by the caller that found it empty.
        if id.is_some()
            && left <= inner.config.prefetch.low_water as usize
            && !inner.refilling.swap(true, Ordering::AcqRel)
        {
            let inner = self.inner.clone();
            tokio::spawn(async move {
                let _fetching = inner.fetching.lock().await;
                let low = inner.buffer.lock().unwrap_or_else(|p| p.into_inner()).len()
                    <= inner.config.prefetch.low_water as usize;
                if low && let Err(error) = inner.fill().await {
                    tracing::warn!(%error, "prefetch refill failed; the next caller asks again");
                }
                inner.refilling.store(false, Ordering::Release);
            });
        }
        id
    }
}

fn chunks(count: u32) -> Result<impl Iterator<Item = u32>, Error> {
    if count == 0 {
        return Err(Error::InvalidArgument("count must be at least 1".into()));
    }
    Ok((0..count.div_ceil(MAX_BATCH)).map(move |i| (count - i * MAX_BATCH).min(MAX_BATCH)))
}

fn parse_id(text: &str) -> Result<u64, Error> {
    text.parse().map_err(|_| Error::Unavailable {
        attempts: vec![("the fleet".into(), format!("answered an ID that is not a number: {text:?}"))],
    })
}

impl Inner {
    fn route(&self) -> usize {
        self.route.lock().unwrap_or_else(|p| p.into_inner()).active()
    }

    /// Fetches one batch into the buffer.
    async fn fill(&self) -> Result<(), Error> {
        let batch = self.config.prefetch.batch;
        let (answer, asked_at) = self.call::<ManyIds>("/v1/ids:batch", serde_json::json!({ "count": batch })).await?;
        let ids = answer.ids.iter().map(|id| parse_id(id)).collect::<Result<Vec<_>, _>>()?;
        let mut buffer = self.buffer.lock().unwrap_or_else(|p| p.into_inner());
        buffer.push(asked_at, ids);
        self.metrics.buffered.set(buffer.len() as i64);
        Ok(())
    }

    /// POSTs `body` to `path` on the endpoint in use, then on every other by preference until
    /// one answers. Returns the answer and when the request that got it was sent.
    async fn call<T: DeserializeOwned>(&self, path: &str, body: serde_json::Value) -> Result<(T, Instant), Error> {
        let order = self.route.lock().unwrap_or_else(|p| p.into_inner()).order();
        let mut attempts = Vec::new();
        for index in order {
            let endpoint = &self.endpoints[index];
            let asked_at = (self.now)();
            let failure = match self.http.post(format!("{endpoint}{path}")).json(&body).send().await {
                Err(error) => transport_failure(&error),
                Ok(response) if response.status().is_success() => match response.json::<T>().await {
                    Ok(answer) => {
                        self.metrics.request(index, "ok");
                        self.answered(index, &attempts);
                        return Ok((answer, asked_at));
                    }
                    Err(error) => format!("an unreadable answer: {}", transport_failure(&error)),
                },
                Ok(response) if response.status().is_server_error() => {
                    let status = response.status().as_u16();
                    let body: ErrorBody = response.json().await.unwrap_or_default();
                    format!("{status} {}", body.error.code).trim_end().to_owned()
                }
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = retry_after(response.headers());
                    let ErrorBody { error } = response.json().await.unwrap_or_default();
                    let endpoint = endpoint.clone();
                    if status == 429 {
                        self.metrics.request(index, "over_quota");
                        return Err(Error::OverQuota { endpoint, retry_after, message: error.message });
                    }
                    self.metrics.request(index, "rejected");
                    return Err(Error::Rejected { endpoint, status, code: error.code, message: error.message });
                }
            };
            self.metrics.request(index, "failed");
            attempts.push((endpoint.clone(), failure));
        }
        tracing::error!(attempts = describe(&attempts), "no idgen endpoint answered");
        Err(Error::Unavailable { attempts })
    }

    fn answered(&self, index: usize, failed_before: &[(String, String)]) {
        let moved = self.route.lock().unwrap_or_else(|p| p.into_inner()).answered(index);
        if let Some(moved) = moved {
            self.record(&moved, &describe(failed_before));
        }
    }

    fn record(&self, moved: &Move, why: &str) {
        let (from, to) = (&self.endpoints[moved.from], &self.endpoints[moved.to]);
        match moved.why {
            Why::Failover => tracing::warn!(from, to, why, "idgen endpoint failed: requests move to the next"),
            Why::Recovered => {
                tracing::info!(from, to, "idgen endpoint answers its health probe again: requests move back")
            }
        }
        self.metrics.moved(moved);
    }

    /// Whether the endpoint issues: `/healthz` answers 200 with `"status": "ok"`. A region on
    /// standby answers 200 `"standby"` (its load balancer's health check must pass) while it
    /// refuses every ID: moving back to it would fail the next request over again.
    async fn healthy(&self, index: usize) -> bool {
        let url = format!("{}/healthz", self.endpoints[index]);
        match self.http.get(url).send().await {
            Ok(response) if response.status() == reqwest::StatusCode::OK => {
                response.json::<serde_json::Value>().await.is_ok_and(|body| body["status"] == "ok")
            }
            _ => false,
        }
    }

    async fn refresh_schedule(&self) {
        let Some(url) = &self.config.registry_url else { return };
        match RegistrySnapshot::fetch_with(&self.http, url).await {
            Ok(snapshot) => match snapshot.schedule() {
                Ok(schedule) => {
                    let decoder = Decoder { schedule, regions: snapshot.region_names() };
                    *self.decoder.write().unwrap_or_else(|p| p.into_inner()) = Some(decoder);
                }
                Err(error) => tracing::error!(%error, "the registry's schedule was refused; keeping the one held"),
            },
            Err(error) => tracing::warn!(%error, "registry unreachable; decoding with the schedule held"),
        }
    }
}

fn transport_failure(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "connection failed"
    } else {
        "transport error"
    };
    // The innermost cause says what actually happened (refused, reset, …).
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    format!("{kind} ({cause})")
}

/// While a backup is in use, probes the preferred endpoints' `/healthz` every probe interval
/// and moves requests back to the first that answers 200 `"status": "ok"`.
async fn probe(inner: Weak<Inner>) {
    loop {
        let Some(interval) = inner.upgrade().map(|i| Duration::from_millis(i.config.probe_interval_ms)) else {
            return;
        };
        tokio::time::sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        let candidates = inner.route.lock().unwrap_or_else(|p| p.into_inner()).to_probe();
        for index in candidates {
            if inner.healthy(index).await {
                let moved = inner.route.lock().unwrap_or_else(|p| p.into_inner()).probe_answered(index);
                if let Some(moved) = moved {
                    inner.record(&moved, "health probe answered 200 ok");
                }
                break;
            }
        }
    }
}

async fn refresh_schedule(inner: Weak<Inner>) {
    loop {
        let Some(every) = inner.upgrade().map(|i| Duration::from_millis(i.config.registry_refresh_ms)) else {
            return;
        };
        // Sooner while there is no schedule at all.
        let missing = inner.upgrade().is_some_and(|i| i.decoder.read().unwrap_or_else(|p| p.into_inner()).is_none());
        tokio::time::sleep(if missing { every.min(Duration::from_secs(1)) } else { every }).await;
        let Some(inner) = inner.upgrade() else { return };
        inner.refresh_schedule().await;
    }
}
