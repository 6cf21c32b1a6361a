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
const LEAD: i64 = 30 * DAY;

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
    let retired = store.retire_region("eu-west-1", None, "alice", NOW + 1, LEAD).await.unwrap();
    assert_eq!((retired.number, retired.status), (1, RegionStatus::Retired));
    assert!(matches!(
        store.retire_region("eu-west-1", None, "alice", NOW, LEAD).await,
        Err(RegistryError::UnknownRegion(_))
    ));
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
    let regions = store.regions(NOW).await.unwrap();
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

async fn a_retirement_takes_effect_at_its_time_and_can_be_cancelled_until_then(db: Db) {
    let store = open(&db).await;
    for name in ["us-east-1", "eu-west-1", "ap-south-1"] {
        store.add_region(name, 8, "alice", NOW).await.unwrap();
    }
    let at = NOW + DAY;
    let pending = store.retire_region("eu-west-1", Some(at), "alice", NOW, LEAD).await.unwrap();
    assert_eq!((pending.number, pending.status, pending.retires_at_ms), (1, RegionStatus::Active, Some(at)));
    let eu = |regions: Vec<idgen_registry::store::Region>| regions.into_iter().find(|r| r.number == 1).unwrap();
    // Until its time it is active (it still issues and owns its number); from then on, retired.
    let before = eu(store.regions(at - 1).await.unwrap());
    assert_eq!((before.status, before.retires_at_ms, before.retired_at_ms), (RegionStatus::Active, Some(at), None));
    let after = eu(store.regions(at).await.unwrap());
    assert_eq!((after.status, after.retires_at_ms, after.retired_at_ms), (RegionStatus::Retired, None, Some(at)));
    // Pending: the name is still taken, and a second time is refused; at once is not.
    assert!(matches!(store.add_region("eu-west-1", 8, "alice", NOW).await, Err(RegistryError::NameExists(_))));
    assert!(matches!(
        store.retire_region("eu-west-1", Some(at + DAY), "alice", NOW, LEAD).await,
        Err(RegistryError::RetirePending { at_ms, .. }) if at_ms == at
    ));

    // Cancelled while ahead: active with nothing pending, and nothing left to cancel.
    let cancelled = store.cancel_retire("eu-west-1", "bob", at - 1).await.unwrap();
    assert_eq!((cancelled.status, cancelled.retires_at_ms), (RegionStatus::Active, None));
    assert_eq!(eu(store.regions(at + DAY).await.unwrap()).status, RegionStatus::Active, "cancelled for good");
    assert!(matches!(store.cancel_retire("eu-west-1", "bob", NOW).await, Err(RegistryError::NoRetirementPending(_))));
    assert!(matches!(store.cancel_retire("nowhere-1", "bob", NOW).await, Err(RegistryError::UnknownRegion(_))));

    // Scheduled again; once its time has passed it cannot be cancelled, and the name comes back
    // with a new number (the write makes the retirement permanent first).
    store.retire_region("eu-west-1", Some(at + DAY), "alice", NOW, LEAD).await.unwrap();
    assert!(matches!(
        store.cancel_retire("eu-west-1", "bob", at + DAY).await,
        Err(RegistryError::AlreadyRetired { at_ms, .. }) if at_ms == at + DAY
    ));
    assert_eq!(store.add_region("eu-west-1", 8, "alice", at + DAY).await.unwrap().number, 3);
    let regions = store.regions(at + DAY).await.unwrap();
    assert_eq!(regions[1].retired_at_ms, Some(at + DAY), "{regions:?}");
    assert!(matches!(
        store.cancel_retire("eu-west-1", "bob", at + DAY).await,
        Err(RegistryError::NoRetirementPending(_))
    ));

    // A pending retirement is brought forward by a retire at once (a region already dead).
    store.retire_region("ap-south-1", Some(at), "alice", NOW, LEAD).await.unwrap();
    let now = store.retire_region("ap-south-1", None, "alice", NOW + 5, LEAD).await.unwrap();
    assert_eq!((now.status, now.retired_at_ms, now.retires_at_ms), (RegionStatus::Retired, Some(NOW + 5), None));
    assert!(matches!(
        store.cancel_retire("ap-south-1", "bob", NOW + 6).await,
        Err(RegistryError::AlreadyRetired { .. })
    ));

    let audit = store.audit_log(100).await.unwrap();
    let actions: Vec<(&str, &str)> = audit.iter().map(|a| (a.action.as_str(), a.actor.as_str())).collect();
    for expected in [("schedule_retire", "alice"), ("cancel_retire", "bob"), ("retire_region", "alice")] {
        assert!(actions.contains(&expected), "{expected:?} not in {actions:?}");
    }
    assert!(audit.iter().any(|a| a.action == "schedule_retire" && a.detail.contains(&format_unix_ms(at))));
}

async fn the_home_region_stays_while_a_layout_only_it_issues_under_is_ahead(db: Db) {
    let store = open(&db).await;
    store.add_region("us-east-1", 8, "alice", NOW).await.unwrap();
    // v1 has no region bits and is in force until v2 (2028-01-01): at once or later, refused.
    for at in [None, Some(NOW + DAY)] {
        let Err(RegistryError::HomeRegionInUse(why)) = store.retire_region("us-east-1", at, "alice", NOW, LEAD).await
        else {
            panic!("the home region was retired under v1");
        };
        assert!(why.contains("v1") && why.contains("until 2028-01-01T00:00:00.000Z"), "{why}");
    }
    assert_eq!(store.regions(NOW + 2 * DAY).await.unwrap()[0].status, RegionStatus::Active, "nothing changed");

    // Once v2 is in force, it can be retired; and no layout without region bits can then be
    // scheduled while the retirement is pending (only the home region would issue under it).
    let later = idgen_core::EPOCH_UNIX_MS + idgen_core::DEFAULT_V2_FROM as i64 + 100 * DAY;
    store.retire_region("us-east-1", Some(later + DAY), "alice", later, LEAD).await.unwrap();
    let from_ms = (later - idgen_core::EPOCH_UNIX_MS + 400 * DAY) as u64;
    let home_only = ScheduledLayout { layout: Layout::new("v3", 0, 10, 12).unwrap(), from_ms };
    let Err(RegistryError::ScheduleConflict { what }) = store.add_layout(home_only.clone(), "alice", later, LEAD).await
    else {
        panic!("a home-only layout was scheduled while the home region retires");
    };
    assert!(what.contains("retires at"), "{what}");
    store.cancel_retire("us-east-1", "alice", later).await.unwrap();
    store.add_layout(home_only, "alice", later, LEAD).await.unwrap();
    let Err(RegistryError::HomeRegionInUse(why)) =
        store.retire_region("us-east-1", Some(later + DAY), "alice", later, LEAD).await
    else {
        panic!("the home region was retired with a home-only layout scheduled");
    };
    assert!(why.contains("v3") && why.contains("scheduled from") && why.contains("no end"), "{why}");
}

async fn a_registry_has_one_identity_made_at_init(db: Db) {
    let store = open(&db).await;
    let id = store.schedule(NOW, LEAD).await.unwrap().registry_id;
    assert_eq!(id.len(), 32, "{id}");
    // Init again, or another process opening it: the same registry.
    assert_eq!(open(&db).await.schedule(NOW + DAY, LEAD).await.unwrap().registry_id, id);
    // A registry started over on another database has another.
    let other = if db.url().starts_with("sqlite:") { sqlite().await } else { postgres().await };
    assert_ne!(open(&other).await.schedule(NOW, LEAD).await.unwrap().registry_id, id);
}

async fn each_region_names_its_lease_tables_and_only_a_compare_and_set_moves_one(db: Db) {
    use std::collections::BTreeMap;
    let store = open(&db).await;
    let tables = |region: &idgen_registry::store::Region| -> Vec<(String, String, Option<String>)> {
        region.lease_tables.iter().map(|(l, t)| (l.clone(), t.table.clone(), t.moved_from.clone())).collect()
    };
    let defaults = store.add_region("us-east-1", 8, "alice", NOW).await.unwrap();
    assert_eq!(
        tables(&defaults),
        vec![("v1".into(), "idgen-leases".into(), None), ("v2".into(), "idgen-leases-v2".into(), None)]
    );
    let named = BTreeMap::from([("v2".to_owned(), "eu-leases-v2".to_owned())]);
    let eu = store.add_region_with_tables("eu-west-1", 8, &named, "alice", NOW).await.unwrap();
    assert_eq!(tables(&eu)[1], ("v2".into(), "eu-leases-v2".into(), None));
    let unknown = BTreeMap::from([("v9".to_owned(), "x-leases".to_owned())]);
    let refused = store.add_region_with_tables("ap-south-1", 8, &unknown, "alice", NOW).await;
    assert!(matches!(refused, Err(RegistryError::UnknownLayout(_))), "{refused:?}");
    let twice = BTreeMap::from([("v1".to_owned(), "same".to_owned()), ("v2".to_owned(), "same".to_owned())]);
    let refused = store.add_region_with_tables("ap-south-1", 8, &twice, "alice", NOW).await;
    assert!(matches!(refused, Err(RegistryError::LeaseTableInUse { .. })), "{refused:?}");
    assert_eq!(store.regions(NOW).await.unwrap().len(), 2, "refused adds add nothing");

    // A move names the table it replaces; a move from a table that is no longer the region's is
    // refused (two operators, or a typo), and changes nothing.
    let moved =
        store.move_lease_table("eu-west-1", "v2", "eu-leases-v2", "eu-leases-v2-restored", None, "bob", NOW).await;
    let moved = moved.unwrap();
    assert_eq!(tables(&moved)[1], ("v2".into(), "eu-leases-v2-restored".into(), Some("eu-leases-v2".into())));
    let stale =
        store.move_lease_table("eu-west-1", "v2", "eu-leases-v2", "eu-leases-v2-again", None, "carol", NOW).await;
    assert!(matches!(stale, Err(RegistryError::LeaseTableMoved { .. })), "{stale:?}");
    let clash =
        store.move_lease_table("eu-west-1", "v1", "idgen-leases", "eu-leases-v2-restored", None, "bob", NOW).await;
    assert!(matches!(clash, Err(RegistryError::LeaseTableInUse { .. })), "{clash:?}");
    assert!(matches!(
        store.move_lease_table("eu-west-1", "v9", "a-table", "b-table", None, "bob", NOW).await,
        Err(RegistryError::UnknownLayout(_))
    ));
    assert!(matches!(
        store.move_lease_table("nowhere", "v1", "a-table", "b-table", None, "bob", NOW).await,
        Err(RegistryError::UnknownRegion(_))
    ));
    let listed = store.regions(NOW).await.unwrap();
    assert_eq!(tables(&listed[1]), tables(&moved), "as the move answered");
    assert_eq!(tables(&listed[0]), tables(&defaults), "another region untouched");
    let audit = store.audit_log(10).await.unwrap();
    assert_eq!((audit[0].action.as_str(), audit[0].actor.as_str()), ("move_lease_table", "bob"));

    // A layout scheduled later gets every active region's default table.
    let v3 = Layout::new("v3", 4, 8, 10).unwrap();
    let from_ms = idgen_core::DEFAULT_V2_FROM + 365 * DAY as u64;
    store.add_layout(ScheduledLayout { layout: v3, from_ms }, "alice", NOW, LEAD).await.unwrap();
    for region in store.regions(NOW).await.unwrap() {
        assert_eq!(region.lease_tables["v3"].table, "idgen-leases-v3", "{}", region.name);
    }
}

async fn a_regions_lease_table_is_recorded_by_its_first_init_and_no_other_table_of_its_name(db: Db) {
    let store = open(&db).await;
    store.add_region("us-east-1", 8, "alice", NOW).await.unwrap();
    let id = |region: &idgen_registry::store::Region, layout: &str| region.lease_tables[layout].table_id.clone();
    assert_eq!(id(&store.regions(NOW).await.unwrap()[0], "v1"), None, "nothing recorded before the first init");
    let (region, recorded) = store
        .record_lease_table("us-east-1", "v1", "idgen-leases", "aaaaaaaaaaaaaaaa1111", "alice", NOW)
        .await
        .unwrap();
    assert!(recorded);
    assert_eq!(id(&region, "v1").as_deref(), Some("aaaaaaaaaaaaaaaa1111"));
    // The same table again (init is idempotent): nothing more.
    let (_, again) =
        store.record_lease_table("us-east-1", "v1", "idgen-leases", "aaaaaaaaaaaaaaaa1111", "bob", NOW).await.unwrap();
    assert!(!again);
    // A second table of the same name: refused, nothing changed.
    let other = store.record_lease_table("us-east-1", "v1", "idgen-leases", "bbbbbbbbbbbbbbbb2222", "bob", NOW).await;
    assert!(matches!(other, Err(RegistryError::LeaseTableIdentity { .. })), "{other:?}");
    // A table the region does not name, a layout it has none for, a region that is not there.
    let unnamed = store.record_lease_table("us-east-1", "v1", "other-leases", "bbbbbbbbbbbbbbbb2222", "bob", NOW).await;
    assert!(matches!(unnamed, Err(RegistryError::LeaseTableMoved { .. })), "{unnamed:?}");
    let v9 = store.record_lease_table("us-east-1", "v9", "idgen-leases", "bbbbbbbbbbbbbbbb2222", "bob", NOW).await;
    assert!(matches!(v9, Err(RegistryError::UnknownLayout(_))), "{v9:?}");
    let nowhere = store.record_lease_table("nowhere", "v1", "idgen-leases", "bbbbbbbbbbbbbbbb2222", "bob", NOW).await;
    assert!(matches!(nowhere, Err(RegistryError::UnknownRegion(_))), "{nowhere:?}");
    let listed = store.regions(NOW).await.unwrap();
    assert_eq!(id(&listed[0], "v1").as_deref(), Some("aaaaaaaaaaaaaaaa1111"));
    assert_eq!(id(&listed[0], "v2"), None, "each layout's table is its own");
    // A move names the adopted table's identity, or none (its next init records it).
    let moved = store
        .move_lease_table(
            "us-east-1",
            "v1",
            "idgen-leases",
            "idgen-leases-adopted",
            Some("cccccccccccccccc3333"),
            "bob",
            NOW,
        )
        .await
        .unwrap();
    assert_eq!(id(&moved, "v1").as_deref(), Some("cccccccccccccccc3333"));
    let moved =
        store.move_lease_table("us-east-1", "v2", "idgen-leases-v2", "idgen-leases-v2-b", None, "bob", NOW).await;
    assert_eq!(id(&moved.unwrap(), "v2"), None);
    let audit = store.audit_log(10).await.unwrap();
    assert!(audit.iter().any(|a| a.action == "record_lease_table" && a.detail.contains("aaaaaaaaaaaaaaaa1111")));
}

async fn numbers_reported_in_use_elsewhere_are_never_handed_out_before_their_time(db: Db) {
    use idgen_registry::store::Reported;
    let store = open(&db).await;
    let ours = store.schedule(NOW, LEAD).await.unwrap().registry_id;
    store.add_region("us-east-1", 8, "alice", NOW).await.unwrap();
    // A generator of another registry (this one started over) issues as eu-west-1 under 1, and
    // another as ap-south-1 under 3, until a day from now.
    let until = NOW + DAY;
    let reported = store.report_number_in_use(1, "eu-west-1", "old-registry", until, "w1", NOW, LEAD).await.unwrap();
    assert_eq!(reported, Reported::Withheld { until_ms: until });
    store.report_number_in_use(3, "ap-south-1", "old-registry", until, "w2", NOW, LEAD).await.unwrap();
    // Reports that withhold nothing: this registry's own generators, a time past, the number under
    // the same region here, a number handed to another region here (two regions on one number).
    let nothing = |reported| matches!(reported, Reported::Nothing { .. });
    assert!(nothing(store.report_number_in_use(2, "x", &ours, until, "w", NOW, LEAD).await.unwrap()));
    assert!(nothing(store.report_number_in_use(2, "x", "old-registry", NOW - 1, "w", NOW, LEAD).await.unwrap()));
    assert!(nothing(store.report_number_in_use(0, "us-east-1", "old-registry", until, "w", NOW, LEAD).await.unwrap()));
    let conflict = store.report_number_in_use(0, "sa-east-1", "old-registry", until, "w", NOW, LEAD).await.unwrap();
    assert_eq!(conflict, Reported::Conflict { region: "us-east-1".into() });
    // The most a report withholds a number for is one lead.
    let capped = store.report_number_in_use(5, "x", "old-registry", NOW + 400 * DAY, "w", NOW, LEAD).await.unwrap();
    assert_eq!(capped, Reported::Withheld { until_ms: NOW + LEAD });
    let held: Vec<u32> = store.numbers_in_use(NOW).await.unwrap().iter().map(|n| n.number).collect();
    assert_eq!(held, vec![1, 3, 5]);

    // New regions get the numbers nobody issues under: 2, 4, 6, 7; then none is left but the
    // withheld ones, and the refusal says so.
    for expected in [2, 4, 6, 7] {
        let name = format!("r{expected}");
        assert_eq!(store.add_region(&name, 8, "alice", NOW).await.unwrap().number, expected);
    }
    let refused = store.add_region("r8", 8, "alice", NOW).await;
    assert!(
        matches!(&refused, Err(RegistryError::NumbersInUse { numbers, .. }) if *numbers == vec![1, 3, 5]),
        "{refused:?}"
    );
    // Their time over, they are handed out as any other.
    assert!(store.numbers_in_use(until).await.unwrap().iter().all(|n| n.number == 5));
    assert_eq!(store.add_region("r8", 8, "alice", until).await.unwrap().number, 1);
}

async fn a_new_registry_hands_out_no_number_while_it_is_quiet(db: Db) {
    let store = open(&db).await;
    let now = idgen::system_unix_ms();
    let quiet = store.add_region_quietly("us-east-1", 8, &Default::default(), 60_000, "alice", now).await;
    assert!(matches!(quiet, Err(RegistryError::NewRegistryQuiet { .. })), "{quiet:?}");
    let later = store.add_region_quietly("us-east-1", 8, &Default::default(), 60_000, "alice", now + 61_000).await;
    assert_eq!(later.unwrap().number, 0);
}

store_suite!(
    a_regions_lease_table_is_recorded_by_its_first_init_and_no_other_table_of_its_name,
    numbers_reported_in_use_elsewhere_are_never_handed_out_before_their_time,
    a_new_registry_hands_out_no_number_while_it_is_quiet,
    default_schedule_reproduces_the_spec_vectors,
    region_numbers_are_never_reused,
    concurrent_adds_never_share_a_number,
    the_horizon_only_moves_forward,
    layouts_are_validated,
    open_never_initializes_and_init_is_idempotent,
    reads_write_only_when_the_horizon_must_move,
    a_retirement_takes_effect_at_its_time_and_can_be_cancelled_until_then,
    the_home_region_stays_while_a_layout_only_it_issues_under_is_ahead,
    a_registry_has_one_identity_made_at_init,
    each_region_names_its_lease_tables_and_only_a_compare_and_set_moves_one
);

/// `idgen registry init --owner-url`: the migrations run as the schema's owner, and the role the
/// registry runs as can do everything the registry does (open, add and retire regions, add a
/// layout, move the horizon, write the audit) and nothing more: no DELETE, no TRUNCATE, no
/// change to a layout, no DDL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_role_does_what_the_registry_does_and_nothing_more() {
    use sqlx::Connection;
    let db = postgres().await;
    let runtime = db.login_role().await;
    let within = std::time::Duration::from_secs(5);
    let role = idgen_server::database::user_of(&runtime).unwrap();
    RegistryStore::initialize(db.url(), &InitialSchedule::spec_default("us-east-1"), within).await.unwrap();
    RegistryStore::grant_runtime(db.url(), &role, None).await.unwrap();
    // Granting again (an upgrade's init) leaves the same set.
    RegistryStore::grant_runtime(db.url(), &role, None).await.unwrap();

    let store = RegistryStore::open(&runtime, "us-east-1", within).await.unwrap();
    store.advance_horizon(NOW, 30 * DAY).await.unwrap();
    store.add_region("us-east-1", 8, "alice", NOW).await.unwrap();
    store.add_region("eu-west-1", 8, "alice", NOW).await.unwrap();
    store.retire_region("eu-west-1", Some(NOW + DAY), "alice", NOW, 30 * DAY).await.unwrap();
    store.cancel_retire("eu-west-1", "alice", NOW + 1).await.unwrap();
    store.retire_region("eu-west-1", None, "alice", NOW + 2, 30 * DAY).await.unwrap();
    let from_ms = (NOW + 400 * DAY - idgen_core::EPOCH_UNIX_MS) as u64 + idgen_core::DEFAULT_V2_FROM;
    let v3 = ScheduledLayout { layout: Layout::new("v3", 4, 8, 10).unwrap(), from_ms };
    store.add_layout(v3, "alice", NOW, 30 * DAY).await.unwrap();
    assert_eq!(store.schedule(NOW, 30 * DAY).await.unwrap().layouts.len(), 3);
    assert!(store.audit_log(10).await.unwrap().len() >= 5);

    let mut conn = sqlx::PgConnection::connect(&runtime).await.unwrap();
    for statement in [
        "DELETE FROM regions",
        "DELETE FROM registry_audit",
        "TRUNCATE layouts",
        "UPDATE layouts SET from_ms = 0",
        "DROP TABLE schedule_state",
        "ALTER TABLE regions ADD COLUMN x BIGINT",
        "CREATE TABLE shadow (a BIGINT)",
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (99, 'x', true, '\\x00', 0)",
    ] {
        let error = sqlx::query(statement).execute(&mut conn).await.expect_err(statement).to_string();
        assert!(error.contains("permission denied") || error.contains("must be owner"), "{statement}: {error}");
    }
    // A role init makes itself, with the password a deployment keeps in its secret (a quote in it
    // is a literal's, not SQL); a second init sets the password again.
    let made = format!("idgen_test_role_{}_made", std::process::id());
    RegistryStore::grant_runtime(db.url(), &made, Some("pass'word")).await.unwrap();
    RegistryStore::grant_runtime(db.url(), &made, Some("another")).await.unwrap();
    let mut admin = sqlx::PgConnection::connect(db.url()).await.unwrap();
    let (login, password): (bool, bool) =
        sqlx::query_as("SELECT rolcanlogin, rolpassword IS NOT NULL FROM pg_authid WHERE rolname = $1")
            .bind(&made)
            .fetch_one(&mut admin)
            .await
            .unwrap();
    assert!(login && password, "the role init made cannot log in with a password");
    for statement in [format!("DROP OWNED BY {made}"), format!("DROP ROLE {made}")] {
        sqlx::query(&statement).execute(&mut admin).await.unwrap();
    }

    // Nor can it make or migrate a registry of its own.
    let initial = InitialSchedule::spec_default("us-east-1");
    drop(conn);
    drop(store);
    let fresh = postgres().await;
    let own = fresh.url().replacen("://postgres@", &format!("://{role}@"), 1);
    assert!(RegistryStore::initialize(&own, &initial, within).await.is_err(), "the runtime role created tables");
}

/// A registry database made before registries had an identity and named lease tables (its
/// migrations up to 0002), with regions: `init` gives it an identity and names each region's
/// tables as they were, the defaults, so the fleets it serves go on claiming where they did.
#[tokio::test]
async fn a_registry_of_an_earlier_release_gets_an_identity_and_names_todays_tables() {
    use std::borrow::Cow;
    let db = postgres().await;
    let pool = sqlx::PgPool::connect(db.url()).await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations/registry/postgres");
    let mut migrator = sqlx::migrate::Migrator::new(dir).await.unwrap();
    migrator.migrations = Cow::Owned(migrator.migrations.iter().filter(|m| m.version < 3).cloned().collect());
    migrator.run(&pool).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO schedule_state (id, horizon_ms, home_region) VALUES (1, 0, 'us-east-1');
         INSERT INTO layouts VALUES ('v1', 0, 10, 12, 0, 0), ('v2', 3, 9, 10, 63072000000, 0);
         INSERT INTO regions (number, name, status, created_at_ms) VALUES (0, 'us-east-1', 'active', 0),
                (1, 'eu-west-1', 'active', 0);",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let initialized = RegistryStore::initialize(
        db.url(),
        &InitialSchedule::spec_default("us-east-1"),
        std::time::Duration::from_secs(5),
    )
    .await
    .unwrap();
    assert!(matches!(initialized, Initialized::Already { regions: 2, .. }), "{initialized:?}");
    let store = RegistryStore::open(db.url(), "us-east-1", std::time::Duration::from_secs(5)).await.unwrap();
    assert_eq!(store.schedule(NOW, LEAD).await.unwrap().registry_id.len(), 32);
    for region in store.regions(NOW).await.unwrap() {
        let named: Vec<(&str, &str)> =
            region.lease_tables.iter().map(|(l, t)| (l.as_str(), t.table.as_str())).collect();
        assert_eq!(named, vec![("v1", "idgen-leases"), ("v2", "idgen-leases-v2")], "{}", region.name);
    }
}
