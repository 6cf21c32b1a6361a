//! A connection polled again at once when it wakes itself while being polled.
//!
//! hyper's request body is a channel from the connection to the service. When the service takes
//! a chunk from it, the channel wakes the connection (so that it sends the next one), even when the
//! body is complete and its sender already gone. The service runs inside the connection's own
//! poll, so the connection wakes itself: tokio finishes the poll, queues the task again and polls
//! the whole connection a second time, only to find nothing to do. For `POST /v1/ids` with `{}`
//! that second trip through the scheduler cost more than all of the worker's own work (callgrind:
//! 1.8k of 16.4k instructions per request).
//!
//! [`Repoll`] answers such a wake by polling the connection again right away, inside the same
//! task poll, instead of sending it round the scheduler. A wake from anywhere else (the socket
//! became readable, a timer fired) goes to the task's waker as before. The rule of every future
//! is kept: a future that was woken is polled again; only the route is shorter. A connection that
//! keeps waking itself is polled at most [`MAX_POLLS`] times, then yields to the scheduler like any
//! other task, so it cannot starve the others; so does one whose task has used up tokio's
//! cooperative budget (its reads would only answer "not now"). hyper's own yield after 16
//! pipelined requests is a self-wake too: a pipelining client gets at most `MAX_POLLS` × 16
//! requests per task poll.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use atomic_waker::AtomicWaker;

/// Polls of the inner future per poll of [`Repoll`]: the first, and again after self-wakes.
pub const MAX_POLLS: usize = 4;

/// `inner`, polled again at once when it wakes itself during its own poll.
pub struct Repoll<F> {
    inner: Pin<Box<F>>,
    signal: Arc<Signal>,
    /// The waker `inner` sees (one per connection, so that every `will_wake` check holds).
    waker: Waker,
}

/// What the inner future's waker reaches: the flags of the poll in progress, and the task's waker.
struct Signal {
    polling: AtomicBool,
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        // During a poll, the poller sees `woken` when the poll ends and polls again. Otherwise
        // (or if the poll ended in between: then both happen, and one poll is spare) the task is
        // woken. SeqCst on both sides: either this load sees `polling` false or the poller's load
        // of `woken` after clearing `polling` sees true; never neither.
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> Repoll<F> {
    pub fn new(inner: F) -> Self {
        let signal = Arc::new(Signal {
            polling: AtomicBool::new(false),
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        let waker = Waker::from(signal.clone());
        Repoll { inner: Box::pin(inner), signal, waker }
    }
}

impl<F: Future> Future for Repoll<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.signal.task.register(cx.waker());
        let mut inner_cx = Context::from_waker(&this.waker);
        for _ in 0..MAX_POLLS {
            this.signal.woken.store(false, Ordering::SeqCst);
            this.signal.polling.store(true, Ordering::SeqCst);
            let polled = this.inner.as_mut().poll(&mut inner_cx);
            this.signal.polling.store(false, Ordering::SeqCst);
            if polled.is_ready() {
                return polled;
            }
            if !this.signal.woken.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        // Still waking itself: the scheduler polls it again after the other tasks.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts the wakes of the task polling a `Repoll`.
    #[derive(Default)]
    struct TaskWakes(AtomicUsize);

    impl Wake for TaskWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A future that wakes itself during its first `self_wakes` polls, then is ready; it counts
    /// its polls.
    struct WakesItself {
        self_wakes: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for WakesItself {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let polls = self.polls.fetch_add(1, Ordering::SeqCst);
            if polls < self.self_wakes {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }
    }

    fn task() -> (Arc<TaskWakes>, Waker) {
        let wakes = Arc::new(TaskWakes::default());
        let waker = Waker::from(wakes.clone());
        (wakes, waker)
    }

    #[test]
    fn a_self_wake_is_answered_by_polling_again_inside_the_same_poll() {
        let (wakes, waker) = task();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut future = Box::pin(Repoll::new(WakesItself { self_wakes: 1, polls: polls.clone() }));
        assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_ready());
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0, "the task was not sent round the scheduler");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_scheduler_and_is_woken() {
        let (wakes, waker) = task();
        let polls = Arc::new(AtomicUsize::new(0));
        let mut future = Box::pin(Repoll::new(WakesItself { self_wakes: 100, polls: polls.clone() }));
        assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), MAX_POLLS);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "a yield must come with a wake, or the task is lost");
    }

    #[test]
    fn a_wake_after_the_poll_reaches_the_task() {
        // A future that is pending without waking itself, and hands out its waker.
        struct Parked(Arc<std::sync::Mutex<Option<Waker>>>);
        impl Future for Parked {
            type Output = ();
            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                *self.0.lock().unwrap() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
        let (wakes, waker) = task();
        let slot = Arc::new(std::sync::Mutex::new(None));
        let mut future = Box::pin(Repoll::new(Parked(slot.clone())));
        assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        let inner_waker = slot.lock().unwrap().take().unwrap();
        std::thread::spawn(move || inner_waker.wake()).join().unwrap();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "a wake from the outside must wake the task");
        // Polled again, it registers the (possibly new) task waker and wakes reach it again.
        assert!(future.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        slot.lock().unwrap().take().unwrap().wake_by_ref();
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
    }
}
