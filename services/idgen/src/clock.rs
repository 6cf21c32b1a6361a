//! Clocks: the wall clock that goes into IDs and lease times, its synchronization state, and a way
//! to wait for a given millisecond without blocking a tokio worker thread or spinning a core.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{oneshot, watch};

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
}

/// The system clock. Sync is checked through the kernel's NTP state (`adjtimex`) unless switched off.
pub struct SystemClock {
    require_sync: bool,
    max_error_us: i64,
    ticker: OnceLock<Ticker>,
}

impl SystemClock {
    /// `require_sync = false` is for development: the health report says the check is off.
    pub fn new(require_sync: bool, max_error_ms: i64) -> Self {
        SystemClock { require_sync, max_error_us: max_error_ms * 1000, ticker: OnceLock::new() }
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

fn system_unix_ns() -> i128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128)
}

impl Clock for SystemClock {
    fn unix_ms(&self) -> i64 {
        system_unix_ms()
    }

    fn sync_status(&self) -> SyncStatus {
        if !self.require_sync {
            return SyncStatus::NotChecked;
        }
        kernel_sync_status(self.max_error_us)
    }

    fn wait_until(&self, target_unix_ms: i64) -> WaitFuture<'_> {
        let ticker = self.ticker.get_or_init(Ticker::spawn);
        let (tx, rx) = oneshot::channel();
        let sent = ticker.requests.lock().is_ok_and(|requests| requests.send((target_unix_ms, tx)).is_ok());
        Box::pin(async move {
            if sent {
                let _ = rx.await;
            } else {
                // The ticker thread is gone (only at process exit); fall back to the coarse timer.
                let wait = (target_unix_ms as i128 * 1_000_000 - system_unix_ns()).max(0);
                tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
            }
        })
    }
}

/// The kernel's NTP state via `adjtimex(2)` (read-only: `modes = 0`).
#[cfg(target_os = "linux")]
pub fn kernel_sync_status(max_error_us: i64) -> SyncStatus {
    // SAFETY: a zeroed timex with modes = 0 asks adjtimex to read, not change, the state.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut tx) };
    if state == -1 {
        return SyncStatus::Unsynchronized(format!("adjtimex failed: {}", std::io::Error::last_os_error()));
    }
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

#[cfg(not(target_os = "linux"))]
pub fn kernel_sync_status(_max_error_us: i64) -> SyncStatus {
    SyncStatus::Unsynchronized("clock synchronization can only be checked on Linux".into())
}

/// One thread that wakes waiters at millisecond boundaries. It sleeps in the kernel with a 1 µs
/// timer slack, so a waiter wakes within microseconds of its millisecond, and it runs only while
/// somebody is waiting: no tokio worker is blocked and no core spins.
struct Ticker {
    requests: Mutex<mpsc::Sender<(i64, oneshot::Sender<()>)>>,
}

impl Ticker {
    fn spawn() -> Ticker {
        let (tx, rx) = mpsc::channel::<(i64, oneshot::Sender<()>)>();
        let spawned = std::thread::Builder::new().name("idgen-ms-ticker".into()).spawn(move || {
            #[cfg(target_os = "linux")]
            // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64);
            }
            let mut waiters: Vec<(i64, oneshot::Sender<()>)> = Vec::new();
            loop {
                let now_ns = system_unix_ns();
                waiters.retain_mut(|(target, waiter)| (*target as i128) * 1_000_000 > now_ns && !waiter.is_closed());
                // `retain_mut` dropped the due senders, which wakes their receivers with an
                // error: that is the signal. (Dropping is cheaper than sending `()`.) Waiters
                // that gave up (a clock step back made their target far away) go too.
                let next = waiters.iter().map(|(target, _)| *target).min();
                let received = match next {
                    None => rx.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
                    Some(target) => {
                        let wait = (target as i128 * 1_000_000 - now_ns).max(0) as u64;
                        rx.recv_timeout(Duration::from_nanos(wait))
                    }
                };
                match received {
                    Ok(waiter) => waiters.push(waiter),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
        });
        if let Err(error) = spawned {
            tracing::error!(%error, "could not start the millisecond ticker thread; waits use the tokio timer");
        }
        Ticker { requests: Mutex::new(tx) }
    }
}

/// A clock a test moves by hand. Waits resolve when the test advances it far enough.
pub struct ManualClock {
    now: AtomicI64,
    changed: watch::Sender<i64>,
    sync: Mutex<SyncStatus>,
}

impl ManualClock {
    pub fn new(unix_ms: i64) -> Self {
        ManualClock {
            now: AtomicI64::new(unix_ms),
            changed: watch::channel(unix_ms).0,
            sync: Mutex::new(SyncStatus::NotChecked),
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
}

impl Clock for ManualClock {
    fn unix_ms(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }

    fn sync_status(&self) -> SyncStatus {
        self.sync.lock().expect("sync status lock").clone()
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
