//! Millisecond waits on one thread of the process's own (the ticker), and the waiters' list it
//! shares with a runtime's timer.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::system::system_unix_ns;

/// Whether the millisecond `target_unix_ms` has begun on the system clock.
pub(super) fn is_due(target_unix_ms: i64) -> bool {
    target_unix_ms as i128 * 1_000_000 <= system_unix_ns()
}

/// Waiters by the millisecond they wait for, one `Notify` for each millisecond: what the ticker
/// thread and a runtime's timer both keep under their lock.
#[derive(Default)]
pub(super) struct Waiters(pub(super) BTreeMap<i64, Arc<Notify>>);

impl Waiters {
    /// A wait for `target_unix_ms`, registered before the caller lets go of its lock, so a
    /// `notify_waiters` after that cannot miss it.
    pub(super) fn add(&mut self, target_unix_ms: i64) -> Pin<Box<OwnedNotified>> {
        let notify = self.0.entry(target_unix_ms).or_insert_with(|| Arc::new(Notify::new())).clone();
        let mut notified = Box::pin(notify.notified_owned());
        notified.as_mut().enable();
        notified
    }

    /// Moves the waiters whose millisecond has begun by `now_ns` to `due`, to be woken once the
    /// lock is let go.
    pub(super) fn take_due(&mut self, now_ns: i128, due: &mut Vec<Arc<Notify>>) {
        while let Some(entry) = self.0.first_entry() {
            if (*entry.key() as i128) * 1_000_000 > now_ns {
                break;
            }
            due.push(entry.remove());
        }
    }

    /// The earliest millisecond waited for.
    pub(super) fn first(&self) -> Option<i64> {
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
pub(super) struct Ticker {
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
    pub(super) fn spawn() -> Option<&'static Ticker> {
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
    pub(super) fn register(&self, target_unix_ms: i64) -> Option<Pin<Box<OwnedNotified>>> {
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
