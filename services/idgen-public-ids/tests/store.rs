//! The public-ID store suite on SQLite and PostgreSQL (a fresh database per test on the server
//! `IDGEN_POSTGRES_URL` names; ./scripts/test starts it). Unreachable: the tests fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use idgen_public_ids::format::{Format, OsRandom, RandomUnavailable, new_opaque, stored_bytes};
use idgen_public_ids::store::PublicIdStore;
use idgen_test_support::{TestDatabase as Db, store_suite};

async fn sqlite() -> Db {
    Db::sqlite("public-ids.db")
}

async fn postgres() -> Db {
    Db::postgres("public_ids").await
}

fn opaque() -> Result<String, RandomUnavailable> {
    new_opaque(&OsRandom)
}

/// The internal ID a stored public ID's text resolves to, if any.
async fn resolve(store: &PublicIdStore, format: Format, text: &str) -> Option<u64> {
    resolve_typed(store, format, text).await.map(|(internal_id, _)| internal_id)
}

/// The internal ID and type number a stored public ID's text resolves to, if any.
async fn resolve_typed(store: &PublicIdStore, format: Format, text: &str) -> Option<(u64, Option<u16>)> {
    store.resolve(format, &stored_bytes(format, text).unwrap()).await.unwrap()
}

/// The stored public ID of an internal ID in a format, if any.
async fn lookup(store: &PublicIdStore, internal_id: u64, format: Format) -> Option<String> {
    store.lookup(internal_id, format).await.unwrap().map(|(public_id, _)| public_id)
}

async fn creates_are_idempotent_per_format(db: Db) {
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    let first = store.create_batch(&[42], Format::Opaque, None, &opaque, 1).await.unwrap().remove(0);
    assert!(first.created);
    assert_eq!(first.public_id.len(), 26);
    let again = store.create_batch(&[42], Format::Opaque, None, &opaque, 2).await.unwrap().remove(0);
    assert_eq!((again.public_id.as_str(), again.created), (first.public_id.as_str(), false));
    let uuid = store
        .create_batch(&[42], Format::Uuidv7, None, &|| Ok("0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f0a0b".into()), 3)
        .await
        .unwrap()
        .remove(0);
    assert_ne!(uuid.public_id, first.public_id, "one public ID per format");
    assert_eq!(resolve(&store, Format::Opaque, &first.public_id).await, Some(42));
    assert_eq!(resolve(&store, Format::Uuidv7, &uuid.public_id).await, Some(42));
    assert_eq!(lookup(&store, 42, Format::Opaque).await, Some(first.public_id.clone()));
    assert_eq!(lookup(&store, 43, Format::Opaque).await, None);
    assert_eq!(resolve(&store, Format::Opaque, "0000000000000000000000000z").await, None);
}

async fn a_batch_of_a_thousand_in_one_call(db: Db) {
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    store.create_batch(&[5, 7], Format::Opaque, None, &opaque, 1).await.unwrap();
    let ids: Vec<u64> = (1..=1000).collect();
    let mappings = store.create_batch(&ids, Format::Opaque, None, &opaque, 2).await.unwrap();
    assert_eq!(mappings.len(), 1000);
    assert_eq!(mappings.iter().filter(|m| !m.created).count(), 2, "5 and 7 existed");
    let distinct: std::collections::HashSet<_> = mappings.iter().map(|m| m.public_id.clone()).collect();
    assert_eq!(distinct.len(), 1000);
    for m in mappings.iter().step_by(97) {
        assert_eq!(resolve(&store, Format::Opaque, &m.public_id).await, Some(m.internal_id));
    }
}

async fn concurrent_creates_of_one_internal_id_agree(db: Db) {
    let store = Arc::new(PublicIdStore::connect(db.url()).await.unwrap());
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store.create_batch(&[777], Format::Opaque, None, &opaque, 1).await.unwrap().remove(0)
            })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let winners: std::collections::HashSet<_> = results.iter().map(|m| m.public_id.clone()).collect();
    assert_eq!(winners.len(), 1, "every caller gets the one mapping");
    assert_eq!(results.iter().filter(|m| m.created).count(), 1, "exactly one created it");
}

async fn a_random_collision_is_retried_not_surfaced(db: Db) {
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    let taken = store.create_batch(&[1], Format::Opaque, None, &opaque, 1).await.unwrap().remove(0).public_id;
    // The generator "collides" twice with the existing public ID, then draws a fresh one.
    let calls = AtomicU32::new(0);
    let colliding = || if calls.fetch_add(1, Ordering::SeqCst) < 2 { Ok(taken.clone()) } else { opaque() };
    let mapping = store.create_batch(&[2], Format::Opaque, None, &colliding, 2).await.unwrap().remove(0);
    assert_ne!(mapping.public_id, taken);
    assert!(mapping.created);
    assert!(calls.load(Ordering::SeqCst) >= 3);
    assert_eq!(resolve(&store, Format::Opaque, &taken).await, Some(1), "the existing mapping is untouched");
}

/// A mapping keeps the type number it was made with, as a resolve and a lookup find it; a
/// create of it again, with another type or none, answers the mapping as it is (the service
/// then refuses it 409), and changes nothing.
async fn a_mapping_keeps_its_type(db: Db) {
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    let typed = store.create_batch(&[1, 2], Format::Opaque, Some(3), &opaque, 1).await.unwrap();
    assert!(typed.iter().all(|m| m.created && m.type_number == Some(3)), "{typed:?}");
    let uuid = || Ok("0190a0b0-c0d0-7e0f-8a0b-0c0d0e0f0a0b".to_owned());
    let typed_uuid = store.create_batch(&[1], Format::Uuidv7, Some(32767), &uuid, 1).await.unwrap().remove(0);
    assert_eq!(resolve_typed(&store, Format::Opaque, &typed[0].public_id).await, Some((1, Some(3))));
    assert_eq!(resolve_typed(&store, Format::Uuidv7, &typed_uuid.public_id).await, Some((1, Some(32767))));
    assert_eq!(store.lookup(2, Format::Opaque).await.unwrap(), Some((typed[1].public_id.clone(), Some(3))));
    let again = store.create_batch(&[2, 3], Format::Opaque, None, &opaque, 2).await.unwrap();
    assert_eq!((again[0].created, again[0].type_number), (false, Some(3)), "found as it was made");
    assert_eq!(again[0].public_id, typed[1].public_id);
    assert_eq!((again[1].created, again[1].type_number), (true, None));
    assert_eq!(resolve_typed(&store, Format::Opaque, &again[1].public_id).await, Some((3, None)));
    assert_eq!(resolve_typed(&store, Format::Opaque, &typed[1].public_id).await, Some((2, Some(3))), "unchanged");
}

store_suite!(
    creates_are_idempotent_per_format,
    a_batch_of_a_thousand_in_one_call,
    concurrent_creates_of_one_internal_id_agree,
    a_random_collision_is_retried_not_surfaced,
    a_mapping_keeps_its_type
);

/// `idgen public init --owner-url`: the migrations (and data keys) are written as the schema's
/// owner, and the role the service runs as can add and read mappings and read the data keys, and
/// nothing more: no key written, no mapping changed or deleted, no DDL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_role_does_what_the_service_does_and_nothing_more() {
    use sqlx::Connection;
    let db = postgres().await;
    let runtime = db.login_role().await;
    let within = std::time::Duration::from_secs(5);
    let role = idgen_server::database::user_of(&runtime).unwrap();
    PublicIdStore::initialize(db.url(), within, Some((&role, None))).await.unwrap();
    let owner = PublicIdStore::open(db.url(), within).await.unwrap();
    assert!(owner.add_wrapped_key(1, "key", &[7; 40], 0).await.unwrap(), "the owner writes data keys");

    let store = PublicIdStore::open(&runtime, within).await.unwrap();
    let made = store.create_batch(&[1, 2, 3], Format::Opaque, None, &opaque, 0).await.unwrap();
    assert_eq!(resolve(&store, Format::Opaque, &made[1].public_id).await, Some(2));
    assert_eq!(lookup(&store, 3, Format::Opaque).await, Some(made[2].public_id.clone()));
    assert_eq!(store.wrapped_keys().await.unwrap().len(), 1);
    assert!(store.add_wrapped_key(2, "key", &[8; 40], 0).await.is_err(), "the runtime role wrote a data key");

    let mut conn = sqlx::PgConnection::connect(&runtime).await.unwrap();
    for statement in [
        "DELETE FROM public_ids_opaque",
        "UPDATE public_ids_opaque SET internal_id = 9",
        "DELETE FROM public_ids_uuidv7",
        "DELETE FROM public_id_keys",
        "UPDATE public_id_keys SET kms_key_id = 'other'",
        "TRUNCATE public_ids_uuidv7",
        "DROP TABLE public_id_keys",
        "CREATE TABLE shadow (a BIGINT)",
    ] {
        let error = sqlx::query(statement).execute(&mut conn).await.expect_err(statement).to_string();
        assert!(error.contains("permission denied") || error.contains("must be owner"), "{statement}: {error}");
    }
}

/// The probe answers while the database does; once it is gone (dropped, its connections ended),
/// the probe and every call fail, each counted under its operation, and `/metrics` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_and_failed_calls_show_a_database_that_is_gone() {
    let db = postgres().await;
    let store = PublicIdStore::connect(db.url()).await.unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    store.metrics().register(&mut registry);
    let scrape = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    let within = std::time::Duration::from_secs(5);
    assert!(store.probe(within).await);
    let text = scrape();
    assert!(text.contains("idgen_public_database_up 1\n"), "{text}");
    for operation in ["create", "resolve", "lookup", "read_keys", "add_key", "probe"] {
        let series = format!("idgen_public_storage_errors_total{{operation=\"{operation}\"}} 0\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }

    drop(db);
    assert!(!store.probe(within).await, "a probe of a dropped database answered");
    assert!(store.resolve(Format::Opaque, &[7; 16]).await.is_err());
    assert!(store.create_batch(&[9], Format::Opaque, None, &opaque, 1).await.is_err());
    let text = scrape();
    assert!(text.contains("idgen_public_database_up 0\n"), "{text}");
    for (operation, count) in [("probe", 1), ("resolve", 1), ("create", 1), ("lookup", 0)] {
        let series = format!("idgen_public_storage_errors_total{{operation=\"{operation}\"}} {count}\n");
        assert!(text.contains(&series), "{series} missing from\n{text}");
    }
}
