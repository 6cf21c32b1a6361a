//! The issuing path: it owns [`IdGenerator`] and its lock-free fast path, which touch memory and
//! the clock only, and never call a lease store, the registry or anything else across a network.
//!
//! [`IdGenerator`]: the core state machine behind a mutex, with a clock and metrics.
//!
//! This is the request path: memory, the clock and nothing else. Within a millisecond, IDs come
//! from a run the core has already issued, one atomic add each and no lock ([`crate::issuing::fast_path`]);
//! the core's lock is taken once per millisecond to issue the next run, and whenever there is no
//! run to take from. When the core asks to wait (the millisecond's sequence is used up, or the
//! clock is a few ms behind), the waiting happens outside the lock on the clock's waiter, so no
//! tokio worker is blocked and no core spins.

pub(crate) mod fast_path;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idgen_core::generator::{LeaseView, NotNow, Refusal, WaitCause};
use idgen_core::uuid::UuidV7State;
use idgen_core::{Generator, MAX_WAIT_BEHIND_LIMIT_MS};
use rand::Rng;

use crate::clock::cpu_counter::{self, Calibration, Window};
use crate::clock::{Clock, SyncStatus};
use crate::issuing::fast_path::{Runs, Taken};
use crate::metrics::{GeneratorMetrics, LayoutLabel, ReasonLabel};

pub struct IdGenerator {
    core: Mutex<Locked>,
    /// The rest of the current millisecond's run, for requests that need no lock.
    runs: Runs,
    clock: Arc<dyn Clock>,
    /// The clock is kept on the CPU's counter: the fast path checks that instead of reading it.
    cpu_counter: bool,
    metrics: Arc<GeneratorMetrics>,
}

/// What the request path changes, under one lock.
struct Locked {
    generator: Generator,
    uuid: UuidV7State,
    /// The wall-clock millisecond in which the clock's sync state was last read.
    sync_read_unix_ms: Option<i64>,
    /// The CPU counter's rate, for each published run's window.
    calibration: Calibration,
}

impl Locked {
    /// Reads the clock's sync state once in every millisecond that issues anything, so no ID or
    /// UUID carries a millisecond in which the kernel had already reported the clock
    /// unsynchronized. One `adjtimex` per busy millisecond; nothing when the check is off.
    fn follow_clock_sync(&mut self, now_unix_ms: i64, clock: &dyn Clock) {
        if self.sync_read_unix_ms != Some(now_unix_ms) {
            self.sync_read_unix_ms = Some(now_unix_ms);
            self.generator.set_clock_unsynchronized(clock.sync_status().refusal());
        }
    }
}

/// What `/healthz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Issuing { leases: Vec<LeaseView>, clock: SyncStatus },
    Refusing { refusal: Refusal, leases: Vec<LeaseView>, clock: SyncStatus },
}

impl IdGenerator {
    pub fn new(core: Generator, clock: Arc<dyn Clock>, metrics: Arc<GeneratorMetrics>) -> Self {
        let locked = Locked {
            generator: core,
            uuid: UuidV7State::default(),
            sync_read_unix_ms: None,
            calibration: Calibration::default(),
        };
        let cpu_counter = clock.follows_cpu_counter();
        IdGenerator { core: Mutex::new(locked), runs: Runs::default(), clock, cpu_counter, metrics }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn metrics(&self) -> &Arc<GeneratorMetrics> {
        &self.metrics
    }

    /// Runs `f` on the core state. For the lease keeper and tests; never held across an await.
    /// The fast path's run is closed first: whatever `f` changes (a lost lease, a release, the
    /// clock's state, the schedule) holds for every ID issued after it returns.
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Generator) -> R) -> R {
        let mut locked = self.lock();
        self.close_run();
        f(&mut locked.generator)
    }

    /// Closes the fast path's run and counts what it handed out. Called with the core's lock held.
    fn close_run(&self) {
        self.metrics.ids_issued.inc_by(self.runs.close());
    }

    fn lock(&self) -> MutexGuard<'_, Locked> {
        // A panic while holding the lock cannot leave the core half-updated: `issue` changes
        // state only after every check has passed. So a poisoned lock is still consistent.
        self.core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lock, and the clock read once it is held (so time spent waiting for the lock never
    /// looks like a clock behind the last issued millisecond), with its sync state for that
    /// millisecond.
    fn lock_now(&self) -> (MutexGuard<'_, Locked>, i64) {
        let mut locked = self.lock();
        let now = self.clock.unix_ms();
        locked.follow_clock_sync(now, &*self.clock);
        (locked, now)
    }

    /// One ID. The same path as a batch, without collecting into a vector.
    pub async fn next_id(&self) -> Result<u64, Refusal> {
        if let Some(id) = self.try_next_id() {
            return Ok(id);
        }
        let mut id = 0;
        self.issue(1, |taken| id = taken.first).await?;
        Ok(id)
    }

    /// One ID from the current millisecond's run if there is one, else `None` (then
    /// [`Self::next_id`] takes the lock): the CPU counter (or a clock read), a few loads and one
    /// atomic add, no lock and no await. The first step of [`Self::issue`], for the single ID
    /// every caller asks for most.
    #[inline]
    pub fn try_next_id(&self) -> Option<u64> {
        if self.cpu_counter
            && let Some(taken) = self.runs.take_by_counter(cpu_counter::now, 1)
        {
            #[cfg(test)]
            tests::TAKEN_BY_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Some(taken.first);
        }
        self.runs.take(self.clock.unix_ms(), 1).map(|taken| taken.first)
    }

    /// Whether the fast path checks the CPU counter rather than reading the clock.
    pub fn checks_cpu_counter(&self) -> bool {
        self.cpu_counter
    }

    /// `count` (≥ 1) strictly increasing IDs. A batch is issued in as few runs as the sequence
    /// allows; when a millisecond is used up it spills into the next.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<u64>, Refusal> {
        let mut ids = Vec::with_capacity(count.max(1) as usize);
        self.issue(count, |taken| ids.extend(taken.first..taken.first + u64::from(taken.count))).await?;
        Ok(ids)
    }

    /// Issues `count` (≥ 1) IDs as runs handed to `take`: from the current millisecond's run
    /// without a lock while it lasts, else through the core (which issues the rest of the
    /// millisecond: this request keeps what it needs and publishes the remainder), waiting outside
    /// the lock when the core asks to. On a refusal, runs already handed out are simply never
    /// used: gaps are allowed, repeats are not.
    async fn issue(&self, count: u32, mut take: impl FnMut(Taken)) -> Result<(), Refusal> {
        let count = count.max(1);
        let mut issued = 0;
        loop {
            let now = self.clock.unix_ms();
            if let Some(taken) = self.runs.take(now, count - issued) {
                take(taken);
                issued += taken.count;
                if issued == count {
                    return Ok(());
                }
                continue;
            }
            let (now, step) = {
                let (mut locked, now) = self.lock_now();
                let step = match self.runs.take(now, count - issued) {
                    // Another request issued this millisecond's run while we waited for the lock.
                    Some(taken) => Ok(taken),
                    None => match locked.generator.issue(now, u32::MAX) {
                        Ok(run) => {
                            let mine = run.count.min(count - issued);
                            let window = if self.cpu_counter {
                                locked.calibration.window(run.unix_ms)
                            } else {
                                Window::default()
                            };
                            let replaced = self.runs.publish(
                                run.unix_ms,
                                run.first,
                                u64::from(run.count),
                                u64::from(mine),
                                window,
                            );
                            self.metrics.ids_issued.inc_by(replaced);
                            Ok(Taken { first: run.first, count: mine })
                        }
                        Err(not_now) => {
                            // Every slow path that issues nothing resets the run, so requests that
                            // keep failing cannot pile offsets onto one run's ticket.
                            self.close_run();
                            Err(not_now)
                        }
                    },
                };
                (now, step)
            };
            match step {
                Ok(taken) => {
                    take(taken);
                    issued += taken.count;
                    if issued == count {
                        return Ok(());
                    }
                }
                Err(NotNow::Wait { until_unix_ms, cause }) => self.wait(now, until_unix_ms, cause).await,
                Err(NotNow::Refuse(refusal)) => {
                    self.count_refusal(&refusal);
                    return Err(refusal);
                }
            }
        }
    }

    /// Waits for the millisecond the core asked for, but no longer than that wait should take
    /// (at most a few ms): if the clock steps back meanwhile, the target is far away, and the
    /// caller must re-read the clock and be refused (`clock_behind`), not sleep out the step.
    async fn wait(&self, now_unix_ms: i64, until_unix_ms: i64, cause: WaitCause) {
        match cause {
            WaitCause::SequenceExhausted => self.metrics.sequence_spills.inc(),
            WaitCause::ClockBehind => self.metrics.clock_behind_events.inc(),
        };
        let expected_ms = (until_unix_ms - now_unix_ms).clamp(0, MAX_WAIT_BEHIND_LIMIT_MS) as u64;
        let limit = Duration::from_millis(expected_ms + 2);
        let _ = tokio::time::timeout(limit, self.clock.wait_until(until_unix_ms)).await;
    }

    /// `count` increasing UUIDv7s. They need no lease (uniqueness is by randomness), but they
    /// carry the time, so they follow the same clock rules: refused while the clock is
    /// unsynchronized, a small step back waited out, a large one refused.
    pub async fn next_uuids(&self, count: u32) -> Result<Vec<[u8; 16]>, Refusal> {
        let count = count.max(1) as usize;
        let mut uuids = Vec::with_capacity(count);
        loop {
            let (now, step) = {
                let mut rng = rand::rng();
                let (mut locked, now) = self.lock_now();
                let Locked { generator, uuid, .. } = &mut *locked;
                let max_wait_behind_ms = generator.config().max_wait_behind_ms;
                let step = match generator.unsynchronized() {
                    Some(reason) => Err(NotNow::Refuse(Refusal::ClockUnsynchronized { reason: reason.to_owned() })),
                    None => loop {
                        if uuids.len() == count {
                            break Ok(());
                        }
                        match uuid.next(now, max_wait_behind_ms, rng.random(), rng.random()) {
                            Ok(bytes) => uuids.push(bytes),
                            Err(not_now) => break Err(not_now),
                        }
                    },
                };
                (now, step)
            };
            match step {
                Ok(()) => {
                    self.metrics.uuids_issued.inc_by(uuids.len() as u64);
                    return Ok(uuids);
                }
                Err(NotNow::Wait { until_unix_ms, cause }) => self.wait(now, until_unix_ms, cause).await,
                Err(NotNow::Refuse(refusal)) => {
                    self.count_refusal(&refusal);
                    return Err(refusal);
                }
            }
        }
    }

    fn count_refusal(&self, refusal: &Refusal) {
        if matches!(refusal, Refusal::ClockBehind { .. }) {
            self.metrics.clock_behind_events.inc();
        }
        self.metrics.refusals.get_or_create(&ReasonLabel { reason: refusal.reason() }).inc();
    }

    pub fn health(&self) -> Health {
        let clock = self.clock.sync_status();
        let (locked, now) = self.lock_now();
        let core = &locked.generator;
        let leases = core.leases();
        match core.check(now) {
            Ok(()) | Err(NotNow::Wait { .. }) => Health::Issuing { leases, clock },
            Err(NotNow::Refuse(refusal)) => Health::Refusing { refusal, leases, clock },
        }
    }

    /// Brings the gauges up to date; call before a scrape.
    pub fn refresh_gauges(&self) {
        let locked = self.lock();
        // Read under the lock, as a request does: a millisecond issued meanwhile is not "ahead".
        let now = self.clock.unix_ms();
        // Count what the live run has handed out (the next request opens a new one).
        self.close_run();
        let core = &locked.generator;
        let fence = core.config().fence_ms;
        for entry in core.schedule().entries() {
            let label = LayoutLabel { layout: entry.layout.name().to_owned() };
            match core.lease(entry.layout.name()) {
                Some(lease) => {
                    let remaining = (lease.expiry_unix_ms - fence - now) as f64 / 1000.0;
                    self.metrics.lease_remaining_seconds.get_or_create(&label).set(remaining);
                    self.metrics.lease_machine_number.get_or_create(&label).set(i64::from(lease.machine));
                }
                None => {
                    self.metrics.lease_remaining_seconds.get_or_create(&label).set(0.0);
                    self.metrics.lease_machine_number.get_or_create(&label).set(-1);
                }
            }
        }
        let synchronized = match self.clock.sync_status() {
            SyncStatus::Synchronized { .. } => 1,
            SyncStatus::Unsynchronized(_) => 0,
            SyncStatus::NotChecked => -1,
        };
        self.metrics.clock_synchronized.set(synchronized);
        let standby = matches!(core.check(now), Err(NotNow::Refuse(refusal)) if refusal.standby_until().is_some());
        self.metrics.region_standby.set(i64::from(standby));
        let layouts: Vec<String> = core.schedule().entries().iter().map(|e| e.layout.name().to_owned()).collect();
        drop(locked);
        // Outside the core's lock: the request path takes it.
        for layout in layouts {
            self.metrics.layout_known(&layout);
        }
        let discipline = self.clock.discipline();
        let (offset, error) =
            discipline.map_or((f64::NAN, f64::NAN), |d| (d.offset_seconds, d.estimated_error_seconds));
        self.metrics.clock_offset_seconds.set(offset);
        self.metrics.clock_estimated_error_seconds.set(error);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use idgen_core::{GeneratorConfig, Lease, OPEN_HORIZON, Schedule};

    use super::*;
    use crate::SystemClock;

    /// Single IDs the fast path took by the CPU counter, in this test binary.
    pub(crate) static TAKEN_BY_COUNTER: AtomicU64 = AtomicU64::new(0);

    fn on_the_system_clock(clock: SystemClock) -> IdGenerator {
        let mut core = Generator::new(
            GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 },
            Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
            0,
            true,
        )
        .unwrap();
        let now = crate::system_unix_ms();
        let lease =
            Lease { layout: "v1".into(), machine: 1, epoch: 1, expiry_unix_ms: now + 60_000, floor_unix_ms: now };
        core.install_lease(lease).unwrap();
        IdGenerator::new(core, Arc::new(clock), Arc::new(GeneratorMetrics::default()))
    }

    #[test]
    fn single_ids_are_taken_by_the_counter_where_the_clock_is_kept_on_it() {
        let off = on_the_system_clock(SystemClock::new(false, 5).with_cpu_counter(false));
        assert!(!off.checks_cpu_counter(), "clock.cpu_counter = false");
        let g = on_the_system_clock(SystemClock::new(false, 5));
        assert_eq!(g.checks_cpu_counter(), cpu_counter::usable());
        if !g.checks_cpu_counter() {
            return; // another clocksource: nothing to take by
        }
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let until = std::time::Instant::now() + Duration::from_millis(400);
        let mut last = 0;
        while std::time::Instant::now() < until {
            for _ in 0..100 {
                let id = runtime.block_on(g.next_id()).unwrap();
                assert!(id > last);
                last = id;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // Calibration takes two 50 ms measurements; after that most single IDs go by the counter.
        assert!(TAKEN_BY_COUNTER.load(Ordering::Relaxed) > 1_000, "{TAKEN_BY_COUNTER:?}");
    }
}
