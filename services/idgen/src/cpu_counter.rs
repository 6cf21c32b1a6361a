//! The CPU's time-stamp counter as the fast path's check that the wall clock is still inside the
//! current run's millisecond, in place of reading the clock for every ID.
//!
//! Where the kernel keeps its realtime clock *on* the TSC (clocksource `tsc`, on a CPU with
//! `constant_tsc` and `nonstop_tsc`: one rate, never stopped), `clock_gettime(CLOCK_REALTIME)` is
//! the counter read in order, scaled and offset. So the counter value before which the clock is
//! certainly still in millisecond M can be worked out once, when M's run is published under the
//! core's lock, and each ID of the run then costs one `rdtsc` and a comparison instead of a clock
//! read (measured here: ≈ 10 ns against ≈ 26 ns).
//!
//! Why the answer is the clock's own, never a later one:
//! - the deadline is computed from a counter reading taken *before* the clock reading it is paired
//!   with, minus [`MARGIN_NS`], at a rate shaded down by [`RATE_SLACK`]: it falls before the
//!   millisecond's end by a margin far above what NTP's slew (≤ 500 ppm: 0.5 µs in a millisecond)
//!   or the counter's skew between cores can move it;
//! - the rate is the counter's against the realtime clock, measured over ≥ [`CALIBRATION_NS`] and
//!   used only when two measurements in a row agree within [`RATE_AGREEMENT`]: a clock step in
//!   between makes them disagree, and the fast path reads the clock again until they agree anew;
//! - the counter runs while the process is stopped: a process frozen past its lease resumes past
//!   every deadline, and its next ID goes through the clock and the core, which refuse it;
//! - a run with no deadline (no rate yet, or the clock already past M when it was published) is
//!   still handed out, through the clock read ([`crate::fast_path::Runs::take`]).
//!
//! What this cannot see is a step of the wall clock inside the run's millisecond: such a run is
//! handed out until its deadline (< 1 ms) as if the step had come just after. Uniqueness does not
//! rest on this check at all: the core issued every ID of a run under every rule, once.
//! Elsewhere (another clocksource, aarch64, a clock injected by tests) there is no counter and the
//! fast path reads the clock as before.

use std::sync::OnceLock;

/// How far before the end of its millisecond a run's deadline falls, at the least.
const MARGIN_NS: i64 = 20_000;
/// How much slower than measured the counter is taken to run when a deadline is worked out.
const RATE_SLACK: f64 = 1e-3;
/// The shortest interval a rate is measured over.
const CALIBRATION_NS: i64 = 50_000_000;
/// How closely two measurements in a row must agree for the rate to be used.
const RATE_AGREEMENT: f64 = 1e-4;
/// A counter reading and a clock reading further apart than this (in counter ticks: the thread
/// was interrupted between them) are not paired.
const MAX_PAIR_TICKS: u64 = 100_000;

/// Whether this machine's realtime clock is kept on the TSC, read once per process.
pub(crate) fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| {
        let clocksource = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo");
        match (clocksource, cpuinfo) {
            (Ok(source), Ok(cpuinfo)) => cfg!(target_arch = "x86_64") && follows_tsc(&source, &cpuinfo),
            _ => false,
        }
    })
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
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_REALTIME always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let after = now();
    let unix_ns = ts.tv_sec.checked_mul(1_000_000_000)?.checked_add(ts.tv_nsec)?;
    (after >= before && after - before <= MAX_PAIR_TICKS).then_some((before, unix_ns))
}

/// The counter's rate against the realtime clock, as the core's lock holder learns it from the
/// pairs it reads when it publishes runs.
#[derive(Debug, Default)]
pub(crate) struct Calibration {
    /// The pair the next measurement is taken from.
    anchor: Option<(u64, i64)>,
    /// The last measurement, ticks per nanosecond.
    measured: Option<f64>,
    /// The rate in use: the lower of two agreeing measurements in a row, or none.
    rate: Option<f64>,
}

impl Calibration {
    /// The counter value before which the realtime clock is certainly still in `unix_ms`, read
    /// now; 0 (no deadline: the run is taken through the clock) when that cannot be said.
    #[inline(never)] // once per millisecond, under the lock: kept out of the request path's code
    pub(crate) fn deadline(&mut self, unix_ms: i64) -> u64 {
        pair().map_or(0, |(counter, unix_ns)| self.deadline_at(unix_ms, counter, unix_ns))
    }

    /// [`Self::deadline`] for a pair read at `counter`, `unix_ns`.
    fn deadline_at(&mut self, unix_ms: i64, counter: u64, unix_ns: i64) -> u64 {
        self.learn(counter, unix_ns);
        let Some(rate) = self.rate else { return 0 };
        if unix_ns.div_euclid(1_000_000) != unix_ms {
            return 0;
        }
        let left_ns = (unix_ms + 1) * 1_000_000 - MARGIN_NS - unix_ns;
        if left_ns <= 0 {
            return 0;
        }
        counter.saturating_add((left_ns as f64 * rate * (1.0 - RATE_SLACK)) as u64)
    }

    fn learn(&mut self, counter: u64, unix_ns: i64) {
        let Some((anchor_counter, anchor_ns)) = self.anchor else {
            self.anchor = Some((counter, unix_ns));
            return;
        };
        let elapsed_ns = unix_ns - anchor_ns;
        if counter < anchor_counter || elapsed_ns < 0 {
            // The clock stepped back (or the counter did): start over.
            *self = Calibration { anchor: Some((counter, unix_ns)), ..Calibration::default() };
            return;
        }
        if elapsed_ns < CALIBRATION_NS {
            return;
        }
        let measured = (counter - anchor_counter) as f64 / elapsed_ns as f64;
        self.rate = self
            .measured
            .filter(|previous| (measured / previous - 1.0).abs() <= RATE_AGREEMENT)
            .map(|previous| previous.min(measured));
        self.measured = Some(measured);
        self.anchor = Some((counter, unix_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ticks per ns of the counter in these tests.
    const GHZ3: u64 = 3;

    /// Pairs of a 3 GHz counter against a clock that reads `offset_ns` more than true time.
    fn pair_at(true_ns: i64, offset_ns: i64) -> (u64, i64) {
        (true_ns as u64 * GHZ3, true_ns + offset_ns)
    }

    fn calibrated() -> (Calibration, i64) {
        let mut calibration = Calibration::default();
        let start = 1_800_000_000_000_000_000i64;
        for step in 0..3 {
            let (counter, ns) = pair_at(start + step * CALIBRATION_NS, 0);
            calibration.learn(counter, ns);
        }
        (calibration, start + 2 * CALIBRATION_NS)
    }

    #[test]
    fn no_deadline_until_two_measurements_agree() {
        let mut calibration = Calibration::default();
        let start = 1_800_000_000_000_000_000i64;
        let (counter, ns) = pair_at(start, 0);
        assert_eq!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "no rate yet");
        let (counter, ns) = pair_at(start + CALIBRATION_NS, 0);
        assert_eq!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "one measurement");
        let (counter, ns) = pair_at(start + 2 * CALIBRATION_NS + 100_000, 0);
        assert_ne!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "two that agree");
    }

    #[test]
    fn a_deadline_falls_before_the_end_of_its_millisecond_by_the_margin() {
        let (mut calibration, at) = calibrated();
        for into_ms in [0, 1, 333_333, 900_000, 979_999, 980_000, 999_999] {
            let true_ns = (at / 1_000_000 + 7) * 1_000_000 + into_ms;
            let (counter, ns) = pair_at(true_ns, 0);
            let ms = ns.div_euclid(1_000_000);
            let deadline = calibration.deadline_at(ms, counter, ns);
            let end_counter = ((ms + 1) * 1_000_000) as u64 * GHZ3;
            if into_ms >= 1_000_000 - MARGIN_NS {
                assert_eq!(deadline, 0, "inside the margin: no deadline");
            } else {
                assert!(deadline <= end_counter - MARGIN_NS as u64 * GHZ3, "{into_ms}: {deadline}");
                assert!(deadline > counter, "{into_ms}: some of the millisecond is left");
            }
        }
    }

    #[test]
    fn a_pair_from_another_millisecond_gives_no_deadline() {
        let (mut calibration, at) = calibrated();
        let (counter, ns) = pair_at(at + 10 * 1_000_000 + 5, 0);
        assert_eq!(
            calibration.deadline_at(ns.div_euclid(1_000_000) - 1, counter, ns),
            0,
            "the run's millisecond is gone"
        );
    }

    #[test]
    fn a_clock_step_stops_deadlines_until_the_rate_agrees_again() {
        let (mut calibration, at) = calibrated();
        // The clock steps forward by 40 ms between two measurements: the rate disagrees.
        let (counter, ns) = pair_at(at + CALIBRATION_NS, 40_000_000);
        assert_eq!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "stepped forward");
        let (counter, ns) = pair_at(at + 2 * CALIBRATION_NS, 40_000_000);
        assert_eq!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "one good measurement");
        let (counter, ns) = pair_at(at + 3 * CALIBRATION_NS, 40_000_000);
        assert_ne!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "two again");
        // A step back starts over at once.
        let (counter, ns) = pair_at(at + 4 * CALIBRATION_NS, -1_000_000_000);
        assert_eq!(calibration.deadline_at(ns.div_euclid(1_000_000), counter, ns), 0, "stepped back");
        assert!(calibration.rate.is_none() && calibration.measured.is_none());
    }

    #[test]
    fn a_clock_slewed_by_ntp_keeps_its_deadlines_early() {
        // The clock runs 500 ppm fast (NTP's largest slew): the rate agrees with itself, and a
        // deadline still falls before the clock's own end of the millisecond.
        let mut calibration = Calibration::default();
        let start = 1_800_000_000_000_000_000i64;
        let slewed = |true_ns: i64| (true_ns as u64 * GHZ3, start + (true_ns - start) + (true_ns - start) / 2_000);
        for step in 0..3 {
            let (counter, ns) = slewed(start + step * CALIBRATION_NS);
            calibration.learn(counter, ns);
        }
        let true_ns = start + 3 * CALIBRATION_NS + 123_456;
        let (counter, ns) = slewed(true_ns);
        let ms = ns.div_euclid(1_000_000);
        let deadline = calibration.deadline_at(ms, counter, ns);
        assert_ne!(deadline, 0);
        // The counter value at which the slewed clock reaches the end of `ms`.
        let end_true_ns = start + ((ms + 1) * 1_000_000 - start) * 2_000 / 2_001;
        assert!(deadline < (end_true_ns - MARGIN_NS * 9 / 10) as u64 * GHZ3, "{deadline}");
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
            let deadline = calibration.deadline(ms);
            if deadline == 0 {
                continue; // no rate yet, inside the margin, or the clock moved on meanwhile
            }
            // Until the deadline, the clock reads `ms` (each reading between two counter
            // readings, both before the deadline).
            loop {
                let (before, clock, after) = (now(), crate::clock::system_unix_ms(), now());
                if after >= deadline {
                    break;
                }
                assert!(before < deadline);
                assert_eq!(clock, ms, "the clock left the millisecond before the deadline");
            }
            checked += 1;
            if checked == 50 {
                return;
            }
        }
        panic!("only {checked} deadlines in 2,000 tries: {calibration:?}");
    }
}
