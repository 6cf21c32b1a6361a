//! A read replica (`read_database_url`) against a real PostgreSQL streaming replica that
//! ./scripts/test makes (`pg_basebackup -R` from the local server, on 127.0.0.1:5433): resolves
//! and lookups read it; with its replay paused (real lag), a mapping just created on the primary
//! still resolves at once, read again on the primary; with it stopped, resolves go on from the
//! primary; each outcome counted in `idgen_public_replica_reads_total`. Beside it, an instance with
//! a cache, as the service runs: a miss on both is not remembered, a hit asks neither.

mod common;

use std::process::Command;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::call;
use idgen_public_ids::AppState;
use idgen_public_ids::format::{Format, OsRandom};
use idgen_public_ids::store::{PoolSettings, PublicIdStore};
use idgen_test_support::TestDatabase as Db;
use sqlx::{Connection, PgConnection};

fn env(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: this test needs the replica ./scripts/test makes"))
}

/// Runs pg_ctl on the replica as the postgres user.
fn pg_ctl(args: &[&str]) {
    let status = Command::new("runuser")
        .args([
            "-u",
            "postgres",
            "--",
            &format!("{}/pg_ctl", env("IDGEN_PG_BIN")),
            "-D",
            &env("IDGEN_POSTGRES_REPLICA_DIR"),
        ])
        .args(args)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "pg_ctl {args:?}: {status}");
}

/// Leaves the replica as the test found it, however the test ends: running, replaying.
struct RestoreReplica;

impl Drop for RestoreReplica {
    fn drop(&mut self) {
        let log = format!("{}/server.log", env("IDGEN_POSTGRES_REPLICA_DIR"));
        let running = Command::new("pg_isready").args(["-q", "-h", "127.0.0.1", "-p", "5433"]).status();
        if !running.is_ok_and(|s| s.success()) {
            pg_ctl(&["-l", &log, "-w", "start"]);
        }
        let _ = Command::new("psql")
            .args([&env("IDGEN_POSTGRES_REPLICA_URL"), "-qAtc", "SELECT pg_wal_replay_resume()"])
            .status();
    }
}

/// An instance without a cache: every read reaches the store, so each is the replica's to answer.
async fn instance(store: PublicIdStore) -> AppState {
    common::instance(store, 0).await
}

async fn create(state: &AppState, internal_id: u64) -> String {
    let body = format!(r#"{{"internal_id": "{internal_id}"}}"#);
    let (status, made) = call(state, Method::POST, "/v1/public-ids", &body).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    made["public_id"].as_str().unwrap().to_owned()
}

async fn resolves_to(state: &AppState, public_id: &str, internal_id: u64) {
    let (status, found) = call(state, Method::GET, &format!("/v1/public-ids/{public_id}"), "").await;
    assert_eq!(
        (status, found["internal_id"].as_str()),
        (StatusCode::OK, Some(internal_id.to_string().as_str())),
        "{found}"
    );
}

/// The replica's count of each outcome so far.
fn outcomes(store: &PublicIdStore) -> [u64; 4] {
    let mut registry = prometheus_client::registry::Registry::default();
    store.metrics().register_replica(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    ["found", "missed", "failed", "skipped"].map(|outcome| {
        let series = format!("idgen_public_replica_reads_total{{outcome=\"{outcome}\"}} ");
        let line = text.lines().find(|l| l.starts_with(&series)).unwrap_or_else(|| panic!("{series} in {text}"));
        line[series.len()..].parse().unwrap()
    })
}

/// Whether the replica has replayed `public_id`'s row yet.
async fn on_replica(replica: &str, public_id: &str) -> bool {
    let bytes = idgen_public_ids::format::stored_bytes(Format::Opaque, public_id).unwrap();
    let mut connection = PgConnection::connect(replica).await.unwrap();
    sqlx::query_scalar::<_, bool>("SELECT EXISTS (SELECT 1 FROM public_ids_opaque WHERE public_id = $1)")
        .bind(uuid::Uuid::from_bytes(bytes))
        .fetch_one(&mut connection)
        .await
        .unwrap()
}

/// Waits until the replica has replayed what the primary has written so far.
async fn caught_up(replica: &str, public_id: &str) {
    for _ in 0..300 {
        if PgConnection::connect(replica).await.is_ok() && on_replica(replica, public_id).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the replica did not replay {public_id} within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_the_replica_and_its_lag_or_absence_never_answers_404() {
    let admin = env("IDGEN_POSTGRES_REPLICA_URL");
    let _restore = RestoreReplica;
    let db = Db::postgres("public_ids_replica").await;
    let within = Duration::from_secs(5);
    PublicIdStore::initialize(db.url(), within, None).await.unwrap();
    let name = db.url().rsplit_once('/').unwrap().1;
    let replica = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let settings = PoolSettings { acquire_timeout: Duration::from_millis(500), ..PoolSettings::default() };
    let writer = instance(PublicIdStore::open(db.url(), within).await.unwrap()).await;
    let store = PublicIdStore::open_with(db.url(), within, settings)
        .await
        .unwrap()
        .with_replica(&replica, settings, Default::default())
        .unwrap();
    let reader = instance(store.clone()).await;
    // The same with a cache, as the service runs: its replica reads counted apart.
    let cached_store = PublicIdStore::open_with(db.url(), within, settings)
        .await
        .unwrap()
        .with_replica(&replica, settings, Default::default())
        .unwrap();
    let cached = common::instance(cached_store.clone(), 1_000).await;

    // Replayed: the replica answers.
    let first = create(&writer, 1).await;
    caught_up(&replica, &first).await;
    resolves_to(&reader, &first, 1).await;
    let (status, _) = call(&reader, Method::GET, "/v1/internal-ids/1/public-id?format=opaque", "").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(outcomes(&store), [2, 0, 0, 0]);

    // Replay paused: a mapping made on the primary now is not on the replica, and resolves at
    // once all the same, read again on the primary; an unknown ID is still 404.
    let mut replica_admin = PgConnection::connect(&admin).await.unwrap();
    sqlx::query("SELECT pg_wal_replay_pause()").execute(&mut replica_admin).await.unwrap();
    for _ in 0..100 {
        let state: String =
            sqlx::query_scalar("SELECT pg_get_wal_replay_pause_state()").fetch_one(&mut replica_admin).await.unwrap();
        if state == "paused" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // With a cache: a lookup that finds nothing on the replica or the primary is not remembered.
    let lookup_2 = "/v1/internal-ids/2/public-id?format=opaque";
    let (status, _) = call(&cached, Method::GET, lookup_2, "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let second = create(&writer, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!on_replica(&replica, &second).await, "the replica replayed while paused: no lag to test");
    // So the mapping another instance made since answers at once, though the replica lags; and
    // once found it is the cache's both ways (no replica read more).
    let (status, found) = call(&cached, Method::GET, lookup_2, "").await;
    assert_eq!((status, found["public_id"].as_str()), (StatusCode::OK, Some(second.as_str())), "{found}");
    resolves_to(&cached, &second, 2).await;
    assert_eq!(outcomes(&cached_store), [0, 2, 0, 0]);
    resolves_to(&reader, &second, 2).await;
    let (status, found) = call(&reader, Method::GET, "/v1/internal-ids/2/public-id?format=opaque", "").await;
    assert_eq!((status, found["public_id"].as_str()), (StatusCode::OK, Some(second.as_str())));
    // An unknown UUIDv7 made just now is read on both (it may be the replica's lag); an opaque ID
    // without the keyed check's tag is not read at all.
    let unknown = idgen_public_ids::format::new_uuidv7(&OsRandom, idgen::system_unix_ms()).unwrap();
    let (status, _) = call(&reader, Method::GET, &format!("/v1/public-ids/{unknown}"), "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&reader, Method::GET, "/v1/public-ids/0000000000000000000000000z", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(outcomes(&store), [2, 3, 0, 0]);
    sqlx::query("SELECT pg_wal_replay_resume()").execute(&mut replica_admin).await.unwrap();
    drop(replica_admin);

    // The replica stopped: resolves go on from the primary; after one failure the replica is
    // left alone for a while (skipped), not asked again by every request.
    pg_ctl(&["stop", "-m", "fast", "-w"]);
    let third = create(&writer, 3).await;
    resolves_to(&reader, &third, 3).await;
    resolves_to(&reader, &first, 1).await;
    resolves_to(&reader, &second, 2).await;
    let [found, missed, failed, skipped] = outcomes(&store);
    assert_eq!((found, missed, failed, skipped), (2, 3, 1, 2));
    // A cached mapping resolves with the replica gone, and asks it nothing.
    resolves_to(&cached, &second, 2).await;
    assert_eq!(outcomes(&cached_store), [0, 2, 0, 0]);
}
