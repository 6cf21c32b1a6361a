//! In-process cost of an ID, against a clock read and against the crates a Rust team would pick
//! instead, all measured in the same run: [`EmbeddedGenerator::next_id`] and `next_ids(1000)`,
//! `uuid::Uuid::now_v7()`, `snowflaked::sync::Generator` and `rs-snowflake` (behind a mutex: its
//! generator takes `&mut self`), on one and two threads, with `SystemTime::now()` as the
//! baseline. Reports CPU nanoseconds per ID (the process's CPU time, every thread included) and
//! IDs per second, median of alternated rounds. `scripts/bench` runs it; by hand:
//!
//! ```sh
//! cargo run --release -p idgen --example bench_inprocess -- [seconds per run] [rounds]
//! ```
//!
//! The snowflake peers and idgen share one cap, 4,096 IDs per millisecond per generator (a
//! 12-bit sequence); a peer that reaches it spins on the clock until the next millisecond, and
//! idgen waits on a timer, so past the cap CPU-ns per ID counts the peer's spinning and not
//! idgen's sleeping. `uuid::now_v7` has no such cap. The lines under "below the cap" measure
//! the same calls paced to 2,048 IDs per millisecond in all, where no one waits, and count only
//! the CPU time inside the calls: the work of an ID alone.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use idgen::{EmbeddedGenerator, GeneratorConfig, StoreKind};

/// The process's CPU time (user + system, every thread), in nanoseconds.
fn process_cpu_ns() -> u128 {
    cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// The calling thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u128 {
    cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn cpu_ns(clock: libc::clockid_t) -> u128 {
    // SAFETY: clock_gettime writes into the timespec we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u128 * 1_000_000_000 + ts.tv_nsec as u128
}

#[derive(Clone, Copy, PartialEq)]
enum Work {
    ClockRead,
    NextId,
    NextIdByClock,
    Batch1000,
    UuidV7,
    Snowflaked,
    RsSnowflake,
}

const WORKS: [Work; 7] = [
    Work::ClockRead,
    Work::NextId,
    Work::NextIdByClock,
    Work::Batch1000,
    Work::UuidV7,
    Work::Snowflaked,
    Work::RsSnowflake,
];

impl Work {
    fn name(self) -> &'static str {
        match self {
            Work::ClockRead => "SystemTime::now()",
            Work::NextId => "idgen next_id()",
            Work::NextIdByClock => "idgen next_id(), clock",
            Work::Batch1000 => "idgen next_ids(1000)",
            Work::UuidV7 => "uuid now_v7()",
            Work::Snowflaked => "snowflaked (sync)",
            Work::RsSnowflake => "rs-snowflake (mutex)",
        }
    }

    /// Items one call yields.
    fn per_call(self) -> u64 {
        if self == Work::Batch1000 { 1_000 } else { 1 }
    }
}

/// The generators under test, fresh for each measurement except idgen's (one per process, as a
/// service holds it: its lease and sequence carry on from one measurement to the next).
struct Subjects {
    idgen: Arc<EmbeddedGenerator>,
    /// The same with `clock.cpu_counter = false`: the fast path reads the clock for every ID.
    idgen_by_clock: Arc<EmbeddedGenerator>,
    snowflaked: snowflaked::sync::Generator,
    rs_snowflake: Mutex<snowflake::SnowflakeIdGenerator>,
}

impl Subjects {
    /// One call of `work`.
    async fn call(&self, work: Work) {
        match work {
            Work::ClockRead => {
                std::hint::black_box(SystemTime::now());
            }
            Work::NextId | Work::NextIdByClock => {
                // One call site for both, so that the two are compiled (and inlined) alike.
                let idgen = if work == Work::NextId { &self.idgen } else { &self.idgen_by_clock };
                std::hint::black_box(idgen.next_id().await.expect("issuing"));
            }
            Work::Batch1000 => {
                std::hint::black_box(self.idgen.next_ids(1_000).await.expect("issuing"));
            }
            Work::UuidV7 => {
                std::hint::black_box(uuid::Uuid::now_v7());
            }
            Work::Snowflaked => {
                std::hint::black_box(self.snowflaked.generate::<u64>());
            }
            Work::RsSnowflake => {
                let mut generator = self.rs_snowflake.lock().unwrap_or_else(|p| p.into_inner());
                std::hint::black_box(generator.real_time_generate());
            }
        }
    }
}

/// Runs `work` on `threads` threads for `run`; returns (CPU ns per item, items per second).
/// Flat out, CPU is the process's (every thread, spinning included). Paced, every thread is held
/// to its share of 2,048 items per millisecond, sleeping between bursts, and CPU is the threads'
/// own time inside the bursts (a sleep costs none; the clock reads around a burst of hundreds of
/// calls add well under a nanosecond per call).
fn measure(idgens: &[Arc<EmbeddedGenerator>; 2], work: Work, threads: usize, run: Duration, paced: bool) -> (f64, f64) {
    let subjects = Arc::new(Subjects {
        idgen: idgens[0].clone(),
        idgen_by_clock: idgens[1].clone(),
        snowflaked: snowflaked::sync::Generator::new(1),
        rs_snowflake: Mutex::new(snowflake::SnowflakeIdGenerator::new(1, 1)),
    });
    let barrier = Arc::new(std::sync::Barrier::new(threads + 1));
    let per_ms = (2_048 / threads as u64 / work.per_call()).max(1);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (subjects, barrier) = (subjects.clone(), barrier.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                barrier.wait();
                let start = Instant::now();
                let deadline = start + run;
                let (mut items, mut burst_cpu_ns) = (0u64, 0u128);
                runtime.block_on(async {
                    let mut tick = 0u32;
                    while Instant::now() < deadline {
                        let calls = if paced { per_ms } else { 256 };
                        let before = if paced { thread_cpu_ns() } else { 0 };
                        for _ in 0..calls {
                            subjects.call(work).await;
                        }
                        items += calls * work.per_call();
                        if paced {
                            burst_cpu_ns += thread_cpu_ns() - before;
                            tick += 1;
                            let next = start + Duration::from_millis(1) * tick;
                            std::thread::sleep(next.saturating_duration_since(Instant::now()));
                        }
                    }
                });
                (items, burst_cpu_ns)
            })
        })
        .collect();
    barrier.wait();
    let (cpu_start, wall_start) = (process_cpu_ns(), Instant::now());
    let (mut items, mut burst_cpu_ns) = (0, 0);
    for handle in handles {
        let (i, c) = handle.join().expect("bench thread");
        items += i;
        burst_cpu_ns += c;
    }
    let (cpu, wall) = (process_cpu_ns() - cpu_start, wall_start.elapsed());
    let cpu = if paced { burst_cpu_ns } else { cpu };
    (cpu as f64 / items as f64, items as f64 / wall.as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1.0);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let run = Duration::from_secs_f64(seconds);

    // The embedded generator as a service runs it: its own lease file, the keeper on a runtime
    // of its own, the clock check off (this machine's clock reports unsynchronized). Twice: as
    // configured by default, and with `clock.cpu_counter = false` (a clock read for every ID).
    let dir = tempfile::tempdir()?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let start = |file: &str, cpu_counter: bool| {
        let mut config = GeneratorConfig::development();
        config.lease.create_tables = true;
        config.clock.require_sync = false;
        config.clock.cpu_counter = cpu_counter;
        config.lease.store = Some(StoreKind::Sqlite);
        config.lease.sqlite_path = Some(dir.path().join(file));
        runtime.block_on(async {
            let mut registry = prometheus_client::registry::Registry::default();
            let idgen = EmbeddedGenerator::start(&config, &mut registry).await?;
            idgen.ready(Duration::from_secs(30)).await?;
            anyhow::Ok(Arc::new(idgen))
        })
    };
    let idgens = [start("leases.db", true)?, start("leases-by-clock.db", false)?];
    println!(
        "idgen next_id() checks the {}",
        if idgens[0].generator().checks_cpu_counter() {
            "CPU counter (clocksource tsc)"
        } else {
            "clock (no TSC clocksource here)"
        }
    );

    // BENCH_ONLY=idgen (or clock, uuid, snow, rs-) measures only the works whose name starts so.
    let only = std::env::var("BENCH_ONLY").ok();
    let works: Vec<Work> = WORKS
        .into_iter()
        .filter(|w| w.name().starts_with(only.as_deref().unwrap_or("")) || *w == Work::ClockRead)
        .collect();
    println!("in-process: {rounds} alternated rounds of {seconds} s per measurement; cap 4,096 IDs/ms per generator");
    for (paced, heading) in [(false, "flat out"), (true, "below the cap (2,048 IDs/ms in all)")] {
        println!("  {heading}:");
        for threads in [1, 2] {
            let mut cpu = vec![Vec::new(); works.len()];
            let mut rate = vec![Vec::new(); works.len()];
            for _ in 0..rounds {
                for (i, work) in works.iter().enumerate() {
                    let (c, r) = measure(&idgens, *work, threads, run, paced);
                    cpu[i].push(c);
                    rate[i].push(r);
                }
            }
            let clock = median(cpu[0].clone());
            for (i, work) in works.iter().enumerate() {
                let (c, r) = (median(cpu[i].clone()), median(rate[i].clone()));
                println!(
                    "  {threads} thread{}  {:<21} {:>8.1} CPU-ns/ID  {:>12.0} IDs/s  {:>6.2}x the clock read",
                    if threads == 1 { " " } else { "s" },
                    work.name(),
                    c,
                    r,
                    c / clock
                );
            }
        }
    }
    for idgen in idgens {
        let idgen = Arc::into_inner(idgen).expect("no measurement holds the generator");
        runtime.block_on(idgen.shutdown())?;
    }
    Ok(())
}
