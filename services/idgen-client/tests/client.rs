//! The client against stand-in fleets on loopback that the test can make refuse (503), hang
//! (past the request timeout), answer 429 or vanish, with a manual monotonic clock for the
//! prefetch validity window.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use idgen_client::{Client, ClientConfig, Error};
use serde_json::{Value, json};

/// A monotonic clock the test moves.
#[derive(Clone)]
struct ManualInstant {
    base: Instant,
    offset_ms: Arc<AtomicU64>,
}

impl ManualInstant {
    fn new() -> Self {
        ManualInstant { base: Instant::now(), offset_ms: Arc::default() }
    }
    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.offset_ms.load(Ordering::SeqCst))
    }
    fn advance(&self, ms: u64) {
        self.offset_ms.fetch_add(ms, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Serve,
    Refuse,
    Hang,
    OverQuota,
    /// A region on standby: every ID refused (503 `schedule`), its health check 200 `standby`.
    Standby,
}

struct Fleet {
    /// IDs are `base + n`: each fleet its own range, so the test knows which one issued an ID.
    base: u64,
    next: AtomicU64,
    mode: Mutex<Mode>,
    requests: AtomicUsize,
    /// Per batch served: when (by the manual clock), and its IDs' range.
    served: Mutex<Vec<(Instant, u64, u64)>>,
    clock: ManualInstant,
}

type Shared = Arc<Fleet>;

impl Fleet {
    fn mode(&self) -> Mode {
        *self.mode.lock().unwrap()
    }
    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }
    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn refusal(fleet: &Fleet) -> Option<Response> {
    fleet.requests.fetch_add(1, Ordering::SeqCst);
    match fleet.mode() {
        Mode::Serve => None,
        Mode::Refuse => Some(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1")],
                Json(json!({"error": {"code": "lease", "message": "no lease"}})),
            )
                .into_response(),
        ),
        Mode::Standby => Some(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("retry-after", "1")],
                Json(json!({"error": {"code": "schedule", "message": "not the home region"}})),
            )
                .into_response(),
        ),
        Mode::OverQuota => Some(
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "3")],
                Json(json!({"error": {"code": "over_quota", "message": "orders is over its quota"}})),
            )
                .into_response(),
        ),
        Mode::Hang => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            None
        }
    }
}

async fn one(State(fleet): State<Shared>) -> Response {
    if let Some(refused) = refusal(&fleet).await {
        return refused;
    }
    let id = fleet.base + fleet.next.fetch_add(1, Ordering::SeqCst);
    Json(json!({"id": id.to_string(), "id_num": id})).into_response()
}

async fn batch(State(fleet): State<Shared>, Json(body): Json<Value>) -> Response {
    if let Some(refused) = refusal(&fleet).await {
        return refused;
    }
    let count = body["count"].as_u64().unwrap();
    assert!((1..=1000).contains(&count), "the client asked for {count}");
    let first = fleet.base + fleet.next.fetch_add(count, Ordering::SeqCst);
    fleet.served.lock().unwrap().push((fleet.clock.now(), first, first + count - 1));
    let ids: Vec<String> = (first..first + count).map(|id| id.to_string()).collect();
    Json(json!({ "ids": ids })).into_response()
}

async fn uuids(State(fleet): State<Shared>, Json(body): Json<Value>) -> Response {
    if let Some(refused) = refusal(&fleet).await {
        return refused;
    }
    let count = body["count"].as_u64().unwrap();
    let ids: Vec<String> = (0..count).map(|i| format!("019a0000-0000-7000-8000-{:012x}", fleet.base + i)).collect();
    Json(json!({ "ids": ids })).into_response()
}

async fn healthz(State(fleet): State<Shared>) -> Response {
    match fleet.mode() {
        Mode::Serve => Json(json!({"status": "ok"})).into_response(),
        Mode::Standby => Json(json!({"status": "standby", "reason": "schedule"})).into_response(),
        _ => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "refusing"}))).into_response(),
    }
}

async fn fleet(base: u64, clock: &ManualInstant) -> (String, Shared) {
    let shared = Arc::new(Fleet {
        base,
        next: AtomicU64::new(0),
        mode: Mutex::new(Mode::Serve),
        requests: AtomicUsize::new(0),
        served: Mutex::new(Vec::new()),
        clock: clock.clone(),
    });
    let app = axum::Router::new()
        .route("/v1/ids", post(one))
        .route("/v1/ids:batch", post(batch))
        .route("/v1/uuids", post(uuids))
        .route("/healthz", get(healthz))
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, shared)
}

/// A URL nothing listens on: connections are refused.
async fn nothing_listening() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

const LOCAL: u64 = 1_000_000;
const BACKUP: u64 = 2_000_000;

fn from(base: u64, id: u64) -> bool {
    (base..base + 1_000_000).contains(&id)
}

async fn client(config: ClientConfig, clock: &ManualInstant) -> Client {
    let clock = clock.clone();
    Client::builder(config).clock(move || clock.now()).build().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_id_is_never_older_than_the_validity_window() {
    let clock = ManualInstant::new();
    let (url, local) = fleet(LOCAL, &clock).await;
    let mut config = ClientConfig::new(url);
    (config.prefetch.batch, config.prefetch.low_water, config.prefetch.validity_ms) = (50, 10, 2_000);
    let client = client(config, &clock).await;
    let mut handed = Vec::new();
    // Takes at an uneven pace: bursts, then pauses longer than the window.
    for step in 0..2_000u64 {
        let id = client.next_id().await.unwrap();
        handed.push((clock.now(), id));
        clock.advance(match step % 97 {
            0 => 2_500,
            n if n % 7 == 0 => 300,
            _ => 3,
        });
        if step % 50 == 0 {
            // Let a background refill land.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let served = local.served.lock().unwrap().clone();
    for (at, id) in &handed {
        let (served_at, _, _) = served.iter().find(|(_, first, last)| (first..=last).contains(&id)).unwrap();
        let age = at.duration_since(*served_at);
        assert!(age < Duration::from_millis(2_000), "ID {id} handed out {age:?} after its batch was served");
    }
    assert!(handed.windows(2).all(|w| w[0].1 < w[1].1), "increasing from one endpoint");
    assert!(client.metrics().stale_ids() > 0, "the pauses made batches stale: the window was exercised");
    println!(
        "{} IDs handed out, {} dropped as stale, {} batches",
        handed.len(),
        client.metrics().stale_ids(),
        served.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refill_that_fails_falls_over_like_a_request_and_the_probe_brings_it_back() {
    let clock = ManualInstant::new();
    let (local_url, local) = fleet(LOCAL, &clock).await;
    let (backup_url, backup) = fleet(BACKUP, &clock).await;
    let mut config = ClientConfig::new(local_url.clone());
    config.backups = vec![backup_url.clone()];
    config.probe_interval_ms = 50;
    (config.prefetch.batch, config.prefetch.low_water) = (20, 5);
    let client = client(config, &clock).await;
    assert!(from(LOCAL, client.next_id().await.unwrap()));

    local.set(Mode::Refuse);
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids.push(client.next_id().await.expect("no caller-visible error while the backup answers"));
    }
    assert!(ids.iter().any(|id| from(BACKUP, *id)), "refills came from the backup");
    assert_eq!(client.endpoint(), backup_url);
    assert_eq!(client.metrics().moves_between(&local_url, &backup_url), 1, "one move, counted");

    local.set(Mode::Serve);
    let deadline = Instant::now() + Duration::from_secs(2);
    while client.endpoint() != local_url {
        assert!(Instant::now() < deadline, "never moved back after the local fleet recovered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(client.metrics().moves_between(&backup_url, &local_url), 1);
    let back = client.next_ids(10).await.unwrap();
    assert!(back.iter().all(|id| from(LOCAL, *id)));
    let mut all = [ids, back].concat();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 210, "no ID handed out twice");
    assert!(backup.requests() > 0);
}

/// A local region on standby (its workers refuse every ID by design, its health check answers
/// 200 `standby`): requests fail over once and stay on the backup, probe after probe, until the
/// region issues.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_on_standby_is_failed_over_from_and_not_probed_back_to() {
    let clock = ManualInstant::new();
    let (local_url, local) = fleet(LOCAL, &clock).await;
    let (backup_url, _) = fleet(BACKUP, &clock).await;
    local.set(Mode::Standby);
    let mut config = ClientConfig::new(local_url.clone());
    config.backups = vec![backup_url.clone()];
    config.probe_interval_ms = 20;
    config.prefetch.batch = 0;
    let client = client(config, &clock).await;
    assert!(from(BACKUP, client.next_id().await.unwrap()));
    assert_eq!(client.endpoint(), backup_url);
    let refused = local.requests();
    // Twenty probe intervals: every probe reads 200 "standby", none moves back.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..20 {
        assert!(from(BACKUP, client.next_id().await.unwrap()));
    }
    assert_eq!(client.endpoint(), backup_url);
    assert_eq!(client.metrics().moves_between(&backup_url, &local_url), 0, "moved back to a region on standby");
    assert_eq!(client.metrics().moves_between(&local_url, &backup_url), 1);
    assert_eq!(local.requests(), refused, "no ID request went to the region on standby again");

    // Its layout starts: it issues, the probe brings requests back.
    local.set(Mode::Serve);
    let deadline = Instant::now() + Duration::from_secs(2);
    while client.endpoint() != local_url {
        assert!(Instant::now() < deadline, "never moved back once the region issued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(from(LOCAL, client.next_id().await.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_errors_and_timeouts_move_at_once_429_does_not() {
    let clock = ManualInstant::new();
    let (backup_url, backup) = fleet(BACKUP, &clock).await;
    // Nothing listening locally: the first request moves.
    let mut config = ClientConfig::new(nothing_listening().await);
    config.backups = vec![backup_url.clone()];
    config.prefetch.batch = 0;
    let refused = client(config, &clock).await;
    assert!(from(BACKUP, refused.next_id().await.unwrap()));
    assert_eq!(refused.endpoint(), backup_url);

    // A local fleet that hangs: the request times out and moves.
    let (hanging_url, hanging) = fleet(LOCAL, &clock).await;
    hanging.set(Mode::Hang);
    let mut config = ClientConfig::new(hanging_url.clone());
    config.backups = vec![backup_url.clone()];
    config.request_timeout_ms = 200;
    let timed_out = client(config, &clock).await;
    let started = Instant::now();
    let ids = timed_out.next_ids(5).await.unwrap();
    assert!(ids.iter().all(|id| from(BACKUP, *id)) && started.elapsed() < Duration::from_secs(2));
    assert_eq!(timed_out.metrics().requests(&hanging_url, "failed"), 1);
    let started = Instant::now();
    timed_out.next_ids(5).await.unwrap();
    assert!(started.elapsed() < Duration::from_millis(150), "later requests go straight to the backup");

    // Over quota: returned with its Retry-After, nothing moves, the backup is not asked.
    let (quota_url, quota) = fleet(LOCAL, &clock).await;
    quota.set(Mode::OverQuota);
    let asked_before = backup.requests();
    let mut config = ClientConfig::new(quota_url.clone());
    config.backups = vec![backup_url.clone()];
    let limited = client(config, &clock).await;
    match limited.next_id().await {
        Err(Error::OverQuota { retry_after, .. }) => assert_eq!(retry_after, Some(Duration::from_secs(3))),
        other => panic!("expected over quota, got {other:?}"),
    }
    assert_eq!(limited.endpoint(), quota_url);
    assert_eq!(backup.requests(), asked_before, "a 429 is not a failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_endpoint_down_the_error_says_what_each_one_did() {
    let clock = ManualInstant::new();
    let (refusing_url, refusing) = fleet(LOCAL, &clock).await;
    refusing.set(Mode::Refuse);
    let mut config = ClientConfig::new(refusing_url);
    config.backups = vec![nothing_listening().await];
    let client = client(config, &clock).await;
    let error = client.next_id().await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, Error::Unavailable { ref attempts } if attempts.len() == 2), "{text}");
    assert!(text.contains("503 lease") && text.contains("connection failed"), "{text}");
    assert!(matches!(client.next_ids(0).await, Err(Error::InvalidArgument(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_above_a_thousand_are_split_and_uuids_parse() {
    let clock = ManualInstant::new();
    let (url, local) = fleet(LOCAL, &clock).await;
    let client = client(ClientConfig::new(url), &clock).await;
    let ids = client.next_ids(2_500).await.unwrap();
    assert_eq!(ids.len(), 2_500);
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(local.served.lock().unwrap().len(), 3, "1000 + 1000 + 500");
    let uuids = client.next_uuids(3).await.unwrap();
    assert_eq!(uuids.len(), 3);
    assert!(uuids.iter().all(|u| u.get_version_num() == 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoding_is_local_with_the_registrys_schedule_and_region_names() {
    let epoch_ms = |unix: i64| (unix - idgen::core::EPOCH_UNIX_MS) as u64;
    let now = idgen::system_unix_ms();
    let v2_from = epoch_ms(now - 86_400_000);
    let layouts = json!({
        "layouts": [
            {"name": "v1", "region_bits": 0, "machine_bits": 10, "sequence_bits": 12, "from_ms": 0},
            {"name": "v2", "region_bits": 3, "machine_bits": 9, "sequence_bits": 10, "from_ms": v2_from},
        ],
        "horizon_ms": epoch_ms(now + 30 * 86_400_000),
        "home_region": "us-east-1",
    });
    let regions = json!({"regions": [
        {"name": "us-east-1", "number": 0, "status": "active"},
        {"name": "eu-west-1", "number": 2, "status": "active"},
    ]});
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = asked.clone();
    let app = axum::Router::new()
        .route(
            "/v1/layouts",
            get(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async move { Json(layouts) }
            }),
        )
        .route("/v1/regions", get(move || async move { Json(regions) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let registry = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let clock = ManualInstant::new();
    let (url, _) = fleet(LOCAL, &clock).await;
    let mut config = ClientConfig::new(url);
    config.registry_url = Some(registry);
    let client = client(config, &clock).await;
    let at = epoch_ms(now);
    let id = (at << 22) | (2 << 19) | (170 << 10) | 3;
    for _ in 0..1_000 {
        let decoded = client.decode(id).unwrap();
        assert_eq!(decoded.layout, "v2");
        assert_eq!((decoded.region_number, decoded.region.as_deref()), (Some(2), Some("eu-west-1")));
        assert_eq!((decoded.machine, decoded.sequence, decoded.created_at_unix_ms), (170, 3, now));
    }
    assert_eq!(asked.load(Ordering::SeqCst), 1, "a thousand decodes, one registry call");
    let v1 = ((epoch_ms(now) - 2 * 86_400_000) << 22) | (37 << 12) | 5;
    let decoded = client.decode(v1).unwrap();
    assert_eq!((decoded.layout.as_str(), decoded.region, decoded.machine), ("v1", None, 37));
    assert!(matches!(client.decode(1 << 63), Err(Error::Decode { .. })));
}

/// The registry the client decodes with is reached over https, or over plain HTTP only on
/// loopback (a development registry): the schedule decides how every ID decodes.
#[test]
fn a_registry_over_plain_http_beyond_loopback_is_refused() {
    let with =
        |url: &str| ClientConfig { registry_url: Some(url.into()), ..ClientConfig::new("http://127.0.0.1:8701") };
    for url in ["https://registry.idgen.internal:8700", "http://127.0.0.1:8700", "http://localhost:8700"] {
        with(url).validate().unwrap();
    }
    for url in ["http://registry.idgen.internal:8700", "http://10.0.0.7:8700"] {
        match with(url).validate() {
            Err(Error::Config(why)) => assert!(why.contains("https://"), "{url}: {why}"),
            other => panic!("{url}: {other:?}"),
        }
    }
}
