//! What a worker checks before it serves: a port it cannot bind, a registry that contradicts the
//! copy saved by an earlier run, a copy it cannot save or read, a home-region flag the registry
//! contradicts, and DynamoDB lease tables that do not exist (against moto, started by
//! ./scripts/test). Each start goes through `Worker::build`.

mod common;

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::extract::State;
use axum::routing::get;
use common::config_in as config;
use idgen::{LeaseStore, SqliteLeaseStore};
use idgen_worker::Worker;
use idgen_worker::config::{StoreKind, WorkerConfig};
use serde_json::{Value, json};

const DAY: u64 = 86_400_000;

/// Milliseconds since the idgen epoch.
fn now_ms() -> u64 {
    let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    (unix - idgen::core::EPOCH_UNIX_MS) as u64
}

async fn held_rows(dir: &std::path::Path) -> Vec<idgen::LeaseRow> {
    let store = SqliteLeaseStore::open(&dir.join("leases.db"), "idgen-leases").await.unwrap();
    store.list().await.unwrap()
}

fn published(horizon_ms: u64, v2_from_ms: u64) -> (Value, Value) {
    let layouts = json!({
        "layouts": [
            {"name": "v1", "region_bits": 0, "machine_bits": 10, "sequence_bits": 12, "from_ms": 0},
            {"name": "v2", "region_bits": 3, "machine_bits": 9, "sequence_bits": 10, "from_ms": v2_from_ms},
        ],
        "horizon_ms": horizon_ms,
        "home_region": "us-east-1",
    });
    let regions = json!({"regions": [
        {"name": "us-east-1", "number": 0, "status": "active"},
        {"name": "eu-west-1", "number": 1, "status": "active"},
    ]});
    (layouts, regions)
}

/// A stand-in registry that publishes whatever the test sets.
async fn registry(answer: (Value, Value)) -> (String, Arc<Mutex<(Value, Value)>>) {
    let shared = Arc::new(Mutex::new(answer));
    let app = axum::Router::new()
        .route(
            "/v1/layouts",
            get(|State(s): State<Arc<Mutex<(Value, Value)>>>| async move { Json(s.lock().unwrap().0.clone()) }),
        )
        .route(
            "/v1/regions",
            get(|State(s): State<Arc<Mutex<(Value, Value)>>>| async move { Json(s.lock().unwrap().1.clone()) }),
        )
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, shared)
}

async fn start_and_stop(config: &WorkerConfig) -> anyhow::Result<()> {
    let worker = Worker::build(config, 1).await?;
    worker.serve(async {}).await
}

#[tokio::test]
async fn a_port_in_use_fails_the_start_before_any_number_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut config = config(dir.path());
    config.listen = taken.local_addr().unwrap();
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("the port is taken"));
    assert!(error.contains("binding"), "{error}");
    // Longer than a keeper needs to claim, had one been started.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert_eq!(held_rows(dir.path()).await, vec![], "a worker that cannot serve takes no machine number");
}

#[tokio::test]
async fn a_registry_that_contradicts_the_saved_copy_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    let v2_from = now + 10 * DAY;
    let (url, answer) = registry(published(now + 30 * DAY, v2_from)).await;
    let mut config = config(dir.path());
    config.registry_url = Some(url);
    start_and_stop(&config).await.unwrap();
    assert!(dir.path().join("schedule.json").exists(), "the first answer was saved");

    // Restored from an older backup: the horizon is back where it was ten days ago.
    *answer.lock().unwrap() = published(now + 20 * DAY, v2_from);
    let error = format!("{:#}", Worker::build(&config, 2).await.err().expect("a horizon moved back"));
    assert!(error.contains("refusing to start") && error.contains("horizon"), "{error}");
    // Another registry altogether: v2 starts elsewhere, inside the saved horizon.
    *answer.lock().unwrap() = published(now + 40 * DAY, v2_from + DAY);
    let error = format!("{:#}", Worker::build(&config, 3).await.err().expect("the past was rewritten"));
    assert!(error.contains("refusing to start") && error.contains("changes layouts"), "{error}");
    // The region renumbered.
    let (layouts, mut regions) = published(now + 40 * DAY, v2_from);
    regions["regions"][1]["number"] = json!(5);
    *answer.lock().unwrap() = (layouts, regions);
    let error = format!("{:#}", Worker::build(&config, 4).await.err().expect("the region was renumbered"));
    assert!(error.contains("was number 1, now 5"), "{error}");

    // A registry that moved forward is taken, and becomes the copy the next start is held to.
    *answer.lock().unwrap() = published(now + 40 * DAY, v2_from);
    start_and_stop(&config).await.unwrap();
    *answer.lock().unwrap() = published(now + 30 * DAY, v2_from);
    let error = format!("{:#}", Worker::build(&config, 5).await.err().expect("held to the newer copy now"));
    assert!(error.contains("horizon"), "{error}");

    // Retired and added again: a new number, the old one listed as retired. Not a contradiction.
    let (layouts, mut regions) = published(now + 40 * DAY, v2_from);
    regions["regions"][1]["number"] = json!(2);
    regions["regions"].as_array_mut().unwrap().push(json!({"name": "eu-west-1", "number": 1, "status": "retired"}));
    *answer.lock().unwrap() = (layouts, regions);
    start_and_stop(&config).await.unwrap();
}

#[tokio::test]
async fn a_copy_that_cannot_be_saved_fails_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = registry(published(now_ms() + 30 * DAY, now_ms() + 10 * DAY)).await;
    let mut config = config(dir.path());
    config.registry_url = Some(url);
    std::fs::write(dir.path().join("not-a-directory"), b"").unwrap();
    config.schedule_cache = Some(dir.path().join("not-a-directory/schedule.json"));
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("the copy cannot be written"));
    assert!(error.contains("restart while the registry is down"), "{error}");
}

#[tokio::test]
async fn missing_dynamodb_tables_fail_the_start_with_what_to_do() {
    let endpoint = std::env::var("IDGEN_DYNAMODB_ENDPOINT").expect(
        "IDGEN_DYNAMODB_ENDPOINT is not set: this test needs a DynamoDB-protocol server (./scripts/test starts moto)",
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.lease.store = Some(StoreKind::Dynamodb);
    config.lease.dynamodb.endpoint = Some(endpoint);
    config.lease.create_tables = false;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let unique = format!("start-{}-{nanos}", std::process::id());
    config.lease.tables =
        [("v1".to_owned(), format!("{unique}-v1")), ("v2".to_owned(), format!("{unique}-v2"))].into_iter().collect();
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("no such table"));
    assert!(error.contains("does not exist") && error.contains("idgen leases init"), "{error}");

    // Only the layout in force must have its table: the next layout's is claimed early, and its
    // absence is logged and retried, not a reason to refuse to start.
    let settings = config.lease.dynamodb.settings();
    let v1 = idgen::DynamoDbLeaseStore::new(idgen::lease::dynamodb::client(&settings).await, &format!("{unique}-v1"));
    v1.create_tables().await.unwrap();
    config.preclaim_ms = 5 * 365 * DAY as i64; // the v2 cutover (2028) is "soon"
    // A table nobody made the fleet's (no genesis) fails the start too, saying what to run.
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("no genesis"));
    assert!(error.contains("genesis") && error.contains("idgen leases init"), "{error}");
    let init = idgen::GenesisRequest { how: idgen::GenesisHow::Init, by: "test".into(), registry_id: None };
    v1.record_genesis(&init, idgen::system_unix_ms()).await.unwrap();
    let worker = Worker::build(&config, 2).await.unwrap();
    let kept = worker.embedded.layouts();
    assert_eq!(kept, vec!["v1".to_owned()], "v2's keeper could not start: its table is missing");
    worker.serve(async {}).await.unwrap();

    config.lease.create_tables = true;
    start_and_stop(&config).await.unwrap();
    config.lease.create_tables = false;
    start_and_stop(&config).await.unwrap();
}

#[tokio::test]
async fn an_unreadable_copy_on_disk_refuses_the_start_instead_of_being_replaced() {
    // Before, a copy that could not be read was replaced by whatever the registry said, skipping
    // the forward-only check the copy exists for.
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = registry(published(now_ms() + 30 * DAY, now_ms() + 10 * DAY)).await;
    let mut config = config(dir.path());
    config.registry_url = Some(url);
    std::fs::write(dir.path().join("schedule.json"), b"{\"layouts\": [trunc").unwrap();
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("the copy is unreadable"));
    assert!(error.contains("refusing to start") && error.contains("unreadable"), "{error}");
    assert!(error.contains("schedule.json") && error.contains("delete"), "says what to do: {error}");
    assert_eq!(std::fs::read(dir.path().join("schedule.json")).unwrap(), b"{\"layouts\": [trunc", "left as it was");
}

#[tokio::test]
async fn a_home_region_flag_the_registry_contradicts_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = registry(published(now_ms() + 30 * DAY, now_ms() + 10 * DAY)).await;
    let mut config = config(dir.path());
    config.registry_url = Some(url);
    config.home_region = Some(true); // the registry's home region is us-east-1, this is eu-west-1
    let error = format!("{:#}", Worker::build(&config, 1).await.err().expect("not the home region"));
    assert!(error.contains("home_region = true") && error.contains("us-east-1"), "{error}");
    config.home_region = Some(false);
    start_and_stop(&config).await.unwrap();
}
