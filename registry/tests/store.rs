//! The registry store suite, run on SQLite and on PostgreSQL (a fresh database per test on the
//! server `IDGEN_POSTGRES_URL` names; ./scripts/test starts it). Unreachable: the tests fail.

use std::sync::Arc;

use idgen_core::{Layout, Schedule, ScheduleEntry, Timestamp, format_unix_ms};
use idgen_registry::store::{
    InitialSchedule, Initialized, RegionStatus, RegistryError, RegistryStore, ScheduledLayout,
};
use idgen_test_support::{TestDatabase as Db, store_suite};

const NOW: i64 = 1_795_000_000_000; // 2026-11-18
const DAY: i64 = 86_400_000;

async fn sqlite() -> Db {
    Db::sqlite("registry.db")
}

async fn postgres() -> Db {
    Db::postgres("registry").await
}

async fn open(db: &Db) -> RegistryStore {
    RegistryStore::connect(db.url(), &InitialSchedule::spec_default("us-east-1")).await.unwrap()
}

fn schedule(view: &idgen_registry::store::ScheduleView) -> Schedule {
    let entries = view
        .layouts
        .iter()
        .map(|l| ScheduleEntry { layout: l.layout.clone(), from: Timestamp::from_millis(l.from_ms).unwrap() })
        .collect();
    Schedule::new(entries, view.horizon_ms).unwrap()
}

async fn default_schedule_reproduces_the_spec_vectors(db: Db) {
    let store = open(&db).await;
    let view = store.schedule(NOW, 30 * DAY).await.unwrap();
    assert_eq!(view.home_region, "us-east-1");
    assert_eq!(view.region_capacity(NOW), 8, "v1 has no region field; v2 carries 8");
    let s = schedule(&view);
    let d = s.decode(97_301_141_913_751_557).unwrap();
    assert_eq!((d.layout.name(), d.machine, d.sequence), ("v1", 37, 5));
    assert_eq!(format_unix_ms(d.timestamp.unix_ms()), "2026-09-26T12:00:00.000Z");
    let d = s.decode(683_244_571_854_022_659).unwrap();
    assert_eq!((d.layout.name(), d.region_number, d.machine, d.sequence), ("v2", Some(2), 170, 3));
    assert_eq!(format_unix_ms(d.timestamp.unix_ms()), "2031-03-01T09:30:00.000Z");
}

async fn region_numbers_are_never_reused(db: Db) {
    let store = open(&db).await;
    for (i, name) in ["us-east-1", "eu-west-1", "ap-south-1"].into_iter().enumerate() {
        assert_eq!(store.add_region(name, 8, "alice", NOW).await.unwrap().number, i as u32);
    }
    assert!(matches!(store.add_region("eu-west-1", 8, "alice", NOW).await, Err(RegistryError::NameExists(_))));
    let retired = store.retire_region("eu-west-1", "alice", NOW + 1).await.unwrap();
    assert_eq!((retired.number, retired.status), (1, RegionStatus::Retired));
    assert!(matches!(store.retire_region("eu-west-1", "alice", NOW).await, Err(RegistryError::UnknownRegion(_))));
    // The lowest never-used number, not the retired 1; and a retired name comes back with a new one.
    assert_eq!(store.add_region("sa-east-1", 8, "alice", NOW).await.unwrap().number, 3);
    assert_eq!(store.add_region("eu-west-1", 8, "alice", NOW).await.unwrap().number, 4);
    // Not after a restart either.
    drop(store);
    let store = open(&db).await;
    for n in 5..8 {
        assert_eq!(store.add_region(&format!("r{n}"), 8, "bob", NOW).await.unwrap().number, n);
    }
    assert!(matches!(store.add_region("r8", 8, "bob", NOW).await, Err(RegistryError::NoNumberLeft { capacity: 8 })));
    let regions = store.regions().await.unwrap();
    assert_eq!(regions.len(), 8, "the retired row stays: {regions:?}");
    assert_eq!(regions.iter().filter(|r| r.status == RegionStatus::Retired).count(), 1);
    let audit = store.audit_log(100).await.unwrap();
    assert_eq!(audit.iter().filter(|a| a.action == "add_region").count(), 8);
    assert!(audit.iter().any(|a| a.action == "retire_region" && a.actor == "alice"));
}

async fn concurrent_adds_never_share_a_number(db: Db) {
    let store = Arc::new(open(&db).await);
    // The same name from many callers at once: exactly one wins.
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.add_region("same", 8, "racer", NOW).await })
        })
        .collect();
    let (mut won, mut refused) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(region) => {
                assert_eq!(region.number, 0);
                won += 1;
            }
            Err(RegistryError::NameExists(_)) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!((won, refused), (1, 7));
    // Sixteen different names for the seven numbers left: each number goes to exactly one.
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { store.add_region(&format!("region-{i}"), 8, "racer", NOW).await })
        })
        .collect();
    let mut numbers = Vec::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(region) => numbers.push(region.number),
            Err(RegistryError::NoNumberLeft { .. }) => refused += 1,
            Err(other) => panic!("{other}"),
        }
    }
    numbers.sort_unstable();
    assert_eq!(numbers, (1..8).collect::<Vec<_>>(), "7 distinct numbers");
    assert_eq!(refused, 9);
}

async fn the_horizon_only_moves_forward(db: Db) {
    let store = open(&db).await;
    let far = store.advance_horizon(NOW, 30 * DAY).await.unwrap();
    assert_eq!(far as i64 + idgen_core::EPOCH_UNIX_MS, NOW + 30 * DAY);
    let near = store.advance_horizon(NOW, DAY).await.unwrap();
    assert_eq!(near, far, "a shorter lead (or a clock behind) never pulls the horizon back");
    assert_eq!(store.schedule(NOW, DAY).await.unwrap().horizon_ms, far);
    let later = store.advance_horizon(NOW + 2 * DAY, 30 * DAY).await.unwrap();
    assert_eq!(later, far + 2 * DAY as u64);
}

/// Reads do not write while the horizon is at least half a lead ahead: the horizon a read
/// returns stays where the writer left it as time passes; only once it has fallen half a lead
/// behind does a read move it (a new registry's first read, a writer that stopped).
async fn reads_write_only_when_the_horizon_must_move(db: Db) {
    let store = open(&db).await;
    let first = store.schedule(NOW, 30 * DAY).await.unwrap().horizon_ms;
    assert_eq!(first as i64 + idgen_core::EPOCH_UNIX_MS, NOW + 30 * DAY, "a new registry's first read moves it");
    for later in [NOW + DAY, NOW + 14 * DAY] {
        assert_eq!(store.schedule(later, 30 * DAY).await.unwrap().horizon_ms, first, "a read wrote");
    }
    let moved = store.schedule(NOW + 16 * DAY, 30 * DAY).await.unwrap().horizon_ms;
    assert_eq!(moved as i64 + idgen_core::EPOCH_UNIX_MS, NOW + 46 * DAY, "half a lead behind: moved");
}

async fn layouts_are_validated(db: Db) {
    let store = open(&db).await;
    let horizon = store.schedule(NOW, 30 * DAY).await.unwrap().horizon_ms;
    let v2_from = idgen_core::DEFAULT_V2_FROM;
    let v3 = |from_ms| ScheduledLayout { layout: Layout::new("v3", 4, 8, 10).unwrap(), from_ms };
    // Before the horizon, or not after the last layout (v2 at 2028): refused, nothing changed.
    assert!(matches!(
        store.add_layout(v3(horizon - 1), "alice", NOW, 30 * DAY).await,
        Err(RegistryError::ScheduleConflict { .. })
    ));
    assert!(matches!(
        store.add_layout(v3(v2_from), "alice", NOW, 30 * DAY).await,
        Err(RegistryError::ScheduleConflict { .. })
    ));
    assert!(matches!(
        store.add_layout(v3(idgen_core::MAX_TIMESTAMP + 1), "alice", NOW, 30 * DAY).await,
        Err(RegistryError::ScheduleConflict { .. })
    ));
    let dup = ScheduledLayout { layout: Layout::v2(), from_ms: v2_from * 2 };
    assert!(matches!(store.add_layout(dup, "alice", NOW, 30 * DAY).await, Err(RegistryError::LayoutExists(_))));
    // A layout that cannot carry an active region's number.
    for n in 0..6 {
        store.add_region(&format!("r{n}"), 8, "alice", NOW).await.unwrap();
    }
    let narrow = ScheduledLayout { layout: Layout::new("narrow", 2, 10, 10).unwrap(), from_ms: v2_from * 2 };
    assert!(matches!(
        store.add_layout(narrow, "alice", NOW, 30 * DAY).await,
        Err(RegistryError::ScheduleConflict { .. })
    ));
    assert_eq!(store.schedule(NOW, 30 * DAY).await.unwrap().layouts.len(), 2, "refusals changed nothing");
    // A valid one.
    store.add_layout(v3(v2_from * 2), "alice", NOW, 30 * DAY).await.unwrap();
    let view = store.schedule(NOW, 30 * DAY).await.unwrap();
    assert_eq!(view.layouts.iter().map(|l| l.layout.name()).collect::<Vec<_>>(), ["v1", "v2", "v3"]);
    assert_eq!(view.region_capacity(NOW), 8, "v2 (3 bits) is still ahead: a number must fit it too");
    let after_v2 = idgen_core::EPOCH_UNIX_MS + v2_from as i64 * 2 + 1;
    assert_eq!(view.region_capacity(after_v2), 16, "once only v3 (4 bits) remains");
    assert!(store.audit_log(10).await.unwrap().iter().any(|a| a.action == "add_layout" && a.detail.starts_with("v3")));
}

/// A production registry opens only a database `initialize` made (`idgen registry init`): an
/// empty one is refused and left empty, never seeded, so no region number is handed out twice;
/// init is idempotent and keeps what the registry handed out; another home region is refused.
async fn open_never_initializes_and_init_is_idempotent(db: Db) {
    let within = std::time::Duration::from_secs(5);
    let refused = |result: Result<RegistryStore, RegistryError>| match result {
        Err(RegistryError::NotARegistry(why)) => why,
        Err(other) => panic!("not a refusal: {other}"),
        Ok(_) => panic!("opened"),
    };
    let why = refused(RegistryStore::open(db.url(), "us-east-1", within).await);
    assert!(why.contains("empty") && why.contains("idgen registry init"), "{why}");
    let why = refused(RegistryStore::open(db.url(), "us-east-1", within).await);
    assert!(why.contains("empty"), "a refused open made something: {why}");

    let initial = InitialSchedule::spec_default("us-east-1");
    assert_eq!(RegistryStore::initialize(db.url(), &initial, within).await.unwrap(), Initialized::Now);
    let store = RegistryStore::open(db.url(), "us-east-1", within).await.unwrap();
    assert_eq!(store.add_region("us-east-1", 8, "alice", NOW).await.unwrap().number, 0);
    assert_eq!(store.add_region("eu-west-1", 8, "alice", NOW).await.unwrap().number, 1);
    let again = RegistryStore::initialize(db.url(), &initial, within).await.unwrap();
    assert_eq!(again, Initialized::Already { home_region: "us-east-1".into(), regions: 2 });
    assert_eq!(store.add_region("ap-south-1", 8, "alice", NOW).await.unwrap().number, 2, "init kept the numbers");

    let other = InitialSchedule::spec_default("eu-west-1");
    assert!(matches!(RegistryStore::initialize(db.url(), &other, within).await, Err(RegistryError::NotARegistry(_))));
    let why = refused(RegistryStore::open(db.url(), "eu-west-1", within).await);
    assert!(why.contains("home region us-east-1"), "{why}");
}

store_suite!(sqlite: default_schedule_reproduces_the_spec_vectors, region_numbers_are_never_reused, concurrent_adds_never_share_a_number, the_horizon_only_moves_forward, layouts_are_validated, open_never_initializes_and_init_is_idempotent, reads_write_only_when_the_horizon_must_move);
store_suite!(postgres: default_schedule_reproduces_the_spec_vectors, region_numbers_are_never_reused, concurrent_adds_never_share_a_number, the_horizon_only_moves_forward, layouts_are_validated, open_never_initializes_and_init_is_idempotent, reads_write_only_when_the_horizon_must_move);
