//! Millisecond waits on a tokio runtime (Linux): a `timerfd` its I/O driver polls.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::system::system_unix_ns;
use super::ticker::{Waiters, is_due};

/// The waits of a clock bound to a tokio runtime: a one-shot `timerfd` (CLOCK_REALTIME, absolute)
/// armed for the earliest waiter's millisecond, registered with the runtime's I/O driver, and a
/// task on that runtime that wakes the waiters whose millisecond has come when it fires. A
/// `timerfd` expiry is an hrtimer without slack, so a waiter wakes within microseconds of its
/// millisecond, as with the ticker thread, but on the thread that polls the driver.
pub(super) struct RuntimeTimer {
    fd: tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    pub(super) state: Mutex<TimerState>,
    /// False once the timer has stopped (its runtime stopped, or the kernel refused to arm it):
    /// waits go to the ticker thread.
    running: std::sync::atomic::AtomicBool,
    /// Notified when the timer stops, so that its task, parked on a timer that may never fire
    /// again, ends.
    stopped: Notify,
}

struct Stopped(Arc<RuntimeTimer>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.stop(&mut self.0.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));
    }
}

pub(super) enum Registered {
    Due,
    Waiting(Pin<Box<OwnedNotified>>),
    Stopped,
}

pub(super) struct TimerState {
    waiters: Waiters,
    /// The millisecond the timer is armed for (`i64::MAX`: not armed, or its task is about to
    /// look at the waiters and arm it again).
    armed: i64,
}

impl RuntimeTimer {
    pub(super) fn start() -> std::io::Result<Arc<RuntimeTimer>> {
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

    pub(super) fn running(&self) -> bool {
        self.running.load(Ordering::Acquire)
    }

    /// A wait for `target_unix_ms`: already due, registered, or refused because the timer has
    /// stopped (checked under the lock its task stops under, so no waiter is left behind).
    pub(super) fn register(&self, target_unix_ms: i64) -> Registered {
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
    pub(super) fn stop(&self, state: &mut TimerState) {
        self.running.store(false, Ordering::Release);
        // A permit: the task sees it at its next wait if it is not waiting now.
        self.stopped.notify_one();
        std::mem::take(&mut state.waiters).0.values().for_each(|notify| notify.notify_waiters());
    }

    /// Arms the timer for the start of `unix_ms` (under the state lock).
    pub(super) fn arm(&self, state: &mut TimerState, unix_ms: i64) {
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
