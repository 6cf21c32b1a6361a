//! The CPU's time-stamp counter as the fast path's check that the wall clock is still inside the
//! current run's millisecond, in place of reading the clock for every single ID.
//!
//! Where the kernel keeps its realtime clock *on* the TSC (clocksource `tsc`, on a CPU with
//! `constant_tsc` and `nonstop_tsc`: one rate, never stopped), `clock_gettime(CLOCK_REALTIME)` is
//! the counter read in order, scaled and offset. So the counter window in which the clock is
//! certainly still in millisecond M can be worked out once, when M's run is published under the
//! core's lock, and each single ID of the run then costs one `rdtsc` and two comparisons instead
//! of a clock read (measured here: ≈ 10 ns against ≈ 26 ns). Batches still read the clock.
//!
//! Why the answer is the clock's own, never a later one:
//! - the window opens at a counter reading taken *before* the clock reading it is paired with,
//!   and closes [`MARGIN_NS`] before the millisecond ends, at a rate shaded down by
//!   [`RATE_SLACK`]: below the window (a counter that went back: suspend, a restored VM) or past
//!   it, the fast path reads the clock;
//! - the rate is the counter's against the realtime clock, measured over ≥ [`CALIBRATION_NS`] and
//!   used only while two measurements in a row agree within [`RATE_AGREEMENT`] *and* the kernel's
//!   discipline (`adjtimex`: tick, frequency, PLL offset and state) is what it was when they were
//!   taken: chrony slews by changing the tick and frequency (by up to ~10 %), and any change
//!   drops the rate until two new measurements agree. What moves the clock's rate without showing
//!   there (`adjtime`'s single-shot slew, 500 ppm) is covered by the slack;
//! - the clocksource is read again every [`SOURCE_CHECK_NS`]: if the kernel has left the TSC (its
//!   watchdog found it unstable), the counter is not used again in this process;
//! - the counter runs while the process is stopped: a process frozen past its lease resumes past
//!   the window, and its next ID goes through the clock and the core, which refuse it;
//! - every reading is checked against the counter's idea of the time (the anchor, moved on at
//!   the rate in use): a clock more than 100 µs + 0.1 % of the time since the anchor away from it
//!   drops the rate at once, so no later run has a window until two measurements agree again;
//! - a run with no window (no rate yet, or the clock already past M when it was published) is
//!   still handed out, through the clock read ([`crate::issuing::fast_path::Runs::take`]).
//!
//! What an ID taken by the counter promises: it carries the millisecond its run was published in,
//! and it was handed out while the counter was inside that run's window, less than a millisecond
//! of *counter* time after the publish read the clock. Where the clock is the counter scaled (the
//! clocksource is the TSC, which is when this path is used), counter time is the clock's, so the
//! ID's millisecond lies between clock reads taken before and after the request
//! (`tests/request_path.rs` holds it to that). What moves the clock apart from the counter is not
//! seen until the next slow path: a step of the wall clock (`date -s`, `chronyc makestep`), or a
//! hypervisor that stops the guest's counter during a pause, or sets it back by less than a window
//! after a migration, and then corrects the clock. Then the rest of one run (< 1 ms of counter
//! time) goes out with the millisecond the clock had left, as old as the pause was long; the next
//! slow path's reading disagrees with the counter and drops the rate (above). No ID is issued
//! twice either way: uniqueness does not rest on this check at all, since the core issued every
//! ID of a run under every rule (the fence among them) for its millisecond, once.
//! Elsewhere (another clocksource, aarch64 and so Graviton, a clock injected by tests) there is
//! no counter and the fast path reads the clock as before.

use std::sync::OnceLock;

/// How far before the end of its millisecond a run's window closes, at the least.
const MARGIN_NS: i64 = 20_000;
/// How much slower than measured the counter is taken to run when a window is worked out.
const RATE_SLACK: f64 = 2e-3;
/// The shortest interval a rate is measured over.
const CALIBRATION_NS: i64 = 50_000_000;
/// How closely two measurements in a row must agree for the rate to be used.
const RATE_AGREEMENT: f64 = 1e-4;
/// A counter reading and a clock reading further apart than this (in counter ticks: the thread
/// was interrupted between them) are not paired.
const MAX_PAIR_TICKS: u64 = 100_000;
/// How often the clocksource is read again.
const SOURCE_CHECK_NS: i64 = 1_000_000_000;
/// How far the clock may read from where the counter, at the rate in use, says it should be,
/// before the rate is dropped: this much, plus [`DISAGREEMENT_PER_NS`] of the time since the
/// anchor (the rate's own error and an undisclosed slew, 500 ppm, stay well inside it).
const DISAGREEMENT_NS: f64 = 100_000.0;
const DISAGREEMENT_PER_NS: f64 = 1e-3;

/// The counter values in which the clock is still in a run's millisecond: `start ≤ c < end`.
/// The default is empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub start: u64,
    pub end: u64,
}

impl Window {
    #[inline]
    pub(crate) fn contains(&self, counter: u64) -> bool {
        self.start <= counter && counter < self.end
    }
}

/// Whether this machine's realtime clock is kept on the TSC, read once per process.
pub(crate) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo");
        match (clocksource(), cpuinfo) {
            (Some(source), Ok(cpuinfo)) => cfg!(target_arch = "x86_64") && follows_tsc(&source, &cpuinfo),
            _ => false,
        }
    })
}

/// The kernel's current clocksource.
fn clocksource() -> Option<String> {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource").ok()
}

/// The kernel's clocksource is the TSC and every CPU's TSC has one rate and never stops.
fn follows_tsc(clocksource: &str, cpuinfo: &str) -> bool {
    let mut cpus = cpuinfo.lines().filter(|line| line.starts_with("flags")).peekable();
    let every_cpu_has = cpus.peek().is_some()
        && cpus.all(|line| {
            let has = |flag: &str| line.split_whitespace().any(|word| word == flag);
            has("constant_tsc") && has("nonstop_tsc")
        });
    clocksource.trim() == "tsc" && every_cpu_has
}

/// The counter now. Not ordered against the instructions around it: the margin is thousands of
/// times larger than the window it may move in.
#[inline]
pub(crate) fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc reads a register; every x86-64 CPU has it.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0 // never called: `usable()` is false
    }
}

/// A counter reading and the realtime clock in Unix nanoseconds, the counter read first; `None`
/// if the thread was interrupted between them.
fn pair() -> Option<(u64, i64)> {
    let before = now();
    let unix_ns = crate::clock::system_unix_ns();
    let after = now();
    let unix_ns = i64::try_from(unix_ns).ok()?;
    (after >= before && after - before <= MAX_PAIR_TICKS).then_some((before, unix_ns))
}

/// What the kernel's clock discipline says about the clock's rate (`adjtimex`, read only):
/// tick, frequency, PLL offset still to slew, and state.
fn discipline() -> (i64, i64, i64, i32) {
    #[cfg(target_os = "linux")]
    if let Ok((_, tx)) = crate::clock::read_adjtimex() {
        return (tx.tick, tx.freq, tx.offset, tx.status);
    }
    (-1, -1, -1, -1)
}

/// One reading of everything a window is worked out from.
#[derive(Debug, Clone, Copy)]
struct Reading {
    counter: u64,
    unix_ns: i64,
    discipline: (i64, i64, i64, i32),
}

/// The counter's rate against the realtime clock, as the core's lock holder learns it from the
/// readings it takes when it publishes runs.
#[derive(Debug, Default)]
pub(crate) struct Calibration {
    /// The reading the next measurement is taken from.
    anchor: Option<Reading>,
    /// The last measurement, ticks per nanosecond.
    measured: Option<f64>,
    /// The rate in use: the lower of two agreeing measurements in a row, or none.
    rate: Option<f64>,
    /// When the clocksource was last read.
    source_checked_ns: i64,
    /// The kernel left the TSC: no window again.
    left_tsc: bool,
}

impl Calibration {
    /// The counter window in which the realtime clock is certainly still in `unix_ms`, read now;
    /// empty (the run is taken through the clock) when that cannot be said.
    #[inline(never)] // once per millisecond, under the lock: kept out of the request path's code
    pub(crate) fn window(&mut self, unix_ms: i64) -> Window {
        let Some((counter, unix_ns)) = pair() else { return Window::default() };
        if unix_ns - self.source_checked_ns >= SOURCE_CHECK_NS {
            self.source_checked_ns = unix_ns;
            self.left_tsc |= clocksource().is_none_or(|source| source.trim() != "tsc");
        }
        if self.left_tsc {
            return Window::default();
        }
        self.window_at(unix_ms, Reading { counter, unix_ns, discipline: discipline() })
    }

    /// [`Self::window`] from `reading`.
    fn window_at(&mut self, unix_ms: i64, reading: Reading) -> Window {
        self.learn(reading);
        let Some(rate) = self.rate else { return Window::default() };
        if reading.unix_ns.div_euclid(1_000_000) != unix_ms {
            return Window::default();
        }
        let left_ns = (unix_ms + 1) * 1_000_000 - MARGIN_NS - reading.unix_ns;
        if left_ns <= 0 {
            return Window::default();
        }
        let ticks = (left_ns as f64 * rate * (1.0 - RATE_SLACK)) as u64;
        reading.counter.checked_add(ticks).map_or(Window::default(), |end| Window { start: reading.counter, end })
    }

    fn learn(&mut self, reading: Reading) {
        let Some(anchor) = self.anchor else {
            self.anchor = Some(reading);
            return;
        };
        let elapsed_ns = reading.unix_ns - anchor.unix_ns;
        let disagrees = |rate: f64| {
            let by_counter_ns = (reading.counter - anchor.counter) as f64 / rate;
            (elapsed_ns as f64 - by_counter_ns).abs() > DISAGREEMENT_NS + by_counter_ns * DISAGREEMENT_PER_NS
        };
        if reading.counter < anchor.counter
            || elapsed_ns < 0
            || reading.discipline != anchor.discipline
            || self.rate.is_some_and(disagrees)
        {
            // The clock stepped back, the counter did, the kernel changed the clock's rate, or the
            // clock is not where the counter says it should be (a step either way, or a counter
            // stopped or set back while the clock went on: a hypervisor's pause or migration):
            // start over from here.
            self.anchor = Some(reading);
            (self.measured, self.rate) = (None, None);
            return;
        }
        if elapsed_ns < CALIBRATION_NS {
            return;
        }
        let measured = (reading.counter - anchor.counter) as f64 / elapsed_ns as f64;
        self.rate = self
            .measured
            .filter(|previous| (measured / previous - 1.0).abs() <= RATE_AGREEMENT)
            .map(|previous| previous.min(measured));
        self.measured = Some(measured);
        self.anchor = Some(reading);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks per ns of the counter in these tests.
    const GHZ3: u64 = 3;
    const START: i64 = 1_800_000_000_000_000_000;
    const STILL: (i64, i64, i64, i32) = (10_000, 0, 0, 0);

    /// A reading of a 3 GHz counter against a clock `offset_ns` ahead of true time.
    fn reading(true_ns: i64, offset_ns: i64) -> Reading {
        Reading { counter: true_ns as u64 * GHZ3, unix_ns: true_ns + offset_ns, discipline: STILL }
    }

    fn window(calibration: &mut Calibration, reading: Reading) -> Window {
        calibration.window_at(reading.unix_ns.div_euclid(1_000_000), reading)
    }

    /// Calibrated at START, START + 50 ms, START + 100 ms; returns the last.
    fn calibrated() -> (Calibration, i64) {
        let mut calibration = Calibration::default();
        for step in 0..3 {
            calibration.learn(reading(START + step * CALIBRATION_NS, 0));
        }
        (calibration, START + 2 * CALIBRATION_NS)
    }

    #[test]
    fn no_window_until_two_measurements_agree() {
        let mut calibration = Calibration::default();
        assert_eq!(window(&mut calibration, reading(START, 0)), Window::default(), "no rate yet");
        let one = reading(START + CALIBRATION_NS, 0);
        assert_eq!(window(&mut calibration, one), Window::default(), "one measurement");
        let two = reading(START + 2 * CALIBRATION_NS + 100_000, 0);
        assert_ne!(window(&mut calibration, two), Window::default(), "two that agree");
    }

    #[test]
    fn a_window_opens_at_its_reading_and_closes_20_us_before_its_millisecond_ends() {
        let (mut calibration, at) = calibrated();
        for into_ms in [0, 1, 333_333, 900_000, 979_999, 980_000, 999_999] {
            let r = reading((at / 1_000_000 + 7) * 1_000_000 + into_ms, 0);
            let ms = r.unix_ns.div_euclid(1_000_000);
            let w = window(&mut calibration, r);
            let end_of_ms = ((ms + 1) * 1_000_000) as u64 * GHZ3;
            if into_ms >= 980_000 {
                assert_eq!(w, Window::default(), "{into_ms}: within 20 µs of the end: no window");
            } else {
                assert_eq!(w.start, r.counter, "{into_ms}");
                assert!(w.end <= end_of_ms - 20_000 * GHZ3, "{into_ms}: {w:?}");
                assert!(w.end > w.start, "{into_ms}: some of the millisecond is left");
            }
        }
    }

    #[test]
    fn a_clock_running_1000_ppm_faster_than_measured_still_leaves_20_us() {
        // A slew the kernel's discipline does not show (adjtime's single shot: 500 ppm; twice
        // that here) changes the clock's rate after calibration: the window still closes at
        // least 20 µs of true time before the clock reaches the end of its millisecond.
        let (mut calibration, at) = calibrated();
        let fast = |true_ns: i64| Reading {
            counter: true_ns as u64 * GHZ3,
            unix_ns: at + (true_ns - at) + (true_ns - at) / 1_000,
            discipline: STILL,
        };
        for into_ms in [0, 250_000, 500_000, 750_000] {
            let true_ns = at + 3_000_000 + into_ms;
            let r = fast(true_ns);
            let ms = r.unix_ns.div_euclid(1_000_000);
            let w = window(&mut calibration, r);
            assert_ne!(w, Window::default(), "{into_ms}");
            // True time at which the fast clock reads the end of `ms`.
            let end_true_ns = at + ((ms + 1) * 1_000_000 - at) * 1_000 / 1_001;
            assert!(w.end <= (end_true_ns - 20_000) as u64 * GHZ3, "{into_ms}: {w:?} vs {end_true_ns}");
        }
    }

    #[test]
    fn a_reading_from_another_millisecond_gives_no_window() {
        let (mut calibration, at) = calibrated();
        let r = reading(at + 10 * 1_000_000 + 5, 0);
        assert_eq!(calibration.window_at(r.unix_ns.div_euclid(1_000_000) - 1, r), Window::default());
    }

    #[test]
    fn a_counter_below_the_window_is_outside_it() {
        // A counter that went back (suspend, a restored VM) must not find a stale run usable.
        let (mut calibration, at) = calibrated();
        let w = window(&mut calibration, reading(at + 1_000_000, 0));
        assert!(w.contains(w.start) && w.contains(w.end - 1));
        assert!(!w.contains(w.start - 1) && !w.contains(0) && !w.contains(w.end));
        assert!(!Window::default().contains(0), "the default window is empty");
    }

    #[test]
    fn a_clock_step_stops_windows_until_the_rate_agrees_again() {
        let (mut calibration, at) = calibrated();
        // The clock steps forward by 40 ms between two measurements: the rate disagrees.
        let none = Window::default();
        assert_eq!(window(&mut calibration, reading(at + CALIBRATION_NS, 40_000_000)), none, "stepped forward");
        assert_eq!(window(&mut calibration, reading(at + 2 * CALIBRATION_NS, 40_000_000)), none, "one measurement");
        assert_ne!(window(&mut calibration, reading(at + 3 * CALIBRATION_NS, 40_000_000)), none, "two again");
        // A step back starts over at once.
        assert_eq!(window(&mut calibration, reading(at + 4 * CALIBRATION_NS, -1_000_000_000)), none, "stepped back");
        assert!(calibration.rate.is_none() && calibration.measured.is_none());
    }

    #[test]
    fn a_clock_that_leaves_the_counter_drops_the_rate_at_the_next_reading() {
        // The counter stopped for 3 ms while the clock went on (a hypervisor's pause, then a
        // corrected clock), or the clock stepped by 1 ms either way, all within one calibration
        // interval: the very next reading has no window, and the rate is gone until two new
        // measurements agree.
        for jump_ns in [3_000_000, 1_000_000, -1_000_000] {
            let (mut calibration, at) = calibrated();
            assert_ne!(window(&mut calibration, reading(at + 1_000_000, 0)), Window::default());
            let r = reading(at + 2_000_000, jump_ns);
            assert_eq!(window(&mut calibration, r), Window::default(), "{jump_ns}");
            assert!(calibration.rate.is_none(), "{jump_ns}");
        }
        // 10 ms after the anchor the tolerance is 110 µs: 100 µs off keeps the rate, 120 µs not.
        for (off_ns, kept) in [(100_000, true), (-100_000, true), (120_000, false), (-120_000, false)] {
            let (mut calibration, at) = calibrated();
            calibration.learn(reading(at + 10_000_000, off_ns));
            assert_eq!(calibration.rate.is_some(), kept, "{off_ns}");
        }
    }

    #[test]
    fn after_a_pause_of_the_counter_one_run_goes_out_late_and_the_next_has_no_window() {
        // The weaker promise, end to end on the fast path: a run published with a window, then
        // the counter stands still for a second while the clock goes on. Requests that come in
        // then (before any slow path) still take the run by the counter: IDs of its millisecond,
        // a second older than the clock, each once. The next publish reads the clock, finds it a
        // second from the counter's prediction and gives its run no window: from then on the
        // clock decides.
        use crate::issuing::fast_path::{Runs, Taken};
        let (mut calibration, at) = calibrated();
        let published = reading(at + 1_000_000, 0);
        let w = window(&mut calibration, published);
        assert_ne!(w, Window::default());
        let runs = <Runs>::default();
        runs.publish(published.unix_ns.div_euclid(1_000_000), 7_000, 4, 1, w);
        let paused_counter = published.counter + 1_000;
        assert_eq!(runs.take_by_counter(|| paused_counter, 1), Some(Taken { first: 7_001, count: 1 }));
        assert_eq!(runs.take_by_counter(|| paused_counter, 1), Some(Taken { first: 7_002, count: 1 }));
        let resumed = Reading { counter: paused_counter + 3_000, ..reading(at + 1_001_000 + 1_000_000_000, 0) };
        let next = calibration.window_at(resumed.unix_ns.div_euclid(1_000_000), resumed);
        assert_eq!(next, Window::default(), "the clock left the counter: no window");
        runs.publish(resumed.unix_ns.div_euclid(1_000_000), 9_000, 4, 0, next);
        assert_eq!(runs.take_by_counter(|| resumed.counter, 1), None, "by the clock from here on");
    }

    #[test]
    fn a_change_in_the_kernels_discipline_drops_the_rate_at_once() {
        // chrony slews by changing the tick and the frequency (by up to ~10 %): the first
        // reading after a change has no window, however soon it comes.
        let (mut calibration, at) = calibrated();
        assert_ne!(window(&mut calibration, reading(at + 1_000_000, 0)), Window::default());
        for changed in [(9_000, 0, 0, 0), (10_000, 65_536, 0, 0), (10_000, 0, 1_000, 0), (10_000, 0, 0, 1)] {
            let (mut calibration, _) = calibrated();
            let r = Reading { discipline: changed, ..reading(at + 1_000_000, 0) };
            assert_eq!(window(&mut calibration, r), Window::default(), "{changed:?}");
            let r = Reading { discipline: changed, ..reading(at + 2_000_000, 0) };
            assert_eq!(window(&mut calibration, r), Window::default(), "{changed:?}: not yet measured again");
        }
    }

    #[test]
    fn a_steady_slew_agrees_with_itself() {
        // A clock slewed 500 ppm fast throughout (the discipline unchanged) is measured at that
        // rate, and its windows close before its own end of the millisecond.
        let mut calibration = Calibration::default();
        let slewed = |true_ns: i64| Reading {
            counter: true_ns as u64 * GHZ3,
            unix_ns: START + (true_ns - START) + (true_ns - START) / 2_000,
            discipline: STILL,
        };
        for step in 0..3 {
            calibration.learn(slewed(START + step * CALIBRATION_NS));
        }
        let r = slewed(START + 3 * CALIBRATION_NS + 123_456);
        let ms = r.unix_ns.div_euclid(1_000_000);
        let w = window(&mut calibration, r);
        assert_ne!(w, Window::default());
        let end_true_ns = START + ((ms + 1) * 1_000_000 - START) * 2_000 / 2_001;
        assert!(w.end <= (end_true_ns - 20_000) as u64 * GHZ3, "{w:?}");
    }

    #[test]
    fn only_a_tsc_clocksource_on_a_constant_nonstop_tsc_counts() {
        let good = "processor : 0\nflags : fpu tsc constant_tsc nonstop_tsc rdtscp\n\nprocessor : 1\nflags : fpu tsc constant_tsc nonstop_tsc\n";
        assert!(follows_tsc("tsc\n", good));
        assert!(!follows_tsc("kvm-clock\n", good));
        assert!(!follows_tsc("tsc\n", "flags : fpu tsc constant_tsc\n"), "stops in deep sleep");
        assert!(!follows_tsc("tsc\n", &good.replacen("constant_tsc ", "", 1)), "one CPU without it");
        assert!(!follows_tsc("tsc\n", "processor : 0\n"), "no flags at all");
    }

    #[test]
    fn this_machines_counter_pairs_with_its_clock() {
        // Here the clocksource is the TSC (as on the bench machines); elsewhere nothing pairs.
        if !usable() {
            return;
        }
        let mut calibration = Calibration::default();
        let mut checked = 0;
        for _ in 0..2_000 {
            std::thread::sleep(std::time::Duration::from_micros(300));
            let ms = crate::clock::system_unix_ms();
            let w = calibration.window(ms);
            if w == Window::default() {
                continue; // no rate yet, inside the margin, or the clock moved on meanwhile
            }
            // Inside the window, the clock reads `ms` (each reading between two counter
            // readings, both inside it).
            loop {
                let (before, clock, after) = (now(), crate::clock::system_unix_ms(), now());
                if after >= w.end {
                    break;
                }
                assert!(w.contains(before));
                assert_eq!(clock, ms, "the clock left the millisecond inside the window");
            }
            checked += 1;
            if checked == 50 {
                return;
            }
        }
        panic!("only {checked} windows in 2,000 tries: {calibration:?}");
    }
}
