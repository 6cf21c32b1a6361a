//! In-process cost of an ID, against a clock read measured beside it in the same run:
//! `next_id()` and `next_ids(1000)` on one and two threads, and `SystemTime::now()` as the
//! baseline. Reports CPU nanoseconds per ID (the process's CPU time, every thread included, so
//! waiting for the next millisecond at the layout cap counts only what it costs) and IDs per
//! second, median of alternated rounds. `scripts/bench` runs it; by hand:
//!
//! ```sh
//! cargo run --release -p idgen --example bench_inprocess -- [seconds per run] [rounds]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use idgen::core::{Generator, GeneratorConfig, Lease, OPEN_HORIZON, Schedule};
use idgen::{Clock, GeneratorMetrics, IdGenerator, SystemClock};

/// The process's CPU time (user + system, every thread), in nanoseconds.
fn process_cpu_ns() -> u128 {
    // SAFETY: clock_gettime writes into the timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

fn generator() -> Arc<IdGenerator> {
    let clock = Arc::new(SystemClock::new(false, 5));
    let now = clock.unix_ms();
    let schedule = Schedule::default_with_horizon(OPEN_HORIZON).expect("default schedule");
    let mut core = Generator::new(GeneratorConfig::default(), schedule, 0, true).expect("valid config");
    let lease =
        Lease { layout: "v1".into(), machine: 1, epoch: 1, expiry_unix_ms: now + 3_600_000, floor_unix_ms: now };
    core.install_lease(lease).expect("lease");
    Arc::new(IdGenerator::new(core, clock, Arc::new(GeneratorMetrics::default())))
}

#[derive(Clone, Copy)]
enum Work {
    ClockRead,
    NextId,
    Batch1000,
}

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::ClockRead => "SystemTime::now()",
            Work::NextId => "next_id()",
            Work::Batch1000 => "next_ids(1000)",
        }
    }
}

/// Runs `work` on `threads` threads for `run`; returns (CPU ns per item, items per second).
fn measure(work: Work, threads: usize, run: Duration) -> (f64, f64) {
    let generator = generator();
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (generator, barrier) = (generator.clone(), barrier.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                barrier.wait();
                let deadline = Instant::now() + run;
                let mut items = 0u64;
                runtime.block_on(async {
                    while Instant::now() < deadline {
                        for _ in 0..256 {
                            match work {
                                Work::ClockRead => {
                                    std::hint::black_box(SystemTime::now());
                                    items += 1;
                                }
                                Work::NextId => {
                                    std::hint::black_box(generator.next_id().await.expect("issuing"));
                                    items += 1;
                                }
                                Work::Batch1000 => {
                                    let ids = generator.next_ids(1_000).await.expect("issuing");
                                    items += std::hint::black_box(ids).len() as u64;
                                }
                            }
                        }
                    }
                });
                items
            })
        })
        .collect();
    barrier.wait();
    let (cpu_start, wall_start) = (process_cpu_ns(), Instant::now());
    let items: u64 = handles.into_iter().map(|h| h.join().expect("bench thread")).sum();
    let (cpu, wall) = (process_cpu_ns() - cpu_start, wall_start.elapsed());
    (cpu as f64 / items as f64, items as f64 / wall.as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let run = Duration::from_secs_f64(seconds);
    println!("in-process: {rounds} alternated rounds of {seconds} s per measurement; layout cap 4,096,000 IDs/s");
    for threads in [1, 2] {
        let works = [Work::ClockRead, Work::NextId, Work::Batch1000];
        // BENCH_ONLY=next_id (or clock, batch) measures one thing alone, e.g. under a profiler.
        let only = std::env::var("BENCH_ONLY").ok();
        let works: Vec<Work> = works
            .into_iter()
            .filter(|w| {
                only.as_deref().is_none_or(|o| {
                    w.name().starts_with(o)
                        || o == "clock" && matches!(w, Work::ClockRead)
                        || o == "batch" && matches!(w, Work::Batch1000)
                })
            })
            .collect();
        let mut cpu = vec![Vec::new(); works.len()];
        let mut rate = vec![Vec::new(); works.len()];
        for _ in 0..rounds {
            for (i, work) in works.iter().enumerate() {
                let (c, r) = measure(*work, threads, run);
                cpu[i].push(c);
                rate[i].push(r);
            }
        }
        let clock = median(cpu[0].clone());
        for (i, work) in works.iter().enumerate() {
            let (c, r) = (median(cpu[i].clone()), median(rate[i].clone()));
            println!(
                "  {threads} thread{}  {:<18} {:>8.1} CPU-ns/item  {:>12.0} items/s  {:>5.2}x the clock read",
                if threads == 1 { " " } else { "s" },
                work.name(),
                c,
                r,
                c / clock
            );
        }
    }
}
