//! The generator state machine: sequence per millisecond, the clock rules and the lease fence.
//!
//! The state is four facts per lease and two for the clock: which machine number is held under
//! which layout, its epoch, its expiry and the floor it may not go below; and the last timestamp
//! issued with the next free sequence in it. `issue(now, want)` either hands out a run of IDs, asks
//! the caller to wait until a later millisecond, or refuses with the reason.
//!
//! The rules, in the order they are checked:
//! 1. no ID without a synchronized clock (when the operator requires one);
//! 2. timestamps never go backwards: behind the last issued timestamp (or the lease floor) by at
//!    most `max_wait_behind_ms`, wait; by more, refuse until the clock has caught up;
//! 3. the region must still be active, and the timestamp representable and below the schedule's
//!    horizon;
//! 4. the layout the timestamp selects must have a lease (and a region field, unless this is the
//!    home region);
//! 5. the fence: never issue a timestamp ≥ `lease_expiry − fence`;
//! 6. when the millisecond's sequence is used up, wait for the next millisecond.

use thiserror::Error;

use crate::layout::{FieldError, LOW_BITS, Layout, MachineNumber};
use crate::schedule::{Schedule, ScheduleChange};
use crate::time::{Timestamp, TimestampError};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneratorConfig {
    /// Never issue a timestamp ≥ `lease_expiry − fence_ms`.
    pub fence_ms: i64,
    /// A clock behind the last issued timestamp by at most this much is waited out.
    pub max_wait_behind_ms: i64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        GeneratorConfig { fence_ms: 5_000, max_wait_behind_ms: 5 }
    }
}

/// The largest clock step back a generator may wait out instead of refusing (SPEC §3 asks for
/// 5 ms; more than a second would hold requests for longer than any caller waits).
pub const MAX_WAIT_BEHIND_LIMIT_MS: i64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A fence of 0 or less would issue up to (or past) the lease expiry, where a successor may
    /// already be issuing.
    #[error("fence_ms must be at least 1, not {0}: no ID may be issued at or past lease expiry − fence")]
    Fence(i64),
    #[error("max_wait_behind_ms must be 0–{MAX_WAIT_BEHIND_LIMIT_MS}, not {0}")]
    WaitBehind(i64),
}

impl GeneratorConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.fence_ms < 1 {
            return Err(ConfigError::Fence(self.fence_ms));
        }
        if !(0..=MAX_WAIT_BEHIND_LIMIT_MS).contains(&self.max_wait_behind_ms) {
            return Err(ConfigError::WaitBehind(self.max_wait_behind_ms));
        }
        Ok(())
    }
}

/// A lease as granted by the lease table: what the generator may issue under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub layout: String,
    pub machine: u32,
    pub epoch: u64,
    /// Unix ms, by this holder's clock.
    pub expiry_unix_ms: i64,
    /// The `:now` the claim was made with; nothing below it may be issued.
    pub floor_unix_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldLease {
    layout: Layout,
    machine: MachineNumber,
    epoch: u64,
    expiry_unix_ms: i64,
    floor_unix_ms: i64,
    /// The region and machine bits, already shifted into place.
    base: u64,
    last_issued_unix_ms: Option<i64>,
}

/// Why the generator will not issue now. Each maps to one `/healthz` reason.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    #[error("clock is not synchronized: {reason}")]
    ClockUnsynchronized { reason: String },
    #[error("clock is {behind_ms} ms behind the last issued timestamp; refusing until it catches up")]
    ClockBehind { behind_ms: i64 },
    #[error("timestamp out of range: {0}")]
    OutOfRange(TimestampError),
    #[error("timestamp is at or past the schedule horizon ({horizon_unix_ms} Unix ms)")]
    PastHorizon { horizon_unix_ms: i64 },
    #[error("no lease held for layout {layout}")]
    NoLease { layout: String },
    /// Outside the home region, a layout without region bits (v1) is not this region's to issue
    /// under: the region waits for the first layout with a region field (`issues_from_unix_ms`,
    /// `None` if the schedule has none after now). By design, not a fault: [`Refusal::standby_until`].
    #[error("layout {layout} has no region field and this is not the home region{}", issues_from(*issues_from_unix_ms))]
    NotHomeRegion { layout: String, issues_from_unix_ms: Option<i64> },
    #[error("inside the fence: lease on machine {machine} expires at {expiry_unix_ms} Unix ms, fence {fence_ms} ms")]
    PastFence { machine: u32, expiry_unix_ms: i64, fence_ms: i64 },
    /// The registry no longer lists this generator's region number as active (retired, or the
    /// region was added again under a new number): nothing more may be issued under it.
    #[error("{reason}")]
    RegionRetired { reason: String },
}

impl Refusal {
    /// A short, stable word for health reports, metrics and error codes.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::ClockUnsynchronized { .. } => "clock_unsynchronized",
            Refusal::ClockBehind { .. } => "clock_behind",
            Refusal::OutOfRange(_)
            | Refusal::PastHorizon { .. }
            | Refusal::NotHomeRegion { .. }
            | Refusal::RegionRetired { .. } => "schedule",
            // Inside the fence is a lease problem to the operator: the lease is (about to be) gone.
            Refusal::NoLease { .. } | Refusal::PastFence { .. } => "lease",
        }
    }

    /// Every word [`Refusal::reason`] gives, so metrics can show each from the start.
    pub const REASONS: [&'static str; 4] = ["lease", "clock_behind", "clock_unsynchronized", "schedule"];

    /// When this refusal is the region's *standby*, the time (Unix ms) the schedule first lets the
    /// region issue: a region other than the home region, before the first layout with a region
    /// field, refuses every ID by design (v1 has no region bits, so only the home region issues
    /// under it). `None` for every other refusal, which is a fault: a clock, a lease, a horizon or
    /// a retired region. The refusal order of [`Generator::issue`] puts the clock and a retired
    /// region first, so a standby region with a bad clock is refusing, not on standby.
    pub fn standby_until(&self) -> Option<i64> {
        match self {
            Refusal::NotHomeRegion { issues_from_unix_ms, .. } => *issues_from_unix_ms,
            _ => None,
        }
    }
}

/// The tail of the not-home-region message: when the region issues.
fn issues_from(unix_ms: Option<i64>) -> String {
    unix_ms.map_or_else(String::new, |ms| format!("; this region issues from {}", crate::time::format_unix_ms(ms)))
}

/// Why the caller has to come back later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitCause {
    /// The millisecond's sequence is used up: the batch spills into the next millisecond.
    SequenceExhausted,
    /// The clock is a little behind the last issued timestamp or the lease floor.
    ClockBehind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotNow {
    Wait { until_unix_ms: i64, cause: WaitCause },
    Refuse(Refusal),
}

/// A run of consecutive IDs in one millisecond: `first, first + 1, …, first + count − 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub first: u64,
    pub count: u32,
    pub unix_ms: i64,
    pub machine: u32,
}

impl Run {
    pub fn ids(&self) -> impl Iterator<Item = u64> + use<> {
        let first = self.first;
        (0..u64::from(self.count)).map(move |i| first + i)
    }
}

/// What a graceful release writes back: the expiry that lets a successor start at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub layout: String,
    pub machine: u32,
    pub epoch: u64,
    /// The last issued timestamp + 1 (or the floor if nothing was issued).
    pub expiry_unix_ms: i64,
}

/// A read-only view of a held lease, for health reports and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub layout: String,
    pub machine: u32,
    pub epoch: u64,
    pub expiry_unix_ms: i64,
    pub floor_unix_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InstallError {
    #[error("layout {0} is not in the schedule")]
    UnknownLayout(String),
    #[error(transparent)]
    Field(#[from] FieldError),
    #[error("lease expiry {expiry_unix_ms} is not after its floor {floor_unix_ms}")]
    Inverted { floor_unix_ms: i64, expiry_unix_ms: i64 },
}

#[derive(Debug, Clone)]
pub struct Generator {
    config: GeneratorConfig,
    schedule: Schedule,
    region: u32,
    home_region: bool,
    clock_unsynchronized: Option<String>,
    region_retired: Option<String>,
    /// When the registry retires this region (Unix ms): nothing is issued from then on.
    region_retires_at: Option<i64>,
    leases: Vec<HeldLease>,
    last_unix_ms: Option<i64>,
    next_sequence: u32,
}

struct Plan {
    lease: usize,
    unix_ms: i64,
    sequence: u32,
    available: u32,
}

impl Generator {
    /// A generator for one region. It issues nothing until a lease is installed. The
    /// configuration is checked here, so no embedder can run the core with a fence that would
    /// issue at or past a lease's expiry.
    pub fn new(
        config: GeneratorConfig,
        schedule: Schedule,
        region: u32,
        home_region: bool,
    ) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Generator {
            config,
            schedule,
            region,
            home_region,
            clock_unsynchronized: None,
            region_retired: None,
            region_retires_at: None,
            leases: Vec::new(),
            last_unix_ms: None,
            next_sequence: 0,
        })
    }

    pub fn config(&self) -> GeneratorConfig {
        self.config
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    pub fn region(&self) -> u32 {
        self.region
    }

    pub fn home_region(&self) -> bool {
        self.home_region
    }

    /// Takes a newer copy of the schedule. The past cannot change: every entry that starts
    /// before the current horizon must be the same in both, and the horizon never moves back.
    pub fn set_schedule(&mut self, schedule: Schedule) -> Result<(), ScheduleChange> {
        self.schedule.check_successor(&schedule)?;
        self.schedule = schedule;
        Ok(())
    }

    /// `None` when the clock is synchronized (or the check is off); otherwise the reason it is not.
    pub fn set_clock_unsynchronized(&mut self, reason: Option<String>) {
        self.clock_unsynchronized = reason;
    }

    /// Why the clock is held unsynchronized, if it is.
    pub fn unsynchronized(&self) -> Option<&str> {
        self.clock_unsynchronized.as_deref()
    }

    /// The region no longer issues (`Some(reason)`), or issues again (`None`).
    pub fn set_region_retired(&mut self, reason: Option<String>) {
        self.region_retired = reason;
    }

    /// The region retires at `at` (Unix ms; `None`: no retirement scheduled): from that
    /// millisecond on nothing is issued, whether or not anyone says so again.
    pub fn set_region_retires_at(&mut self, at_unix_ms: Option<i64>) {
        self.region_retires_at = at_unix_ms;
    }

    /// When the region retires, if the registry has scheduled it.
    pub fn region_retires_at(&self) -> Option<i64> {
        self.region_retires_at
    }

    /// Whether a lease on `machine` under `layout` could be installed: the layout is in the
    /// schedule and this region's number and the machine number fit its fields. A lease keeper
    /// asks before it claims, so it never takes a number it cannot use.
    pub fn check_installable(&self, layout: &str, machine: u32) -> Result<(), InstallError> {
        self.encoded_base(layout, machine).map(|_| ())
    }

    /// The layout and the region and machine bits, shifted into place.
    fn encoded_base(&self, layout: &str, machine: u32) -> Result<(Layout, MachineNumber, u64), InstallError> {
        let layout =
            self.schedule.layout(layout).ok_or_else(|| InstallError::UnknownLayout(layout.to_owned()))?.clone();
        let machine = layout.machine_number(machine)?;
        let region = if layout.region_bits() == 0 { 0 } else { self.region };
        let base = layout.encode(Timestamp::ZERO, layout.region_number(region)?, machine, layout.sequence(0)?)?;
        Ok((layout, machine, base))
    }

    /// Starts issuing under a freshly claimed lease. Replaces any lease held for the same layout.
    pub fn install_lease(&mut self, lease: Lease) -> Result<(), InstallError> {
        let (layout, machine, base) = self.encoded_base(&lease.layout, lease.machine)?;
        if lease.expiry_unix_ms <= lease.floor_unix_ms {
            return Err(InstallError::Inverted {
                floor_unix_ms: lease.floor_unix_ms,
                expiry_unix_ms: lease.expiry_unix_ms,
            });
        }
        self.leases.retain(|held| held.layout.name() != lease.layout);
        self.leases.push(HeldLease {
            layout,
            machine,
            epoch: lease.epoch,
            expiry_unix_ms: lease.expiry_unix_ms,
            floor_unix_ms: lease.floor_unix_ms,
            base,
            last_issued_unix_ms: None,
        });
        // A different machine number in the same millisecond could make a smaller ID: finish the
        // current millisecond so IDs from this generator keep strictly increasing.
        self.next_sequence = u32::MAX;
        Ok(())
    }

    /// Records a successful renewal. Returns false (and changes nothing) unless the lease is the
    /// one held, with the same epoch, and the expiry moves forward.
    pub fn extend_lease(&mut self, layout: &str, machine: u32, epoch: u64, new_expiry_unix_ms: i64) -> bool {
        match self.held_mut(layout) {
            Some(held)
                if held.machine.value() == machine
                    && held.epoch == epoch
                    && new_expiry_unix_ms > held.expiry_unix_ms =>
            {
                held.expiry_unix_ms = new_expiry_unix_ms;
                true
            }
            _ => false,
        }
    }

    /// The lease is lost (a renewal failed its condition): stop issuing under it at once.
    pub fn drop_lease(&mut self, layout: &str) -> Option<LeaseView> {
        let index = self.leases.iter().position(|held| held.layout.name() == layout)?;
        Some(view(&self.leases.remove(index)))
    }

    /// Stops issuing under the layout's lease and says what to write back so a successor can
    /// start at once: the last issued timestamp + 1.
    pub fn begin_release(&mut self, layout: &str) -> Option<Release> {
        let index = self.leases.iter().position(|held| held.layout.name() == layout)?;
        let held = self.leases.remove(index);
        Some(Release {
            layout: layout.to_owned(),
            machine: held.machine.value(),
            epoch: held.epoch,
            expiry_unix_ms: held.last_issued_unix_ms.map_or(held.floor_unix_ms, |last| last + 1),
        })
    }

    pub fn lease(&self, layout: &str) -> Option<LeaseView> {
        self.leases.iter().find(|held| held.layout.name() == layout).map(view)
    }

    pub fn leases(&self) -> Vec<LeaseView> {
        self.leases.iter().map(view).collect()
    }

    pub fn last_issued_unix_ms(&self) -> Option<i64> {
        self.last_unix_ms
    }

    /// Would `issue` hand out an ID at `now`? Changes nothing.
    pub fn check(&self, now_unix_ms: i64) -> Result<(), NotNow> {
        self.plan(now_unix_ms).map(|_| ())
    }

    /// Issues up to `want` IDs (at least 1) in the millisecond `now`, all under one lease.
    pub fn issue(&mut self, now_unix_ms: i64, want: u32) -> Result<Run, NotNow> {
        let plan = self.plan(now_unix_ms)?;
        let count = want.clamp(1, plan.available);
        let held = &mut self.leases[plan.lease];
        let timestamp = (plan.unix_ms - crate::time::EPOCH_UNIX_MS) as u64;
        let first = (timestamp << LOW_BITS) | held.base | u64::from(plan.sequence);
        held.last_issued_unix_ms = Some(plan.unix_ms);
        self.last_unix_ms = Some(plan.unix_ms);
        self.next_sequence = plan.sequence + count;
        Ok(Run { first, count, unix_ms: plan.unix_ms, machine: held.machine.value() })
    }

    fn plan(&self, now: i64) -> Result<Plan, NotNow> {
        if let Some(reason) = &self.clock_unsynchronized {
            return Err(NotNow::Refuse(Refusal::ClockUnsynchronized { reason: reason.clone() }));
        }
        if let Some(reason) = &self.region_retired {
            return Err(NotNow::Refuse(Refusal::RegionRetired { reason: reason.clone() }));
        }
        if let Some(at) = self.region_retires_at.filter(|at| now >= *at) {
            let reason = format!(
                "this region (number {}) retired at {}, as the registry scheduled",
                self.region,
                crate::time::format_unix_ms(at)
            );
            return Err(NotNow::Refuse(Refusal::RegionRetired { reason }));
        }
        if let Some(last) = self.last_unix_ms {
            self.not_behind(now, last)?;
        }
        let timestamp = Timestamp::from_unix_ms(now).map_err(|e| NotNow::Refuse(Refusal::OutOfRange(e)))?;
        if timestamp.millis() >= self.schedule.horizon() {
            let horizon_unix_ms = self.schedule.horizon() as i64 + crate::time::EPOCH_UNIX_MS;
            return Err(NotNow::Refuse(Refusal::PastHorizon { horizon_unix_ms }));
        }
        let layout = &self.schedule.entry_at(timestamp).layout;
        if layout.region_bits() == 0 && !self.home_region {
            let issues_from_unix_ms = self
                .schedule
                .entries()
                .iter()
                .find(|e| e.from > timestamp && e.layout.region_bits() > 0)
                .map(|e| e.from.unix_ms());
            return Err(NotNow::Refuse(Refusal::NotHomeRegion {
                layout: layout.name().to_owned(),
                issues_from_unix_ms,
            }));
        }
        let lease = self
            .leases
            .iter()
            .position(|held| held.layout.name() == layout.name())
            .ok_or_else(|| NotNow::Refuse(Refusal::NoLease { layout: layout.name().to_owned() }))?;
        let held = &self.leases[lease];
        self.not_behind(now, held.floor_unix_ms)?;
        if now >= held.expiry_unix_ms - self.config.fence_ms {
            return Err(NotNow::Refuse(Refusal::PastFence {
                machine: held.machine.value(),
                expiry_unix_ms: held.expiry_unix_ms,
                fence_ms: self.config.fence_ms,
            }));
        }
        let per_ms = layout.sequences_per_ms();
        let sequence = if self.last_unix_ms == Some(now) { self.next_sequence } else { 0 };
        if sequence >= per_ms {
            return Err(NotNow::Wait { until_unix_ms: now + 1, cause: WaitCause::SequenceExhausted });
        }
        Ok(Plan { lease, unix_ms: now, sequence, available: per_ms - sequence })
    }

    /// `now` may not be below `floor`: wait a little, refuse a lot.
    fn not_behind(&self, now: i64, floor: i64) -> Result<(), NotNow> {
        if now >= floor {
            return Ok(());
        }
        let behind_ms = floor.saturating_sub(now);
        if behind_ms <= self.config.max_wait_behind_ms {
            Err(NotNow::Wait { until_unix_ms: floor, cause: WaitCause::ClockBehind })
        } else {
            Err(NotNow::Refuse(Refusal::ClockBehind { behind_ms }))
        }
    }

    fn held_mut(&mut self, layout: &str) -> Option<&mut HeldLease> {
        self.leases.iter_mut().find(|held| held.layout.name() == layout)
    }
}

fn view(held: &HeldLease) -> LeaseView {
    LeaseView {
        layout: held.layout.name().to_owned(),
        machine: held.machine.value(),
        epoch: held.epoch,
        expiry_unix_ms: held.expiry_unix_ms,
        floor_unix_ms: held.floor_unix_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{DEFAULT_V2_FROM, OPEN_HORIZON};
    use crate::time::EPOCH_UNIX_MS;

    const NOW: i64 = 1_790_424_000_000; // 2026-09-26T12:00:00Z

    fn generator() -> Generator {
        let mut g =
            Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 0, true)
                .unwrap();
        g.install_lease(lease(37, 1, NOW, NOW + 300_000)).unwrap();
        g
    }

    fn lease(machine: u32, epoch: u64, floor: i64, expiry: i64) -> Lease {
        Lease { layout: "v1".into(), machine, epoch, expiry_unix_ms: expiry, floor_unix_ms: floor }
    }

    #[test]
    fn issues_the_spec_vector() {
        let mut g = generator();
        let run = g.issue(NOW, 6).unwrap();
        assert_eq!(run.first + 5, 97_301_141_913_751_557);
        assert_eq!(run.count, 6);
    }

    #[test]
    fn sequence_spills_into_the_next_millisecond() {
        let mut g = generator();
        assert_eq!(g.issue(NOW, 5000).unwrap().count, 4096);
        assert_eq!(g.issue(NOW, 1), Err(NotNow::Wait { until_unix_ms: NOW + 1, cause: WaitCause::SequenceExhausted }));
        let run = g.issue(NOW + 1, 1).unwrap();
        assert_eq!(run.first & 0xfff, 0);
    }

    #[test]
    fn small_step_back_waits_big_step_back_refuses() {
        let mut g = generator();
        g.issue(NOW + 100, 1).unwrap();
        assert_eq!(g.issue(NOW + 95, 1), Err(NotNow::Wait { until_unix_ms: NOW + 100, cause: WaitCause::ClockBehind }));
        assert_eq!(g.issue(NOW + 94, 1), Err(NotNow::Refuse(Refusal::ClockBehind { behind_ms: 6 })));
        assert!(g.issue(NOW + 100, 1).is_ok());
    }

    #[test]
    fn fence_is_exclusive_of_expiry_minus_fence() {
        let mut g = generator();
        let fence_start = NOW + 300_000 - 5_000;
        assert!(g.issue(fence_start - 1, 1).is_ok());
        assert!(matches!(g.issue(fence_start, 1), Err(NotNow::Refuse(Refusal::PastFence { .. }))));
        assert!(g.extend_lease("v1", 37, 1, NOW + 400_000));
        assert!(g.issue(fence_start, 1).is_ok());
        assert!(!g.extend_lease("v1", 37, 2, NOW + 500_000), "wrong epoch");
        assert!(!g.extend_lease("v1", 37, 1, NOW + 10), "backwards");
    }

    #[test]
    fn no_lease_no_ids_and_the_floor_holds() {
        let mut g =
            Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 0, true)
                .unwrap();
        assert_eq!(g.issue(NOW, 1), Err(NotNow::Refuse(Refusal::NoLease { layout: "v1".into() })));
        g.install_lease(lease(3, 4, NOW, NOW + 300_000)).unwrap();
        assert!(matches!(g.issue(NOW - 6, 1), Err(NotNow::Refuse(Refusal::ClockBehind { .. }))));
        assert!(matches!(g.issue(NOW - 1, 1), Err(NotNow::Wait { .. })));
        assert!(g.issue(NOW, 1).is_ok());
        assert!(g.drop_lease("v1").is_some());
        assert!(matches!(g.issue(NOW + 1, 1), Err(NotNow::Refuse(Refusal::NoLease { .. }))));
    }

    #[test]
    fn release_writes_back_last_issued_plus_one() {
        let mut g = generator();
        g.issue(NOW + 42, 1).unwrap();
        let release = g.begin_release("v1").unwrap();
        assert_eq!(release.expiry_unix_ms, NOW + 43);
        assert!(g.issue(NOW + 50, 1).is_err(), "nothing is issued after release begins");
    }

    #[test]
    fn a_new_machine_number_in_the_same_millisecond_waits_for_the_next() {
        let mut g = generator();
        let a = g.issue(NOW, 1).unwrap();
        g.install_lease(lease(2, 1, NOW, NOW + 300_000)).unwrap();
        assert!(matches!(g.issue(NOW, 1), Err(NotNow::Wait { cause: WaitCause::SequenceExhausted, .. })));
        let b = g.issue(NOW + 1, 1).unwrap();
        assert!(b.first > a.first);
    }

    #[test]
    fn horizon_and_home_region_are_enforced() {
        let horizon = 1_000;
        let schedule = Schedule::default_with_horizon(horizon).unwrap();
        let mut g = Generator::new(GeneratorConfig::default(), schedule.clone(), 0, true).unwrap();
        g.install_lease(lease(1, 1, EPOCH_UNIX_MS, EPOCH_UNIX_MS + 300_000)).unwrap();
        assert!(g.issue(EPOCH_UNIX_MS + 999, 1).is_ok());
        assert!(matches!(g.issue(EPOCH_UNIX_MS + 1000, 1), Err(NotNow::Refuse(Refusal::PastHorizon { .. }))));

        let mut other = Generator::new(GeneratorConfig::default(), schedule, 3, false).unwrap();
        other.install_lease(lease(1, 1, EPOCH_UNIX_MS, EPOCH_UNIX_MS + 300_000)).unwrap();
        assert!(matches!(other.issue(EPOCH_UNIX_MS + 10, 1), Err(NotNow::Refuse(Refusal::NotHomeRegion { .. }))));
    }

    /// Outside the home region, before the first layout with a region field, the refusal is the
    /// region's standby, naming when it issues; from that layout on, a refusal is a fault again.
    #[test]
    fn a_region_other_than_the_home_region_is_on_standby_until_its_layout() {
        let v2_from = DEFAULT_V2_FROM as i64 + EPOCH_UNIX_MS;
        let mut other =
            Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 3, false)
                .unwrap();
        let Err(NotNow::Refuse(refusal)) = other.check(NOW) else { panic!("a non-home region issued under v1") };
        assert_eq!(refusal, Refusal::NotHomeRegion { layout: "v1".into(), issues_from_unix_ms: Some(v2_from) });
        assert_eq!(refusal.standby_until(), Some(v2_from));
        assert_eq!(refusal.reason(), "schedule", "requests get the same 503 as before");
        assert!(refusal.to_string().ends_with("this region issues from 2028-01-01T00:00:00.000Z"), "{refusal}");

        // A preclaimed v2 lease changes nothing before the cutover.
        let v2 = Lease {
            layout: "v2".into(),
            machine: 5,
            epoch: 1,
            expiry_unix_ms: v2_from + 300_000,
            floor_unix_ms: v2_from - 60_000,
        };
        other.install_lease(v2).unwrap();
        let Err(NotNow::Refuse(refusal)) = other.check(v2_from - 1) else { panic!("issued before the cutover") };
        assert_eq!(refusal.standby_until(), Some(v2_from));
        // From the cutover it issues; and a refusal then (no lease) is a fault, not standby.
        assert!(other.issue(v2_from, 1).is_ok());
        other.drop_lease("v2");
        let Err(NotNow::Refuse(refusal)) = other.check(v2_from + 10) else { panic!("issued without a lease") };
        assert_eq!((refusal.reason(), refusal.standby_until()), ("lease", None));

        // A clock problem or a retired region is a fault even on standby.
        let mut other =
            Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 3, false)
                .unwrap();
        other.set_clock_unsynchronized(Some("STA_UNSYNC".into()));
        let Err(NotNow::Refuse(refusal)) = other.check(NOW) else { panic!() };
        assert_eq!(refusal.standby_until(), None);
        other.set_clock_unsynchronized(None);
        other.set_region_retired(Some("region 3 is retired".into()));
        let Err(NotNow::Refuse(refusal)) = other.check(NOW) else { panic!() };
        assert_eq!(refusal.standby_until(), None);
        // The home region is never on standby; nor is a region whose schedule has no layout with
        // a region field ahead (it would never issue: a fault to look at).
        let Err(NotNow::Refuse(refusal)) = generator().check(NOW - 10_000) else { panic!() };
        assert_eq!(refusal.standby_until(), None);
        let v1_only = Schedule::new(
            vec![crate::schedule::ScheduleEntry { layout: crate::Layout::v1(), from: Timestamp::ZERO }],
            OPEN_HORIZON,
        )
        .unwrap();
        let stuck = Generator::new(GeneratorConfig::default(), v1_only, 3, false).unwrap();
        let Err(NotNow::Refuse(refusal)) = stuck.check(NOW) else { panic!() };
        assert_eq!((refusal.reason(), refusal.standby_until()), ("schedule", None));
    }

    #[test]
    fn a_newer_schedule_extends_but_never_rewrites() {
        let mut g = Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(1_000).unwrap(), 0, true)
            .unwrap();
        assert!(g.set_schedule(Schedule::default_with_horizon(2_000).unwrap()).is_ok());
        assert!(matches!(
            g.set_schedule(Schedule::default_with_horizon(1_500).unwrap()),
            Err(ScheduleChange::HorizonBackwards { .. })
        ));
        let moved_v2 = Schedule::new(
            vec![
                crate::schedule::ScheduleEntry { layout: crate::Layout::v1(), from: Timestamp::ZERO },
                crate::schedule::ScheduleEntry {
                    layout: crate::Layout::v2(),
                    from: Timestamp::from_millis(1_500).unwrap(),
                },
            ],
            3_000,
        )
        .unwrap();
        assert_eq!(g.set_schedule(moved_v2), Err(ScheduleChange::RewritesThePast), "v2 moved into the settled past");
        assert_eq!(g.schedule().horizon(), 2_000);
    }

    #[test]
    fn unsynchronized_clock_refuses() {
        let mut g = generator();
        g.set_clock_unsynchronized(Some("STA_UNSYNC".into()));
        assert_eq!(
            g.issue(NOW, 1).unwrap_err(),
            NotNow::Refuse(Refusal::ClockUnsynchronized { reason: "STA_UNSYNC".into() })
        );
        g.set_clock_unsynchronized(None);
        assert!(g.issue(NOW, 1).is_ok());
    }

    #[test]
    fn a_fence_that_would_issue_at_or_past_expiry_is_refused_at_construction() {
        // On the unchecked core a fence of -1000 issued one second past the lease expiry, where a
        // successor may already be issuing the same milliseconds.
        let schedule = Schedule::default_with_horizon(OPEN_HORIZON).unwrap();
        for fence_ms in [-1_000, -1, 0] {
            let config = GeneratorConfig { fence_ms, max_wait_behind_ms: 5 };
            assert_eq!(Generator::new(config, schedule.clone(), 0, true).unwrap_err(), ConfigError::Fence(fence_ms));
        }
        for max_wait_behind_ms in [-1, MAX_WAIT_BEHIND_LIMIT_MS + 1] {
            let config = GeneratorConfig { fence_ms: 5_000, max_wait_behind_ms };
            assert!(Generator::new(config, schedule.clone(), 0, true).is_err(), "{max_wait_behind_ms}");
        }
        let tight = Generator::new(GeneratorConfig { fence_ms: 1, max_wait_behind_ms: 0 }, schedule, 0, true);
        let mut tight = tight.unwrap();
        tight.install_lease(lease(1, 1, NOW, NOW + 10)).unwrap();
        assert!(tight.issue(NOW + 8, 1).is_ok());
        assert!(matches!(tight.issue(NOW + 9, 1), Err(NotNow::Refuse(Refusal::PastFence { .. }))));
    }

    #[test]
    fn a_lease_that_cannot_be_used_is_known_before_it_is_claimed() {
        let g = Generator::new(
            GeneratorConfig::default(),
            Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
            9, // does not fit v2's 3 region bits
            false,
        )
        .unwrap();
        assert!(g.check_installable("v1", 1023).is_ok(), "v1 has no region field");
        assert!(matches!(g.check_installable("v2", 1), Err(InstallError::Field(FieldError::Overflow { .. }))));
        assert!(matches!(g.check_installable("v1", 1024), Err(InstallError::Field(FieldError::Overflow { .. }))));
        assert_eq!(g.check_installable("v9", 1), Err(InstallError::UnknownLayout("v9".into())));
    }

    #[test]
    fn a_retired_region_stops_issuing() {
        let mut g = generator();
        assert!(g.issue(NOW, 1).is_ok());
        g.set_region_retired(Some("region 0 is retired".into()));
        let refused = g.issue(NOW + 1, 1).unwrap_err();
        assert_eq!(refused, NotNow::Refuse(Refusal::RegionRetired { reason: "region 0 is retired".into() }));
        let NotNow::Refuse(refusal) = refused else { unreachable!() };
        assert_eq!(refusal.reason(), "schedule");
        g.set_region_retired(None);
        assert!(g.issue(NOW + 2, 1).is_ok());
    }

    #[test]
    fn a_region_issues_until_its_retirement_time_and_not_from_it() {
        let mut g = generator();
        g.set_region_retires_at(Some(NOW + 2));
        assert_eq!(g.region_retires_at(), Some(NOW + 2));
        assert!(g.issue(NOW, 1).is_ok());
        assert!(g.issue(NOW + 1, 4096).is_ok(), "the whole last millisecond");
        for now in [NOW + 2, NOW + 3, NOW + 86_400_000] {
            let Err(NotNow::Refuse(refusal)) = g.issue(now, 1) else { panic!("issued at {now}") };
            assert_eq!(refusal.reason(), "schedule");
            assert!(refusal.to_string().contains("retired at 2026-09-26T12:00:00.002Z"), "{refusal}");
        }
        assert!(g.check(NOW + 2).is_err());
        // Cancelled (the registry says so before the time): issuing again.
        g.set_region_retires_at(None);
        assert!(g.issue(NOW + 3, 1).is_ok());
    }

    #[test]
    fn past_the_end_of_time_nothing_is_issued() {
        let mut g = generator();
        let end = Timestamp::MAX.unix_ms();
        let v2 = Lease { layout: "v2".into(), ..lease(1, 2, end - 10, end + 300_000) };
        g.install_lease(v2).unwrap();
        assert!(g.issue(end, 1).is_ok());
        assert!(matches!(g.issue(end + 1, 1), Err(NotNow::Refuse(Refusal::OutOfRange(_)))));
    }
}
