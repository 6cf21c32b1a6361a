//! [`IdGenerator`]: the core state machine behind a mutex, with a clock and metrics.
//!
//! This is the request path: memory, the clock and nothing else. When the core asks to wait (the
//! millisecond's sequence is used up, or the clock is a few ms behind), the waiting happens
//! outside the lock on the clock's waiter, so no tokio worker is blocked and no core spins.

use std::sync::{Arc, Mutex, MutexGuard};

use idgen_core::Generator;
use idgen_core::generator::{LeaseView, NotNow, Refusal, WaitCause};
use idgen_core::uuid::UuidV7State;
use rand::Rng;

use crate::clock::{Clock, SyncStatus};
use crate::metrics::{GeneratorMetrics, LayoutLabel, ReasonLabel};

pub struct IdGenerator {
    core: Mutex<Generator>,
    uuid: Mutex<UuidV7State>,
    clock: Arc<dyn Clock>,
    metrics: Arc<GeneratorMetrics>,
}

/// What `/healthz` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    Issuing { leases: Vec<LeaseView>, clock: SyncStatus },
    Refusing { refusal: Refusal, leases: Vec<LeaseView>, clock: SyncStatus },
}

impl IdGenerator {
    pub fn new(core: Generator, clock: Arc<dyn Clock>, metrics: Arc<GeneratorMetrics>) -> Self {
        IdGenerator { core: Mutex::new(core), uuid: Mutex::new(UuidV7State::default()), clock, metrics }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn metrics(&self) -> &Arc<GeneratorMetrics> {
        &self.metrics
    }

    /// Runs `f` on the core state. For the lease keeper and tests; never held across an await.
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Generator) -> R) -> R {
        f(&mut self.lock())
    }

    fn lock(&self) -> MutexGuard<'_, Generator> {
        // A panic while holding the lock cannot leave the core half-updated: `issue` changes
        // state only after every check has passed. So a poisoned lock is still consistent.
        self.core.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn next_id(&self) -> Result<u64, Refusal> {
        Ok(self.next_ids(1).await?[0])
    }

    /// `count` (≥ 1) strictly increasing IDs. A batch is issued in as few runs as the sequence
    /// allows; when a millisecond is used up it spills into the next.
    pub async fn next_ids(&self, count: u32) -> Result<Vec<u64>, Refusal> {
        let count = count.max(1);
        let mut ids = Vec::with_capacity(count as usize);
        loop {
            let now = self.clock.unix_ms();
            let step = self.lock().issue(now, count - ids.len() as u32);
            match step {
                Ok(run) => {
                    ids.extend(run.ids());
                    if ids.len() == count as usize {
                        self.metrics.ids_issued.inc_by(u64::from(count));
                        return Ok(ids);
                    }
                }
                Err(NotNow::Wait { until_unix_ms, cause }) => {
                    match cause {
                        WaitCause::SequenceExhausted => self.metrics.sequence_spills.inc(),
                        WaitCause::ClockBehind => self.metrics.clock_behind_events.inc(),
                    };
                    self.clock.wait_until(until_unix_ms).await;
                }
                Err(NotNow::Refuse(refusal)) => {
                    self.count_refusal(&refusal);
                    if !ids.is_empty() {
                        // Already issued IDs are simply never used: gaps are allowed, repeats are not.
                        self.metrics.ids_issued.inc_by(ids.len() as u64);
                    }
                    return Err(refusal);
                }
            }
        }
    }

    /// `count` increasing UUIDv7s. They need no lease (uniqueness is by randomness), but they
    /// carry the time, so they too are refused while the clock is unsynchronized.
    pub fn next_uuids(&self, count: u32) -> Result<Vec<[u8; 16]>, Refusal> {
        if let Some(reason) = self.clock.sync_status().refusal() {
            let refusal = Refusal::ClockUnsynchronized { reason };
            self.count_refusal(&refusal);
            return Err(refusal);
        }
        let mut rng = rand::rng();
        let mut state = self.uuid.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let uuids: Vec<[u8; 16]> =
            (0..count.max(1)).map(|_| state.next(self.clock.unix_ms(), rng.random(), rng.random())).collect();
        self.metrics.uuids_issued.inc_by(uuids.len() as u64);
        Ok(uuids)
    }

    fn count_refusal(&self, refusal: &Refusal) {
        if matches!(refusal, Refusal::ClockBehind { .. }) {
            self.metrics.clock_behind_events.inc();
        }
        self.metrics.refusals.get_or_create(&ReasonLabel { reason: refusal.reason() }).inc();
    }

    pub fn health(&self) -> Health {
        let now = self.clock.unix_ms();
        let clock = self.clock.sync_status();
        let core = self.lock();
        let leases = core.leases();
        match core.check(now) {
            Ok(()) | Err(NotNow::Wait { .. }) => Health::Issuing { leases, clock },
            Err(NotNow::Refuse(refusal)) => Health::Refusing { refusal, leases, clock },
        }
    }

    /// Brings the gauges up to date; call before a scrape.
    pub fn refresh_gauges(&self) {
        let now = self.clock.unix_ms();
        let core = self.lock();
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
    }
}
