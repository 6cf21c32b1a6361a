//! The clock: it owns every reading of time a generator makes (the system and manual clocks, the
//! kernel's synchronization gate, the CPU counter's window) and never issues an ID or touches a
//! lease.
//!
//! Clocks: the wall clock that goes into IDs and lease times, its synchronization state, and a way
//! to wait for a given millisecond without blocking a tokio worker thread or spinning a core. The
//! CPU counter ([`cpu_counter`]) lets the fast path check a window instead of reading the clock;
//! it asks this module's clock whether it may, and this module asks it whether it can.

pub(crate) mod cpu_counter;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::futures::OwnedNotified;
use tokio::sync::{Notify, watch};

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

/// The kernel's clock discipline as `adjtimex(2)` reads it (`modes = 0`: read, never change):
/// the clock state it returns and the `timex` it filled.
#[cfg(target_os = "linux")]
pub(crate) fn read_adjtimex() -> std::io::Result<(i32, libc::timex)> {
    // SAFETY: a zeroed timex with modes = 0 asks adjtimex to read, not change, the state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == -1 { Err(std::io::Error::last_os_error()) } else { Ok((state, tx)) }
}

/// The kernel's NTP state via `adjtimex(2)` (read-only: `modes = 0`).
#[cfg(target_os = "linux")]
pub fn kernel_sync_status(max_error_us: i64) -> SyncStatus {
    let (state, tx) = match read_adjtimex() {
        Ok(read) => read,
        Err(error) => return SyncStatus::Unsynchronized(format!("adjtimex failed: {error}")),
    };
    if state == libc::TIME_ERROR || tx.status & libc::STA_UNSYNC != 0 {
        return SyncStatus::Unsynchronized("kernel reports the clock unsynchronized (STA_UNSYNC/TIME_ERROR)".into());
    }
    let estimated_error_us = tx.esterror;
    if estimated_error_us > max_error_us {
        return SyncStatus::Unsynchronized(format!(
            "estimated clock error {} µs exceeds the {} µs limit",
            estimated_error_us, max_error_us
        ));
    }
    SyncStatus::Synchronized { estimated_error_us }
}

/// The kernel's offset and estimated error via `adjtimex(2)` (read-only); `None` if it fails.
#[cfg(target_os = "linux")]
pub fn kernel_discipline() -> Option<Discipline> {
    let (_, tx) = read_adjtimex().ok()?;
    // The offset is in microseconds, or nanoseconds when the kernel says STA_NANO.
    let offset_unit = if tx.status & libc::STA_NANO != 0 { 1e-9 } else { 1e-6 };
    Some(Discipline {
        offset_seconds: tx.offset as f64 * offset_unit,
        estimated_error_seconds: tx.esterror as f64 * 1e-6,
    })
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_discipline() -> Option<Discipline> {
    None
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_sync_status(_max_error_us: i64) -> SyncStatus {
    SyncStatus::Unsynchronized("clock synchronization can only be checked on Linux".into())
}

/// Whether the millisecond `target_unix_ms` has begun on the system clock.
fn is_due(target_unix_ms: i64) -> bool {
    target_unix_ms as i128 * 1_000_000 <= system_unix_ns()
}

/// Waiters by the millisecond they wait for, one `Notify` for each millisecond: what the ticker
/// thread and a runtime's timer both keep under their lock.
#[derive(Default)]
struct Waiters(BTreeMap<i64, Arc<Notify>>);

impl Waiters {
    /// A wait for `target_unix_ms`, registered before the caller lets go of its lock, so a
    /// `notify_waiters` after that cannot miss it.
    fn add(&mut self, target_unix_ms: i64) -> Pin<Box<OwnedNotified>> {
        let notify = self.0.entry(target_unix_ms).or_insert_with(|| Arc::new(Notify::new())).clone();
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        notified
    }

    /// Moves the waiters whose millisecond has begun by `now_ns` to `due`, to be woken once the
    /// lock is let go.
    fn take_due(&mut self, now_ns: i128, due: &mut Vec<Arc<Notify>>) {
        while let Some(entry) = self.0.first_entry() {
            if (*entry.key() as i128) * 1_000_000 > now_ns {
                break;
            }
            due.push(entry.remove());
        }
    }

    /// The earliest millisecond waited for.
    fn first(&self) -> Option<i64> {
        self.0.keys().next().copied()
    }
}

/// One thread that wakes waiters at millisecond boundaries. It sleeps in the kernel with a 1 µs
/// timer slack, so a waiter wakes within microseconds of its millisecond; no tokio worker is
/// blocked and no core spins. Waiters for one millisecond share one wake-up (a batch of requests
/// at the sequence cap all wait for the same next millisecond), and the thread is woken only
/// when a waiter needs it earlier than it already sleeps: at the cap it keeps sleeping from one
/// millisecond boundary to the next for a few idle milliseconds, so the next waiters find it
/// already on its way.
struct Ticker {
    state: Mutex<TickerState>,
    wake: Condvar,
}

struct TickerState {
    waiters: Waiters,
    /// The millisecond the thread sleeps until (`i64::MAX`: until woken).
    sleeping_until: i64,
}

/// Idle millisecond boundaries the thread still wakes on before it sleeps until woken.
const LINGER_MS: u32 = 20;

impl Ticker {
    /// The ticker thread, started once per process (leaked: it lives as long as the process).
    fn spawn() -> Option<&'static Ticker> {
        let ticker: &'static Ticker = Box::leak(Box::new(Ticker {
            state: Mutex::new(TickerState { waiters: Waiters::default(), sleeping_until: i64::MAX }),
            wake: Condvar::new(),
        }));
        match std::thread::Builder::new().name("idgen-ms-ticker".into()).spawn(move || ticker.run()) {
            Ok(_) => Some(ticker),
            Err(error) => {
                tracing::error!(%error, "could not start the millisecond ticker thread; waits use the tokio timer");
                None
            }
        }
    }

    /// A future that resolves at `target_unix_ms`; `None` if that is already past.
    fn register(&self, target_unix_ms: i64) -> Option<Pin<Box<OwnedNotified>>> {
        if is_due(target_unix_ms) {
            return None;
        }
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let notified = state.waiters.add(target_unix_ms);
        if target_unix_ms < state.sleeping_until {
            state.sleeping_until = target_unix_ms;
            self.wake.notify_one();
        }
        Some(notified)
    }

    fn run(&self) {
        #[cfg(target_os = "linux")]
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64);
        }
        let mut idle = 0;
        let mut due = Vec::new();
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        loop {
            let now_ns = system_unix_ns();
            state.waiters.take_due(now_ns, &mut due);
            if !due.is_empty() {
                // Woken outside the lock: a woken task often registers its next wait at once (a
                // batch at the cap), and on a busy core it runs before this thread has let go, so
                // it waited on the lock's futex (6% of a worker's samples at the cap). A waiter
                // that registers meanwhile finds its millisecond already due (and does not wait)
                // or a new entry, which this thread sees when it looks again under the lock, so
                // until then it is marked awake: no one need wake it.
                state.sleeping_until = i64::MIN;
                drop(state);
                due.drain(..).for_each(|notify| notify.notify_waiters());
                state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                continue;
            }
            let until = match state.waiters.first() {
                Some(target) => {
                    idle = 0;
                    target
                }
                None if idle < LINGER_MS => {
                    idle += 1;
                    (now_ns / 1_000_000) as i64 + 1
                }
                None => i64::MAX,
            };
            state.sleeping_until = until;
            state = if until == i64::MAX {
                self.wake.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner())
            } else {
                let wait = Duration::from_nanos((until as i128 * 1_000_000 - now_ns).max(0) as u64);
                self.wake.wait_timeout(state, wait).unwrap_or_else(|poisoned| poisoned.into_inner()).0
            };
        }
    }
}

/// The waits of a clock bound to a tokio runtime: a one-shot `timerfd` (CLOCK_REALTIME, absolute)
/// armed for the earliest waiter's millisecond, registered with the runtime's I/O driver, and a
/// task on that runtime that wakes the waiters whose millisecond has come when it fires. A
/// `timerfd` expiry is an hrtimer without slack, so a waiter wakes within microseconds of its
/// millisecond, as with the ticker thread, but on the thread that polls the driver.
#[cfg(target_os = "linux")]
struct RuntimeTimer {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    state: Mutex<TimerState>,
    /// False once the timer has stopped (its runtime stopped, or the kernel refused to arm it):
    /// waits go to the ticker thread.
    running: std::sync::atomic::AtomicBool,
    /// Notified when the timer stops, so that its task, parked on a timer that may never fire
    /// again, ends.
    stopped: Notify,
}

#[cfg(target_os = "linux")]
struct Stopped(Arc<RuntimeTimer>);

#[cfg(target_os = "linux")]
impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.stop(&mut self.0.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    }
}

#[cfg(target_os = "linux")]
enum Registered {
    Due,
    Waiting(Pin<Box<OwnedNotified>>),
    Stopped,
}

#[cfg(target_os = "linux")]
struct TimerState {
    waiters: Waiters,
    /// The millisecond the timer is armed for (`i64::MAX`: not armed, or its task is about to
    /// look at the waiters and arm it again).
    armed: i64,
}

#[cfg(target_os = "linux")]
impl RuntimeTimer {
    fn start() -> std::io::Result<Arc<RuntimeTimer>> {
        use std::os::fd::FromRawFd;
        let handle = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        // SAFETY: timerfd_create has no preconditions; a non-negative return is a new fd we own.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_REALTIME, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new, open fd that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let _entered = handle.enter();
        // SAFETY: the `OwnedFd` holds an open timerfd, stays open while the `AsyncFd` owns it and
        // always answers the same descriptor.
        let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)? };
        let timer = Arc::new(RuntimeTimer {
            fd,
            state: Mutex::new(TimerState { waiters: Waiters::default(), armed: i64::MAX }),
            running: std::sync::atomic::AtomicBool::new(true),
            stopped: Notify::new(),
        });
        handle.spawn(RuntimeTimer::run(Stopped(timer.clone())));
        Ok(timer)
    }

    fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// A wait for `target_unix_ms`: already due, registered, or refused because the timer has
    /// stopped (checked under the lock its task stops under, so no waiter is left behind).
    fn register(&self, target_unix_ms: i64) -> Registered {
        if is_due(target_unix_ms) {
            return Registered::Due;
        }
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !self.running() {
            return Registered::Stopped;
        }
        let notified = state.waiters.add(target_unix_ms);
        if target_unix_ms < state.armed {
            state.armed = target_unix_ms;
            self.arm(&mut state, target_unix_ms);
        }
        Registered::Waiting(notified)
    }

    /// Marks the timer stopped, ends its task and wakes every waiter, which then waits out the
    /// rest on the ticker thread (under the state lock, so no one registers after).
    fn stop(&self, state: &mut TimerState) {
        self.running.store(false, Ordering::Release);
        // A permit: the task sees it at its next wait if it is not waiting now.
        self.stopped.notify_one();
        std::mem::take(&mut state.waiters).0.values().for_each(|notify| notify.notify_waiters());
    }

    /// Arms the timer for the start of `unix_ms` (under the state lock).
    fn arm(&self, state: &mut TimerState, unix_ms: i64) {
        use std::os::fd::AsRawFd;
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: unix_ms.div_euclid(1000) as libc::time_t,
                tv_nsec: (unix_ms.rem_euclid(1000) * 1_000_000) as libc::c_long,
            },
        };
        // SAFETY: the fd is our open timerfd and `spec` outlives the call.
        let armed =
            unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) };
        if armed != 0 {
            tracing::error!(error = %std::io::Error::last_os_error(), "could not arm the millisecond timer; waits go to the ticker thread");
            self.stop(state);
        }
    }

    /// The task: `stopped` owns the timer and, dropped however the task ends (also unpolled,
    /// when its runtime shuts down before it ran), marks it stopped and wakes every waiter, so
    /// that no wait is left for a timer no one polls.
    async fn run(stopped: Stopped) {
        let this = &*stopped.0;
        let mut due = Vec::new();
        // One registration for the task's life, not one per expiry.
        let stop = this.stopped.notified();
        tokio::pin!(stop);
        while this.running() {
            let ready = tokio::select! {
                biased;
                () = &mut stop => return,
                ready = this.fd.readable() => ready,
            };
            let Ok(mut ready) = ready else { return };
            let mut expirations = [0u8; 8];
            // Nothing to read: woken for nothing, look again.
            match ready.try_io(|fd| {
                use std::os::fd::AsRawFd;
                // SAFETY: reads at most 8 bytes into the buffer we own from our open timerfd.
                let read = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), 8) };
                if read < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
            }) {
                // Read: the expiration is consumed, so the next poll waits for the next edge
                // (an expiry after the read is a new one, which the driver reports again).
                Ok(Ok(())) => ready.clear_ready(),
                Ok(Err(error)) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                Ok(Err(error)) => {
                    tracing::error!(%error, "the millisecond timer failed; waits go to the ticker thread");
                    return;
                }
                Err(_would_block) => continue,
            }
            let now_ns = system_unix_ns();
            {
                let mut state = this.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                state.waiters.take_due(now_ns, &mut due);
                state.armed = i64::MAX;
                if let Some(next) = state.waiters.first() {
                    state.armed = next;
                    this.arm(&mut state, next);
                }
            }
            due.drain(..).for_each(|notify| notify.notify_waiters());
        }
    }
}

/// A clock a test moves by hand. Waits resolve when the test advances it far enough.
pub struct ManualClock {
    now: AtomicI64,
    changed: watch::Sender<i64>,
    sync: Mutex<SyncStatus>,
    discipline: Mutex<Option<Discipline>>,
}

impl ManualClock {
    pub fn new(unix_ms: i64) -> Self {
        ManualClock {
            now: AtomicI64::new(unix_ms),
            changed: watch::channel(unix_ms).0,
            sync: Mutex::new(SyncStatus::NotChecked),
            discipline: Mutex::new(None),
        }
    }

    /// Sets the wall clock, forwards or backwards (a step).
    pub fn set(&self, unix_ms: i64) {
        self.now.store(unix_ms, Ordering::SeqCst);
        self.changed.send_replace(unix_ms);
    }

    pub fn advance(&self, ms: i64) {
        self.set(self.unix_ms() + ms);
    }

    pub fn set_sync_status(&self, status: SyncStatus) {
        *self.sync.lock().expect("sync status lock") = status;
    }

    /// What [`Clock::discipline`] reports from now on.
    pub fn set_discipline(&self, discipline: Option<Discipline>) {
        *self.discipline.lock().expect("discipline lock") = discipline;
    }
}

impl Clock for ManualClock {
    fn unix_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sync_status(&self) -> SyncStatus {
        self.sync.lock().expect("sync status lock").clone()
    }

    fn discipline(&self) -> Option<Discipline> {
        *self.discipline.lock().expect("discipline lock")
    }

    fn wait_until(&self, target_unix_ms: i64) -> WaitFuture<'_> {
        let mut rx = self.changed.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|now| *now >= target_unix_ms).await;
        })
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

    #[tokio::test]
    async fn manual_clock_wait_resolves_on_advance() {
        let clock = std::sync::Arc::new(ManualClock::new(1000));
        let waiter = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.wait_until(1005).await })
        };
        tokio::task::yield_now().await;
        clock.advance(4);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        clock.advance(1);
        waiter.await.unwrap();
    }
}
