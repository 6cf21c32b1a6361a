//! The process's runtime for every handle, and the fork guard.
//!
//! A binding's host (a Python interpreter, Node.js) has no tokio runtime, so the handles share
//! one of their own: two worker threads, started on the first handle. A host that forks copies
//! the memory of that runtime but none of its threads, so a child never uses its parent's: a
//! `pthread_atfork` handler counts forks in the child, a runtime (and a handle) belongs to the
//! fork generation it was made in, and the child's first handle starts a runtime of its own.
//! The parent's runtime in the child is leaked, never dropped: dropping it would wait for
//! threads that do not exist there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};

use tokio::runtime::Runtime;

use crate::Error;

static FORKS: AtomicU64 = AtomicU64::new(0);
static WATCH_FORKS: Once = Once::new();
static RUNTIME: Mutex<Option<(u64, Arc<Runtime>)>> = Mutex::new(None);

extern "C" fn after_fork_in_child() {
    // Async-signal-safe: one atomic add.
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// How many times this process's ancestry forked since this library was first used: a handle
/// made at one generation refuses to work at another.
pub fn generation() -> u64 {
    WATCH_FORKS.call_once(|| {
        // SAFETY: registers a handler that only adds to an atomic; no other argument is used.
        let registered = unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        assert_eq!(registered, 0, "pthread_atfork failed: fork detection is required");
    });
    FORKS.load(Ordering::SeqCst)
}

/// Whether this process is still the generation `started` (no fork since).
#[inline]
pub fn unforked(started: u64) -> bool {
    FORKS.load(Ordering::Relaxed) == started
}

/// The runtime of this fork generation, started on first use.
pub(crate) fn get() -> Result<(u64, Arc<Runtime>), Error> {
    let generation = generation();
    let mut slot = RUNTIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((made_in, runtime)) = slot.as_ref() {
        if *made_in == generation {
            return Ok((generation, runtime.clone()));
        }
        // The parent's, copied by fork: its threads are gone.
        std::mem::forget(slot.take());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("idgen-sdk")
        .enable_all()
        .build()
        .map_err(|e| Error::Failed(format!("starting idgen's runtime threads: {e}")))?;
    let runtime = Arc::new(runtime);
    *slot = Some((generation, runtime.clone()));
    Ok((generation, runtime))
}

/// Runs `call` on the runtime's blocking threads: the SDK's own, never the host's (libuv's
/// pool, an event loop's executor). For a binding whose host must not wait, which settles its
/// promise from `call`. The calls of a handle (`Held::block_on`) may wait there.
pub fn spawn_waiting(call: impl FnOnce() + Send + 'static) -> Result<(), Error> {
    let (_, runtime) = get()?;
    drop(runtime.spawn_blocking(call));
    Ok(())
}

/// A handle's hold on its runtime: released normally in the process that made it, leaked in a
/// forked child.
pub(crate) struct Held {
    pub(crate) generation: u64,
    runtime: Option<Arc<Runtime>>,
}

impl Held {
    pub(crate) fn new() -> Result<Self, Error> {
        let (generation, runtime) = get()?;
        Ok(Held { generation, runtime: Some(runtime) })
    }

    pub(crate) fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("held until dropped")
    }

    /// Runs `future` to completion on the runtime, blocking this thread; refused in a forked
    /// child.
    pub(crate) fn block_on<F: std::future::Future>(&self, future: F) -> Result<F::Output, Error> {
        if !unforked(self.generation) {
            return Err(Error::forked());
        }
        Ok(self.runtime().block_on(future))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !unforked(self.generation) {
            std::mem::forget(self.runtime.take());
        }
    }
}
