//! The lease keeper driven step by step: a manual wall clock, a hand-moved monotonic `now`
//! passed to `tick`, and a real SQLite lease table (and, where a test says so, a DynamoDB table on
//! the DynamoDB-protocol server ./scripts/test starts: the same steps on both stores).

use std::sync::Arc;

use idgen::lease::conformance::FaultyStore;
use std::time::Duration;

use idgen::core::{Generator, GeneratorConfig, OPEN_HORIZON, Refusal, Schedule};
use idgen::{
    AuditKind, GeneratorMetrics, IdGenerator, LeaseConfig, LeaseConfigError, LeaseKeeper, LeaseStore, MachineRanges,
    ManualClock, Outcome, SqliteLeaseStore, SyncStatus,
};
use tokio::time::Instant;

const T0: i64 = 1_790_424_000_000;

struct Fixture {
    _dir: tempfile::TempDir,
    store: Arc<dyn LeaseStore>,
    clock: Arc<ManualClock>,
    backend: Backend,
}

/// Which lease store a fixture's table is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Dynamodb,
}

async fn fixture() -> Fixture {
    fixture_on(Backend::Sqlite).await
}

/// A fresh table on `backend` (DynamoDB: a table of its own on the DynamoDB-protocol server).
async fn fixture_on(backend: Backend) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn LeaseStore> = match backend {
        Backend::Sqlite => {
            Arc::new(SqliteLeaseStore::open(&dir.path().join("leases.db"), "idgen-leases").await.unwrap())
        }
        Backend::Dynamodb => Arc::new(bare_dynamodb_table().await),
    };
    // The operator's step that makes a table the fleet's (`idgen leases init`).
    store.record_genesis(&init_request(), T0).await.unwrap();
    Fixture { _dir: dir, store, clock: Arc::new(ManualClock::new(T0)), backend }
}

/// A new DynamoDB lease table (and its audit table), as a stack makes them: no genesis.
async fn bare_dynamodb_table() -> idgen::DynamoDbLeaseStore {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let table = format!("keeper-{}-{n}-{nanos}", std::process::id());
    let store = idgen::DynamoDbLeaseStore::new(dynamodb_client().await, &table);
    store.create_tables().await.expect("creating tables on the DynamoDB-protocol server");
    store
}

fn init_request() -> idgen::GenesisRequest {
    idgen::GenesisRequest { how: idgen::GenesisHow::Init, by: "oncall".into(), registry_id: None }
}

/// Both stores.
const BACKENDS: [Backend; 2] = [Backend::Sqlite, Backend::Dynamodb];

async fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    let endpoint = std::env::var("IDGEN_DYNAMODB_ENDPOINT").expect(
        "IDGEN_DYNAMODB_ENDPOINT is not set: these tests need a DynamoDB-protocol server (./scripts/test starts moto)",
    );
    let settings = idgen::DynamoDbSettings { endpoint: Some(endpoint), ..idgen::DynamoDbSettings::default() };
    idgen::lease::dynamodb::client(&settings).await
}

fn config(machines: std::ops::RangeInclusive<u32>) -> LeaseConfig {
    LeaseConfig {
        lease_ms: 3_000,
        renew_interval_ms: 1_000,
        fence_ms: 500,
        machines: MachineRanges::everywhere(machines),
        max_backoff_ms: 2_000,
    }
}

fn generator(clock: &Arc<ManualClock>) -> Arc<IdGenerator> {
    generator_in(clock, 0, true)
}

fn generator_in(clock: &Arc<ManualClock>, region: u32, home: bool) -> Arc<IdGenerator> {
    let core = Generator::new(
        GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 },
        Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
        region,
        home,
    )
    .unwrap();
    Arc::new(IdGenerator::new(core, clock.clone(), Arc::new(GeneratorMetrics::default())))
}

/// The generator's metrics as Prometheus text.
fn metrics_text(g: &IdGenerator) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    g.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

fn keeper(
    f: &Fixture,
    generator: &Arc<IdGenerator>,
    machines: std::ops::RangeInclusive<u32>,
    holder: &str,
) -> LeaseKeeper {
    LeaseKeeper::new("v1", f.store.clone(), generator.clone(), config(machines), holder.into()).unwrap()
}

#[tokio::test]
async fn claims_renews_and_issues_under_its_machine_number() {
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 0..=63, "a");
    assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })), "no ID before a claim");
    let Outcome::Claimed { machine, epoch: 1, expiry_unix_ms } = k.tick(now).await else { panic!() };
    assert_eq!(expiry_unix_ms, T0 + 3_000);
    let id = g.next_id().await.unwrap();
    assert_eq!((id >> 12) & 0x3ff, u64::from(machine));
    assert_eq!(k.tick(now).await, Outcome::Idle, "nothing due yet");
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    assert_eq!(k.tick(now).await, Outcome::Renewed { machine, expiry_unix_ms: T0 + 4_000 });
    assert_eq!(g.with_core(|c| c.lease("v1").unwrap().expiry_unix_ms), T0 + 4_000);
}

#[tokio::test]
async fn a_lost_renewal_stops_issuing_at_once_and_claims_another_number() {
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 7..=8, "a");
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    g.next_id().await.unwrap();
    // An operator quarantines the number under the live worker.
    f.store.quarantine(machine, "oncall", T0 + 10).await.unwrap();
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    let Outcome::Lost { machine: lost, then } = outcome else { panic!("{outcome:?}") };
    assert_eq!(lost, machine);
    let Outcome::Claimed { machine: other, .. } = *then else { panic!("{then:?}") };
    assert_ne!(other, machine);
    let id = g.next_id().await.unwrap();
    assert_eq!((id >> 12) & 0x3ff, u64::from(other));
    let history = f.store.history(Some(machine), T0, T0 + 10_000).await.unwrap();
    assert!(history.iter().any(|e| e.kind == AuditKind::RenewFailed));
}

#[tokio::test]
async fn when_every_number_is_taken_it_stays_not_ready_and_backs_off() {
    let mut now = Instant::now();
    let f = fixture().await;
    let (g1, g2, g3) = (generator(&f.clock), generator(&f.clock), generator(&f.clock));
    let (mut k1, mut k2, mut k3) =
        (keeper(&f, &g1, 0..=1, "a"), keeper(&f, &g2, 0..=1, "b"), keeper(&f, &g3, 0..=1, "c"));
    assert!(matches!(k1.tick(now).await, Outcome::Claimed { .. }));
    assert!(matches!(k2.tick(now).await, Outcome::Claimed { .. }));
    let mut delays = Vec::new();
    for _ in 0..6 {
        let Outcome::AllTaken { retry_in } = k3.tick(now).await else { panic!() };
        delays.push(retry_in);
        assert!(matches!(g3.next_id().await, Err(Refusal::NoLease { .. })));
        assert_eq!(k3.tick(now).await, Outcome::Idle, "not retried before the backoff");
        now += retry_in;
    }
    assert!(delays.iter().all(|d| *d <= Duration::from_millis(3_000)), "capped at max backoff + jitter: {delays:?}");
    assert!(delays[4] > delays[0], "backs off: {delays:?}");
}

#[tokio::test]
async fn release_writes_last_issued_plus_one_and_a_successor_starts_at_once() {
    let now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 4..=4, "a");
    assert!(matches!(k.tick(now).await, Outcome::Claimed { machine: 4, .. }));
    f.clock.advance(42);
    let last = g.next_id().await.unwrap();
    k.release().await.unwrap();
    assert_eq!(f.store.get(4).await.unwrap().unwrap().lease_expiry, T0 + 43);
    let refused = g.next_id().await;
    assert!(matches!(refused, Err(Refusal::NoLease { .. })), "issued after release: {refused:?}");

    f.clock.advance(2); // T0 + 44 > stored expiry: the successor may claim immediately
    let g2 = generator(&f.clock);
    let mut k2 = keeper(&f, &g2, 4..=4, "b");
    assert!(matches!(k2.tick(now).await, Outcome::Claimed { machine: 4, epoch: 2, .. }));
    assert!(g2.next_id().await.unwrap() > last);
}

#[tokio::test]
async fn an_unsynchronized_clock_refuses_until_it_recovers() {
    let now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 0..=63, "a");
    f.clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    assert!(matches!(k.tick(now).await, Outcome::ClockUnsynchronized { .. }), "no claim with an unsynchronized clock");
    assert_eq!(k.machine(), None);
    assert_eq!(k.tick(now).await, Outcome::Idle, "checked again a second later, not in a busy loop");
    assert!(matches!(g.next_id().await, Err(Refusal::ClockUnsynchronized { .. })));
    assert!(matches!(g.next_uuids(1).await, Err(Refusal::ClockUnsynchronized { .. })));
    f.clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    assert!(matches!(k.tick(now + Duration::from_secs(1)).await, Outcome::Claimed { .. }));
    assert!(g.next_id().await.is_ok());
}

#[tokio::test]
async fn a_lost_lease_is_not_replaced_while_the_clock_is_unsynchronized() {
    let now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 7..=8, "a");
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    f.store.quarantine(machine, "oncall", T0 + 10).await.unwrap();
    f.clock.advance(1_000);
    f.clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    let outcome = k.tick(now + Duration::from_secs(1)).await;
    let Outcome::Lost { then, .. } = outcome else { panic!("{outcome:?}") };
    assert!(matches!(*then, Outcome::ClockUnsynchronized { .. }), "no claim on an unsynchronized clock: {then:?}");
    assert_eq!(k.machine(), None);
    let other = if machine == 7 { 8 } else { 7 };
    assert_eq!(f.store.get(other).await.unwrap(), None, "the other number was not touched");
    f.clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    let outcome = k.tick(now + Duration::from_secs(2)).await;
    assert!(matches!(outcome, Outcome::Claimed { machine, .. } if machine == other), "{outcome:?}");
}

#[test]
fn lease_timing_leaves_room_for_one_failed_renewal() {
    let v1 = idgen::core::Layout::v1();
    let timing =
        |lease_ms, renew_interval_ms, fence_ms| LeaseConfig { lease_ms, renew_interval_ms, fence_ms, ..config(0..=63) };
    timing(300_000, 10_000, 5_000).validate(&v1).unwrap();
    timing(idgen::MAX_LEASE_MS, 10_000, 5_000).validate(&v1).unwrap();
    assert!(
        matches!(timing(idgen::MAX_LEASE_MS + 1, 10_000, 5_000).validate(&v1), Err(LeaseConfigError::Timing { .. })),
        "longer than a quarantine lift allows for"
    );
    timing(3_000, 1_000, 500).validate(&v1).unwrap();
    timing(3_000, 1_250, 500).validate(&v1).unwrap();
    for (lease, renew, fence) in [
        (20_000, 16_000, 5_000),
        (3_000, 1_300, 500),
        (3_000, 1_000, 0),
        (3_000, 0, 500),
        (3_000, 500, 3_000),
        (300_000, 10_000, 20_000),
    ] {
        let refused = timing(lease, renew, fence).validate(&v1);
        assert!(matches!(refused, Err(LeaseConfigError::Timing { .. })), "lease {lease} renew {renew} fence {fence}");
    }
}

/// The fixture's table, wrapped so the test can switch it off or lose claim answers.
fn switchable(f: &Fixture) -> Arc<FaultyStore> {
    FaultyStore::new(f.store.clone(), Arc::default())
}

#[tokio::test]
async fn a_table_outage_keeps_issuing_until_the_fence_and_a_renewal_before_it_extends_the_lease() {
    let mut now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(0..=63), "a".into()).unwrap();
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    store.faults.set_down(true);
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    assert!(matches!(outcome, Outcome::StoreUnavailable { .. }), "{outcome:?}");
    f.clock.set(T0 + 2_499);
    assert!(g.next_id().await.is_ok(), "still before the fence at expiry − 500 ms");
    // The table is back before the fence: the lease is renewed, the number kept.
    store.faults.set_down(false);
    now += Duration::from_millis(1_000);
    let outcome = k.tick(now).await;
    assert_eq!(outcome, Outcome::Renewed { machine, expiry_unix_ms: T0 + 5_499 });
    f.clock.set(T0 + 2_600);
    assert!(g.next_id().await.is_ok(), "past the old fence, under the renewed lease");
}

#[tokio::test]
async fn a_table_outage_past_the_fence_stops_issuing_and_the_lease_is_claimed_afresh_not_renewed() {
    // Before, the renewal after the outage extended a lease the core held as expired, on the
    // row's word that nobody had claimed the number meanwhile.
    let mut now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(0..=63), "a".into()).unwrap();
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    let before = g.next_id().await.unwrap();
    store.faults.set_down(true);
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    assert!(matches!(k.tick(now).await, Outcome::StoreUnavailable { .. }));
    f.clock.set(T0 + 2_500);
    assert!(matches!(g.next_id().await, Err(Refusal::PastFence { .. })));
    assert!(matches!(g.health(), idgen::Health::Refusing { refusal: Refusal::PastFence { .. }, .. }));
    store.faults.set_down(false);
    now += Duration::from_millis(1_000);
    let outcome = k.tick(now).await;
    let Outcome::Lapsed { machine: lapsed, then } = outcome else { panic!("{outcome:?}") };
    assert_eq!(lapsed, machine);
    let Outcome::Claimed { machine: other, .. } = *then else { panic!("{then:?}") };
    assert_ne!(other, machine, "the number it let lapse is not claimed again for a lease");
    let after = g.next_id().await.unwrap();
    assert!(after > before && (after >> 12) & 0x3ff == u64::from(other));
    let text = metrics_text(&g);
    assert!(text.contains(r#"idgen_lease_events_total{layout="v1",event="lease_lapsed"} 1"#), "{text}");
}

#[tokio::test]
async fn a_clock_step_back_does_not_lose_the_lease() {
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 0..=63, "a");
    let Outcome::Claimed { machine, expiry_unix_ms, .. } = k.tick(now).await else { panic!() };
    g.next_id().await.unwrap();
    // One second later the clock has stepped back two: the renewal's expiry is behind the row's.
    now += Duration::from_millis(1_000);
    f.clock.set(T0 - 1_000);
    assert_eq!(k.tick(now).await, Outcome::NotForward { machine, stored_expiry_unix_ms: expiry_unix_ms });
    assert_eq!(k.machine(), Some(machine), "the number is still ours");
    assert!(matches!(g.next_id().await, Err(Refusal::ClockBehind { .. })), "and the generator waits for its clock");
    // Once the clock is past where it was, renewals move the expiry forward again.
    now += Duration::from_millis(1_000);
    f.clock.set(T0 + 1_500);
    assert_eq!(k.tick(now).await, Outcome::Renewed { machine, expiry_unix_ms: T0 + 4_500 });
    assert!(g.next_id().await.is_ok());
}

#[tokio::test]
async fn a_claim_whose_answer_was_lost_is_adopted_not_left_for_a_whole_lease() {
    // Before, the keeper claimed afresh after a lost answer: with a range of one number, its own
    // applied claim made the number "taken" and it stayed without a lease for the whole lease.
    let mut now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(5..=5), "a".into()).unwrap();
    store.faults.set_losing_claim_answers(true);
    let Outcome::StoreUnavailable { retry_in, .. } = k.tick(now).await else { panic!() };
    let row = f.store.get(5).await.unwrap().unwrap();
    assert_eq!((row.holder.as_str(), row.lease_epoch), ("a", 1), "the claim went through");
    store.faults.set_losing_claim_answers(false);
    now += retry_in;
    f.clock.advance(300);
    assert_eq!(k.tick(now).await, Outcome::Adopted { machine: 5, epoch: 1, expiry_unix_ms: T0 + 3_000 });
    assert!(g.next_id().await.is_ok(), "issuing under the adopted number");
    let floor = g.with_core(|c| c.lease("v1").unwrap().floor_unix_ms);
    assert_eq!(floor, T0, "its floor is the :now the claim was made with");
    assert!(matches!(k.tick(now).await, Outcome::Renewed { machine: 5, .. }), "and renewed at once");
}

#[tokio::test]
async fn a_lost_claim_whose_row_is_no_longer_ours_is_not_adopted() {
    let mut now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(5..=5), "a".into()).unwrap();
    store.faults.set_losing_claim_answers(true);
    let Outcome::StoreUnavailable { retry_in, .. } = k.tick(now).await else { panic!() };
    store.faults.set_losing_claim_answers(false);
    // Meanwhile the row was quarantined and lifted: it no longer carries our token.
    f.store.quarantine(5, "oncall", T0).await.unwrap();
    let lift = idgen::Lift { min_expiry_unix_ms: T0 + 10, holder_stopped: false };
    assert!(matches!(f.store.release_quarantine(5, "oncall", lift, T0).await.unwrap(), idgen::LiftOutcome::Lifted(_)));
    now += retry_in;
    f.clock.advance(3_001);
    let outcome = k.tick(now).await;
    assert!(matches!(outcome, Outcome::Claimed { machine: 5, epoch: 4, .. }), "{outcome:?}");
}

#[tokio::test]
async fn a_number_the_generator_cannot_use_is_never_claimed() {
    // Region 9 does not fit v2's three region bits. Before, every retry claimed one more number
    // it could not use and left it held for a whole lease, until the range was drained.
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator_in(&f.clock, 9, false);
    let mut k = LeaseKeeper::new("v2", f.store.clone(), g.clone(), config(0..=3), "a".into()).unwrap();
    for _ in 0..5 {
        let outcome = k.tick(now).await;
        let Outcome::CannotUse { retry_in, .. } = outcome else { panic!("{outcome:?}") };
        now += retry_in;
    }
    assert!(f.store.list().await.unwrap().is_empty(), "no row was taken");
    assert_eq!(k.machine(), None);
}

#[tokio::test]
async fn two_keepers_of_one_holder_on_one_table_are_refused() {
    let f = fixture().await;
    let (g1, g2) = (generator(&f.clock), generator(&f.clock));
    let first = keeper(&f, &g1, 0..=63, "web-7/pid-1/5/00");
    let refused = LeaseKeeper::new("v1", f.store.clone(), g2.clone(), config(0..=63), "web-7/pid-1/5/00".into());
    assert!(matches!(refused, Err(LeaseConfigError::SecondKeeper { .. })), "one table, one holder, one keeper");
    // Another handle on the same file is the same table.
    let dir = f._dir.path().join("leases.db");
    let other: Arc<dyn LeaseStore> = Arc::new(SqliteLeaseStore::open(&dir, "idgen-leases").await.unwrap());
    let refused = LeaseKeeper::new("v1", other.clone(), g2.clone(), config(0..=63), "web-7/pid-1/5/00".into());
    assert!(matches!(refused, Err(LeaseConfigError::SecondKeeper { .. })));
    // Another table, or the first keeper gone: fine.
    let v2: Arc<dyn LeaseStore> = Arc::new(SqliteLeaseStore::open(&dir, "idgen-leases-v2").await.unwrap());
    LeaseKeeper::new("v2", v2, g2.clone(), config(0..=63), "web-7/pid-1/5/00".into()).unwrap();
    drop(first);
    LeaseKeeper::new("v1", other, g2, config(0..=63), "web-7/pid-1/5/00".into()).unwrap();
}

#[tokio::test]
async fn a_release_gives_back_a_claim_whose_answer_was_lost() {
    let now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(5..=5), "a".into()).unwrap();
    store.faults.set_losing_claim_answers(true);
    assert!(matches!(k.tick(now).await, Outcome::StoreUnavailable { .. }));
    store.faults.set_losing_claim_answers(false);
    k.release().await.unwrap();
    let row = f.store.get(5).await.unwrap().unwrap();
    assert_eq!(row.lease_expiry, T0, "given back at the claim's :now, not held for a whole lease");
    f.clock.advance(1);
    let g2 = generator(&f.clock);
    let mut k2 = keeper(&f, &g2, 5..=5, "b");
    assert!(matches!(k2.tick(now).await, Outcome::Claimed { machine: 5, .. }), "a successor claims at once");
}

#[tokio::test]
async fn each_claim_counts_the_numbers_left_free_in_its_range() {
    // The machine-numbers alert reads this gauge: after a claim, the numbers of the range that no
    // live lease holds (an expired row is free again; a quarantined one is not).
    let now = Instant::now();
    let f = fixture().await;
    f.store.claim(2, "other-live", T0, T0 + 60_000).await.unwrap();
    f.store.claim(3, "other-expired", T0 - 120_000, T0 - 60_000).await.unwrap();
    f.store.quarantine(4, "oncall", T0).await.unwrap();
    f.store.claim(9, "outside-the-range", T0, T0 + 60_000).await.unwrap();
    let g = generator(&f.clock);
    let free = || metrics_text(&g).lines().find(|l| l.starts_with("idgen_lease_numbers_free{")).map(str::to_owned);
    let mut k = keeper(&f, &g, 0..=5, "a");
    assert!(matches!(k.tick(now).await, Outcome::Claimed { .. }));
    // Six numbers; held: 2 (live), 4 (quarantined) and ours.
    assert_eq!(free().as_deref(), Some(r#"idgen_lease_numbers_free{layout="v1"} 3"#));

    // Every number taken: the gauge says 0.
    let h = generator(&f.clock);
    for holder in ["b", "c", "d"] {
        let mut other = keeper(&f, &generator(&f.clock), 0..=5, holder);
        assert!(matches!(other.tick(now).await, Outcome::Claimed { .. }));
    }
    let mut last = keeper(&f, &h, 0..=5, "e");
    assert!(matches!(last.tick(now).await, Outcome::AllTaken { .. }));
    let text = metrics_text(&h);
    assert!(text.contains(r#"idgen_lease_numbers_free{layout="v1"} 0"#), "{text}");
}

/// Runs `sql` on the fixture's lease file, as an operator's hand (or a file put back from a
/// copy) would change it.
async fn by_hand(f: &Fixture, sql: &str) {
    let pool =
        sqlx::SqlitePool::connect(&format!("sqlite://{}", f._dir.path().join("leases.db").display())).await.unwrap();
    sqlx::query(sql).execute(&pool).await.unwrap();
    pool.close().await;
}

/// A keeper of 7–8 that claimed and issued, the row of its number changed by `sql` (`{m}`: the
/// number), and the renewal a second later.
struct ChangedUnderTheLease {
    f: Fixture,
    g: Arc<IdGenerator>,
    k: LeaseKeeper,
    now: Instant,
    machine: u32,
    outcome: Outcome,
}

async fn renewal_after_by_hand(sql: &str) -> ChangedUnderTheLease {
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 7..=8, "a");
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    g.next_id().await.unwrap();
    by_hand(&f, &sql.replace("{m}", &machine.to_string())).await;
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    ChangedUnderTheLease { f, g, k, now, machine, outcome }
}

#[tokio::test]
async fn a_row_deleted_under_a_held_lease_stops_issuing_and_nothing_more_is_claimed_in_that_table() {
    // Before, the keeper took the failed renewal for an ordinary loss and claimed again in the
    // same table: one whose rows no longer say who holds what (a number whose row was deleted is
    // claimable by anyone, while its holder issues until its next renewal).
    let ChangedUnderTheLease { f, g, mut k, mut now, machine, outcome } =
        renewal_after_by_hand(r#"DELETE FROM "idgen-leases" WHERE machine_id = {m}"#).await;
    let Outcome::Lost { machine: lost, then } = outcome else { panic!("{outcome:?}") };
    assert_eq!(lost, machine);
    let Outcome::TableRefused { reason, .. } = *then else { panic!("claimed again in that table: {then:?}") };
    assert!(reason.contains("its row is gone") && reason.contains("lease-table-restore"), "{reason}");
    assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })), "stopped issuing at once");
    // It stays so: every later claim is refused, the free numbers notwithstanding.
    for _ in 0..5 {
        now += Duration::from_secs(3);
        f.clock.advance(3_000);
        let outcome = k.tick(now).await;
        assert!(matches!(outcome, Outcome::TableRefused { .. } | Outcome::Idle), "{outcome:?}");
    }
    assert!(f.store.list().await.unwrap().iter().all(|row| row.lease_expiry < T0 + 16_000 || row.holder != "a"));
    let text = metrics_text(&g);
    assert!(text.contains(r#"event="table_went_back""#), "counted: {text}");
}

#[tokio::test]
async fn a_row_back_at_an_older_epoch_or_another_holder_at_ours_is_a_table_that_went_back() {
    for (change, shows) in [
        (r#"UPDATE "idgen-leases" SET lease_epoch = lease_epoch - 1 WHERE machine_id = {m}"#, "epoch"),
        (r#"UPDATE "idgen-leases" SET holder = 'b' WHERE machine_id = {m}"#, "names b at the same epoch"),
    ] {
        let outcome = renewal_after_by_hand(change).await.outcome;
        let Outcome::Lost { then, .. } = outcome else { panic!("{outcome:?}") };
        let Outcome::TableRefused { reason, .. } = *then else { panic!("{change}: claimed again: {then:?}") };
        assert!(reason.contains(shows), "{reason}");
    }
}

/// Writes `row` over the fixture's row of its number, behind the store's back: a row put back
/// from a copy, or edited by hand.
async fn put_row_by_hand(f: &Fixture, row: &idgen::LeaseRow) {
    match f.backend {
        Backend::Sqlite => {
            let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", f._dir.path().join("leases.db").display()))
                .await
                .unwrap();
            sqlx::query(
                r#"INSERT OR REPLACE INTO "idgen-leases"
                   (machine_id, holder, lease_expiry, lease_epoch, claim_token, expiry_before_quarantine)
                   VALUES (?, ?, ?, ?, ?, ?)"#,
            )
            .bind(row.machine_id)
            .bind(&row.holder)
            .bind(row.lease_expiry)
            .bind(row.lease_epoch as i64)
            .bind(&row.claim_token)
            .bind(row.expiry_before_quarantine)
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        Backend::Dynamodb => {
            use aws_sdk_dynamodb::types::AttributeValue::{N, S};
            let mut put = dynamodb_client()
                .await
                .put_item()
                .table_name(f.store.table_name())
                .item("machine_id", N(row.machine_id.to_string()))
                .item("holder", S(row.holder.clone()))
                .item("lease_expiry", N(row.lease_expiry.to_string()))
                .item("lease_epoch", N(row.lease_epoch.to_string()));
            if let Some(token) = &row.claim_token {
                put = put.item("claim_token", S(token.clone()));
            }
            if let Some(kept) = row.expiry_before_quarantine {
                put = put.item("expiry_before_quarantine", N(kept.to_string()));
            }
            put.send().await.unwrap();
        }
    }
}

/// Deletes the fixture's row of `machine` behind the store's back.
async fn delete_row_by_hand(f: &Fixture, machine: u32) {
    match f.backend {
        Backend::Sqlite => by_hand(f, &format!(r#"DELETE FROM "idgen-leases" WHERE machine_id = {machine}"#)).await,
        Backend::Dynamodb => {
            dynamodb_client()
                .await
                .delete_item()
                .table_name(f.store.table_name())
                .key("machine_id", aws_sdk_dynamodb::types::AttributeValue::N(machine.to_string()))
                .send()
                .await
                .unwrap();
        }
    }
}

/// What the test does to the lapsed holder's row once its successor holds the number.
#[derive(Debug, Clone, Copy)]
enum SetBack {
    /// The whole row as the lapsed holder left it (its holder, epoch, expiry and token): a row
    /// put back from a copy.
    WholeRow,
    /// Only its holder and epoch, the successor's expiry left: a hand edit.
    HolderAndEpoch,
}

/// Keeper A (5–6) claims 5 and issues; it stops ticking (frozen, or cut off from the table) past
/// its lease; keeper B (5 only) claims 5 and issues; the row is set back to A; A ticks and both
/// issue in the same milliseconds.
async fn a_lapsed_holder_meets_its_row_set_back(backend: Backend, set_back: SetBack) {
    let mut now = Instant::now();
    let f = fixture_on(backend).await;
    // 6 is held until T0 + 1 s, so A's first claim takes 5; it is free again when A's lease lapses.
    f.store.claim(6, "c", T0, T0 + 1_000).await.unwrap();
    let ga = generator(&f.clock);
    let mut ka = keeper(&f, &ga, 5..=6, "a");
    let outcome = ka.tick(now).await;
    let Outcome::Claimed { machine: 5, epoch: a_epoch, expiry_unix_ms: a_expiry } = outcome else {
        panic!("{backend:?}: A claims 5: {outcome:?}")
    };
    let mut ids = vec![ga.next_id().await.unwrap()];
    let as_a_left_it = f.store.get(5).await.unwrap().unwrap();

    // A's lease passes without a tick of A; B takes the number over and issues.
    f.clock.set(a_expiry + 1);
    let gb = generator(&f.clock);
    let mut kb = keeper(&f, &gb, 5..=5, "b");
    let Outcome::Claimed { machine: 5, .. } = kb.tick(now).await else { panic!("B claims 5") };
    ids.push(gb.next_id().await.unwrap());

    let row = match set_back {
        SetBack::WholeRow => as_a_left_it,
        SetBack::HolderAndEpoch => {
            let b = f.store.get(5).await.unwrap().unwrap();
            idgen::LeaseRow { holder: "a".into(), lease_epoch: a_epoch, ..b }
        }
    };
    put_row_by_hand(&f, &row).await;

    // A wakes half a second later (its renewal's expiry is past B's too) and ticks.
    f.clock.advance(500);
    now += Duration::from_secs(5);
    let outcome = ka.tick(now).await;
    assert!(
        !matches!(outcome, Outcome::Renewed { .. }),
        "{backend:?} {set_back:?}: a lapsed lease renewed: {outcome:?}"
    );
    // Both issue in the same milliseconds (a wait for the next one, which this clock never
    // brings by itself, counts as nothing issued).
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        for (g, into) in [(&ga, &mut from_a), (&gb, &mut from_b)] {
            if let Ok(Ok(more)) = tokio::time::timeout(Duration::from_millis(200), g.next_ids(4)).await {
                into.extend(more);
            }
        }
        f.clock.advance(1);
    }
    assert!(!from_b.is_empty(), "B, the number's holder, issues on");
    ids.extend(&from_a);
    ids.extend(&from_b);
    let issued = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), issued, "{backend:?} {set_back:?}: an ID issued twice after {outcome:?}");
    assert!(from_a.iter().all(|id| (id >> 12) & 0x3ff != 5), "A issued under 5 again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_is_not_renewed_in_a_table_set_back_under_its_successor() {
    // Before, A's renewal met its condition on the row set back to it, extended the lease the
    // core held as expired, and A issued under 5 in the milliseconds B was issuing in.
    for backend in BACKENDS {
        for set_back in [SetBack::WholeRow, SetBack::HolderAndEpoch] {
            a_lapsed_holder_meets_its_row_set_back(backend, set_back).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_went_back_is_refused_by_the_next_keeper_of_the_process_too() {
    // Before, what a keeper learnt died with it: the supervisor's new keeper (after a panic)
    // claimed again in the table that went back.
    for backend in BACKENDS {
        let mut now = Instant::now();
        let f = fixture_on(backend).await;
        let g = generator(&f.clock);
        let mut k = keeper(&f, &g, 7..=8, "a");
        let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
        delete_row_by_hand(&f, machine).await;
        now += Duration::from_millis(1_000);
        f.clock.advance(1_000);
        let outcome = k.tick(now).await;
        let Outcome::Lost { then, .. } = outcome else { panic!("{backend:?}: {outcome:?}") };
        assert!(matches!(*then, Outcome::TableRefused { .. }), "{backend:?}: {then:?}");
        drop(k);
        // The same process starts a new keeper on the same table (a handle opened anew).
        let mut again = keeper(&f, &g, 7..=8, "a");
        let outcome = again.tick(now).await;
        let Outcome::TableRefused { reason, .. } = &outcome else { panic!("{backend:?}: claimed again: {outcome:?}") };
        assert!(reason.contains("went back"), "{reason}");
        assert_eq!(again.machine(), None);
        assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keeper_claims_nothing_in_a_table_nobody_made_the_fleets() {
    // A table made beside the live one (no genesis) shows every number free; before, a keeper
    // claimed in it at once.
    for backend in BACKENDS {
        let mut now = Instant::now();
        let dir = tempfile::tempdir().unwrap();
        let bare: Arc<dyn LeaseStore> = match backend {
            Backend::Sqlite => {
                Arc::new(SqliteLeaseStore::open(&dir.path().join("bare.db"), "idgen-leases").await.unwrap())
            }
            Backend::Dynamodb => Arc::new(bare_dynamodb_table().await),
        };
        let clock = Arc::new(ManualClock::new(T0));
        let g = generator(&clock);
        let mut k = LeaseKeeper::new("v1", bare.clone(), g.clone(), config(0..=3), "a".into()).unwrap();
        for _ in 0..3 {
            let outcome = k.tick(now).await;
            let Outcome::TableRefused { reason, retry_in } = &outcome else { panic!("{backend:?}: {outcome:?}") };
            assert!(reason.contains("genesis") && reason.contains("idgen leases init"), "{reason}");
            now += *retry_in;
        }
        assert!(bare.list().await.unwrap().is_empty(), "{backend:?}: nothing claimed");
        // Once an operator made it the fleet's, the same keeper claims.
        bare.record_genesis(&init_request(), T0).await.unwrap();
        assert!(matches!(k.tick(now).await, Outcome::Claimed { .. }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_makes_the_row_of_a_number_held_before_parks_it() {
    // Rows emptied by hand (the genesis left behind). Before, a new claimant made the
    // row afresh and issued at once, while the number's holder went on until its next renewal.
    for backend in BACKENDS {
        let now = Instant::now();
        let f = fixture_on(backend).await;
        let ga = generator(&f.clock);
        let mut ka = keeper(&f, &ga, 5..=5, "a");
        let Outcome::Claimed { machine: 5, .. } = ka.tick(now).await else { panic!("{backend:?}: A claims 5") };
        ga.next_id().await.unwrap();
        delete_row_by_hand(&f, 5).await;

        // B (5 only) makes the row again: the audit log shows 5 held, so B parks it.
        let gb = generator(&f.clock);
        let mut kb = keeper(&f, &gb, 5..=5, "b");
        let outcome = kb.tick(now).await;
        assert!(matches!(outcome, Outcome::AllTaken { .. }), "{backend:?}: B used a vanished row: {outcome:?}");
        assert!(matches!(gb.next_id().await, Err(Refusal::NoLease { .. })));
        let parked = f.store.get(5).await.unwrap().unwrap();
        assert_eq!((parked.holder.as_str(), parked.lease_epoch), ("b", 1), "{backend:?}");
        assert_eq!(parked.lease_expiry, T0 + idgen::MAX_LEASE_MS, "{backend:?}: parked for the longest lease");
        assert!(metrics_text(&gb).contains(r#"event="row_vanished"} 1"#), "{backend:?}");
        // A number nobody ever held is claimed as always (the audit log shows only our claim).
        let gc = generator(&f.clock);
        let mut kc = keeper(&f, &gc, 9..=9, "c");
        assert!(matches!(kc.tick(now).await, Outcome::Claimed { machine: 9, epoch: 1, .. }), "{backend:?}");
        // A's next renewal finds its row gone (another holder at its epoch): it stops.
        f.clock.advance(1_000);
        let outcome = ka.tick(now + Duration::from_secs(1)).await;
        assert!(matches!(outcome, Outcome::Lost { .. }), "{backend:?}: {outcome:?}");
        assert!(matches!(ga.next_id().await, Err(Refusal::NoLease { .. })));
    }
}

#[tokio::test]
async fn a_renewal_answered_after_its_fence_extends_nothing() {
    // The lapse check and the renewal's write are separate steps. A renewal sent in
    // time whose answer comes back after the held lease's fence (a freeze meanwhile, in which a
    // successor may have claimed and the table been put back) must not extend the lease.
    let mut now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(0..=63), "a".into()).unwrap();
    let Outcome::Claimed { machine, .. } = k.tick(now).await else { panic!() };
    // The renewal applies; the process freezes past the fence before it reads the answer.
    let clock = f.clock.clone();
    store.faults.set_after_renew(Some(Arc::new(move || clock.set(T0 + 2_600))));
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    let Outcome::Lapsed { machine: lapsed, then } = outcome else { panic!("extended after its fence: {outcome:?}") };
    assert_eq!(lapsed, machine);
    assert!(matches!(*then, Outcome::Claimed { machine: other, .. } if other != machine), "{then:?}");
    store.faults.set_after_renew(None);
    // The renewal's answer in time extends it, as always.
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    assert!(matches!(k.tick(now).await, Outcome::Renewed { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_does_not_revive_a_lease_the_table_shows_lapsed() {
    // The renewal's write carries the lapse: a row set back under the holder, its expiry at or
    // before the renewer's now + fence (a copy put back from before its last renewal), is not the
    // renewal's to revive; and below the expiry the holder's renewals wrote it is the table going
    // back.
    for backend in BACKENDS {
        let mut now = Instant::now();
        let f = fixture_on(backend).await;
        let g = generator(&f.clock);
        let mut k = keeper(&f, &g, 7..=7, "a");
        let Outcome::Claimed { machine: 7, .. } = k.tick(now).await else { panic!() };
        now += Duration::from_millis(1_000);
        f.clock.advance(1_000);
        assert!(matches!(k.tick(now).await, Outcome::Renewed { .. }), "{backend:?}");
        // Set back to an expiry inside the renewer's fence, at its own holder and epoch.
        let row = f.store.get(7).await.unwrap().unwrap();
        put_row_by_hand(&f, &idgen::LeaseRow { lease_expiry: T0 + 1_400, ..row }).await;
        now += Duration::from_millis(1_000);
        f.clock.advance(1_000);
        let outcome = k.tick(now).await;
        let Outcome::Lost { then, .. } = outcome else { panic!("{backend:?}: revived: {outcome:?}") };
        let Outcome::TableRefused { reason, .. } = *then else { panic!("{backend:?}: {then:?}") };
        assert!(reason.contains("below the"), "{backend:?}: {reason}");
        assert_eq!(f.store.get(7).await.unwrap().unwrap().lease_expiry, T0 + 1_400, "{backend:?}: not revived");
        assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })));
    }
}

/// The registry's word on the table, switchable by the test: named, or moved elsewhere.
struct Named(std::sync::atomic::AtomicBool);

impl idgen::lease::TableCheck for Named {
    fn check(&self, _: &str, _: &str, _: &idgen::Genesis) -> Result<(), String> {
        Ok(())
    }
    fn still_named(&self, _: &str, table: &str) -> Result<(), String> {
        match self.0.load(std::sync::atomic::Ordering::SeqCst) {
            true => Ok(()),
            false => Err(format!("lease table {table} is not region r's table for layout v1: the registry names t2")),
        }
    }
}

#[tokio::test]
async fn a_keeper_stops_renewing_in_a_table_the_registry_moved_the_region_from() {
    // Renewals on an old table that still exists stop once the registry names the
    // new one (and issuing with them).
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let named = Arc::new(Named(true.into()));
    let mut k = keeper(&f, &g, 7..=8, "a").with_table_check(named.clone());
    let Outcome::Claimed { .. } = k.tick(now).await else { panic!() };
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    assert!(matches!(k.tick(now).await, Outcome::Renewed { .. }));
    named.0.store(false, std::sync::atomic::Ordering::SeqCst);
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    let Outcome::Lost { then, .. } = outcome else { panic!("renewed in a table the registry moved from: {outcome:?}") };
    assert!(matches!(*then, Outcome::TableRefused { ref reason, .. } if reason.contains("names t2")), "{then:?}");
    assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })));
}

#[tokio::test]
async fn a_sqlite_file_replaced_under_a_keeper_stops_it_at_its_next_renewal() {
    // Before, nothing noticed until the pool recycled its connection.
    let mut now = Instant::now();
    let f = fixture().await;
    let g = generator(&f.clock);
    let mut k = keeper(&f, &g, 7..=8, "a");
    let Outcome::Claimed { .. } = k.tick(now).await else { panic!() };
    let path = f._dir.path().join("leases.db");
    let copy = f._dir.path().join("copy.db");
    let other = SqliteLeaseStore::open(&copy, "idgen-leases").await.unwrap();
    other.record_genesis(&init_request(), T0).await.unwrap();
    other.close().await;
    std::fs::rename(&copy, &path).unwrap();
    now += Duration::from_millis(1_000);
    f.clock.advance(1_000);
    let outcome = k.tick(now).await;
    let Outcome::Lost { then, .. } = outcome else { panic!("renewed in a file replaced: {outcome:?}") };
    let Outcome::TableRefused { reason, .. } = *then else { panic!("{then:?}") };
    assert!(reason.contains("not the one this process opened"), "{reason}");
    assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })));
    // The process claims in it no more.
    now += Duration::from_secs(3);
    f.clock.advance(3_000);
    assert!(matches!(k.tick(now).await, Outcome::TableRefused { .. } | Outcome::Idle));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_a_table_refused_since_its_checks_is_given_back_not_used() {
    // Found by the model: a claimant that passed the table's checks and froze before
    // its write claimed in the table restored meanwhile under the same name. The checks are made
    // again after the claim: here the table loses its genesis (made bare again) between the two.
    let now = Instant::now();
    let f = fixture().await;
    let store = switchable(&f);
    let g = generator(&f.clock);
    let mut k = LeaseKeeper::new("v1", store.clone(), g.clone(), config(7..=7), "a".into()).unwrap();
    let path = f._dir.path().join("leases.db");
    store.faults.set_after_claim(Some(Arc::new(move || {
        let path = path.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display())).await.unwrap();
                sqlx::query(r#"DELETE FROM "idgen-genesis""#).execute(&pool).await.unwrap();
                pool.close().await;
            });
        })
        .join()
        .unwrap();
    })));
    let outcome = k.tick(now).await;
    let Outcome::TableRefused { reason, .. } = &outcome else {
        panic!("used a claim in a table refused since: {outcome:?}")
    };
    assert!(reason.contains("genesis"), "{reason}");
    assert!(matches!(g.next_id().await, Err(Refusal::NoLease { .. })));
    let row = f.store.get(7).await.unwrap().unwrap();
    assert_eq!((row.holder.as_str(), row.lease_expiry), ("a", T0), "given back to the claim's :now");
}
