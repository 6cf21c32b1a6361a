//! The conformance suite every [`LeaseStore`] backend must pass (quickwit's
//! `metastore_test_suite!` pattern). A backend's test file calls
//! [`lease_store_conformance!`](crate::lease_store_conformance) with an async function that
//! returns a [`StoreFactory`] for a fresh, empty table.

use std::sync::Arc;

use async_trait::async_trait;

use crate::lease::{
    AuditKind, ClaimOutcome, ClaimToken, Conditional, Genesis, GenesisHow, GenesisRequest, LeaseStore, Lift,
    LiftOutcome, QUARANTINE_EXPIRY_UNIX_MS, QUARANTINED, StoreError,
};

/// Opens handles to one fresh table. Each `open` is an independent client (its own connections),
/// as separate processes would have.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    async fn open(&self) -> Arc<dyn LeaseStore>;

    /// Quarantines `machine` behind the stores' back, as the design notes' AWS CLI command does
    /// (holder `QUARANTINED`, expiry 2100-01-01, epoch + 1) and keeping nothing of the row.
    async fn quarantine_by_hand(&self, machine: u32);
}

/// A lift by an operator who has not said the last holder is stopped.
fn lift(min_expiry_unix_ms: i64) -> Lift {
    Lift { min_expiry_unix_ms, holder_stopped: false }
}

fn lifted(outcome: LiftOutcome) -> crate::LeaseRow {
    match outcome {
        LiftOutcome::Lifted(row) => row,
        other => panic!("expected the lift to succeed: {other:?}"),
    }
}

const T0: i64 = 1_790_424_000_000;
const LEASE: i64 = 300_000;

fn claimed(outcome: ClaimOutcome) -> crate::LeaseRow {
    match outcome {
        ClaimOutcome::Claimed(row) => row,
        ClaimOutcome::Taken => panic!("expected the claim to succeed"),
    }
}

pub async fn claim_free_number(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    assert_eq!(store.get(37).await.unwrap(), None);
    let row = claimed(store.claim(37, "a/pid-1/1", T0, T0 + LEASE).await.unwrap());
    assert_eq!(row.machine_id, 37);
    assert_eq!(row.holder, "a/pid-1/1");
    assert_eq!(row.lease_expiry, T0 + LEASE);
    assert_eq!(row.lease_epoch, 1);
    assert!(row.claim_token.is_some(), "a claim leaves its token on the row");
    assert_eq!(row.expiry_before_quarantine, None);
    assert_eq!(store.get(37).await.unwrap(), Some(row));
}

/// Two claimants with the same holder string and the same expiry (two processes in containers
/// with one configured name, PID 1 and the same start millisecond): the second one's failed
/// condition must not be taken for its own earlier write. Only the claim token tells them apart.
pub async fn a_claim_meeting_the_same_holder_and_expiry_is_taken_unless_it_carries_our_token(
    factory: &dyn StoreFactory,
) {
    let (a, b) = (factory.open().await, factory.open().await);
    let holder = "web-7/pid-1/1790424000000";
    let (first, second) = (ClaimToken::random(), ClaimToken::random());
    let row = claimed(a.claim_as(21, holder, &first, T0, T0 + LEASE).await.unwrap());
    assert_eq!(b.claim_as(21, holder, &second, T0, T0 + LEASE).await.unwrap(), ClaimOutcome::Taken);
    // The first claimant retrying its own claim (its answer was lost) finds it applied.
    assert_eq!(a.claim_as(21, holder, &first, T0, T0 + LEASE).await.unwrap(), ClaimOutcome::Claimed(row.clone()));
    assert_eq!(b.get(21).await.unwrap(), Some(row), "nothing changed");
    let claims = a.history(Some(21), T0, T0 + 100).await.unwrap();
    assert!(claims.iter().all(|e| e.kind == AuditKind::Claim && e.lease_epoch == 1), "{claims:?}");
}

pub async fn claim_needs_expiry_strictly_before_now(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    claimed(store.claim(5, "a", T0, T0 + LEASE).await.unwrap());
    assert_eq!(store.claim(5, "b", T0 + 1, T0 + 1 + LEASE).await.unwrap(), ClaimOutcome::Taken);
    assert_eq!(
        store.claim(5, "b", T0 + LEASE, T0 + 2 * LEASE).await.unwrap(),
        ClaimOutcome::Taken,
        "expiry == now is not expired"
    );
    let row = claimed(store.claim(5, "b", T0 + LEASE + 1, T0 + 2 * LEASE).await.unwrap());
    assert_eq!((row.holder.as_str(), row.lease_epoch), ("b", 2));
    // A failed claim changes nothing.
    assert_eq!(store.claim(5, "c", T0 + LEASE + 2, T0 + 3 * LEASE).await.unwrap(), ClaimOutcome::Taken);
    assert_eq!(store.get(5).await.unwrap().unwrap().holder, "b");
}

pub async fn renew_checks_holder_epoch_and_forward_expiry(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let row = claimed(store.claim(9, "a", T0, T0 + LEASE).await.unwrap());
    let e = row.lease_epoch;
    assert_eq!(store.renew(9, "a", e, T0 + LEASE + 10, T0 + 10, T0 + 10).await.unwrap(), Conditional::Applied);
    assert_eq!(store.get(9).await.unwrap().unwrap().lease_expiry, T0 + LEASE + 10);
    assert_eq!(
        store.renew(9, "b", e, T0 + LEASE + 20, T0 + 20, T0 + 20).await.unwrap(),
        Conditional::ConditionFailed,
        "wrong holder"
    );
    assert_eq!(
        store.renew(9, "a", e + 1, T0 + LEASE + 20, T0 + 20, T0 + 20).await.unwrap(),
        Conditional::ConditionFailed,
        "wrong epoch"
    );
    // Renewing to the expiry the row already holds is idempotent: a retry that meets its own
    // first attempt must not look like a lost lease.
    assert_eq!(
        store.renew(9, "a", e, T0 + LEASE + 10, T0 + 20, T0 + 20).await.unwrap(),
        Conditional::Applied,
        "idempotent"
    );
    assert_eq!(
        store.renew(9, "a", e, T0 + LEASE, T0 + 20, T0 + 20).await.unwrap(),
        Conditional::ConditionFailed,
        "backward"
    );
    assert_eq!(
        store.renew(10, "a", 1, T0 + LEASE, T0 + 20, T0 + 20).await.unwrap(),
        Conditional::ConditionFailed,
        "no such row"
    );
    assert_eq!(store.get(9).await.unwrap().unwrap().lease_expiry, T0 + LEASE + 10, "failed renewals change nothing");
    let failures = store.history(Some(9), T0, T0 + 100).await.unwrap();
    assert_eq!(failures.iter().filter(|e| e.kind == AuditKind::RenewFailed).count(), 3);
    // The lapse rides in the write: a lease the table shows at or before `live_after` (the
    // renewer's now + fence) is not revived, even by its own holder and epoch.
    let stored = T0 + LEASE + 10;
    assert_eq!(
        store.renew(9, "a", e, stored + LEASE, stored, T0 + 200).await.unwrap(),
        Conditional::ConditionFailed,
        "lapsed by the table's expiry"
    );
    assert_eq!(store.get(9).await.unwrap().unwrap().lease_expiry, stored, "a refused revival changes nothing");
    assert_eq!(store.renew(9, "a", e, stored + LEASE, stored - 1, T0 + 200).await.unwrap(), Conditional::Applied);
}

pub async fn a_stale_holder_cannot_renew_after_a_takeover(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let a = claimed(store.claim(37, "a", T0, T0 + LEASE).await.unwrap());
    let b = claimed(store.claim(37, "b", T0 + LEASE + 1, T0 + 2 * LEASE).await.unwrap());
    assert_eq!(b.lease_epoch, a.lease_epoch + 1);
    // A wakes up and tries to renew with its old epoch, even with a far expiry.
    assert_eq!(
        store.renew(37, "a", a.lease_epoch, T0 + 10 * LEASE, T0 + 15, T0 + 15).await.unwrap(),
        Conditional::ConditionFailed
    );
    // Even if A had the same name (it cannot: the pid and start time differ), the epoch stops it.
    assert_eq!(
        store.renew(37, "b", a.lease_epoch, T0 + 10 * LEASE, T0 + 15, T0 + 15).await.unwrap(),
        Conditional::ConditionFailed
    );
    assert_eq!(store.get(37).await.unwrap().unwrap(), b);
}

pub async fn release_lets_a_successor_start_at_once(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let a = claimed(store.claim(3, "a", T0, T0 + LEASE).await.unwrap());
    assert_eq!(store.release(3, "a", a.lease_epoch + 1, T0 + 43, T0 + 50).await.unwrap(), Conditional::ConditionFailed);
    assert_eq!(store.release(3, "x", a.lease_epoch, T0 + 43, T0 + 50).await.unwrap(), Conditional::ConditionFailed);
    assert_eq!(store.release(3, "a", a.lease_epoch, T0 + 43, T0 + 50).await.unwrap(), Conditional::Applied);
    assert_eq!(store.get(3).await.unwrap().unwrap().lease_expiry, T0 + 43);
    assert_eq!(store.claim(3, "b", T0 + 43, T0 + LEASE).await.unwrap(), ClaimOutcome::Taken);
    let b = claimed(store.claim(3, "b", T0 + 44, T0 + 44 + LEASE).await.unwrap());
    assert_eq!(b.lease_epoch, a.lease_epoch + 1);
}

pub async fn quarantine_defeats_claims_and_renewals(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let a = claimed(store.claim(170, "a", T0, T0 + LEASE).await.unwrap());
    let q = store.quarantine(170, "oncall", T0 + 5).await.unwrap();
    assert_eq!(q.holder, QUARANTINED);
    assert_eq!(q.lease_expiry, QUARANTINE_EXPIRY_UNIX_MS);
    assert_eq!(q.lease_epoch, a.lease_epoch + 1);
    assert_eq!(
        store.renew(170, "a", a.lease_epoch, T0 + 2 * LEASE, T0 + 10, T0 + 10).await.unwrap(),
        Conditional::ConditionFailed
    );
    assert_eq!(
        store.claim(170, "b", QUARANTINE_EXPIRY_UNIX_MS - 1, QUARANTINE_EXPIRY_UNIX_MS).await.unwrap(),
        ClaimOutcome::Taken
    );
    // Quarantining a number nobody ever held creates its row, which keeps 0: nobody held it.
    let fresh = store.quarantine(171, "oncall", T0).await.unwrap();
    assert_eq!((fresh.holder.as_str(), fresh.lease_epoch, fresh.expiry_before_quarantine), (QUARANTINED, 1, Some(0)));
    // Lifting it only works on a quarantined row, and leaves the number free after the given expiry.
    assert_eq!(store.release_quarantine(9, "oncall", lift(T0 + LEASE), T0).await.unwrap(), LiftOutcome::NotQuarantined);
    let lifted_row = lifted(store.release_quarantine(170, "oncall", lift(T0 + 2 * LEASE), T0 + 20).await.unwrap());
    assert_eq!((lifted_row.lease_expiry, lifted_row.lease_epoch), (T0 + 2 * LEASE, q.lease_epoch + 1));
    assert_eq!((lifted_row.holder.as_str(), lifted_row.expiry_before_quarantine), ("released-by:oncall", None));
    assert_eq!(store.get(170).await.unwrap(), Some(lifted_row));
    assert_eq!(
        store.release_quarantine(170, "oncall", lift(T0 + 2 * LEASE), T0 + 20).await.unwrap(),
        LiftOutcome::NotQuarantined,
        "lifted once"
    );
    assert_eq!(store.claim(170, "b", T0 + 2 * LEASE, T0 + 3 * LEASE).await.unwrap(), ClaimOutcome::Taken);
    claimed(store.claim(170, "b", T0 + 2 * LEASE + 1, T0 + 3 * LEASE).await.unwrap());
    lifted(store.release_quarantine(171, "oncall", lift(T0 + LEASE), T0 + 30).await.unwrap());
}

/// A holder cut off from the table by the quarantine may go on issuing until its own expiry −
/// fence. Lifting must not hand the number out before that, whatever lease the operator's tool
/// is configured with: the pre-quarantine expiry is kept on the row and the lift never goes below it.
pub async fn lifting_a_quarantine_never_moves_a_holders_expiry_back(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let long = T0 + 10 * LEASE;
    claimed(store.claim(44, "a", T0, long).await.unwrap());
    assert_eq!(store.renew(44, "a", 1, long + 7, T0 + 1, T0 + 1).await.unwrap(), Conditional::Applied);
    let q = store.quarantine(44, "oncall", T0 + 5).await.unwrap();
    assert_eq!(q.expiry_before_quarantine, Some(long + 7));
    let again = store.quarantine(44, "oncall", T0 + 6).await.unwrap();
    assert_eq!(again.expiry_before_quarantine, Some(long + 7), "a second quarantine keeps what the first kept");
    // The operator's tool asks for "a lease from now", shorter than the holder's.
    let lifted_row = lifted(store.release_quarantine(44, "oncall", lift(T0 + LEASE), T0 + 10).await.unwrap());
    assert_eq!(lifted_row.lease_expiry, long + 7);
    assert_eq!(store.claim(44, "b", T0 + LEASE + 1, T0 + 2 * LEASE).await.unwrap(), ClaimOutcome::Taken);
    assert_eq!(store.claim(44, "b", long + 7, long + LEASE).await.unwrap(), ClaimOutcome::Taken);
    claimed(store.claim(44, "b", long + 8, long + LEASE).await.unwrap());
    // A later minimum wins over an earlier kept expiry.
    store.quarantine(44, "oncall", long + 9).await.unwrap();
    let lifted_row = lifted(store.release_quarantine(44, "oncall", lift(long + 5 * LEASE), long + 10).await.unwrap());
    assert_eq!(lifted_row.lease_expiry, long + 5 * LEASE);
}

/// A row quarantined by hand keeps nothing of the expiry its holder may still believe it holds:
/// lifting it is refused, and changes nothing, until the operator says that holder is stopped. A
/// quarantine by the store on top of it keeps what the row had: still nothing.
pub async fn a_quarantine_that_kept_no_expiry_is_lifted_only_once_its_holder_is_stopped(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let a = claimed(store.claim(61, "a", T0, T0 + LEASE).await.unwrap());
    factory.quarantine_by_hand(61).await;
    let by_hand = store.get(61).await.unwrap().unwrap();
    assert_eq!((by_hand.holder.as_str(), by_hand.lease_epoch), (QUARANTINED, a.lease_epoch + 1));
    assert_eq!(by_hand.expiry_before_quarantine, None);
    assert_eq!(
        store.release_quarantine(61, "oncall", lift(T0 + LEASE), T0 + 10).await.unwrap(),
        LiftOutcome::NoKeptExpiry
    );
    assert_eq!(store.get(61).await.unwrap(), Some(by_hand.clone()), "a refused lift changes nothing");
    let again = store.quarantine(61, "oncall", T0 + 11).await.unwrap();
    assert_eq!(again.expiry_before_quarantine, None, "a second quarantine cannot know the first one's either");
    assert_eq!(
        store.release_quarantine(61, "oncall", lift(T0 + LEASE), T0 + 12).await.unwrap(),
        LiftOutcome::NoKeptExpiry
    );
    let stopped = Lift { min_expiry_unix_ms: T0 + 2 * LEASE, holder_stopped: true };
    let lifted_row = lifted(store.release_quarantine(61, "oncall", stopped, T0 + 13).await.unwrap());
    assert_eq!((lifted_row.holder.as_str(), lifted_row.lease_expiry), ("released-by:oncall", T0 + 2 * LEASE));
    assert_eq!(lifted_row.lease_epoch, again.lease_epoch + 1);
    let events = store.history(Some(61), T0, T0 + 100).await.unwrap();
    assert_eq!(events.last().map(|e| e.kind), Some(AuditKind::ReleaseQuarantine), "{events:?}");
}

pub async fn list_and_history(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    for (i, machine) in [12, 3, 40].into_iter().enumerate() {
        claimed(store.claim(machine, &format!("h{machine}"), T0 + i as i64, T0 + LEASE).await.unwrap());
    }
    let rows = store.list().await.unwrap();
    assert_eq!(rows.iter().map(|r| r.machine_id).collect::<Vec<_>>(), vec![3, 12, 40]);
    store.quarantine(3, "oncall", T0 + 100).await.unwrap();
    let all = store.history(None, T0, T0 + 1000).await.unwrap();
    assert_eq!(all.len(), 4);
    assert!(all.windows(2).all(|w| w[0].at_unix_ms <= w[1].at_unix_ms), "oldest first");
    let three = store.history(Some(3), T0, T0 + 1000).await.unwrap();
    assert_eq!(three.iter().map(|e| e.kind).collect::<Vec<_>>(), vec![AuditKind::Claim, AuditKind::Quarantine]);
    assert_eq!(three[1].holder, "oncall");
    assert_eq!(three[0].lease_expiry, T0 + LEASE);
    let window = store.history(Some(3), T0 + 50, T0 + 150).await.unwrap();
    assert_eq!(window.len(), 1, "only the quarantine falls in the window");
    assert!(store.history(Some(99), T0, T0 + 1000).await.unwrap().is_empty());
}

/// Eight independent clients race for one free number, round after round: exactly one wins.
pub async fn racing_claimants_exactly_one_wins(factory: &dyn StoreFactory) {
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(factory.open().await);
    }
    for round in 0..20u32 {
        let machine = 500 + round;
        let barrier = Arc::new(tokio::sync::Barrier::new(stores.len()));
        let tasks: Vec<_> = stores
            .iter()
            .enumerate()
            .map(|(i, store)| {
                let (store, barrier) = (store.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim(machine, &format!("claimant-{i}"), T0, T0 + LEASE).await.unwrap()
                })
            })
            .collect();
        let mut winners = Vec::new();
        for task in tasks {
            if let ClaimOutcome::Claimed(row) = task.await.unwrap() {
                winners.push(row);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        assert_eq!(winners[0].lease_epoch, 1);
        assert_eq!(stores[0].get(machine).await.unwrap().unwrap().holder, winners[0].holder);
    }
}

fn genesis_request(how: GenesisHow, registry: Option<&str>) -> GenesisRequest {
    GenesisRequest { how, by: "oncall".into(), registry_id: registry.map(str::to_owned) }
}

/// A fresh table is claimed in by nobody until an explicit step wrote its genesis; `init` writes
/// it once, binds it to a registry once and never to another; an adoption writes its own.
pub async fn a_table_is_claimable_only_once_its_genesis_is_written(factory: &dyn StoreFactory) {
    let store = factory.open().await;
    let refused = store.check_claimable().await.unwrap_err();
    let StoreError::Misconfigured(why) = &refused else { panic!("{refused:?}") };
    assert!(why.contains("genesis") && why.contains("idgen leases init"), "{why}");
    assert_eq!(store.genesis().await.unwrap(), None);
    // Rows alone (an earlier release's live table) make no genesis, and init changes none of them.
    let row = claimed(store.claim(3, "a", T0, T0 + LEASE).await.unwrap());
    assert!(store.check_claimable().await.is_err());

    let first = store.record_genesis(&genesis_request(GenesisHow::Init, None), T0).await.unwrap();
    assert_eq!((first.how.clone(), first.registry_id.clone(), first.by.as_str()), (GenesisHow::Init, None, "oncall"));
    assert_eq!(store.check_claimable().await.unwrap(), first);
    assert_eq!(store.get(3).await.unwrap(), Some(row), "init changes no row");
    assert_eq!(store.list().await.unwrap().len(), 1, "the genesis is no machine number's row");
    // Idempotent: the record is kept as it is.
    assert_eq!(store.record_genesis(&genesis_request(GenesisHow::Init, None), T0 + 1).await.unwrap(), first);
    // Bound to the first registry that asks, and to no other after.
    let bound = store.record_genesis(&genesis_request(GenesisHow::Init, Some("r1")), T0 + 2).await.unwrap();
    assert_eq!(bound, Genesis { registry_id: Some("r1".into()), ..first.clone() });
    let other = store.record_genesis(&genesis_request(GenesisHow::Init, Some("r2")), T0 + 3).await.unwrap_err();
    assert!(matches!(&other, StoreError::Misconfigured(why) if why.contains("r1")), "{other:?}");
    assert_eq!(store.genesis().await.unwrap(), Some(bound.clone()), "a refused write changes nothing");
    // An adoption writes its own, under the same registry, seen by every handle.
    let from = GenesisHow::Adopted { from: "idgen-leases-old".into() };
    let adopted = store.record_genesis(&genesis_request(from.clone(), None), T0 + 4).await.unwrap();
    assert_eq!((adopted.how.clone(), adopted.registry_id.as_deref()), (from, Some("r1")));
    assert_ne!(adopted.table_id, bound.table_id);
    assert_eq!(factory.open().await.check_claimable().await.unwrap(), adopted);
}

/// Generates one `#[tokio::test]` per conformance check. `$factory` is an async fn returning a
/// [`StoreFactory`] for a fresh table.
#[macro_export]
macro_rules! lease_store_conformance {
    ($factory:path) => {
        $crate::lease_store_conformance!(@tests $factory;
            claim_free_number,
            a_claim_meeting_the_same_holder_and_expiry_is_taken_unless_it_carries_our_token,
            claim_needs_expiry_strictly_before_now,
            renew_checks_holder_epoch_and_forward_expiry,
            a_stale_holder_cannot_renew_after_a_takeover,
            release_lets_a_successor_start_at_once,
            quarantine_defeats_claims_and_renewals,
            lifting_a_quarantine_never_moves_a_holders_expiry_back,
            a_quarantine_that_kept_no_expiry_is_lifted_only_once_its_holder_is_stopped,
            list_and_history,
            racing_claimants_exactly_one_wins,
            a_table_is_claimable_only_once_its_genesis_is_written
        );
    };
    (@tests $factory:path; $($name:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let factory = $factory().await;
                $crate::lease::conformance::$name(&factory).await;
            }
        )*
    };
}

/// What a test can break in a [`FaultyStore`], shared by every store it wraps (a generator may
/// open its table again, after a keeper restart).
#[derive(Debug, Default)]
pub struct Faults {
    /// Every call answers `Unavailable` (the table is down).
    pub down: std::sync::atomic::AtomicBool,
    /// A claim goes through, but its answer is lost (`Unavailable`).
    pub lose_claim_answers: std::sync::atomic::AtomicBool,
    /// Runs after a renewal applied, before its answer is handed back (a process frozen while
    /// the answer was on its way: a test moves its clock here).
    pub after_renew: std::sync::Mutex<Option<Hook>>,
    /// Runs after a claim applied, before its answer is handed back (the table changed under a
    /// frozen claimant: a test restores or empties it here).
    pub after_claim: std::sync::Mutex<Option<Hook>>,
}

/// A test's code run inside a store call ([`Faults::after_renew`]).
#[derive(Clone)]
pub struct Hook(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl Faults {
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn set_losing_claim_answers(&self, lose: bool) {
        self.lose_claim_answers.store(lose, std::sync::atomic::Ordering::SeqCst);
    }

    /// Runs `hook` after every renewal from now on (`None`: no more).
    pub fn set_after_renew(&self, hook: Option<Arc<dyn Fn() + Send + Sync>>) {
        *self.after_renew.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = hook.map(Hook);
    }

    /// Runs `hook` after every claim from now on (`None`: no more).
    pub fn set_after_claim(&self, hook: Option<Arc<dyn Fn() + Send + Sync>>) {
        *self.after_claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = hook.map(Hook);
    }
}

/// A lease table wrapped so a test can switch it off or make it lose the answers to claims it
/// applies ([`Faults`]); otherwise every call goes to `inner`.
pub struct FaultyStore {
    pub inner: Arc<dyn LeaseStore>,
    pub faults: Arc<Faults>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn LeaseStore>, faults: Arc<Faults>) -> Arc<Self> {
        Arc::new(FaultyStore { inner, faults })
    }

    fn check(&self) -> Result<(), crate::StoreError> {
        match self.faults.down.load(std::sync::atomic::Ordering::SeqCst) {
            true => Err(crate::StoreError::Unavailable("switched off by the test".into())),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl LeaseStore for FaultyStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn table_key(&self) -> String {
        self.inner.table_key()
    }
    fn table_name(&self) -> String {
        self.inner.table_name()
    }
    async fn genesis(&self) -> Result<Option<Genesis>, crate::StoreError> {
        self.check()?;
        self.inner.genesis().await
    }
    async fn record_genesis(&self, request: &GenesisRequest, now: i64) -> Result<Genesis, crate::StoreError> {
        self.check()?;
        self.inner.record_genesis(request, now).await
    }
    async fn check_claimable(&self) -> Result<Genesis, crate::StoreError> {
        self.check()?;
        self.inner.check_claimable().await
    }
    async fn claim_as(
        &self,
        m: u32,
        h: &str,
        t: &ClaimToken,
        now: i64,
        exp: i64,
    ) -> Result<ClaimOutcome, crate::StoreError> {
        self.check()?;
        let outcome = self.inner.claim_as(m, h, t, now, exp).await;
        let hook = self.faults.after_claim.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(Hook(hook)) = hook {
            hook();
        }
        if self.faults.lose_claim_answers.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(crate::StoreError::Unavailable("the claim went through, its answer was lost".into()));
        }
        outcome
    }
    async fn renew(
        &self,
        m: u32,
        h: &str,
        e: u64,
        exp: i64,
        live_after: i64,
        now: i64,
    ) -> Result<Conditional, crate::StoreError> {
        self.check()?;
        let renewed = self.inner.renew(m, h, e, exp, live_after, now).await;
        let hook = self.faults.after_renew.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        if let Some(Hook(hook)) = hook {
            hook();
        }
        renewed
    }
    async fn close(&self) {
        self.inner.close().await
    }
    async fn release(&self, m: u32, h: &str, e: u64, exp: i64, now: i64) -> Result<Conditional, crate::StoreError> {
        self.check()?;
        self.inner.release(m, h, e, exp, now).await
    }
    async fn quarantine(&self, m: u32, o: &str, now: i64) -> Result<crate::LeaseRow, crate::StoreError> {
        self.check()?;
        self.inner.quarantine(m, o, now).await
    }
    async fn release_quarantine(
        &self,
        m: u32,
        o: &str,
        lift: Lift,
        now: i64,
    ) -> Result<LiftOutcome, crate::StoreError> {
        self.check()?;
        self.inner.release_quarantine(m, o, lift, now).await
    }
    async fn get(&self, m: u32) -> Result<Option<crate::LeaseRow>, crate::StoreError> {
        self.check()?;
        self.inner.get(m).await
    }
    async fn list(&self) -> Result<Vec<crate::LeaseRow>, crate::StoreError> {
        self.check()?;
        self.inner.list().await
    }
    async fn history(&self, m: Option<u32>, from: i64, to: i64) -> Result<Vec<crate::AuditEvent>, crate::StoreError> {
        self.check()?;
        self.inner.history(m, from, to).await
    }
}
