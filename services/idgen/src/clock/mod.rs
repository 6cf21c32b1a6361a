//! The clock: it owns every reading of time a generator makes, and never issues an ID or
//! touches a lease. Its rooms:
//!
//! - here, what a clock is: [`Clock`] (the wall clock that goes into IDs and lease times, its
//!   synchronization state, and a way to wait for a given millisecond without blocking a tokio
//!   worker thread or spinning a core), [`SyncStatus`] and [`Discipline`];
//! - `system`: [`SystemClock`], the one clock in service, and the system time the rest of the
//!   crate records ([`system_unix_ms`]);
//! - `kernel`: the kernel's synchronization gate and discipline (`adjtimex`, read only);
//! - `ticker`: the millisecond waits on one thread of the process's own;
//! - `runtime_timer` (Linux): the same waits on a `timerfd` a tokio runtime's driver polls;
//! - `manual`: [`ManualClock`], a clock a test moves by hand;
//! - [`cpu_counter`]: the CPU counter's window, by which the fast path checks the millisecond
//!   instead of reading the clock; it asks this module's clock whether it may, and this module
//!   asks it whether it can.
//!
//! None of them may block a tokio worker while a millisecond is waited for.

pub(crate) mod cpu_counter;
mod kernel;
mod manual;
#[cfg(target_os = "linux")]
mod runtime_timer;
mod system;
mod ticker;

use std::future::Future;
use std::pin::Pin;

#[cfg(target_os = "linux")]
pub(crate) use kernel::read_adjtimex;
pub use kernel::{kernel_discipline, kernel_sync_status};
#[cfg(target_os = "linux")]
pub use kernel::{monotonic_coarse_ns, monotonic_ns};
pub use manual::ManualClock;
pub(crate) use system::system_unix_ns;
pub use system::{SystemClock, system_unix_ms};

pub type WaitFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The kernel's (or a test's) word on whether the wall clock can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncStatus {
    /// Synchronized, with the kernel's estimated error.
    Synchronized { estimated_error_us: i64 },
    /// Not synchronized, or too far off: the reason, for `/healthz`.
    Unsynchronized(String),
    /// The check is switched off (development only).
    NotChecked,
}

impl SyncStatus {
    /// The refusal reason the generator should hold, if any.
    pub fn refusal(&self) -> Option<String> {
        match self {
            SyncStatus::Unsynchronized(reason) => Some(reason.clone()),
            _ => None,
        }
    }
}

pub trait Clock: Send + Sync + 'static {
    /// Wall-clock Unix milliseconds.
    fn unix_ms(&self) -> i64;
    fn sync_status(&self) -> SyncStatus;
    /// Resolves once `unix_ms() >= target`.
    fn wait_until(&self, target_unix_ms: i64) -> WaitFuture<'_>;
    /// What the kernel's clock discipline (chrony, ntpd) reports now, for the clock metrics;
    /// `None` where there is none to read.
    fn discipline(&self) -> Option<Discipline> {
        None
    }
    /// Whether `unix_ms` is the CPU's counter scaled, so that the fast path may check the counter
    /// against a window instead of reading the clock ([`crate::clock::cpu_counter`]).
    fn follows_cpu_counter(&self) -> bool {
        false
    }
}

/// The kernel's view of the clock's quality (`adjtimex`): the offset the discipline is still
/// correcting, signed (a clock ahead is positive), and its estimated error. Exported as gauges so
/// that a clock drifting or jumping either way alarms before it is refused.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Discipline {
    pub offset_seconds: f64,
    pub estimated_error_seconds: f64,
}
