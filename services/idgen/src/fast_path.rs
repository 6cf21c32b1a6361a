//! The lock-free fast path of the request path: a run of IDs the core has already issued, handed
//! out by one atomic add.
//!
//! When a request finds no usable run, it takes the core's lock and has the core issue *every*
//! sequence left in the current millisecond (every rule checked for that millisecond: clock sync,
//! step back, horizon, layout, lease, fence). It keeps what it needs and publishes the rest here.
//! Further requests in the same millisecond take theirs with one `fetch_add` on [`Runs::ticket`]
//! and no lock. What is never handed out is a gap, which IDs may have.
//!
//! Why this cannot hand out an ID twice or out of order:
//! - the core issued the whole run, so every ID in it is unique and above every ID issued before;
//! - offsets come from one atomic counter, so no two requests get the same offset of a run;
//! - the ticket names its run (a generation), and a run is read consistently (a sequence lock on
//!   its slot), so an offset is only ever added to the `first` of the run it was counted in;
//! - a run is used only in its own millisecond (`unix_ms == now`, or, where the clock is kept on
//!   the CPU's counter, the counter inside the run's window in that millisecond:
//!   [`crate::cpu_counter`]): the core never issues a millisecond twice, so a millisecond names at
//!   most one run, ever;
//! - whoever changes what the core may issue (a lost lease, a release, an unsynchronized clock, a
//!   retired region, a new schedule) closes the run under the core's lock first. A request that
//!   took its offset just before still issues an ID of a millisecond the core had checked, which
//!   is why the fence and the release rule hold for it (SPEC §2: the successor starts above the
//!   stored expiry, and the release writes the last issued millisecond + 1).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering, fence};

use crate::cpu_counter::Window;

/// Bits of the ticket that count offsets within a run; the rest name the run.
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// How many runs' slots exist: a request holding an old ticket finds its slot reused (and the
/// generation changed) rather than a half-written one.
const SLOTS: usize = 4;
/// A slot's tag while its run is being written.
const WRITING: u64 = u64::MAX;

#[derive(Default)]
struct Slot {
    /// The run's generation (its ticket's upper bits), or [`WRITING`].
    tag: AtomicU64,
    unix_ms: AtomicI64,
    first: AtomicU64,
    count: AtomicU64,
    /// The CPU counter's values in which the clock is still in `unix_ms` (empty for none).
    window_start: AtomicU64,
    window_end: AtomicU64,
}

/// The current run and the slots of the last few. At first, generation 0's slot says count 0: the
/// first request takes the lock. A used-up run still counts offsets (requests that find it used
/// up add theirs), but they are not counted as issued: a run hands out at most its `count`.
#[derive(Default)]
pub(crate) struct Runs {
    /// `generation << OFFSET_BITS | next offset`. The one contended cache line of the fast path:
    /// every request writes it, so nothing else is read from it.
    ticket: Padded<AtomicU64>,
    /// The generation of the current run, written once per publish: a line every core keeps a
    /// shared copy of, so a request checks which run is current without touching `ticket`.
    current: Padded<AtomicU64>,
    slots: [Slot; SLOTS],
}

#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

/// One run as read from its slot.
struct Run {
    unix_ms: i64,
    first: u64,
    count: u64,
    window: Window,
}

impl Run {
    /// The IDs at `offset` (counted for this run) and after, up to `want`.
    #[inline]
    fn hand_out(&self, offset: u64, want: u32) -> Option<Taken> {
        (offset < self.count)
            .then(|| Taken { first: self.first + offset, count: (self.count - offset).min(u64::from(want)) as u32 })
    }
}

/// A contiguous range of IDs handed out: `first, first + 1, …, first + count − 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub first: u64,
    pub count: u32,
}

impl Runs {
    /// Up to `want` IDs of the run of millisecond `now_unix_ms`, without a lock; `None` when
    /// there is no such run or it is used up (then the caller takes the slow path). The run is
    /// looked at before an offset is counted, so requests that cannot use it (another millisecond,
    /// used up) do not consume its offsets.
    #[inline]
    pub(crate) fn take(&self, now_unix_ms: i64, want: u32) -> Option<Taken> {
        self.take_if(want, |run| run.unix_ms == now_unix_ms)
    }

    /// [`Self::take`] with the CPU counter in place of the clock, read once the run is: the run
    /// is taken only while the counter is inside its window. `None` also when the run has no
    /// window (then the caller reads the clock and takes it by its millisecond).
    #[inline]
    pub(crate) fn take_by_counter(&self, counter: impl FnOnce() -> u64, want: u32) -> Option<Taken> {
        self.take_if(want, |run| run.window.contains(counter()))
    }

    #[inline]
    fn take_if(&self, want: u32, current: impl FnOnce(&Run) -> bool) -> Option<Taken> {
        let generation = self.current.0.load(Ordering::Acquire);
        let run = self.run(generation)?;
        if !current(&run) {
            return None;
        }
        let ticket = self.ticket.0.fetch_add(u64::from(want), Ordering::Acquire);
        if ticket >> OFFSET_BITS != generation {
            return None; // a new run was published meanwhile
        }
        run.hand_out(ticket & OFFSET_MASK, want)
    }

    /// The run of `generation`, read consistently from its slot; `None` if the slot holds
    /// another generation's run (or is being written).
    #[inline]
    fn run(&self, generation: u64) -> Option<Run> {
        let slot = &self.slots[generation as usize % SLOTS];
        if slot.tag.load(Ordering::Acquire) != generation {
            return None;
        }
        let run = Run {
            unix_ms: slot.unix_ms.load(Ordering::Relaxed),
            first: slot.first.load(Ordering::Relaxed),
            count: slot.count.load(Ordering::Relaxed),
            window: Window {
                start: slot.window_start.load(Ordering::Relaxed),
                end: slot.window_end.load(Ordering::Relaxed),
            },
        };
        fence(Ordering::Acquire);
        (slot.tag.load(Ordering::Relaxed) == generation).then_some(run)
    }

    /// Publishes a new run of `count` IDs from `first` in millisecond `unix_ms`, of which the
    /// caller already took the first `taken`, usable by the CPU counter inside `window` (empty:
    /// only by the clock); the run it replaces is closed. Returns how many IDs the replaced run
    /// handed out (for the issued-IDs counter). Callers hold the core's lock, which serializes
    /// every publish.
    pub(crate) fn publish(&self, unix_ms: i64, first: u64, count: u64, taken: u64, window: Window) -> u64 {
        let current = self.ticket.0.load(Ordering::Relaxed) >> OFFSET_BITS;
        let generation = (current + 1) & (u64::MAX >> OFFSET_BITS);
        let slot = &self.slots[generation as usize % SLOTS];
        slot.tag.store(WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.unix_ms.store(unix_ms, Ordering::Relaxed);
        slot.first.store(first, Ordering::Relaxed);
        slot.count.store(count, Ordering::Relaxed);
        slot.window_start.store(window.start, Ordering::Relaxed);
        slot.window_end.store(window.end, Ordering::Relaxed);
        slot.tag.store(generation, Ordering::Release);
        let replaced = self.ticket.0.swap(generation << OFFSET_BITS | taken, Ordering::AcqRel);
        self.current.0.store(generation, Ordering::Release);
        let old = &self.slots[(replaced >> OFFSET_BITS) as usize % SLOTS];
        // The replaced run's slot is not rewritten before the next publish (four slots, and
        // publishes are serialized), so its count is still its own.
        (replaced & OFFSET_MASK).min(old.count.load(Ordering::Relaxed))
    }

    /// Ends the current run: every later request takes the slow path. Returns how many IDs it
    /// handed out.
    pub(crate) fn close(&self) -> u64 {
        self.publish(i64::MIN, 0, 0, 0, Window::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Window = Window { start: 0, end: 0 };

    #[test]
    fn a_run_is_handed_out_once_and_only_in_its_millisecond() {
        let runs = Runs::default();
        assert_eq!(runs.take(100, 1), None, "no run yet");
        assert_eq!(runs.publish(100, 1_000, 10, 1, NONE), 0);
        assert_eq!(runs.take(101, 1), None, "another millisecond");
        assert_eq!(runs.take(100, 3), Some(Taken { first: 1_001, count: 3 }));
        assert_eq!(runs.take(100, 10), Some(Taken { first: 1_004, count: 6 }), "what is left");
        assert_eq!(runs.take(100, 1), None, "used up");
        assert_eq!(runs.close(), 10, "the 10 handed out (counted once, not the overshoot)");
        assert_eq!(runs.take(100, 1), None, "closed");
        assert_eq!(runs.publish(102, 5_000, 4, 0, NONE), 0);
        assert_eq!(runs.take(102, 4), Some(Taken { first: 5_000, count: 4 }));
    }

    #[test]
    fn by_the_counter_a_run_is_taken_only_inside_its_window() {
        let runs = Runs::default();
        runs.publish(100, 1_000, 10, 0, NONE);
        assert_eq!(runs.take_by_counter(|| 0, 1), None, "no window: only by the clock");
        assert_eq!(runs.take(100, 1), Some(Taken { first: 1_000, count: 1 }));
        runs.publish(101, 2_000, 10, 0, Window { start: 300, end: 500 });
        assert_eq!(runs.take_by_counter(|| 299, 1), None, "below the window: the counter went back");
        assert_eq!(runs.take_by_counter(|| 300, 1), Some(Taken { first: 2_000, count: 1 }));
        assert_eq!(runs.take_by_counter(|| 499, 1), Some(Taken { first: 2_001, count: 1 }));
        assert_eq!(runs.take_by_counter(|| 500, 1), None, "at the window's end");
        assert_eq!(runs.take(101, 1), Some(Taken { first: 2_002, count: 1 }), "by the clock, still");
        runs.close();
        assert_eq!(runs.take_by_counter(|| 400, 1), None, "closed");
    }

    #[test]
    fn a_stale_ticket_never_reads_another_runs_slot() {
        let runs = Runs::default();
        runs.publish(7, 7_000, 5, 0, NONE);
        let stale = runs.ticket.0.load(Ordering::Relaxed) >> OFFSET_BITS;
        assert!(runs.run(stale).is_some_and(|run| run.unix_ms == 7));
        // The slot is reused SLOTS publishes later, by another generation: the old one's ticket
        // finds nothing there, even for a run of the same shape.
        for ms in 8..8 + SLOTS as i64 {
            runs.publish(ms, 7_000, 5, 0, NONE);
        }
        assert_eq!((stale as usize) % SLOTS, ((stale + SLOTS as u64) as usize) % SLOTS, "the same slot");
        assert!(runs.run(stale).is_none());
        assert!(runs.run(stale + SLOTS as u64).is_some_and(|run| run.unix_ms == 7 + SLOTS as i64));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Publish { ms: i64, count: u64, taken: u64, window: Window },
        Take { ms: i64, want: u32 },
        TakeByCounter { counter: u64, want: u32 },
        Close,
    }

    use proptest::prelude::*;

    proptest::proptest! {
        /// Against a model of one current run: every take hands out exactly what the model says
        /// (the run's next IDs, in its millisecond only, never past its end), and what each
        /// publish or close reports as handed out is what was.
        #[test]
        fn takes_follow_a_model_of_the_current_run(ops in proptest::collection::vec(
            proptest::prop_oneof![
                (0i64..4, 0u64..6, 0u64..3, 0u64..3, 0u64..4).prop_map(|(ms, count, taken, start, end)| {
                    Op::Publish { ms, count, taken: taken.min(count), window: Window { start, end } }
                }),
                (0i64..4, 1u32..4).prop_map(|(ms, want)| Op::Take { ms, want }),
                (0u64..4, 1u32..4).prop_map(|(counter, want)| Op::TakeByCounter { counter, want }),
                proptest::strategy::Just(Op::Close),
            ],
            1..60,
        )) {
            let runs = Runs::default();
            // (ms, first, count, next offset, window) of the current run, as the model sees it.
            let mut model: Option<(i64, u64, u64, u64, Window)> = None;
            let mut first = 0u64;
            for op in ops {
                match op {
                    Op::Publish { ms, count, taken, window } => {
                        let handed = runs.publish(ms, first, count, taken, window);
                        prop_assert_eq!(handed, model.map_or(0, |(_, _, count, next, _)| next.min(count)));
                        model = Some((ms, first, count, taken, window));
                        first += 100;
                    }
                    Op::Close => {
                        let handed = runs.close();
                        prop_assert_eq!(handed, model.map_or(0, |(_, _, count, next, _)| next.min(count)));
                        model = None;
                    }
                    Op::Take { .. } | Op::TakeByCounter { .. } => {
                        // Which check the run must pass: its millisecond, or its window.
                        let (usable, want) = match (&op, &model) {
                            (&Op::Take { ms, want }, Some((run_ms, ..))) => (*run_ms == ms, want),
                            (&Op::TakeByCounter { counter, want }, Some((.., window))) => {
                                (window.start <= counter && counter < window.end, want)
                            }
                            (&Op::Take { want, .. } | &Op::TakeByCounter { want, .. }, _) => (false, want),
                            _ => unreachable!("only takes here"),
                        };
                        let expected = match &mut model {
                            Some((_, run_first, count, next, _)) if usable => {
                                let offset = *next;
                                *next += u64::from(want);
                                (offset < *count).then(|| Taken {
                                    first: *run_first + offset,
                                    count: (*count - offset).min(u64::from(want)) as u32,
                                })
                            }
                            _ => None,
                        };
                        let taken = match op {
                            Op::Take { ms, want } => runs.take(ms, want),
                            Op::TakeByCounter { counter, want } => runs.take_by_counter(|| counter, want),
                            _ => unreachable!("only takes here"),
                        };
                        prop_assert_eq!(taken, expected);
                    }
                }
            }
        }
    }

    #[test]
    fn many_threads_take_disjoint_increasing_ids() {
        let runs = std::sync::Arc::new(Runs::default());
        let mut next_first = 0u64;
        let mut all = Vec::new();
        for ms in 0..200i64 {
            runs.publish(ms, next_first, 64, 0, NONE);
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let runs = runs.clone();
                    std::thread::spawn(move || {
                        let mut mine = Vec::new();
                        while let Some(taken) = runs.take(ms, 3) {
                            mine.extend(taken.first..taken.first + u64::from(taken.count));
                        }
                        mine
                    })
                })
                .collect();
            for handle in handles {
                let mine = handle.join().unwrap();
                assert!(mine.windows(2).all(|w| w[0] < w[1]), "one thread's IDs increase");
                all.extend(mine);
            }
            next_first += 1_000;
        }
        let count = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), count, "no ID twice");
        assert_eq!(count, 200 * 64, "every ID of every run handed out once");
    }
}
