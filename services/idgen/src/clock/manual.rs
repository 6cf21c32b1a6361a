//! [`ManualClock`]: a clock a test moves by hand, steps back included.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};

use tokio::sync::watch;

use super::{Clock, Discipline, SyncStatus, WaitFuture};

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
