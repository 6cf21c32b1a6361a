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
//! - runs are numbered with all 64 bits (never reused), a run is read consistently (a sequence
//!   lock on its slot, tagged with that number), and an offset counts for the run that was read
//!   only if the ticket's low bits of the run number still match *and* the number read again
//!   after the add shows the low bits cannot have gone all the way round meanwhile
//!   ([`Runs::take_if`]); so an offset is only ever added to the `first` of the run it was
//!   counted in, however long a request stalls between reading a run and counting its offset;
//! - a ticket's offsets cannot overflow into its run number: a request adds at most its run's
//!   count (≤ 2^22, the most sequence bits a layout can have), and a request that finds the run
//!   used up replaces it (publishes the next run or closes this one) before its thread runs
//!   anything else, so a run's ticket takes at most its count plus four adds per thread, far
//!   below 2^40;
//! - a run is used only in its own millisecond (`unix_ms == now`, or, where the clock is kept on
//!   the CPU's counter, the counter inside the run's window in that millisecond:
//!   [`crate::clock::cpu_counter`]): the core never issues a millisecond twice, so a millisecond names at
//!   most one run, ever;
//! - whoever changes what the core may issue (a lost lease, a release, an unsynchronized clock, a
//!   retired region, a new schedule) closes the run under the core's lock first. A request that
//!   took its offset just before still issues an ID of a millisecond the core had checked, which
//!   is why the fence and the release rule hold for it (SPEC §2: the successor starts above the
//!   stored expiry, and the release writes the last issued millisecond + 1).

use std::sync::atomic::{self, AtomicU64, Ordering};

use crate::clock::cpu_counter::Window;

/// How many runs' slots exist: a request holding an old run number finds its slot reused (and
/// its tag changed) rather than a half-written one.
const SLOTS: usize = 4;
/// A slot's tag while its run is being written. No run number reaches it.
const WRITING: u64 = u64::MAX;

/// Where the fast path's atomics come from: the standard library's, or, in the model check at
/// the end of this file, loom's model of them.
pub(crate) trait Atomics: 'static {
    type U64: AtomicWord;
    fn fence(order: Ordering);
}

/// The operations of a 64-bit atomic the fast path uses.
pub(crate) trait AtomicWord: Default + Send + Sync {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    fn swap(&self, value: u64, order: Ordering) -> u64;
}

/// The standard library's atomics: what the generator runs on.
pub(crate) struct Std;

impl Atomics for Std {
    type U64 = AtomicU64;
    #[inline]
    fn fence(order: Ordering) {
        atomic::fence(order);
    }
}

impl AtomicWord for AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        AtomicU64::load(self, order)
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        AtomicU64::store(self, value, order);
    }
    #[inline]
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        AtomicU64::fetch_add(self, value, order)
    }
    #[inline]
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        AtomicU64::swap(self, value, order)
    }
}

struct Slot<A: Atomics> {
    /// The run's number (all 64 bits of it), or [`WRITING`].
    tag: A::U64,
    /// An `i64` (Unix ms), stored as its bits.
    unix_ms: A::U64,
    first: A::U64,
    count: A::U64,
    /// The CPU counter's values in which the clock is still in `unix_ms` (empty for none).
    window_start: A::U64,
    window_end: A::U64,
}

impl<A: Atomics> Default for Slot<A> {
    fn default() -> Self {
        Slot {
            tag: A::U64::default(),
            unix_ms: A::U64::default(),
            first: A::U64::default(),
            count: A::U64::default(),
            window_start: A::U64::default(),
            window_end: A::U64::default(),
        }
    }
}

/// The current run and the slots of the last few. Runs are numbered from 0 with all 64 bits
/// (never wrapping: 2^64 publishes is 584 million years at one a microsecond); the ticket carries
/// only the low `RUN_BITS` of the number. At first, run 0's slot says count 0: the first request
/// takes the lock. A used-up run still counts offsets (requests that find it used up add
/// theirs), but they are not counted as issued: a run hands out at most its `count`.
///
/// `RUN_BITS` is 24 in the generator; the tests narrow it to make the ticket's run number wrap
/// within a few publishes.
pub(crate) struct Runs<A: Atomics = Std, const RUN_BITS: u32 = 24> {
    /// `run number mod 2^RUN_BITS << OFFSET_BITS | next offset`. The one contended cache line of
    /// the fast path: every request writes it, so nothing else is read from it.
    ticket: Padded<A::U64>,
    /// The number of the current run, written once per publish: a line every core keeps a
    /// shared copy of, so a request checks which run is current without touching `ticket`.
    current: Padded<A::U64>,
    slots: [Slot<A>; SLOTS],
}

impl<A: Atomics, const RUN_BITS: u32> Default for Runs<A, RUN_BITS> {
    fn default() -> Self {
        Runs {
            ticket: Padded(A::U64::default()),
            current: Padded(A::U64::default()),
            slots: std::array::from_fn(|_| Slot::default()),
        }
    }
}

#[repr(align(128))]
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
    fn hand_out(&self, offset: u64, want: u64) -> Option<Taken> {
        (offset < self.count)
            .then(|| Taken { first: self.first + offset, count: (self.count - offset).min(want) as u32 })
    }
}

/// A contiguous range of IDs handed out: `first, first + 1, …, first + count − 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub first: u64,
    pub count: u32,
}

impl<A: Atomics, const RUN_BITS: u32> Runs<A, RUN_BITS> {
    /// Bits of the ticket that count offsets within a run.
    const OFFSET_BITS: u32 = 64 - RUN_BITS;
    const OFFSET_MASK: u64 = (1 << Self::OFFSET_BITS) - 1;
    const RUN_MASK: u64 = u64::MAX >> Self::OFFSET_BITS;

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

    /// Reads the current run, checks it with `current`, then counts `want` offsets on the ticket.
    /// The offsets belong to the run that was read only if the ticket still names it; the ticket
    /// holds the run number's low `RUN_BITS`, so the full number is read again after the add:
    /// a request that stalled between the read and the add while the low bits went all the way
    /// round (2^24 publishes) lands on a later run with the same low bits, and must not add its
    /// offset to the `first` of the run it read.
    ///
    /// Why reading `current` again is enough: the add reads a ticket some publish swapped in (or
    /// one counted on since), and synchronizes with it; every publish before that one stored its
    /// number in `current` first. So if the ticket came from the run `n + k·2^RUN_BITS` (k ≥ 1),
    /// `current` now reads at least `n + 2^RUN_BITS − 1`; if it came from run `n` itself,
    /// `current` reads `n` or a later run that closed it, which a request that took its offset
    /// just before a close may still hand out (see the module's comment).
    #[inline]
    fn take_if(&self, want: u32, current: impl FnOnce(&Run) -> bool) -> Option<Taken> {
        let number = self.current.0.load(Ordering::Acquire);
        let run = self.run(number)?;
        if !current(&run) {
            return None;
        }
        // Never more than the run has: a ticket's offsets can then grow by at most one run's
        // count per request that passed the check.
        let want = u64::from(want).min(run.count);
        let ticket = self.ticket.0.fetch_add(want, Ordering::Acquire);
        if ticket >> Self::OFFSET_BITS != number & Self::RUN_MASK {
            return None; // a new run was published meanwhile
        }
        if self.current.0.load(Ordering::Relaxed).wrapping_sub(number) >= Self::RUN_MASK {
            return None; // the ticket's run number went all the way round: another run's ticket
        }
        run.hand_out(ticket & Self::OFFSET_MASK, want)
    }

    /// The run numbered `number`, read consistently from its slot; `None` if the slot holds
    /// another run (or is being written).
    #[inline]
    fn run(&self, number: u64) -> Option<Run> {
        let slot = &self.slots[number as usize % SLOTS];
        if slot.tag.load(Ordering::Acquire) != number {
            return None;
        }
        let run = Run {
            unix_ms: slot.unix_ms.load(Ordering::Relaxed) as i64,
            first: slot.first.load(Ordering::Relaxed),
            count: slot.count.load(Ordering::Relaxed),
            window: Window {
                start: slot.window_start.load(Ordering::Relaxed),
                end: slot.window_end.load(Ordering::Relaxed),
            },
        };
        A::fence(Ordering::Acquire);
        (slot.tag.load(Ordering::Relaxed) == number).then_some(run)
    }

    /// Publishes a new run of `count` IDs from `first` in millisecond `unix_ms`, of which the
    /// caller already took the first `taken`, usable by the CPU counter inside `window` (empty:
    /// only by the clock); the run it replaces is closed. Returns how many IDs the replaced run
    /// handed out (for the issued-IDs counter). Callers hold the core's lock, which serializes
    /// every publish.
    pub(crate) fn publish(&self, unix_ms: i64, first: u64, count: u64, taken: u64, window: Window) -> u64 {
        let replaced_number = self.current.0.load(Ordering::Relaxed);
        let number = replaced_number + 1;
        let slot = &self.slots[number as usize % SLOTS];
        slot.tag.store(WRITING, Ordering::Relaxed);
        A::fence(Ordering::Release);
        slot.unix_ms.store(unix_ms as u64, Ordering::Relaxed);
        slot.first.store(first, Ordering::Relaxed);
        slot.count.store(count, Ordering::Relaxed);
        slot.window_start.store(window.start, Ordering::Relaxed);
        slot.window_end.store(window.end, Ordering::Relaxed);
        slot.tag.store(number, Ordering::Release);
        let replaced = self.ticket.0.swap((number & Self::RUN_MASK) << Self::OFFSET_BITS | taken, Ordering::AcqRel);
        self.current.0.store(number, Ordering::Release);
        // The replaced run's slot is not rewritten before the next publish (four slots, and
        // publishes are serialized), so its count is still its own.
        let old = &self.slots[replaced_number as usize % SLOTS];
        (replaced & Self::OFFSET_MASK).min(old.count.load(Ordering::Relaxed))
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
        let runs = <Runs>::default();
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
        let runs = <Runs>::default();
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
        let runs = <Runs>::default();
        runs.publish(7, 7_000, 5, 0, NONE);
        let stale = runs.current.0.load(Ordering::Relaxed);
        assert!(runs.run(stale).is_some_and(|run| run.unix_ms == 7));
        // The slot is reused SLOTS publishes later, by another run: the old one's number finds
        // nothing there, even for a run of the same shape.
        for ms in 8..8 + SLOTS as i64 {
            runs.publish(ms, 7_000, 5, 0, NONE);
        }
        assert_eq!((stale as usize) % SLOTS, ((stale + SLOTS as u64) as usize) % SLOTS, "the same slot");
        assert!(runs.run(stale).is_none());
        assert!(runs.run(stale + SLOTS as u64).is_some_and(|run| run.unix_ms == 7 + SLOTS as i64));
    }

    #[test]
    fn a_take_stalled_while_the_run_number_wraps_hands_out_nothing() {
        // A request reads the current run and checks it, then stalls before its add while the
        // ticket's 24-bit run number goes all the way round: 2^24 publishes, which refused
        // requests make in minutes (a slow path that issues nothing closes the run). Its add
        // lands on a later run with the same low bits, whose offset it must not add to the
        // `first` of the run it read: that hands out an ID again.
        let runs = <Runs>::default();
        runs.publish(100, 1_000, 10, 1, NONE); // the publisher keeps 1_000 for itself
        assert_eq!(runs.take(100, 1), Some(Taken { first: 1_001, count: 1 }));
        let stalled = runs.take_if(1, |run| {
            assert_eq!(run.first, 1_000, "the run it read");
            for _ in 0..(1 << 24) - 1 {
                runs.close();
            }
            runs.publish(200, 5_000, 10, 0, NONE); // the same low 24 bits as the run read
            true
        });
        assert_eq!(stalled, None, "an offset of run 200 added to the first of run 100");
        // The stalled request's offset is a gap in run 200; the rest is handed out as usual.
        assert_eq!(runs.take(200, 1), Some(Taken { first: 5_001, count: 1 }));
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
            let runs = <Runs>::default();
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
        let runs = std::sync::Arc::new(<Runs>::default());
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

/// The fast path under loom: every interleaving, within a preemption bound, of a publisher that
/// publishes runs and closes them (as the core's lock holder does) and requests that take from
/// them, on loom's model of the atomics, which also explores the older values a relaxed or
/// acquire load may still return. The run number in the ticket is one or two bits wide, so it
/// goes all the way round within the publisher's few steps: a request that read a run and stalls
/// while the number wraps is among the interleavings, as are takes just before and after a close.
///
/// What must hold in every one: no ID is handed out twice, and every ID handed out is one its
/// run counted as handed out when it was replaced (an offset of that run, below its count).
#[cfg(test)]
mod model {
    use std::cell::Cell;

    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64 as LoomU64;

    use super::*;

    struct Loom;

    impl Atomics for Loom {
        type U64 = LoomU64;
        fn fence(order: Ordering) {
            loom::sync::atomic::fence(order);
        }
    }

    impl AtomicWord for LoomU64 {
        fn load(&self, order: Ordering) -> u64 {
            LoomU64::load(self, order)
        }
        fn store(&self, value: u64, order: Ordering) {
            LoomU64::store(self, value, order);
        }
        fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
            LoomU64::fetch_add(self, value, order)
        }
        fn swap(&self, value: u64, order: Ordering) -> u64 {
            LoomU64::swap(self, value, order)
        }
    }

    /// Run `r` (1, 2, …) is millisecond `r`, IDs `100·r ..`, of `COUNT`, the first kept by the
    /// publisher.
    const COUNT: u64 = 2;

    /// One request: takes from whatever run it finds current (its clock agrees with every run),
    /// and says which run it read and what it was handed.
    fn request<const RUN_BITS: u32>(runs: &Runs<Loom, RUN_BITS>) -> Option<(u64, Taken)> {
        let read = Cell::new(0);
        let taken = runs.take_if(1, |run| {
            read.set(run.first / 100);
            true
        })?;
        Some((read.get(), taken))
    }

    /// `publishes` runs and then a close, against `requests` concurrent requests of one ID each.
    fn check<const RUN_BITS: u32>(publishes: u64, requests: usize, preemptions: usize) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(preemptions);
        builder.check(move || {
            let runs = Arc::new(Runs::<Loom, RUN_BITS>::default());
            let takers: Vec<_> = (0..requests)
                .map(|_| {
                    let runs = runs.clone();
                    loom::thread::spawn(move || request(&runs))
                })
                .collect();
            // Under the core's lock: publish, each run replacing the last, then close the last.
            let mut handed = vec![100]; // the publisher's own first ID of run 1
            let mut counted = vec![0; publishes as usize + 1]; // by run; run 0 is the empty one
            for run in 1..=publishes {
                counted[run as usize - 1] = runs.publish(run as i64, 100 * run, COUNT, 1, Window::default());
                if run > 1 {
                    handed.push(100 * run);
                }
            }
            counted[publishes as usize] = runs.close();
            for taker in takers {
                if let Some((read, taken)) = taker.join().unwrap() {
                    assert_eq!(taken.count, 1);
                    assert_eq!(taken.first / 100, read, "an ID of another run than the one it checked");
                    handed.push(taken.first);
                }
            }
            for &id in &handed {
                let (run, offset) = (id / 100, id % 100);
                assert!(
                    offset < counted[run as usize],
                    "ID {id}: offset {offset} of run {run}, which counted {} handed out (counted {counted:?}, handed {handed:?})",
                    counted[run as usize]
                );
            }
            let mut unique = handed.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), handed.len(), "an ID handed out twice: {handed:?}");
        });
    }

    #[test]
    fn loom_a_one_bit_run_number_wraps_under_a_stalled_request_and_no_id_is_handed_out_twice() {
        // Three publishes and a close: the number wraps twice while the request may stall.
        check::<1>(3, 1, 3);
    }

    #[test]
    fn loom_two_requests_on_a_wrapping_run_number_never_take_one_id() {
        check::<1>(3, 2, 1);
    }

    #[test]
    fn loom_a_two_bit_run_number_wraps_under_a_request_that_may_still_use_a_closed_run() {
        // With two bits a request that counted its offset just before a close (one or two runs
        // ago) still hands it out; five publishes take the number round once.
        check::<2>(5, 1, 3);
    }
}
