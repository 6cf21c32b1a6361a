//! [`LeaseKeeper`]: holds one machine number in one layout's lease table.
//!
//! One step, [`LeaseKeeper::tick`], does whatever is due: keep the generator's view of the clock's
//! sync state current, claim a number if none is held, renew if the renewal interval has passed.
//! The loop around it ([`LeaseKeeper::run`]) only sleeps until the next step is due. Timers use
//! the monotonic clock (tokio's `Instant`); lease times use the wall clock.
//!
//! The rules (SPEC §2): claim from a random start in the range, trying the next number on a failed
//! condition and wrapping once; when every number is taken, retry with backoff and jitter. A renewal
//! whose condition fails means the number is lost: the generator stops issuing under it at once
//! and the keeper claims another. When the table cannot be reached, nothing changes: the generator
//! keeps issuing until its fence and the keeper retries. On shutdown, release.
//!
//! Two rules beyond SPEC §2 keep a table that went back from handing a number out twice. A lease
//! the core already holds past its fence is not renewed but claimed again ([`LeaseKeeper::tick`],
//! `Outcome::Lapsed`). And a table seen going back is claimed in no more by this process, whichever
//! keeper saw it ([`WENT_BACK`], by `LeaseStore::table_key`, as [`KEPT`] is).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idgen_core::{InstallError, Layout, Lease};
use rand::Rng;
use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::issuing::IdGenerator;
use crate::lease::{
    AuditEvent, AuditKind, ClaimOutcome, ClaimToken, Conditional, LeaseRow, LeaseStore, MAX_LEASE_MS, StoreError,
    TableCheck,
};

/// Which machine numbers a generator may claim, per layout. Fleet workers take 0–63, embedded
/// generators 64 and up (SPEC §2), so the two never compete for a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineRanges {
    /// For layouts not listed below: from `first` to `last`, or to the layout's highest number.
    pub first: u32,
    pub last: Option<u32>,
    /// Per-layout ranges, e.g. v1 64–1023 and v2 64–511.
    pub layouts: BTreeMap<String, RangeInclusive<u32>>,
}

impl MachineRanges {
    /// A fleet worker's: 0–63 in every layout.
    pub fn fleet() -> Self {
        MachineRanges { first: 0, last: Some(63), layouts: BTreeMap::new() }
    }

    /// An embedded generator's: 64 up to each layout's highest number (v1 64–1023, v2 64–511).
    pub fn embedded() -> Self {
        MachineRanges { first: 64, last: None, layouts: BTreeMap::new() }
    }

    /// The same range in every layout.
    pub fn everywhere(range: RangeInclusive<u32>) -> Self {
        MachineRanges { first: *range.start(), last: Some(*range.end()), layouts: BTreeMap::new() }
    }

    /// This range for `layout` instead of the default.
    pub fn with_layout(mut self, layout: &str, range: RangeInclusive<u32>) -> Self {
        self.layouts.insert(layout.to_owned(), range);
        self
    }

    pub fn for_layout(&self, layout: &Layout) -> RangeInclusive<u32> {
        match self.layouts.get(layout.name()) {
            Some(range) => range.clone(),
            None => self.first..=self.last.unwrap_or(layout.max_machine()),
        }
    }
}

/// Lease timing and the machine-number ranges. Validated: 0 < fence < renew interval < lease ≤
/// [`MAX_LEASE_MS`] (SPEC §2), and two renew intervals fit before the fence (one renewal may fail
/// and the next still lands before issuing stops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    pub lease_ms: i64,
    pub renew_interval_ms: i64,
    pub fence_ms: i64,
    pub machines: MachineRanges,
    /// Longest wait between claim attempts when every number is taken or the table is down.
    pub max_backoff_ms: i64,
}

impl Default for LeaseConfig {
    /// The SPEC's timing, and the embedded generator's range (64 and up).
    fn default() -> Self {
        LeaseConfig {
            lease_ms: 300_000,
            renew_interval_ms: 10_000,
            fence_ms: 5_000,
            machines: MachineRanges::embedded(),
            max_backoff_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LeaseConfigError {
    #[error(
        "lease timing must satisfy 0 < fence < renew interval < lease ≤ {MAX_LEASE_MS} ms, and 2 × renew interval ≤ lease − fence (one failed renewal must not stop issuing): fence {fence_ms} ms, renew interval {renew_interval_ms} ms, lease {lease_ms} ms"
    )]
    Timing { fence_ms: i64, renew_interval_ms: i64, lease_ms: i64 },
    #[error("machine range {first}–{last} is empty or outside layout {layout}'s 0–{max}")]
    Range { first: u32, last: u32, layout: String, max: u32 },
    #[error("max backoff must be at least 100 ms, not {0}")]
    Backoff(i64),
    #[error("layout {0} is not in the generator's schedule")]
    UnknownLayout(String),
    /// Two keepers of one holder on one table would each take the other's row for its own.
    #[error("{table} already has a lease keeper for holder {holder} in this process: one generator per table")]
    SecondKeeper { table: String, holder: String },
}

impl LeaseConfig {
    pub fn validate(&self, layout: &Layout) -> Result<(), LeaseConfigError> {
        let fits = |lease: i64, fence: i64, renew: i64| renew.checked_mul(2).is_some_and(|two| two <= lease - fence);
        if !(0 < self.fence_ms
            && self.fence_ms < self.renew_interval_ms
            && self.renew_interval_ms < self.lease_ms
            && self.lease_ms <= MAX_LEASE_MS
            && fits(self.lease_ms, self.fence_ms, self.renew_interval_ms))
        {
            return Err(LeaseConfigError::Timing {
                fence_ms: self.fence_ms,
                renew_interval_ms: self.renew_interval_ms,
                lease_ms: self.lease_ms,
            });
        }
        let range = self.machines.for_layout(layout);
        let (first, last) = (*range.start(), *range.end());
        if first > last || last > layout.max_machine() {
            return Err(LeaseConfigError::Range {
                first,
                last,
                layout: layout.name().to_owned(),
                max: layout.max_machine(),
            });
        }
        if self.max_backoff_ms < 100 {
            return Err(LeaseConfigError::Backoff(self.max_backoff_ms));
        }
        Ok(())
    }
}

/// The (table, holder) pairs that have a keeper in this process.
static KEPT: Mutex<BTreeSet<(String, String)>> = Mutex::new(BTreeSet::new());

/// A keeper's place in [`KEPT`], given back when the keeper is dropped (also by a panic).
struct KeptTable((String, String));

impl KeptTable {
    fn take(table: String, holder: &str) -> Result<Self, LeaseConfigError> {
        let key = (table, holder.to_owned());
        let mut kept = KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !kept.insert(key.clone()) {
            return Err(LeaseConfigError::SecondKeeper { table: key.0, holder: key.1 });
        }
        Ok(KeptTable(key))
    }
}

impl Drop for KeptTable {
    fn drop(&mut self) {
        KEPT.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&self.0);
    }
}

/// The tables this process saw go back under a lease it held, by `LeaseStore::table_key`, with
/// why: nothing more is claimed in them by any keeper of the process (a keeper that panics is
/// started again by the supervisor, and must not forget). Until the process restarts, after an
/// operator made a table the fleet's again (runbooks/lease-table-restore.md).
static WENT_BACK: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());

fn went_back_before(table_key: &str) -> Option<String> {
    WENT_BACK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(table_key).cloned()
}

/// What one tick did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing was due.
    Idle,
    Claimed {
        machine: u32,
        epoch: u64,
        expiry_unix_ms: i64,
    },
    /// An earlier claim whose answer was lost had applied (the row carries its token): the
    /// number is ours, and is renewed at once.
    Adopted {
        machine: u32,
        epoch: u64,
        expiry_unix_ms: i64,
    },
    /// The generator could not issue under a lease on this layout (e.g. this region's number
    /// does not fit it): nothing is claimed; retried after `retry_in`.
    CannotUse {
        error: InstallError,
        retry_in: Duration,
    },
    /// Every number in the range is held by someone else.
    AllTaken {
        retry_in: Duration,
    },
    Renewed {
        machine: u32,
        expiry_unix_ms: i64,
    },
    /// The core held the lease past its fence (the process froze, or the table was out of reach
    /// for a lease): it is no renewal's to extend. The lease was dropped and `then` is what the
    /// keeper did instead: a claim like anyone's, of any number but this one for a lease, or, if
    /// the row shows the table going back, nothing.
    Lapsed {
        machine: u32,
        then: Box<Outcome>,
    },
    /// The renewal's condition failed: the number was taken over or quarantined. The generator
    /// stopped issuing under it; `then` is what the immediate re-claim did.
    Lost {
        machine: u32,
        then: Box<Outcome>,
    },
    /// The table could not be reached; nothing changed. The generator issues until its fence.
    StoreUnavailable {
        error: StoreError,
        retry_in: Duration,
    },
    /// The renewal's new expiry was not past the stored one (the clock went back); the row still
    /// names us, so the lease is kept as it is and renewed again shortly.
    NotForward {
        machine: u32,
        stored_expiry_unix_ms: i64,
    },
    /// No claim while the clock is unsynchronized: a claim's `:now` is this clock, and a clock
    /// running ahead would take numbers whose holders are still alive.
    ClockUnsynchronized {
        reason: String,
    },
    /// Nothing is claimed in this table: it has no genesis of its own, is a restored copy no
    /// operator has adopted, or is not the table the registry names for the region (asked again
    /// after `retry_in`), or it went back under a lease of this process (see [`Outcome::Lost`]: its
    /// row vanished, or carries an older epoch), and then this process claims in it no more.
    TableRefused {
        reason: String,
        retry_in: Duration,
    },
}

/// A claim whose answer never came: it may have applied. Retried first, with the same token.
#[derive(Debug, Clone)]
struct PendingClaim {
    machine: u32,
    token: ClaimToken,
    now_unix_ms: i64,
    expiry_unix_ms: i64,
}

#[derive(Debug, Clone)]
enum State {
    /// `retry_at: None`: claim at the next tick.
    Unclaimed {
        failures: u32,
        retry_at: Option<Instant>,
        pending: Option<PendingClaim>,
    },
    Held {
        machine: u32,
        epoch: u64,
        renew_at: Instant,
    },
}

pub struct LeaseKeeper {
    layout: String,
    store: Arc<dyn LeaseStore>,
    generator: Arc<IdGenerator>,
    config: LeaseConfig,
    machines: RangeInclusive<u32>,
    holder: String,
    state: State,
    /// How often the clock's sync state is re-read while nothing else is due.
    sync_check_every: Duration,
    /// What the registry says of the table, asked before every sweep of claims (none: no
    /// registry, development).
    table_check: Option<Arc<dyn TableCheck>>,
    /// A number whose lease lapsed, not claimed again until then: its row may hide a successor.
    avoid: Option<(u32, Instant)>,
    _kept: KeptTable,
}

impl LeaseKeeper {
    /// A keeper for `layout` (which must be in the generator's schedule), as `holder`
    /// ([`crate::holder`]). One process keeps at most one lease per table and holder: a second
    /// keeper for the same pair is refused, since the two could not tell their rows apart.
    pub fn new(
        layout: &str,
        store: Arc<dyn LeaseStore>,
        generator: Arc<IdGenerator>,
        config: LeaseConfig,
        holder: String,
    ) -> Result<Self, LeaseConfigError> {
        let known = generator.with_core(|core| core.schedule().layout(layout).cloned());
        let Some(known) = known else {
            return Err(LeaseConfigError::UnknownLayout(layout.to_owned()));
        };
        config.validate(&known)?;
        let kept = KeptTable::take(store.table_key(), &holder)?;
        // A lease the generator still holds on this layout is one whose keeper died (a panic):
        // keep renewing it rather than take another number and leave this one held for a lease.
        let state = match generator.with_core(|core| core.lease(layout)) {
            Some(held) => State::Held { machine: held.machine, epoch: held.epoch, renew_at: Instant::now() },
            None => State::Unclaimed { failures: 0, retry_at: None, pending: None },
        };
        Ok(LeaseKeeper {
            layout: layout.to_owned(),
            store,
            generator,
            machines: config.machines.for_layout(&known),
            config,
            holder,
            state,
            sync_check_every: Duration::from_secs(1),
            table_check: None,
            avoid: None,
            _kept: kept,
        })
    }

    /// Asks `check` (the registry's word on the table) before every sweep of claims.
    pub fn with_table_check(mut self, check: Arc<dyn TableCheck>) -> Self {
        self.table_check = Some(check);
        self
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The machine number held, if any.
    pub fn machine(&self) -> Option<u32> {
        match self.state {
            State::Held { machine, .. } => Some(machine),
            State::Unclaimed { .. } => None,
        }
    }

    /// When the next tick has something to do.
    pub fn next_due(&self, now: Instant) -> Instant {
        let due = match self.state {
            State::Unclaimed { retry_at, .. } => retry_at.unwrap_or(now),
            State::Held { renew_at, .. } => renew_at,
        };
        due.min(now + self.sync_check_every)
    }

    /// Does whatever is due at `now` (monotonic). Lease times are read from the generator's clock.
    pub async fn tick(&mut self, now: Instant) -> Outcome {
        let clock = self.generator.clock().clone();
        let sync = clock.sync_status().refusal();
        self.generator.with_core(|core| core.set_clock_unsynchronized(sync.clone()));
        match self.state.clone() {
            State::Unclaimed { failures, retry_at, pending }
                if retry_at.is_none_or(|at| now >= at) && sync.is_some() =>
            {
                self.state = State::Unclaimed { failures, retry_at: Some(now + self.sync_check_every), pending };
                Outcome::ClockUnsynchronized { reason: sync.unwrap_or_default() }
            }
            State::Unclaimed { failures, retry_at, pending } if retry_at.is_none_or(|at| now >= at) => {
                self.claim(now, failures, pending).await
            }
            State::Held { machine, epoch, renew_at } if now >= renew_at => self.renew(now, machine, epoch).await,
            _ => Outcome::Idle,
        }
    }

    async fn renew(&mut self, now: Instant, machine: u32, epoch: u64) -> Outcome {
        let wall = self.generator.clock().unix_ms();
        let fence = self.config.fence_ms;
        let held = self.generator.with_core(|core| core.lease(&self.layout));
        let held_expiry = match held {
            Some(held) if held.machine == machine && held.epoch == epoch && wall < held.expiry_unix_ms - fence => {
                held.expiry_unix_ms
            }
            _ => return self.lapsed(now, machine, epoch).await,
        };
        // The registry moved the region to another table (`idgen regions move-lease-table`):
        // renewals here stop, and so does issuing, so that nobody holds a number in both.
        if let Some(check) = &self.table_check
            && let Err(reason) = check.still_named(&self.layout, &self.store.table_name())
        {
            self.generator.with_core(|core| core.drop_lease(&self.layout));
            self.generator.metrics().lease_event(&self.layout, "renew_lost");
            tracing::error!(layout = %self.layout, machine, epoch, "not renewing: {reason}");
            let then = self.refused(now, 0, reason, None);
            return Outcome::Lost { machine, then: Box::new(then) };
        }
        let new_expiry = wall + self.config.lease_ms;
        // The lapse rides in the write: it applies only while the stored lease is still before
        // its fence by the clock read now, after the check above. A freeze between the check and
        // this read, a successor's claim meanwhile, and a table put back under it, cannot revive
        // a lease the table shows lapsed.
        let live_after = self.generator.clock().unix_ms().max(wall) + fence;
        match self.store.renew(machine, &self.holder, epoch, new_expiry, live_after, wall).await {
            Ok(Conditional::Applied) => {
                // A freeze after the write was sent (its answer late): the lease may have passed
                // its fence meanwhile, and a successor claimed it. Nothing is extended then.
                let after = self.generator.clock().unix_ms();
                if after >= held_expiry - fence {
                    tracing::warn!(layout = %self.layout, machine, epoch, "the renewal's answer came after the lease's fence: not extending it");
                    return self.lapsed(now, machine, epoch).await;
                }
                self.generator.with_core(|core| core.extend_lease(&self.layout, machine, epoch, new_expiry));
                self.generator.metrics().lease_event(&self.layout, "renew");
                self.state = State::Held { machine, epoch, renew_at: now + ms(self.config.renew_interval_ms) };
                Outcome::Renewed { machine, expiry_unix_ms: new_expiry }
            }
            Ok(Conditional::ConditionFailed) => {
                // The condition also fails when this clock went back, so the new expiry is not
                // past the stored one. If the row still names us and our epoch, with an expiry not
                // below the one we hold, nobody else has the number: keep it (the generator stops
                // at its fence as always) and retry. Below the one we hold, the table went back.
                let row = self.store.get(machine).await;
                if let Ok(Some(row)) = &row
                    && row.holder == self.holder
                    && row.lease_epoch == epoch
                    && row.lease_expiry >= held_expiry
                {
                    self.generator.metrics().lease_event(&self.layout, "renew_not_forward");
                    let retry_in = Duration::from_secs(1).min(ms(self.config.renew_interval_ms));
                    self.state = State::Held { machine, epoch, renew_at: now + retry_in };
                    return Outcome::NotForward { machine, stored_expiry_unix_ms: row.lease_expiry };
                }
                // Stop issuing first, then look for another number.
                self.generator.with_core(|core| core.drop_lease(&self.layout));
                if let Ok(row) = &row
                    && let Some(why) = went_back(row.as_ref(), &self.holder, epoch, held_expiry)
                {
                    let then = self.table_went_back(now, machine, epoch, &why);
                    return Outcome::Lost { machine, then: Box::new(then) };
                }
                self.generator.metrics().lease_event(&self.layout, "renew_lost");
                tracing::warn!(layout = %self.layout, machine, epoch, "renewal failed its condition: lease lost, claiming another number");
                let then = match self.generator.clock().sync_status().refusal() {
                    // The same rule as any claim: none on an unsynchronized clock.
                    Some(reason) => {
                        self.state = State::Unclaimed {
                            failures: 0,
                            retry_at: Some(now + self.sync_check_every),
                            pending: None,
                        };
                        Outcome::ClockUnsynchronized { reason }
                    }
                    None => self.claim(now, 0, None).await,
                };
                Outcome::Lost { machine, then: Box::new(then) }
            }
            // The table is not the one the lease is in (a SQLite file replaced): nobody claiming
            // through it sees this lease, so issuing stops now, not at the fence.
            Err(StoreError::Replaced(why)) => {
                self.generator.with_core(|core| core.drop_lease(&self.layout));
                let then = self.table_went_back(now, machine, epoch, &why);
                Outcome::Lost { machine, then: Box::new(then) }
            }
            Err(error) => {
                self.generator.metrics().lease_event(&self.layout, "store_unavailable");
                let retry_in = Duration::from_secs(1).min(ms(self.config.renew_interval_ms));
                tracing::warn!(layout = %self.layout, machine, %error, "renewal could not reach the lease table; issuing continues until the fence");
                self.state = State::Held { machine, epoch, renew_at: now + retry_in };
                Outcome::StoreUnavailable { error, retry_in }
            }
        }
    }

    /// A lease the core holds past its fence (or no longer holds) is not renewed. Its renewal
    /// would take the row's word that nobody claimed the number since the lease ran out; a table
    /// put back from a copy, or a row set back by hand, gives that word just as well, while the
    /// successor that claimed it issues on (and the core's `extend_lease` takes any later expiry at
    /// the same epoch). So the keeper drops the lease and reads the row as a failed renewal reads
    /// it (gone, an older epoch, another holder at ours: the table went back, and this process
    /// claims in it no more), then claims like any claimant: through the table's and the
    /// registry's checks, under `lease_expiry < :now`, with the floor a claim gets. It is then as
    /// safe as any claimant, and safer in one respect: the number it let lapse, whose row is the
    /// one that may hide a successor, it does not claim again for a lease, by which time such a
    /// successor has found the row changed under it (its next renewal) or passed its own fence.
    async fn lapsed(&mut self, now: Instant, machine: u32, epoch: u64) -> Outcome {
        let row = match self.store.get(machine).await {
            Ok(row) => row,
            // Still out of reach: nothing changes (the core refuses past its fence) until it answers.
            Err(error) => {
                self.generator.metrics().lease_event(&self.layout, "store_unavailable");
                let retry_in = Duration::from_secs(1).min(ms(self.config.renew_interval_ms));
                self.state = State::Held { machine, epoch, renew_at: now + retry_in };
                return Outcome::StoreUnavailable { error, retry_in };
            }
        };
        self.generator.with_core(|core| core.drop_lease(&self.layout));
        self.generator.metrics().lease_event(&self.layout, "lease_lapsed");
        tracing::warn!(
            layout = %self.layout,
            machine,
            epoch,
            "the lease passed its fence without a renewal: not renewing it, claiming afresh (another number)"
        );
        if let Some(why) = went_back(row.as_ref(), &self.holder, epoch, i64::MIN) {
            let then = self.table_went_back(now, machine, epoch, &why);
            return Outcome::Lapsed { machine, then: Box::new(then) };
        }
        self.avoid = Some((machine, now + ms(self.config.lease_ms)));
        let then = match self.generator.clock().sync_status().refusal() {
            Some(reason) => {
                self.state =
                    State::Unclaimed { failures: 0, retry_at: Some(now + self.sync_check_every), pending: None };
                Outcome::ClockUnsynchronized { reason }
            }
            None => self.claim(now, 0, None).await,
        };
        Outcome::Lapsed { machine, then: Box::new(then) }
    }

    /// The row of `machine` showed the table going back under our lease (`why`): every change of
    /// a row raises its epoch, and none deletes it, so this table is not the one the lease was
    /// claimed in. Its other rows are as old, and a claim in it could take a number whose holder
    /// is issuing right now: this process claims in it no more.
    fn table_went_back(&mut self, now: Instant, machine: u32, epoch: u64, why: &str) -> Outcome {
        let reason = format!(
            "{} went back under the lease on machine {machine} (epoch {epoch}): {why}. Nothing more is claimed \
             in it by this process: see runbooks/lease-table-restore.md",
            self.store.describe()
        );
        self.generator.metrics().lease_event(&self.layout, "table_went_back");
        tracing::error!(layout = %self.layout, machine, epoch, "{reason}");
        WENT_BACK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(self.store.table_key())
            .or_insert_with(|| reason.clone());
        self.refused(now, 0, reason, None)
    }

    async fn claim(&mut self, now: Instant, failures: u32, pending: Option<PendingClaim>) -> Outcome {
        if let Some(reason) = went_back_before(&self.store.table_key()) {
            return self.refused(now, failures, reason, pending);
        }
        let genesis = match self.store.check_claimable().await {
            Ok(genesis) => genesis,
            Err(StoreError::Misconfigured(reason)) => return self.refused(now, failures, reason, pending),
            Err(StoreError::Replaced(reason)) => return self.replaced(now, failures, reason, pending),
            Err(error) => return self.unavailable(now, failures, error, pending),
        };
        if let Some(check) = &self.table_check
            && let Err(reason) = check.check(&self.layout, &self.store.table_name(), &genesis)
        {
            return self.refused(now, failures, reason, pending);
        }
        if let Some(pending) = pending {
            // The last claim's answer was lost. If it applied, the row carries its token and the
            // number is ours; without this, the number would sit unused for a whole lease.
            let PendingClaim { machine, ref token, now_unix_ms, expiry_unix_ms } = pending;
            match self.store.claim_as(machine, &self.holder, token, now_unix_ms, expiry_unix_ms).await {
                // It made the row of a number held before: parked, as a fresh claim's would be.
                Ok(ClaimOutcome::Claimed(row))
                    if row.lease_epoch == 1 && self.row_vanished(machine, now_unix_ms).await => {}
                Ok(ClaimOutcome::Claimed(row)) => {
                    return self
                        .install(now, failures, machine, row.lease_epoch, now_unix_ms, expiry_unix_ms, true)
                        .await;
                }
                Ok(_) => {} // it never applied, or the row has changed since: claim afresh
                Err(error) => return self.unavailable(now, failures, error, Some(pending)),
            }
        }
        let (first, last) = (*self.machines.start(), *self.machines.end());
        let size = last - first + 1;
        let start = rand::rng().random_range(0..size);
        let avoid = self.avoid.filter(|(_, until)| now < *until).map(|(machine, _)| machine);
        for offset in 0..size {
            let machine = first + (start + offset) % size;
            if avoid == Some(machine) {
                continue;
            }
            // Never take a row the generator cannot use (e.g. this region's number does not fit
            // the layout): each retry would take another, until the range is drained.
            if let Err(error) = self.generator.with_core(|core| core.check_installable(&self.layout, machine)) {
                return self.cannot_use(now, failures, error);
            }
            let wall = self.generator.clock().unix_ms();
            let expiry = wall + self.config.lease_ms;
            let token = ClaimToken::random();
            match self.store.claim_as(machine, &self.holder, &token, wall, expiry).await {
                Ok(ClaimOutcome::Claimed(row)) if row.lease_epoch == 1 && self.row_vanished(machine, wall).await => {
                    continue;
                }
                Ok(ClaimOutcome::Claimed(row)) => {
                    return self.install(now, failures, machine, row.lease_epoch, wall, expiry, false).await;
                }
                Ok(ClaimOutcome::Taken) => continue,
                Err(StoreError::Replaced(reason)) => return self.replaced(now, failures, reason, None),
                Err(error) => {
                    let pending = PendingClaim { machine, token, now_unix_ms: wall, expiry_unix_ms: expiry };
                    return self.unavailable(now, failures, error, Some(pending));
                }
            }
        }
        self.generator.metrics().lease_event(&self.layout, "claim_all_taken");
        self.set_free(0);
        let retry_in = self.backoff(failures);
        tracing::warn!(layout = %self.layout, first, last, ?retry_in, "every machine number in the range is taken");
        self.state = State::Unclaimed { failures: failures + 1, retry_at: Some(now + retry_in), pending: None };
        Outcome::AllTaken { retry_in }
    }

    /// After a claim that made the row (epoch 1: nobody had it), whether the number was held
    /// before all the same, by the audit log: then its row was removed under its holder (rows
    /// emptied by hand, the genesis left behind), who goes on issuing until its next renewal finds
    /// the row gone. The number is parked instead of used: released at once to the claim's `:now`
    /// plus the longest lease any generator may hold, by when every holder of it has tried a
    /// renewal (and stopped) or passed its own lease, and the sweep goes on to the next number.
    /// An audit log that cannot be read (its table down: its records wait in the spool) says
    /// nothing either way, and the number is used, as it was before the audit was asked: parking
    /// every fresh number while the audit table is down would stop a new table's fleet.
    async fn row_vanished(&self, machine: u32, wall: i64) -> bool {
        let history = match self.store.history(Some(machine), 0, wall.saturating_add(1)).await {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!(layout = %self.layout, machine, %error, "a claim made a row afresh and the audit log could not be read to say whether the number was held before");
                return false;
            }
        };
        let ours = |event: &AuditEvent| {
            event.holder == self.holder && event.kind == AuditKind::Claim && event.lease_epoch == 1
        };
        let Some(held) = history.iter().rev().find(|event| !ours(event)) else { return false };
        let why = format!(
            "its row was gone, and the audit log shows it {} by {} (epoch {}) at {}",
            held.kind.as_str(),
            held.holder,
            held.lease_epoch,
            idgen_core::format_unix_ms(held.at_unix_ms)
        );
        let parked_until = wall.saturating_add(MAX_LEASE_MS);
        let released = self.store.release(machine, &self.holder, 1, parked_until, wall).await;
        self.generator.metrics().lease_event(&self.layout, "row_vanished");
        tracing::error!(
            layout = %self.layout,
            machine,
            parked_until = %idgen_core::format_unix_ms(parked_until),
            ?released,
            "machine {machine} not used: {why}; a holder may still issue under it until its next renewal, so it is \
             parked for the longest lease (runbooks/lease-table-restore.md)"
        );
        true
    }

    /// Starts issuing under a claimed row. Should the generator refuse it after all, the number
    /// is given back at once (nothing was issued under it).
    #[allow(clippy::too_many_arguments)]
    async fn install(
        &mut self,
        now: Instant,
        failures: u32,
        machine: u32,
        epoch: u64,
        floor_unix_ms: i64,
        expiry_unix_ms: i64,
        adopted: bool,
    ) -> Outcome {
        // The table's checks again, now that the claim applied: a claimant that froze between its
        // checks and its write may have claimed in a table restored meanwhile under the same name
        // (DynamoDB addresses a table by name), whose row of the number is older than its holder's
        // lease. Refused now, the claim is given back to its `:now`, below which nothing was issued.
        if let Some(refusal) = self.refused_after_the_claim().await {
            let wall = self.generator.clock().unix_ms();
            if let Err(release) = self.store.release(machine, &self.holder, epoch, floor_unix_ms, wall).await {
                tracing::warn!(error = %release, machine, "could not give back a claim in a table refused since; it expires on its own");
            }
            return match refusal {
                Err(StoreError::Replaced(reason)) => self.replaced(now, failures, reason, None),
                Err(error @ StoreError::Unavailable(_)) => self.unavailable(now, failures, error, None),
                Err(error) => self.refused(now, failures, error.to_string(), None),
                Ok(reason) => self.refused(now, failures, reason, None),
            };
        }
        let lease = Lease { layout: self.layout.clone(), machine, epoch, expiry_unix_ms, floor_unix_ms };
        if let Err(error) = self.generator.with_core(|core| core.install_lease(lease)) {
            let wall = self.generator.clock().unix_ms();
            // The stored expiry goes back to the claim's `:now`: anyone whose clock is past it
            // may claim, and nothing was issued at or above it.
            if let Err(release) = self.store.release(machine, &self.holder, epoch, floor_unix_ms, wall).await {
                tracing::warn!(error = %release, machine, "could not give back an unusable claim; it expires on its own");
            }
            return self.cannot_use(now, failures, error);
        }
        let event = if adopted { "claim_adopted" } else { "claim" };
        self.generator.metrics().lease_event(&self.layout, event);
        tracing::info!(layout = %self.layout, machine, epoch, expiry = expiry_unix_ms, adopted, "claimed machine number");
        // An adopted claim is older than a fresh one: renew it at once.
        let renew_at = if adopted { now } else { now + ms(self.config.renew_interval_ms) };
        self.state = State::Held { machine, epoch, renew_at };
        self.count_free().await;
        if adopted {
            Outcome::Adopted { machine, epoch, expiry_unix_ms }
        } else {
            Outcome::Claimed { machine, epoch, expiry_unix_ms }
        }
    }

    /// Whether the table is refused now (after a claim): `Some(Ok(reason))` by the process's
    /// memory or the registry, `Some(Err(error))` by the table's own checks (or it could not be
    /// asked), `None` if it may be claimed in.
    async fn refused_after_the_claim(&self) -> Option<Result<String, StoreError>> {
        if let Some(reason) = went_back_before(&self.store.table_key()) {
            return Some(Ok(reason));
        }
        let genesis = match self.store.check_claimable().await {
            Ok(genesis) => genesis,
            Err(error) => return Some(Err(error)),
        };
        let check = self.table_check.as_ref()?;
        check.check(&self.layout, &self.store.table_name(), &genesis).err().map(Ok)
    }

    /// How many numbers of the range no live lease holds, for the machine-numbers alert: one
    /// scan of the table after each claim (claims are rare: a start, a lost lease). The lease is
    /// already installed; a failed scan only leaves the gauge as it was.
    async fn count_free(&self) {
        let now = self.generator.clock().unix_ms();
        match self.store.list().await {
            Ok(rows) => {
                let held =
                    rows.iter().filter(|r| self.machines.contains(&r.machine_id) && r.lease_expiry > now).count();
                let size = (self.machines.end() - self.machines.start()) as usize + 1;
                self.set_free(size.saturating_sub(held) as i64);
            }
            Err(error) => {
                tracing::debug!(layout = %self.layout, %error, "counting free machine numbers: the scan failed")
            }
        }
    }

    fn set_free(&self, free: i64) {
        let label = crate::metrics::LayoutLabel { layout: self.layout.clone() };
        self.generator.metrics().lease_numbers_free.get_or_create(&label).set(free);
    }

    fn cannot_use(&mut self, now: Instant, failures: u32, error: InstallError) -> Outcome {
        self.generator.metrics().lease_event(&self.layout, "claim_unusable");
        let retry_in = self.backoff(failures);
        tracing::error!(%error, layout = %self.layout, ?retry_in, "the generator cannot issue under this layout: not claiming");
        self.state = State::Unclaimed { failures: failures + 1, retry_at: Some(now + retry_in), pending: None };
        Outcome::CannotUse { error, retry_in }
    }

    fn unavailable(
        &mut self,
        now: Instant,
        failures: u32,
        error: StoreError,
        pending: Option<PendingClaim>,
    ) -> Outcome {
        self.generator.metrics().lease_event(&self.layout, "store_unavailable");
        let retry_in = self.backoff(failures);
        tracing::warn!(layout = %self.layout, %error, ?retry_in, "claim could not reach the lease table");
        self.state = State::Unclaimed { failures: failures + 1, retry_at: Some(now + retry_in), pending };
        Outcome::StoreUnavailable { error, retry_in }
    }

    /// The table was replaced under this process: no claim in it, by any keeper of the process,
    /// from now on ([`WENT_BACK`]).
    fn replaced(&mut self, now: Instant, failures: u32, reason: String, pending: Option<PendingClaim>) -> Outcome {
        self.generator.metrics().lease_event(&self.layout, "table_went_back");
        WENT_BACK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(self.store.table_key())
            .or_insert_with(|| reason.clone());
        self.refused(now, failures, reason, pending)
    }

    /// No claim in this table: [`Outcome::TableRefused`].
    fn refused(&mut self, now: Instant, failures: u32, reason: String, pending: Option<PendingClaim>) -> Outcome {
        self.generator.metrics().lease_event(&self.layout, "table_refused");
        let retry_in = self.backoff(failures);
        tracing::error!(layout = %self.layout, ?retry_in, "no claim in this lease table: {reason}");
        self.state = State::Unclaimed { failures: failures + 1, retry_at: Some(now + retry_in), pending };
        Outcome::TableRefused { reason, retry_in }
    }

    /// Exponential from 250 ms up to the configured maximum, with ±50 % jitter.
    fn backoff(&self, failures: u32) -> Duration {
        let base = (250i64 << failures.min(16)).min(self.config.max_backoff_ms);
        let jittered = rand::rng().random_range(base / 2..=base + base / 2);
        ms(jittered)
    }

    /// Stops issuing under this layout's lease and writes back its last issued timestamp + 1, so a
    /// successor can start at once.
    pub async fn release(&mut self) -> Result<(), StoreError> {
        if let State::Unclaimed { pending: Some(pending), .. } = &self.state {
            // A claim whose answer was lost may have applied: give it back too, or it stays
            // held for a whole lease. Nothing was issued under it, so its own `:now` will do.
            let machine = pending.machine;
            let ours = self.store.get(machine).await?.filter(|row| row.claimed_by(&self.holder, &pending.token));
            if let Some(row) = ours {
                let wall = self.generator.clock().unix_ms();
                self.store.release(machine, &self.holder, row.lease_epoch, pending.now_unix_ms, wall).await?;
            }
        }
        let State::Held { .. } = self.state else {
            return Ok(());
        };
        // Released: never claim again from this keeper.
        self.state = State::Unclaimed {
            failures: 0,
            retry_at: Some(Instant::now() + Duration::from_secs(86_400 * 365)),
            pending: None,
        };
        let Some(release) = self.generator.with_core(|core| core.begin_release(&self.layout)) else {
            return Ok(());
        };
        let wall = self.generator.clock().unix_ms();
        let outcome =
            self.store.release(release.machine, &self.holder, release.epoch, release.expiry_unix_ms, wall).await?;
        match outcome {
            Conditional::Applied => {
                self.generator.metrics().lease_event(&self.layout, "release");
                tracing::info!(layout = %self.layout, machine = release.machine, expiry = release.expiry_unix_ms, "released machine number");
            }
            Conditional::ConditionFailed => tracing::warn!(
                layout = %self.layout,
                machine = release.machine,
                epoch = release.epoch,
                "nothing to release: the row no longer names this holder and epoch (taken over or quarantined)"
            ),
        }
        Ok(())
    }

    /// Ticks until `shutdown` turns true, then releases. Returns the keeper's final release result.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) -> Result<(), StoreError> {
        loop {
            if *shutdown.borrow() {
                break;
            }
            let outcome = self.tick(Instant::now()).await;
            if !matches!(outcome, Outcome::Idle | Outcome::Renewed { .. }) {
                tracing::debug!(layout = %self.layout, ?outcome, "lease keeper");
            }
            let due = self.next_due(Instant::now());
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        break; // the owner is gone: shut down
                    }
                }
            }
        }
        let released = self.release().await;
        self.store.close().await;
        released
    }
}

/// Whether the row a renewal failed on shows the table going back: a number's row is never
/// deleted, and every change of it (a claim, a quarantine, a lift) raises its epoch, so a row
/// that is gone, or has an epoch below ours, or another holder at ours, is an older copy; and at
/// our epoch only our own renewals move the expiry, forward, so ours below `held_expiry` (what
/// the core holds from them) is one too.
fn went_back(row: Option<&LeaseRow>, holder: &str, epoch: u64, held_expiry: i64) -> Option<String> {
    match row {
        None => Some("its row is gone".to_owned()),
        Some(row) if row.lease_epoch < epoch => Some(format!("its row has epoch {} again", row.lease_epoch)),
        Some(row) if row.lease_epoch == epoch && row.holder != holder => {
            Some(format!("its row names {} at the same epoch", row.holder))
        }
        Some(row) if row.lease_epoch == epoch && row.lease_expiry < held_expiry => Some(format!(
            "its row is ours with expiry {}, below the {held_expiry} our renewals wrote",
            row.lease_expiry
        )),
        Some(_) => None,
    }
}

fn ms(millis: i64) -> Duration {
    Duration::from_millis(millis.max(0) as u64)
}
