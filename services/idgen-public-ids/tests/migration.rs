//! PostgreSQL databases made before mappings were kept at 16 bytes: migrated in place, every
//! mapping of both stored formats resolves both ways after, instances of the previous version
//! and of this one agree while both run, and the old table goes only once every row of it has
//! its copy. A fresh database per test on `IDGEN_POSTGRES_URL` (./scripts/test starts it).

use std::borrow::Cow;
use std::time::Duration;

use idgen_public_ids::check::{Gate, Legacy, Verdict};
use idgen_public_ids::format::{self, Format, OsRandom, new_opaque, new_uuidv7};
use idgen_public_ids::store::PublicIdStore;
use idgen_public_ids::store::check;
use idgen_public_ids::store::legacy::{self, Copied, Dropped};
use idgen_test_support::TestDatabase as Db;
use sqlx::{Connection, PgConnection, PgPool};

const WITHIN: Duration = Duration::from_secs(5);

/// The tables of a database of this version, once the one from before is dropped.
const TABLES: [&str; 6] = [
    "_sqlx_migrations",
    "public_id_check_keys",
    "public_id_keys",
    "public_id_legacy_filter",
    "public_ids_opaque",
    "public_ids_uuidv7",
];

/// The service's PostgreSQL migrations up to (not including) `version`: the database as an
/// earlier version of the service left it.
async fn migrate_before(pool: &PgPool, version: i64) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/public_ids/postgres");
    let mut migrator = sqlx::migrate::Migrator::new(dir).await.unwrap();
    migrator.migrations = Cow::Owned(migrator.migrations.iter().filter(|m| m.version < version).cloned().collect());
    migrator.run(pool).await.unwrap();
}

/// Adds mappings as the previous version did: one row of text each in `public_ids`.
async fn add_as_before(connection: &mut PgConnection, format: Format, mappings: &[(i64, String)]) {
    let (ids, texts): (Vec<i64>, Vec<String>) = mappings.iter().cloned().unzip();
    sqlx::query(
        "INSERT INTO public_ids (internal_id, format, public_id, created_at_ms) \
         SELECT i, $3, p, 1 FROM UNNEST($1::BIGINT[], $2::TEXT[]) AS m(i, p) ON CONFLICT DO NOTHING",
    )
    .bind(ids)
    .bind(texts)
    .bind(format.as_str())
    .execute(connection)
    .await
    .unwrap();
}

/// Another opaque public ID with the same last 8 bytes as `text`.
fn twin_of(text: &str) -> String {
    let mut bytes = format::stored_bytes(Format::Opaque, text).unwrap();
    bytes[0] ^= 0x5a;
    format::stored_text(Format::Opaque, &bytes)
}

/// What the previous version reads: the old table's public ID of an internal ID.
async fn read_as_before(connection: &mut PgConnection, internal_id: i64, format: Format) -> Option<String> {
    sqlx::query_scalar("SELECT public_id FROM public_ids WHERE internal_id = $1 AND format = $2")
        .bind(internal_id)
        .bind(format.as_str())
        .fetch_optional(connection)
        .await
        .unwrap()
}

async fn tables(url: &str) -> Vec<String> {
    let connection = idgen_server::database::Pool::connect_one(url).await.unwrap();
    let tables = connection.tables().await.unwrap();
    connection.close().await;
    tables
}

/// The internal ID a stored public ID's text resolves to in `format`; `None` for text not of its
/// shape.
async fn resolve(
    store: &PublicIdStore,
    format: Format,
    text: &str,
) -> Result<Option<u64>, idgen_public_ids::store::ResolveError> {
    let Some(bytes) = idgen_public_ids::format::stored_bytes(format, text) else { return Ok(None) };
    Ok(store.resolve(format, &bytes).await?.map(|(internal_id, _)| internal_id))
}

async fn assert_resolves_both_ways(store: &PublicIdStore, format: Format, mappings: &[(i64, String)]) {
    for (id, text) in mappings {
        assert_eq!(resolve(store, format, text).await.unwrap(), Some(*id as u64), "{text}");
        let found = store.lookup(*id as u64, format).await.unwrap();
        assert_eq!(found, Some((text.clone(), None)), "{id}: untyped, as it was made");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_of_the_previous_version_migrates_in_place() {
    let db = Db::postgres("public_ids_migration").await;
    let owner = PgPool::connect(db.url()).await.unwrap();
    migrate_before(&owner, 3).await;
    // Both formats, more rows than one copy batch, some internal IDs in both, and two public IDs
    // that share their last 8 bytes (what the new tables index): both are copied.
    let mut opaque: Vec<(i64, String)> = (1..=12_500).map(|i| (i, new_opaque(&OsRandom).unwrap())).collect();
    opaque.extend([(12_501, twin_of(&opaque[0].1)), (12_502, twin_of(&opaque[1].1))]);
    let uuids: Vec<(i64, String)> =
        (5_001..=8_000).map(|i| (i, new_uuidv7(&OsRandom, 1_700_000_000_000 + i).unwrap())).collect();
    let mut before = owner.acquire().await.unwrap().detach();
    add_as_before(&mut before, Format::Opaque, &opaque).await;
    add_as_before(&mut before, Format::Uuidv7, &uuids).await;
    let refused = format!("{:#}", PublicIdStore::open(db.url(), WITHIN).await.err().expect("opened before init"));
    assert!(refused.contains("lacks migrations [3, 4, 5]"), "{refused}");

    // The migrations alone: the old rows are not copied yet, and this version will not start.
    migrate_before(&owner, 6).await;
    let refused = format!("{:#}", PublicIdStore::open(db.url(), WITHIN).await.err().expect("opened before the copy"));
    assert!(refused.contains("not all copied") && refused.contains("idgen public init"), "{refused}");

    // `init` copies them in batches and grants the runtime role what the service uses.
    let runtime = db.login_role().await;
    let role = idgen_server::database::user_of(&runtime).unwrap();
    let copied = PublicIdStore::initialize(db.url(), WITHIN, Some((&role, None))).await.unwrap();
    assert_eq!(copied, Some(Copied { opaque: 12_502, uuidv7: 3_000 }));
    assert_eq!(PublicIdStore::initialize(db.url(), WITHIN, None).await.unwrap(), None, "copied twice");
    let store = PublicIdStore::open(&runtime, WITHIN).await.unwrap();
    assert_resolves_both_ways(&store, Format::Opaque, &opaque).await;
    assert_resolves_both_ways(&store, Format::Uuidv7, &uuids).await;

    // A rolling upgrade: an instance of the previous version (the runtime role, on the old
    // table) and one of this version serve side by side and agree on every mapping.
    let mut previous = PgConnection::connect(&runtime).await.unwrap();
    let theirs = [(20_001, new_opaque(&OsRandom).unwrap())];
    add_as_before(&mut previous, Format::Opaque, &theirs).await;
    let theirs_uuid = [(20_002, new_uuidv7(&OsRandom, 1_800_000_000_000).unwrap())];
    add_as_before(&mut previous, Format::Uuidv7, &theirs_uuid).await;
    assert_resolves_both_ways(&store, Format::Opaque, &theirs).await;
    assert_resolves_both_ways(&store, Format::Uuidv7, &theirs_uuid).await;
    let again = store.create_batch(&[20_001], Format::Opaque, None, &|| new_opaque(&OsRandom), 0).await.unwrap();
    assert_eq!((again[0].public_id.as_str(), again[0].created), (theirs[0].1.as_str(), false));
    let ours =
        store.create_batch(&[20_003], Format::Opaque, None, &|| new_opaque(&OsRandom), 0).await.unwrap().remove(0);
    let ours_uuid = store
        .create_batch(&[20_003], Format::Uuidv7, None, &|| new_uuidv7(&OsRandom, 1_800_000_000_000), 0)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(read_as_before(&mut previous, 20_003, Format::Opaque).await, Some(ours.public_id.clone()));
    assert_eq!(read_as_before(&mut previous, 20_003, Format::Uuidv7).await, Some(ours_uuid.public_id.clone()));
    add_as_before(&mut previous, Format::Opaque, &[(20_003, new_opaque(&OsRandom).unwrap())]).await;
    assert_eq!(read_as_before(&mut previous, 20_003, Format::Opaque).await, Some(ours.public_id.clone()));
    // A mapping the previous version made that is not in the new table yet (its copy as a
    // moment in the race would have it): a create here takes it, not a second public ID.
    sqlx::query("ALTER TABLE public_ids DISABLE TRIGGER public_ids_legacy_added").execute(&owner).await.unwrap();
    let uncopied = [(20_004, new_opaque(&OsRandom).unwrap())];
    add_as_before(&mut before, Format::Opaque, &uncopied).await;
    sqlx::query("ALTER TABLE public_ids ENABLE TRIGGER public_ids_legacy_added").execute(&owner).await.unwrap();
    let taken =
        store.create_batch(&[20_004], Format::Opaque, None, &|| new_opaque(&OsRandom), 0).await.unwrap().remove(0);
    assert_eq!((taken.public_id.as_str(), taken.created), (uncopied[0].1.as_str(), false));
    // A public ID drawn now that shares its last 8 bytes with one made before: a mapping of its
    // own, in both tables, and both resolve.
    let twin = twin_of(&opaque[2].1);
    let made = store.create_batch(&[20_005], Format::Opaque, None, &|| Ok(twin.clone()), 0).await.unwrap().remove(0);
    assert_eq!((made.public_id.as_str(), made.created), (twin.as_str(), true));
    assert_eq!(read_as_before(&mut previous, 20_005, Format::Opaque).await, Some(twin.clone()));
    assert_resolves_both_ways(&store, Format::Opaque, &[(20_005, twin), opaque[2].clone()]).await;

    // Typed public IDs wait for the old table to go: instances of the previous version, which
    // know no types, would resolve a typed ID without its prefix.
    let typed = |url: &str| {
        let mut config = idgen_public_ids::PublicIdsConfig::development();
        config.database_url = Some(url.to_owned());
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.formats = vec!["opaque".into()];
        let order = idgen_public_ids::types::TypeSection { number: 1, format: "opaque".into() };
        config.types = [("order".to_owned(), order)].into();
        config
    };
    let refused =
        idgen_public_ids::serve(typed(db.url()), None, async {}).await.expect_err("typed beside the old table");
    assert!(refused.is::<idgen::config::Refused>(), "exit status 2: {refused:#}");
    assert!(format!("{refused:#}").contains("idgen public drop-legacy-table"), "{refused:#}");

    // The old table goes only when every row of it has its copy.
    sqlx::query("DELETE FROM public_ids_opaque WHERE internal_id = 77").execute(&owner).await.unwrap();
    let refused = format!("{:#}", legacy::drop_legacy_table(&owner).await.expect_err("dropped with a row missing"));
    assert!(refused.contains("1 of its 15508 rows have no copy"), "{refused}");
    assert!(tables(db.url()).await.contains(&"public_ids".to_owned()), "dropped after a refusal");
    let (_, text) = &opaque[76];
    sqlx::query("INSERT INTO public_ids_opaque VALUES (77, public_id_opaque_to_uuid($1))")
        .bind(text)
        .execute(&owner)
        .await
        .unwrap();
    assert_eq!(legacy::drop_legacy_table(&owner).await.unwrap(), Dropped::Dropped { rows: 15_508 });
    assert_eq!(legacy::drop_legacy_table(&owner).await.unwrap(), Dropped::NothingToDrop);
    assert_eq!(tables(db.url()).await, TABLES);
    assert_resolves_both_ways(&store, Format::Opaque, &opaque).await;
    assert_resolves_both_ways(&store, Format::Uuidv7, &uuids).await;
    assert_resolves_both_ways(&store, Format::Opaque, &[(20_004, uncopied[0].1.clone())]).await;
    let after =
        store.create_batch(&[30_000], Format::Opaque, None, &|| new_opaque(&OsRandom), 0).await.unwrap().remove(0);
    assert!(after.created);
    // The runtime role's grants after an init on the database as it is now.
    PublicIdStore::initialize(db.url(), WITHIN, Some((&role, None))).await.unwrap();
    assert_eq!(resolve(&store, Format::Opaque, &after.public_id).await.unwrap(), Some(30_000));

    // The keyed check came with this version's init, on a database that held mappings: its
    // filter of untagged IDs stays open (every untagged ID is read) until `seal-legacy`, which
    // puts every one of them in it; then each still passes the check, and random ones do not.
    let open = Gate::new(check::gate_state(store.db()).await.unwrap());
    assert!(matches!(open.state().legacy, Legacy::Open));
    let random_id = || {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).unwrap();
        bytes
    };
    assert_eq!(open.judge(Format::Opaque, &random_id(), None), Verdict::Legacy);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM public_ids_opaque").fetch_one(&owner).await.unwrap();
    let connection = idgen_server::database::Pool::connect_one(db.url()).await.unwrap();
    let sealed = check::seal_legacy(&connection, 0).await.unwrap();
    connection.close().await;
    assert_eq!((sealed.read, sealed.untagged), (rows as u64, rows as u64), "every mapping here was made untagged");
    let gate = Gate::new(check::refreshed(store.db(), &open.state()).await.unwrap());
    let old = opaque.iter().chain(&theirs).chain(&uncopied).map(|(_, text)| text).chain([&after.public_id]);
    for text in old {
        let bytes = format::stored_bytes(Format::Opaque, text).unwrap();
        assert_eq!(gate.judge(Format::Opaque, &bytes, None), Verdict::Legacy, "{text} made before check keys");
    }
    let passed = (0..10_000).filter(|_| gate.judge(Format::Opaque, &random_id(), None) != Verdict::Forged).count();
    assert!(passed < 300, "{passed} of 10,000 random IDs passed a filter of 1 % false positives");

    // Now a typed service starts (and stops at once), and a typed mapping lives beside the old
    // untyped ones.
    idgen_public_ids::serve(typed(db.url()), None, async {}).await.unwrap();
    let order = store.create_batch(&[40_000], Format::Opaque, Some(1), &|| new_opaque(&OsRandom), 0).await.unwrap();
    let bytes = format::stored_bytes(Format::Opaque, &order[0].public_id).unwrap();
    assert_eq!(store.resolve(Format::Opaque, &bytes).await.unwrap(), Some((40_000, Some(1))));
    assert_eq!(store.lookup(40_000, Format::Opaque).await.unwrap(), Some((order[0].public_id.clone(), Some(1))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_database_has_only_the_16_byte_tables() {
    let db = Db::postgres("public_ids_fresh").await;
    assert_eq!(PublicIdStore::initialize(db.url(), WITHIN, None).await.unwrap(), None);
    assert_eq!(tables(db.url()).await, TABLES);
    let store = PublicIdStore::open(db.url(), WITHIN).await.unwrap();
    let made = store.create_batch(&[1], Format::Opaque, None, &|| new_opaque(&OsRandom), 0).await.unwrap().remove(0);
    assert_eq!(resolve(&store, Format::Opaque, &made.public_id).await.unwrap(), Some(1));
    // The opaque and the UUIDv7 text of the same 16 bytes are two public IDs, in two tables.
    assert_eq!(resolve(&store, Format::Uuidv7, &made.public_id).await.unwrap(), None);
    // A public ID sharing its last 8 bytes (what the index holds) with another is another public
    // ID: stored, and each resolves to its own internal ID (a resolve compares all 16 bytes). The
    // same public ID again is refused and drawn again (the store suite's collision test).
    let twin = twin_of(&made.public_id);
    let other = store.create_batch(&[2], Format::Opaque, None, &|| Ok(twin.clone()), 0).await.unwrap().remove(0);
    assert_eq!((other.public_id.as_str(), other.created), (twin.as_str(), true));
    assert_eq!(resolve(&store, Format::Opaque, &twin).await.unwrap(), Some(2));
    assert_eq!(resolve(&store, Format::Opaque, &made.public_id).await.unwrap(), Some(1));
    // Two of one public ID (which no create makes: a row written by hand) are not answered.
    let owner = PgPool::connect(db.url()).await.unwrap();
    sqlx::query("INSERT INTO public_ids_opaque SELECT 3, public_id FROM public_ids_opaque WHERE internal_id = 1")
        .execute(&owner)
        .await
        .unwrap();
    assert!(resolve(&store, Format::Opaque, &made.public_id).await.is_err(), "a public ID held twice was answered");
    assert_eq!(
        legacy::drop_legacy_table(&PgPool::connect(db.url()).await.unwrap()).await.unwrap(),
        Dropped::NothingToDrop
    );
}
