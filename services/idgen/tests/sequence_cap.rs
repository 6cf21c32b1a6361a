//! At the sequence cap a request waits for the next millisecond without blocking a tokio worker
//! thread and without spinning a core.
//!
//! A stream of 1,000-ID batches on a single-threaded runtime (so a blocked thread would show at
//! once) must reach close to the layout's cap of 4,096 IDs per millisecond, while a heartbeat task
//! on the same thread keeps ticking and the process uses a small fraction of a core. Reported as
//! ratios (IDs/s against the cap, CPU time against wall time), measured in the same run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use idgen::core::{Generator, GeneratorConfig, Lease, OPEN_HORIZON, Schedule};
use idgen::{Clock, GeneratorMetrics, IdGenerator, SystemClock};

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

#[test]
fn batches_reach_the_sequence_cap_without_burning_a_core() {
    batches_at_the_cap(false);
}

/// The same with the waits kept by a timer in the runtime (as the worker runs), on the one
/// thread that also serves the heartbeat.
#[test]
fn batches_reach_the_sequence_cap_with_the_waits_on_the_runtime() {
    batches_at_the_cap(true);
}

fn batches_at_the_cap(waits_on_the_runtime: bool) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut clock = SystemClock::new(false, 5);
        if waits_on_the_runtime {
            clock = clock.with_waits_on_this_runtime();
            assert!(clock.waits_on_a_runtime());
        }
        let clock = Arc::new(clock);
        let now = clock.unix_ms();
        let mut core =
            Generator::new(GeneratorConfig::default(), Schedule::default_with_horizon(OPEN_HORIZON).unwrap(), 0, true)
                .unwrap();
        core.install_lease(Lease {
            layout: "v1".into(),
            machine: 1,
            epoch: 1,
            expiry_unix_ms: now + 600_000,
            floor_unix_ms: now,
        })
        .unwrap();
        let metrics = Arc::new(GeneratorMetrics::default());
        let generator = Arc::new(IdGenerator::new(core, clock.clone(), metrics.clone()));

        let run_for = Duration::from_millis(1_500);
        let heartbeats = Arc::new(AtomicU64::new(0));
        let heartbeat = {
            let heartbeats = heartbeats.clone();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(Duration::from_millis(5));
                loop {
                    interval.tick().await;
                    heartbeats.fetch_add(1, Ordering::Relaxed);
                }
            })
        };

        let (wall_start, cpu_start) = (Instant::now(), cpu_time());
        let streams: Vec<_> = (0..4)
            .map(|_| {
                let generator = generator.clone();
                tokio::spawn(async move {
                    let (mut issued, mut last) = (0u64, 0u64);
                    while wall_start.elapsed() < run_for {
                        let ids = generator.next_ids(1000).await.unwrap();
                        assert!(ids[0] > last && ids.windows(2).all(|w| w[0] < w[1]));
                        last = ids[999];
                        issued += 1000;
                    }
                    issued
                })
            })
            .collect();
        let mut issued = 0;
        for stream in streams {
            issued += stream.await.unwrap();
        }
        let (wall, cpu) = (wall_start.elapsed(), cpu_time() - cpu_start);
        heartbeat.abort();

        let cap = 4_096_000.0;
        let rate = issued as f64 / wall.as_secs_f64();
        let cpu_share = cpu.as_secs_f64() / wall.as_secs_f64();
        let beats = heartbeats.load(Ordering::Relaxed);
        let expected_beats = wall.as_millis() as u64 / 5;
        println!(
            "issued {issued} IDs in {wall:?}: {rate:.0} IDs/s = {:.3} of the 4,096,000/s cap; \
             CPU {cpu:?} = {cpu_share:.3} of one core; spills {}; heartbeats {beats}/{expected_beats}",
            rate / cap,
            metrics.sequence_spills.get()
        );
        assert!(rate / cap > 0.8, "the sequence, not the waiting, should be the limit: {:.3} of cap", rate / cap);
        assert!(cpu_share < 0.5, "waiting must not spin a core: {cpu_share:.3}");
        assert!(
            beats * 10 >= expected_beats * 8,
            "the runtime thread kept serving other tasks: {beats}/{expected_beats}"
        );
        assert!(metrics.sequence_spills.get() > 0);
    });
}
