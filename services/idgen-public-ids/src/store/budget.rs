//! The primary's reads by resolves and lookups, held to a budget (`primary_fallback_reads`): at
//! most that many at once in all, so that reads never take the primary's pool from creates,
//! and at most a caller's share of them at once (half the budget, rounded up), so that one
//! caller asking for public IDs that do not exist cannot hold every read while another's
//! genuine resolve of an ID created a moment ago waits. Every read of the primary takes its
//! permits: after the replica missed, after it failed, while it is left alone, and with no
//! replica at all. A read waits for them at most the pool's acquire timeout, then is refused
//! 503 (counted: `idgen_public_primary_fallbacks_total{outcome="refused"}`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget ([module docs](self)).
pub(super) struct PrimaryReads {
    all: Arc<Semaphore>,
    share: u32,
    /// Each caller reading now, with its share; an entry goes when its last read ends.
    callers: Mutex<HashMap<Arc<str>, Arc<Semaphore>>>,
    wait: Duration,
}

/// One read's permits: its caller's and one of all, given back when it is dropped.
pub(super) struct Permit {
    reads: Arc<PrimaryReads>,
    caller: Arc<str>,
    share: Arc<Semaphore>,
    held: Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)>,
}

impl PrimaryReads {
    /// `reads` at once in all (at least one), each waited for at most `wait`.
    pub(super) fn new(reads: u32, wait: Duration) -> Arc<PrimaryReads> {
        let reads = reads.max(1);
        Arc::new(PrimaryReads {
            all: Arc::new(Semaphore::new(reads as usize)),
            share: reads.div_ceil(2),
            callers: Mutex::default(),
            wait,
        })
    }

    /// How many reads one caller may have at once.
    #[cfg(test)]
    fn share(&self) -> u32 {
        self.share
    }

    fn callers(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Arc<Semaphore>>> {
        self.callers.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The permits for one read of the primary by `caller`, or `None` once [`Self::wait`] has
    /// passed without them.
    pub(super) async fn take(self: &Arc<Self>, caller: &str) -> Option<Permit> {
        let (caller, share) = {
            let mut callers = self.callers();
            match callers.get_key_value(caller) {
                Some((name, share)) => (name.clone(), share.clone()),
                None => {
                    let (name, share) = (Arc::<str>::from(caller), Arc::new(Semaphore::new(self.share as usize)));
                    callers.insert(name.clone(), share.clone());
                    (name, share)
                }
            }
        };
        // From here on the permit gives the caller's entry up when dropped, taken or not.
        let mut permit = Permit { reads: self.clone(), caller, share, held: None };
        let until = tokio::time::Instant::now() + self.wait;
        let own = tokio::time::timeout_at(until, permit.share.clone().acquire_owned()).await.ok()?.ok()?;
        permit.held = Some((own, None));
        let one = tokio::time::timeout_at(until, self.all.clone().acquire_owned()).await.ok()?.ok()?;
        permit.held = Some((permit.held.take()?.0, Some(one)));
        Some(permit)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        drop(self.held.take());
        let mut callers = self.reads.callers();
        // The map's and this one's: no other read of this caller holds or waits for its share.
        if Arc::strong_count(&self.share) == 2 {
            callers.remove(&self.caller);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One caller holds at most its share; another still reads beside it; a read waits at most
    /// the wait; and a caller's entry goes with its last read.
    #[tokio::test]
    async fn a_caller_holds_its_share_and_no_more() {
        let reads = PrimaryReads::new(4, Duration::from_millis(50));
        assert_eq!(reads.share(), 2);
        let (first, second) = (reads.take("flood").await.unwrap(), reads.take("flood").await.unwrap());
        assert!(reads.take("flood").await.is_none(), "a third read of one caller at once");
        let other = reads.take("orders").await.expect("another caller reads beside the flood");
        let _more = reads.take("orders").await.unwrap();
        assert!(reads.take("third").await.is_none(), "all four are taken");
        drop((first, other));
        assert!(reads.take("third").await.is_some(), "one given back is taken again");
        drop(second);
        assert!(!reads.callers().contains_key("flood"), "the caller's entry went with its last read");
        assert!(!reads.callers().contains_key("third"));
        assert!(reads.callers().contains_key("orders"));
    }
}
