//! The request path's clock rules, driven by a manual clock: a step back while a request waits
//! for the next millisecond, and the kernel's sync state, read in every millisecond that issues.

use std::sync::Arc;
use std::time::Duration;

use idgen::core::{Generator, GeneratorConfig, Lease, OPEN_HORIZON, Refusal, Schedule};
use idgen::{GeneratorMetrics, IdGenerator, ManualClock, SyncStatus};

const T0: i64 = 1_790_424_000_000;

fn generator(clock: &Arc<ManualClock>) -> Arc<IdGenerator> {
    let mut core = Generator::new(
        GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 },
        Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
        0,
        true,
    )
    .unwrap();
    let lease = Lease { layout: "v1".into(), machine: 3, epoch: 1, expiry_unix_ms: T0 + 300_000, floor_unix_ms: T0 };
    core.install_lease(lease).unwrap();
    Arc::new(IdGenerator::new(core, clock.clone(), Arc::new(GeneratorMetrics::default())))
}

/// A generator on the real clock (its sync check off), with no lease yet.
fn on_the_system_clock() -> (Arc<IdGenerator>, Arc<idgen::SystemClock>) {
    let clock = Arc::new(idgen::SystemClock::new(false, 5));
    let core = Generator::new(
        GeneratorConfig { fence_ms: 500, max_wait_behind_ms: 5 },
        Schedule::default_with_horizon(OPEN_HORIZON).unwrap(),
        0,
        true,
    )
    .unwrap();
    (Arc::new(IdGenerator::new(core, clock.clone(), Arc::new(GeneratorMetrics::default()))), clock)
}

#[tokio::test(start_paused = true)]
async fn a_clock_step_back_during_a_wait_is_refused_not_slept_out() {
    // Before, a request waiting for the next millisecond slept until the wall clock got there:
    // after a 10 s step back, 10 s. SPEC §3: refuse at once when more than 5 ms behind.
    let clock = Arc::new(ManualClock::new(T0));
    let g = generator(&clock);
    assert_eq!(g.next_ids(4_096).await.unwrap().len(), 4_096, "T0's sequence is used up");
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_id().await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "waiting for T0 + 1");
    clock.set(T0 - 10_000);
    let answered = tokio::time::timeout(Duration::from_millis(20), waiting).await;
    let result = answered.expect("answered within a few milliseconds, not after the step").unwrap();
    assert_eq!(result, Err(Refusal::ClockBehind { behind_ms: 10_000 }));
    // A step back within the rule is still waited out.
    clock.set(T0 + 1);
    g.next_id().await.unwrap();
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_ids(4_096).await }
    });
    tokio::task::yield_now().await;
    clock.set(T0 - 2);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiting.is_finished(), "2 ms behind: still waiting");
    clock.set(T0 + 2);
    let ids = tokio::time::timeout(Duration::from_millis(20), waiting).await.unwrap().unwrap().unwrap();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test]
async fn the_kernel_saying_unsynchronized_stops_the_next_millisecond_without_a_keeper() {
    // Before, only the lease keeper's tick (once a second) told the generator: up to a second of
    // IDs after the kernel reported STA_UNSYNC. Now every millisecond that issues reads it.
    let clock = Arc::new(ManualClock::new(T0));
    clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    let g = generator(&clock);
    g.next_id().await.unwrap();
    clock.set_sync_status(SyncStatus::Unsynchronized("STA_UNSYNC".into()));
    clock.advance(1);
    let refused = Refusal::ClockUnsynchronized { reason: "STA_UNSYNC".into() };
    assert_eq!(g.next_id().await, Err(refused.clone()));
    assert_eq!(g.next_ids(10).await, Err(refused));
    assert_eq!(g.next_uuids(1).await, Err(Refusal::ClockUnsynchronized { reason: "STA_UNSYNC".into() }));
    assert!(matches!(g.health(), idgen::Health::Refusing { refusal: Refusal::ClockUnsynchronized { .. }, .. }));
    clock.set_sync_status(SyncStatus::Synchronized { estimated_error_us: 800 });
    clock.advance(1);
    assert!(g.next_id().await.is_ok(), "and issues again once the kernel says synchronized");
}

#[tokio::test(start_paused = true)]
async fn uuids_follow_the_clock_rules_of_ids() {
    let clock = Arc::new(ManualClock::new(T0));
    let g = generator(&clock);
    let first = g.next_uuids(3).await.unwrap();
    assert!(first.windows(2).all(|w| w[0] < w[1]));
    clock.set(T0 - 60_000);
    assert_eq!(g.next_uuids(1).await, Err(Refusal::ClockBehind { behind_ms: 60_000 }));
    clock.set(T0 - 3);
    let waiting = tokio::spawn({
        let g = g.clone();
        async move { g.next_uuids(1).await }
    });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "3 ms behind: waits");
    clock.set(T0);
    let next = tokio::time::timeout(Duration::from_millis(20), waiting).await.unwrap().unwrap().unwrap();
    assert!(next[0] > first[2]);
}

/// The lock-free fast path under fire: six threads issue single IDs and batches on the real
/// clock while another thread drops the lease and installs one on a new machine number every few
/// milliseconds, and retires and reinstates the region. Every ID must be unique, each thread's
/// IDs must increase, and every ID must lie inside a lease it was issued under: at or above the
/// lease's floor, below its expiry − fence, and not after the millisecond the lease was dropped.
#[test]
fn many_threads_never_share_an_id_while_the_lease_changes_under_them() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (g, clock) = on_the_system_clock();
    let now = idgen::Clock::unix_ms(&*clock);
    let lease = |machine: u32, floor: i64| Lease {
        layout: "v1".into(),
        machine,
        epoch: u64::from(machine),
        expiry_unix_ms: floor + 60_000,
        floor_unix_ms: floor,
    };
    g.with_core(|c| c.install_lease(lease(1, now))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let issuers: Vec<_> = (0..6)
        .map(|t| {
            let (g, stop) = (g.clone(), stop.clone());
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let mut ids = Vec::new();
                runtime.block_on(async {
                    let mut i = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let result = if t % 2 == 0 {
                            g.next_id().await.map(|id| vec![id])
                        } else {
                            g.next_ids(1 + i % 40).await
                        };
                        if let Ok(batch) = result {
                            ids.extend(batch);
                        }
                    }
                });
                ids
            })
        })
        .collect();
    // (machine, floor, expiry, dropped at) for every lease installed.
    let mut leases = vec![(1u32, now, now + 60_000, i64::MAX)];
    let deadline = std::time::Instant::now() + Duration::from_millis(1_500);
    let mut machine = 1;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(3));
        let at = idgen::Clock::unix_ms(&*clock);
        machine += 1;
        g.with_core(|c| {
            c.drop_lease("v1");
            c.set_region_retired(if machine % 7 == 0 { Some("retired".into()) } else { None });
            c.install_lease(lease(machine, at))
        })
        .unwrap();
        // Dropped no later than the millisecond this call returned in.
        leases.last_mut().unwrap().3 = idgen::Clock::unix_ms(&*clock);
        leases.push((machine, at, at + 60_000, i64::MAX));
    }
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for issuer in issuers {
        let ids = issuer.join().unwrap();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "one thread's IDs strictly increase");
        all.extend(ids);
    }
    assert!(all.len() > 10_000, "only {} IDs issued", all.len());
    for &id in &all {
        let (ts, m) = ((id >> 22) as i64 + idgen::core::EPOCH_UNIX_MS, ((id >> 12) & 0x3ff) as u32);
        let (_, floor, expiry, dropped) = leases.iter().find(|l| l.0 == m).expect("a machine that was leased");
        assert!(*floor <= ts && ts < expiry - 500 && ts <= *dropped, "ID {id} at {ts} outside lease of {m}");
    }
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "an ID was issued twice");
    println!("{total} IDs across {} leases, no ID twice", leases.len());
}

#[test]
fn the_clock_gauges_follow_the_discipline_either_way_and_say_nan_when_there_is_none() {
    // A forward jump must alarm as a step back does: the offset is exported signed, with the
    // estimated error, both read at scrape time.
    let clock = Arc::new(ManualClock::new(T0));
    let g = generator(&clock);
    let mut registry = prometheus_client::registry::Registry::default();
    g.metrics().register(&mut registry);
    let scrape = |g: &IdGenerator| {
        g.refresh_gauges();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    };
    let unknown = scrape(&g);
    assert!(unknown.contains("idgen_clock_offset_seconds NaN"), "{unknown}");
    assert!(unknown.contains("idgen_clock_estimated_error_seconds NaN"), "{unknown}");
    for (offset, error) in [(0.012, 0.0005), (-0.25, 0.004)] {
        clock.set_discipline(Some(idgen::Discipline { offset_seconds: offset, estimated_error_seconds: error }));
        let text = scrape(&g);
        assert!(text.contains(&format!("idgen_clock_offset_seconds {offset}")), "{text}");
        assert!(text.contains(&format!("idgen_clock_estimated_error_seconds {error}")), "{text}");
    }
}

/// Where the clock is kept on the CPU's counter, the fast path hands out a run by the counter
/// inside a window in the run's millisecond instead of reading the clock: while nothing moves the
/// clock apart from the counter (no step, no hypervisor correcting it after stopping the counter:
/// that weaker case is `cpu_counter`'s unit tests), it must never hand one out after the clock
/// has left that millisecond. Two threads take single IDs on the real clock, pausing at random so
/// that calls land just before and just after deadlines; every ID's millisecond must lie between
/// the clock read before the call and the clock read after it.
#[test]
fn ids_taken_by_the_cpu_counter_carry_the_millisecond_they_are_handed_out_in() {
    use rand::Rng;
    let (g, clock) = on_the_system_clock();
    let now = idgen::Clock::unix_ms(&*clock);
    let lease = Lease { layout: "v1".into(), machine: 1, epoch: 1, expiry_unix_ms: now + 60_000, floor_unix_ms: now };
    g.with_core(|c| c.install_lease(lease)).unwrap();
    // (That the counter is used where it can be is the unit test in generator.rs.)
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let g = g.clone();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                let mut rng = rand::rng();
                let (mut ids, mut late) = (Vec::new(), Vec::new());
                let until = std::time::Instant::now() + Duration::from_millis(1_200);
                while std::time::Instant::now() < until {
                    for _ in 0..rng.random_range(1..200) {
                        let before = idgen::system_unix_ms();
                        let id = runtime.block_on(g.next_id()).unwrap();
                        let after = idgen::system_unix_ms();
                        let ts = (id >> 22) as i64 + idgen::core::EPOCH_UNIX_MS;
                        if ts < before || ts > after {
                            late.push((before, ts, after));
                        }
                        ids.push(id);
                    }
                    std::thread::sleep(Duration::from_micros(rng.random_range(0..1_500)));
                }
                (ids, late)
            })
        })
        .collect();
    let mut all = Vec::new();
    for thread in threads {
        let (ids, late) = thread.join().unwrap();
        assert!(late.is_empty(), "IDs outside the clock around their call (before, ID, after): {late:?}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "one thread's IDs strictly increase");
        all.extend(ids);
    }
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "an ID was issued twice");
}
