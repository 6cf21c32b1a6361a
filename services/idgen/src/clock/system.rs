//! [`SystemClock`]: the wall clock in service, its sync gate (the kernel's, unless switched off)
//! and its millisecond waits (the ticker thread, or a timer in the runtime it was bound to); and
//! the system time everything else records.

#[cfg(target_os = "linux")]
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::kernel::{kernel_discipline, kernel_sync_status};
#[cfg(target_os = "linux")]
use super::runtime_timer::{Registered, RuntimeTimer};
use super::ticker::{Ticker, is_due};
use super::{Clock, Discipline, SyncStatus, WaitFuture};

/// The system clock. Sync is checked through the kernel's NTP state (`adjtimex`) unless switched off.
pub struct SystemClock {
    require_sync: bool,
    max_error_us: i64,
    ticker: OnceLock<Option<&'static Ticker>>,
    cpu_counter: bool,
    /// Waits kept by a timer in the tokio runtime the clock was bound to, if it was.
    #[cfg(target_os = "linux")]
    runtime_timer: Option<Arc<RuntimeTimer>>,
}

impl SystemClock {
    /// `require_sync = false` is for development: the health report says the check is off.
    pub fn new(require_sync: bool, max_error_ms: i64) -> Self {
        SystemClock {
            require_sync,
            max_error_us: max_error_ms * 1000,
            ticker: OnceLock::new(),
            cpu_counter: true,
            #[cfg(target_os = "linux")]
            runtime_timer: None,
        }
    }

    /// Millisecond waits kept by a timer in the current tokio runtime (a `timerfd` its I/O driver
    /// polls, and a task there that wakes the waiters) instead of the ticker thread: the thread
    /// that was going to sleep in the driver anyway wakes at the millisecond, where the ticker
    /// thread's wake and its cross-thread wake of the runtime would be two context switches more
    /// for every millisecond a request waits (a batch at the cap waits in nearly every one).
    /// For a process whose one runtime lives as long as the clock and is always driven (the
    /// worker's): waits end only when that runtime polls its driver. Called outside a runtime, or
    /// where the timer cannot be made, the ticker thread keeps the waits (and says so); inside a
    /// runtime built without I/O it panics, as tokio's `AsyncFd` does. Should the runtime stop,
    /// waits under way and later ones go to the ticker thread.
    pub fn with_waits_on_this_runtime(mut self) -> Self {
        #[cfg(target_os = "linux")]
        match RuntimeTimer::start() {
            Ok(timer) => self.runtime_timer = Some(timer),
            Err(error) => tracing::warn!(%error, "millisecond waits stay on the ticker thread"),
        }
        self
    }

    /// Whether waits are kept by the runtime's timer ([`SystemClock::with_waits_on_this_runtime`]).
    pub fn waits_on_a_runtime(&self) -> bool {
        #[cfg(target_os = "linux")]
        return self.runtime_timer.as_ref().is_some_and(|timer| timer.running());
        #[cfg(not(target_os = "linux"))]
        false
    }

    /// `false`: the fast path reads the clock for every ID even where the clock is kept on the
    /// CPU's counter (`clock.cpu_counter = false`).
    pub fn with_cpu_counter(mut self, allowed: bool) -> Self {
        self.cpu_counter = allowed;
        self
    }

    pub fn requires_sync(&self) -> bool {
        self.require_sync
    }
}

/// The system clock's Unix milliseconds, for timestamps that are only recorded (audit rows,
/// creation times, CLI reports); IDs take their time from a [`Clock`].
pub fn system_unix_ms() -> i64 {
    // Read on every request: the realtime clock straight from the vDSO, then seconds and
    // milliseconds, without `SystemTime`'s checked subtraction or a 128-bit division.
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes into the timespec we own; CLOCK_REALTIME always exists.
        unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
        ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
    }
    #[cfg(not(target_os = "linux"))]
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64 * 1000 + i64::from(d.subsec_millis()))
}

/// The system clock's Unix nanoseconds (0 before 1970).
pub(crate) fn system_unix_ns() -> i128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

impl Clock for SystemClock {
    fn unix_ms(&self) -> i64 {
        system_unix_ms()
    }

    fn discipline(&self) -> Option<Discipline> {
        kernel_discipline()
    }

    fn follows_cpu_counter(&self) -> bool {
        self.cpu_counter && crate::clock::cpu_counter::usable()
    }

    fn sync_status(&self) -> SyncStatus {
        if !self.require_sync {
            return SyncStatus::NotChecked;
        }
        kernel_sync_status(self.max_error_us)
    }

    fn wait_until(&self, target_unix_ms: i64) -> WaitFuture<'_> {
        #[cfg(target_os = "linux")]
        if let Some(timer) = self.runtime_timer.as_ref() {
            let notified = match timer.register(target_unix_ms) {
                Registered::Due => return Box::pin(std::future::ready(())),
                Registered::Waiting(notified) => notified,
                Registered::Stopped => return self.wait_on_the_ticker(target_unix_ms),
            };
            return Box::pin(async move {
                notified.await;
                // Woken before the millisecond only when the runtime's timer stopped: the rest of
                // the wait on the ticker thread.
                if !is_due(target_unix_ms) {
                    self.wait_on_the_ticker(target_unix_ms).await;
                }
            });
        }
        self.wait_on_the_ticker(target_unix_ms)
    }
}

/// A clock bound to a runtime ends its timer's task when it goes (an embedded generator started
/// again in the same runtime leaves no task or descriptor behind): the timer is stopped and
/// fired at once, so the task wakes and sees it.
#[cfg(target_os = "linux")]
impl Drop for SystemClock {
    fn drop(&mut self) {
        if let Some(timer) = &self.runtime_timer {
            let mut state = timer.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            timer.stop(&mut state);
            // Any millisecond already past fires at once (zero would disarm it instead).
            timer.arm(&mut state, 1);
        }
    }
}

impl SystemClock {
    fn wait_on_the_ticker(&self, target_unix_ms: i64) -> WaitFuture<'_> {
        match self.ticker.get_or_init(Ticker::spawn).and_then(|ticker| ticker.register(target_unix_ms)) {
            Some(notified) => notified,
            None => Box::pin(async move {
                // Already due, or the ticker thread could not start: the coarse timer.
                let wait = (target_unix_ms as i128 * 1_000_000 - system_unix_ns()).max(0);
                tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn system_clock_waits_for_the_millisecond() {
        let clock = SystemClock::new(false, 5);
        for _ in 0..20 {
            let target = clock.unix_ms() + 2;
            clock.wait_until(target).await;
            assert!(clock.unix_ms() >= target);
        }
        assert_eq!(clock.sync_status(), SyncStatus::NotChecked);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_for_one_millisecond_share_a_wake_and_an_earlier_one_is_not_held_back() {
        for clock in both_system_clocks() {
            one_late_millisecond_and_an_earlier_one(clock).await;
        }
    }

    async fn one_late_millisecond_and_an_earlier_one(clock: std::sync::Arc<SystemClock>) {
        let now = clock.unix_ms();
        let late = now + 1_500;
        let waiters: Vec<_> = (0..16)
            .map(|_| {
                let clock = clock.clone();
                tokio::spawn(async move {
                    clock.wait_until(late).await;
                    clock.unix_ms()
                })
            })
            .collect();
        tokio::task::yield_now().await;
        // The ticker now sleeps until `late`; a waiter for an earlier millisecond wakes it.
        clock.wait_until(now + 20).await;
        assert!(clock.unix_ms() < late, "the early waiter was held back to the late one's millisecond");
        for waiter in waiters {
            assert!(waiter.await.unwrap() >= late, "woken before its millisecond");
        }
    }

    /// Tasks that wait for one millisecond after another, as batches at the cap do, registering
    /// their next wait the moment they are woken: none is lost, none wakes early.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_that_register_again_as_soon_as_they_are_woken_are_never_lost() {
        for clock in both_system_clocks() {
            waiters_registering_again(clock).await;
        }
    }

    async fn waiters_registering_again(clock: std::sync::Arc<SystemClock>) {
        let tasks: Vec<_> = (0..8)
            .map(|task| {
                let clock = clock.clone();
                tokio::spawn(async move {
                    for round in 0..150 {
                        let target = clock.unix_ms() + 1 + (task + round) % 3;
                        clock.wait_until(target).await;
                        assert!(clock.unix_ms() >= target, "woken before {target}");
                    }
                })
            })
            .collect();
        for task in tasks {
            tokio::time::timeout(std::time::Duration::from_secs(20), task)
                .await
                .expect("a waiter was never woken")
                .unwrap();
        }
    }

    /// Each way a system clock keeps its waits: the ticker thread, and a timer in the runtime
    /// (made here, so inside the test's runtime).
    fn both_system_clocks() -> [std::sync::Arc<SystemClock>; 2] {
        let on_runtime = SystemClock::new(false, 5).with_waits_on_this_runtime();
        assert!(on_runtime.waits_on_a_runtime(), "no timer in the runtime");
        [std::sync::Arc::new(SystemClock::new(false, 5)), std::sync::Arc::new(on_runtime)]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waits_end_in_their_millisecond_on_the_ticker_and_on_the_runtime_timer() {
        for clock in both_system_clocks() {
            for _ in 0..50 {
                let target = clock.unix_ms() + 1 + clock.unix_ms() % 3;
                clock.wait_until(target).await;
                let woke = clock.unix_ms();
                assert!(woke >= target, "woken at {woke}, before {target}");
            }
            // Already due: at once.
            clock.wait_until(clock.unix_ms() - 1).await;
        }
    }

    /// The runtime a clock's timer lives in stops while a task on another runtime waits: the
    /// wait still ends in its millisecond, not before, and later waits go to the ticker thread.
    #[test]
    fn a_wait_outlives_the_runtime_its_timer_was_in() {
        let first = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        a_wait_outliving(first);
        // On a runtime of one thread that is only driven in `block_on`, the timer's task never
        // ran before the runtime went: it must stop all the same.
        a_wait_outliving(tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap());
    }

    fn a_wait_outliving(first: tokio::runtime::Runtime) {
        let clock =
            std::sync::Arc::new(first.block_on(async { SystemClock::new(false, 5).with_waits_on_this_runtime() }));
        assert!(clock.waits_on_a_runtime());
        let second = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let target = clock.unix_ms() + 300;
        let waiter = {
            let clock = clock.clone();
            second.spawn(async move {
                clock.wait_until(target).await;
                clock.unix_ms()
            })
        };
        second.block_on(async { tokio::time::sleep(Duration::from_millis(20)).await });
        drop(first);
        let woke =
            second.block_on(async { tokio::time::timeout(Duration::from_secs(10), waiter).await }).unwrap().unwrap();
        assert!(woke >= target, "woken at {woke}, before {target}");
        assert!(!clock.waits_on_a_runtime());
        second.block_on(async {
            let target = clock.unix_ms() + 3;
            clock.wait_until(target).await;
            assert!(clock.unix_ms() >= target);
        });
    }

    /// The kernel refuses to arm the timer: waits go to the ticker thread, and the timer's task,
    /// parked on a timer that will now never fire, ends rather than staying behind for good.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_timer_that_cannot_be_armed_ends_its_task() {
        let clock = SystemClock::new(false, 5).with_waits_on_this_runtime();
        let timer = clock.runtime_timer.clone().expect("no timer in the runtime");
        let target = clock.unix_ms() + 2;
        clock.wait_until(target).await;
        // Held by the clock, its task (parked on the timer by now) and this test.
        assert_eq!(Arc::strong_count(&timer), 3);
        // A time before 1970: timerfd_settime answers EINVAL.
        timer.arm(&mut timer.state.lock().unwrap(), -5_000);
        assert!(!clock.waits_on_a_runtime());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&timer) > 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the timer's task is still waiting on a timer that cannot fire"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let target = clock.unix_ms() + 3;
        clock.wait_until(target).await;
        assert!(clock.unix_ms() >= target);
    }
}
